"""The shared cache's metric families (registered through `Metrics.feature`, router/metrics.py)."""

from __future__ import annotations

from router.metrics import Family, FeatureMetrics, MetricKind

__all__ = ["SharedCacheMetrics"]


class SharedCacheMetrics(FeatureMetrics):
    """Each router's shared cache: its session, its conflicts and its ZooKeeper operations (the
    session's state by use is the kernel's `router_zookeeper_state`)."""

    def __init__(self) -> None:
        self.cache_shared_connected = Family(
            MetricKind.GAUGE,
            "router_cache_shared_connected",
            "1 while a shared cache's ZooKeeper session is connected, else 0 (decisions then use "
            "this router's cache alone).",
            ("router",),
        )
        self.cache_shared_conflicts = Family(
            MetricKind.COUNTER,
            "router_cache_shared_conflicts_total",
            "Keys for which this router adopted another router's choice from the shared cache after "
            "deciding differently itself (concurrent first decisions, or decisions made while "
            "ZooKeeper was unreachable).",
            ("router",),
        )
        self.cache_shared_operations = Family(
            MetricKind.COUNTER,
            "router_cache_shared_operations_total",
            "ZooKeeper operations of a shared cache, by operation (read, create, update, delete, "
            "claim) and outcome (ok, failed, timeout, raced: another router wrote first; expired: a "
            "sweep's delete).",
            ("router", "operation", "outcome"),
        )
