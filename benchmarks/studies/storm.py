"""The reconnect storm: kill -9 one of three brokers under thousands of MQTT sessions, and see how
routerd (without limits, with a per-broker connect rate) and HAProxy 2.6 (maxconn + queue, and its
frontend rate limit) spread the orphans' reconnects over the survivors; then bring the broker back
with routerd's slow start and `routerctl rebalance`, and show the ramp (issue 33 point 5).

    .venv/bin/python -m benchmarks.studies.storm [--sessions N] [--rate R] [--slow-start MS]
                                                 [--fast-path | --trio-path] [--quick]
                                                 [--scenarios routerd,routerd-rate,haproxy,haproxy-rate]
                                                 [--json FILE] [--timeout S] [--keep-logs]

Quoted by benchmarks/README.md ("The reconnect storm").

Each scenario starts its own fleet on 127.0.0.1 ports below 32768 (benchmarks/fleet.py): three
mosquitto brokers (node ids brokerone/brokertwo/brokerthree, `max_connections -1`, RLIMIT_NOFILE
raised with `prlimit`, every session logged with its epoch second: `log_type notice`) and one
proxy in front of them. The client is this process: one epoll loop (idle_sessions.py's
`SessionClient`, sources 127.0.0.2-.9) holding N MQTT 3.1.1 sessions (clean session, keep-alive
300 s: no PINGREQ of its own during a scenario, so the proxies' CPU is the storm's).

1. Open N sessions at 2R a second (at most 1,000), each retried on failure like a device (below),
   until all are open; wait 1.5 s, so the kill falls in a later second than the last connect.
2. Read from the brokers' logs which broker holds which session, and kill -9 the broker holding
   the most (its sessions are the orphans; the others' are the survivors' sessions).
3. Every session that ends reconnects through the proxy: the first attempt after a jittered
   0.1-1 s, each failed attempt doubling the next wait (jitter x 2^k, k capped at 3: at most 8 s),
   as a device with exponential back-off would. A failed attempt is a refusal: CONNACK with a
   non-zero code (routerd refuses with 0x88 as Artemis does), a close or reset before the CONNACK,
   or no CONNACK within 30 s (paho's and mqtt.js's default connect timeout).
4. The storm ends when every orphan is open again (bounded: 3 N/R + 30 s). Then every open session
   sends one PINGREQ and must get its PINGRESP within 10 s.

Figures per scenario: orphans; time from the kill to the last orphan's CONNACK; per survivor, the
sessions (MQTT CONNECTs mosquitto logged as "New client connected") it took in each wall-clock
second from the kill's second to the last orphan's, and the peak; refusals (by reason) and
attempts in the storm; survivors' sessions lost (closed, reset, or no PINGRESP to the check:
must be 0); the proxy's CPU time from the kill to the last orphan back (`cpu_ns` of its PID,
threads and children included).

Scenarios (`--scenarios`, in this order, each with freshly started brokers and proxy):

- `routerd`: routerd, no limits (the figures of today). CONSISTENT_HASH over CLIENT_ID (Artemis's:
  one point per node id, so all of a dead broker's keys go to one survivor), a key cache (needed
  by the rebalance; the same in both routerd scenarios), TCP probes every second.
- `routerd-rate`: the same with `connectRate=R;slowStart=S` on every connector, and routerd's
  default queue (`maxQueue` ten seconds of R, `queueTimeout` 5 s; `--max-queue` and
  `--queue-timeout` change them). Clients wait in the queue rather than being refused while the
  orphans of one broker number at most 5 R; a refused client retries with its back-off. Then
  **the return**: mosquitto starts again on the killed broker's port; once routerd reports it
  ready (its slow start begins: connect rate R x 5 % growing to R over S), `routerctl rebalance
  mqtt --rate R/2 --wait` moves just enough clients back (they are closed, reconnect with the
  back-off, and the cache sends them to the returned broker, whose gate paces them). The ramp is
  the returned broker's sessions a second, beside R x share(t) from its slow start.
- `haproxy`: HAProxy 2.6 (Debian), TCP mode, one thread, `balance hash` on the MQTT client id
  (`mqtt_field_value`: HAProxy 2.6 does read it in TCP mode) with `hash-type consistent` (which
  spreads a dead server's keys over the others), passive health as routerd's (a refused connect
  marks the server down) and `option redispatch`; per server `maxconn` ceil(0.6 N) (a broker sized
  to carry its share when one of three is gone, with 20 % to spare) + `maxqueue` 10 R +
  `timeout queue` as routerd's queueTimeout. HAProxy has no per-server connect rate: maxconn bounds
  how many are open, not how fast they come.
- `haproxy-rate`: the same with the frontend's `rate-limit sessions 2R` (HAProxy's nearest rate
  lever: all servers together, so each of the two survivors gets about R when the hash splits
  evenly).

Acceptance (issue 33, checked on `routerd-rate`; PASS/FAIL lines): no survivor takes more than
R x 1.1 sessions in any second of the storm, every orphan is back within orphans/R + 5 s (orphans,
not N: the stricter reading), and 0 survivor sessions are lost.

Exit status 0 when every scenario measured (every orphan back, nothing lost on the survivors) and
the acceptance holds, 1 otherwise, 2 when mosquitto, haproxy or prlimit is missing. The whole run
is bounded by --timeout; Ctrl-C, SIGTERM and the timeout stop every process started, by PID.
`--trio-path` puts routerd's acceptor on the trio path (`fastPath=false`) and defaults N to 1,000;
`--quick` is the smoke test's tiny run (300 sessions, R 60/s, S 3 s).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import heapq
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

from benchmarks.clients import find_tool
from benchmarks.configs import HaproxyLimits, haproxy_maxconn, haproxy_mqtt_pool_config
from benchmarks.fleet import (
    Fleet,
    FleetError,
    admin_get,
    cpu_ns,
    pick_ports,
    raise_fd_limit,
    stop_signals_interrupt,
)
from benchmarks.studies.idle_sessions import (
    NODE_IDS,
    OPEN,
    ROUTER,
    HardTimeout,
    Session,
    SessionClient,
    add_run_options,
    broker_config,
    established_on,
    keep_outputs,
    log_summary,
    result_header,
    routerd_idle_config,
    routerd_ready,
    serves_fast_path,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from types import FrameType

__all__ = [
    "SCENARIOS",
    "StormClient",
    "acceptance",
    "backoff_s",
    "main",
    "parse_connects",
    "per_second",
    "slow_start_bound",
]

ROOT: Final = Path(__file__).resolve().parents[2]
BROKERS: Final = len(NODE_IDS)
SCENARIOS: Final = ("routerd", "routerd-rate", "haproxy", "haproxy-rate")
SCHEMA: Final = "router-storm/1"
ID_PREFIX: Final = "storm-"
"""Client ids are this and the session's index, the same in every scenario: the routerd scenarios
place every key alike, and kill the same broker."""

KEEPALIVE_S: Final = 300
"""The sessions' MQTT keep-alive: its PINGREQ (every 150 s) never falls within a scenario, so the
proxies' CPU in the storm is the storm's; the check after the storm pings every session once."""
CONNACK_TIMEOUT_S: Final = 30.0
"""A device gives up an attempt after this long without CONNACK (paho's and mqtt.js's default)."""
FIRST_RETRY_S: Final = (0.1, 1.0)
"""The jitter of every wait before a reconnect attempt: uniform in this range, times 2^k."""
BACKOFF_DOUBLINGS: Final = 3
"""k (failed attempts in a row) is capped here: the longest wait is 8 s."""
SETTLE_S: Final = 1.5
"""From the last session open to the kill: the kill's second has no connect of the ramp."""
PING_CHECK_S: Final = 10.0
"""How long the check after the storm waits for every PINGRESP."""
MAX_PENDING: Final = 200
"""Opens in flight at most during the ramp."""
CACHE_TIMEOUT_MS: Final = 3_600_000
"""routerd's key cache: an hour, longer than any run (the rebalance needs one)."""
CHECK_PERIOD_MS: Final = 1000
"""routerd's TCP probes and HAProxy's `check inter`."""
HAPROXY_SHARE: Final = 0.6
"""HAProxy's per-server maxconn as a share of N: a survivor's half when one broker of three is
gone, with 20 % to spare."""
SLOW_START_FLOOR: Final = 0.05
"""pools/gates.py's SLOW_START_FLOOR: the share a returned target starts with."""

