"""routerd in front of three real Artemis 2.40 brokers, with Artemis's own CORE client.

The session's brokers (`a1`, `a2`, `a3`: tests/conftest.py `artemis_brokers`) are the targets of
one router keyed on CLIENT_ID (CONSISTENT_HASH), served by a proxy and a redirect acceptor. A CORE
producer (the distribution's `artemis producer --protocol core`, which sets its client ID on the
connection factory, so it travels in CREATESESSION_V2) sends a message through routerd; its
connections with the client ID go to the broker `routerctl route` predicts (routerd's decision
lines), and `artemis queue stat` on each broker finds the message on a broker routerd chose. (The
CLI opens two connections, and one of them now and then creates its session without the client
ID: that one is routed as the NULL key, as Artemis's router routes it.)
In proxy mode the broker's cluster topology never reaches the client (it would name the brokers'
own addresses); in redirect mode the client follows DISCONNECT_V3 to the broker
(`reconnectAttempts` other than 0). A router without a ready target refuses in Artemis's words and
closes, so the Java client does not spin on it.

routerd is started once per module; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import uuid
from typing import TYPE_CHECKING

import pytest

from keys import NEED_MORE, core
from tests.conftest import (
    ARTEMIS_PASSWORD,
    ARTEMIS_USER,
    Artemis,
    free_port,
    read_until_closed,
    run_artemis_cli,
)
from tests.keys.test_core import load_capture
from tests.router.conftest import Routerd, acceptors_xml, broker_xml, static_connectors

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
"""Bound of every wait on routerd (an Artemis client JVM starts in about 1-2 s here)."""
NODE_IDS = ("blue", "crimson", "fox")
"""routerd's node ids of the brokers a1, a2, a3: Artemis's ring has one point per node id, and
these three split the client IDs below between them (a1, a2, a3 would leave a2 almost nothing)."""
ACCEPTORS = {
    "core-proxy": "router=core;mode=proxy",
    "core-redirect": "router=core;mode=redirect",
    "core-dead": "router=dead;mode=proxy",
}
CHECK_PERIOD_MS = 2000
"""The core router's probe period, which is also each probe's deadline: long enough that a probe
never misses it while client JVMs start on a loaded 2-core machine (a target marked not ready for a
moment sends its keys to another broker, which is right, but not what these tests predict)."""
CLIENT_IDS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
"""Candidates: one that `routerctl route` sends to each broker is used."""


def _config(brokers: tuple[Artemis, ...], ports: dict[str, int], admin: int) -> str:
    del admin
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    dead = free_port()
    connectors += f'\n<connector name="nowhere">tcp://127.0.0.1:{dead}?nodeId=nowhere</connector>'
    routers = f"""
      <connection-router name="core">
        <key-type>CLIENT_ID</key-type>
        <policy name="CONSISTENT_HASH"/>
        <pool><check-period>{CHECK_PERIOD_MS}</check-period><static-connectors>{refs}</static-connectors></pool>
      </connection-router>
      <connection-router name="dead">
        <key-type>CLIENT_ID</key-type>
        <policy name="FIRST_ELEMENT"/>
        <pool><check-period>500</check-period>
          <static-connectors><connector-ref>nowhere</connector-ref></static-connectors></pool>
      </connection-router>"""
    return broker_xml(connectors, acceptors_xml(ACCEPTORS, ports), routers)


@pytest.fixture(scope="module")
def routed(
    artemis_brokers: tuple[Artemis, Artemis, Artemis], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Routerd, dict[str, int]]]:
    ports = {name: free_port() for name in ACCEPTORS}
    router = Routerd(tmp_path_factory.mktemp("routerd"), lambda admin: _config(artemis_brokers, ports, admin))
    try:
        router.start()
        for node_id in NODE_IDS:
            router.wait_for_log(rf"router=core target={node_id} is ready", TIMEOUT_S, consume=False)
        yield router, ports
    finally:
        router.stop()


def _one_per_broker(router: Routerd) -> dict[str, str]:
    """A client ID that `routerctl route` sends to each broker: client ID -> node id."""
    nodes = {cid: str(d["node_id"]) for cid, d in router.predict("core", "--client-id", CLIENT_IDS).items()}
    chosen = {node: cid for cid, node in reversed(nodes.items())}
    assert set(chosen) == set(NODE_IDS), f"{CLIENT_IDS} must land on every broker, got {nodes}"
    return {cid: node for node, cid in chosen.items()}


def _produce(url: str, client_id: str, queue: str) -> None:
    done = run_artemis_cli(
        "producer",
        "--protocol",
        "core",
        "--url",
        url,
        "--user",
        ARTEMIS_USER,
        "--password",
        ARTEMIS_PASSWORD,
        "--clientID",
        client_id,
        "--destination",
        f"queue://{queue}",
        "--message-count",
        "1",
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _messages_on(broker: Artemis, queue: str) -> int:
    """Messages `queue` holds on `broker` (0 when it has no such queue), from `artemis queue stat`."""
    done = run_artemis_cli(
        "queue",
        "stat",
        "--url",
        broker.url,
        "--user",
        ARTEMIS_USER,
        "--password",
        ARTEMIS_PASSWORD,
        "--queueName",
        queue,
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout[done.stdout.index("{") :])
    return sum(int(q["messageCount"]) for q in document["data"] if q["name"] == queue)


@pytest.mark.parametrize("acceptor", ["core-proxy", "core-redirect"])
def test_core_clients_land_where_routerctl_route_predicts(
    routed: tuple[Routerd, dict[str, int]], artemis_brokers: tuple[Artemis, Artemis, Artemis], acceptor: str
) -> None:
    router, ports = routed
    brokers = dict(zip(NODE_IDS, artemis_brokers, strict=True))
    predicted = _one_per_broker(router)
    for client_id in predicted:
        queue = f"q-{acceptor}-{uuid.uuid4().hex[:8]}"
        before = router.mark()
        _produce(f"tcp://127.0.0.1:{ports[acceptor]}?reconnectAttempts=5&retryInterval=100", client_id, queue)
        held = {node: _messages_on(broker, queue) for node, broker in brokers.items()}
        router.mark()
        lines = router.lines[before:]
        chosen: dict[str, set[str]] = {}
        for line in lines:
            if m := re.search(r"router=core key=(\S+) target=(\S+)", line):
                chosen.setdefault(m[1], set()).add(m[2])
        changed = [line for line in lines if "router=core target=" in line and "ready" in line]
        # The producer (the distribution's CLI) opens two connections; now and then one of them
        # creates its session without the client ID, so its key is NULL (as in Artemis's router).
        # What is checked: every connection with the client ID went to one broker, the predicted
        # one unless the pool changed meanwhile; the message is on a broker routerd chose.
        assert set(chosen) <= {client_id, "NULL"}, (client_id, lines)
        assert len(chosen.get(client_id, ())) == 1, (client_id, lines)
        assert chosen[client_id] == {predicted[client_id]} or changed, (client_id, chosen, lines)
        landed = {node for node, count in held.items() if count}
        assert sum(held.values()) == 1, (client_id, held, lines)
        assert landed <= set().union(*chosen.values()), (client_id, held, lines)


def _packets(data: bytes) -> list[core.Packet]:
    """The whole CORE packets at the start of `data` (a server's answers, after no magic)."""
    found, offset = [], 0
    while (packet := core.parse_packet(data, offset)) is not NEED_MORE:
        assert isinstance(packet, core.Packet)
        found.append(packet)
        offset = packet.end
    return found


def _session_answer(packets: list[core.Packet]) -> core.Packet | None:
    """The answer to CREATESESSION: the first channel-1 packet that is not an answer to a replayed
    CHECK_FOR_FAILOVER or REATTACH_SESSION."""
    skipped = {core.PacketType.CHECK_FOR_FAILOVER_REPLY, core.PacketType.REATTACH_SESSION_RESP}
    return next((p for p in packets if p.channel == 1 and p.type not in skipped), None)


def test_a_proxied_core_client_never_sees_the_brokers_topology(
    routed: tuple[Routerd, dict[str, int]],
) -> None:
    """The Java client's whole opening sent at once (captured: user alice, whom the brokers do not
    know): the client gets the router's topology (its node ID, no connector), then the broker's
    answer to the session (here its security EXCEPTION), never the broker's own topology."""
    _router, ports = routed
    with socket.create_connection(("127.0.0.1", ports["core-proxy"]), timeout=TIMEOUT_S) as sock:
        sock.sendall(load_capture("v2-client-id"))
        data = b""
        while _session_answer(_packets(data)) is None:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {data.hex()}"
            data += chunk
        sock.settimeout(1.0)  # anything the broker sends late is read too
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                data += chunk
    packets = _packets(data)
    topologies = [p for p in packets if p.type == core.PacketType.CLUSTER_TOPOLOGY_V4]
    assert len(topologies) == 1, [(p.type, p.channel) for p in packets]  # ours alone
    assert core.ROUTER_NODE_ID.encode() in topologies[0].body
    answer = _session_answer(packets)
    assert answer is not None
    assert answer.type == core.PacketType.EXCEPTION
    assert "AMQ229031" in (core.decode_exception(answer).message or "")  # the broker's own words


def test_a_router_without_a_ready_target_refuses_in_artemis_words_and_closes(
    routed: tuple[Routerd, dict[str, int]],
) -> None:
    _router, ports = routed
    with socket.create_connection(("127.0.0.1", ports["core-dead"]), timeout=TIMEOUT_S) as sock:
        sock.sendall(load_capture("v2-client-id"))
        answer = read_until_closed(sock)
    exceptions = [core.decode_exception(p) for p in _packets(answer) if p.type == core.PacketType.EXCEPTION]
    assert [e.code for e in exceptions] == [core.ROUTING_EXCEPTION], answer.hex()
    assert "AMQ229238" in (exceptions[0].message or "")
