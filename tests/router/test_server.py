"""serve_router in process, over real loopback sockets: proxying, refusal, drain, health checks."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
import trio

from keys import KeyType
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import AcceptorConfig, Config, RouterConfig
from router.datapath.net import open_connection
from router.server import ServerInfo, serve_router

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


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
    params = () if fast_path else (("fastPath", "false"),)
    acceptor = AcceptorConfig(name="a", host="127.0.0.1", port=0, router="r", params=params)
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
        assert (info.runtimes["r"].fast_path is not None) is request.param
        runtime = info.runtimes["r"]
        await runtime.wait_until(lambda: runtime.pool is not None and runtime.pool.ready_count() == 2)
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
        assert runtime.pool is not None
        runtime.apply_events(runtime.pool.record_check("b0", False, "test"))
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
    assert runtime.pool is not None
    pool = runtime.pool
    await runtime.wait_until(lambda: pool.state("b0").value == "not-ready")
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
    await runtime.wait_until(lambda: runtime.pool is not None and runtime.pool.active)
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


async def test_serve_router_warns_about_what_this_release_cannot_do(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a ROLE_NAME router without a user store on its acceptor: routerd says so once."""
    config = _config([1])
    router = dataclasses.replace(config.routers[0], key_type=KeyType.ROLE_NAME)
    config = dataclasses.replace(config, routers=(router,))
    shutdown = trio.Event()
    await nursery.start(
        lambda task_status: serve_router(config, admin=None, shutdown=shutdown, task_status=task_status)
    )
    shutdown.set()
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "router.server"
    ]
    assert warnings == [
        "router=r key-type=ROLE_NAME: no acceptor of it has usersFile/rolesFile, so only client-certificate "
        "users have roles; every other connection's key is NULL",
    ]
