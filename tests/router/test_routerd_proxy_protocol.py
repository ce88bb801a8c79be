"""routerd and the PROXY protocol end to end: real HAProxy 2.6, real mosquitto, real routerd.

Receiving (`proxyProtocolEnabled=true`): HAProxy (`mode tcp`, `send-proxy` and `send-proxy-v2`)
sits in front of a routerd acceptor whose router keys on SOURCE_IP with CONSISTENT_HASH over the
three brokers of `mosquitto_fleet`. MQTT clients bound to 127.0.0.2-.9 connect to HAProxy; the
key routerd logs is each client's own address (not HAProxy's), the target is what
`routerctl route --source-ip` predicts, and the client's PUBLISH shows up on that broker.
A connection without a header, or with a malformed one, is closed with one log line.

Sending (`sendProxyProtocol=v1|v2`): the target is an HAProxy frontend with `accept-proxy` in front
of one mosquitto; HAProxy's log (client address first) shows the client routerd was talking to.

HAProxy runs in the foreground (`haproxy -db`), logs to its stdout, and is stopped by its PID, as in
tests/keys/test_proxy_protocol.py. One HAProxy process holds every frontend:

    fe_v1    -> be_v1    -> routerd "pp"    (send-proxy)
    fe_v2    -> be_v2    -> routerd "pp"    (send-proxy-v2)
    fe_chain -> be_chain -> routerd "chain" (send-proxy-v2; "chain" also sends v2 onwards)
    fe_accept (accept-proxy) -> be_broker -> mosquitto-0, routerd's connector "behind-haproxy"
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from keys.mqtt import MQTT_DISCONNECT, encode_connect
from tests.conftest import LineLog, read_until_closed, recv_exactly, stop_process
from tests.router.conftest import MqttObserver, acceptors_xml, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.router.conftest import Mosquitto, Routerd

NODE_IDS = ["node4", "node9", "node20"]
"""As in test_routerd_mosquitto.py: Artemis's ring splits 127.0.0.2-.9 over all three (3/3/2)."""
SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
TIMEOUT_S = 10.0
"""Upper bound of every wait: a port, a log line, a reply, a close; each takes milliseconds."""
HANDSHAKE_TIMEOUT_S = 2
"""`handshake-timeout` of the proxy-protocol acceptors."""

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
"""MQTT 3.1.1 CONNACK, session present 0, return code 0x00 accepted (MQTT 3.1.1 §3.2)."""

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
"""The PROXY protocol v2 signature (HAProxy doc/proxy-protocol.txt section 2.2)."""
V2_BAD_VERSION = (
    V2_SIGNATURE
    + b"\x11"  # version 1 (must be 2), command PROXY
    + b"\x11"  # TCP over IPv4
    + b"\x00\x0c"  # length 12
    + bytes([192, 0, 2, 10])  # source 192.0.2.10
    + bytes([127, 0, 0, 1])  # destination 127.0.0.1
    + (40000).to_bytes(2, "big")  # source port
    + (1883).to_bytes(2, "big")  # destination port
)

_HAPROXY_CONFIG = """\
global
    log stdout format raw local0 info
defaults
    mode tcp
    log global
    log-format "client=%ci:%cp dest=%fi:%fp frontend=%ft backend=%b/%s local=%bi:%bp termination=%ts"
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe_v1
    bind 127.0.0.1:{fe_v1}
    default_backend be_v1
frontend fe_v2
    bind 127.0.0.1:{fe_v2}
    default_backend be_v2
frontend fe_chain
    bind 127.0.0.1:{fe_chain}
    default_backend be_chain
frontend fe_accept
    bind 127.0.0.1:{fe_accept} accept-proxy
    default_backend be_broker
backend be_v1
    server routerd 127.0.0.1:{pp} send-proxy
backend be_v2
    server routerd 127.0.0.1:{pp} send-proxy-v2
backend be_chain
    server routerd 127.0.0.1:{chain} send-proxy-v2
backend be_broker
    server mosquitto 127.0.0.1:{broker}
"""


