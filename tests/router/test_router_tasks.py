"""router/router_tasks.py: a router's tasks started, restarted and stopped on their own (through
reloads of a real server: test_reload.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
import trio.testing

from router.config.settings import Config
from router.router_tasks import RouterTasks
from router.services.cache_store import CacheStore
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    from pathlib import Path


async def test_start_restart_stop_and_the_store_of_a_router(tmp_path: Path) -> None:
    runtime = make_runtime()
    store = CacheStore.open(str(tmp_path / "r.sqlite"))
    try:
        config = Config(source="t.xml", routers=(runtime.config,))
        tasks = RouterTasks({}, lambda: config, [(runtime, store)])
        assert tasks.store_of(runtime) is store
        assert tasks.store_of(make_runtime()) is None
        async with trio.open_nursery() as nursery:
            tasks.nursery = nursery
            tasks.start(runtime, None)
            await trio.testing.wait_all_tasks_blocked()
            tasks.restart(runtime)
            await trio.testing.wait_all_tasks_blocked()
            tasks.stop("r")  # every task of the router ends: the nursery can close
    finally:
        store.close()
