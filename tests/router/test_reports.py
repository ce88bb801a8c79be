"""router/reports.py: the log line and the metric updates of every event."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import logging
import re
import typing
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import NULL_KEY, WireProtocol
from pools import PoolEvent, PoolEventKind, TargetState
from router import reports
from router.core import events
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import (
    Accepted,
    Closed,
    CloseReason,
    Connected,
    ConnectFailed,
    ConnectFailure,
    ConnectionRef,
    ConnectionsClosed,
    Decided,
    Event,
    LookedUp,
    Mode,
    NotAuthorized,
    OpeningFailed,
    OpeningFailure,
)
from router.core.status import CheckRecord, OperationalState, PoolStatus, TargetStatus
from router.logs import MAX_SHOWN_CHARS, shown
from router.metrics import Metrics
from router.reports import MetricUpdates, TargetMetrics, log_event

if TYPE_CHECKING:
    from collections.abc import Iterator

CONN = ConnectionRef(id=1, router="r", acceptor="a", peer=Address("::1", 5000))
TARGET_ADDRESS = Address("127.0.0.1", 1883)


def _failed(cause: ConnectFailure, *, reason: str = "x", redispatched_to: str | None = None) -> ConnectFailed:
    """A failed connect of `CONN` (key k) to b1."""
    return ConnectFailed(
        conn=CONN,
        key="k",
        node_id="b1",
        address=TARGET_ADDRESS,
        reason=reason,
        cause=cause,
        redispatched_to=redispatched_to,
    )


def _decided(
    mode: Mode, status: RouteStatus = RouteStatus.OK, reason: DecisionReason = DecisionReason.POLICY
) -> Decided:
    node_id = None if mode is Mode.REFUSE else "b1"
    return Decided(
        conn=CONN,
        key="k",
        status=status,
        reason=reason,
        mode=mode,
        node_id=node_id,
        protocol=WireProtocol.MQTT,
    )


@pytest.mark.parametrize(
    ("event", "level", "line"),
    [
        (Accepted(conn=CONN), None, None),
        (
            OpeningFailed(conn=CONN, failure=OpeningFailure.REJECTED, protocol="mqtt", detail="bad byte"),
            logging.WARNING,
            'peer=[::1]:5000 acceptor=a protocol=mqtt handshake rejected: "bad byte"',
        ),
        (
            OpeningFailed(
                conn=CONN, failure=OpeningFailure.TIMEOUT, protocol="detect", bytes_read=3, timeout_s=2.0
            ),
            logging.WARNING,
            "peer=[::1]:5000 acceptor=a protocol=detect handshake not complete after 2 s (3 bytes)",
        ),
        (
            OpeningFailed(conn=CONN, failure=OpeningFailure.TLS, protocol="tls", detail="NO_SHARED_CIPHER"),
            logging.WARNING,
            "peer=[::1]:5000 acceptor=a protocol=tls handshake failed: NO_SHARED_CIPHER",
        ),
        (
            NotAuthorized(conn=CONN, reason="user 'u' not authenticated by the store"),
            logging.WARNING,
            "peer=[::1]:5000 acceptor=a router=r outcome=NOT_AUTHORIZED "
            "reason=\"user 'u' not authenticated by the store\"",
        ),
        (_decided(Mode.PROXY), None, None),
        (
            _decided(Mode.REDIRECT),
            logging.INFO,
            "peer=[::1]:5000 router=r key=k target=b1 outcome=REDIRECT protocol=mqtt",
        ),
        (
            _decided(Mode.REFUSE, RouteStatus.REFUSED_UNAVAILABLE, DecisionReason.NO_READY_TARGET),
            logging.INFO,
            "peer=[::1]:5000 router=r key=k outcome=REFUSED_UNAVAILABLE reason=no ready target",
        ),
        (
            _decided(Mode.REFUSE, RouteStatus.REFUSED_UNAVAILABLE, DecisionReason.ROUTING_TIMED_OUT),
            logging.WARNING,
            "peer=[::1]:5000 router=r key=k outcome=REFUSED_UNAVAILABLE reason=routing timed out",
        ),
        (
            _decided(Mode.REFUSE, RouteStatus.REFUSED_USE_ANOTHER, DecisionReason.NO_LOCAL_CONNECTOR),
            logging.WARNING,
            "peer=[::1]:5000 router=r key=k outcome=REFUSED_USE_ANOTHER "
            "reason=the decision is the local target and no <local-target-connector-ref> is configured",
        ),
        (
            Connected(conn=CONN, key="k", node_id="b1", address=TARGET_ADDRESS, connect_s=0.25),
            logging.INFO,
            "peer=[::1]:5000 router=r key=k target=b1 outcome=OK",
        ),
        (
            _failed(ConnectFailure.REFUSED, reason="Connection refused"),
            logging.WARNING,
            "peer=[::1]:5000 router=r key=k target=b1 outcome=CONNECT_FAILED reason=Connection refused",
        ),
        (
            Closed(
                conn=CONN, node_id="b1", bytes_in=10, bytes_out=20, duration_s=1.5, reason=CloseReason.CLOSED
            ),
            logging.INFO,
            "peer=[::1]:5000 router=r target=b1 closed bytes_in=10 bytes_out=20 duration_s=1.500 "
            "reason=closed",
        ),
        (
            Closed(
                conn=CONN,
                node_id="b1",
                bytes_in=1,
                bytes_out=0,
                duration_s=0.0,
                reason=CloseReason.REPLAY_FAILED,
                detail="target sent no complete opening in 5 s",
            ),
            logging.WARNING,
            "peer=[::1]:5000 router=r target=b1 closed bytes_in=1 bytes_out=0 duration_s=0.000 "
            'reason=replay_failed ("target sent no complete opening in 5 s")',
        ),
        (
            ConnectionsClosed(
                router="r", node_id="b1", address=None, reason=CloseReason.TARGET_NOT_READY, count=2
            ),
            logging.WARNING,
            "router=r target=b1 is not ready: closing its 2 proxied connection(s)",
        ),
        (
            ConnectionsClosed(
                router="r", node_id="b1", address=TARGET_ADDRESS, reason=CloseReason.FAILOVER, count=1
            ),
            logging.WARNING,
            "router=r target=b1 member 127.0.0.1:1883 is not active: closing its 1 proxied connection(s)",
        ),
        (
            ConnectionsClosed(router="r", node_id=None, address=None, reason=CloseReason.SHUTDOWN, count=3),
            logging.INFO,
            "router=r grace period over: closing its 3 proxied connection(s)",
        ),
        (LookedUp(router="r", key="k", status=RouteStatus.OK), None, None),
        (
            PoolEvent(kind=PoolEventKind.TARGET_NOT_READY, pool="r", node_id="b1", detail="refused"),
            logging.WARNING,
            "router=r target=b1 is not ready: refused",
        ),
        (
            PoolEvent(kind=PoolEventKind.TARGET_READY, pool="r", node_id="b1"),
            logging.INFO,
            "router=r target=b1 is ready",
        ),
    ],
)
def test_log_event_writes_one_line_per_event(
    caplog: pytest.LogCaptureFixture, event: Event, level: int | None, line: str | None
) -> None:
    caplog.set_level(logging.DEBUG)
    log_event(event)
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records == ([] if line is None else [(level, line)])


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
    }


def test_metric_updates_of_a_proxied_connection() -> None:
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    for event in (
        Accepted(conn=CONN),
        _decided(Mode.PROXY),
        Connected(conn=CONN, key="k", node_id="b1", address=TARGET_ADDRESS, connect_s=0.25),
    ):
        updates(event)
    assert _samples(metrics)[("router_proxied_connections", (("node_id", "b1"), ("router", "r")))] == 1.0
    updates(
        Closed(
            conn=CONN, node_id="b1", bytes_in=10, bytes_out=20, duration_s=1.0, reason=CloseReason.SHUTDOWN
        )
    )
    samples = _samples(metrics)
    assert samples[("router_connections_accepted_total", (("acceptor", "a"), ("router", "r")))] == 1.0
    assert samples[("router_routing_decisions_total", (("router", "r"), ("status", "OK")))] == 1.0
    assert samples[("router_proxied_connections", (("node_id", "b1"), ("router", "r")))] == 0.0
    # Bytes are not counted from the Closed: RouterRuntime reads them while connections live.
    assert not any(name == "router_proxied_bytes_total" for name, _ in samples)
    assert (
        samples[("router_proxied_connections_closed_total", (("reason", "shutdown"), ("router", "r")))] == 1.0
    )


def test_metric_updates_of_failures_refusals_and_lookups() -> None:
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    for event in (
        OpeningFailed(conn=CONN, failure=OpeningFailure.REJECTED, protocol="amqp"),
        OpeningFailed(conn=CONN, failure=OpeningFailure.TIMEOUT, protocol="mqtt"),
        OpeningFailed(conn=CONN, failure=OpeningFailure.TLS, protocol="tls"),
        NotAuthorized(conn=CONN, reason="no"),
        _decided(Mode.REFUSE, RouteStatus.REFUSED_USE_ANOTHER, DecisionReason.NO_POOL_OR_POLICY),
        _failed(ConnectFailure.TIMEOUT, reason="timed out"),
        LookedUp(router="r", key="k", status=RouteStatus.REFUSED_UNAVAILABLE),
        Closed(conn=CONN, node_id="b1", bytes_in=0, bytes_out=0, duration_s=0.0, reason=CloseReason.RESET),
    ):
        updates(event)
    samples = _samples(metrics)
    assert samples[("router_client_errors_total", (("acceptor", "a"), ("reason", "amqp")))] == 1.0
    assert samples[("router_client_errors_total", (("acceptor", "a"), ("reason", "timeout")))] == 1.0
    assert samples[("router_client_errors_total", (("acceptor", "a"), ("reason", "tls")))] == 1.0
    assert samples[("router_authentication_failures_total", (("acceptor", "a"),))] == 1.0
    assert (
        samples[("router_routing_decisions_total", (("router", "r"), ("status", "REFUSED_USE_ANOTHER")))]
        == 1.0
    )
    assert (
        samples[
            (
                "router_target_connect_failures_total",
                (("node_id", "b1"), ("reason", "timeout"), ("router", "r")),
            )
        ]
        == 1.0
    )
    assert (
        samples[("router_routing_refusals_total", (("reason", "no_pool_or_policy"), ("router", "r")))] == 1.0
    )
    assert samples[("router_routing_refusals_total", (("reason", "connect_failed"), ("router", "r")))] == 1.0
    assert samples[("router_lookups_total", (("router", "r"), ("status", "REFUSED_UNAVAILABLE")))] == 1.0
    assert not any(
        name == "router_proxied_connections_closed_total" for name, _ in samples
    )  # a reset: not ours


def test_metric_updates_of_pool_events_and_a_target_that_leaves() -> None:
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    updates.router_started("r", ["b1"])
    samples = _samples(metrics)
    assert samples[("router_pool_active", (("router", "r"),))] == 0.0
    assert samples[("router_target_ready", (("node_id", "b1"), ("router", "r")))] == 0.0
    updates(PoolEvent(kind=PoolEventKind.TARGET_READY, pool="r", node_id="b1"))
    updates(PoolEvent(kind=PoolEventKind.POOL_ACTIVE, pool="r"))
    updates(_failed(ConnectFailure.OTHER))
    updates(_failed(ConnectFailure.TIMEOUT, reason="timed out"))
    updates(_decided(Mode.PROXY))
    updates(Connected(conn=CONN, key="k", node_id="b1", address=TARGET_ADDRESS, connect_s=0.25))
    samples = _samples(metrics)
    assert samples[("router_target_ready", (("node_id", "b1"), ("router", "r")))] == 1.0
    assert samples[("router_pool_active", (("router", "r"),))] == 1.0
    assert (
        samples[("router_target_connect_duration_seconds_count", (("node_id", "b1"), ("router", "r")))] == 1
    )
    updates(PoolEvent(kind=PoolEventKind.TARGET_REMOVED, pool="r", node_id="b1", detail="ready"))
    samples = _samples(metrics)
    assert ("router_target_ready", (("node_id", "b1"), ("router", "r"))) not in samples
    assert not [name for name, labels in samples if ("node_id", "b1") in labels and "target_connect" in name]
    updates(_failed(ConnectFailure.OTHER))
    assert (
        _samples(metrics)[
            (
                "router_target_connect_failures_total",
                (("node_id", "b1"), ("reason", "other"), ("router", "r")),
            )
        ]
        == 1.0
    )


def test_metric_updates_observe_the_connect_time_the_data_path_reports() -> None:
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    updates(_decided(Mode.PROXY))
    updates(_failed(ConnectFailure.REFUSED, redispatched_to="b2"))
    updates(Connected(conn=CONN, key="k", node_id="b2", address=TARGET_ADDRESS, connect_s=0.003))
    registry = metrics.registry
    b2 = {"router": "r", "node_id": "b2"}
    assert registry.get_sample_value("router_target_connect_duration_seconds_count", b2) == 1.0
    assert registry.get_sample_value("router_target_connect_duration_seconds_sum", b2) == 0.003
    b1 = {"router": "r", "node_id": "b1"}
    assert registry.get_sample_value("router_target_connect_duration_seconds_count", b1) is None
    assert registry.get_sample_value("router_connect_redispatches_total", {"router": "r"}) == 1.0
    assert (
        registry.get_sample_value(
            "router_routing_refusals_total", {"router": "r", "reason": "connect_failed"}
        )
        is None
    )


def test_metric_updates_closed_while_connecting_is_no_refusal() -> None:
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    updates(_decided(Mode.PROXY))
    updates(_failed(ConnectFailure.CLOSED_BY_ROUTER, reason=CloseReason.SHUTDOWN.while_connecting))
    samples = _samples(metrics)
    assert not any(name == "router_routing_refusals_total" for name, _ in samples)
    assert (
        samples[
            (
                "router_target_connect_failures_total",
                (("node_id", "b1"), ("reason", "closed_by_router"), ("router", "r")),
            )
        ]
        == 1.0
    )


def test_metric_updates_count_refusals_by_reason() -> None:
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    for reason in (
        DecisionReason.NO_READY_TARGET,
        DecisionReason.NO_READY_TARGET,
        DecisionReason.ROUTING_TIMED_OUT,
    ):
        updates(_decided(Mode.REFUSE, RouteStatus.REFUSED_UNAVAILABLE, reason))
    updates(_decided(Mode.REDIRECT))
    registry, labels = metrics.registry, {"router": "r"}
    assert (
        registry.get_sample_value("router_routing_refusals_total", {**labels, "reason": "no_ready_target"})
        == 2
    )
    assert (
        registry.get_sample_value("router_routing_refusals_total", {**labels, "reason": "routing_timed_out"})
        == 1
    )


def _pool_status(*targets: TargetStatus) -> PoolStatus:
    return PoolStatus(kind="static-connectors", active=True, quorum_size=1, targets=targets)


def _target_status(
    node_id: str,
    state: TargetState = TargetState.READY,
    operational_state: OperationalState = OperationalState.UP,
    last_check: CheckRecord | None = None,
    last_change: float | None = None,
) -> TargetStatus:
    return TargetStatus(
        node_id=node_id,
        local=False,
        connector=None,
        state=state,
        operational_state=operational_state,
        last_check=last_check,
        last_change=last_change,
        connections=0,
    )


def test_target_metrics_export_state_check_and_change_and_drop_targets_that_left() -> None:
    metrics = Metrics()
    export = TargetMetrics(metrics, "r")
    check = CheckRecord(at=1000.0, duration_s=0.25, ok=True)
    export(
        _pool_status(
            _target_status(
                "b1", operational_state=OperationalState.DRAIN, last_check=check, last_change=900.0
            ),
            _target_status("b2", TargetState.UNKNOWN, OperationalState.DOWN),
        )
    )
    registry = metrics.registry

    def value(name: str, node_id: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"router": "r", "node_id": node_id, **labels})

    assert {s.value: value("router_target_state", "b1", state=s.value) for s in OperationalState} == {
        "up": 0.0,
        "down": 0.0,
        "drain": 1.0,
        "maint": 0.0,
        "ejected": 0.0,
    }
    assert value("router_target_state", "b2", state="down") == 1.0
    assert value("router_target_check_duration_seconds", "b1") == 0.25
    assert value("router_target_check_duration_seconds", "b2") is None  # not probed yet
    assert value("router_target_last_change_timestamp_seconds", "b1") == 900.0
    export(_pool_status(_target_status("b2", operational_state=OperationalState.UP, last_change=950.0)))
    assert value("router_target_state", "b2", state="up") == 1.0
    assert value("router_target_state", "b1", state="drain") is None
    assert value("router_target_check_duration_seconds", "b1") is None
    assert value("router_target_last_change_timestamp_seconds", "b1") is None
    export(None)
    assert "router_target_state{" not in metrics.exposition().decode()


def _event_types() -> set[type]:
    """Every type in the `Event` union (it is a string alias: evaluated with the module's names)."""
    alias: object = events.Event
    assert isinstance(alias, str)
    union = eval(alias, {**vars(events), "PoolEvent": PoolEvent})  # our own alias
    return set(typing.get_args(union))


def test_every_event_type_has_a_log_line_or_is_silent_and_has_a_metric_update() -> None:
    types = _event_types()
    assert len(types) == 12
    assert set(reports._LOG_LINES) | reports.SILENT_EVENTS == types
    assert not set(reports._LOG_LINES) & reports.SILENT_EVENTS
    assert set(MetricUpdates(Metrics())._updates) == types


# -- client-supplied values: one line per event, whatever the client sends (router/logs.py `shown`) --

HOSTILE_VALUES = [
    pytest.param("evil\nINFO router.conn: peer=1.2.3.4:1 router=r key=x target=b1 outcome=OK", id="newline"),
    pytest.param("evil\rpeer=x", id="cr"),
    pytest.param("\x1b[2J\x1b[31mred", id="ansi"),
    pytest.param('say "hi"', id="quotes"),
    pytest.param("back\\slash\\", id="backslash"),
    pytest.param("x outcome=OK key=y", id="key-value-look-alike"),
    pytest.param("jürgen\u202e😀", id="unicode"),
    pytest.param("k" * 15000, id="15kb"),
]


@contextlib.contextmanager
def _captured() -> Iterator[list[logging.LogRecord]]:
    """The records of the report loggers, every level enabled (no caplog: hypothesis reuses it)."""
    records: list[logging.LogRecord] = []

    class ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = ListHandler()
    saved = [(log, log.level) for log in (reports.conn_log, reports.pool_log)]
    for log, _ in saved:
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        for log, level in saved:
            log.removeHandler(handler)
            log.setLevel(level)


def _client_events(value: str) -> list[Event]:
    """Every event whose line carries a client-supplied value, carrying `value`."""
    return [
        Connected(conn=CONN, key=value, node_id="b1", address=TARGET_ADDRESS, connect_s=0.25),
        ConnectFailed(
            conn=CONN,
            key=value,
            node_id="b1",
            address=TARGET_ADDRESS,
            reason="timed out",
            cause=ConnectFailure.TIMEOUT,
        ),
        Decided(
            conn=CONN,
            key=value,
            status=RouteStatus.OK,
            reason=DecisionReason.POLICY,
            mode=Mode.REDIRECT,
            node_id="b1",
        ),
        Decided(
            conn=CONN,
            key=value,
            status=RouteStatus.REFUSED_UNAVAILABLE,
            reason=DecisionReason.ROUTING_TIMED_OUT,
            mode=Mode.REFUSE,
        ),
        NotAuthorized(conn=CONN, reason=value),
        OpeningFailed(conn=CONN, failure=OpeningFailure.REJECTED, protocol="mqtt", detail=value),
        OpeningFailed(conn=CONN, failure=OpeningFailure.TLS, protocol="tls", detail=value),
        Closed(
            conn=CONN,
            node_id="b1",
            bytes_in=1,
            bytes_out=0,
            duration_s=0.0,
            reason=CloseReason.REPLAY_FAILED,
            detail=value,
        ),
    ]


def _only_line(event: Event) -> str:
    with _captured() as records:
        log_event(event)
    assert len(records) == 1
    return records[0].getMessage()


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
"""A quoted value of `shown` (what a logfmt reader skips as one value)."""


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_log_event_client_value_stays_in_one_quoted_line(value: str) -> None:
    for event in _client_events(value):
        line = _only_line(event)
        assert all(" " <= char <= "~" for char in line), line
        assert shown(value) in line
        assert shown(value).startswith('"')
        unquoted = _QUOTED.sub('""', line)
        assert unquoted.count("outcome=") <= 1, line
        assert "key=y" not in unquoted


def test_log_event_long_key_is_cut_with_its_length() -> None:
    line = _only_line(
        Connected(conn=CONN, key="k" * 15000, node_id="b1", address=TARGET_ADDRESS, connect_s=0.25)
    )
    assert (
        line == f'peer=[::1]:5000 router=r key="{"k" * MAX_SHOWN_CHARS}"...(len=15000) target=b1 outcome=OK'
    )


def test_log_event_forged_line_is_inside_the_quotes() -> None:
    line = _only_line(
        Connected(
            conn=CONN,
            key="x\nINFO router.conn: key=y outcome=OK",
            node_id="b1",
            address=TARGET_ADDRESS,
            connect_s=0.25,
        )
    )
    assert (
        line == 'peer=[::1]:5000 router=r key="x\\nINFO router.conn: key=y outcome=OK" target=b1 outcome=OK'
    )


def test_log_event_null_key_prints_null() -> None:
    line = _only_line(
        Connected(conn=CONN, key=NULL_KEY, node_id="b1", address=TARGET_ADDRESS, connect_s=0.25)
    )
    assert line == "peer=[::1]:5000 router=r key=NULL target=b1 outcome=OK"


_CONNECTED_LINE = re.compile(
    r'peer=\[::1\]:5000 router=r key=("(?:[^"\\]|\\.)*"(?:\.\.\.\(len=\d+\))?|[^" ]+) target=b1 outcome=OK'
)


@given(st.text())
def test_log_event_any_key_gives_one_line_and_its_prefix_back(key: str) -> None:
    line = _only_line(Connected(conn=CONN, key=key, node_id="b1", address=TARGET_ADDRESS, connect_s=0.25))
    assert all(" " <= char <= "~" for char in line), line
    found = _CONNECTED_LINE.fullmatch(line)
    assert found is not None, line
    text = found.group(1)
    cut = re.fullmatch(r'(".*")\.\.\.\(len=(\d+)\)', text)
    if cut is not None:
        assert ast.literal_eval(cut.group(1)) == key[:MAX_SHOWN_CHARS]
        assert int(cut.group(2)) == len(key) > MAX_SHOWN_CHARS
    elif text.startswith('"'):
        assert ast.literal_eval(text) == key
    else:
        assert text == key


def test_target_metrics_count_failed_probes_and_down_time_on_from_the_last_scrape() -> None:
    """Scenario: the status says 2 failed probes and 3.5 s down, then 5 and 10 s: the counters
    follow (from 0 at the first scrape, never counting a value twice); a target's connect
    failures start at 0 for every reason; a target that leaves takes its series along."""
    metrics = Metrics()
    export = TargetMetrics(metrics, "r")
    registry = metrics.registry

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"router": "r", "node_id": "b1", **labels})

    down = OperationalState.DOWN
    first = dataclasses.replace(_target_status("b1", operational_state=down), check_failures=2, down_s=3.5)
    export(_pool_status(first))
    assert (value("router_target_check_failures_total"), value("router_target_down_seconds_total")) == (
        2.0,
        3.5,
    )
    assert value("router_target_connect_failures_total", reason="refused") == 0.0
    later = dataclasses.replace(first, check_failures=5, down_s=10.0)
    export(_pool_status(later))
    export(_pool_status(later))
    assert (value("router_target_check_failures_total"), value("router_target_down_seconds_total")) == (
        5.0,
        10.0,
    )
    export(_pool_status())
    assert value("router_target_check_failures_total") is None
    assert value("router_target_down_seconds_total") is None
