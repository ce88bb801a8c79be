"""The native data path (router/datapath/native_path.py and its C core, router/datapath/_core.c).

Its behaviour is the fast path's: tests/router/datapath/test_fast_path.py runs every one of its
tests on both data paths. Here: choosing the data path, and what only the core has (its table of
connections growing past one chunk, its deadline lists), over real loopback sockets.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import logging
import re
import socket
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, cast

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from cache.cache import CacheConfig
from keys import KeyType, WireProtocol
from keys.refusal import parse_refusal
from policies import PolicyConfig
from pools import Connector
from router import conn_lines
from router.conn_lines import NativeConnLines
from router.core.events import Closed, CloseReason, Connected
from router.core.framing import MqttFrames
from router.datapath import native_path
from router.datapath.acceptor import ConnectionLimits
from router.datapath.fast_path import FastPath
from router.datapath.native_path import (
    DATA_PATH_ENV,
    DATA_PATHS,
    NATIVE,
    NativePath,
    default_data_path,
    open_fast_path,
)
from router.server import ServerInfo, serve_router
from tests.keys.test_mqtt import connect_packet
from tests.router.core.test_framing import _mqtt_packet as _packet
from tests.router.datapath.test_fast_path import _config, _serve_echo

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from router.config.settings import Config
    from router.runtime import RouterRuntime

_core = native_path.EXTENSION

CHUNK = 1024
"""Connections per chunk of the core's table (`CHUNK` in _core.c)."""


def _noop(*args: object) -> None:
    pass


class TestChoosing:
    def test_the_c_core_is_built(self) -> None:
        assert NATIVE  # deploy/bootstrap.sh builds it; the fallback is tested, not hidden

    def test_default_is_native_unless_the_environment_says(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv(DATA_PATH_ENV, raising=False)
        assert default_data_path() == "native"
        monkeypatch.setenv(DATA_PATH_ENV, "python")
        assert default_data_path() == "python"

    def test_each_choice_opens_its_loop(self) -> None:
        assert DATA_PATHS == ("native", "python")
        python = open_fast_path("python", lambda: 0.0, _noop, 5.0)
        native = open_fast_path("native", lambda: 0.0, _noop, 5.0)
        try:
            assert type(python) is FastPath
            assert type(native) is NativePath
        finally:
            python.close_all()
            native.close_all()
        assert python.join(0)  # never started: released at once
        assert native.join(0)

    def test_unknown_choice_names_the_choices(self) -> None:
        with pytest.raises(ValueError, match=r"^data path must be one of native, python, not 'rust'$"):
            open_fast_path("rust", lambda: 0.0, _noop, 5.0)

    @pytest.mark.parametrize(
        ("argv", "env", "message"),
        [
            (["--data-path", "rust"], "", "argument --data-path: invalid choice: 'rust'"),
            ([], "rust", "--data-path ($ROUTERD_DATA_PATH) must be one of native, python, not 'rust'"),
        ],
    )
    def test_routerd_refuses_an_unknown_data_path(
        self, argv: list[str], env: str, message: str, tmp_path: object
    ) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "router", "--config", "/nonexistent.xml", *argv],
            env={"PATH": "/usr/bin:/bin", DATA_PATH_ENV: env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr


async def _start(
    nursery: trio.Nursery, config: Config, *, limits: ConnectionLimits | None = None, lean: bool = False
) -> tuple[ServerInfo, trio.Event]:
    """A server on the native path (`lean`: as routerd's, its core carries lean connections)."""
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            config,
            admin=None,
            grace_s=1,
            shutdown=shutdown,
            limits=limits,
            data_path="native",
            lean=lean,
            task_status=task_status,
        )
    )
    assert isinstance(info.fast_path, NativePath)
    return info, shutdown


def _accepted_and_proxied(runtime: RouterRuntime) -> tuple[float | None, float | None]:
    """Router r's connections accepted on acceptor a and its proxied decisions, as scraped."""
    registry = runtime.metrics.registry
    return (
        registry.get_sample_value("router_connections_accepted_total", {"router": "r", "acceptor": "a"}),
        registry.get_sample_value("router_routing_decisions_total", {"router": "r", "status": "OK"}),
    )


