"""Storm protection with a real routerd and real mosquitto brokers (issue 33), on both data paths:
an acceptor's `connectionRate` turns a burst of new connections into a ramp without closing any of
them (the kernel's backlog holds them while routerd pauses accepting); a target's `maxConnections`
holds clients in a bounded FIFO queue and refuses, in MQTT's words, those that find it full or
wait longer than `queueTimeout`; its `connectRate` spaces the connects it receives.

Every wait is bounded; routerd is stopped by its PID (tests/router/conftest.py)."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families
from proton import ConnectionException
from proton.utils import BlockingConnection
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from keys import mqtt
from tests.conftest import free_port, read_until_closed
from tests.keys.test_mqtt import connect_packet
from tests.keys.test_openwire import CI_TCP_TIGHT, _cache_off, _wfi_tcp
from tests.router.conftest import acceptors_xml, broker_xml, router_xml, routerctl_json, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd

pytestmark = pytest.mark.integration

TIMEOUT_S = 20.0
RATE = 20
"""The acceptors' connectionRate: new connections a second."""
BURST = 2
CLIENTS = 50
"""One burst of clients, all connecting at once: at RATE a second they take about 2.4 s to get in."""


def _config(broker: Mosquitto, ports: dict[str, int]) -> str:
    connectors, refs = static_connectors([("m0", broker.port)])
    acceptors = acceptors_xml(
        {
            "fast": f"router=r;connectionRate={RATE};connectionBurst={BURST}",
            "trio": f"router=r;connectionRate={RATE};connectionBurst={BURST};fastPath=false",
        },
        ports,
    )
    return broker_xml(connectors, acceptors, router_xml("r", "SOURCE_IP", "FIRST_ELEMENT", refs))


