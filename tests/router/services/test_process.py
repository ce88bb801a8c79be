"""router/services/process.py: the status resource's process and acceptors, read from a real
server (both data paths) over its admin API."""

from __future__ import annotations

import json
import os
import resource
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
import trio

from keys import KeyType
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, TargetState
from router.config.settings import AcceptorConfig, Config, RouterConfig
from router.core.admission import Admission
from router.server import ServerInfo, serve_router
from router.services.process import ProcessView, package_version

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

MQTT_CONNECT = bytes.fromhex(
    "10"  # CONNECT, flags 0 (MQTT 3.1.1 §3.1)
    "0e"  # remaining length 14
    "00044d515454"  # protocol name "MQTT"
    "04"  # protocol level 4 (3.1.1)
    "02"  # connect flags: clean session
    "003c"  # keep alive 60 s
    "00026331"  # client id "c1"
)
WAIT_S = 5.0


async def _echo(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                while data := await stream.receive_some(65536):
                    await stream.send_all(data)
            except trio.BrokenResourceError:
                pass  # probes connect and close at once

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


def _config(backend: int) -> Config:
    router = RouterConfig(
        name="r",
        key_type=KeyType.CLIENT_ID,
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("b0",),
            check_period_ms=600_000,  # one probe at start; the test sets readiness itself
            quorum_timeout_ms=30_000,
        ),
    )
    acceptors = (
        AcceptorConfig(name="fast", host="127.0.0.1", port=0, router="r", connections_allowed=10),
        AcceptorConfig(name="slow", host="127.0.0.1", port=0, router="r", fast_path=False),
    )
    connectors = (Connector.from_url("b0", f"tcp://127.0.0.1:{backend}"),)
    return Config(source="test.xml", connectors=connectors, acceptors=acceptors, routers=(router,))


async def _receive(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    with trio.fail_after(WAIT_S):
        while len(data) < size and (chunk := await stream.receive_some(size - len(data))):
            data += chunk
    return bytes(data)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class TestStatusResource:
    @pytest.fixture
    async def server(self, nursery: trio.Nursery) -> AsyncIterator[tuple[ServerInfo, str]]:
        backend = await nursery.start(_echo)
        shutdown = trio.Event()
        info: ServerInfo = await nursery.start(
            lambda task_status: serve_router(
                _config(backend), admin=("127.0.0.1", 0), shutdown=shutdown, task_status=task_status
            )
        )
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(lambda: runtime.pool.target_state("b0") is TargetState.READY)
        assert info.admin is not None
        yield info, f"http://127.0.0.1:{info.admin[1]}/api/v1/status"
        shutdown.set()

    @staticmethod
    async def _until(url: str, expected: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The status document once `expected` holds for its acceptors by name (bounded wait)."""
        with trio.fail_after(WAIT_S):
            while True:
                document: dict[str, Any] = await trio.to_thread.run_sync(_get, url)
                acceptors = {a["name"]: a for a in document["acceptors"]}
                if expected(acceptors):
                    return document
                await trio.sleep(0.02)

    async def test_status_shows_the_process_and_its_acceptors(self, server: tuple[ServerInfo, str]) -> None:
        info, url = server
        document = await trio.to_thread.run_sync(_get, url)
        process = document["process"]
        assert process["pid"] == os.getpid()
        assert process["version"] == package_version() != ""
        assert process["uptime_s"] >= 0
        assert process["descriptors"]["limit"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert 0 < process["descriptors"]["open"] < process["descriptors"]["limit"]
        assert process["client_connections"]["open"] == 0
        assert process["client_connections"]["budget"] >= 1
        fast, slow = document["acceptors"]
        assert (fast["name"], fast["data_path"], fast["port"]) == ("fast", "fast", info.acceptors["fast"][1])
        assert (slow["name"], slow["data_path"], slow["port"]) == ("slow", "trio", info.acceptors["slow"][1])
        assert (fast["connections_allowed"], slow["connections_allowed"]) == (10, None)
        assert fast["router"] == slow["router"] == "r"
        assert fast["mode"] == "proxy"

    async def test_status_counts_pending_until_decided_and_open_until_closed_on_both_paths(
        self, server: tuple[ServerInfo, str]
    ) -> None:
        """Scenario: a client that has not sent its opening is pending; once the router has
        decided (and proxies it) it is open but not pending; closed, it is neither."""
        info, url = server
        clients = [await trio.open_tcp_stream(*info.acceptors[name]) for name in ("fast", "slow")]
        both = {"fast", "slow"}
        await self._until(url, lambda a: all((a[n]["open"], a[n]["pending"]) == (1, 1) for n in both))
        for client in clients:
            await client.send_all(MQTT_CONNECT)
            assert await _receive(client, len(MQTT_CONNECT)) == MQTT_CONNECT  # replayed, echoed
        document = await self._until(
            url, lambda a: all((a[n]["open"], a[n]["pending"]) == (1, 0) for n in both)
        )
        assert document["process"]["client_connections"]["open"] == 2
        for client in clients:
            await client.aclose()
        await self._until(url, lambda a: all((a[n]["open"], a[n]["pending"]) == (0, 0) for n in both))

    async def test_status_counts_a_quorum_wait_as_pending_on_both_paths(
        self, server: tuple[ServerInfo, str]
    ) -> None:
        """Scenario: the pool has lost its quorum; a complete opening waits for it (the fast path
        hands the connection over to the trio side to wait), pending until the target is back."""
        info, url = server
        runtime = info.runtimes["r"]
        runtime.pool.record_check("b0", False, "made not ready by the test")
        clients = [await trio.open_tcp_stream(*info.acceptors[name]) for name in ("fast", "slow")]
        for client in clients:
            await client.send_all(MQTT_CONNECT)
        both = {"fast", "slow"}
        await self._until(url, lambda a: all((a[n]["open"], a[n]["pending"]) == (1, 1) for n in both))
        runtime.pool.record_check("b0", True)
        await self._until(url, lambda a: all((a[n]["open"], a[n]["pending"]) == (1, 0) for n in both))
        for client in clients:
            await client.aclose()


def test_process_view_before_serving_has_no_acceptors() -> None:
    view = ProcessView(Admission(budget=7))
    status = view.status()
    assert status.acceptors == ()
    assert (status.process.client_budget, status.process.client_connections) == (7, 0)
    assert status.process.pid == os.getpid()
