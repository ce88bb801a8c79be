"""router/datapath/relay.py: half-close in each direction, reset propagation, byte counts, over real
socket pairs; the connection-TTL stamps on memory streams with trio's virtual clock."""

from __future__ import annotations

import functools
import math
import socket
import struct
from typing import TYPE_CHECKING

import trio
import trio.testing

from keys.mqtt import encode_connect
from router.core.events import CloseReason
from router.datapath.relay import relay
from tests.router.core.test_live import Closer, live_connection

if TYPE_CHECKING:
    from router.core.live import LiveConnection


def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
    return bytes(data)


async def _relay_into(ended: list[CloseReason], *args: trio.abc.Stream | list[int]) -> None:
    """`relay`, keeping how it ended."""
    client, upstream, counts = args
    assert isinstance(client, trio.abc.Stream)
    assert isinstance(upstream, trio.abc.Stream)
    assert isinstance(counts, list)
    ended.append(await relay(client, upstream, counts))


async def test_bytes_are_counted_as_they_pass_not_only_at_the_end() -> None:
    """Scenario: a long-lived connection relays a little each way and stays open: its counts
    already hold those bytes (a scrape reads them), before either side closes."""
    client, router_client_side = _pair()
    router_upstream_side, broker = _pair()
    counts = [0, 0]
    ended: list[CloseReason] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay_into, ended, router_client_side, router_upstream_side, counts)
        await client.send_all(b"ping")
        assert await broker.receive_some(100) == b"ping"
        await broker.send_all(b"pong!")
        assert await client.receive_some(100) == b"pong!"
        assert counts == [4, 5]
        assert ended == []  # still open
        await client.aclose()
        await broker.aclose()
    assert ended


async def test_relay_half_close_keeps_other_direction_open() -> None:
    """Scenario: the client sends and shuts its write side; the broker still answers afterwards."""
    client, router_client_side = _pair()
    router_upstream_side, broker = _pair()
    counts = [0, 0]
    ended: list[CloseReason] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay_into, ended, router_client_side, router_upstream_side, counts)
        await client.send_all(b"request")
        await client.send_eof()
        assert await _read_all(broker) == b"request"  # EOF reached the broker
        await broker.send_all(b"late answer")
        await broker.aclose()
        assert await _read_all(client) == b"late answer"
    assert counts == [len(b"request"), len(b"late answer")]
    assert ended == [CloseReason.CLOSED]
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
    ended: list[CloseReason] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay_into, ended, router_client_side, upstream, counts)
        await client.send_all(b"x")
        assert await broker.receive_some(10) == b"x"
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        broker.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await broker.aclose()
        with trio.fail_after(5):
            assert await _read_all(client) == b""
    assert ended == [CloseReason.RESET]
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
    scope = trio.CancelScope()
    conn = _ttl_connection(start, scope)
    counts = [0, 0]

    async def proxied() -> None:
        with scope:
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
        conn.close(CloseReason.CONNECTION_TTL)
        assert await client.receive_some() == b""
        assert await broker.receive_some() == b""
    assert counts == [5, 6]


async def test_relay_exempts_an_unsniffed_mqtt_client_by_its_first_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, router_client_side = trio.testing.memory_stream_pair()
    router_upstream_side, broker = trio.testing.memory_stream_pair()
    conn = _ttl_connection(trio.current_time(), trio.CancelScope())
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


def _ttl_connection(now: float, scope: trio.CancelScope) -> LiveConnection:
    closer = Closer()
    closer.then = scope.cancel
    return live_connection(ttl_ms=1500, now=now, closer=closer)


async def test_a_moved_connection_ends_the_brokers_frame_then_says_its_farewell() -> None:
    """Scenario: the broker is mid-PUBLISH when the router moves the client: the client gets the
    rest of that PUBLISH, then the farewell (not the broker's next packet), then EOF; the router
    waits for the client to close before it closes its side."""
    from keys import Sniffed, WireProtocol
    from router.core.framing import Farewell

    client, router_client_side = _pair()
    router_upstream_side, broker = _pair()
    sniffed = Sniffed(protocol=WireProtocol.MQTT, client_id="c", protocol_version="5")
    live = live_connection(sniffed=sniffed, ttl_ms=-1)
    counts = live.counts
    ended: list[CloseReason] = []
    publish = b"\x30\x0a" + b"0123456789"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_relay_moved, ended, router_client_side, router_upstream_side, counts, live)
        await broker.send_all(b"\x20\x03\x00\x00\x00" + publish[:5])  # CONNACK, half a PUBLISH
        got = b""
        while len(got) < 10:
            got += await client.receive_some(100)
        await trio.testing.wait_all_tasks_blocked()
        assert live.move(Farewell(b"C", b"BYE", "test"), CloseReason.EVACUATED)
        await broker.send_all(publish[5:] + b"\xd0\x00")  # the rest, then a PINGRESP not to be passed on
        while not got.endswith(b"BYE"):
            got += await client.receive_some(100)
        assert got == b"\x20\x03\x00\x00\x00" + publish + b"BYE"
        assert await client.receive_some(100) == b""  # the router half-closed
        assert await broker.receive_some(100) == b""  # the broker's side is closed
        await client.aclose()  # the client leaves: the router's linger ends
    await broker.aclose()
    assert ended == [CloseReason.CLOSED]
    assert counts == [0, len(got) - 3]


async def _relay_moved(
    ended: list[CloseReason],
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    counts: list[int],
    live: LiveConnection,
) -> None:
    ended.append(await relay(client, upstream, counts, live=live))


async def test_a_sift_takes_the_topology_out_of_the_brokers_stream_and_counts_what_was_read() -> None:
    """Scenario: a proxied CORE client: the broker's cluster-topology packets never reach it (they
    would name the brokers' own addresses), everything else does, in order."""
    from router.core.stream_filter import TopologyFilter
    from tests.router.core.test_stream_filter import MESSAGE, TOPOLOGY_V4

    client, router_client_side = _pair()
    router_upstream_side, broker = _pair()
    counts = [0, 0]
    sift = TopologyFilter()
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            await relay(router_client_side, router_upstream_side, counts, sift=sift)

        nursery.start_soon(run)
        await broker.send_all(MESSAGE + TOPOLOGY_V4 + MESSAGE)
        await broker.aclose()
        assert await _read_all(client) == MESSAGE + MESSAGE
        await client.aclose()
    assert counts[1] == 2 * len(MESSAGE) + len(TOPOLOGY_V4)
    assert sift.dropped == 1
