"""A router's sticky cache shared through ZooKeeper (`<cache><zookeeper connect=… path=…/></cache>`).

Every router keeps its own cache (cache/cache.py) and decides from it without ZooKeeper when it
holds a usable entry for the key. ZooKeeper holds one znode per key (layout:
router/features/shared_cache/znodes.py) and is asked only when a router's own copy has nothing usable:

- **A miss** (`lookup`, on the trio side; the fast path hands such connections over) reads the
  key's znode, with a watch, waiting at most `READ_TIMEOUT_S`. An entry whose target is ready here
  is adopted (copied into this router's cache) and used.
- **A new choice** (the policy's pick after a miss) is claimed with create-if-absent
  (`claim`, at most `CLAIM_TIMEOUT_S`): the first router to create the znode wins; a router
  whose create finds the znode there reads it and adopts the winner's choice when its target is
  ready, counting it in `router_cache_shared_conflicts_total`. A live entry whose target is ready
  is never overwritten; one whose target is not ready here (or that expired) is, version-checked,
  as in memory. So two routers deciding the same new key at once may send its very first
  connections to different brokers, and agree from then on.
- **Watches** keep the copies honest: when another router overwrites or deletes a key's znode,
  the routers that hold the key read it again and follow (`_changed`).
- **The keys used** are looked at every `touch_interval`: an entry is extended when less than half
  its timeout is left (`touch_due`: at most about two writes per key and timeout, whatever the
  traffic); a key this router now sends elsewhere than its entry says (a redispatch after a failed
  connect, an entry bypassed) is claimed again; an operator's eviction is deleted. Expired
  znodes are deleted by the sweep, every bucket once per timeout (at most once per 256 s),
  version-checked (a router that extends one meanwhile wins).
- **While ZooKeeper does not answer** (the connection dropped, or a frozen server left a
  heartbeat unanswered for the answer timeout: `SessionWatch`) each router goes on with its own
  cache and decides misses alone (`lookup` answers at once when the session is not connected);
  the keys it decided meanwhile are remembered (at most `max-entries`, beyond that every key it
  holds) and claimed as soon as ZooKeeper answers again (`reconcile`), adopting the ZooKeeper
  entry when another router got there first. After a session expiry (its watches are gone), and
  at start when the cache was loaded from its file, every key it holds is read again.
- **Pins are not shared**: a pinned key is neither written to ZooKeeper nor changed by it.

kazoo's blocking calls run in worker threads, the background's (watches, extensions, sweeps,
reconciling) limited to `BACKGROUND_THREADS` so that decisions' reads always find one; its watch
and session callbacks (kazoo's threads) only post into trio channels, which a fixed number of
tasks consume.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from typing import TYPE_CHECKING, Final, TypeVar, TypeVarTuple, Unpack

import trio

from router.core.engine import DecisionReason, RouteDecision
from router.feature import Service
from router.features.shared_cache.metrics import SharedCacheMetrics
from router.features.shared_cache.znodes import (
    BUCKETS,
    UNANSWERED,
    Answer,
    SharedEntry,
    bucket_path,
    key_of,
    touch_due,
    znode_of,
)
from router.services.zookeeper import (
    CLOSE_TIMEOUT_S,
    Inbox,
    NodeExistsError,
    NoNodeError,
    Session,
    SessionWatch,
    VersionMismatchError,
    ZooKeeper,
    ZooKeeperError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from router.config.settings import ZooKeeperConfig
    from router.core.engine import SharedCacheWait
    from router.feature import Kernel
    from router.runtime import RouterRuntime

__all__ = ["CLAIM_TIMEOUT_S", "READ_TIMEOUT_S", "SharedCache", "SharedCaches", "start"]

log = logging.getLogger("router.cache")

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

READ_TIMEOUT_S: Final = 0.5
"""How long a decision waits for ZooKeeper's answer about a key before it decides alone: ten
times a loopback read's p99 measured with 100,000 keys, well inside the 10 s routing deadline."""
CLAIM_TIMEOUT_S: Final = 0.5
"""How long a decision waits for its claim (the create, and a re-read when another router was
first) before it keeps its own choice and claims it later."""
TOUCH_INTERVAL_MAX_S: Final = 5.0
"""At the latest, how often the keys used are looked at (a quarter of the timeout when that is
shorter, at least `TOUCH_INTERVAL_MIN_S`): an entry is extended within this of becoming due."""
TOUCH_INTERVAL_MIN_S: Final = 0.2
SWEEP_INTERVAL_MIN_S: Final = 1.0
"""One bucket of expired entries is swept every timeout / 256, at least this often: every
router reads each znode once per timeout (at most once per 256 s) to find the expired ones."""
CLAIM_TRIES: Final = 3
"""Create or overwrite attempts of one claim: a race lost twice in a row means a key in flux."""
BACKGROUND_THREADS: Final = 8
"""Worker threads the background's ZooKeeper calls may hold at once (of trio's 40)."""
BACKGROUND_TASKS: Final = 8
"""Tasks that follow watch events, and that reconcile keys."""


