"""LEAST_CONNECTIONS on the counts real brokers report (connectionCount=), end to end with routerd.

For each kind of broker, two brokers behind one routerd (LEAST_CONNECTIONS, probes every 500 ms):
clients connected straight to the first broker, not through the router, show in its reported count
(`routerctl status ROUTER --json`, its table too), so the router's next new client goes to the
second; once they leave, the first broker is the least loaded again.

- Apache ActiveMQ Artemis 2.40: `ConnectionCount` over its console's Jolokia (`artemis-jolokia`),
  two brokers of this module made with the web console (`make_artemis`); MQTT clients with the
  brokers' login.
- ActiveMQ Classic 5.17 from Debian: `CurrentConnectionsCount` over Jolokia (`activemq-jolokia`),
  which Debian's package does not serve: the brokers serve it from Debian's Jolokia servlet
  (tests/conftest.py `ActiveMQ.jolokia_port`); MQTT clients.
- RabbitMQ 3.10 from Debian: the rabbitmq_prometheus gauge `rabbitmq_connections`
  (`rabbitmq-prometheus`) of the session's nodes. RabbitMQ 3.10 counts AMQP 0-9-1 connections
  there but not its AMQP 1.0 plugin's, so the direct clients speak AMQP 0-9-1 (a handshake written
  here) and the routed one AMQP 1.0 (proton).

Every process listens on 127.0.0.1 and is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from keys.mqtt import encode_connect
from tests.conftest import (
    ARTEMIS_PASSWORD,
    ARTEMIS_USER,
    JOLOKIA_PASSWORD,
    JOLOKIA_USER,
    ActiveMQ,
    free_port,
    require_java,
    require_jolokia,
    started_together,
)
from tests.router.conftest import ROUTERCTL, routerctl_json

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.conftest import Artemis
    from tests.router.conftest import RabbitNode, Routerd

pytestmark = pytest.mark.integration

DIRECT_CLIENTS = 3
"""Clients connected straight to the first broker."""
TIMEOUT_S = 20.0
"""Bound of each wait for a count to show (a read every 500 ms)."""
DOCUMENT_PATH = Path(__file__).resolve().parents[2] / "docs" / "admin-api.yaml"


def _config(port: int, router_user: str | None, connectors: dict[str, str]) -> Callable[[int], str]:
    """A LEAST_CONNECTIONS router `lc` over `connectors` (node id -> URL), the pool's login
    `router_user` (its password the same), probes and count reads every 500 ms."""
    xml_connectors = "".join(f'<connector name="{n}">{u}</connector>' for n, u in connectors.items())
    refs = "".join(f"<connector-ref>{n}</connector-ref>" for n in connectors)
    login = (
        "" if router_user is None else f"<username>{router_user}</username><password>{router_user}</password>"
    )
    return lambda _admin: (
        f"""<core><connectors>{xml_connectors}</connectors>
      <acceptors><acceptor name="a">tcp://127.0.0.1:{port}?router=lc</acceptor></acceptors>
      <connection-routers><connection-router name="lc"><policy name="LEAST_CONNECTIONS"/>
        <pool>{login}<check-period>500</check-period><quorum-size>2</quorum-size>
          <static-connectors>{refs}</static-connectors></pool>
      </connection-router></connection-routers></core>"""
    )


def _targets(router: Routerd) -> dict[str, dict[str, Any]]:
    """The targets of `routerctl status lc --json`, by node id."""
    code, document = routerctl_json(router, "status", "lc")
    assert code == 0, document
    pool = document["pool"]
    assert isinstance(pool, dict)
    return {t["node_id"]: t for t in pool["targets"]}


def _wait_counts(router: Routerd, expected: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Wait until each named target's broker-reported count is the expected one: the targets."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        targets = _targets(router)
        counts = {n: (targets[n].get("broker_count") or {}).get("count") for n in expected}
        if counts == expected:
            return targets
        assert time.monotonic() < deadline, f"counts {counts}, expected {expected}: {targets}"
        time.sleep(0.2)  # another process's state: nothing to wait on


def _check_document(targets: dict[str, dict[str, Any]], source: str) -> None:
    """Each target's document is a `TargetStatus` of docs/admin-api.yaml, with a fresh count read
    from `source`, and ready."""
    document = yaml.safe_load(DOCUMENT_PATH.read_text())
    base = "urn:connection-router:admin-api"
    registry: Registry[Any] = Registry().with_resource(
        base, Resource.from_contents(document, default_specification=DRAFT202012)
    )
    schema = {"$ref": f"{base}#/components/schemas/TargetStatus"}
    validator = Draft202012Validator(schema, registry=registry)
    for target in targets.values():
        errors = [error.message for error in validator.iter_errors(target)]
        assert errors == [], target
        report = target["broker_count"]
        assert report["source"] == source
        assert report["count"] is not None
        # Artemis's console answers its first Jolokia request after a start in more than the
        # test's 0.5-s deadline: that error stays in the status (last_error), older than the read.
        assert report["last_error"] is None or report["last_error_at"] < report["read_at"]
        assert 0 <= report["age_s"] < 5
        assert target["state"] == "ready"


def _table(router: Routerd) -> str:
    done = subprocess.run(
        [*ROUTERCTL, "status", "lc", "--admin", router.admin],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _mqtt_session(
    port: int, client_id: str, user: str | None = None, password: str | None = None
) -> socket.socket:
    """An MQTT 3.1.1 session (CONNACK 0) on 127.0.0.1:port."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(encode_connect(client_id, user_name=user, password=password))
    assert sock.recv(4) == b"\x20\x02\x00\x00", client_id
    return sock


