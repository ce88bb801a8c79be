"""Many idle MQTT sessions held through routerd: are any lost, and what does each one cost?

    .venv/bin/python -m benchmarks.studies.idle_sessions [--sessions 10000] [--minutes 3] [--keepalive 30]
                                                         [--fast-path | --trio-path] [--json FILE]

Quoted by benchmarks/README.md ("Idle MQTT sessions").

One run starts, on 127.0.0.1 ports below 32768 chosen at run time, three mosquitto brokers
(`max_connections -1`, `sys_interval 1`, RLIMIT_NOFILE raised to the hard limit with `prlimit`) and
routerd with one MQTT acceptor whose router keys on CLIENT_ID with CONSISTENT_HASH over the three
brokers (soft RLIMIT_NOFILE raised to the hard limit the same way). Then, from this process (one
epoll loop, raw non-blocking sockets, sources spread over 127.0.0.2-.9), it:

1. opens and closes a few warm-up sessions (lazily allocated pools are not charged to the others),
   reads routerd's RSS and descriptor count (the baseline);
2. opens N MQTT 3.1.1 sessions (distinct client ids, clean session, keep-alive K) at a bounded
   rate, each one CONNECT -> CONNACK 0x00; the time from `connect()` to CONNACK is the connect
   latency; an open that fails (refused, closed, no CONNACK within 10 s, CONNACK != 0) is counted
   as failed, not retried;
3. holds them for M minutes: every session sends PINGREQ every K/2 s and must get PINGRESP before
   its next one is due; a missing PINGRESP, a close, a reset or any unexpected packet makes the
   session lost (it is not reopened);
4. waits for the last PINGRESPs, reads the per-broker session counts (mosquitto's
   `$SYS/broker/clients/connected`, and the established connections on each broker port from
   /proc/net/tcp), sends DISCONNECT on every session and closes it, SIGTERMs routerd (it drains;
   its exit status must be 0) and stops the brokers, all by PID.

It prints a table (and writes it as JSON with --json) and exits 0 when every session opened and
none was lost and routerd exited 0, else 1 (2 for a missing tool). The whole run is bounded by
--timeout (default: ramp bound + hold + 3 minutes); Ctrl-C, SIGTERM and the timeout stop every
process it started. This is a benchmark to run by hand, not a test: the full run takes minutes.

`--trio-path` adds `fastPath=false` to the acceptor, which keeps every connection on the trio
path; the default acceptor (plain TCP, no TLS, PROXY protocol, user store or TTL) qualifies for
the fast path (docs/operations.md, "The fast path"). The path actually taken is checked with
`router.core.plan.fast_path_serves`, as routerd decides it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

from benchmarks.clients import find_tool, split_packet
from benchmarks.configs import mosquitto_config
from benchmarks.fleet import (
    Fleet,
    FleetError,
    admin_get,
    cpu_ns,
    fd_count,
    pick_ports,
    raise_fd_limit,
    rss_kib,
)
from keys import mqtt
from router.config import load_config_text
from router.core.plan import fast_path_serves

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType

__all__ = [
    "CONNACK_TIMEOUT_S",
    "OPEN",
    "PINGREQ",
    "HardTimeout",
    "Session",
    "SessionClient",
    "add_run_options",
    "broker_config",
    "established_on",
    "keep_outputs",
    "log_summary",
    "main",
    "nofile_limits",
    "result_header",
    "routerd_idle_config",
    "routerd_ready",
    "serves_fast_path",
]

ROOT: Final = Path(__file__).resolve().parents[2]
BROKERS: Final = 3
ROUTER: Final = "mqtt"
ACCEPTOR: Final = "mqtt"
CHECK_PERIOD_MS: Final = 5000
"""routerd's TCP health probes of the brokers: rare enough not to blur the broker counts."""
CONNACK_TIMEOUT_S: Final = 10.0
"""An open without CONNACK after this long failed (routerd's handshake timeout is also 10 s)."""
SETTLE_S: Final = 1.0
"""Pause before reading an RSS, so that routerd has finished with the last connection."""
SAMPLE_EVERY_S: Final = 10.0
"""How often routerd's RSS and descriptor count are sampled during the hold."""
SOURCES: Final = tuple(f"127.0.0.{n}" for n in range(2, 10))
"""Source addresses of the sessions, round robin (loopback aliases need no setup)."""
IP_BIND_ADDRESS_NO_PORT: Final = 24
"""Linux socket option (<linux/in.h>): bind() leaves the port to connect(), per 4-tuple."""
FD_BASE_MARGIN: Final = 64
"""Descriptors routerd needs beyond two per session (listeners, epoll, logs, probes, admin)."""
NODE_IDS: Final = ("brokerone", "brokertwo", "brokerthree")
"""The brokers' node ids. CONSISTENT_HASH is Artemis's: one point per node at the FNV-1a hash of its
node id, a key goes to the greatest point <= its hash (else the smallest). Ids that differ only in
their last character land next to each other: with broker-1..3 the shares are 38 / 0.4 / 61 %.
These three divide the ring 32 / 26 / 42 %."""

