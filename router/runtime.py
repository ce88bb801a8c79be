"""One connection router at run time: its engine, pool and live connections under one lock, the
quorum wait, the pool-change signal, and the reports of what happens.

Both data paths (the trio path in the trio thread, the fast path in its epoll thread) and the
services (probes, discovery, admin, TTL checks) share one `RouterRuntime` per router. Every read or
change of the engine, the pool and the registry of live connections goes through a method here that
takes the router's lock; nothing outside reaches them. Pool changes (`record_check`, `add_target`,
`remove_target`, `connect_refused`) and the quorum wait run in the trio thread; decisions
(`decide_now`), registration (`register`/`unregister`) and reports (`report`) come from either.

Pool changes are reported (log lines, metrics) and acted on: the proxied connections of a target
that becomes not ready, or of the former member of a failed-over HA pair, are closed through the
closers their data path registered (router/core/live.py), so this module knows neither path.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from typing import TYPE_CHECKING, Final, Protocol

import trio

from cache.cache import Changes
from pools import PoolEventKind, PoolKind
from router.core.engine import (
    DecisionReason,
    QuorumWait,
    RouteDecision,
    RouteStatus,
    RoutingEngine,
    build_pool,
)
from router.core.events import Accepted, CloseReason, ConnectionRef, ConnectionsClosed, LookedUp
from router.core.live import LiveConnections, broker_failure, closed_by_pool_change
from router.core.plan import after_connect_failed
from router.core.shared_cache import UNANSWERED, SharedEntry
from router.core.status import CheckRecord, TargetHistory, operational_state, snapshot
from router.reports import MetricUpdates, TargetMetrics, log_event

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from cache.cache import CacheEntry, Row, TargetCache
    from keys import ConnectionFacts
    from pools import AdminState, Connector, PoolEvent, Target, TargetState
    from router.config.settings import AcceptorConfig, Config, RouterConfig
    from router.core.address import Address
    from router.core.engine import Wait
    from router.core.events import Closed, Event, Subscriber
    from router.core.framing import Farewell
    from router.core.live import LiveConnection
    from router.core.plan import Opening, Proxy, Refuse
    from router.core.reload import Departed
    from router.core.shared_cache import Answer
    from router.core.status import RouterStatus, ZooKeeperStatus
    from router.metrics import Metrics

__all__ = ["RouterRuntime", "SharedCacheClient", "close_removed"]

CACHE_PURGE_MIN_PERIOD_S: Final = 1.0
"""Sweep expired cache entries at most this often (a tiny timeout would otherwise spin)."""

_connection_ids = itertools.count(1)
"""Connection ids, unique in the process (`next` on a count is atomic under the GIL)."""


class SharedCacheClient(Protocol):
    """What a router asks of its cache shared through ZooKeeper (router/services/shared_cache.py)."""

    async def lookup(self, key: str) -> Answer:
        """The key's entry, None when there is none, UNANSWERED when ZooKeeper did not answer."""
        ...

    def missed(self, key: str) -> None:
        """A decision for `key` was made without ZooKeeper: claim it when ZooKeeper answers."""

    async def claim(self, key: str, node_id: str) -> SharedEntry | None:
        """Make `node_id` the key's entry unless another router's is there first: the entry in
        force (None: ZooKeeper did not answer)."""
        ...


class _Keep:
    """The default of `set_filters`' arguments: leave the filter as it is."""


