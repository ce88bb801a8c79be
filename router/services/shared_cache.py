"""A router's sticky cache shared through ZooKeeper (`<cache><zookeeper connect=… path=…/></cache>`).

Every router keeps its own cache (cache/cache.py) and decides from it without ZooKeeper when it
holds a usable entry for the key. ZooKeeper holds one znode per key (layout:
router/core/shared_cache.py) and is asked only when a router's own copy has nothing usable:

- **A miss** (`lookup`, on the trio side; the fast path hands such connections over) reads the
  key's znode, with a watch. An entry whose target is ready here is adopted (copied into this
  router's cache) and used.
- **A new choice** (the policy's pick after a miss) is claimed with create-if-absent
  (`claim`): the first router to create the znode wins; a router whose create finds the znode
  there reads it and adopts the winner's choice when its target is ready, counting it in
  `router_cache_shared_conflicts_total`. So two routers deciding the same new key at once may
  send its very first connections to different brokers, and agree from then on. An entry whose
  target is not ready here is overwritten with the new choice (version-checked, as in memory).
- **Watches** keep the copies honest: when another router overwrites or deletes a key's znode,
  the routers that hold the key read it again and follow (`_changed`).
- **Expiry** stays expire-after-access across routers: an entry's znode says until when it lives;
  a router that used the key extends it when less than half the timeout is left (`touch_due`; at
  most about two writes per key and timeout, whatever the traffic), every `touch_interval`.
  Expired znodes are deleted by the sweep, one bucket per `SWEEP_INTERVAL_S`, version-checked (a
  router that extends one meanwhile wins).
- **While ZooKeeper is unreachable** each router goes on with its own cache and decides misses
  alone (`lookup` answers at once when the session is not connected); the keys it decided
  meanwhile are remembered (at most `max-entries`, beyond that every key it holds) and claimed
  when the session returns, adopting the ZooKeeper entry when another router got there first
  (`reconcile`). After a session expiry (its watches are gone) every key it holds is read again.

kazoo's blocking calls run in worker threads; its watch and session callbacks (kazoo's threads)
only post into a trio channel.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING, Final

import trio

from router.core.shared_cache import BUCKETS, SharedEntry, bucket_path, key_of, touch_due, znode_of
from router.services.discovery import (
    CLOSE_TIMEOUT_S,
    NodeExistsError,
    NoNodeError,
    Session,
    VersionMismatchError,
    ZooKeeper,
    ZooKeeperError,
)

if TYPE_CHECKING:
    from router.config.settings import ZooKeeperConfig
    from router.runtime import RouterRuntime

__all__ = ["READ_TIMEOUT_S", "SWEEP_INTERVAL_S", "SharedCache", "serve_shared_cache"]

log = logging.getLogger("router.cache")

READ_TIMEOUT_S: Final = 0.5
"""How long a decision waits for ZooKeeper's answer about a key before it decides alone."""
TOUCH_INTERVAL_MAX_S: Final = 5.0
"""At the latest, how often the keys used are looked at for extending their entries (a quarter of
the timeout when that is shorter, at least `TOUCH_INTERVAL_MIN_S`)."""
TOUCH_INTERVAL_MIN_S: Final = 0.2
SWEEP_INTERVAL_S: Final = 1.0
"""One bucket of expired entries is swept this often: all of them in 256 s."""
CLAIM_TRIES: Final = 3
"""Create or overwrite attempts of one claim before the router keeps its own choice."""
RECONCILE_CONCURRENCY: Final = 16
"""Keys read or claimed at once when the session returns."""


class _Unavailable:
    """ZooKeeper did not answer (not connected, an error, too slow)."""


UNAVAILABLE: Final = _Unavailable()


