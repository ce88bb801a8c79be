"""routerd in front of two real ActiveMQ Classic 5.17 brokers, with real OpenWire, STOMP and MQTT clients.

Two brokers (`amq-a`, `amq-b`; ENVIRONMENT.md §3.3) each serve OpenWire, STOMP and MQTT 3.1.1. One
routerd has an acceptor per scenario: OpenWire proxy and redirect keyed on CLIENT_ID, STOMP proxy
keyed on CLIENT_ID and on USER_NAME, MQTT 3.1.1 proxy keyed on CLIENT_ID (all CONSISTENT_HASH over
the two brokers), and a STOMP acceptor whose only target never answers. Every client lands where
`routerctl route` predicts, proven from the broker's side: the Java client prints the name of the
broker it is connected to, and STOMP observers subscribed directly on each broker see where a
STOMP or MQTT message was published. Refusals and bad openings get what SPEC A6 and Part B say.

Brokers, the compiled Java probe and routerd are started once per module; every wait is bounded.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import paho.mqtt.client as mqtt
import pytest
import stomp  # type: ignore[import-untyped]  # stomp.py ships no type hints
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.conftest import JAVA_CLIENT_JARS, ActiveMQ, free_port, read_until_closed, require_java
from tests.router.conftest import Routerd, acceptors_xml

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

NODE_IDS = ("amq-a", "amq-b")
"""brokerName of each broker, and its nodeId in routerd's connectors."""
TIMEOUT_S = 20.0
"""Bound of every wait on a client, broker or routerd (a broker starts in about 2 s, a JVM in 1 s)."""
HANDSHAKE_TIMEOUT_S = 2
"""`handshake-timeout` of the acceptors that get bad openings."""
SNIFF_MAX_BYTES = 1024
"""`sniffMaxBytes` of the acceptors that get bad openings."""
CLOSE_SLACK_S = 3.0
"""Scheduling slack on top of the handshake deadline for a bad opening to be closed."""
MISSING = "run ./run-tests, which installs it"

# Client ids and users per scenario. Artemis's ring has one point per node id and these two are
# close together, so ids that differ only at the end all land on one broker; these were picked so
# that each list covers both brokers (each test checks that with `routerctl route`).
OPENWIRE_IDS = ["ow-alice", "ow-frank", "ow-bob", "ow-ivan"]
REDIRECT_IDS = ["fo-alice", "fo-carol"]
STOMP_IDS = ["st-alice", "st-bob", "st-carol", "st-dave"]
STOMP_USERS = ["alice", "bob", "carol", "heidi"]
MQTT_IDS = ["mq-alice", "mq-ivan", "mq-bob", "mq-judy"]

ACCEPTORS = {
    "ow-proxy": f"router=ow;mode=proxy;protocols=OPENWIRE;sniffMaxBytes={SNIFF_MAX_BYTES};"
    f"handshake-timeout={HANDSHAKE_TIMEOUT_S}",
    "ow-redirect": "router=ow;mode=redirect;protocols=OPENWIRE",
    "ow-user": "router=ow-user;mode=proxy;protocols=OPENWIRE",
    "stomp-proxy": f"router=stomp-cid;mode=proxy;protocols=STOMP;sniffMaxBytes={SNIFF_MAX_BYTES};"
    f"handshake-timeout={HANDSHAKE_TIMEOUT_S}",
    "stomp-user": "router=stomp-user;mode=proxy;protocols=STOMP",
    "mqtt-proxy": "router=mqtt-cid;mode=proxy;protocols=MQTT",
    "stomp-dead": "router=dead-pool;mode=proxy;protocols=STOMP",
}
ROUTERS = {  # name: (key type, broker connector it routes to)
    "ow": ("CLIENT_ID", "openwire"),
    "ow-user": ("USER_NAME", "openwire"),
    "stomp-cid": ("CLIENT_ID", "stomp"),
    "stomp-user": ("USER_NAME", "stomp"),
    "mqtt-cid": ("CLIENT_ID", "mqtt"),
}

# --- Java: Debian's ActiveMQ broker and client (ENVIRONMENT.md §3.3, §5) ------------------------

