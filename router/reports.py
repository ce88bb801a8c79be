"""The subscribers of router events (router/core/events.py): the log lines and the metrics.

Both data paths report what happens to a connection as events, and the pool reports its changes;
this module is the only place that turns them into log lines (`log_event`) and metric updates
(`MetricUpdates`). Adding a consumer (the routing event log) means adding a subscriber, not
editing the data paths. Subscribers run in the reporting thread (trio's or the fast path's), so
they only format, count and return. What is read rather than counted, the targets' states and
probes, is copied into the metrics at scrape time (`TargetMetrics`, from the router's status).

Log lines are `key=value` pairs (docs/operations.md lists them). Every value a client (or a
target) chose goes through `shown`: the key, the reason of a refused authentication, what was wrong
with an opening or a replay (sniffer reasons quote client bytes). A plain value stays bare; any
other is quoted and escaped, and a long one is cut and followed by its length, so one line is
always one event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, assert_never

from pools import PoolEvent, PoolEventKind
from router import conn_lines
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import (
    Accepted,
    AcceptRefused,
    Closed,
    CloseReason,
    Connected,
    ConnectFailed,
    ConnectFailure,
    ConnectionsClosed,
    Decided,
    GateOutcome,
    Held,
    LookedUp,
    Mode,
    NotAuthorized,
    OpeningFailed,
    OpeningFailure,
)
from router.core.status import OperationalState
from router.logs import shown

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from router.core.events import Event
    from router.core.status import PoolStatus
    from router.metric_values import Tally
    from router.metrics import Metrics

__all__ = ["MetricUpdates", "TargetMetrics", "log_event"]

conn_log = logging.getLogger("router.conn")
"""Client connections."""
pool_log = logging.getLogger("router.pool")
"""Pool and target changes, and what the router closed because of them."""

_WARN_REASONS = frozenset({DecisionReason.ROUTING_TIMED_OUT, DecisionReason.NO_LOCAL_CONNECTOR})
"""Refusals an operator should look at (the others are the pool doing its job)."""
_WARN_CLOSES = frozenset({CloseReason.REPLAY_FAILED.value, CloseReason.INTERNAL_ERROR.value})
"""By value: looking an Enum up in a set calls its Python-level hash, on every close."""

_OK: Final = RouteStatus.OK._value_
"""The `status` label of a proxied decision."""
_REFUSAL_LABELS: Final = {reason._value_: reason.name.lower() for reason in DecisionReason}
"""The `reason` label of `router_routing_refusals_total` for each decision reason, by value."""
_REFUSAL_REASONS: Final = (
    DecisionReason.NO_READY_TARGET,
    DecisionReason.POLICY_SELECTS_NONE,
    DecisionReason.NO_POOL_OR_POLICY,
    DecisionReason.ROUTING_TIMED_OUT,
    DecisionReason.NO_LOCAL_CONNECTOR,
    DecisionReason.CONNECT_FAILED,
    DecisionReason.QUEUE_FULL,
    DecisionReason.QUEUE_TIMEOUT,
)
"""The decision reasons that refuse a client (docs/operations.md, `router_routing_refusals_total`):
their series start at 0."""
_TARGET_FAILURES: Final = tuple(
    cause for cause in ConnectFailure if cause is not ConnectFailure.CLOSED_BY_ROUTER
)
"""The `reason`s of `router_target_connect_failures_total` a target's series start with, at 0."""


def log_event(event: Event) -> None:
    """Write the log line of an event (none for Accepted, proxied decisions and lookups)."""
    write = _LOG_LINES.get(type(event))
    if write is not None:
        write(event)


def _log_decided_unless_proxied(event: Decided) -> None:
    if event.mode is not Mode.PROXY:  # a proxied one: its Connected or ConnectFailed line follows
        _log_decided(event)


def _log_connected(event: Connected) -> None:
    if conn_log.isEnabledFor(logging.INFO):
        conn = event.conn
        conn_lines.connected(conn.peer, conn.router, event.key, event.node_id)


def _log_connect_failed(event: ConnectFailed) -> None:
    conn = event.conn
    conn_log.warning(
        "peer=%s router=%s key=%s target=%s outcome=CONNECT_FAILED reason=%s%s",
        conn.peer,
        conn.router,
        shown(event.key),
        event.node_id,
        event.reason,
        "" if event.redispatched_to is None else f" redispatched_to={event.redispatched_to}",
    )


