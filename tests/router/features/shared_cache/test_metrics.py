"""router/features/shared_cache/metrics.py: the families and their labels."""

from __future__ import annotations

from router.features.shared_cache.metrics import SharedCacheMetrics
from router.metrics import Metrics


def test_shared_cache_metrics_are_registered_and_counted() -> None:
    metrics = Metrics()
    families = metrics.feature(SharedCacheMetrics)
    families.cache_shared_connected.set(("r",), 1.0)
    families.cache_shared_conflicts.inc(("r",), 2)
    families.cache_shared_operations.inc(("r", "claim", "raced"))
    exposition = metrics.exposition().decode()
    assert 'router_cache_shared_connected{router="r"} 1.0' in exposition
    assert 'router_cache_shared_conflicts_total{router="r"} 2.0' in exposition
    assert (
        'router_cache_shared_operations_total{operation="claim",outcome="raced",router="r"} 1.0' in exposition
    )


def test_shared_cache_metrics_are_not_in_a_registry_without_the_feature() -> None:
    assert "router_cache_shared" not in Metrics().exposition().decode()
