"""The benchmark's processes: ports, descriptor limits, start, readiness, RSS, and stop by PID.

Every child runs in its own session (Ctrl-C reaches only the harness, which then stops each child
in reverse order: SIGTERM, then SIGKILL after a grace period), with stdout and stderr in a log
file of the run's work directory. Readiness of a listener is read from /proc/net/tcp, so no
probe connection reaches a backend (iperf3 takes every connection for a test client).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import time
import urllib.request
from typing import IO, TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from pathlib import Path
    from types import FrameType

__all__ = [
    "CLOCK_TICK_S",
    "PORT_RANGE",
    "Fleet",
    "FleetError",
    "admin_get",
    "cpu_ns",
    "cpu_ns_by_thread",
    "cpu_ticks_by_thread",
    "listening_ports",
    "pick_ports",
    "pid_alive",
    "pinned",
    "quietest_cpu",
    "raise_fd_limit",
    "rss_kib",
    "stop_signals_interrupt",
]

PORT_RANGE: Final = (20000, 32000)
"""Listener ports: below the ephemeral range 32768-60999 (ENVIRONMENT.md §3, gotcha 6)."""

STOP_GRACE_S: Final = 5.0
"""How long a child may take to exit after SIGTERM before it gets SIGKILL."""

_TCP_LISTEN: Final = "0A"
"""The state column of /proc/net/tcp for LISTEN."""


class FleetError(RuntimeError):
    """A process of the benchmark did not start or did not become ready."""


def _interrupt(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise KeyboardInterrupt, so a run unwinds through the
    fleet's stop (also when started in the background, where a shell leaves SIGINT ignored); the
    handlers before are put back after it."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def raise_fd_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit; children inherit it.

    Returns:
        The soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return hard if soft == resource.RLIM_INFINITY else soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def pick_ports(count: int, *, rng: random.Random | None = None) -> list[int]:
    """`count` distinct ports in `PORT_RANGE` that can be bound on 127.0.0.1 now.

    Raises:
        FleetError: not enough free ports were found.
    """
    rng = rng or random.Random()
    chosen: list[int] = []
    for _ in range(count * 200):
        if len(chosen) == count:
            break
        port = rng.randrange(*PORT_RANGE)
        if port in chosen:
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    if len(chosen) < count:
        raise FleetError(f"found only {len(chosen)} free ports of {count} in {PORT_RANGE}")
    return chosen


def listening_ports() -> set[int]:
    """The TCP ports something listens on, from /proc/net/tcp and /proc/net/tcp6 (a JVM listens on
    127.0.0.1 with an IPv6 socket, IPv4-mapped)."""
    ports: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            table = open(name)  # noqa: SIM115 - closed below; a kernel without IPv6 has no tcp6
        except FileNotFoundError:
            continue
        with table:
            next(table)  # header
            for line in table:
                fields = line.split()
                if len(fields) > 3 and fields[3] == _TCP_LISTEN:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def rss_kib(pid: int) -> int:
    """The resident set size of a process, in KiB (VmRSS of /proc/PID/status).

    Raises:
        FleetError: the process is gone or reports no VmRSS.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError as exc:
        raise FleetError(f"cannot read the RSS of pid {pid}: {exc.strerror}") from exc
    raise FleetError(f"pid {pid} reports no VmRSS")


