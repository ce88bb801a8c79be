"""router/core/live.py: the registry of proxied connections, what it closes (through the closers
the data paths give it), and the counts LEAST_CONNECTIONS reads from it. Pure: no trio here."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from keys.mqtt import encode_connect
from pools import BrokerFailure, Connector, Target
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import Closed, CloseReason, Connected, ConnectFailed, ConnectFailure, ConnectionRef
from router.core.live import BROKER_EARLY_CLOSE_S, LiveConnection, LiveConnections, broker_failure
from router.core.plan import Proxy, Refuse
from tests.router.core.test_ttl import _mqtt

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import Sniffed


class Closer:
    """A data path's closer that records what the router asked (and then calls `then`, if set)."""

    def __init__(self) -> None:
        self.calls: list[CloseReason] = []
        self.then: Callable[[], object] | None = None

    def __call__(self, reason: CloseReason) -> None:
        self.calls.append(reason)
        if self.then is not None:
            self.then()


def ref(peer: str = "127.0.0.2:5000", *, conn_id: int = 1) -> ConnectionRef:
    host, _, port = peer.rpartition(":")
    return ConnectionRef(id=conn_id, router="r", acceptor="a", peer=Address(host, int(port)))


def live_connection(
    peer: str = "127.0.0.2:5000",
    *,
    node_id: str = "b1",
    address: tuple[str, int] = ("127.0.0.1", 20001),
    ttl_ms: int = 1500,
    sniffed: Sniffed | None = None,
    now: float = 0.0,
    opening: bytes = b"",
    closer: Closer | None = None,
) -> LiveConnection:
    return LiveConnection(
        conn=ref(peer),
        node_id=node_id,
        address=Address(*address),
        closer=closer or Closer(),
        now=now,
        ttl_ms=ttl_ms,
        sniffed=sniffed,
        opening=opening,
    )


class TestLiveConnection:
    def test_sniffed_connection_has_its_ttl_at_once(self) -> None:
        conn = live_connection(sniffed=_mqtt(1))
        assert (conn.ttl_s, conn.peek_first_bytes) == (math.inf, False)
        conn = live_connection(sniffed=_mqtt(0))
        assert (conn.ttl_s, conn.peek_first_bytes) == (1.5, False)

    def test_unsniffed_connection_under_ttl_peeks_at_first_bytes(self) -> None:
        assert live_connection().peek_first_bytes is True
        assert live_connection(ttl_ms=-1).peek_first_bytes is False  # no TTL, nothing to decide

    @pytest.mark.parametrize(
        ("first", "ttl_s"),
        [
            pytest.param(encode_connect("c", keepalive_s=1), math.inf, id="mqtt-keepalive-1"),
            pytest.param(encode_connect("c", keepalive_s=0), 1.5, id="mqtt-keepalive-0"),
            pytest.param(encode_connect("c", keepalive_s=1)[:6], 1.5, id="incomplete-connect"),
            pytest.param(b"\x10\xff\xff\xff\xff\x01", 1.5, id="bad-mqtt"),
            pytest.param(b"AMQP\x03\x01\x00\x00", 1.5, id="amqp"),
        ],
    )
    def test_first_bytes_decide_the_mqtt_exemption(self, first: bytes, ttl_s: float) -> None:
        conn = live_connection()
        conn.first_bytes(bytearray(first))
        assert (conn.ttl_s, conn.peek_first_bytes) == (ttl_s, False)

    def test_opening_bytes_read_before_routing_decide_at_once(self) -> None:
        """Scenario: behind a PROXY header the CONNECT arrived with the header, unsniffed."""
        conn = live_connection(opening=encode_connect("c", keepalive_s=1))
        assert (conn.ttl_s, conn.peek_first_bytes) == (math.inf, False)

    def test_close_calls_the_closer_once_and_keeps_the_first_reason(self) -> None:
        closer = Closer()
        conn = live_connection(closer=closer)
        assert conn.close(CloseReason.CONNECTION_TTL) is True
        assert conn.close(CloseReason.TARGET_NOT_READY) is False
        assert conn.closed_by is CloseReason.CONNECTION_TTL
        assert closer.calls == [CloseReason.CONNECTION_TTL]
        assert "127.0.0.2:5000" in repr(conn)


