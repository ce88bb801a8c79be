"""router/kept_files.py: the state file's states restored at start, and the features' files opened
before their routers are given to them, closed at exit (the whole start and exit through a real
routerd: test_routerd_admin_state.py, test_routerd_event_log.py, test_routerd_file_faults.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pools import AdminState
from router.acceptors import StartupError
from router.feature import OpenError, Service
from router.kept_files import close_files, open_files, restore_admin_states
from router.services.state_file import StateFile
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    from pathlib import Path

    from router.runtime import RouterRuntime


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


class _Files(Service):
    """A service that says what the kernel asked of it, in order, and fails to open when told."""

    def __init__(self, said: list[str], name: str, *, fails: bool = False) -> None:
        self.said, self.name, self.fails = said, name, fails

    def open_files(self) -> None:
        if self.fails:
            raise OpenError(f"{self.name}: cannot open")
        self.said.append(f"{self.name} open")

    def router_added(self, runtime: RouterRuntime) -> None:
        self.said.append(f"{self.name} {runtime.name}")

    async def close_files(self, timeout_s: float) -> None:
        self.said.append(f"{self.name} close {timeout_s:g}")


def test_open_files_opens_every_service_then_gives_each_the_routers() -> None:
    said: list[str] = []
    open_files([_Files(said, "a"), _Files(said, "b")], [make_runtime()])
    assert said == ["a open", "b open", "a r", "b r"]


def test_open_files_that_fail_are_a_startup_error_with_the_service_s_line() -> None:
    said: list[str] = []
    with pytest.raises(StartupError, match=r"^b: cannot open$"):
        open_files([_Files(said, "a"), _Files(said, "b", fails=True)], [make_runtime()])
    assert said == ["a open"]


async def test_close_files_closes_every_service_within_the_exit_time() -> None:
    said: list[str] = []
    await close_files((), [_Files(said, "a"), _Files(said, "b")], None)
    assert sorted(said) == ["a close 5", "b close 5"]
