"""The artemis group's processes: Artemis 2.40 as a pure connection router, its two target brokers,
routerd beside it, and the Java client that times a first session.

`ArtemisFleet.start` runs, in the run's work directory and on 127.0.0.1 ports chosen at run time:
`artemis create` once (a template instance, never started), two copies of it as the target
brokers (C1 only, heap 64-256 MiB: they only answer pool probes and the first-session client),
then a copy as the router broker (heap 64-512 MiB, the JIT as shipped; its acceptor
`router=bench;protocols=CORE,AMQP,MQTT`, persistence and security off, CONSISTENT_HASH on
CLIENT_ID over the two targets: `configs.artemis_router_xml`; its loggers at routerd's level and
no line per redirected client: `configs.artemis_log4j2`), then routerd with the same connectors and router
(`configs.routerd_artemis_config`). Each router is started alone and timed from its launch to its
first CORE redirect; the set-up's other costs (the template, the targets, compiling the Java
client) are timed too. `ArtemisFleet.stop` stops them by PID, last started first; the run's
`Fleet` would stop them anyway.

`run_first_session` runs benchmarks/java/FirstSession.java (compiled by `compile_first_session`
against the Artemis JMS client jar) in one JVM over several URLs.

Artemis comes from .cache/artemis, where deploy/bootstrap.sh puts it (ENVIRONMENT.md §8), as for the
test suite's brokers (tests/conftest.py, whose template and instance handling this follows).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks.clients import REDIRECTED, ClientError, core_template, load_capture, probe_core_redirect
from benchmarks.configs import (
    ARTEMIS_PASSWORD,
    ARTEMIS_TARGETS,
    ARTEMIS_USER,
    ArtemisPorts,
    artemis_log4j2,
    artemis_router_xml,
    artemis_target_xml,
    routerd_artemis_config,
)
from benchmarks.fleet import FleetError, listening_ports, pick_ports, rss_kib
from tools.artemis_instance import CREATED_PORT, copy_instance, profile_heap

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from benchmarks.clients import CoreTemplate
    from benchmarks.fleet import Fleet

__all__ = [
    "ARTEMIS_HOME",
    "ARTEMIS_VERSION",
    "CLIENT_CLASSPATH",
    "FIRST_SESSION_SOURCE",
    "ArtemisFleet",
    "FirstSessionResult",
    "compile_first_session",
    "missing_artemis",
    "run_first_session",
]

ROOT: Final = Path(__file__).resolve().parent.parent
ARTEMIS_VERSION: Final = "2.40.0"
ARTEMIS_CACHE: Final = ROOT / ".cache" / "artemis"
"""Where deploy/bootstrap.sh puts the distribution and the client jars (ignored by git)."""
ARTEMIS_HOME: Final = ARTEMIS_CACHE / f"apache-artemis-{ARTEMIS_VERSION}"
ARTEMIS_CLI: Final = ARTEMIS_HOME / "bin" / "artemis"
CLIENT_CLASSPATH: Final = (
    ARTEMIS_CACHE / f"artemis-jms-client-all-{ARTEMIS_VERSION}.jar",
    ARTEMIS_CACHE / "slf4j-simple-2.0.17.jar",
)
"""The standalone JMS client over CORE (every dependency shaded in), and an SLF4J provider."""
FIRST_SESSION_SOURCE: Final = Path(__file__).resolve().parent / "java" / "FirstSession.java"

ROUTER_HEAP: Final = "512M"
"""-Xmx of the router broker (Artemis's own default is 2G; 512 MiB is ample for a router)."""
TARGET_HEAP: Final = "256M"
"""-Xmx of each target broker, as the test suite's brokers (tests/conftest.py)."""
START_TIMEOUT_S: Final = 120.0
"""Bound of `artemis create`, of a broker's start and of a router's first redirect (a broker
starts in 3-6 s here, more with other work on the machine)."""
FIRST_SESSION_URL: Final = "tcp://127.0.0.1:{port}?reconnectAttempts=5"
"""The Java client's URL: reconnectAttempts other than 0 makes it follow a CORE redirect (both
default to 0, so a plain URL does not: keys/core.py `encode_redirect`). The same on every path."""
_CLIENT_JAVA_ARGS: Final = ("-Xms64m", "-Xmx256m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")


def missing_artemis() -> list[str]:
    """What the artemis group needs and this machine lacks: java, javac, the distribution, the jars."""
    missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
    return missing + [str(p) for p in (ARTEMIS_CLI, *CLIENT_CLASSPATH) if not p.exists()]


def _env() -> dict[str, str]:
    """The environment without what would override an instance's profile (`JAVA_ARGS` replaces its
    heap settings) or point `bin/artemis` at another instance."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ARTEMIS_", "JAVA_ARGS")) and k != "DEBUG_ARGS"
    }


def _run(argv: Sequence[str], what: str, *, timeout: float = START_TIMEOUT_S) -> float:
    """Run a command to its end; the seconds it took.

    Raises:
        ClientError: it failed or timed out (its output is in the message).
    """
    started = time.monotonic()
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=_env(),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ClientError(f"{what} took more than {timeout:g} s") from exc
    if done.returncode != 0:
        raise ClientError(f"{what} exited {done.returncode}: {(done.stdout + done.stderr).strip()[-500:]}")
    return time.monotonic() - started


def _listening(port: int) -> Callable[[], bool]:
    return lambda: port in listening_ports()


def create_template(directory: Path) -> float:
    """`artemis create` into `directory`: an instance never started, copied for each broker (a create
    costs a JVM start, a copy does not). On 127.0.0.1, login required, no web console, one acceptor
    for every protocol, the NIO journal without fsync, no disk-speed test; as the test suite's.

    Returns:
        The seconds it took.
    """
    argv = [str(ARTEMIS_CLI), "create", str(directory), "--silent", "--name=template"]
    argv += [f"--user={ARTEMIS_USER}", f"--password={ARTEMIS_PASSWORD}", "--require-login"]
    argv += ["--host=127.0.0.1", "--http-host=127.0.0.1", "--no-web", "--no-autotune", "--nio"]
    argv += ["--no-fsync", f"--default-port={CREATED_PORT}", "--no-amqp-acceptor"]
    argv += ["--no-stomp-acceptor", "--no-mqtt-acceptor", "--no-hornetq-acceptor"]
    return _run(argv, "artemis create")


def make_instance(
    template: Path, base: Path, *, broker_xml: str, profile: str, log4j2: str | None = None
) -> None:
    """Copy the template instance to `base`, write its broker.xml, artemis.profile and (if given)
    log4j2.properties (made from the template's), and point its scripts and settings at `base`
    instead of the template (tools/artemis_instance.py `copy_instance`)."""
    etc = {"broker.xml": broker_xml, "artemis.profile": profile}
    if log4j2 is not None:
        etc["log4j2.properties"] = log4j2
    copy_instance(template, base, etc)


def compile_first_session(directory: Path) -> float:
    """javac FirstSession.java into `directory` against the client jar; the seconds it took."""
    directory.mkdir(parents=True, exist_ok=True)
    javac = shutil.which("javac") or "javac"
    argv = [javac, "-cp", str(CLIENT_CLASSPATH[0]), "-d", str(directory), str(FIRST_SESSION_SOURCE)]
    return _run(argv, "javac FirstSession.java")


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstSessionResult:
    """What FirstSession printed: per path, the timed visits' milliseconds and the failures."""

    ms: dict[str, list[float]]
    errors: dict[str, int]
    last_error: dict[str, str]

    @classmethod
    def from_json(cls, line: str) -> FirstSessionResult:
        """Read FirstSession's result line.

        Raises:
            ClientError: not the object FirstSession prints.
        """
        try:
            doc = json.loads(line)
            return cls(
                ms={str(k): [float(x) for x in v] for k, v in doc["ms"].items()},
                errors={str(k): int(v) for k, v in doc["errors"].items()},
                last_error={str(k): str(v) for k, v in doc["last_error"].items()},
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ClientError(f"FirstSession: unreadable result {line[:300]!r}") from exc


def run_first_session(
    classes: Path,
    paths: Sequence[tuple[str, int]],
    *,
    warmup: int,
    rounds: int,
    log: Path,
    id_prefix: str = "bench-fs-",
) -> FirstSessionResult:
    """Time createConnection -> started session through each (name, port), in one client JVM.

    Args:
        classes: where `compile_first_session` put the class.
        paths: (name, port) of each path; the URL is `FIRST_SESSION_URL`.
        warmup: untimed rounds first.
        rounds: timed rounds; each visits every path once, the order rotated each round.
        log: where the client's own output goes.
        id_prefix: the client IDs' prefix.

    Raises:
        ClientError: the client did not run or printed no result.
    """
    classpath = os.pathsep.join([*map(str, CLIENT_CLASSPATH), str(classes)])
    argv = [shutil.which("java") or "java", *_CLIENT_JAVA_ARGS, "-cp", classpath, "FirstSession"]
    argv += [ARTEMIS_USER, ARTEMIS_PASSWORD, str(warmup), str(rounds), id_prefix]
    argv += [f"{name}={FIRST_SESSION_URL.format(port=port)}" for name, port in paths]
    # A visit takes 10-100 ms; a failed one up to the client's callTimeout (30 s).
    timeout = START_TIMEOUT_S + (warmup + rounds) * len(paths) * 2.0
    with log.open("ab") as out:
        try:
            done = subprocess.run(
                argv,
                stdout=subprocess.PIPE,
                stderr=out,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClientError(f"FirstSession took more than {timeout:g} s (log: {log})") from exc
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ClientError(f"FirstSession exited {done.returncode} without a result (log: {log})")
    return FirstSessionResult.from_json(lines[-1])


@dataclass(slots=True)
class ArtemisSetup:
    """What the group's set-up cost, in seconds (the JSON's `artemis_router_start` details)."""

    template_s: float = 0.0
    """`artemis create` of the template instance."""
    javac_s: float = 0.0
    targets_s: float = 0.0
    """The two target brokers, started together, from launch until both listen."""
    routers_s: dict[str, float] = field(default_factory=dict)
    """Per router ("artemis", "routerd"): from its launch, alone, to its first CORE redirect."""
    rss_at_start_kib: dict[str, int] = field(default_factory=dict)
    """The JVMs' and routerd's resident memory right after their start."""
    total_s: float = 0.0
    """All of the set-up, from `artemis create` to routerd's first redirect."""


class ArtemisFleet:
    """The artemis group's brokers and routerd, started into the run's `Fleet` and stopped by PID."""

    def __init__(self, fleet: Fleet, directory: Path, *, log_level: str, say: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.directory = directory
        """Instances, the template, the compiled client and routerd's configuration go here."""
        self.log_level = log_level
        self._say = say
        self.ports: ArtemisPorts | None = None
        self.opening: CoreTemplate = core_template(load_capture())
        self.pids: dict[str, int] = {}
        """The routers' PIDs: "artemis" (the router broker's JVM) and "routerd"."""
        self.target_pids: dict[str, int] = {}
        """The target brokers' JVMs, by name."""
        self.setup = ArtemisSetup()
        self.classes = directory / "classes"
        self._procs: list[subprocess.Popen[bytes]] = []

    def need_ports(self) -> ArtemisPorts:
        """The group's ports.

        Raises:
            FleetError: not started.
        """
        if self.ports is None:
            raise FleetError("the artemis group's brokers are not started")
        return self.ports

    def start(self) -> None:
        """Create the template; start the targets (and compile the Java client meanwhile); then the
        Artemis router, then routerd, each alone until its first CORE redirect.

        Raises:
            ClientError: a command failed.
            FleetError: a process exited or was not ready in time.
        """
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        ports = ArtemisPorts.from_numbers(pick_ports(ArtemisPorts.COUNT))
        self.ports = ports
        template = self.directory / "template"
        self.setup.template_s = create_template(template)
        created_xml = (template / "etc" / "broker.xml").read_text()
        created_profile = (template / "etc" / "artemis.profile").read_text()
        created_log4j2 = (template / "etc" / "log4j2.properties").read_text()
        launched = time.monotonic()
        targets = []
        for name, port in zip(ARTEMIS_TARGETS, ports.targets, strict=True):
            base = self.directory / name
            make_instance(
                template,
                base,
                broker_xml=artemis_target_xml(created_xml, name=name, port=port),
                profile=profile_heap(created_profile, heap=TARGET_HEAP, c1_only=True),
            )
            proc = self._launch(name, [str(base / "bin" / "artemis"), "run"])
            self.target_pids[name] = proc.pid
            targets.append((name, port, proc))
        self.setup.javac_s = compile_first_session(self.classes)
        for name, port, proc in targets:
            self.fleet.wait_until(name, proc, _listening(port), START_TIMEOUT_S, f"listen on {port}")
        self.setup.targets_s = time.monotonic() - launched
        self._say(f"artemis targets listening after {self.setup.targets_s:.1f} s")

        base = self.directory / "router"
        make_instance(
            template,
            base,
            broker_xml=artemis_router_xml(
                created_xml, name="router", port=ports.artemis_router, targets=ports.targets
            ),
            profile=profile_heap(created_profile, heap=ROUTER_HEAP, c1_only=False),
            log4j2=artemis_log4j2(created_log4j2, level=self.log_level),
        )
        self._start_router(
            "artemis", "artemis router", [str(base / "bin" / "artemis"), "run"], ports.artemis_router
        )

        config = self.directory / "routerd-artemis.xml"
        config.write_text(routerd_artemis_config(ports))
        argv = [sys.executable, "-m", "router", "--config", str(config)]  # one list type for both
        argv += ["--admin", f"127.0.0.1:{ports.routerd_admin}", "--log-level", self.log_level]
        self._start_router("routerd", "routerd-artemis", argv, ports.routerd_redirect)
        self.setup.total_s = time.monotonic() - started

    def _launch(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        proc = self.fleet.start(name, argv, env=_env(), cwd=ROOT)
        self._procs.append(proc)
        return proc

    def _start_router(self, path: str, name: str, argv: Sequence[str], port: int) -> None:
        """Launch one router and wait for its first CORE redirect (its pool has a ready target)."""
        launched = time.monotonic()
        proc = self._launch(name, argv)
        opening = self.opening.opening("bench-start")
        self.fleet.wait_until(
            name,
            proc,
            lambda: probe_core_redirect(port, opening, timeout=2.0).startswith(REDIRECTED),
            START_TIMEOUT_S,
            "redirect a CORE opening",
        )
        self.setup.routers_s[path] = time.monotonic() - launched
        self.pids[path] = proc.pid
        self.setup.rss_at_start_kib[path] = rss_kib(proc.pid)
        self._say(
            f"{name} redirected its first CORE opening {self.setup.routers_s[path]:.1f} s after its launch"
        )

    def rss_kib(self) -> dict[str, int]:
        """The resident memory of every process of the group still running: targets, routers."""
        found: dict[str, int] = {}
        for name, pid in [*self.target_pids.items(), *self.pids.items()]:
            with contextlib.suppress(FleetError):
                found[name] = rss_kib(pid)
        return found

    def stop(self) -> None:
        """Stop routerd and the brokers by PID, last started first."""
        while self._procs:
            self.fleet.stop(self._procs.pop())
