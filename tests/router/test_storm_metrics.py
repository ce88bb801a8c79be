"""router/storm_metrics.py: the storm protection's families are part of every routerd's metrics."""

from __future__ import annotations

from router.metrics import Metrics
from router.storm_metrics import QUEUE_BUCKETS_S


def test_storm_families_are_exported_with_the_kernels() -> None:
    metrics = Metrics()
    metrics.storm.queue_wait.observe(("r", "b1"), 0.3)
    metrics.storm.acceptor_paused.inc(("a",), 0.5)
    text = metrics.exposition().decode()
    assert 'router_target_queue_wait_seconds_bucket{le="0.5",node_id="b1",router="r"} 1.0' in text
    assert 'router_acceptor_paused_seconds_total{acceptor="a"} 0.5' in text
    for family in (
        "router_target_queue_length",
        "router_target_gate_connections",
        "router_target_gate_limit",
    ):
        assert f"# TYPE {family} gauge" in text
    assert tuple(sorted(QUEUE_BUCKETS_S)) == QUEUE_BUCKETS_S
