"""The benchmark's process handling: ports, readiness, RSS, CPU pinning, stop by PID."""

from __future__ import annotations

import functools
import os
import random
import resource
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from benchmarks.fleet import (
    CLOCK_TICK_S,
    PORT_RANGE,
    Fleet,
    FleetError,
    cpu_ns,
    cpu_ns_by_thread,
    cpu_ticks_by_thread,
    listening_ports,
    pick_ports,
    pid_alive,
    pinned,
    raise_fd_limit,
    rss_kib,
    stop_signals_interrupt,
)

if TYPE_CHECKING:
    from pathlib import Path


def test_pick_ports_are_distinct_free_and_below_ephemeral_range() -> None:
    ports = pick_ports(15, rng=random.Random(7))
    assert len(set(ports)) == 15
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] < 32768 for p in ports)


def test_listening_ports_sees_a_listener() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert server.getsockname()[1] in listening_ports()


def test_rss_kib_of_this_process_is_positive() -> None:
    assert rss_kib(os.getpid()) > 0


def test_rss_kib_of_missing_process_raises() -> None:
    with pytest.raises(FleetError, match="cannot read the RSS"):
        rss_kib(2**22 + 1)  # above pid_max's default maximum


def test_cpu_ns_is_the_sum_of_the_threads_and_children() -> None:
    sum(range(200_000))  # some CPU time on this thread
    threads, children = cpu_ns_by_thread(os.getpid())
    assert threads[threading.get_native_id()] > 0
    assert cpu_ns(os.getpid()) >= sum(threads.values()) + children
    with pytest.raises(FleetError, match="is gone"):
        cpu_ns_by_thread(2**22 + 1)  # above pid_max's default: no such process


def test_cpu_ticks_split_this_threads_time_into_user_and_system() -> None:
    me = threading.get_native_id()
    user_before, system_before = cpu_ticks_by_thread(os.getpid())[me]
    deadline = time.thread_time() + 5 * CLOCK_TICK_S
    while time.thread_time() < deadline:  # user time: several ticks of it
        sum(range(1_000))
    user_after, system_after = cpu_ticks_by_thread(os.getpid())[me]
    assert user_after - user_before >= 2
    assert system_after >= system_before
    assert cpu_ticks_by_thread(2**22 + 1) == {}  # no such process: no threads


def test_raise_fd_limit_reaches_the_hard_limit() -> None:
    soft = raise_fd_limit()
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft


def test_pinned_restores_the_cpu_set() -> None:
    before = os.sched_getaffinity(0)
    cpu = max(before)
    with pinned([], cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


def test_pinned_pins_other_processes_and_rejects_pid_0(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    with Fleet(tmp_path, say=lambda _t: None) as fleet:
        (port,) = pick_ports(1)
        server = f"import socket,time; s=socket.create_server(('127.0.0.1',{port})); time.sleep(60)"
        proc = fleet.start("toy", [sys.executable, "-c", server], ports=[port])
        before = os.sched_getaffinity(proc.pid)
        with pinned([proc.pid], cpu):
            assert os.sched_getaffinity(proc.pid) == {cpu}
        assert os.sched_getaffinity(proc.pid) == before
    with pytest.raises(ValueError, match="positive"), pinned([0], cpu):
        pass


def test_fleet_starts_waits_for_the_port_and_stops_by_pid(tmp_path: Path) -> None:
    (port,) = pick_ports(1)
    server = f"import socket,time; s=socket.create_server(('127.0.0.1',{port})); time.sleep(60)"
    said: list[str] = []
    with Fleet(tmp_path, say=said.append) as fleet:
        proc = fleet.start("toy", [sys.executable, "-c", server], ports=[port])
        assert port in listening_ports()
    assert proc.returncode is not None
    assert not pid_alive(proc.pid)
    assert said == [f"started toy (pid {proc.pid})", f"stopped toy (pid {proc.pid})"]


def _says_up(fleet: Fleet, name: str) -> bool:
    return "up" in fleet.tail(name)


def test_fleet_stop_waits_a_child_s_own_grace_before_sigkill(tmp_path: Path) -> None:
    """Scenario: a child that takes 1 s to exit after SIGTERM, as valgrind writing its last dump:
    with a grace of 0.2 s it is killed, with 10 s it exits by itself."""
    slow_exit = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(7)))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    with Fleet(tmp_path, say=lambda _t: None) as fleet:
        for name, grace_s, status in (("killed", 0.2, -signal.SIGKILL), ("waited", 10.0, 7)):
            proc = fleet.start(name, [sys.executable, "-c", slow_exit], stop_grace_s=grace_s)
            fleet.wait_until(name, proc, functools.partial(_says_up, fleet, name), 10, "set its handler")
            fleet.stop(proc)
            assert proc.returncode == status


def test_fleet_start_reports_an_early_exit_with_the_log(tmp_path: Path) -> None:
    (port,) = pick_ports(1)
    with (
        Fleet(tmp_path, say=lambda _t: None) as fleet,
        pytest.raises(FleetError, match=r"exited with status 3.*boom"),
    ):
        fleet.start("bad", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], ports=[port])


def test_stop_signals_interrupt_turns_sigterm_into_keyboard_interrupt_and_restores() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), stop_signals_interrupt():
        signal.raise_signal(signal.SIGTERM)  # its handler runs before this call returns
    assert signal.getsignal(signal.SIGTERM) is before
