"""router/reload.py: serve_router's reload in process, over real loopback sockets: applied in
place, connections and listening sockets kept, nothing changed when it fails."""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
from typing import TYPE_CHECKING

import pytest
import trio

from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, TargetState
from router.config import ConfigError
from router.config.settings import AcceptorConfig, Config, EventFileFormat, EventLogConfig, RouterConfig
from router.core.reload import ReloadError
from router.datapath.net import open_connection
from router.server import ServerInfo, serve_router
from tests.router.features.event_log.conftest import all_records
from tests.router.test_server import _read_until_eof, _serve_named_echo, _until

if TYPE_CHECKING:
    from pathlib import Path

    from router.core.reload import ConfigDiff


def _reload_config(
    ports: list[int],
    pool: tuple[str, ...],
    acceptors: dict[str, tuple[int, bool]],
    *,
    policy: str = "FIRST_ELEMENT",
) -> Config:
    """Router `r` over the targets `pool` (names of `b{i}` on `ports[i]`), and acceptors by name:
    (port, fast path allowed)."""
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{port}") for i, port in enumerate(ports))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name=policy),
        pool=PoolConfig(
            kind=PoolKind.STATIC, static_connectors=pool, check_period_ms=100, quorum_timeout_ms=0
        ),
    )
    configured = tuple(
        AcceptorConfig(name=name, host="127.0.0.1", port=port, router="r", fast_path=fast)
        for name, (port, fast) in acceptors.items()
    )
    return Config(source="test.xml", connectors=connectors, acceptors=configured, routers=(router,))


