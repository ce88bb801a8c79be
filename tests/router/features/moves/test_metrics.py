"""router/features/moves/metrics.py: the families and their labels."""

from __future__ import annotations

from router.features.moves.metrics import MoveMetrics
from router.metrics import Metrics


def test_move_metrics_are_registered_and_counted() -> None:
    metrics = Metrics()
    families = metrics.feature(MoveMetrics)
    families.evacuation_moved.inc(("r", "b1"))
    families.evacuation_remaining.set(("r", "b1"), 3.0)
    exposition = metrics.exposition().decode()
    assert 'router_evacuation_moved_total{node_id="b1",router="r"} 1.0' in exposition
    assert 'router_evacuation_remaining{node_id="b1",router="r"} 3.0' in exposition


def test_move_metrics_are_not_in_a_registry_without_the_feature() -> None:
    assert "router_evacuation" not in Metrics().exposition().decode()
