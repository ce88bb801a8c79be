"""routerd and TLS end to end: real mosquitto brokers, real paho clients, certificates from trustme.

Passthrough: three mosquitto brokers with TLS listeners, each with its own certificate for
a.example, b.example and c.example; routerd peeks at the SNI of the ClientHello (acceptor without
`sslEnabled`, key SNI_HOST) and relays the encrypted bytes, so the client's TLS peer is the broker
itself. Termination (`sslEnabled=true`): routerd's certificate, SNI_HOST from the hello, plain MQTT
to the brokers. Client certificates (`trustStorePath`, `needClientAuth=true`, key USER_NAME): the
certificate's CN is the user, before the user name on the wire; a client without a certificate
fails the TLS handshake. USER_NAME from MQTT 5 CONNECTs without TLS.

Every client has a real MQTT session (CONNACK 0, its own publish received back) and lands where
`routerctl route` predicts, proven from the brokers' side: observers subscribed directly on each
broker see which one got the publish. Node ids broker-a/broker-d/broker-g split a/b/c.example over
all three brokers and alice/carol over broker-a/broker-d (each test checks its spread with
`routerctl route`). Every wait is bounded; every process is stopped by its PID.
"""

from __future__ import annotations

import socket
import ssl
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
import pytest
import trustme
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from tests.conftest import free_port
from tests.router.conftest import Mosquitto, MqttObserver, running, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    from tests.router.conftest import Routerd

NODE_IDS = ("broker-a", "broker-d", "broker-g")
"""nodeId of each broker in routerd's connectors, in broker order."""
SNI_NAMES = ("a.example", "b.example", "c.example")
"""Server names: on Artemis's ring over NODE_IDS they land on broker-g, broker-d and broker-a."""
CERT_USERS = ("alice", "carol")
"""Client certificate CNs: alice lands on broker-a, carol on broker-d."""
MQTT5_USERS = tuple(f"user-{i}" for i in range(8))
TIMEOUT_S = 10.0
"""Bound of every wait on a client, a broker or routerd."""
HANDSHAKE_TIMEOUT_S = 3
"""`handshake-timeout` of the acceptors (the TLS handshake is part of the opening)."""


# --- brokers -------------------------------------------------------------------------------------


class TlsMosquitto(Mosquitto):
    """A real mosquitto broker whose `port` is a TLS listener, with its own server certificate.

    A second, plain listener on `plain_port` serves the observers only; routerd's connectors
    point at the TLS port. Run as root, mosquitto 2.0 drops privileges to user mosquitto before
    it loads the certificate files (which are in pytest's 0700 tmp_path), so the configuration
    keeps it at `user root`; as any other user that line has no effect (mosquitto.conf(5)).
    """

    def __init__(self, workdir: Path, name: str, ca: trustme.CA) -> None:
        super().__init__(workdir, name)
        self.plain_port = free_port()
        self.certificate = ca.issue_cert(*SNI_NAMES)
        cert, key, cafile = self.dir / "cert.pem", self.dir / "key.pem", self.dir / "ca.pem"
        self.certificate.cert_chain_pems[0].write_to_path(str(cert))
        self.certificate.private_key_pem.write_to_path(str(key))
        ca.cert_pem.write_to_path(str(cafile))
        self.conf.write_text(
            "user root\nallow_anonymous true\npersistence false\n"
            "log_dest stderr\nlog_type error\nlog_type warning\n"
            f"listener {self.port} 127.0.0.1\ncertfile {cert}\nkeyfile {key}\ncafile {cafile}\n"
            f"listener {self.plain_port} 127.0.0.1\n"
        )


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_brokers(tmp_path: Path, ca: trustme.CA) -> Iterator[list[TlsMosquitto]]:
    """Three running mosquitto brokers with TLS listeners, stopped afterwards."""
    yield from running([TlsMosquitto(tmp_path, f"mosquitto-tls-{i}", ca) for i in range(len(NODE_IDS))])


# --- routerd -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Acceptor:
    name: str
    port: int
    key_type: str
    broker_ports: list[int]
    params: str = ""


