"""`routerd --workers N` (router/features/workers/service.py): a real routerd with two processes in
front of three real mosquitto brokers, clients speaking MQTT 3.1.1 on raw sockets (a CONNECT, its
CONNACK, a DISCONNECT), and which broker each client went to read from routerd's connection lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

import pytest

from tests.conftest import free_port
from tests.router.conftest import ROUTERCTL

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from tests.router.conftest import Mosquitto, Routerd

CONNACK_OK = b"\x20\x02\x00\x00"


def _config(fleet: Sequence[Mosquitto], policy: str, port: int) -> Callable[[int], str]:
    connectors = "".join(
        f'<connector name="{b.name}">tcp://127.0.0.1:{b.port}?nodeId={b.name}</connector>' for b in fleet
    )
    refs = "".join(f"<connector-ref>{b.name}</connector-ref>" for b in fleet)

    def make(_admin_port: int) -> str:
        return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}</connectors>
  <acceptors><acceptor name="mqtt">tcp://127.0.0.1:{port}?router=r;protocols=MQTT;mode=proxy</acceptor></acceptors>
  <connection-routers><connection-router name="r">
    <key-type>CLIENT_ID</key-type>
    <cache><timeout>600000</timeout></cache>
    <policy name="{policy}"/>
    <pool><check-period>200</check-period><static-connectors>{refs}</static-connectors></pool>
  </connection-router></connection-routers>
</core></configuration>"""

    return make


def _connect(port: int, client_id: str, *, stay: bool = False) -> socket.socket | None:
    """An MQTT 3.1.1 client's CONNECT through routerd; its CONNACK must accept it. With `stay` the
    connection is returned open, else it is closed with a DISCONNECT."""
    cid = client_id.encode()
    rest = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"\x10" + bytes([len(rest)]) + rest)
    answer = b""
    while len(answer) < 4:
        more = sock.recv(4 - len(answer))
        assert more, f"{client_id}: routerd closed the connection before the CONNACK"
        answer += more
    assert answer == CONNACK_OK, (client_id, answer)
    if stay:
        return sock
    sock.sendall(b"\xe0\x00")
    sock.close()
    return None


