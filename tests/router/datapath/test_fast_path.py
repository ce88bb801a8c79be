"""The fast path in process, over real loopback sockets, on both data paths: the C core
(router/datapath/native_path.py, the default when built) and the Python fast path
(router/datapath/fast_path.py, its fallback and reference): every test runs on each.

serve_router runs as routerd does; which acceptors take the fast path is the plan's rule
(`plan.fast_path_serves`, tests/router/core/test_plan.py), checked here with the `fastPath=false`
switch. Fake brokers are trio servers in the test's nursery.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import pytest
import trio

from keys import KeyType, mqtt
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import AcceptorConfig, AcceptorMode, Config, RouterConfig
from router.core import answers as fastpath_answers
from router.datapath.native_path import DATA_PATH_ENV, DATA_PATHS, NativePath
from router.server import ServerInfo, serve_router
from tests.keys.test_mqtt import connect_packet

if TYPE_CHECKING:
    from collections.abc import Callable

BIG = 8 * 1024 * 1024
"""Bytes pushed through one connection to exercise backpressure (more than socket buffers hold)."""


async def _serve_echo(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A fake broker that echoes until EOF, then closes (health probes connect and leave)."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                while data := await stream.receive_some(65536):
                    await stream.send_all(data)
            except trio.BrokenResourceError:
                pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


def _config(
    port: int,
    *,
    url: str | None = None,
    check_period_ms: int = 100,
    key_type: KeyType = KeyType.SOURCE_IP,
    mode: AcceptorMode = AcceptorMode.PROXY,
    quorum_timeout_ms: int = 0,
    handshake_timeout_ms: int = 10_000,
) -> Config:
    router = RouterConfig(
        name="r",
        key_type=key_type,
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("b0",),
            check_period_ms=check_period_ms,
            quorum_timeout_ms=quorum_timeout_ms,
        ),
    )
    acceptor = AcceptorConfig(
        name="a",
        host="127.0.0.1",
        port=0,
        router="r",
        mode=mode,
        handshake_timeout_ms=handshake_timeout_ms,
        protocols=("MQTT",),
    )
    connector = Connector.from_url("b0", url or f"tcp://127.0.0.1:{port}?nodeId=b0")
    return Config(source="test.xml", connectors=(connector,), acceptors=(acceptor,), routers=(router,))


async def _start(nursery: trio.Nursery, config: Config, *, ready: bool = True) -> ServerInfo:
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            config, admin=None, grace_s=1, shutdown=shutdown, task_status=task_status
        )
    )
    runtime = info.runtimes["r"]
    assert info.fast_path is not None
    assert isinstance(info.fast_path, NativePath) == (os.environ[DATA_PATH_ENV] == "native")
    if ready:
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
    nursery.start_soon(_stop_later, shutdown)
    return info


async def _stop_later(shutdown: trio.Event) -> None:
    try:
        await trio.sleep_forever()
    finally:
        shutdown.set()


def _client(info: ServerInfo) -> socket.socket:
    host, port = info.acceptors["a"]
    return socket.create_connection((host, port), timeout=10)


def _read_until_eof(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


async def _in_thread(fn: Callable[[], bytes]) -> bytes:
    return await trio.to_thread.run_sync(fn)


@pytest.fixture(autouse=True, params=DATA_PATHS)
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on each data path (serve_router's default comes from the environment)."""
    chosen: str = request.param
    monkeypatch.setenv(DATA_PATH_ENV, chosen)
    return chosen


@pytest.fixture
async def echo_port(nursery: trio.Nursery) -> int:
    port: int = await nursery.start(_serve_echo)
    return port


