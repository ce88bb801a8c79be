"""Shared test configuration: hypothesis profiles (STYLE R10), loopback ports, sockets and child
processes' logs for the tests that start real components, and a real ActiveMQ Classic broker
(`from tests.conftest import …`).

`HYPOTHESIS_PROFILE=deep pytest …` runs every property with 2000 examples; the default `fast`
profile keeps the ordinary run quick.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from collections.abc import Callable

settings.register_profile("fast", max_examples=100)
settings.register_profile("deep", max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


PORT_RANGE = (20000, 32000)
_used_ports: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, below the ephemeral range, not handed out before in this session."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(*PORT_RANGE)
        if port in _used_ports:
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _used_ports.add(port)
        return port
    raise RuntimeError("no free port found")


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts a TCP connection on host:port now."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def wait_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    """Wait until something accepts on host:port."""
    deadline = time.monotonic() + timeout
    while not accepts(port, host):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing accepts on {host}:{port} after {timeout} s")
        time.sleep(0.02)  # polling a port: nothing to await on another process's listen()


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float) -> None:
    """SIGTERM a process we started and wait for it; SIGKILL when it has not ended in `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything until the peer closes (a reset counts as a close); bounded by the socket's timeout."""
    got = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            got += chunk
    return bytes(got)


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `condition` (state of another thread or process: nothing to wait on) until it holds
    or `timeout` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer closes `sock` (EOF or reset) within `seconds`, sending nothing first."""
    sock.settimeout(seconds)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    """`count` bytes, or fewer if the peer closes first."""
    got = b""
    while len(got) < count and (chunk := sock.recv(count - len(got))):
        got += chunk
    return got


class LineLog:
    """The lines of a child process's text pipe, read by a thread, with bounded waits for a pattern."""

    def __init__(self, stream: IO[str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._stream = stream
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"{name} log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def search(self, pattern: str, timeout: float, start: int = 0) -> tuple[re.Match[str], int]:
        """The first line from `lines[start]` on that matches `pattern`, waiting up to `timeout` for
        it: the match (`.string` is the line) and the index after that line."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        index = start
        while True:
            while index < len(self.lines):
                index += 1
                if match := regex.search(self.lines[index - 1]):
                    return match, index
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no {self.name} log line matching {pattern!r}; log so far:\n"
                    + "\n".join(self.lines[-30:])
                )
            try:
                line_or_eof = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line_or_eof is None:
                raise RuntimeError(f"{self.name} exited; log:\n" + "\n".join(self.lines[-30:]))
            self.lines.append(line_or_eof)

    def take_in(self) -> int:
        """Move the lines the reader has so far into `lines`, without waiting: their count."""
        with contextlib.suppress(queue.Empty):
            while (line := self._queue.get_nowait()) is not None:
                self.lines.append(line)
            self._queue.put(None)  # the end of the pipe stays for the next search to see
        return len(self.lines)

    def close(self, timeout: float) -> None:
        """Once the process has ended: take in its last lines, then close the pipe."""
        self._reader.join(timeout)  # it ends at the pipe's EOF, right after the process
        self.take_in()
        self._stream.close()


# --- ActiveMQ Classic 5.17 from Debian (ENVIRONMENT.md §3.3) -------------------------------------

ACTIVEMQ_TIMEOUT_S = 60.0
"""Bound of a broker's start and stop (it starts in about 2 s)."""

ACTIVEMQ_JAR = "/usr/share/activemq/bin/activemq.jar"
MQTT_CODEC_JAR = "/usr/share/java/mqtt-client.jar"
"""The fusesource MQTT codec: without it in the instance's lib/ every MQTT connection fails."""
JAVA_CLIENT_JARS = [
    "/usr/share/java/activemq-client.jar",
    "/usr/share/java/geronimo-jms_1.1_spec.jar",
    "/usr/share/java/slf4j-api.jar",
    "/usr/share/java/slf4j-nop.jar",
    "/usr/share/java/hawtbuf.jar",
    "/usr/share/java/geronimo-j2ee-management-1.1-spec.jar",
]
"""The Java client's classpath."""

_BROKER_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="{name}" useJmx="false"
          persistent="{persistent}" dataDirectory="{base}/data" schedulerSupport="false">
    {store}
    {plugins}
    <transportConnectors>
      <transportConnector name="openwire" uri="tcp://127.0.0.1:{openwire}"/>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{stomp}"/>
      <transportConnector name="mqtt" uri="mqtt://127.0.0.1:{mqtt}"/>
    </transportConnectors>
  </broker>
</beans>
"""

_SHARED_STORE_XML = """<persistenceAdapter>
      <kahaDB directory="{kahadb}" lockKeepAlivePeriod="2000">
        <locker><shared-file-locker lockAcquireSleepInterval="{lock_interval_ms}"/></locker>
      </kahaDB>
    </persistenceAdapter>"""
"""Shared-store HA (ENVIRONMENT.md §4): the broker holding the KahaDB file lock is active, the
other waits for the lock with its ports closed."""

_LOG4J = """log4j.rootLogger=WARN, stdout
log4j.logger.org.apache.activemq.store.SharedFileLocker=INFO
log4j.logger.org.apache.activemq.broker.TransportConnector=INFO
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n
"""


def require_java() -> None:
    """Fail (never skip) when the JDK or Debian's ActiveMQ packages are missing."""
    missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
    missing += [jar for jar in [ACTIVEMQ_JAR, MQTT_CODEC_JAR, *JAVA_CLIENT_JARS] if not Path(jar).exists()]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)} (activemq, libmqtt-client-java, a JDK): "
            "run ./run-tests, which installs them"
        )


@dataclass(slots=True)
class ActiveMQ:
    """One real ActiveMQ Classic broker on 127.0.0.1, stopped by its PID: non-persistent, or
    persistent in a KahaDB directory shared with its HA partner (`shared_store`)."""

    name: str
    base: Path
    openwire: int = field(default_factory=free_port)
    stomp: int = field(default_factory=free_port)
    mqtt: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    shared_store: Path | None = None
    """KahaDB directory shared by an HA pair: the broker that holds its lock is the active one."""
    lock_interval_ms: int = 200
    """How often a passive broker tries the shared lock (ActiveMQ's default is 10000)."""
    plugins: str = ""
    """A `<plugins>` element for the broker, e.g. a `simpleAuthenticationPlugin`; none by default."""
    _log_start: int = 0

    @property
    def log(self) -> Path:
        return self.base / "broker.log"

    def start(self) -> None:
        """Start the JVM (without waiting for it: see `wait_ready`)."""
        for sub in ("conf", "data", "tmp", "lib"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        jar_link = self.base / "lib" / "mqtt-client.jar"
        if not jar_link.is_symlink():  # a restarted broker keeps its instance directory
            jar_link.symlink_to(MQTT_CODEC_JAR)  # ActiveMQ adds $BASE/lib
        (self.base / "conf" / "activemq.xml").write_text(
            _BROKER_XML.format(
                name=self.name,
                base=self.base,
                openwire=self.openwire,
                stomp=self.stomp,
                mqtt=self.mqtt,
                persistent="false" if self.shared_store is None else "true",
                store=self._store_xml(),
                plugins=self.plugins,
            )
        )
        (self.base / "conf" / "log4j.properties").write_text(_LOG4J)
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:  # the child keeps its own descriptor; restarts append
            self.proc = subprocess.Popen(  # java itself, so proc.pid is the JVM's
                [
                    "java",
                    "-Xms64m",
                    "-Xmx256m",
                    "-Djava.awt.headless=true",
                    "-Dactivemq.home=/usr/share/activemq",
                    f"-Dactivemq.base={self.base}",
                    f"-Dactivemq.conf={self.base}/conf",
                    f"-Dactivemq.data={self.base}/data",
                    f"-Djava.io.tmpdir={self.base}/tmp",
                    f"-Dactivemq.classpath={self.base}/conf",
                    "-jar",
                    ACTIVEMQ_JAR,
                    "start",
                    f"xbean:file:{self.base}/conf/activemq.xml",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self) -> None:
        """Wait until all three connectors accept (they open last, after the broker started)."""
        assert self.proc is not None
        deadline = time.monotonic() + ACTIVEMQ_TIMEOUT_S
        for port in (self.openwire, self.stomp, self.mqtt):
            while not accepts(port):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self._tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name}: nothing on {port}:\n{self._tail()}")
                time.sleep(0.05)  # polling another process's listen(): nothing to wait on

    def _store_xml(self) -> str:
        if self.shared_store is None:
            return ""
        return _SHARED_STORE_XML.format(kahadb=self.shared_store, lock_interval_ms=self.lock_interval_ms)

    def wait_passive(self) -> None:
        """Wait until this member of a shared-store pair logs that it waits for the lock (passive)."""
        assert self.proc is not None
        deadline = time.monotonic() + ACTIVEMQ_TIMEOUT_S
        while "waiting a lock to be acquired" not in self._since_start():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self._tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} never became passive:\n{self._tail()}")
            time.sleep(0.05)  # another process's log file: nothing to wait on

    def kill(self) -> None:
        """SIGKILL, as a crash: no clean shutdown, the shared lock is released by the kernel."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(ACTIVEMQ_TIMEOUT_S)
        self.proc = None

    def _since_start(self) -> str:
        with self.log.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM (a clean stop takes well under a second), SIGKILL if it hangs."""
        stop_process(self.proc, ACTIVEMQ_TIMEOUT_S)
        self.proc = None
