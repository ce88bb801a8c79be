"""router/features/admin_states/service.py: the state file read at start and its states applied,
its status in the process's status document (written on each change and at exit through a real
routerd: test_routerd_admin_state.py, test_routerd_file_faults.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from pools import AdminState
from router.config.settings import Config
from router.feature import Kernel, OpenError
from router.features.admin_states.service import AdminStates, restore_admin_states
from router.features.admin_states.state_file import StateFile
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    from pathlib import Path

    from router.runtime import RouterRuntime


def _kernel(runtime: RouterRuntime, **options: object) -> Kernel:
    return Kernel(
        runtimes={runtime.name: runtime},
        metrics=runtime.metrics,
        stop=lambda: None,
        config=lambda: Config(source="test.xml", routers=(runtime.config,)),
        options=options,
    )


async def test_restore_admin_states_applies_what_it_can_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "states.json"
    StateFile(str(path)).save(
        {"r": {"b1": AdminState.DRAIN, "gone": AdminState.MAINT}, "nope": {"b1": AdminState.DRAIN}}
    )
    runtime = make_runtime()
    restore_admin_states(StateFile(str(path)), {"r": runtime})
    assert runtime.pool.admin_states() == {"b1": AdminState.DRAIN}


def test_restore_admin_states_of_an_unreadable_file_is_an_open_error(tmp_path: Path) -> None:
    path = tmp_path / "states.json"
    path.write_text("{not json")
    with pytest.raises(OpenError, match="fix or delete it"):
        restore_admin_states(StateFile(str(path)), {})


async def test_the_service_restores_at_open_and_says_where_its_file_is(tmp_path: Path) -> None:
    path = tmp_path / "states.json"
    StateFile(str(path)).save({"r": {"b2": AdminState.MAINT}})
    runtime = make_runtime()
    service = AdminStates(_kernel(runtime, state_file=str(path)))
    service.open_files()
    assert runtime.pool.admin_states()["b2"] is AdminState.MAINT
    assert service.process_status() == {"state_file": {"path": str(path), "persisted": True, "error": None}}
    await service.close_files(1.0)


async def test_without_the_option_the_states_are_in_memory_only() -> None:
    runtime = make_runtime()
    service = AdminStates(_kernel(runtime))
    service.open_files()
    assert service.kept is None
    assert service.process_status() == {"state_file": None}
    await service.close_files(1.0)


async def test_the_service_warns_at_open_when_its_file_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario (issue 34): a state file where routerd cannot write (here in a directory that does
    not exist, which stops root too; a read-only one: test_files.py): one WARNING at start naming
    the file, why and the fix, instead of a 500 at the first drain; routerd starts, the states work
    in memory."""
    path = tmp_path / "gone" / "state.json"
    runtime = make_runtime()
    service = AdminStates(_kernel(runtime, state_file=str(path)))
    with caplog.at_level(logging.WARNING, logger="router.server"):
        service.open_files()
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"state file {str(path)!r} cannot be written: its directory {tmp_path / 'gone'} does not "
        "exist; drain and maint states set from now on are not kept across a restart, and setting "
        "one answers 500: give routerd --state-file FILE in a writable directory"
    )
    assert service.kept is not None
    await service.close_files(1.0)


async def test_the_service_says_nothing_of_a_writable_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = make_runtime()
    service = AdminStates(_kernel(runtime, state_file=str(tmp_path / "state.json")))
    with caplog.at_level(logging.WARNING, logger="router.server"):
        service.open_files()
    assert caplog.records == []
    await service.close_files(1.0)
