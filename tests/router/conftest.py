"""Real components for integration tests: mosquitto brokers, ZooKeeper (one per test session, or
one of a test's own that it may stop and restart) and routerd processes on loopback.

Ports are chosen at run time below 32768 (outside the ephemeral range, ENVIRONMENT.md gotcha 6).
Nothing here sleeps for a fixed time: we wait for a port to accept, or for a line in routerd's log,
each with a deadline. Every process is stopped by the PID we started it with.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import free_port, stop_process, wait_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence


def port_closed(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return True
    return False


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


class Routerd:
    """A real routerd process with its log read line by line."""

    def __init__(self, workdir: Path, make_config: Callable[[int], str]) -> None:
        self.admin_port = free_port()
        self.config = workdir / "router.xml"
        self.config.write_text(make_config(self.admin_port))
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._cursor = 0

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "router",
                "--config",
                str(self.config),
                "--admin",
                f"127.0.0.1:{self.admin_port}",
                "--grace-period",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for_log(r"ready: \d+ acceptor\(s\) listening", consume=False)

    def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_log(self, pattern: str, timeout: float = 15.0, *, consume: bool = True) -> str:
        """Wait for a log line matching `pattern` after the last consumed match.

        With `consume`, later calls search only after this match, so a sequence of calls matches
        lines in order; without it the cursor stays where it was.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        index = self._cursor
        while True:
            while index < len(self.lines):
                line = self.lines[index]
                index += 1
                if regex.search(line):
                    if consume:
                        self._cursor = index
                    return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no log line matching {pattern!r}; log so far:\n" + "\n".join(self.lines[-30:])
                )
            try:
                line_or_eof = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line_or_eof is None:
                raise RuntimeError("routerd exited; log:\n" + "\n".join(self.lines[-30:]))
            self.lines.append(line_or_eof)

    def route(self, router: str, *args: str) -> list[dict[str, Any]]:
        """`routerctl route --config <this routerd's config> --router ROUTER ARGS…`: the decisions."""
        return self.predict_many(router, [list(args)])[0]

    def predict(self, router: str, flag: str, values: Sequence[str]) -> dict[str, dict[str, Any]]:
        """`routerctl route … FLAG VALUE` for each value (one connection each): value -> decision."""
        results = self.predict_many(router, [[flag, value] for value in values])
        return {value: decisions[0] for value, decisions in zip(values, results, strict=True)}

    def predict_many(self, router: str, argvs: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
        """Several `routerctl route` runs side by side (each is a Python start-up)."""
        command = [
            sys.executable,
            "-c",
            "from router.cli import routerctl_main; routerctl_main()",
            "route",
            "--config",
            str(self.config),
            "--router",
            router,
        ]
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
        if self._reader is not None:
            self._reader.join(10)  # it ends at the pipe's EOF, right after the process
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        self.proc = None
        return status


@pytest.fixture
def mosquitto_fleet(tmp_path: Path) -> Iterator[list[Mosquitto]]:
    """Three running mosquitto brokers, stopped afterwards."""
    if shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists():
        pytest.fail("mosquitto is not installed: run ./run-tests, which installs it")
    brokers = [Mosquitto(tmp_path, f"mosquitto-{i}") for i in range(3)]
    try:
        for broker in brokers:
            broker.start()
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


@pytest.fixture
def start_routerd(tmp_path: Path) -> Iterator[Callable[[Callable[[int], str]], Routerd]]:
    """Start a routerd: pass a function from its admin port to the config XML; stopped afterwards."""
    started: list[Routerd] = []

    def start(make_config: Callable[[int], str]) -> Routerd:
        router = Routerd(tmp_path, make_config)
        started.append(router)
        router.start()
        return router

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    """`free_port()` for tests."""
    return free_port


# --- ZooKeeper 3.8 from Debian (ENVIRONMENT.md §3.2) ------------------------------------------

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
"""zookeeper.jar's manifest pulls in its dependencies; slf4j-simple makes it log (to its file)."""
ZOOKEEPER_TICK_MS = 250
"""Small, so that short session timeouts are allowed: the server clamps a session timeout to
2-20 ticks (0.5-5 s here; the default tickTime of 2000 would make it 4-40 s)."""
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
