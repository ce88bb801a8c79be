"""routerd with AMQP 1.0 keys and native redirect, against two real RabbitMQ nodes and real proton clients.

Keys CLIENT_ID (the Open's container-id) and USER_NAME (the SASL PLAIN authcid) in proxy mode,
with SASL (answered by routerd itself, the broker's SASL preamble dropped on replay) and without;
the AMQP redirect (Open + Close `amqp:connection:redirect` {network-host, port}) read by proton
and followed by the documented snippet `docs/examples/follow_redirect_proton.py`; the refusal of a
router whose pool is dead; bad openings closed within the deadline while a proton client is served.

The two RabbitMQ 3.10 nodes (rabbitmq_amqp1_0 plugin, AMQP 1.0 on the AMQP port) run once per
module, on loopback, with their own epmd, which this module starts and stops by PID. Their
`cluster_name` is the node id of their connector, and RabbitMQ announces it in the properties of
its Open, which routerd relays: that, and a direct consumer on the predicted node, prove where a
connection landed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import free_port, wait_port

try:
    from proton import ConnectionException, Message, ProtonException, symbol
    from proton.utils import BlockingConnection, ConnectionClosed
except ImportError as missing:  # a collection error that says what to do, never a skip
    raise ImportError("python-qpid-proton is not installed: run ./run-tests, which installs it") from missing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

    from tests.router.conftest import Routerd

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0
BOOT_TIMEOUT_S = 90.0
"""First boot takes about 15 s alone (ENVIRONMENT.md §3.4); two at once on two cores, more."""
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
"""The scripts that run as the calling user; /usr/sbin/rabbitmq-server would switch to `rabbitmq`."""
NODE_IDS = ("rmq-1", "rmq-2")
"""CONSISTENT_HASH puts one point per node id on the ring, as Artemis does (no virtual nodes), so
the share of each node depends on where the ids hash: these two split keys about evenly."""
CONTAINER_IDS = ["orders-service", "billing", "inventory", "gateway"]
"""The Artemis hash of ids that differ only in their last character differs little, so such ids
tend to land together; varied ids spread. The tests assert they cover both nodes."""
USERS = ["alice", "bob", "carol", "erin"]
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


def _password_hash(password: str) -> str:
    """RabbitMQ's `rabbit_password_hashing_sha256`: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def _definitions() -> str:
    """Users `guest` and USERS (password "pw-" + name), all allowed everything on vhost "/"."""
    users = ["guest", *USERS]
    return json.dumps(
        {
            "users": [
                {
                    "name": user,
                    "password_hash": _password_hash("guest" if user == "guest" else f"pw-{user}"),
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": ["administrator"] if user == "guest" else [],
                }
                for user in users
            ],
            "vhosts": [{"name": "/"}],
            "permissions": [
                {"user": user, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"} for user in users
            ],
        }
    )


class RabbitNode:
    """One real RabbitMQ node on 127.0.0.1 with the AMQP 1.0 plugin, everything under `workdir`."""

    def __init__(self, workdir: Path, node_id: str, *, epmd_port: int, home: Path) -> None:
        self.node_id = node_id
        self.name = f"{node_id}@localhost"
        self.port, self.dist_port = free_port(), free_port()
        self.dir = workdir / node_id
        self.dir.mkdir(parents=True)
        (self.dir / "definitions.json").write_text(_definitions())
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            f"cluster_name = {node_id}\n"
            f"load_definitions = {self.dir / 'definitions.json'}\n"
            "log.console = true\nlog.console.level = warning\nlog.file = false\n"
        )
        (self.dir / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        self.env = {
            **os.environ,
            "HOME": str(home),  # holds the Erlang cookie shared with rabbitmqctl
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.dir / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
            # Else the distribution ports listen on 0.0.0.0 (ENVIRONMENT.md gotcha 10): the node's,
            # and rabbitmqctl's own for the moment it runs.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the node; `wait_ready` waits for it."""
        with open(self.dir / "console.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own: the wrapper, beam and its helpers
            )

    def wait_ready(self) -> None:
        """Wait until the AMQP port accepts and a defined user can open a connection."""
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.dir / 'console.log'}")
            try:
                wait_port(self.port, timeout=1)
                BlockingConnection(self.url(USERS[-1]), timeout=5, allowed_mechs="PLAIN").close()
                return
            except (TimeoutError, ProtonException, OSError) as not_yet:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} not ready after {BOOT_TIMEOUT_S} s") from not_yet

    def url(self, user: str = "guest") -> str:
        password = "guest" if user == "guest" else f"pw-{user}"
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}"

    def begin_stop(self) -> subprocess.Popen[bytes]:
        """`rabbitmqctl stop PIDFILE`, which returns once the node's process has ended."""
        return subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.name, "stop", str(self.dir / "rabbitmq.pid")],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def end_stop(self, ctl: subprocess.Popen[bytes]) -> None:
        """Wait for `begin_stop`; if the node did not end, SIGKILL its process group by our child's PID."""
        try:
            ctl.wait(60)
        except subprocess.TimeoutExpired:
            ctl.kill()
            ctl.wait(10)
        if self.proc is None:
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its group: started with start_new_session
            self.proc.wait(10)
        self.proc = None


