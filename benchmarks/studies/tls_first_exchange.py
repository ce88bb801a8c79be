"""TLS first exchange: a paho-mqtt client's TLS connect and first round trips, through routerd,
through HAProxy 2.6 and direct to mosquitto.

    .venv/bin/python -m benchmarks.studies.tls_first_exchange [--quick] [--rounds N] [--connects N]
                                                             [--no-pin] [--json PATH] [--keep-logs]

Quoted by docs/protocols.md ("TLS termination"), README.md ("Benchmarks") and
benchmarks/README.md ("TLS first exchange").

One run starts, on 127.0.0.1 ports between 20000 and 32000 chosen at run time, with one server
certificate (trustme, for 127.0.0.1):

    mosquitto  a plain listener (the proxies' backend) and a TLS listener (the direct path);
               `set_tcp_nodelay true`, without which mosquitto's own TLS listener holds its CONNACK
               40 ms behind its session tickets (Nagle against the client's delayed ACK)
    haproxy    TLS termination (`bind ... ssl crt`), mode tcp, the plain listener as its server
    routerd    TLS termination (acceptor `sslEnabled=true`), key SOURCE_IP, FIRST_ELEMENT over
               the same plain listener

Then a client in this process (paho-mqtt 2, MQTT 3.1.1, TLS 1.3, a new connection each time, its
socket as paho leaves it: Nagle on) times, for every connection:

    handshake       TCP connect and TLS handshake (paho's connect() returns; its CONNECT is sent)
    connack         end of the handshake -> CONNACK: the first exchange, which a delayed ACK hits
    first_exchange  all of it: handshake, CONNECT/CONNACK, SUBSCRIBE/SUBACK, then its own QoS 0
                    PUBLISH received back

Rounds visit the three paths in turn (the order rotated each round), each pinned to the idlest CPU
with mosquitto and the proxy, as benchmarks.run's latency figure is (benchmarks/README.md), unless
`--no-pin`: then the client, the proxy and mosquitto run on any CPU, in parallel where they can. A
figure is the median over all connections of a path. Printed: the medians, the ratios
routerd/HAProxy, routerd/direct and HAProxy/direct, and the goal (routerd's first exchange at most
`GOAL_RATIO` times HAProxy's). The JSON goes to `--json` (default
$TMPDIR/router-bench/tls-first-exchange.json). Exit status: 0; 1 when a path failed; 2 when
haproxy or mosquitto is missing; 130 when interrupted. Every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import paho.mqtt.client as mqtt
import trustme
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from benchmarks.clients import ClientError, find_tool
from benchmarks.configs import mosquitto_config
from benchmarks.fleet import (
    Fleet,
    FleetError,
    admin_get,
    cpu_ns,
    pick_ports,
    pinned,
    quietest_cpu,
    stop_signals_interrupt,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = [
    "FULL",
    "GOAL_RATIO",
    "PATHS",
    "PHASES",
    "QUICK",
    "Exchange",
    "Settings",
    "Summary",
    "haproxy_tls_config",
    "main",
    "mosquitto_tls_config",
    "routerd_tls_config",
    "summarize",
    "time_first_exchange",
]

ROOT: Final = Path(__file__).resolve().parents[2]
TOOLS: Final = ("haproxy", "mosquitto")
INSTALL_HINT: Final = "run ./benchmarks/bench, which installs them, or: apt-get install -y haproxy mosquitto"
PathName = Literal["direct", "haproxy", "routerd"]
PATHS: Final[tuple[PathName, ...]] = ("direct", "haproxy", "routerd")
PHASES: Final = ("handshake", "connack", "first_exchange")
GOAL_RATIO: Final = 1.5
"""routerd's median first exchange may take at most this many times HAProxy's."""
CLIENT_TIMEOUT_S: Final = 5.0
"""Bound of each step of one client connection."""
ROUTER: Final = "tls"
"""The name of routerd's one router (its admin API path)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How big a run is."""

    rounds: int
    """Visits of each path; the order of the paths is rotated each round."""
    connects: int
    """Connections per path and round."""


FULL: Final = Settings(rounds=7, connects=30)
QUICK: Final = Settings(rounds=2, connects=5)