def _landed(router: Routerd, before: dict[str, dict[str, Any]]) -> str:
    """The target whose count LEAST_CONNECTIONS sees went up by the one routed client."""
    after = _targets(router)
    grown = [n for n in after if after[n]["connections"] > before[n]["connections"]]
    assert len(grown) == 1, (before, after)
    return grown[0]


# --- Apache ActiveMQ Artemis 2.40: ConnectionCount over the console's Jolokia --------------------


@pytest.fixture
def artemis_consoles(make_artemis: Callable[..., Artemis]) -> list[Artemis]:
    """Two brokers of this test with their web console (Jolokia at /console/jolokia), started in
    parallel. The session's `artemis_brokers` have no console."""
    brokers = [make_artemis(name, web_port=free_port()) for name in ("c1", "c2")]
    for broker in brokers:
        broker.start()
    for broker in brokers:
        broker.wait_ready()
    return brokers


def test_least_connections_follows_artemis_jolokia_counts(
    artemis_consoles: list[Artemis], start_routerd: Callable[..., Routerd]
) -> None:
    port = free_port()
    connectors = {
        b.name: f"tcp://127.0.0.1:{b.port}?connectionCount=artemis-jolokia;"
        f"connectionCountUrl=http://127.0.0.1:{b.web_port}/console/jolokia"
        for b in artemis_consoles
    }
    router = start_routerd(_config(port, ARTEMIS_USER, connectors))  # the pool's login is Jolokia's
    _check_document(_wait_counts(router, {"c1": 0, "c2": 0}), "artemis-jolokia")
    login = {"user": ARTEMIS_USER, "password": ARTEMIS_PASSWORD}
    with contextlib.ExitStack() as direct:
        for n in range(DIRECT_CLIENTS):
            direct.enter_context(_mqtt_session(artemis_consoles[0].port, f"direct-{n}", **login))
        before = _wait_counts(router, {"c1": DIRECT_CLIENTS, "c2": 0})
        assert before["c1"]["connections"] == DIRECT_CLIENTS  # what LEAST_CONNECTIONS counts
        table = _table(router)
        assert "artemis-jolokia" in table
        assert " ago " in table
        print(table)  # docs/operations.md shows one (pytest -s)
        with _mqtt_session(port, f"routed-{uuid.uuid4().hex[:6]}", **login):
            assert _landed(router, before) == "c2"
            _wait_counts(router, {"c1": DIRECT_CLIENTS, "c2": 1})  # the broker counts it too
    before = _wait_counts(router, {"c1": 0, "c2": 0})
    with _mqtt_session(port, f"routed-{uuid.uuid4().hex[:6]}", **login):
        assert _landed(router, before) in ("c1", "c2")  # a tie again: round-robin


# --- ActiveMQ Classic 5.17 (Debian): CurrentConnectionsCount over Jolokia ------------------------


@pytest.fixture
def activemq_jolokia(tmp_path: Path) -> Iterator[list[ActiveMQ]]:
    """Two brokers of this test serving Jolokia at /api/jolokia."""
    require_java()
    require_jolokia()
    brokers = [ActiveMQ(name, tmp_path / name, jolokia_port=free_port()) for name in ("q1", "q2")]
    with started_together(brokers):
        yield brokers


def test_least_connections_follows_activemq_jolokia_counts(
    activemq_jolokia: list[ActiveMQ], start_routerd: Callable[..., Routerd]
) -> None:
    port = free_port()
    connectors = {
        b.name: f"tcp://127.0.0.1:{b.mqtt}?connectionCount=activemq-jolokia;connectionCountUrl={b.jolokia_url};"
        f"connectionCountUser={JOLOKIA_USER};connectionCountPassword={JOLOKIA_PASSWORD}"
        for b in activemq_jolokia
    }
    router = start_routerd(_config(port, None, connectors))
    _check_document(_wait_counts(router, {"q1": 0, "q2": 0}), "activemq-jolokia")
    with contextlib.ExitStack() as direct:
        for n in range(DIRECT_CLIENTS):
            direct.enter_context(_mqtt_session(activemq_jolokia[0].mqtt, f"direct-{n}"))
        before = _wait_counts(router, {"q1": DIRECT_CLIENTS, "q2": 0})
        with _mqtt_session(port, f"routed-{uuid.uuid4().hex[:6]}"):
            assert _landed(router, before) == "q2"
            _wait_counts(router, {"q1": DIRECT_CLIENTS, "q2": 1})
    _wait_counts(router, {"q1": 0, "q2": 0})


