"""routerd end to end with a ZooKeeper discovery pool: real ZooKeeper, real mosquitto brokers, real
`routerctl register` processes, real paho clients.

Scenarios of issue 4, point 3: registered members become targets (status, admin API, routed
clients); a SIGTERM'd registration leaves at once, a SIGKILL'd one when its session expires; a
malformed member is ignored with one log line; while ZooKeeper is down the router keeps routing
with its last membership, and after ZooKeeper is back it sees what changed meanwhile.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest
from jsonschema import Draft202012Validator
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from router.config import load_config
from tests.conftest import LineLog
from tests.router.conftest import ROUTERCTL, ZooKeeperServer, mqtt_round_trip
from tests.router.services.test_admin_api import BASE_URI, REGISTRY
from tests.router.test_routerd_metrics import promtool_check_metrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.router.conftest import Mosquitto, Routerd

TIMEOUT_S = 15.0
SESSION_TIMEOUT_MS = 1000
"""Of the registrations: how long a SIGKILL'd member outlives its process (the test server allows
0.5 s to `ZOOKEEPER_MAX_SESSION_TIMEOUT_MS`)."""
LONG_SESSION_TIMEOUT_MS = 4000
"""Of a registration whose session must outlive a ZooKeeper stop, and expire in a bounded time
after the restart: a restarted server gives each session its full timeout again."""
STAYING_SESSION_TIMEOUT_MS = 20_000
"""Of a registration that must stay across a ZooKeeper restart: its client must reconnect within
the timeout the restarted server gives it (it retries every second at most); 4 s was once not
enough on a loaded machine."""
ROUTER_SESSION_TIMEOUT_MS = 2000


def _config(
    zookeeper: ZooKeeperServer,
    path: str,
    port: int,
    *,
    session_timeout_ms: int = ROUTER_SESSION_TIMEOUT_MS,
    shared_cache: bool = False,
) -> str:
    """A discovery pool at `path`, and with `shared_cache` a shared cache at `path`-cache (both
    with `session_timeout_ms` and the default answer timeout)."""
    attributes = f'connect="{zookeeper.connect}" session-timeout="{session_timeout_ms}"'
    cache = f'<cache><timeout>600000</timeout><zookeeper {attributes} path="{path}-cache"/></cache>'
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <acceptors>
   <acceptor name="mqtt">tcp://127.0.0.1:{port}?router=fleet;protocols=MQTT;mode=proxy</acceptor>
  </acceptors>
  <discovery-groups>
   <discovery-group name="zk"><zookeeper {attributes} path="{path}"/></discovery-group>
  </discovery-groups>
  <connection-routers>
   <connection-router name="fleet">
    <key-type>CLIENT_ID</key-type>{cache if shared_cache else ""}
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>200</check-period><quorum-timeout>0</quorum-timeout>
     <discovery-group-ref discovery-group-name="zk"/></pool>
   </connection-router>
  </connection-routers>
 </core>
</configuration>
"""