def _connect_at_once(port: int, count: int) -> list[float]:
    """Open `count` MQTT sessions through `port` at once (one thread each): the time each one's
    CONNACK came, from the start; every session must be accepted (none refused or closed)."""
    answered: list[float] = []
    errors: list[str] = []
    start = time.monotonic()
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
                sock.sendall(mqtt.encode_connect(f"storm-{i}"))
                reply = sock.recv(4)
                if reply[:1] != b"\x20" or reply[3:4] != b"\x00":
                    raise RuntimeError(f"no CONNACK 0: {reply!r}")
                with lock:
                    answered.append(time.monotonic() - start)
        except (OSError, RuntimeError) as exc:
            with lock:
                errors.append(f"client {i}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 2)
    assert errors == []
    return sorted(answered)


@pytest.mark.parametrize("acceptor", ["fast", "trio"])
def test_connection_rate_turns_a_burst_into_a_ramp_and_closes_nothing(
    acceptor: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    ports = {"fast": free_port(), "trio": free_port()}
    router = start_routerd(lambda admin: _config(mosquitto_fleet[0], ports))
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    times = _connect_at_once(ports[acceptor], CLIENTS)
    assert len(times) == CLIENTS
    # BURST at once, then RATE a second: the last one is let in after (CLIENTS - BURST) / RATE s.
    assert times[-1] >= (CLIENTS - BURST) / RATE * 0.9
    for i, first in enumerate(times):
        in_a_second = sum(1 for t in times[i:] if t < first + 1.0)
        assert in_a_second <= RATE + BURST + 1, (first, times)
    # The pauses are counted: about as long as the ramp took beyond the burst.
    found = re.search(
        rf'^router_acceptor_paused_seconds_total\{{acceptor="{acceptor}"\}} (\S+)$', router.metrics(), re.M
    )
    assert found is not None
    assert (CLIENTS - BURST) / RATE * 0.8 <= float(found.group(1)) <= times[-1] + 1.0


# -- a target's gate ---------------------------------------------------------------------------------

SERVER_UNAVAILABLE = 0x88
"""The CONNACK code routerd, as Artemis, sends an MQTT 3.1.1 client it refuses as unavailable (MQTT
5's "server unavailable"; keys/mqtt.py `encode_connack_v3_as_artemis`)."""


def _gated_config(
    broker: Mosquitto, ports: dict[str, int], connector_params: str, *, check_period_ms: int = 1000
) -> str:
    """Router r over the one target m0 (connector c0 with `connector_params`), keyed on CLIENT_ID,
    served by a fast-path and a trio-path acceptor."""
    connector = f'<connector name="c0">tcp://127.0.0.1:{broker.port}?nodeId=m0;{connector_params}</connector>'
    acceptors = acceptors_xml({"fast": "router=r", "trio": "router=r;fastPath=false"}, ports)
    ref = "<connector-ref>c0</connector-ref>"
    routers = router_xml("r", "CLIENT_ID", "FIRST_ELEMENT", ref, check_period_ms=check_period_ms)
    return broker_xml(connector, acceptors, routers)


def _session(port: int, client_id: str) -> socket.socket:
    """An MQTT 3.1.1 session's socket, its CONNECT sent (read its CONNACK with `_connack`)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.sendall(mqtt.encode_connect(client_id))
    return sock


def _connack(sock: socket.socket) -> int | None:
    """The CONNACK's return code; None when the connection closed without one."""
    reply = b""
    while len(reply) < 4:
        chunk = sock.recv(4 - len(reply))
        if not chunk:
            return None
        reply += chunk
    assert reply[:2] == b"\x20\x02", reply
    return reply[3]


@pytest.mark.parametrize("acceptor", ["fast", "trio"])
def test_max_connections_queues_then_refuses_in_mqtt_words(
    acceptor: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: maxConnections=2, maxQueue=1, queueTimeout=1500. Two sessions get in; the third
    waits; the fourth finds the queue full and is refused at once (CONNACK 0x88); when one of the two
    leaves, the third gets in. Then a fourth waits the whole queue timeout and is refused."""
    ports = {"fast": free_port(), "trio": free_port()}
    params = "maxConnections=2;maxQueue=1;queueTimeout=1500"
    router = start_routerd(lambda admin: _gated_config(mosquitto_fleet[0], ports, params))
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    port = ports[acceptor]
    first, second = _session(port, "s1"), _session(port, "s2")
    assert (_connack(first), _connack(second)) == (0, 0)
    waiting = _session(port, "s3")
    time.sleep(0.3)  # s3 is in the queue now (its CONNACK does not come)
    full = _session(port, "s4")
    began = time.monotonic()
    assert _connack(full) == SERVER_UNAVAILABLE
    assert time.monotonic() - began < 1.0  # at once, not after the queue timeout
    router.wait_for_log(r"key=s4 target=m0 outcome=REFUSED_UNAVAILABLE reason=queue full", TIMEOUT_S)
    first.close()
    assert _connack(waiting) == 0
    router.wait_for_log(r"key=s3 target=m0 waited_s=\d+\.\d+: let in by the target's gate", TIMEOUT_S)
    late = _session(port, "s5")
    began = time.monotonic()
    assert _connack(late) == SERVER_UNAVAILABLE
    assert 1.3 < time.monotonic() - began < 5.0
    router.wait_for_log(
        r"key=s5 target=m0 outcome=REFUSED_UNAVAILABLE reason=queue timeout waited_s=1\.", TIMEOUT_S
    )
    document = router.get("/api/v1/routers/r")
    assert isinstance(document, dict)
    (target,) = document["pool"]["targets"]
    assert _schema_errors(target) == []
    assert target["gate"] == {
        "open": 2,
        "limit": 2,
        "max_connections": 2,
        "queued": 0,
        "max_queue": 1,
        "queue_timeout_ms": 1500,
        "connect_rate": None,
        "slow_start_share": 1.0,
    }
    metrics = _samples(router)
    assert metrics["router_routing_refusals_total", ("r", "queue_full")] == 1
    assert metrics["router_routing_refusals_total", ("r", "queue_timeout")] == 1
    assert metrics["router_target_gate_connections", ("r", "m0")] == 2
    assert metrics["router_target_gate_limit", ("r", "m0")] == 2
    assert metrics["router_target_queue_length", ("r", "m0")] == 0
    assert metrics["router_target_queue_wait_seconds_count", ("r", "m0")] == 2  # s3 and s5 waited
    for sock in (second, waiting, full, late):
        sock.close()


@pytest.mark.parametrize("acceptor", ["fast", "trio"])
def test_connect_rate_spaces_the_connects_a_target_receives(
    acceptor: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: connectRate=20 and 50 clients at once: every one gets in (the default queue holds
    ten seconds of the rate), no second sees more than 1.1 x 20 (+1) connects."""
    ports = {"fast": free_port(), "trio": free_port()}
    router = start_routerd(lambda admin: _gated_config(mosquitto_fleet[0], ports, "connectRate=20"))
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    times = _connect_at_once(ports[acceptor], CLIENTS)
    assert len(times) == CLIENTS
    assert times[-1] >= (CLIENTS - 2) / 20 * 0.9
    for i, first in enumerate(times):
        in_a_second = sum(1 for t in times[i:] if t < first + 1.0)
        assert in_a_second <= 20 * 1.1 + 1, (first, times)


def _samples(router: Routerd) -> dict[tuple[str, tuple[str, ...]], float]:
    """routerd's samples: (name, (router, then node_id or reason)) -> value."""
    found: dict[tuple[str, tuple[str, ...]], float] = {}
    for family in text_string_to_metric_families(router.metrics()):
        for sample in family.samples:
            labels = sample.labels
            if "router" in labels:
                rest = labels.get("node_id", labels.get("reason", ""))
                found[sample.name, (labels["router"], rest)] = sample.value
    return found


def _schema_errors(target: dict[str, Any]) -> list[str]:
    """What makes a target's document not a `TargetStatus` of docs/admin-api.yaml."""
    document = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "admin-api.yaml").read_text())
    base = "urn:connection-router:admin-api"
    registry: Registry[Any] = Registry().with_resource(
        base, Resource.from_contents(document, default_specification=DRAFT202012)
    )
    validator = Draft202012Validator({"$ref": f"{base}#/components/schemas/TargetStatus"}, registry=registry)
    return [error.message for error in validator.iter_errors(target)]


@pytest.mark.parametrize("acceptor", ["fast", "trio"])
def test_a_reload_raising_max_connections_lets_waiting_clients_in(
    acceptor: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: maxConnections=1 with a queue of 2 and a long queue timeout; one session is in,
    two wait. A reload that raises maxConnections to 3 lets both in, in place (the first session
    stays connected, nobody is refused)."""
    ports = {"fast": free_port(), "trio": free_port()}
    broker = mosquitto_fleet[0]
    params = "maxConnections={};maxQueue=2;queueTimeout=20000"
    router = start_routerd(lambda admin: _gated_config(broker, ports, params.format(1)))
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    port = ports[acceptor]
    first = _session(port, "r1")
    assert _connack(first) == 0
    waiting = [_session(port, "r2"), _session(port, "r3")]
    deadline = time.monotonic() + TIMEOUT_S
    while _samples(router).get(("router_target_queue_length", ("r", "m0"))) != 2:
        assert time.monotonic() < deadline, "the two sessions never waited"
        time.sleep(0.1)  # another process's state: nothing to wait on
    router.config.write_text(_gated_config(broker, ports, params.format(3)))
    assert router.proc is not None
    router.proc.send_signal(signal.SIGHUP)
    assert [_connack(sock) for sock in waiting] == [0, 0]
    first.sendall(b"\xc0\x00")  # PINGREQ: the first session is still there
    assert first.recv(2) == b"\xd0\x00"
    for sock in (first, *waiting):
        sock.close()


def test_a_full_queue_refuses_amqp_stomp_and_openwire_clients_in_their_words(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: maxConnections=1 without a queue, its one slot held by an MQTT session. A proton
    AMQP client gets Close amqp:connection:forced "... is not ready" (it heard "SASL ok" from
    routerd first), a STOMP client an ERROR frame, an OpenWire client its WireFormatInfo echo and
    then the close (OpenWire has no refusal of its own); each refusal is logged `queue full`."""
    ports = {"fast": free_port(), "trio": free_port()}
    router = start_routerd(
        lambda admin: _gated_config(mosquitto_fleet[0], ports, "maxConnections=1;maxQueue=0")
    )
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    holder = _session(ports["fast"], "holder")
    assert _connack(holder) == 0

    url = f"amqp://guest:guest@127.0.0.1:{ports['trio']}"
    with pytest.raises(ConnectionException) as refused:
        BlockingConnection(url, TIMEOUT_S, container_id="amqp-1", allowed_mechs="PLAIN").close()
    assert "amqp:connection:forced" in str(refused.value)
    assert "Connection router r is not ready" in str(refused.value)
    router.wait_for_log(r"key=amqp-1 target=m0 outcome=REFUSED_UNAVAILABLE reason=queue full", TIMEOUT_S)

    connect = b"CONNECT\naccept-version:1.2\nhost:/\nclient-id:stomp-1\n\n\x00"
    with socket.create_connection(("127.0.0.1", ports["fast"]), timeout=TIMEOUT_S) as sock:
        sock.sendall(connect)
        answer = read_until_closed(sock)
    assert answer.startswith(b"ERROR\n")
    assert b"message:Connection router r is not ready" in answer
    router.wait_for_log(r"key=stomp-1 target=m0 outcome=REFUSED_UNAVAILABLE reason=queue full", TIMEOUT_S)

    wire_format = _wfi_tcp()  # as the Java client: its WireFormatInfo, the echo, its ConnectionInfo
    echo = _cache_off(wire_format)
    with socket.create_connection(("127.0.0.1", ports["fast"]), timeout=TIMEOUT_S) as sock:
        sock.sendall(wire_format)
        got = b""
        while len(got) < len(echo):
            chunk = sock.recv(len(echo) - len(got))
            assert chunk, "closed before the echo"
            got += chunk
        assert got == echo
        sock.sendall(CI_TCP_TIGHT)
        assert read_until_closed(sock) == b""  # nothing but the close
    router.wait_for_log(r"key=client-42 target=m0 outcome=REFUSED_UNAVAILABLE reason=queue full", TIMEOUT_S)
    holder.close()


@pytest.mark.parametrize(
    ("acceptor", "policy", "moves"), [("fast", "FIRST_ELEMENT", True), ("trio", "CONSISTENT_HASH", False)]
)
def test_a_held_back_key_moves_only_when_its_policy_lets_it(
    acceptor: str,
    policy: str,
    moves: bool,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[..., Routerd],
) -> None:
    """Scenario: two targets, the first with maxConnections=1 and no queue. With FIRST_ELEMENT (no
    key belongs to a target) a second client goes to the other target; with CONSISTENT_HASH the
    key belongs to its target and is refused instead."""
    ports = {"fast": free_port(), "trio": free_port()}
    router = _start_two_targets(start_routerd, mosquitto_fleet, ports, policy)
    # Two client ids that CONSISTENT_HASH sends to m0 (FIRST_ELEMENT sends every one there).
    predicted = router.predict("r", "--client-id", [f"k{i}" for i in range(40)])
    on_m0 = [cid for cid, decision in predicted.items() if decision["node_id"] == "m0"][:2]
    assert len(on_m0) == 2
    first = _session(ports[acceptor], on_m0[0])
    assert _connack(first) == 0
    second = _session(ports[acceptor], on_m0[1])
    if moves:
        assert _connack(second) == 0
        router.wait_for_log(
            rf"key={on_m0[1]} target=m0 reason=queue full waited_s=\S+ redispatched_to=m1", TIMEOUT_S
        )
    else:
        assert _connack(second) == SERVER_UNAVAILABLE
        router.wait_for_log(
            rf"key={on_m0[1]} target=m0 outcome=REFUSED_UNAVAILABLE reason=queue full", TIMEOUT_S
        )
    first.close()
    second.close()


@pytest.mark.parametrize("acceptor", ["fast", "trio"])
def test_an_evacuated_connection_gives_its_slot_back(
    acceptor: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: a session holds the one slot of m0 (maxConnections=1); evacuating m0 moves it
    away, and the gate counts no connection any more."""
    ports = {"fast": free_port(), "trio": free_port()}
    router = _start_two_targets(start_routerd, mosquitto_fleet, ports, "FIRST_ELEMENT")
    sessions = [_session(ports[acceptor], "moved-1")]  # MQTT 3.1.1: the evacuation closes it
    assert _connack(sessions[0]) == 0
    assert _gate(router)["open"] == 1
    code, status = routerctl_json(router, "evacuate", "r", "m0", "--rate", "10", "--wait", "--timeout", "30")
    assert code == 0, status
    assert read_until_closed(sessions[0]) == b""
    _wait_for_gate(router, 0)
    # MQTT 5: the evacuation tells it DISCONNECT 0x9C, and the connection leaves its target after.
    code, status = routerctl_json(router, "state", "r", "m0", "ready")
    assert code == 0, status
    sessions.append(socket.create_connection(("127.0.0.1", ports[acceptor]), timeout=TIMEOUT_S))
    sessions[1].sendall(connect_packet(level=5, client_id=b"moved-5"))
    assert sessions[1].recv(3)[:1] == b"\x20"  # CONNACK
    _wait_for_gate(router, 1)
    code, status = routerctl_json(router, "evacuate", "r", "m0", "--rate", "10", "--wait", "--timeout", "30")
    assert code == 0, status
    assert read_until_closed(sessions[1]).find(b"\xe0") >= 0  # DISCONNECT
    _wait_for_gate(router, 0)
    for session in sessions:
        session.close()


def _wait_for_gate(router: Routerd, open_connections: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while _gate(router)["open"] != open_connections:
        assert time.monotonic() < deadline, _gate(router)
        time.sleep(0.1)  # another process's state: nothing to wait on


def _gate(router: Routerd) -> dict[str, Any]:
    """Target m0's gate in router r's status document."""
    document = router.get("/api/v1/routers/r")
    assert isinstance(document, dict)
    (target,) = [t for t in document["pool"]["targets"] if t["node_id"] == "m0"]
    gate: dict[str, Any] = target["gate"]
    return gate


def test_slow_start_ramps_a_restarted_broker_not_one_ready_at_start(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: maxConnections=100 with slowStart=4000. Ready at router start: the full limit.
    Killed and restarted: once ready again its limit starts at 5 (5 %) and grows back to 100."""
    ports = {"fast": free_port(), "trio": free_port()}
    broker = mosquitto_fleet[0]
    params = "maxConnections=100;slowStart=4000"
    router = start_routerd(lambda admin: _gated_config(broker, ports, params, check_period_ms=200))
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    assert (_gate(router)["limit"], _gate(router)["slow_start_share"]) == (100, 1.0)
    broker.kill()
    router.wait_for_log(r"router=r target=m0 is not ready", TIMEOUT_S)
    broker.start()
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    early = _gate(router)
    assert early["limit"] < 50, early
    assert early["slow_start_share"] < 0.5, early
    deadline = time.monotonic() + TIMEOUT_S
    seen = [early["limit"]]
    while seen[-1] < 100:
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)  # another process's state: nothing to wait on
        seen.append(_gate(router)["limit"])
    assert seen == sorted(seen)  # it only grows
    assert len(set(seen)) >= 3  # and in steps, not at once


@pytest.mark.parametrize("policy", ["ROUND_ROBIN", "LEAST_CONNECTIONS"])
def test_slow_start_ramps_a_restarted_brokers_share_of_new_clients(
    policy: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    """Scenario: ROUND_ROBIN (or LEAST_CONNECTIONS) over m0 (slowStart=60000) and m1. After m0 is
    killed and restarted, 40 new clients (half on each data path) arrive within a few seconds of
    its return, at a share of about 5 %: m0 takes a few of them, not half (ROUND_ROBIN) nor all
    until it catches up (LEAST_CONNECTIONS, whose m0 starts empty)."""
    ports = {"fast": free_port(), "trio": free_port()}
    router = _start_two_targets(
        start_routerd, mosquitto_fleet, ports, policy, m0_params="slowStart=60000", check_period_ms=200
    )
    broker = mosquitto_fleet[0]
    broker.kill()
    router.wait_for_log(r"router=r target=m0 is not ready", TIMEOUT_S)
    broker.start()
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    sessions = []
    try:
        for i in range(40):
            sessions.append(_session(ports["fast" if i % 2 else "trio"], f"ramp-{i}"))
            assert _connack(sessions[-1]) == 0
        document = router.get("/api/v1/routers/r")
        assert isinstance(document, dict)
        counts = {t["node_id"]: t["connections"] for t in document["pool"]["targets"]}
        assert counts["m0"] + counts["m1"] == 40, counts
        assert 1 <= counts["m0"] <= 8, counts  # at a full share: 20 (ROUND_ROBIN), 40 (LEAST_CONNECTIONS)
    finally:
        for sock in sessions:
            sock.close()


def _start_two_targets(
    start_routerd: Callable[..., Routerd],
    brokers: list[Mosquitto],
    ports: dict[str, int],
    policy: str,
    *,
    m0_params: str = "maxConnections=1;maxQueue=0",
    check_period_ms: int = 1000,
) -> Routerd:
    """routerd with router r (CLIENT_ID, `policy`) over m0 (`m0_params`: by default
    maxConnections=1, no queue) and m1 (no limits), served by a fast-path and a trio-path
    acceptor; both targets ready."""
    connectors = (
        f'<connector name="c0">tcp://127.0.0.1:{brokers[0].port}?nodeId=m0;{m0_params}</connector>'
        f'<connector name="c1">tcp://127.0.0.1:{brokers[1].port}?nodeId=m1</connector>'
    )
    refs = "<connector-ref>c0</connector-ref><connector-ref>c1</connector-ref>"
    routers = router_xml("r", "CLIENT_ID", policy, refs, check_period_ms=check_period_ms)
    acceptors = acceptors_xml({"fast": "router=r", "trio": "router=r;fastPath=false"}, ports)
    router = start_routerd(lambda admin: broker_xml(connectors, acceptors, routers))
    for node_id in ("m0", "m1"):
        router.wait_for_log(rf"router=r target={node_id} is ready", TIMEOUT_S, consume=False)
    return router