@dataclass(frozen=True, slots=True, kw_only=True)
class Exchange:
    """One client connection's times, in seconds."""

    handshake_s: float
    """TCP connect and TLS handshake."""
    connack_s: float
    """End of the handshake to the CONNACK."""
    first_exchange_s: float
    """Start to the client's own publish received back."""


# --- configurations ------------------------------------------------------------------------------


def mosquitto_tls_config(plain_port: int, tls_port: int, cert: Path, key: Path) -> str:
    """mosquitto with a plain and a TLS listener on 127.0.0.1, anonymous, no persistence.

    `set_tcp_nodelay true`: without it mosquitto's TLS listener sends its session tickets, then
    holds the CONNACK behind them until the client's delayed ACK (40 ms). `user root` keeps a
    broker started as root from dropping privileges before it reads the key (the work directory
    is private); as any other user the line has no effect.
    """
    return (
        "user root\nset_tcp_nodelay true\n"
        + mosquitto_config(plain_port)
        + f"listener {tls_port} 127.0.0.1\ncertfile {cert}\nkeyfile {key}\n"
    )


def haproxy_tls_config(port: int, backend_port: int, key_store: Path) -> str:
    """HAProxy terminating TLS on 127.0.0.1:port (key and certificate in one PEM file), mode tcp,
    one thread, in front of the plain listener."""
    return f"""global
    maxconn 1000
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend tls
    bind 127.0.0.1:{port} ssl crt {key_store}
    default_backend mqtt
backend mqtt
    server mosquitto 127.0.0.1:{backend_port}
"""


def routerd_tls_config(port: int, backend_port: int, key_store: Path) -> str:
    """routerd terminating TLS on 127.0.0.1:port in proxy mode, key SOURCE_IP, FIRST_ELEMENT over
    the plain listener (no sniffing: like HAProxy, it connects once the handshake is done)."""
    acceptor = f"tcp://127.0.0.1:{port}?router={ROUTER};mode=proxy;sslEnabled=true;keyStorePath={key_store}"
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors><connector name="mosquitto">tcp://127.0.0.1:{backend_port}</connector></connectors>
  <acceptors><acceptor name="tls">{acceptor}</acceptor></acceptors>
  <connection-routers>
    <connection-router name="{ROUTER}">
      <key-type>SOURCE_IP</key-type><policy name="FIRST_ELEMENT"/>
      <pool><check-period>1000</check-period><quorum-timeout>0</quorum-timeout>
        <static-connectors><connector-ref>mosquitto</connector-ref></static-connectors></pool>
    </connection-router>
  </connection-routers>
