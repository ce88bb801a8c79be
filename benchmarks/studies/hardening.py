"""Reproduce the findings of the hardening review against a routerd build, and print what happened.

    .venv/bin/python -m benchmarks.studies.hardening [--source DIR] [--limit 1024]

Quoted by benchmarks/README.md ("The hardening review's findings") and the hardening issue's
closing note.

Runs routerd (from this tree, or from `--source`, a checkout of another commit, to compare a
build from before the fixes) in front of three real mosquitto brokers, with a hard descriptor limit
of `--limit`, and plays the attacker of each finding, bounded in count and time:

1. descriptor exhaustion: 50 victim MQTT sessions on one router; silent TCP connections to
   another router's SOURCE_IP acceptor until the process runs out. Victims that still answer
   PINGREQ, targets reported not ready, attackers refused at accept, descriptors afterwards;
2. the accept loop at the limit: routerd's CPU seconds and log lines while the attackers hold on;
3. log injection: a client id with a newline and a forged line;
4. memory through keys: connections with 15 KB client ids through a router with `<cache/>`
   (timeout 0): routerd's RSS growth;
5. catastrophic backtracking: `(a+)+$` as key filter and one crafted client id; the connect latency
   of a good client of another router meanwhile;
6. SIGHUP: whether routerd is still running.

Only configuration both builds read is used. Not a test: it prints figures (the closing note of the
hardening issue quotes them); tests/router/test_routerd_hardening.py asserts the fixed behaviour.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Final

from benchmarks.configs import mosquitto_config
from benchmarks.fleet import Fleet, cpu_ns, fd_count, pick_ports, raise_fd_limit, rss_kib
from keys import mqtt

ROOT: Final = Path(__file__).resolve().parents[2]
VICTIMS: Final = 50
ATTACK_MAX: Final = 1500
"""Silent connections the attacker opens at most (bounded; the limit is reached well before)."""
ATTACK_S: Final = 10.0
"""How long the attacker takes at most to open them, and then holds them."""
LONG_IDS: Final = 2000
"""Connections with a 15 KB client id in each round of finding 4."""
MEMORY_ROUNDS: Final = 10
"""Rounds of finding 4: growth that goes on round after round is kept for good, growth that levels
off is the allocator holding on to freed memory for reuse."""
BACKTRACK_AS: Final = 24
"""`a`s before the `!` of finding 5: Python's `re` takes seconds for (a+)+$ on 24 of them."""


def _session(port: int, client_id: str, *, timeout: float = 5.0) -> socket.socket:
    """An MQTT session through routerd, its CONNACK read (raises OSError when refused)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(mqtt.encode_connect(client_id))
    if _recv(sock, 4)[:2] != b"\x20\x02":
        raise OSError("no CONNACK")
    return sock


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _answers_ping(sock: socket.socket) -> bool:
    try:
        sock.sendall(b"\xc0\x00")
        return _recv(sock, 2) == b"\xd0\x00"
    except OSError:
        return False


def _config(brokers: list[int], ports: dict[str, int]) -> str:
    connectors = "\n".join(
        f'      <connector name="b{i}">tcp://127.0.0.1:{port}?nodeId=b{i}</connector>'
        for i, port in enumerate(brokers)
    )
    refs = "".join(f"<connector-ref>b{i}</connector-ref>" for i in range(len(brokers)))

    def router(name: str, key_type: str, extra: str = "") -> str:
        return (
            f'      <connection-router name="{name}"><key-type>{key_type}</key-type>{extra}'
            '<policy name="CONSISTENT_HASH"/><pool><check-period>500</check-period>'
            f"<static-connectors>{refs}</static-connectors></pool></connection-router>"
        )

    acceptors = "\n".join(
        f'      <acceptor name="{name}">tcp://127.0.0.1:{port}?router={name}</acceptor>'
        for name, port in ports.items()
    )
    routers = "\n".join(
        [
            router("attacked", "SOURCE_IP"),
            router("victims", "CLIENT_ID"),
            router("cached", "CLIENT_ID", "<cache/>"),
            router("filtered", "CLIENT_ID", "<key-filter>(a+)+$</key-filter>"),
        ]
    )
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
    <connectors>
{connectors}
    </connectors>
    <acceptors>
{acceptors}
    </acceptors>
    <connection-routers>
{routers}
    </connection-routers>
</core></configuration>
"""


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, finding: str, what: str, value: object) -> None:
        self.rows.append((finding, what, str(value)))
        print(f"  {finding:<22} {what:<58} {value}", flush=True)


