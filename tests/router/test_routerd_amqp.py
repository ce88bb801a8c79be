"""routerd with AMQP 1.0 keys and native redirect, against two real RabbitMQ nodes and real proton clients.

Keys CLIENT_ID (the Open's container-id) and USER_NAME (the SASL PLAIN authcid) in proxy mode,
with SASL (answered by routerd itself, the broker's SASL preamble dropped on replay) and without;
the AMQP redirect (Open + Close `amqp:connection:redirect` {network-host, port}) read by proton
and followed by the documented snippet `docs/examples/follow_redirect_proton.py`; the refusal of a
router whose pool is dead; bad openings closed within the deadline while a proton client is served.

The two RabbitMQ 3.10 nodes (rabbitmq_amqp1_0 plugin, AMQP 1.0 on the AMQP port) of the test
session (`rabbit_nodes` in tests/router/conftest.py) run on loopback, with their own epmd, stopped
by PID. Their `cluster_name` is the node id of their connector, and RabbitMQ announces it in the
properties of its Open, which routerd relays: that, and a direct consumer on the predicted node,
prove where a connection landed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import read_until_closed
from tests.router.conftest import (
    RABBITMQ_NODE_IDS,
    RABBITMQ_USERS,
    ROUTERCTL,
    acceptors_xml,
    static_connectors,
)

try:
    from proton import ConnectionException, Message, symbol
    from proton.utils import BlockingConnection, ConnectionClosed
except ImportError as missing:  # a collection error that says what to do, never a skip
    raise ImportError("python-qpid-proton is not installed: run ./run-tests, which installs it") from missing

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from tests.router.conftest import RabbitNode, Routerd

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0
CONTAINER_IDS = ["orders-service", "billing", "inventory", "gateway"]
"""The Artemis hash of ids that differ only in their last character differs little, so such ids
tend to land together; varied ids spread. The tests assert they cover both nodes."""
HANDSHAKE_TIMEOUT_S = 2

# AMQP 1.0 protocol header, no SASL (AMQP 1.0 §2.2).
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
# A frame (§2.3.1: SIZE 21, DOFF 2, TYPE 0 = AMQP, channel 0) holding an Open (descriptor 0x10)
# whose list8 has one field, the container-id "raw-1" (str8).
OPEN_RAW_1 = bytes.fromhex("00000015 02 00 0000  00 53 10  c0 08 01  a1 05 7261772d31".replace(" ", ""))
# An Open of 2025 bytes: list32 of one field, a str32 container-id of 2000 bytes. Well-formed, but
# longer than the acceptor's sniffMaxBytes=1024.
OPEN_OVERSIZED = (
    bytes.fromhex("000007e9 02 00 0000  00 53 10  d0 000007d9 00000001  b1 000007d0".replace(" ", ""))
    + b"a" * 2000
)


def _config(nodes: list[RabbitNode], ports: dict[str, int], *, dead_port: int) -> str:
    connectors, refs = static_connectors((n.node_id, n.port) for n in nodes)
    acceptors = {
        "by-container-id": "router=by-container-id;mode=proxy;"
        f"handshake-timeout={HANDSHAKE_TIMEOUT_S};sniffMaxBytes=1024",
        "by-user": "router=by-user;mode=proxy",
        "redirect": "router=by-container-id;mode=redirect",
        "dead": "router=dead;mode=proxy",
    }
    pool = "<check-period>500</check-period><quorum-timeout>0</quorum-timeout>"
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}
    <connector name="nowhere">tcp://127.0.0.1:{dead_port}</connector></connectors>
  <acceptors>{acceptors_xml(acceptors, ports)}</acceptors>
  <connection-routers>
   <connection-router name="by-container-id"><key-type>CLIENT_ID</key-type>
    <policy name="CONSISTENT_HASH"/><pool>{pool}<static-connectors>{refs}</static-connectors></pool>
   </connection-router>
   <connection-router name="by-user"><key-type>USER_NAME</key-type><policy name="CONSISTENT_HASH"/>
    <pool>{pool}<static-connectors>{refs}</static-connectors></pool></connection-router>
   <connection-router name="dead"><key-type>CLIENT_ID</key-type><policy name="FIRST_ELEMENT"/>
    <pool>{pool}<static-connectors><connector-ref>nowhere</connector-ref></static-connectors></pool>
   </connection-router>
  </connection-routers>
</core></configuration>"""


def _nodes_of(decisions: dict[str, dict[str, object]]) -> dict[str, str]:
    return {value: str(decision["node_id"]) for value, decision in decisions.items()}