</core></configuration>
"""


# --- the client ----------------------------------------------------------------------------------


def time_first_exchange(port: int, context: ssl.SSLContext, *, timeout: float = CLIENT_TIMEOUT_S) -> Exchange:
    """One paho-mqtt client over TLS on 127.0.0.1:port: connect, CONNACK, subscribe, its own QoS 0
    publish back; then DISCONNECT and close.

    Raises:
        ClientError: the connection failed, the CONNACK refused it, or a step took over `timeout`.
    """
    client_id = f"tls-bench-{uuid.uuid4().hex[:12]}"
    topic = f"bench/tls/{client_id}"
    marks: dict[str, float] = {}
    refused: list[int] = []

    def on_connect(
        _c: mqtt.Client, _u: object, _f: mqtt.ConnectFlags, rc: ReasonCode, _p: Properties | None
    ) -> None:
        marks.setdefault("connack", time.perf_counter())
        if rc.value != 0:
            refused.append(rc.value)

    def on_subscribe(*_args: object) -> None:
        marks.setdefault("suback", time.perf_counter())

    def on_message(_c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
        if message.topic == topic:
            marks.setdefault("message", time.perf_counter())

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv311
    )
    client.tls_set_context(context)
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    try:
        started = time.perf_counter()
        try:
            client.connect("127.0.0.1", port)  # TCP, the TLS handshake, then the CONNECT is sent
        except (OSError, ssl.SSLError) as exc:
            raise ClientError(f"connect to 127.0.0.1:{port} failed: {exc}") from exc
        handshaken = time.perf_counter()
        _loop_until(client, marks, "connack", timeout)
        if refused:
            raise ClientError(f"CONNACK refused the connection (return code {refused[0]})")
        client.subscribe(topic, 0)
        _loop_until(client, marks, "suback", timeout)
        client.publish(topic, b"x", 0)
        _loop_until(client, marks, "message", timeout)
    finally:
        client.disconnect()
        sock = client.socket()
        if sock is not None:
            sock.close()
    return Exchange(
        handshake_s=handshaken - started,
        connack_s=marks["connack"] - handshaken,
        first_exchange_s=marks["message"] - started,
    )


def _loop_until(client: mqtt.Client, marks: dict[str, float], mark: str, timeout: float) -> None:
    """Run paho's loop in this thread until a callback set `mark`."""
    deadline = time.perf_counter() + timeout
    while mark not in marks:
        rc = client.loop(timeout=min(0.5, timeout))
        if rc is not MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise ClientError(f"connection lost before the {mark} ({rc.name})")
        if time.perf_counter() > deadline:
            raise ClientError(f"no {mark} within {timeout:g} s")


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """What a run found: medians, their ratios, and the goal."""

    medians_ms: dict[str, dict[str, float]]
    """Per path (that did not fail), per phase: the median over its connections, in ms."""
    ratios: dict[str, dict[str, float]]
    """Per pair ("routerd/haproxy", "routerd/direct", "haproxy/direct"), per phase."""
    goal_ratio: float | None
    """routerd/HAProxy of the first exchange; None when either failed."""
    server_cpu_ms: dict[str, float]
    """Per path: CPU time per connection of the process that ends TLS (mosquitto direct, else the
    proxy), in ms."""

    @property
    def goal_met(self) -> bool | None:
        return None if self.goal_ratio is None else self.goal_ratio <= GOAL_RATIO

    def to_json(self) -> dict[str, object]:
        goal = {
            "rule": f"routerd's median first exchange <= {GOAL_RATIO} x HAProxy's",
            "ratio": self.goal_ratio,
            "met": self.goal_met,
        }
        return {
            "medians_ms": self.medians_ms,
            "ratios": self.ratios,
            "server_cpu_ms_per_connection": self.server_cpu_ms,
            "goal": goal,
        }


def summarize(samples: dict[PathName, list[Exchange]], server_cpu_ms: dict[PathName, float]) -> Summary:
    """Medians in ms per path and phase, the ratios of the medians, the goal's ratio, and the CPU
    time per connection of the process that ends TLS."""
    medians: dict[str, dict[str, float]] = {}
    for path, exchanges in samples.items():
        if exchanges:
            medians[path] = {
                phase: round(statistics.median(getattr(e, f"{phase}_s") for e in exchanges) * 1000, 3)
                for phase in PHASES
            }
    ratios: dict[str, dict[str, float]] = {}
    for over, under in (("routerd", "haproxy"), ("routerd", "direct"), ("haproxy", "direct")):
        if over in medians and under in medians:
            ratios[f"{over}/{under}"] = {
                phase: round(medians[over][phase] / medians[under][phase], 2)
                for phase in PHASES
                if medians[under][phase] > 0
            }
    goal_ratio = ratios.get("routerd/haproxy", {}).get("first_exchange")
    return Summary(
        medians_ms=medians,
        ratios=ratios,
        goal_ratio=goal_ratio,
        server_cpu_ms={str(path): cpu for path, cpu in server_cpu_ms.items()},
    )


def format_summary(summary: Summary) -> str:
    """The medians (ms) and ratios as a table, and the goal in one line."""
    lines = [
        f"{'median, ms':<18}" + "".join(f"{phase:>16}" for phase in PHASES) + f"{'TLS end CPU/conn':>18}"
    ]
    for path in PATHS:
        row = summary.medians_ms.get(path)
        cells = [f"{row[phase]:>16.2f}" if row else f"{'failed':>16}" for phase in PHASES]
        cpu = summary.server_cpu_ms.get(path)
        lines.append(f"{path:<18}" + "".join(cells) + (f"{cpu:>18.2f}" if cpu is not None else ""))
    for name, values in summary.ratios.items():
        lines.append(f"{name:<18}" + "".join(f"{values.get(p, float('nan')):>15.2f}x" for p in PHASES))
    verdict = {True: "met", False: "NOT met", None: "not measured"}[summary.goal_met]
    shown = "" if summary.goal_ratio is None else f" ({summary.goal_ratio:.2f}x)"
    lines.append(f"goal: routerd's median first exchange <= {GOAL_RATIO}x HAProxy's: {verdict}{shown}")
    return "\n".join(lines)


