"""routerd under exhaustion and hostile clients (issue 10): one attacker must never cost the other
clients their connections.

Real routerd processes in front of real mosquitto brokers, every load bounded in count and time,
all traffic on 127.0.0.0/8. Each test reproduces one finding of the hardening review and then checks
what the other clients see: their sessions still answer PINGREQ through the router, routerd's
descriptors return to their baseline (/proc/PID/fd), its memory stays bounded (VmRSS), and a new
well-behaved client still connects at once.

1. descriptor exhaustion: silent connections beyond the client budget are closed at accept, counted
   and logged rate-limited, while the victims of another router keep their sessions; the limits of
   one acceptor (`connectionsAllowed`, `connectionsAllowedPerSource`) likewise.
2. accept() at EMFILE (the process's soft limit lowered from outside with prlimit) pauses instead
   of spinning, on the fast path and the trio path; a flood beyond the budget costs little CPU.
3. hostile client ids (line breaks, ANSI escapes, `key=value` look-alikes, 15,000 characters)
   cannot forge or split log lines.
4. a flood of distinct long client ids keeps the cache at `<max-entries>`.
5. a catastrophic regular expression is harmless (RE2); one RE2 refuses is refused at start and by
   the admin API.
6. SIGHUP reloads the configuration and changes nothing else.
7. a connect to a target that died between probes is redispatched to another target.
8. an MQTT CONNECT announcing more than `sniffMaxBytes` is rejected at once.
9. unsupported MQTT protocol levels get the broker's own answer, byte for byte.
10. the admin API serves at most 16 connections at once and recovers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.core.admin_access import ADMIN_MAX_CONNECTIONS
from router.logs import LOG_BURST, LOG_INTERVAL_S
from tests.conftest import closed_within, eventually, free_port, read_until_closed, recv_exactly
from tests.router.conftest import (
    Mosquitto,
    MqttObserver,
    Routerd,
    acceptors_xml,
    running,
    static_connectors,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

NODE_IDS = ["node4", "node9", "node20"]
TIMEOUT_S = 10.0
"""Bound of every single socket operation and wait of this module."""

CONNACK_OK = b"\x20\x02\x00\x00"
"""MQTT 3.1.1 CONNACK, session present 0, return code 0 "accepted" (MQTT 3.1.1 §3.2)."""
CONNACK_BAD_VERSION = b"\x20\x02\x00\x01"
"""CONNACK return code 1, "unacceptable protocol version" (MQTT 3.1.1 §3.2.2.3)."""
PINGREQ, PINGRESP = b"\xc0\x00", b"\xd0\x00"
"""MQTT 3.1.1 §3.12, §3.13."""
DISCONNECT = b"\xe0\x00"
"""MQTT 3.1.1 §3.14."""

LOG_LINE_START = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: "
)
"""How every line of routerd's log starts (its logging.basicConfig format)."""
SUPPRESSED = re.compile(r'\.\.\. and (\d+) more lines like "(.*)" in the last [\d.]+ s were suppressed$')
"""The summary line of router/logs.py's LogLimiter."""

_ROUTERD_WITH_LIMIT = (
    "import resource, sys\n"
    "soft, hard = int(sys.argv.pop(1)), int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
    "from router.cli import routerd_main\n"
    "routerd_main()\n"
)
"""`python -c` program: set RLIMIT_NOFILE to argv[1:3], then be routerd (same process, same PID).
Set in the child itself rather than with a preexec_fn, which is unsafe with the test's threads."""


# --- MQTT on raw sockets ------------------------------------------------------------------------


def _remaining_length(size: int) -> bytes:
    """MQTT's variable byte integer (MQTT 3.1.1 §2.2.3)."""
    out = bytearray()
    while True:
        size, digit = divmod(size, 128)
        out.append(digit | (0x80 if size else 0))
        if not size:
            return bytes(out)


def _connect_packet(client_id: str | bytes, *, name: bytes = b"MQTT", level: int = 4) -> bytes:
    """MQTT CONNECT (MQTT 3.1.1 §3.1): clean session, keepalive 60 s, no will, user or password."""
    cid = client_id.encode() if isinstance(client_id, str) else client_id
    body = (
        len(name).to_bytes(2, "big")
        + name
        + bytes([level, 0x02])  # protocol level, connect flags: clean session
        + (60).to_bytes(2, "big")  # keepalive
        + len(cid).to_bytes(2, "big")
        + cid
    )
    return b"\x10" + _remaining_length(len(body)) + body


def _open(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S, source_address=(source, 0))


def _session(port: int, client_id: str, source: str = "127.0.0.1") -> socket.socket:
    """An MQTT session through the router (or a broker): CONNECT, CONNACK accepted; the open socket."""
    sock = _open(port, source)
    try:
        sock.sendall(_connect_packet(client_id))
        connack = recv_exactly(sock, 4)
    except BaseException:
        sock.close()
        raise
    if connack != CONNACK_OK:
        sock.close()
        raise AssertionError(f"{client_id!r} from {source} on {port}: CONNACK {connack.hex()}")
    return sock


def _answers_ping(sock: socket.socket) -> bool:
    """Whether the session answers PINGREQ with PINGRESP (through the router, from the broker)."""
    try:
        sock.sendall(PINGREQ)
        return recv_exactly(sock, 2) == PINGRESP
    except OSError:
        return False