_PROBE_JAVA = """
import javax.jms.*;
import org.apache.activemq.ActiveMQConnection;
import org.apache.activemq.ActiveMQConnectionFactory;

/** Probe URL USER PASSWORD CLIENT_ID...: one connection per client id, each sends one message to
 *  its own queue and receives it back, then prints where it is connected. */
public class Probe {
  public static void main(String[] a) throws Exception {
    for (int i = 3; i < a.length; i++) {
      String id = a[i];
      Connection c = new ActiveMQConnectionFactory(a[1], a[2], a[0]).createConnection();
      try {
        c.setClientID(id);
        c.start();
        Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue q = s.createQueue("probe." + id);
        MessageConsumer consumer = s.createConsumer(q);
        s.createProducer(q).send(s.createTextMessage("hello-" + id));
        TextMessage m = (TextMessage) consumer.receive(10000);
        System.out.println("client=" + id + " got=" + (m == null ? null : m.getText())
            + " broker=" + ((ActiveMQConnection) c).getBrokerName()
            + " remote=" + ((ActiveMQConnection) c).getTransport().getRemoteAddress());
      } finally {
        c.close();
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ActiveMQ]]:
    """The two brokers, started in parallel; stopped at the end of the module."""
    require_java()
    started = {name: ActiveMQ(name, tmp_path_factory.mktemp(name)) for name in NODE_IDS}
    try:
        for broker in started.values():
            broker.start()
        for broker in started.values():
            broker.wait_ready()
        yield started
    finally:
        for broker in started.values():
            broker.stop()


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Probe.java compiled with javac against the Debian client jars."""
    require_java()
    out = tmp_path_factory.mktemp("probe")
    (out / "Probe.java").write_text(_PROBE_JAVA)
    subprocess.run(
        ["javac", "-cp", ":".join(JAVA_CLIENT_JARS), "-d", str(out), str(out / "Probe.java")],
        check=True,
        timeout=TIMEOUT_S * 3,
    )
    return out


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What the Java probe printed for one client id."""

    got: str
    broker: str
    remote: str


def _run_probe(
    probe_dir: Path, url: str, client_ids: list[str], *, user: str = "app-user"
) -> dict[str, ProbeResult]:
    """Run the Java client: one session per client id (send + receive one message); where it was."""
    done = subprocess.run(
        [
            "java",
            "-cp",
            ":".join([*JAVA_CLIENT_JARS, str(probe_dir)]),
            "Probe",
            url,
            user,
            "app-secret",
            *client_ids,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 3,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = {}
    for line in done.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split())
        results[fields["client"]] = ProbeResult(
            got=fields["got"], broker=fields["broker"], remote=fields["remote"]
        )
    assert sorted(results) == sorted(client_ids), done.stdout + done.stderr
    return results


# --- routerd ----------------------------------------------------------------------------------


def _config(brokers: dict[str, ActiveMQ], ports: dict[str, int], *, dead_port: int) -> str:
    connectors = "\n".join(
        f'<connector name="{name}-{proto}">tcp://127.0.0.1:{port}?nodeId={name}</connector>'
        for name, broker in brokers.items()
        for proto, port in (("openwire", broker.openwire), ("stomp", broker.stomp), ("mqtt", broker.mqtt))
    )
    pool = "<check-period>1000</check-period><quorum-timeout>0</quorum-timeout>"
    routers = "\n".join(
        f"""<connection-router name="{name}"><key-type>{key}</key-type><policy name="CONSISTENT_HASH"/>
    <pool>{pool}<static-connectors>{"".join(f"<connector-ref>{n}-{proto}</connector-ref>" for n in brokers)}
    </static-connectors></pool></connection-router>"""
        for name, (key, proto) in ROUTERS.items()
    )
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}
    <connector name="nowhere">tcp://127.0.0.1:{dead_port}?nodeId=nowhere</connector></connectors>
  <acceptors>{acceptors_xml(ACCEPTORS, ports)}</acceptors>
  <connection-routers>{routers}
   <connection-router name="dead-pool"><key-type>CLIENT_ID</key-type><policy name="FIRST_ELEMENT"/>
    <pool>{pool}<static-connectors><connector-ref>nowhere</connector-ref></static-connectors></pool>
   </connection-router>
  </connection-routers>
</core></configuration>"""