_CONNECTED: Final = re.compile(r"^(\d+): New client connected from \S+ as (\S+) \(")
"""mosquitto 2.0's notice for a session it accepted (after the CONNECT), with its epoch second."""


def _say(text: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"storm {stamp}: {text}", file=sys.stderr, flush=True)


# -- pure helpers -----------------------------------------------------------------------------------


def backoff_s(failures: int, rng: random.Random) -> float:
    """The wait before a session's next connect attempt, after `failures` failed attempts in a row
    (0: the first attempt after it was lost): uniform in `FIRST_RETRY_S` times 2^min(failures,
    `BACKOFF_DOUBLINGS`).

    Raises:
        ValueError: `failures` is negative.
    """
    if failures < 0:
        raise ValueError(f"failures must be 0 or more, got {failures!r}")
    return rng.uniform(*FIRST_RETRY_S) * float(2 ** min(failures, BACKOFF_DOUBLINGS))


def parse_connects(text: str) -> list[tuple[int, str]]:
    """(epoch second, client id) of every session a mosquitto log records as connected."""
    found: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = _CONNECTED.match(line)
        if match is not None:
            found.append((int(match.group(1)), match.group(2)))
    return found


def per_second(seconds: Iterable[int], first: int, last: int) -> list[int]:
    """How many of `seconds` fall in each second from `first` to `last` (both included)."""
    counts = collections.Counter(seconds)
    return [counts.get(second, 0) for second in range(first, last + 1)]


