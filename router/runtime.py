"""One router at run time: its engine and pool, the quorum wait, and live connection counts.

The engine (`router/core/engine.py`) decides; this module adds what needs trio: waiting up to
`quorum-timeout` for the pool's quorum (SPEC A1 step 7), waking waiters when the health checker
changes the pool, and counting the connections we route so LEAST_CONNECTIONS sees a burst.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from pools import PoolEventKind
from router.core.engine import RouteDecision, RouteStatus, RoutingEngine, build_pool
from router.core.live import CLOSED_BY_FAILOVER, CLOSED_BY_TARGET_NOT_READY, LiveConnections

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client import Counter, Gauge

    from keys import ConnectionFacts, SniffError, WireProtocol
    from pools import Connector, PoolEvent, Target
    from router.config.settings import Config, RouterConfig
    from router.datapath.fast_path import FastPath
    from router.metrics import Metrics

__all__ = ["LiveConnectionCounts", "RelayMetrics", "RouterRuntime"]

log = logging.getLogger("router.pool")
conn_log = logging.getLogger("router.conn")
"""The log of client connections, written alike by both data paths (router/datapath/trio_path.py and
router/datapath/fast_path.py) through the `RouterRuntime.report_*` methods."""

CACHE_PURGE_MIN_PERIOD_S = 1.0
"""Sweep expired cache entries at most this often (a tiny timeout would otherwise spin)."""


class LiveConnectionCounts:
    """Connections this process has routed to each target and not yet closed, plus the counts
    brokers report to the health probe (`probeConnectionCount=true`).

    With a broker count, a target's count is the broker's (every client it has, ours included)
    plus how many more connections we hold to it now than when the count was read, so a burst
    between two probes still spreads; without one it is our own live count.
    """

    __slots__ = ("_counts", "_lock", "_reported")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()  # the fast-path thread counts too
        self._reported: dict[str, tuple[int, int]] = {}
        """node id -> (the broker's count, our live count when it was read)."""

    def connection_count(self, node_id: str) -> int | None:
        """The count of a target (0 when none; never unknown: we count ours all)."""
        live = self._counts.get(node_id, 0)
        reported = self._reported.get(node_id)
        if reported is None:
            return live
        broker, live_then = reported
        return max(0, broker + live - live_then)

    def report(self, node_id: str, broker_count: int | None) -> None:
        """Record the connection count a broker reported to the probe; None forgets the last
        one (the probe could not read it), leaving our own count."""
        if broker_count is None:
            self._reported.pop(node_id, None)
            return
        with self._lock:
            self._reported[node_id] = (broker_count, self._counts.get(node_id, 0))

    def opened(self, node_id: str) -> None:
        """Count one more connection routed to a target."""
        with self._lock:
            self._counts[node_id] = self._counts.get(node_id, 0) + 1

    def closed(self, node_id: str) -> None:
        """Count one connection to a target as closed."""
        with self._lock:
            self._counts[node_id] -= 1


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """The metric children a connection proxied to one target updates."""

    active: Gauge
    """`router_proxied_connections` of the router and target."""
    to_target: Counter
    """`router_proxied_bytes_total` of the router, direction client_to_target."""
    to_client: Counter
    """`router_proxied_bytes_total` of the router, direction target_to_client."""


class RouterRuntime:
    """A connection router at run time: engine, pool, counts, and the pool-change signal.

    Its `count_*` and `report_*` methods count and log what happens to client connections, the
    same way for the trio path and the fast path (which calls them in its own thread).
    """

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
        self.fast_path: FastPath | None = None
        """The epoll relay thread serving some acceptors of this router, if any."""
        self.lock = threading.Lock()
        """Held around every use of the engine and the pool: the fast-path thread
        (router/datapath/fast_path.py) decides while this thread probes, discovers and looks up."""
        self.connections = LiveConnections()
        """The proxied connections open now, which the TTL checker and pool changes can close."""
        self.engine = RoutingEngine(
            router, pool, local, round_robin_start=round_robin_start, counts=self.counts
        )
        self._changed = trio.Event()
        # Metric children by label value, looked up once instead of per connection (a `labels()`
        # call costs microseconds); filled on first use so /metrics shows only what happened.
        self._decision_counters: dict[RouteStatus, Counter] = {}
        self._accepted_counters: dict[str, Counter] = {}
        self._relay_metrics: dict[str, RelayMetrics] = {}
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
                    log.info(
                        "router=%s target=%s is ready%s",
                        self.name,
                        event.node_id,
                        f" ({event.detail})" if event.detail else "",
                    )
                    self.metrics.target_ready.labels(self.name, event.node_id).set(1)
                case PoolEventKind.TARGET_NOT_READY:
                    log.warning(
                        "router=%s target=%s is not ready: %s", self.name, event.node_id, event.detail
                    )
                    self.metrics.target_ready.labels(self.name, event.node_id).set(0)
                    self._close_connections_to(event.node_id)
                case PoolEventKind.TARGET_FAILOVER:
                    log.warning("router=%s target=%s failed over: %s", self.name, event.node_id, event.detail)
                    if event.node_id is not None and event.former is not None:
                        self._close_connections_to(
                            event.node_id, address=event.former, reason=CLOSED_BY_FAILOVER
                        )
                case PoolEventKind.TARGET_ADDED:
                    log.info(
                        "router=%s target=%s joined the pool (%s)", self.name, event.node_id, event.detail
                    )
                    self.metrics.target_ready.labels(self.name, event.node_id).set(0)
                case PoolEventKind.TARGET_REMOVED:
                    log.warning(
                        "router=%s target=%s left the pool (it was %s)",
                        self.name,
                        event.node_id,
                        event.detail,
                    )
                    self.metrics.target_ready.remove(self.name, event.node_id)
                    self.metrics.connect_failures.remove(self.name, event.node_id)
                case PoolEventKind.POOL_ACTIVE:
                    log.info("router=%s pool is active (%s)", self.name, event.detail)
                    self.metrics.pool_active.labels(self.name).set(1)
                case PoolEventKind.POOL_INACTIVE:
                    log.warning("router=%s pool is inactive (%s)", self.name, event.detail)
                    self.metrics.pool_active.labels(self.name).set(0)
        if changed:
            woken, self._changed = self._changed, trio.Event()
            woken.set()

    def add_target(self, target: Target) -> None:
        """Add a discovered target to the pool; `serve_health_checks` starts probing it at once.

        Raises:
            ValueError: the pool already has a target with this node id.
        """
        assert self.pool is not None, "only a router with a pool discovers targets"
        with self.lock:
            events = self.pool.add_target(target)
        self.apply_events(events)

    def remove_target(self, node_id: str) -> None:
        """Remove a discovered target from the pool; its probe loop stops and its metrics go.

        Raises:
            KeyError: no target with this node id.
        """
        assert self.pool is not None, "only a router with a pool discovers targets"
        with self.lock:
            events = self.pool.remove_target(node_id)
        self.apply_events(events)

    def connect_refused(self, target: Target, connector: Connector, reason: str) -> None:
        """A connection to a member of the pool was refused: that member is un-ready at once, as
        if its probe had failed (the next successful probe makes it ready again), so the clients
        that follow go to the member that took over instead of waiting for the next check.

        Nothing happens when the target has left the pool (or was replaced) since it was chosen.
        """
        pool = self.pool
        if pool is None or target.connector is None:
            return
        try:
            member = target.connector.members.index(connector)
        except ValueError:
            return
        detail = f"connect to {connector.url} failed: {reason}"
        with self.lock:
            if pool.target(target.node_id) is not target:
                return
            events = pool.record_check(target.node_id, False, detail, member=member)
        self.apply_events(events)

    def _close_connections_to(
        self,
        node_id: str | None,
        *,
        address: tuple[str, int] | None = None,
        reason: str = CLOSED_BY_TARGET_NOT_READY,
    ) -> None:
        """Close the proxied connections to a target that is not ready (or, after a failover, to
        its member at `address`), so that their clients reconnect through the router (SPEC B, HA
        awareness); logged once with the count. The fast path closes its own in its thread, where
        it logs and counts them the same way (`report_router_closes`)."""
        if node_id is None:
            return
        if self.fast_path is not None:
            self.fast_path.close_target(self, node_id, address, reason)
        closed = self.connections.close_target(node_id, address=address, reason=reason)
        self.report_router_closes(node_id, address, reason, closed)

    def report_router_closes(
        self, node_id: str, address: tuple[str, int] | None, reason: str, closed: int
    ) -> None:
        """Count and log (once) the connections the router closed to a target or member."""
        if not closed:
            return
        self.metrics.router_closes.labels(self.name, reason).inc(closed)
        what = "is not ready" if address is None else f"member {address[0]}:{address[1]} is not active"
        log.warning(
            "router=%s target=%s %s: closing its %d proxied connection(s)", self.name, node_id, what, closed
        )

    async def serve_cache_purge(self) -> None:
        """Drop expired cache entries every timeout, so keys never looked up again do not pile up."""
        cache = self.engine.cache
        if cache is None or cache.config.timeout_ms == 0:
            return
        period_s = max(cache.config.timeout_ms / 1000, CACHE_PURGE_MIN_PERIOD_S)
        while True:
            await trio.sleep(period_s)
            with self.lock:
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

    def relay_metrics(self, node_id: str) -> RelayMetrics:
        """The metric children of the connections proxied to a target, looked up once."""
        children = self._relay_metrics.get(node_id)
        if children is None:
            metrics = self.metrics
            children = self._relay_metrics[node_id] = RelayMetrics(
                active=metrics.active_connections.labels(self.name, node_id),
                to_target=metrics.proxied_bytes.labels(self.name, "client_to_target"),
                to_client=metrics.proxied_bytes.labels(self.name, "target_to_client"),
            )
        return children

    def report_opening_rejected(self, acceptor: str, peer: str, exc: SniffError) -> None:
        """Count and log a client closed because of its opening's bytes (a `SniffError`)."""
        self.metrics.client_errors.labels(acceptor, exc.protocol).inc()
        conn_log.warning(
            "peer=%s acceptor=%s protocol=%s handshake rejected: %s", peer, acceptor, exc.protocol, exc.reason
        )

    def report_opening_timeout(
        self, acceptor: str, peer: str, protocol: str, timeout_s: float, bytes_read: int
    ) -> None:
        """Count and log a client closed at its handshake deadline (`protocol`: as far as known)."""
        self.metrics.client_errors.labels(acceptor, "timeout").inc()
        conn_log.warning(
            "peer=%s acceptor=%s protocol=%s handshake not complete after %g s (%d bytes)",
            peer,
            acceptor,
            protocol,
            timeout_s,
            bytes_read,
        )

    def report_redirect(self, peer: str, key: str, node_id: str, protocol: WireProtocol) -> None:
        """Log and count an OK decision answered with a native redirect."""
        conn_log.info(
            "peer=%s router=%s key=%s target=%s outcome=REDIRECT protocol=%s",
            peer,
            self.name,
            key,
            node_id,
            protocol.value,
        )
        self.count_decision(RouteStatus.OK)

    def report_connect_failure(self, peer: str, key: str, node_id: str, reason: str) -> None:
        """Count and log a connect to the chosen target that failed (`connect_refused` is apart:
        it must run in the trio thread)."""
        self.metrics.connect_failures.labels(self.name, node_id).inc()
        conn_log.warning(
            "peer=%s router=%s key=%s target=%s outcome=CONNECT_FAILED reason=%s",
            peer,
            self.name,
            key,
            node_id,
            reason,
        )

    def report_connected(self, peer: str, key: str, node_id: str) -> None:
        """Log a client connected to its target (the relay starts)."""
        conn_log.info("peer=%s router=%s key=%s target=%s outcome=OK", peer, self.name, key, node_id)

    def report_closed(
        self, peer: str, node_id: str, counts: list[int], duration_s: float, closed_by: str | None
    ) -> None:
        """Count the bytes of a proxied connection that ended and log it.

        Args:
            peer: the client's `ip:port`.
            node_id: the target's node id.
            counts: bytes `[client -> target, target -> client]`.
            duration_s: how long it was proxied.
            closed_by: why the router closed it (a reset, the TTL, ...), or None when its ends did.
        """
        children = self.relay_metrics(node_id)
        children.to_target.inc(counts[0])
        children.to_client.inc(counts[1])
        conn_log.info(
            "peer=%s router=%s target=%s closed bytes_in=%d bytes_out=%d duration_s=%.3f%s",
            peer,
            self.name,
            node_id,
            counts[0],
            counts[1],
            duration_s,
            "" if closed_by is None else f" reason={closed_by}",
        )

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
        with self.lock:
            key = engine.connection_key(facts)
            if engine.is_internal(facts):
                return engine.local_decision(key, "internal client id")
            decision = engine.early(key, trio.current_time())
        return decision or await self._select(key)

    def lookup(self, key: str) -> RouteDecision:
        """The management lookup (SPEC A7): from step 3, no quorum wait."""
        with self.lock:
            decision = self.engine.lookup(key, trio.current_time())
        self.metrics.lookups.labels(self.name, decision.status.value).inc()
        return decision

    async def _select(self, key: str) -> RouteDecision:
        pool = self.pool
        pool_config = self.config.pool
        assert pool is not None, "early() refuses without a pool"
        assert pool_config is not None, "a router with a pool has a pool config"
        with self.lock:
            targets = pool.routing_targets()
            waiting = not targets and pool.ready_count() < pool.quorum_size
        timeout_s = pool_config.quorum_timeout_ms / 1000
        if waiting and timeout_s > 0:
            with trio.move_on_after(timeout_s):
                await self.wait_until(lambda: bool(pool.routing_targets()))
        with self.lock:
            return self.engine.select(key, pool.routing_targets(), trio.current_time())
