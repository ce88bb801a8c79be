"""Paced, protocol-native moves end to end: real mosquitto brokers, real paho MQTT 5 clients,
routerd on both data paths, and `routerctl evacuate | rebalance`.

An evacuation drains the target and tells each of its clients MQTT 5 DISCONNECT 0x9C at the rate
asked; the clients reconnect through the router and land on the other targets (the router cached
their new target), while the other targets' clients are left alone. A rebalance moves just enough
clients to a target that came back. A SIGTERM moves clients over the grace period with
DISCONNECT 0x8B instead of closing them all at its end.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
import uuid
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.conftest import eventually
from tests.router.conftest import ROUND_ROBIN_NODE_IDS, ROUTERCTL, round_robin_config, routerctl_json

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from tests.router.conftest import Mosquitto, Routerd

TIMEOUT_S = 15.0
USE_ANOTHER_SERVER = 0x9C
SERVER_SHUTTING_DOWN = 0x8B


def _config(brokers: Sequence[Mosquitto], port: int, *, fast_path: bool = True) -> Callable[[int], str]:
    acceptor = f"router=rr;mode=proxy;fastPath={str(fast_path).lower()}"
    return round_robin_config(brokers, port, "<cache><timeout>600000</timeout></cache>", acceptor)


class _Client:
    """A paho MQTT 5 client connected through the router; it records the DISCONNECTs it is sent
    and reconnects by itself (paho's loop), unless `reconnect` is False."""

    def __init__(self, port: int, client_id: str, *, reconnect: bool = True) -> None:
        self.client_id = client_id
        self.disconnects: list[tuple[float, int, str | None]] = []
        """(monotonic time, reason code, Server Reference) of each disconnect."""
        self.connects = 0
        self._connected = threading.Condition()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=reconnect,
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.connect("127.0.0.1", port, keepalive=60)
        self.client.loop_start()
        self.wait_connects(1)

    def _on_connect(self, *_args: object) -> None:
        with self._connected:
            self.connects += 1
            self._connected.notify_all()

    def _on_disconnect(
        self, _client: object, _userdata: object, _flags: object, reason: object, properties: object
    ) -> None:
        reference = getattr(properties, "ServerReference", None) if properties is not None else None
        self.disconnects.append((time.monotonic(), int(getattr(reason, "value", 0)), reference))

    def wait_connects(self, count: int) -> None:
        with self._connected:
            assert self._connected.wait_for(lambda: self.connects >= count, TIMEOUT_S), (
                f"{self.client_id}: {self.connects} connects, expected {count}"
            )

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        # The callbacks are bound methods of this object: without them the paho client is no
        # longer in a reference cycle, so it is freed (and closes its socket pair) at once, not
        # by a later garbage collection that warns of unclosed sockets.
        self.client.on_connect = self.client.on_disconnect = None


def _connections(router: Routerd) -> dict[str, int]:
    status = router.get("/api/v1/routers/rr")
    assert isinstance(status, dict)
    return {t["node_id"]: t["connections"] for t in status["pool"]["targets"]}


def _target(router: Routerd, node_id: str) -> dict[str, object]:
    target = router.get(f"/api/v1/routers/rr/targets/{node_id}")
    assert isinstance(target, dict)
    return target


def _wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    assert eventually(predicate, timeout), f"timed out waiting for {what}"


def _client_ids(count: int) -> list[str]:
    run = uuid.uuid4().hex[:6]
    return [f"evac-{run}-{i:02d}" for i in range(count)]


@contextlib.contextmanager
def _resident(router: Routerd, port: int, count: int) -> Iterator[list[_Client]]:
    """`count` clients connected through the router that do not reconnect, closed at the end."""
    clients = [_Client(port, cid, reconnect=False) for cid in _client_ids(count)]
    try:
        _wait_until(lambda: sum(_connections(router).values()) == count, f"{count} clients")
        yield clients
    finally:
        for client in clients:
            client.close()


def test_evacuate_moves_a_targets_clients_paced_in_their_protocol(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario (fast path): 15 clients, 5 per broker; evacuating m0 at 10/s tells its 5 clients
    DISCONNECT 0x9C (no Server Reference: a proxy acceptor) 0.1 s apart, drains m0, and they come
    back through the router to the other two brokers; the other 10 clients are left alone."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port, fast_path=True))
    clients = [_Client(port, cid) for cid in _client_ids(15)]
    try:
        _wait_until(lambda: sorted(_connections(router).values()) == [5, 5, 5], "5 clients per broker")
        evacuated = ROUND_ROBIN_NODE_IDS[0]
        code, status = routerctl_json(
            router, "evacuate", "rr", evacuated, "--rate", "10", "--wait", "--timeout", "30"
        )
        assert code == 0, status
        assert (status["state"], status["moved"], status["left"], status["rate"]) == ("done", 5, 0, 10.0)
        moved = [c for c in clients if c.disconnects]
        assert len(moved) == 5
        assert all(
            [(code, ref) for _, code, ref in c.disconnects] == [(USE_ANOTHER_SERVER, None)] for c in moved
        )
        times = sorted(c.disconnects[0][0] for c in moved)
        assert times[-1] - times[0] >= 0.3  # paced: 10 a second, not all at once
        for client in moved:
            client.wait_connects(2)
        _wait_until(
            lambda: _connections(router)[evacuated] == 0, "no connection left on the evacuated target"
        )
        counts = _connections(router)
        assert sum(counts.values()) == 15
        assert counts[evacuated] == 0
        target = router.get(f"/api/v1/routers/rr/targets/{evacuated}")
        assert isinstance(target, dict)
        assert target["admin_state"] == "drain"
        router.wait_for_log(rf"router=rr evacuate of target={evacuated} done: moved=5 left=0")
        assert f'router_evacuation_moved_total{{node_id="{evacuated}",router="rr"}} 5.0' in router.metrics()
    finally:
        for client in clients:
            client.close()


def test_evacuate_on_the_trio_path_can_name_the_new_target(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario (trio path, --refer): each moved client is told the address of the broker its key
    routes to now, and reconnecting through the router lands it on that very broker."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port, fast_path=False))
    clients = [_Client(port, cid) for cid in _client_ids(6)]
    try:
        _wait_until(lambda: sorted(_connections(router).values()) == [2, 2, 2], "2 clients per broker")
        evacuated = ROUND_ROBIN_NODE_IDS[1]
        code, status = routerctl_json(
            router, "evacuate", "rr", evacuated, "--rate", "50", "--refer", "--wait"
        )
        assert code == 0, status
        assert status["moved"] == 2
        ports = {f"127.0.0.1:{b.port}": n for n, b in zip(ROUND_ROBIN_NODE_IDS, mosquitto_fleet, strict=True)}
        moved = [c for c in clients if c.disconnects]
        assert len(moved) == 2
        for client in moved:
            [(_, reason, reference)] = client.disconnects
            assert reason == USE_ANOTHER_SERVER
            assert reference in ports
            assert ports[reference] != evacuated
            answer = router.get(f"/api/v1/routers/rr/target?key={client.client_id}&dry-run=true")
            assert isinstance(answer, dict)
            assert answer["node_id"] == ports[reference]  # the cache sends it where it was told
    finally:
        for client in clients:
            client.close()


def test_abort_and_status(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario: a slow evacuation is aborted: what moved stays moved, the rest stay connected."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port))
    clients = [_Client(port, cid) for cid in _client_ids(12)]
    try:
        _wait_until(lambda: sorted(_connections(router).values()) == [4, 4, 4], "4 clients per broker")
        evacuated = ROUND_ROBIN_NODE_IDS[2]
        code, status = routerctl_json(router, "evacuate", "rr", evacuated, "--rate", "0.2")
        assert code == 0
        assert status["state"] == "running"
        _wait_until(lambda: sum(bool(c.disconnects) for c in clients) == 1, "the first move")
        code, status = routerctl_json(router, "evacuate", "rr", evacuated, "--abort")
        assert (code, status["state"], status["moved"]) == (0, "aborted", 1)
        time.sleep(2.5)  # a running evacuation would have moved more by now
        assert sum(bool(c.disconnects) for c in clients) == 1
        code, status = routerctl_json(router, "evacuate", "rr", evacuated, "--status")
        assert (status["state"], status["left"]) == ("aborted", 3)
        unknown = subprocess.run(
            [*ROUTERCTL, "evacuate", "--admin", router.admin, "rr", "nope"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert unknown.returncode == 1
        assert "404 no target with node id 'nope' in router 'rr'" in unknown.stderr
    finally:
        for client in clients:
            client.close()


def test_rebalance_moves_just_enough_to_a_target_that_came_back(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario: 12 clients arrive while m2 is in maintenance (6 + 6 + 0); m2 returns; a rebalance
    moves 2 off each of m0 and m1 to m2 (4 + 4 + 4), each client told DISCONNECT 0x9C once."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port))
    back = ROUND_ROBIN_NODE_IDS[2]
    assert routerctl_json(router, "state", "rr", back, "maint")[0] == 0
    clients = [_Client(port, cid) for cid in _client_ids(12)]
    try:
        _wait_until(
            lambda: _connections(router) == {**dict.fromkeys(ROUND_ROBIN_NODE_IDS[:2], 6), back: 0},
            "6 + 6 + 0",
        )
        assert routerctl_json(router, "state", "rr", back, "ready")[0] == 0
        _wait_until(lambda: _target(router, back)["state"] == "ready", "m2 ready")
        code, status = routerctl_json(router, "rebalance", "rr", "--rate", "20", "--band", "0.1", "--wait")
        assert code == 0, status
        assert (status["state"], status["moved"]) == ("done", 4)
        _wait_until(lambda: _connections(router) == dict.fromkeys(ROUND_ROBIN_NODE_IDS, 4), "4 + 4 + 4")
        assert sorted(len(c.disconnects) for c in clients) == [0] * 8 + [1] * 4
    finally:
        for client in clients:
            client.close()


def test_sigterm_moves_clients_over_the_grace_period(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario: SIGTERM with 8 clients and a 4 s grace period: each is told DISCONNECT 0x8B, spread
    over the period (not all at once at its end), and routerd exits 0."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port), "--grace-period", "4")
    with _resident(router, port, 8) as clients:
        assert router.proc is not None
        started = time.monotonic()
        router.proc.send_signal(signal.SIGTERM)
        _wait_until(lambda: all(c.disconnects for c in clients), "every client told", timeout=10)
        reasons = {c.disconnects[0][1] for c in clients}
        assert reasons == {SERVER_SHUTTING_DOWN}
        times = sorted(c.disconnects[0][0] - started for c in clients)
        assert times[0] >= 0.2  # the first after one interval (0.4 s), not at once
        assert times[-1] - times[0] >= 1.5  # spread over the period (0.4 s apart)
        assert times[-1] < 4.0  # all before the end of the grace period
        # It ends by itself once they are gone: a second SIGTERM (stop()) could meet it exiting,
        # after its handlers are gone, and kill it.
        assert router.proc.wait(15) == 0


def test_routerctl_shutdown_wait_returns_once_routerd_is_gone(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario: a Kubernetes preStop: `routerctl shutdown --wait` with 4 clients and a 2 s grace
    period returns 0 only after routerd has moved them and exited, not at the first slow answer."""
    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port), "--grace-period", "2")
    with _resident(router, port, 4) as clients:
        assert router.proc is not None
        started = time.monotonic()
        done = subprocess.run(
            [*ROUTERCTL, "shutdown", "--admin", router.admin, "--wait", "--timeout", "30"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert router.proc.poll() == 0  # gone, and exited cleanly, before routerctl returned
        assert time.monotonic() - started >= 0.5  # the clients were moved over the grace period
        assert all(c.disconnects and c.disconnects[0][1] == SERVER_SHUTTING_DOWN for c in clients)
        assert router.stop() == 0
