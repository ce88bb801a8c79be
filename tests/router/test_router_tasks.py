"""router/router_tasks.py: a router's tasks started, restarted and stopped on their own (through
reloads of a real server: test_reload.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
import trio.testing

from router.config.settings import Config
from router.feature import Service
from router.router_tasks import RouterTasks
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    from router.runtime import RouterRuntime


async def test_start_restart_stop_of_a_router() -> None:
    runtime = make_runtime()
    config = Config(source="t.xml", routers=(runtime.config,))
    tasks = RouterTasks({}, lambda: config)
    async with trio.open_nursery() as nursery:
        tasks.nursery = nursery
        tasks.start(runtime)
        await trio.testing.wait_all_tasks_blocked()
        tasks.restart(runtime)
        await trio.testing.wait_all_tasks_blocked()
        tasks.stop("r")  # every task of the router ends: the nursery can close


class _Counting(Service):
    """Counts the starts of each per-router hook, and serves until cancelled."""

    def __init__(self) -> None:
        self.core: list[str] = []
        self.data: list[str] = []

    async def serve_router(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.core.append(runtime.name)
        task_status.started()
        await trio.sleep_forever()

    async def serve_router_data(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.data.append(runtime.name)
        task_status.started()
        await trio.sleep_forever()


async def test_a_change_of_the_router_restarts_serve_router_only() -> None:
    """`serve_router` is restarted when a reload changes the router; `serve_router_data` (what
    discovery and the shared cache run) goes on until the router goes."""
    runtime = make_runtime()
    config = Config(source="t.xml", routers=(runtime.config,))
    service = _Counting()
    tasks = RouterTasks({_Counting: service}, lambda: config)
    async with trio.open_nursery() as nursery:
        tasks.nursery = nursery
        await tasks.start_first(runtime)
        assert (service.core, service.data) == (["r"], ["r"])
        tasks.restart(runtime)
        await trio.testing.wait_all_tasks_blocked()
        assert (service.core, service.data) == (["r", "r"], ["r"])
        tasks.stop("r")