KEEP: Final = _Keep()


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
        self.config = router
        """The router's configuration in force (replaced as a whole by `reconfigure`)."""
        self.name = router.name
        self.metrics = metrics
        self._pool = pool
        self._lock = threading.Lock()
        self._connections = LiveConnections()
        self._round_robin_start = round_robin_start
        self._engine = RoutingEngine(
            router, pool, local, round_robin_start=round_robin_start, counts=self._connections
        )
        self._changed = trio.Event()
        self._outliers_changed = trio.Event()
        """Set when an ejection begins, so `serve_outlier_returns` looks at its end."""
        self._history = TargetHistory()
        """Each target's last probes, why it is not ready, when its state last changed."""
        self._updates = updates = MetricUpdates(metrics)
        updates.router_started(self.name, None if pool is None else [t.node_id for t in pool.targets])
        if pool is not None:
            self._observe_targets([t.node_id for t in pool.targets], time.time())
        self._target_metrics = target_metrics = TargetMetrics(metrics, self.name)
        self._unsample = (
            metrics.sample_when_scraped(lambda: target_metrics(self.status().pool)),
            metrics.sample_when_scraped(self._sample_cache),
            metrics.sample_when_scraped(self._sample_bytes),
        )
        """Takes this router's samplers off (`retire`)."""
        self._subscribers: tuple[Subscriber, ...] = (log_event, updates)
        self._shared: SharedCacheClient | None = None
        """The cache shared through ZooKeeper (router/services/shared_cache.py), once attached."""
        self.zookeeper: dict[str, ZooKeeperStatus] = {}
        """Its ZooKeeper sessions by use (`discovery`, `shared_cache`), as `SessionWatch`
        (router/services/discovery.py) last saw them; `GET /api/v1/status` shows them."""
        self._shared_evicted: set[str] = set()
        """Keys operators evicted, for a shared cache to delete in ZooKeeper."""
        self._cache_reported = (0, 0, 0)
        """The cache's evictions, hits and misses at the last scrape."""
        self._bytes_reported = (0, 0)
        """The bytes relayed each way at the last scrape (`_sample_bytes`)."""

    def _sample_cache(self) -> None:
        """The cache's size, evictions, hits and misses, for a scrape (the metrics' thread)."""
        cache = self._engine.cache
        if cache is None:
            return
        with self._lock:
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
        with self._lock:
            relayed = self._connections.relayed()
        metrics, name = self.metrics, self.name
        for direction, now, before in zip(
            ("client_to_target", "target_to_client"), relayed, self._bytes_reported, strict=True
        ):
            if now > before:
                metrics.proxied_bytes.inc((name, direction), now - before)
        self._bytes_reported = relayed

    # -- reports --

    def subscribe(self, subscriber: Subscriber) -> None:
        """Have `subscriber` receive every event from now on (in the reporting thread)."""
        self._subscribers = (*self._subscribers, subscriber)

    def report(self, event: Event) -> None:
        """Hand an event to every subscriber (log lines, metrics, ...)."""
        for subscriber in self._subscribers:
            subscriber(event)

    def accept(self, acceptor: str, peer: Address) -> ConnectionRef:
        """A new client connection: its reference (with a process-unique id), reported `Accepted`."""
        conn = ConnectionRef(id=next(_connection_ids), router=self.name, acceptor=acceptor, peer=peer)
        self.report(Accepted(conn=conn))
        return conn

    # -- decisions (either thread) --

    def decide_now(self, facts: ConnectionFacts, now: float) -> RouteDecision | Wait:
        """The SPEC A1 workflow for a connection as far as it goes without waiting (`RoutingEngine.begin`).

        Args:
            facts: what is known about the connection.
            now: the current time of the trio clock (the fast path's thread reads it too).
        """
        lock = self._lock
        lock.acquire()  # not `with`, here and in register/unregister: every connection pays this
        try:
            return self._engine.begin(facts, now)
        finally:
            lock.release()

    def after_connect_failed(
        self, acceptor: AcceptorConfig, opening: Opening, failed: Proxy, now: float, *, retry: bool
    ) -> Proxy | Refuse:
        """The connect `failed` planned did not succeed: connect to another ready target once
        (`retry`, HAProxy's redispatch; the cache entry moves with it), else refuse in the client's
        protocol (either thread)."""
        if retry:
            with self._lock:
                decision = self._engine.redispatch(failed.key, failed.reason, failed.target.node_id, now)
        else:
            decision = RouteDecision(
                key=failed.key, status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.CONNECT_FAILED
            )
        return after_connect_failed(acceptor, self.name, opening, decision)

    def attach_shared(self, shared: SharedCacheClient) -> None:
        """Use `shared` for the misses of a cache shared through ZooKeeper (before serving)."""
        self._shared = shared

    async def resolve(self, wait: Wait) -> RouteDecision:
        """Finish a decision that had to wait (trio thread): ask the shared cache, and/or wait
        for the quorum; a new choice is claimed in the shared cache, and another router's choice
        that won the claim is adopted when its target is ready."""
        if isinstance(wait, QuorumWait):
            return await self.wait_for_quorum(wait)
        shared = self._shared
        assert shared is not None, "a router whose engine asks for its shared cache has one"
        found = await shared.lookup(wait.key)
        entry = found if isinstance(found, SharedEntry) else None  # bypassed unless ready here
        with self._lock:
            step = self._engine.after_shared(
                wait, None if entry is None else entry.node_id, trio.current_time()
            )
        decision = step if isinstance(step, RouteDecision) else await self.wait_for_quorum(step)
        if decision.reason is not DecisionReason.POLICY or decision.target is None:
            return decision
        if found is UNANSWERED:
            shared.missed(wait.key)
            return decision
        winner = await shared.claim(wait.key, decision.target.node_id)
        if winner is None or winner.node_id == decision.target.node_id:
            return decision
        with self._lock:
            adopted = self._engine.adopt(wait.key, winner.node_id, trio.current_time())
        if adopted is None:
            return decision
        self.metrics.cache_shared_conflicts.inc((self.name,))
        return adopted

    async def wait_for_quorum(self, wait: QuorumWait) -> RouteDecision:
        """Wait up to the quorum timeout for the pool to have routing targets, then decide (trio
        thread). The caller's cancel scope bounds the wait as well."""
        with trio.move_on_after(wait.timeout_s):
            await self.wait_until(self._has_routing_targets)
        with self._lock:
            return self._engine.finish(wait, trio.current_time())

    async def decide(self, facts: ConnectionFacts) -> RouteDecision:
        """The whole workflow, waiting (for the shared cache, the quorum) when it must (trio thread)."""
        decision = self.decide_now(facts, trio.current_time())
        if isinstance(decision, RouteDecision):
            return decision
        return await self.resolve(decision)

    def lookup(self, key: str, *, dry_run: bool = False) -> RouteDecision:
        """The management lookup (SPEC A7): from step 3, no quorum wait; reported `LookedUp`. A
        dry run changes nothing (no cache write, no round-robin move)."""
        with self._lock:
            engine, now = self._engine, trio.current_time()
            decision = engine.peek(key, now) if dry_run else engine.lookup(key, now)
        self.report(LookedUp(router=self.name, key=decision.key, status=decision.status))
        return decision

    def _has_routing_targets(self) -> bool:
        with self._lock:
            return self._pool is not None and bool(self._pool.routing_targets())

    # -- what operators see and change --

    def status(self) -> RouterStatus:
        """A consistent snapshot of the router's filters, cache and pool."""
        with self._lock:
            return snapshot(self.config, self._engine, self._pool, self._connections, self._history)

    def cache_entries(self) -> dict[str, str]:
        """The sticky cache now: key -> node id of the entries not expired (empty without a cache)."""
        with self._lock:
            cache = self._engine.cache
            return {} if cache is None else cache.entries(trio.current_time())

    # -- the sticky cache (trio thread) --

    def _cache(self) -> TargetCache:
        cache = self._engine.cache
        if cache is None:
            raise LookupError(f"connection router {self.name!r} has no <cache>")
        return cache

    def cache_listing(
        self, *, prefix: str = "", node_id: str | None = None, after: str = "", limit: int = 100
    ) -> list[CacheEntry]:
        """A page of the live cache entries in key order (`TargetCache.listing`).

        Raises:
            LookupError: the router has no cache.
        """
        with self._lock:  # a copy: sorting 100,000 keys would hold decisions for tens of ms
            copy = self._cache().copy()
        return copy.listing(trio.current_time(), prefix=prefix, node_id=node_id, after=after, limit=limit)

    def cache_entry(self, key: str) -> CacheEntry | None:
        """One live entry, as it is (no refresh); None when absent.

        Raises:
            LookupError: the router has no cache.
        """
        with self._lock:
            return self._cache().entry(key, trio.current_time())

    def cache_evict(self, *, key: str | None = None, node_id: str | None = None) -> int:
        """Evict one key, every entry of one target, or (neither given) everything; how many. A
        shared cache deletes their entries in ZooKeeper too (`take_cache_use`).

        Raises:
            LookupError: the router has no cache.
        """
        with self._lock:
            cache = self._cache()
            if key is not None:
                keys = [key] if cache.evict(key) else []
            elif node_id is not None:
                keys = cache.evict_target(node_id)
            else:
                keys = cache.clear()
            if self._engine.shared:
                self._shared_evicted.update(keys if key is None else [key])
            return len(keys)

    def take_cache_use(self) -> tuple[set[str], set[str], set[str]]:
        """A shared cache's work since the last call: the keys used (read or written), the keys
        operators evicted, and those evicted to make room (`TargetCache.take_dropped`)."""
        with self._lock:
            cache = self._engine.cache
            used, dropped = (set(), set()) if cache is None else (cache.take_used(), cache.take_dropped())
            evicted, self._shared_evicted = self._shared_evicted, set()
        return used, evicted, dropped

    def cached_node(self, key: str) -> str | None:
        """The node id of the router's own cache entry for a key (expired or not; not a pin)."""
        with self._lock:
            cache = self._engine.cache
            return None if cache is None else cache.node_of(key)

    def cached_nodes(self, keys: Iterable[str]) -> dict[str, str]:
        """`cached_node` of several keys at once (one lock): the keys that have an entry."""
        with self._lock:
            cache = self._engine.cache
            if cache is None:
                return {}
            found = ((key, cache.node_of(key)) for key in keys)
            return {key: node_id for key, node_id in found if node_id is not None}

    def shared_keys(self) -> list[str]:
        """The keys of the router's own cache entries (not pins): what a shared cache shares."""
        with self._lock:
            cache = self._engine.cache
            return [] if cache is None else cache.entry_keys()

    def follow_shared(self, key: str, node_id: str | None) -> None:
        """Another router changed a key's shared entry: hold its node id from now on (None: it
        was deleted, so the router's own entry goes too). A pinned key is left as it is."""
        with self._lock:
            cache = self._engine.cache
            if cache is None or cache.is_pinned(key):
                return
            if node_id is None:
                cache.evict(key)
            else:
                cache.put(key, node_id, trio.current_time())

    def cache_pin(self, key: str, node_id: str, duration_s: float | None = None) -> CacheEntry:
        """Pin a key to a target of the pool (for `duration_s`, or until evicted); the new entry.

        Raises:
            LookupError: the router has no cache.
            ValueError: no target with this node id, or a duration that is not > 0.
        """
        with self._lock:
            cache = self._cache()
            if self._pool is None or self._pool.target(node_id) is None:
                known = [] if self._pool is None else [t.node_id for t in self._pool.targets]
                raise ValueError(f"no target with node id {node_id!r} in the pool (has {known})")
            if duration_s is not None and not duration_s > 0:
                raise ValueError(f"a pin's duration must be > 0 seconds, got {duration_s!r}")
            now = trio.current_time()
            cache.pin(key, node_id, now, math.inf if duration_s is None else now + duration_s)
            entry = cache.entry(key, now)
        assert entry is not None
        return entry

    def take_cache_changes(self, now: float) -> Changes:
        """What changed in a persisted cache since the last call (`TargetCache.take_changes`)."""
        with self._lock:
            cache = self._engine.cache
            return Changes() if cache is None else cache.take_changes(now)

    def cache_store_failed(self) -> None:
        """A write of the cache's changes failed: the next one is the whole cache."""
        with self._lock:
            if self._engine.cache is not None:
                self._engine.cache.resync()

    def restore_cache(self, rows: Iterable[tuple[str, Row]], now: float) -> int:
        """Load a persisted cache's entries (in the trio clock) before the router serves; how many."""
        with self._lock:
            return self._cache().restore(rows, now)

    def set_filters(
        self, *, key_filter: str | _Keep | None = KEEP, local_target_filter: str | _Keep | None = KEEP
    ) -> RouterStatus:
        """Change the run-time filters (SPEC A7: blank or None disables one); both or neither change.

        Raises:
            ValueError: an expression that does not compile (nothing changed).
        """
        with self._lock:
            engine = self._engine
            old = (engine.key_filter, engine.local_target_filter)
            try:
                if not isinstance(key_filter, _Keep):
                    engine.key_filter = key_filter
                if not isinstance(local_target_filter, _Keep):
                    engine.local_target_filter = local_target_filter
            except ValueError:
                engine.key_filter, engine.local_target_filter = old
                raise
            return snapshot(self.config, engine, self._pool, self._connections, self._history)

    # -- a configuration reload (trio thread) --

    def reconfigure(self, config: Config, router: RouterConfig) -> None:
        """Apply a reload's configuration of this router in place (router/core/reload.py): its
        open connections and their registry stay; the pool keeps the state of unchanged targets and
        the discovered members; the policy (its round-robin position) and the cache (its entries)
        stay when their settings did not change; a filter the file did not change keeps the value
        it has at run time (set through the admin API). Pool changes are reported as they happen
        (targets joining and leaving); closing the connections of departed targets is the
        caller's (`close_removed`).

        Args:
            config: the whole configuration in force after the reload.
            router: this router's configuration in it.
        """
        assert router.name == self.name, "a reload matches routers by name"
        built, local = build_pool(config, router)
        events: list[PoolEvent] = []
        with self._lock:
            old, engine = self.config, self._engine
            pool = self._pool
            if built is None or pool is None:
                if pool is not None:  # the pool went: its targets leave
                    events = pool.reconfigure(pool.quorum_size, [])
                pool = built
                if built is not None:
                    self._updates.router_started(self.name, [t.node_id for t in built.targets])
                else:
                    self.metrics.pool_active.remove((self.name,))
            else:
                assert router.pool is not None
                targets = list(built.targets)
                if config.pool_discovery_group(router) is not None:  # discovered members stay
                    targets += [t for t in pool.targets if not t.local]
                events = pool.reconfigure(router.pool.quorum_size, targets, router.pool.outlier_detection)
            new = RoutingEngine(
                router, pool, local, round_robin_start=self._round_robin_start, counts=self._connections
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
            appeared = self._pool is None and pool is not None
            self.config, self._engine, self._pool = router, new, pool
            if appeared:  # a pool the router did not have: its targets' history starts now
                assert pool is not None
                self._observe_targets([t.node_id for t in pool.targets], time.time())
        self._apply(events)

    def retire(self) -> None:
        """The router left the configuration: its targets leave (reported), and its samplers and
        router-level series go (else an alert on its pool would fire for good, and the samplers
        would keep it in memory). Closing its connections is the caller's (`close_removed`)."""
        with self._lock:
            events = [] if self._pool is None else self._pool.reconfigure(self._pool.quorum_size, [])
        self._apply(events)
        self._sample_bytes()  # what its connections relayed until now stays counted
        for unsample in self._unsample:
            unsample()
        self._target_metrics(None)
        for family in (self.metrics.pool_active, self.metrics.cache_entries):
            family.remove((self.name,))

    # -- the pool (trio thread) --

    def record_check(
        self, node_id: str, ok: bool, detail: str = "", *, member: int = 0, duration_s: float = 0.0
    ) -> None:
        """Record a probe's outcome for a target (one member of an HA pair) and act on the changes.

        Args:
            node_id: the probed target.
            ok: whether the probe succeeded.
            detail: why not, when it failed.
            member: which member of an HA pair was probed (0: the primary).
            duration_s: how long the probe took (shown in the status and the metrics).

        Raises:
            KeyError: no target with this node id.
        """
        pool = self._pool
        assert pool is not None, "only a router with a pool probes"
        record = CheckRecord(at=time.time(), duration_s=duration_s, ok=ok, reason="" if ok else detail)
        with self._lock:
            events = pool.record_check(node_id, ok, detail, member=member)
            if pool.probed(node_id):  # a probe that ran when maintenance began is not recorded
                self._history.checked(node_id, member, record)
        self._apply(events)

    def add_target(self, target: Target) -> None:
        """Add a discovered target to the pool; `serve_health_checks` starts probing it at once.

        Raises:
            ValueError: the pool already has a target with this node id.
        """
        assert self._pool is not None, "only a router with a pool discovers targets"
        with self._lock:
            events = self._pool.add_target(target)
        self._apply(events)

    def remove_target(self, node_id: str) -> None:
        """Remove a discovered target from the pool; its probe loop stops and its metrics go.

        Raises:
            KeyError: no target with this node id.
        """
        assert self._pool is not None, "only a router with a pool discovers targets"
        with self._lock:
            events = self._pool.remove_target(node_id)
        self._apply(events)

    def connect_refused(self, target: Target, connector: Connector, reason: str) -> None:
        """A connection to a member of the pool was refused: that member is un-ready at once, as
        if its probe had failed (the next successful probe makes it ready again), so the clients
        that follow go to the member that took over instead of waiting for the next check.

        Nothing happens when the target has left the pool (or was replaced) since it was chosen.
        """
        pool = self._pool
        if pool is None or target.connector is None:
            return
        try:
            member = target.connector.members.index(connector)
        except ValueError:
            return
        detail = f"connect to {connector.url} failed: {reason}"
        with self._lock:
            if pool.target(target.node_id) is not target:
                return
            events = pool.record_check(target.node_id, False, detail, member=member)
        self._apply(events)

    # -- passive health (pools/outlier.py) --

    def first_answer(self, live: LiveConnection, data: bytes | bytearray | memoryview) -> None:
        """A data path's report of a target's first bytes on a proxied connection (b"": it ended
        its side without a byte), from either thread: an answer ends the target's failures in a
        row (the lock is taken only when it has some)."""
        if not data:
            live.broker_ended_silently()
            return
        pool = self._pool
        if live.broker_answered(data) and pool is not None and pool.failing(live.node_id):
            with self._lock:
                pool.broker_answered(live.node_id)

    def broker_failed(self, closed: Closed) -> None:
        """Count a proxied connection that the broker refused or dropped (trio thread): the
        target may be ejected (TARGET_EJECTED, logged and counted)."""
        failure = broker_failure(closed.reason)
        pool = self._pool
        if failure is None or pool is None:
            return
        self.metrics.outlier_failures.inc((self.name, failure.value))
        with self._lock:
            events = pool.broker_failed(closed.node_id, failure, trio.current_time(), closed.detail)
        if events:
            self._apply(events)
            self._outliers_changed.set()

    async def serve_outlier_returns(self) -> None:
        """End each ejection when its time is over (TARGET_RETURNED), whatever its probes said."""
        while True:
            with self._lock:
                pool = self._pool
                until = None if pool is None else pool.next_return()
            self._outliers_changed = changed = trio.Event()
            with trio.move_on_at(math.inf if until is None else until):
                await changed.wait()
            with self._lock:
                pool = self._pool
                events = [] if pool is None else pool.return_ejected(trio.current_time())
            self._apply(events)

    def set_admin_state(self, node_id: str, state: AdminState) -> bool:
        """Set what operators allow a target: `ready`, `drain` (no new connections, cached keys
        included) or `maint` (as drain, and not probed); open connections stay. A discovery pool
        takes node ids that are not (yet) members: the state applies when one joins. Whether it
        changed anything.

        Raises:
            LookupError: the router has no pool.
            ValueError: a static or cluster pool has no target with this node id.
        """
        with self._lock:
            pool = self._pool
            if pool is None or self.config.pool is None:
                raise LookupError(f"connection router {self.name!r} has no pool")
            if pool.target(node_id) is None and self.config.pool.kind is not PoolKind.DISCOVERY:
                known = [t.node_id for t in pool.targets]
                raise ValueError(
                    f"no target with node id {node_id!r} in the pool of {self.name!r} (has {known})"
                )
            events = pool.set_admin_state(node_id, state)
        self._apply(events)
        return bool(events)

    def admin_states(self) -> dict[str, AdminState]:
        """Every node id whose administrative state is not `ready`."""
        with self._lock:
            return {} if self._pool is None else self._pool.admin_states()

    def is_probed(self, node_id: str) -> bool:
        """Whether a target of the pool is probed now (it is not in maintenance)."""
        with self._lock:
            return self._pool is not None and self._pool.probed(node_id)

    def report_broker_count(self, node_id: str, broker_count: int | None) -> None:
        """Record the connection count a broker reported to its probe (None: it could not be read)."""
        with self._lock:
            self._connections.report_broker_count(node_id, broker_count)

    def target(self, node_id: str) -> Target | None:
        """The pool's target with this node id now, if any."""
        with self._lock:
            return None if self._pool is None else self._pool.target(node_id)

    def targets(self) -> tuple[Target, ...]:
        """The pool's targets now, in pool order (none without a pool)."""
        with self._lock:
            return () if self._pool is None else tuple(self._pool.targets)

    def target_state(self, node_id: str) -> TargetState:
        """The readiness of one target now.

        Raises:
            KeyError: no target with this node id.
        """
        with self._lock:
            assert self._pool is not None, "only a router with a pool has targets"
            return self._pool.state(node_id)

    def target_ready(self, node_id: str) -> bool:
        """Whether the pool has a ready target with this node id now."""
        with self._lock:
            return self._pool is not None and self._pool.ready_target(node_id) is not None

    def ready_count(self) -> int:
        """How many of the pool's targets are ready now."""
        with self._lock:
            return 0 if self._pool is None else self._pool.ready_count()

    def active_member(self, node_id: str) -> int | None:
        """The index of the active member of an HA-pair target (None: none is ready).

        Raises:
            KeyError: no target with this node id.
        """
        with self._lock:
            assert self._pool is not None, "only a router with a pool has members"
            return self._pool.active_member(node_id)

    def _observe_targets(self, node_ids: Iterable[str], now: float) -> None:
        """Record the operational state of these targets at `now` in the history (under the lock,
        or before the router serves)."""
        pool = self._pool
        assert pool is not None
        for node_id in node_ids:
            if pool.target(node_id) is not None:  # an administrative state may name an absent one
                ejected = pool.ejection(node_id) is not None
                state = operational_state(pool.state(node_id), pool.admin_state(node_id), ejected=ejected)
                self._history.observe(node_id, state, now)

    def _apply(self, events: Iterable[PoolEvent]) -> None:
        """Report pool changes, then close the connections they doom, and wake decisions waiting
        for the quorum (trio thread)."""
        events = list(events)
        touched = [event for event in events if event.node_id is not None]
        if touched:
            now = time.time()
            with self._lock:
                for event in touched:
                    assert event.node_id is not None
                    if event.kind is PoolEventKind.TARGET_REMOVED:
                        self._history.forget(event.node_id)
                        continue
                    if event.kind is PoolEventKind.TARGET_NOT_READY:
                        self._history.failed(event.node_id, event.detail)
                    self._observe_targets([event.node_id], now)
        for event in events:
            self.report(event)
        for event in events:
            if (closing := closed_by_pool_change(event)) is not None:
                self._close_target(*closing)
        if events:
            woken, self._changed = self._changed, trio.Event()
            woken.set()

    def _close_target(self, node_id: str, reason: CloseReason, address: Address | None = None) -> None:
        """Close the proxied connections to a target (or to one member address of it), so their
        clients reconnect through the router (SPEC B, HA awareness); reported once with the count."""
        with self._lock:
            doomed = self._connections.open_to(node_id, address)
        closing = ConnectionsClosed(
            router=self.name, node_id=node_id, address=address, reason=reason, count=len(doomed)
        )
        self._close(doomed, closing)

    def _close(self, doomed: list[LiveConnection], closing: ConnectionsClosed) -> None:
        """Report, then have each data path close its connections: after the report, so the lines
        come in that order on both paths, and outside the lock (a closer may take other locks)."""
        if doomed:
            self.report(closing)
        for conn in doomed:
            conn.close(closing.reason)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds, re-checking after every pool change (trio thread)."""
        while not predicate():
            await self._changed.wait()

    async def serve_cache_purge(self) -> None:
        """Drop expired cache entries every timeout, so keys never looked up again do not pile up."""
        cache = self._engine.cache
        if cache is None or cache.config.timeout_ms == 0:
            return
        period_s = max(cache.config.timeout_ms / 1000, CACHE_PURGE_MIN_PERIOD_S)
        while True:
            await trio.sleep(period_s)
            with self._lock:
                cache.purge_expired(trio.current_time())

    # -- live connections (either thread) --

    def register(self, conn: LiveConnection) -> None:
        """Count a proxied connection from its decision on (LEAST_CONNECTIONS sees it at once) and
        make it closable by the router; `unregister` it when it ends."""
        lock = self._lock
        lock.acquire()
        try:
            self._connections.add(conn)
        finally:
            lock.release()

    def unregister(self, conn: LiveConnection) -> None:
        """Forget a proxied connection that ended (or never connected)."""
        lock = self._lock
        lock.acquire()
        try:
            self._connections.discard(conn)
        finally:
            lock.release()

    def open_connections(self, node_id: str | None = None) -> int:
        """How many proxied connections are open now (to one target, or in all)."""
        with self._lock:
            if node_id is None:
                return len(self._connections)
            return len(self._connections.to(node_id))

    def movable(self, node_id: str | None = None) -> list[LiveConnection]:
        """The proxied connections the router has not closed or moved yet (to one target, or all)."""
        with self._lock:
            return self._connections.open_all() if node_id is None else self._connections.open_to(node_id)

    def is_movable(self, conn: LiveConnection) -> bool:
        """Whether a connection is still open and neither closed nor moved by the router."""
        with self._lock:
            return self._movable(conn)

    def count_movable(self, conns: Iterable[LiveConnection]) -> int:
        """How many of these connections are still movable (`is_movable`)."""
        with self._lock:
            return sum(1 for conn in conns if self._movable(conn))

    def _movable(self, conn: LiveConnection) -> bool:
        """`is_movable`, under the lock."""
        return conn.closed_by is None and self._connections.holds(conn)

    def open_counts(self) -> dict[str, int]:
        """Connections not yet closed or moved, per target open to new connections (a rebalance's
        view; targets without connections count 0)."""
        with self._lock:
            if self._pool is None:
                return {}
            return {t.node_id: len(self._connections.open_to(t.node_id)) for t in self._pool.ready_targets()}

    def relocate(self, key: str, leaving: str | None, *, to: str | None = None) -> RouteDecision:
        """Route a moved connection's key again (`RoutingEngine.relocate`), caching the result."""
        with self._lock:
            return self._engine.relocate(key, leaving, trio.current_time(), to=to)

    def move(self, conn: LiveConnection, farewell: Farewell, reason: CloseReason) -> bool:
        """Have a connection's data path tell its client `farewell` and end it (`LiveConnection.move`);
        False when the router had closed or moved it already."""
        with self._lock:
            return conn.move(farewell, reason)

    def close_idle(self, now: float) -> list[tuple[LiveConnection, float]]:
        """Close the connections whose client was silent for their TTL; each with its idle time."""
        with self._lock:
            return self._connections.close_idle(now, CloseReason.CONNECTION_TTL)

    def close_departed(self, departed: Departed) -> int:
        """Close the connections to a target (or to some of its member addresses) that left the
        configuration (`target_removed`), reported once per address with the count; how many."""
        reason = CloseReason.TARGET_REMOVED
        closed = 0
        for address in departed.addresses or (None,):
            with self._lock:
                doomed = self._connections.open_to(departed.node_id, address)
            closing = ConnectionsClosed(
                router=self.name, node_id=departed.node_id, address=address, reason=reason, count=len(doomed)
            )
            self._close(doomed, closing)
            closed += len(doomed)
        return closed

    def close_all(self, reason: CloseReason) -> int:
        """Close every proxied connection (the end of a shutdown's grace period); how many."""
        with self._lock:
            doomed = self._connections.open_all()
        closing = ConnectionsClosed(
            router=self.name, node_id=None, address=None, reason=reason, count=len(doomed)
        )
        self._close(doomed, closing)
        return len(doomed)


def close_removed(runtime: RouterRuntime, departed: Iterable[Departed]) -> int:
    """Close, at once, the connections whose target left the configuration in a reload where they
    cannot be moved paced (router/server.py moves those of a router that goes on, as an evacuation
    does): the connections of a router the reload removed, and those to a member address an HA
    pair no longer has. Reason `target_removed`; their clients reconnect through the router and
    get a target of the configuration in force. How many were closed.

    Args:
        runtime: the router (changed, or removed by the reload) whose connections these are.
        departed: the targets (or member addresses) that left.
    """
    return sum(runtime.close_departed(gone) for gone in departed)
