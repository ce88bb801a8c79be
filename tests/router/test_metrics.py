"""Metrics: Prometheus names, and one registry per server instance."""

from __future__ import annotations

from router.metrics import Metrics


def test_metrics_exposition_names_every_family() -> None:
    metrics = Metrics()
    metrics.connections_accepted.labels("a", "r").inc()
    metrics.decisions.labels("r", "OK").inc(2)
    text = metrics.exposition().decode()
    assert 'router_connections_accepted_total{acceptor="a",router="r"} 1.0' in text
    assert 'router_routing_decisions_total{router="r",status="OK"} 2.0' in text
    for family in (
        "router_target_ready",
        "router_pool_active",
        "router_proxied_connections",
        "router_target_connect_failures_total",
        "router_proxied_bytes_total",
        "router_lookups_total",
    ):
        assert f"# HELP {family.removesuffix('_total')}" in text


def test_metrics_instances_do_not_share_state() -> None:
    first, second = Metrics(), Metrics()
    first.decisions.labels("r", "OK").inc()
    labels = {"router": "r", "status": "OK"}
    assert first.registry.get_sample_value("router_routing_decisions_total", labels) == 1.0
    assert second.registry.get_sample_value("router_routing_decisions_total", labels) is None