@dataclass(frozen=True, slots=True)
class Routed:
    router: Routerd
    ports: dict[str, int]
    brokers: dict[str, ActiveMQ]


@pytest.fixture(scope="module")
def routed(brokers: dict[str, ActiveMQ], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    """One routerd for the module, every broker target ready and the dead one known dead."""
    ports = {name: free_port() for name in ACCEPTORS}
    dead_port = free_port()
    router = Routerd(
        tmp_path_factory.mktemp("routerd"), lambda _admin: _config(brokers, ports, dead_port=dead_port)
    )
    try:
        router.start()
        # The first probes run at once; lines come in any order, so none is consumed.
        for name in ROUTERS:
            for node_id in NODE_IDS:
                router.wait_for_log(rf"router={name} target={node_id} is ready", TIMEOUT_S, consume=False)
        router.wait_for_log(r"router=dead-pool target=nowhere is not ready", TIMEOUT_S, consume=False)
        yield Routed(router, ports, brokers)
    finally:
        router.stop()


def _predict(router: Routerd, name: str, flag: str, values: list[str]) -> dict[str, dict[str, str]]:
    """`routerctl route --config … --router NAME FLAG VALUE` for each value."""
    return {
        value: {k: str(v) for k, v in d.items()} for value, d in router.predict(name, flag, values).items()
    }


def _predicted_nodes(router: Routerd, name: str, flag: str, values: list[str]) -> dict[str, str]:
    nodes = {k: v["node_id"] for k, v in _predict(router, name, flag, values).items()}
    assert set(nodes.values()) == set(NODE_IDS), f"{values} must land on both brokers, got {nodes}"
    return nodes


# --- STOMP and MQTT clients ----------------------------------------------------------------------


class _Inbox(stomp.ConnectionListener):  # type: ignore[misc]  # stomp.py is untyped
    """What a stomp.py connection received, with bounded waits."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.connected = False
        self.errors: list[str] = []
        self.receipts: set[str] = set()
        self.messages: list[tuple[str, str]] = []
        """(destination, body) in arrival order."""

    def on_connected(self, frame: stomp.utils.Frame) -> None:
        with self._cond:
            self.connected = True
            self._cond.notify_all()

    def on_error(self, frame: stomp.utils.Frame) -> None:
        with self._cond:
            self.errors.append(str(frame.headers.get("message")))
            self._cond.notify_all()

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        with self._cond:
            self.receipts.add(str(frame.headers["receipt-id"]))
            self._cond.notify_all()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        with self._cond:
            self.messages.append((str(frame.headers["destination"]), str(frame.body)))
            self._cond.notify_all()

    def wait_receipt(self, receipt: str) -> None:
        self.wait(lambda: receipt in self.receipts, f"RECEIPT {receipt!r}")

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate() or bool(self.errors), TIMEOUT_S):
                raise AssertionError(f"no {what} within {TIMEOUT_S} s")
            assert not self.errors, f"STOMP ERROR while waiting for {what}: {self.errors}"


def _stomp_connect(port: int, *, login: str, client_id: str) -> tuple[stomp.Connection12, _Inbox]:
    """A stomp.py 1.2 session. `wait=True` would block without a bound (stomp.py 9 waits for
    CONNECTED in an endless loop), so we wait for on_connected ourselves."""
    conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1, timeout=TIMEOUT_S)
    inbox = _Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(login, "secret", wait=False, headers={"client-id": client_id})
    inbox.wait(lambda: inbox.connected, "CONNECTED")
    return conn, inbox


def _stomp_round_trip(port: int, *, login: str, client_id: str, destination: str) -> None:
    """Subscribe to `destination`, send one message to it, receive it back, all through `port`."""
    conn, inbox = _stomp_connect(port, login=login, client_id=client_id)
    try:
        # The receipt says the subscription exists before we publish to the topic.
        conn.subscribe(destination, id="1", ack="auto", headers={"receipt": "sub-1"})
        inbox.wait_receipt("sub-1")
        conn.send(destination, f"hello-{client_id}")
        inbox.wait(lambda: (destination, f"hello-{client_id}") in inbox.messages, f"MESSAGE on {destination}")
    finally:
        conn.disconnect()


class _Observer:
    """A STOMP subscriber on each broker, directly, to `/topic/keys.>`: which broker saw a topic."""

    def __init__(self, brokers: dict[str, ActiveMQ]) -> None:
        self._conns: list[tuple[str, stomp.Connection12, _Inbox]] = []
        try:
            for name, broker in brokers.items():
                conn, inbox = _stomp_connect(broker.stomp, login="observer", client_id=f"obs-{uuid.uuid4()}")
                self._conns.append((name, conn, inbox))
                conn.subscribe("/topic/keys.>", id="obs", ack="auto", headers={"receipt": "obs"})
                inbox.wait_receipt("obs")
        except BaseException:
            self.close()
            raise

    def where(self, destination: str) -> list[str]:
        """The brokers that delivered `destination`, once one did (the two brokers are not networked,
        so a message published on one never shows up on the other)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            seen = [
                name for name, _, inbox in self._conns if any(d == destination for d, _ in inbox.messages)
            ]
            if seen:
                return seen
            time.sleep(0.02)  # observers fill their inboxes from stomp.py's receiver threads
        return []

    def close(self) -> None:
        for _, conn, _ in self._conns:
            conn.disconnect()


@pytest.fixture
def observer(routed: Routed) -> Iterator[_Observer]:
    obs = _Observer(routed.brokers)
    yield obs
    obs.close()


def _mqtt_round_trip(port: int, *, client_id: str, topic: str) -> None:
    """MQTT 3.1.1 through `port`: subscribe to `topic`, publish one QoS 1 message, receive it."""
    connected, subscribed, received = threading.Event(), threading.Event(), threading.Event()
    refused: list[object] = []
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv311
    )

    def on_connect(_c: mqtt.Client, _u: object, _f: object, reason: object, _p: object) -> None:
        if getattr(reason, "is_failure", False):
            refused.append(reason)
        connected.set()

    client.on_connect = on_connect
    client.on_subscribe = lambda *_a: subscribed.set()
    client.on_message = lambda _c, _u, msg: received.set() if msg.topic == topic else None
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert connected.wait(TIMEOUT_S), "no CONNACK"
        assert not refused, refused
        client.subscribe(topic, qos=1)
        assert subscribed.wait(TIMEOUT_S), "no SUBACK"
        published = client.publish(topic, client_id.encode(), qos=1)
        published.wait_for_publish(TIMEOUT_S)
        assert published.is_published(), "no PUBACK"
        assert received.wait(TIMEOUT_S), "own message not received"
    finally:
        client.disconnect()
        client.loop_stop()


