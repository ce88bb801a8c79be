"""router/features/cache_store/metrics.py: the families and their labels."""

from __future__ import annotations

from router.features.cache_store.metrics import CacheStoreMetrics
from router.metrics import Metrics


def test_cache_store_metrics_are_registered_and_counted() -> None:
    metrics = Metrics()
    families = metrics.feature(CacheStoreMetrics)
    families.cache_store_rows.inc(("r",), 3)
    families.cache_store_errors.inc(("r",))
    exposition = metrics.exposition().decode()
    assert 'router_cache_store_rows_total{router="r"} 3.0' in exposition
    assert 'router_cache_store_errors_total{router="r"} 1.0' in exposition


def test_cache_store_metrics_are_not_in_a_registry_without_the_feature() -> None:
    assert "router_cache_store" not in Metrics().exposition().decode()
