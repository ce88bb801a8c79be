"""routerd in front of two real ActiveMQ Classic 5.17 brokers, with real OpenWire, STOMP and MQTT clients.

Two brokers (`amq-a`, `amq-b`; ENVIRONMENT.md §3.3) each serve OpenWire, STOMP and MQTT 3.1.1. One
routerd has an acceptor per scenario: OpenWire proxy and redirect keyed on CLIENT_ID, STOMP proxy
keyed on CLIENT_ID and on USER_NAME, MQTT 3.1.1 proxy keyed on CLIENT_ID (all CONSISTENT_HASH over
the two brokers), and a STOMP acceptor whose only target never answers. Every client lands where
`routerctl route` predicts, proven from the broker's side: the Java client prints the name of the
broker it is connected to, and STOMP observers subscribed directly on each broker see where a
STOMP or MQTT message was published. Refusals and bad openings get what SPEC A6 and Part B say.
An evacuation (issue 13, point 2) moves long-lived Java failover clients off one broker, paced,
and each reconnects to the broker routerd's lookup names (section 7 says what the clients need).

Brokers, the compiled Java probe and routerd are started once per module; every wait is bounded.
"""

from __future__ import annotations

import contextlib
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

from tests.conftest import (
    JAVA_CLIENT_JARS,
    ActiveMQ,
    LineLog,
    eventually,
    free_port,
    read_until_closed,
    require_java,
    stop_process,
)
from tests.router.conftest import Routerd, acceptors_xml, routerctl_json, static_connectors

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


