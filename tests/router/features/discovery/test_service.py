"""ZooKeeper discovery and registration in-process: the logic on trio's virtual clock with a fake
ZooKeeper, the real client against a real ZooKeeper (no mocks).

`TestServeDiscoveryScenarios` plays ZooKeeper with `FakeZooKeeper` (the `DiscoveryClient`
interface without kazoo's threads) and asserts every log line with the virtual time it was
logged at. The other tests use their own path under the session's ZooKeeper; their probes are a
fake `check` (every target is ready), so what is tested is membership: znodes in, pool targets
out. kazoo runs real threads, so those run on trio's real clock and wait on pool state with a
deadline.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio
from kazoo.client import KazooClient

from policies import PolicyConfig
from pools import Connector, Member, PoolConfig, PoolKind, Target, TargetState
from router.config.settings import Config, DiscoveryGroupConfig, RouterConfig, ZooKeeperConfig
from router.core.zookeeper_link import LinkState
from router.features.discovery.service import RegistrationError, serve_discovery, serve_registration
from router.features.probes.service import serve_health_checks
from router.metrics import Metrics
from router.runtime import RouterRuntime
from router.services.zookeeper import Session, ZooKeeper, ZooKeeperError
from tests.conftest import free_port

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from tests.router.conftest import ZooKeeperServer

DEADLINE_S = 15.0
SESSION_TIMEOUT_MS = 2000

FAKE_ZK = ZooKeeperConfig(connect="zk.example:2181", path="/routers/r", session_timeout_ms=4000)
"""The discovery group of the scenarios on the virtual clock: 4 s to answer at start."""
WHERE = "zookeeper zk.example:2181/routers/r"


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
    return [t.node_id for t in runtime.pool.targets()]


def _ready(runtime: RouterRuntime) -> list[str]:
    return [
        t.node_id for t in runtime.pool.targets() if runtime.pool.target_state(t.node_id) is TargetState.READY
    ]


async def _until(runtime: RouterRuntime, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(DEADLINE_S):
        await runtime.pool.wait_until(predicate)


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
            missing = trio.Event()  # the first reading comes before any member registers
            on_missing = _OnLog(lambda m: "does not exist: no members until it is created" in m, missing)
            logging.getLogger("router.discovery").addHandler(on_missing)
            try:
                await nursery.start(serve_discovery, runtime, zk_config)
                with trio.fail_after(DEADLINE_S):
                    await missing.wait()
            finally:
                logging.getLogger("router.discovery").removeHandler(on_missing)
            await _create(kazoo, f"{path}/b1", _doc("b1", 1001))
            await _until(runtime, lambda: _ready(runtime) == ["b1"])
            await _create(kazoo, f"{path}/b2", _doc("b2", 1002, backup="tcp://127.0.0.1:2002"))
            await _until(runtime, lambda: _ready(runtime) == ["b1", "b2"])
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
            await _until(runtime, lambda: runtime.pool.target("b2") != b2)
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


class FakeZooKeeper:
    """A ZooKeeper ensemble and its client in one, played by the test: the `DiscoveryClient`
    interface without kazoo's threads, so `serve_discovery` runs on trio's virtual clock.

    As in ZooKeeper, a reading sets a watch when it starts (so also when it then fails on a child)
    that fires once, at the next change of the members, and that goes with the session; reading
    while not connected fails with ConnectionLoss.
    """

    def __init__(self, *, read_s: float = 0.0, members: dict[str, bytes] | None = None) -> None:
        self.read_s = read_s
        """How long each reading takes (virtual seconds)."""
        self.members = members
        """The children of the path and their data; None while the path does not exist."""
        self.failure: str | None = None
        """While set, a connected reading fails with this kazoo exception name."""
        self.reads: list[float] = []
        """When each reading started."""
        self.started = self.closed = self._connected = self._watching = False
        self.frozen = False
        """While set, heartbeats wait (a SIGSTOPped server: the connection stays up)."""
        self.held: list[Callable[[bool], None]] = []
        self._on_session: Callable[[Session], None] | None = None
        self._on_change: Callable[[], None] | None = None

    def on_session(self, callback: Callable[[Session], None]) -> None:
        self._on_session = callback

    def on_change(self, callback: Callable[[], None]) -> None:
        self._on_change = callback

    def start(self) -> None:
        self.started = True

    def heartbeat(self, path: str, callback: Callable[[bool], None]) -> None:
        """Answered at once while connected and not frozen; held while frozen; failed when not connected."""
        if not self._connected:
            callback(False)
        elif self.frozen:
            self.held.append(callback)
        else:
            callback(True)

    def thaw(self) -> None:
        """The frozen server goes on: it answers what it held."""
        self.frozen = False
        held, self.held = self.held, []
        for callback in held:
            callback(True)

    async def read_members(self, path: str) -> dict[str, bytes] | None:
        # What the reading finds is decided when it starts; its answer comes `read_s` later.
        self.reads.append(trio.current_time())
        connected, failure = self._connected, self.failure
        members = None if self.members is None else dict(self.members)
        self._watching = self._watching or connected
        await trio.sleep(self.read_s)
        if not connected:
            raise ZooKeeperError(f"read {path}: ConnectionLoss")
        if failure is not None:
            raise ZooKeeperError(f"read {path}: {failure}")
        return members

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True

    def report(self, session: Session) -> None:
        """The client's session changes (as kazoo would call the listener)."""
        assert self._on_session is not None, "serve_discovery registers first"
        self._connected = session is Session.CONNECTED
        if session is Session.LOST:
            self._watching = False
        if not self._connected:  # kazoo fails the requests of a dropped connection
            held, self.held = self.held, []
            for callback in held:
                callback(False)
        self._on_session(session)

    def change(self, members: dict[str, bytes] | None) -> None:
        """Someone changes the members (None: deletes the path); a set watch fires."""
        self.members = members
        if self._watching:
            assert self._on_change is not None, "serve_discovery registers first"
            self._watching = False
            self._on_change()