def _log_held(event: Held) -> None:
    conn = event.conn
    if event.outcome is GateOutcome.ADMITTED:
        if conn_log.isEnabledFor(logging.INFO):
            conn_lines.info(
                "peer=%s router=%s key=%s target=%s waited_s=%.3f: let in by the target's gate",
                conn.peer,
                conn.router,
                shown(event.key),
                event.node_id,
                event.waited_s,
            )
        return
    if event.moved_to is not None:
        if conn_log.isEnabledFor(logging.INFO):
            conn_lines.info(
                "peer=%s router=%s key=%s target=%s reason=%s waited_s=%.3f redispatched_to=%s",
                conn.peer,
                conn.router,
                shown(event.key),
                event.node_id,
                event.outcome.value,
                event.waited_s,
                event.moved_to,
            )
        return
    conn_log.warning(
        "peer=%s acceptor=%s router=%s key=%s target=%s outcome=REFUSED_UNAVAILABLE reason=%s waited_s=%.3f",
        conn.peer,
        conn.acceptor,
        conn.router,
        shown(event.key),
        event.node_id,
        event.outcome.value,
        event.waited_s,
    )


def _log_not_authorized(event: NotAuthorized) -> None:
    conn = event.conn
    conn_log.warning(
        "peer=%s acceptor=%s router=%s outcome=NOT_AUTHORIZED reason=%s",
        conn.peer,
        conn.acceptor,
        conn.router,
        shown(event.reason),
    )