class SharedCache:
    """One router's side of the shared cache (see the module docstring)."""

    def __init__(
        self, runtime: RouterRuntime, zookeeper: ZooKeeperConfig, *, client: ZooKeeper | None = None
    ) -> None:
        cache = runtime.config.cache
        assert cache is not None, "a shared cache is a router's <cache>"
        assert cache.timeout_ms > 0, "RouterConfig requires a timeout of a shared cache"
        self.runtime = runtime
        self.name = runtime.name
        self.metrics = runtime.metrics.feature(SharedCacheMetrics)
        self.path = zookeeper.path
        self.timeout_s = cache.timeout_ms / 1000
        self.max_keys = cache.max_entries
        self.client = ZooKeeper(zookeeper.connect, zookeeper.session_timeout_ms) if client is None else client
        self.connected = False
        self.known: dict[str, SharedEntry] = {}
        """What this router last read or wrote of each key it holds (with the znode's version);
        pruned to the keys it still holds when it outgrows `max-entries`."""
        self.unsynced: set[str] = set()
        """Keys decided while ZooKeeper did not answer: claimed when it does."""
        self.resync_all = cache.persisted
        """The unsynced keys overflowed, the session expired, or the cache was loaded from its
        file at start: reconcile every key held."""
        self.used: set[str] = set()
        """Keys used and not yet looked at by the touch loop (each is kept until its entry is
        extended, claimed again, or no longer held)."""
        self.evicted: set[str] = set()
        """Keys operators evicted whose znodes are still to be deleted (at most `max-entries`, while
        ZooKeeper does not answer: beyond it an eviction's znode is left to expire, and the sweep
        deletes it)."""
        self.dropped: dict[str, SharedEntry] = {}
        """Keys this router's cache evicted to make room (at most `max-entries`) whose entry it wrote
        last: deleted unless another router changed (used) it since (version-checked), so keys a
        client invents do not pile up in ZooKeeper until they expire."""
        self._background = trio.CapacityLimiter(BACKGROUND_THREADS)
        self._reconciling = False
        self._changes = Inbox[str]()
        """Paths whose watch fired (at most one watch per znode and session: bounded by the keys
        this router read or wrote)."""
        # Sessions as the watch sees them (kazoo's reports, and a server that does not answer),
        # handed to `_session` in the trio thread.
        self.watch = SessionWatch(runtime, "shared_cache", zookeeper, self.client, self._session)
        self.where = self.watch.where
        self.client.on_session(self.watch.post)
        self.client.on_znode_change(self._changes.post)
        self._nursery: trio.Nursery | None = None
        """`serve`'s, where the background runs."""

    # -- the shared cache's slice of the router at run time (its lock: `RouterRuntime.held`) --

    def _cached_node(self, key: str) -> str | None:
        """The node id of the router's own cache entry for a key (expired or not; not a pin)."""
        with self.runtime.held() as state:
            cache = state.engine.cache
            return None if cache is None else cache.node_of(key)

    def _cached_nodes(self, keys: Iterable[str]) -> dict[str, str]:
        """`_cached_node` of several keys at once (one lock): the keys that have an entry."""
        with self.runtime.held() as state:
            cache = state.engine.cache
            if cache is None:
                return {}
            found = ((key, cache.node_of(key)) for key in keys)
            return {key: node_id for key, node_id in found if node_id is not None}

    def _held_keys(self) -> list[str]:
        """The keys of the router's own cache entries (not pins): what a shared cache shares."""
        with self.runtime.held() as state:
            cache = state.engine.cache
            return [] if cache is None else cache.entry_keys()

    def _follow(self, key: str, node_id: str | None) -> None:
        """Another router changed a key's shared entry: hold its node id from now on (None: it
        was deleted, so the router's own entry goes too). A pinned key is left as it is."""
        with self.runtime.held() as state:
            cache = state.engine.cache
            if cache is None or cache.is_pinned(key):
                return
            if node_id is None:
                cache.evict(key)
            else:
                cache.put(key, node_id, trio.current_time())

    def _take_use(self) -> tuple[set[str], set[str], set[str]]:
        """The cache's use since the last call: the keys used (read or written), the keys
        operators evicted, and those evicted to make room."""
        with self.runtime.held() as state:
            cache = state.engine.cache
            if cache is None:
                return set(), set(), set()
            return cache.take_used(), cache.take_evicted(), cache.take_dropped()

    def _target_ready(self, node_id: str) -> bool:
        return self.runtime.pool.target_ready(node_id)

    async def resolve(self, wait: SharedCacheWait) -> RouteDecision:
        """Finish a decision that waits for the shared cache (`RouterRuntime.resolve`): ask it,
        and/or wait for the quorum; a new choice is claimed, and another router's choice that
        won the claim is adopted when its target is ready."""
        runtime = self.runtime
        found = await self.lookup(wait.key)
        entry = found if isinstance(found, SharedEntry) else None  # bypassed unless ready here
        with runtime.held() as state:
            step = state.engine.after_shared(
                wait, None if entry is None else entry.node_id, trio.current_time()
            )
        decision = step if isinstance(step, RouteDecision) else await runtime.pool.wait_for_quorum(step)
        if decision.reason is not DecisionReason.POLICY or decision.target is None:
            return decision
        if found is UNANSWERED:
            self.missed(wait.key)
            return decision
        winner = await self.claim(wait.key, decision.target.node_id)
        if winner is None or winner.node_id == decision.target.node_id:
            return decision
        with runtime.held() as state:
            adopted = state.engine.adopt(wait.key, winner.node_id, trio.current_time())
        if adopted is None:
            return decision
        self.metrics.cache_shared_conflicts.inc((self.name,))
        return adopted

    def _count(self, operation: str, outcome: str) -> None:
        self.metrics.cache_shared_operations.inc((self.name, operation, outcome))

    async def _call(self, function: Callable[[Unpack[_Ts]], _T], *args: *_Ts) -> _T:
        """A blocking kazoo call of the background, in a worker thread of its own limiter."""
        return await trio.to_thread.run_sync(
            function, *args, abandon_on_cancel=True, limiter=self._background
        )

    # -- what decisions ask (trio thread) --

    async def lookup(self, key: str) -> Answer:
        """The key's entry in ZooKeeper (None: there is none, or it expired), read with a watch;
        UNANSWERED at once when the session is not connected, or after `READ_TIMEOUT_S`."""
        if not self.connected:
            return UNANSWERED
        with trio.move_on_after(READ_TIMEOUT_S):
            try:
                entry = await self._read(key, limiter=None)
            except ZooKeeperError:
                self._count("read", "failed")
                return UNANSWERED
            self._count("read", "ok")
            return entry
        self._count("read", "timeout")
        return UNANSWERED

    async def _read(self, key: str, *, limiter: trio.CapacityLimiter | None) -> SharedEntry | None:
        found = await trio.to_thread.run_sync(
            functools.partial(self.client.read, znode_of(self.path, key), watch=True),
            abandon_on_cancel=True,
            limiter=limiter,
        )
        if found is None:
            self.known.pop(key, None)
            return None
        entry = SharedEntry.from_data(*found)
        if entry is None:  # not an entry: overwritten by the next claim
            entry = SharedEntry(node_id="", until=0.0, version=found[1])
        self.known[key] = entry
        return None if entry.expired(time.time()) else entry

    def missed(self, key: str) -> None:
        """A decision for `key` was made without ZooKeeper's answer: claim it when it answers."""
        if len(self.unsynced) >= self.max_keys:
            self.resync_all = True
            self.unsynced.clear()
        self.unsynced.add(key)

    async def claim(self, key: str, node_id: str, *, background: bool = False) -> SharedEntry | None:
        """Make `node_id` the key's entry unless a live entry on a target ready here is there
        (another router's choice, or this router's own from a concurrent decision): the entry in
        force afterwards. None: ZooKeeper did not answer within `CLAIM_TIMEOUT_S` (a decision's
        claim) or at all; the key is claimed again later."""
        with trio.move_on_after(math.inf if background else CLAIM_TIMEOUT_S):
            try:
                entry = await self._claim(key, node_id, None if not background else self._background)
            except ZooKeeperError:
                entry = None
            if entry is not None:
                return entry
        self._count("claim", "failed")
        self.missed(key)
        return None

    async def _claim(
        self, key: str, node_id: str, limiter: trio.CapacityLimiter | None
    ) -> SharedEntry | None:
        path = znode_of(self.path, key)
        for _ in range(CLAIM_TRIES):
            previous = self.known.get(key)
            if previous is not None and previous.node_id != node_id and self._live_here(previous):
                return previous  # the first writer wins
            entry = SharedEntry(node_id=node_id, until=time.time() + self.timeout_s)
            try:
                if previous is None:
                    await trio.to_thread.run_sync(
                        self.client.create, path, entry.to_data(), abandon_on_cancel=True, limiter=limiter
                    )
                    self._count("create", "ok")
                    version = 0
                else:
                    version = await trio.to_thread.run_sync(
                        self.client.update,
                        path,
                        entry.to_data(),
                        previous.version,
                        abandon_on_cancel=True,
                        limiter=limiter,
                    )
                    self._count("update", "ok")
            except (NodeExistsError, VersionMismatchError, NoNodeError):
                self._count("claim", "raced")
                current = await self._read(key, limiter=limiter)  # what is there now
                if current is not None and current.node_id == node_id:
                    return current
                continue
            entry = SharedEntry(node_id=node_id, until=entry.until, version=version, ours=True)
            self.known[key] = entry
            if self._nursery is not None:  # the watch is set after the decision, not in its time
                self._nursery.start_soon(self._watch_entry, key, version)
            return entry
        return None

    def _live_here(self, entry: SharedEntry) -> bool:
        return not entry.expired(time.time()) and self._target_ready(entry.node_id)

    async def _watch_entry(self, key: str, version: int) -> None:
        """Watch a znode this router just wrote; read it again if it changed in between."""
        with contextlib.suppress(ZooKeeperError):
            now = await self._call(self.client.watch_for, znode_of(self.path, key))
            if now != version:
                await self._changed(znode_of(self.path, key))

    # -- the service (trio thread) --

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the session, watches, uses and sweeps until cancelled."""
        self.client.start()
        log.info("router=%s cache shared at %s", self.name, self.where)
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.watch.serve)
                nursery.start_soon(self._touch_loop)
                nursery.start_soon(self._sweep_loop)
                for _ in range(BACKGROUND_TASKS):
                    nursery.start_soon(self._follow_watches)
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                await self.client.aclose()

    def _session(self, session: Session) -> None:
        self.metrics.cache_shared_connected.set((self.name,), 1 if session is Session.CONNECTED else 0)
        if session is Session.CONNECTED:
            self.connected = True
            log.info("router=%s connected to %s: reconciling the cache", self.name, self.where)
            self._start_reconcile()
        elif session is Session.SUSPENDED:
            self.connected = False
            log.warning(
                "router=%s lost the connection to %s: deciding with this router's cache alone "
                "until it is back",
                self.name,
                self.where,
            )
        else:
            self.connected = False
            self.resync_all = True  # the watches went with the session
            log.warning(
                "router=%s session with %s expired (or nothing heard for its timeout): every key "
                "held is read again when connected",
                self.name,
                self.where,
            )

    def _start_reconcile(self) -> None:
        if self._nursery is not None and not self._reconciling and (self.unsynced or self.resync_all):
            self._reconciling = True
            self._nursery.start_soon(self.reconcile)

    async def reconcile(self) -> None:
        """Claim the keys decided while ZooKeeper did not answer (every key held, after a session
        expiry), adopting the entries other routers made meanwhile."""
        try:
            if self.resync_all:
                self.resync_all = False
                self.unsynced.clear()
                self.known.clear()
                keys = set(self._held_keys())
            else:
                keys, self.unsynced = self.unsynced, set()
            if keys:
                adopted = await self._reconcile(keys)
                log.info(
                    "router=%s cache reconciled with %s: %d key(s), %d now follow another router's choice",
                    self.name,
                    self.where,
                    len(keys),
                    adopted,
                )
        finally:
            self._reconciling = False

    async def _reconcile(self, keys: Iterable[str]) -> int:
        adopted = 0
        pending = iter(keys)

        async def worker() -> None:
            nonlocal adopted
            for key in pending:  # each key is taken by one worker
                held = self._cached_node(key)
                if held is None:
                    continue
                if not self.connected:
                    self.missed(key)
                    continue
                try:
                    current = await self._read(key, limiter=self._background)
                except ZooKeeperError:
                    self.missed(key)
                    continue
                if current is not None and current.node_id == held:
                    continue
                winner = current if current is not None and self._live_here(current) else None
                if winner is None:
                    winner = await self.claim(key, held, background=True)
                if winner is not None and winner.node_id != held:
                    self._follow(key, winner.node_id)
                    adopted += 1

        async with trio.open_nursery() as nursery:
            for _ in range(BACKGROUND_TASKS):
                nursery.start_soon(worker)
        if adopted:
            self.metrics.cache_shared_conflicts.inc((self.name,), adopted)
        return adopted

    async def _follow_watches(self) -> None:
        async for path in self._changes.receive:
            await self._changed(path)

    async def _changed(self, path: str) -> None:
        """A watch fired (or a write of ours was overtaken): read the key's entry again and follow."""
        key = key_of(path.rsplit("/", 1)[-1])
        if key is None or not self.connected:
            return
        if self._cached_node(key) is None:
            self.known.pop(key, None)  # not held (any more): no need to watch it again
            return
        try:
            entry = await self._read(key, limiter=self._background)
        except ZooKeeperError:
            return
        held = self._cached_node(key)
        if held is None:
            return
        if entry is None:
            self._follow(key, None)
        elif entry.node_id != held and self._target_ready(entry.node_id):
            self._follow(key, entry.node_id)

    def _touch_interval(self) -> float:
        return min(max(self.timeout_s / 4, TOUCH_INTERVAL_MIN_S), TOUCH_INTERVAL_MAX_S)

    async def _touch_loop(self) -> None:
        """Every touch interval: the keys used (extended when due, claimed again when this router
        now sends them elsewhere), the operators' evictions, the keys decided alone."""
        while True:
            await trio.sleep(self._touch_interval())
            used, evicted, dropped = self._take_use()
            self.used |= used
            for key in evicted:
                if len(self.evicted) >= self.max_keys:
                    break
                self.evicted.add(key)
            for key in dropped:  # made room for others here: gone unless another router uses it
                entry = self.known.pop(key, None)
                if entry is not None and entry.ours and len(self.dropped) < self.max_keys:
                    self.dropped[key] = entry
            if len(self.known) > self.max_keys:  # keys this router no longer holds
                held_now = set(self._held_keys())
                self.known = {k: e for k, e in self.known.items() if k in held_now}
            if not self.connected:
                continue
            self._start_reconcile()
            while self.evicted and self.connected:
                await self._delete(self.evicted.pop())
            while self.dropped and self.connected:
                await self._delete_unused(*self.dropped.popitem())
            await self._look_at_used()

    async def _look_at_used(self) -> None:
        held = self._cached_nodes(self.used)
        now = time.time()
        for key in list(self.used):
            node_id, entry = held.get(key), self.known.get(key)
            if node_id is None or entry is None:
                self.used.discard(key)  # not held, or not in ZooKeeper yet (unsynced)
            elif entry.node_id != node_id:
                self.used.discard(key)
                winner = await self.claim(key, node_id, background=True)
                if winner is not None and winner.node_id != node_id:
                    self._follow(key, winner.node_id)
            elif touch_due(entry, now, self.timeout_s):
                self.used.discard(key)
                await self._extend(key, entry)
            if not self.connected:
                return

    async def _extend(self, key: str, entry: SharedEntry) -> None:
        extended = SharedEntry(node_id=entry.node_id, until=time.time() + self.timeout_s)
        path = znode_of(self.path, key)
        try:
            version = await self._call(self.client.update, path, extended.to_data(), entry.version)
        except (VersionMismatchError, NoNodeError):
            self._count("update", "raced")
            await self._changed(path)  # another router changed or deleted it: follow
            return
        except ZooKeeperError:
            self._count("update", "failed")
            self.used.add(key)  # again next time
            return
        self._count("update", "ok")
        self.known[key] = SharedEntry(node_id=entry.node_id, until=extended.until, version=version, ours=True)

    async def _delete(self, key: str) -> None:
        self.known.pop(key, None)
        try:
            await self._call(self.client.delete, znode_of(self.path, key))
            self._count("delete", "ok")
        except ZooKeeperError:
            self._count("delete", "failed")
            self.evicted.add(key)  # again when ZooKeeper answers

    async def _delete_unused(self, key: str, entry: SharedEntry) -> None:
        if self._cached_node(key) is not None:  # decided here again meanwhile
            return
        try:
            if await self._call(self.client.delete, znode_of(self.path, key), entry.version):
                self._count("delete", "dropped")
        except VersionMismatchError:  # extended or overwritten since: another router uses it
            self._count("delete", "raced")
        except ZooKeeperError:
            self._count("delete", "failed")

    async def _sweep_loop(self) -> None:
        """Delete expired entries, one bucket at a time, every bucket once per timeout."""
        bucket = 0
        interval = max(self.timeout_s / BUCKETS, SWEEP_INTERVAL_MIN_S)
        while True:
            await trio.sleep(interval)
            if self.connected:
                try:
                    await self.sweep(bucket)
                except ZooKeeperError:
                    self._count("sweep", "failed")
            bucket = (bucket + 1) % BUCKETS

    async def sweep(self, bucket: int) -> None:
        """Delete the expired entries of one bucket (version-checked: one extended meanwhile stays).

        Raises:
            ZooKeeperError: ZooKeeper did not answer.
        """
        parent = bucket_path(self.path, bucket)
        names = await self._call(self.client.children, parent)
        now = time.time()
        for name in names:
            path = f"{parent}/{name}"
            found = await self._call(self.client.read, path)
            if found is None:
                continue
            entry = SharedEntry.from_data(*found)
            if entry is not None and entry.expired(now):
                with contextlib.suppress(VersionMismatchError):
                    if await self._call(self.client.delete, path, entry.version):
                        self._count("delete", "expired")


class SharedCaches(Service):
    """The feature's service: each router whose cache is shared through ZooKeeper gets its side of
    it, which finishes the decisions that wait for it (`RouterState.resolver`), for as long as the
    router runs (a change of the router keeps it)."""

    async def serve_router_data(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        zookeeper = runtime.config.cache_zookeeper
        if zookeeper is None:
            task_status.started()
            return
        shared = SharedCache(runtime, zookeeper)
        runtime.held().resolver = shared.resolve  # one store: a waiting decision reads it
        await shared.serve(task_status=task_status)


def start(kernel: Kernel) -> SharedCaches:
    """The feature's service for one routerd."""
    return SharedCaches()
