"""routerd with protocol keys and native redirect, against real mosquitto and real paho clients.

Keys CLIENT_ID and USER_NAME read from the MQTT CONNECT (3.1.1 and 5) in proxy mode; MQTT 5
redirect (CONNACK 0x9C + Server Reference) in redirect mode; auto mode; refusals on the wire;
bad openings closed within the deadline while a well-behaved client is served.
"""

from __future__ import annotations

import importlib.util
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.conftest import read_until_closed
from tests.router.conftest import MqttObserver, acceptors_xml, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd

ROOT = Path(__file__).resolve().parents[2]
NODE_IDS = ["node4", "node9", "node20"]
TIMEOUT_S = 10.0
CLIENT_IDS = [f"sensor-{i}" for i in range(12)]

# MQTT 3.1.1 CONNECT, client id "raw-1", clean session, keepalive 60 (MQTT 3.1.1 §3.1).
CONNECT_311 = bytes.fromhex("10 11 0004 4d515454 04 02 003c 0005 7261772d31".replace(" ", ""))
# The first 1100 bytes of a valid MQTT 3.1.1 CONNECT of 2048 bytes (client id of 2036 bytes):
# well-formed as far as it goes, but longer than the acceptor's sniffMaxBytes=1024.
OVERSIZED_CONNECT_PREFIX = (
    bytes.fromhex("10 8010 0004 4d515454 04 02 003c 07f4".replace(" ", "")) + b"a" * 2036
)[:1100]
# MQTT 5 CONNECT, client id "raw-5", clean start, keepalive 60, no properties (MQTT 5 §3.1).
CONNECT_5 = bytes.fromhex("10 12 0004 4d515454 05 02 003c 00 0005 7261772d35".replace(" ", ""))


def _config(brokers: list[Mosquitto], ports: dict[str, int], *, dead_port: int) -> str:
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    acceptors = {
        "by-client-id": "router=by-client-id;mode=proxy;handshake-timeout=2;sniffMaxBytes=1024",
        "by-user": "router=by-user;mode=proxy",
        "redirect": "router=by-client-id;mode=redirect",
        "auto": "router=by-client-id;mode=auto",
        "dead": "router=dead;mode=redirect",
    }
    pool = "<check-period>200</check-period><quorum-timeout>0</quorum-timeout>"
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}
    <connector name="nowhere">tcp://127.0.0.1:{dead_port}</connector></connectors>
  <acceptors>{acceptors_xml(acceptors, ports)}</acceptors>
  <connection-routers>
   <connection-router name="by-client-id"><key-type>CLIENT_ID</key-type><policy name="CONSISTENT_HASH"/>
    <pool>{pool}<static-connectors>{refs}</static-connectors></pool></connection-router>
   <connection-router name="by-user"><key-type>USER_NAME</key-type><policy name="CONSISTENT_HASH"/>
    <pool>{pool}<static-connectors>{refs}</static-connectors></pool></connection-router>
   <connection-router name="dead"><key-type>CLIENT_ID</key-type><policy name="FIRST_ELEMENT"/>
    <pool>{pool}<static-connectors><connector-ref>nowhere</connector-ref></static-connectors></pool>
   </connection-router>
  </connection-routers>
</core></configuration>"""


def _observer(brokers: list[Mosquitto]) -> MqttObserver:
    """Direct subscribers to `keys/#` on every broker: which broker saw a topic."""
    return MqttObserver("keys/#", dict(zip(NODE_IDS, (b.port for b in brokers), strict=True)), TIMEOUT_S)


def _publish_through(
    port: int, *, client_id: str, version: MQTTProtocolVersion, user: str | None = None, topic: str
) -> bool:
    connected = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version)
    if user is not None:
        client.username_pw_set(user, "secret")
    client.on_connect = lambda *_a: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        if not connected.wait(TIMEOUT_S):
            return False
        info = client.publish(topic, b"x", qos=1)
        info.wait_for_publish(TIMEOUT_S)  # raises on timeout
        return info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def _raw_exchange(port: int, data: bytes) -> bytes:
    """Send bytes, read until the router closes (bounded); return what came back."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
        s.sendall(data)
        got = bytearray()
        while chunk := s.recv(4096):
            got += chunk
        return bytes(got)