def slow_start_bound(rate: float, slow_start_s: float, elapsed_s: float) -> float:
    """The most connects a second a returned target's gate lets in `elapsed_s` after it became
    ready: its rate times the slow-start share (pools/gates.py), times 1.1 for the bucket."""
    share = 1.0 if elapsed_s >= slow_start_s else max(SLOW_START_FLOOR, elapsed_s / slow_start_s)
    return rate * share * 1.1


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One acceptance line."""

    name: str
    passed: bool
    detail: str


def acceptance(
    *, rate: float, peaks: Sequence[int], back_s: float | None, orphans: int, lost: int
) -> list[Check]:
    """Issue 33's acceptance for the rate-limited scenario.

    Args:
        rate: R, connects a second per broker.
        peaks: each survivor's most sessions in one second of the storm.
        back_s: seconds from the kill to the last orphan's CONNACK; None when some never came back.
        orphans: the killed broker's sessions.
        lost: the survivors' sessions lost.
    """
    bound = rate * 1.1
    deadline = orphans / rate + 5
    return [
        Check(
            name=f"no survivor above R x 1.1 = {bound:g} connects in any second",
            passed=bool(peaks) and max(peaks) <= bound,
            detail=f"peaks {list(peaks)}",
        ),
        Check(
            name=f"every orphan back within orphans/R + 5 = {deadline:.1f} s",
            passed=back_s is not None and back_s <= deadline,
            detail="not all back" if back_s is None else f"{back_s:.2f} s",
        ),
        Check(name="0 survivor sessions lost", passed=lost == 0, detail=f"{lost} lost"),
    ]


# -- the client ---------------------------------------------------------------------------------------


class StormClient(SessionClient):
    """`SessionClient` whose sessions come back: a session that ends (lost, or an attempt that
    failed) opens again under the same client id after `backoff_s`. Records when each attempt
    started, each session opened and was lost, and each refusal."""

    def __init__(self, port: int, *, id_prefix: str, rng: random.Random) -> None:
        super().__init__(
            port, keepalive_s=KEEPALIVE_S, id_prefix=id_prefix, connack_timeout_s=CONNACK_TIMEOUT_S
        )
        self.rng = rng
        self.retrying = True
        """False: an ended session is not opened again (the end of a scenario)."""
        self.live: dict[int, Session] = {}
        """The open session of each index."""
        self.opened_at: dict[int, float] = {}
        """When each index's current (or last) session opened."""
        self.attempts: list[float] = []
        """When each connect attempt started."""
        self.losses: list[tuple[float, int, str]] = []
        """(when, index, reason) of every open session that ended without us asking."""
        self.refusals: list[tuple[float, int, str]] = []
        """(when, index, reason) of every attempt that failed."""
        self._failures: dict[int, int] = {}
        """Failed attempts in a row of each index (its back-off step)."""
        self._retries: list[tuple[float, int]] = []
        """(when, index) of the attempts to come, a heap."""
        self._watched: set[int] = set()
        self._watched_since = 0.0
        self._back: set[int] = set()
        """The watched indices open again since `_watched_since` (`watch`)."""

    def open_one(self, index: int, now: float) -> None:
        self.attempts.append(now)
        super().open_one(index, now)

    def on_open(self, session: Session, now: float) -> None:
        self.live[session.index] = session
        self.opened_at[session.index] = now
        self._failures.pop(session.index, None)
        if session.index in self._watched and now > self._watched_since:
            self._back.add(session.index)

    def on_end(self, session: Session, reason: str, *, was_open: bool) -> None:
        now = time.monotonic()
        index = session.index
        if was_open:
            self.live.pop(index, None)
            self._back.discard(index)
            self.losses.append((now, index, reason))
            failures = 0
        else:
            self.refusals.append((now, index, reason))
            failures = self._failures[index] = self._failures.get(index, 0) + 1
        if self.retrying:
            heapq.heappush(self._retries, (now + backoff_s(failures, self.rng), index))

    def step(self, timeout: float) -> None:
        """One poll (no longer than until the next attempt is due), its events, then the attempts due."""
        if self._retries:
            timeout = min(timeout, max(0.0, self._retries[0][0] - time.monotonic()))
        super().step(timeout)
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            _, index = heapq.heappop(self._retries)
            if self.retrying and index not in self.live:
                self.open_one(index, now)

    def serve(
        self, deadline: float, done: Callable[[], bool], tick: Callable[[], None] | None = None
    ) -> bool:
        """Serve every session until `done()` or `deadline`; whether `done()` held."""
        while not done():
            if time.monotonic() >= deadline:
                return False
            self.step(0.02)
            if tick is not None:
                tick()
        return True

    def watch(self, indices: Iterable[int], since: float) -> None:
        """Follow `indices` from `since` on (`back`)."""
        self._watched, self._watched_since = set(indices), since
        self._back = {i for i in self._watched if i in self.live and self.opened_at[i] > since}

    def back(self) -> int:
        """How many of the watched indices have a session open that opened after `since`."""
        return len(self._back)

    def ping_all(self, timeout: float) -> int:
        """One PINGREQ on every open session; a session without PINGRESP within `timeout` is
        dropped as lost. Returns how many were dropped."""
        now = time.monotonic()
        for session in list(self.live.values()):
            if not session.ping_sent:
                self.send_ping(session, now)
        deadline = now + timeout
        while self.outstanding and time.monotonic() < deadline:
            self.step(0.05)
        silent = [s for s in self.live.values() if s.state == OPEN and s.ping_sent]
        for session in silent:
            self._drop(session, f"no PINGRESP to the check within {timeout:g} s")
        return len(silent)

    def stop(self) -> None:
        """No more attempts; DISCONNECT and close every session."""
        self.retrying = False
        self._retries.clear()
        self.close_all()


