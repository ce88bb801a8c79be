"""The subscribers of router events (router/core/events.py): the log lines and the metrics.

Both data paths report what happens to a connection as events, and the pool reports its changes;
this module is the only place that turns them into log lines (`log_event`) and metric updates
(`MetricUpdates`). Adding a consumer (the routing event log) means adding a subscriber, not
editing the data paths. Subscribers run in the reporting thread (trio's or the fast path's), so
they only format, count and return.

Log lines are `key=value` pairs (docs/operations.md lists them). Client-supplied values (keys) are
printed as received for now.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never

from pools import PoolEvent, PoolEventKind
from router.core.engine import DecisionReason
from router.core.events import (
    Accepted,
    Closed,
    CloseReason,
    Connected,
    ConnectFailed,
    ConnectionsClosed,
    Decided,
    LookedUp,
    Mode,
    NotAuthorized,
    OpeningFailed,
    OpeningFailure,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client import Counter, Gauge

    from router.core.events import Event
    from router.metrics import Metrics

__all__ = ["MetricUpdates", "log_event"]

conn_log = logging.getLogger("router.conn")
"""Client connections."""
pool_log = logging.getLogger("router.pool")
"""Pool and target changes, and what the router closed because of them."""

_WARN_REASONS = frozenset({DecisionReason.ROUTING_TIMED_OUT, DecisionReason.NO_LOCAL_CONNECTOR})
"""Refusals an operator should look at (the others are the pool doing its job)."""
_WARN_CLOSES = frozenset({CloseReason.REPLAY_FAILED.value, CloseReason.INTERNAL_ERROR.value})
"""By value: looking an Enum up in a set calls its Python-level hash, on every close."""


def log_event(event: Event) -> None:
    """Write the log line of an event (none for Accepted, proxied decisions and lookups)."""
    match event:  # the events of every connection first: each case is an isinstance check
        case Accepted() | LookedUp():
            pass
        case Decided():
            if event.mode is not Mode.PROXY:  # a proxied one: its Connected or ConnectFailed line follows
                _log_decided(event)
        case Closed():
            if conn_log.isEnabledFor(
                logging.WARNING if event.reason._value_ in _WARN_CLOSES else logging.INFO
            ):
                _log_closed(event)
        case Connected(conn=conn):
            if conn_log.isEnabledFor(logging.INFO):
                conn_log.info(
                    "peer=%s router=%s key=%s target=%s outcome=OK",
                    conn.peer,
                    conn.router,
                    event.key,
                    event.node_id,
                )
        case ConnectFailed(conn=conn):
            conn_log.warning(
                "peer=%s router=%s key=%s target=%s outcome=CONNECT_FAILED reason=%s",
                conn.peer,
                conn.router,
                event.key,
                event.node_id,
                event.reason,
            )
        case OpeningFailed():
            _log_opening_failed(event)
        case NotAuthorized(conn=conn, reason=reason):
            conn_log.warning(
                "peer=%s acceptor=%s router=%s outcome=NOT_AUTHORIZED reason=%s",
                conn.peer,
                conn.acceptor,
                conn.router,
                reason,
            )
        case ConnectionsClosed():
            _log_connections_closed(event)
        case PoolEvent():
            _log_pool_event(event)
        case _:
            assert_never(event)


def _log_opening_failed(event: OpeningFailed) -> None:
    conn = event.conn
    match event.failure:
        case OpeningFailure.REJECTED:
            conn_log.warning(
                "peer=%s acceptor=%s protocol=%s handshake rejected: %s",
                conn.peer,
                conn.acceptor,
                event.protocol,
                event.detail,
            )
        case OpeningFailure.TIMEOUT:
            conn_log.warning(
                "peer=%s acceptor=%s protocol=%s handshake not complete after %g s (%d bytes)",
                conn.peer,
                conn.acceptor,
                event.protocol,
                event.timeout_s,
                event.bytes_read,
            )
        case OpeningFailure.TLS:
            conn_log.warning(
                "peer=%s acceptor=%s protocol=tls handshake failed: %s",
                conn.peer,
                conn.acceptor,
                event.detail,
            )
        case _:
            assert_never(event.failure)


def _log_decided(event: Decided) -> None:
    conn = event.conn
    match event.mode:
        case Mode.PROXY:
            pass  # the Connected or ConnectFailed line follows
        case Mode.REDIRECT:
            if conn_log.isEnabledFor(logging.INFO):
                conn_log.info(
                    "peer=%s router=%s key=%s target=%s outcome=REDIRECT protocol=%s",
                    conn.peer,
                    conn.router,
                    event.key,
                    event.node_id,
                    "" if event.protocol is None else event.protocol.value,
                )
        case Mode.REFUSE:
            level = logging.WARNING if event.reason in _WARN_REASONS else logging.INFO
            conn_log.log(
                level,
                "peer=%s router=%s key=%s outcome=%s reason=%s",
                conn.peer,
                conn.router,
                event.key,
                event.status.value,
                event.reason.value,
            )
        case _:
            assert_never(event.mode)


def _log_closed(event: Closed) -> None:
    level = logging.WARNING if event.reason._value_ in _WARN_CLOSES else logging.INFO
    conn = event.conn
    conn_log.log(
        level,
        "peer=%s router=%s target=%s closed bytes_in=%d bytes_out=%d duration_s=%.3f reason=%s%s",
        conn.peer,
        conn.router,
        event.node_id,
        event.bytes_in,
        event.bytes_out,
        event.duration_s,
        event.reason.value,
        f" ({event.detail})" if event.detail else "",
    )


def _log_connections_closed(event: ConnectionsClosed) -> None:
    if event.reason is CloseReason.SHUTDOWN:
        pool_log.info(
            "router=%s grace period over: closing its %d proxied connection(s)", event.router, event.count
        )
        return
    what = "is not ready" if event.address is None else f"member {event.address} is not active"
    pool_log.warning(
        "router=%s target=%s %s: closing its %d proxied connection(s)",
        event.router,
        event.node_id,
        what,
        event.count,
    )


def _log_pool_event(event: PoolEvent) -> None:
    router, node_id, detail = event.pool, event.node_id, event.detail
    match event.kind:
        case PoolEventKind.TARGET_READY:
            pool_log.info("router=%s target=%s is ready%s", router, node_id, f" ({detail})" if detail else "")
        case PoolEventKind.TARGET_NOT_READY:
            pool_log.warning("router=%s target=%s is not ready: %s", router, node_id, detail)
        case PoolEventKind.TARGET_FAILOVER:
            pool_log.warning("router=%s target=%s failed over: %s", router, node_id, detail)
        case PoolEventKind.TARGET_ADDED:
            pool_log.info("router=%s target=%s joined the pool (%s)", router, node_id, detail)
        case PoolEventKind.TARGET_REMOVED:
            pool_log.warning("router=%s target=%s left the pool (it was %s)", router, node_id, detail)
        case PoolEventKind.POOL_ACTIVE:
            pool_log.info("router=%s pool is active (%s)", router, detail)
        case PoolEventKind.POOL_INACTIVE:
            pool_log.warning("router=%s pool is inactive (%s)", router, detail)
        case _:
            assert_never(event.kind)


@dataclass(frozen=True, slots=True)
class _Relayed:
    """The metric children a connection proxied to one target updates, looked up once."""

    active: Gauge
    to_target: Counter
    to_client: Counter


class MetricUpdates:
    """Keeps the metric families (`router/metrics.py`) up to date with events.

    Metric children are looked up once per label set (a `labels()` call costs microseconds) and
    created on first use, so /metrics shows only what happened. The events of every connection
    come first in `__call__`'s match (each case is an isinstance check).
    """

    __slots__ = ("_children", "_relayed", "metrics")

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._children: dict[tuple[Counter, str, str], Counter] = {}
        """(family, label, label) -> counter child."""
        self._relayed: dict[tuple[str, str], _Relayed] = {}
        """(router, node id) -> the children of its proxied connections."""

    def router_started(self, router: str, node_ids: Iterable[str] | None) -> None:
        """Export a router's pool as not active with no target ready yet (None: it has no pool)."""
        if node_ids is None:
            return
        self.metrics.pool_active.labels(router).set(0)
        for node_id in node_ids:
            self.metrics.target_ready.labels(router, node_id).set(0)

    def _counter(self, family: Counter, first: str, second: str = "") -> Counter:
        key = (family, first, second)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(first, second) if second else family.labels(first)
        return child

    def _relay(self, router: str, node_id: str) -> _Relayed:
        children = self._relayed.get((router, node_id))
        if children is None:
            m = self.metrics
            children = self._relayed[(router, node_id)] = _Relayed(
                active=m.active_connections.labels(router, node_id),
                to_target=m.proxied_bytes.labels(router, "client_to_target"),
                to_client=m.proxied_bytes.labels(router, "target_to_client"),
            )
        return children

    def __call__(self, event: Event) -> None:
        """Update the metrics of one event."""
        m = self.metrics
        match event:
            case Accepted(conn=conn):
                self._counter(m.connections_accepted, conn.acceptor, conn.router).inc()
            case Decided(conn=conn, status=status):
                self._counter(m.decisions, conn.router, status._value_).inc()  # not the .value property
            case Closed(conn=conn, node_id=node_id, reason=reason):
                relayed = self._relay(conn.router, node_id)
                relayed.active.dec()
                if event.bytes_in:
                    relayed.to_target.inc(event.bytes_in)
                if event.bytes_out:
                    relayed.to_client.inc(event.bytes_out)
                if reason.by_router:
                    self._counter(m.router_closes, conn.router, reason.value).inc()
            case Connected(conn=conn, node_id=node_id):
                self._relay(conn.router, node_id).active.inc()
            case ConnectFailed(conn=conn, node_id=node_id):
                self._counter(m.connect_failures, conn.router, node_id).inc()
            case OpeningFailed(conn=conn, failure=failure):
                label = event.protocol if failure is OpeningFailure.REJECTED else failure.value
                self._counter(m.client_errors, conn.acceptor, label).inc()
            case NotAuthorized(conn=conn):
                self._counter(m.auth_failures, conn.acceptor).inc()
            case LookedUp(router=router, status=status):
                self._counter(m.lookups, router, status.value).inc()
            case ConnectionsClosed():
                pass  # each connection's own Closed counts it
            case PoolEvent():
                self._pool_event(event)
            case _:
                assert_never(event)

    def _pool_event(self, event: PoolEvent) -> None:
        m, router, node_id = self.metrics, event.pool, event.node_id or ""
        match event.kind:
            case PoolEventKind.TARGET_READY:
                m.target_ready.labels(router, node_id).set(1)
            case PoolEventKind.TARGET_NOT_READY | PoolEventKind.TARGET_ADDED:
                m.target_ready.labels(router, node_id).set(0)
            case PoolEventKind.TARGET_REMOVED:
                # Not router_proxied_connections: connections to a target that left stay open.
                self._children.pop((m.connect_failures, router, node_id), None)
                for family in (m.target_ready, m.connect_failures):
                    with contextlib.suppress(KeyError):  # never had that child
                        family.remove(router, node_id)
            case PoolEventKind.POOL_ACTIVE:
                m.pool_active.labels(router).set(1)
            case PoolEventKind.POOL_INACTIVE:
                m.pool_active.labels(router).set(0)
            case PoolEventKind.TARGET_FAILOVER:
                pass
            case _:
                assert_never(event.kind)