_RESIDENT_JAVA = """
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import javax.jms.*;
import org.apache.activemq.ActiveMQConnection;
import org.apache.activemq.ActiveMQConnectionFactory;
import org.apache.activemq.transport.TransportListener;

/** Resident URL USER PASSWORD SECONDS CLIENT_ID...: one long-lived connection per client id.
 *
 *  Each connection makes a round trip (sends one message to its own queue and receives it back)
 *  and prints "client=ID event=connected got=BODY want=BODY broker=NAME remote=ADDRESS". Then it
 *  stays open; when its transport is interrupted it prints "client=ID event=interrupted", and when
 *  the failover transport has connected it again (to whichever broker) it makes a round trip there
 *  and prints event=resumed. Commands on stdin: "check" makes a round trip on every connection
 *  (event=checked); "quit" (or EOF) closes them all, prints "event=bye" and exits 0. After SECONDS
 *  it prints "event=timeout" and exits 3. The transport callbacks run with the failover
 *  transport's lock held, so they only queue work for the main thread, which does all JMS calls. */
public class Resident {
  static final class Client {
    final String id;
    final ActiveMQConnection connection;
    Session session;
    MessageProducer producer;
    MessageConsumer consumer;
    int rounds;
    volatile boolean settled;

    Client(String id, ActiveMQConnection connection) {
      this.id = id;
      this.connection = connection;
    }

    void roundTrip(String event) throws JMSException {
      String body = "hello-" + id + "-" + ++rounds;
      producer.send(session.createTextMessage(body));
      Message m = consumer.receive(10000);
      String got = m instanceof TextMessage ? ((TextMessage) m).getText() : String.valueOf(m);
      System.out.println("client=" + id + " event=" + event + " got=" + got + " want=" + body
          + " broker=" + connection.getBrokerName()
          + " remote=" + connection.getTransport().getRemoteAddress());
    }
  }

  public static void main(String[] a) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(a[3]));
    BlockingQueue<String[]> work = new LinkedBlockingQueue<>();
    Map<String, Client> clients = new LinkedHashMap<>();
    ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(a[1], a[2], a[0]);
    for (int i = 4; i < a.length; i++) {
      Client client = new Client(a[i], (ActiveMQConnection) factory.createConnection());
      client.connection.addTransportListener(new TransportListener() {
        public void onCommand(Object command) {}
        public void onException(IOException error) {}
        public void transportInterupted() {
          if (client.settled) work.add(new String[] {"interrupted", client.id});
        }
        public void transportResumed() {
          if (client.settled) work.add(new String[] {"resumed", client.id});
        }
      });
      clients.put(client.id, client);
      client.connection.setClientID(client.id);
      client.connection.start();
      client.session = client.connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
      Queue queue = client.session.createQueue("evacuation." + client.id);
      client.consumer = client.session.createConsumer(queue);
      client.producer = client.session.createProducer(queue);
      client.roundTrip("connected");
      // The first connect's transportResumed came before start() could send (it holds the lock).
      client.settled = true;
    }
    Thread stdin = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
        for (String line; (line = in.readLine()) != null; ) {
          work.add(new String[] {line.trim(), null});
        }
      } catch (IOException e) {
        // treated as EOF
      }
      work.add(new String[] {"quit", null});
    });
    stdin.setDaemon(true);
    stdin.start();
    while (true) {
      String[] job = work.poll(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
      if (job == null) {
        System.out.println("event=timeout");
        System.exit(3);
      }
      switch (job[0]) {
        case "interrupted":
          System.out.println("client=" + job[1] + " event=interrupted");
          break;
        case "resumed":
          clients.get(job[1]).roundTrip("resumed");
          break;
        case "check":
          for (Client c : clients.values()) c.roundTrip("checked");
          break;
        case "quit":
          for (Client c : clients.values()) c.connection.close();
          System.out.println("event=bye");
          System.exit(0);
          break;
        default:
          System.out.println("event=unknown command=" + job[0]);
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
    """Probe.java and Resident.java compiled with javac against the Debian client jars."""
    require_java()
    out = tmp_path_factory.mktemp("probe")
    (out / "Probe.java").write_text(_PROBE_JAVA)
    (out / "Resident.java").write_text(_RESIDENT_JAVA)
    subprocess.run(
        [
            "javac",
            "-cp",
            ":".join(JAVA_CLIENT_JARS),
            "-d",
            str(out),
            str(out / "Probe.java"),
            str(out / "Resident.java"),
        ],
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


# --- 7. Evacuation of OpenWire clients ---------------------------------------------------------------
#
# Issue 13, point 2: `routerctl evacuate` moves a broker's long-lived OpenWire clients elsewhere,
# paced. The Java client follows only with the failover: transport (a plain tcp: connection just
# fails): on a proxy acceptor routerd closes each client at a frame boundary and the failover
# transport reconnects to its URL list, routerd itself, which routes the key again with the
# evacuated target drained; with --refer routerd sends a ConnectionControl whose reconnectTo (and
# connectedBrokers, rebalanceConnection) name the broker, and `FailoverTransport.reconnect(URI)`
# replaces the client's URL list with that broker (`reconnectSupported=true`, the default), so it
# then reaches the broker directly. Both brokers of the module serve; each test has its own routerd
# (an evacuation leaves its target drained).

EVACUATION_ROUTER = "ow-evac"
EVACUATED = NODE_IDS[0]
EVACUATION_IDS = {
    # Client ids per case (each only once in the session: a broker refuses a client id in use), half
    # of them on the evacuated broker (checked against `routerctl route` by the test).
    "proxy": ["ev-alice", "ev-bob", "ev-carol", "ev-dave", "ev-erin", "ev-grace", "ev-heidi", "ev-ivan"],
    "refer": ["ev-frank", "ev-judy", "ev-mallory", "ev-olivia", "ev-rupert", "ev-walter"],
}
EVACUATION_RATE = 4.0
"""Connections a second: the evacuated broker's 3 or 4 clients are told over 0.5-0.75 s."""
FAILOVER_OPTIONS = (
    "maxReconnectAttempts=10&startupMaxReconnectAttempts=3&timeout=15000"
    "&reconnectSupported=true&updateURIsSupported=true"
)
"""The failover: options of the moved clients: bounded reconnects and sends (the defaults retry
forever), and the two that let a ConnectionControl redirect them (both true by default)."""
RESIDENT_LIMIT_S = 180
"""The Java residents exit by themselves after this long, whatever happens to the test."""
RESIDENT_JARS = [
    *(jar for jar in JAVA_CLIENT_JARS if not jar.endswith("/slf4j-nop.jar")),
    "/usr/share/java/slf4j-simple.jar",  # same Debian package (libslf4j-java) as slf4j-nop
]
"""The residents' classpath: the client's INFO log (failover reconnects) goes to their stderr,
which a failed wait shows."""


