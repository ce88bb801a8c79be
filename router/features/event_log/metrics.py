"""The event log's metric families (registered through `Metrics.feature`, router/metrics.py): what
routerd's event log counts of its events and files, and its ring (docs/event-log.md)."""

from __future__ import annotations

from router.metrics import Family, FeatureMetrics, MetricKind

__all__ = ["EventLogMetrics"]


class EventLogMetrics(FeatureMetrics):
    """The event log's events by outcome, its files, its ring's size and use."""

    def __init__(self) -> None:
        self.event_log_events = Family(
            MetricKind.COUNTER,
            "router_event_log_events_total",
            "Routing events (decisions and closed connections) of the event log, by outcome: written "
            "(handed to the file in progress), dropped (the ring was full: the oldest went) or lost "
            "(a write failed, or the writer process died).",
            ("outcome",),
        )
        self.event_log_files = Family(
            MetricKind.COUNTER,
            "router_event_log_files_total",
            "Event log files, by outcome: finished (complete, renamed into place) or deleted (the "
            "oldest beyond <max-size>).",
            ("outcome",),
        )
        self.event_log_ring_size = Family(
            MetricKind.GAUGE,
            "router_event_log_ring_size",
            "Events the event log's ring holds at most (its ring-size; read when scraped).",
            (),
        )
        self.event_log_ring_used = Family(
            MetricKind.GAUGE,
            "router_event_log_ring_used",
            "Events waiting in the event log's ring for the writer (read when scraped).",
            (),
        )