class TestRelay:
    async def test_connector_by_host_name_is_proxied_by_the_trio_side(
        self, nursery: trio.Nursery, echo_port: int
    ) -> None:
        info = await _start(nursery, _config(echo_port, url=f"tcp://localhost:{echo_port}?nodeId=b0"))
        runtime, fast = info.runtimes["r"], info.fast_path
        assert fast is not None

        def exchange() -> tuple[bytes, int, int]:
            with _client(info) as sock:
                sock.sendall(b"by name")
                assert sock.recv(7) == b"by name"
                # While it is open: relayed by the trio side, not by the epoll thread.
                registered = trio.from_thread.run_sync(runtime.connections.open_connections)
                on_fast = trio.from_thread.run_sync(fast.open_count)
                sock.shutdown(socket.SHUT_WR)
                return _read_until_eof(sock), registered, on_fast

        assert await trio.to_thread.run_sync(exchange) == (b"", 1, 0)

    async def test_relays_megabytes_both_ways_with_backpressure_and_half_close(
        self, nursery: trio.Nursery, echo_port: int
    ) -> None:
        info = await _start(nursery, _config(echo_port))
        payload = bytes(range(256)) * (BIG // 256)

        def exchange() -> bytes:
            with _client(info) as sock:
                sock.sendall(payload)  # the echo comes back while we send: the router must not stall
                sock.shutdown(socket.SHUT_WR)
                return _read_until_eof(sock)

        async with trio.open_nursery() as inner:
            result: list[bytes] = []

            async def run() -> None:
                result.append(await _in_thread(exchange))

            inner.start_soon(run)
        assert result[0] == payload
        registry = info.runtimes["r"].metrics.registry
        sent = registry.get_sample_value(
            "router_proxied_bytes_total", {"router": "r", "node_id": "b0", "direction": "client_to_target"}
        )
        assert sent == BIG
        assert info.runtimes["r"].connections.open_connections("b0") == 0
        if isinstance(info.fast_path, NativePath):  # past 64 KiB each way went through pipes
            assert info.fast_path.spliced_bytes() > 2 * (BIG - 256 * 1024)

    async def test_refused_connect_makes_the_member_not_ready_and_the_backup_takes_over(
        self, nursery: trio.Nursery, echo_port: int
    ) -> None:
        pair = f"(tcp://127.0.0.1:{_closed_port()},tcp://127.0.0.1:{echo_port})?nodeId=b0"
        config = _config(echo_port, url=pair, check_period_ms=60_000)  # no probe in the test's time
        info = await _start(nursery, config)
        runtime = info.runtimes["r"]
        assert runtime.pool.active_member("b0") == 1
        runtime.pool.record_check("b0", True, member=0)  # a stale "primary is fine"
        runtime.pool.record_check("b0", False, "test", member=1)  # the primary becomes active
        runtime.pool.record_check("b0", True, member=1)
        assert runtime.pool.active_member("b0") == 0

        def refused() -> bytes:
            with _client(info) as sock:
                return _read_until_eof(sock)

        assert await _in_thread(refused) == b""
        await runtime.pool.wait_until(lambda: runtime.pool.active_member("b0") == 1)

        def echoed() -> bytes:
            with _client(info) as sock:
                sock.sendall(b"through the backup")
                sock.shutdown(socket.SHUT_WR)
                return _read_until_eof(sock)

        assert await _in_thread(echoed) == b"through the backup"

    async def test_target_not_ready_closes_its_relayed_connections_and_counts_them(
        self, nursery: trio.Nursery, echo_port: int, caplog: pytest.LogCaptureFixture
    ) -> None:
        info = await _start(nursery, _config(echo_port, check_period_ms=60_000))
        runtime = info.runtimes["r"]

        def held() -> bytes:
            with _client(info) as sock:
                sock.sendall(b"x")
                assert sock.recv(1) == b"x"
                trio.from_thread.run_sync(lambda: runtime.pool.record_check("b0", False, "probe failed"))
                return _read_until_eof(sock)

        assert await _in_thread(held) == b""
        labels = {"router": "r", "reason": "target_not_ready"}
        registry = runtime.metrics.registry
        with trio.fail_after(5):
            # Counted when the epoll thread reports the connection closed: no event to await here.
            while registry.get_sample_value("router_proxied_connections_closed_total", labels) != 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert "router=r target=b0 is not ready: closing its 1 proxied connection(s)" in caplog.text


class TestOpening:
    async def test_mqtt5_redirect_is_answered_by_the_fast_path(
        self, nursery: trio.Nursery, echo_port: int
    ) -> None:
        info = await _start(
            nursery, _config(echo_port, key_type=KeyType.CLIENT_ID, mode=AcceptorMode.REDIRECT)
        )
        assert info.fast_path is not None

        def connect() -> bytes:
            with _client(info) as sock:
                sock.sendall(connect_packet(level=5, client_id=b"dev-1"))
                return _read_until_eof(sock)

        answer = await _in_thread(connect)
        expected = mqtt.encode_connack(
            mqtt.MQTT_V5_USE_ANOTHER_SERVER, protocol_level=5, server_reference=f"127.0.0.1:{echo_port}"
        )
        assert answer == expected

    async def test_opening_split_byte_by_byte_is_replayed_unchanged(
        self, nursery: trio.Nursery, echo_port: int
    ) -> None:
        info = await _start(nursery, _config(echo_port, key_type=KeyType.CLIENT_ID))
        packet = connect_packet(client_id=b"dev-2")

        def connect() -> bytes:
            with _client(info) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for byte in packet:
                    sock.send(bytes([byte]))
                sock.shutdown(socket.SHUT_WR)
                return _read_until_eof(sock)

        assert await _in_thread(connect) == packet  # the echo broker returns the replayed CONNECT

    async def test_garbage_is_closed_with_nothing_sent(self, nursery: trio.Nursery, echo_port: int) -> None:
        info = await _start(nursery, _config(echo_port, key_type=KeyType.CLIENT_ID))

        def garbage() -> bytes:
            with _client(info) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                return _read_until_eof(sock)

        assert await _in_thread(garbage) == b""
        registry = info.runtimes["r"].metrics.registry
        assert (
            registry.get_sample_value("router_client_errors_total", {"acceptor": "a", "reason": "detect"})
            == 1
        )

    async def test_silent_client_is_closed_at_the_handshake_deadline(
        self, nursery: trio.Nursery, echo_port: int
    ) -> None:
        info = await _start(nursery, _config(echo_port, key_type=KeyType.CLIENT_ID, handshake_timeout_ms=300))

        def silent() -> bytes:
            with _client(info) as sock:
                sock.sendall(b"\x10")  # MQTT, then nothing
                return _read_until_eof(sock)

        with trio.fail_after(5):
            assert await _in_thread(silent) == b""
        registry = info.runtimes["r"].metrics.registry
        assert (
            registry.get_sample_value("router_client_errors_total", {"acceptor": "a", "reason": "timeout"})
            == 1
        )

    async def test_no_ready_target_is_handed_to_the_trio_side_which_answers_in_mqtt(
        self, nursery: trio.Nursery
    ) -> None:
        info = await _start(
            nursery,
            _config(_closed_port(), key_type=KeyType.CLIENT_ID, quorum_timeout_ms=200),
            ready=False,
        )

        def connect() -> bytes:
            with _client(info) as sock:
                sock.sendall(connect_packet(level=5, client_id=b"dev-3"))
                return _read_until_eof(sock)

        answer = await _in_thread(connect)
        assert answer == mqtt.encode_connack(mqtt.MQTT_V5_SERVER_UNAVAILABLE, protocol_level=5)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unexpected_error_costs_one_connection_not_the_fast_path(
    nursery: trio.Nursery, echo_port: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a bug raises while answering one client; that client is closed, the next one is
    served as usual by the same thread."""
    real = fastpath_answers.redirect
    calls: list[int] = []

    def broken_once(*args: Any, **kwargs: Any) -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(fastpath_answers, "redirect", broken_once)
    info = await _start(nursery, _config(echo_port, key_type=KeyType.CLIENT_ID, mode=AcceptorMode.REDIRECT))

    def connect() -> bytes:
        with _client(info) as sock:
            sock.sendall(connect_packet(level=5, client_id=b"dev-4"))
            return _read_until_eof(sock)

    assert await _in_thread(connect) == b""
    assert (await _in_thread(connect))[3] == mqtt.MQTT_V5_USE_ANOTHER_SERVER
    assert "fast path: unexpected error on descriptor" in caplog.text  # logged before the 2nd accept