class SharedCache:
    """One router's side of the shared cache (see the module docstring)."""

    def __init__(
        self, runtime: RouterRuntime, zookeeper: ZooKeeperConfig, *, client: ZooKeeper | None = None
    ) -> None:
        cache = runtime.config.cache
        assert cache is not None, "a shared cache is a router's <cache>"
        self.runtime = runtime
        self.name = runtime.name
        self.path = zookeeper.path
        self.where = f"zookeeper {zookeeper.connect}{zookeeper.path}"
        self.timeout_s = cache.timeout_ms / 1000
        self.max_unsynced = cache.max_entries
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
        token = trio.lowlevel.current_trio_token()
        self._send, self._receive = trio.open_memory_channel[Session | str](math.inf)

        def post(item: Session | str) -> None:  # kazoo's threads
            def deliver() -> None:
                with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                    self._send.send_nowait(item)

            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(deliver)

        self._post = post
        self.client.on_session(post)
        self._nursery: trio.Nursery
        """Where background reads run (`serve`'s)."""

    def _watch(self, path: str) -> None:
        self._post(path)

    def _count(self, operation: str, outcome: str) -> None:
        self.runtime.metrics.cache_shared_operations.inc((self.name, operation, outcome))

    # -- what decisions ask (trio thread) --

    async def lookup(self, key: str) -> SharedEntry | _Unavailable | None:
        """The key's entry in ZooKeeper (None: there is none, or it expired), read with a watch;
        UNAVAILABLE at once when the session is not connected, or after `READ_TIMEOUT_S`."""
        if not self.connected:
            return UNAVAILABLE
        with trio.move_on_after(READ_TIMEOUT_S):
            try:
                entry = await self._read(key)
            except ZooKeeperError:
                self._count("read", "failed")
                return UNAVAILABLE
            self._count("read", "ok")
            return entry
        self._count("read", "timeout")
        return UNAVAILABLE

    async def _read(self, key: str) -> SharedEntry | None:
        found = await trio.to_thread.run_sync(
            self.client.read, znode_of(self.path, key), self._watch, abandon_on_cancel=True
        )
        if found is None:
            self.known.pop(key, None)
            return None
        data, version = found
        entry = SharedEntry.from_data(data, version)
        if entry is None:  # not an entry: overwritten by the next claim
            entry = SharedEntry(node_id="", until=0.0, version=version)
        self.known[key] = entry
        return None if entry.expired(time.time()) else entry

    def missed(self, key: str) -> None:
        """A decision for `key` was made without ZooKeeper's answer: claim it when it answers."""
        if len(self.unsynced) >= self.max_unsynced:
            self.resync_all = True
            self.unsynced.clear()
        self.unsynced.add(key)

    async def claim(self, key: str, node_id: str) -> SharedEntry | None:
        """Make `node_id` the key's entry unless another router's valid entry is there first: the
        entry in force afterwards (None: ZooKeeper did not answer; the key is claimed later)."""
        path = znode_of(self.path, key)
        for _ in range(CLAIM_TRIES):
            entry = SharedEntry(node_id=node_id, until=self._until())
            previous = self.known.get(key)
            try:
                if previous is None:
                    await trio.to_thread.run_sync(
                        self.client.create, path, entry.to_data(), abandon_on_cancel=True
                    )
                    self._count("create", "ok")
                    entry = SharedEntry(node_id=node_id, until=entry.until, version=0)
                else:
                    version = await trio.to_thread.run_sync(
                        self.client.update, path, entry.to_data(), previous.version, abandon_on_cancel=True
                    )
                    self._count("update", "ok")
                    entry = SharedEntry(node_id=node_id, until=entry.until, version=version)
                self.known[key] = entry
                self._nursery.start_soon(self._watch_entry, path)  # not in the decision's time
                return entry
            except (NodeExistsError, VersionMismatchError, NoNodeError):
                self._count("claim", "raced")
                try:  # another router wrote it meanwhile: read what is there now
                    current = await self._read(key)
                except ZooKeeperError:
                    break
                if current is not None and current.node_id != node_id and self._ready(current.node_id):
                    return current  # the first writer wins
                if current is not None and current.node_id == node_id:
                    return current
            except ZooKeeperError:
                break
        self._count("claim", "failed")
        self.missed(key)
        return None

    async def _watch_entry(self, path: str) -> None:
        with contextlib.suppress(ZooKeeperError):
            await trio.to_thread.run_sync(self.client.watch_for, path, self._watch, abandon_on_cancel=True)

    def _until(self) -> float | None:
        return None if self.timeout_s == 0 else time.time() + self.timeout_s

    def _ready(self, node_id: str) -> bool:
        target = self.runtime.target(node_id)
        return target is not None and self.runtime.target_ready(node_id)

    # -- the service (trio thread) --

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the session, watches, touches and sweeps until cancelled."""
        self.client.start()
        log.info("router=%s cache shared at %s", self.name, self.where)
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._touch_loop)
                if self.timeout_s > 0:
                    nursery.start_soon(self._sweep_loop)
                async for item in self._receive:
                    if isinstance(item, Session):
                        await self._session(item, nursery)
                    else:
                        nursery.start_soon(self._changed, item)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                await self.client.aclose()

    async def _session(self, session: Session, nursery: trio.Nursery) -> None:
        self.runtime.metrics.cache_shared_connected.set(
            (self.name,), 1 if session is Session.CONNECTED else 0
        )
        if session is Session.CONNECTED:
            self.connected = True
            log.info("router=%s connected to %s: reconciling the cache", self.name, self.where)
            nursery.start_soon(self.reconcile)
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
                "router=%s session with %s expired: every key held is read again when connected",
                self.name,
                self.where,
            )

    async def reconcile(self) -> None:
        """Claim the keys decided while ZooKeeper did not answer (every key held, after a session
        expiry), adopting the entries other routers made meanwhile."""
        if self.resync_all:
            self.resync_all = False
            self.unsynced.clear()
            self.known.clear()
            keys = set(self.runtime.cache_entries())
        else:
            keys, self.unsynced = self.unsynced, set()
        if not keys:
            return
        adopted = 0
        limiter = trio.CapacityLimiter(RECONCILE_CONCURRENCY)

        async def one(key: str) -> None:
            nonlocal adopted
            async with limiter:
                node_id = self.runtime.cached_node(key)
                if node_id is None or not self.connected:
                    return
                try:
                    current = await self._read(key)
                except ZooKeeperError:
                    self.missed(key)
                    return
                if current is not None and current.node_id != node_id and self._ready(current.node_id):
                    self.runtime.follow_shared(key, current.node_id)
                    adopted += 1
                elif current is None or current.node_id != node_id:
                    winner = await self.claim(key, node_id)
                    if winner is not None and winner.node_id != node_id:
                        self.runtime.follow_shared(key, winner.node_id)
                        adopted += 1

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(one, key)
        if adopted:
            self.runtime.metrics.cache_shared_conflicts.inc((self.name,), adopted)
        log.info(
            "router=%s cache reconciled with %s: %d key(s), %d now follow another router's choice",
            self.name,
            self.where,
            len(keys),
            adopted,
        )

    async def _changed(self, path: str) -> None:
        """A watch fired: read the key's entry again and follow it."""
        key = key_of(path.rsplit("/", 1)[-1])
        if key is None or not self.connected:
            return
        try:
            entry = await self._read(key)
        except ZooKeeperError:
            return
        held = self.runtime.cached_node(key)
        if held is None:
            self.known.pop(key, None)
        elif entry is not None and entry.node_id != held and self._ready(entry.node_id):
            self.runtime.follow_shared(key, entry.node_id)
        elif entry is None:
            self.runtime.follow_shared(key, None)

    def _touch_interval(self) -> float:
        if self.timeout_s == 0:
            return TOUCH_INTERVAL_MAX_S
        return min(max(self.timeout_s / 4, TOUCH_INTERVAL_MIN_S), TOUCH_INTERVAL_MAX_S)

    async def _touch_loop(self) -> None:
        """Extend the entries of the keys used, when due; delete those operators evicted."""
        while True:
            await trio.sleep(self._touch_interval())
            used, evicted = self.runtime.take_cache_use()
            if len(self.known) > self.max_unsynced:  # keys this router no longer holds
                held = self.runtime.cache_entries()
                self.known = {k: e for k, e in self.known.items() if k in held}
            if not self.connected:
                continue
            for key in evicted:
                await self._delete(key)
            if self.timeout_s == 0:
                continue
            now = time.time()
            for key in used:
                entry = self.known.get(key)
                if entry is not None and touch_due(entry, now, self.timeout_s):
                    await self._extend(key, entry)

    async def _extend(self, key: str, entry: SharedEntry) -> None:
        extended = SharedEntry(node_id=entry.node_id, until=self._until())
        try:
            version = await trio.to_thread.run_sync(
                self.client.update,
                znode_of(self.path, key),
                extended.to_data(),
                entry.version,
                abandon_on_cancel=True,
            )
        except (VersionMismatchError, NoNodeError):
            self._count("update", "raced")
            return  # the watch reads it again
        except ZooKeeperError:
            self._count("update", "failed")
            return
        self._count("update", "ok")
        self.known[key] = SharedEntry(node_id=entry.node_id, until=extended.until, version=version)

    async def _delete(self, key: str) -> None:
        self.known.pop(key, None)
        try:
            await trio.to_thread.run_sync(
                self.client.delete, znode_of(self.path, key), abandon_on_cancel=True
            )
            self._count("delete", "ok")
        except ZooKeeperError:
            self._count("delete", "failed")

    async def _sweep_loop(self) -> None:
        """Delete expired entries, one bucket per `SWEEP_INTERVAL_S`, version-checked."""
        bucket = 0
        while True:
            await trio.sleep(SWEEP_INTERVAL_S)
            if self.connected:
                with contextlib.suppress(ZooKeeperError):
                    await self.sweep(bucket)
            bucket = (bucket + 1) % BUCKETS

    async def sweep(self, bucket: int) -> None:
        """Delete the expired entries of one bucket (version-checked: one extended meanwhile stays).

        Raises:
            ZooKeeperError: ZooKeeper did not answer.
        """
        parent = bucket_path(self.path, bucket)
        names = await trio.to_thread.run_sync(self.client.children, parent, abandon_on_cancel=True)
        now = time.time()
        for name in names:
            path = f"{parent}/{name}"
            found = await trio.to_thread.run_sync(self.client.read, path, None, abandon_on_cancel=True)
            if found is None:
                continue
            entry = SharedEntry.from_data(*found)
            if entry is not None and entry.expired(now):
                with contextlib.suppress(VersionMismatchError):
                    if await trio.to_thread.run_sync(
                        self.client.delete, path, entry.version, abandon_on_cancel=True
                    ):
                        self._count("delete", "expired")


async def serve_shared_cache(
    runtime: RouterRuntime, shared: SharedCache, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a router's shared cache until cancelled (`SharedCache.serve`)."""
    await shared.serve(task_status=task_status)