def test_ended_reports_its_bytes_and_the_routers_reason_first() -> None:
    conn = live_connection()
    conn.counts[:] = [3, 4]
    assert conn.ended(2.0, CloseReason.CLOSED, "x") == Closed(
        conn=conn.conn,
        node_id="b1",
        bytes_in=3,
        bytes_out=4,
        duration_s=2.0,
        reason=CloseReason.CLOSED,
        detail="x",
    )
    conn.close(CloseReason.EVACUATED)
    assert conn.ended(2.0, CloseReason.RESET).reason is CloseReason.EVACUATED


def test_connected_in_reports_the_target_it_reached() -> None:
    conn = LiveConnection(
        conn=ref(), node_id="b1", address=Address("127.0.0.1", 20001), closer=Closer(), now=0.0, key="k"
    )
    assert conn.connected_in(0.25) == Connected(
        conn=conn.conn, key="k", node_id="b1", address=Address("127.0.0.1", 20001), connect_s=0.25
    )


class TestConnectFailed:
    """The ConnectFailed both data paths report for a connect that did not complete."""

    @staticmethod
    def _conn() -> LiveConnection:
        return LiveConnection(
            conn=ref(), node_id="b1", address=Address("127.0.0.1", 20001), closer=Closer(), now=0.0, key="k"
        )

    def test_a_failed_connect_names_the_redispatch_target(self) -> None:
        conn = self._conn()
        other = Connector.from_url("b2", "tcp://127.0.0.1:20002?nodeId=b2")
        then = Proxy(
            key="k", reason=DecisionReason.POLICY, target=Target.remote(other), connector=other, replay=b""
        )
        assert conn.connect_failed(("Connection refused", ConnectFailure.REFUSED), then) == ConnectFailed(
            conn=conn.conn,
            key="k",
            node_id="b1",
            address=Address("127.0.0.1", 20001),
            reason="Connection refused",
            cause=ConnectFailure.REFUSED,
            redispatched_to="b2",
        )

    def test_a_refused_client_is_redispatched_nowhere(self) -> None:
        refuse = Refuse(
            key="k", status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.CONNECT_FAILED, answer=b""
        )
        failed = self._conn().connect_failed(("timed out", ConnectFailure.TIMEOUT), refuse)
        assert (failed.reason, failed.cause, failed.redispatched_to) == (
            "timed out",
            ConnectFailure.TIMEOUT,
            None,
        )

    def test_closed_while_connecting_gives_the_routers_own_reason_first(self) -> None:
        conn = self._conn()
        failed = conn.connect_failed(CloseReason.SHUTDOWN)
        assert (failed.reason, failed.cause) == (
            "closed by the router: shutdown",
            ConnectFailure.CLOSED_BY_ROUTER,
        )
        conn.close(CloseReason.TARGET_NOT_READY)
        assert conn.connect_failed(CloseReason.SHUTDOWN).reason == "closed by the router: target_not_ready"


