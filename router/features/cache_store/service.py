"""Persisted caches in a running routerd (`CacheStores`): each router's file opened and its entries
loaded before the router serves (at start, and for a router a reload adds), its cache's changes
written every `WRITE_INTERVAL_S` in a worker thread (through the file's writer process:
router/services/cache_store.py), and the last ones at exit or when a reload removes the router.

A file that cannot be opened or read is an `OpenError` (routerd does not start; at a reload:
nothing changes), unless routerd runs with `--discard-unreadable-cache`: then it is renamed aside
and the cache starts empty.

Decisions never wait for the disk: the cache journals what changed (cache/cache.py) and the
writes take the journal. A write that fails (disk full, an I/O error, an unwritable file) is logged
and counted, and the next write is the whole cache, so nothing is lost that the cache still holds.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from cache.cache import Changes
from router.feature import Kernel, OpenError, Service
from router.features.cache_store.metrics import CacheStoreMetrics
from router.services.cache_store import WRITE_INTERVAL_S, CacheStore, CacheStoreError, set_aside
from router.services.files import EXIT_FILES_S, why_unwritable

if TYPE_CHECKING:
    from cache.cache import Row
    from router.config.settings import RouterConfig
    from router.runtime import RouterRuntime

__all__ = [
    "CacheStores",
    "close_cache_store",
    "load_cache_store",
    "serve_cache_store",
    "write_cache_changes",
]

log = logging.getLogger("router.server")
write_log = logging.getLogger("router.cache")


class CacheStores(Service):
    """The persisted caches of one routerd, one file per router whose cache is persisted."""

    def __init__(self, kernel: Kernel) -> None:
        self._discard_unreadable = bool(kernel.options.get("discard_unreadable_cache"))
        self._metrics = kernel.metrics.feature(CacheStoreMetrics)
        self._prepared: dict[str, tuple[CacheStore, list[tuple[str, Row]]]] = {}
        """Router name -> its file and entries, read and not yet taken in (`router_added`)."""
        self._stores: dict[str, tuple[RouterRuntime, CacheStore]] = {}
        """Router name -> the router and its open file."""
        self._nursery: trio.Nursery | None = None
        """`serve`'s: where a removed router's last writes run."""

    def store_of(self, runtime: RouterRuntime) -> CacheStore | None:
        """The router's persisted cache's file, if it has one."""
        found = self._stores.get(runtime.name)
        return found[1] if found is not None and found[0] is runtime else None

    async def prepare_router(self, config: RouterConfig) -> None:
        offset = time.time() - trio.current_time()
        loaded = await trio.to_thread.run_sync(load_cache_store, config, self._discard_unreadable, offset)
        if loaded is not None:
            self._prepared[config.name] = loaded

    def discard_prepared(self) -> None:
        prepared, self._prepared = self._prepared, {}
        for store, _ in prepared.values():
            store.close()

    def router_added(self, runtime: RouterRuntime) -> None:
        loaded = self._prepared.pop(runtime.name, None)
        if loaded is None:
            return
        store, rows = loaded
        _restore_cache(runtime, rows)
        self._stores[runtime.name] = (runtime, store)

    def router_removed(self, runtime: RouterRuntime) -> None:
        found = self._stores.pop(runtime.name, None)
        if found is not None and self._nursery is not None:
            self._nursery.start_soon(self._close_removed, runtime, found[1])

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def serve_router_data(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        store = self.store_of(runtime)
        if store is not None:
            await serve_cache_store(runtime, store, self._metrics)

    async def close_files(self, timeout_s: float) -> None:
        self.discard_prepared()
        stores, self._stores = self._stores, {}
        async with trio.open_nursery() as nursery:
            for runtime, store in stores.values():
                nursery.start_soon(close_cache_store, runtime, store, self._metrics, timeout_s)

    async def _close_removed(self, runtime: RouterRuntime, store: CacheStore) -> None:
        """A removed router's persisted cache: its last changes written, its file closed."""
        with trio.CancelScope(shield=True):  # cleanup: the last decisions' changes reach the file
            await close_cache_store(runtime, store, self._metrics, EXIT_FILES_S)


