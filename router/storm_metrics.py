"""The storm protection's metric families: what the targets' gates (router/runtime/gates.py, the
rules in pools/gates.py) and the acceptors' `connectionRate` do, kept apart from the kernel's other
families (`Metrics.storm`, router/metrics.py)."""

from __future__ import annotations

from typing import Final

from router.metric_values import Family, Histogram, MetricKind

__all__ = ["QUEUE_BUCKETS_S", "StormMetrics"]

QUEUE_BUCKETS_S: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Buckets of `router_target_queue_wait_seconds`: a wait is a fraction of a queueTimeout (5 s by
default), up to half a minute."""


class StormMetrics:
    """The targets' queues and slots, and the acceptors' pauses."""

    def __init__(self) -> None:
        self.queue_wait = Histogram(
            "router_target_queue_wait_seconds",
            "How long connections waited in their target's queue (maxConnections, connectRate) "
            "before they were let in or refused at the queue timeout; its _count is the "
            "connections that waited.",
            ("router", "node_id"),
            QUEUE_BUCKETS_S,
        )
        self.queue_length = Family(
            MetricKind.GAUGE,
            "router_target_queue_length",
            "Connections waiting for their target's gate now (targets with maxConnections or "
            "connectRate; read at each scrape).",
            ("router", "node_id"),
        )
        self.gate_open = Family(
            MetricKind.GAUGE,
            "router_target_gate_connections",
            "Proxied connections holding one of their target's maxConnections slots now (read at "
            "each scrape).",
            ("router", "node_id"),
        )
        self.gate_limit = Family(
            MetricKind.GAUGE,
            "router_target_gate_limit",
            "A target's effective maxConnections now: lower than configured during its slow start "
            "(read at each scrape; targets with maxConnections only).",
            ("router", "node_id"),
        )
        self.acceptor_paused = Family(
            MetricKind.COUNTER,
            "router_acceptor_paused_seconds_total",
            "Seconds the acceptor stopped accepting because its connectionRate was used up (the "
            "kernel's listen backlog held new connections meanwhile); its rate is the share of time "
            "the acceptor is throttled.",
            ("acceptor",),
        )