def _config(acceptor: _Acceptor) -> str:
    """One acceptor and its router: CONSISTENT_HASH over the brokers, named NODE_IDS in order."""
    connectors, refs = static_connectors(zip(NODE_IDS, acceptor.broker_ports, strict=True))
    params = f"router=r;mode=proxy;handshake-timeout={HANDSHAKE_TIMEOUT_S}" + acceptor.params
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}</connectors>
  <acceptors><acceptor name="{acceptor.name}">tcp://127.0.0.1:{acceptor.port}?{params}</acceptor></acceptors>
  <connection-routers>
   <connection-router name="r"><key-type>{acceptor.key_type}</key-type><policy name="CONSISTENT_HASH"/>
    <pool><check-period>500</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors>{refs}</static-connectors></pool></connection-router>
  </connection-routers>
</core></configuration>"""


def _start(start_routerd: Callable[[Callable[[int], str]], Routerd], acceptor: _Acceptor) -> Routerd:
    router = start_routerd(lambda _admin: _config(acceptor))
    for _ in acceptor.broker_ports:
        router.wait_for_log(r"router=r target=broker-\w is ready")
    return router


def _predict(router: Routerd, flag: str, values: tuple[str, ...]) -> dict[str, str]:
    """`routerctl route --router r FLAG VALUE` for each value: the node id it predicts."""
    decisions = router.predict("r", flag, values)
    for decision in decisions.values():
        assert decision["status"] == "OK", decision
    return {value: str(d["node_id"]) for value, d in decisions.items()}


# --- clients -------------------------------------------------------------------------------------


class ClientContext(ssl.SSLContext):
    """A client context that can send a given SNI, and keeps the sockets it wrapped.

    paho wraps its socket with `server_hostname=<the host it connects to>`, and we cannot map
    a.example to 127.0.0.1 in /etc/hosts; so paho connects to 127.0.0.1 and this context puts
    `server_name` in the ClientHello instead (and checks the certificate against it: CERT_REQUIRED
    and check_hostname stay on). paho does not close the socket of a failed TLS handshake, so
    `close()` does.
    """

    server_name: str | None = None
    wrapped: list[ssl.SSLSocket]

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        wrapped = super().wrap_socket(
            sock,
            server_side=server_side,
            do_handshake_on_connect=do_handshake_on_connect,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=server_hostname if self.server_name is None else self.server_name,
            session=session,
        )
        self.wrapped.append(wrapped)
        return wrapped

    def close(self) -> None:
        for wrapped in self.wrapped:
            wrapped.close()


def _client_context(ca: trustme.CA, server_name: str | None = None) -> ClientContext:
    context = ClientContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    ca.configure_trust(context)
    context.server_name = server_name
    context.wrapped = []
    return context


def _with_context(context: ssl.SSLContext) -> Callable[[mqtt.Client], None]:
    def configure(client: mqtt.Client) -> None:
        client.tls_set_context(context)
        client.tls_insecure_set(False)

    return configure


def _der(certificate: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(certificate.cert_chain_pems[0].bytes().decode())


def _mqtt_session(
    port: int,
    *,
    topic: str,
    tls: Callable[[mqtt.Client], None] | None = None,
    user: str | None = None,
    version: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311,
) -> bytes | None:
    """A real MQTT session through routerd: CONNACK 0, then the client's own QoS 1 publish on
    `topic` comes back to its subscription. Returns the DER certificate of the TLS peer (None
    without TLS)."""
    connected, subscribed, received = threading.Event(), threading.Event(), threading.Event()
    reason_codes: list[int] = []

    def on_connect(
        _c: mqtt.Client, _u: object, _f: mqtt.ConnectFlags, rc: ReasonCode, _p: Properties | None
    ) -> None:
        reason_codes.append(rc.value)
        connected.set()

    def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == topic:
            received.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"c-{uuid.uuid4()}", protocol=version)
    if tls is not None:
        tls(client)
    if user is not None:
        client.username_pw_set(user, "secret")
    client.on_connect = on_connect
    client.on_message = on_message
    client.on_subscribe = lambda *_a: subscribed.set()
    client.connect("127.0.0.1", port)  # TCP and the TLS handshake, each bounded by paho's 5 s
    sock = client.socket()
    peer = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
    client.loop_start()
    try:
        assert connected.wait(TIMEOUT_S), "no CONNACK"
        assert reason_codes == [0], f"CONNACK reason codes {reason_codes}"
        client.subscribe(topic, qos=1)
        assert subscribed.wait(TIMEOUT_S), "no SUBACK"
        info = client.publish(topic, b"x", qos=1)
        info.wait_for_publish(TIMEOUT_S)  # raises on timeout
        assert info.is_published()
        assert received.wait(TIMEOUT_S), "the client's own publish did not come back"
    finally:
        client.disconnect()
        client.loop_stop()
    return peer


@pytest.fixture
def observer_factory() -> Iterator[Callable[[list[int]], MqttObserver]]:
    """Direct subscribers to `keys/#` on brokers given by their plain ports (named NODE_IDS in
    order): which broker saw a topic. Closed afterwards."""
    observers: list[MqttObserver] = []

    def make(plain_ports: list[int]) -> MqttObserver:
        observer = MqttObserver("keys/#", dict(zip(NODE_IDS, plain_ports, strict=True)), TIMEOUT_S)
        observers.append(observer)
        return observer

    yield make
    for observer in observers:
        observer.close()


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.integration
def test_sni_passthrough_lands_on_predicted_tls_broker(
    tls_brokers: list[TlsMosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    observer_factory: Callable[[list[int]], MqttObserver],
    ca: trustme.CA,
) -> None:
    """Scenario: routerd never decrypts; the client's TLS peer is the predicted broker itself."""
    acceptor = _Acceptor("tls-pass", free_port(), "SNI_HOST", [b.port for b in tls_brokers])
    router = _start(start_routerd, acceptor)
    predicted = _predict(router, "--sni", SNI_NAMES)
    assert set(predicted.values()) == set(NODE_IDS), f"the names must cover all brokers: {predicted}"
    certificates = {node: _der(b.certificate) for node, b in zip(NODE_IDS, tls_brokers, strict=True)}
    observer = observer_factory([b.plain_port for b in tls_brokers])
    for name in SNI_NAMES:
        topic = f"keys/pass/{name}"
        peer = _mqtt_session(acceptor.port, topic=topic, tls=_with_context(_client_context(ca, name)))
        assert peer == certificates[predicted[name]], f"{name}: TLS not ended by {predicted[name]}"
        assert observer.where(topic) == predicted[name], name


