"""What one router's lock guards: its configuration in force, engine, pool, live connections and
the pool's history, in one object that is its own lock.

Every read or change of them goes through `with state:` (`RouterRuntime.held()`), from the trio
thread or the fast path's epoll thread. The kernel (router/runtime/kernel.py), its pool and
connection slices (pool.py, connections.py) and the features' slices of the runtime
(router/features/*/) all do it this way, so nothing reaches them unguarded.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from types import TracebackType

    from pools import Pool
    from router.config.settings import RouterConfig
    from router.core.engine import RouteDecision, RoutingEngine, SharedCacheWait
    from router.core.live import LiveConnections
    from router.core.status import TargetHistory, TargetSection, ZooKeeperStatus

__all__ = ["RouterState", "SharedResolver"]


class SharedResolver(Protocol):
    """Finishes the decisions that wait for a cache shared through ZooKeeper (the shared cache's
    service, router/features/shared_cache/service.py, attaches one before the router serves)."""

    async def __call__(self, wait: SharedCacheWait) -> RouteDecision:
        """The decision, once the shared cache answered (or did not in time)."""
        ...


class RouterState:
    """A router's guarded state (see the module docstring): enter it to read or change it."""

    __slots__ = (
        "config",
        "connections",
        "engine",
        "history",
        "lock",
        "pool",
        "resolver",
        "target_sections",
        "zookeeper",
    )

    def __init__(
        self,
        config: RouterConfig,
        engine: RoutingEngine,
        pool: Pool | None,
        connections: LiveConnections,
        history: TargetHistory,
    ) -> None:
        self.lock = threading.Lock()
        """The router's lock: both data paths' threads take it, so hold it briefly."""
        self.config = config
        """The router's configuration in force (replaced as a whole by a reload)."""
        self.engine = engine
        """Its routing engine (replaced by a reload; the policy and cache may carry over)."""
        self.pool = pool
        """Its pool, None for a router without one."""
        self.connections = connections
        """The proxied connections open now (router/core/live.py)."""
        self.history = history
        """Each target's last probes, why it is not ready, when its state last changed."""
        self.resolver: SharedResolver | None = None
        """What finishes decisions that wait for a shared cache, once attached."""
        self.zookeeper: dict[str, ZooKeeperStatus] = {}
        """Its ZooKeeper sessions by use (`discovery`, `shared_cache`), as `SessionWatch`
        (router/services/zookeeper.py) last saw them; `GET /api/v1/status` shows them. Trio
        thread only."""
        self.target_sections: dict[str, TargetSection] = {}
        """The features' members of each target's status document, by name: a feature's service
        adds its own when the router joins (`Service.router_added`); the snapshot
        (`RouterRuntime.status`) computes them."""

    def __enter__(self) -> RouterState:
        self.lock.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.lock.release()