def _targets(router: Routerd, keys: set[str], count: int, timeout: float = 20.0) -> dict[str, list[str]]:
    """Key -> the targets routerd's connection lines give it, once `count` lines of `keys` are in."""
    deadline = time.monotonic() + timeout
    while True:
        router.mark()  # takes in the lines read so far
        seen: dict[str, list[str]] = defaultdict(list)
        for line in list(router.lines):
            match = re.search(r"router\.conn: .*key=(\S+) target=(\S+) outcome=OK", line)
            if match is not None and match[1] in keys:
                seen[match[1]].append(match[2])
        if sum(map(len, seen.values())) >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def _accepted(router: Routerd) -> int:
    """`router_connections_accepted_total` of the supervisor's /metrics, every label set."""
    total = 0.0
    for line in router.metrics().splitlines():
        if line.startswith("router_connections_accepted_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _accepted_reaches(router: Routerd, count: int, timeout: float = 10.0) -> int:
    """`_accepted` once it is `count` (the workers send their counts every second), or at the
    deadline."""
    deadline = time.monotonic() + timeout
    while (seen := _accepted(router)) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return seen


def _status(router: Routerd) -> dict[str, object]:
    document = router.get("/api/v1/status")
    assert isinstance(document, dict)
    return document


def _worker_pid(router: Routerd) -> int:
    workers = _status(router)["workers"]
    assert isinstance(workers, list), workers
    assert len(workers) == 1, workers
    pid = workers[0]["pid"]
    assert isinstance(pid, int), workers
    return pid


@pytest.mark.integration
@pytest.mark.parametrize("policy", ["ROUND_ROBIN", "CONSISTENT_HASH"])
def test_two_workers_send_1000_client_ids_to_the_same_broker_both_times(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], policy: str
) -> None:
    """Scenario: 1,000 client ids connect twice each through `--workers 2`. Every id landed on one
    broker both times; ROUND_ROBIN's first choices are spread evenly, its turns being one position;
    the supervisor's /metrics counts the 2,000 connections of both processes."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, policy, port), "--workers", "2")
    router.wait_for_log(r"worker 1 ready: 1 acceptor\(s\) listening")
    keys = [f"client-{i}" for i in range(1000)]
    for _ in range(2):
        for key in keys:
            _connect(port, key)
    seen = _targets(router, set(keys), 2000)
    assert sorted(len(targets) for targets in seen.values()) == [2] * 1000
    split = {key: targets for key, targets in seen.items() if len(set(targets)) != 1}
    assert split == {}
    assert _accepted_reaches(router, 2000) == 2000
    spread = Counter(targets[0] for targets in seen.values())
    if policy == "ROUND_ROBIN":
        assert sorted(spread.values()) == [333, 333, 334], spread
    else:
        assert len(spread) == 3, spread
    assert router.stop() == 0


@pytest.mark.integration
def test_a_drain_reaches_the_workers_and_a_killed_worker_is_started_again(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: an operator drains a broker through the supervisor's admin API: no new client of
    either process goes there. Then the worker is killed (SIGKILL): the supervisor's clients stay
    connected and the worker's go (both served), the supervisor starts the worker again, and the
    supervisor's /metrics still counts the killed worker's connections beside the new ones;
    SIGTERM stops both processes."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, "ROUND_ROBIN", port), "--workers", "2")
    router.wait_for_log(r"worker 1 ready: 1 acceptor\(s\) listening")
    drained = mosquitto_fleet[0].name
    request = urllib.request.Request(
        f"{router.admin}/api/v1/routers/r/targets/{drained}",
        data=json.dumps({"admin_state": "drain"}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    time.sleep(0.5)  # the board is followed every 50 ms
    keys = {f"after-drain-{i}" for i in range(300)}
    for key in sorted(keys):
        _connect(port, key)
    seen = _targets(router, keys, 300)
    assert sum(map(len, seen.values())) == 300
    assert not any(drained in targets for targets in seen.values())

    held = [_connect(port, f"held-{i}", stay=True) for i in range(40)]
    assert _accepted_reaches(router, 340) == 340
    pid = _worker_pid(router)
    shown = subprocess.run(
        [*ROUTERCTL, "status", "--admin", router.admin],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"1 of 1 running (pid {pid}), 0 restart(s)" in shown.stdout, shown.stdout + shown.stderr
    router.mark()
    os.kill(pid, signal.SIGKILL)
    router.wait_for_log(rf"worker 1 \(pid {pid}\) killed by SIGKILL; starting it again in 1 s")
    router.wait_for_log(r"worker 1 ready: 1 acceptor\(s\) listening")
    alive = 0
    for sock in held:
        assert sock is not None
        try:
            sock.sendall(b"\xc0\x00")  # PINGREQ
            alive += sock.recv(2) == b"\xd0\x00"
        except OSError:
            pass
        sock.close()
    assert 0 < alive < 40, alive  # the supervisor's stayed, the killed worker's went
    assert _worker_pid(router) != pid
    for i in range(200):
        _connect(port, f"after-restart-{i}")
    assert _accepted_reaches(router, 540) == 540  # the killed worker's counted connections stay
    new_pid = _worker_pid(router)
    assert router.stop() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(new_pid, 0)


@pytest.mark.integration
def test_a_reload_of_the_supervisor_reloads_the_workers(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: the file changes (a key filter that routes client ids by their first 8 characters
    only) and the supervisor reloads (POST /api/v1/reload): the worker reloads its file too, so
    that clients of either process are routed by the new key. Then both get SIGTERM at once (as
    systemd sends it to the whole cgroup): both drain and exit 0."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, "CONSISTENT_HASH", port), "--workers", "2")
    router.wait_for_log(r"worker 1 ready: 1 acceptor\(s\) listening")
    text = router.config.read_text()
    filtered = "<key-type>CLIENT_ID</key-type><key-filter>^.{8}</key-filter>"
    router.config.write_text(text.replace("<key-type>CLIENT_ID</key-type>", filtered))
    request = urllib.request.Request(f"{router.admin}/api/v1/reload", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    router.wait_for_log(r"worker 1: the supervisor reloaded; reloading")
    router.wait_for_log(r"configuration .* reloaded")
    router.mark()
    for i in range(100):
        _connect(port, f"filtered-{i}")
    seen = _targets(router, {"filtered"}, 100)  # the key each process took: the filter's match
    assert len(seen["filtered"]) == 100
    assert len(set(seen["filtered"])) == 1  # one key, one broker, whichever process decided
    # SIGTERM to both at once, as systemd's KillMode=control-group sends it: the worker's second one
    # (from its supervisor) does not cut its grace period short. Clients held open, so that each
    # process has some to move over its grace period.
    held = [_connect(port, f"held-{i}", stay=True) for i in range(30)]
    worker = _worker_pid(router)
    os.kill(worker, signal.SIGTERM)
    assert router.stop() == 0
    for sock in held:
        assert sock is not None
        sock.close()
    router_lines = "\n".join(router.lines)
    assert "worker 1: SIGTERM received, stopping already" in router_lines
    assert "second signal" not in router_lines
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


@pytest.mark.integration
def test_an_evacuation_moves_the_clients_of_every_process(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: 40 MQTT clients on one broker (FIRST_ELEMENT), served by both processes; an
    operator evacuates the broker through the supervisor's admin API: every client is moved
    (an MQTT 3.1.1 client's connection is closed, so that it reconnects elsewhere), the worker's
    too, each process at its share of the rate; new clients go to the next broker."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, "FIRST_ELEMENT", port), "--workers", "2")
    router.wait_for_log(r"worker 1 ready: 1 acceptor\(s\) listening")
    held = [_connect(port, f"evacuated-{i}", stay=True) for i in range(40)]
    assert _accepted_reaches(router, 40) == 40
    first = mosquitto_fleet[0].name
    request = urllib.request.Request(
        f"{router.admin}/api/v1/routers/r/targets/{first}/evacuation",
        data=json.dumps({"rate": 400}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202
        assert json.loads(answer.read())["rate"] == 200  # the supervisor's share
    closed = 0
    for sock in held:
        assert sock is not None
        sock.settimeout(10)
        try:
            closed += sock.recv(16) == b""
        except OSError:
            closed += 1
        sock.close()
    assert closed == 40
    router.mark()
    started = [line for line in router.lines if f"evacuate of target={first} started" in line]
    assert len(started) == 2, started  # the supervisor's part and the worker's, at 200/s each
    assert all("at 200/s" in line for line in started)
    _connect(port, "after-evacuation")
    seen = _targets(router, {"after-evacuation"}, 1)
    assert seen["after-evacuation"] == [mosquitto_fleet[1].name]
    assert router.stop() == 0


@pytest.mark.integration
def test_what_several_workers_cannot_serve_is_refused_in_one_line(tmp_path: Path) -> None:
    """Scenario: routerd --workers 2 on an acceptor with port 0 (each process would listen on a port
    of its own): exit status 2, the rule in one line on stderr, no traceback. (rules.py's tests
    have the other rules.)"""
    config = tmp_path / "router.xml"
    config.write_text(
        """<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors><connector name="b1">tcp://127.0.0.1:1?nodeId=b1</connector></connectors>
  <acceptors><acceptor name="mqtt">tcp://127.0.0.1:0?router=r;protocols=MQTT</acceptor></acceptors>
  <connection-routers><connection-router name="r"><key-type>CLIENT_ID</key-type><cache/>
    <policy name="ROUND_ROBIN"/>
    <pool><static-connectors><connector-ref>b1</connector-ref></static-connectors></pool>
  </connection-router></connection-routers>
</core></configuration>"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "router", "--config", str(config), "--no-admin", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "routerd: error: --workers 2: acceptor 'mqtt' has port 0 (each process would listen on a port "
        "of its own); give it a port"
    )
    assert "Traceback" not in done.stderr
