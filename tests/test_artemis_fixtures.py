"""The Artemis fixtures of tests/conftest.py work with real clients: the session's three brokers
take MQTT 3.1.1 and 5 (paho-mqtt), CORE (the distribution's `artemis producer/consumer`, and a JMS program
on the standalone client jar), AMQP 1.0 (proton), STOMP (stomp.py) and OpenWire (a JMS program on
ActiveMQ Classic's client) on one acceptor, with a login; the web console is there only on request; and
a replication pair's backup serves the primary's messages after a kill -9 of the primary.
"""

from __future__ import annotations

import base64
import subprocess
import threading
import uuid
from typing import TYPE_CHECKING, Any
from urllib.request import Request, urlopen

import paho.mqtt.client as mqtt
import pytest
import stomp  # type: ignore[import-untyped]  # stomp.py ships no type hints
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from proton import Message
from proton.utils import BlockingConnection

from tests.conftest import (
    ARTEMIS_ACTIVE,
    ARTEMIS_CLIENT_CLASSPATH,
    ARTEMIS_PASSWORD,
    ARTEMIS_TIMEOUT_S,
    ARTEMIS_USER,
    JAVA_CLIENT_JARS,
    Artemis,
    ArtemisPair,
    free_port,
    require_java,
    run_artemis_cli,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.integration

TIMEOUT_S = 15.0
"""Bound of one client exchange."""

_ROUND_TRIP_JAVA = """
import javax.jms.*;

/** RoundTrip URL USER PASSWORD QUEUE BODY: send BODY to QUEUE, receive it, print it (JMS 1.1). */
public class RoundTrip {
  public static void main(String[] a) throws Exception {
    ConnectionFactory factory = NEW_FACTORY;
    Connection connection = factory.createConnection();
    try {
      connection.start();
      Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
      Queue queue = session.createQueue(a[3]);
      session.createProducer(queue).send(session.createTextMessage(a[4]));
      TextMessage got = (TextMessage) session.createConsumer(queue).receive(10000);
      System.out.println("received=" + (got == null ? "nothing" : got.getText()));
    } finally {
      connection.close();
    }
  }
}
"""

_JAVA_CLIENTS = {
    "core": (
        [str(jar) for jar in ARTEMIS_CLIENT_CLASSPATH],
        "new org.apache.activemq.artemis.jms.client.ActiveMQConnectionFactory(a[0], a[1], a[2])",
    ),
    "openwire": (
        JAVA_CLIENT_JARS,
        "new org.apache.activemq.ActiveMQConnectionFactory(a[1], a[2], a[0])",
    ),
}
"""Per protocol: the classpath and the connection factory of a Java client. CORE: Artemis's
standalone client jar; OpenWire: ActiveMQ Classic 5.17's client, from Debian."""


def _cli_send(broker: Artemis, protocol: str, queue: str, body: str, count: int = 1) -> None:
    produced = run_artemis_cli(
        "producer",
        f"--protocol={protocol}",
        f"--url={broker.url}",
        f"--user={ARTEMIS_USER}",
        f"--password={ARTEMIS_PASSWORD}",
        f"--destination=queue://{queue}",
        f"--message={body}",
        f"--message-count={count}",
    )
    assert f"Produced: {count} messages" in produced.stdout, produced.stdout + produced.stderr


def _cli_receive(broker: Artemis, protocol: str, queue: str, count: int = 1) -> list[str]:
    """The bodies `artemis consumer` receives from `queue` (it prints `Received BODY` with --verbose)."""
    consumed = run_artemis_cli(
        "consumer",
        f"--protocol={protocol}",
        f"--url={broker.url}",
        f"--user={ARTEMIS_USER}",
        f"--password={ARTEMIS_PASSWORD}",
        f"--destination=queue://{queue}",
        f"--message-count={count}",
        "--receive-timeout=10000",
        "--verbose",
    )
    bodies = [line.split(" Received ", 1)[1] for line in consumed.stdout.splitlines() if " Received " in line]
    assert f"Consumed: {count} messages" in consumed.stdout, consumed.stdout + consumed.stderr
    return bodies


class TestArtemisBrokers:
    """The session's three brokers."""

    def test_artemis_brokers_run_on_own_ports_with_all_protocols(self, artemis_brokers):
        assert len({broker.port for broker in artemis_brokers}) == 3
        for broker in artemis_brokers:
            assert broker.proc is not None
            assert broker.proc.poll() is None
            line = broker.wait_log(r"AMQ221020: Started \w+ Acceptor", timeout=0)
            assert f"127.0.0.1:{broker.port} " in line
            for protocol in ("CORE", "MQTT", "AMQP", "STOMP", "OPENWIRE"):
                assert protocol in line
            assert "<web" not in (broker.base / "etc" / "bootstrap.xml").read_text()
            assert broker.rss_kib() < 512 * 1024, "-Xmx256M keeps a broker well under 512 MiB"

    @pytest.mark.parametrize("version", [MQTTProtocolVersion.MQTTv311, MQTTProtocolVersion.MQTTv5])
    def test_artemis_brokers_mqtt_round_trip(self, artemis_brokers, version):
        broker = artemis_brokers[0]
        got: list[bytes] = []
        received = threading.Event()

        def on_message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
            got.append(bytes(message.payload))
            received.set()

        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"fixture-{uuid.uuid4()}",
            protocol=version,
        )
        client.username_pw_set(ARTEMIS_USER, ARTEMIS_PASSWORD)
        client.on_message = on_message
        assert client.connect("127.0.0.1", broker.port) == mqtt.MQTT_ERR_SUCCESS
        client.loop_start()
        try:
            topic = f"fixture/{uuid.uuid4()}"
            client.subscribe(topic, qos=1)
            # Until the SUBACK the broker may drop a publish to the topic: publish until one arrives.
            for _ in range(int(TIMEOUT_S / 0.5)):
                client.publish(topic, b"hello artemis", qos=1)
                if received.wait(0.5):
                    break
            assert got[0] == b"hello artemis"
        finally:
            client.loop_stop()
            client.disconnect()

    def test_artemis_brokers_mqtt_refuses_wrong_password(self, artemis_brokers):
        connacks: list[int] = []
        done = threading.Event()

        def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
            connacks.append(reason.value)
            done.set()

        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="wrong", protocol=MQTTProtocolVersion.MQTTv311
        )
        client.username_pw_set(ARTEMIS_USER, "not-the-password")
        client.on_connect = on_connect
        client.connect("127.0.0.1", artemis_brokers[1].port)
        client.loop_start()
        try:
            assert done.wait(TIMEOUT_S)
        finally:
            client.loop_stop()
            client.disconnect()
        assert connacks == [135], "paho's ReasonCode for MQTT 3.1.1's CONNACK 5, not authorized"

    def test_artemis_brokers_cli_core_round_trip(self, artemis_brokers):
        """Scenario: the distribution's own CORE client (`artemis producer`, `artemis consumer`)."""
        broker, queue = artemis_brokers[1], f"fixture.cli.{uuid.uuid4()}"
        _cli_send(broker, "core", queue, "hello over core", count=2)
        assert _cli_receive(broker, "core", queue, count=2) == ["hello over core"] * 2

    def test_artemis_brokers_amqp_round_trip(self, artemis_brokers):
        url = f"amqp://{ARTEMIS_USER}:{ARTEMIS_PASSWORD}@127.0.0.1:{artemis_brokers[2].port}"
        connection = BlockingConnection(url, TIMEOUT_S, allowed_mechs="PLAIN")
        try:
            queue = f"fixture.amqp.{uuid.uuid4()}"
            # Receiver first: an address that AMQP auto-creates is multicast, and a message sent
            # before any queue is bound to it is dropped.
            receiver = connection.create_receiver(queue)
            connection.create_sender(queue).send(Message(body="hello over amqp"))
            assert receiver.receive(timeout=TIMEOUT_S).body == "hello over amqp"
            receiver.accept()
        finally:
            connection.close()

    def test_artemis_brokers_stomp_round_trip(self, artemis_brokers):
        got: list[str] = []
        events = {"connected": threading.Event(), "receipt": threading.Event(), "message": threading.Event()}

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]  # untyped base class
            def on_connected(self, frame: stomp.utils.Frame) -> None:
                events["connected"].set()

            def on_receipt(self, frame: stomp.utils.Frame) -> None:
                events["receipt"].set()

            def on_message(self, frame: stomp.utils.Frame) -> None:
                got.append(frame.body)
                events["message"].set()

        conn = stomp.Connection12([("127.0.0.1", artemis_brokers[2].port)], reconnect_attempts_max=1)
        conn.set_listener("fixture", Listener())
        # wait=False: stomp.py 9 waits for CONNECTED without a bound (tests/router/test_routerd_activemq.py)
        conn.connect(ARTEMIS_USER, ARTEMIS_PASSWORD, wait=False)
        try:
            assert events["connected"].wait(TIMEOUT_S)
            queue = f"fixture.stomp.{uuid.uuid4()}"
            conn.subscribe(queue, id="1", ack="auto", headers={"receipt": "subscribed"})
            assert events["receipt"].wait(TIMEOUT_S)
            conn.send(queue, "hello over stomp")
            assert events["message"].wait(TIMEOUT_S)
            assert got == ["hello over stomp"]
        finally:
            conn.disconnect()

    @pytest.mark.parametrize("protocol", sorted(_JAVA_CLIENTS))
    def test_artemis_brokers_java_client_round_trip(self, artemis_brokers, tmp_path: Path, protocol):
        """Scenario: a JMS program compiled and run with only its client's jars on the classpath
        (for CORE, Artemis's standalone client jar)."""
        require_java()
        jars, new_factory = _JAVA_CLIENTS[protocol]
        classpath = ":".join(jars)
        (tmp_path / "RoundTrip.java").write_text(_ROUND_TRIP_JAVA.replace("NEW_FACTORY", new_factory))
        subprocess.run(
            ["javac", "-cp", classpath, "-d", str(tmp_path), str(tmp_path / "RoundTrip.java")],
            check=True,
            timeout=ARTEMIS_TIMEOUT_S,
        )
        queue = f"fixture.{protocol}.{uuid.uuid4()}"
        ran = subprocess.run(
            [
                *(
                    "java",
                    "-Xmx64m",
                    "-XX:TieredStopAtLevel=1",
                    "-cp",
                    f"{classpath}:{tmp_path}",
                    "RoundTrip",
                ),
                *(artemis_brokers[0].url, ARTEMIS_USER, ARTEMIS_PASSWORD, queue, f"hello over {protocol}"),
            ],
            capture_output=True,
            text=True,
            timeout=ARTEMIS_TIMEOUT_S,
            check=False,
        )
        assert f"received=hello over {protocol}" in ran.stdout, ran.stdout + ran.stderr
        assert "No SLF4J providers" not in ran.stderr