def load_cache_store(
    config: RouterConfig, discard_unreadable: bool, offset: float
) -> tuple[CacheStore, list[tuple[str, Row]]] | None:
    """A router's persisted cache: its file opened, its entries read and its writer process started
    (`offset`: wall clock minus trio clock); None when its cache is not persisted.

    Raises:
        OpenError: the file cannot be opened or read (unless `discard_unreadable`: then it is
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
        raise OpenError(f"router {config.name!r}: {exc}") from exc


def _open_cache_store(router: str, path: str, discard_unreadable: bool) -> CacheStore:
    """Open the file. A file in a directory routerd cannot write fails here, at start (creating it,
    or SQLite's first write, which needs a journal beside it), rather than at its first write: the
    error says why and how to fix it (`why_unwritable`), as the state file's start-up warning does."""
    try:
        return CacheStore.open(path)
    except CacheStoreError as exc:
        if not (exc.damaged and discard_unreadable):
            unwritable = None if exc.damaged else why_unwritable(path)
            if exc.damaged:
                hint = "; move it away, or start routerd with --discard-unreadable-cache"
            elif unwritable is not None:
                hint = f" ({unwritable}): set <file> in its <cache> to a file in a writable directory"
            else:
                hint = ""
            raise OpenError(f"router {router!r}: {exc}{hint}") from exc
        aside = set_aside(path)
        log.warning("router=%s %s: renamed to %s; the cache starts empty", router, exc, aside)
    try:
        return CacheStore.open(path)
    except CacheStoreError as exc:
        raise OpenError(f"router {router!r}: {exc}") from exc


def _restore_cache(runtime: RouterRuntime, rows: list[tuple[str, Row]]) -> None:
    with runtime.held() as state:  # before the router serves
        assert state.engine.cache is not None
        loaded = state.engine.cache.restore(rows, trio.current_time())
    cache = runtime.config.cache
    assert cache is not None
    log.info("router=%s persisted cache %s: %d entries loaded", runtime.name, cache.file, loaded)


async def serve_cache_store(runtime: RouterRuntime, store: CacheStore, metrics: CacheStoreMetrics) -> None:
    """Write the router's cache journal every `WRITE_INTERVAL_S` until cancelled; the caller
    writes the last changes (`write_cache_changes`) and closes the store."""
    while True:
        await trio.sleep(WRITE_INTERVAL_S)
        await write_cache_changes(runtime, store, metrics)


async def write_cache_changes(runtime: RouterRuntime, store: CacheStore, metrics: CacheStoreMetrics) -> None:
    """Write what changed in the router's cache since the last write, in a worker thread; a failed
    write is logged and counted, and the next one writes the whole cache. Cancelled, it abandons
    the thread (a write hung on a frozen filesystem), and the next write is the whole cache."""
    now = trio.current_time()
    with runtime.held() as state:
        cache = state.engine.cache
        changes = Changes() if cache is None else cache.take_changes(now)
    if not changes.rows and not changes.full:
        return
    offset = time.time() - now
    try:
        written = await trio.to_thread.run_sync(store.write, changes, offset, abandon_on_cancel=True)
    except CacheStoreError as exc:
        _write_failed(runtime, metrics, f"{exc}; the next write is the whole cache")
        return
    except trio.Cancelled:
        _resync(runtime)  # the abandoned write may never land
        raise
    metrics.cache_store_rows.inc((runtime.name,), written)


async def close_cache_store(
    runtime: RouterRuntime, store: CacheStore, metrics: CacheStoreMetrics, timeout_s: float
) -> None:
    """At exit (or when a reload removes the router): write the last changes and close the file,
    within `timeout_s`; beyond it (a hung or frozen filesystem) the writer process is left to
    finish when the filesystem answers, with an ERROR naming the file, counted."""
    with trio.move_on_after(timeout_s) as scope:
        await write_cache_changes(runtime, store, metrics)
        await trio.to_thread.run_sync(store.close, abandon_on_cancel=True)
    if scope.cancelled_caught:
        _write_failed(
            runtime,
            metrics,
            f"persisted cache {store.path!r}: its last write did not end within {timeout_s:g} s (a hung "
            "or frozen filesystem?): left to its writer process, which ends once the filesystem answers",
        )


def _resync(runtime: RouterRuntime) -> None:
    """A write of the cache's changes failed: the next one is the whole cache."""
    with runtime.held() as state:
        if state.engine.cache is not None:
            state.engine.cache.resync()


def _write_failed(runtime: RouterRuntime, metrics: CacheStoreMetrics, message: str) -> None:
    _resync(runtime)
    metrics.cache_store_errors.inc((runtime.name,))
    write_log.error("router=%s %s", runtime.name, message)