def test_a_failed_count_read_leaves_the_target_ready(
    activemq_jolokia: list[ActiveMQ], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: wrong Jolokia credentials on one target: its status says why (HTTP 401) and the
    count is this router's own; the target stays ready and takes clients."""
    port = free_port()
    good, bad = activemq_jolokia
    connectors = {
        "q1": f"tcp://127.0.0.1:{good.mqtt}?connectionCount=activemq-jolokia;connectionCountUrl={good.jolokia_url};"
        f"connectionCountUser={JOLOKIA_USER};connectionCountPassword={JOLOKIA_PASSWORD}",
        "q2": f"tcp://127.0.0.1:{bad.mqtt}?connectionCount=activemq-jolokia;connectionCountUrl={bad.jolokia_url};"
        f"connectionCountUser={JOLOKIA_USER};connectionCountPassword=wrong",
    }
    router = start_routerd(_config(port, None, connectors))
    router.wait_for_log(
        r"router=lc target=q2 broker connection count \(activemq-jolokia\) not read, .*HTTP status 401"
    )
    targets = _targets(router)
    report = targets["q2"]["broker_count"]
    assert report["count"] is None
    assert (
        report["last_error"]
        == f"{bad.jolokia_url}: HTTP status 401 (check connectionCountUser, or the pool's user)"
    )
    assert targets["q2"]["state"] == "ready"
    with contextlib.ExitStack() as direct:
        for n in range(DIRECT_CLIENTS):  # q2's clients the router cannot see
            direct.enter_context(_mqtt_session(bad.mqtt, f"direct-{n}"))
        before = _wait_counts(router, {"q1": 0})
        with _mqtt_session(port, f"routed-{uuid.uuid4().hex[:6]}"):
            assert _landed(router, before) in ("q1", "q2")  # both count 0: a tie


# --- RabbitMQ 3.10 (Debian): the rabbitmq_prometheus gauge rabbitmq_connections ------------------


def _amqp091_connection(port: int, user: str = "guest", password: str = "guest") -> socket.socket:
    """An open AMQP 0-9-1 connection (AMQP 0-9-1 §2.2.4: protocol header, Start/Start-Ok with PLAIN,
    Tune/Tune-Ok, Open/Open-Ok on vhost "/"): what RabbitMQ 3.10's `rabbitmq_connections` counts."""

    def frame(class_id: int, method_id: int, arguments: bytes) -> bytes:
        payload = struct.pack(">HH", class_id, method_id) + arguments
        return struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"  # a method frame, channel 0

    def short(text: str) -> bytes:
        return bytes([len(text)]) + text.encode()

    def read_method(sock: socket.socket) -> tuple[int, int, bytes]:
        header = _recv_exactly(sock, 7)
        _, _, size = struct.unpack(">BHI", header)
        payload = _recv_exactly(sock, size + 1)[:-1]
        class_id, method_id = struct.unpack(">HH", payload[:4])
        return class_id, method_id, payload[4:]

    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    assert read_method(sock)[:2] == (10, 10)  # connection.start
    response = f"\x00{user}\x00{password}".encode()
    sock.sendall(
        frame(
            10,
            11,
            b"\x00\x00\x00\x00"
            + short("PLAIN")
            + struct.pack(">I", len(response))
            + response
            + short("en_US"),
        )
    )
    class_id, method_id, tune = read_method(sock)
    assert (class_id, method_id) == (10, 30)  # connection.tune
    channel_max, frame_max, _heartbeat = struct.unpack(">HIH", tune[:8])
    sock.sendall(frame(10, 31, struct.pack(">HIH", channel_max, frame_max, 0)))  # no heartbeats
    sock.sendall(frame(10, 40, short("/") + short("") + b"\x00"))
    assert read_method(sock)[:2] == (10, 41)  # connection.open-ok
    return sock


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def test_least_connections_follows_rabbitmq_prometheus_counts(
    rabbit_nodes: list[RabbitNode], start_routerd: Callable[..., Routerd]
) -> None:
    from proton import symbol
    from proton.utils import BlockingConnection

    port = free_port()
    first, second = rabbit_nodes
    connectors = {
        n.node_id: f"tcp://127.0.0.1:{n.port}?connectionCount=rabbitmq-prometheus;connectionCountUrl={n.metrics_url}"
        for n in rabbit_nodes
    }
    router = start_routerd(_config(port, None, connectors))
    _check_document(_wait_counts(router, {first.node_id: 0, second.node_id: 0}), "rabbitmq-prometheus")
    with contextlib.ExitStack() as direct:
        for _ in range(DIRECT_CLIENTS):
            direct.enter_context(_amqp091_connection(first.port))
        _wait_counts(router, {first.node_id: DIRECT_CLIENTS, second.node_id: 0})
        routed = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", 10, allowed_mechs="PLAIN")
        try:
            assert routed.conn is not None
            # The node that answered names itself. (The status cannot tell: once a read follows the
            # routed connection, RabbitMQ 3.10's gauge, blind to AMQP 1.0, takes it out again.)
            assert routed.conn.remote_properties[symbol("cluster_name")] == second.node_id
        finally:
            routed.close()
    _wait_counts(router, {first.node_id: 0, second.node_id: 0})