def fd_count(pid: int) -> int:
    """How many descriptors a process has open (/proc/PID/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_ns(pid: int) -> int:
    """CPU time a process and the processes it started (routerd's event log writer) have used so
    far, in nanoseconds, summed over their threads (`cpu_ns_by_thread`).

    Raises:
        FleetError: the process is gone.
    """
    threads, children = cpu_ns_by_thread(pid)
    return sum(threads.values()) + children


def cpu_ns_by_thread(pid: int) -> tuple[dict[int, int], int]:
    """CPU time each thread of a process has used so far (thread id -> ns), and the processes it
    started, all their threads together.

    Read from /proc/PID/task/TID/schedstat (first field: time on CPU), which is exact where
    /proc/PID/stat counts in clock ticks of 10 ms. A child that ended meanwhile is not counted.

    Raises:
        FleetError: the process is gone.
    """
    tids = _threads(pid)
    if not tids:
        raise FleetError(f"pid {pid} is gone")
    threads: dict[int, int] = {}
    children = 0
    for tid in tids:
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/task/{tid}/schedstat") as stat,
        ):
            threads[tid] = int(stat.read().split()[0])
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/children") as listed:
            for child in listed.read().split():
                with contextlib.suppress(FleetError):
                    children += cpu_ns(int(child))
    return threads, children


CLOCK_TICK_S: Final = 1 / os.sysconf("SC_CLK_TCK")
"""The unit of `cpu_ticks_by_thread` (10 ms on Linux)."""


def cpu_ticks_by_thread(pid: int) -> dict[int, tuple[int, int]]:
    """The user and the system CPU time each thread of a process has used so far, in clock ticks
    (`CLOCK_TICK_S`): /proc/PID/task/TID/stat, coarse, but the only place that splits the two.
    A thread that ended meanwhile is left out."""
    ticks: dict[int, tuple[int, int]] = {}
    for tid in _threads(pid):
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/task/{tid}/stat") as stat,
        ):
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            ticks[tid] = (int(fields[11]), int(fields[12]))  # utime and stime: fields 14 and 15 of stat(5)
    return ticks


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


@contextlib.contextmanager
def pinned(pids: Iterable[int], cpu: int) -> Iterator[None]:
    """Run every thread of `pids` and this process (and so the children it starts) on one CPU.

    Restores each thread's previous CPU set on exit. Threads that are gone are skipped.

    Raises:
        ValueError: a PID is not positive (0 would mean this process).
    """
    pids = list(pids)
    if any(pid <= 0 for pid in pids):
        raise ValueError(f"PIDs must be positive, got {pids!r}")
    saved: dict[int, set[int]] = {}
    try:
        for tid in [os.getpid(), *(t for pid in pids for t in _threads(pid))]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {cpu})
        yield
    finally:
        for tid, cpus in saved.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(tid, cpus)


def _cpu_idle_ticks() -> dict[int, int]:
    """Idle plus iowait ticks of each CPU since boot, from /proc/stat."""
    ticks: dict[int, int] = {}
    with open("/proc/stat") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 5:
                ticks[int(name[3:])] = int(fields[3]) + int(fields[4])
    return ticks


def quietest_cpu(sample_s: float = 0.1) -> int:
    """The CPU this process may use that was idle longest over the next `sample_s` seconds."""
    allowed = os.sched_getaffinity(0)
    before = _cpu_idle_ticks()
    time.sleep(sample_s)
    after = _cpu_idle_ticks()
    return max(sorted(allowed), key=lambda cpu: after.get(cpu, 0) - before.get(cpu, 0))


def admin_get(port: int, path: str, *, timeout: float = 5.0) -> object:
    """GET a JSON document from routerd's admin API on 127.0.0.1."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
        return json.loads(response.read())


class Fleet:
    """The processes of one run, stopped in reverse start order by `stop_all` (or `with`)."""

    def __init__(self, workdir: Path, *, say: Callable[[str], None]) -> None:
        self.workdir = workdir
        self._say = say
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._grace_s: dict[int, float] = {}
        """PID -> how long that child may take to exit after SIGTERM (`start`; else `STOP_GRACE_S`)."""

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop_all()

    def log_path(self, name: str) -> Path:
        """The log file of a child."""
        return self.workdir / f"{name.replace(' ', '-')}.log"

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ports: Iterable[int] = (),
        timeout: float = 20.0,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running child and wait until it listens on all `ports` (none: return at once).

        Args:
            name: names its log file and its lines in the harness's output.
            argv: the command.
            ports: what it must listen on before this returns.
            timeout: how long it may take to listen.
            cwd: its working directory (default: ours).
            env: its environment (default: ours).
            stop_grace_s: how long it may take to exit after SIGTERM before it gets SIGKILL.

        Raises:
            FleetError: it exited, or did not listen in time (its log's tail is in the message).
        """
        with open(self.log_path(name), "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=cwd,
                env=env,
            )
        self._procs.append((name, proc))
        self._grace_s[proc.pid] = stop_grace_s
        wanted = set(ports)
        self.wait_until(
            name, proc, lambda: wanted <= listening_ports(), timeout, f"listen on {sorted(wanted)}"
        )
        self._say(f"started {name} (pid {proc.pid})")
        return proc

    def start_helper(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start a short-lived child with pipes on stdin and stdout (stopped with the fleet)."""
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        self._procs.append((name, proc))
        return proc

    def wait_until(
        self,
        name: str,
        proc: subprocess.Popen[bytes],
        ready: Callable[[], bool],
        timeout: float,
        what: str,
    ) -> None:
        """Poll `ready` every 20 ms until it holds.

        Raises:
            FleetError: the process exited first, or `timeout` passed.
        """
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise FleetError(f"{name} exited with status {proc.returncode}: {self.tail(name)}")
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise FleetError(f"{name} did not {what} within {timeout:g} s: {self.tail(name)}")
            time.sleep(0.02)  # polling another process; nothing to wait on

    def tail(self, name: str, lines: int = 5) -> str:
        """The last lines of a child's log, on one line."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop one child by its PID: SIGTERM, then SIGKILL after its stop grace (`start`)."""
        for entry in list(self._procs):
            if entry[1] is proc:
                self._procs.remove(entry)
                self._stop_one(*entry)

    def stop_all(self) -> None:
        """Stop every child still running, last started first."""
        while self._procs:
            self._stop_one(*self._procs.pop())

    def _stop_one(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        for stream in (proc.stdin, proc.stdout):
            _close_quietly(stream)
        grace_s = self._grace_s.pop(proc.pid, STOP_GRACE_S)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                proc.wait(STOP_GRACE_S)
            self._say(f"stopped {name} (pid {proc.pid})")


def _close_quietly(stream: IO[bytes] | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (for tests of the cleanup)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
