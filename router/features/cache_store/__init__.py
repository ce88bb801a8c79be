"""A persisted sticky cache (`<persisted>true</persisted>`): each router's cache loaded from its
file before the router serves, its changes written every `WRITE_INTERVAL_S`, the last ones at exit.

    service.py   `CacheStores`: the files opened and loaded (at start, and for a router a reload
                 adds), the writes, the last writes at exit or when a reload removes the router
    metrics.py   router_cache_store_rows_total, router_cache_store_errors_total

The file itself (SQLite, written through a process of its own, read by `routerctl route --cache`
too) is the kernel's: router/services/cache_store.py. routerd's `--discard-unreadable-cache` is
this feature's option.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature, Option
from router.features.cache_store.metrics import CacheStoreMetrics
from router.features.cache_store.service import CacheStores

__all__ = ["FEATURE"]

FEATURE: Final = Feature(
    name="cache_store",
    in_workers=False,
    metrics=CacheStoreMetrics,
    options=(
        Option(
            name="discard_unreadable_cache",
            help="start with an empty cache when a persisted cache's file cannot be read (damaged, "
            "not a database); the file is renamed to FILE.unreadable-TIME, not deleted",
        ),
    ),
    start=CacheStores,
)
