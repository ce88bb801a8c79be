"""The persisted caches' metric families (registered through `Metrics.feature`, router/metrics.py)."""

from __future__ import annotations

from router.metrics import Family, FeatureMetrics, MetricKind

__all__ = ["CacheStoreMetrics"]


class CacheStoreMetrics(FeatureMetrics):
    """Each router's persisted cache: what it wrote and what failed."""

    def __init__(self) -> None:
        self.cache_store_rows = Family(
            MetricKind.COUNTER,
            "router_cache_store_rows_total",
            "Rows a persisted cache wrote to its file (entries changed or deleted).",
            ("router",),
        )
        self.cache_store_errors = Family(
            MetricKind.COUNTER,
            "router_cache_store_errors_total",
            "Writes of a persisted cache's changes that failed (the next write is the whole cache).",
            ("router",),
        )