# -- one scenario ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The run's sizes (from the command line)."""

    sessions: int
    rate: float
    """R: connects a second per broker (routerd's connectRate)."""
    slow_start_ms: int
    rebalance_rate: float
    max_queue: int | None
    queue_timeout_ms: int
    fast_path: bool
    routerd_log_level: str

    @property
    def ramp_rate(self) -> float:
        """Sessions opened a second at the start: 2R, at most 1,000 (the busiest broker, with 42 %
        of the keys, gets 0.84 R: below the limit)."""
        return min(1000.0, 2 * self.rate)

    @property
    def storm_bound_s(self) -> float:
        """How long the storm may take at the most."""
        return 3 * self.sessions / self.rate + 30


class Tools:
    """The programs the run needs, found on PATH."""

    def __init__(self) -> None:
        self.mosquitto = find_tool("mosquitto")
        self.haproxy = find_tool("haproxy")
        self.prlimit = find_tool("prlimit")

    def missing(self) -> list[str]:
        return [name for name in ("mosquitto", "haproxy", "prlimit") if getattr(self, name) is None]


def _connector_params(settings: Settings) -> str:
    params = f"connectRate={settings.rate:g};slowStart={settings.slow_start_ms}"
    params += f";queueTimeout={settings.queue_timeout_ms}"
    if settings.max_queue is not None:
        params += f";maxQueue={settings.max_queue}"
    return params