# --- HAProxy -------------------------------------------------------------------------------------


class _Haproxy:
    """HAProxy in the foreground (-db) with its log lines (stdout) collected by a thread."""

    def __init__(self, config_path: Path, ports: list[int]) -> None:
        binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if binary is None:
            pytest.fail("haproxy is not installed: run ./run-tests, which installs it (Debian: haproxy)")
        self._proc = subprocess.Popen(
            [binary, "-db", "-f", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self._proc.stdout is not None
        self._log = LineLog(self._proc.stdout, "haproxy")
        try:
            for port in ports:
                probe_port = self._wait_port(port)
                # HAProxy logs a session when it ends: once the probe's line is there, the probe's
                # session (and any connection to a server it opened) is over and cannot reach
                # routerd later, where it would count as a client error.
                self.wait_for_log(rf"^(client=)?127\.0\.0\.1:{probe_port}\b")
        except BaseException:
            self.stop()
            raise

    def _wait_port(self, port: int) -> int:
        """Wait until HAProxy accepts on `port`; the local port of the probe that got in."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                self._log.close(TIMEOUT_S)
                raise RuntimeError(f"haproxy exited with {self._proc.returncode}: {self._log.lines}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                    probe_port: int = probe.getsockname()[1]
                return probe_port
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"haproxy does not listen on {port}") from None
                time.sleep(0.02)  # polling another process's listen(): nothing to wait on

    def wait_for_log(self, pattern: str) -> re.Match[str]:
        """The first log line (from the start) matching `pattern`, waiting for it if need be."""
        return self._log.search(pattern, TIMEOUT_S)[0]

    def stop(self) -> None:
        stop_process(self._proc, TIMEOUT_S)  # by the PID we started
        self._log.close(TIMEOUT_S)


# --- The deployment: mosquitto x3, HAProxy, routerd ------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ports:
    pp: int
    """routerd acceptor "pp": proxyProtocolEnabled=true, router "hash"."""
    send_v1: int
    """routerd acceptor "send-v1": sendProxyProtocol=v1, router "behind-haproxy"."""
    send_v2: int
    """routerd acceptor "send-v2": sendProxyProtocol=v2, router "behind-haproxy"."""
    chain: int
    """routerd acceptor "chain": proxyProtocolEnabled=true and sendProxyProtocol=v2."""
    fe_v1: int
    fe_v2: int
    fe_chain: int
    fe_accept: int


@dataclass(frozen=True, slots=True)
class _Deployment:
    router: Routerd
    haproxy: _Haproxy
    ports: _Ports


def _routerd_config(brokers: list[Mosquitto], ports: _Ports) -> str:
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    timeout = f"handshake-timeout={HANDSHAKE_TIMEOUT_S}"
    acceptors = {
        "pp": f"router=hash;mode=proxy;proxyProtocolEnabled=true;{timeout}",
        "send-v1": "router=behind-haproxy;mode=proxy;sendProxyProtocol=v1",
        "send-v2": "router=behind-haproxy;mode=proxy;sendProxyProtocol=v2",
        "chain": f"router=behind-haproxy;mode=proxy;proxyProtocolEnabled=true;sendProxyProtocol=v2;{timeout}",
    }
    acceptor_ports = {
        "pp": ports.pp,
        "send-v1": ports.send_v1,
        "send-v2": ports.send_v2,
        "chain": ports.chain,
    }
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}
    <connector name="haproxy">tcp://127.0.0.1:{ports.fe_accept}?nodeId=behind-haproxy</connector>
  </connectors>
  <acceptors>{acceptors_xml(acceptors, acceptor_ports)}</acceptors>
  <connection-routers>
   <connection-router name="hash"><key-type>SOURCE_IP</key-type><policy name="CONSISTENT_HASH"/>
    <pool><check-period>200</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors>{refs}</static-connectors></pool></connection-router>
   <connection-router name="behind-haproxy"><key-type>SOURCE_IP</key-type>
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>1000</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors><connector-ref>haproxy</connector-ref></static-connectors></pool>
   </connection-router>
  </connection-routers>
</core></configuration>
"""


@pytest.fixture
def deployment(
    tmp_path: Path,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> Iterator[_Deployment]:
    """Three mosquittos, HAProxy with every frontend, then routerd with every router ready."""
    ports = _Ports(*(free_port() for _ in range(8)))
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        _HAPROXY_CONFIG.format(
            fe_v1=ports.fe_v1,
            fe_v2=ports.fe_v2,
            fe_chain=ports.fe_chain,
            fe_accept=ports.fe_accept,
            pp=ports.pp,
            chain=ports.chain,
            broker=mosquitto_fleet[0].port,
        )
    )
    haproxy = _Haproxy(config, [ports.fe_v1, ports.fe_v2, ports.fe_chain, ports.fe_accept])
    try:
        router = start_routerd(lambda _admin: _routerd_config(mosquitto_fleet, ports))
        for node_id in NODE_IDS:
            router.wait_for_log(rf"router=hash target={node_id} is ready", consume=False)
        router.wait_for_log(r"router=behind-haproxy target=behind-haproxy is ready", consume=False)
        yield _Deployment(router, haproxy, ports)
    finally:
        haproxy.stop()


# --- MQTT on raw sockets ---------------------------------------------------------------------------


def _connect(client_id: str) -> bytes:
    """MQTT 3.1.1 CONNECT, clean session, keepalive 30 s (MQTT 3.1.1 §3.1)."""
    return encode_connect(client_id, keepalive_s=30)


def _publish(topic: str, payload: bytes) -> bytes:
    """MQTT PUBLISH, QoS 0 (MQTT 3.1.1 §3.3), with a one-byte remaining length."""
    body = len(topic.encode()).to_bytes(2, "big") + topic.encode() + payload
    assert len(body) < 128, "one-byte remaining length"
    return bytes([0x30, len(body)]) + body


def _mqtt_session(port: int, source: str, *, header: bytes = b"", topic: str | None = None) -> int:
    """From `source`: [header,] CONNECT, CONNACK 0x00, [PUBLISH,] DISCONNECT, then the broker's close.

    Returns:
        The client's own port.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S, source_address=(source, 0)) as conn:
        client_port: int = conn.getsockname()[1]
        conn.sendall(header + _connect(f"pp-{uuid.uuid4().hex[:12]}"))
        assert recv_exactly(conn, 4) == CONNACK_ACCEPTED, f"no CONNACK 0x00 for {source}"
        if topic is not None:
            conn.sendall(_publish(topic, b"hello"))
        conn.sendall(MQTT_DISCONNECT)  # mosquitto closes the connection on it (MQTT 3.1.1 §3.14)
        assert read_until_closed(conn) == b""  # the broker closes on DISCONNECT, all the way back
    return client_port


# --- Observers and predictions ----------------------------------------------------------------------


def _predict(router: Routerd, router_name: str, sources: list[str]) -> dict[str, str]:
    """`routerctl route --source-ip IP` for each source: source -> node id."""
    decisions = router.predict(router_name, "--source-ip", sources)
    for source, decision in decisions.items():
        assert decision["key"] == source
    return {source: str(d["node_id"]) for source, d in decisions.items()}


def _metric(router: Routerd, name: str, labels: str) -> float:
    """One sample of routerd's Prometheus exposition, 0 when absent."""
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", router.metrics(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


_OK_LINE = r"peer=(?P<peer>\S+) router={router} key={key} target=(?P<target>\S+) outcome=OK"


# --- 1. Receiving: the key is the address in HAProxy's header --------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(("frontend", "backend"), [("fe_v1", "be_v1"), ("fe_v2", "be_v2")], ids=["v1", "v2"])
def test_routerd_proxy_protocol_keys_on_original_client_address(
    deployment: _Deployment, mosquitto_fleet: list[Mosquitto], frontend: str, backend: str
) -> None:
    """Scenario: clients from 127.0.0.2-.9 through HAProxy `send-proxy`/`send-proxy-v2`.

    routerd's TCP peer is HAProxy's own connection (the `%bi:%bp` HAProxy logs for that client),
    yet the key is the client's address, the target is routerctl's prediction for that address,
    and the client's PUBLISH appears on that broker.
    """
    router, haproxy = deployment.router, deployment.haproxy
    port = getattr(deployment.ports, frontend)
    predicted = _predict(router, "hash", SOURCES)
    assert sorted(set(predicted.values())) == sorted(NODE_IDS), f"the sources must spread: {predicted}"
    brokers = dict(zip(NODE_IDS, (b.port for b in mosquitto_fleet), strict=True))
    with MqttObserver("pp/#", brokers, TIMEOUT_S) as seen:
        for source in SOURCES:
            topic = f"pp/{frontend}/{source}"
            client_port = _mqtt_session(port, source, topic=topic)
            ok_line = _OK_LINE.format(router="hash", key=re.escape(source))
            logged = re.search(ok_line, router.wait_for_log(ok_line))
            assert logged is not None
            hap = haproxy.wait_for_log(
                rf"^client={re.escape(source)}:{client_port} dest=\S+ frontend={frontend} "
                rf"backend={backend}/routerd local=(?P<local>\S+) termination=--"
            )
            assert logged["peer"] == hap["local"], "routerd's peer is HAProxy's connection"
            assert logged["peer"].rpartition(":")[0] == "127.0.0.1" != source
            assert logged["target"] == predicted[source], source
            assert seen.where(topic) == predicted[source], f"{source}'s PUBLISH on another broker"


# --- 2. Receiving: no header or a bad one ------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("opening", "reason"),
    [
        (
            _connect("no-header"),
            r"missing PROXY protocol header, connection starts with b'\\\\x10",  # the log doubles the \\
        ),
        (
            b"PROXY TCP4 999.1.1.1 127.0.0.1 40000 1883\r\n" + _connect("bad-v1"),
            r"v1 TCP4 source address '999\.1\.1\.1' is not IPv4",
        ),
        (
            V2_BAD_VERSION + _connect("bad-v2"),
            r"v2 version must be 2, got 1 \(byte 0x11\)",
        ),
        (
            b"PROXY TCP4 192.0.2.10 127.0.0.1 40000 1883\n" + _connect("bare-lf"),
            r"v1 line ends with a bare LF",
        ),
    ],
    ids=["missing", "v1-bad-address", "v2-bad-version", "v1-bare-lf"],
)
def test_routerd_proxy_protocol_bad_header_closed_with_one_log_line(
    deployment: _Deployment, opening: bytes, reason: str
) -> None:
    """Scenario: a client straight to the proxy-protocol acceptor with no header or a malformed one
    gets nothing back and is closed at once, with one log line naming it; the next client, with a
    good header, is served and keyed on its header's address."""
    router, pp = deployment.router, deployment.ports.pp
    logged_before = router.mark()
    started = time.monotonic()
    with socket.create_connection(
        ("127.0.0.1", pp), timeout=TIMEOUT_S, source_address=("127.0.0.7", 0)
    ) as bad:
        bad_peer = f"127.0.0.7:{bad.getsockname()[1]}"
        bad.sendall(opening)
        assert read_until_closed(bad) == b""
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S, "closed at once, not at the deadline"
    router.wait_for_log(
        rf"peer={re.escape(bad_peer)} acceptor=pp protocol=proxy handshake rejected: \"?{reason}"
    )
    assert _metric(router, "router_client_errors_total", 'acceptor="pp",reason="proxy"') == 1.0

    good_header = f"PROXY TCP4 192.0.2.10 127.0.0.1 40000 {pp}\r\n".encode()
    good_port = _mqtt_session(pp, "127.0.0.7", header=good_header)
    line = router.wait_for_log(_OK_LINE.format(router="hash", key=re.escape("192.0.2.10")))
    assert f"peer=127.0.0.7:{good_port} " in line
    # Everything about the bad connection was logged before it was closed, so before this line.
    assert sum(f"peer={bad_peer} " in entry for entry in router.lines[logged_before:]) == 1


@pytest.mark.integration
def test_routerd_proxy_protocol_stalled_header_times_out_with_bytes_read(deployment: _Deployment) -> None:
    """Scenario: half a v1 header, then silence: closed at `handshake-timeout` with the log line
    of a stalled opening, which counts the bytes read as it does for MQTT (`(1 bytes)`)."""
    router, pp = deployment.router, deployment.ports.pp
    started = time.monotonic()
    with socket.create_connection(
        ("127.0.0.1", pp), timeout=TIMEOUT_S, source_address=("127.0.0.8", 0)
    ) as slow:
        peer = f"127.0.0.8:{slow.getsockname()[1]}"
        slow.sendall(b"PROXY TCP4 ")
        assert read_until_closed(slow) == b""
    elapsed = time.monotonic() - started
    assert HANDSHAKE_TIMEOUT_S - 0.1 < elapsed < HANDSHAKE_TIMEOUT_S + 3
    line = router.wait_for_log(rf"peer={re.escape(peer)} acceptor=pp protocol=proxy handshake not complete")
    assert _metric(router, "router_client_errors_total", 'acceptor="pp",reason="timeout"') == 1.0
    assert line.endswith(f"handshake not complete after {HANDSHAKE_TIMEOUT_S} s (11 bytes)"), line


# --- 3. Sending: HAProxy `accept-proxy` sees the client routerd proxied ------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_routerd_send_proxy_protocol_target_sees_client_address(
    deployment: _Deployment, version: str
) -> None:
    """Scenario: a client from 127.0.0.5 through routerd (`sendProxyProtocol`) to HAProxy
    `accept-proxy` in front of mosquitto: the MQTT session works (CONNACK 0x00) and HAProxy logs
    127.0.0.5 with the client's port as the client, and routerd's acceptor as the destination."""
    router, haproxy = deployment.router, deployment.haproxy
    acceptor_port = deployment.ports.send_v1 if version == "v1" else deployment.ports.send_v2
    client_port = _mqtt_session(acceptor_port, "127.0.0.5")
    router.wait_for_log(
        rf"peer=127\.0\.0\.5:{client_port} router=behind-haproxy key=127\.0\.0\.5 "
        r"target=behind-haproxy outcome=OK"
    )
    haproxy.wait_for_log(
        rf"^client=127\.0\.0\.5:{client_port} dest=127\.0\.0\.1:{acceptor_port} frontend=fe_accept "
        r"backend=be_broker/mosquitto local=\S+ termination=--"
    )