class _Run:
    """The processes of one run and their ports."""

    def __init__(self, fleet: Fleet, work: Path) -> None:
        self.fleet, self.work = fleet, work
        plain, direct, haproxy, routerd, admin = pick_ports(5)
        self.ports: dict[PathName, int] = {"direct": direct, "haproxy": haproxy, "routerd": routerd}
        self.admin = admin
        self.plain = plain
        self.pids: dict[PathName, int] = {}
        self.mosquitto_pid = 0
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        self.key_store, self.cert, self.key = work / "server.pem", work / "cert.pem", work / "key.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(self.key_store))
        leaf.cert_chain_pems[0].write_to_path(str(self.cert))
        leaf.private_key_pem.write_to_path(str(self.key))
        self.ca_file = work / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))

    def start(self, log_level: str) -> None:
        work, tool = self.work, {name: find_tool(name) or name for name in TOOLS}
        (work / "mosquitto.conf").write_text(
            mosquitto_tls_config(self.plain, self.ports["direct"], self.cert, self.key)
        )
        (work / "haproxy.cfg").write_text(
            haproxy_tls_config(self.ports["haproxy"], self.plain, self.key_store)
        )
        (work / "routerd.xml").write_text(
            routerd_tls_config(self.ports["routerd"], self.plain, self.key_store)
        )
        mosquitto = self.fleet.start(
            "mosquitto",
            [tool["mosquitto"], "-c", str(work / "mosquitto.conf")],
            ports=[self.plain, self.ports["direct"]],
        )
        self.mosquitto_pid = mosquitto.pid
        haproxy = self.fleet.start(
            "haproxy",
            [tool["haproxy"], "-f", str(work / "haproxy.cfg"), "-db"],
            ports=[self.ports["haproxy"]],
        )
        self.pids["haproxy"] = haproxy.pid
        argv = [sys.executable, "-m", "router", "--config", str(work / "routerd.xml")]
        argv += ["--admin", f"127.0.0.1:{self.admin}", "--log-level", log_level]
        routerd = self.fleet.start("routerd", argv, ports=[self.ports["routerd"], self.admin], cwd=ROOT)
        self.pids["routerd"] = routerd.pid
        self.fleet.wait_until("routerd", routerd, self._routerd_ready, 20, "report its target ready")

    def _routerd_ready(self) -> bool:
        status = admin_get(self.admin, f"/api/v1/routers/{ROUTER}")
        pool = status.get("pool") if isinstance(status, dict) else None
        targets = pool.get("targets") if isinstance(pool, dict) else None
        return bool(targets) and all(isinstance(t, dict) and t.get("state") == "ready" for t in targets or [])

    def context(self) -> ssl.SSLContext:
        """The clients' context: the run's CA, host name checked, TLS 1.3 (as negotiated)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        return context

    def measure(
        self, settings: Settings, say: Callable[[str], None], *, pin: bool = True
    ) -> tuple[dict[PathName, list[Exchange]], dict[PathName, float], dict[PathName, str]]:
        """Every round: the exchanges per path; the CPU time per connection, in ms, of the process
        that ends TLS (mosquitto direct, else the proxy); why a path failed (not visited again).
        With `pin`, each visit runs on one CPU (the client, mosquitto and the proxy)."""
        samples: dict[PathName, list[Exchange]] = {path: [] for path in PATHS}
        cpu_ns_used: dict[PathName, int] = dict.fromkeys(PATHS, 0)
        failed: dict[PathName, str] = {}
        context = self.context()
        for index in range(settings.rounds):
            order = PATHS[index % len(PATHS) :] + PATHS[: index % len(PATHS)]
            for path in order:
                if path in failed:
                    continue
                server = self.pids.get(path, self.mosquitto_pid)
                pids = [self.mosquitto_pid, *([self.pids[path]] if path in self.pids else [])]
                try:
                    time_first_exchange(self.ports[path], context)  # untimed: a warm-up per visit
                    with pinned(pids, quietest_cpu()) if pin else contextlib.nullcontext():
                        before = cpu_ns(server)
                        samples[path] += [
                            time_first_exchange(self.ports[path], context) for _ in range(settings.connects)
                        ]
                        cpu_ns_used[path] += cpu_ns(server) - before
                except ClientError as exc:
                    failed[path] = str(exc)
                    say(f"{path} failed: {exc}")
            say(f"round {index + 1} of {settings.rounds} done")
        cpu_ms = {
            path: round(used / 1e6 / len(samples[path]), 3)
            for path, used in cpu_ns_used.items()
            if samples[path]
        }
        return samples, cpu_ms, failed


def default_json_path() -> Path:
    """Where the JSON goes without --json: the system's temporary directory, never the tree."""
    return Path(tempfile.gettempdir()) / "router-bench" / "tls-first-exchange.json"


