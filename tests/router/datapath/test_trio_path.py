"""relay(): half-close in each direction, reset propagation, byte counts, over real socket pairs;
the connection-TTL stamps on memory streams with trio's virtual clock."""

from __future__ import annotations

import functools
import math
import socket
import struct

import trio
import trio.testing

from keys import ConnectionFacts
from keys.detect import make_detector
from keys.mqtt import encode_connect
from router.core.live import CLOSED_BY_TTL, ProxiedConnection
from router.datapath.fast_path import HandedOver
from router.datapath.trio_path import AcceptorIO, ConnectionLimits, relay, resume_connection
from router.metrics import Metrics
from router.runtime import RouterRuntime
from tests.conftest import read_until_closed
from tests.router.test_server import _config, _serve_named_echo


def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
    return bytes(data)


async def test_relay_half_close_keeps_other_direction_open() -> None:
    """Scenario: the client sends and shuts its write side; the broker still answers afterwards."""
    client, router_client_side = _pair()
    router_upstream_side, broker = _pair()
    counts = [0, 0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay, router_client_side, router_upstream_side, counts)
        await client.send_all(b"request")
        await client.send_eof()
        assert await _read_all(broker) == b"request"  # EOF reached the broker
        await broker.send_all(b"late answer")
        await broker.aclose()
        assert await _read_all(client) == b"late answer"
    assert counts == [len(b"request"), len(b"late answer")]
    await client.aclose()


async def test_relay_moves_large_payload_intact() -> None:
    client, router_client_side = _pair()
    router_upstream_side, broker = _pair()
    payload = bytes(range(256)) * 8192  # 2 MiB, several relay chunks
    counts = [0, 0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay, router_client_side, router_upstream_side, counts)

        async def send() -> None:
            await client.send_all(payload)
            await client.send_eof()

        nursery.start_soon(send)
        assert await _read_all(broker) == payload
        await broker.aclose()
        assert await _read_all(client) == b""
    assert counts == [len(payload), 0]
    await client.aclose()


async def test_relay_reset_by_broker_closes_client() -> None:
    """Scenario: the broker's side is reset; the relay ends and the client sees the end too."""
    client_sock, client_side = socket.socketpair()
    client = trio.SocketStream(trio.socket.from_stdlib_socket(client_sock))
    router_client_side = trio.SocketStream(trio.socket.from_stdlib_socket(client_side))
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    upstream = await trio.open_tcp_stream("127.0.0.1", port)
    broker = await listener.accept()
    counts = [0, 0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay, router_client_side, upstream, counts)
        await client.send_all(b"x")
        assert await broker.receive_some(10) == b"x"
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        broker.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await broker.aclose()
        with trio.fail_after(5):
            assert await _read_all(client) == b""
    await client.aclose()
    await listener.aclose()


async def test_relay_stamps_client_reads_and_ends_when_its_scope_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: a connection under a TTL; reads from the client (not from the broker) stamp
    `last_read_at`; cancelling its scope (as the TTL checker does) closes both sides."""
    client, router_client_side = trio.testing.memory_stream_pair()
    router_upstream_side, broker = trio.testing.memory_stream_pair()
    start = trio.current_time()
    conn = _ttl_connection(start)
    counts = [0, 0]

    async def proxied() -> None:
        with conn.cancel_scope:
            await relay(router_client_side, router_upstream_side, counts, activity=conn)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(proxied)
        await trio.sleep(1)
        await client.send_all(b"hello")
        assert await broker.receive_some() == b"hello"
        await trio.sleep(1)
        await broker.send_all(b"answer")
        assert await client.receive_some() == b"answer"
        assert conn.last_read_at == start + 1  # the broker's bytes do not count
        assert conn.ttl_s == 1.5  # "hello" is not an MQTT CONNECT: the TTL stays
        conn.close(CLOSED_BY_TTL)
        assert await client.receive_some() == b""
        assert await broker.receive_some() == b""
    assert counts == [5, 6]


async def test_relay_exempts_an_unsniffed_mqtt_client_by_its_first_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, router_client_side = trio.testing.memory_stream_pair()
    router_upstream_side, broker = trio.testing.memory_stream_pair()
    conn = _ttl_connection(trio.current_time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(relay, activity=conn), router_client_side, router_upstream_side, [0, 0]
        )
        connect = encode_connect("sensor-1", keepalive_s=1)
        await client.send_all(connect)
        assert await broker.receive_some() == connect
        assert (conn.ttl_s, conn.peek_first_bytes) == (math.inf, False)
        await client.aclose()
        await broker.aclose()


def _ttl_connection(now: float) -> ProxiedConnection:
    return ProxiedConnection(
        peer="127.0.0.2:5000",
        acceptor="a",
        node_id="b1",
        address=("127.0.0.1", 1883),
        ttl_ms=1500,
        sniffed=None,
        now=now,
    )


async def test_resume_connection_keeps_the_fast_paths_decision(nursery: trio.Nursery) -> None:
    """Scenario: the fast path decided (ROUND_ROBIN: b0) and handed the connection over; the trio
    side proxies to b0 without deciding again, so the round-robin position moved once (next: b1)."""
    ports = [await nursery.start(_serve_named_echo, name) for name in (b"b0", b"b1")]
    config = _config(ports, policy="ROUND_ROBIN")
    router, acceptor = config.routers[0], config.acceptors[0]
    runtime = RouterRuntime(config, router, Metrics(), round_robin_start=0)
    assert runtime.pool is not None
    for target in runtime.pool.targets:
        runtime.pool.record_check(target.node_id, True)
    facts = ConnectionFacts(source_ip="127.0.0.2")
    decision = runtime.engine.route(facts, trio.current_time())
    assert decision.target is not None
    assert decision.target.node_id == "b0"

    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        accepted, address = listener.accept()
        handed = HandedOver(accepted, f"{address[0]}:{address[1]}", b"", None, b"", decision)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(accepted))
        io = AcceptorIO(detect=make_detector(()), detect_inner=make_detector(()))
        nursery.start_soon(resume_connection, stream, acceptor, runtime, ConnectionLimits(), io, handed)
        client.shutdown(socket.SHUT_WR)
        assert await trio.to_thread.run_sync(lambda: read_until_closed(client)) == b"hello from b0\nbye"
    following = runtime.engine.route(facts, trio.current_time())
    assert following.target is not None
    assert following.target.node_id == "b1"
