"""One router at run time: its engine and pool, the quorum wait, and live connection counts.

The engine (`router/engine.py`) decides; this module adds what needs trio: waiting up to
`quorum-timeout` for the pool's quorum (SPEC A1 step 7), waking waiters when the health checker
changes the pool, and counting the connections we route so LEAST_CONNECTIONS sees a burst.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from pools import PoolEventKind
from router.engine import RouteDecision, RouteStatus, RoutingEngine, build_pool

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client import Counter

    from keys import ConnectionFacts
    from pools import PoolEvent
    from router.metrics import Metrics
    from router.settings import Config, RouterConfig

__all__ = ["LiveConnectionCounts", "RouterRuntime"]

log = logging.getLogger("router.pool")

CACHE_PURGE_MIN_PERIOD_S = 1.0
"""Sweep expired cache entries at most this often (a tiny timeout would otherwise spin)."""


class LiveConnectionCounts:
    """Connections this process has routed to each target and not yet closed."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def connection_count(self, node_id: str) -> int | None:
        """The live count of a target (0 when none; never unknown: we count them all)."""
        return self._counts.get(node_id, 0)

    def opened(self, node_id: str) -> None:
        """Count one more connection routed to a target."""
        self._counts[node_id] = self._counts.get(node_id, 0) + 1

    def closed(self, node_id: str) -> None:
        """Count one connection to a target as closed."""
        self._counts[node_id] -= 1


class RouterRuntime:
    """A connection router at run time: engine, pool, counts, and the pool-change signal."""

    def __init__(
        self,
        config: Config,
        router: RouterConfig,
        metrics: Metrics,
        *,
        round_robin_start: int | None = None,
    ) -> None:
        pool, local = build_pool(config, router)
        self.config = router
        self.name = router.name
        self.pool = pool
        self.metrics = metrics
        self.counts = LiveConnectionCounts()
        self.engine = RoutingEngine(
            router, pool, local, round_robin_start=round_robin_start, counts=self.counts
        )
        self._changed = trio.Event()
        # Metric children by label value, looked up once instead of per connection; filled on
        # first use so /metrics shows only what happened.
        self._decision_counters: dict[RouteStatus, Counter] = {}
        self._accepted_counters: dict[str, Counter] = {}
        if pool is not None:
            metrics.pool_active.labels(self.name).set(0)
            for target in pool.targets:
                metrics.target_ready.labels(self.name, target.node_id).set(0)

    def apply_events(self, events: Iterable[PoolEvent]) -> None:
        """Log and export pool changes, and wake decisions waiting for the quorum."""
        changed = False
        for event in events:
            changed = True
            match event.kind:
                case PoolEventKind.TARGET_READY:
                    log.info("router=%s target=%s is ready", self.name, event.node_id)
                    self.metrics.target_ready.labels(self.name, event.node_id).set(1)
                case PoolEventKind.TARGET_NOT_READY:
                    log.warning(
                        "router=%s target=%s is not ready: %s", self.name, event.node_id, event.detail
                    )
                    self.metrics.target_ready.labels(self.name, event.node_id).set(0)
                case PoolEventKind.TARGET_FAILOVER:
                    log.warning("router=%s target=%s failed over: %s", self.name, event.node_id, event.detail)
                case PoolEventKind.POOL_ACTIVE:
                    log.info("router=%s pool is active (%s)", self.name, event.detail)
                    self.metrics.pool_active.labels(self.name).set(1)
                case PoolEventKind.POOL_INACTIVE:
                    log.warning("router=%s pool is inactive (%s)", self.name, event.detail)
                    self.metrics.pool_active.labels(self.name).set(0)
        if changed:
            woken, self._changed = self._changed, trio.Event()
            woken.set()

    async def serve_cache_purge(self) -> None:
        """Drop expired cache entries every timeout, so keys never looked up again do not pile up."""
        cache = self.engine.cache
        if cache is None or cache.config.timeout_ms == 0:
            return
        period_s = max(cache.config.timeout_ms / 1000, CACHE_PURGE_MIN_PERIOD_S)
        while True:
            await trio.sleep(period_s)
            dropped = cache.purge_expired(trio.current_time())
            if dropped:
                log.debug("router=%s dropped %d expired cache entries", self.name, dropped)

    def count_decision(self, status: RouteStatus) -> None:
        """Count what a routed client connection got (`router_routing_decisions_total`)."""
        counter = self._decision_counters.get(status)
        if counter is None:
            counter = self._decision_counters[status] = self.metrics.decisions.labels(self.name, status.value)
        counter.inc()

    def count_accepted(self, acceptor: str) -> None:
        """Count a client connection accepted for this router (`router_connections_accepted_total`)."""
        counter = self._accepted_counters.get(acceptor)
        if counter is None:
            counter = self._accepted_counters[acceptor] = self.metrics.connections_accepted.labels(
                acceptor, self.name
            )
        counter.inc()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds, re-checking after every pool change."""
        while not predicate():
            await self._changed.wait()

    async def decide(self, facts: ConnectionFacts) -> RouteDecision:
        """The whole SPEC A1 workflow for a connection, waiting up to quorum-timeout for quorum.

        The caller's cancel scope bounds the wait as well. The caller counts the outcome it acts
        on (`Metrics.decisions`), which may differ (a local decision without a local connector).
        """
        engine = self.engine
        key = engine.connection_key(facts)
        if engine.is_internal(facts):
            decision = engine.local_decision(key, "internal client id")
        else:
            decision = engine.early(key, trio.current_time()) or await self._select(key)
        return decision

    def lookup(self, key: str) -> RouteDecision:
        """The management lookup (SPEC A7): from step 3, no quorum wait."""
        decision = self.engine.lookup(key, trio.current_time())
        self.metrics.lookups.labels(self.name, decision.status.value).inc()
        return decision

    async def _select(self, key: str) -> RouteDecision:
        pool = self.pool
        pool_config = self.config.pool
        assert pool is not None, "early() refuses without a pool"
        assert pool_config is not None, "a router with a pool has a pool config"
        targets = pool.routing_targets()
        timeout_s = pool_config.quorum_timeout_ms / 1000
        if not targets and timeout_s > 0 and pool.ready_count() < pool.quorum_size:
            with trio.move_on_after(timeout_s):
                await self.wait_until(lambda: bool(pool.routing_targets()))
            targets = pool.routing_targets()
        return self.engine.select(key, targets, trio.current_time())
