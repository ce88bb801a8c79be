"""Targets' administrative states end to end: real mosquitto brokers, real paho clients, routerd
and `routerctl state`.

drain: no new connection lands on the target, not even a client whose key the cache sends there,
while a client connected before keeps working. maint: as drain, and the target is not probed (a
broker stopped meanwhile is not noticed). Both survive a restart of routerd (its state file), and
`ready` opens the target again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import eventually
from tests.router.conftest import ROUND_ROBIN_NODE_IDS, ROUTERCTL, landings_by_key, round_robin_config

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from tests.router.conftest import Mosquitto, Routerd

NODE_IDS = ROUND_ROBIN_NODE_IDS
TIMEOUT_S = 10.0


def _config(brokers: Sequence[Mosquitto], port: int) -> Callable[[int], str]:
    return round_robin_config(brokers, port, "<cache><timeout>600000</timeout></cache>")


_landings = landings_by_key


def _state(router: Routerd, node_id: str, state: str | None = None) -> dict[str, object]:
    command = [
        *ROUTERCTL,
        "state",
        "--json",
        "--admin",
        router.admin,
        "rr",
        node_id,
        *([state] if state else []),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    return document


class _Session:
    """A paho client that stays connected through the router and echoes to itself."""

    def __init__(self, port: int, client_id: str) -> None:
        self.topic = f"session/{uuid.uuid4().hex[:8]}"
        self.got = threading.Event()
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.on_message = lambda *_a: self.got.set()
        self.client.on_subscribe = lambda *_a: subscribed.set()
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        self.client.subscribe(self.topic, qos=1)
        assert subscribed.wait(TIMEOUT_S)

    def round_trip(self) -> bool:
        self.got.clear()
        self.client.publish(self.topic, b"still here", qos=1)
        return self.got.wait(TIMEOUT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_drain_and_maint_keep_new_connections_away_and_survive_a_restart(
    tmp_path: Path, mosquitto_fleet, start_routerd, free_port
):
    port = free_port()
    router: Routerd = start_routerd(_config(mosquitto_fleet, port))
    [drained] = _landings(mosquitto_fleet, port, ["long"]).values()
    session = _Session(port, "long")  # cached: reconnects go to `drained` while it is ready
    try:
        assert _landings(mosquitto_fleet, port, ["long-again"]) != {}  # (round robin moved on)
        document = _state(router, drained, "drain")
        assert (document["admin_state"], document["state"]) == ("drain", "ready")
        router.wait_for_log(rf"router=rr target={drained} admin state drain \(was ready\)")

        fresh = _landings(mosquitto_fleet, port, [f"new-{i}" for i in range(12)])
        assert drained not in fresh.values()
        assert len(set(fresh.values())) == 2
        # A key cached on the drained target goes elsewhere; the session opened before stays.
        assert _landings(mosquitto_fleet, port, ["long"])["long"] != drained
        assert session.round_trip()
    finally:
        session.close()

    # maint on another target: not probed, so its broker stopping goes unnoticed.
    maintained = next(n for n in NODE_IDS if n != drained)
    assert _state(router, maintained, "maint")["admin_state"] == "maint"
    router.wait_for_log(rf"router=rr target={maintained} admin state maint \(was ready\)")
    mosquitto_fleet[NODE_IDS.index(maintained)].stop()
    deadline = time.monotonic() + 1.5  # more than seven check periods
    while time.monotonic() < deadline:
        assert not any(f"target={maintained} is not ready" in line for line in router.lines)
        time.sleep(0.1)
    open_one = next(n for n in NODE_IDS if n not in (drained, maintained))
    assert set(_landings(mosquitto_fleet, port, [f"m-{i}" for i in range(4)]).values()) == {open_one}

    # Both states are kept across a restart.
    assert router.stop() == 0
    router.start()
    router.wait_for_log(r"state file .*: 2 administrative state\(s\) restored")
    status = router.get("/api/v1/routers/rr")
    assert isinstance(status, dict)
    states = {t["node_id"]: t["admin_state"] for t in status["pool"]["targets"]}
    assert states == {drained: "drain", maintained: "maint", open_one: "ready"}
    assert f'router_target_state{{node_id="{maintained}",router="rr",state="maint"}} 1.0' in router.metrics()

    # ready again: the drained target takes new connections (after its probe).
    assert _state(router, drained, "ready")["admin_state"] == "ready"
    again = _landings(mosquitto_fleet, port, [f"back-{i}" for i in range(6)])
    assert set(again.values()) == {drained, open_one}


def test_state_errors_are_one_line(tmp_path: Path, mosquitto_fleet, start_routerd, free_port):
    router: Routerd = start_routerd(_config(mosquitto_fleet, free_port()))
    command = [*ROUTERCTL, "state", "--admin", router.admin, "rr", "nobody", "drain"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "404 no target with node id 'nobody' in the pool of 'rr' (has ['b0', 'b1', 'b2'])"
    )


def _request(
    router: Routerd, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, str]:
    request = urllib.request.Request(router.admin + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_admin_tokens_guard_state_changes_and_say_who_made_them(
    tmp_path: Path, mosquitto_fleet, start_routerd, free_port
):
    reader, operator = "r" * 32, "o" * 32
    tokens = tmp_path / "admin-tokens"
    tokens.write_text(f"dashboards user {reader}\noncall operator {operator}\n")
    tokens.chmod(0o600)
    router: Routerd = start_routerd(_config(mosquitto_fleet, free_port()), "--admin-tokens", str(tokens))
    drain = b'{"admin_state": "drain"}'
    path = "/api/v1/routers/rr/targets/b0"
    assert _request(router, "GET", "/healthz") == (200, "ok\n")  # load balancers' checks need none
    # nor Kubernetes' readiness probe (200 once the first probes made the quorum)
    assert eventually(lambda: _request(router, "GET", "/readyz") == (200, "ready\n"), TIMEOUT_S)
    status, body = _request(router, "PUT", path, drain)
    assert (status, json.loads(body)) == (
        401,
        {"error": "a valid token is needed: Authorization: Bearer TOKEN"},
    )
    status, body = _request(router, "PUT", path, drain, Authorization=f"Bearer {reader}")
    assert (status, json.loads(body)) == (
        403,
        {"error": "token 'dashboards' has level user; PUT needs operator"},
    )
    assert _request(router, "GET", path, Authorization=f"Bearer {reader}")[0] == 200
    status, body = _request(router, "PUT", path, drain, Authorization=f"Bearer {operator}")
    assert (status, json.loads(body)["admin_state"]) == (200, "drain")
    router.wait_for_log(
        r"admin oncall \(operator\) from 127\.0\.0\.1:\d+: PUT /api/v1/routers/rr/targets/b0 -> 200"
    )
    # A path is checked as it is routed: percent-encoded or with a trailing slash, the same.
    for shutdown in ("/api/v1/%73hutdown", "/api/v1/shutdown/"):
        status, body = _request(router, "POST", shutdown, b"{}", Authorization=f"Bearer {operator}")
        assert (status, json.loads(body)) == (
            403,
            {"error": "token 'oncall' has level operator; POST needs admin"},
        )
    assert _request(router, "GET", "/readyz/")[0] == 200  # open, as /readyz
    status, body = _request(router, "GET", path, Authorization=f"Bearer {operator}", Host="evil.example:80")
    assert status == 421
    assert "does not name this router" in json.loads(body)["error"]

    # routerctl sends the token of ROUTERCTL_TOKEN_FILE.
    token_file = tmp_path / "token"
    token_file.write_text(operator + "\n")
    command = [*ROUTERCTL, "state", "--json", "--admin", router.admin, "rr", "b0", "ready"]
    env = {**os.environ, "ROUTERCTL_TOKEN_FILE": str(token_file)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["admin_state"] == "ready"
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode == 4  # the admin API refused access (routerctl's exit statuses)
    assert plain.stderr.strip().endswith("401 a valid token is needed: Authorization: Bearer TOKEN")


def test_an_admin_api_beyond_loopback_needs_tokens(tmp_path: Path, mosquitto_fleet, free_port):
    config = tmp_path / "router.xml"
    config.write_text(_config(mosquitto_fleet, free_port())(0))
    port = free_port()
    command = [sys.executable, "-m", "router", "--config", str(config), "--admin", f"0.0.0.0:{port}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"routerd: error: --admin 0.0.0.0:{port} is reachable from other hosts: give --admin-tokens FILE "
        "(anyone reaching it could drain brokers and read the cache), or listen on loopback"
    )
