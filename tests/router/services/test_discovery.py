"""ZooKeeper discovery and registration in-process, against a real ZooKeeper (no mocks).

Each test uses its own path under the session's ZooKeeper. Probes are a fake `check` (every
target is ready), so what is tested is membership: znodes in, pool targets out. kazoo runs real
threads, so these tests run on trio's real clock and wait on pool state with a deadline.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import pytest
import trio
from kazoo.client import KazooClient

from policies import PolicyConfig
from pools import Connector, Member, PoolConfig, PoolKind, Target
from router.config.settings import Config, DiscoveryGroupConfig, RouterConfig, ZooKeeperConfig
from router.metrics import Metrics
from router.runtime import RouterRuntime
from router.services.discovery import (
    NodeExistsError,
    RegistrationError,
    Session,
    ZooKeeper,
    ZooKeeperError,
    serve_discovery,
    serve_registration,
)
from router.services.health import serve_health_checks
from tests.conftest import free_port

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tests.router.conftest import ZooKeeperServer

DEADLINE_S = 15.0
SESSION_TIMEOUT_MS = 2000


@pytest.fixture
def path(request: pytest.FixtureRequest) -> str:
    return f"/test-discovery/{request.node.name}"


@pytest.fixture
def zk_config(zookeeper: ZooKeeperServer, path: str) -> ZooKeeperConfig:
    return ZooKeeperConfig(connect=zookeeper.connect, path=path, session_timeout_ms=SESSION_TIMEOUT_MS)


@pytest.fixture
async def kazoo(zookeeper: ZooKeeperServer) -> AsyncIterator[KazooClient]:
    """A plain kazoo client of the test, to write znodes as any registrant could."""
    client = KazooClient(hosts=zookeeper.connect)
    await trio.to_thread.run_sync(client.start)
    yield client
    await trio.to_thread.run_sync(client.stop)
    client.close()


def _runtime(zk: ZooKeeperConfig, *, local: bool = False) -> RouterRuntime:
    connectors = (Connector.from_url("here", "tcp://127.0.0.1:21001?nodeId=local-1"),)
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        local_connector="here" if local else None,
        pool=PoolConfig(
            kind=PoolKind.DISCOVERY, discovery_group="zk", check_period_ms=100, local_target_enabled=local
        ),
    )
    group = DiscoveryGroupConfig(name="zk", zookeeper=zk)
    config = Config(source="t.xml", connectors=connectors, routers=(router,), discovery_groups=(group,))
    return RouterRuntime(config, router, Metrics())


async def _always_ready(connector: Connector) -> tuple[bool, str]:
    return True, ""


def _ids(runtime: RouterRuntime) -> list[str]:
    assert runtime.pool is not None
    return [t.node_id for t in runtime.pool.targets]


def _ready(runtime: RouterRuntime) -> list[str]:
    assert runtime.pool is not None
    return [t.node_id for t in runtime.pool.ready_targets()]


async def _until(runtime: RouterRuntime, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(DEADLINE_S):
        await runtime.wait_until(predicate)


def _doc(node_id: str, port: int = 1883, **extra: object) -> bytes:
    return json.dumps({"node_id": node_id, "connector": f"tcp://127.0.0.1:{port}", **extra}).encode()


async def _create(kazoo: KazooClient, path: str, data: bytes, *, ephemeral: bool = True) -> None:
    await trio.to_thread.run_sync(lambda: kazoo.create(path, data, ephemeral=ephemeral, makepath=True))


async def _delete(kazoo: KazooClient, path: str) -> None:
    await trio.to_thread.run_sync(kazoo.delete, path)


class _OnLog(logging.Handler):
    """Sets a trio event when a record matches (records of trio tasks are emitted in trio's thread)."""

    def __init__(self, matches: Callable[[str], bool], event: trio.Event) -> None:
        super().__init__()
        self.matches, self.event = matches, event

    def emit(self, record: logging.LogRecord) -> None:
        if self.matches(record.getMessage()):
            self.event.set()


class TestServeDiscovery:
    async def test_serve_discovery_members_join_are_probed_and_leave(
        self, zk_config: ZooKeeperConfig, kazoo: KazooClient, path: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: the path does not exist at start; two members register; one leaves; a member
        re-registers with another address (an update); the metrics follow."""
        caplog.set_level(logging.INFO)
        runtime = _runtime(zk_config)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve_health_checks(runtime, check=_always_ready, task_status=task_status)
            )
            await nursery.start(serve_discovery, runtime, zk_config)
            await _create(kazoo, f"{path}/b1", _doc("b1", 1001))
            await _until(runtime, lambda: _ready(runtime) == ["b1"])
            await _create(kazoo, f"{path}/b2", _doc("b2", 1002, backup="tcp://127.0.0.1:2002"))
            await _until(runtime, lambda: _ready(runtime) == ["b1", "b2"])
            assert runtime.pool is not None
            b2 = runtime.pool.target("b2")
            assert b2 is not None
            assert b2.connector is not None
            assert b2.connector.display_url == "(tcp://127.0.0.1:1002,tcp://127.0.0.1:2002)"
            exposition = runtime.metrics.exposition().decode()
            assert 'router_target_ready{node_id="b1",router="r"} 1.0' in exposition

            await _delete(kazoo, f"{path}/b1")
            await _until(runtime, lambda: _ids(runtime) == ["b2"])
            assert 'node_id="b1"' not in runtime.metrics.exposition().decode()

            await trio.to_thread.run_sync(kazoo.set, f"{path}/b2", _doc("b2", 1003))
            await _until(runtime, lambda: runtime.pool is not None and runtime.pool.target("b2") != b2)
            await _until(runtime, lambda: _ready(runtime) == ["b2"])
            nursery.cancel_scope.cancel()
        messages = [r.getMessage() for r in caplog.records]
        assert any("does not exist: no members until it is created" in m for m in messages)
        assert any("target=b1 left the pool (it was ready)" in m for m in messages)
        assert any(
            "target=b2 re-registered: (tcp://127.0.0.1:1002,tcp://127.0.0.1:2002) -> tcp://127.0.0.1:1003"
            in m
            for m in messages
        )

    async def test_serve_discovery_malformed_member_is_logged_once_and_ignored(
        self, zk_config: ZooKeeperConfig, kazoo: KazooClient, path: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        runtime = _runtime(zk_config, local=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve_health_checks(runtime, check=_always_ready, task_status=task_status)
            )
            await _create(kazoo, f"{path}/junk", b"not json")
            await _create(kazoo, f"{path}/clash", _doc("local-1"))
            await nursery.start(serve_discovery, runtime, zk_config)
            await _create(kazoo, f"{path}/b1", _doc("b1"))
            await _until(runtime, lambda: _ids(runtime) == ["local-1", "b1"])
            await _create(kazoo, f"{path}/b2", _doc("b2"))  # another reading: no new warnings
            await _until(runtime, lambda: _ids(runtime) == ["local-1", "b1", "b2"])
            nursery.cancel_scope.cancel()
        warnings = [r.getMessage() for r in caplog.records if "ignoring this member" in r.getMessage()]
        assert len(warnings) == 2
        assert any("/junk: ignoring this member: document is not a JSON object" in w for w in warnings)
        assert any(
            "/clash: ignoring this member: node id 'local-1' is already in the pool (the local target)" in w
            for w in warnings
        )

    async def test_serve_discovery_session_expiry_reads_the_members_again(
        self,
        zookeeper: ZooKeeperServer,
        zk_config: ZooKeeperConfig,
        kazoo: KazooClient,
        path: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Scenario: the router's session is expired (another client takes it over and closes it);
        it keeps its members, logs the loss once, and a new session reads what changed."""
        caplog.set_level(logging.INFO)
        runtime = _runtime(zk_config)
        client = ZooKeeper(zk_config.connect, zk_config.session_timeout_ms)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve_health_checks(runtime, check=_always_ready, task_status=task_status)
            )
            await _create(kazoo, f"{path}/b1", _doc("b1"))
            await nursery.start(
                lambda task_status: serve_discovery(
                    runtime, zk_config, client=client, task_status=task_status
                )
            )
            await _until(runtime, lambda: _ids(runtime) == ["b1"])
            session_id, password = client.session
            thief = KazooClient(hosts=zookeeper.connect, client_id=(session_id, password))
            await trio.to_thread.run_sync(thief.start)
            await _delete(kazoo, f"{path}/b1")
            await _create(kazoo, f"{path}/b2", _doc("b2"))
            await trio.to_thread.run_sync(thief.stop)  # closes the router's session: LOST
            thief.close()
            await _until(runtime, lambda: _ids(runtime) == ["b2"])
            assert client.session_id not in (0, session_id)
            nursery.cancel_scope.cancel()
        messages = [r.getMessage() for r in caplog.records]
        assert sum("expired or closed: keeping the last 1 member(s)" in m for m in messages) == 1
        assert any("reading the members again" in m for m in messages)

    async def test_serve_discovery_unreachable_zookeeper_warns_once(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        zk = ZooKeeperConfig(connect=f"127.0.0.1:{free_port()}", path="/nobody", session_timeout_ms=300)
        runtime = _runtime(zk)
        with trio.move_on_after(1.5):
            await serve_discovery(runtime, zk)
        messages = [r.getMessage() for r in caplog.records]
        assert sum("does not answer: no discovered targets until it does" in m for m in messages) == 1
        assert _ids(runtime) == []
        assert not any(
            r.levelno >= logging.WARNING and r.name.startswith("router.discovery.kazoo")
            for r in caplog.records
        )


class TestServeRegistration:
    async def test_serve_registration_creates_then_deletes_on_cancel(
        self, zk_config: ZooKeeperConfig, kazoo: KazooClient, path: str
    ) -> None:
        member = Member.from_fields(node_id="b/1", connector="tcp://127.0.0.1:1883?probe=mqtt", weight=3)
        async with trio.open_nursery() as nursery:
            znode = await nursery.start(
                lambda task_status: serve_registration(
                    zk_config, member, connect_timeout_s=DEADLINE_S, task_status=task_status
                )
            )
            assert znode == f"{path}/b%2F1"
            data, stat = await trio.to_thread.run_sync(kazoo.get, znode)
            assert stat.ephemeralOwner != 0
            assert json.loads(data) == {
                "node_id": "b/1",
                "connector": "tcp://127.0.0.1:1883?probe=mqtt",
                "weight": 3,
            }
            nursery.cancel_scope.cancel()
        assert await trio.to_thread.run_sync(kazoo.exists, znode) is None

    async def test_serve_registration_duplicate_node_id_is_an_error(
        self, zk_config: ZooKeeperConfig, kazoo: KazooClient, path: str
    ) -> None:
        await _create(kazoo, f"{path}/b1", _doc("b1"))
        with pytest.raises(RegistrationError, match=r"node id 'b1' is registered already: .*/b1 exists"):
            await serve_registration(
                zk_config,
                Member.from_fields(node_id="b1", connector="tcp://h:1"),
                connect_timeout_s=DEADLINE_S,
            )
        assert await trio.to_thread.run_sync(kazoo.exists, f"{path}/b1") is not None  # not ours: kept

    async def test_serve_registration_unreachable_zookeeper_is_an_error(self) -> None:
        zk = ZooKeeperConfig(connect=f"127.0.0.1:{free_port()}", path="/x")
        with (
            trio.fail_after(DEADLINE_S),
            pytest.raises(RegistrationError, match=r"cannot reach zookeeper 127\.0\.0\.1:\d+ within 0\.5 s"),
        ):
            await serve_registration(
                zk, Member.from_fields(node_id="b1", connector="tcp://h:1"), connect_timeout_s=0.5
            )

    async def test_serve_registration_registers_again_after_session_expiry(
        self,
        zookeeper: ZooKeeperServer,
        zk_config: ZooKeeperConfig,
        kazoo: KazooClient,
        path: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Scenario: another client takes the registrant's session over and closes it (as an
        expiry would); the registrant creates its znode again in a new session."""
        caplog.set_level(logging.INFO, logger="router.discovery")
        registered_again = trio.Event()
        handler = _OnLog(
            lambda message: message.startswith("registered") and message.endswith(" again"), registered_again
        )
        client = ZooKeeper(zk_config.connect, zk_config.session_timeout_ms)
        member = Member.from_fields(node_id="b1", connector="tcp://h:1")
        logging.getLogger("router.discovery").addHandler(handler)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: serve_registration(
                        zk_config,
                        member,
                        connect_timeout_s=DEADLINE_S,
                        client=client,
                        task_status=task_status,
                    )
                )
                first = client.session_id
                thief = KazooClient(hosts=zookeeper.connect, client_id=client.session)
                await trio.to_thread.run_sync(thief.start)
                await trio.to_thread.run_sync(thief.stop)  # closes the registrant's session
                thief.close()
                with trio.fail_after(DEADLINE_S):
                    await registered_again.wait()
                _data, stat = await trio.to_thread.run_sync(kazoo.get, f"{path}/b1")
                assert stat.ephemeralOwner == client.session_id != first
                nursery.cancel_scope.cancel()
        finally:
            logging.getLogger("router.discovery").removeHandler(handler)


class TestZooKeeper:
    async def test_zookeeper_create_read_delete(self, zk_config: ZooKeeperConfig, path: str) -> None:
        client = ZooKeeper(zk_config.connect, zk_config.session_timeout_ms)
        states: list[Session] = []
        connected = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def on_session(state: Session) -> None:  # in kazoo's thread
            states.append(state)
            if state is Session.CONNECTED:
                token.run_sync_soon(connected.set)

        client.on_session(on_session)
        client.start()
        try:
            with trio.fail_after(DEADLINE_S):
                await connected.wait()
            assert await trio.to_thread.run_sync(client.read_children, path) is None
            await trio.to_thread.run_sync(client.create_ephemeral, f"{path}/a", b"1")
            with pytest.raises(NodeExistsError):
                await trio.to_thread.run_sync(client.create_ephemeral, f"{path}/a", b"2")
            assert await trio.to_thread.run_sync(client.read_children, path) == {"a": b"1"}
            with pytest.raises(ZooKeeperError, match=f"create {path}/a/b: NoChildrenForEphemeralsError"):
                await trio.to_thread.run_sync(client.create_ephemeral, f"{path}/a/b", b"")
            assert await trio.to_thread.run_sync(client.delete_own, f"{path}/a") is True
            assert await trio.to_thread.run_sync(client.delete_own, f"{path}/a") is False
        finally:
            await trio.to_thread.run_sync(client.close)
        assert states[-1] is Session.LOST


def test_member_target_is_what_discovery_adds() -> None:
    member = Member.from_fields(node_id="b1", connector="tcp://127.0.0.1:1", backup="tcp://127.0.0.1:2")
    assert member.target() == Target(
        node_id="b1", connector=Connector(name="b1", host="127.0.0.1", port=1, backups=(("127.0.0.1", 2),))
    )
