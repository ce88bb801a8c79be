"""Each router's service tasks, in two groups that a reload cancels on their own.

    core  the features' tasks for the router (`Service.serve_router`: health checks first, the TTL
          checker, the cache sweep) and the outlier returns: restarted when the router changes
    data  the features' tasks that outlive a change of the router (`Service.serve_router_data`:
          ZooKeeper discovery, the shared cache, the persisted cache's writes): stopped only when
          the router goes

router/server.py starts them for the routers it starts with; router/reload.py for the routers a
reload adds, changes and removes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from router.config.settings import Config
    from router.feature import Service
    from router.runtime import RouterRuntime

__all__ = ["RouterTasks"]


@dataclass(eq=False, slots=True)
class _Scopes:
    core: trio.CancelScope
    data: trio.CancelScope


class RouterTasks:
    """The routers' service tasks in the process's services nursery (`nursery`, set once open)."""

    def __init__(
        self,
        features: Mapping[type, Service],
        config: Callable[[], Config],
    ) -> None:
        self._features = features
        self._config = config
        """The configuration in force."""
        self._scopes: dict[str, _Scopes] = {}
        self.nursery: trio.Nursery | None = None

    async def start_first(self, runtime: RouterRuntime) -> None:
        """At start: a router's tasks, each group ready before the next (the first probes run at
        once)."""
        assert self.nursery is not None
        scopes = self._scopes[runtime.name] = _Scopes(core=trio.CancelScope(), data=trio.CancelScope())
        await self.nursery.start(self._serve_core, runtime, scopes.core)
        await self.nursery.start(self._serve_data, runtime, scopes.data)

    def start(self, runtime: RouterRuntime) -> None:
        """The tasks of a router a reload added."""
        scopes = self._scopes[runtime.name] = _Scopes(core=trio.CancelScope(), data=trio.CancelScope())
        self.spawn(self._serve_core, runtime, scopes.core)
        self.spawn(self._serve_data, runtime, scopes.data)

    def restart(self, runtime: RouterRuntime) -> None:
        """The core tasks of a router whose configuration changed, started again."""
        scopes = self._scopes[runtime.name]
        scopes.core.cancel(reason="the router's configuration changed")
        scopes.core = trio.CancelScope()
        self.spawn(self._serve_core, runtime, scopes.core)

    def stop(self, name: str) -> None:
        """Every task of a router a reload removed."""
        scopes = self._scopes.pop(name)
        scopes.core.cancel(reason="router removed")
        scopes.data.cancel(reason="router removed")

    def spawn(self, function: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run a task in the services nursery."""
        assert self.nursery is not None
        self.nursery.start_soon(function, *args)

    async def _serve_core(
        self,
        runtime: RouterRuntime,
        scope: trio.CancelScope,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for service in self._features.values():  # the probes first: they run at once
                    await nursery.start(service.serve_router, runtime)
                nursery.start_soon(runtime.pool.serve_outlier_returns)
                task_status.started()

    async def _serve_data(
        self,
        runtime: RouterRuntime,
        scope: trio.CancelScope,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for service in self._features.values():
                    await nursery.start(service.serve_router_data, runtime)
                task_status.started()
