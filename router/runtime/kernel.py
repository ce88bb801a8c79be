"""One connection router at run time: the kernel both data paths and every service share.

Both data paths (the trio path in the trio thread, the fast path in its epoll thread) and the
services share one `RouterRuntime` per router. It holds the router's guarded state
(router/runtime/state.py: configuration, engine, pool, live connections, one lock), reports what
happens to its subscribers (log lines, metrics, the event log), accepts connections, decides them
(waiting for the quorum or a shared cache when it must), answers management lookups and status
snapshots, and applies a reload's configuration. Two slices carry the rest: `pool`
(router/runtime/pool.py: probes, discovery, administrative states, passive health, the waits) and
`connections` (router/runtime/connections.py: the data paths' registry, closing). The features
bring their own slices (router/features/*/), written against `held()`.

Pool changes are reported (log lines, metrics) and acted on: the proxied connections of a target
that becomes not ready, or of the former member of a failed-over HA pair, are closed through the
closers their data path registered (router/core/live.py), so this package knows neither path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import trio

from router.core.engine import (
    DecisionReason,
    QuorumWait,
    RouteDecision,
    RouteStatus,
    RoutingEngine,
    build_pool,
)
from router.core.events import CONNECTION_IDS, Accepted, ConnectionRef, LookedUp
from router.core.live import LiveConnections
from router.core.plan import after_connect_failed, held_back
from router.core.status import TargetHistory, snapshot
from router.reports import MetricUpdates, TargetMetrics, log_event
from router.runtime.connections import RouterConnections
from router.runtime.gates import RouterGates
from router.runtime.pool import RouterPool
from router.runtime.reports import Reports
from router.runtime.state import RouterState

if TYPE_CHECKING:
    from keys import ConnectionFacts
    from pools import PoolEvent
    from router.config.settings import AcceptorConfig, Config, RouterConfig
    from router.core.address import Address
    from router.core.engine import Wait
    from router.core.events import GateOutcome
    from router.core.plan import Opening, Proxy, Refuse
    from router.core.status import RouterStatus
    from router.metric_values import Tally
    from router.metrics import Metrics

__all__ = ["RouterRuntime", "decide"]

_DIRECTIONS: Final = ("client_to_target", "target_to_client")
"""The `direction` label of `router_proxied_bytes_total`, in `LiveConnections.relayed`'s order."""


