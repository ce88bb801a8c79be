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
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

import pytest
from hypothesis import settings

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # tools/ is not an installed package (tests/tools/test_generate.py)
    sys.path.insert(0, _ROOT)

from tools.artemis_instance import CREATED_PORT, broker_xml, copy_instance, profile_heap, replace_once  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

# No per-example deadline: these tests check results, not time, and on the 2-core machines the
# suite shares with JVMs and brokers an example took 257 ms once against hypothesis's default 200.
settings.register_profile("fast", max_examples=100, deadline=None)
settings.register_profile("deep", max_examples=2000, deadline=None)
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
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="{name}" useJmx="{use_jmx}"
          persistent="{persistent}" dataDirectory="{base}/data" schedulerSupport="false">
    {management}
    {store}
    {plugins}
    <transportConnectors>
      <transportConnector name="openwire" uri="tcp://127.0.0.1:{openwire}"/>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{stomp}"/>
      <transportConnector name="mqtt" uri="mqtt://127.0.0.1:{mqtt}"/>
    </transportConnectors>
  </broker>
  {jolokia}
</beans>
"""

JOLOKIA_JARS = [
    "/usr/share/java/jolokia-core.jar",
    "/usr/share/java/json-simple.jar",
    "/usr/share/java/jetty9-server.jar",
    "/usr/share/java/jetty9-servlet.jar",
    "/usr/share/java/jetty9-security.jar",
    "/usr/share/java/jetty9-util.jar",
    "/usr/share/java/jetty9-http.jar",
    "/usr/share/java/jetty9-io.jar",
    "/usr/share/java/servlet-api.jar",
]
"""Debian's Jolokia 1.7 agent servlet (libjolokia-core-java) and the Jetty 9 and servlet API it runs
in (libjetty9-java, libservlet-api-java): Debian's ActiveMQ leaves out upstream's web console and
its Jolokia (activemq-web-console is a disabled module), so a broker started with `jolokia_port`
serves Jolokia the way upstream's conf/jetty.xml does, from these jars in its lib/."""
JOLOKIA_USER = "admin"
JOLOKIA_PASSWORD = "admin"
"""The Jolokia endpoint's basic-authentication user (upstream's jetty-realm.properties default)."""

_JOLOKIA_MANAGEMENT_XML = (
    '<managementContext><managementContext createConnector="false"/></managementContext>'
)
"""JMX on (the MBeans Jolokia reads), without the RMI connector on port 1099 that it would open."""

_JOLOKIA_XML = """<bean id="jolokia" class="org.eclipse.jetty.server.Server"
        init-method="start" destroy-method="stop">
    <constructor-arg><bean class="java.net.InetSocketAddress">
      <constructor-arg value="127.0.0.1"/><constructor-arg value="{port}" type="int"/>
    </bean></constructor-arg>
    <property name="handler"><bean class="org.eclipse.jetty.security.ConstraintSecurityHandler">
      <property name="loginService"><bean class="org.eclipse.jetty.security.HashLoginService">
        <property name="name" value="ActiveMQRealm"/>
        <property name="config" value="{base}/conf/jetty-realm.properties"/>
      </bean></property>
      <property name="authenticator">
        <bean class="org.eclipse.jetty.security.authentication.BasicAuthenticator"/>
      </property>
      <property name="constraintMappings"><list><bean class="org.eclipse.jetty.security.ConstraintMapping">
        <property name="pathSpec" value="/*"/>
        <property name="constraint"><bean class="org.eclipse.jetty.util.security.Constraint">
          <property name="name" value="BASIC"/><property name="roles" value="admin"/>
          <property name="authenticate" value="true"/>
        </bean></property>
      </bean></list></property>
      <property name="handler"><bean class="org.eclipse.jetty.servlet.ServletContextHandler">
        <property name="contextPath" value="/api"/>
        <property name="servletHandler"><bean class="org.eclipse.jetty.servlet.ServletHandler">
          <property name="servlets"><list><bean class="org.eclipse.jetty.servlet.ServletHolder">
            <property name="name" value="jolokia"/>
            <property name="className" value="org.jolokia.http.AgentServlet"/>
            <property name="initParameters">
              <map><entry key="discoveryEnabled" value="false"/></map>
            </property>
          </bean></list></property>
          <property name="servletMappings"><list><bean class="org.eclipse.jetty.servlet.ServletMapping">
            <property name="servletName" value="jolokia"/><property name="pathSpecs" value="/jolokia/*"/>
          </bean></list></property>
        </bean></property>
      </bean></property>
    </bean></property>
  </bean>"""