@pytest.mark.integration
def test_routerd_proxy_protocol_chain_forwards_original_client_address_and_port(
    deployment: _Deployment,
) -> None:
    """Scenario: HAProxy `send-proxy-v2` -> routerd (`proxyProtocolEnabled=true`,
    `sendProxyProtocol=v2`) -> HAProxy `accept-proxy` -> mosquitto, client from 127.0.0.6.

    The header routerd sends on names the original client: its address and its port, both from
    the header routerd received (as HAProxy does when it chains), not the address of one with the
    port of the load balancer's connection to routerd.
    """
    router, haproxy, ports = deployment.router, deployment.haproxy, deployment.ports
    client_port = _mqtt_session(ports.fe_chain, "127.0.0.6")
    front = haproxy.wait_for_log(
        rf"^client=127\.0\.0\.6:{client_port} dest=\S+ frontend=fe_chain backend=be_chain/routerd "
        r"local=(?P<local>\S+) termination=--"
    )
    router.wait_for_log(
        rf"peer={re.escape(front['local'])} router=behind-haproxy key=127\.0\.0\.6 "
        r"target=behind-haproxy outcome=OK"
    )
    back = haproxy.wait_for_log(
        r"^client=(?P<client>127\.0\.0\.6:\d+) dest=\S+ frontend=fe_accept "
        r"backend=be_broker/mosquitto local=\S+ termination=--"
    )
    assert back["client"] == f"127.0.0.6:{client_port}", (
        f"the broker-side HAProxy saw client {back['client']}; the first HAProxy's own connection "
        f"to routerd was {front['local']}"
    )