def _receive(sock: socket.socket, size: int) -> bytes:
    """`size` bytes from `sock`, however the kernel splits them (fewer when it ends first)."""
    data = b""
    while len(data) < size and (chunk := sock.recv(size - len(data))):
        data += chunk
    return data


async def test_table_grows_past_one_chunk_and_every_connection_relays(nursery: trio.Nursery) -> None:
    """Scenario: 1,100 connections open at once (more than one chunk of the core's table), each
    sends its own bytes and gets them back; all of them closed, none is left open and every byte
    is counted. One health probe only: on a slow machine (the sanitized run beside CI's brokers) a
    probe of the in-process echo server busy with 1,100 connections could time out, and a target
    that is not ready has its connections closed (SPEC B)."""
    echo_port: int = await nursery.start(_serve_echo)
    info, shutdown = await _start(nursery, _config(echo_port, check_period_ms=600_000))
    runtime, fast = info.runtimes["r"], info.fast_path
    assert fast is not None
    await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
    host, port = info.acceptors["a"]
    count = CHUNK + 76

    def open_all() -> tuple[list[bytes], int]:
        socks = [socket.create_connection((host, port), timeout=10) for _ in range(count)]
        try:
            for n, sock in enumerate(socks):
                sock.sendall(b"conn-%05d" % n)
            return [_receive(sock, 10) for sock in socks], fast.open_count()
        finally:
            for sock in socks:
                sock.close()

    got, open_at_once = await trio.to_thread.run_sync(open_all)
    assert got == [b"conn-%05d" % n for n in range(count)]
    assert open_at_once == count
    registry = runtime.metrics.registry
    with trio.fail_after(10):
        while fast.open_count():  # noqa: ASYNC110  # the core's thread closes them: no trio event
            await trio.sleep(0.05)
    for direction in ("client_to_target", "target_to_client"):
        labels = {"router": "r", "node_id": "b0", "direction": direction}
        assert registry.get_sample_value("router_proxied_bytes_total", labels) == 10 * count
    assert registry.get_sample_value("router_proxied_connections", {"router": "r", "node_id": "b0"}) == 0
    shutdown.set()


async def test_connect_that_never_completes_fails_at_the_deadline(nursery: trio.Nursery) -> None:
    """Scenario: once the pool is ready, the target's accept queue is made full (its SYNs are
    dropped): the core's connect deadline fails the connect, the client gets its protocol's
    refusal (CONNACK 0x88, server unavailable, as Artemis answers), and the failure is counted as
    a timeout."""
    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        target.listen(16)
        config = _config(target.getsockname()[1], key_type=KeyType.CLIENT_ID, check_period_ms=60_000)
        info, shutdown = await _start(nursery, config, limits=ConnectionLimits(connect_timeout_s=0.3))
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
        target.listen(0)  # the probe's connection, never accepted, fills the queue now
        host, port = info.acceptors["a"]

        def connect() -> bytes:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(connect_packet(client_id=b"late"))
                data = bytearray()
                while chunk := sock.recv(64):
                    data += chunk
                return bytes(data)

        with trio.fail_after(10):
            answer = await trio.to_thread.run_sync(connect)
        assert answer == b"\x20\x02\x00\x88"
        failed = runtime.metrics.registry.get_sample_value(
            "router_target_connect_failures_total", {"router": "r", "node_id": "b0", "reason": "timeout"}
        )
        assert failed == 1
        shutdown.set()


async def _start_lean(nursery: trio.Nursery, config: Config) -> tuple[ServerInfo, trio.Event]:
    """A server whose core carries lean connections (as routerd's), the pool ready."""
    info, shutdown = await _start(nursery, config, lean=True)
    runtime = info.runtimes["r"]
    await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
    assert isinstance(info.fast_path, NativePath)
    assert info.fast_path._lean  # its connections are lean ones
    return info, shutdown


def _echo_round(host: str, port: int, count: int, *, keep: bool = False) -> list[socket.socket]:
    """`count` connections that each send 16 bytes and get them back; closed unless `keep`."""
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(count)]
    for n, sock in enumerate(socks):
        sock.sendall(b"lean-%011d" % n)
    for n, sock in enumerate(socks):
        got = b""
        while len(got) < 16:
            got += sock.recv(16 - len(got))
        assert got == b"lean-%011d" % n
    if not keep:
        for sock in socks:
            sock.close()
        return []
    return socks


