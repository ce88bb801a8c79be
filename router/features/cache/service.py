"""The sticky cache at run time: what operators read and change in a running router's cache, and
the sweep of expired entries.

Each function takes the router's lock (`RouterRuntime.held()`) and reads the trio clock, the
cache's clock; they run in the trio thread. `CachePurge`, the feature's service, sweeps each
router's expired entries every timeout, so keys never looked up again do not pile up.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

import trio

from router.feature import Service

if TYPE_CHECKING:
    from cache.cache import CacheEntry, TargetCache
    from router.feature import Kernel
    from router.runtime import RouterRuntime
    from router.runtime.state import RouterState

__all__ = [
    "CACHE_PURGE_MIN_PERIOD_S",
    "CachePurge",
    "cache_entries",
    "cache_entry",
    "cache_evict",
    "cache_listing",
    "cache_pin",
    "serve_cache_purge",
    "start",
]

CACHE_PURGE_MIN_PERIOD_S: Final = 1.0
"""Sweep expired cache entries at most this often (a tiny timeout would otherwise spin)."""


def _cache(runtime: RouterRuntime, state: RouterState) -> TargetCache:
    cache = state.engine.cache
    if cache is None:
        raise LookupError(f"connection router {runtime.name!r} has no <cache>")
    return cache


def cache_entries(runtime: RouterRuntime) -> dict[str, str]:
    """The sticky cache now: key -> node id of the entries not expired (empty without a cache)."""
    with runtime.held() as state:
        cache = state.engine.cache
        return {} if cache is None else cache.entries(trio.current_time())


def cache_listing(
    runtime: RouterRuntime, *, prefix: str = "", node_id: str | None = None, after: str = "", limit: int = 100
) -> list[CacheEntry]:
    """A page of the live cache entries in key order (`TargetCache.listing`).

    Raises:
        LookupError: the router has no cache.
    """
    with runtime.held() as state:  # a copy: sorting 100,000 keys would hold decisions for tens of ms
        copy = _cache(runtime, state).copy()
    return copy.listing(trio.current_time(), prefix=prefix, node_id=node_id, after=after, limit=limit)


def cache_entry(runtime: RouterRuntime, key: str) -> CacheEntry | None:
    """One live entry, as it is (no refresh); None when absent.

    Raises:
        LookupError: the router has no cache.
    """
    with runtime.held() as state:
        return _cache(runtime, state).entry(key, trio.current_time())


def cache_evict(runtime: RouterRuntime, *, key: str | None = None, node_id: str | None = None) -> int:
    """Evict one key, every entry of one target, or (neither given) everything; how many. A
    shared cache deletes their entries in ZooKeeper too (`TargetCache.note_evicted`).

    Raises:
        LookupError: the router has no cache.
    """
    with runtime.held() as state:
        cache = _cache(runtime, state)
        if key is not None:
            keys = [key] if cache.evict(key) else []
        elif node_id is not None:
            keys = cache.evict_target(node_id)
        else:
            keys = cache.clear()
        cache.note_evicted(keys if key is None else [key])
        return len(keys)


def cache_pin(runtime: RouterRuntime, key: str, node_id: str, duration_s: float | None = None) -> CacheEntry:
    """Pin a key to a target of the pool (for `duration_s`, or until evicted); the new entry.

    Raises:
        LookupError: the router has no cache.
        ValueError: no target with this node id, or a duration that is not > 0.
    """
    with runtime.held() as state:
        cache, pool = _cache(runtime, state), state.pool
        if pool is None or pool.target(node_id) is None:
            known = [] if pool is None else [t.node_id for t in pool.targets]
            raise ValueError(f"no target with node id {node_id!r} in the pool (has {known})")
        if duration_s is not None and not duration_s > 0:
            raise ValueError(f"a pin's duration must be > 0 seconds, got {duration_s!r}")
        now = trio.current_time()
        cache.pin(key, node_id, now, math.inf if duration_s is None else now + duration_s)
        entry = cache.entry(key, now)
    assert entry is not None
    return entry


async def serve_cache_purge(runtime: RouterRuntime) -> None:
    """Drop expired cache entries every timeout, so keys never looked up again do not pile up."""
    with runtime.held() as state:
        cache = state.engine.cache
    if cache is None or cache.config.timeout_ms == 0:
        return
    period_s = max(cache.config.timeout_ms / 1000, CACHE_PURGE_MIN_PERIOD_S)
    while True:
        await trio.sleep(period_s)
        with runtime.held():
            cache.purge_expired(trio.current_time())


class CachePurge(Service):
    """The feature's service: each router's sweep of expired entries (restarted with the router's
    tasks when a reload changes it, so a new cache or timeout is swept from then on)."""

    async def serve_router(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        await serve_cache_purge(runtime)


def start(kernel: Kernel) -> CachePurge:
    """The feature's service for one routerd."""
    return CachePurge()
