"""router/kept_files.py: the features' files opened and read before their routers are given to
them, closed at exit (the whole start and exit through a real
routerd: test_routerd_admin_state.py, test_routerd_event_log.py, test_routerd_file_faults.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from router.acceptors import StartupError
from router.feature import OpenError, Service
from router.kept_files import close_files, open_files
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    from router.config.settings import RouterConfig
    from router.runtime import RouterRuntime


class _Files(Service):
    """A service that says what the kernel asked of it, in order, and fails to open when told."""

    def __init__(self, said: list[str], name: str, *, fails: bool = False) -> None:
        self.said, self.name, self.fails = said, name, fails

    def open_files(self) -> None:
        if self.fails:
            raise OpenError(f"{self.name}: cannot open")
        self.said.append(f"{self.name} open")

    async def prepare_router(self, config: RouterConfig) -> None:
        self.said.append(f"{self.name} read {config.name}")

    def router_added(self, runtime: RouterRuntime) -> None:
        self.said.append(f"{self.name} {runtime.name}")

    async def close_files(self, timeout_s: float) -> None:
        self.said.append(f"{self.name} close {timeout_s:g}")


async def test_open_files_opens_every_service_reads_then_gives_each_the_routers() -> None:
    said: list[str] = []
    await open_files([_Files(said, "a"), _Files(said, "b")], [make_runtime()])
    assert said == ["a open", "b open", "a read r", "b read r", "a r", "b r"]


async def test_open_files_that_fail_are_a_startup_error_with_the_service_s_line() -> None:
    said: list[str] = []
    with pytest.raises(StartupError, match=r"^b: cannot open$"):
        await open_files([_Files(said, "a"), _Files(said, "b", fails=True)], [make_runtime()])
    assert said == ["a open"]


async def test_close_files_closes_every_service_within_the_exit_time() -> None:
    said: list[str] = []
    await close_files([_Files(said, "a"), _Files(said, "b")])
    assert sorted(said) == ["a close 5", "b close 5"]
