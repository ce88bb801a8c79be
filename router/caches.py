"""Persisted caches at start and at a reload: each file opened, its entries loaded into the router's
cache, and its writer process started (router/services/cache_store.py writes the changes).

A file that cannot be opened or read is a `StartupError` (at a reload: nothing changes), unless
routerd runs with `--discard-unreadable-cache`: then it is renamed aside and the cache starts empty.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from router.acceptors import StartupError
from router.services.cache_store import CacheStore, CacheStoreError, close_cache_store, set_aside
from router.services.files import EXIT_FILES_S

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cache.cache import Row
    from router.config.settings import RouterConfig
    from router.runtime import RouterRuntime

__all__ = ["close_cache_stores", "close_store", "load_cache_store", "open_cache_stores", "restore_cache"]

log = logging.getLogger("router.server")


def open_cache_stores(
    runtimes: Iterable[RouterRuntime], discard_unreadable: bool
) -> list[tuple[RouterRuntime, CacheStore]]:
    """Open each persisted cache's file and load its entries into the router's cache.

    Raises:
        StartupError: a file cannot be opened or read (unless `discard_unreadable`: then it is
            renamed aside, logged, and the cache starts empty), or another routerd holds it.
    """
    stores: list[tuple[RouterRuntime, CacheStore]] = []
    try:
        for runtime in runtimes:
            loaded = load_cache_store(runtime.config, discard_unreadable, time.time() - trio.current_time())
            if loaded is not None:
                store, rows = loaded
                stores.append((runtime, store))
                restore_cache(runtime, rows)
    except StartupError:
        close_cache_stores(stores)
        raise
    return stores


def load_cache_store(
    config: RouterConfig, discard_unreadable: bool, offset: float
) -> tuple[CacheStore, list[tuple[str, Row]]] | None:
    """A router's persisted cache: its file opened and its entries read (`offset`: wall clock
    minus trio clock); None when its cache is not persisted.

    Raises:
        StartupError: the file cannot be opened or read (unless `discard_unreadable`: then it is
            renamed aside, logged, and the cache starts empty), or another routerd holds it.
    """
    cache = config.cache
    if cache is None or not cache.persisted:
        return None
    assert cache.file is not None, "the loader gives a persisted cache its file"
    store = _open_cache_store(config.name, cache.file, discard_unreadable)
    try:
        rows = store.load(time.time(), cache.timeout_ms, offset)
        store.start_writer()  # the writes go through a process of their own (cache_store.py)
        return store, rows
    except CacheStoreError as exc:
        store.close()
        raise StartupError(f"router {config.name!r}: {exc}") from exc


def restore_cache(runtime: RouterRuntime, rows: list[tuple[str, Row]]) -> None:
    with runtime.held() as state:  # before the router serves
        assert state.engine.cache is not None
        loaded = state.engine.cache.restore(rows, trio.current_time())
    cache = runtime.config.cache
    assert cache is not None
    log.info("router=%s persisted cache %s: %d entries loaded", runtime.name, cache.file, loaded)


def _open_cache_store(router: str, path: str, discard_unreadable: bool) -> CacheStore:
    try:
        return CacheStore.open(path)
    except CacheStoreError as exc:
        if not (exc.damaged and discard_unreadable):
            hint = "; move it away, or start routerd with --discard-unreadable-cache" if exc.damaged else ""
            raise StartupError(f"router {router!r}: {exc}{hint}") from exc
        aside = set_aside(path)
        log.warning("router=%s %s: renamed to %s; the cache starts empty", router, exc, aside)
    try:
        return CacheStore.open(path)
    except CacheStoreError as exc:
        raise StartupError(f"router {router!r}: {exc}") from exc


def close_cache_stores(stores: Iterable[tuple[RouterRuntime, CacheStore]]) -> None:
    for _, store in stores:
        store.close()


async def close_store(runtime: RouterRuntime, store: CacheStore) -> None:
    """A removed router's persisted cache: its last changes written, its file closed."""
    with trio.CancelScope(shield=True):  # cleanup: the last decisions' changes reach the file
        await close_cache_store(runtime, store, EXIT_FILES_S)
