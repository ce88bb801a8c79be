"""serve_router in process, over real loopback sockets: proxying, refusal, drain, health checks."""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import re
import socket
from typing import TYPE_CHECKING, Any, Final

import pytest
import trio

from keys import KeyType, mqtt
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, TargetState
from router.config.settings import AcceptorConfig, AcceptorMode, Config, RouterConfig
from router.datapath import fast_path as fast_path_module
from router.datapath.acceptor import ConnectionLimits
from router.datapath.native_path import DATA_PATH_ENV
from router.datapath.net import open_connection
from router.server import ServerInfo, serve_router
from tests.conftest import read_until_closed, recv_exactly
from tests.keys.test_mqtt import connect_packet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from router.runtime import RouterRuntime


async def _serve_named_echo(
    name: bytes, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """A fake broker: greets with its name, echoes until EOF, then says bye and closes."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                await stream.send_all(b"hello from " + name + b"\n")
                while data := await stream.receive_some(65536):
                    await stream.send_all(data)
                await stream.send_all(b"bye")
            except trio.BrokenResourceError:
                pass  # health probes connect and close at once

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


def _config(
    ports: list[int], *, quorum_size: int = 1, policy: str = "FIRST_ELEMENT", fast_path: bool = True
) -> Config:
    names = tuple(f"b{i}" for i in range(len(ports)))
    connectors = tuple(
        Connector.from_url(name, f"tcp://127.0.0.1:{port}") for name, port in zip(names, ports, strict=True)
    )
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name=policy),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=names,
            check_period_ms=100,
            quorum_size=quorum_size,
            quorum_timeout_ms=0,
        ),
    )
    acceptor = AcceptorConfig(name="a", host="127.0.0.1", port=0, router="r", fast_path=fast_path)
    return Config(source="test.xml", connectors=connectors, acceptors=(acceptor,), routers=(router,))


async def _read_until_eof(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
    return bytes(data)


class TestServeRouter:
    @pytest.fixture
    async def fleet(self, nursery: trio.Nursery) -> list[int]:
        return [await nursery.start(_serve_named_echo, name) for name in (b"b0", b"b1")]

    @pytest.fixture(params=[True, False], ids=["fast-path", "trio-path"])
    async def server(
        self, nursery: trio.Nursery, fleet: list[int], request: pytest.FixtureRequest
    ) -> AsyncIterator[ServerInfo]:
        shutdown = trio.Event()
        config = _config(fleet, fast_path=request.param)
        info: ServerInfo = await nursery.start(
            lambda task_status: serve_router(
                config, admin=None, grace_s=5, shutdown=shutdown, task_status=task_status
            )
        )
        assert (info.fast_path is not None and info.fast_path.acceptors == {"a"}) is request.param
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 2)
        yield info
        shutdown.set()

    async def test_serve_router_proxies_both_ways_with_half_close(self, server: ServerInfo) -> None:
        host, port = server.acceptors["a"]
        client = await trio.open_tcp_stream(host, port)
        await client.send_all(b"ping")
        await client.send_eof()
        assert await _read_until_eof(client) == b"hello from b0\npingbye"
        await client.aclose()

    async def test_serve_router_counts_connection_in_metrics(self, server: ServerInfo) -> None:
        host, port = server.acceptors["a"]
        async with await trio.open_tcp_stream(host, port) as client:
            await client.send_eof()
            await _read_until_eof(client)
        registry = server.runtimes["r"].metrics.registry
        labels = {"acceptor": "a", "router": "r"}
        assert registry.get_sample_value("router_connections_accepted_total", labels) == 1.0
        ok = {"router": "r", "status": "OK"}
        assert registry.get_sample_value("router_routing_decisions_total", ok) == 1.0

    async def test_serve_router_fails_over_in_pool_order(self, server: ServerInfo, fleet: list[int]) -> None:
        """Scenario: FIRST_ELEMENT; the first target goes un-ready, connections go to the second."""
        runtime = server.runtimes["r"]
        runtime.pool.record_check("b0", False, "test")
        host, port = server.acceptors["a"]
        async with await trio.open_tcp_stream(host, port) as client:
            await client.send_eof()
            assert await _read_until_eof(client) == b"hello from b1\nbye"


async def test_serve_router_refuses_when_no_target_is_ready(nursery: trio.Nursery) -> None:
    """Scenario: the only target's port is closed; the client is closed with no byte sent."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    dead_port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            _config([dead_port]), admin=None, shutdown=shutdown, task_status=task_status
        )
    )
    runtime = info.runtimes["r"]
    await runtime.pool.wait_until(lambda: runtime.pool.target_state("b0") is TargetState.NOT_READY)
    async with await trio.open_tcp_stream(*info.acceptors["a"]) as client:
        assert await _read_until_eof(client) == b""
    refused = {"router": "r", "status": "REFUSED_UNAVAILABLE"}
    assert runtime.metrics.registry.get_sample_value("router_routing_decisions_total", refused) == 1.0
    shutdown.set()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
