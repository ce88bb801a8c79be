"""Prometheus metrics of one router process, served on the admin listener at /metrics.

Each server instance has its own `CollectorRegistry` (tests run several in one process). Names
follow Prometheus conventions: `router_` prefix, `_total` for counters, base units.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["Metrics"]


class Metrics:
    """The router's metric families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections_accepted = Counter(
            "router_connections_accepted_total",
            "Client connections accepted, by acceptor and router.",
            ["acceptor", "router"],
            registry=r,
        )
        self.decisions = Counter(
            "router_routing_decisions_total",
            "Outcomes of routed client connections as the client gets them, by router and status "
            "(OK, REFUSED_USE_ANOTHER, REFUSED_UNAVAILABLE).",
            ["router", "status"],
            registry=r,
        )
        self.lookups = Counter(
            "router_lookups_total",
            "Management-API lookups (GET .../target?key=), by router and status.",
            ["router", "status"],
            registry=r,
        )
        self.target_ready = Gauge(
            "router_target_ready",
            "1 while a pool target is ready (its last probe succeeded), else 0.",
            ["router", "node_id"],
            registry=r,
        )
        self.pool_active = Gauge(
            "router_pool_active",
            "1 while the router's pool has its quorum of ready targets, else 0.",
            ["router"],
            registry=r,
        )
        self.active_connections = Gauge(
            "router_proxied_connections",
            "Proxied connections open now, by router and target.",
            ["router", "node_id"],
            registry=r,
        )
        self.router_closes = Counter(
            "router_proxied_connections_closed_total",
            "Proxied connections the router closed itself, by router and reason: connection_ttl "
            "(no bytes from the client within the connection TTL), target_not_ready (the "
            "target's probe failed) or failover (the HA-pair member it went to is no longer the active one).",
            ["router", "reason"],
            registry=r,
        )
        self.connect_failures = Counter(
            "router_target_connect_failures_total",
            "Routed connections whose connect to the chosen target failed.",
            ["router", "node_id"],
            registry=r,
        )
        self.proxied_bytes = Counter(
            "router_proxied_bytes_total",
            "Bytes relayed, counted when a connection closes; direction is client_to_target or "
            "target_to_client.",
            ["router", "direction"],
            registry=r,
        )
        self.auth_failures = Counter(
            "router_authentication_failures_total",
            "Clients refused because the router's user store did not accept their credentials.",
            ["acceptor"],
            registry=r,
        )
        self.client_errors = Counter(
            "router_client_errors_total",
            "Client connections closed during their opening: bad bytes, over the byte cap, or the "
            "handshake deadline; reason is the protocol that rejected it, or 'timeout'.",
            ["acceptor", "reason"],
            registry=r,
        )

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