async def _registered_at_once(info: ServerInfo, count: int) -> list[socket.socket]:
    """`count` echo connections through router r, kept open: each one is an ordinary connection,
    registered at its decision (none carried lean); the caller closes them."""
    runtime = info.runtimes["r"]
    host, port = info.acceptors["a"]
    socks = await trio.to_thread.run_sync(lambda: _echo_round(host, port, count, keep=True))
    try:
        with runtime.held() as state:
            assert state.connections.sync is None  # nothing carried unregistered
            assert len(state.connections) == count
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


async def _until_no_proxied(fast: object) -> None:
    assert isinstance(fast, NativePath)
    with trio.fail_after(10):
        while fast.open_count():  # noqa: ASYNC110  # the core's thread closes them: no trio event
            await trio.sleep(0.02)


@pytest.fixture
def conn_level() -> Iterator[Callable[[int], None]]:
    """Sets router.conn's level for the test (its INFO lines decide whether connections are lean:
    `conn_lines.line_writers`); WARNING to begin with."""
    logger = conn_lines.conn_log
    before = logger.level
    logger.setLevel(logging.WARNING)
    yield logger.setLevel
    logger.setLevel(before)


@pytest.mark.usefixtures("conn_level")
class TestLean:
    """Connections the core carries alone once decided (routerd's `lean`): the metrics, the
    registry, the admission, passive health and the lines see them as ordinary ones."""

    async def test_short_connections_are_counted_when_scraped(self, nursery: trio.Nursery) -> None:
        """Scenario: 300 short echo connections: no Python object is registered for them, and a
        scrape shows each one connected, its bytes, none open and the admission back to 0."""
        echo_port: int = await nursery.start(_serve_echo)
        info, shutdown = await _start_lean(nursery, _config(echo_port))
        runtime, fast = info.runtimes["r"], info.fast_path
        assert isinstance(fast, NativePath)
        host, port = info.acceptors["a"]
        await trio.to_thread.run_sync(_echo_round, host, port, 300)
        await _until_no_proxied(fast)
        registry = runtime.metrics.registry
        labels = {"router": "r", "node_id": "b0"}
        assert registry.get_sample_value("router_target_connect_duration_seconds_count", labels) == 300
        assert registry.get_sample_value("router_proxied_connections", labels) == 0
        for direction in ("client_to_target", "target_to_client"):
            bytes_labels = {**labels, "direction": direction}
            assert registry.get_sample_value("router_proxied_bytes_total", bytes_labels) == 16 * 300
        accepted = {"router": "r", "acceptor": "a"}
        assert registry.get_sample_value("router_connections_accepted_total", accepted) == 300
        decisions = {"router": "r", "status": "OK"}  # counted without making the events
        assert registry.get_sample_value("router_routing_decisions_total", decisions) == 300
        with trio.fail_after(5):
            while registry.get_sample_value("router_client_connections"):  # noqa: ASYNC110  # released once per turn
                await trio.sleep(0.02)
        assert runtime.connections.open_connections() == 0
        shutdown.set()

    async def test_open_connections_are_registered_when_the_registry_is_read(
        self, nursery: trio.Nursery
    ) -> None:
        """Scenario: 5 connections stay open: the registry's count shows them (made ordinary
        connections on the read), the gauge counts them once, and the router can close them (a
        target that is not ready): every client sees its connection end, and none is left."""
        echo_port: int = await nursery.start(_serve_echo)
        info, shutdown = await _start_lean(nursery, _config(echo_port))
        runtime, fast = info.runtimes["r"], info.fast_path
        host, port = info.acceptors["a"]
        socks = await trio.to_thread.run_sync(lambda: _echo_round(host, port, 5, keep=True))
        try:
            registry = runtime.metrics.registry
            labels = {"router": "r", "node_id": "b0"}
            assert registry.get_sample_value("router_proxied_connections", labels) == 5  # the core's
            assert runtime.connections.open_connections("b0") == 5
            assert registry.get_sample_value("router_proxied_connections", labels) == 5  # Python's now
            assert runtime.connections.close_to("b0", CloseReason.TARGET_NOT_READY) == 5

            def ended() -> list[bytes]:
                return [sock.recv(16) for sock in socks]

            assert await trio.to_thread.run_sync(ended) == [b""] * 5
            await _until_no_proxied(fast)
            assert registry.get_sample_value("router_proxied_connections", labels) == 0
            closes = {"router": "r", "reason": "target_not_ready"}
            assert registry.get_sample_value("router_proxied_connections_closed_total", closes) == 5
            assert runtime.connections.open_connections() == 0
        finally:
            for sock in socks:
                sock.close()
        shutdown.set()

    async def test_connect_refused_makes_an_ordinary_connection_of_it(self, nursery: trio.Nursery) -> None:
        """Scenario: the target stops listening after its probe: a lean connection's refused connect
        comes back to Python (made an ordinary connection there), is counted as refused, its client
        is closed and its admission given back."""
        with socket.socket() as target:
            target.bind(("127.0.0.1", 0))
            target.listen(16)
            config = _config(target.getsockname()[1], check_period_ms=60_000)
            info, shutdown = await _start_lean(nursery, config)
        runtime = info.runtimes["r"]
        host, port = info.acceptors["a"]

        def refused() -> bytes:
            with socket.create_connection((host, port), timeout=10) as sock:
                return sock.recv(16)

        assert await trio.to_thread.run_sync(refused) == b""
        registry = runtime.metrics.registry
        failures = {"router": "r", "node_id": "b0", "reason": "refused"}
        assert registry.get_sample_value("router_target_connect_failures_total", failures) == 1
        assert registry.get_sample_value("router_client_connections") == 0
        assert runtime.connections.open_connections() == 0
        shutdown.set()

    async def test_the_core_closing_everything_closes_lean_connections_as_the_routers(
        self, nursery: trio.Nursery
    ) -> None:
        """Scenario: 3 lean connections open, never read from the registry, when the core closes
        everything (the end of a shutdown): each is made an ordinary connection to be closed for the
        router's reason, counted so, and the gauge and the admission come back to 0."""
        echo_port: int = await nursery.start(_serve_echo)
        info, shutdown = await _start_lean(nursery, _config(echo_port))
        runtime, fast = info.runtimes["r"], info.fast_path
        assert isinstance(fast, NativePath)
        host, port = info.acceptors["a"]
        socks = await trio.to_thread.run_sync(lambda: _echo_round(host, port, 3, keep=True))
        try:
            fast.close_all()
            assert await trio.to_thread.run_sync(lambda: [_receive(sock, 16) for sock in socks]) == [b""] * 3
        finally:
            for sock in socks:
                sock.close()
        await _until_no_proxied(fast)
        registry = runtime.metrics.registry
        closes = {"router": "r", "reason": "shutdown"}
        assert registry.get_sample_value("router_proxied_connections_closed_total", closes) == 3
        assert registry.get_sample_value("router_proxied_connections", {"router": "r", "node_id": "b0"}) == 0
        assert registry.get_sample_value("router_client_connections") == 0
        shutdown.set()

    async def test_lines_are_written_by_the_core(
        self, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, conn_level: Callable[[int], None]
    ) -> None:
        """Scenario: with routerd's INFO lines through the C buffer, two connections write their
        `outcome=OK` and `closed` lines, the Python lines' text."""
        stream = io.StringIO()
        lines = NativeConnLines(stream, threading.RLock())
        monkeypatch.setattr(conn_lines, "_installed", lines)
        conn_level(logging.INFO)
        echo_port: int = await nursery.start(_serve_echo)
        info, shutdown = await _start_lean(nursery, _config(echo_port))
        host, port = info.acceptors["a"]
        await trio.to_thread.run_sync(_echo_round, host, port, 2)
        await _until_no_proxied(info.fast_path)
        lines.flush()
        text = [line.split(" INFO router.conn: ", 1)[1] for line in stream.getvalue().splitlines()]
        connected = [line for line in text if line.endswith("outcome=OK")]
        closed = [line for line in text if " closed " in line]
        assert len(connected) == 2
        assert len(closed) == 2
        assert all(
            re.fullmatch(r"peer=127\.0\.0\.1:\d+ router=r key=127\.0\.0\.1 target=b0 outcome=OK", line)
            for line in connected
        )
        assert all(
            re.fullmatch(
                r"peer=127\.0\.0\.1:\d+ router=r target=b0 closed bytes_in=16 bytes_out=16 "
                r"duration_s=\d+\.\d{3} reason=closed",
                line,
            )
            for line in closed
        )
        shutdown.set()

    async def test_broker_that_drops_the_client_is_passive_healths(self, nursery: trio.Nursery) -> None:
        """Scenario: a target that accepts, reads the client's bytes and closes without a word:
        the core tells BROKER_CLOSED_EARLY itself and passive health counts the failure."""

        async def dropper(stream: trio.SocketStream) -> None:
            async with stream:
                with trio.move_on_after(2):
                    await stream.receive_some(64)

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, dropper, listeners)
        info, shutdown = await _start_lean(nursery, _config(listeners[0].socket.getsockname()[1]))
        runtime = info.runtimes["r"]
        host, port = info.acceptors["a"]

        def dropped() -> bytes:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(b"hello")
                return sock.recv(16)

        assert await trio.to_thread.run_sync(dropped) == b""
        registry = runtime.metrics.registry
        with trio.fail_after(5):
            while not registry.get_sample_value(  # noqa: ASYNC110  # counted in the trio thread
                "router_target_outlier_failures_total", {"router": "r", "reason": "broker_closed_early"}
            ):
                await trio.sleep(0.02)
        shutdown.set()

    async def test_decisions_in_plain_values_are_the_workflows(self, nursery: trio.Nursery) -> None:
        """Scenario: a SOURCE_IP router with a cache and ROUND_ROBIN over two targets: its lean
        connections are decided in plain values (`RoutingEngine.plain`): the first from 127.0.0.1
        by the policy, the next ones cache hits to the same target; read, the registry shows each
        with its own connection id, its key and its target, and the cache counted one miss."""
        ports = [await nursery.start(_serve_echo) for _ in range(2)]
        config = _config(ports[0])
        connectors = tuple(
            Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{p}?nodeId=b{i}") for i, p in enumerate(ports)
        )
        router = config.routers[0]
        assert router.pool is not None
        router = dataclasses.replace(
            router,
            policy=PolicyConfig(name="ROUND_ROBIN"),
            cache=CacheConfig(timeout_ms=60_000),
            pool=dataclasses.replace(router.pool, static_connectors=("b0", "b1")),
        )
        config = dataclasses.replace(config, connectors=connectors, routers=(router,))
        info, shutdown = await _start(nursery, config, lean=True)
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 2)
        host, port = info.acceptors["a"]
        socks = await trio.to_thread.run_sync(lambda: _echo_round(host, port, 4, keep=True))
        try:
            with runtime.held() as state:
                live = state.connections.open_all()  # made ordinary connections by the read
                cache = state.engine.cache
                assert cache is not None
                assert (cache.hits, cache.misses) == (3, 1)
            assert len(live) == 4
            assert len({c.conn.id for c in live}) == 4
            assert {(c.key, c.conn.peer.host, c.conn.router, c.conn.acceptor) for c in live} == {
                ("127.0.0.1", "127.0.0.1", "r", "a")
            }
            assert len({c.node_id for c in live}) == 1
        finally:
            for sock in socks:
                sock.close()
        assert _accepted_and_proxied(runtime) == (4, 4)
        shutdown.set()

    async def test_a_gated_target_is_decided_in_plain_values_and_served_as_ever(
        self, nursery: trio.Nursery
    ) -> None:
        """Scenario: the target has a gate (maxConnections): a connection decided in plain values
        cannot be lean, and goes on as an ordinary connection from its decision (registered at
        once, its slot held and given back at its end)."""
        echo_port: int = await nursery.start(_serve_echo)
        url = f"tcp://127.0.0.1:{echo_port}?nodeId=b0&maxConnections=10"
        info, shutdown = await _start_lean(nursery, _config(echo_port, url=url))
        runtime = info.runtimes["r"]
        socks = await _registered_at_once(info, 2)
        try:
            assert runtime.pool.gates.states()["b0"].open == 2
        finally:
            for sock in socks:
                sock.close()
        with trio.fail_after(5):
            while runtime.pool.gates.states()["b0"].open:  # noqa: ASYNC110  # the core's thread ends them
                await trio.sleep(0.02)
        shutdown.set()

    async def test_a_policy_that_reads_counts_has_every_connection_registered(
        self, nursery: trio.Nursery
    ) -> None:
        """Scenario: LEAST_CONNECTIONS reads the registry's counts at each pick: its connections are
        registered at their decision (no lean one to make ordinary at every pick)."""
        echo_port: int = await nursery.start(_serve_echo)
        config = _config(echo_port)
        router = dataclasses.replace(config.routers[0], policy=PolicyConfig(name="LEAST_CONNECTIONS"))
        info, shutdown = await _start_lean(nursery, dataclasses.replace(config, routers=(router,)))
        for sock in await _registered_at_once(info, 2):
            sock.close()
        shutdown.set()

    async def test_info_lines_through_logging_make_no_lean_connection(
        self, nursery: trio.Nursery, conn_level: Callable[[int], None]
    ) -> None:
        """Scenario: router.conn's INFO lines on but not through the C buffer (logging's): the core
        cannot write them, so its connections are ordinary ones."""
        conn_level(logging.INFO)
        echo_port: int = await nursery.start(_serve_echo)
        info, shutdown = await _start(nursery, _config(echo_port), lean=True)
        assert isinstance(info.fast_path, NativePath)
        assert not info.fast_path._lean
        shutdown.set()

    async def test_a_subscriber_gets_every_event(self, nursery: trio.Nursery) -> None:
        """Scenario: a subscriber to the router's events (the event log, a test): connections are
        ordinary ones again, each reported connected and closed."""
        echo_port: int = await nursery.start(_serve_echo)
        info, shutdown = await _start_lean(nursery, _config(echo_port))
        runtime = info.runtimes["r"]
        events: list[object] = []
        runtime.report.subscribe(events.append)
        host, port = info.acceptors["a"]
        await trio.to_thread.run_sync(_echo_round, host, port, 3)
        await _until_no_proxied(info.fast_path)
        assert sum(isinstance(e, Connected) for e in events) == 3
        assert sum(isinstance(e, Closed) for e in events) == 3
        shutdown.set()


