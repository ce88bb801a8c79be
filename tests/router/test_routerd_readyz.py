"""routerd's readiness endpoint end to end: real mosquitto brokers, a real routerd, `GET /readyz`.

200 `ready` only while the acceptors listen and every router takes new clients (its pool has its
quorum and a target open to new clients); 503 with one line naming the router and why (or
`shutting down`) otherwise, from the moment SIGTERM arrives, while the
open connections drain. Kubernetes' readinessProbe (deploy/kubernetes/) relies on it.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest

from tests.conftest import eventually, free_port
from tests.router.conftest import ROUTERCTL, acceptors_xml, routerctl_json, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from tests.router.conftest import Mosquitto, Routerd

pytestmark = pytest.mark.integration

TIMEOUT_S = 10.0
NODE_IDS = ("b0", "b1", "b2")


def _config(pools: Mapping[str, tuple[Sequence[int], int]], port: int) -> Callable[[int], str]:
    """Routers named by `pools`, each over static connectors to (its broker ports, quorum-size),
    key CLIENT_ID, FIRST_ELEMENT, probed every 200 ms; the first router's acceptor on `port`."""
    connectors: list[str] = []
    routers: list[str] = []
    for name, (ports, quorum) in pools.items():
        xml, refs = static_connectors(zip(NODE_IDS, ports, strict=False))
        connectors.append(xml.replace('name="c', f'name="{name}-c'))
        refs = refs.replace("<connector-ref>c", f"<connector-ref>{name}-c")
        routers.append(
            f"""<connection-router name="{name}">
    <key-type>CLIENT_ID</key-type>
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>200</check-period><quorum-size>{quorum}</quorum-size>
     <quorum-timeout>0</quorum-timeout><static-connectors>{refs}</static-connectors></pool>
   </connection-router>"""
        )
    first = next(iter(pools))
    acceptors = acceptors_xml({"a": f"router={first};mode=proxy"}, {"a": port})

    def make(_admin_port: int) -> str:
        return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <connectors>{"".join(connectors)}</connectors>
  <acceptors>{acceptors}</acceptors>
  <connection-routers>{"".join(routers)}</connection-routers>
 </core>
</configuration>
"""

    return make


def _get(router: Routerd, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(router.admin + path, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _mqtt_connect(port: int, client_id: str) -> socket.socket:
    """An MQTT 3.1.1 session through the router (CONNECT, then its CONNACK 0x00)."""
    payload = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(client_id).to_bytes(2, "big") + client_id.encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.sendall(bytes([0x10, len(payload)]) + payload)
    assert _recv(sock, 4) == b"\x20\x02\x00\x00"
    return sock


def _recv(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_readyz_follows_the_quorum(mosquitto_fleet: list[Mosquitto], start_routerd) -> None:
    """Scenario: quorum-size 2 of 3 brokers; one broker down keeps it ready, two make it 503 with
    the router's name and counts, the broker's return makes it ready again."""
    ports = [b.port for b in mosquitto_fleet]
    router: Routerd = start_routerd(_config({"fleet": (ports, 2)}, free_port()))
    assert eventually(lambda: _get(router, "/readyz") == (200, "ready\n"), TIMEOUT_S)
    assert _get(router, "/healthz") == (200, "ok\n")

    mosquitto_fleet[0].stop()
    router.wait_for_log(r"router=fleet target=b0 is not ready")
    assert _get(router, "/readyz") == (200, "ready\n")  # 2 of 3 still make the quorum

    mosquitto_fleet[1].stop()
    router.wait_for_log(r"router=fleet pool is inactive \(1/2 ready\)")
    assert _get(router, "/readyz") == (
        503,
        "not ready: router 'fleet': pool below its quorum, 1 of 3 target(s) ready, quorum-size 2\n",
    )

    mosquitto_fleet[1].start()
    router.wait_for_log(r"router=fleet pool is active \(2/2 ready\)")
    assert _get(router, "/readyz") == (200, "ready\n")


def test_readyz_is_503_while_a_pool_has_no_quorum(mosquitto_fleet: list[Mosquitto], start_routerd) -> None:
    """Scenario: one router's brokers run, another's are down (nothing listens on their ports):
    the process is not ready, and the reason names the router without its quorum, only it."""
    up = [b.port for b in mosquitto_fleet]
    down = [free_port(), free_port()]
    router: Routerd = start_routerd(_config({"up": (up, 1), "down": (down, 1)}, free_port()))
    router.wait_for_log(r"router=up pool is active", consume=False)
    router.wait_for_log(r"router=down target=b0 is not ready", consume=False)
    router.wait_for_log(r"router=down target=b1 is not ready", consume=False)
    assert _get(router, "/readyz") == (
        503,
        "not ready: router 'down': pool below its quorum, 0 of 2 target(s) ready, quorum-size 1\n",
    )
    assert _get(router, "/healthz") == (200, "ok\n")  # alive all the same: no restart wanted


def test_readyz_is_503_from_sigterm_on_while_a_connection_drains(
    mosquitto_fleet: list[Mosquitto], start_routerd
) -> None:
    """Scenario: a client session is open through the router; SIGTERM starts a 30 s grace period.
    At once /readyz says `shutting down` (Kubernetes takes the pod out of its Service), /healthz
    still answers, the session still works; once the client leaves, routerd exits 0 well before
    the grace period's end."""
    port = free_port()
    ports = [b.port for b in mosquitto_fleet]
    router: Routerd = start_routerd(_config({"fleet": (ports, 1)}, port), "--grace-period", "30")
    assert eventually(lambda: _get(router, "/readyz") == (200, "ready\n"), TIMEOUT_S)
    with _mqtt_connect(port, "draining-client") as client:
        assert router.proc is not None
        router.proc.send_signal(signal.SIGTERM)
        router.wait_for_log(r"SIGTERM received")
        assert _get(router, "/readyz") == (503, "not ready: shutting down\n")
        router.wait_for_log(r"shutting down: no new connections; open ones are moved over 30 s")
        assert _get(router, "/readyz") == (503, "not ready: shutting down\n")
        assert _get(router, "/healthz") == (200, "ok\n")
        client.sendall(b"\xc0\x00")  # PINGREQ: the proxied session is alive during the grace period
        assert _recv(client, 2) == b"\xd0\x00"
        assert router.proc.poll() is None
    assert router.proc.wait(TIMEOUT_S) == 0
    router.wait_for_log(r"stopped")