@pytest.fixture
def routed(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> tuple[Routerd, dict[str, int]]:
    ports = {name: free_port() for name in ("by-client-id", "by-user", "redirect", "auto", "dead")}
    router = start_routerd(lambda _admin: _config(mosquitto_fleet, ports, dead_port=free_port()))
    for _ in range(6):
        router.wait_for_log(r"router=by-(client-id|user) target=node\d+ is ready")
    return router, ports


@pytest.mark.integration
@pytest.mark.parametrize("version", [MQTTProtocolVersion.MQTTv311, MQTTProtocolVersion.MQTTv5])
def test_proxy_by_client_id_lands_where_routerctl_predicts(
    routed: tuple[Routerd, dict[str, int]], mosquitto_fleet: list[Mosquitto], version: MQTTProtocolVersion
) -> None:
    router, ports = routed
    predicted = {
        k: v["node_id"] for k, v in router.predict("by-client-id", "--client-id", CLIENT_IDS).items()
    }
    assert len(set(predicted.values())) >= 2, "the client ids must spread"
    with _observer(mosquitto_fleet) as observer:
        for client_id in CLIENT_IDS:
            topic = f"keys/{version.name}/{client_id}"
            assert _publish_through(ports["by-client-id"], client_id=client_id, version=version, topic=topic)
            assert observer.where(topic) == predicted[client_id], client_id


@pytest.mark.integration
def test_proxy_by_user_name_lands_where_routerctl_predicts(
    routed: tuple[Routerd, dict[str, int]], mosquitto_fleet: list[Mosquitto]
) -> None:
    router, ports = routed
    users = [f"user-{i}" for i in range(8)]
    predicted = {k: v["node_id"] for k, v in router.predict("by-user", "--user", users).items()}
    with _observer(mosquitto_fleet) as observer:
        for user in users:
            topic = f"keys/user/{user}"
            assert _publish_through(
                ports["by-user"],
                client_id=f"c-{uuid.uuid4()}",
                user=user,
                version=MQTTProtocolVersion.MQTTv311,
                topic=topic,
            )
            assert observer.where(topic) == predicted[user], user


@pytest.mark.integration
def test_redirect_mqtt5_gets_0x9c_with_predicted_server_reference(
    routed: tuple[Routerd, dict[str, int]],
) -> None:
    router, ports = routed
    connack = _raw_exchange(ports["redirect"], CONNECT_5)
    predicted = router.predict("by-client-id", "--client-id", ["raw-5"])["raw-5"]
    reference = str(predicted["connector"]).removeprefix("tcp://").encode()
    # CONNACK, flags 0, reason 0x9C, properties: Server Reference (0x1C) host:port (MQTT 5 §3.2.2.3.16)
    props = b"\x1c" + len(reference).to_bytes(2, "big") + reference
    body = b"\x00\x9c" + bytes([len(props)]) + props
    assert connack == b"\x20" + bytes([len(body)]) + body


@pytest.mark.integration
def test_redirect_is_followed_by_the_documented_paho_snippet(
    routed: tuple[Routerd, dict[str, int]],
) -> None:
    router, ports = routed
    spec = importlib.util.spec_from_file_location("follow", ROOT / "docs/examples/follow_redirect_paho.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    client = module.connect_following_redirects("127.0.0.1", ports["redirect"], "follower-1")
    try:
        expected = str(
            router.predict("by-client-id", "--client-id", ["follower-1"])["follower-1"]["connector"]
        )
        assert f"tcp://{client.host}:{client.port}" == expected
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.integration
def test_auto_mode_redirects_mqtt5_and_proxies_mqtt311(routed: tuple[Routerd, dict[str, int]]) -> None:
    _, ports = routed
    connack = _raw_exchange(ports["auto"], CONNECT_5)
    assert (connack[0], connack[2:4]) == (0x20, b"\x00\x9c")  # CONNACK "Use another server"
    with socket.create_connection(("127.0.0.1", ports["auto"]), timeout=TIMEOUT_S) as s:
        s.sendall(CONNECT_311)
        assert s.recv(4) == b"\x20\x02\x00\x00"  # mosquitto's own CONNACK, accepted: proxied


@pytest.mark.integration
@pytest.mark.parametrize(
    ("connect", "connack"),
    [(CONNECT_5, b"\x20\x03\x00\x88\x00"), (CONNECT_311, b"\x20\x02\x00\x88")],
)
def test_refusal_unavailable_is_connack_0x88(
    routed: tuple[Routerd, dict[str, int]], connect: bytes, connack: bytes
) -> None:
    router, ports = routed
    router.wait_for_log(r"router=dead target=nowhere is not ready", consume=False)
    assert _raw_exchange(ports["dead"], connect) == connack


@pytest.mark.integration
@pytest.mark.parametrize(
    ("opening", "log_pattern"),
    [
        (b"\x10\xff\xff\xff\xff\x01", r"protocol=mqtt handshake rejected: .*remaining length"),
        (b"GET / HTTP/1.1\r\n\r\n", r'protocol=detect handshake rejected: "unknown protocol'),
        (  # rejected when the remaining length arrives, not after 1024 bytes or at the deadline
            OVERSIZED_CONNECT_PREFIX[:5],
            r'protocol=mqtt handshake rejected: "the opening announces 2051 bytes, over the '
            r"acceptor's cap of 1024 \(sniffMaxBytes\)",
        ),
        (b"\x10", r"protocol=mqtt handshake not complete after 2 s \(1 bytes\)"),
        (CONNECT_311[:9], r"protocol=mqtt handshake not complete after 2 s \(9 bytes\)"),
    ],
    ids=["bad-remaining-length", "garbage", "over-cap", "stall-after-first-byte", "truncated"],
)
def test_bad_openings_are_closed_while_a_good_client_is_served(
    routed: tuple[Routerd, dict[str, int]], opening: bytes, log_pattern: str
) -> None:
    router, ports = routed
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", ports["by-client-id"]), timeout=TIMEOUT_S) as bad:
        bad.sendall(opening)
        # Meanwhile a well-behaved client on the same acceptor gets its session.
        with socket.create_connection(("127.0.0.1", ports["by-client-id"]), timeout=TIMEOUT_S) as good:
            good.sendall(CONNECT_311)
            assert good.recv(4) == b"\x20\x02\x00\x00"
        read_until_closed(bad)  # closed with unread bytes: a reset is a close too
    assert time.monotonic() - started < 2 + 3  # the handshake deadline, with scheduling slack
    router.wait_for_log(log_pattern)
