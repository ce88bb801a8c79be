"""router/features/event_log/metrics.py: the families and their labels (counted by the event log
itself: test_service.py)."""

from __future__ import annotations

from router.features import register_metrics
from router.features.event_log.metrics import EventLogMetrics
from router.metrics import Metrics


def test_event_log_metrics_are_registered_and_counted() -> None:
    metrics = Metrics()
    families = metrics.feature(EventLogMetrics)
    families.event_log_events.inc(("written",), 3)
    families.event_log_files.inc(("finished",))
    families.event_log_ring_size.set((), 65536)
    families.event_log_ring_used.set((), 7)
    exposition = metrics.exposition().decode()
    assert 'router_event_log_events_total{outcome="written"} 3.0' in exposition
    assert 'router_event_log_files_total{outcome="finished"} 1.0' in exposition
    assert "router_event_log_ring_size 65536.0" in exposition
    assert "router_event_log_ring_used 7.0" in exposition


def test_event_log_metrics_are_listed_from_the_start_even_with_the_log_off() -> None:
    """Scenario: routerd registers every feature's families at start (/metrics lists them)."""
    assert "# HELP router_event_log_events_total" not in Metrics().exposition().decode()
    assert "# HELP router_event_log_events_total" in register_metrics(Metrics()).exposition().decode()