class Scenario:
    """One scenario's fleet, client and figures (see the module docstring)."""

    def __init__(self, name: str, settings: Settings, tools: Tools, workdir: Path) -> None:
        self.name = name
        self.settings = settings
        self.tools = tools
        self.workdir = workdir
        self.figures: dict[str, object] = {"scenario": name}
        self.wrap: list[str] = []
        self.broker_ports: list[int] = []
        self.proxy_port = 0
        self.admin_port = 0
        self.brokers: list[subprocess.Popen[bytes]] = []
        self.proxy: subprocess.Popen[bytes] | None = None
        self.clock_offset = time.time() - time.monotonic()
        """Epoch seconds = monotonic + this."""
        self.victim = 0
        """The broker killed (1-3)."""

    @property
    def routerd(self) -> bool:
        return self.name.startswith("routerd")

    def _broker_log(self, n: int) -> Path:
        return self.workdir / f"mosquitto-{n}.log"

    def _start_broker(self, fleet: Fleet, n: int, name: str) -> subprocess.Popen[bytes]:
        assert self.tools.mosquitto is not None
        conf = self.workdir / f"mosquitto-{n}.conf"
        conf.write_text(broker_config(self.broker_ports[n - 1], notices=True))
        argv = [*self.wrap, self.tools.mosquitto, "-c", str(conf)]
        return fleet.start(name, argv, ports=[self.broker_ports[n - 1]])

    def _start_proxy(self, fleet: Fleet) -> subprocess.Popen[bytes]:
        settings = self.settings
        if self.routerd:
            limited = self.name == "routerd-rate"
            text = routerd_idle_config(
                self.broker_ports,
                self.proxy_port,
                fast_path=settings.fast_path,
                connector_params=_connector_params(settings) if limited else "",
                check_period_ms=CHECK_PERIOD_MS,
                cache_timeout_ms=CACHE_TIMEOUT_MS,
            )
            (self.workdir / "routerd.xml").write_text(text)
            self.figures["path"] = "fast" if serves_fast_path(text) else "trio"
            argv = [*self.wrap, sys.executable, "-m", "router", "--config", str(self.workdir / "routerd.xml")]
            argv += ["--admin", f"127.0.0.1:{self.admin_port}", "--log-level", settings.routerd_log_level]
            proc = fleet.start("routerd", argv, ports=[self.proxy_port, self.admin_port], cwd=ROOT)
            fleet.wait_until(
                "routerd", proc, lambda: routerd_ready(self.admin_port), 20, "report 3 brokers ready"
            )
            return proc
        assert self.tools.haproxy is not None
        limits = HaproxyLimits(
            server_maxconn=math.ceil(HAPROXY_SHARE * settings.sessions),
            server_maxqueue=math.ceil(10 * settings.rate),
            queue_timeout_ms=settings.queue_timeout_ms,
            rate_limit_sessions=round(2 * settings.rate) if self.name == "haproxy-rate" else None,
        )
        self.figures["haproxy_limits"] = {
            "server_maxconn": limits.server_maxconn,
            "server_maxqueue": limits.server_maxqueue,
            "timeout_queue_ms": limits.queue_timeout_ms,
            "rate_limit_sessions": limits.rate_limit_sessions,
        }
        servers = [(f"broker-{n}", port) for n, port in enumerate(self.broker_ports, 1)]
        maxconn = haproxy_maxconn(raise_fd_limit())
        conf = self.workdir / "haproxy.cfg"
        conf.write_text(haproxy_mqtt_pool_config(self.proxy_port, servers, maxconn=maxconn, limits=limits))
        return fleet.start(
            "haproxy", [*self.wrap, self.tools.haproxy, "-f", str(conf), "-db"], ports=[self.proxy_port]
        )

    def _placement(self) -> dict[int, int]:
        """Session index -> broker (1-3), from the brokers' logs (the last connect of each id wins)."""
        prefix = ID_PREFIX
        where: dict[int, tuple[int, int]] = {}
        for n in range(1, BROKERS + 1):
            for second, client_id in parse_connects(self._broker_log(n).read_text(errors="replace")):
                if client_id.startswith(prefix):
                    index = int(client_id[len(prefix) :])
                    if index not in where or second >= where[index][0]:
                        where[index] = (second, n)
        return {index: n for index, (_, n) in where.items()}

    def run(self) -> dict[str, object]:
        """Start the fleet, open the sessions, kill a broker, measure the storm (and the return)."""
        assert self.tools.prlimit is not None
        figures = self.figures
        hard = raise_fd_limit()
        self.wrap = [self.tools.prlimit, f"--nofile={hard}:{hard}", "--"]
        with Fleet(self.workdir, say=_say) as fleet:
            *self.broker_ports, self.proxy_port, self.admin_port = pick_ports(BROKERS + 2)
            self.brokers = [self._start_broker(fleet, n, f"mosquitto-{n}") for n in range(1, BROKERS + 1)]
            self.proxy = proxy = self._start_proxy(fleet)
            client = StormClient(self.proxy_port, id_prefix=ID_PREFIX, rng=random.Random(1))
            try:
                self._storm(client, fleet, proxy)
                if self.name == "routerd-rate":
                    self._return(client, fleet)
            finally:
                client.stop()
            figures["proxy_log"] = log_summary(fleet.log_path("routerd" if self.routerd else "haproxy"), 5)
        return figures

    def _storm(self, client: StormClient, fleet: Fleet, proxy: subprocess.Popen[bytes]) -> None:
        settings, figures, n = self.settings, self.figures, self.settings.sessions
        _say(f"{self.name}: opening {n} sessions at {settings.ramp_rate:g}/s")
        start = time.monotonic()
        client.ramp(
            n, rate=settings.ramp_rate, max_pending=MAX_PENDING, deadline=start + n / settings.ramp_rate + 60
        )
        if not client.serve(start + n / settings.ramp_rate + 90, lambda: len(client.live) == n):
            raise FleetError(f"{self.name}: only {len(client.live)} of {n} sessions opened")
        figures["ramp_s"] = round(time.monotonic() - start, 2)
        figures["ramp_refusals"] = len(client.refusals)
        client.serve(time.monotonic() + SETTLE_S, lambda: False)
        placement = self._placement()
        per_broker = collections.Counter(placement.values())
        figures["sessions_per_broker_before"] = {
            NODE_IDS[b - 1]: per_broker[b] for b in range(1, BROKERS + 1)
        }
        victim = max(range(1, BROKERS + 1), key=lambda b: per_broker[b])
        orphans = sorted(i for i, b in placement.items() if b == victim)
        survivors_sessions = sorted(i for i, b in placement.items() if b != victim)
        survivors = [b for b in range(1, BROKERS + 1) if b != victim]
        figures["killed"] = NODE_IDS[victim - 1]
        figures["orphans"] = len(orphans)
        figures["survivor_sessions"] = len(survivors_sessions)
        self.victim = victim

        cpu0 = cpu_ns(proxy.pid)
        killed_at = time.monotonic()
        victim_proc = self.brokers[victim - 1]
        victim_proc.send_signal(signal.SIGKILL)
        victim_proc.wait(5)
        fleet.stop(victim_proc)  # forgotten by the fleet: it is gone already
        _say(
            f"{self.name}: killed {NODE_IDS[victim - 1]} (pid {victim_proc.pid}) with {len(orphans)} sessions"
        )
        client.watch(orphans, killed_at)
        back = client.serve(killed_at + settings.storm_bound_s, lambda: client.back() == len(orphans))
        ended = time.monotonic()
        cpu1 = cpu_ns(proxy.pid)
        back_s = max((client.opened_at[i] for i in orphans), default=killed_at) - killed_at if back else None
        figures["all_back"] = back
        figures["orphans_back"] = client.back()
        figures["time_to_all_back_s"] = None if back_s is None else round(back_s, 2)
        figures["proxy_cpu_s"] = round((cpu1 - cpu0) / 1e9, 3)
        figures["storm_window_s"] = round(ended - killed_at, 2)

        silent = client.ping_all(PING_CHECK_S)
        checked = time.monotonic()
        survivor_set = set(survivors_sessions)
        lost = [(t, i, r) for t, i, r in client.losses if t > killed_at and i in survivor_set]
        figures["survivor_sessions_lost"] = len({i for _, i, _ in lost})
        figures["survivor_lost_reasons"] = dict(collections.Counter(r for _, _, r in lost))
        figures["silent_at_check"] = silent
        refused = [r for t, _, r in client.refusals if killed_at < t <= checked]
        figures["refusals"] = len(refused)
        figures["refusal_reasons"] = dict(collections.Counter(refused).most_common(6))
        figures["attempts"] = sum(1 for t in client.attempts if t > killed_at)

        first = math.floor(killed_at + self.clock_offset)
        last = math.floor(
            killed_at + (back_s if back_s is not None else ended - killed_at) + self.clock_offset
        )
        series: dict[str, list[int]] = {}
        for b in survivors:
            seconds = [s for s, _ in parse_connects(self._broker_log(b).read_text(errors="replace"))]
            series[NODE_IDS[b - 1]] = per_second(seconds, first, last)
        figures["connects_per_second"] = series
        figures["peak_connects_per_s"] = {name: max(counts, default=0) for name, counts in series.items()}
        figures["sessions_per_broker_after"] = {
            NODE_IDS[b - 1]: count
            for b, count in zip(range(1, BROKERS + 1), self._established(), strict=True)
        }
        _say(
            f"{self.name}: orphans back in {figures['time_to_all_back_s']} s, peaks "
            f"{figures['peak_connects_per_s']}, refusals {len(refused)}, "
            f"lost {figures['survivor_sessions_lost']}"
        )

    def _established(self) -> list[int]:
        counts = established_on(self.broker_ports)
        return [counts[port] for port in self.broker_ports]

    def _return(self, client: StormClient, fleet: Fleet) -> None:
        """Start the killed broker again, wait for routerd to see it ready, rebalance, record the ramp."""
        settings, victim = self.settings, self.victim
        ret: dict[str, object] = {}
        self.figures["return"] = ret
        log = self._broker_log(victim)
        offset = len(log.read_bytes())
        self._start_broker(fleet, victim, f"mosquitto-{victim}")
        started = time.monotonic()
        if not client.serve(started + 20, lambda: _quiet_ready(self.admin_port)):
            raise FleetError(f"routerd did not report {NODE_IDS[victim - 1]} ready again within 20 s")
        ready_at = time.monotonic()
        ret["ready_after_s"] = round(ready_at - started, 2)
        argv = [sys.executable, "-c", "from router.ctl import routerctl_main; routerctl_main()", "rebalance"]
        argv += [
            "--admin",
            f"http://127.0.0.1:{self.admin_port}",
            ROUTER,
            "--rate",
            f"{settings.rebalance_rate:g}",
        ]
        argv += ["--wait", "--timeout", "120", "--json"]
        ctl = fleet.start("routerctl-rebalance", argv, cwd=ROOT)
        samples: list[tuple[float, object]] = []
        sampler = _GateSampler(self.admin_port, NODE_IDS[victim - 1], ready_at, samples)
        moved_from = len(client.losses)
        bound = ready_at + 120 + settings.storm_bound_s
        done = client.serve(
            bound, lambda: ctl.poll() is not None and len(client.live) == settings.sessions, sampler
        )
        finished = time.monotonic()
        ret["rebalance_exit_status"] = ctl.poll()
        with contextlib.suppress(OSError, ValueError):
            text = fleet.log_path("routerctl-rebalance").read_text()
            status = json.loads(text[text.index("{") :])
            if isinstance(status, dict):
                ret["rebalance"] = {
                    k: status.get(k) for k in ("state", "moved", "left", "rate", "achieved_rate")
                }
        ret["all_open_after"] = done
        ret["sessions_moved"] = len(client.losses) - moved_from
        ret["refusals"] = sum(1 for t, _, _ in client.refusals if t > ready_at)
        ret["refusal_reasons"] = dict(
            collections.Counter(r for t, _, r in client.refusals if t > ready_at).most_common(6)
        )
        ret["duration_s"] = round(finished - ready_at, 2)
        text = log.read_bytes()[offset:].decode(errors="replace")
        first = math.floor(ready_at + self.clock_offset)
        last = math.floor(finished + self.clock_offset)
        counts = per_second((s for s, _ in parse_connects(text)), first, last)
        while len(counts) > 1 and counts[-1] == 0:
            counts.pop()
        ramp = []
        for k, count in enumerate(counts):
            elapsed = first + k + 1 - (ready_at + self.clock_offset)  # the end of second k since ready
            ramp.append(
                {
                    "second": k,
                    "connects": count,
                    "bound": round(
                        slow_start_bound(settings.rate, settings.slow_start_ms / 1000, elapsed), 1
                    ),
                }
            )
        ret["ramp"] = ramp
        ret["gate_samples"] = samples
        ret["sessions_per_broker_after"] = {
            NODE_IDS[b - 1]: count
            for b, count in zip(range(1, BROKERS + 1), self._established(), strict=True)
        }
        _say(f"{self.name}: the return: {ret['sessions_moved']} moved, ramp {[r['connects'] for r in ramp]}")