def _log_opening_failed(event: OpeningFailed) -> None:
    conn = event.conn
    match event.failure:
        case OpeningFailure.REJECTED:
            conn_log.warning(
                "peer=%s acceptor=%s protocol=%s handshake rejected: %s",
                conn.peer,
                conn.acceptor,
                event.protocol,
                shown(event.detail),
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
                shown(event.detail),
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
                conn_lines.info(
                    "peer=%s router=%s key=%s target=%s outcome=REDIRECT protocol=%s",
                    conn.peer,
                    conn.router,
                    shown(event.key),
                    event.node_id,
                    "" if event.protocol is None else event.protocol.value,
                )
        case Mode.REFUSE:
            level = logging.WARNING if event.reason in _WARN_REASONS else logging.INFO
            if not conn_log.isEnabledFor(level):
                return
            conn_lines.log(
                level,
                "peer=%s router=%s key=%s outcome=%s reason=%s",
                conn.peer,
                conn.router,
                shown(event.key),
                event.status.value,
                event.reason.value,
            )
        case _:
            assert_never(event.mode)


def _log_closed(event: Closed) -> None:
    level = logging.WARNING if event.reason._value_ in _WARN_CLOSES else logging.INFO
    if not conn_log.isEnabledFor(level):
        return
    conn = event.conn
    conn_lines.closed(
        level,
        conn.peer,
        conn.router,
        event.node_id,
        event.bytes_in,
        event.bytes_out,
        event.duration_s,
        event.reason._value_,
        event.detail,
    )


def _log_accept_refused(event: AcceptRefused) -> None:
    conn_log.warning(
        "peer=%s acceptor=%s router=%s refused at accept: %s reached (%d connections)",
        event.peer,
        event.acceptor,
        event.router,
        event.refusal.parameter,
        event.limit,
    )


def _log_connections_closed(event: ConnectionsClosed) -> None:
    if event.reason is CloseReason.SHUTDOWN:
        pool_log.info(
            "router=%s grace period over: closing its %d proxied connection(s)", event.router, event.count
        )
        return
    if event.reason is CloseReason.TARGET_REMOVED:
        what = (
            "left the configuration"
            if event.address is None
            else f"member {event.address} left the configuration"
        )
    else:
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
        case PoolEventKind.TARGET_ADMIN_STATE:
            pool_log.warning("router=%s target=%s admin state %s", router, node_id, detail)
        case PoolEventKind.TARGET_EJECTED:
            pool_log.warning("router=%s target=%s is %s", router, node_id, detail)
        case PoolEventKind.TARGET_RETURNED:
            pool_log.info("router=%s target=%s returns from its ejection (%s)", router, node_id, detail)
        case PoolEventKind.POOL_ACTIVE:
            pool_log.info("router=%s pool is active (%s)", router, detail)
        case PoolEventKind.POOL_INACTIVE:
            pool_log.warning("router=%s pool is inactive (%s)", router, detail)
        case _:
            assert_never(event.kind)


_LOG_LINES: Final[Mapping[type[Event], Callable[[Any], None]]] = {
    AcceptRefused: _log_accept_refused,
    Decided: _log_decided_unless_proxied,
    Closed: _log_closed,
    Connected: _log_connected,
    ConnectFailed: _log_connect_failed,
    OpeningFailed: _log_opening_failed,
    NotAuthorized: _log_not_authorized,
    Held: _log_held,
    ConnectionsClosed: _log_connections_closed,
    PoolEvent: _log_pool_event,
}
"""The line of each event type, looked up by the event's type (one dict lookup instead of a match
that tries each class in turn); Accepted and LookedUp have none."""
SILENT_EVENTS: Final = frozenset({Accepted, LookedUp})
"""The event types without a log line (a test checks every event type is one or the other)."""


class MetricUpdates:
    """Keeps the metric families (`router/metrics.py`) up to date with events.

    A label set appears in /metrics from its first update on, so /metrics shows only what happened.
    """

    __slots__ = ("_updates", "metrics")

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._updates: Mapping[type[Event], Callable[[Any], None]] = {
            Accepted: self._accepted,
            Decided: self._decided,
            Connected: self._connected,
            Closed: self._closed,
            ConnectFailed: self._connect_failed,
            OpeningFailed: self._opening_failed,
            NotAuthorized: self._not_authorized,
            Held: self._held,
            LookedUp: self._looked_up,
            AcceptRefused: self._accept_refused,
            ConnectionsClosed: self._connections_closed,
            PoolEvent: self._pool_event,
        }
        """The update of each event type, looked up by the event's type (a test checks that every
        event type has one)."""

    def router_started(self, router: str, node_ids: Iterable[str] | None) -> None:
        """Export a router's counters at 0 for each of their known label values (so that panels
        and rates show 0, not "no data", before the first one), and its pool as not active with no
        target ready yet (None: it has no pool)."""
        m = self.metrics
        for status in RouteStatus:
            m.decisions.inc((router, status._value_), 0)
        for reason in _REFUSAL_REASONS:
            m.refusals.inc((router, _REFUSAL_LABELS[reason._value_]), 0)
        m.redispatches.inc((router,), 0)
        if node_ids is None:
            return
        self.metrics.pool_active.set((router,), 0)
        for node_id in node_ids:
            self.metrics.target_ready.set((router, node_id), 0)

    def __call__(self, event: Event) -> None:
        """Update the metrics of one event."""
        self._updates[type(event)](event)

    def accepted(self, acceptor: str, router: str, tally: Tally | None = None) -> None:
        """An `Accepted`'s update, without the event (it has no line); into `tally` when given."""
        if tally is None:
            self.metrics.connections_accepted.inc((acceptor, router))
        else:
            self.accepted_cell(acceptor, router, tally)[0] += 1

    def proxied(self, router: str, tally: Tally | None = None) -> None:
        """A proxied `Decided`'s update, without the event (its line is the Connected one's); into
        `tally` when given."""
        if tally is None:
            self.metrics.decisions.inc((router, _OK))
        else:
            self.proxied_cell(router, tally)[0] += 1

    def accepted_cell(self, acceptor: str, router: str, tally: Tally) -> list[int]:
        """`tally`'s cell of `accepted`'s count, for a caller that keeps it."""
        return tally.cell(self.metrics.connections_accepted, (acceptor, router))

    def proxied_cell(self, router: str, tally: Tally) -> list[int]:
        """`tally`'s cell of `proxied`'s count, for a caller that keeps it."""
        return tally.cell(self.metrics.decisions, (router, _OK))

    def _accepted(self, event: Accepted) -> None:
        conn = event.conn
        self.accepted(conn.acceptor, conn.router)

    def _decided(self, event: Decided) -> None:
        m, router, mode = self.metrics, event.conn.router, event.mode
        m.decisions.inc((router, event.status._value_))  # not the .value property
        if mode is Mode.REFUSE:
            m.refusals.inc((router, _REFUSAL_LABELS[event.reason._value_]))

    def _connected(self, event: Connected) -> None:
        m, labels = self.metrics, (event.conn.router, event.node_id)
        m.active_connections.inc(labels)
        m.connect_duration.observe(labels, event.connect_s)

    def _closed(self, event: Closed) -> None:
        m, router = self.metrics, event.conn.router
        m.active_connections.inc((router, event.node_id), -1)
        if event.reason.by_router:
            m.router_closes.inc((router, event.reason.value))

    def _connect_failed(self, event: ConnectFailed) -> None:
        m, router = self.metrics, event.conn.router
        cause = event.cause
        m.connect_failures.inc((router, event.node_id, cause._value_))
        if event.redispatched_to is not None:
            m.redispatches.inc((router,))
            return
        if cause is not ConnectFailure.CLOSED_BY_ROUTER:  # the client is refused in its protocol
            m.refusals.inc((router, _REFUSAL_LABELS[DecisionReason.CONNECT_FAILED._value_]))

    def _held(self, event: Held) -> None:
        m, router, outcome = self.metrics, event.conn.router, event.outcome
        if outcome is not GateOutcome.QUEUE_FULL:
            m.storm.queue_wait.observe((router, event.node_id), event.waited_s)
        if outcome is not GateOutcome.ADMITTED and event.moved_to is None:
            m.refusals.inc((router, outcome.name.lower()))

    def _opening_failed(self, event: OpeningFailed) -> None:
        failure = event.failure
        label = event.protocol if failure is OpeningFailure.REJECTED else failure.value
        self.metrics.client_errors.inc((event.conn.acceptor, label))

    def _not_authorized(self, event: NotAuthorized) -> None:
        self.metrics.auth_failures.inc((event.conn.acceptor,))

    def _accept_refused(self, event: AcceptRefused) -> None:
        self.metrics.connections_refused.inc((event.acceptor, event.refusal.value))

    def _looked_up(self, event: LookedUp) -> None:
        self.metrics.lookups.inc((event.router, event.status.value))

    def _connections_closed(self, event: ConnectionsClosed) -> None:
        pass  # each connection's own Closed counts it

    def _pool_event(self, event: PoolEvent) -> None:
        m, labels = self.metrics, (event.pool, event.node_id or "")
        match event.kind:
            case PoolEventKind.TARGET_READY:
                m.target_ready.set(labels, 1)
            case PoolEventKind.TARGET_NOT_READY | PoolEventKind.TARGET_ADDED:
                m.target_ready.set(labels, 0)
            case PoolEventKind.TARGET_REMOVED:
                # Not router_proxied_connections: connections to a target that left stay open.
                # Its state, probe and last change go with the next scrape (`TargetMetrics`).
                m.target_ready.remove(labels)
                m.connect_failures.remove_matching(labels)
                m.ejections.remove(labels)
                m.connect_duration.remove_matching(labels)
            case PoolEventKind.POOL_ACTIVE:
                m.pool_active.set((event.pool,), 1)
            case PoolEventKind.POOL_INACTIVE:
                m.pool_active.set((event.pool,), 0)
            case PoolEventKind.TARGET_EJECTED:
                m.ejections.inc(labels)
            case (
                PoolEventKind.TARGET_ADMIN_STATE
                | PoolEventKind.TARGET_FAILOVER
                | PoolEventKind.TARGET_RETURNED
            ):
                pass  # router_target_state is read from the router's status when scraped
            case _:
                assert_never(event.kind)


class TargetMetrics:
    """Copies a router's targets from its status into the metrics, before each scrape:
    `router_target_state` (one-hot), `router_target_check_duration_seconds` and
    `router_target_last_change_timestamp_seconds`, `router_target_check_failures_total` and
    `router_target_down_seconds_total` (counted on from what the status said at the last scrape);
    the series of targets that left are dropped."""

    __slots__ = ("_exported", "metrics", "router")

    def __init__(self, metrics: Metrics, router: str) -> None:
        self.metrics = metrics
        self.router = router
        self._exported: dict[str, tuple[int, float]] = {}
        """Node ids exported at the last scrape, with their failed probes and down time then."""

    def __call__(self, pool: PoolStatus | None) -> None:
        """Export the targets of `pool` (the router's status now; None: no pool)."""
        m, router = self.metrics, self.router
        targets = () if pool is None else pool.targets
        if pool is not None:
            m.pool_open_targets.set((router,), pool.open)
        for target in targets:
            labels = (router, target.node_id)
            for state in OperationalState:
                m.target_state.set((*labels, state.value), int(state is target.operational_state))
            if target.last_check is not None:
                m.target_check_duration.set(labels, target.last_check.duration_s)
            if target.last_change is not None:
                m.target_last_change.set(labels, target.last_change)
            if target.node_id not in self._exported:  # at 0 from the start: panels show 0, not "no data"
                for cause in _TARGET_FAILURES:
                    m.connect_failures.inc((*labels, cause._value_), 0)
            failures, down_s = self._exported.get(target.node_id, (0, 0.0))
            m.check_failures.inc(labels, max(0, target.check_failures - failures))
            m.down_seconds.inc(labels, max(0.0, target.down_s - down_s))
        current = {target.node_id: (target.check_failures, target.down_s) for target in targets}
        for node_id in self._exported.keys() - current.keys():
            labels = (router, node_id)
            m.target_state.remove_matching(labels)
            for family in (m.target_check_duration, m.target_last_change, m.check_failures, m.down_seconds):
                family.remove(labels)
        self._exported = current
