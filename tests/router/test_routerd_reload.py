"""Configuration reload of a real routerd with real mosquitto brokers and paho sessions: SIGHUP and
`POST /api/v1/reload` apply a changed file in place, established sessions live on (only those
whose target left the file are closed), a bad file changes nothing (docs/operations.md,
"Reloading the configuration")."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import accepts, eventually, free_port
from tests.router.conftest import (
    ROUND_ROBIN_NODE_IDS,
    ROUTERCTL,
    Routerd,
    acceptors_xml,
    mqtt_round_trip,
    static_connectors,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from pathlib import Path

    from tests.router.conftest import Mosquitto

pytestmark = pytest.mark.integration

NODE_IDS = ROUND_ROBIN_NODE_IDS
SESSIONS = 100
"""Live MQTT sessions held through the reloads (issue 13, point 3)."""


def _config(
    brokers: Sequence[Mosquitto],
    pool: Sequence[int],
    acceptors: Mapping[str, int],
    *,
    key_filter: str = "",
    policy: str = "ROUND_ROBIN",
    fast_path: bool = True,
) -> str:
    """Router `rr` (CLIENT_ID) over the brokers at indexes `pool`, one MQTT acceptor per name."""
    connectors, _ = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    refs = "".join(f"<connector-ref>c{i}</connector-ref>" for i in pool)
    query = "router=rr;protocols=MQTT" + ("" if fast_path else ";fastPath=false")
    accepting = acceptors_xml(dict.fromkeys(acceptors, query), acceptors)
    filter_element = f"<key-filter>{key_filter}</key-filter>" if key_filter else ""
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <connectors>{connectors}</connectors>
  <acceptors>{accepting}</acceptors>
  <connection-routers>
   <connection-router name="rr">
    <key-type>CLIENT_ID</key-type>
    {filter_element}
    <policy name="{policy}"/>
    <pool><check-period>200</check-period><static-connectors>{refs}</static-connectors></pool>
   </connection-router>
  </connection-routers>
 </core>
</configuration>
"""