def _quiet_ready(admin_port: int) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return routerd_ready(admin_port)
    return False


class _GateSampler:
    """The returned target's gate (slow-start share, open, queued) from the admin API, every 0.5 s."""

    def __init__(
        self, admin_port: int, node_id: str, since: float, samples: list[tuple[float, object]]
    ) -> None:
        self.admin_port, self.node_id, self.since, self.samples = admin_port, node_id, since, samples
        self.next = since

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + 0.5
        with contextlib.suppress(OSError, ValueError):
            status = admin_get(self.admin_port, f"/api/v1/routers/{ROUTER}", timeout=2)
            pool = status.get("pool") if isinstance(status, dict) else None
            targets = pool.get("targets") if isinstance(pool, dict) else None
            for target in targets if isinstance(targets, list) else []:
                if isinstance(target, dict) and target.get("node_id") == self.node_id:
                    gate = target.get("gate")
                    if isinstance(gate, dict):
                        picked = {k: gate.get(k) for k in ("slow_start_share", "open", "queued")}
                        self.samples.append((round(now - self.since, 2), picked))


# -- the run ---------------------------------------------------------------------------------------------


def _row(figures: Mapping[str, object]) -> list[str]:
    def get(name: str) -> str:
        value = figures.get(name)
        return "-" if value is None else str(value)

    peaks = figures.get("peak_connects_per_s")
    peak_text = " / ".join(f"{v}" for v in peaks.values()) if isinstance(peaks, dict) else "-"
    back = get("time_to_all_back_s") if figures.get("all_back") else f"not all ({get('orphans_back')})"
    return [
        get("scenario"),
        get("orphans"),
        back,
        peak_text,
        f"{get('refusals')} / {get('attempts')}",
        get("survivor_sessions_lost"),
        get("proxy_cpu_s"),
    ]