_STREAMS = st.lists(
    st.builds(
        _packet, st.sampled_from([0x20, 0x30, 0x90, 0xD0]), st.binary(max_size=200) | st.just(b"y" * 20_000)
    ),
    max_size=8,
).map(b"".join) | st.binary(max_size=64)
"""A broker's bytes: MQTT packets (lengths of 1 to 3 bytes), or anything (a follower gets lost)."""


@pytest.mark.skipif(_core is None, reason="never: ./run-tests builds the core")
class TestMqttInC:
    """The core's MQTT follower and first-answer reading against their Python references."""

    @given(data=_STREAMS, cuts=st.lists(st.integers(min_value=0), max_size=10))
    def test_follower_is_mqtt_frames(self, data: bytes, cuts: list[int]) -> None:
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        pieces = [data[a:b] for a, b in itertools.pairwise(points)]
        reference = MqttFrames()
        for piece in pieces:
            reference.feed(piece)
        assert _core is not None
        assert _core.mqtt_frames(*pieces) == (
            reference.frames,
            reference._left,
            reference._head,
            reference.lost,
        )

    @given(
        answer=st.builds(
            lambda code, extra, cut: (_packet(0x20, bytes((0, code)) + extra))[:cut],
            st.integers(min_value=0, max_value=255),
            st.binary(max_size=4),
            st.integers(min_value=0, max_value=12),
        )
        | st.binary(max_size=12)
    )
    def test_refusal_is_parse_refusals(self, answer: bytes) -> None:
        assert _core is not None
        assert _core.mqtt_refused(answer) == (parse_refusal(WireProtocol.MQTT, answer) is not None)


