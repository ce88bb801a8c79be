"""routerd in front of a real Artemis fleet, with each protocol's own client (issue 32, point 6).

The session's three brokers (`a1`, `a2`, `a3`: tests/conftest.py `artemis_brokers`, one acceptor
each for CORE, AMQP, MQTT, STOMP and OpenWire) are the targets of one router keyed on CLIENT_ID
(CONSISTENT_HASH, node ids as in test_routerd_artemis.py), served by two routerd acceptors that take
every protocol: one proxies, one redirects. For each protocol's real client (paho MQTT 3.1.1 and
5, proton AMQP 1.0, stomp.py, and the ActiveMQ Classic Java client over OpenWire) and each mode it
can follow (the native redirects: MQTT 5, AMQP and OpenWire; CORE is test_routerd_artemis.py's),
three clients whose client ids `routerctl route` sends to three different brokers each send one
message to a queue of their own through routerd and leave it there. `artemis queue stat` on each
broker then proves from the broker's side where each client landed: the message is on the
predicted broker and nowhere else. Each client then receives its message back through routerd.
The OpenWire clients run with their default options in both modes.

Then a replication pair (`artemis_pair`) is one HA-pair target of its own routerd: a message sent
through routerd to the primary is consumed through routerd from the backup after a kill -9 of the
primary, once routerd's log says the backup is the active member.

The fleet's routerd is started once per module; every wait is bounded.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
import pytest
import stomp  # type: ignore[import-untyped]  # stomp.py ships no type hints
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from proton import Data, Message
from proton.reactor import LinkOption
from proton.utils import BlockingConnection

from tests.conftest import (
    ARTEMIS_PASSWORD,
    ARTEMIS_USER,
    JAVA_CLIENT_JARS,
    Artemis,
    ArtemisPair,
    accepts,
    free_port,
    require_java,
    run_artemis_cli,
)
from tests.router.conftest import Routerd, acceptors_xml, broker_xml, static_connectors
from tests.router.test_routerd_artemis import CLIENT_IDS, NODE_IDS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import ModuleType

    from proton import Link

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0
"""Bound of every wait on routerd, a broker or a client (a client JVM starts in about 1-2 s here)."""
ROUTER = "fleet"
ACCEPTORS = {
    "proxy": f"router={ROUTER};mode=proxy",
    "redirect": f"router={ROUTER};mode=redirect",
}
"""Two acceptors, each for every protocol (no `protocols=`): the modes differ, nothing else."""
CASES = [
    ("mqtt311", "proxy"),
    ("mqtt5", "proxy"),
    ("amqp", "proxy"),
    ("stomp", "proxy"),
    ("openwire", "proxy"),
    ("mqtt5", "redirect"),
    ("amqp", "redirect"),
    ("openwire", "redirect"),
]
"""(client, mode): every client proxied, and redirected where its protocol has a native redirect
that the client can follow (MQTT 3.1.1 and STOMP have none: docs/protocols.md)."""
FAILOVER_OPTIONS = (
    "maxReconnectAttempts=10&startupMaxReconnectAttempts=3&timeout=15000"
    "&reconnectSupported=true&updateURIsSupported=true"
)
"""The OpenWire client follows routerd's ConnectionControl only with the failover: transport
(docs/protocols.md): bounded reconnects and sends (the defaults retry forever), and the two options
that let a ConnectionControl move it (both true by default)."""


# --- which broker a client id goes to --------------------------------------------------------------


def _config(brokers: Sequence[Artemis], ports: dict[str, int]) -> str:
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    routers = f"""
      <connection-router name="{ROUTER}">
        <key-type>CLIENT_ID</key-type>
        <policy name="CONSISTENT_HASH"/>
        <pool><check-period>500</check-period><static-connectors>{refs}</static-connectors></pool>
      </connection-router>"""
    return broker_xml(connectors, acceptors_xml(ACCEPTORS, ports), routers)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The module's routerd in front of the session's brokers."""

    router: Routerd
    ports: dict[str, int]
    """Acceptor name -> port."""
    brokers: dict[str, Artemis]
    """Node id -> broker."""
    keys: dict[str, str]
    """Every candidate client id of every case (`_candidates`) -> the node id `routerctl route`
    gives that key."""