class _TimedLog(logging.Handler):
    """The lines of the `router.discovery` logger, each with the virtual time it was logged at."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "router.discovery":  # not kazoo's, logged in its threads
            self.lines.append((trio.current_time(), record.levelname, record.getMessage()))


@pytest.fixture
def discovery_log() -> Iterator[_TimedLog]:
    logger = logging.getLogger("router.discovery")
    handler, level = _TimedLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _zk_state(runtime: RouterRuntime) -> LinkState:
    """The discovery session's state as status shows it (a call: mypy does not narrow it)."""
    return runtime.held().zookeeper["discovery"].state


async def _start(nursery: trio.Nursery, runtime: RouterRuntime, fake: FakeZooKeeper) -> None:
    await nursery.start(partial(serve_discovery, runtime, FAKE_ZK, client=fake))


DISCOVERING = (0.0, "INFO", f"router=r discovering members at {WHERE}")
"""The first line of every scenario."""


class TestServeDiscoveryScenarios:
    """serve_discovery on trio's virtual clock, with `FakeZooKeeper` (the scenarios start at 0 s)."""

    async def test_serve_discovery_warns_once_when_zookeeper_never_answers(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        fake = FakeZooKeeper()
        runtime = _runtime(FAKE_ZK)
        with trio.move_on_after(60):
            await serve_discovery(runtime, FAKE_ZK, client=fake)
        assert trio.current_time() == 60.0
        assert discovery_log.lines == [
            DISCOVERING,
            (4.0, "WARNING", f"router=r {WHERE} does not answer: no discovered targets until it does"),
        ]
        assert (fake.started, fake.reads, fake.closed, _ids(runtime)) == (True, [], True, [])

    async def test_serve_discovery_late_answer_reads_the_members(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        """Scenario: ZooKeeper answers 10 s after the start, after the warning at 4 s."""
        fake = FakeZooKeeper(members={"b1": _doc("b1")})
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            await trio.sleep(10)
            fake.report(Session.CONNECTED)
            await trio.sleep(50)
            nursery.cancel_scope.cancel()
        assert discovery_log.lines == [
            DISCOVERING,
            (4.0, "WARNING", f"router=r {WHERE} does not answer: no discovered targets until it does"),
            (10.0, "INFO", f"router=r connected to {WHERE}: reading the members"),
        ]
        assert (fake.reads, _ids(runtime)) == ([10.0], ["b1"])

    async def test_serve_discovery_answer_within_the_session_timeout_gives_no_warning(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        fake = FakeZooKeeper(members={})
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            await trio.sleep(3.5)
            fake.report(Session.CONNECTED)
            await trio.sleep(3.7)  # past the session timeout
            fake.report(Session.SUSPENDED)  # and never back
            await trio.sleep(60)
            nursery.cancel_scope.cancel()
        assert [(t, message) for t, _, message in discovery_log.lines] == [
            DISCOVERING[::2],
            (3.5, f"router=r connected to {WHERE}: reading the members"),
            (
                7.2,
                f"router=r lost the connection to {WHERE}: keeping the last 0 member(s) and probing "
                "them until it is back",
            ),
            # Nothing heard since the last heartbeat's answer (7.0) for the session timeout (4 s).
            (
                11.0,
                f"router=r nothing heard from {WHERE} (discovery) for the session timeout (4 s): "
                "counting the session as lost",
            ),
            (
                11.0,
                f"router=r session with {WHERE} expired or closed: keeping the last 0 member(s) until "
                "a new session reads them again",
            ),
        ]
        assert fake.reads == [3.5]

    async def test_serve_discovery_suspended_keeps_members_then_reads_again(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        """Scenario: a member joins while connected (a watch); the connection drops and a member
        leaves meanwhile (its watch event changes nothing while disconnected); back at 5 s, the
        router reads again and applies what changed."""
        fake = FakeZooKeeper(members={"b1": _doc("b1")})
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            fake.change({"b1": _doc("b1"), "b2": _doc("b2", 1884)})
            await trio.sleep(1)
            assert _ids(runtime) == ["b1", "b2"]
            fake.report(Session.SUSPENDED)
            await trio.sleep(1)
            fake.change({"b2": _doc("b2", 1884)})
            await trio.sleep(2)
            assert _ids(runtime) == ["b1", "b2"]  # kept while suspended
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        assert discovery_log.lines == [
            DISCOVERING,
            (0.0, "INFO", f"router=r connected to {WHERE}: reading the members"),
            (
                2.0,
                "WARNING",
                f"router=r lost the connection to {WHERE}: keeping the last 2 member(s) and probing "
                "them until it is back",
            ),
            (5.0, "INFO", f"router=r connected to {WHERE}: reading the members again"),
        ]
        assert (fake.reads, _ids(runtime)) == ([0.0, 1.0, 5.0], ["b2"])

    async def test_serve_discovery_frozen_server_is_suspended_then_answers_again(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        """Scenario: kazoo stays CONNECTED but the server stops answering at 1.2 s (SIGSTOP): the
        heartbeat asked at 1.5 s is unanswered at 3.5 s (the answer timeout, 2 s): suspended, said
        once, in status and metrics; the server goes on at 4.5 s: connected, and the members are read
        again."""
        fake = FakeZooKeeper(members={"b1": _doc("b1")})
        runtime = _runtime(FAKE_ZK)
        metrics = runtime.metrics
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            assert _zk_state(runtime) is LinkState.CONNECTING
            fake.report(Session.CONNECTED)
            await trio.sleep(1.2)
            fake.frozen = True
            await trio.sleep(2.2)
            assert _zk_state(runtime) is LinkState.CONNECTED
            await trio.sleep(0.1)
            assert _zk_state(runtime) is LinkState.SUSPENDED
            assert metrics.zookeeper_state.value(("r", "discovery", "suspended")) == 1.0
            assert metrics.zookeeper_state.value(("r", "discovery", "connected")) == 0.0
            await trio.sleep(1.0)  # lost at 5 s: the session timeout (4 s) after the last answer
            fake.thaw()
            await trio.sleep(0.1)
            assert _zk_state(runtime) is LinkState.CONNECTED
            assert metrics.zookeeper_state.value(("r", "discovery", "connected")) == 1.0
            nursery.cancel_scope.cancel()
        assert "discovery" not in runtime.held().zookeeper  # gone with the task
        assert metrics.zookeeper_state.label_sets() == []
        assert [(t, message) for t, _, message in discovery_log.lines] == [
            DISCOVERING[::2],
            (0.0, f"router=r connected to {WHERE}: reading the members"),
            (
                3.5,
                f"router=r {WHERE} (discovery) does not answer within 2 s: counting the session as suspended",
            ),
            (
                3.5,
                f"router=r lost the connection to {WHERE}: keeping the last 1 member(s) and probing "
                "them until it is back",
            ),
            (4.5, f"router=r {WHERE} (discovery) answers again"),
            (4.5, f"router=r connected to {WHERE}: reading the members again"),
        ]
        assert fake.reads == [0.0, 4.5]

    async def test_serve_discovery_watches_fired_by_a_dropped_connection_start_no_reading(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        """Scenario: as kazoo does, the connection drops (SUSPENDED) and every watch fires right
        after: the table hears of the suspension first, so no reading starts (it would wait for a
        connection that is gone, and hold the loop)."""
        fake = FakeZooKeeper(members={"b1": _doc("b1")})
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            fake.report(Session.SUSPENDED)
            assert fake._on_change is not None
            fake._on_change()  # kazoo's _reset_watchers, after the listener
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        assert fake.reads == [0.0]

    async def test_serve_discovery_lost_session_reads_again_in_a_new_session(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        fake = FakeZooKeeper(members={"b1": _doc("b1")})
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            fake.report(Session.CONNECTED)
            await trio.sleep(2)
            fake.report(Session.SUSPENDED)
            await trio.sleep(3)  # within the session timeout (4 s) of the last answer: kazoo says so
            fake.report(Session.LOST)
            await trio.sleep(1)
            fake.change({"b1": _doc("b1"), "b2": _doc("b2", 1884)})  # no watch: it went with the session
            await trio.sleep(1)
            assert (fake.reads, _ids(runtime)) == ([0.0], ["b1"])
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        assert discovery_log.lines == [
            DISCOVERING,
            (0.0, "INFO", f"router=r connected to {WHERE}: reading the members"),
            (
                2.0,
                "WARNING",
                f"router=r lost the connection to {WHERE}: keeping the last 1 member(s) and probing "
                "them until it is back",
            ),
            (
                5.0,
                "WARNING",
                f"router=r session with {WHERE} expired or closed: keeping the last 1 member(s) until a "
                "new session reads them again",
            ),
            (7.0, "INFO", f"router=r connected to {WHERE}: reading the members again"),
        ]
        assert (fake.reads, _ids(runtime)) == ([0.0, 7.0], ["b1", "b2"])

    async def test_serve_discovery_path_missing_until_created(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        """Scenario: the path is missing at start, created empty at 1 s, gains a member at 2 s, is
        deleted at 3 s, and is still missing for a new session at 4 s: one warning per time it goes
        missing."""
        fake = FakeZooKeeper()
        runtime = _runtime(FAKE_ZK)
        missing = (f"router=r {WHERE} does not exist: no members until it is created",)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            fake.change({})
            await trio.sleep(1)
            fake.change({"b1": _doc("b1")})
            await trio.sleep(1)
            assert _ids(runtime) == ["b1"]
            fake.change(None)
            await trio.sleep(1)
            fake.report(Session.LOST)
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        assert discovery_log.lines == [
            DISCOVERING,
            (0.0, "INFO", f"router=r connected to {WHERE}: reading the members"),
            (0.0, "WARNING", *missing),
            (3.0, "WARNING", *missing),
            (
                4.0,
                "WARNING",
                f"router=r session with {WHERE} expired or closed: keeping the last 0 member(s) until a "
                "new session reads them again",
            ),
            (4.0, "INFO", f"router=r connected to {WHERE}: reading the members again"),
        ]
        assert (fake.reads, _ids(runtime)) == ([0.0, 1.0, 2.0, 3.0, 4.0], [])

    async def test_serve_discovery_read_failure_is_logged_once_and_retried_on_the_next_watch(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        """Scenario: readings fail at 0 and 1 s (one warning), work at 2 s, fail again at 3 s (a
        warning again: a reading worked in between)."""
        fake = FakeZooKeeper()
        fake.members, fake.failure = {"b1": _doc("b1")}, "OperationTimeoutError"
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            fake.report(Session.CONNECTED)
            await trio.sleep(1)
            fake.change({"b1": _doc("b1"), "b2": _doc("b2", 1884)})
            await trio.sleep(1)
            assert _ids(runtime) == []
            fake.failure = None
            fake.change({"b2": _doc("b2", 1884)})
            await trio.sleep(1)
            assert _ids(runtime) == ["b2"]
            fake.failure = "OperationTimeoutError"
            fake.change({})
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
        cannot_read = f"router=r cannot read the members at {WHERE}: read /routers/r: OperationTimeoutError"
        assert discovery_log.lines == [
            DISCOVERING,
            (0.0, "INFO", f"router=r connected to {WHERE}: reading the members"),
            (0.0, "WARNING", cannot_read),
            (3.0, "WARNING", cannot_read),
        ]
        assert (fake.reads, _ids(runtime)) == ([0.0, 1.0, 2.0, 3.0], ["b2"])

    async def test_serve_discovery_watch_during_a_reading_makes_one_more_reading(
        self, autojump_clock: trio.testing.MockClock, discovery_log: _TimedLog
    ) -> None:
        """Scenario: readings take 0.5 s; the members change twice during the first one."""
        fake = FakeZooKeeper(read_s=0.5, members={"b1": _doc("b1")})
        runtime = _runtime(FAKE_ZK)
        async with trio.open_nursery() as nursery:
            await _start(nursery, runtime, fake)
            fake.report(Session.CONNECTED)
            fake.report(Session.CONNECTED)  # kazoo never repeats itself; the watch drops a repeat
            await trio.sleep(0.2)
            fake.change({"b1": _doc("b1"), "b2": _doc("b2", 1884)})  # the watch set at 0 s fires
            await trio.sleep(0.1)
            fake.change({"b1": _doc("b1"), "b2": _doc("b2", 1884), "b3": _doc("b3", 1885)})  # no watch
            with trio.fail_after(10):
                await runtime.pool.wait_until(lambda: len(_ids(runtime)) == 3)
            assert trio.current_time() == 1.0
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
        assert fake.reads == [0.0, 0.5]
        assert [(t, message) for t, _, message in discovery_log.lines] == [
            DISCOVERING[::2],
            (0.0, f"router=r connected to {WHERE}: reading the members"),
        ]


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


def test_member_target_is_what_discovery_adds() -> None:
    member = Member.from_fields(node_id="b1", connector="tcp://127.0.0.1:1", backup="tcp://127.0.0.1:2")
    assert member.target() == Target(
        node_id="b1", connector=Connector(name="b1", host="127.0.0.1", port=1, backups=(("127.0.0.1", 2),))
    )
