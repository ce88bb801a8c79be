"""Real components for integration tests: mosquitto brokers, ZooKeeper (one per test session, or
one of a test's own that it may stop and restart), two RabbitMQ nodes (one pair per test session)
and routerd processes on loopback; MQTT observers, and the pieces of routerd configurations the
tests have in common.

Ports are chosen at run time below 32768 (outside the ephemeral range, ENVIRONMENT.md gotcha 6).
Nothing here sleeps for a fixed time: we wait for a port to accept, or for a line in routerd's log,
each with a deadline. Every process is stopped by the PID we started it with.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import LineLog, free_port, stop_process, wait_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from typing import Self

ROUTERCTL = (sys.executable, "-c", "from router.ctl import routerctl_main; routerctl_main()")
"""The command line of `routerctl` run from this checkout (add its subcommand and arguments)."""


def static_connectors(node_ports: Iterable[tuple[str, int]]) -> tuple[str, str]:
    """The `<connector>`s `cI` of a routerd configuration, one for each (node id, port) in order,
    and the `<connector-ref>`s of them all (a static pool over every one)."""
    ports = list(node_ports)
    connectors = "\n".join(
        f'<connector name="c{i}">tcp://127.0.0.1:{port}?nodeId={node_id}</connector>'
        for i, (node_id, port) in enumerate(ports)
    )
    return connectors, "".join(f"<connector-ref>c{i}</connector-ref>" for i in range(len(ports)))


def acceptors_xml(params: Mapping[str, str], ports: Mapping[str, int]) -> str:
    """The `<acceptor>`s of a routerd configuration on 127.0.0.1: for each name in `params`, its URL
    parameters, on its port in `ports`."""
    return "\n".join(
        f'<acceptor name="{name}">tcp://127.0.0.1:{ports[name]}?{query}</acceptor>'
        for name, query in params.items()
    )


def router_xml(name: str, key_type: str, policy: str, refs: str, *, check_period_ms: int = 1000) -> str:
    """A `<connection-router>` over a static pool of the `<connector-ref>`s `refs`."""
    return f"""
      <connection-router name="{name}">
        <key-type>{key_type}</key-type>
        <policy name="{policy}"/>
        <pool><check-period>{check_period_ms}</check-period><static-connectors>{refs}</static-connectors></pool>
      </connection-router>"""


def broker_xml(connectors: str, acceptors: str, routers: str) -> str:
    """A routerd configuration: `<connectors>`, `<acceptors>` and `<connection-routers>` holding
    these elements, in the `<core>` of a broker.xml."""
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <connectors>{connectors}</connectors>
  <acceptors>{acceptors}</acceptors>
  <connection-routers>{routers}</connection-routers>
 </core>
</configuration>
"""