def _say(text: str) -> None:
    print(f"tls-bench: {text}", file=sys.stderr, flush=True)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.tls_first_exchange",
        description="A paho-mqtt client's TLS connect and first exchange: routerd, HAProxy, direct.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny run (the test suite's smoke run)")
    parser.add_argument("--rounds", type=int, help=f"rounds per path (1-50; default {FULL.rounds})")
    parser.add_argument(
        "--connects", type=int, help=f"connections per path and round (1-500; default {FULL.connects})"
    )
    parser.add_argument("--json", type=Path, help=f"where the figures go (default {default_json_path()})")
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the client, mosquitto and the proxy on every CPU"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--routerd-log-level", default="WARNING", help="routerd's --log-level (default WARNING)"
    )
    args = parser.parse_args(argv)
    for name, high in (("rounds", 50), ("connects", 500)):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= high:
            parser.error(f"--{name} must be between 1 and {high}, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the exit status (module docstring)."""
    args = _parse_args(argv)
    base = QUICK if args.quick else FULL
    settings = Settings(rounds=args.rounds or base.rounds, connects=args.connects or base.connects)
    missing = [t for t in TOOLS if find_tool(t) is None]
    if missing:
        print(f"benchmarks: missing {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="router-tls-bench-"))
    started_at = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    samples: dict[PathName, list[Exchange]] = {path: [] for path in PATHS}
    cpu_ms: dict[PathName, float] = {}
    failed: dict[PathName, str] = {}
    interrupted = False
    with stop_signals_interrupt():  # SIGTERM unwinds through the fleet's stop as Ctrl-C does
        try:
            with Fleet(workdir, say=_say) as fleet:
                run = _Run(fleet, workdir)
                run.start(args.routerd_log_level)
                samples, cpu_ms, failed = run.measure(settings, _say, pin=not args.no_pin)
        except FleetError as exc:
            failed = dict.fromkeys(PATHS, str(exc))
            _say(f"FAILED to start: {exc}")
        except KeyboardInterrupt:
            interrupted = True
            _say("interrupted; every process started was stopped")
    summary = summarize(samples, cpu_ms)
    doc = {
        "schema": "router-bench-tls-first-exchange/1",
        "started_at": started_at.isoformat(timespec="seconds"),
        "quick": bool(args.quick),
        "settings": {**asdict(settings), "pinned": not args.no_pin},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0]},
        "versions": {
            "openssl": ssl.OPENSSL_VERSION,
            "python": sys.version.split()[0],
            "paho_mqtt": getattr(mqtt, "__version__", "unknown"),
        },
        **summary.to_json(),
        "samples_ms": {
            path: {phase: [round(getattr(e, f"{phase}_s") * 1000, 3) for e in exchanges] for phase in PHASES}
            for path, exchanges in samples.items()
        },
        "failures": failed,
        "interrupted": interrupted,
    }
    json_path: Path = args.json or default_json_path()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(format_summary(summary))
    size = f"{'quick run; ' if args.quick else ''}{settings.rounds} rounds x {settings.connects} connections"
    print(f"{size} per path; load average {load_start:.2f} at start. JSON: {json_path}", flush=True)
    if failed or interrupted or args.keep_logs:
        _say(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
