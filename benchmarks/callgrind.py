"""User-space instructions per connection, counted by valgrind's callgrind (the instructions group).

A proxy runs under `valgrind --tool=callgrind --separate-threads=yes`; `Callgrind` zeroes its
counters and dumps them (`callgrind_control -z` / `-d`) around batches of connections, and each dump
is one file per thread, `cg.PID.DUMP-THREAD`, whose `summary:` line is the instructions the thread
executed since the last zero. An instruction count does not depend on the machine's load or clock,
so it compares routerd with HAProxy where timed figures move with whatever else runs.

Two batches of different sizes, N1 then N2 connections, each between a zero and a dump, give per
thread (dump 2 - dump 1) / (N2 - N1): what the batches share (the zero and dump requests
themselves, a connection still closing when the dump comes, the load client's start) cancels. The
parsing and that arithmetic are pure (`parse_dump_name`, `dump_total`, `per_connection`,
`counted_value`); `Callgrind` and `read_dump` do the I/O.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import TYPE_CHECKING, Final, Literal, assert_never

from benchmarks.fleet import FleetError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

__all__ = [
    "CALLGRIND_TOOLS",
    "Callgrind",
    "Counted",
    "counted_value",
    "dump_total",
    "parse_dump_name",
    "per_connection",
    "read_dump",
    "valgrind_argv",
]

CALLGRIND_TOOLS: Final = ("valgrind", "callgrind_control")
"""The programs of the instructions group, both from the Debian package valgrind."""

DUMP_PREFIX: Final = "cg"
"""Dump files are `cg.PID.DUMP-THREAD` in the output directory (`--callgrind-out-file=DIR/cg.%p`)."""

_DUMP_NAME: Final = re.compile(rf"^{DUMP_PREFIX}\.(\d+)\.(\d+)-(\d+)$")
"""A requested dump's file; the one written at exit has no DUMP part (`cg.PID-THREAD`)."""

DUMP_WAIT_S: Final = 30.0
"""How long a dump's files may take to be complete after `callgrind_control -d` has returned
(callgrind writes them before it answers; this is a margin, not a wait that is expected)."""

CONTROL_TIMEOUT_S: Final = 120.0
"""Bound of one `callgrind_control` call: it reaches the process through vgdb, which waits until
valgrind's scheduler runs (under load, seconds)."""


def valgrind_argv(valgrind: str, out_dir: Path, argv: Sequence[str]) -> list[str]:
    """`argv` under callgrind, one count per thread, dumps into `out_dir`, not counting until
    `Callgrind.instrument`.

    `--instr-atstart=no`: uninstrumented, valgrind runs routerd's start (CPython and its imports)
    in 8 s rather than 50 s (2 shared CPUs). `--dump-instr=no` keeps costs per function and line,
    not per instruction address: the dumps stay small and only their totals are read. The
    program's process is valgrind's (same PID), so `Fleet.stop` and `callgrind_control` reach it by
    the PID `Popen` gives.
    """
    return [
        valgrind,
        "--tool=callgrind",
        "--separate-threads=yes",
        "--instr-atstart=no",
        "--dump-instr=no",
        f"--callgrind-out-file={out_dir}/{DUMP_PREFIX}.%p",
        *argv,
    ]


def parse_dump_name(name: str) -> tuple[int, int, int] | None:
    """(pid, dump number, thread number) of a requested dump's file name, else None.

    Dump numbers count from 1 in the order of the requests; threads are callgrind's own numbers
    (1 is the main thread), not the kernel's thread ids.
    """
    match = _DUMP_NAME.match(name)
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3])


def dump_total(text: str) -> int | None:
    """The instructions of one dump file: its `summary:` line, which callgrind writes in the
    header (the `totals:` line, written last, when there is none).

    Returns:
        The count, or None while the file is incomplete (no `totals:` line yet).

    Raises:
        ValueError: the line holds no count.
    """
    lines = text.splitlines()
    totals = [line for line in lines if line.startswith("totals:")]
    if not totals:
        return None
    line = next((line for line in lines if line.startswith("summary:")), totals[0])
    fields = line.split()
    if len(fields) < 2 or not fields[1].isdigit():
        raise ValueError(f"callgrind dump: {line[:80]!r} holds no count")
    return int(fields[1])