T = TypeVar("T")


class _Background(Generic[T]):
    """A blocking call in a thread, so that a second client runs while the first is pending."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._call = call
        self._result: list[T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result.append(self._call())
        except BaseException as exc:  # re-raised by result()
            self._error.append(exc)

    def result(self) -> T:
        self._thread.join(TIMEOUT_S * 3)
        assert not self._thread.is_alive(), "background client still running"
        if self._error:
            raise self._error[0]
        return self._result[0]


# --- 1. OpenWire proxy ----------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("options", ["", "?wireFormat.tightEncodingEnabled=false"], ids=["tight", "loose"])
def test_openwire_proxy_java_client_lands_on_predicted_broker(
    routed: Routed, probe_dir: Path, options: str
) -> None:
    """Scenario: the Java client behind routerd's echo, replay and preamble drop completes a
    session (send + receive) on the broker `routerctl route --client-id` predicts."""
    predicted = _predicted_nodes(routed.router, "ow", "--client-id", OPENWIRE_IDS)
    port = routed.ports["ow-proxy"]
    results = _run_probe(probe_dir, f"tcp://127.0.0.1:{port}{options}", OPENWIRE_IDS)
    for client_id, result in results.items():
        assert result.got == f"hello-{client_id}", client_id
        assert result.broker == predicted[client_id], client_id
        assert result.remote == f"tcp://127.0.0.1:{port}", client_id  # through routerd, not around it
        # Logged when routerd connected, before the session; the wait only covers its stderr pipe.
        routed.router.wait_for_log(
            rf"router=ow key={client_id} target={predicted[client_id]} outcome=OK", TIMEOUT_S, consume=False
        )


@pytest.mark.integration
def test_openwire_proxy_by_user_name_lands_on_predicted_broker(routed: Routed, probe_dir: Path) -> None:
    """Scenario: key USER_NAME read from ConnectionInfo.userName; each user's session (send +
    receive) runs on the broker `routerctl route --user` predicts."""
    predicted = _predicted_nodes(routed.router, "ow-user", "--user", STOMP_USERS)
    assert set(predicted.values()) == set(NODE_IDS), "the users must cover both brokers"
    port = routed.ports["ow-user"]
    for user in STOMP_USERS:
        (result,) = _run_probe(probe_dir, f"tcp://127.0.0.1:{port}", [f"owu-{user}"], user=user).values()
        assert result.got == f"hello-owu-{user}", user
        assert result.broker == predicted[user], user


# --- 2. OpenWire redirect -------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("options", ["", "?wireFormat.tightEncodingEnabled=false"], ids=["tight", "loose"])
def test_openwire_redirect_failover_client_reconnects_to_predicted_broker(
    routed: Routed, probe_dir: Path, options: str
) -> None:
    """Scenario: the failover client gets routerd's ConnectionControl, reconnects to the predicted
    broker's connector and sends + receives its message there."""
    decisions = _predict(routed.router, "ow", "--client-id", REDIRECT_IDS)
    assert {d["node_id"] for d in decisions.values()} == set(NODE_IDS)
    port = routed.ports["ow-redirect"]
    url = (
        f"failover:(tcp://127.0.0.1:{port}{options})"
        "?reconnectSupported=true&updateURIsSupported=true&maxReconnectAttempts=5"
    )
    results = _run_probe(probe_dir, url, REDIRECT_IDS)
    for client_id, result in results.items():
        assert result.got == f"hello-{client_id}", client_id
        assert result.broker == decisions[client_id]["node_id"], client_id
        assert result.remote == decisions[client_id]["connector"], client_id  # the broker itself
        # Logged before the redirect was sent; the wait only covers routerd's stderr pipe.
        routed.router.wait_for_log(
            rf"router=ow key={client_id} target={decisions[client_id]['node_id']} outcome=REDIRECT "
            "protocol=openwire",
            TIMEOUT_S,
            consume=False,
        )