def _evacuation_config(brokers: dict[str, ActiveMQ], port: int) -> str:
    connectors, refs = static_connectors((name, broker.openwire) for name, broker in brokers.items())
    acceptor = acceptors_xml(
        {"ow-evac": f"router={EVACUATION_ROUTER};mode=proxy;protocols=OPENWIRE"}, {"ow-evac": port}
    )
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}</connectors>
  <acceptors>{acceptor}</acceptors>
  <connection-routers>
   <connection-router name="{EVACUATION_ROUTER}"><key-type>CLIENT_ID</key-type>
    <policy name="CONSISTENT_HASH"/><pool><check-period>1000</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors>{refs}</static-connectors></pool>
   </connection-router>
  </connection-routers>
</core></configuration>"""


@pytest.fixture
def evacuation_router(brokers: dict[str, ActiveMQ], tmp_path: Path) -> Iterator[tuple[Routerd, int]]:
    """A routerd of its own for one evacuation (router `ow-evac`, a proxy OpenWire acceptor over
    both brokers), both targets ready; (it, the acceptor's port)."""
    port = free_port()
    router = Routerd(tmp_path, lambda _admin: _evacuation_config(brokers, port))
    try:
        router.start()
        for node_id in NODE_IDS:
            router.wait_for_log(
                rf"router={EVACUATION_ROUTER} target={node_id} is ready", TIMEOUT_S, consume=False
            )
        yield router, port
    finally:
        router.stop()


class _Residents:
    """The Java `Resident` program: one long-lived failover connection per client id, and what
    each reported (`client=ID event=… got=… want=… broker=… remote=…` lines)."""

    def __init__(self, probe_dir: Path, url: str, client_ids: list[str], stderr: Path) -> None:
        self.stderr = stderr
        with stderr.open("w") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    "java",
                    "-cp",
                    ":".join([*RESIDENT_JARS, str(probe_dir)]),
                    "-Dorg.slf4j.simpleLogger.showDateTime=true",
                    "Resident",
                    url,
                    "app-user",
                    "app-secret",
                    str(RESIDENT_LIMIT_S),
                    *client_ids,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        self._out = LineLog(self.proc.stdout, "Resident")

    def wait(self, client_id: str, event: str, timeout: float = TIMEOUT_S) -> dict[str, str]:
        """The first report of `event` by `client_id`, waiting up to `timeout` for it."""
        try:
            match, _ = self._out.search(rf"^client={re.escape(client_id)} event={event}\b", timeout)
        except (TimeoutError, RuntimeError) as exc:
            raise AssertionError(f"{exc}\nResident's stderr:\n{self.stderr.read_text()[-3000:]}") from exc
        return dict(part.split("=", 1) for part in match.string.split())

    def events(self, client_id: str) -> list[str]:
        """The events `client_id` reported so far, in order."""
        self._out.take_in()
        prefix = f"client={client_id} event="
        return [line[len(prefix) :].split()[0] for line in self._out.lines if line.startswith(prefix)]

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def quit(self) -> int:
        """Close every connection and end the program: its exit status."""
        self.command("quit")
        self._out.search(r"^event=bye$", TIMEOUT_S)
        return self.proc.wait(TIMEOUT_S)

    def stop(self) -> None:
        stop_process(self.proc, TIMEOUT_S)
        self._out.close(TIMEOUT_S)
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # nothing unsent matters once it ended
                self.proc.stdin.close()


def _open_connections(router: Routerd) -> dict[str, int]:
    """The proxied connections routerd holds to each target of the evacuation router."""
    status = router.get(f"/api/v1/routers/{EVACUATION_ROUTER}")
    assert isinstance(status, dict)
    return {t["node_id"]: t["connections"] for t in status["pool"]["targets"]}


@pytest.mark.integration
@pytest.mark.parametrize("case", ["proxy", "refer"])
def test_openwire_evacuation_moves_failover_clients_to_the_broker_routerd_names(
    evacuation_router: tuple[Routerd, int], probe_dir: Path, tmp_path: Path, case: str
) -> None:
    """Scenario: long-lived Java failover clients through a proxy acceptor, half of them on amq-a;
    `routerctl evacuate ow-evac amq-a --rate 4 --wait` (with `--refer` in the second case) moves
    exactly those, paced; each reconnects by itself (proxy: through routerd; refer: to the broker
    named by the ConnectionControl) to the broker routerd's dry-run lookup names, and sends and
    receives there; the other clients are not disturbed. The clients use the failover: transport
    (FAILOVER_OPTIONS); a plain tcp: client would just lose its connection."""
    router, port = evacuation_router
    refer = case == "refer"
    client_ids = EVACUATION_IDS[case]
    predicted = _predicted_nodes(router, EVACUATION_ROUTER, "--client-id", client_ids)
    moved_ids = [c for c in client_ids if predicted[c] == EVACUATED]
    kept_ids = [c for c in client_ids if predicted[c] != EVACUATED]
    assert len(moved_ids) >= 3, predicted
    assert len(kept_ids) >= 3, predicted
    via_router = f"tcp://127.0.0.1:{port}"
    residents = _Residents(
        probe_dir, f"failover:({via_router})?{FAILOVER_OPTIONS}", client_ids, tmp_path / "resident.err"
    )
    try:
        for client_id in client_ids:
            report = residents.wait(client_id, "connected", TIMEOUT_S * 2)
            assert report["got"] == report["want"], report
            assert (report["broker"], report["remote"]) == (predicted[client_id], via_router), report
        before = {node_id: sum(predicted[c] == node_id for c in client_ids) for node_id in NODE_IDS}
        assert eventually(lambda: _open_connections(router) == before, TIMEOUT_S), _open_connections(router)

        refer_flag = ["--refer"] if refer else []
        code, status = routerctl_json(
            router,
            "evacuate",
            EVACUATION_ROUTER,
            EVACUATED,
            "--rate",
            str(EVACUATION_RATE),
            *refer_flag,
            "--wait",
            "--timeout",
            str(TIMEOUT_S),
        )
        assert code == 0, status
        assert (status["state"], status["moved"], status["left"]) == ("done", len(moved_ids), 0), status
        assert isinstance(status["started_at"], float)
        assert isinstance(status["finished_at"], float)
        # Paced: the first at once, then one every 1/rate s (not all at once).
        assert status["finished_at"] - status["started_at"] >= (len(moved_ids) - 1) / EVACUATION_RATE - 0.05

        now_on = dict(predicted)
        for client_id in moved_ids:
            lookup = router.get(f"/api/v1/routers/{EVACUATION_ROUTER}/target?key={client_id}&dry-run=true")
            assert isinstance(lookup, dict)
            assert lookup["status"] == "OK", lookup
            assert lookup["node_id"] != EVACUATED, lookup  # drained
            now_on[client_id] = lookup["node_id"]
            report = residents.wait(client_id, "resumed")
            assert report["got"] == report["want"], report
            assert report["broker"] == lookup["node_id"], report
            assert report["remote"] == (lookup["connector"] if refer else via_router), report

        # Every client still works, each where it should be, and only the moved ones noticed.
        residents.command("check")
        for client_id in client_ids:
            report = residents.wait(client_id, "checked")
            assert report["got"] == report["want"], report
            assert report["broker"] == now_on[client_id], report
        for client_id in kept_ids:
            assert residents.events(client_id) == ["connected", "checked"], client_id
        for client_id in moved_ids:
            events = residents.events(client_id)
            if refer:  # the ConnectionControl reconnects it; the close may or may not come first
                events = [e for e in events if e != "interrupted"]
                assert events == ["connected", "resumed", "checked"], (client_id, residents.events(client_id))
            else:  # the close interrupts the transport, then the failover transport reconnects
                assert events == ["connected", "interrupted", "resumed", "checked"], client_id
        # routerd holds the moved clients' connections to the other broker (proxy), or none (refer).
        after = {EVACUATED: 0, NODE_IDS[1]: len(kept_ids) if refer else len(client_ids)}
        assert eventually(lambda: _open_connections(router) == after, TIMEOUT_S), _open_connections(router)
        assert residents.quit() == 0

        closed = rf"router={EVACUATION_ROUTER} target={EVACUATED} closed .* reason=evacuated"
        for _ in moved_ids:
            router.wait_for_log(closed)  # each moved connection's closed line (in order, from the start)
        router.wait_for_log(
            rf"router={EVACUATION_ROUTER} evacuate of target={EVACUATED} done: moved={len(moved_ids)} left=0",
            consume=False,
        )
        router.mark()
        assert len([line for line in router.lines if re.search(closed, line)]) == len(moved_ids)
    finally:
        residents.stop()