class TestBrokerAnswer:
    """What passive health learns from a connection's end (pools/outlier.py)."""

    def test_broker_closed_without_a_byte_soon_is_closed_early(self) -> None:
        conn = live_connection(sniffed=_mqtt(0))
        conn.counts[0] = 20
        conn.broker_ended_silently()
        assert conn.ended(BROKER_EARLY_CLOSE_S, CloseReason.RESET).reason is CloseReason.BROKER_CLOSED_EARLY
        assert broker_failure(CloseReason.BROKER_CLOSED_EARLY) is BrokerFailure.CLOSED_EARLY
        assert conn.ended(BROKER_EARLY_CLOSE_S + 0.1, CloseReason.CLOSED).reason is CloseReason.CLOSED

    def test_broker_silent_before_the_client_said_anything_does_not_count(self) -> None:
        conn = live_connection()
        conn.broker_ended_silently()
        assert conn.ended(0.1, CloseReason.CLOSED).reason is CloseReason.CLOSED
        assert broker_failure(CloseReason.CLOSED) is None

    def test_connack_refusal_is_broker_refused_with_its_code(self) -> None:
        conn = live_connection(sniffed=_mqtt(0))
        assert conn.broker_answered(memoryview(bytes.fromhex("20020005"))) is False
        closed = conn.ended(0.1, CloseReason.CLOSED)
        assert (closed.reason, closed.detail) == (
            CloseReason.BROKER_REFUSED,
            "mqtt CONNACK 0x05 not authorized",
        )
        assert live_connection(sniffed=_mqtt(0)).broker_answered(bytes.fromhex("20020000")) is True

    def test_router_close_wins_over_what_the_broker_did(self) -> None:
        conn = live_connection(sniffed=_mqtt(0))
        conn.broker_answered(bytes.fromhex("20020005"))
        conn.close(CloseReason.SHUTDOWN)
        assert conn.ended(0.1, CloseReason.CLOSED).reason is CloseReason.SHUTDOWN


class TestLiveConnections:
    def test_add_discard_and_lookup_by_target_and_address(self) -> None:
        live = LiveConnections()
        primary = live_connection("10.1.0.1:1", address=("10.0.0.1", 61616))
        backup = live_connection("10.1.0.1:2", address=("10.0.0.2", 61616))
        other = live_connection("10.1.0.1:3", node_id="b2")
        for conn in (primary, backup, other):
            live.add(conn)
        assert len(live) == 3
        assert live.to("b1") == [primary, backup]
        assert live.to("b1", Address("10.0.0.2", 61616)) == [backup]
        assert live.to("nope") == []
        live.discard(primary)
        live.discard(primary)  # twice is harmless
        live.discard(other)
        assert len(live) == 1
        assert live.to("b2") == []

    def test_relayed_counts_open_connections_and_keeps_ended_ones(self) -> None:
        """Scenario: bytes pass on two connections to two targets; one ends, is discarded twice,
        then a third registers. Each target's total counts open connections' bytes as they pass
        and never goes down."""
        live = LiveConnections()
        first, second, third = (live_connection(f"10.1.0.1:{n}", node_id=f"b{n}") for n in (1, 2, 3))
        live.add(first)
        live.add(second)
        assert live.relayed() == {"b1": (0, 0), "b2": (0, 0)}
        first.counts[0] += 10
        second.counts[1] += 200
        assert live.relayed() == {"b1": (10, 0), "b2": (0, 200)}
        first.counts[1] += 5
        live.discard(first)
        assert live.relayed() == {"b1": (10, 5), "b2": (0, 200)}
        live.discard(first)  # an unknown connection adds nothing
        assert live.relayed() == {"b1": (10, 5), "b2": (0, 200)}
        live.add(third)
        third.counts[0] += 1
        live.discard(second)
        assert live.relayed() == {"b1": (10, 5), "b2": (0, 200), "b3": (1, 0)}

    def test_open_to_gives_only_that_targets_open_connections(self) -> None:
        live = LiveConnections()
        closers = [Closer(), Closer(), Closer()]
        conns = [
            live_connection("10.1.0.1:1", closer=closers[0]),
            live_connection("10.1.0.1:2", closer=closers[1]),
            live_connection("10.1.0.1:3", node_id="b2", closer=closers[2]),
        ]
        for conn in conns:
            live.add(conn)
        doomed = live.open_to("b1")
        assert doomed == conns[:2]
        for conn in doomed:
            conn.close(CloseReason.TARGET_NOT_READY)
        assert live.open_to("b1") == []  # closing already: not twice
        assert [c.calls for c in closers] == [[CloseReason.TARGET_NOT_READY]] * 2 + [[]]
        assert [c.closed_by for c in conns] == [CloseReason.TARGET_NOT_READY] * 2 + [None]

    def test_open_to_a_member_address(self) -> None:
        """Scenario: an HA pair fails over; only the connections to the old member are closed."""
        live = LiveConnections()
        primary = live_connection("10.1.0.1:1", address=("10.0.0.1", 61616))
        backup = live_connection("10.1.0.1:2", address=("10.0.0.2", 61616))
        live.add(primary)
        live.add(backup)
        assert live.open_to("b1", Address("10.0.0.1", 61616)) == [primary]

    def test_open_all_leaves_out_what_the_router_closed(self) -> None:
        live = LiveConnections()
        conns = [live_connection("10.1.0.1:1"), live_connection("10.1.0.1:2", node_id="b2")]
        for conn in conns:
            live.add(conn)
        conns[0].close(CloseReason.CONNECTION_TTL)
        assert live.open_all() == [conns[1]]

    def test_close_idle_uses_the_last_read(self) -> None:
        live = LiveConnections()
        idle = live_connection("10.1.0.1:1")
        busy = live_connection("10.1.0.1:2")
        exempt = live_connection("10.1.0.1:3", sniffed=_mqtt(1))
        for conn in (idle, busy, exempt):
            live.add(conn)
        busy.last_read_at = 1.0
        ttl = CloseReason.CONNECTION_TTL
        assert live.close_idle(1.4, ttl) == []
        assert live.close_idle(1.5, ttl) == [(idle, 1.5)]
        assert live.close_idle(2.0, ttl) == []  # idle is closing already
        assert live.close_idle(2.5, ttl) == [(busy, 1.5)]
        assert exempt.closed_by is None

    def test_close_idle_drops_connections_exempted_by_their_first_bytes(self) -> None:
        live = LiveConnections()
        conn = live_connection()
        live.add(conn)
        conn.first_bytes(encode_connect("c", keepalive_s=1))
        assert live.close_idle(100.0, CloseReason.CONNECTION_TTL) == []
        assert conn.closed_by is None
        assert len(live) == 1  # still open, still closable when its target fails
        assert live.open_to("b1") == [conn]