def _connect_latency(port: int, client_id: str, source: str = "127.0.0.1") -> float:
    """Seconds from connect() to the CONNACK of a new session (closed again)."""
    started = time.monotonic()
    with _session(port, client_id, source) as sock:
        elapsed = time.monotonic() - started
        sock.sendall(DISCONNECT)
    return elapsed


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data`, then everything the peer sends until it closes (bounded by TIMEOUT_S)."""
    with _open(port) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


# --- routerd from outside: /proc, /metrics, the log ---------------------------------------------


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _lowest_free_fd(pid: int) -> int:
    """The descriptor number the process's next socket would get (the lowest one not open), the
    least of five looks 20 ms apart: a health probe's socket may be open during one of them."""
    lowest = []
    for _ in range(5):
        used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
        lowest.append(next(n for n in range(len(used) + 1) if n not in used))
        time.sleep(0.02)  # another process's descriptors: nothing to wait on
    return min(lowest)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid(router: Routerd) -> int:
    assert router.proc is not None
    assert router.proc.poll() is None, "routerd exited"
    return router.proc.pid


def _samples(router: Routerd) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of routerd's /metrics: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(router.metrics())
        for sample in family.samples
    }


def _metric(routerd: Routerd, name: str, /, **labels: str) -> float:
    """One sample of routerd's /metrics, 0 when absent."""
    return _samples(routerd).get((name, frozenset(labels.items())), 0.0)


def _targets_ready(router: Routerd) -> dict[tuple[str, str], float]:
    """router_target_ready: (router, node id) -> 0 or 1."""
    return {
        (labels["router"], labels["node_id"]): value
        for (name, label_set), value in _samples(router).items()
        if name == "router_target_ready"
        for labels in [dict(label_set)]
    }


def _healthz(router: Routerd) -> bool:
    try:
        with urllib.request.urlopen(router.admin + "/healthz", timeout=5) as response:
            return bool(response.status == 200 and response.read() == b"ok\n")
    except OSError:
        return False


def _peer_line(router: Routerd, peer: tuple[str, int], router_name: str) -> str:
    """The `outcome=` line routerd wrote for the connection from `peer`."""
    return router.wait_for_log(
        rf"peer={re.escape(peer[0])}:{peer[1]} router={router_name} key=.* outcome=", consume=False
    )


def _take_in_lines(router: Routerd) -> None:
    """Move the lines routerd wrote so far into `router.lines` (its reader hands them over only
    while a search waits)."""
    with contextlib.suppress(TimeoutError):
        router.wait_for_log(r"(?!)", timeout=0.3, consume=False)  # a pattern that matches nothing


def _suppressed(lines: Iterable[str], template_part: str) -> int:
    """How many lines whose message contains `template_part` the summaries say were suppressed."""
    return sum(
        int(match.group(1))
        for line in lines
        if (match := SUPPRESSED.search(line)) is not None and template_part in match.group(2)
    )


def _router(
    name: str,
    key_type: str,
    refs: str,
    *,
    policy: str = "CONSISTENT_HASH",
    check_period_ms: int = 1000,
    extra: str = "",
) -> str:
    """A `<connection-router>` over the connectors `refs`, without quorum wait."""
    return (
        f'<connection-router name="{name}"><key-type>{key_type}</key-type>{extra}'
        f'<policy name="{policy}"/><pool><check-period>{check_period_ms}</check-period>'
        f"<quorum-timeout>0</quorum-timeout><static-connectors>{refs}</static-connectors></pool>"
        "</connection-router>"
    )


def _core(
    fleet: list[Mosquitto],
    acceptors: Mapping[str, str],
    ports: Mapping[str, int],
    routers: Callable[[str], Iterable[str]],
    more_connectors: str = "",
) -> str:
    """A configuration with the fleet's connectors (NODE_IDS), `acceptors` (name -> URL parameters)
    on `ports`, and the routers `routers(refs)` makes with the fleet's connector references."""
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in fleet), strict=True))
    return (
        f"<core><connectors>{connectors}{more_connectors}</connectors>"
        f"<acceptors>{acceptors_xml(acceptors, ports)}</acceptors>"
        f"<connection-routers>{''.join(routers(refs))}</connection-routers></core>"
    )


class LimitedRouterd(Routerd):
    """A routerd process started with the descriptor limit (soft, hard) we choose."""

    def __init__(self, workdir: Path, make_config: Callable[[int], str], nofile: tuple[int, int]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir, make_config)
        self.nofile = nofile

    def program(self) -> list[str]:
        return [sys.executable, "-c", _ROUTERD_WITH_LIMIT, *(str(n) for n in self.nofile)]


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Mosquitto]]:
    """Three mosquitto brokers for the whole module (node ids NODE_IDS)."""
    workdir = tmp_path_factory.mktemp("hardening-fleet")
    yield from running([Mosquitto(workdir, f"mosquitto-{i}") for i in range(3)])


@pytest.fixture(scope="module")
def spare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A fourth broker, only in the `redispatch` router's pool: killed by that test."""
    broker = Mosquitto(tmp_path_factory.mktemp("hardening-spare"), "spare")
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


SHARED_ACCEPTORS = {
    "per-source": "router=by-source;connectionsAllowedPerSource=5",
    "capped": "router=by-source;connectionsAllowed=3",
    "good": "router=by-source",
    "clients": "router=by-client-id",
    "small-cap": "router=by-client-id;sniffMaxBytes=1024;handshake-timeout=5",
    "small-cap-trio": "router=by-client-id;sniffMaxBytes=1024;handshake-timeout=5;fastPath=false",
    "cached": "router=cached",
    "regex": "router=regex;sniffMaxBytes=65536",
    "redispatch": "router=redispatch",
}
"""The acceptors of the module's shared routerd (all proxy mode, all plain TCP)."""


BYSTANDERS = 10
"""MQTT sessions through the shared routerd that live as long as it: every test on it checks that
they still answer PINGREQ afterwards."""


class Shared:
    """The module's shared routerd, its acceptors' ports, and the bystanders' sessions."""

    def __init__(self, router: Routerd, ports: dict[str, int], fleet: list[Mosquitto]) -> None:
        self.router = router
        self.ports = ports
        self.fleet = fleet
        self.bystanders: list[socket.socket] = []

    def bystanders_answer(self) -> bool:
        """Whether every bystander's session still answers PINGREQ through the router."""
        return len(self.bystanders) == BYSTANDERS and all(_answers_ping(s) for s in self.bystanders)


def _shared_config(fleet: list[Mosquitto], spare: Mosquitto, ports: dict[str, int]) -> str:
    spare_refs = "".join(f"<connector-ref>{c}</connector-ref>" for c in ("spare", "c1", "c2"))
    return _core(
        fleet,
        SHARED_ACCEPTORS,
        ports,
        lambda refs: [
            _router("by-source", "SOURCE_IP", refs),
            _router("by-client-id", "CLIENT_ID", refs),
            _router(
                "cached",
                "CLIENT_ID",
                refs,
                extra="<cache><timeout>0</timeout><max-entries>1000</max-entries></cache>",
            ),
            _router(
                "regex",
                "CLIENT_ID",
                refs,
                policy="FIRST_ELEMENT",
                extra="<key-filter>(a+)+$</key-filter><key-max-length>40000</key-max-length>",
            ),
            _router("redispatch", "SOURCE_IP", spare_refs, policy="FIRST_ELEMENT", check_period_ms=60_000),
        ],
        f'<connector name="spare">tcp://127.0.0.1:{spare.port}?nodeId=spare</connector>',
    )


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, fleet: list[Mosquitto], spare: Mosquitto
) -> Iterator[Shared]:
    """One routerd for the tests that need no descriptor limit of their own."""
    ports = {name: free_port() for name in SHARED_ACCEPTORS}
    router = Routerd(
        tmp_path_factory.mktemp("hardening-shared"), lambda _: _shared_config(fleet, spare, ports)
    )
    try:
        router.start()
        for name in ("by-source", "by-client-id", "cached", "regex"):
            for node_id in NODE_IDS:
                router.wait_for_log(rf"router={name} target={node_id} is ready", consume=False)
        for node_id in ("spare", "node9", "node20"):
            router.wait_for_log(rf"router=redispatch target={node_id} is ready", consume=False)
        state = Shared(router, ports, fleet)
        state.bystanders.extend(
            _session(ports["clients"], f"bystander-{i}", "127.0.0.30") for i in range(BYSTANDERS)
        )
        yield state
        for sock in state.bystanders:
            sock.close()
    finally:
        router.stop()


@pytest.fixture
def start_limited(
    tmp_path: Path, run_routerd: Callable[[Routerd], Routerd]
) -> Callable[[Callable[[int], str], tuple[int, int]], Routerd]:
    """Start a routerd with a descriptor limit (soft, hard) of the test's choice; stopped afterwards."""
    count = iter(range(1_000_000))

    def start(make_config: Callable[[int], str], nofile: tuple[int, int]) -> Routerd:
        return run_routerd(LimitedRouterd(tmp_path / f"routerd-{next(count)}", make_config, nofile))

    return start


# --- 1. descriptor exhaustion -------------------------------------------------------------------

VICTIMS = 50
ATTACKERS = 700
"""Silent connections of the attacker: more than the client budget at a hard limit of 1024."""


def _budget_config(fleet: list[Mosquitto], ports: dict[str, int]) -> str:
    return _core(
        fleet,
        {"A": "router=attacked", "B": "router=victims"},
        ports,
        lambda refs: [
            _router("attacked", "SOURCE_IP", refs, check_period_ms=500),
            _router("victims", "CLIENT_ID", refs, check_period_ms=500),
        ],
    )


def _refused_among(socks: Sequence[socket.socket], expected: int, timeout: float) -> set[int]:
    """Indexes of the sockets the peer closed (EOF or reset), waiting until `expected` of them are
    or `timeout` passed; the others stay open and unread."""
    poller = select.poll()
    by_fd = {sock.fileno(): i for i, sock in enumerate(socks)}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLRDHUP)
    closed: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(closed) < expected and (left := deadline - time.monotonic()) > 0:
        for fd, _events in poller.poll(left * 1000):
            poller.unregister(fd)
            closed.add(by_fd[fd])
    return closed


@pytest.mark.integration
def test_descriptor_budget_refuses_attacker_at_accept_and_victims_keep_their_sessions(
    fleet: list[Mosquitto],
    start_limited: Callable[[Callable[[int], str], tuple[int, int]], Routerd],
) -> None:
    """Scenario: a hard descriptor limit of 1024 and 700 silent connections on acceptor A (a
    SOURCE_IP router): connections beyond the budget are closed at accept, counted, logged at most
    LOG_BURST times per interval; the 50 MQTT sessions of acceptor B (a CLIENT_ID router) keep
    answering, no target goes down, the admin API answers, and everything comes back afterwards."""
    ports = {"A": free_port(), "B": free_port()}
    router = start_limited(lambda _: _budget_config(fleet, ports), (256, 1024))
    pid = _pid(router)
    for name in ("attacked", "victims"):
        for node_id in NODE_IDS:
            router.wait_for_log(rf"router={name} target={node_id} is ready", consume=False)
    router.wait_for_log(r"routerd: descriptor limit raised from 256 to 1024", consume=False)
    started = router.wait_for_log(
        r"descriptor limit 1024, \d+ in use: up to \d+ client connections", consume=False
    )
    found = re.search(r"up to (\d+) client connections", started)
    assert found is not None
    budget = int(found.group(1))
    assert ATTACKERS > budget > VICTIMS, started
    assert _metric(router, "router_client_connection_budget") == budget

    victims = [_session(ports["B"], f"victim-{i}") for i in range(VICTIMS)]
    attackers: list[socket.socket] = []
    try:
        assert all(_answers_ping(v) for v in victims)
        fds_before, rss_before, cpu_before = _fd_count(pid), _rss_mib(pid), _cpu_s(pid)
        attack_started = time.monotonic()
        for _ in range(ATTACKERS):  # silent: the SOURCE_IP router proxies them without reading
            attackers.append(_open(ports["A"], "127.0.0.2"))
        admitted = budget - VICTIMS
        refused = _refused_among(attackers, ATTACKERS - admitted, TIMEOUT_S)
        assert len(refused) == ATTACKERS - admitted
        assert min(refused) >= admitted  # the first ones in were served, the later ones refused
        # One more, timed: closed at accept, not held until some deadline.
        extra_started = time.monotonic()
        with _open(ports["A"], "127.0.0.3") as extra:
            assert closed_within(extra, 1.0)
        extra_s = time.monotonic() - extra_started
        assert extra_s < 0.5
        attack_s = time.monotonic() - attack_started
        cpu_attack = _cpu_s(pid) - cpu_before
        # At the budget with the attacker's connections held, routerd does not spin.
        cpu_idle_start = _cpu_s(pid)
        time.sleep(2.0)  # a measurement window of another process's CPU time
        cpu_idle = _cpu_s(pid) - cpu_idle_start
        assert cpu_idle < 0.3
        fds_attacked, rss_attacked = _fd_count(pid), _rss_mib(pid)

        refused_metric = _metric(
            router, "router_connections_refused_total", acceptor="A", reason="descriptor_budget"
        )
        assert refused_metric == len(refused) + 1 > 0
        assert set(_targets_ready(router).values()) == {1.0}
        assert len(_targets_ready(router)) == 2 * len(NODE_IDS)
        assert _healthz(router)
        assert all(_answers_ping(v) for v in victims)  # while the attacker holds its connections
    finally:
        for sock in attackers:
            sock.close()
    assert eventually(lambda: abs(_fd_count(pid) - fds_before) <= 3), (fds_before, _fd_count(pid))
    fds_after, rss_after = _fd_count(pid), _rss_mib(pid)
    latency_b = _connect_latency(ports["B"], "good-after-attack")
    latency_a = _connect_latency(ports["A"], "good-on-a", "127.0.0.3")
    assert latency_b < 1.0
    assert latency_a < 1.0
    assert all(_answers_ping(v) for v in victims)
    assert rss_after < rss_before + 60
    for victim in victims:
        victim.sendall(DISCONNECT)
        victim.close()
    assert router.stop() == 0  # the rate limiter writes its pending summaries at exit

    lines = router.lines
    assert not [line for line in lines if "is not ready" in line or "accept failed" in line]
    refusal = "refused at accept: %s reached (%d connections)"
    written = [line for line in lines if "refused at accept: the descriptor budget reached" in line]
    assert written, "no refusal was logged"
    assert all("acceptor=A router=attacked" in line for line in written)
    intervals = 1 + math.ceil((time.monotonic() - attack_started) / LOG_INTERVAL_S)
    assert len(written) <= LOG_BURST * intervals
    assert len(written) + _suppressed(lines, refusal) == refused_metric  # every refusal accounted for
    assert not [line for line in lines if not LOG_LINE_START.match(line)]
    print(  # the figures of the report (pytest -s)
        f"\nbudget {budget}; refused {len(refused)} + 1 (metric {refused_metric:g}); log lines "
        f"{len(written)} + suppressed {_suppressed(lines, refusal)}; fds {fds_before} -> "
        f"{fds_attacked} -> {fds_after}; RSS {rss_before:.1f} -> {rss_attacked:.1f} -> {rss_after:.1f} "
        f"MiB; attack {attack_s:.2f} s, CPU {cpu_attack:.2f} s, idle CPU at budget {cpu_idle:.2f} s/2 s; "
        f"refused at {extra_s * 1000:.1f} ms; latency B {latency_b * 1000:.1f} ms, "
        f"A {latency_a * 1000:.1f} ms"
    )


@pytest.mark.integration
def test_connections_allowed_per_source_refuses_sixth_from_one_source(shared: Shared) -> None:
    """Scenario: `connectionsAllowedPerSource=5`: five sessions from 127.0.0.5 are served, the sixth
    is closed at accept (reason source_limit), 127.0.0.6 is still served, and a slot that ends is
    free again."""
    router, port = shared.router, shared.ports["per-source"]
    sessions = [_session(port, f"per-source-{i}", "127.0.0.5") for i in range(5)]
    try:
        with _open(port, "127.0.0.5") as sixth:
            assert closed_within(sixth, 1.0)
        other = _session(port, "other-source", "127.0.0.6")
        sessions.append(other)
        assert _answers_ping(other)
        assert (
            _metric(router, "router_connections_refused_total", acceptor="per-source", reason="source_limit")
            == 1
        )
        router.wait_for_log(
            r"peer=127\.0\.0\.5:\d+ acceptor=per-source router=by-source refused at accept: "
            r"connectionsAllowedPerSource reached \(5 connections\)",
            consume=False,
        )
        sessions.pop(0).close()  # a slot of 127.0.0.5 ends: a new one gets it (once routerd saw it)

        def fifth_again() -> bool:
            try:
                sessions.append(_session(port, "per-source-again", "127.0.0.5"))
            except (OSError, AssertionError):
                return False
            return True

        assert eventually(fifth_again)
        assert all(_answers_ping(s) for s in sessions)
    finally:
        for sock in sessions:
            sock.close()
    assert shared.bystanders_answer()


@pytest.mark.integration
def test_connections_allowed_refuses_beyond_acceptor_limit(shared: Shared) -> None:
    """Scenario: `connectionsAllowed=3`: three sessions from three sources, a fourth from a fourth
    source is closed at accept (reason acceptor_limit); the other acceptors of the router serve."""
    router, port = shared.router, shared.ports["capped"]
    sessions = [_session(port, f"capped-{i}", f"127.0.0.{20 + i}") for i in range(3)]
    try:
        with _open(port, "127.0.0.23") as fourth:
            assert closed_within(fourth, 1.0)
        assert (
            _metric(router, "router_connections_refused_total", acceptor="capped", reason="acceptor_limit")
            == 1
        )
        router.wait_for_log(
            r"acceptor=capped router=by-source refused at accept: "
            r"connectionsAllowed reached \(3 connections\)",
            consume=False,
        )
        assert _connect_latency(shared.ports["good"], "not-capped", "127.0.0.23") < 1.0
        assert all(_answers_ping(s) for s in sessions)
    finally:
        for sock in sessions:
            sock.close()
    assert shared.bystanders_answer()


# --- 2. accept() at EMFILE, and a flood beyond the budget ---------------------------------------

PENDING = 20
"""Connections per acceptor left waiting in the listen backlog while accept() fails."""
FLOOD_S = 2.5
FLOOD_MAX = 2000
"""Bounds of one flood of connections refused at the budget: seconds and connections."""


def _squeeze_config(fleet: list[Mosquitto], ports: dict[str, int]) -> str:
    return _core(
        fleet,
        {"F": "router=squeeze", "T": "router=squeeze;fastPath=false"},
        ports,
        lambda refs: [_router("squeeze", "SOURCE_IP", refs, policy="FIRST_ELEMENT")],
    )


def _flood(port: int, source: str) -> int:
    """Connect, wait for the router's close, close; repeated for FLOOD_S seconds or FLOOD_MAX times.
    Returns how many were closed at once (refused at accept)."""
    refused = 0
    deadline = time.monotonic() + FLOOD_S
    for _ in range(FLOOD_MAX):
        if time.monotonic() > deadline:
            break
        with _open(port, source) as sock:
            refused += closed_within(sock, 1.0)
    return refused


@pytest.mark.integration
def test_accept_at_emfile_pauses_instead_of_spinning_on_both_paths(
    fleet: list[Mosquitto],
    start_limited: Callable[[Callable[[int], str], tuple[int, int]], Routerd],
) -> None:
    """Scenario: routerd's soft descriptor limit is lowered (prlimit, from outside) to its lowest
    free descriptor, so accept() itself fails with EMFILE while clients wait in the backlog of a
    fast-path acceptor (F) and a trio-path one (T). Both pause and retry instead of spinning (CPU
    and log stay small), the probes that fail locally change no target's state, and once the
    limit is back every waiting client is served. Then, with the budget full, a flood of
    connections refused at accept costs little CPU on both paths."""
    ports = {"F": free_port(), "T": free_port()}
    router = start_limited(lambda _: _squeeze_config(fleet, ports), (256, 256))
    pid = _pid(router)
    for node_id in NODE_IDS:
        router.wait_for_log(rf"router=squeeze target={node_id} is ready", consume=False)
    router.wait_for_log(r"fast path \(epoll relay thread\) serves acceptor\(s\) F$", consume=False)
    fds_before, rss_before = _fd_count(pid), _rss_mib(pid)
    pending: list[socket.socket] = []
    holders: list[socket.socket] = []
    try:
        # Linux gives a new descriptor the lowest free number and fails with EMFILE when that
        # number is not below RLIMIT_NOFILE (fs/file.c alloc_fd): with the soft limit at the
        # lowest free number, every accept(), socket() and open() of routerd fails.
        lowest_free = _lowest_free_fd(pid)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, 256))
        for port in (ports["F"], ports["T"]):
            pending.extend(_open(port, "127.0.0.4") for _ in range(PENDING))
        router.wait_for_log(
            r"ERROR router\.conn: acceptor=F accept failed \(Too many open files\)", consume=False
        )
        router.wait_for_log(
            r"ERROR router\.server: acceptor=T accept failed \(Too many open files\)", consume=False
        )
        cpu_start, lines_start = _cpu_s(pid), len(router.lines)
        time.sleep(5.0)  # the measurement window: accept() fails the whole time
        cpu_emfile = _cpu_s(pid) - cpu_start
        _take_in_lines(router)
        lines_emfile = len(router.lines) - lines_start
        assert cpu_emfile < 1.5
        assert lines_emfile < 200
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (256, 256))

        for i, sock in enumerate(pending):  # every client that waited in the backlog is served now
            sock.sendall(_connect_packet(f"waited-{i}"))
            assert recv_exactly(sock, 4) == CONNACK_OK, i
        assert set(_targets_ready(router).values()) == {1.0}  # the probes were skipped, not failed
        assert _healthz(router)
        for sock in pending:
            sock.close()
        pending.clear()
        assert eventually(lambda: abs(_fd_count(pid) - fds_before) <= 3), (fds_before, _fd_count(pid))

        # Fill the budget with silent connections on F, then flood each acceptor in turn.
        found = re.search(
            r"up to (\d+) client connections", router.wait_for_log(r"up to \d+ client", consume=False)
        )
        assert found is not None
        budget = int(found.group(1))
        holders.extend(_open(ports["F"], "127.0.0.7") for _ in range(budget))
        assert not _refused_among(holders, 1, 1.0)
        floods = {}
        for name in ("F", "T"):
            cpu_start = _cpu_s(pid)
            refused = _flood(ports[name], "127.0.0.8")
            floods[name] = (refused, _cpu_s(pid) - cpu_start)
            assert refused > 0
            assert (
                _metric(router, "router_connections_refused_total", acceptor=name, reason="descriptor_budget")
                == refused
            )
            assert floods[name][1] < 1.5
    finally:
        for sock in [*pending, *holders]:
            sock.close()
    assert eventually(lambda: abs(_fd_count(pid) - fds_before) <= 3), (fds_before, _fd_count(pid))
    fds_after = _fd_count(pid)
    latency = {name: _connect_latency(ports[name], f"good-{name}", "127.0.0.9") for name in ("F", "T")}
    assert max(latency.values()) < 1.0
    rss_after = _rss_mib(pid)
    assert rss_after < rss_before + 60
    assert router.stop() == 0

    lines = router.lines
    for logger, acceptor in (("router.conn", "F"), ("router.server", "T")):
        failed = [line for line in lines if f"{logger}: acceptor={acceptor} accept failed" in line]
        assert 0 < len(failed) <= LOG_BURST * 3, (acceptor, len(failed))
    assert not [line for line in lines if "is not ready" in line]
    assert [line for line in lines if "probe skipped, its state stays as it was" in line]
    assert not [line for line in lines if not LOG_LINE_START.match(line)]
    print(
        f"\nEMFILE at fd {lowest_free}: CPU {cpu_emfile:.3f} s in 5 s, {lines_emfile} log lines; "
        f"flood at budget {budget}: "
        + ", ".join(f"{n}: {r} refused, CPU {c:.2f} s in {FLOOD_S} s" for n, (r, c) in floods.items())
        + f"; latency after {', '.join(f'{n} {v * 1000:.1f} ms' for n, v in latency.items())}"
        + f"; fds {fds_before} -> {fds_after}; RSS {rss_before:.1f} -> {rss_after:.1f} MiB"
    )


# --- 3. log injection ---------------------------------------------------------------------------


@pytest.mark.integration
def test_hostile_client_ids_cannot_forge_or_split_log_lines(shared: Shared) -> None:
    """Scenario: client ids with a line feed, a carriage return, an ANSI escape, a `key=value`
    look-alike and 15,000 characters, through a CLIENT_ID router: each connection is one log line,
    the value quoted and escaped (router/logs.py `shown`), the long one is key NULL."""
    router, port = shared.router, shared.ports["clients"]
    long_id = "L" * 15_000
    hostile = {
        "line feed": (
            "inj\n2026-01-01 00:00:00,000 INFO router.conn: forged",
            r'"inj\n2026-01-01 00:00:00,000 INFO router.conn: forged"',
        ),
        "carriage return": ("inj\rforged", r'"inj\rforged"'),
        "ansi escape": ("\x1b[31minj-red\x1b[0m", r'"\x1b[31minj-red\x1b[0m"'),
        "look-alike": ("x outcome=OK target=evil", '"x outcome=OK target=evil"'),
        "15,000 characters": (long_id, "NULL"),
    }
    for i, (client_id, expected) in enumerate(hostile.values()):
        with _open(port, f"127.0.0.{40 + i}") as sock:
            peer = sock.getsockname()
            sock.sendall(_connect_packet(client_id))
            recv_exactly(sock, 4)  # a CONNACK, or mosquitto's close (it refuses control characters)
            line = _peer_line(router, peer, "by-client-id")
        assert f" key={expected} target=" in line, line
        assert re.search(r" target=node\d+ outcome=OK$", line), line
    lines = router.lines
    assert not [line for line in lines if not LOG_LINE_START.match(line)], "a line that is not one event"
    assert not [line for line in lines if "\x1b" in line or "\r" in line]
    assert not [line for line in lines if "L" * 300 in line], "the 15,000-character id in the log"
    assert not [line for line in lines if "target=evil outcome" in line or "Traceback" in line]
    assert shared.bystanders_answer()


# --- 4. memory through keys ---------------------------------------------------------------------

KEYS = 5000
"""Distinct 900-character client ids, each one short session through the cached router."""
WORKERS = 4


@pytest.mark.integration
def test_cache_max_entries_bounds_memory_under_distinct_long_client_ids(shared: Shared) -> None:
    """Scenario: 5,000 short sessions with distinct 900-character client ids through a CLIENT_ID
    router whose cache keeps at most 1,000 entries: it holds 1,000, evicts the rest, routerd's RSS
    grows little; a 15,000-character client id (over key-max-length 1024) is key NULL."""
    router, port = shared.router, shared.ports["cached"]
    pid = _pid(router)
    rss_before, fds_before = _rss_mib(pid), _fd_count(pid)
    done: list[int] = []
    errors: list[BaseException] = []
    deadline = time.monotonic() + 60

    def worker(w: int) -> None:
        count = 0
        try:
            for i in range(w, KEYS, WORKERS):
                if time.monotonic() > deadline:
                    break
                client_id = f"k{i:05d}-" + "x" * 893
                with _session(port, client_id, f"127.0.0.{60 + w}") as sock:
                    sock.sendall(DISCONNECT)
                count += 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        done.append(count)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(70)
    elapsed = time.monotonic() - started
    assert not errors, errors[:3]
    assert sum(done) == KEYS
    rss_after = _rss_mib(pid)

    entries = _metric(router, "router_cache_entries", router="cached")
    evictions = _metric(router, "router_cache_evictions_total", router="cached")
    status = router.get("/api/v1/routers/cached")
    assert isinstance(status, dict)
    assert entries == status["cache_entries"] == 1000
    assert evictions >= KEYS - 1000
    assert rss_after - rss_before < 60
    assert eventually(lambda: abs(_fd_count(pid) - fds_before) <= 3), (fds_before, _fd_count(pid))

    with _open(port, "127.0.0.70") as sock:
        peer = sock.getsockname()
        sock.sendall(_connect_packet("M" * 15_000))
        recv_exactly(sock, 4)
        line = _peer_line(router, peer, "cached")
    assert " key=NULL target=" in line, line
    assert shared.bystanders_answer()
    print(
        f"\n{KEYS} sessions in {elapsed:.1f} s; cache entries {entries:g}, evictions {evictions:g}; "
        f"RSS {rss_before:.1f} -> {rss_after:.1f} MiB; fds {fds_before} -> {_fd_count(pid)}"
    )


# --- 5. catastrophic regular expressions --------------------------------------------------------

HOSTILE_REGEX_ID = "a" * 30_000 + "!"
"""Against `(a+)+$`, exponential for a backtracking engine; linear for RE2."""


@pytest.mark.integration
def test_catastrophic_key_filter_does_not_stall_other_clients(shared: Shared) -> None:
    """Scenario: `<key-filter>(a+)+$</key-filter>` and client ids of 30,000 'a' and a '!': while
    they connect, another router's new clients connect at once; the hostile key is NULL."""
    router = shared.router
    hostile_s: list[float] = []
    peers: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def attack() -> None:
        try:
            for i in range(10):
                started = time.monotonic()
                with _open(shared.ports["regex"], f"127.0.0.{80 + i}") as sock:
                    peers.append(sock.getsockname())
                    sock.sendall(_connect_packet(HOSTILE_REGEX_ID))
                    recv_exactly(sock, 4)
                hostile_s.append(time.monotonic() - started)
        except BaseException as exc:  # reported below
            errors.append(exc)

    attacker = threading.Thread(target=attack)
    attacker.start()
    latencies: list[float] = []
    while attacker.is_alive() and len(latencies) < 50:
        latencies.append(
            _connect_latency(shared.ports["good"], f"regex-bystander-{len(latencies)}", "127.0.0.79")
        )
    attacker.join(60)
    assert not errors, errors
    assert len(hostile_s) == 10
    assert latencies
    assert max(latencies) < 0.5
    assert max(hostile_s) < 0.5
    for peer in peers:
        assert " key=NULL target=" in _peer_line(router, peer, "regex")
    assert shared.bystanders_answer()
    print(
        f"\nhostile connects max {max(hostile_s) * 1000:.1f} ms; bystander latency max "
        f"{max(latencies) * 1000:.1f} ms over {len(latencies)}"
    )


@pytest.mark.integration
def test_key_filter_re2_refuses_is_a_config_error_at_start(tmp_path: Path) -> None:
    """Scenario: a backreference, which needs backtracking, stops routerd at start: exit 2 and one
    line naming the filter, the pattern and the rule."""
    config = tmp_path / "router.xml"
    config.write_text(
        f"""<core><connectors><connector name="c0">tcp://127.0.0.1:{free_port()}</connector></connectors>
  <acceptors><acceptor name="a">tcp://127.0.0.1:{free_port()}?router=r</acceptor></acceptors>
  <connection-routers><connection-router name="r"><key-type>CLIENT_ID</key-type>
    <key-filter>(a)\\1</key-filter><policy name="FIRST_ELEMENT"/>
    <pool><static-connectors><connector-ref>c0</connector-ref></static-connectors></pool>
  </connection-router></connection-routers></core>"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "router", "--config", str(config), "--no-admin"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"routerd: error: {config}:4: <key-filter>: key-filter '(a)\\\\1' is not ")
    assert "invalid escape sequence: \\1" in line
    assert "no backreferences" in line


@pytest.mark.integration
def test_admin_api_refuses_a_filter_re2_refuses(shared: Shared) -> None:
    """Scenario: PUT /api/v1/routers/regex/filters with a backreference is a 400 naming it, and the
    filter in force stays."""
    request = urllib.request.Request(
        shared.router.admin + "/api/v1/routers/regex/filters",
        data=json.dumps({"key_filter": "(a)\\1"}).encode(),
        method="PUT",
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 400
    error = json.loads(refused.value.read())["error"]
    refused.value.close()
    assert "(a)\\\\1" in error
    assert "no backreferences" in error
    status = shared.router.get("/api/v1/routers/regex")
    assert isinstance(status, dict)
    assert status["key_filter"] == "(a+)+$"
    assert shared.bystanders_answer()


# --- 6. SIGHUP ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_sighup_reloads_and_routerd_keeps_serving(shared: Shared) -> None:
    """Scenario: SIGHUP reloads the (unchanged) file: one line says so, one that nothing changed;
    sessions, new clients and the admin API carry on (tests/router/test_routerd_reload.py tests
    reloads that change things)."""
    router = shared.router
    with _session(shared.ports["good"], "before-sighup", "127.0.0.90") as session:
        pid = _pid(router)
        os.kill(pid, signal.SIGHUP)
        router.wait_for_log(r"INFO router.server: configuration .* reloaded: nothing changed", consume=False)
        assert _answers_ping(session)
        assert _connect_latency(shared.ports["good"], "after-sighup", "127.0.0.91") < 1.0
        assert _pid(router) == pid
        assert _healthz(router)
    assert len([line for line in router.lines if "SIGHUP received" in line]) == 1
    assert shared.bystanders_answer()


# --- 7. redispatch ------------------------------------------------------------------------------


@pytest.mark.integration
def test_connect_to_target_dead_since_last_probe_is_redispatched(shared: Shared, spare: Mosquitto) -> None:
    """Scenario: the first target of a FIRST_ELEMENT pool (probed every 60 s) dies; the next client
    is connected to the next target at once and gets that broker's CONNACK."""
    router = shared.router
    spare.kill()
    brokers = dict(zip(NODE_IDS, (b.port for b in shared.fleet), strict=True))
    topic = f"redispatch/{uuid.uuid4()}"
    with MqttObserver("redispatch/#", brokers, TIMEOUT_S) as observer:
        with _session(shared.ports["redispatch"], "redispatched", "127.0.0.100") as sock:
            # PUBLISH QoS 0 (MQTT 3.1.1 §3.3): topic, no payload; then a ping orders it before we close
            sock.sendall(
                b"\x30" + _remaining_length(2 + len(topic)) + len(topic).to_bytes(2, "big") + topic.encode()
            )
            assert _answers_ping(sock)
        assert observer.where(topic) == "node9"
    line = router.wait_for_log(
        r"peer=127\.0\.0\.100:\d+ router=redispatch key=127\.0\.0\.100 target=spare outcome=CONNECT_FAILED",
        consume=False,
    )
    assert line.endswith(" redispatched_to=node9"), line
    assert _metric(router, "router_connect_redispatches_total", router="redispatch") == 1
    assert shared.bystanders_answer()


# --- 8. an opening announcing more than sniffMaxBytes -------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("acceptor", ["small-cap", "small-cap-trio"], ids=["fast-path", "trio-path"])
def test_connect_announcing_over_sniff_max_bytes_is_rejected_at_once(shared: Shared, acceptor: str) -> None:
    """Scenario: a CONNECT header claiming 2 MiB on an acceptor with sniffMaxBytes=1024 and a
    5 s handshake deadline is closed as soon as the remaining length has arrived."""
    # CONNECT, remaining length 2 MiB (variable byte integer 80 80 80 01), then the protocol name.
    opening = b"\x10" + _remaining_length(2 * 1024 * 1024) + b"\x00\x04MQTT\x04\x02\x00\x3c"
    assert opening[1:5] == b"\x80\x80\x80\x01"
    started = time.monotonic()
    with _open(shared.ports[acceptor], "127.0.0.110") as sock:
        peer = sock.getsockname()
        sock.sendall(opening)
        assert closed_within(sock, 5.0)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0
    shared.router.wait_for_log(
        rf"peer=127\.0\.0\.110:{peer[1]} acceptor={acceptor} protocol=mqtt handshake rejected: "
        r"\"the opening announces 2097157 bytes, over the acceptor's cap of 1024 \(sniffMaxBytes\)",
        consume=False,
    )
    assert shared.bystanders_answer()


# --- 9. unsupported protocol levels: the broker's own answer ------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "level"), [(b"MQIsdp", 0), (b"MQTT", 3), (b"MQTT", 6)], ids=["MQIsdp-0", "MQTT-3", "MQTT-6"]
)
def test_unsupported_protocol_level_gets_the_brokers_bytes(shared: Shared, name: bytes, level: int) -> None:
    """Scenario: a CONNECT mosquitto refuses with "unacceptable protocol version" gets exactly the
    bytes through the CLIENT_ID router (which sniffs it) that it gets from mosquitto directly."""
    connect = _connect_packet(f"level-{level}", name=name, level=level)
    direct = _exchange(shared.fleet[0].port, connect)
    assert direct == CONNACK_BAD_VERSION
    assert _exchange(shared.ports["clients"], connect) == direct
    assert shared.bystanders_answer()


# --- 10. the admin API's connection cap ---------------------------------------------------------


@pytest.mark.integration
def test_admin_api_holds_at_most_sixteen_connections_and_still_answers_health_checks(shared: Shared) -> None:
    """Scenario: 16 silent admin connections (ADMIN_MAX_CONNECTIONS) from 16 addresses are held
    open; a 17th takes the place of the oldest, which is closed at once; /healthz answers while they
    are held; the descriptors stay bounded and are back once they are gone."""
    router = shared.router
    pid = _pid(router)
    fds = _fd_count(pid)
    silent = [_open(router.admin_port, f"127.0.0.{10 + i}") for i in range(ADMIN_MAX_CONNECTIONS)]
    try:
        assert eventually(lambda: _fd_count(pid) >= fds + ADMIN_MAX_CONNECTIONS, 5.0)
        with _open(router.admin_port, "127.0.0.9"):
            assert closed_within(silent[0], 1.0)  # the oldest gave its place
            assert not _refused_among(silent[1:], 1, 0.2)  # the others are still held
        assert _healthz(router)
        assert _fd_count(pid) <= fds + ADMIN_MAX_CONNECTIONS + 3
        router.wait_for_log(
            r"WARNING router\.admin: admin API: a connection that sent no request yet was closed to make "
            r"room for one from 127\.0\.0\.9:\d+",
            consume=False,
        )
    finally:
        for sock in silent:
            sock.close()
    assert eventually(lambda: abs(_fd_count(pid) - fds) <= 3, 5.0), (fds, _fd_count(pid))
    assert shared.bystanders_answer()