# --- 3. STOMP proxy ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_stomp_proxy_by_client_id_lands_on_predicted_broker(routed: Routed, observer: _Observer) -> None:
    """Scenario: stomp.py sends and receives through routerd by its `client-id` header; the
    observers see the message only on the predicted broker."""
    predicted = _predicted_nodes(routed.router, "stomp-cid", "--client-id", STOMP_IDS)
    for client_id in STOMP_IDS:
        destination = f"/topic/keys.stomp.{client_id}"
        _stomp_round_trip(
            routed.ports["stomp-proxy"], login="app-user", client_id=client_id, destination=destination
        )
        assert observer.where(destination) == [predicted[client_id]], client_id


@pytest.mark.integration
def test_stomp_proxy_by_user_name_lands_on_predicted_broker(routed: Routed, observer: _Observer) -> None:
    """Scenario: as above, routed by the `login` header."""
    predicted = _predicted_nodes(routed.router, "stomp-user", "--user", STOMP_USERS)
    for user in STOMP_USERS:
        destination = f"/topic/keys.user.{user}"
        _stomp_round_trip(
            routed.ports["stomp-user"], login=user, client_id=f"c-{uuid.uuid4()}", destination=destination
        )
        assert observer.where(destination) == [predicted[user]], user


# --- 4. MQTT 3.1.1 proxy ------------------------------------------------------------------------------