def _example() -> ModuleType:
    """The documented snippet, loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        "follow_redirect_proton", ROOT / "docs/examples/follow_redirect_proton.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cluster_name(connection: BlockingConnection) -> str:
    """The `cluster_name` RabbitMQ put in its Open: the node id of the broker that answered."""
    assert connection.conn is not None
    properties = connection.conn.remote_properties
    assert isinstance(properties, dict), properties
    return str(properties[symbol("cluster_name")])


def _exchange(url: str, *, container_id: str, queue: str, sasl: bool = True) -> tuple[str, str]:
    """Send two messages to `queue`, receive the first back; (the broker's node id, the body left).

    The second message stays in the queue, for a direct consumer to find on the broker it landed on.
    """
    if sasl:
        connection = BlockingConnection(url, TIMEOUT_S, container_id=container_id, allowed_mechs="PLAIN")
    else:
        connection = BlockingConnection(url, TIMEOUT_S, container_id=container_id, sasl_enabled=False)
    try:
        echoed, left = f"echo {uuid.uuid4()}", f"left {uuid.uuid4()}"
        sender = connection.create_sender(queue)
        sender.send(Message(body=echoed))
        sender.send(Message(body=left))
        receiver = connection.create_receiver(queue)
        message = receiver.receive(timeout=TIMEOUT_S)
        receiver.accept()
        assert message.body == echoed
        return _cluster_name(connection), left
    finally:
        connection.close()


def _take_direct(node: RabbitNode, queue: str) -> object:
    """Receive one message from `queue` straight from `node` (not through routerd); its body."""
    connection = BlockingConnection(node.url(), TIMEOUT_S, allowed_mechs="PLAIN")
    try:
        receiver = connection.create_receiver(queue)
        message = receiver.receive(timeout=TIMEOUT_S)
        receiver.accept()
        return message.body
    finally:
        connection.close()


@pytest.fixture
def routed(
    rabbit_nodes: list[RabbitNode],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> tuple[Routerd, dict[str, int]]:
    ports = {name: free_port() for name in ("by-container-id", "by-user", "redirect", "dead")}
    router = start_routerd(lambda _admin: _config(rabbit_nodes, ports, dead_port=free_port()))
    for _ in range(4):
        router.wait_for_log(r"router=by-(container-id|user) target=rmq-\d is ready")
    return router, ports


@pytest.mark.integration
def test_proxy_by_container_id_lands_where_routerctl_predicts(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: proton with SASL PLAIN; the Open's container-id picks the RabbitMQ node."""
    router, ports = routed
    predicted = _nodes_of(router.predict("by-container-id", "--client-id", CONTAINER_IDS))
    assert set(predicted.values()) == set(RABBITMQ_NODE_IDS), "the container ids must spread over both nodes"
    nodes = {node.node_id: node for node in rabbit_nodes}
    for container_id in CONTAINER_IDS:
        queue = f"/queue/by-container-{uuid.uuid4()}"
        url = f"amqp://guest:guest@127.0.0.1:{ports['by-container-id']}"
        answered, left = _exchange(url, container_id=container_id, queue=queue)
        assert answered == predicted[container_id], container_id
        assert _take_direct(nodes[predicted[container_id]], queue) == left, container_id
        router.wait_for_log(
            rf"router=by-container-id key={container_id} target={predicted[container_id]} outcome=OK"
        )


@pytest.mark.integration
def test_proxy_by_user_name_lands_where_routerctl_predicts(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: the SASL PLAIN authcid picks the node, which authenticates the user itself."""
    router, ports = routed
    predicted = _nodes_of(router.predict("by-user", "--user", RABBITMQ_USERS))
    assert set(predicted.values()) == set(RABBITMQ_NODE_IDS), "the users must spread over both nodes"
    nodes = {node.node_id: node for node in rabbit_nodes}
    for user in RABBITMQ_USERS:
        queue = f"/queue/by-user-{uuid.uuid4()}"
        url = f"amqp://{user}:pw-{user}@127.0.0.1:{ports['by-user']}"
        answered, left = _exchange(url, container_id=f"c-{uuid.uuid4()}", queue=queue)
        assert answered == predicted[user], user
        assert _take_direct(nodes[predicted[user]], queue) == left, user
        router.wait_for_log(rf"router=by-user key={user} target={predicted[user]} outcome=OK")


@pytest.mark.integration
def test_proxy_by_user_name_wrong_password_is_closed_with_the_broker_refusal_logged(
    routed: tuple[Routerd, dict[str, int]],
) -> None:
    """Scenario: routerd said sasl-outcome ok itself; the broker's outcome "auth" ends the connection.

    RabbitMQ answers a bad password after 3 s. Like a direct client, the client through routerd
    gets the AMQP header it is owed and Close amqp:unauthorized-access.
    """
    router, ports = routed
    url = f"amqp://{RABBITMQ_USERS[0]}:wrong@127.0.0.1:{ports['by-user']}"
    with pytest.raises(ConnectionException) as refused:
        BlockingConnection(url, TIMEOUT_S, allowed_mechs="PLAIN").close()
    assert "amqp:unauthorized-access" in str(refused.value)
    router.wait_for_log(
        r"target=rmq-\d closed .* reason=replay_failed "
        r"\(\"target's opening rejected: amqp: broker rejected authentication: code 1 \(auth\)\"\)"
    )


@pytest.mark.integration
def test_proxy_by_container_id_without_sasl_lands_where_routerctl_predicts(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: proton with sasl_enabled=False; RabbitMQ serves it as its amqp1_0.default_user."""
    router, ports = routed
    predicted = _nodes_of(router.predict("by-container-id", "--client-id", CONTAINER_IDS))
    nodes = {node.node_id: node for node in rabbit_nodes}
    for node_id in RABBITMQ_NODE_IDS:  # one container id per node
        container_id = next(c for c in CONTAINER_IDS if predicted[c] == node_id)
        queue = f"/queue/no-sasl-{uuid.uuid4()}"
        url = f"amqp://127.0.0.1:{ports['by-container-id']}"
        answered, left = _exchange(url, container_id=container_id, queue=queue, sasl=False)
        assert answered == node_id, container_id
        assert _take_direct(nodes[node_id], queue) == left, container_id


@pytest.mark.integration
def test_redirect_amqp_close_names_the_predicted_node(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: proton raises ConnectionClosed(amqp:connection:redirect); the info map holds the node."""
    router, ports = routed
    url = f"amqp://guest:guest@127.0.0.1:{ports['redirect']}"
    container_id = CONTAINER_IDS[0]
    predicted = router.predict("by-container-id", "--client-id", [container_id])[container_id]
    expected = next(n for n in rabbit_nodes if n.node_id == predicted["node_id"])
    with pytest.raises(ConnectionClosed) as plain:
        BlockingConnection(url, TIMEOUT_S, container_id=container_id, allowed_mechs="PLAIN").close()
    assert plain.value.condition == "amqp:connection:redirect"  # proton does not follow it
    example = _example()
    with pytest.raises(example.ClosedByPeer) as kept:
        example.KeepingConnection(url, TIMEOUT_S, container_id=container_id, allowed_mechs="PLAIN").close()
    condition = kept.value.remote_condition
    assert condition.name == "amqp:connection:redirect"
    assert condition.info == {symbol("network-host"): "127.0.0.1", symbol("port"): expected.port}
    assert example.redirect_target(condition) == ("127.0.0.1", expected.port)
    router.wait_for_log(
        rf"router=by-container-id key={container_id} target={expected.node_id} outcome=REDIRECT protocol=amqp"
    )


@pytest.mark.integration
def test_redirect_is_followed_by_the_documented_proton_snippet(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: the snippet run as a program follows the redirect, then sends and receives there."""
    router, ports = routed
    predicted = _nodes_of(router.predict("by-container-id", "--client-id", CONTAINER_IDS))
    for node in rabbit_nodes:  # one container id per node
        container_id = next(c for c in CONTAINER_IDS if predicted[c] == node.node_id)
        run = subprocess.run(
            [
                sys.executable,
                str(ROOT / "docs/examples/follow_redirect_proton.py"),
                f"amqp://guest:guest@127.0.0.1:{ports['redirect']}",
                container_id,
                f"/queue/followed-{uuid.uuid4()}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.returncode == 0, run.stderr
        out = run.stdout.splitlines()
        assert out[0] == f"connected to 127.0.0.1:{node.port}", (container_id, out)
        assert out[1].startswith("sent and received hello "), (container_id, out)


@pytest.mark.integration
def test_refusal_unavailable_is_close_forced_not_ready(routed: tuple[Routerd, dict[str, int]]) -> None:
    """Scenario: every target of the pool is down: Close amqp:connection:forced "… is not ready"."""
    router, ports = routed
    router.wait_for_log(r"router=dead target=nowhere is not ready", consume=False)
    example = _example()
    with pytest.raises(example.ClosedByPeer) as kept:
        example.KeepingConnection(
            f"amqp://guest:guest@127.0.0.1:{ports['dead']}",
            TIMEOUT_S,
            container_id="refused-1",
            allowed_mechs="PLAIN",
        ).close()
    condition = kept.value.remote_condition
    assert (condition.name, condition.description) == (
        "amqp:connection:forced",
        "Connection router dead is not ready",
    )
    router.wait_for_log(r"router=dead key=refused-1 outcome=REFUSED_UNAVAILABLE")


def _serve_one(port: int) -> str:
    """A well-behaved proton client's round trip through `port`; the node that answered."""
    queue = f"/queue/good-{uuid.uuid4()}"
    answered, _ = _exchange(f"amqp://guest:guest@127.0.0.1:{port}", container_id="good-1", queue=queue)
    return answered


@pytest.mark.integration
@pytest.mark.parametrize(
    ("opening", "half_close", "log_pattern"),
    [
        (
            AMQP_HEADER + OPEN_RAW_1[:12],
            True,
            r"protocol=amqp handshake rejected: \"client closed after 20 bytes, before the handshake",
        ),
        (
            AMQP_HEADER + OPEN_RAW_1[:12],
            False,
            r"protocol=amqp handshake not complete after 2 s \(20 bytes\)",
        ),
        (
            AMQP_HEADER + b"\xde\xad\xbe\xef" * 4,
            False,
            r"protocol=amqp handshake rejected: \"frame size 3735928559 exceeds the handshake limit",
        ),
        (
            b"AMQP\x00\x00\x09\x01",
            False,
            r"protocol=amqp handshake rejected: \"unsupported protocol header .*\(AMQP 0-9-1\)",
        ),
        # Two bytes: "A" alone could still be AMQP or CORE ("ARTEMIS"), and says protocol=detect.
        (b"AM", False, r"protocol=amqp handshake not complete after 2 s \(2 bytes\)"),
        (
            AMQP_HEADER + OPEN_OVERSIZED,
            False,
            r"protocol=amqp handshake rejected: \"no complete handshake in the first 1024 bytes",
        ),
    ],
    ids=[
        "truncated-frame-then-eof",
        "truncated-frame-then-stall",
        "garbage-after-header",
        "amqp-0-9-1-header",
        "stall-after-two-bytes",
        "open-over-cap",
    ],
)
def test_bad_openings_are_closed_while_a_proton_client_is_served(
    routed: tuple[Routerd, dict[str, int]], opening: bytes, half_close: bool, log_pattern: str
) -> None:
    """Scenario: each bad opening gets one log line naming peer and protocol, and a close in time."""
    router, ports = routed
    port = ports["by-container-id"]
    logged_before = router.mark()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as bad:
        peer = "{}:{}".format(*bad.getsockname())
        bad.sendall(opening)
        if half_close:
            bad.shutdown(socket.SHUT_WR)
        # Meanwhile a well-behaved client on the same acceptor gets its session.
        assert _serve_one(port) in RABBITMQ_NODE_IDS
        read_until_closed(bad)  # closed with unread bytes: a reset is a close too
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S + 3  # the deadline, with scheduling slack
    line = router.wait_for_log(rf"peer={peer} .*{log_pattern}", consume=False)
    about_it = [entry for entry in router.lines[logged_before:] if f"peer={peer} " in entry]
    assert about_it == [line], "one log line per rejected connection"


@pytest.mark.integration
def test_evacuation_tells_an_amqp_client_amqp_connection_forced(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: a proton client proxied (SASL answered by routerd, the broker's Open relayed)
    waits on a receiver; its target is evacuated: proton gets the router's Close
    `amqp:connection:forced` at a frame boundary (a proxy acceptor names no address), not a bare
    reset, and the other broker's client is left alone."""
    router, ports = routed
    predicted = _nodes_of(router.predict("by-container-id", "--client-id", CONTAINER_IDS))
    evacuated = RABBITMQ_NODE_IDS[0]
    moved_id = next(c for c in CONTAINER_IDS if predicted[c] == evacuated)
    kept_id = next(c for c in CONTAINER_IDS if predicted[c] != evacuated)
    url = f"amqp://guest:guest@127.0.0.1:{ports['by-container-id']}"
    moved = BlockingConnection(url, TIMEOUT_S, container_id=moved_id, allowed_mechs="PLAIN")
    kept = BlockingConnection(url, TIMEOUT_S, container_id=kept_id, allowed_mechs="PLAIN")
    try:
        receiver = moved.create_receiver(f"/queue/evacuated-{uuid.uuid4()}")
        command = [*ROUTERCTL, "evacuate", "--admin", router.admin, "by-container-id", evacuated, "--wait"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        with pytest.raises(ConnectionClosed) as closed:
            receiver.receive(timeout=TIMEOUT_S)
        assert closed.value.condition == "amqp:connection:forced"
        queue = f"/queue/kept-{uuid.uuid4()}"
        kept.create_sender(queue).send(Message(body="still here"))
        assert kept.create_receiver(queue).receive(timeout=TIMEOUT_S).body == "still here"
        router.wait_for_log(rf"router=by-container-id target={evacuated} closed .* reason=evacuated")
    finally:
        kept.close()
        with contextlib.suppress(ConnectionException):
            moved.close()
