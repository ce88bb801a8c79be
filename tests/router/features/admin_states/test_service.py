"""router/features/admin_states/service.py: the state file read at start and its states applied,
its status in the process's status document (written on each change and at exit through a real
routerd: test_routerd_admin_state.py, test_routerd_file_faults.py)."""

from __future__ import annotations

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
