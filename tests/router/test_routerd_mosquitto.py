"""routerd end to end: real mosquitto brokers, real paho clients from several 127.0.0.x sources.

Scenario of the foundation issue: proxy mode, key SOURCE_IP, CONSISTENT_HASH over three brokers.
Each source address lands where `routerctl route` predicts, always the same; killing its broker
moves it to the floor neighbour once the probe sees the broker down; a restart brings it back.
FIRST_ELEMENT fails over in pool order; a pool below quorum refuses.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from tests.router.conftest import MqttObserver, acceptors_xml, broker_xml, mqtt_round_trip, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd

SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
# Node ids chosen so Artemis's one-point-per-node ring splits 127.0.0.2-.9 over all three brokers
# (3/3/2); with most names the eight addresses, whose hashes are close, all land on one node.
NODE_IDS = ["node4", "node9", "node20"]
TIMEOUT_S = 10.0


def _config(brokers: list[Mosquitto], ports: dict[str, int]) -> str:
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    acceptors = acceptors_xml({name: f"router={name};mode=proxy" for name in ports}, ports)
    return broker_xml(
        connectors,
        acceptors,
        f"""
   <connection-router name="hash">
    <key-type>SOURCE_IP</key-type>
    <policy name="CONSISTENT_HASH"/>
    <pool><check-period>200</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors>{refs}</static-connectors></pool>
   </connection-router>
   <connection-router name="first">
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>200</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors>{refs}</static-connectors></pool>
   </connection-router>
   <connection-router name="quorum">
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>200</check-period><quorum-size>3</quorum-size>
     <quorum-timeout>300</quorum-timeout><static-connectors>{refs}</static-connectors></pool>
   </connection-router>""",
    )


def _round_trip(port: int, source: str) -> bool:
    """Connect through the router from `source`, subscribe, publish, receive our own message."""
    return mqtt_round_trip(
        port, client_id=f"c-{uuid.uuid4()}", topic=f"demo/{source}", source=source, timeout=TIMEOUT_S
    )


def _landings(brokers: list[Mosquitto], port: int) -> dict[str, str]:
    """Where a round trip from each source lands, seen by direct subscribers on every running broker."""
    running = {node_id: b.port for node_id, b in zip(NODE_IDS, brokers, strict=True) if b.proc is not None}
    with MqttObserver("demo/#", running, TIMEOUT_S) as seen:
        for source in SOURCES:
            assert _round_trip(port, source), f"no MQTT round trip through the router from {source}"
        topics = seen.wait_for([f"demo/{source}" for source in SOURCES])
    return {topic.removeprefix("demo/"): node for topic, node in topics.items()}


def _predict(router: Routerd, ready: list[str]) -> dict[str, str]:
    decisions = router.route("hash", "--ready", ",".join(ready), *SOURCES)
    return {d["key"]: d["node_id"] for d in decisions}


@pytest.fixture
def routed(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> tuple[Routerd, dict[str, int]]:
    ports = {name: free_port() for name in ("hash", "first", "quorum")}
    router = start_routerd(lambda _admin_port: _config(mosquitto_fleet, ports))
    for _ in NODE_IDS * 3:
        router.wait_for_log(r"target=node\d+ is ready")
    return router, ports


@pytest.mark.integration
def test_routerd_consistent_hash_is_sticky_and_fails_over_to_floor_neighbour(
    routed: tuple[Routerd, dict[str, int]], mosquitto_fleet: list[Mosquitto]
) -> None:
    router, ports = routed
    predicted = _predict(router, NODE_IDS)
    assert sorted(set(predicted.values())) == sorted(NODE_IDS), "the sources must spread"
    first = _landings(mosquitto_fleet, ports["hash"])
    assert first == predicted
    assert _landings(mosquitto_fleet, ports["hash"]) == first  # sticky

    victim_node = predicted["127.0.0.2"]
    victim = mosquitto_fleet[NODE_IDS.index(victim_node)]
    victim.kill()
    router.wait_for_log(rf"router=hash target={victim_node} is not ready")
    survivors = [n for n in NODE_IDS if n != victim_node]
    after_kill = _landings(mosquitto_fleet, ports["hash"])
    assert after_kill == _predict(router, survivors)
    for source, node in first.items():  # only the victim's clients moved
        if node != victim_node:
            assert after_kill[source] == node

    victim.start()
    router.wait_for_log(rf"router=hash target={victim_node} is ready")
    assert _landings(mosquitto_fleet, ports["hash"]) == first


@pytest.mark.integration
def test_routerd_first_element_fails_over_in_pool_order(
    routed: tuple[Routerd, dict[str, int]], mosquitto_fleet: list[Mosquitto]
) -> None:
    router, ports = routed
    assert set(_landings(mosquitto_fleet, ports["first"]).values()) == {"node4"}
    mosquitto_fleet[0].kill()
    router.wait_for_log(r"router=first target=node4 is not ready")
    assert set(_landings(mosquitto_fleet, ports["first"]).values()) == {"node9"}
    mosquitto_fleet[1].kill()
    router.wait_for_log(r"router=first target=node9 is not ready")
    assert set(_landings(mosquitto_fleet, ports["first"]).values()) == {"node20"}
    mosquitto_fleet[0].start()
    router.wait_for_log(r"router=first target=node4 is ready")
    assert set(_landings(mosquitto_fleet, ports["first"]).values()) == {"node4"}


@pytest.mark.integration
def test_routerd_pool_below_quorum_refuses(
    routed: tuple[Routerd, dict[str, int]], mosquitto_fleet: list[Mosquitto]
) -> None:
    router, ports = routed
    assert _round_trip(ports["quorum"], "127.0.0.2")
    mosquitto_fleet[2].kill()
    router.wait_for_log(r"router=quorum pool is inactive \(2/3 ready\)")
    assert not _round_trip(ports["quorum"], "127.0.0.2")
    router.wait_for_log(r"router=quorum key=127\.0\.0\.2 outcome=REFUSED_UNAVAILABLE")
    status = router.get("/api/v1/routers/quorum")
    assert isinstance(status, dict)
    assert status["pool"]["active"] is False


@pytest.mark.integration
def test_routerd_sigterm_exits_zero(routed: tuple[Routerd, dict[str, int]]) -> None:
    router, _ = routed
    assert router.stop() == 0