@pytest.mark.skipif(_core is None, reason="never: ./run-tests builds the core")
@given(address=st.binary(min_size=4, max_size=4))
def test_peer_address_is_inet_ntops(address: bytes) -> None:
    """The core writes a client's IPv4 address itself (inet_ntop's sprintf cost more than the
    rest of the accept): the same text."""
    assert _core is not None
    assert _core.ipv4_text(address) == socket.inet_ntop(socket.AF_INET, address)


async def _serve_mqtt_broker(
    answer: bytes, then: list[bytes], *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """A fake MQTT broker: reads a CONNECT, sends `answer`, then each of `then` in its own write,
    and keeps the connection until the client leaves (health probes connect and leave)."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                if not await stream.receive_some(4096):
                    return
                await stream.send_all(answer)
                for part in then:
                    await trio.sleep(0.02)
                    await stream.send_all(part)
                while await stream.receive_some(4096):
                    pass
            except trio.BrokenResourceError:
                pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


@pytest.mark.usefixtures("conn_level")
class TestLeanMqtt:
    """MQTT connections the core carries alone: it follows the broker's packets and reads its first
    answer, so an evacuation still finds the boundaries and passive health still sees a refusal."""

    async def test_materialized_connection_knows_where_packets_end(self, nursery: trio.Nursery) -> None:
        """Scenario: the broker sends a CONNACK, then a PUBLISH whose header is split over two
        writes and a PINGRESP; the connection made ordinary afterwards (the registry read) has a
        cursor at a boundary, three packets counted, as Python's follower of the same bytes."""
        publish = _packet(0x30, b"t" * 300)  # a 2-byte remaining length
        then = [publish[:2], publish[2:], b"\xd0\x00"]
        port: int = await nursery.start(_serve_mqtt_broker, b"\x20\x02\x00\x00", then)
        config = _config(port, key_type=KeyType.CLIENT_ID)
        info, shutdown = await _start_lean(nursery, config)
        runtime = info.runtimes["r"]
        host, acceptor_port = info.acceptors["a"]
        expected = b"\x20\x02\x00\x00" + b"".join(then)

        def client() -> socket.socket:
            sock = socket.create_connection((host, acceptor_port), timeout=10)
            sock.sendall(connect_packet(client_id=b"lean-1"))
            got = b""
            while len(got) < len(expected):
                got += sock.recv(4096)
            assert got == expected
            return sock

        sock = await trio.to_thread.run_sync(client)
        try:
            (conn,) = runtime.connections.movable("b0")
            assert isinstance(conn.cursor, MqttFrames)
            assert conn.cursor.frames == 3
            assert conn.cursor.at_boundary
            assert conn.protocol is WireProtocol.MQTT
        finally:
            sock.close()
        shutdown.set()

    async def _lane(
        self, nursery: trio.Nursery, *, handshake_timeout_ms: int = 10_000
    ) -> tuple[ServerInfo, trio.Event, tuple[str, int]]:
        """A lean MQTT router whose acceptor is an MQTT lane (a CONNECT read in plain values)."""
        port: int = await nursery.start(_serve_mqtt_broker, b"\x20\x02\x00\x00", [])
        config = _config(port, key_type=KeyType.CLIENT_ID, handshake_timeout_ms=handshake_timeout_ms)
        info, shutdown = await _start_lean(nursery, config)
        (listener,) = cast("NativePath", info.fast_path)._listeners.values()
        assert listener.mqtt_lane
        return info, shutdown, info.acceptors["a"]

    @pytest.mark.parametrize("parts", [1, 2], ids=["one-read", "two-reads"])
    async def test_a_connect_on_the_lane_is_read_as_the_sniffer_reads_it(
        self, nursery: trio.Nursery, parts: int
    ) -> None:
        """Scenario: a CONNECT in one read (decided in plain values) or in two (the lane left, read
        as always): the client gets the broker's CONNACK; the registry then shows the connection
        with its client id as key, MQTT, its own reference; one accept and one decision counted."""
        info, shutdown, (host, port) = await self._lane(nursery)
        runtime = info.runtimes["r"]
        packet = connect_packet(client_id=b"lane-7", user=b"u")

        def client() -> socket.socket:
            sock = socket.create_connection((host, port), timeout=10)
            sock.sendall(packet[:10] if parts == 2 else packet)
            if parts == 2:
                threading.Event().wait(0.1)
                sock.sendall(packet[10:])
            assert _receive(sock, 4) == b"\x20\x02\x00\x00"
            return sock

        sock = await trio.to_thread.run_sync(client)
        try:
            (conn,) = runtime.connections.movable("b0")
            assert (conn.key, conn.protocol, conn.conn.peer.host, conn.conn.acceptor) == (
                "lane-7",
                WireProtocol.MQTT,
                "127.0.0.1",
                "a",
            )
        finally:
            sock.close()
        assert _accepted_and_proxied(runtime) == (1, 1)
        shutdown.set()

    async def test_a_bad_connect_on_the_lane_is_refused_as_ever(self, nursery: trio.Nursery) -> None:
        """Scenario: a CONNECT of an unknown protocol level on the lane: the sniffer's refusal, its
        CONNACK 0x01 and the client error counted, as off the lane."""
        info, shutdown, (host, port) = await self._lane(nursery)

        def client() -> bytes:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(connect_packet(level=9))
                return _receive(sock, 8)

        assert await trio.to_thread.run_sync(client) == b"\x20\x02\x00\x01"
        registry = info.runtimes["r"].metrics.registry
        assert (
            registry.get_sample_value("router_client_errors_total", {"acceptor": "a", "reason": "mqtt"}) == 1
        )
        shutdown.set()

    @pytest.mark.parametrize("sent", [b"", b"\x10"], ids=["nothing", "one-byte"])
    async def test_a_connect_that_never_completes_on_the_lane_times_out(
        self, nursery: trio.Nursery, sent: bytes
    ) -> None:
        """Scenario: nothing, or one byte of a CONNECT, then nothing: the handshake deadline closes
        it, counted as a timeout, and its admission is given back."""
        info, shutdown, (host, port) = await self._lane(nursery, handshake_timeout_ms=300)
        runtime = info.runtimes["r"]

        def client() -> bytes:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(sent)
                return _receive(sock, 8)

        assert await trio.to_thread.run_sync(client) == b""
        registry = runtime.metrics.registry
        assert (
            registry.get_sample_value("router_client_errors_total", {"acceptor": "a", "reason": "timeout"})
            == 1
        )
        with trio.fail_after(5):
            while registry.get_sample_value("router_client_connections"):  # noqa: ASYNC110  # the core's thread
                await trio.sleep(0.02)
        shutdown.set()

    async def test_refusal_in_the_first_answer_is_passive_healths(self, nursery: trio.Nursery) -> None:
        """Scenario: the broker refuses the CONNECT (CONNACK 0x05, not authorized) and closes: the
        client gets the refusal, the close is `broker_refused` and passive health counts it."""
        port: int = await nursery.start(_serve_mqtt_broker, b"\x20\x02\x00\x05", [])
        info, shutdown = await _start_lean(nursery, _config(port, key_type=KeyType.CLIENT_ID))
        runtime = info.runtimes["r"]
        host, acceptor_port = info.acceptors["a"]

        def client() -> bytes:
            with socket.create_connection((host, acceptor_port), timeout=10) as sock:
                sock.sendall(connect_packet(client_id=b"refused-1"))
                return sock.recv(64)

        assert await trio.to_thread.run_sync(client) == b"\x20\x02\x00\x05"
        registry = runtime.metrics.registry
        labels = {"router": "r", "reason": "broker_refused"}
        with trio.fail_after(5):
            while not registry.get_sample_value("router_target_outlier_failures_total", labels):  # noqa: ASYNC110
                await trio.sleep(0.02)
        shutdown.set()

    async def test_many_mqtt_connections_are_counted(self, nursery: trio.Nursery) -> None:
        """Scenario: 100 MQTT clients connect, get their CONNACK and leave: all counted when
        scraped, none open, none registered."""
        port: int = await nursery.start(_serve_mqtt_broker, b"\x20\x02\x00\x00", [])
        info, shutdown = await _start_lean(nursery, _config(port, key_type=KeyType.CLIENT_ID))
        runtime = info.runtimes["r"]
        host, acceptor_port = info.acceptors["a"]

        def clients() -> None:
            for n in range(100):
                with socket.create_connection((host, acceptor_port), timeout=10) as sock:
                    sock.sendall(connect_packet(client_id=b"many-%d" % n))
                    assert sock.recv(64) == b"\x20\x02\x00\x00"

        await trio.to_thread.run_sync(clients)
        await _until_no_proxied(info.fast_path)
        registry = runtime.metrics.registry
        labels = {"router": "r", "node_id": "b0"}
        assert registry.get_sample_value("router_target_connect_duration_seconds_count", labels) == 100
        assert registry.get_sample_value("router_proxied_connections", labels) == 0
        assert runtime.connections.open_connections() == 0
        shutdown.set()