def test_every_target_drained_is_not_ready_everywhere(
    mosquitto_fleet: list[Mosquitto], start_routerd
) -> None:
    """Scenario (issue 34): both targets of a router drained, the quorum still holds (drained
    targets count for it, as in Artemis), yet every new client is refused: /readyz is 503 and
    says why, the status and the metric say 0 targets open, `routerctl wait router … ready` times
    out and `wait target … open` does too while `wait target … ready` returns (a drained target
    is ready). Undrained, all is ready again."""
    ports = [b.port for b in mosquitto_fleet[:2]]
    router: Routerd = start_routerd(_config({"fleet": (ports, 1)}, free_port()))
    assert eventually(lambda: _get(router, "/readyz") == (200, "ready\n"), TIMEOUT_S)
    for node_id in ("b0", "b1"):
        code, _ = routerctl_json(router, "state", "fleet", node_id, "drain")
        assert code == 0
    assert _get(router, "/readyz") == (503, "not ready: router 'fleet': 0 of 2 target(s) open: 2 drained\n")
    document = router.get("/api/v1/routers/fleet")
    assert isinstance(document, dict)
    pool = document["pool"]
    assert (pool["active"], pool["open"], pool["accepting"]) == (True, 0, False)
    assert pool["not_accepting_reason"] == "0 of 2 target(s) open: 2 drained"
    assert re.search(r"^router_pool_open_targets\{router=\"fleet\"\} 0\.0$", router.metrics(), re.M)

    def wait(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*ROUTERCTL, "wait", "--timeout", "1", "--interval", "0.2", "--admin", router.admin, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    refused = wait("router", "fleet", "ready")
    assert refused.returncode == 5, refused
    assert "last: not-ready (0 of 2 target(s) open: 2 drained)" in refused.stderr
    assert wait("target", "fleet", "b0", "open").returncode == 5
    assert wait("target", "fleet", "b0", "ready").returncode == 0

    code, _ = routerctl_json(router, "state", "fleet", "b1", "ready")
    assert code == 0
    assert _get(router, "/readyz") == (200, "ready\n")
    assert wait("router", "fleet", "ready").returncode == 0
    assert wait("target", "fleet", "b1", "open").returncode == 0
    assert re.search(r"^router_pool_open_targets\{router=\"fleet\"\} 1\.0$", router.metrics(), re.M)