def _post_reload(router: Routerd) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(router.admin + "/api/v1/reload", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _listening_inode(pid: int, port: int) -> str:
    """The inode of the socket listening on 127.0.0.1:`port` in routerd's network namespace."""
    with open(f"/proc/{pid}/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and local == f"0100007F:{port:04X}":
                return inode
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


class Session:
    """One paho MQTT session through the router: it subscribes to its own topic and counts what it
    publishes and receives, and every connect and disconnect."""

    def __init__(self, port: int, client_id: str, topic: str) -> None:
        self.topic = topic
        self.published: set[int] = set()
        self.received: set[int] = set()
        self.connects = 0
        self.disconnects: list[str] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, reconnect_on_failure=False)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda *_a: self._subscribed.set()
        self.client = client
        client.connect("127.0.0.1", port, keepalive=30)
        client.loop_start()

    def _on_connect(self, client: mqtt.Client, *_a: object) -> None:
        self.connects += 1
        client.subscribe(self.topic, qos=1)

    def _on_disconnect(self, _c: mqtt.Client, _u: object, _f: object, reason: object, _p: object) -> None:
        self.disconnects.append(str(reason))

    def _on_message(self, _c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.add(int(message.payload))

    def ready(self, timeout: float) -> bool:
        return self._subscribed.wait(timeout)

    def publish(self, number: int) -> None:
        self.published.add(number)
        self.client.publish(self.topic, str(number).encode(), qos=1)

    def all_arrived(self) -> bool:
        with self._lock:
            return self.received >= self.published

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _open_sessions(port: int, count: int, prefix: str) -> list[Session]:
    run = uuid.uuid4().hex[:8]
    sessions = [Session(port, f"{prefix}-{run}-{i}", f"reload-{run}/{i}") for i in range(count)]
    assert all(s.ready(20) for s in sessions), "every session subscribed through the router"
    return sessions


class _Publisher:
    """Has every session publish the next number every 50 ms, in its own thread, until stopped."""

    def __init__(self, sessions: Sequence[Session]) -> None:
        self._sessions = sessions
        self._stop = threading.Event()
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for session in self._sessions:
                session.publish(self.rounds)
            self.rounds += 1
            self._stop.wait(0.05)

    def wait_rounds(self, more: int) -> None:
        """Let `more` rounds go by (bounded)."""
        until = self.rounds + more
        assert eventually(lambda: self.rounds >= until, 30)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def sessions_closed() -> Iterator[list[Session]]:
    """Sessions a test opens, closed at its end whatever happened."""
    opened: list[Session] = []
    yield opened
    for session in opened:
        session.close()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
def test_100_sessions_live_through_three_reloads(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    sessions_closed: list[Session],
    fast_path: bool,
) -> None:
    """Scenario: 100 paho sessions publish and receive through routerd while it reloads a file that
    adds a target, then changes the key filter and adds an acceptor, then removes an acceptor that
    has no sessions: no session is disconnected, every message arrives, the unchanged acceptor keeps
    its listening socket, the new one accepts and the removed one refuses connects."""
    brokers = mosquitto_fleet
    main, spare, extra = free_port(), free_port(), free_port()
    router = start_routerd(
        lambda _admin: _config(brokers, [0, 1], {"mqtt": main, "spare": spare}, fast_path=fast_path)
    )
    router.wait_for_log(r"router=rr pool is active")
    assert router.proc is not None
    inode = _listening_inode(router.proc.pid, main)
    sessions_closed.extend(_open_sessions(main, SESSIONS, "live"))
    publisher = _Publisher(sessions_closed)
    try:
        publisher.wait_rounds(3)

        # 1. a target is added (SIGHUP)
        router.config.write_text(
            _config(brokers, [0, 1, 2], {"mqtt": main, "spare": spare}, fast_path=fast_path)
        )
        router.proc.send_signal(signal.SIGHUP)
        summary = "router rr changed (pool, targets; targets added: b2)"
        router.wait_for_log(re.escape(f"configuration {router.config} reloaded: {summary}"))
        router.wait_for_log(r"router=rr target=b2 is ready")
        publisher.wait_rounds(3)

        # 2. the key filter changes and an acceptor is added (the admin API)
        router.config.write_text(
            _config(
                brokers,
                [0, 1, 2],
                {"mqtt": main, "spare": spare, "extra": extra},
                key_filter="[a-z0-9-]+",
                fast_path=fast_path,
            )
        )
        status, answer = _post_reload(router)
        assert status == 200, answer
        assert answer["acceptors"] == {"added": ["extra"], "removed": [], "changed": []}
        assert answer["routers"]["changed"] == [
            {
                "name": "rr",
                "what": ["key-filter"],
                "targets_added": [],
                "targets_removed": [],
                "targets_changed": [],
            }
        ]
        assert mqtt_round_trip(extra, client_id=f"new-{uuid.uuid4()}", topic="reload/extra")
        publisher.wait_rounds(3)

        # 3. the acceptor without sessions is removed
        router.config.write_text(
            _config(
                brokers,
                [0, 1, 2],
                {"mqtt": main, "extra": extra},
                key_filter="[a-z0-9-]+",
                fast_path=fast_path,
            )
        )
        status, answer = _post_reload(router)
        assert (status, answer["summary"]) == (200, "acceptors removed: spare")
        assert not accepts(spare)
        publisher.wait_rounds(3)
    finally:
        publisher.stop()

    assert eventually(lambda: all(s.all_arrived() for s in sessions_closed), 30), "every message arrived"
    assert [s.disconnects for s in sessions_closed] == [[]] * SESSIONS
    assert [s.connects for s in sessions_closed] == [1] * SESSIONS
    assert publisher.rounds >= 12
    assert _listening_inode(router.proc.pid, main) == inode
    assert mqtt_round_trip(main, client_id=f"after-{uuid.uuid4()}", topic="reload/after")
    status_document: Any = router.get("/api/v1/routers/rr")
    assert status_document["key_filter"] == "[a-z0-9-]+"
    assert [t["node_id"] for t in status_document["pool"]["targets"]] == list(NODE_IDS)

    def proxied() -> int:
        document: Any = router.get("/api/v1/routers/rr")
        return sum(t["connections"] for t in document["pool"]["targets"])

    assert eventually(lambda: proxied() == SESSIONS, 10)  # the round trips' connections have ended
    router.mark()  # take in every line so far
    assert not [line for line in router.lines if "closing its" in line or " ERROR " in line]


def test_reload_moves_the_sessions_of_a_removed_target_only(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    sessions_closed: list[Session],
) -> None:
    brokers = mosquitto_fleet
    port = free_port()
    router = start_routerd(lambda _admin: _config(brokers, [0, 1], {"mqtt": port}))
    for node_id in ("b0", "b1"):
        router.wait_for_log(rf"router=rr target={node_id} is ready", consume=False)
    sessions_closed.extend(_open_sessions(port, 6, "removed"))
    targets: Any = router.get("/api/v1/routers/rr")
    on_b1 = next(t["connections"] for t in targets["pool"]["targets"] if t["node_id"] == "b1")
    assert on_b1 == 3  # ROUND_ROBIN

    router.config.write_text(_config(brokers, [0], {"mqtt": port}))
    status, answer = _post_reload(router)
    assert status == 200
    assert answer["routers"]["changed"][0]["targets_removed"] == ["b1"]
    # Moved, paced, as `routerctl evacuate` moves them (router/features/moves/service.py).
    router.wait_for_log(re.escape("router=rr evacuate of target=b1 started: 3 connection(s) at 50/s"))
    router.wait_for_log(re.escape("router=rr evacuate of target=b1 done: moved=3 left=0"))
    assert eventually(lambda: sum(bool(s.disconnects) for s in sessions_closed) == 3, 10)
    kept = [s for s in sessions_closed if not s.disconnects]
    for number, session in enumerate(kept):
        session.publish(number)
    assert eventually(lambda: all(s.all_arrived() for s in kept), 10)
    assert eventually(
        lambda: (
            'router_proxied_connections_closed_total{reason="evacuated",router="rr"} 3.0' in router.metrics()
        ),
        10,
    )


def test_reload_of_a_bad_file_changes_nothing_and_says_why_as_at_start(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    tmp_path: Path,
) -> None:
    brokers = mosquitto_fleet
    port = free_port()
    router = start_routerd(lambda _admin: _config(brokers, [0, 1], {"mqtt": port}))
    router.wait_for_log(r"router=rr pool is active")
    before: Any = _stable(router.get("/api/v1/routers"))
    good = router.config.read_text()
    bad = good.replace(
        "<check-period>200</check-period>", "<check-period>200</check-period><quorum-size>-5</quorum-size>"
    )
    assert bad != good
    (tmp_path / "bad").mkdir()
    bad_copy = tmp_path / "bad" / router.config.name
    bad_copy.write_text(bad)
    at_start = subprocess.run(
        [sys.executable, "-m", "router", "--config", str(bad_copy), "--no-admin"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert at_start.returncode == 2
    reason = (
        at_start.stderr.strip().removeprefix("routerd: error: ").replace(str(bad_copy), str(router.config))
    )
    assert "<quorum-size>: must be > 0, got '-5'" in reason

    router.config.write_text(bad)
    status, answer = _post_reload(router)
    assert (status, answer) == (400, {"error": reason})
    assert router.proc is not None
    router.proc.send_signal(signal.SIGHUP)
    router.wait_for_log(
        re.escape(f"ERROR router.server: reload of {router.config} failed, nothing changed: {reason}")
    )
    assert _stable(router.get("/api/v1/routers")) == before
    assert mqtt_round_trip(port, client_id=f"bad-{uuid.uuid4()}", topic="reload/bad")
    result = subprocess.run(
        [*ROUTERCTL, "reload", "--admin", router.admin],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr == f"routerctl: error: {router.admin}/api/v1/reload: 400 {reason}\n"


_PROBE_TIMES = frozenset({"last_check", "last_change", "down_s"})
"""Fields of a target's status that every probe changes (when, how long): `down_s` too, the time a
target that joined took to its first good probe, a few milliseconds that differ between joins."""


def _stable(document: object) -> object:
    """A status document without the fields each probe changes."""
    if isinstance(document, dict):
        return {k: _stable(v) for k, v in document.items() if k not in _PROBE_TIMES}
    if isinstance(document, list):
        return [_stable(v) for v in document]
    return document


def test_sighup_and_the_endpoint_apply_the_same_change(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
) -> None:
    brokers = mosquitto_fleet
    port = free_port()
    first = _config(brokers, [0], {"mqtt": port}, policy="FIRST_ELEMENT")
    second = _config(brokers, [1, 0], {"mqtt": port}, policy="FIRST_ELEMENT")
    router = start_routerd(lambda _admin: first)
    router.wait_for_log(r"router=rr pool is active")
    assert router.proc is not None

    def landed() -> str | None:
        targets: Any = router.get("/api/v1/routers/rr/target?key=k&dry-run=true")
        return str(targets["node_id"])

    router.config.write_text(second)
    router.proc.send_signal(signal.SIGHUP)
    line = router.wait_for_log(r"configuration .* reloaded: ")
    by_signal = line.split(" reloaded: ", 1)[1]
    router.wait_for_log(r"router=rr target=b1 is ready")
    assert eventually(lambda: landed() == "b1", 10)
    status_after_signal: Any = _stable(router.get("/api/v1/routers/rr"))

    router.config.write_text(first)
    status, answer = _post_reload(router)
    assert status == 200
    assert answer["summary"] == "router rr changed (pool, targets; targets removed: b1)"
    assert landed() == "b0"
    router.config.write_text(second)
    status, answer = _post_reload(router)
    assert (status, answer["summary"]) == (200, by_signal)
    router.wait_for_log(r"router=rr target=b1 is ready")
    assert eventually(lambda: landed() == "b1", 10)
    assert eventually(lambda: _stable(router.get("/api/v1/routers/rr")) == status_after_signal, 10)
    assert mqtt_round_trip(port, client_id=f"same-{uuid.uuid4()}", topic="reload/same")


def test_reload_outcome_in_metrics_and_to_systemd(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    run_routerd: Callable[[Routerd], Routerd],
    tmp_path: Path,
) -> None:
    """Scenario (issue 34): routerd under a `Type=notify` unit (NOTIFY_SOCKET: a datagram socket
    of the test's). It says READY=1 once listening; a refused file gives RELOADING=1 then READY=1
    with the refusal, `router_config_last_reload_successful` 0 and the success timestamp kept; a
    good file gives 1 and a later timestamp; SIGTERM gives STOPPING=1. `router_build_info` names
    the version."""
    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(sock_path))
        notify.settimeout(15)
        router = Routerd(tmp_path, lambda _admin: _config(mosquitto_fleet, [0, 1], {"mqtt": free_port()}))
        router.env["NOTIFY_SOCKET"] = str(sock_path)
        run_routerd(router)
        assert notify.recv(4096).decode() == "READY=1\nSTATUS=1 acceptor(s) listening"

        def metric(name: str) -> float:
            found = re.search(rf"^{name} (\S+)$", router.metrics(), re.MULTILINE)
            assert found is not None, name
            return float(found.group(1))

        assert metric("router_config_last_reload_successful") == 1
        started = metric("router_config_last_reload_success_timestamp_seconds")
        assert re.search(
            r'^router_build_info\{python_version="3\.\d+\.\d+",version="[^"]+"\} 1\.0$',
            router.metrics(),
            re.M,
        )

        good = router.config.read_text()

        def reload_with_check_period(period: str) -> subprocess.CompletedProcess[str]:
            """`routerctl reload` of the file with another <check-period>."""
            router.config.write_text(
                good.replace("<check-period>200</check-period>", f"<check-period>{period}</check-period>")
            )
            return subprocess.run(
                [*ROUTERCTL, "reload", "--admin", router.admin], capture_output=True, text=True, timeout=60
            )

        refused = reload_with_check_period("-1")
        assert refused.returncode == 1, refused
        assert notify.recv(4096).decode() == "RELOADING=1\nSTATUS=reloading the configuration"
        message = notify.recv(4096).decode()
        assert message.startswith("READY=1\nSTATUS=reload refused, the configuration in force is unchanged: ")
        assert "check-period" in message
        assert metric("router_config_last_reload_successful") == 0
        assert metric("router_config_last_reload_success_timestamp_seconds") == started

        applied = reload_with_check_period("300")
        assert applied.returncode == 0, applied
        assert notify.recv(4096).decode() == "RELOADING=1\nSTATUS=reloading the configuration"
        assert notify.recv(4096).decode().startswith("READY=1\nSTATUS=configuration reloaded: ")
        assert metric("router_config_last_reload_successful") == 1
        assert metric("router_config_last_reload_success_timestamp_seconds") > started

        assert router.proc is not None
        router.proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096).decode().startswith("STOPPING=1\nSTATUS=shutting down")
        assert router.proc.wait(30) == 0