class Epmd:
    """The Erlang port mapper of the nodes, started by us in the foreground so its PID is ours.

    beam would start an `epmd -daemon` that outlives the nodes, and rabbitmqctl starts one when
    none answers; with ours listening on the port, neither does.
    """

    def __init__(self) -> None:
        self.port = free_port()
        binary = shutil.which("epmd")
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, "-port", str(self.port), "-address", "127.0.0.1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(self.port, timeout=TIMEOUT_S)
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def rabbit_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RabbitNode]]:
    """Two running RabbitMQ nodes (node ids NODE_IDS), started in parallel, stopped afterwards."""
    missing = [p for p in ("rabbitmq-server", "rabbitmqctl") if not (RABBITMQ_BIN / p).exists()]
    if missing or shutil.which("epmd") is None:
        pytest.fail("rabbitmq-server is not installed: run ./run-tests, which installs it")
    workdir = tmp_path_factory.mktemp("rabbitmq")
    home = workdir / "home"
    home.mkdir()
    cookie = home / ".erlang.cookie"
    cookie.write_text(uuid.uuid4().hex.upper())
    cookie.chmod(0o400)  # Erlang refuses a cookie others can read
    epmd = Epmd()
    nodes: list[RabbitNode] = []
    try:
        nodes.extend(RabbitNode(workdir, node_id, epmd_port=epmd.port, home=home) for node_id in NODE_IDS)
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready()
        yield nodes
    finally:
        stopping = [(node, node.begin_stop()) for node in nodes if node.proc is not None]
        for node, ctl in stopping:
            node.end_stop(ctl)
        epmd.stop()


def _config(nodes: list[RabbitNode], ports: dict[str, int], *, dead_port: int) -> str:
    connectors = "\n".join(
        f'<connector name="{n.node_id}">tcp://127.0.0.1:{n.port}?nodeId={n.node_id}</connector>'
        for n in nodes
    )
    refs = "".join(f"<connector-ref>{n.node_id}</connector-ref>" for n in nodes)
    acceptors = {
        "by-container-id": "router=by-container-id;mode=proxy;"
        f"handshake-timeout={HANDSHAKE_TIMEOUT_S};sniffMaxBytes=1024",
        "by-user": "router=by-user;mode=proxy",
        "redirect": "router=by-container-id;mode=redirect",
        "dead": "router=dead;mode=proxy",
    }
    acceptor_xml = "\n".join(
        f'<acceptor name="{name}">tcp://127.0.0.1:{ports[name]}?{params}</acceptor>'
        for name, params in acceptors.items()
    )
    pool = "<check-period>500</check-period><quorum-timeout>0</quorum-timeout>"
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>{connectors}
    <connector name="nowhere">tcp://127.0.0.1:{dead_port}</connector></connectors>
  <acceptors>{acceptor_xml}</acceptors>
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