@dataclass(frozen=True)
class _Termination:
    router: Routerd
    acceptor: _Acceptor
    certificate: trustme.LeafCert
    """routerd's own certificate, for a.example, b.example and c.example."""


@pytest.fixture
def termination(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    ca: trustme.CA,
    tmp_path: Path,
) -> _Termination:
    """routerd terminating TLS with its own certificate, key SNI_HOST, over the plain brokers."""
    certificate = ca.issue_cert(*SNI_NAMES)
    key_store = tmp_path / "router.pem"
    certificate.private_key_and_cert_chain_pem.write_to_path(str(key_store))
    acceptor = _Acceptor(
        "tls-end",
        free_port(),
        "SNI_HOST",
        [b.port for b in mosquitto_fleet],
        f";sslEnabled=true;keyStorePath={key_store}",
    )
    return _Termination(_start(start_routerd, acceptor), acceptor, certificate)


@pytest.mark.integration
def test_sni_termination_lands_on_predicted_plain_broker(
    termination: _Termination,
    mosquitto_fleet: list[Mosquitto],
    observer_factory: Callable[[list[int]], MqttObserver],
    ca: trustme.CA,
) -> None:
    """Scenario: routerd ends TLS with its own certificate and speaks plain MQTT to the brokers."""
    predicted = _predict(termination.router, "--sni", SNI_NAMES)
    assert set(predicted.values()) == set(NODE_IDS), f"the names must cover all brokers: {predicted}"
    observer = observer_factory([b.port for b in mosquitto_fleet])
    for name in SNI_NAMES:
        topic = f"keys/end/{name}"
        context = _client_context(ca, name)
        peer = _mqtt_session(termination.acceptor.port, topic=topic, tls=_with_context(context))
        assert peer == _der(termination.certificate), f"{name}: TLS not ended by routerd"
        assert observer.where(topic) == predicted[name], name


def _client_hello(ca: trustme.CA, server_name: str) -> bytes:
    """The ClientHello a Python client sends first (TLS 1.3 offered), made in memory."""
    outgoing = ssl.MemoryBIO()
    tls = _client_context(ca).wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):  # it waits for the ServerHello
        tls.do_handshake()
    return outgoing.read()


def _loop_until_closed(client: mqtt.Client) -> MQTTErrorCode:
    """Run paho's loop in this thread (no automatic reconnect) until the connection ends or the
    deadline passes; paho's last result (MQTT_ERR_CONN_LOST once routerd closed it)."""
    deadline = time.monotonic() + TIMEOUT_S
    rc = MQTTErrorCode.MQTT_ERR_SUCCESS
    while rc is MQTTErrorCode.MQTT_ERR_SUCCESS and time.monotonic() < deadline:
        rc = client.loop(timeout=0.5)
    return rc