class Registrant:
    """A real `routerctl register` process with its stderr read line by line."""

    def __init__(
        self, zookeeper: ZooKeeperServer, path: str, node_id: str, broker: Mosquitto, session_timeout_ms: int
    ) -> None:
        self.node_id = node_id
        self.proc = subprocess.Popen(
            [
                *ROUTERCTL,
                "register",
                "--zookeeper",
                zookeeper.connect,
                "--path",
                path,
                "--node-id",
                node_id,
                "--connector",
                f"tcp://127.0.0.1:{broker.port}?probe=mqtt",
                "--session-timeout",
                str(session_timeout_ms),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stderr is not None
        self._log = LineLog(self.proc.stderr, f"routerctl register {node_id}")

    @property
    def lines(self) -> list[str]:
        """Its stderr lines so far."""
        return self._log.lines

    def wait_for(self, pattern: str, timeout: float = TIMEOUT_S) -> str:
        """Wait for a stderr line matching `pattern` (searching every line so far)."""
        return self._log.search(pattern, timeout)[0].string

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        status = self.proc.wait(TIMEOUT_S)
        self._log.close(TIMEOUT_S)
        return status


@pytest.fixture
def register(zookeeper: ZooKeeperServer) -> Iterator[Callable[..., Registrant]]:
    """Start `routerctl register` processes (waiting until registered); stopped afterwards."""
    started: list[Registrant] = []

    def start(
        path: str,
        node_id: str,
        broker: Mosquitto,
        server: ZooKeeperServer = zookeeper,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> Registrant:
        registrant = Registrant(server, path, node_id, broker, session_timeout_ms)
        started.append(registrant)
        registrant.wait_for(rf"registered node id '{node_id}' as {path}/{node_id}")
        return registrant

    yield start
    for registrant in started:
        registrant.stop(signal.SIGKILL)


def _round_trip(port: int, client_id: str) -> bool:
    """Connect through the router, subscribe, publish, and receive our own message."""
    return mqtt_round_trip(port, client_id=client_id, topic=f"zk/{client_id}", timeout=TIMEOUT_S)


def _routed_to(router: Routerd, port: int, node_id: str) -> None:
    """A real MQTT client through the router lands on `node_id` (the router's log says where)."""
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    assert _round_trip(port, client_id), f"no MQTT round trip through the router for {client_id}"
    router.wait_for_log(rf"key={client_id} target={node_id} outcome=OK")


def _routerctl_status(router: Routerd, *args: str) -> str:
    """`routerctl status --admin ADMIN ARGS` (a real process): what it prints."""
    return subprocess.run(
        [*ROUTERCTL, "status", "--admin", router.admin, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def _status_targets(router: Routerd) -> dict[str, dict[str, object]]:
    """`routerctl status` (a real process) -> the pool's targets by node id."""
    out = _routerctl_status(router, "--json", "fleet")
    return {t["node_id"]: t for t in json.loads(out)["pool"]["targets"]}


@contextmanager
def _kazoo(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client of the test (to write znodes that routerctl would never write)."""
    client = KazooClient(hosts=zookeeper.connect)
    client.start(timeout=TIMEOUT_S)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def path(request: pytest.FixtureRequest) -> str:
    """A members path of this test alone (the session's ZooKeeper is shared)."""
    return f"/connection-router/{request.node.name}"


@pytest.mark.integration
def test_routerd_zookeeper_members_come_and_go(
    zookeeper: ZooKeeperServer,
    path: str,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    register: Callable[..., Registrant],
    free_port: Callable[[], int],
) -> None:
    """Scenario: b0 and b1 register; both become targets and clients reach them; a malformed member
    is ignored once; b0's registrant is SIGKILL'd (gone after its session timeout), b1's SIGTERM'd
    (gone at once, exit status 0)."""
    port = free_port()
    router = start_routerd(lambda _admin: _config(zookeeper, path, port))
    router.wait_for_log(
        rf"router=fleet connected to zookeeper {zookeeper.connect}{path}: reading the members"
    )
    router.wait_for_log(rf"zookeeper {zookeeper.connect}{path} does not exist", consume=False)

    b0 = register(path, "b0", mosquitto_fleet[0])
    router.wait_for_log(r"router=fleet target=b0 joined the pool \(tcp://127\.0\.0\.1:\d+\)")
    router.wait_for_log(r"router=fleet target=b0 is ready")
    _routed_to(router, port, "b0")  # FIRST_ELEMENT: b0 arrived first
    b1 = register(path, "b1", mosquitto_fleet[1])
    router.wait_for_log(r"router=fleet target=b1 is ready")
    targets = _status_targets(router)
    assert sorted(targets) == ["b0", "b1"]
    assert targets["b1"]["connector"] == f"tcp://127.0.0.1:{mosquitto_fleet[1].port}"
    assert {t["state"] for t in targets.values()} == {"ready"}
    lookup = router.get("/api/v1/routers/fleet/target?key=anyone")
    assert isinstance(lookup, dict)
    assert lookup["node_id"] == "b0"

    # A malformed member: logged once, ignored, the router carries on.
    with _kazoo(zookeeper) as zk:
        zk.create(f"{path}/junk", b'{"node_id": "junk"}', ephemeral=True)
        router.wait_for_log(
            r"router=fleet zookeeper \S+/junk: ignoring this member: connector must be a string"
        )
        zk.create(f"{path}/b0-twin", b'{"node_id": "b0", "connector": "tcp://127.0.0.1:1"}', ephemeral=True)
        router.wait_for_log(
            r"/b0-twin: ignoring this member: node id 'b0' is already registered by znode 'b0'"
        )
    assert sorted(_status_targets(router)) == ["b0", "b1"]
    assert sum("ignoring this member" in line for line in router.lines) == 2

    killed_at = time.monotonic()
    assert b0.stop(signal.SIGKILL) == -signal.SIGKILL
    router.wait_for_log(r"router=fleet target=b0 left the pool \(it was ready\)")
    assert time.monotonic() - killed_at >= SESSION_TIMEOUT_MS / 1000 * 0.5  # by session expiry
    _routed_to(router, port, "b1")
    metrics = router.metrics()
    assert 'router_target_ready{node_id="b1",router="fleet"} 1.0' in metrics
    assert 'node_id="b0"' not in metrics.split("router_proxied_connections")[0]

    stopped_at = time.monotonic()
    assert b1.stop(signal.SIGTERM) == 0
    assert any("deregistered node id 'b1'" in line for line in b1.lines)
    router.wait_for_log(r"router=fleet target=b1 left the pool")
    assert time.monotonic() - stopped_at < SESSION_TIMEOUT_MS / 1000  # deleted, not expired
    router.wait_for_log(r"router=fleet pool is inactive \(0/1 ready\)", consume=False)
    assert _status_targets(router) == {}
    assert not _round_trip(port, "nobody")


@pytest.mark.integration
def test_routerd_zookeeper_down_keeps_membership_then_resynchronises(
    own_zookeeper: ZooKeeperServer,
    path: str,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    register: Callable[..., Registrant],
    free_port: Callable[[], int],
) -> None:
    """Scenario: b0 and b1 registered; ZooKeeper stops; the router keeps both and routes; b1's
    registrant dies meanwhile; ZooKeeper starts again; the router re-reads: b1 goes when its
    session expires, b2 registered after the restart joins, b0 stays."""
    port = free_port()
    router = start_routerd(lambda _admin: _config(own_zookeeper, path, port))
    b0 = register(path, "b0", mosquitto_fleet[0], own_zookeeper, STAYING_SESSION_TIMEOUT_MS)
    b1 = register(path, "b1", mosquitto_fleet[1], own_zookeeper, LONG_SESSION_TIMEOUT_MS)
    router.wait_for_log(r"router=fleet target=b0 is ready", consume=False)
    router.wait_for_log(r"router=fleet target=b1 is ready", consume=False)

    own_zookeeper.stop()
    router.wait_for_log(r"router=fleet lost the connection to zookeeper \S+: keeping the last 2 member\(s\)")
    b0.wait_for(r"lost the connection to zookeeper")  # and keeps trying
    assert sorted(_status_targets(router)) == ["b0", "b1"]
    _routed_to(router, port, "b0")
    assert b1.stop(signal.SIGKILL) == -signal.SIGKILL  # its session expires once ZooKeeper is back

    own_zookeeper.start()
    router.wait_for_log(r"router=fleet connected to zookeeper \S+: reading the members again")
    register(path, "b2", mosquitto_fleet[2], own_zookeeper)
    router.wait_for_log(r"router=fleet target=b2 is ready", consume=False)
    router.wait_for_log(r"router=fleet target=b1 left the pool", timeout=LONG_SESSION_TIMEOUT_MS / 1000 + 20)
    assert sorted(_status_targets(router)) == ["b0", "b2"]
    assert not any("target=b0 left the pool" in line for line in router.lines)
    _routed_to(router, port, "b0")  # still first in pool order: it never left
    assert sum("lost the connection to zookeeper" in line for line in router.lines) == 1
    assert router.stop() == 0


FROZEN_SESSION_TIMEOUT_MS = 12_000
"""Of the router's sessions when its ZooKeeper is frozen: kazoo alone would notice an idle frozen
server after about two thirds of it (8 s), and never while requests keep coming."""
SUSPENDED_WITHIN_S = 4.5
"""The default answer timeout (2 s) and a quarter of it to ask, and a margin for a loaded machine
(well below kazoo's own 8 s)."""


def _zookeeper_states(router: Routerd) -> dict[str, str]:
    """`routerctl status --json` (a real process) -> use -> the state of router fleet's session."""
    out = _routerctl_status(router, "--json")
    return {z["use"]: z["state"] for z in json.loads(out)["zookeeper"] if z["router"] == "fleet"}


def _wait_states(router: Routerd, state: str, timeout: float) -> float:
    """Wait until both sessions show `state` in /api/v1/status (each answer checked against
    docs/admin-api.yaml); how long it took (seconds)."""
    validator = Draft202012Validator(
        {"$ref": f"{BASE_URI}#/components/schemas/ServerStatus"}, registry=REGISTRY
    )
    started = time.monotonic()
    deadline = started + timeout
    while True:
        document = router.get("/api/v1/status")
        assert isinstance(document, dict)
        assert [e.message for e in validator.iter_errors(document)] == []
        states = {z["use"]: z["state"] for z in document["zookeeper"]}
        if states == {"discovery": state, "shared_cache": state}:
            return time.monotonic() - started
        assert time.monotonic() < deadline, f"not {state} within {timeout:g} s: {states}"
        time.sleep(0.1)


def _state_metrics(router: Routerd) -> dict[tuple[str, str], float]:
    """(use, state) -> router_zookeeper_state of router fleet."""
    return {
        (sample.labels["use"], sample.labels["state"]): sample.value
        for family in text_string_to_metric_families(router.metrics())
        for sample in family.samples
        if sample.name == "router_zookeeper_state" and sample.labels["router"] == "fleet"
    }


@pytest.mark.integration
def test_routerd_zookeeper_frozen_server_is_suspended_then_connected_and_lost_when_killed(
    own_zookeeper: ZooKeeperServer,
    path: str,
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> None:
    """Scenario: a router's discovery pool and shared cache use one ZooKeeper, which is SIGSTOPped
    (the connection stays up, nothing is answered): both sessions show suspended within the
    default answer timeout (status, routerctl status, metrics; the shared cache no longer counts as
    connected), each transition logged once; SIGCONT:
    connected again; SIGKILL: suspended at once, lost after the session timeout."""
    port = free_port()
    router = start_routerd(
        lambda _admin: _config(
            own_zookeeper, path, port, session_timeout_ms=FROZEN_SESSION_TIMEOUT_MS, shared_cache=True
        )
    )
    router.wait_for_log(r"router=fleet connected to zookeeper \S+: reading the members", consume=False)
    router.wait_for_log(r"router=fleet connected to zookeeper \S+: reconciling the cache", consume=False)
    _wait_states(router, "connected", TIMEOUT_S)
    assert _zookeeper_states(router) == {"discovery": "connected", "shared_cache": "connected"}
    assert own_zookeeper.proc is not None
    pid = own_zookeeper.proc.pid

    os.kill(pid, signal.SIGSTOP)
    try:
        took = _wait_states(router, "suspended", SUSPENDED_WITHIN_S)
        print(f"suspended {took:.2f} s after SIGSTOP")
        assert _zookeeper_states(router) == {"discovery": "suspended", "shared_cache": "suspended"}
        table = _routerctl_status(router)
        assert re.search(r"^ROUTER +ZOOKEEPER +STATE +SINCE +AT$", table, re.MULTILINE), table
        for use in ("discovery", "shared_cache"):
            assert re.search(
                rf"^fleet +{use} +suspended +\S+Z +{own_zookeeper.connect}/", table, re.MULTILINE
            )
        checked = promtool_check_metrics(router.metrics())
        assert checked.returncode == 0, checked.stderr
        metrics = _state_metrics(router)
        assert metrics[("discovery", "suspended")] == metrics[("shared_cache", "suspended")] == 1.0
        assert metrics[("discovery", "connected")] == metrics[("shared_cache", "connected")] == 0.0
        assert 'router_cache_shared_connected{router="fleet"} 0.0' in router.metrics()
        router.wait_for_log(
            r"\(discovery\) does not answer within 2 s: counting the session as suspended", consume=False
        )
        router.wait_for_log(
            r"\(shared_cache\) does not answer within 2 s: counting the session as suspended", consume=False
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait_states(router, "connected", TIMEOUT_S)
    router.wait_for_log(r"router=fleet connected to zookeeper \S+: reading the members again")
    for use in ("discovery", "shared_cache"):
        assert sum(f"({use}) does not answer" in line for line in router.lines) == 1

    own_zookeeper.proc.kill()  # by its PID
    own_zookeeper.proc.wait(TIMEOUT_S)
    _wait_states(router, "suspended", SUSPENDED_WITHIN_S)
    took = _wait_states(router, "lost", FROZEN_SESSION_TIMEOUT_MS / 1000 + TIMEOUT_S)
    print(f"lost {took:.2f} s after suspended")
    metrics = _state_metrics(router)
    assert metrics[("discovery", "lost")] == metrics[("shared_cache", "lost")] == 1.0
    for use in ("discovery", "shared_cache"):
        router.wait_for_log(
            rf"\({use}\) for the session timeout \(12 s\): counting the session as lost", consume=False
        )
    assert router.stop() == 0


def test__config_loads(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path)  # not started: only its address is used
    (tmp_path / "r.xml").write_text(_config(server, "/connection-router/x", 21000))
    config = load_config(tmp_path / "r.xml")
    group = config.pool_discovery_group(config.router("fleet"))
    assert group is not None
    assert group.zookeeper is not None
    assert group.zookeeper.connect == server.connect
    assert group.zookeeper.session_timeout_ms == ROUTER_SESSION_TIMEOUT_MS
