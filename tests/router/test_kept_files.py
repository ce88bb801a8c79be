"""router/kept_files.py: the state file's states restored at start, and the event log started only
when configured (the whole start and exit through a real routerd: test_routerd_admin_state.py,
test_routerd_event_log.py, test_routerd_file_faults.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pools import AdminState
from router.acceptors import StartupError
from router.config.settings import Config
from router.kept_files import restore_admin_states, start_event_log
from router.metrics import Metrics
from router.services.state_file import StateFile
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    from pathlib import Path


async def test_restore_admin_states_applies_what_it_can_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "states.json"
    StateFile(str(path)).save(
        {"r": {"b1": AdminState.DRAIN, "gone": AdminState.MAINT}, "nope": {"b1": AdminState.DRAIN}}
    )
    runtime = make_runtime()
    restore_admin_states(StateFile(str(path)), {"r": runtime})
    assert runtime.pool.admin_states() == {"b1": AdminState.DRAIN}


def test_restore_admin_states_of_an_unreadable_file_is_a_startup_error(tmp_path: Path) -> None:
    path = tmp_path / "states.json"
    path.write_text("{not json")
    with pytest.raises(StartupError, match="fix or delete it"):
        restore_admin_states(StateFile(str(path)), {})


def test_no_event_log_without_its_configuration() -> None:
    assert start_event_log(Config(source="t.xml"), [], Metrics()) is None