class Mosquitto:
    """One real mosquitto broker on 127.0.0.1."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "log_dest stderr\nlog_type error\nlog_type warning\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(binary).exists():
            pytest.fail("mosquitto is not installed: run ./run-tests, which installs it")
        with open(self.dir / "stderr.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [binary, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=log
            )
        wait_port(self.port)

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        stop_process(self.proc, 10)
        self.proc = None


MosquittoT = TypeVar("MosquittoT", bound=Mosquitto)


def running(brokers: list[MosquittoT]) -> Iterator[list[MosquittoT]]:
    """Start the brokers, give them, then stop them all: the body of a fixture (`yield from`)."""
    try:
        for broker in brokers:
            broker.start()
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


class MqttObserver:
    """Direct paho subscribers to `topic_filter` on brokers named by node id: which broker saw a
    topic. Closed on leaving its `with` block (or by `close`)."""

    def __init__(self, topic_filter: str, ports: Mapping[str, int], timeout: float = 10.0) -> None:
        """Subscribe on each broker (node id -> port); returns once every SUBACK came."""
        self.topics: dict[str, str] = {}
        """topic -> node id of the broker it was seen on."""
        self._changed = threading.Condition()
        self._timeout = timeout
        self._clients: list[mqtt.Client] = []
        try:
            for node_id, port in ports.items():
                self._watch(topic_filter, node_id, port)
        except BaseException:
            self.close()
            raise

    def _watch(self, topic_filter: str, node_id: str, port: int) -> None:
        subscribed = threading.Event()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"observer-{uuid.uuid4()}")

        def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
            with self._changed:
                self.topics[msg.topic] = node_id
                self._changed.notify_all()

        client.on_message = on_message
        client.on_subscribe = lambda *_a: subscribed.set()
        client.connect("127.0.0.1", port)
        self._clients.append(client)
        client.loop_start()
        client.subscribe(topic_filter, qos=1)
        assert subscribed.wait(self._timeout), f"observer on {node_id} not subscribed"

    def where(self, topic: str) -> str | None:
        """The broker that saw `topic`; mosquitto delivers to other subscribers ~40 ms late."""
        with self._changed:
            self._changed.wait_for(lambda: topic in self.topics, self._timeout)
            return self.topics.get(topic)

    def wait_for(self, topics: Sequence[str]) -> dict[str, str]:
        """Wait until every topic was seen (or the timeout passed): every topic seen so far."""
        with self._changed:
            self._changed.wait_for(lambda: all(t in self.topics for t in topics), self._timeout)
            return dict(self.topics)

    def close(self) -> None:
        for client in self._clients:
            client.disconnect()
            client.loop_stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def routerctl_json(router: Routerd, command: str, *args: str) -> tuple[int, dict[str, object]]:
    """`routerctl COMMAND --admin … --json ARGS…` against a running routerd: its exit status and
    its JSON answer (an object)."""
    done = subprocess.run(
        [*ROUTERCTL, command, "--admin", router.admin, "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout, done.stderr
    document = json.loads(done.stdout)
    assert isinstance(document, dict), document
    return done.returncode, document


class Routerd:
    """A real routerd process with its log read line by line."""

    def __init__(self, workdir: Path, make_config: Callable[[int], str], args: Sequence[str] = ()) -> None:
        self.args = tuple(args)
        """More routerd options."""
        self.admin_port = free_port()
        self.config = workdir / "router.xml"
        self.config.write_text(make_config(self.admin_port))
        self.proc: subprocess.Popen[str] | None = None
        self.env: dict[str, str] = {}
        """More environment variables of the process (set before `start`)."""
        self._log: LineLog | None = None
        self._cursor = 0

    @property
    def lines(self) -> list[str]:
        """routerd's log lines so far."""
        return [] if self._log is None else self._log.lines

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def program(self) -> list[str]:
        """The command that runs routerd, before its options."""
        return [sys.executable, "-m", "router"]

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *self.program(),
                "--config",
                str(self.config),
                "--admin",
                f"127.0.0.1:{self.admin_port}",
                "--grace-period",
                "2",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        assert self.proc.stderr is not None
        self._log = LineLog(self.proc.stderr, "routerd")
        self._cursor = 0  # a restarted routerd: its new log from the start
        self.wait_for_log(r"ready: \d+ acceptor\(s\) listening", consume=False)

    def wait_for_log(self, pattern: str, timeout: float = 15.0, *, consume: bool = True) -> str:
        """Wait for a log line matching `pattern` after the last consumed match.

        With `consume`, later calls search only after this match, so a sequence of calls matches
        lines in order; without it the cursor stays where it was.
        """
        assert self._log is not None, "routerd was not started"
        match, after = self._log.search(pattern, timeout, self._cursor)
        if consume:
            self._cursor = after
        return match.string

    def mark(self) -> int:
        """Consume every line routerd has logged so far, so that later waits and `lines[mark:]` see
        only what comes after (an ephemeral port reused from an earlier test's client must not
        match): the number of lines so far."""
        assert self._log is not None, "routerd was not started"
        self._cursor = self._log.take_in()
        return self._cursor

    def route(self, router: str, *args: str) -> list[dict[str, Any]]:
        """`routerctl route --config <this routerd's config> --router ROUTER ARGS…`: the decisions."""
        return self.predict_many(router, [list(args)])[0]

    def predict(self, router: str, flag: str, values: Sequence[str]) -> dict[str, dict[str, Any]]:
        """`routerctl route … FLAG VALUE` for each value (one connection each): value -> decision."""
        results = self.predict_many(router, [[flag, value] for value in values])
        return {value: decisions[0] for value, decisions in zip(values, results, strict=True)}

    def predict_many(self, router: str, argvs: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
        """Several `routerctl route` runs side by side (each is a Python start-up)."""
        command = [*ROUTERCTL, "route", "--json", "--config", str(self.config), "--router", router]
        procs = [
            subprocess.Popen([*command, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for argv in argvs
        ]
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results.append([json.loads(line) for line in out.splitlines()])
        return results

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.admin + path, timeout=5) as response:
            return json.loads(response.read())

    def metrics(self) -> str:
        """The Prometheus exposition of the admin endpoint `/metrics`."""
        with urllib.request.urlopen(self.admin + "/metrics", timeout=5) as response:
            return str(response.read().decode())

    def stop(self) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait(10)
        if self._log is not None:
            self._log.close(10)
        self.proc = None
        return status


@pytest.fixture
def mosquitto_fleet(tmp_path: Path) -> Iterator[list[Mosquitto]]:
    """Three running mosquitto brokers, stopped afterwards."""
    yield from running([Mosquitto(tmp_path, f"mosquitto-{i}") for i in range(3)])


@pytest.fixture
def start_routerd(tmp_path: Path, run_routerd: Callable[[Routerd], Routerd]) -> Callable[..., Routerd]:
    """Start a routerd: pass a function from its admin port to the config XML, and more options;
    stopped afterwards."""

    def start(make_config: Callable[[int], str], *args: str) -> Routerd:
        return run_routerd(Routerd(tmp_path, make_config, args))

    return start


@pytest.fixture
def run_routerd() -> Iterator[Callable[[Routerd], Routerd]]:
    """Start a `Routerd` (or one of its kinds) the test made; every one is stopped afterwards."""
    started: list[Routerd] = []

    def run(router: Routerd) -> Routerd:
        started.append(router)
        router.start()
        return router

    yield run
    for router in started:
        router.stop()


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    """`free_port()` for tests."""
    return free_port


# --- ZooKeeper 3.8 from Debian (ENVIRONMENT.md §3.2) ------------------------------------------

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
"""zookeeper.jar's manifest pulls in its dependencies; slf4j-simple makes it log (to its file)."""
ZOOKEEPER_TICK_MS = 250
"""Small, so that short session timeouts are allowed: the server's lower bound of a session timeout
is 2 ticks (0.5 s here; the default tickTime of 2000 would make it 4 s)."""
ZOOKEEPER_MAX_SESSION_TIMEOUT_MS = 30_000
"""The server's upper bound of a session timeout (by default 20 ticks, only 5 s here): a session
that must survive a server restart on a loaded machine gets more."""
ZOOKEEPER_TIMEOUT_S = 30.0
"""Bound of a server's start and stop (it answers `ruok` after about 0.4 s)."""


class ZooKeeperServer:
    """One real standalone ZooKeeper on 127.0.0.1, stopped by its PID; restartable with its data."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        (base / "data").mkdir(parents=True, exist_ok=True)
        (base / "zoo.cfg").write_text(
            f"tickTime={ZOOKEEPER_TICK_MS}\n"
            f"dataDir={base / 'data'}\n"
            f"clientPort={self.port}\n"
            f"maxSessionTimeout={ZOOKEEPER_MAX_SESSION_TIMEOUT_MS}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"  # otherwise a Jetty admin server on 0.0.0.0:8080
            "4lw.commands.whitelist=ruok,srvr,mntr,envi,stat\n"  # kazoo's server_version() needs envi
        )

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.base / "zookeeper.log"

    def start(self) -> None:
        """Start the JVM and wait until it answers `ruok` with `imok`."""
        missing = [jar for jar in ZOOKEEPER_JARS if not Path(jar).exists()]
        if missing or shutil.which("java") is None:
            pytest.fail(
                f"ZooKeeper is not installed ({', '.join(missing) or 'java'}): run deploy/bootstrap.sh"
            )
        with self.log.open("ab") as out:  # the child keeps its own descriptor; restarts append
            self.proc = subprocess.Popen(  # java itself, so proc.pid is the JVM's
                [
                    "java",
                    "-Xmx128m",
                    f"-Dzookeeper.log.dir={self.base}",
                    "-cp",
                    ":".join(ZOOKEEPER_JARS),
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    str(self.base / "zoo.cfg"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + ZOOKEEPER_TIMEOUT_S
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ZooKeeper on {self.port} does not answer:\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.05)  # another process's start-up: nothing to wait on

    def answers(self) -> bool:
        """Whether the server answers the `ruok` four-letter word."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(16) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM (it stops at once), SIGKILL if it hangs; the data directory stays."""
        stop_process(self.proc, ZOOKEEPER_TIMEOUT_S)
        self.proc = None


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper for the whole test session; give each test its own path under it."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test alone, which the test may stop and start again."""
    server = ZooKeeperServer(tmp_path / "zookeeper")
    try:
        server.start()
        yield server
    finally:
        server.stop()


# --- RabbitMQ 3.10 from Debian (ENVIRONMENT.md §3.4) ------------------------------------------

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
"""The scripts that run as the calling user; /usr/sbin/rabbitmq-server would switch to `rabbitmq`."""
RABBITMQ_BOOT_TIMEOUT_S = 90.0
"""First boot takes about 15 s alone (ENVIRONMENT.md §3.4); two at once on two cores, more."""
RABBITMQ_NODE_IDS = ("rmq-1", "rmq-2")
"""CONSISTENT_HASH puts one point per node id on the ring, as Artemis does (no virtual nodes), so
the share of each node depends on where the ids hash: these two split keys about evenly."""
RABBITMQ_USERS = ["alice", "bob", "carol", "erin"]
"""Users of every node besides `guest`/`guest`, each with the password "pw-" + name."""


def _rabbitmq_password_hash(password: str) -> str:
    """RabbitMQ's `rabbit_password_hashing_sha256`: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def _rabbitmq_definitions() -> str:
    """Users `guest` and RABBITMQ_USERS, all allowed everything on vhost "/"."""
    users = ["guest", *RABBITMQ_USERS]
    return json.dumps(
        {
            "users": [
                {
                    "name": user,
                    "password_hash": _rabbitmq_password_hash("guest" if user == "guest" else f"pw-{user}"),
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
    """One real RabbitMQ node on 127.0.0.1 with the AMQP 1.0 plugin, everything under `workdir`,
    and the rabbitmq_prometheus plugin's metrics page at `metrics_url` (its per-node gauge
    `rabbitmq_connections`, which RabbitMQ 3.10 keeps for AMQP 0-9-1 connections, not for the AMQP
    1.0 plugin's).

    Its `cluster_name` is its node id, which RabbitMQ announces in the properties of its Open.
    """

    def __init__(self, workdir: Path, node_id: str, *, epmd_port: int, home: Path) -> None:
        self.node_id = node_id
        self.name = f"{node_id}@localhost"
        self.port, self.dist_port, self.metrics_port = free_port(), free_port(), free_port()
        self.dir = workdir / node_id
        self.dir.mkdir(parents=True)
        (self.dir / "definitions.json").write_text(_rabbitmq_definitions())
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"prometheus.tcp.ip = 127.0.0.1\nprometheus.tcp.port = {self.metrics_port}\n"
            "loopback_users = none\n"
            f"cluster_name = {node_id}\n"
            f"load_definitions = {self.dir / 'definitions.json'}\n"
            "log.console = true\nlog.console.level = warning\nlog.file = false\n"
        )
        (self.dir / "enabled_plugins").write_text("[rabbitmq_amqp1_0,rabbitmq_prometheus].\n")
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
        """Wait until the AMQP port accepts, a defined user can open a connection, and the metrics
        page's port accepts."""
        # python-qpid-proton: imported here, so that only the tests of a RabbitMQ node need it.
        from proton import ProtonException
        from proton.utils import BlockingConnection

        deadline = time.monotonic() + RABBITMQ_BOOT_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.dir / 'console.log'}")
            try:
                wait_port(self.port, timeout=1)
                BlockingConnection(self.url(RABBITMQ_USERS[-1]), timeout=5, allowed_mechs="PLAIN").close()
                wait_port(self.metrics_port, timeout=max(1.0, deadline - time.monotonic()))
                return
            except (TimeoutError, ProtonException, OSError) as not_yet:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.name} not ready after {RABBITMQ_BOOT_TIMEOUT_S} s"
                    ) from not_yet

    @property
    def metrics_url(self) -> str:
        """The rabbitmq_prometheus plugin's page (the Prometheus text format)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

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
            wait_port(self.port, timeout=10)
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc, 10)


@pytest.fixture(scope="session")
def rabbit_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RabbitNode]]:
    """Two running RabbitMQ nodes (node ids RABBITMQ_NODE_IDS) for the whole test session, started
    in parallel with their own epmd; every test uses queues of its own."""
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
        nodes.extend(
            RabbitNode(workdir, node_id, epmd_port=epmd.port, home=home) for node_id in RABBITMQ_NODE_IDS
        )
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


def mqtt_round_trip(
    port: int, *, client_id: str, topic: str, source: str = "", timeout: float = 15.0
) -> bool:
    """Connect (from `source`, default any), subscribe to `topic`, publish to it and receive our
    own message within `timeout`; False when any step fails (a refused connect included)."""
    got, subscribed = threading.Event(), threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_message = lambda *_a: got.set()
    client.on_subscribe = lambda *_a: subscribed.set()
    try:
        client.connect("127.0.0.1", port, keepalive=30, bind_address=source)
    except OSError:
        return False
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout):
            return False
        client.publish(topic, b"hello", qos=1)
        return got.wait(timeout)
    finally:
        client.disconnect()
        client.loop_stop()


# --- one ROUND_ROBIN router over mosquitto brokers, keyed on the client id ----------------------

ROUND_ROBIN_NODE_IDS = ("b0", "b1", "b2")
"""Node ids of the brokers of `round_robin_config`, in pool order."""


def round_robin_config(
    brokers: Sequence[Mosquitto], port: int, cache: str, acceptor: str = "router=rr;mode=proxy"
) -> Callable[[int], str]:
    """A routerd configuration (a function of the admin port, as `Routerd` takes it): router `rr`,
    CLIENT_ID, ROUND_ROBIN over `brokers` (node ids `ROUND_ROBIN_NODE_IDS`, probed every 200 ms),
    the acceptor's URL parameters `acceptor` (proxy mode) on `port`, with the `<cache>` element
    `cache`."""
    connectors, refs = static_connectors(zip(ROUND_ROBIN_NODE_IDS, (b.port for b in brokers), strict=True))
    acceptors = acceptors_xml({"rr": acceptor}, {"rr": port})

    def make(_admin_port: int) -> str:
        return broker_xml(
            connectors,
            acceptors,
            f"""
   <connection-router name="rr">
    <key-type>CLIENT_ID</key-type>
    {cache}
    <policy name="ROUND_ROBIN"/>
    <pool><check-period>200</check-period><static-connectors>{refs}</static-connectors></pool>
   </connection-router>""",
        )

    return make


def client_id_landings(
    brokers: Sequence[Mosquitto], visits: Sequence[tuple[int, str]], timeout: float = 10.0
) -> list[str | None]:
    """For each (router port, client id) in order, the node id (of `ROUND_ROBIN_NODE_IDS`) of the
    running broker its MQTT round trip reached, seen by direct subscribers; None: not seen."""
    run = uuid.uuid4().hex[:8]
    running = {n: b.port for n, b in zip(ROUND_ROBIN_NODE_IDS, brokers, strict=True) if b.proc is not None}
    topics = [f"landing-{run}/{i}" for i in range(len(visits))]
    with MqttObserver(f"landing-{run}/#", running, timeout) as seen:
        for (port, key), topic in zip(visits, topics, strict=True):
            assert mqtt_round_trip(port, client_id=key, topic=topic, timeout=timeout), key
        found = seen.wait_for(topics)
    return [found.get(topic) for topic in topics]


def landings_by_key(brokers: Sequence[Mosquitto], port: int, keys: Sequence[str]) -> dict[str, str]:
    """Client id -> the node id its round trip through the router on `port` reached."""
    landed = client_id_landings(brokers, [(port, key) for key in keys])
    return {key: node for key, node in zip(keys, landed, strict=True) if node is not None}