@pytest.mark.integration
@pytest.mark.parametrize("cut", [None, 20], ids=["stall-after-hello", "stall-in-hello"])
def test_sni_termination_stalled_handshake_is_logged_as_tls(
    termination: _Termination, ca: trustme.CA, cut: int | None
) -> None:
    """Scenario: a client that stops in the TLS handshake is closed at the handshake deadline, and
    the log line names its protocol, tls, and the bytes read, as the passthrough acceptor does
    (docs/protocols.md "Bad input": `protocol=detect` only when the first bytes matched nothing)."""
    opening = _client_hello(ca, "a.example")[:cut]
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", termination.acceptor.port), timeout=TIMEOUT_S) as client:
        client.sendall(opening)
        while client.recv(65536):  # routerd's ServerHello and the rest of its flight, then EOF
            pass
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S + 3  # with scheduling slack
    line = termination.router.wait_for_log(r"acceptor=tls-end protocol=\S+ handshake not complete")
    expected = f"protocol=tls handshake not complete after {HANDSHAKE_TIMEOUT_S} s ({len(opening)} bytes)"
    assert line.endswith(expected), line


@pytest.mark.integration
def test_sni_termination_plain_client_is_rejected(termination: _Termination) -> None:
    """Scenario: a paho client without TLS on the terminating acceptor gets no CONNACK; routerd
    closes it and logs that its first bytes are no TLS."""
    connacks: list[object] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"c-{uuid.uuid4()}")
    client.on_connect = lambda *a: connacks.append(a)
    try:
        assert client.connect("127.0.0.1", termination.acceptor.port) is MQTTErrorCode.MQTT_ERR_SUCCESS
        assert _loop_until_closed(client) is MQTTErrorCode.MQTT_ERR_CONN_LOST
    finally:
        client.disconnect()
    assert connacks == []
    termination.router.wait_for_log(
        r"acceptor=tls-end protocol=detect handshake rejected: \"unknown protocol, connection starts with 10"
    )


FIRST_EXCHANGE_CONNECTS = 15
"""paho clients timed by the first-exchange test."""
FIRST_EXCHANGE_LIMIT_S = 0.020
"""Median CONNECT -> CONNACK after the handshake: half the 40 ms delayed-ACK scale; about 1.5 ms
on an idle machine."""


def _first_exchange_s(port: int, context: ssl.SSLContext) -> float:
    """Connect a paho client over TLS (its socket keeps Nagle's algorithm, as paho's does) and
    time its first exchange: from the end of the handshake to the CONNACK."""
    connacks: list[float] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"c-{uuid.uuid4()}")
    client.tls_set_context(context)
    client.tls_insecure_set(False)
    client.on_connect = lambda *_a: connacks.append(time.perf_counter())
    try:
        assert client.connect("127.0.0.1", port) is MQTTErrorCode.MQTT_ERR_SUCCESS  # TCP and TLS
        handshaken = time.perf_counter()
        deadline = handshaken + TIMEOUT_S
        while not connacks and time.perf_counter() < deadline:
            assert client.loop(timeout=0.5) is MQTTErrorCode.MQTT_ERR_SUCCESS
        assert connacks, "no CONNACK"
        return connacks[0] - handshaken
    finally:
        client.disconnect()


@pytest.mark.integration
def test_sni_termination_first_exchange_is_not_delayed(termination: _Termination, ca: trustme.CA) -> None:
    """Scenario: right after the TLS 1.3 handshake, a paho client's CONNECT gets its CONNACK
    within a few milliseconds. trio holds the session tickets back until the first write, so
    nothing carried routerd's ACK of the client's Finished: the kernel delayed it 40 ms, and the
    client's Nagle held the CONNECT that long (docs/protocols.md, "TLS termination")."""
    context = _client_context(ca, "a.example")
    try:
        times = [
            _first_exchange_s(termination.acceptor.port, context) for _ in range(FIRST_EXCHANGE_CONNECTS)
        ]
    finally:
        context.close()
    shown = ", ".join(f"{t * 1000:.1f}" for t in sorted(times))
    assert statistics.median(times) < FIRST_EXCHANGE_LIMIT_S, f"CONNECT -> CONNACK in ms: {shown}"


