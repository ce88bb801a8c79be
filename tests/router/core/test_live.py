"""router/core/live.py: the registry of proxied connections and what it closes."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from keys import Sniffed, WireProtocol
from keys.mqtt import encode_connect
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import Config, RouterConfig
from router.core.live import CLOSED_BY_TARGET_NOT_READY, CLOSED_BY_TTL, LiveConnections, ProxiedConnection
from router.metrics import Metrics
from router.runtime import RouterRuntime


def _runtime() -> RouterRuntime:
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{20000 + i}") for i in (1, 2))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("b1", "b2")),
    )
    return RouterRuntime(Config(source="t.xml", connectors=connectors, routers=(router,)), router, Metrics())


def _conn(
    peer: str = "127.0.0.2:5000",
    *,
    node_id: str = "b1",
    address: tuple[str, int] = ("127.0.0.1", 20001),
    ttl_ms: int = 1500,
    sniffed: Sniffed | None = None,
    now: float = 0.0,
    opening: bytes = b"",
) -> ProxiedConnection:
    return ProxiedConnection(
        peer=peer,
        acceptor="a",
        node_id=node_id,
        address=address,
        ttl_ms=ttl_ms,
        sniffed=sniffed,
        now=now,
        opening=opening,
    )


def _mqtt(keepalive_s: int) -> Sniffed:
    return Sniffed(
        protocol=WireProtocol.MQTT, client_id="c", protocol_version="3.1.1", keepalive_s=keepalive_s
    )


async def _hold(conn: ProxiedConnection, closed_at: dict[str, float]) -> None:
    """Stand-in for a connection's proxy task: runs until its scope is cancelled."""
    with conn.cancel_scope:
        await trio.sleep_forever()
    closed_at[conn.peer] = trio.current_time()


# -- ProxiedConnection --


class TestProxiedConnection:
    def test_sniffed_connection_has_its_ttl_at_once(self) -> None:
        conn = _conn(sniffed=_mqtt(1))
        assert (conn.ttl_s, conn.peek_first_bytes) == (math.inf, False)
        conn = _conn(sniffed=_mqtt(0))
        assert (conn.ttl_s, conn.peek_first_bytes) == (1.5, False)

    def test_unsniffed_connection_under_ttl_peeks_at_first_bytes(self) -> None:
        assert _conn().peek_first_bytes is True
        assert _conn(ttl_ms=-1).peek_first_bytes is False  # no TTL, nothing to decide

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
        conn = _conn()
        conn.first_bytes(bytearray(first))
        assert (conn.ttl_s, conn.peek_first_bytes) == (ttl_s, False)

    def test_opening_bytes_read_before_routing_decide_at_once(self) -> None:
        """Scenario: behind a PROXY header the CONNECT arrived with the header, unsniffed."""
        conn = _conn(opening=encode_connect("c", keepalive_s=1))
        assert (conn.ttl_s, conn.peek_first_bytes) == (math.inf, False)

    def test_close_keeps_the_first_reason(self) -> None:
        conn = _conn()
        assert conn.close(CLOSED_BY_TTL) is True
        assert conn.close(CLOSED_BY_TARGET_NOT_READY) is False
        assert conn.closed_by == CLOSED_BY_TTL
        assert conn.cancel_scope.cancel_called
        assert "127.0.0.2:5000" in repr(conn)


# -- LiveConnections --


class TestLiveConnections:
    def test_add_discard_and_lookup_by_target_and_address(self) -> None:
        live = LiveConnections()
        primary = _conn("p:1", address=("10.0.0.1", 61616))
        backup = _conn("p:2", address=("10.0.0.2", 61616))
        other = _conn("p:3", node_id="b2")
        for conn in (primary, backup, other):
            live.add(conn)
        assert len(live) == 3
        assert live.to("b1") == [primary, backup]
        assert live.to("b1", ("10.0.0.2", 61616)) == [backup]
        assert live.to("nope") == []
        live.discard(primary)
        live.discard(primary)  # twice is harmless
        live.discard(other)
        assert len(live) == 1
        assert live.to("b2") == []

    async def test_close_target_cancels_only_that_target(self) -> None:
        live = LiveConnections()
        conns = [_conn("p:1"), _conn("p:2"), _conn("p:3", node_id="b2")]
        closed_at: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for conn in conns:
                live.add(conn)
                nursery.start_soon(_hold, conn, closed_at)
            await trio.testing.wait_all_tasks_blocked()
            assert live.close_target("b1") == 2
            assert live.close_target("b1") == 0  # closing already: not counted twice
            await trio.testing.wait_all_tasks_blocked()
            assert set(closed_at) == {"p:1", "p:2"}
            assert [c.closed_by for c in conns] == [CLOSED_BY_TARGET_NOT_READY] * 2 + [None]
            nursery.cancel_scope.cancel()

    def test_close_target_by_member_address(self) -> None:
        """Scenario: an HA pair fails over; only the connections to the old member are closed."""
        live = LiveConnections()
        primary = _conn("p:1", address=("10.0.0.1", 61616))
        backup = _conn("p:2", address=("10.0.0.2", 61616))
        live.add(primary)
        live.add(backup)
        assert live.close_target("b1", address=("10.0.0.1", 61616), reason="failover") == 1
        assert (primary.closed_by, backup.closed_by) == ("failover", None)

    def test_close_idle_uses_the_last_read(self) -> None:
        live = LiveConnections()
        idle, busy, exempt = _conn("p:1"), _conn("p:2"), _conn("p:3", sniffed=_mqtt(1))
        for conn in (idle, busy, exempt):
            live.add(conn)
        busy.last_read_at = 1.0
        assert live.close_idle(1.4) == []
        assert live.close_idle(1.5) == [(idle, 1.5)]
        assert live.close_idle(2.0) == []  # idle is closing already
        assert live.close_idle(2.5) == [(busy, 1.5)]
        assert exempt.closed_by is None

    def test_close_idle_drops_connections_exempted_by_their_first_bytes(self) -> None:
        live = LiveConnections()
        conn = _conn()
        live.add(conn)
        conn.first_bytes(encode_connect("c", keepalive_s=1))
        assert live.close_idle(100.0) == []
        assert conn.closed_by is None
        assert len(live) == 1  # still open, still closable when its target fails
        assert live.close_target("b1") == 1


# -- serve_connection_ttl_checks --