def test_make_artemis_web_console_on_request(make_artemis: Callable[..., Artemis]):
    """Scenario: a broker made with a web port serves Jolokia there, behind the same login."""
    broker = make_artemis("web", web_port=free_port())
    broker.start()
    broker.wait_ready()
    url = (
        f"http://127.0.0.1:{broker.web_port}/console/jolokia/read/"
        'org.apache.activemq.artemis:broker="web"/Name'
    ).replace('"', "%22")
    # jolokia-access.xml allows the origin of --http-host only
    request = Request(url, headers={"Origin": f"http://127.0.0.1:{broker.web_port}"})
    request.add_unredirected_header("Authorization", "Basic " + _basic(ARTEMIS_USER, ARTEMIS_PASSWORD))
    with urlopen(request, timeout=TIMEOUT_S) as answer:
        assert b'"value":"web"' in answer.read()


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_artemis_pair_backup_serves_after_primary_killed(artemis_pair: ArtemisPair):
    """Scenario: a message sent to the primary is consumed from the backup after a kill -9 of the
    primary; the backup logs that it became active."""
    queue = f"fixture.ha.{uuid.uuid4()}"
    _cli_send(artemis_pair.primary, "core", queue, "kept across failover")
    artemis_pair.primary.kill()
    artemis_pair.backup.wait_ready()
    assert "AMQ221037" in artemis_pair.backup.wait_log(r"AMQ221037: .* to become 'active'", timeout=0)
    assert ARTEMIS_ACTIVE in artemis_pair.backup.wait_log(ARTEMIS_ACTIVE, timeout=0)
    assert _cli_receive(artemis_pair.backup, "core", queue) == ["kept across failover"]