CONNACK: Final = 0x20
PUBLISH: Final = 0x30
PINGREQ: Final = b"\xc0\x00"
PINGRESP: Final = 0xD0

# Session states.
CONNECTING: Final = 0
WAIT_CONNACK: Final = 1
OPEN: Final = 2
FAILED: Final = 3
"""Never opened: refused, closed, no CONNACK in time, or CONNACK with a non-zero code."""
LOST: Final = 4
"""Opened, then closed, reset, or a PINGRESP missing."""
CLOSED: Final = 5
"""Closed by us at the end."""

_STATE_NAMES: Final = {
    CONNECTING: "connecting",
    WAIT_CONNACK: "waiting for CONNACK",
    OPEN: "open",
    FAILED: "failed",
    LOST: "lost",
    CLOSED: "closed",
}


class HardTimeout(Exception):
    """The run exceeded --timeout."""


def _say(text: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"idle-sessions {stamp}: {text}", file=sys.stderr, flush=True)


# -- MQTT 3.1.1 packets ---------------------------------------------------------------------------


# -- the session client ---------------------------------------------------------------------------


class Session:
    """One MQTT session of the client."""

    __slots__ = ("client_id", "connected_at", "index", "ping_sent", "rx", "sock", "started", "state")

    def __init__(self, index: int, client_id: str, sock: socket.socket, started: float) -> None:
        self.index = index
        self.client_id = client_id
        self.sock = sock
        self.started = started
        self.state = CONNECTING
        self.connected_at = 0.0
        self.ping_sent = 0.0
        """When the outstanding PINGREQ was sent; 0.0 when none is outstanding."""
        self.rx = bytearray()