async def test_serve_router_drains_open_connections_on_shutdown(
    nursery: trio.Nursery, fast_path: bool
) -> None:
    """Scenario: after shutdown starts, new connects fail but an open connection keeps working."""
    port = await nursery.start(_serve_named_echo, b"b0")
    shutdown = trio.Event()
    done = trio.Event()

    async def run(task_status: trio.TaskStatus[ServerInfo]) -> None:
        await serve_router(
            _config([port], fast_path=fast_path),
            admin=None,
            grace_s=30,
            shutdown=shutdown,
            task_status=task_status,
        )
        done.set()

    info: ServerInfo = await nursery.start(run)
    runtime = info.runtimes["r"]
    await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
    client = await trio.open_tcp_stream(*info.acceptors["a"])
    assert await client.receive_some(100) == b"hello from b0\n"
    shutdown.set()
    await trio.testing.wait_all_tasks_blocked()
    with pytest.raises(ConnectionRefusedError):
        await open_connection(*info.acceptors["a"])
    await client.send_all(b"still here")
    assert await client.receive_some(100) == b"still here"
    assert not done.is_set()
    await client.send_eof()
    assert await _read_until_eof(client) == b"bye"
    await client.aclose()
    with trio.fail_after(5):
        await done.wait()


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again: connects are refused


