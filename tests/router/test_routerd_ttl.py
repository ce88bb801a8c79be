"""routerd end to end with real mosquitto brokers: connection TTL and closing connections to a
target that stops answering (router/features/ttl/service.py, router/core/live.py).

- An idle proxied client (raw TCP that never speaks, or MQTT with keep-alive 0) is closed by the
  router after `connectionTtl`, never before, and within TTL + check interval (+ a margin for
  process scheduling).
- A paho client whose keep-alive is below the TTL stays connected through 3 x TTL and still
  publishes and receives at the end.
- A broker that stops answering (SIGSTOP: its sockets stay open, so only the MQTT probe notices)
  becomes not ready, and the router closes the proxied connections to it within one check
  period plus the probe's deadline.

All timing is measured with `time.monotonic()` around blocking reads with deadlines; nothing
sleeps for a fixed time.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families

from keys.mqtt import encode_connect
from tests.conftest import read_until_closed
from tests.router.conftest import Mosquitto

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.router.conftest import Routerd

TTL_MS = 1500
CHECK_INTERVAL_MS = 250
CHECK_PERIOD_MS = 300
"""The pool's probe period; the probe deadline is min(period, 3 s), so also 300 ms."""
MARGIN_S = 0.75
"""Slack for process start-up of the read, scheduling on 2 shared cores and log I/O."""
TIMEOUT_S = 10.0


def _config(broker: Mosquitto, ports: dict[str, int]) -> str:
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <connection-ttl-check-interval>{CHECK_INTERVAL_MS}</connection-ttl-check-interval>
  <connectors>
   <connector name="m0">tcp://127.0.0.1:{broker.port}?nodeId=m0;probe=mqtt</connector>
  </connectors>
  <acceptors>
   <acceptor name="raw">tcp://127.0.0.1:{ports["raw"]}?router=ip;connectionTtl={TTL_MS}</acceptor>
   <acceptor name="mqtt">tcp://127.0.0.1:{ports["mqtt"]}?router=cid;protocols=MQTT;connectionTTL={TTL_MS}</acceptor>
   <acceptor name="plain-ip">tcp://127.0.0.1:{ports["plain-ip"]}?router=ip</acceptor>
   <acceptor name="long-ttl">tcp://127.0.0.1:{ports["long-ttl"]}?router=cid;protocols=MQTT;connectionTtl=600000</acceptor>
  </acceptors>
  <connection-routers>
   <connection-router name="ip">
    <key-type>SOURCE_IP</key-type>
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>{CHECK_PERIOD_MS}</check-period>
     <static-connectors><connector-ref>m0</connector-ref></static-connectors></pool>
   </connection-router>
   <connection-router name="cid">
    <key-type>CLIENT_ID</key-type>
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>{CHECK_PERIOD_MS}</check-period>
     <static-connectors><connector-ref>m0</connector-ref></static-connectors></pool>
   </connection-router>
  </connection-routers>
 </core>
</configuration>
"""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path, "mosquitto-ttl")
    broker.start()
    try:
        yield broker
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            os.kill(broker.proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        broker.stop()


@pytest.fixture
def routed(
    broker: Mosquitto,
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> tuple[Routerd, dict[str, int]]:
    ports = {name: free_port() for name in ("raw", "mqtt", "plain-ip", "long-ttl")}
    router = start_routerd(lambda _admin_port: _config(broker, ports))
    router.wait_for_log(r"router=ip target=m0 is ready", consume=False)
    router.wait_for_log(r"router=cid target=m0 is ready", consume=False)
    return router, ports


def _closed_total(router: Routerd, name: str, reason: str) -> float:
    for family in text_string_to_metric_families(router.metrics()):
        for sample in family.samples:
            if sample.name == "router_proxied_connections_closed_total" and sample.labels == {
                "router": name,
                "reason": reason,
            }:
                return sample.value
    return 0.0


def _mqtt_connect(port: int, client_id: str) -> tuple[socket.socket, float]:
    """A raw MQTT 3.1.1 client with keep-alive 0 (it never pings): CONNECT, CONNACK accepted.

    Returns:
        The socket, and the monotonic time just before the client's last bytes (the CONNECT).
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    try:
        sent_at = time.monotonic()
        sock.sendall(encode_connect(client_id, keepalive_s=0))
        connack = b""
        while len(connack) < 4:
            chunk = sock.recv(4 - len(connack))
            assert chunk, "closed before CONNACK"
            connack += chunk
        assert connack == b"\x20\x02\x00\x00", connack.hex()
    except BaseException:  # a failed check must not leave the socket to the GC
        sock.close()
        raise
    return sock, sent_at


