"""The benchmark command: HAProxy 2.6 and routerd in front of the same backends, same load clients;
and (the artemis group) routerd's redirects against Artemis's own connection router.

    .venv/bin/python -m benchmarks.run [--quick] [--json PATH] [--only GROUP,...]
                                       [--routerd-log-level LEVEL] [--keep-logs] [--event-log]

One run starts, on 127.0.0.1 ports below 32768 chosen at run time: a C echo server (two ports =
two backends), `iperf3 -s`, mosquitto, HAProxy (TCP mode, one thread) and routerd (static pools,
CONSISTENT_HASH, proxy mode). Then it measures, in this order (`--only` takes these names):

    memory    RSS per idle proxied connection (5,000 connections held open through each proxy)
    bulk      iperf3 throughput, 1 and 8 streams
    rate      short connections: connect, 16 B echo, close; 50 in parallel, from 127.0.0.2-.9
    mqtt      MQTT 3.1.1 CONNECT -> CONNACK through the proxy to mosquitto, key CLIENT_ID
    redirect  MQTT 5 CONNECT -> CONNACK 0x9C from the proxy itself (HAProxy: a Lua service)
    latency   ping-pong round trips over one connection, p50/p99, and what each proxy adds
    decision  routerd's routing decision in process (cache miss and hit), p50/p99
    workers   short connections (as rate) through a second pair of proxies on ports of their own,
              started in turn: routerd --workers 2 and HAProxy nbthread 2; their CPU (all of
              routerd's processes) and the load client's per connection
    instructions  user-space instructions per connection (echo, MQTT 3.1.1 CONNECT) of a second
              HAProxy and routerd run under valgrind's callgrind on their own ports
    artemis   (only with --only) Artemis 2.40 as a pure router and routerd in mode=redirect over the
              same two Artemis target brokers: CORE, AMQP and MQTT 5 redirects per second, router
              CPU per redirect, a Java CORE client's time to its first session, start-up, RSS

It prints a table (absolute figures and routerd/HAProxy ratios) and writes the figures to a JSON
file, stops every process it started by PID (also on Ctrl-C, SIGTERM and errors), and exits 0, or
1 when a measurement failed, or 2 when a tool is missing. A figure routerd cannot produce yet
(CLIENT_ID keys, redirect mode) is null with a reason that starts "not supported by this routerd
yet"; that is not a failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks.artemis import ARTEMIS_VERSION, ArtemisFleet, missing_artemis, run_first_session
from benchmarks.callgrind import (
    CALLGRIND_TOOLS,
    Callgrind,
    Counted,
    counted_value,
    per_connection,
    valgrind_argv,
)
from benchmarks.clients import (
    REDIRECTED,
    REQUIRED_TOOLS,
    USE_ANOTHER_SERVER,
    ClientError,
    CoreTemplate,
    Loadgen,
    PingResult,
    RateKind,
    RateResult,
    build_c_tools,
    find_tool,
    probe_amqp_redirect,
    probe_connack,
    probe_core_redirect,
    run_iperf,
)
from benchmarks.configs import (
    PROBE_LOCAL_CLIENT_ID,
    PROBE_OTHER_CLIENT_ID,
    Ports,
    haproxy_config,
    haproxy_maxconn,
    mosquitto_config,
    mqtt_redirect_lua,
    routerd_config,
)
from benchmarks.decision import time_decisions
from benchmarks.fleet import (
    Fleet,
    FleetError,
    admin_get,
    cpu_ns,
    pick_ports,
    pinned,
    quietest_cpu,
    raise_fd_limit,
    rss_kib,
    stop_signals_interrupt,
)
from benchmarks.report import (
    DEFAULT_GROUPS,
    GROUPS,
    Figure,
    PathName,
    format_goals,
    format_table,
    goal_results,
    median_figures,
    new_figures,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["FULL", "QUICK", "Settings", "default_json_path", "main"]

ROOT: Final = Path(__file__).resolve().parent.parent
INSTALL_HINT: Final = (
    "run ./benchmarks/bench (or ./run-tests), which installs them, or: "
    "apt-get install -y haproxy iperf3 mosquitto gcc libc6-dev valgrind"
)
ARTEMIS_HINT: Final = (
    "the artemis group needs a JDK and Apache Artemis in .cache/artemis: run ./deploy/bootstrap.sh"
)
FD_MARGIN: Final = 500
"""Descriptors kept free beyond two per idle proxied connection (listeners, logs, probes)."""
SETTLE_S: Final = 1.0
"""Pause before reading an RSS, so that the proxy has finished with the last connection."""
WARMUP_PLATEAU: Final = 0.10
"""A router is warm when a warm-up round's rate is at most this much above the round before's."""
VALGRIND_START_S: Final = 120.0
"""How long a proxy under callgrind may take to listen and, routerd, to report its pools ready:
routerd took 8 s on 2 shared CPUs, not yet counting (`valgrind_argv`), and 50-70 s counting."""
VALGRIND_STOP_S: Final = 60.0
"""How long a proxy under callgrind may take to exit after SIGTERM: at its exit callgrind writes a
last dump of every thread and removes its vgdb FIFOs from /tmp, which SIGKILL would leave."""
WARMUP_MIN_ROUNDS: Final = 3
"""Warm-up rounds before the plateau is looked for (a round of a noisy machine can dip while the
JIT is still at work), unless `artemis_warmup_max_seconds` ends the warm-up first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How big each measurement is."""

    iperf_seconds: float
    rate_total: int
    rate_seconds: float
    rate_concurrency: int
    mqtt_total: int
    mqtt_seconds: float
    ping_count: int
    """Round trips per path, over all rounds."""
    ping_rounds: int
    ping_seconds: float
    """Upper bound per path, over all rounds."""
    idle_connections: int
    idle_seconds: float
    decision_keys: int
    artemis_total: int
    """Redirects per protocol and router (also HAProxy's reference echo connections)."""
    artemis_seconds: float
    """Upper bound of each of those runs."""
    artemis_warmup_round_seconds: float
    """Untimed redirects first, per protocol and router, in rounds this long (bounded by
    `artemis_total` too), until the rate stops rising (`WARMUP_PLATEAU`): the JIT of Artemis's
    JVM compiles the paths a redirect takes (cold, its first second of CORE redirects runs at a
    sixth of its warm rate)."""
    artemis_warmup_max_seconds: float
    """The most warm-up rounds may take per protocol and router."""
    first_session_rounds: int
    """Timed rounds of the Java client, each visiting direct, Artemis and routerd."""
    first_session_warmup: int
    """Untimed rounds first (class loading, the client JVM's JIT, the brokers' first sessions)."""
    instructions_warmup: int
    """Connections through a proxy under callgrind before the counted ones, per kind: the first
    connections pay for imports, caches and pools that later ones find ready."""
    instructions_batches: tuple[int, int]
    """N1 and N2, the counted batches (`benchmarks.callgrind.per_connection`). Under callgrind
    routerd carries about 250 connections a second, HAProxy more."""
    instructions_seconds: float
    """Upper bound of each of those batches; a batch must finish all its connections."""


FULL: Final = Settings(
    iperf_seconds=5,
    rate_total=20_000,
    rate_seconds=10,
    rate_concurrency=50,
    mqtt_total=20_000,
    mqtt_seconds=10,
    ping_count=21_000,
    ping_rounds=7,
    ping_seconds=14,
    idle_connections=5_000,
    idle_seconds=60,
    decision_keys=20_000,
    artemis_total=20_000,
    artemis_seconds=10,
    artemis_warmup_round_seconds=2,
    artemis_warmup_max_seconds=20,
    first_session_rounds=30,
    first_session_warmup=10,
    instructions_warmup=300,
    instructions_batches=(500, 1500),
    instructions_seconds=120,
)
QUICK: Final = Settings(
    iperf_seconds=1,
    rate_total=500,
    rate_seconds=5,
    rate_concurrency=50,
    mqtt_total=300,
    mqtt_seconds=5,
    ping_count=1_500,
    ping_rounds=3,
    ping_seconds=5,
    idle_connections=200,
    idle_seconds=30,
    decision_keys=2_000,
    artemis_total=300,
    artemis_seconds=5,
    artemis_warmup_round_seconds=0.5,
    artemis_warmup_max_seconds=0.5,
    first_session_rounds=3,
    first_session_warmup=2,
    instructions_warmup=50,
    instructions_batches=(50, 150),
    instructions_seconds=60,
)


def default_json_path() -> Path:
    """Where the JSON goes without --json: the system's temporary directory, never the tree."""
    return Path(tempfile.gettempdir()) / "router-bench" / "latest.json"


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _first_line(argv: Sequence[str]) -> str:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (result.stdout or result.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def _versions(groups: Sequence[str] = ()) -> dict[str, str]:
    tool = {name: find_tool(name) or name for name in REQUIRED_TOOLS}
    commit = _first_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"])  # read-only
    versions = {
        "haproxy": _first_line([tool["haproxy"], "-v"]),
        "iperf3": _first_line([tool["iperf3"], "--version"]),
        "mosquitto": _first_line([tool["mosquitto"], "-h"]),
        "gcc": _first_line([tool["gcc"], "--version"]),
        "python": sys.version.split()[0],
        "routerd_commit": commit,
    }
    if "instructions" in groups:
        versions["valgrind"] = _first_line([find_tool("valgrind") or "valgrind", "--version"])
    if "artemis" in groups:
        versions["artemis"] = ARTEMIS_VERSION
        versions["java"] = _first_line([shutil.which("java") or "java", "-version"])
    return versions


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Bench:
    """One run: the fleet, the load clients and the figures they fill."""

    def __init__(
        self,
        fleet: Fleet,
        settings: Settings,
        figures: dict[str, Figure],
        *,
        log_level: str,
        event_log: bool = False,
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self.figures = figures
        self.log_level = log_level
        self.event_log = event_log
        """Run routerd with its routing event log on (`--event-log` into the work directory)."""
        self.workdir = fleet.workdir
        self.fd_limit = raise_fd_limit()
        self.idle_connections = min(settings.idle_connections, (self.fd_limit - FD_MARGIN) // 2)
        self.ports: Ports | None = None
        self.loadgen: Loadgen | None = None
        self.pids: dict[PathName, int] = {}
        """The proxies' PIDs."""
        self.echo_pid: int | None = None

    # -- starting --

    def start(self) -> None:
        """Build the C tools, write the configurations, start the backends and both proxies."""
        binaries = build_c_tools(self.workdir)
        self.loadgen = Loadgen(binaries["loadgen"], self.fleet)
        ports = Ports.from_numbers(pick_ports(Ports.COUNT))
        self.ports = ports
        tool = {name: find_tool(name) or name for name in REQUIRED_TOOLS}
        work = self.workdir
        (work / "mosquitto.conf").write_text(mosquitto_config(ports.mosquitto))
        (work / "redirect.lua").write_text(mqtt_redirect_lua(f"127.0.0.1:{ports.mosquitto}"))
        maxconn = haproxy_maxconn(self.fd_limit)
        (work / "haproxy.cfg").write_text(
            haproxy_config(ports, lua_path=str(work / "redirect.lua"), maxconn=maxconn)
        )
        (work / "routerd.xml").write_text(routerd_config(ports))
        check = subprocess.run(
            [tool["haproxy"], "-c", "-f", str(work / "haproxy.cfg")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check.returncode != 0:
            raise FleetError(f"haproxy -c rejects the generated configuration: {check.stdout}{check.stderr}")

        echo = self.fleet.start(
            "echo backends", [str(binaries["echo_srv"]), "127.0.0.1", *map(str, ports.echo)], ports=ports.echo
        )
        self.echo_pid = echo.pid
        self.fleet.start(
            "iperf3 server",
            [tool["iperf3"], "-s", "-B", "127.0.0.1", "-p", str(ports.iperf)],
            ports=[ports.iperf],
        )
        self.fleet.start(
            "mosquitto", [tool["mosquitto"], "-c", str(work / "mosquitto.conf")], ports=[ports.mosquitto]
        )
        haproxy = self.fleet.start(
            "haproxy", [tool["haproxy"], "-f", str(work / "haproxy.cfg"), "-db"], ports=_haproxy_ports(ports)
        )
        self.pids["haproxy"] = haproxy.pid
        routerd_argv = self._routerd_argv(work, ports.routerd_admin)
        routerd = self.fleet.start("routerd", routerd_argv, ports=_routerd_ports(ports), cwd=ROOT)
        self.pids["routerd"] = routerd.pid
        ready = "report every pool target ready"
        self.fleet.wait_until("routerd", routerd, lambda: _pools_ready(ports.routerd_admin), 20, ready)
        _say(
            f"haproxy maxconn {maxconn}, fd limit {self.fd_limit}, {self.idle_connections} idle connections; "
            f"logs in {work}"
        )

    def _routerd_argv(self, work: Path, admin_port: int) -> list[str]:
        """routerd with `work`'s routerd.xml, the run's log level and event log (into `work`)."""
        argv = [sys.executable, "-m", "router", "--config", str(work / "routerd.xml")]
        argv += ["--admin", f"127.0.0.1:{admin_port}", "--log-level", self.log_level]
        if self.event_log:
            argv += ["--event-log", str(work / "events")]
        return argv

    def _need(self) -> tuple[Ports, Loadgen]:
        if self.ports is None or self.loadgen is None:
            raise FleetError("the fleet is not started")
        return self.ports, self.loadgen

    # -- measurements --

    def run_group(self, group: str) -> None:
        """Run one measurement group; an error fails the group's values that are still missing."""
        started = time.monotonic()
        _say(f"measuring {group}")
        measure: dict[str, Callable[[], None]] = {
            "memory": self.memory,
            "bulk": self.bulk,
            "rate": self.rate,
            "mqtt": self.mqtt,
            "redirect": self.redirect,
            "latency": self.latency,
            "decision": self.decision,
            "workers": self.workers,
            "instructions": self.instructions,
            "artemis": self.artemis,
        }
        try:
            measure[group]()
        except (
            ClientError,
            FleetError,
            OSError,
            RuntimeError,
            ValueError,
            subprocess.SubprocessError,
        ) as exc:
            _say(f"{group} failed: {exc}")
            _fail_missing(self.figures, [group], f"{type(exc).__name__}: {exc}")
        _say(f"{group} took {time.monotonic() - started:.1f} s")

    def _run_rates(
        self,
        figure: Figure,
        paths: Sequence[tuple[PathName, int]],
        *,
        kind: RateKind,
        total: int,
        seconds: float,
        reason: int = 0,
        id_tag: str = "",
        unsupported: str | None = None,
        cpu_figure: Figure | None = None,
        pids: Mapping[PathName, int] | None = None,
        core_opening: CoreTemplate | None = None,
    ) -> None:
        """`loadgen rate` through each path; record the rates, with the proxy's CPU time per connection.

        Args:
            figure: where the rates go.
            paths: (path, port) in the order to measure.
            kind: what each connection sends and expects (see `Loadgen.rate`).
            total: connections per path, `rate_concurrency` at a time.
            seconds: upper bound per path.
            reason: the CONNACK code expected (MQTT kinds).
            id_tag: MQTT client ids of a path start "bench-" + id_tag + the path's initial + "-".
            unsupported: why routerd cannot be measured (routerd is then marked so, not run), or None.
            cpu_figure: where the proxies' CPU time per connection goes too, if anywhere.
            pids: whose CPU time is the path's (default: the proxies of the fleet).
            core_opening: the CORE opening of kind "core".
        """
        _, loadgen = self._need()
        if unsupported is not None:
            figure.unsupported("routerd", unsupported)
            paths = [(path, port) for path, port in paths if path != "routerd"]
        for path, port in paths:
            pid = (self.pids if pids is None else pids).get(path)
            cpu_before = cpu_ns(pid) if pid is not None else 0
            result = loadgen.rate(
                port,
                kind=kind,
                reason=reason,
                concurrency=self.settings.rate_concurrency,
                total=total,
                seconds=seconds,
                id_prefix=f"bench-{id_tag}{path[0]}-",
                core_opening=core_opening,
            )
            details = result.details()
            if pid is not None and result.ok > 0:
                cpu_us = (cpu_ns(pid) - cpu_before) / 1000 / result.ok
                details["proxy_cpu_us_per_connection"] = round(cpu_us, 2)
                if cpu_figure is not None:
                    cpu_figure.set(path, cpu_us)
            if result.ok == 0:
                figure.details[path] = details
                figure.fail(
                    path, f"no connection succeeded ({result.errors} errors, last: {result.last_error})"
                )
                if cpu_figure is not None and path in cpu_figure.paths:
                    cpu_figure.fail(path, "no connection succeeded")
            else:
                figure.set(path, result.rate, details)
            if result.errors:
                _say(f"{figure.name}/{path}: {result.errors} errors, last: {result.last_error}")

    def memory(self) -> None:
        """RSS growth per idle proxied connection, and the RSS before them."""
        ports, loadgen = self._need()
        count = self.idle_connections
        warmup = max(1, min(100, count // 10))
        per_conn, before_fig = self.figures["memory_per_connection"], self.figures["memory_rss_before"]
        for path_name, port in _echo_paths(ports)[1:]:
            pid = self.pids[path_name]
            helper, _ = loadgen.open_idle(port, count=warmup, seconds=self.settings.idle_seconds)
            self.fleet.stop(helper)  # first connections pay for lazily allocated pools
            time.sleep(SETTLE_S)
            before = rss_kib(pid)
            helper, opened = loadgen.open_idle(port, count=count, seconds=self.settings.idle_seconds)
            try:
                time.sleep(SETTLE_S)
                after = rss_kib(pid)
            finally:
                self.fleet.stop(helper)
            details: dict[str, object] = {
                "requested": count,
                "open": opened.open,
                "errors": opened.errors,
                "open_seconds": round(opened.seconds, 3),
                "rss_before_kib": before,
                "rss_after_kib": after,
            }
            if opened.open == 0:
                per_conn.fail(path_name, f"no idle connection opened (last error: {opened.last_error})")
                per_conn.details[path_name] = details
            else:
                per_conn.set(path_name, (after - before) / opened.open, details)
            before_fig.set(path_name, before / 1024)

    def bulk(self) -> None:
        """iperf3 through each path, one stream and eight."""
        ports, _ = self._need()
        paths: list[tuple[PathName, int]] = [
            ("direct", ports.iperf),
            ("haproxy", ports.haproxy_iperf),
            ("routerd", ports.routerd_iperf),
        ]
        for streams, name in ((1, "bulk_1_stream"), (8, "bulk_8_streams")):
            for path, port in paths:
                gbps, details = run_iperf(port, streams=streams, seconds=self.settings.iperf_seconds)
                self.figures[name].set(path, gbps, details)

    def rate(self) -> None:
        """Short connections with a 16-byte echo."""
        ports, _ = self._need()
        s = self.settings
        self._run_rates(
            self.figures["connection_rate"],
            _echo_paths(ports),
            kind="echo",
            total=s.rate_total,
            seconds=s.rate_seconds,
            cpu_figure=self.figures["connection_cpu"],
        )

    def client_id_support(self) -> str | None:
        """None when routerd routes MQTT connections by their client id, else why not.

        The probe router takes the key `PROBE_LOCAL_CLIENT_ID` to its local target, which has no
        connector, so routerd refuses that client, but only if it has read the client id: with
        the key NULL the client reaches mosquitto and gets CONNACK 0x00 like any other.
        """
        ports, _ = self._need()
        other = probe_connack(ports.routerd_probe, PROBE_OTHER_CLIENT_ID, "3.1.1")
        local = probe_connack(ports.routerd_probe, PROBE_LOCAL_CLIENT_ID, "3.1.1")
        sniffer = (
            "" if (ROOT / "keys" / "mqtt.py").exists() else "; keys/mqtt.py (the MQTT sniffer) does not exist"
        )
        if other != "connack 0x00":
            return (
                f"an MQTT 3.1.1 CONNECT through the probe acceptor got {other!r}, not CONNACK 0x00{sniffer}"
            )
        if local == "connack 0x00":
            return (
                f"a CONNECT with client id {PROBE_LOCAL_CLIENT_ID!r} reached mosquitto although that key "
                f"goes to the local target: routerd routed it as key NULL{sniffer}"
            )
        return None

    def redirect_support(self) -> str | None:
        """None when routerd's mode=redirect acceptor answers an MQTT 5 CONNECT with 0x9C."""
        ports, _ = self._need()
        answer = probe_connack(ports.routerd_redirect, "bench-probe-redirect", "5")
        if answer == f"connack 0x{USE_ANOTHER_SERVER:02x}":
            return None
        if answer == "connack 0x00":
            return "the mode=redirect acceptor proxied the MQTT 5 CONNECT to mosquitto (CONNACK 0x00)"
        return f"the mode=redirect acceptor answered an MQTT 5 CONNECT with {answer!r}, not CONNACK 0x9c"

    def mqtt(self) -> None:
        """MQTT 3.1.1 CONNECT -> CONNACK through each path to mosquitto."""
        ports, _ = self._need()
        s = self.settings
        self._run_rates(
            self.figures["mqtt_connect_rate"],
            [("direct", ports.mosquitto), ("haproxy", ports.haproxy_mqtt), ("routerd", ports.routerd_mqtt)],
            kind="mqtt3",
            total=s.mqtt_total,
            seconds=s.mqtt_seconds,
            id_tag="b",
            unsupported=self.client_id_support(),
        )

    def redirect(self) -> None:
        """MQTT 5 CONNECT -> CONNACK 0x9C answered by the proxy itself."""
        ports, _ = self._need()
        s = self.settings
        answer = probe_connack(ports.haproxy_redirect, "bench-probe-redirect", "5")
        if answer != f"connack 0x{USE_ANOTHER_SERVER:02x}":
            raise ClientError(f"HAProxy's Lua redirect answered {answer!r}, not CONNACK 0x9c")
        self._run_rates(
            self.figures["mqtt5_redirect_rate"],
            [("haproxy", ports.haproxy_redirect), ("routerd", ports.routerd_redirect)],
            kind="mqtt5",
            reason=USE_ANOTHER_SERVER,
            total=s.mqtt_total,
            seconds=s.mqtt_seconds,
            id_tag="r",
            unsupported=self.redirect_support(),
        )

    def latency(self) -> None:
        """Ping-pong round trips over one connection; what each proxy adds to the direct path.

        The load client, the proxy and the echo backend of each run share one CPU. On a VM, waking
        a process on an idle virtual CPU costs some 60 µs, so without pinning the direct p50 flips
        between 5 and 70 µs from run to run, and the difference to it means nothing. Pinned, a round
        trip is the CPU work of the path plus its context switches, which is what a proxy adds.

        Other work on the machine lands on that CPU now and then, so the count is split into
        rounds that visit direct, HAProxy and routerd in turn (each run on the CPU that was
        idlest just before), and every figure is the median over the rounds: a p50 is the median
        of the rounds' p50s, an added latency the median of the rounds' differences to the direct
        run of the same round.
        """
        ports, loadgen = self._need()
        if self.echo_pid is None:
            raise FleetError("the echo backends are not running")
        echo_pid = self.echo_pid
        s = self.settings
        paths = _echo_paths(ports)
        per_round = max(1, s.ping_count // s.ping_rounds)
        seconds = max(1.0, s.ping_seconds / s.ping_rounds)
        rounds: dict[PathName, list[PingResult]] = {path: [] for path, _ in paths}
        cpus: list[int] = []
        for index in range(s.ping_rounds):
            for path, port in paths[index % 3 :] + paths[: index % 3]:
                cpu = quietest_cpu()
                cpus.append(cpu)
                with pinned([echo_pid, *([self.pids[path]] if path in self.pids else [])], cpu):
                    rounds[path].append(loadgen.ping(port, count=per_round, seconds=seconds))
        p50, p99 = self.figures["rtt_p50"], self.figures["rtt_p99"]
        for path, results in rounds.items():
            broken = [r for r in results if r.count == 0]
            if broken:
                p50.fail(path, f"a round trip run failed ({broken[0].last_error})")
                p99.fail(path, f"a round trip run failed ({broken[0].last_error})")
                continue
            details: dict[str, object] = {
                "rounds": len(results),
                "count_per_round": per_round,
                "p50_us_per_round": [r.p50_us for r in results],
                "p99_us_per_round": [r.p99_us for r in results],
                "mean_us_per_round": [r.mean_us for r in results],
                "max_us": max(r.max_us for r in results),
                "errors": sum(r.errors for r in results),
                "cpus": sorted(set(cpus)),
            }
            p50.set(path, statistics.median(r.p50_us for r in results), details)
            p99.set(path, statistics.median(r.p99_us for r in results))
        for rtt, added, pick in (
            (p50, self.figures["added_latency_p50"], _p50),
            (p99, self.figures["added_latency_p99"], _p99),
        ):
            for proxy in _PROXIES:
                if rtt.values.get("direct") is None or rtt.values.get(proxy) is None:
                    added.fail(proxy, "a round-trip figure it is computed from is missing")
                    continue
                differences = [
                    pick(p) - pick(d) for p, d in zip(rounds[proxy], rounds["direct"], strict=True)
                ]
                added.set(proxy, statistics.median(differences), {"us_per_round": differences})

    def decision(self) -> None:
        """routerd's routing decision time, in process."""
        ports = self.ports or _placeholder_ports()
        times = time_decisions(routerd_config(ports), "echo", keys=self.settings.decision_keys)
        details: dict[str, object] = {
            "keys": times.keys,
            "router": "echo (SOURCE_IP, CONSISTENT_HASH, 2 targets)",
        }
        self.figures["decision_miss_p50"].set("routerd", times.miss_p50_us, details)
        self.figures["decision_miss_p99"].set("routerd", times.miss_p99_us)
        self.figures["decision_hit_p50"].set("routerd", times.hit_p50_us, details)
        self.figures["decision_hit_p99"].set("routerd", times.hit_p99_us)

    def workers(self) -> None:
        """Short connections through routerd `--workers 2` and HAProxy `nbthread 2`.

        A second routerd and HAProxy, started in turn on ports of their own
        (`Ports.with_proxy_ports`) in front of the fleet's backends, with the fleet's configurations
        otherwise (HAProxy's with `nbthread 2`); the fleet's proxies keep theirs. Each gets a
        warm-up, then the rate group's load; the CPU per connection is all of a proxy's processes'
        (`cpu_ns` counts routerd's workers, its children), and the load client's own is in the
        details (the client shares the machine's cores).
        """
        ports, loadgen = self._need()
        s = self.settings
        work = self.workdir / "workers"
        work.mkdir(exist_ok=True)
        own = ports.with_proxy_ports(pick_ports(Ports.PROXY_COUNT))
        tool = {name: find_tool(name) or name for name in REQUIRED_TOOLS}
        lua = str(self.workdir / "redirect.lua")
        single = haproxy_config(own, lua_path=lua, maxconn=haproxy_maxconn(self.fd_limit))
        (work / "haproxy.cfg").write_text(single.replace("nbthread 1", f"nbthread {WORKERS}", 1))
        (work / "routerd.xml").write_text(routerd_config(own))
        routerd_argv = [*self._routerd_argv(work, own.routerd_admin), "--workers", str(WORKERS)]
        rate, cpu = self.figures["connection_rate_workers"], self.figures["connection_cpu_workers"]

        def routerd_started() -> bool:
            return _pools_ready(own.routerd_admin) and bool(_worker_pids(own.routerd_admin))

        proxies: list[tuple[PathName, list[str], list[int], int]] = [
            (
                "haproxy",
                [tool["haproxy"], "-f", str(work / "haproxy.cfg"), "-db"],
                _haproxy_ports(own),
                own.haproxy_echo,
            ),
            ("routerd", routerd_argv, _routerd_ports(own), own.routerd_echo),
        ]
        for path, argv, listens, port in proxies:
            name = f"{path} {WORKERS} workers"
            try:
                proc = self.fleet.start(name, argv, ports=listens, cwd=ROOT)
                try:
                    processes = 1
                    if path == "routerd":
                        self.fleet.wait_until(
                            name,
                            proc,
                            routerd_started,
                            20,
                            "report every pool target ready and its workers started",
                        )
                        processes += len(_worker_pids(own.routerd_admin))
                    loadgen.rate(
                        port, kind="echo", concurrency=s.rate_concurrency, total=s.rate_total // 10,
                        seconds=s.rate_seconds, id_prefix=f"bench-ww{path[0]}-",
                    )  # fmt: skip  # warm-up
                    client_before = _children_cpu_s()
                    cpu_before = cpu_ns(proc.pid)  # its workers too: they are its children
                    result = loadgen.rate(
                        port, kind="echo", concurrency=s.rate_concurrency, total=s.rate_total,
                        seconds=s.rate_seconds, id_prefix=f"bench-w{path[0]}-",
                    )  # fmt: skip
                    if result.ok == 0:
                        raise ClientError(
                            f"no connection succeeded ({result.errors} errors, last: {result.last_error})"
                        )
                    proxy_us = (cpu_ns(proc.pid) - cpu_before) / 1000 / result.ok
                    details = result.details()
                    details["processes"] = processes
                    details["proxy_cpu_us_per_connection"] = round(proxy_us, 2)
                    details["client_cpu_us_per_connection"] = round(
                        (_children_cpu_s() - client_before) * 1e6 / result.ok, 2
                    )
                    rate.set(path, result.rate, details)
                    cpu.set(path, proxy_us)
                finally:
                    self.fleet.stop(proc)
            except (ClientError, FleetError, OSError, ValueError, subprocess.SubprocessError) as exc:
                _say(f"{WORKERS} workers of {path} failed: {exc}")
                for figure in (rate, cpu):
                    if path not in figure.values:
                        figure.fail(path, f"{type(exc).__name__}: {exc}")

    def instructions(self) -> None:
        """User-space instructions per connection, counted by callgrind (benchmarks/callgrind.py).

        A second HAProxy and a second routerd, each under callgrind and started in turn, listen on
        ports of their own (`Ports.with_proxy_ports`) in front of the fleet's backends, with the
        fleet's configurations otherwise; the fleet's proxies keep theirs, so the timed groups are
        untouched. A proxy that fails leaves the other's values measured.
        """
        ports, _ = self._need()
        work = self.workdir / "callgrind"
        work.mkdir(exist_ok=True)
        own = ports.with_proxy_ports(pick_ports(Ports.PROXY_COUNT))
        tool = {name: find_tool(name) or name for name in (*REQUIRED_TOOLS, *CALLGRIND_TOOLS)}
        maxconn = haproxy_maxconn(self.fd_limit)
        lua = str(self.workdir / "redirect.lua")
        (work / "haproxy.cfg").write_text(haproxy_config(own, lua_path=lua, maxconn=maxconn))
        (work / "routerd.xml").write_text(routerd_config(own))
        routerd_argv = self._routerd_argv(work, own.routerd_admin)
        proxies: list[tuple[PathName, list[str], list[int], dict[RateKind, int]]] = [
            (
                "haproxy",
                [tool["haproxy"], "-f", str(work / "haproxy.cfg"), "-db"],
                _haproxy_ports(own),
                {"echo": own.haproxy_echo, "mqtt3": own.haproxy_mqtt},
            ),
            (
                "routerd",
                routerd_argv,
                _routerd_ports(own),
                {"echo": own.routerd_echo, "mqtt3": own.routerd_mqtt},
            ),
        ]
        for path, argv, listens, kinds in proxies:
            name = f"{path} callgrind"
            started = time.monotonic()
            try:
                proc = self.fleet.start(
                    name,
                    valgrind_argv(tool["valgrind"], work, argv),
                    ports=listens,
                    timeout=VALGRIND_START_S,
                    cwd=ROOT,
                    stop_grace_s=VALGRIND_STOP_S,
                )
                try:
                    if path == "routerd":
                        self.fleet.wait_until(
                            name, proc, lambda: _pools_ready(own.routerd_admin), VALGRIND_START_S,
                            "report every pool target ready",
                        )  # fmt: skip
                    ready_s = round(time.monotonic() - started, 1)
                    _say(f"{name} ready after {ready_s:g} s")
                    control = Callgrind(tool["callgrind_control"], proc.pid, work)
                    control.instrument()
                    for kind, figure_name in _INSTRUCTION_KINDS:
                        per_thread, details = self._count_instructions(control, path, kind, kinds[kind])
                        value, details["counted"] = counted_value(per_thread, _COUNTED[path])
                        details["start_s"] = ready_s
                        self.figures[figure_name].set(path, value, details)
                finally:
                    self.fleet.stop(proc)
            except (ClientError, FleetError, OSError, ValueError, subprocess.SubprocessError) as exc:
                _say(f"instructions of {path} failed: {exc}")
                for _, figure_name in _INSTRUCTION_KINDS:
                    if path not in self.figures[figure_name].values:
                        self.figures[figure_name].fail(path, f"{type(exc).__name__}: {exc}")

    def _count_instructions(
        self, control: Callgrind, path: PathName, kind: RateKind, port: int
    ) -> tuple[dict[int, float], dict[str, object]]:
        """One kind of connection through a proxy under callgrind: a warm-up, then N1 and N2
        connections (`Settings.instructions_batches`), each batch between a zero and a dump.

        Returns:
            Thread -> instructions per connection, and details for the JSON file.

        Raises:
            ClientError: a batch did not finish every one of its connections (the count per
                connection divides by the number sent).
            FleetError: callgrind_control failed.
        """
        _, loadgen = self._need()
        s = self.settings

        def batch(tag: str, total: int) -> RateResult:
            # MQTT client ids "bench-i" + batch + path initial + "-" + counter: none repeats
            return loadgen.rate(
                port,
                kind=kind,
                concurrency=s.rate_concurrency,
                total=total,
                seconds=s.instructions_seconds,
                id_prefix=f"bench-i{tag}{path[0]}-",
            )

        warmup = batch(f"w{kind[0]}", s.instructions_warmup)
        if warmup.errors:
            _say(f"{kind} warm-up of {path} under callgrind: {warmup.errors} errors ({warmup.last_error})")
        dumps: list[dict[int, int]] = []
        rates: list[float] = []
        for number, total in enumerate(s.instructions_batches, 1):
            control.zero()
            result = batch(f"{number}{kind[0]}", total)
            dumps.append(control.dump())
            if result.ok != total:
                raise ClientError(
                    f"{kind} through {path} under callgrind: {result.ok} of {total} connections succeeded "
                    f"({result.errors} errors, {result.unfinished} unfinished, last: {result.last_error})"
                )
            rates.append(round(result.rate, 1))
        first, second = dumps
        per_thread = per_connection(first, second, counts=s.instructions_batches)
        details: dict[str, object] = {
            "batches": list(s.instructions_batches),
            "warmup": s.instructions_warmup,
            "warmup_errors": warmup.errors,
            "rates_under_callgrind": rates,
            "per_thread": {str(t): round(v) for t, v in per_thread.items()},
            "dumps": [{str(t): n for t, n in d.items()} for d in dumps],
        }
        return per_thread, details

    def artemis(self) -> None:
        """routerd against Artemis's own connection router: both redirect to the same two Artemis
        brokers (see benchmarks/artemis.py for what runs, benchmarks/README.md for how it compares).
        """
        ports, _ = self._need()
        group = ArtemisFleet(self.fleet, self.workdir / "artemis", log_level=self.log_level, say=_say)
        try:
            group.start()
            unsupported = self._artemis_redirects(group, ports)
            self._artemis_first_session(group, unsupported.get("core"))
            rss = self.figures["artemis_router_rss"]
            for path, pid in _router_pids(group).items():
                rss.set(path, rss_kib(pid) / 1024, {"rss_at_start_kib": group.setup.rss_at_start_kib[path]})
        finally:
            start = self.figures["artemis_router_start"]
            for path, took in _router_seconds(group).items():
                start.set(path, took)
            start.details["setup_s"] = {
                "artemis_create_template": round(group.setup.template_s, 2),
                "javac_first_session": round(group.setup.javac_s, 2),
                "targets_start_to_listen": round(group.setup.targets_s, 2),
                "routers_start_to_first_redirect": {p: round(t, 2) for p, t in group.setup.routers_s.items()},
                "total": round(group.setup.total_s, 2),
            }
            start.details["rss_at_end_kib"] = group.rss_kib()
            group.stop()

    def _artemis_redirects(self, group: ArtemisFleet, ports: Ports) -> dict[str, str]:
        """Check that both routers redirect each protocol, warm both up, measure HAProxy's proxied
        echo rate as the scale, then each protocol's redirect rate through Artemis, then routerd.

        Returns:
            Why routerd cannot be measured, per kind it does not redirect.

        Raises:
            ClientError: Artemis's router does not redirect one of the openings.
        """
        _, loadgen = self._need()
        s = self.settings
        artemis_ports = group.need_ports()
        routers: list[tuple[PathName, int]] = [
            ("artemis", artemis_ports.artemis_router),
            ("routerd", artemis_ports.routerd_redirect),
        ]
        unsupported: dict[str, str] = {}
        for kind, label, _, _ in _ARTEMIS_KINDS:
            for path, port in routers:
                answer = _probe_redirect(kind, port, group.opening)
                if answer is None:
                    continue
                if path == "artemis":
                    raise ClientError(f"Artemis's router answered the {label} opening with {answer!r}")
                unsupported[kind] = f"the mode=redirect acceptor answered the {label} opening with {answer!r}"
        warmup: dict[str, list[float]] = {}
        for kind, _, _, reason in _ARTEMIS_KINDS:
            for path, port in routers:
                if kind in unsupported and path == "routerd":
                    continue
                warmup[f"{path}/{kind}"] = self._warm_up(port, kind, reason, path, group.opening)
        haproxy_pid = self.pids["haproxy"]
        cpu_before = cpu_ns(haproxy_pid)
        reference = loadgen.rate(
            ports.haproxy_echo,
            kind="echo",
            concurrency=s.rate_concurrency,
            total=s.artemis_total,
            seconds=s.artemis_seconds,
        )
        details = reference.details()
        if reference.ok:
            details["proxy_cpu_us_per_connection"] = round(
                (cpu_ns(haproxy_pid) - cpu_before) / 1000 / reference.ok, 2
            )
        for kind, _, name, reason in _ARTEMIS_KINDS:
            figure = self.figures[name]
            figure.details["warmup_rates"] = {p: warmup.get(f"{p}/{kind}", []) for p, _ in routers}
            if reference.ok:
                figure.set("haproxy", reference.rate, {"what": "proxied 16 B echo", **details})
            else:
                figure.fail(
                    "haproxy", f"no echo connection through HAProxy succeeded ({reference.last_error})"
                )
            self._run_rates(
                figure,
                routers,
                kind=kind,
                reason=reason,
                total=s.artemis_total,
                seconds=s.artemis_seconds,
                id_tag=kind[0],
                unsupported=unsupported.get(kind),
                cpu_figure=self.figures[name.replace("_rate", "_cpu")],
                pids=_router_pids(group),
                core_opening=group.opening,
            )
            if kind in unsupported:
                self.figures[name.replace("_rate", "_cpu")].unsupported("routerd", unsupported[kind])
        return unsupported

    def _warm_up(
        self, port: int, kind: RateKind, reason: int, path: PathName, opening: CoreTemplate
    ) -> list[float]:
        """Untimed redirect rounds until the rate stops rising (or the warm-up's time is up).

        Returns:
            Each round's rate.
        """
        _, loadgen = self._need()
        s = self.settings
        rates: list[float] = []
        deadline = time.monotonic() + s.artemis_warmup_max_seconds
        while True:
            result = loadgen.rate(
                port,
                kind=kind,
                reason=reason,
                concurrency=s.rate_concurrency,
                total=s.artemis_total,
                seconds=s.artemis_warmup_round_seconds,
                id_prefix=f"bench-w{len(rates)}{kind[0]}{path[0]}-",
                core_opening=opening,
            )
            rates.append(round(result.rate, 1))
            warm = len(rates) >= WARMUP_MIN_ROUNDS and rates[-1] <= rates[-2] * (1 + WARMUP_PLATEAU)
            if warm or time.monotonic() >= deadline:
                _say(f"warm-up of {path}, {kind}: {', '.join(f'{r:,.0f}' for r in rates)} conn/s")
                return rates

    def _artemis_first_session(self, group: ArtemisFleet, unsupported: str | None) -> None:
        """A Java CORE client's createConnection -> started session: straight to a target, through
        Artemis's router, through routerd (both redirects followed with reconnectAttempts)."""
        s = self.settings
        artemis_ports = group.need_ports()
        paths: list[tuple[PathName, int]] = [
            ("direct", artemis_ports.targets[0]),
            ("artemis", artemis_ports.artemis_router),
            ("routerd", artemis_ports.routerd_redirect),
        ]
        figure = self.figures["artemis_first_session"]
        if unsupported is not None:
            figure.unsupported("routerd", f"no CORE redirect: {unsupported}")
            paths = paths[:2]
        result = run_first_session(
            group.classes,
            paths,
            warmup=s.first_session_warmup,
            rounds=s.first_session_rounds,
            log=self.fleet.log_path("first-session"),
        )
        for path, _ in paths:
            samples = result.ms.get(path, [])
            errors = result.errors.get(path, 0)
            details: dict[str, object] = {
                "rounds": len(samples),
                "warmup_rounds": s.first_session_warmup,
                "errors": errors,
                "ms": samples,
            }
            if errors or not samples:
                figure.details[path] = details
                figure.fail(path, f"{errors} connection(s) failed, last: {result.last_error.get(path, '')}")
            else:
                details["min_ms"], details["max_ms"] = min(samples), max(samples)
                figure.set(path, statistics.median(samples), details)


WORKERS: Final = 2
"""The workers group's processes (routerd `--workers`) and threads (HAProxy `nbthread`)."""

_INSTRUCTION_KINDS: Final[tuple[tuple[RateKind, str], ...]] = (
    ("echo", "instructions_echo"),
    ("mqtt3", "instructions_mqtt3"),
)
"""The instructions group's connections: loadgen kind and figure."""
_COUNTED: Final[dict[PathName, Counted]] = {"haproxy": "all", "routerd": "busiest"}
"""Which threads each proxy's instruction count takes (see `Counted`)."""


_ARTEMIS_KINDS: Final[tuple[tuple[RateKind, str, str, int], ...]] = (
    ("core", "CORE", "artemis_core_redirect_rate", 0),
    ("amqp", "AMQP", "artemis_amqp_redirect_rate", 0),
    ("mqtt5", "MQTT 5", "artemis_mqtt5_redirect_rate", USE_ANOTHER_SERVER),
)
"""The artemis group's redirects: loadgen kind, name, rate figure (its CPU figure is `_cpu`), and
the CONNACK reason expected (MQTT)."""


def _probe_redirect(kind: RateKind, port: int, opening: CoreTemplate) -> str | None:
    """None when the router at `port` redirects one opening of `kind`, else what it answered."""
    if kind == "core":
        answer = probe_core_redirect(port, opening.opening("bench-probe-core"))
        return None if answer.startswith(REDIRECTED) else answer
    if kind == "amqp":
        answer = probe_amqp_redirect(port, "bench-probe-amqp")
        return None if answer.startswith(REDIRECTED) else answer
    answer = probe_connack(port, "bench-probe-mqtt", "5")
    return None if answer == f"connack 0x{USE_ANOTHER_SERVER:02x}" else answer


def _router_pids(group: ArtemisFleet) -> dict[PathName, int]:
    return {path: group.pids[path] for path in ("artemis", "routerd") if path in group.pids}


def _router_seconds(group: ArtemisFleet) -> dict[PathName, float]:
    return {
        path: group.setup.routers_s[path] for path in ("artemis", "routerd") if path in group.setup.routers_s
    }


_PROXIES: Final[tuple[PathName, ...]] = ("haproxy", "routerd")


def _p50(result: PingResult) -> float:
    return result.p50_us


def _p99(result: PingResult) -> float:
    return result.p99_us


def _fail_missing(figures: dict[str, Figure], groups: Sequence[str], why: str) -> None:
    """Fail every value of these groups' figures that has neither a value nor a reason yet."""
    for figure in figures.values():
        if figure.group in groups:
            for path in figure.paths:
                if path not in figure.values:
                    figure.fail(path, why)


def _haproxy_ports(ports: Ports) -> list[int]:
    """What HAProxy listens on (`haproxy_config`)."""
    return [ports.haproxy_echo, ports.haproxy_iperf, ports.haproxy_mqtt, ports.haproxy_redirect]


def _routerd_ports(ports: Ports) -> list[int]:
    """What routerd listens on (`routerd_config`, and its admin API)."""
    return [
        ports.routerd_echo, ports.routerd_iperf, ports.routerd_mqtt, ports.routerd_redirect,
        ports.routerd_probe, ports.routerd_admin,
    ]  # fmt: skip


def _pools_ready(admin_port: int) -> bool:
    """Whether the routerd whose admin API is on `admin_port` reports every target of every
    router of `routerd_config` ready."""
    for name in ("echo", "iperf", "mqtt", "mqtt-probe"):
        status = admin_get(admin_port, f"/api/v1/routers/{name}")
        if not isinstance(status, dict):
            return False
        pool = status.get("pool")
        targets = pool.get("targets") if isinstance(pool, dict) else None
        if not isinstance(targets, list) or not targets:
            return False
        if not all(isinstance(t, dict) and t.get("state") == "ready" for t in targets):
            return False
    return True


def _worker_pids(admin_port: int) -> list[int]:
    """The PIDs of a routerd's running workers (its status document)."""
    try:
        status = admin_get(admin_port, "/api/v1/status")
    except (OSError, ValueError):
        return []
    workers = status.get("workers", []) if isinstance(status, dict) else []
    return [w["pid"] for w in workers if isinstance(w, dict) and isinstance(w.get("pid"), int)]


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (the load client's runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _echo_paths(ports: Ports) -> list[tuple[PathName, int]]:
    """Where direct, HAProxy and routerd take a connection to the echo backends."""
    return [("direct", ports.echo[0]), ("haproxy", ports.haproxy_echo), ("routerd", ports.routerd_echo)]


def _placeholder_ports() -> Ports:
    """A port plan for the in-process decision figures when nothing was started (`--only decision`)."""
    return Ports.from_numbers(range(20001, 20001 + Ports.COUNT))


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark routerd against HAProxy 2.6 on loopback (see benchmarks/README.md).",
    )
    parser.add_argument("--quick", action="store_true", help="tiny runs (the test suite's smoke run)")
    parser.add_argument(
        "--json", type=Path, default=None, help=f"where to write the figures (default {default_json_path()})"
    )
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_GROUPS),
        help=f"comma-separated groups to run, from {','.join(GROUPS)} (default all but artemis, which "
        "starts three Artemis JVMs: --only artemis, or add it to a list)",
    )
    parser.add_argument(
        "--routerd-log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="routerd's --log-level (default WARNING: no line per connection, as HAProxy without 'log')",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the work directory with the logs")
    parser.add_argument(
        "--event-log",
        action="store_true",
        help="run routerd with its routing event log on (routerd --event-log into the work directory): "
        "the event log's cost is this run's figures against a run without",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="repeat the whole measurement this many times (fresh processes each time) and report "
        "the medians; the goals are computed within each run (default 1)",
    )
    parser.add_argument(
        "--event-log-pairs",
        type=int,
        default=0,
        metavar="N",
        help="measure the event log's cost: N pairs of runs, without then with the event log (fresh "
        "processes each), interleaved so that the machine's drift hits both; prints each figure's "
        "change per pair and its median, and judges the log's goal (<= 5 %% of the short-connection "
        "rate)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 10:
        parser.error(f"--runs must be 1-10, got {args.runs}")
    if args.event_log_pairs and (args.runs > 1 or args.event_log):
        parser.error("--event-log-pairs runs its own pairs: it takes neither --runs nor --event-log")
    if not 0 <= args.event_log_pairs <= 20:
        parser.error(f"--event-log-pairs must be 1-20, got {args.event_log_pairs}")
    groups = [g.strip() for g in str(args.only).split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        parser.error(f"--only takes names from {','.join(GROUPS)}, got {args.only!r}")
    args.groups = [g for g in GROUPS if g in groups]
    return args


def _measure(
    groups: list[str],
    settings: Settings,
    figures: dict[str, Figure],
    workdir: Path,
    log_level: str,
    *,
    event_log: bool = False,
) -> int:
    """Start the fleet when needed, run the groups, stop the fleet; the idle connection count used."""
    with Fleet(workdir, say=_say) as fleet:
        bench = Bench(fleet, settings, figures, log_level=log_level, event_log=event_log)
        fleet_groups = [g for g in groups if g != "decision"]
        if fleet_groups:
            try:
                bench.start()
            except (ClientError, FleetError, OSError, subprocess.SubprocessError) as exc:
                _say(f"could not start: {exc}")
                _fail_missing(figures, fleet_groups, f"the fleet did not start: {exc}")
                groups = [g for g in groups if g not in fleet_groups]
        for group in groups:
            bench.run_group(group)
        return bench.idle_connections


EVENT_LOG_GOAL: Final = -0.05
"""The event log's goal (issue 11): it costs at most 5 % of routerd's short-connection rate."""


def pair_changes(pairs: Sequence[tuple[dict[str, Figure], dict[str, Figure]]]) -> dict[str, list[float]]:
    """Per figure with a routerd value in every pair: routerd's value with the event log over its
    value without, minus 1, for each pair (-0.156: 15.6 % less)."""
    changes: dict[str, list[float]] = {}
    for name in pairs[0][0]:
        values = [(off[name].values.get("routerd"), on[name].values.get("routerd")) for off, on in pairs]
        if all(a is not None and b is not None and a > 0 for a, b in values):
            changes[name] = [b / a - 1 for a, b in values]  # type: ignore[operator]  # checked above
    return changes


def _report_pairs(
    pairs: list[tuple[dict[str, Figure], dict[str, Figure]]],
    args: argparse.Namespace,
    json_path: Path,
    workdir: Path,
    started_at: datetime.datetime,
    *,
    interrupted: bool,
) -> int:
    """Print and write the event log's cost from the pairs; the exit status."""
    changes = pair_changes(pairs)
    lines = [f"the event log's cost, {len(pairs)} pair(s) of runs (off, then on; fresh processes each):"]
    lines.append(f"{'figure':<44}  {'unit':<6}  {'off':>9}  {'on':>9}  change (median of pairs; each pair)")
    for name, each in changes.items():
        off = statistics.median(p[0][name].values["routerd"] or 0.0 for p in pairs)
        on = statistics.median(p[1][name].values["routerd"] or 0.0 for p in pairs)
        figure = pairs[0][0][name]
        lines.append(
            f"{figure.title:<44}  {figure.unit:<6}  {off:>9,.1f}  {on:>9,.1f}  "
            f"{statistics.median(each):+.1%} ({', '.join(f'{c:+.1%}' for c in each)})"
        )
    rate = changes.get("connection_rate")
    median = None if rate is None else statistics.median(rate)
    met = None if median is None else median >= EVENT_LOG_GOAL
    verdict = "not measured" if median is None else "met" if met else "NOT met"
    lines.append(
        f"goal: the event log costs <= {-EVENT_LOG_GOAL:.0%} of the short-connection rate: "
        f"{'-' if median is None else f'{median:+.1%}'}: {verdict}"
    )
    print("\n".join(lines), flush=True)
    failures = [f for pair in pairs for run in pair for figure in run.values() for f in figure.failures()]
    doc = {
        "schema": "router-bench-event-log-pairs/1",
        "started_at": started_at.isoformat(timespec="seconds"),
        "groups": args.groups,
        "quick": bool(args.quick),
        "interrupted": interrupted,
        "versions": _versions(),
        "pairs": [
            {
                side: {n: f.to_json() for n, f in run.items() if f.measured}
                for side, run in zip(("off", "on"), pair, strict=True)
            }
            for pair in pairs
        ],
        "changes": {name: [round(c, 4) for c in each] for name, each in changes.items()},
        "goal": {"bound": EVENT_LOG_GOAL, "median": median, "met": met},
        "failures": failures,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"JSON: {json_path}", flush=True)
    return _finish(workdir, failures, interrupted=interrupted, keep=args.keep_logs)


def _finish(workdir: Path, failures: list[str], *, interrupted: bool, keep: bool) -> int:
    """Keep the work directory (failures, an interruption, `--keep-logs`) or delete it, name the
    failures; the exit status."""
    if failures or interrupted or keep:
        _say(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    for failure in failures:
        _say(f"FAILED {failure}")
    if interrupted:
        return 130
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the exit status is 0, 1 (a measurement failed), 2 (a tool is missing)."""
    args = _parse_args(argv)
    settings = QUICK if args.quick else FULL
    groups: list[str] = args.groups
    needs_fleet = any(g != "decision" for g in groups)
    missing = [t for t in REQUIRED_TOOLS if find_tool(t) is None] if needs_fleet else []
    if missing:
        print(f"benchmarks: missing {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    missing = [t for t in CALLGRIND_TOOLS if find_tool(t) is None] if "instructions" in groups else []
    if missing:
        print(f"benchmarks: missing {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    missing = missing_artemis() if "artemis" in groups else []
    if missing:
        print(f"benchmarks: missing {', '.join(missing)}: {ARTEMIS_HINT}", file=sys.stderr)
        return 2
    json_path: Path = args.json or default_json_path()
    runs: list[dict[str, Figure]] = []
    workdir = Path(tempfile.mkdtemp(prefix="router-bench-"))
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.monotonic()
    load_start = _loadavg()
    interrupted = False
    idle_connections = settings.idle_connections
    pairs: list[tuple[dict[str, Figure], dict[str, Figure]]] = []
    with stop_signals_interrupt():  # Ctrl-C and SIGTERM both unwind through the fleet's stop
        try:
            if args.event_log_pairs:
                for number in range(1, args.event_log_pairs + 1):
                    pair = (new_figures(), new_figures())
                    for figures_of, on in zip(pair, (False, True), strict=True):
                        _say(f"pair {number} of {args.event_log_pairs}: event log {'on' if on else 'off'}")
                        run_dir = workdir / f"pair{number}-{'on' if on else 'off'}"
                        run_dir.mkdir()
                        _measure(groups, settings, figures_of, run_dir, args.routerd_log_level, event_log=on)
                    pairs.append(pair)
            else:
                for number in range(1, args.runs + 1):
                    if args.runs > 1:
                        _say(f"run {number} of {args.runs}")
                    runs.append(new_figures())
                    run_dir = workdir / f"run{number}" if args.runs > 1 else workdir
                    run_dir.mkdir(exist_ok=True)
                    idle_connections = _measure(
                        groups, settings, runs[-1], run_dir, args.routerd_log_level, event_log=args.event_log
                    )
                    if args.runs > 1:
                        print(f"run {number} of {args.runs}:\n{format_table(runs[-1])}\n", flush=True)
        except KeyboardInterrupt:
            interrupted = True
            _say("interrupted; every process started was stopped")
    if pairs:
        return _report_pairs(pairs, args, json_path, workdir, started_at, interrupted=interrupted)
    figures = median_figures(runs) if len(runs) > 1 else runs[0] if runs else new_figures()
    goals = goal_results(runs)
    failures = [f for run in runs for figure in run.values() for f in figure.failures()]
    doc: dict[str, object] = {
        "schema": "router-bench/1",
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "quick": bool(args.quick),
        "groups": args.groups,
        "interrupted": interrupted,
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_start": load_start,
            "loadavg_end": _loadavg(),
            "note": "load client, proxies and backends share these CPUs (one CPU for the latency "
            "group); compare figures of one run, not across machines",
        },
        "versions": _versions(groups),
        "settings": {**asdict(settings), "idle_connections": idle_connections, "event_log": args.event_log},
        "figures": {name: f.to_json() for name, f in figures.items() if f.measured},
        "runs": len(runs),
        "per_run": [{name: f.to_json() for name, f in run.items() if f.measured} for run in runs]
        if len(runs) > 1
        else [],
        "goals": goals,
        "failures": failures,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    if len(runs) > 1:
        print(f"medians of {len(runs)} runs:")
    print(format_table(figures))
    print(f"\n{format_goals(goals)}")
    print(
        f"\n{'quick run; ' if args.quick else ''}{os.cpu_count()} CPUs shared by load client, proxies and "
        f"backends; load average {load_start[0]} at start, {_loadavg()[0]} at end. JSON: {json_path}",
        flush=True,
    )
    return _finish(workdir, failures, interrupted=interrupted, keep=args.keep_logs)


if __name__ == "__main__":
    raise SystemExit(main())