async def _redispatch_router(
    nursery: trio.Nursery,
    ports: list[int],
    fast_path: bool,
    *,
    limits: ConnectionLimits | None = None,
    hosts: dict[int, str] | None = None,
) -> ServerInfo:
    """FIRST_ELEMENT over `ports` (b0, b1, ...) by client id, every target ready for the router;
    `hosts` names connectors by host name instead of 127.0.0.1 (index -> name)."""
    config = _config(ports, fast_path=fast_path)
    connectors = tuple(
        Connector.from_url(c.name, f"tcp://{(hosts or {})[i]}:{c.port}") if i in (hosts or {}) else c
        for i, c in enumerate(config.connectors)
    )
    router = config.routers[0]
    assert router.pool is not None
    router = dataclasses.replace(
        router, key_type=KeyType.CLIENT_ID, pool=dataclasses.replace(router.pool, check_period_ms=3_600_000)
    )
    config = dataclasses.replace(config, routers=(router,), connectors=connectors)
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            config, admin=None, grace_s=1, limits=limits, task_status=task_status
        )
    )
    runtime = info.runtimes["r"]
    for node_id in (f"b{i}" for i in range(len(ports))):

        def probed(node_id: str = node_id) -> bool:
            return runtime.pool.target_state(node_id) is not TargetState.UNKNOWN

        await runtime.pool.wait_until(probed)
        runtime.pool.record_check(node_id, True)  # ready as far as the router knows: a dead one died since
    return info


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
async def test_a_failed_connect_is_redispatched_to_another_ready_target(
    nursery: trio.Nursery, fast_path: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario (hardening review): the first pick died between two probes; the client goes on to
    the other ready target (HAProxy's redispatch), counted and logged, its opening replayed."""
    live = await nursery.start(_serve_named_echo, b"b1")
    info = await _redispatch_router(nursery, [_dead_port(), live], fast_path)
    connect = connect_packet(client_id=b"c-1")
    got = await trio.to_thread.run_sync(_client_exchange, info.acceptors["a"], connect)
    assert got == b"hello from b1\n" + connect + b"bye"
    await _until(lambda: any("redispatched_to=b1" in r.getMessage() for r in caplog.records))
    metrics = info.runtimes["r"].metrics
    refused = metrics.connect_failures.value(("r", "b0", "refused"))
    assert (metrics.redispatches.value(("r",)), refused) == (1, 1)
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
async def test_a_failed_redispatch_is_answered_in_the_clients_protocol(
    nursery: trio.Nursery, fast_path: bool
) -> None:
    """Scenario: both targets died; after one redispatch the MQTT client gets CONNACK 0x88 (server
    unavailable, as Artemis answers 3.1.1 clients) instead of a bare close."""
    info = await _redispatch_router(nursery, [_dead_port(), _dead_port()], fast_path)
    got = await trio.to_thread.run_sync(
        _client_exchange, info.acceptors["a"], connect_packet(client_id=b"c-2")
    )
    assert got == b"\x20\x02\x00\x88"
    metrics = info.runtimes["r"].metrics
    await _until(lambda: metrics.connect_failures.value(("r", "b1", "refused")) == 1)
    refused = metrics.connect_failures.value(("r", "b0", "refused"))
    assert (metrics.redispatches.value(("r",)), refused) == (1, 1)
    assert metrics.refusals.value(("r", "connect_failed")) == 1
    nursery.cancel_scope.cancel()


def _no_second_upstream_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python fast path's second socket towards a target fails with EMFILE (the process ran
    short); the C core's socket() is out of reach of a test's monkeypatch."""
    monkeypatch.setenv(DATA_PATH_ENV, "python")
    real, made = fast_path_module._Socket, []

    def make(*args: Any) -> Any:  # targets' sockets are made with 2 arguments, accepted ones with 4
        if len(args) == 2:
            made.append(args)
            if len(made) >= 2:
                raise OSError(errno.EMFILE, "Too many open files")
        return real(*args)

    monkeypatch.setattr(fast_path_module, "_Socket", make)


async def test_the_fast_path_refuses_a_redispatch_it_has_no_socket_for(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario (review): out of descriptors for the redispatched connect, the client gets its
    refusal and its admission is released (it leaked, with no answer)."""
    _no_second_upstream_socket(monkeypatch)
    live = await nursery.start(_serve_named_echo, b"b1")
    info = await _redispatch_router(nursery, [_dead_port(), live], True)
    got = await trio.to_thread.run_sync(
        _client_exchange, info.acceptors["a"], connect_packet(client_id=b"c-1")
    )
    assert got == b"\x20\x02\x00\x88"
    assert info.fast_path is not None
    metrics = next(iter(info.runtimes.values())).metrics
    await _until(lambda: metrics.connect_failures.value(("r", "b1", "local_shortage")) == 1)
    nursery.cancel_scope.cancel()


async def test_a_failure_at_a_connect_deadline_costs_one_connection_not_the_fast_path(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario (review): a connect timeout whose redispatch runs out of descriptors used to end
    the whole fast path (its deadlines were handled outside the per-event guard)."""
    _no_second_upstream_socket(monkeypatch)
    ports = [await nursery.start(_serve_named_echo, name) for name in (b"b0", b"b1")]
    limits = ConnectionLimits(connect_timeout_s=1e-9)  # every connect times out at its deadline
    info = await _redispatch_router(nursery, ports, True, limits=limits)
    first = await trio.to_thread.run_sync(
        _client_exchange, info.acceptors["a"], connect_packet(client_id=b"c-1")
    )
    assert first == b"\x20\x02\x00\x88"
    assert not [r for r in caplog.records if "fast path failed" in r.getMessage()]
    assert info.fast_path is not None
    assert not info.fast_path.join(0)  # still running
    nursery.cancel_scope.cancel()


async def test_a_fast_path_redispatch_to_a_host_name_resolves_it_on_the_trio_side(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario (review): the redispatched target is named by host name: the fast path hands the
    connection over (as plan.for_fast_path says) instead of resolving the name in its thread."""
    in_thread: list[object] = []

    class Recording(fast_path_module._Socket):
        def connect_ex(self, address: Any) -> int:
            in_thread.append(address)
            return int(super().connect_ex(address))

    monkeypatch.setattr(fast_path_module, "_Socket", Recording)
    monkeypatch.setenv(DATA_PATH_ENV, "python")  # the Python fast path's sockets are the ones recorded
    live = await nursery.start(_serve_named_echo, b"b1")
    info = await _redispatch_router(nursery, [_dead_port(), live], True, hosts={1: "localhost"})
    connect = connect_packet(client_id=b"c-1")
    got = await trio.to_thread.run_sync(_client_exchange, info.acceptors["a"], connect)
    assert got == b"hello from b1\n" + connect + b"bye"
    assert [address[0] for address in in_thread if isinstance(address, tuple)] == ["127.0.0.1"]  # b0 only
    nursery.cancel_scope.cancel()


# -- both data paths report alike ---------------------------------------------------------------


class _Lines(logging.Handler):
    """The connection and pool log lines of one run, with the parts that differ between any two
    runs (client ports, durations) replaced."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name in ("router.conn", "router.pool"):
            line = re.sub(r"peer=127\.0\.0\.1:\d+", "peer=127.0.0.1:PORT", record.getMessage())
            line = re.sub(r"duration_s=[0-9.]+", "duration_s=D", line)
            self.lines.append(f"{record.levelname} {line}")


_PROCESS_WIDE: Final = ("router_log_lines_suppressed_total",)
"""Counted for the whole test process (the log limiters a routerd run in-process installs), not
for one server run."""
_TIMINGS: Final = re.compile(
    r"process_.*|router_target_(check_duration_seconds|last_change_timestamp_seconds)|.*_(sum|bucket)"
    r"|router_client_connections|router_config_last_reload_success_timestamp_seconds"
    r"|router_target_down_seconds_total"
)
"""Samples of times and durations (and the process's own figures), which no two runs share (a
histogram's _count stays compared), and the client connections open at the scrape: the fast path
releases a connection's admission on its thread, possibly after the test saw its last line."""


def _metric_samples(info: ServerInfo) -> dict[str, float]:
    registry = info.runtimes["r"].metrics.registry
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in registry.collect()
        for s in family.samples
        if s.name not in _PROCESS_WIDE and not _TIMINGS.fullmatch(s.name)
    }


def _client_exchange(address: tuple[str, int], send: bytes) -> bytes:
    """In a thread: connect, send, half-close, read until the router closes."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(send)
        # A close with our bytes unread is a reset, one before they arrived a clean end: when the
        # router closes at once (a failed connect), which one the client sees is the kernel's timing,
        # and a reset can come before our half-close (which then finds no connection: ENOTCONN).
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
        return read_until_closed(sock)


async def _until(predicate: Callable[[], bool]) -> None:
    """The fast path reports from its own thread: nothing to await, so poll (bounded)."""
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def _scenario(fast_path: bool, name: str, port: int) -> tuple[bytes, list[str], dict[str, float]]:
    """Run one scenario against a fresh routerd-in-process; what the client got, the log lines
    and every metric sample."""
    config = _config([port], fast_path=fast_path)
    router, acceptor = config.routers[0], config.acceptors[0]
    pool = router.pool
    assert pool is not None
    router = dataclasses.replace(router, pool=dataclasses.replace(pool, check_period_ms=3_600_000))
    if name in ("redirect", "refused", "garbage"):
        router = dataclasses.replace(router, key_type=KeyType.CLIENT_ID)
        mode = AcceptorMode.REDIRECT if name == "redirect" else AcceptorMode.PROXY
        acceptor = dataclasses.replace(acceptor, mode=mode)
    config = dataclasses.replace(config, routers=(router,), acceptors=(acceptor,))
    lines = _Lines()
    logger = logging.getLogger("router")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            info: ServerInfo = await nursery.start(
                lambda task_status: serve_router(
                    config, admin=None, grace_s=1, shutdown=shutdown, task_status=task_status
                )
            )
            assert (info.fast_path is not None) is fast_path
            runtime, address = info.runtimes["r"], info.acceptors["a"]
            await runtime.pool.wait_until(lambda: runtime.pool.target_state("b0") is not TargetState.UNKNOWN)
            ready = name != "refused"  # ready also for the dead port of "connect-failed"
            runtime.pool.record_check("b0", ready, "" if ready else "made not ready by the test")
            got = await _drive(name, runtime, address)
            # The last line of the scenario (the fast path may write it after the client saw the end).
            last, count = _LAST_LINE[name]
            await _until(lambda: sum(last in line for line in lines.lines) >= count)
            samples = _metric_samples(info)
            shutdown.set()
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    return got, lines.lines, samples


_LAST_LINE = {
    "proxied": (" closed ", 2),
    "redirect": ("outcome=REDIRECT", 1),
    "refused": ("outcome=REFUSED", 1),
    "garbage": ("handshake rejected", 1),
    "connect-failed": ("pool is inactive", 1),
    "not-ready": (" closed ", 1),
}


async def _drive(name: str, runtime: RouterRuntime, address: tuple[str, int]) -> bytes:
    match name:
        case "connect-failed":
            return await trio.to_thread.run_sync(_client_exchange, address, b"ping")
        case "proxied":
            got = await trio.to_thread.run_sync(_client_exchange, address, b"ping")
            # A second one, so the counts of both paths add up over connections.
            return got + await trio.to_thread.run_sync(_client_exchange, address, b"pong")
        case "redirect":
            connect = connect_packet(level=5, client_id=b"d-1")
            return await trio.to_thread.run_sync(_client_exchange, address, connect)
        case "refused":
            connect = connect_packet(level=5, client_id=b"d-2")
            return await trio.to_thread.run_sync(_client_exchange, address, connect)
        case "garbage":
            return await trio.to_thread.run_sync(_client_exchange, address, b"GET / HTTP/1.1\r\n\r\n")
        case "not-ready":
            with socket.create_connection(address, timeout=10) as sock:
                sock.sendall(b"x")
                first = await trio.to_thread.run_sync(recv_exactly, sock, len(b"hello from b0\nx"))
                runtime.pool.record_check("b0", False, "probe failed")
                rest = await trio.to_thread.run_sync(functools.partial(read_until_closed, sock))
                return first + rest
    raise AssertionError(name)


@pytest.mark.parametrize(
    "scenario", ["proxied", "redirect", "refused", "garbage", "connect-failed", "not-ready"]
)
async def test_both_data_paths_give_the_same_log_lines_and_metrics(
    nursery: trio.Nursery, scenario: str
) -> None:
    """Scenario: the same clients through an acceptor the fast path serves and through one that the
    trio path serves: the client gets the same bytes, routerd writes the same connection and pool
    log lines (client ports and durations aside) and ends with the same metric values."""
    if scenario == "connect-failed":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
    else:
        port = await nursery.start(_serve_named_echo, b"b0")
    fast = await _scenario(True, scenario, port)
    trio_path = await _scenario(False, scenario, port)
    assert fast[0] == trio_path[0]
    assert fast[1] == trio_path[1]
    assert fast[2] == trio_path[2]
    ready = ["INFO router=r target=b0 is ready", "INFO router=r pool is active (1/1 ready)"]
    proxied = "INFO peer=127.0.0.1:PORT router=r key=127.0.0.1 target=b0 outcome=OK"
    closed = (
        "INFO peer=127.0.0.1:PORT router=r target=b0 closed bytes_in={} bytes_out={} duration_s=D reason={}"
    )
    dead = f"router=r target=b0 is not ready: connect to tcp://127.0.0.1:{port} failed: Connection refused"
    expected = {
        "proxied": (
            b"hello from b0\npingbyehello from b0\npongbye",
            [*ready, proxied, closed.format(4, 21, "closed"), proxied, closed.format(4, 21, "closed")],
        ),
        "redirect": (
            mqtt.encode_connack(0x9C, protocol_level=5, server_reference=f"127.0.0.1:{port}"),
            [*ready, "INFO peer=127.0.0.1:PORT router=r key=d-1 target=b0 outcome=REDIRECT protocol=mqtt"],
        ),
        "refused": (
            mqtt.encode_connack(0x88, protocol_level=5),
            [
                *ready,
                "WARNING router=r target=b0 is not ready: made not ready by the test",
                "WARNING router=r pool is inactive (0/1 ready)",
                "INFO peer=127.0.0.1:PORT router=r key=d-2 outcome=REFUSED_UNAVAILABLE "
                "reason=no ready target",
            ],
        ),
        "garbage": (
            b"",
            [
                *ready,
                "WARNING peer=127.0.0.1:PORT acceptor=a protocol=detect handshake rejected: "
                '"unknown protocol, connection starts with 474554202f20485454502f312e310d0a"',
            ],
        ),
        "connect-failed": (
            b"",
            [
                f"WARNING {dead}",
                *ready,
                "WARNING peer=127.0.0.1:PORT router=r key=127.0.0.1 target=b0 outcome=CONNECT_FAILED "
                "reason=Connection refused",
                f"WARNING {dead}",
                "WARNING router=r pool is inactive (0/1 ready)",
            ],
        ),
        "not-ready": (
            b"hello from b0\nx",
            [
                *ready,
                proxied,
                "WARNING router=r target=b0 is not ready: probe failed",
                "WARNING router=r pool is inactive (0/1 ready)",
                "WARNING router=r target=b0 is not ready: closing its 1 proxied connection(s)",
                closed.format(1, 15, "target_not_ready"),
            ],
        ),
    }[scenario]
    assert (fast[0], fast[1]) == expected


# --- configuration reload ----------------------------------------------------------------------