def _predict(router: Routerd, name: str, flag: str, values: list[str]) -> dict[str, dict[str, object]]:
    """`routerctl route` for each value."""
    return router.predict(name, flag, values)


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
    predicted = _nodes_of(_predict(router, "by-container-id", "--client-id", CONTAINER_IDS))
    assert set(predicted.values()) == set(NODE_IDS), "the container ids must spread over both nodes"
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
    predicted = _nodes_of(_predict(router, "by-user", "--user", USERS))
    assert set(predicted.values()) == set(NODE_IDS), "the users must spread over both nodes"
    nodes = {node.node_id: node for node in rabbit_nodes}
    for user in USERS:
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
    url = f"amqp://{USERS[0]}:wrong@127.0.0.1:{ports['by-user']}"
    with pytest.raises(ConnectionException) as refused:
        BlockingConnection(url, TIMEOUT_S, allowed_mechs="PLAIN").close()
    assert "amqp:unauthorized-access" in str(refused.value)
    router.wait_for_log(
        r"protocol=amqp target's opening rejected: broker rejected authentication: code 1 \(auth\)"
    )


@pytest.mark.integration
def test_proxy_by_container_id_without_sasl_lands_where_routerctl_predicts(
    routed: tuple[Routerd, dict[str, int]], rabbit_nodes: list[RabbitNode]
) -> None:
    """Scenario: proton with sasl_enabled=False; RabbitMQ serves it as its amqp1_0.default_user."""
    router, ports = routed
    predicted = _nodes_of(_predict(router, "by-container-id", "--client-id", CONTAINER_IDS))
    nodes = {node.node_id: node for node in rabbit_nodes}
    for node_id in NODE_IDS:  # one container id per node
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
    predicted = _predict(router, "by-container-id", "--client-id", [container_id])[container_id]
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
    predicted = _nodes_of(_predict(router, "by-container-id", "--client-id", CONTAINER_IDS))
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
            r"protocol=amqp handshake rejected: client closed after 20 bytes, before the handshake",
        ),
        (
            AMQP_HEADER + OPEN_RAW_1[:12],
            False,
            r"protocol=amqp handshake not complete after 2 s \(20 bytes\)",
        ),
        (
            AMQP_HEADER + b"\xde\xad\xbe\xef" * 4,
            False,
            r"protocol=amqp handshake rejected: frame size 3735928559 exceeds the handshake limit",
        ),
        (
            b"AMQP\x00\x00\x09\x01",
            False,
            r"protocol=amqp handshake rejected: unsupported protocol header .*\(AMQP 0-9-1\)",
        ),
        (b"A", False, r"protocol=amqp handshake not complete after 2 s \(1 bytes\)"),
        (
            AMQP_HEADER + OPEN_OVERSIZED,
            False,
            r"protocol=amqp handshake rejected: no complete handshake in the first 1024 bytes",
        ),
    ],
    ids=[
        "truncated-frame-then-eof",
        "truncated-frame-then-stall",
        "garbage-after-header",
        "amqp-0-9-1-header",
        "stall-after-first-byte",
        "open-over-cap",
    ],
)
def test_bad_openings_are_closed_while_a_proton_client_is_served(
    routed: tuple[Routerd, dict[str, int]], opening: bytes, half_close: bool, log_pattern: str
) -> None:
    """Scenario: each bad opening gets one log line naming peer and protocol, and a close in time."""
    router, ports = routed
    port = ports["by-container-id"]
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as bad:
        peer = "{}:{}".format(*bad.getsockname())
        bad.sendall(opening)
        if half_close:
            bad.shutdown(socket.SHUT_WR)
        # Meanwhile a well-behaved client on the same acceptor gets its session.
        assert _serve_one(port) in NODE_IDS
        try:
            while bad.recv(4096):
                pass
        except ConnectionResetError:
            pass  # closed with unread bytes: a reset is a close too
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S + 3  # the deadline, with scheduling slack
    line = router.wait_for_log(rf"peer={peer} .*{log_pattern}", consume=False)
    about_it = [entry for entry in router.lines if f"peer={peer} " in entry]
    assert about_it == [line], "one log line per rejected connection"