@pytest.mark.integration
@pytest.mark.parametrize("client", ["raw-tcp-silent", "mqtt-keepalive-0"])
def test_routerd_closes_an_idle_proxied_connection_after_the_ttl(
    routed: tuple[Routerd, dict[str, int]], client: str
) -> None:
    """Scenario: a raw TCP client on a SOURCE_IP acceptor that never sends a byte, or an MQTT
    client with keep-alive 0 on a CLIENT_ID acceptor that sends nothing after its CONNECT."""
    router, ports = routed
    name, reason = ("ip", "connection_ttl") if client == "raw-tcp-silent" else ("cid", "connection_ttl")
    if client == "raw-tcp-silent":
        last_bytes_at = time.monotonic()
        sock = socket.create_connection(("127.0.0.1", ports["raw"]), timeout=TIMEOUT_S)
    else:
        sock, last_bytes_at = _mqtt_connect(ports["mqtt"], f"idle-{uuid.uuid4()}")
    with sock:
        router.wait_for_log(rf"router={name} key=\S+ target=m0 outcome=OK")
        read_until_closed(sock)  # fails after the socket's TIMEOUT_S
        elapsed_s = time.monotonic() - last_bytes_at
    ttl_s, interval_s = TTL_MS / 1000, CHECK_INTERVAL_MS / 1000
    assert ttl_s <= elapsed_s <= ttl_s + interval_s + MARGIN_S, elapsed_s
    line = router.wait_for_log(
        rf"router={name} acceptor=\S+ target=m0 address=127\.0\.0\.1:\d+ outcome=CONNECTION_TTL "
        rf"idle_s=(\S+) ttl_ms={TTL_MS}"
    )
    idle_s = float(line.split("idle_s=")[1].split()[0])
    assert ttl_s <= idle_s <= ttl_s + interval_s + 0.1, line
    router.wait_for_log(
        rf"router={name} target=m0 closed bytes_in=\d+ bytes_out=\d+ .* reason=connection_ttl"
    )
    assert _closed_total(router, name, reason) == 1.0


class _Client:
    """A paho client with keep-alive 1 s, subscribed to its own topic."""

    def __init__(self, port: int) -> None:
        self.topic = f"ttl/{uuid.uuid4()}"
        self.subscribed = threading.Event()
        self.received = threading.Event()
        self.disconnected = threading.Event()
        self.paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"keepalive-{uuid.uuid4()}")
        self.paho.on_subscribe = lambda *_a: self.subscribed.set()
        self.paho.on_message = lambda *_a: self.received.set()
        self.paho.on_disconnect = lambda *_a: self.disconnected.set()
        self.paho.connect("127.0.0.1", port, keepalive=1)
        self.paho.loop_start()

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


@pytest.mark.integration
@pytest.mark.parametrize("acceptor", ["raw", "mqtt"])
def test_routerd_keeps_an_mqtt_client_whose_keepalive_is_below_the_ttl(
    routed: tuple[Routerd, dict[str, int]], acceptor: str
) -> None:
    """Scenario: keep-alive 1 s under a 1.5 s TTL, for 3 x TTL; on the SOURCE_IP acceptor the
    router learns the keep-alive from the first relayed bytes, on the CLIENT_ID one from sniffing."""
    router, ports = routed
    client = _Client(ports[acceptor])
    try:
        assert client.paho.subscribe(client.topic, qos=1)[0] == mqtt.MQTT_ERR_SUCCESS
        assert client.subscribed.wait(TIMEOUT_S)
        # Waiting for a disconnect that must not come: the wait is the 3 x TTL run.
        assert not client.disconnected.wait(3 * TTL_MS / 1000)
        client.paho.publish(client.topic, b"still here", qos=1)
        assert client.received.wait(TIMEOUT_S)
        assert not client.disconnected.is_set()
    finally:
        client.close()
    name = "ip" if acceptor == "raw" else "cid"
    assert _closed_total(router, name, "connection_ttl") == 0.0
    assert not any("outcome=CONNECTION_TTL" in line for line in router.lines)


@pytest.mark.integration
@pytest.mark.parametrize("acceptor", ["long-ttl", "plain-ip"])
def test_routerd_closes_connections_to_a_broker_that_stops_answering(
    routed: tuple[Routerd, dict[str, int]], broker: Mosquitto, acceptor: str
) -> None:
    """Scenario: SIGSTOP the broker. On loopback a killed broker resets its connections by itself;
    a stopped one keeps them open, so only the router can end them: its MQTT probe gets no
    CONNACK within the deadline, the target becomes not ready, and the router closes the
    proxied connection (not the TTL: 10 minutes, or none) so the client can reconnect elsewhere.

    On `long-ttl` the connection is a trio task (an acceptor with a TTL never takes the epoll fast
    path): router/runtime/connections.py logs one line with the count and counts the metric. `plain-ip`
    (no TTL) may be served by the fast path (router/datapath/fast_path.py), which logs each close itself:
    only the timing is asserted there."""
    router, ports = routed
    name = "cid" if acceptor == "long-ttl" else "ip"
    sock, _ = _mqtt_connect(ports[acceptor], f"victim-{uuid.uuid4()}")
    with sock:
        router.wait_for_log(rf"router={name} key=\S+ target=m0 outcome=OK")
        assert broker.proc is not None
        stopped_at = time.monotonic()
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            read_until_closed(sock)  # fails after the socket's TIMEOUT_S
            elapsed_s = time.monotonic() - stopped_at
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
    period_s = CHECK_PERIOD_MS / 1000
    probe_deadline_s = min(period_s, 3.0)
    assert elapsed_s <= period_s + probe_deadline_s + MARGIN_S, elapsed_s
    router.wait_for_log(
        rf"router={name} target=m0 is not ready: no answer from tcp://127\.0\.0\.1:\d+ within"
    )
    assert _closed_total(router, name, "connection_ttl") == 0.0
    if acceptor == "long-ttl":
        router.wait_for_log(r"router=cid target=m0 is not ready: closing its 1 proxied connection\(s\)")
        router.wait_for_log(r"router=cid target=m0 closed bytes_in=\d+ .* reason=target_not_ready")
        assert _closed_total(router, "cid", "target_not_ready") == 1.0