@pytest.fixture
def client_auth(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    ca: trustme.CA,
    tmp_path: Path,
) -> tuple[Routerd, _Acceptor]:
    """routerd terminating TLS for 127.0.0.1, requiring client certificates, key USER_NAME."""
    key_store, trust_store = tmp_path / "router.pem", tmp_path / "ca.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(key_store))
    ca.cert_pem.write_to_path(str(trust_store))
    acceptor = _Acceptor(
        "tls-users",
        free_port(),
        "USER_NAME",
        [b.port for b in mosquitto_fleet],
        f";sslEnabled=true;keyStorePath={key_store};trustStorePath={trust_store};needClientAuth=true",
    )
    return _start(start_routerd, acceptor), acceptor


@pytest.mark.integration
def test_client_certificate_cn_lands_on_predicted_broker(
    client_auth: tuple[Routerd, _Acceptor],
    mosquitto_fleet: list[Mosquitto],
    observer_factory: Callable[[list[int]], MqttObserver],
    ca: trustme.CA,
    tmp_path: Path,
) -> None:
    """Scenario: the CN is the key, not the user name on the wire (SPEC A2): each client sends the
    other CN as its MQTT user name, which alone would route it to the other broker."""
    router, acceptor = client_auth
    predicted = _predict(router, "--user", CERT_USERS)
    assert len(set(predicted.values())) == len(CERT_USERS), f"the CNs must split: {predicted}"
    ca_file = tmp_path / "client-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    observer = observer_factory([b.port for b in mosquitto_fleet])
    for cn, wire_user in zip(CERT_USERS, reversed(CERT_USERS), strict=True):
        cert_file, key_file = tmp_path / f"{cn}.pem", tmp_path / f"{cn}.key"
        leaf = ca.issue_cert(f"{cn}@example", common_name=cn)
        leaf.cert_chain_pems[0].write_to_path(str(cert_file))
        leaf.private_key_pem.write_to_path(str(key_file))

        def configure(client: mqtt.Client, cert: Path = cert_file, key: Path = key_file) -> None:
            client.tls_set(ca_certs=str(ca_file), certfile=str(cert), keyfile=str(key))
            client.tls_insecure_set(False)

        topic = f"keys/cert/{cn}"
        _mqtt_session(acceptor.port, topic=topic, tls=configure, user=wire_user)
        assert observer.where(topic) == predicted[cn], cn


@pytest.mark.integration
@pytest.mark.parametrize(
    "version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"]
)
def test_client_certificate_missing_is_refused(
    client_auth: tuple[Routerd, _Acceptor], ca: trustme.CA, version: ssl.TLSVersion
) -> None:
    """Scenario: with TLS 1.2 paho's handshake fails; with TLS 1.3 the client's side of the
    handshake completes before the server checks the certificate, so the refusal (alert
    certificate_required) ends the connection at paho's first read. No CONNACK either way."""
    router, acceptor = client_auth
    context = _client_context(ca)
    context.maximum_version = version
    connacks: list[object] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"c-{uuid.uuid4()}")
    client.tls_set_context(context)
    client.tls_insecure_set(False)
    client.on_connect = lambda *a: connacks.append(a)
    try:
        if version is ssl.TLSVersion.TLSv1_2:
            with pytest.raises(ssl.SSLError):
                client.connect("127.0.0.1", acceptor.port)
        else:
            assert client.connect("127.0.0.1", acceptor.port) is MQTTErrorCode.MQTT_ERR_SUCCESS
            assert _loop_until_closed(client) is MQTTErrorCode.MQTT_ERR_CONN_LOST
    finally:
        client.disconnect()
        context.close()
    assert connacks == []
    router.wait_for_log(r"acceptor=tls-users protocol=tls handshake failed")


@pytest.mark.integration
def test_mqtt5_user_name_lands_on_predicted_broker(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    observer_factory: Callable[[list[int]], MqttObserver],
) -> None:
    acceptor = _Acceptor("mqtt5-users", free_port(), "USER_NAME", [b.port for b in mosquitto_fleet])
    router = _start(start_routerd, acceptor)
    predicted = _predict(router, "--user", MQTT5_USERS)
    assert len(set(predicted.values())) >= 2, f"the users must spread: {predicted}"
    observer = observer_factory([b.port for b in mosquitto_fleet])
    for user in MQTT5_USERS:
        topic = f"keys/mqtt5/{user}"
        _mqtt_session(acceptor.port, topic=topic, user=user, version=MQTTProtocolVersion.MQTTv5)
        assert observer.where(topic) == predicted[user], user