class TestReload:
    """serve_router's reload (`ServerInfo.reload`): applied in place, connections kept."""

    @pytest.fixture
    async def fleet(self, nursery: trio.Nursery) -> list[int]:
        return [await nursery.start(_serve_named_echo, name) for name in (b"b0", b"b1", b"b2")]

    @staticmethod
    async def _start(nursery: trio.Nursery, configs: list[Config]) -> ServerInfo:
        """serve_router on `configs[0]`; a reload reads `configs[-1]` (append to change the file)."""

        def load() -> Config:
            return configs[-1]

        info: ServerInfo = await nursery.start(
            functools.partial(serve_router, configs[0], admin=None, grace_s=0, load=load)
        )
        return info

    @staticmethod
    async def _reload(info: ServerInfo) -> ConfigDiff:
        assert info.reload is not None
        return await info.reload()

    @staticmethod
    async def _hello(address: tuple[str, int]) -> tuple[trio.SocketStream, bytes]:
        """A client connection through the router: the stream and the target's greeting."""
        stream = await trio.open_tcp_stream(*address)
        greeting = b""
        with trio.fail_after(5):
            while not greeting.endswith(b"\n"):
                greeting += await stream.receive_some(100)
        return stream, greeting

    @staticmethod
    async def _echo(stream: trio.SocketStream, data: bytes) -> bytes:
        await stream.send_all(data)
        got = b""
        with trio.fail_after(5):
            while len(got) < len(data):
                got += await stream.receive_some(100)
        return got

    async def test_reload_of_the_same_configuration_changes_nothing(
        self, nursery: trio.Nursery, fleet: list[int], caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO)
        config = _reload_config(fleet, ("b0",), {"a": (0, True)})
        info = await self._start(nursery, [config])
        bound = dict(info.acceptors)
        diff = await self._reload(info)
        assert not diff.changed
        assert info.acceptors == bound
        assert "configuration test.xml reloaded: nothing changed" in caplog.messages

    @pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
    async def test_reload_adds_and_removes_acceptors_keeping_connections_and_sockets(
        self, nursery: trio.Nursery, fleet: list[int], fast_path: bool
    ) -> None:
        """Scenario: an acceptor added accepts; the unchanged one keeps its socket (and its
        clients); a removed one refuses connects while its established connection goes on."""
        configs = [_reload_config(fleet, ("b0",), {"a": (0, fast_path)})]
        info = await self._start(nursery, configs)
        await info.runtimes["r"].pool.wait_until(lambda: info.runtimes["r"].pool.ready_count() == 1)
        a = info.acceptors["a"]
        a_stream, greeting = await self._hello(a)
        assert greeting == b"hello from b0\n"

        configs.append(_reload_config(fleet, ("b0",), {"a": (0, fast_path), "b": (0, fast_path)}))
        diff = await self._reload(info)
        assert (diff.acceptors_added, diff.acceptors_changed, diff.acceptors_removed) == (("b",), (), ())
        assert info.acceptors["a"] == a
        b = info.acceptors["b"]
        b_stream, greeting = await self._hello(b)
        assert greeting == b"hello from b0\n"
        assert await self._echo(a_stream, b"still a") == b"still a"

        configs.append(_reload_config(fleet, ("b0",), {"b": (0, fast_path)}))
        diff = await self._reload(info)
        assert diff.acceptors_removed == ("a",)
        assert "a" not in info.acceptors
        with pytest.raises(ConnectionRefusedError):
            await open_connection(*a)
        assert await self._echo(a_stream, b"after its acceptor went") == b"after its acceptor went"
        assert await self._echo(b_stream, b"b too") == b"b too"
        await a_stream.aclose()
        await b_stream.aclose()

    @pytest.mark.parametrize("fast_path", [True, False], ids=["to-trio-path", "to-fast-path"])
    async def test_reload_changed_acceptor_on_the_same_address_keeps_its_socket(
        self, nursery: trio.Nursery, fleet: list[int], fast_path: bool
    ) -> None:
        """Scenario: `fastPath` flips, so the other data path serves the acceptor; clients
        connecting all the while are never refused (the listening socket is the same)."""
        configs = [_reload_config(fleet, ("b0",), {"a": (0, fast_path)})]
        info = await self._start(nursery, configs)
        await info.runtimes["r"].pool.wait_until(lambda: info.runtimes["r"].pool.ready_count() == 1)
        a = info.acceptors["a"]
        refused = 0
        done = trio.Event()

        async def keep_connecting() -> None:
            nonlocal refused
            while not done.is_set():
                try:
                    stream, _ = await self._hello(a)
                except OSError:
                    refused += 1
                else:
                    await stream.aclose()

        async with trio.open_nursery() as clients:
            clients.start_soon(keep_connecting)
            for flip in range(4):
                allowed = fast_path if flip % 2 else not fast_path
                configs.append(_reload_config(fleet, ("b0",), {"a": (a[1], allowed)}))
                diff = await self._reload(info)
                assert diff.acceptors_changed == ("a",)
                await trio.sleep(0.05)
            done.set()
        assert refused == 0
        assert info.acceptors["a"] == a
        stream, greeting = await self._hello(a)
        assert greeting == b"hello from b0\n"
        await stream.aclose()

    @pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
    async def test_reload_moves_only_the_connections_of_a_removed_target(
        self, nursery: trio.Nursery, fleet: list[int], fast_path: bool, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO)
        configs = [_reload_config(fleet, ("b0",), {"a": (0, fast_path)})]
        info = await self._start(nursery, configs)
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
        a = info.acceptors["a"]
        on_b0, greeting = await self._hello(a)
        assert greeting == b"hello from b0\n"

        configs.append(_reload_config(fleet, ("b1", "b0"), {"a": (a[1], fast_path)}))
        diff = await self._reload(info)
        assert diff.routers_changed[0].targets_added == ("b1",)
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 2)
        assert runtime.pool.target_state("b0") is TargetState.READY  # kept, not probed again first
        on_b1, greeting = await self._hello(a)
        assert greeting == b"hello from b1\n"
        assert await self._echo(on_b0, b"kept") == b"kept"

        configs.append(_reload_config(fleet, ("b1",), {"a": (a[1], fast_path)}))
        diff = await self._reload(info)
        assert diff.routers_changed[0].targets_removed == ("b0",)
        with trio.fail_after(5):
            assert await _read_until_eof(on_b0) == b""
        assert await self._echo(on_b1, b"stays") == b"stays"
        # Moved as an evacuation moves it (this client's opening was not read: a plain close).
        await _until(lambda: any("reason=evacuated" in m for m in caplog.messages))
        assert (
            "router=r evacuate of target=b0 started: 1 connection(s) at 50/s, oldest first" in caplog.messages
        )
        labels = {"router": "r", "reason": "evacuated"}
        assert (
            runtime.metrics.registry.get_sample_value("router_proxied_connections_closed_total", labels)
            == 1.0
        )
        await on_b0.aclose()
        await on_b1.aclose()

    async def test_reload_of_a_bad_file_changes_nothing(
        self, nursery: trio.Nursery, fleet: list[int], caplog: pytest.LogCaptureFixture
    ) -> None:
        config = _reload_config(fleet, ("b0",), {"a": (0, True)})
        reason = "test.xml:9: <quorum-size>: must be > 0, got '-5'"

        def load() -> Config:
            raise ConfigError("test.xml", 9, "quorum-size", "must be > 0, got '-5'")

        info: ServerInfo = await nursery.start(
            functools.partial(serve_router, config, admin=None, grace_s=0, load=load)
        )
        assert info.reload is not None
        with pytest.raises(ReloadError) as raised:
            await info.reload()
        assert str(raised.value) == reason
        assert f"reload of test.xml failed, nothing changed: {reason}" in caplog.messages

    async def test_reload_that_cannot_bind_changes_nothing(
        self, nursery: trio.Nursery, fleet: list[int]
    ) -> None:
        configs = [_reload_config(fleet, ("b0",), {"a": (0, True)})]
        info = await self._start(nursery, configs)
        a = info.acceptors["a"]
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            configs.append(_reload_config(fleet, ("b0", "b1"), {"a": (a[1], True), "b": (port, True)}))
            assert info.reload is not None
            with pytest.raises(ReloadError, match=rf"acceptor 'b' on 127.0.0.1:{port} cannot listen"):
                await info.reload()
        assert set(info.acceptors) == {"a"}
        assert [t.node_id for t in info.runtimes["r"].pool.targets()] == ["b0"]

    async def test_reload_gives_the_event_log_the_routers_it_adds_and_changes(
        self, fleet: list[int], tmp_path: Path
    ) -> None:
        """Scenario: with the event log on, a reload adds router `r2` (with an acceptor) and changes
        `r`'s policy; each connection of both is logged once (a decision, a close) under its router."""
        first = dataclasses.replace(
            _reload_config(fleet, ("b0",), {"a": (0, False)}),
            event_log=EventLogConfig(directory=str(tmp_path), format=EventFileFormat.JSONL),
        )
        r = first.routers[0]
        second = dataclasses.replace(
            first,
            acceptors=(*first.acceptors, AcceptorConfig(name="b", host="127.0.0.1", port=0, router="r2")),
            routers=(
                dataclasses.replace(r, policy=PolicyConfig(name="ROUND_ROBIN")),
                dataclasses.replace(r, name="r2"),
            ),
        )
        configs = [first]
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            info: ServerInfo = await nursery.start(
                functools.partial(
                    serve_router, first, admin=None, grace_s=0, shutdown=shutdown, load=lambda: configs[-1]
                )
            )
            await info.runtimes["r"].pool.wait_until(lambda: info.runtimes["r"].pool.ready_count() == 1)
            stream, _ = await self._hello(info.acceptors["a"])
            await stream.aclose()
            configs.append(second)
            diff = await self._reload(info)
            assert (diff.routers_added, [c.name for c in diff.routers_changed]) == (("r2",), ["r"])
            await info.runtimes["r2"].pool.wait_until(lambda: info.runtimes["r2"].pool.ready_count() == 1)
            for acceptor in ("a", "b"):
                stream, _ = await self._hello(info.acceptors[acceptor])
                await stream.aclose()
            shutdown.set()
        logged = sorted((str(r["router"]), str(r["kind"])) for r in all_records(tmp_path))
        assert logged == [("r", "close")] * 2 + [("r", "decision")] * 2 + [
            ("r2", "close"),
            ("r2", "decision"),
        ]