def _log_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def run(source: Path, limit: int, report: Report) -> None:
    raise_fd_limit()
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory(prefix="router-hardening-") as tmp, Fleet(Path(tmp), say=print) as fleet:
        work = Path(tmp)
        numbers = pick_ports(7)
        brokers, names = numbers[:3], ["attacked", "victims", "cached", "filtered"]
        ports = dict(zip(names, numbers[3:], strict=True))
        for i, port in enumerate(brokers):
            (work / f"m{i}.conf").write_text(mosquitto_config(port) + "max_connections -1\n")
            fleet.start(f"mosquitto-{i}", [mosquitto, "-c", str(work / f"m{i}.conf")], ports=[port])
        (work / "router.xml").write_text(_config(brokers, ports))
        argv = [
            "prlimit",
            f"--nofile={limit}:{limit}",
            "--",
            sys.executable,
            "-m",
            "router",
            "--config",
            str(work / "router.xml"),
            "--no-admin",
        ]
        env_path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = f"{source}{os.pathsep}{env_path}" if env_path else str(source)
        routerd = fleet.start("routerd", argv, ports=list(ports.values()), cwd=source)
        log = fleet.log_path("routerd")
        time.sleep(1.5)  # the first probes
        pid = routerd.pid
        baseline_fds = fd_count(pid)

        # 1 and 2: descriptor exhaustion, and the accept loop at the limit.
        victims = [_session(ports["victims"], f"victim-{i}") for i in range(VICTIMS)]
        lines_before = len(_log_lines(log))
        attackers: list[socket.socket] = []
        refused = 0
        deadline = time.monotonic() + ATTACK_S
        while len(attackers) + refused < ATTACK_MAX and time.monotonic() < deadline:
            try:
                sock = socket.create_connection(("127.0.0.1", ports["attacked"]), timeout=1)
            except OSError:
                refused += 1
                continue
            attackers.append(sock)
        time.sleep(0.5)
        closed_at_once = 0
        for sock in attackers:
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    closed_at_once += 1
            except BlockingIOError:
                pass  # open, nothing to read: served (or still waiting)
            except OSError:
                closed_at_once += 1
        cpu_before = cpu_ns(pid)
        hold_start = time.monotonic()
        time.sleep(5.0)  # the attackers hold on; probes run every 0.5 s
        cpu_s = (cpu_ns(pid) - cpu_before) / 1e9
        hold_s = time.monotonic() - hold_start
        log_lines = _log_lines(log)[lines_before:]
        alive = sum(_answers_ping(sock) for sock in victims)
        report.add("1 descriptors", f"victim sessions answering PINGREQ (of {VICTIMS})", alive)
        report.add(
            "1 descriptors",
            "'is not ready' lines while attacked",
            sum("is not ready" in line for line in log_lines),
        )
        report.add(
            "1 descriptors",
            "attacker connections open / closed by routerd",
            f"{len(attackers)} / {closed_at_once}",
        )
        report.add("2 accept at limit", f"routerd CPU seconds over {hold_s:.1f} s of holding", f"{cpu_s:.2f}")
        report.add("2 accept at limit", "log lines written while attacked", len(log_lines))
        kinds = collections.Counter(_kind(line) for line in log_lines)
        report.add(
            "2 accept at limit",
            "the most frequent of them",
            ", ".join(f"{k} x{n}" for k, n in kinds.most_common(4)),
        )
        report.add(
            "2 accept at limit", "log bytes written while attacked", sum(len(line) + 1 for line in log_lines)
        )
        for sock in attackers:
            sock.close()
        for sock in victims:
            sock.close()
        time.sleep(2.0)
        report.add(
            "1 descriptors", "routerd descriptors: baseline -> after", f"{baseline_fds} -> {fd_count(pid)}"
        )
        time.sleep(1.5)  # targets a failed probe made not ready get their next probe

        # 3: log injection.
        lines_before = len(_log_lines(log))
        forged = "x\n2000-01-01 00:00:00,000 INFO router.conn: peer=6.6.6.6:1 router=victims key=f outcome=OK"
        with contextlib.suppress(OSError), _session(ports["victims"], forged):
            time.sleep(0.3)
        time.sleep(0.5)
        injected = [line for line in _log_lines(log)[lines_before:] if line.startswith("2000-01-01")]
        report.add("3 log injection", "forged lines in the log", len(injected))

        # 4: memory through keys, in two rounds: growth that goes on is kept, growth that stops is
        # the allocator's reuse.
        rss_before = rss_kib(pid)
        for round_ in range(1, MEMORY_ROUNDS + 1):
            time.sleep(0 if round_ == 1 else 6.0)  # past the connect deadlines that hold a connection
            started = time.monotonic()
            for i in range(LONG_IDS):
                client_id = f"{round_}{i:06d}" + "k" * 15_000
                with contextlib.suppress(OSError), _session(ports["cached"], client_id):
                    pass
            time.sleep(0.5)
            growth = (rss_kib(pid) - rss_before) / 1024
            report.add(
                "4 memory via keys",
                f"RSS growth after {round_ * LONG_IDS} 15 KB client ids ({time.monotonic() - started:.0f} s)",
                f"{growth:.1f} MiB",
            )
        log_size = log.stat().st_size
        report.add("4 memory via keys", "log file size", f"{log_size / 1024 / 1024:.1f} MiB")

        # 5: catastrophic backtracking.
        crafted = "a" * BACKTRACK_AS + "!"
        attack = threading.Thread(target=_try_session, args=(ports["filtered"], crafted), daemon=True)
        attack.start()
        time.sleep(0.2)
        good_start = time.monotonic()
        try:
            _session(ports["victims"], "good-client", timeout=30).close()
            latency = f"{(time.monotonic() - good_start) * 1000:.0f} ms"
        except OSError as exc:
            latency = f"failed: {exc}"
        attack.join(60)
        report.add(
            "5 backtracking",
            f"a good client's connect latency meanwhile ((a+)+$, {BACKTRACK_AS} a's)",
            latency,
        )

        # 6: SIGHUP.
        os.kill(pid, signal.SIGHUP)  # prlimit execs routerd: the same pid
        time.sleep(1.0)
        report.add("6 SIGHUP", "routerd still running after SIGHUP", routerd.poll() is None)
        last = [line for line in _log_lines(log)[-3:] if "SIGHUP" in line]
        report.add("6 SIGHUP", "its log line", last[-1].split(": ", 1)[-1][:70] if last else "(none)")


def _kind(line: str) -> str:
    """A log line without its time, peer and numbers: what kind of line it is."""
    text = line.split(": ", 1)[-1]
    text = re.sub(r"peer=\S+ ", "", text)
    return re.sub(r"\d+", "N", text)[:60]


def _try_session(port: int, client_id: str) -> None:
    with contextlib.suppress(OSError), _session(port, client_id, timeout=60):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the tree to run routerd from (default: this one)"
    )
    parser.add_argument(
        "--limit", type=int, default=1024, help="routerd's hard descriptor limit (default 1024)"
    )
    args = parser.parse_args(argv)
    report = Report()
    print(f"routerd from {args.source} at a descriptor limit of {args.limit}", flush=True)
    run(args.source.resolve(), args.limit, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