"""Jolokia at http://127.0.0.1:{port}/api/jolokia with basic authentication, as upstream's
conf/jetty.xml serves it (there from the web console's war, here Debian's AgentServlet in a Jetty
the broker's Spring context starts and stops)."""

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


def require_jolokia() -> None:
    """Fail (never skip) when Debian's Jolokia, Jetty or servlet API jars are missing."""
    missing = [jar for jar in JOLOKIA_JARS if not Path(jar).exists()]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)} (libjolokia-core-java, libjetty9-java, libservlet-api-java): "
            "run deploy/bootstrap.sh, which installs them"
        )


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
    jolokia_port: int | None = None
    """Jolokia (`JOLOKIA_JARS`) at http://127.0.0.1:jolokia_port/api/jolokia, login JOLOKIA_USER /
    JOLOKIA_PASSWORD, and JMX on; none (and JMX off) unless set."""
    _log_start: int = 0

    @property
    def jolokia_url(self) -> str:
        """The Jolokia endpoint, as upstream ActiveMQ's web console serves it."""
        assert self.jolokia_port is not None, f"{self.name} has no Jolokia"
        return f"http://127.0.0.1:{self.jolokia_port}/api/jolokia"

    @property
    def log(self) -> Path:
        return self.base / "broker.log"

    def start(self) -> None:
        """Start the JVM (without waiting for it: see `wait_ready`)."""
        for sub in ("conf", "data", "tmp", "lib"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        jars = [MQTT_CODEC_JAR, *(JOLOKIA_JARS if self.jolokia_port is not None else [])]
        for jar in jars:
            jar_link = self.base / "lib" / Path(jar).name
            if not jar_link.is_symlink():  # a restarted broker keeps its instance directory
                jar_link.symlink_to(jar)  # ActiveMQ adds $BASE/lib
        if self.jolokia_port is not None:
            (self.base / "conf" / "jetty-realm.properties").write_text(
                f"{JOLOKIA_USER}: {JOLOKIA_PASSWORD}, admin\n"
            )
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
                use_jmx="false" if self.jolokia_port is None else "true",
                management="" if self.jolokia_port is None else _JOLOKIA_MANAGEMENT_XML,
                jolokia=""
                if self.jolokia_port is None
                else _JOLOKIA_XML.format(port=self.jolokia_port, base=self.base),
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
        """Wait until all three connectors (and Jolokia's port, when it has one) accept: they open
        last, after the broker started."""
        assert self.proc is not None
        deadline = time.monotonic() + ACTIVEMQ_TIMEOUT_S
        ports = (
            self.openwire,
            self.stomp,
            self.mqtt,
            *(() if self.jolokia_port is None else (self.jolokia_port,)),
        )
        for port in ports:
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


# --- Apache ActiveMQ Artemis 2.40 from Maven Central (deploy/bootstrap.sh, ENVIRONMENT.md §8) -------

ARTEMIS_VERSION = "2.40.0"
ARTEMIS_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "artemis"
"""Where deploy/bootstrap.sh puts the distribution and the client jars (ignored by git)."""
ARTEMIS_HOME = ARTEMIS_CACHE / f"apache-artemis-{ARTEMIS_VERSION}"
ARTEMIS_CLI = ARTEMIS_HOME / "bin" / "artemis"
"""The distribution's `artemis` command: `create`, and CORE/AMQP/OpenWire clients (`producer`,
`consumer`) that need no instance."""
ARTEMIS_CLIENT_JAR = ARTEMIS_CACHE / f"artemis-jms-client-all-{ARTEMIS_VERSION}.jar"
"""The standalone JMS (javax.jms) client over CORE, every dependency shaded in."""
ARTEMIS_CLIENT_CLASSPATH = [ARTEMIS_CLIENT_JAR, ARTEMIS_CACHE / "slf4j-simple-2.0.17.jar"]
"""`java -cp` for a client program: the client jar, and an SLF4J provider so that it logs (without
one it runs too, and warns once that it logs nothing)."""

ARTEMIS_USER = "admin"
ARTEMIS_PASSWORD = "admin"
"""Every test broker requires a login (`--require-login`); this user has the role `amq`, allowed
everything."""
ARTEMIS_CLUSTER_USER = "cluster"
ARTEMIS_CLUSTER_PASSWORD = "cluster"
"""What the members of a replication pair log in to each other with."""

ARTEMIS_JAVA_MEMORY = "256M"
"""-Xmx of each broker (artemis.profile; Artemis's own default is 2G): five fit the machine."""
ARTEMIS_TIMEOUT_S = 60.0
"""Bound of a broker's start, stop and failover, and of one CLI client run (a start takes 3-4 s alone)."""
ARTEMIS_ACTIVE = "AMQ221007"
"""`Server is now active`: logged by a broker that serves clients (a backup only once it fails over)."""
ARTEMIS_BACKUP_SYNCHRONIZED = "AMQ221024"
"""`Backup server … is synchronized with primary server`: a backup that can take over without loss."""


def require_artemis() -> None:
    """Fail (never skip) when the distribution or a JDK is missing."""
    missing = [] if shutil.which("java") else ["java"]
    missing += [str(p) for p in [ARTEMIS_CLI, *ARTEMIS_CLIENT_CLASSPATH] if not p.exists()]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run deploy/bootstrap.sh, which downloads Artemis")


def _artemis_env(java_args: str | None = None) -> dict[str, str]:
    """The environment without settings that would override the instance's profile (`JAVA_ARGS`
    replaces its -Xmx) or point `bin/artemis` at another instance."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ARTEMIS_", "JAVA_ARGS")) and k != "DEBUG_ARGS"
    }
    if java_args is not None:
        env["JAVA_ARGS"] = java_args
    return env


def create_artemis_template(directory: Path) -> Path:
    """`artemis create` once into `directory`: an instance that is never started, copied for each
    broker (`Artemis.make`), because a create costs a JVM start (about 1.1 s) and a copy does not.

    On 127.0.0.1 with login required, no web console (`Artemis.web_port` adds it), only the main
    acceptor (CORE, AMQP, STOMP, HORNETQ, MQTT, OPENWIRE on one port), the NIO journal without
    fsync (tests need no durability across a machine crash; a killed JVM loses nothing) and no
    disk-speed test (`--no-autotune`: it has hung in containers).
    """
    require_artemis()
    subprocess.run(
        [
            str(ARTEMIS_CLI),
            "create",
            str(directory),
            "--silent",
            "--name=template",
            f"--user={ARTEMIS_USER}",
            f"--password={ARTEMIS_PASSWORD}",
            "--require-login",
            "--host=127.0.0.1",
            "--http-host=127.0.0.1",
            "--no-web",
            "--no-autotune",
            "--nio",
            "--no-fsync",
            f"--java-memory={ARTEMIS_JAVA_MEMORY}",
            f"--default-port={CREATED_PORT}",
            "--no-amqp-acceptor",
            "--no-stomp-acceptor",
            "--no-mqtt-acceptor",
            "--no-hornetq-acceptor",
        ],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=_artemis_env(),
        timeout=ARTEMIS_TIMEOUT_S,
    )
    profile = directory / "etc" / "artemis.profile"
    profile.write_text(profile_heap(profile.read_text(), heap=ARTEMIS_JAVA_MEMORY, c1_only=True))
    return directory


_ARTEMIS_HA_XML = """
      <connectors>
         <connector name="artemis">tcp://127.0.0.1:{port}</connector>
         <connector name="peer">tcp://127.0.0.1:{peer_port}</connector>
      </connectors>
      <cluster-user>{cluster_user}</cluster-user>
      <cluster-password>{cluster_password}</cluster-password>
      <cluster-connections>
         <cluster-connection name="pair">
            <connector-ref>artemis</connector-ref>
            <message-load-balancing>ON_DEMAND</message-load-balancing>
            <max-hops>0</max-hops>
            <static-connectors>
               <connector-ref>peer</connector-ref>
            </static-connectors>
         </cluster-connection>
      </cluster-connections>
      <ha-policy>
         <replication>
            {role}
         </replication>
      </ha-policy>
"""
"""A replication pair: what `artemis create --replicated --staticCluster tcp://PEER [--backup]` adds
to broker.xml (Artemis's docs, "High Availability and Failover"), with the ports filled in."""

_ARTEMIS_HA_ROLES = {
    "primary": "<primary><vote-on-replication-failure>true</vote-on-replication-failure></primary>",
    "backup": "<backup/>",
}

_ARTEMIS_WEB_XML = """   <web path="web" rootRedirectLocation="console">
       <binding name="artemis" uri="http://127.0.0.1:{web_port}">
           <app name="console" url="console" war="console.war"/>
       </binding>
   </web>
</broker>"""
"""The console and Jolokia (`/console/jolokia`), as `artemis create` writes them into bootstrap.xml
without `--no-web`."""


@dataclass(slots=True)
class Artemis:
    """One real Artemis 2.40 broker on 127.0.0.1, copied from the session's template instance and
    stopped by its PID: one acceptor on `port` for CORE, AMQP, MQTT, STOMP, OpenWire (and HORNETQ),
    login `ARTEMIS_USER` / `ARTEMIS_PASSWORD`; alone, or one member of a replication pair."""

    name: str
    base: Path
    """The instance directory (bin/, etc/ with broker.xml and artemis-users.properties, data/)."""
    port: int = field(default_factory=free_port)
    web_port: int | None = None
    """The web console and Jolokia on http://127.0.0.1:web_port/console; none unless set."""
    ha_role: Literal["primary", "backup"] | None = None
    """This broker's role in a replication pair, whose other member listens on `peer_port`."""
    peer_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log_start: int = 0

    @property
    def url(self) -> str:
        """The CORE URL of the acceptor, for `artemis producer --url` or a JMS connection factory."""
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    @property
    def log(self) -> Path:
        """The broker's console output (its log4j2 also writes log/artemis.log)."""
        return self.base / "broker.log"

    def make(self, template: Path) -> None:
        """Copy the template instance to `base` and give the copy its name, ports and HA role
        (tools/artemis_instance.py)."""
        created = template / "etc"
        ha_xml = ""
        if self.ha_role is not None:
            assert self.peer_port is not None, "a member of a replication pair needs its peer's port"
            ha_xml = _ARTEMIS_HA_XML.format(
                port=self.port,
                peer_port=self.peer_port,
                cluster_user=ARTEMIS_CLUSTER_USER,
                cluster_password=ARTEMIS_CLUSTER_PASSWORD,
                role=_ARTEMIS_HA_ROLES[self.ha_role],
            )
        etc = {
            "broker.xml": broker_xml(
                (created / "broker.xml").read_text(),
                what=self.name,
                name=self.name,
                port=self.port,
                after_acceptors=ha_xml,
            )
        }
        if self.web_port is not None:
            web_xml = _ARTEMIS_WEB_XML.format(web_port=self.web_port)
            etc["bootstrap.xml"] = replace_once(
                (created / "bootstrap.xml").read_text(), "</broker>", web_xml, self.name
            )
        copy_instance(template, self.base, etc)

    def start(self) -> None:
        """Start the JVM (without waiting for it: see `wait_ready`). `bin/artemis run` execs java,
        so the PID is the JVM's."""
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:  # the child keeps its own descriptor; restarts append
            self.proc = subprocess.Popen(
                [str(self.base / "bin" / "artemis"), "run"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_artemis_env(),
            )

    def wait_ready(self, timeout: float = ARTEMIS_TIMEOUT_S) -> None:
        """Wait until the broker logs `AMQ221007` (active) and its acceptor accepts: a backup that
        takes over logs the line before its acceptor opens."""
        self.wait_log(ARTEMIS_ACTIVE, timeout)
        deadline = time.monotonic() + timeout
        while not accepts(self.port):
            self._check_alive(deadline, f"nothing accepts on {self.port}")
            time.sleep(0.02)  # polling another process's listen(): nothing to wait on
        if self.web_port is not None:
            self.wait_log("AMQ241004", timeout)  # `Artemis Console available`: the web server is up

    def wait_log(self, pattern: str, timeout: float = ARTEMIS_TIMEOUT_S) -> str:
        """Wait until the broker logs a line matching `pattern` since its last start: that line."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            for line in self.since_start().splitlines():
                if regex.search(line):
                    return line
            self._check_alive(deadline, f"no log line matching {pattern!r}")
            time.sleep(0.05)  # another process's log file: nothing to wait on

    def _check_alive(self, deadline: float, what: str) -> None:
        assert self.proc is not None, f"{self.name} was not started"
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self._tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{self.name}: {what}:\n{self._tail()}")

    def since_start(self) -> str:
        """The broker's console output since its last start."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def _tail(self) -> str:
        return self.since_start()[-3000:]

    def rss_kib(self) -> int:
        """The JVM's resident memory now, in KiB (VmRSS)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return int(match.group(1))

    def kill(self) -> None:
        """SIGKILL, as a crash: no clean shutdown, the backup of a pair takes over."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(ARTEMIS_TIMEOUT_S)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM (a clean stop takes about a second), SIGKILL if it hangs."""
        stop_process(self.proc, ARTEMIS_TIMEOUT_S)
        self.proc = None


def run_artemis_cli(*args: str, timeout: float = ARTEMIS_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the distribution's `artemis` (`producer`, `consumer`, `queue stat`, …) as a client, in a
    small JVM; its output, whatever its exit status."""
    require_artemis()
    return subprocess.run(
        [str(ARTEMIS_CLI), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=_artemis_env(java_args="-Xms16m -Xmx128m -XX:TieredStopAtLevel=1"),
        timeout=timeout,
        check=False,
    )


class _Startable(Protocol):
    def start(self) -> None: ...
    def wait_ready(self) -> None: ...
    def stop(self) -> None: ...


@contextlib.contextmanager
def started_together(brokers: Sequence[_Startable]) -> Iterator[None]:
    """Start every broker, then wait for each (their start-ups overlap); stop them all on leaving,
    also when one failed to start."""
    try:
        for broker in brokers:
            broker.start()
        for broker in brokers:
            broker.wait_ready()
        yield
    finally:
        for broker in brokers:
            broker.stop()


@dataclass(frozen=True, slots=True)
class ArtemisPair:
    """A replication pair (ha-policy replication, static cluster of two): the primary serves, the
    backup is synchronized with it and takes over when it dies."""

    primary: Artemis
    backup: Artemis


@pytest.fixture(scope="session")
def artemis_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's `artemis create`d instance that every test broker is copied from."""
    return create_artemis_template(tmp_path_factory.mktemp("artemis") / "template")


@pytest.fixture(scope="session")
def artemis_brokers(
    tmp_path_factory: pytest.TempPathFactory, artemis_template: Path
) -> Iterator[tuple[Artemis, Artemis, Artemis]]:
    """Three running brokers `a1`, `a2`, `a3` for the whole test session, started in parallel;
    each test uses addresses, queues and client IDs of its own."""
    base = tmp_path_factory.mktemp("artemis-brokers")
    brokers = (Artemis("a1", base / "a1"), Artemis("a2", base / "a2"), Artemis("a3", base / "a3"))
    for broker in brokers:
        broker.make(artemis_template)
    with started_together(brokers):
        yield brokers


@pytest.fixture
def make_artemis(tmp_path: Path, artemis_template: Path) -> Iterator[Callable[..., Artemis]]:
    """A factory of brokers of this test alone, made (not started) under tmp_path: `make_artemis(name,
    web_port=…, ha_role=…, peer_port=…)` takes `Artemis`'s fields; each is stopped at the end."""
    made: list[Artemis] = []

    def make(name: str, **fields: Any) -> Artemis:
        broker = Artemis(name, tmp_path / name, **fields)
        broker.make(artemis_template)
        made.append(broker)
        return broker

    try:
        yield make
    finally:
        for broker in made:
            broker.stop()


@pytest.fixture
def artemis_pair(make_artemis: Callable[..., Artemis]) -> ArtemisPair:
    """A running replication pair of this test alone (`primary`, `backup`), the backup synchronized:
    a test may `pair.primary.kill()` and then `pair.backup.wait_ready()`."""
    primary_port, backup_port = free_port(), free_port()
    primary = make_artemis("primary", port=primary_port, ha_role="primary", peer_port=backup_port)
    backup = make_artemis("backup", port=backup_port, ha_role="backup", peer_port=primary_port)
    primary.start()
    backup.start()
    primary.wait_ready()
    backup.wait_log(ARTEMIS_BACKUP_SYNCHRONIZED)
    return ArtemisPair(primary=primary, backup=backup)
