"""router/caches.py: a persisted cache's file at start and at a reload."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from cache.cache import CacheConfig, Changes
from router.caches import load_cache_store
from router.server import StartupError
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
    with pytest.raises(StartupError, match="router 'r': persisted cache"):
        load_cache_store(persisted, False, offset)
    with pytest.raises(StartupError, match="router 'r': persisted cache"):  # not locked by the first try
        load_cache_store(persisted, False, offset)
    loaded = load_cache_store(persisted, True, offset)  # --discard-unreadable-cache: set aside, empty
    assert loaded is not None
    loaded[0].close()
    assert loaded[1] == []
