"""router/features/cache_store/service.py: a persisted cache's file at start and at a reload (the
whole start, reload and exit through a real routerd: test_routerd_cache.py, test_routerd_file_faults.py)."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from cache.cache import CacheConfig, Changes
from router.feature import OpenError
from router.features.cache_store.service import load_cache_store
from router.services.cache_store import CacheStore
from tests.router.test_server import _config


def test_a_persisted_cache_is_loaded_alike_at_start_and_by_a_reload(tmp_path):
    """`load_cache_store` (what start and a reload adding a router both use): the file's entries
    in the router's clock; None for a cache that is not persisted; a damaged file is one error that
    names the router, and leaves the file free (no lock held: it can be set aside and reopened)."""
    path = tmp_path / "r.sqlite"
    offset = time.time() - 100.0  # wall clock = the router's clock + offset
    writer = CacheStore.open(str(path))
    writer.write(Changes({"k1": ("b0", 10.0, math.nan), "k2": ("b1", 20.0, math.nan)}), offset)
    writer.close()
    base = _config([1])
    persisted = dataclasses.replace(
        base.routers[0], cache=CacheConfig(persisted=True, timeout_ms=600_000, file=str(path))
    )
    loaded = load_cache_store(persisted, False, offset)
    assert loaded is not None
    store, rows = loaded
    store.close()
    assert [(key, row[0], round(row[1], 3)) for key, row in rows] == [("k1", "b0", 10.0), ("k2", "b1", 20.0)]
    not_persisted = dataclasses.replace(persisted, cache=CacheConfig(timeout_ms=1))
    assert load_cache_store(not_persisted, False, offset) is None

    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    with pytest.raises(OpenError, match="router 'r': persisted cache"):
        load_cache_store(persisted, False, offset)
    with pytest.raises(OpenError, match="router 'r': persisted cache"):  # not locked by the first try
        load_cache_store(persisted, False, offset)
    loaded = load_cache_store(persisted, True, offset)  # --discard-unreadable-cache: set aside, empty
    assert loaded is not None
    loaded[0].close()
    assert loaded[1] == []


def test_a_persisted_cache_in_a_directory_routerd_cannot_write_stops_it_saying_why(tmp_path):
    """Scenario (issue 34): the default cache file beside a configuration in a place routerd cannot
    write (here under a file, which stops root too) fails at start, and says why and the fix."""
    (tmp_path / "broker.xml").write_text("<configuration/>")
    path = tmp_path / "broker.xml" / "broker-cache-r.sqlite"
    base = _config([1])
    persisted = dataclasses.replace(
        base.routers[0], cache=CacheConfig(persisted=True, timeout_ms=600_000, file=str(path))
    )
    with pytest.raises(OpenError) as info:
        load_cache_store(persisted, False, 0.0)
    assert str(info.value) == (
        f"router 'r': persisted cache {str(path)!r} cannot be opened: Not a directory (its directory "
        f"{tmp_path / 'broker.xml'} is not a directory): set <file> in its <cache> to a file in a "
        "writable directory"
    )


async def test_the_service_loads_at_start_writes_and_closes_at_exit(tmp_path):
    """`CacheStores`: a router's file read before the router joins (`prepare_router`), its entries
    in the router's cache once it does (`router_added`), its changes written at exit (`close_files`)
    and counted; a reload that fails lets go of what it read (`discard_prepared`)."""
    import trio

    from router.feature import Kernel
    from router.features.cache_store.metrics import CacheStoreMetrics
    from router.features.cache_store.service import CacheStores
    from router.runtime import RouterRuntime

    path = tmp_path / "r.sqlite"
    writer = CacheStore.open(str(path))
    writer.write(
        Changes({"k1": ("b0", trio.current_time() - 1.0, math.nan)}), time.time() - trio.current_time()
    )
    writer.close()
    base = _config([1])
    router = dataclasses.replace(
        base.routers[0], cache=CacheConfig(persisted=True, timeout_ms=600_000, file=str(path))
    )
    config = dataclasses.replace(base, routers=(router,))
    from router.metrics import Metrics

    metrics = Metrics()
    runtime = RouterRuntime(config, router, metrics)
    kernel = Kernel(runtimes={"r": runtime}, metrics=metrics, stop=lambda: None, config=lambda: config)
    service = CacheStores(kernel)

    await service.prepare_router(router)
    service.discard_prepared()  # a failed reload: the file is free again
    await service.prepare_router(router)
    service.router_added(runtime)
    assert service.store_of(runtime) is not None
    with runtime.held() as state:
        assert state.engine.cache is not None
        assert state.engine.cache.get("k1", trio.current_time()) is not None
        state.engine.cache.put("k2", "b0", trio.current_time())
    await service.close_files(5.0)
    reader = CacheStore.open(str(path), read_only=True)
    try:
        assert sorted(key for key, _ in reader.load(time.time(), 600_000)) == ["k1", "k2"]
    finally:
        reader.close()
    assert (metrics.feature(CacheStoreMetrics).cache_store_rows.value(("r",)) or 0) >= 1