def table(results: Sequence[Mapping[str, object]]) -> str:
    """One row per scenario (a Markdown table)."""
    head = [
        "scenario",
        "orphans",
        "all back (s)",
        "peak connects/s per survivor",
        "refusals / attempts",
        "survivor sessions lost",
        "proxy CPU (s)",
    ]
    rows = [head, *(_row(r) for r in results)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(head))]
    lines = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def ramp_table(ret: Mapping[str, object]) -> str:
    """The return: sessions the returned broker took in each second after routerd saw it ready."""
    ramp = ret.get("ramp")
    lines = ["| second after ready | connects | slow-start bound R x share x 1.1 |", "|---|---|---|"]
    for entry in ramp if isinstance(ramp, list) else []:
        if isinstance(entry, dict):
            lines.append(f"| {entry.get('second')} | {entry.get('connects')} | {entry.get('bound')} |")
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.storm",
        description="A reconnect storm through routerd and HAProxy (see benchmarks/README.md).",
    )
    parser.add_argument("--sessions", type=int, default=None, help="N (default 5000; 1000 with --trio-path)")
    parser.add_argument("--rate", type=float, default=None, help="R, connects/s per broker (default N/10)")
    parser.add_argument("--slow-start", type=int, default=None, help="S in ms (default 10000)")
    parser.add_argument(
        "--rebalance-rate", type=float, default=None, help="routerctl rebalance --rate (default R/2)"
    )
    parser.add_argument(
        "--max-queue", type=int, default=None, help="routerd maxQueue (default: its own, 10 R)"
    )
    parser.add_argument(
        "--queue-timeout", type=int, default=5000, help="routerd queueTimeout and HAProxy timeout queue, ms"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny run: 300 sessions, R 60/s, S 3 s")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"some of {','.join(SCENARIOS)}")
    add_run_options(parser)
    args = parser.parse_args(argv)
    if args.sessions is None:
        args.sessions = 300 if args.quick else (5000 if args.fast_path else 1000)
    if args.rate is None:
        args.rate = 60.0 if args.quick else max(10.0, args.sessions / 10)
    if args.slow_start is None:
        args.slow_start = 3000 if args.quick else 10_000
    if args.rebalance_rate is None:
        args.rebalance_rate = args.rate / 2
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        parser.error(f"--scenarios takes some of {','.join(SCENARIOS)}, got {args.scenarios!r}")
    args.scenario_list = [s for s in SCENARIOS if s in scenarios]
    if not 10 <= args.sessions <= 20_000:
        parser.error("--sessions must be 10-20000")
    if not 1 <= args.rate <= 10_000 or not 1 <= args.rebalance_rate <= 10_000:
        parser.error("--rate and --rebalance-rate must be 1-10000")
    if not 0 <= args.slow_start <= 600_000 or not 0 <= args.queue_timeout <= 600_000:
        parser.error("--slow-start and --queue-timeout must be 0-600000 ms")
    if args.timeout is None:
        each = args.sessions / min(1000, 2 * args.rate) + 3 * args.sessions / args.rate + 90
        args.timeout = len(args.scenario_list) * each + 150 + args.slow_start / 1000
    return args


def _on_alarm(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise HardTimeout


def _judge(results: Sequence[Mapping[str, object]], rate: float) -> tuple[list[Check], list[str]]:
    """The acceptance of `routerd-rate` (if it ran) and what failed in any scenario."""
    problems: list[str] = []
    checks: list[Check] = []
    for figures in results:
        name = figures.get("scenario")
        if figures.get("error"):
            problems.append(f"{name}: {figures['error']}")
            continue
        if not figures.get("all_back"):
            problems.append(f"{name}: not every orphan came back")
        if figures.get("survivor_sessions_lost") != 0:
            problems.append(f"{name}: {figures.get('survivor_sessions_lost')} survivor sessions lost")
        ret = figures.get("return")
        if isinstance(ret, dict) and not ret.get("all_open_after"):
            problems.append(f"{name}: not every session open again after the return")
        if name == "routerd-rate":
            peaks = figures.get("peak_connects_per_s")
            back = figures.get("time_to_all_back_s")
            orphans = figures.get("orphans")
            lost = figures.get("survivor_sessions_lost")
            checks = acceptance(
                rate=rate,
                peaks=[int(v) for v in peaks.values()] if isinstance(peaks, dict) else [],
                back_s=float(back) if isinstance(back, int | float) else None,
                orphans=orphans if isinstance(orphans, int) else 0,
                lost=lost if isinstance(lost, int) else -1,
            )
    return checks, problems


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenarios; exit status 0 (all measured, acceptance holds), 1, or 2 (a tool missing)."""
    args = _parse_args(argv)
    tools = Tools()
    if tools.missing():
        print(
            f"storm: {', '.join(tools.missing())} needed (apt-get install -y mosquitto haproxy util-linux)",
            file=sys.stderr,
        )
        return 2
    settings = Settings(
        sessions=args.sessions,
        rate=args.rate,
        slow_start_ms=args.slow_start,
        rebalance_rate=args.rebalance_rate,
        max_queue=args.max_queue,
        queue_timeout_ms=args.queue_timeout,
        fast_path=args.fast_path,
        routerd_log_level=args.routerd_log_level,
    )
    workdir = Path(tempfile.mkdtemp(prefix="router-storm-"))
    started = time.monotonic()
    result: dict[str, object] = {
        **result_header(SCHEMA, "benchmarks.studies.storm", argv),
        "settings": {
            "sessions": settings.sessions,
            "rate": settings.rate,
            "slow_start_ms": settings.slow_start_ms,
            "rebalance_rate": settings.rebalance_rate,
            "max_queue": settings.max_queue,
            "queue_timeout_ms": settings.queue_timeout_ms,
            "path_requested": "fast" if settings.fast_path else "trio",
            "ramp_rate": settings.ramp_rate,
            "timeout_s": round(args.timeout),
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
    }
    results: list[dict[str, object]] = []
    result["scenarios"] = results
    previous_alarm = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    error: str | None = None
    try:
        with stop_signals_interrupt():
            for name in args.scenario_list:
                scenario_dir = workdir / name
                scenario_dir.mkdir()
                scenario = Scenario(name, settings, tools, scenario_dir)
                try:
                    results.append(scenario.run())
                except (FleetError, OSError, subprocess.SubprocessError, ValueError) as exc:
                    scenario.figures["error"] = f"{type(exc).__name__}: {exc}"
                    results.append(scenario.figures)
                    _say(f"{name}: {scenario.figures['error']}")
    except HardTimeout:
        error = f"hard timeout of {args.timeout:.0f} s reached; every process started was stopped"
    except KeyboardInterrupt:
        error = "interrupted; every process started was stopped"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_alarm)
    checks, problems = _judge(results, settings.rate)
    if error is not None:
        problems.insert(0, error)
    ok = not problems and all(c.passed for c in checks)
    result["acceptance"] = [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks]
    result["problems"] = problems
    result["verdict"] = "OK" if ok else "FAILED"
    result["duration_s"] = round(time.monotonic() - started, 1)
    result["machine"] = {
        **(result["machine"] if isinstance(result["machine"], dict) else {}),
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"N = {settings.sessions} sessions, R = {settings.rate:g}/s per broker, path {result['settings']}")
    print(table(results))
    for figures in results:
        ret = figures.get("return")
        if isinstance(ret, dict):
            print(
                f"\nThe return ({figures.get('killed')}, slowStart {settings.slow_start_ms} ms, "
                f"rebalance --rate {settings.rebalance_rate:g}): {ret.get('sessions_moved')} sessions moved, "
                f"{ret.get('refusals')} refusals, per broker after {ret.get('sessions_per_broker_after')}"
            )
            print(ramp_table(ret))
    print()
    for check in checks:
        print(f"{'PASS' if check.passed else 'FAIL'}: {check.name} ({check.detail})")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(f"result: {result['verdict']}")
    keep_outputs(result, args.json, workdir, keep_logs=args.keep_logs or not ok, say=_say)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
