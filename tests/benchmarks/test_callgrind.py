"""Instruction counts: callgrind's dump names and totals, the per-connection arithmetic, which
threads a proxy's figure counts; and the compiled echo server under a real callgrind, counted
between zeroes and dumps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from benchmarks.callgrind import (
    CALLGRIND_TOOLS,
    Callgrind,
    counted_value,
    dump_total,
    parse_dump_name,
    per_connection,
    read_dump,
    valgrind_argv,
)
from benchmarks.clients import Loadgen, build_c_tools, find_tool
from benchmarks.fleet import Fleet, FleetError, pick_ports, pid_alive

if TYPE_CHECKING:
    from pathlib import Path

DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 22875
cmd:  .venv/bin/routerd --config routerd.xml --log-level WARNING --no-admin
part: 1
thread: 3

positions: line
events: Ir
summary: 660110187


ob=(2) ???
fn=(1098) 0x0000000004936778
0 6

totals: 660125068
"""
"""The head and tail of a real dump of routerd's data-path thread (callgrind 3.19, abridged): the
header's summary and the totals callgrind writes last differ a little; the summary is the figure."""


def test_valgrind_argv_counts_per_thread_from_instrument_on(tmp_path: Path) -> None:
    argv = valgrind_argv("/usr/bin/valgrind", tmp_path, ["haproxy", "-db"])
    assert argv[0] == "/usr/bin/valgrind"
    assert argv[-2:] == ["haproxy", "-db"]
    for option in ("--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no", "--dump-instr=no"):
        assert option in argv
    assert f"--callgrind-out-file={tmp_path}/cg.%p" in argv


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("cg.22875.2-03", (22875, 2, 3)),
        ("cg.22875.12-01", (22875, 12, 1)),
        ("cg.22875-03", None),  # the dump at exit
        ("cg.22875", None),  # the empty file callgrind opens at start
        ("routerd.xml", None),
    ],
)
def test_parse_dump_name(name: str, parsed: tuple[int, int, int] | None) -> None:
    assert parse_dump_name(name) == parsed


class TestDumpTotal:
    def test_dump_total_is_the_summary(self) -> None:
        assert dump_total(DUMP) == 660110187

    def test_dump_total_without_summary_is_the_totals(self) -> None:
        assert dump_total(DUMP.replace("summary: 660110187\n", "")) == 660125068

    def test_dump_total_of_an_incomplete_file_is_none(self) -> None:
        """Scenario: callgrind is still writing the file (its totals line comes last)."""
        assert dump_total(DUMP.split("totals:")[0]) is None
        assert dump_total("") is None

    def test_dump_total_rejects_a_line_without_count(self) -> None:
        with pytest.raises(ValueError, match="holds no count"):
            dump_total(DUMP.replace("summary: 660110187", "summary: many"))


def test_per_connection_divides_the_difference_by_the_extra_connections() -> None:
    """Scenario: what both batches share (fixed cost 1,000 on thread 1) cancels; a thread that ran
    in the second batch only counts from 0."""
    first = {1: 1_000 + 500 * 200, 2: 10}
    second = {1: 1_000 + 1_500 * 200, 2: 10, 3: 3_000}
    assert per_connection(first, second, counts=(500, 1500)) == {1: 200.0, 2: 0.0, 3: 3.0}


def test_per_connection_needs_a_larger_second_batch() -> None:
    with pytest.raises(ValueError, match="must be larger"):
        per_connection({1: 1}, {1: 2}, counts=(500, 500))


def test_counted_value_takes_the_busiest_thread_or_all() -> None:
    per_thread = {1: 9_958.0, 2: 21.0, 3: 217_546.0}
    assert counted_value(per_thread, "busiest") == (217_546.0, "thread 3, the busiest")
    assert counted_value(per_thread, "all") == (227_525.0, "all threads")
    with pytest.raises(ValueError, match="no thread"):
        counted_value({}, "all")


def test_read_dump_takes_one_dump_of_one_process(tmp_path: Path) -> None:
    for name, total in (("cg.7.1-01", 5), ("cg.7.1-02", 6), ("cg.7.2-01", 50), ("cg.8.1-01", 99)):
        (tmp_path / name).write_text(DUMP.replace("660110187", str(total)))
    (tmp_path / "cg.7-01").write_text(DUMP)  # at exit
    (tmp_path / "cg.7").write_text("")
    assert read_dump(tmp_path, 7, 1) == {1: 5, 2: 6}
    assert read_dump(tmp_path, 7, 2) == {1: 50}
    assert read_dump(tmp_path, 7, 3) is None


def test_read_dump_waits_for_every_file_of_the_dump(tmp_path: Path) -> None:
    (tmp_path / "cg.7.1-01").write_text(DUMP)
    (tmp_path / "cg.7.1-02").write_text(DUMP.split("totals:")[0])
    assert read_dump(tmp_path, 7, 1) is None


@pytest.mark.integration
def test_callgrind_counts_the_echo_server_per_connection(tmp_path: Path) -> None:
    """Scenario: the compiled echo server under callgrind, not counting until told; zero, 20
    connections, dump, zero, 60 connections, dump: each dump holds the echo server's thread, and
    the count per connection is positive; a process not under callgrind is an error; stopping by
    PID ends valgrind."""
    missing = [tool for tool in CALLGRIND_TOOLS if find_tool(tool) is None]
    if missing:
        pytest.fail(
            f"the instructions group needs {', '.join(missing)}: run ./run-tests, which installs them"
        )
    binaries = build_c_tools(tmp_path)
    (port,) = pick_ports(1)
    out = tmp_path / "callgrind"
    out.mkdir()
    valgrind, control = (str(find_tool(tool)) for tool in CALLGRIND_TOOLS)
    with Fleet(tmp_path, say=lambda _text: None) as fleet:
        proc = fleet.start(
            "echo callgrind",
            valgrind_argv(valgrind, out, [str(binaries["echo_srv"]), "127.0.0.1", str(port)]),
            ports=[port],
            timeout=60,
        )
        callgrind = Callgrind(control, proc.pid, out)
        callgrind.instrument()
        loadgen = Loadgen(binaries["loadgen"], fleet)
        dumps = []
        for total in (20, 60):
            callgrind.zero()
            result = loadgen.rate(port, kind="echo", concurrency=5, total=total, seconds=30)
            assert result.ok == total
            dumps.append(callgrind.dump())
        assert all(1 in dump for dump in dumps), dumps
        per_thread = per_connection(dumps[0], dumps[1], counts=(20, 60))
        assert per_thread[1] > 0
        with pytest.raises(FleetError, match="callgrind_control -z"):
            Callgrind(control, fleet.start("sleep", ["sleep", "60"]).pid, out).zero()
        fleet.stop(proc)
        assert not pid_alive(proc.pid)
    assert read_dump(out, proc.pid, 2) == dumps[1]