def _candidates(client: str, mode: str) -> list[str]:
    """The client ids a case picks its three from: `CLIENT-MODE-NAME` for each name of CLIENT_IDS."""
    return [f"{client}-{mode}-{name}" for name in CLIENT_IDS]


@pytest.fixture(scope="module")
def fleet(
    artemis_brokers: tuple[Artemis, Artemis, Artemis], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    ports = {name: free_port() for name in ACCEPTORS}
    router = Routerd(tmp_path_factory.mktemp("routerd"), lambda _admin: _config(artemis_brokers, ports))
    try:
        router.start()
        for node_id in NODE_IDS:
            router.wait_for_log(rf"router={ROUTER} target={node_id} is ready", TIMEOUT_S, consume=False)
        # One `routerctl route KEY...` for every candidate (a Python start-up costs about 1 s of CPU).
        candidates = [key for client, mode in CASES for key in _candidates(client, mode)]
        keys = {str(d["key"]): str(d["node_id"]) for d in router.route(ROUTER, *candidates)}
        assert sorted(keys) == sorted(candidates), keys
        yield Fleet(router, ports, dict(zip(NODE_IDS, artemis_brokers, strict=True)), keys)
    finally:
        router.stop()


def _one_client_per_broker(fleet: Fleet, client: str, mode: str) -> dict[str, str]:
    """Three of the case's candidate client ids that routerd sends to three different brokers:
    client id -> node id, as `routerctl route --client-id` (the connection's facts) says too."""
    chosen: dict[str, str] = {}
    for client_id in _candidates(client, mode):
        if fleet.keys[client_id] not in chosen.values():
            chosen[client_id] = fleet.keys[client_id]
    assert sorted(chosen.values()) == sorted(NODE_IDS), f"{client}-{mode} must reach every broker: {chosen}"
    decisions = fleet.router.predict(ROUTER, "--client-id", list(chosen))
    for client_id, decision in decisions.items():
        assert decision["node_id"] == chosen[client_id], decision
        assert decision["connector"] == fleet.brokers[chosen[client_id]].url, decision
    return chosen


def _queues_on(broker: Artemis, contains: str) -> dict[str, int]:
    """The queues on `broker` whose name contains `contains`, with the messages each holds (from
    `artemis queue stat`, as test_routerd_artemis.py's `_messages_on`)."""
    done = run_artemis_cli(
        "queue",
        "stat",
        f"--url={broker.url}",
        f"--user={ARTEMIS_USER}",
        f"--password={ARTEMIS_PASSWORD}",
        f"--queueName={contains}",
        "--maxRows=1000",
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout[done.stdout.index("{") :])
    return {str(q["name"]): int(q["messageCount"]) for q in document["data"]}


def _held_by_each(brokers: dict[str, Artemis], contains: str) -> dict[str, dict[str, int]]:
    """`_queues_on` every broker, side by side (each is a JVM): node id -> queue -> messages."""
    with ThreadPoolExecutor(len(brokers)) as pool:
        stats = {node: pool.submit(_queues_on, broker, contains) for node, broker in brokers.items()}
        return {node: stat.result() for node, stat in stats.items()}


# --- the clients ------------------------------------------------------------------------------------
#
# Each client sends one message to a queue of its own through routerd and leaves it there (`send`,
# which says what the client was connected to: `tcp://host:port`), then receives it through routerd
# (`receive`), as `client_id`, entering at `entry`: the acceptor's port, followed when it redirects.
# `_mqtt_broker_queue` names the queue that holds an MQTT message on the broker.


@dataclass(frozen=True, slots=True)
class Entry:
    """Where a client enters: a routerd acceptor, and whether it follows a redirect from there."""

    port: int
    redirect: bool


def _example(name: str) -> ModuleType:
    """A documented snippet of docs/examples, loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# MQTT: Artemis keeps a retained message in the queue `$sys.mqtt.retain.ADDRESS` (the topic with `/`
# as `.`) on the broker it was published to; a subscriber gets it from there.


def _mqtt_connect(entry: Entry, client_id: str, version: MQTTProtocolVersion) -> mqtt.Client:
    """A paho client connected (loop running), through routerd or where its MQTT 5 redirect says."""
    if entry.redirect:
        assert version is MQTTProtocolVersion.MQTTv5, "MQTT 3.1.1 has no redirect"
        follow = _example("follow_redirect_paho")
        client: mqtt.Client = follow.connect_following_redirects(
            "127.0.0.1", entry.port, client_id, username=ARTEMIS_USER, password=ARTEMIS_PASSWORD
        )
        if not client.is_connected():
            client.loop_stop()
            raise AssertionError(f"{client_id}: not connected after following the redirect")
        return client
    connacks: list[int] = []
    answered = threading.Event()

    def on_connect(_c: mqtt.Client, _u: object, _f: object, reason: Any, _p: object) -> None:
        connacks.append(reason.value)
        answered.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version)
    client.username_pw_set(ARTEMIS_USER, ARTEMIS_PASSWORD)
    client.on_connect = on_connect
    client.connect("127.0.0.1", entry.port)
    client.loop_start()
    if not answered.wait(TIMEOUT_S) or connacks != [0]:
        client.loop_stop()
        raise AssertionError(f"{client_id}: CONNACK {connacks}")
    return client


def _mqtt_close(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


def _mqtt_send(version: MQTTProtocolVersion, entry: Entry, client_id: str, queue: str, body: str) -> str:
    client = _mqtt_connect(entry, client_id, version)
    try:
        sent = client.publish(queue.replace(".", "/"), body.encode(), qos=1, retain=True)
        sent.wait_for_publish(TIMEOUT_S)  # until the PUBACK: the broker holds it
        assert sent.is_published(), f"{client_id}: no PUBACK"
        return f"tcp://{client.host}:{client.port}"
    finally:
        _mqtt_close(client)


def _mqtt_receive(version: MQTTProtocolVersion, entry: Entry, client_id: str, queue: str) -> str:
    got: list[bytes] = []
    received = threading.Event()

    def on_message(_c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
        got.append(bytes(message.payload))
        received.set()

    client = _mqtt_connect(entry, client_id, version)
    try:
        client.on_message = on_message
        topic = queue.replace(".", "/")
        client.subscribe(topic, qos=1)
        assert received.wait(TIMEOUT_S), f"{client_id}: no retained message on {topic}"
        client.publish(topic, b"", qos=1, retain=True).wait_for_publish(TIMEOUT_S)  # clears it
    finally:
        _mqtt_close(client)
    return got[0].decode()


def _mqtt_broker_queue(queue: str) -> str:
    return f"$sys.mqtt.retain.{queue}"


# AMQP: the link capability `queue` asks Artemis for an ANYCAST queue of the address's name (created
# on first use); without it an auto-created address is MULTICAST, and a message sent to it before
# anyone subscribed is dropped.


class _Queue(LinkOption):
    """Artemis's AMQP capability `queue` on the link's node (target of a sender, source of a receiver)."""

    def apply(self, link: Link) -> None:
        capabilities = link.source.capabilities if link.is_receiver else link.target.capabilities
        capabilities.put_array(False, Data.SYMBOL)
        capabilities.enter()
        capabilities.put_symbol("queue")
        capabilities.exit()


def _amqp_connect(entry: Entry, client_id: str) -> BlockingConnection:
    url = f"amqp://{ARTEMIS_USER}:{ARTEMIS_PASSWORD}@127.0.0.1:{entry.port}"
    if entry.redirect:
        follow = _example("follow_redirect_proton")
        connection: BlockingConnection = follow.connect_following_redirects(
            url, container_id=client_id, timeout=TIMEOUT_S
        )
        return connection
    return BlockingConnection(url, TIMEOUT_S, container_id=client_id, allowed_mechs="PLAIN")


def _amqp_send(entry: Entry, client_id: str, queue: str, body: str) -> str:
    connection = _amqp_connect(entry, client_id)
    try:
        connection.create_sender(queue, options=_Queue()).send(Message(body=body, durable=True))  # settled
        where = urlsplit(connection.url)  # the URL it connected to (a redirect's, when followed)
        return f"tcp://{where.hostname}:{where.port}"
    finally:
        connection.close()


def _amqp_receive(entry: Entry, client_id: str, queue: str) -> str:
    connection = _amqp_connect(entry, client_id)
    try:
        receiver = connection.create_receiver(queue, options=_Queue())
        message = receiver.receive(timeout=TIMEOUT_S)
        receiver.accept()
        return str(message.body)
    finally:
        connection.close()


# STOMP: Artemis's header `destination-type: ANYCAST` asks for an ANYCAST queue of that name.


class _StompListener(stomp.ConnectionListener):  # type: ignore[misc]  # untyped base class
    def __init__(self) -> None:
        self.connected, self.receipt, self.message = threading.Event(), threading.Event(), threading.Event()
        self.bodies: list[str] = []
        self.errors: list[str] = []

    def on_connected(self, frame: stomp.utils.Frame) -> None:
        self.connected.set()

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.receipt.set()

    def on_error(self, frame: stomp.utils.Frame) -> None:
        self.errors.append(f"{frame.headers} {frame.body}")

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.bodies.append(frame.body)
        self.message.set()


def _stomp_connect(entry: Entry, client_id: str) -> tuple[stomp.Connection12, _StompListener]:
    assert not entry.redirect, "STOMP has no redirect that a client follows"
    listener = _StompListener()
    connection = stomp.Connection12([("127.0.0.1", entry.port)], reconnect_attempts_max=1)
    connection.set_listener("fleet", listener)
    # wait=False: stomp.py 9 waits for CONNECTED without a bound (tests/test_artemis_fixtures.py)
    connection.connect(ARTEMIS_USER, ARTEMIS_PASSWORD, wait=False, headers={"client-id": client_id})
    if not listener.connected.wait(TIMEOUT_S):
        connection.disconnect()
        raise AssertionError(f"{client_id}: no CONNECTED {listener.errors}")
    return connection, listener


def _stomp_send(entry: Entry, client_id: str, queue: str, body: str) -> str:
    connection, listener = _stomp_connect(entry, client_id)
    try:
        connection.send(
            queue, body, headers={"destination-type": "ANYCAST", "persistent": "true", "receipt": "sent"}
        )
        assert listener.receipt.wait(TIMEOUT_S), f"{client_id}: no RECEIPT {listener.errors}"
        host, port = connection.transport.current_host_and_port
        return f"tcp://{host}:{port}"
    finally:
        connection.disconnect()


def _stomp_receive(entry: Entry, client_id: str, queue: str) -> str:
    connection, listener = _stomp_connect(entry, client_id)
    try:
        connection.subscribe(queue, id="1", ack="auto", headers={"destination-type": "ANYCAST"})
        assert listener.message.wait(TIMEOUT_S), f"{client_id}: no MESSAGE {listener.errors}"
        return listener.bodies[0]
    finally:
        connection.disconnect()


# OpenWire: the ActiveMQ Classic Java client from Debian (as test_routerd_activemq.py runs it), one
# JVM for the three clients of a step; a JMS queue is an ANYCAST queue in Artemis. Proxied, the
# client keeps its default options: routerd answers its WireFormatInfo before it knows the broker
# with an echo that turns the marshal cache off, and replays it to Artemis with the cache off too
# (Artemis never negotiates the cache; keys/openwire.py). Redirected, the client negotiates with
# the broker itself.

_FLEET_CLIENT_JAVA = """
import javax.jms.*;
import org.apache.activemq.ActiveMQConnection;
import org.apache.activemq.ActiveMQConnectionFactory;

/** FleetClient send|receive URL USER PASSWORD ID=QUEUE...: for each pair, one connection with that
 *  client id; send: sends "hello-ID" (persistent) to QUEUE and leaves it there; receive: receives one
 *  message from QUEUE. Prints "client=ID event=send|receive got=BODY broker=NAME remote=ADDRESS". */
public class FleetClient {
  public static void main(String[] a) throws Exception {
    ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(a[2], a[3], a[1]);
    for (int i = 4; i < a.length; i++) {
      String id = a[i].split("=", 2)[0];
      ActiveMQConnection c = (ActiveMQConnection) factory.createConnection();
      try {
        c.setClientID(id);
        c.start();
        Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = s.createQueue(a[i].split("=", 2)[1]);
        String got = "-";
        if (a[0].equals("send")) {
          s.createProducer(q).send(s.createTextMessage("hello-" + id));
        } else {
          Message m = s.createConsumer(q).receive(10000);
          got = m instanceof TextMessage ? ((TextMessage) m).getText() : String.valueOf(m);
        }
        System.out.println("client=" + id + " event=" + a[0] + " got=" + got
            + " broker=" + c.getBrokerName() + " remote=" + c.getTransport().getRemoteAddress());
      } finally {
        c.close();
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def fleet_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FleetClient.java compiled with javac against Debian's ActiveMQ client jars: its directory."""
    require_java()
    out = tmp_path_factory.mktemp("fleet-client")
    (out / "FleetClient.java").write_text(_FLEET_CLIENT_JAVA)
    subprocess.run(
        ["javac", "-cp", ":".join(JAVA_CLIENT_JARS), "-d", str(out), str(out / "FleetClient.java")],
        check=True,
        timeout=TIMEOUT_S * 2,
    )
    return out


def _openwire_url(entry: Entry) -> str:
    router = f"tcp://127.0.0.1:{entry.port}"
    if entry.redirect:
        return f"failover:({router})?{FAILOVER_OPTIONS}"
    return router


def _run_fleet_client(
    classes: Path, step: str, entry: Entry, queues: dict[str, str], url: str | None = None
) -> dict[str, dict[str, str]]:
    """Run FleetClient `step` for each client id -> queue (on `url`, by default the entry's):
    client id -> what it printed."""
    done = subprocess.run(
        [
            *("java", "-Xmx64m", "-XX:TieredStopAtLevel=1"),
            *("-cp", ":".join([*JAVA_CLIENT_JARS, str(classes)]), "FleetClient"),
            *(step, url or _openwire_url(entry), ARTEMIS_USER, ARTEMIS_PASSWORD),
            *(f"{client_id}={queue}" for client_id, queue in queues.items()),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 3,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reports = {}
    for line in done.stdout.splitlines():
        if line.startswith("client="):
            fields = dict(part.split("=", 1) for part in line.split())
            reports[fields["client"]] = fields
    assert sorted(reports) == sorted(queues), done.stdout + done.stderr
    return reports


# --- 1. every client lands where `routerctl route` predicts ------------------------------------------

_MQTT_VERSIONS = {"mqtt311": MQTTProtocolVersion.MQTTv311, "mqtt5": MQTTProtocolVersion.MQTTv5}


def _send_all(
    client: str, entry: Entry, queues: dict[str, str], classes: Callable[[], Path]
) -> dict[str, str]:
    """Each client id sends "hello-ID" to its queue: client id -> what it was connected to."""
    if client == "openwire":
        return {cid: r["remote"] for cid, r in _run_fleet_client(classes(), "send", entry, queues).items()}
    connected = {}
    for client_id, queue in queues.items():
        body = f"hello-{client_id}"
        if client in _MQTT_VERSIONS:
            connected[client_id] = _mqtt_send(_MQTT_VERSIONS[client], entry, client_id, queue, body)
        elif client == "amqp":
            connected[client_id] = _amqp_send(entry, client_id, queue, body)
        else:
            assert client == "stomp", client
            connected[client_id] = _stomp_send(entry, client_id, queue, body)
    return connected


def _receive_all(
    client: str, entry: Entry, queues: dict[str, str], classes: Callable[[], Path]
) -> dict[str, str]:
    """What each client id receives from its queue."""
    if client == "openwire":
        return {cid: r["got"] for cid, r in _run_fleet_client(classes(), "receive", entry, queues).items()}
    if client in _MQTT_VERSIONS:
        return {cid: _mqtt_receive(_MQTT_VERSIONS[client], entry, cid, q) for cid, q in queues.items()}
    if client == "amqp":
        return {cid: _amqp_receive(entry, cid, q) for cid, q in queues.items()}
    assert client == "stomp", client
    return {cid: _stomp_receive(entry, cid, q) for cid, q in queues.items()}


@pytest.mark.parametrize(("client", "mode"), CASES, ids=[f"{c}-{m}" for c, m in CASES])
def test_fleet_clients_land_where_routerctl_route_predicts(
    fleet: Fleet, request: pytest.FixtureRequest, client: str, mode: str
) -> None:
    """Scenario: three clients of one protocol, whose client ids routerd sends to the three brokers,
    each send a message to a queue of their own through routerd (proxied, or redirected and
    following the redirect); each message is on the predicted broker alone (`artemis queue stat`
    there); each client receives its own message back through routerd."""
    predicted = _one_client_per_broker(fleet, client, mode)
    run = uuid.uuid4().hex[:8]
    queues = {client_id: f"fleet.{run}.{client_id}" for client_id in predicted}
    entry = Entry(port=fleet.ports[mode], redirect=mode == "redirect")

    def classes() -> Path:  # the Java client is compiled for the OpenWire cases only
        return Path(request.getfixturevalue("fleet_client"))

    connected = _send_all(client, entry, queues, classes)
    router = f"tcp://127.0.0.1:{entry.port}"
    assert connected == {
        client_id: fleet.brokers[node_id].url if entry.redirect else router
        for client_id, node_id in predicted.items()
    }, "redirected clients end at their broker, proxied ones at routerd"

    broker_queue = _mqtt_broker_queue if client in _MQTT_VERSIONS else (lambda queue: queue)
    held = _held_by_each(fleet.brokers, run)
    for client_id, node_id in predicted.items():
        where = {node: stats.get(broker_queue(queues[client_id]), 0) for node, stats in held.items()}
        assert where == {node: int(node == node_id) for node in NODE_IDS}, (client_id, held)

    received = _receive_all(client, entry, queues, classes)
    assert received == {client_id: f"hello-{client_id}" for client_id in predicted}


# --- 2. an Artemis replication pair as one HA-pair target ---------------------------------------------

HA_ROUTER = "ha"
HA_NODE_ID = "pair"
HA_CHECK_PERIOD_MS = 500


def _ha_config(pair: ArtemisPair, port: int) -> str:
    # probe=tcp (the default) tells the members apart: a replication backup keeps its acceptor
    # closed until it takes over (asserted below).
    members = f"tcp://127.0.0.1:{pair.primary.port},tcp://127.0.0.1:{pair.backup.port}"
    connector = f'<connector name="pair">({members})?nodeId={HA_NODE_ID}</connector>'
    routers = f"""
      <connection-router name="{HA_ROUTER}">
        <key-type>CLIENT_ID</key-type>
        <policy name="CONSISTENT_HASH"/>
        <pool>
          <check-period>{HA_CHECK_PERIOD_MS}</check-period>
          <quorum-timeout>10000</quorum-timeout>
          <static-connectors><connector-ref>pair</connector-ref></static-connectors>
        </pool>
      </connection-router>"""
    acceptor = acceptors_xml({"ha": f"router={HA_ROUTER};mode=proxy"}, {"ha": port})
    return broker_xml(connector, acceptor, routers)


def _active_member(router: Routerd) -> str:
    status: Any = router.get(f"/api/v1/routers/{HA_ROUTER}")
    (target,) = status["pool"]["targets"]
    (active,) = [m["connector"] for m in target["members"] if m["active"]]
    return str(active)


def test_ha_pair_connector_follows_a_replication_failover(
    artemis_pair: ArtemisPair, start_routerd: Callable[[Callable[[int], str]], Routerd]
) -> None:
    """Scenario: a message sent through routerd (AMQP) to the replication pair's primary is
    consumed through routerd from the backup after a kill -9 of the primary; routerd's log says the
    backup became the active member."""
    primary, backup = artemis_pair.primary, artemis_pair.backup
    port = free_port()
    router = start_routerd(lambda _admin: _ha_config(artemis_pair, port))
    target = rf"router={HA_ROUTER} target={HA_NODE_ID}"
    router.wait_for_log(rf"{target} is ready \(active member {re.escape(primary.url)}\)", TIMEOUT_S)
    assert _active_member(router) == primary.url
    assert not accepts(backup.port), "a passive replication backup keeps its acceptor closed"

    queue = f"fleet.ha.{uuid.uuid4().hex[:8]}"
    entry = Entry(port=port, redirect=False)
    _amqp_send(entry, "ha-sender", queue, "kept across failover")
    assert _queues_on(primary, queue) == {queue: 1}

    primary.kill()
    backup.wait_ready()
    # The primary's probe fails before the backup opens its acceptor, so the target is not ready
    # for a moment; the backup's first good probe makes it ready again, with the backup active.
    # (Were the backup ready first, the line would be "failed over: <backup> is active".)
    now_active = re.escape(backup.url)
    router.wait_for_log(
        rf"{target} (is ready \(active member {now_active}\)|failed over: {now_active} is active)", TIMEOUT_S
    )
    assert _active_member(router) == backup.url
    assert _amqp_receive(entry, "ha-receiver", queue) == "kept across failover"