class RouterRuntime:
    """A connection router at run time (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        router: RouterConfig,
        metrics: Metrics,
        *,
        round_robin_start: int | None = None,
    ) -> None:
        """Build one router's run-time state; its log lines and metrics are subscribed already.

        Args:
            config: the whole configuration (connectors, cluster connections).
            router: this router's configuration.
            metrics: the process's metric families.
            round_robin_start: the first round-robin position (tests); random when None.
        """
        pool, local = build_pool(config, router)
        connections = LiveConnections()
        try:
            clock = trio.lowlevel.current_clock().current_time
        except RuntimeError:  # built outside trio (tests of the decision code): a clock of its own
            clock = time.monotonic
        gates = RouterGates([] if pool is None else pool.targets, clock)
        engine = RoutingEngine(
            router, pool, local, round_robin_start=round_robin_start, counts=connections, slow_start=gates
        )
        self._state = state = RouterState(router, engine, pool, connections, TargetHistory())
        self._lock = state.lock
        self.name: Final = router.name
        self.metrics: Final = metrics
        self._round_robin_start = round_robin_start
        self._updates = updates = MetricUpdates(metrics)
        self.report: Final = Reports(log_event, updates=updates)
        """Hand an event to every subscriber; `report.subscribe` adds one."""
        self.connections: Final = RouterConnections(self.name, state, self.report)
        """The proxied connections: registered by the data paths, closed by the router."""
        self.pool: Final = RouterPool(self.name, state, self.report, self.connections, metrics, gates)
        state.target_sections["gate"] = lambda target, _history, _now: gates.section(target.node_id)
        """The pool's changes, queries and waits."""
        updates.router_started(self.name, None if pool is None else [t.node_id for t in pool.targets])
        if pool is not None:
            self.pool.observe([t.node_id for t in pool.targets], time.time())
        self._target_metrics = target_metrics = TargetMetrics(metrics, self.name)
        self._unsample = (
            metrics.sample_when_scraped(lambda: target_metrics(self.status().pool)),
            metrics.sample_when_scraped(self._sample_cache),
            metrics.sample_when_scraped(self._sample_bytes),
            metrics.sample_when_scraped(self._sample_gates),
        )
        """Takes this router's samplers off (`retire`)."""
        self._cache_reported = (0, 0, 0)
        """The cache's evictions, hits and misses at the last scrape."""
        self._bytes_reported: dict[str, tuple[int, int]] = {}
        """The bytes relayed each way to each target at the last scrape (`_sample_bytes`)."""

    @property
    def config(self) -> RouterConfig:
        """The router's configuration in force (replaced as a whole by `reconfigure`)."""
        return self._state.config

    def held(self) -> RouterState:
        """The router's guarded state, to enter (`with runtime.held() as state:`) for reading or
        changing it: what the features' slices of the runtime are written against. Hold it
        briefly: both data paths' threads wait for it."""
        return self._state

    def _sample_cache(self) -> None:
        """The cache's size, evictions, hits and misses, for a scrape (the metrics' thread)."""
        with self._state as state:
            cache = state.engine.cache
            if cache is None:
                return
            entries, counts = len(cache), (cache.evictions, cache.hits, cache.misses)
        labels = (self.name,)
        metrics = self.metrics
        metrics.cache_entries.set(labels, entries)
        evictions, hits, misses = (
            now - before for now, before in zip(counts, self._cache_reported, strict=True)
        )
        metrics.cache_evictions.inc(labels, evictions)
        metrics.cache_lookups.inc((self.name, "hit"), hits)
        metrics.cache_lookups.inc((self.name, "miss"), misses)
        self._cache_reported = counts

    def _sample_bytes(self) -> None:
        """The bytes relayed since the last scrape, open connections' included, for a scrape (the
        metrics' thread): a long-lived connection's traffic shows while it flows."""
        with self._state as state:
            relayed = state.connections.relayed()
        metrics, name, reported = self.metrics, self.name, self._bytes_reported
        for node_id, counts in relayed.items():
            before = reported.get(node_id, (0, 0))
            for direction, now, then in zip(_DIRECTIONS, counts, before, strict=True):
                if now > then:
                    metrics.proxied_bytes.inc((name, node_id, direction), now - then)
        self._bytes_reported = relayed

    def _sample_gates(self) -> None:
        """Each gate's queue, slots held and effective limit, for a scrape (the metrics' thread)."""
        metrics = self.metrics
        for node_id, gate in self.pool.gates.states().items():
            labels = (self.name, node_id)
            metrics.storm.queue_length.set(labels, gate.queued)
            if gate.limit is not None:
                metrics.storm.gate_open.set(labels, gate.open)
                metrics.storm.gate_limit.set(labels, gate.limit)

    # -- connections and decisions (either thread, unless said) --

    def accept(self, acceptor: str, peer: Address, tally: Tally | None = None) -> ConnectionRef:
        """A new client connection: its reference (with a process-unique id), reported `Accepted`
        (counted into `tally`, when given and only the metrics read it)."""
        conn = ConnectionRef(id=next(CONNECTION_IDS), router=self.name, acceptor=acceptor, peer=peer)
        if self.report.subscribed:
            self.report(Accepted(conn=conn))
        else:  # only the metrics read it
            self._updates.accepted(acceptor, self.name, tally)
        return conn

    def decide_now(self, facts: ConnectionFacts, now: float) -> RouteDecision | Wait:
        """The SPEC A1 workflow for a connection as far as it goes without waiting (`RoutingEngine.begin`).

        Args:
            facts: what is known about the connection.
            now: the current time of the trio clock (the fast path's thread reads it too).
        """
        lock = self._lock
        lock.acquire()  # not `with`: every connection pays this
        try:
            return self._state.engine.begin(facts, now)
        finally:
            lock.release()

    async def resolve(self, wait: Wait) -> RouteDecision:
        """Finish a decision that had to wait (trio thread): for the quorum, or for the cache
        shared through ZooKeeper (its resolver, attached before the router serves)."""
        if isinstance(wait, QuorumWait):
            return await self.pool.wait_for_quorum(wait)
        resolver = self._state.resolver
        assert resolver is not None, "a router whose engine asks for its shared cache has one"
        return await resolver(wait)

    def after_connect_failed(
        self,
        acceptor: AcceptorConfig,
        opening: Opening,
        failed: Proxy,
        now: float,
        *,
        retry: bool,
        held: GateOutcome | None = None,
    ) -> Proxy | Refuse:
        """The connect `failed` planned did not succeed: connect to another ready target once
        (`retry`, HAProxy's redispatch; the cache entry moves with it), else refuse in the client's
        protocol. `held`: it was not even tried, its target's gate held it back (QUEUE_FULL,
        QUEUE_TIMEOUT): to another ready target only when the router's policy lets the key move
        (`RoutingEngine.elsewhere`), else refused as held back."""
        if held is not None:
            with self._state as state:
                moved = state.engine.elsewhere(failed.key, failed.reason, failed.target.node_id, now)
            if moved is None or not retry:
                return held_back(self.name, opening, failed.key, held)
            return after_connect_failed(acceptor, self.name, opening, moved)
        if retry:
            with self._state as state:
                decision = state.engine.redispatch(failed.key, failed.reason, failed.target.node_id, now)
        else:
            decision = RouteDecision(
                key=failed.key, status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.CONNECT_FAILED
            )
        return after_connect_failed(acceptor, self.name, opening, decision)

    def lookup(self, key: str, *, dry_run: bool = False) -> RouteDecision:
        """The management lookup (SPEC A7): from step 3, no quorum wait; reported `LookedUp`. A
        dry run changes nothing (no cache write, no round-robin move). Trio thread."""
        with self._state as state:
            engine, now = state.engine, trio.current_time()
            decision = engine.peek(key, now) if dry_run else engine.lookup(key, now)
        self.report(LookedUp(router=self.name, key=decision.key, status=decision.status))
        return decision

    def status(self) -> RouterStatus:
        """A consistent snapshot of the router's filters, cache and pool (with the features' members
        of each target's document, `RouterState.target_sections`, at the time of day)."""
        with self._state as state:
            return snapshot(
                state.config,
                state.engine,
                state.pool,
                state.connections,
                state.history,
                now=time.time(),
                sections=state.target_sections,
                full=self.pool.gates.full,
            )

    # -- a configuration reload (trio thread) --

    def reconfigure(self, config: Config, router: RouterConfig) -> None:
        """Apply a reload's configuration of this router in place (router/core/reload.py): its
        open connections and their registry stay; the pool keeps the state of unchanged targets and
        the discovered members; the policy (its round-robin position) and the cache (its entries)
        stay when their settings did not change; a filter the file did not change keeps the value
        it has at run time (set through the admin API). Pool changes are reported as they happen
        (targets joining and leaving); closing the connections of departed targets is the
        caller's (`RouterConnections.close_departed`).

        Args:
            config: the whole configuration in force after the reload.
            router: this router's configuration in it.
        """
        assert router.name == self.name, "a reload matches routers by name"
        built, local = build_pool(config, router)
        events: list[PoolEvent] = []
        with self._state as state:
            old, engine, pool = state.config, state.engine, state.pool
            if built is None or pool is None:
                if pool is not None:  # the pool went: its targets leave
                    events = pool.reconfigure(pool.quorum_size, [])
                pool = built
                if built is not None:
                    self._updates.router_started(self.name, [t.node_id for t in built.targets])
                else:
                    self.metrics.pool_active.remove((self.name,))
                    self.metrics.pool_open_targets.remove((self.name,))
            else:
                assert router.pool is not None
                targets = list(built.targets)
                if config.pool_discovery_group(router) is not None:  # discovered members stay
                    targets += [t for t in pool.targets if not t.local]
                events = pool.reconfigure(router.pool.quorum_size, targets, router.pool.outlier_detection)
            new = RoutingEngine(
                router,
                pool,
                local,
                round_robin_start=self._round_robin_start,
                counts=state.connections,
                slow_start=self.pool.gates,
            )
            if old.policy == router.policy and engine.policy is not None:
                new.policy = engine.policy
            if (old.cache, old.cache_zookeeper) == (router.cache, router.cache_zookeeper):
                new.cache = engine.cache
            else:
                self._cache_reported = (0, 0, 0)
                if new.cache is None:
                    self.metrics.cache_entries.remove((self.name,))
            if old.key_filter == router.key_filter:
                new.key_filter = engine.key_filter
            if old.local_target_filter == router.local_target_filter:
                new.local_target_filter = engine.local_target_filter
            appeared = state.pool is None and pool is not None
            state.config, state.engine, state.pool = router, new, pool
            if appeared:  # a pool the router did not have: its targets' history starts now
                assert pool is not None
                self.pool.observe([t.node_id for t in pool.targets], time.time())
            in_pool = () if pool is None else pool.targets
        self.pool.gates.reconfigure(in_pool)  # limits changed in place: waiting clients stay
        self.pool.apply(events)

    def retire(self) -> None:
        """The router left the configuration: its targets leave (reported), and its samplers and
        router-level series go (else an alert on its pool would fire for good, and the samplers
        would keep it in memory). Closing its connections is the caller's
        (`RouterConnections.close_departed`)."""
        with self._state as state:
            pool = state.pool
            events = [] if pool is None else pool.reconfigure(pool.quorum_size, [])
        self.pool.apply(events)
        self._sample_bytes()  # what its connections relayed until now stays counted
        for unsample in self._unsample:
            unsample()
        self._target_metrics(None)
        for family in (self.metrics.pool_active, self.metrics.pool_open_targets, self.metrics.cache_entries):
            family.remove((self.name,))


async def decide(runtime: RouterRuntime, facts: ConnectionFacts) -> RouteDecision:
    """The whole workflow, waiting (for the shared cache, the quorum) when it must (trio thread):
    what the trio path does, in one call (tests, studies)."""
    decision = runtime.decide_now(facts, trio.current_time())
    if isinstance(decision, RouteDecision):
        return decision
    return await runtime.resolve(decision)