class SessionClient:
    """N MQTT sessions to one address in one epoll loop: open at a bounded rate, ping, close."""

    def __init__(
        self, port: int, *, keepalive_s: int, id_prefix: str, connack_timeout_s: float = CONNACK_TIMEOUT_S
    ) -> None:
        self.port = port
        self.connack_timeout_s = connack_timeout_s
        """An open without CONNACK after this long failed."""
        self.keepalive_s = keepalive_s
        self.ping_interval_s = keepalive_s / 2
        self.id_prefix = id_prefix
        self.epoll = select.epoll()
        self.by_fd: dict[int, Session] = {}
        self.sessions: list[Session] = []
        self.pending = 0
        """Sessions connecting or waiting for their CONNACK."""
        self.open = 0
        self.outstanding = 0
        """Open sessions with a PINGREQ not answered yet."""
        self.pinging = True
        self.opened = 0
        self.failed: collections.Counter[str] = collections.Counter()
        self.lost: collections.Counter[str] = collections.Counter()
        self.lost_at: list[float] = []
        self.connect_ms: list[float] = []
        self.ping_ms: list[float] = []
        self.pings_sent = 0
        self.pongs = 0
        self._deadlines: collections.deque[tuple[float, Session]] = collections.deque()
        """CONNACK deadlines, in time order (sessions start in time order)."""
        self._due: collections.deque[tuple[float, Session]] = collections.deque()
        """Next PINGREQ of each open session, in time order (the interval is the same for all)."""

    # -- opening --

    def open_one(self, index: int, now: float) -> None:
        """Start opening session `index` (its client id is the prefix plus the index)."""
        client_id = f"{self.id_prefix}{index}"
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        except OSError as exc:
            self.failed[f"socket: {exc.strerror}"] += 1
            return
        session = Session(index, client_id, sock, now)
        self.sessions.append(session)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((SOURCES[index % len(SOURCES)], 0))
            code = sock.connect_ex(("127.0.0.1", self.port))
        except OSError as exc:
            session.state = FAILED
            self.failed[f"connect: {exc.strerror}"] += 1
            sock.close()
            return
        if code not in (0, 115):  # 115 = EINPROGRESS
            session.state = FAILED
            self.failed[f"connect: {os.strerror(code)}"] += 1
            sock.close()
            return
        self.pending += 1
        self.by_fd[sock.fileno()] = session
        self.epoll.register(sock.fileno(), select.EPOLLOUT)
        self._deadlines.append((now + self.connack_timeout_s, session))

    def ramp(
        self, count: int, *, rate: float, max_pending: int, deadline: float, start_index: int = 0
    ) -> float:
        """Open `count` sessions, at most `rate` per second and `max_pending` at a time; returns
        the seconds it took. Sessions still opening at `deadline` fail."""
        start = time.monotonic()
        index = 0
        while (index < count or self.pending) and time.monotonic() < deadline:
            now = time.monotonic()
            allowed = min(count, int((now - start) * rate) + 1)
            while index < allowed and self.pending < max_pending:
                self.open_one(start_index + index, now)
                index += 1
            self.step(0.005 if index < count else 0.05)
        for session in self.sessions:
            if session.state in (CONNECTING, WAIT_CONNACK):
                self._fail(session, "still opening at the ramp deadline")
        if index < count:
            self.failed["not started before the ramp deadline"] += count - index
        return time.monotonic() - start

    # -- the loop --

    def run_until(self, deadline: float, tick: Callable[[float], None] | None = None) -> None:
        """Serve every session (pings, answers) until `deadline`; `tick(now)` after each poll."""
        while (now := time.monotonic()) < deadline:
            nxt = self._due[0][0] if self._due else deadline
            self.step(max(0.0, min(nxt - now, deadline - now, 0.25)))
            if tick is not None:
                tick(time.monotonic())

    def settle(self) -> None:
        """Stop sending PINGREQ; wait (at most one ping interval) for the outstanding PINGRESPs."""
        self.pinging = False
        deadline = time.monotonic() + self.ping_interval_s + 1.0
        while self.outstanding and time.monotonic() < deadline:
            self.step(0.05)
        for session in self.sessions:
            if session.state == OPEN and session.ping_sent:
                self._drop(session, "no PINGRESP by the end of the hold")

    def step(self, timeout: float) -> None:
        """One poll, its events, then the timers."""
        for fd, events in self.epoll.poll(timeout):
            session = self.by_fd.get(fd)
            if session is not None:
                self._on_event(session, events)
        self._timers(time.monotonic())

    def _timers(self, now: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, session = deadlines.popleft()
            if session.state in (CONNECTING, WAIT_CONNACK):
                self._fail(session, f"no CONNACK within {self.connack_timeout_s:g} s")
        due = self._due
        while due and due[0][0] <= now:
            _, session = due.popleft()
            if session.state != OPEN:
                continue
            if session.ping_sent:
                self._drop(session, f"no PINGRESP within {self.ping_interval_s:g} s")
                continue
            if self.pinging and self.send_ping(session, now):
                due.append((now + self.ping_interval_s, session))

    def send_ping(self, session: Session, now: float) -> bool:
        """Send PINGREQ on an open session (its PINGRESP is expected); False when that failed and
        the session was dropped."""
        try:
            sent = session.sock.send(PINGREQ)
        except OSError as exc:
            self._drop(session, f"PINGREQ send: {exc.strerror or exc}")
            return False
        if sent != len(PINGREQ):
            self._drop(session, "PINGREQ send: the send buffer is full")
            return False
        session.ping_sent = now
        self.outstanding += 1
        self.pings_sent += 1
        return True

    def _on_event(self, session: Session, events: int) -> None:
        sock = session.sock
        if session.state == CONNECTING:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self._fail(session, f"connect: {os.strerror(code)}")
                return
            try:
                sock.send(mqtt.encode_connect(session.client_id, keepalive_s=self.keepalive_s))
            except OSError as exc:
                self._fail(session, f"CONNECT send: {exc.strerror or exc}")
                return
            session.state = WAIT_CONNACK
            self.epoll.modify(sock.fileno(), select.EPOLLIN)
            return
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError as exc:
            self._drop(session, f"recv: {exc.strerror or exc}")
            return
        if not data:
            self._drop(session, "closed by the peer")
            return
        session.rx += data
        while session.rx and session.state in (WAIT_CONNACK, OPEN):
            try:
                packet = split_packet(session.rx)
            except ValueError as exc:
                self._drop(session, f"malformed packet: {exc}")
                return
            if packet is None:
                return
            kind, body, used = packet
            del session.rx[:used]
            self._on_packet(session, kind, body)

    def _on_packet(self, session: Session, kind: int, body: bytes) -> None:
        now = time.monotonic()
        if kind == CONNACK and session.state == WAIT_CONNACK and len(body) == 2:
            if body[1] != 0:
                self._fail(session, f"CONNACK 0x{body[1]:02x}")
                return
            session.state = OPEN
            session.connected_at = now
            self.pending -= 1
            self.open += 1
            self.opened += 1
            self.connect_ms.append((now - session.started) * 1000)
            self._due.append((now + self.ping_interval_s, session))
            self.on_open(session, now)
        elif kind == PINGRESP and session.state == OPEN and session.ping_sent and not body:
            self.ping_ms.append((now - session.ping_sent) * 1000)
            session.ping_sent = 0.0
            self.outstanding -= 1
            self.pongs += 1
        else:
            what = f"unexpected packet 0x{kind:02x} ({len(body)} bytes) while {_STATE_NAMES[session.state]}"
            self._drop(session, what)

    # -- hooks for a subclass (benchmarks/studies/storm.py reconnects) --

    def on_open(self, session: Session, now: float) -> None:
        """Session `session` got its CONNACK 0x00 at `now` (nothing here)."""

    def on_end(self, session: Session, reason: str, *, was_open: bool) -> None:
        """Session `session` ended without us asking: lost (`was_open`) or failed to open (nothing
        here)."""

    # -- ending sessions --

    def _release(self, session: Session) -> None:
        fd = session.sock.fileno()
        if fd >= 0:
            self.by_fd.pop(fd, None)
            with contextlib.suppress(OSError, ValueError):
                self.epoll.unregister(fd)
        session.sock.close()
        if session.state in (CONNECTING, WAIT_CONNACK):
            self.pending -= 1
        elif session.state == OPEN:
            self.open -= 1
            if session.ping_sent:
                self.outstanding -= 1

    def _fail(self, session: Session, reason: str) -> None:
        self._release(session)
        session.state = FAILED
        self.failed[reason] += 1
        self.on_end(session, reason, was_open=False)

    def _drop(self, session: Session, reason: str) -> None:
        """The session ended without us asking: lost if it was open, else failed."""
        if session.state != OPEN:
            self._fail(session, reason)
            return
        self._release(session)
        session.state = LOST
        self.lost[reason] += 1
        self.lost_at.append(time.monotonic())
        self.on_end(session, reason, was_open=True)

    def close_all(self) -> None:
        """DISCONNECT and close every session still open (and every one still opening)."""
        for session in self.sessions:
            if session.state == OPEN:
                with contextlib.suppress(OSError):
                    session.sock.send(mqtt.MQTT_DISCONNECT)
                self._release(session)
                session.state = CLOSED
            elif session.state in (CONNECTING, WAIT_CONNACK):
                self._fail(session, "still opening at the end")
        self.epoll.close()


# -- measuring routerd and the brokers --------------------------------------------------------------


def nofile_limits(pid: int) -> tuple[int, int]:
    """A process's RLIMIT_NOFILE (soft, hard), from /proc/PID/limits."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise FleetError(f"pid {pid} reports no 'Max open files'")


def established_on(ports: Sequence[int]) -> dict[int, int]:
    """Established TCP connections whose local port is one of `ports` (/proc/net/tcp, IPv4).

    Counted once per (local, remote) pair: a big table read in several chunks can repeat lines.
    """
    wanted = set(ports)
    seen: set[tuple[str, str]] = set()
    counts = dict.fromkeys(ports, 0)
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "01" and (fields[1], fields[2]) not in seen:
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in wanted:
                    seen.add((fields[1], fields[2]))
                    counts[port] += 1
    return counts


def sys_clients_connected(port: int, *, listen_s: float = 2.5) -> int | None:
    """mosquitto's `$SYS/broker/clients/connected`, not counting the client that asks.

    Connects directly to the broker, subscribes to the topic and takes the last value published
    within `listen_s` (mosquitto republishes it within `sys_interval` 1 s after a change, so the
    last value counts this client too). None when nothing arrived.
    """
    deadline = time.monotonic() + listen_s
    topic = mqtt.SYS_CLIENTS_CONNECTED.encode()
    value: int | None = None
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(mqtt.encode_connect(f"idle-sessions-sys-{port}", keepalive_s=30))
        sock.sendall(mqtt.encode_subscribe(1, mqtt.SYS_CLIENTS_CONNECTED))
        data = bytearray()
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
            while (packet := split_packet(data)) is not None:
                kind, body, used = packet
                del data[:used]
                if kind & 0xF0 == PUBLISH:
                    length = int.from_bytes(body[:2], "big")
                    offset = 2 + length + (2 if kind & 0x06 else 0)
                    if body[2 : 2 + length] == topic:
                        value = int(body[offset:])
        with contextlib.suppress(OSError):
            sock.sendall(mqtt.MQTT_DISCONNECT)
    return None if value is None else value - 1


# -- configurations -------------------------------------------------------------------------------


def broker_config(port: int, *, notices: bool = False) -> str:
    """mosquitto for this benchmark: the run's configuration without a connection limit, with a
    `$SYS` tree refreshed every second (the per-broker session count is read from it); `notices`
    also logs every connection and session ("New client connected from … as ID", after the
    epoch second: mosquitto's default `log_timestamp`)."""
    extra = "log_type notice\n" if notices else ""
    return mosquitto_config(port) + "max_connections -1\nsys_interval 1\n" + extra


def routerd_idle_config(
    broker_ports: Sequence[int],
    acceptor_port: int,
    *,
    fast_path: bool,
    connector_params: str = "",
    check_period_ms: int = CHECK_PERIOD_MS,
    cache_timeout_ms: int | None = None,
) -> str:
    """routerd's broker.xml: one MQTT proxy acceptor, a CLIENT_ID router with CONSISTENT_HASH over
    the brokers (static pool, TCP probes every `check_period_ms`); `fastPath=false` keeps the
    acceptor on the trio path. `connector_params` (e.g. `connectRate=500`) go on every connector;
    `cache_timeout_ms` adds a key cache with that expire-after-access (none by default)."""
    params = f";{connector_params}" if connector_params else ""
    connectors = "\n".join(
        f'      <connector name="broker-{n}">tcp://127.0.0.1:{port}?nodeId={node_id}{params}</connector>'
        for n, (port, node_id) in enumerate(zip(broker_ports, NODE_IDS, strict=True), 1)
    )
    cache = (
        ""
        if cache_timeout_ms is None
        else f"\n        <cache>\n          <timeout>{cache_timeout_ms}</timeout>\n        </cache>"
    )
    refs = "\n".join(
        f"            <connector-ref>broker-{n}</connector-ref>" for n in range(1, len(broker_ports) + 1)
    )
    opt_out = "" if fast_path else ";fastPath=false"
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by benchmarks/studies/idle_sessions.py. -->
<configuration xmlns="urn:activemq">
  <core xmlns="urn:activemq:core">
    <connectors>
{connectors}
    </connectors>
    <acceptors>
      <acceptor name="{ACCEPTOR}">tcp://127.0.0.1:{acceptor_port}?router={ROUTER};protocols=MQTT;mode=proxy{opt_out}</acceptor>
    </acceptors>
    <connection-routers>
      <connection-router name="{ROUTER}">
        <key-type>CLIENT_ID</key-type>{cache}
        <policy name="CONSISTENT_HASH"/>
        <pool>
          <check-period>{check_period_ms}</check-period>
          <quorum-size>1</quorum-size>
          <static-connectors>
{refs}
          </static-connectors>
        </pool>
      </connection-router>
    </connection-routers>
  </core>
</configuration>
"""


def serves_fast_path(config_text: str, acceptor: str = ACCEPTOR) -> bool:
    """Whether routerd serves `acceptor` of this configuration on its fast path (as routerd decides)."""
    config = load_config_text(config_text, "idle_sessions.xml")
    served = next(a for a in config.acceptors if a.name == acceptor)
    key_type = config.router(served.router).key_type
    return fast_path_serves(served, key_type, config.connection_ttl.ttl_ms(served))


# -- the run --------------------------------------------------------------------------------------


def _percentile(values: Sequence[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _per_session(kib: int, sessions: int) -> float | None:
    """RSS growth per session open when it was read (sessions already lost are not counted)."""
    return round(kib / sessions, 2) if sessions else None


def routerd_ready(admin_port: int) -> bool:
    """Whether routerd's admin API reports every broker of the router ready."""
    status = admin_get(admin_port, f"/api/v1/routers/{ROUTER}")
    if not isinstance(status, dict):
        return False
    pool = status.get("pool")
    targets = pool.get("targets") if isinstance(pool, dict) else None
    if not isinstance(targets, list) or len(targets) != BROKERS:
        return False
    return all(isinstance(t, dict) and t.get("state") == "ready" for t in targets)


def log_summary(path: Path, limit: int = 8) -> list[str]:
    """routerd's WARNING/ERROR lines and tracebacks' last lines, with digits folded, most frequent first."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    counts: collections.Counter[str] = collections.Counter()
    for line in lines:
        if any(
            level in line
            for level in (" WARNING ", " ERROR ", " CRITICAL ", "Error: ", "Error(", "Warning: ")
        ):
            counts[re.sub(r"\d+", "#", line.split(" ", 2)[-1])[:200]] += 1
    return [f"{n} x {text}" for text, n in counts.most_common(limit)]


class _Sampler:
    """routerd's RSS and descriptors every `SAMPLE_EVERY_S` during the hold."""

    def __init__(self, pid: int, start: float) -> None:
        self.pid = pid
        self.start = start
        self.next = start
        self.samples: list[tuple[float, int, int]] = []

    def __call__(self, now: float) -> None:
        if now >= self.next:
            self.next = now + SAMPLE_EVERY_S
            with contextlib.suppress(OSError, FleetError):
                self.samples.append((round(now - self.start, 1), rss_kib(self.pid), fd_count(self.pid)))


def result_header(schema: str, module: str, argv: Sequence[str] | None) -> dict[str, object]:
    """The first members of a session study's JSON: its schema, when it started and its command."""
    return {
        "schema": schema,
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([f"python -m {module}", *(argv if argv is not None else sys.argv[1:])]),
    }


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a study that runs MQTT sessions through routerd (this one, storm.py): which
    data path, where the JSON goes, routerd's log level, the run's bound, the work directory."""
    path = parser.add_mutually_exclusive_group()
    path.add_argument("--fast-path", dest="fast_path", action="store_true", default=True, help="(default)")
    path.add_argument("--trio-path", dest="fast_path", action="store_false", help="acceptor fastPath=false")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--routerd-log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument("--timeout", type=float, default=None, help="hard bound of the whole run in s")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work directory")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.idle_sessions",
        description="Hold many idle MQTT sessions through routerd (see benchmarks/README.md).",
    )
    parser.add_argument("--sessions", type=int, default=10_000, help="sessions to open (default 10000)")
    parser.add_argument("--minutes", type=float, default=3.0, help="how long to hold them (default 3)")
    parser.add_argument("--keepalive", type=int, default=30, help="MQTT keep-alive K in s; PINGREQ every K/2")
    parser.add_argument("--rate", type=float, default=500.0, help="sessions opened per second (default 500)")
    parser.add_argument("--max-pending", type=int, default=200, help="opens in flight at most (default 200)")
    parser.add_argument(
        "--warmup", type=int, default=100, help="sessions opened and closed first (default 100)"
    )
    add_run_options(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.sessions <= 100_000:
        parser.error("--sessions must be 1-100000")
    if not 0 < args.minutes <= 60:
        parser.error("--minutes must be in (0, 60]")
    if not 4 <= args.keepalive <= 3600:
        parser.error("--keepalive must be 4-3600")
    if not 1 <= args.rate <= 20_000 or not 1 <= args.max_pending <= 5_000 or not 0 <= args.warmup <= 1_000:
        parser.error("--rate 1-20000, --max-pending 1-5000, --warmup 0-1000")
    args.ramp_bound_s = args.sessions / args.rate * 3 + 30
    if args.timeout is None:
        args.timeout = args.ramp_bound_s + args.minutes * 60 + args.keepalive + 180
    return args


def keep_outputs(
    result: dict[str, object],
    json_path: Path | None,
    workdir: Path,
    *,
    keep_logs: bool,
    say: Callable[[str], None],
) -> None:
    """Write `result` as JSON to `json_path` (if given), and keep the work directory (`keep_logs`:
    a failed run or --keep-logs) or delete it."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        say(f"JSON: {json_path}")
    if keep_logs:
        say(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _on_signal(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def _on_alarm(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise HardTimeout


def _stop_routerd(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, float]:
    """SIGTERM routerd and wait for its drain; (exit status or None if it did not exit, seconds)."""
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout), time.monotonic() - started
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started


def run(args: argparse.Namespace, workdir: Path, result: dict[str, object]) -> None:
    """Start the fleet, open, hold and close the sessions; fill `result` as it goes."""
    mosquitto = find_tool("mosquitto")
    prlimit = find_tool("prlimit")
    if mosquitto is None or prlimit is None:
        raise FleetError("mosquitto and prlimit are needed: apt-get install -y mosquitto util-linux")
    fd_limit = raise_fd_limit()
    _, hard = nofile_limits(os.getpid())
    wrap = [prlimit, f"--nofile={hard}:{hard}", "--"]
    figures: dict[str, object] = {}
    result["figures"] = figures
    result["fd_limit"] = {"client_soft": fd_limit, "hard": hard}
    need = 2 * args.sessions + FD_BASE_MARGIN
    if need > hard:
        _say(
            f"WARNING: {args.sessions} proxied sessions need {2 * args.sessions} descriptors in routerd "
            f"(client side + broker side) plus its own; the hard limit is {hard}"
        )
    with Fleet(workdir, say=_say) as fleet:
        *broker_ports, acceptor_port, admin_port = pick_ports(BROKERS + 2)
        brokers: list[subprocess.Popen[bytes]] = []
        for n, port in enumerate(broker_ports, 1):
            conf = workdir / f"mosquitto-{n}.conf"
            conf.write_text(broker_config(port))
            brokers.append(fleet.start(f"mosquitto-{n}", [*wrap, mosquitto, "-c", str(conf)], ports=[port]))
        config_text = routerd_idle_config(broker_ports, acceptor_port, fast_path=args.fast_path)
        (workdir / "routerd.xml").write_text(config_text)
        fast = serves_fast_path(config_text)
        result["path"] = "fast" if fast else "trio"
        result["path_requested"] = "fast" if args.fast_path else "trio"
        argv = [*wrap, sys.executable, "-m", "router", "--config", str(workdir / "routerd.xml")]
        argv += ["--admin", f"127.0.0.1:{admin_port}", "--log-level", args.routerd_log_level]
        routerd = fleet.start("routerd", argv, ports=[acceptor_port, admin_port], cwd=ROOT)
        pid = routerd.pid
        fleet.wait_until("routerd", routerd, lambda: routerd_ready(admin_port), 20, "report 3 brokers ready")
        soft_r, hard_r = nofile_limits(pid)
        result["routerd"] = {"pid": pid, "nofile_soft": soft_r, "nofile_hard": hard_r}
        for n, proc in enumerate(brokers, 1):
            result[f"mosquitto-{n}_nofile"] = list(nofile_limits(proc.pid))
        _say(
            f"routerd pid {pid} ({'fast' if fast else 'trio'} path, RLIMIT_NOFILE {soft_r}/{hard_r}), "
            f"brokers on {broker_ports}, acceptor {acceptor_port}; logs in {workdir}"
        )

        if args.warmup:
            warm = SessionClient(acceptor_port, keepalive_s=args.keepalive, id_prefix="idle-warmup-")
            warm.ramp(
                args.warmup, rate=args.rate, max_pending=args.max_pending, deadline=time.monotonic() + 30
            )
            warm.close_all()
            if warm.opened != args.warmup:
                _say(f"warm-up: only {warm.opened} of {args.warmup} opened: {dict(warm.failed)}")
        time.sleep(SETTLE_S * 2)
        rss_base, fds_base = rss_kib(pid), fd_count(pid)
        figures["routerd_rss_baseline_kib"] = rss_base
        figures["routerd_fds_baseline"] = fds_base
        _say(
            f"baseline: routerd RSS {rss_base} KiB, {fds_base} descriptors; opening {args.sessions} sessions"
        )

        client = SessionClient(acceptor_port, keepalive_s=args.keepalive, id_prefix="idle-")
        cpu_ramp0 = cpu_ns(pid) / 1e9
        ramp_s = client.ramp(
            args.sessions,
            rate=args.rate,
            max_pending=args.max_pending,
            deadline=time.monotonic() + args.ramp_bound_s,
        )
        cpu_ramp1 = cpu_ns(pid) / 1e9
        opened = client.opened
        figures["sessions_requested"] = args.sessions
        figures["sessions_opened"] = opened
        figures["sessions_failed_to_open"] = sum(client.failed.values())
        figures["failed_reasons"] = dict(client.failed)
        figures["ramp_s"] = round(ramp_s, 2)
        figures["connect_ms_p50"] = _round(_percentile(client.connect_ms, 0.50), 2)
        figures["connect_ms_p99"] = _round(_percentile(client.connect_ms, 0.99), 2)
        figures["connect_ms_max"] = _round(max(client.connect_ms, default=None), 2)
        figures["routerd_cpu_s_ramp"] = round(cpu_ramp1 - cpu_ramp0, 2)
        _say(f"ramp: {opened} opened in {ramp_s:.1f} s, failed {dict(client.failed)}")
        settle_until = time.monotonic() + SETTLE_S
        client.run_until(settle_until)
        rss_after, fds_after, open_after = rss_kib(pid), fd_count(pid), client.open
        figures["sessions_open_after_ramp"] = open_after
        figures["routerd_rss_after_ramp_kib"] = rss_after
        figures["routerd_fds_after_ramp"] = fds_after
        figures["rss_per_session_kib"] = _per_session(rss_after - rss_base, open_after)
        _say(
            f"after the ramp: routerd RSS {rss_after} KiB, {fds_after} descriptors; "
            f"holding {args.minutes:g} min"
        )

        hold_start = time.monotonic()
        cpu_hold0 = cpu_ns(pid) / 1e9
        sampler = _Sampler(pid, hold_start)
        client.run_until(hold_start + args.minutes * 60, sampler)
        cpu_hold1 = cpu_ns(pid) / 1e9
        hold_s = time.monotonic() - hold_start
        client.settle()
        rss_end, fds_end = rss_kib(pid), fd_count(pid)
        figures["hold_s"] = round(hold_s, 1)
        figures["routerd_cpu_s_hold"] = round(cpu_hold1 - cpu_hold0, 2)
        figures["routerd_rss_end_kib"] = rss_end
        figures["routerd_fds_end"] = fds_end
        figures["rss_per_session_end_kib"] = _per_session(rss_end - rss_base, client.open)
        figures["hold_samples_s_rss_kib_fds"] = sampler.samples
        figures["sessions_lost"] = sum(client.lost.values())
        figures["lost_reasons"] = dict(client.lost)
        figures["lost_seconds_into_hold"] = [round(t - hold_start, 1) for t in client.lost_at[:20]]
        figures["sessions_open_at_end"] = client.open
        figures["pings_sent"] = client.pings_sent
        figures["pingresp_received"] = client.pongs
        figures["ping_ms_p50"] = _round(_percentile(client.ping_ms, 0.50), 2)
        figures["ping_ms_p99"] = _round(_percentile(client.ping_ms, 0.99), 2)
        figures["ping_ms_max"] = _round(max(client.ping_ms, default=None), 2)
        _say(f"hold over: {client.open} open, lost {dict(client.lost)}; reading the brokers' counts")

        established = established_on(broker_ports)
        distribution: dict[str, dict[str, int | None]] = {}
        for n, port in enumerate(broker_ports, 1):
            sys_count: int | None
            try:
                sys_count = sys_clients_connected(port)
            except (OSError, ValueError) as exc:
                _say(f"mosquitto-{n}: cannot read {mqtt.SYS_CLIENTS_CONNECTED}: {exc}")
                sys_count = None
            distribution[f"broker-{n} ({NODE_IDS[n - 1]})"] = {
                "sys_clients_connected": sys_count,
                "established": established[port],
            }
        figures["per_broker"] = distribution

        _say(f"closing the {client.open} open sessions (DISCONNECT, close)")
        client.close_all()
        closed_deadline = time.monotonic() + 30
        while time.monotonic() < closed_deadline and fd_count(pid) > fds_base + 5:
            time.sleep(0.2)
        figures["routerd_fds_after_close"] = fd_count(pid)
        figures["routerd_rss_after_close_kib"] = rss_kib(pid)
        code, drain_s = _stop_routerd(routerd, 40.0)
        figures["routerd_exit_status"] = code
        figures["routerd_drain_s"] = round(drain_s, 2)
        fleet.stop(routerd)
        _say(f"routerd exited with {code} after {drain_s:.1f} s")


def _table(result: dict[str, object]) -> str:
    figures = result.get("figures")
    f: dict[str, object] = figures if isinstance(figures, dict) else {}

    routerd_info = result.get("routerd")
    routerd: dict[str, object] = routerd_info if isinstance(routerd_info, dict) else {}

    def get(name: str) -> str:
        value = f.get(name)
        return "-" if value is None else str(value)

    rows: list[tuple[str, str]] = [
        ("path", f"{result.get('path', '-')} (requested {result.get('path_requested', '-')})"),
        ("sessions requested", get("sessions_requested")),
        ("sessions opened", get("sessions_opened")),
        ("sessions failed to open",
         f"{get('sessions_failed_to_open')} {f.get('failed_reasons') or ''}".strip()),
        ("sessions lost during the hold", f"{get('sessions_lost')} {f.get('lost_reasons') or ''}".strip()),
        ("sessions open after the ramp / at the end",
         f"{get('sessions_open_after_ramp')} / {get('sessions_open_at_end')}"),
        ("ramp-up time (s)", get("ramp_s")),
        ("connect latency p50 / p99 / max (ms)", f"{get('connect_ms_p50')} / {get('connect_ms_p99')} / "
         f"{get('connect_ms_max')}"),
        ("hold (s)", get("hold_s")),
        ("PINGREQ sent / PINGRESP received", f"{get('pings_sent')} / {get('pingresp_received')}"),
        ("ping round trip p50 / p99 / max (ms)", f"{get('ping_ms_p50')} / {get('ping_ms_p99')} / "
         f"{get('ping_ms_max')}"),
        ("routerd RSS baseline (KiB)", get("routerd_rss_baseline_kib")),
        ("routerd RSS after ramp (KiB)", get("routerd_rss_after_ramp_kib")),
        ("routerd RSS at end of hold (KiB)", get("routerd_rss_end_kib")),
        ("RSS per open session, after ramp (KiB)", get("rss_per_session_kib")),
        ("RSS per open session, end of hold (KiB)", get("rss_per_session_end_kib")),
        ("routerd RLIMIT_NOFILE soft / hard",
         f"{routerd.get('nofile_soft', '-')} / {routerd.get('nofile_hard', '-')}"),
        ("routerd descriptors baseline / after ramp / end / after close",
         f"{get('routerd_fds_baseline')} / {get('routerd_fds_after_ramp')} / {get('routerd_fds_end')} / "
         f"{get('routerd_fds_after_close')}"),
        ("routerd CPU during ramp (s)", get("routerd_cpu_s_ramp")),
        ("routerd CPU during hold (s)", get("routerd_cpu_s_hold")),
    ]  # fmt: skip
    per_broker = f.get("per_broker")
    if isinstance(per_broker, dict):
        for name, counts in per_broker.items():
            if isinstance(counts, dict):
                rows.append(
                    (
                        f"{name} sessions ($SYS clients/connected; established)",
                        f"{counts.get('sys_clients_connected')}; {counts.get('established')}",
                    )
                )
    rows.append(
        (
            "routerd exit status after SIGTERM (drain s)",
            f"{get('routerd_exit_status')} ({get('routerd_drain_s')})",
        )
    )
    rows.append(("result", str(result.get("verdict", "-"))))
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'figure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 0 (all opened, none lost, clean drain), 1, or 2 (tool missing)."""
    args = _parse_args(argv)
    if find_tool("mosquitto") is None or find_tool("prlimit") is None:
        print(
            "idle_sessions: mosquitto and prlimit are needed (apt-get install -y mosquitto)", file=sys.stderr
        )
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="router-idle-"))
    started = time.monotonic()
    result: dict[str, object] = {
        **result_header("router-idle-sessions/1", "benchmarks.studies.idle_sessions", argv),
        "settings": {
            "sessions": args.sessions,
            "minutes": args.minutes,
            "keepalive_s": args.keepalive,
            "ping_interval_s": args.keepalive / 2,
            "rate_per_s": args.rate,
            "max_pending": args.max_pending,
            "warmup": args.warmup,
            "timeout_s": round(args.timeout),
            "routerd_log_level": args.routerd_log_level,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
    }
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous_alarm = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    error: str | None = None
    try:
        run(args, workdir, result)
    except HardTimeout:
        error = f"hard timeout of {args.timeout:.0f} s reached; every process started was stopped"
    except KeyboardInterrupt:
        error = "interrupted; every process started was stopped"
    except (FleetError, OSError, subprocess.SubprocessError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_alarm)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    figures = result.get("figures")
    f: dict[str, object] = figures if isinstance(figures, dict) else {}
    ok = (
        error is None
        and f.get("sessions_opened") == args.sessions
        and f.get("sessions_lost") == 0
        and f.get("routerd_exit_status") == 0
    )
    result["verdict"] = (
        "OK: every session opened, none lost, routerd drained (exit 0)"
        if ok
        else (
            f"FAILED: {error}" if error else "FAILED: see the sessions failed/lost and routerd's exit status"
        )
    )
    result["error"] = error
    result["routerd_log"] = log_summary(workdir / "routerd.log")
    result["mosquitto_log"] = [
        line for n in range(1, BROKERS + 1) for line in log_summary(workdir / f"mosquitto-{n}.log", 3)
    ]
    result["duration_s"] = round(time.monotonic() - started, 1)
    result["machine"] = {
        **(result["machine"] if isinstance(result["machine"], dict) else {}),
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(_table(result))
    for name in ("routerd_log", "mosquitto_log"):
        lines = result[name]
        if isinstance(lines, list):
            for line in lines:
                print(f"{name.replace('_', ' ')}: {line}")
    keep_outputs(result, args.json, workdir, keep_logs=args.keep_logs or not ok, say=_say)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
