"""The moves' metric families (registered through `Metrics.feature`, router/metrics.py)."""

from __future__ import annotations

from router.metrics import Family, FeatureMetrics, MetricKind

__all__ = ["MoveMetrics"]


class MoveMetrics(FeatureMetrics):
    """What evacuations did and have left, per router and target."""

    def __init__(self) -> None:
        self.evacuation_moved = Family(
            MetricKind.COUNTER,
            "router_evacuation_moved_total",
            "Connections an evacuation moved off a target (told to go in their protocol, or closed).",
            ("router", "node_id"),
        )
        self.evacuation_remaining = Family(
            MetricKind.GAUGE,
            "router_evacuation_remaining",
            "Connections a running evacuation still has to move off a target (read when scraped).",
            ("router", "node_id"),
        )