class TestConnectionCount:
    def test_count_is_the_registered_connections_of_a_target(self) -> None:
        live = LiveConnections()
        conns = [live_connection("10.1.0.1:1"), live_connection("10.1.0.1:2"), live_connection(node_id="b2")]
        for conn in conns:
            live.add(conn)
        assert (live.connection_count("b1"), live.connection_count("b2"), live.connection_count("b3")) == (
            2,
            1,
            0,
        )
        live.discard(conns[0])
        assert live.connection_count("b1") == 1

    def test_a_broker_count_is_kept_up_to_date_with_our_own_changes(self) -> None:
        """Scenario: the broker reported 10 while we held 1; we open 2 more and close 1: 11."""
        live = LiveConnections()
        first = live_connection("10.1.0.1:1")
        live.add(first)
        live.report_broker_count("b1", 10)
        assert live.connection_count("b1") == 10
        for port in (2, 3):
            live.add(live_connection(f"10.1.0.1:{port}"))
        live.discard(first)
        assert live.connection_count("b1") == 11
        live.report_broker_count("b1", None)  # the probe could not read it: our own count again
        assert live.connection_count("b1") == 2

    def test_a_broker_count_never_goes_below_zero(self) -> None:
        live = LiveConnections()
        conns = [live_connection(f"10.1.0.1:{port}") for port in (1, 2, 3)]
        for conn in conns:
            live.add(conn)
        live.report_broker_count("b1", 1)  # the broker has not seen ours yet
        for conn in conns:
            live.discard(conn)
        assert live.connection_count("b1") == 0