@pytest.mark.integration
def test_mqtt311_proxy_by_client_id_lands_on_predicted_broker(routed: Routed, observer: _Observer) -> None:
    """Scenario: paho (MQTT 3.1.1) publishes and receives through routerd by client id; the
    message appears only on the predicted broker."""
    predicted = _predicted_nodes(routed.router, "mqtt-cid", "--client-id", MQTT_IDS)
    for client_id in MQTT_IDS:
        _mqtt_round_trip(routed.ports["mqtt-proxy"], client_id=client_id, topic=f"keys/mqtt/{client_id}")
        # ActiveMQ maps the MQTT topic keys/mqtt/X to the JMS topic keys.mqtt.X.
        assert observer.where(f"/topic/keys.mqtt.{client_id}") == [predicted[client_id]], client_id


# --- 5. STOMP refusal ----------------------------------------------------------------------------------

STOMP_CONNECT = (
    b"CONNECT\naccept-version:1.2\nhost:127.0.0.1\nlogin:app-user\npasscode:secret\nclient-id:raw-1\n\n\x00"
)


def _parse_stomp_frame(frame: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = frame.partition(b"\n\n")
    command, *lines = head.decode().split("\n")
    headers = dict(line.split(":", 1) for line in lines)
    return command, headers, body


@pytest.mark.integration
def test_stomp_refusal_dead_pool_gets_error_frame_then_close(routed: Routed) -> None:
    """Scenario: SPEC A6, STOMP REFUSED_UNAVAILABLE: an ERROR frame whose message names the router
    and says it is not ready, then routerd closes the connection."""
    with socket.create_connection(("127.0.0.1", routed.ports["stomp-dead"]), timeout=TIMEOUT_S) as sock:
        sock.sendall(STOMP_CONNECT)
        answer = read_until_closed(sock)  # returns at routerd's close (the socket timeout bounds it)
    assert answer.endswith(b"\x00"), answer
    assert answer.count(b"\x00") == 1, f"one frame expected: {answer!r}"
    command, headers, _ = _parse_stomp_frame(answer[:-1])
    assert command == "ERROR"
    assert "dead-pool" in headers["message"], headers
    assert "not ready" in headers["message"], headers
    # routerd logs the decision before it answers; the wait only covers its stderr pipe.
    routed.router.wait_for_log(
        r"router=dead-pool key=raw-1 outcome=REFUSED_UNAVAILABLE", TIMEOUT_S, consume=False
    )


# --- 6. Bad openings -----------------------------------------------------------------------------------


def _wfi(size: int, body: bytes = b"") -> bytes:
    """An OpenWire WireFormatInfo frame head: size prefix, data type 1, magic, version 12."""
    return struct.pack(">i", size) + b"\x01ActiveMQ" + struct.pack(">i", 12) + body


# The smallest complete WireFormatInfo: no properties (size = type + magic + version + flag).
_MINIMAL_WFI = _wfi(14, b"\x00")
# A WireFormatInfo announcing 2000 bytes of properties, cut after 1100 bytes: well-formed as far
# as it goes, but longer than the acceptor's sniffMaxBytes.
_OVERSIZED_WFI = (_wfi(2000, b"\x01" + struct.pack(">i", 1986)) + b"\x00" * 2000)[:1100]
_STOMP_OVERSIZED = (b"CONNECT\naccept-version:1.2\nx-pad:" + b"a" * 2000)[:1100]

BAD_OPENINGS = [
    # (acceptor, protocol, opening, half-close after it, log reason, closed by the deadline)
    pytest.param(
        "stomp-proxy",
        "stomp",
        STOMP_CONNECT[:30],
        True,
        r"handshake rejected: \"client closed after 30 bytes",
        False,
        id="stomp-truncated-then-eof",
    ),
    pytest.param(
        "stomp-proxy",
        "stomp",
        STOMP_CONNECT[:30],
        False,
        r"not complete after 2 s",
        True,
        id="stomp-truncated-then-silent",
    ),
    pytest.param(
        "stomp-proxy",
        "stomp",
        b"CONNECT\nthis line has no colon\n\n\x00",
        False,
        r"handshake rejected: \"header line without a colon",
        False,
        id="stomp-garbage",
    ),
    pytest.param(
        "stomp-proxy",
        "stomp",
        b"C",
        False,
        r"not complete after 2 s",
        True,
        id="stomp-stall-after-first-byte",
    ),
    pytest.param(
        "stomp-proxy",
        "stomp",
        _STOMP_OVERSIZED,
        False,
        rf"handshake rejected: \"no complete handshake in the first {SNIFF_MAX_BYTES} bytes",
        False,
        id="stomp-over-cap",
    ),
    pytest.param(
        "ow-proxy",
        "openwire",
        _OVERSIZED_WFI[:100],
        True,
        r"handshake rejected: \"client closed after 100 bytes",
        False,
        id="openwire-truncated-then-eof",
    ),
    pytest.param(
        "ow-proxy",
        "openwire",
        _OVERSIZED_WFI[:100],
        False,
        r"not complete after 2 s",
        True,
        id="openwire-truncated-then-silent",
    ),
    pytest.param(
        "ow-proxy",
        "openwire",
        _MINIMAL_WFI + b"\x00\x00\x00\x05\xff\xde\xad\xbe\xef",
        False,
        r"handshake rejected: \"unexpected data type 255 before ConnectionInfo",
        False,
        id="openwire-garbage",
    ),
    pytest.param(
        "ow-proxy",
        "openwire",
        b"\x00",
        False,
        r"not complete after 2 s",
        True,
        id="openwire-stall-after-first-byte",
    ),
    pytest.param(
        "ow-proxy",
        "openwire",
        _OVERSIZED_WFI,
        False,
        rf"handshake rejected: \"no complete handshake in the first {SNIFF_MAX_BYTES} bytes",
        False,
        id="openwire-over-cap",
    ),
]


def _good_client(routed: Routed, acceptor: str, probe_dir: Path) -> Callable[[], None]:
    """A well-behaved client of the acceptor: a full session through routerd."""
    port = routed.ports[acceptor]
    if acceptor == "ow-proxy":

        def openwire() -> None:
            result = _run_probe(probe_dir, f"tcp://127.0.0.1:{port}", ["ow-good"])["ow-good"]
            assert result.got == "hello-ow-good"
            assert result.broker in NODE_IDS

        return openwire

    def stomp_client() -> None:
        client_id = f"good-{uuid.uuid4()}"
        _stomp_round_trip(port, login="app-user", client_id=client_id, destination=f"/queue/good.{client_id}")

    return stomp_client


@pytest.mark.integration
@pytest.mark.parametrize(("acceptor", "protocol", "opening", "eof", "reason", "by_deadline"), BAD_OPENINGS)
def test_bad_opening_closed_with_one_log_line_while_good_client_served(
    routed: Routed,
    probe_dir: Path,
    acceptor: str,
    protocol: str,
    opening: bytes,
    eof: bool,
    reason: str,
    by_deadline: bool,
) -> None:
    """Scenario: SPEC Part B sniffing: a bad opening is closed within the handshake deadline with one
    log line naming the peer and the protocol, while a good client on the same acceptor is served."""
    router = routed.router
    logged_before = router.mark()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", routed.ports[acceptor]), timeout=TIMEOUT_S) as bad:
        peer = "{}:{}".format(*bad.getsockname())
        bad.sendall(opening)
        if eof:
            bad.shutdown(socket.SHUT_WR)
        good = _Background(_good_client(routed, acceptor, probe_dir))
        read_until_closed(bad)  # returns at routerd's close (the socket timeout bounds it)
        elapsed = time.monotonic() - started
        good.result()
    assert elapsed < HANDSHAKE_TIMEOUT_S + CLOSE_SLACK_S, elapsed
    if by_deadline:
        assert elapsed >= HANDSHAKE_TIMEOUT_S - 0.2, f"closed after {elapsed:.2f} s, before the deadline"
    # The log line comes with the close; the wait only covers the pipe from routerd's stderr.
    line = router.wait_for_log(rf"peer={re.escape(peer)} ", 5.0, consume=False)
    assert [entry for entry in router.lines[logged_before:] if f"peer={peer} " in entry] == [line]
    assert f"acceptor={acceptor} " in line, line
    assert re.search(reason, line), line
    # Last, so that a failure here means only this is missing. SPEC Part B and STYLE R7: the line
    # names the protocol (known here: routerd picked the sniffer from the first byte).
    assert f"protocol={protocol} " in line, f"the log line does not name the protocol: {line}"