def per_connection(
    first: Mapping[int, int], second: Mapping[int, int], *, counts: tuple[int, int]
) -> dict[int, float]:
    """Instructions per connection of each thread: (second - first) / (N2 - N1).

    Args:
        first: thread -> instructions of the batch of N1 connections (a thread missing had none).
        second: the same for the batch of N2 connections.
        counts: (N1, N2).

    Returns:
        Thread -> instructions per connection, for every thread of either dump.

    Raises:
        ValueError: N2 is not larger than N1.
    """
    n1, n2 = counts
    if n2 <= n1:
        raise ValueError(f"the second batch must be larger than the first, got {counts!r}")
    threads = sorted(set(first) | set(second))
    return {t: (second.get(t, 0) - first.get(t, 0)) / (n2 - n1) for t in threads}


Counted = Literal["busiest", "all"]
"""Which threads a proxy's figure counts: its busiest (routerd: the data-path thread, which carries
every connection, while its trio thread's health probes and timers run by time, not per connection),
or all of them summed (HAProxy, whose one thread does everything)."""


def counted_value(per_thread: Mapping[int, float], counted: Counted) -> tuple[float, str]:
    """A proxy's instructions per connection from its threads' (`per_connection`).

    Returns:
        The figure, and which threads it counts ("thread 3, the busiest" or "all threads").

    Raises:
        ValueError: no thread.
    """
    if not per_thread:
        raise ValueError("no thread in the dumps")
    if counted == "busiest":
        thread = max(per_thread, key=lambda t: per_thread[t])
        return per_thread[thread], f"thread {thread}, the busiest"
    if counted == "all":
        return sum(per_thread.values()), "all threads"
    assert_never(counted)


def read_dump(out_dir: Path, pid: int, number: int) -> dict[int, int] | None:
    """One requested dump of `pid` in `out_dir`: thread -> instructions.

    Returns:
        The counts, or None while the dump has no file or one of its files is incomplete.
    """
    totals: dict[int, int] = {}
    for path in out_dir.iterdir():
        parsed = parse_dump_name(path.name)
        if parsed is None or parsed[:2] != (pid, number):
            continue
        total = dump_total(path.read_text(errors="replace"))
        if total is None:
            return None
        totals[parsed[2]] = total
    return totals or None


class Callgrind:
    """A process running under callgrind (`valgrind_argv`): zero its counters, dump them."""

    def __init__(self, control: str, pid: int, out_dir: Path) -> None:
        self.control = control
        """The path of callgrind_control."""
        self.pid = pid
        self.out_dir = out_dir
        self._dumps = 0
        """Dumps requested so far (callgrind numbers them from 1)."""

    def _request(self, flag: str) -> None:
        """Run `callgrind_control FLAG PID`; it exits 0 also when it found no such process, and
        says "OK." only when the process took the request.

        Raises:
            FleetError: the process did not take it.
        """
        result = subprocess.run(
            [self.control, flag, str(self.pid)],
            capture_output=True,
            text=True,
            timeout=CONTROL_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0 or "OK." not in result.stdout:
            said = " ".join((result.stdout + result.stderr).split())[:300]
            raise FleetError(f"callgrind_control {flag} {self.pid} failed: {said}")

    def instrument(self) -> None:
        """Start counting (`valgrind_argv` starts the process without).

        Raises:
            FleetError: the process did not take the request.
        """
        self._request("--instr=on")

    def zero(self) -> None:
        """Zero every thread's counters.

        Raises:
            FleetError: the process did not take the request.
        """
        self._request("-z")

    def dump(self) -> dict[int, int]:
        """Dump every thread's counters (which zeroes them) and read the dump.

        Returns:
            Thread -> instructions since the last zero or dump.

        Raises:
            FleetError: the process did not take the request, or the dump's files were not
                complete within `DUMP_WAIT_S`.
        """
        self._request("-d")
        self._dumps += 1
        deadline = time.monotonic() + DUMP_WAIT_S
        while True:
            dump = read_dump(self.out_dir, self.pid, self._dumps)
            if dump is not None:
                return dump
            if time.monotonic() > deadline:
                raise FleetError(f"dump {self._dumps} of pid {self.pid} incomplete after {DUMP_WAIT_S:g} s")
            time.sleep(0.2)  # files another process writes; nothing to wait on
