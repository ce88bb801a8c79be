"""The benchmark command: a smoke run of the whole harness, one of the artemis group, and its
command line.

The smoke runs are not timed tests: they assert only that every figure is produced and positive,
that a figure routerd cannot produce yet is null with a reason saying so, and that every process
started was stopped.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from benchmarks import run
from benchmarks.artemis import missing_artemis
from benchmarks.clients import REQUIRED_TOOLS, Loadgen, find_tool
from benchmarks.configs import Ports
from benchmarks.fleet import Fleet, pick_ports, pid_alive
from benchmarks.report import DEFAULT_GROUPS, GOALS, NOT_SUPPORTED, new_figures

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

ROOT = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300
ARTEMIS_SMOKE_TIMEOUT_S = 300
"""Bound of `--quick --only artemis` (19-60 s measured on 2 shared CPUs: three JVM starts, an
`artemis create`, javac, a client JVM)."""
ARTEMIS_PROCESSES = {"target-1", "target-2", "artemis router", "routerd-artemis"}
PAIRS_COMMAND = (
    sys.executable,
    "-m",
    "benchmarks.run",
    "--quick",
    "--only",
    "rate",
    "--event-log-pairs",
    "2",
)


def _smoke(*args: str, timeout: float = SMOKE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.run ARGS` from the repository root; it must exit 0."""
    _require_tools()
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _require_tools() -> None:
    missing = [tool for tool in REQUIRED_TOOLS if find_tool(tool) is None]
    if missing:
        pytest.fail(f"the benchmark needs {', '.join(missing)}: run ./run-tests, which installs them")


@pytest.mark.integration
def test_run_quick_produces_every_figure(tmp_path: Path) -> None:
    """Scenario: `python -m benchmarks.run --quick` starts everything, fills every figure of the
    default groups (all but artemis; the instructions group's under callgrind too), stops all."""
    out = tmp_path / "x.json"
    result = _smoke("--quick", "--json", str(out))
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    assert doc["quick"] is True
    assert doc["groups"] == list(DEFAULT_GROUPS)
    figures = doc["figures"]
    assert set(figures) == {n for n, f in new_figures().items() if f.group in DEFAULT_GROUPS}
    for name, figure in figures.items():
        assert figure["values"], name
        for path, value in figure["values"].items():
            if value is None:
                assert path == "routerd", (name, path)
                assert figure["reasons"][path].startswith(NOT_SUPPORTED), (name, figure["reasons"])
            else:
                assert isinstance(value, int | float), (name, path, value)
                assert value > 0, (name, path, value)
        if figure["values"].get("haproxy") and figure["values"].get("routerd"):
            assert figure["ratio_routerd_haproxy"] > 0, name
    assert "routerd/HAProxy" in result.stdout
    assert len(doc["goals"]) == len(GOALS)
    default_goals = [g for g in doc["goals"] if "Artemis" not in g["goal"]]
    assert all(isinstance(goal["median"], float) for goal in default_goals), doc["goals"]
    assert "goal (median over runs" in result.stdout
    assert "Artemis" not in result.stdout.splitlines()[0]
    for figure in figures.values():
        assert figure["title"] in result.stdout
    started = dict(re.findall(r"started (.+) \(pid (\d+)\)", result.stderr))
    stopped = dict(re.findall(r"stopped (.+) \(pid (\d+)\)", result.stderr))
    assert {"echo backends", "iperf3 server", "mosquitto", "haproxy", "routerd"} <= set(started)
    assert {"haproxy callgrind", "routerd callgrind"} <= set(started)
    for name in ("instructions_echo", "instructions_mqtt3"):
        details = figures[name]["details"]
        assert details["routerd"]["counted"].endswith("the busiest"), details
        assert details["haproxy"]["counted"] == "all threads", details
        assert details["routerd"]["batches"] == list(run.QUICK.instructions_batches)
    assert started.items() <= stopped.items(), result.stderr
    assert not [name for name, pid in started.items() if pid_alive(int(pid))]


@pytest.mark.integration
def test_run_quick_artemis_group_measures_routerd_beside_artemis(tmp_path: Path) -> None:
    """Scenario: `--quick --only artemis` starts three real Artemis 2.40 brokers (a pure router and
    its two targets) and a routerd over the same targets; both redirect the CORE, AMQP and MQTT 5
    openings of the same load client, a Java client reaches a session through each, every figure
    of the group is positive with its ratio routerd/Artemis, and every process is stopped."""
    missing = missing_artemis()
    if missing:
        pytest.fail(f"the artemis group needs {', '.join(missing)}: run deploy/bootstrap.sh")
    out = tmp_path / "artemis.json"
    result = _smoke("--quick", "--only", "artemis", "--json", str(out), timeout=ARTEMIS_SMOKE_TIMEOUT_S)
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    assert doc["groups"] == ["artemis"]
    assert doc["versions"]["artemis"] == "2.40.0"
    figures = doc["figures"]
    assert set(figures) == {n for n, f in new_figures().items() if f.group == "artemis"}
    for name, figure in figures.items():
        for path, value in figure["values"].items():
            assert isinstance(value, int | float), (name, path, figure["reasons"])
            assert value > 0, (name, path, value)
        assert figure["ratio_routerd_artemis"] > 0, name
    for name in ("artemis_core_redirect_rate", "artemis_amqp_redirect_rate", "artemis_mqtt5_redirect_rate"):
        assert figures[name]["details"]["artemis"]["errors"] == 0, figures[name]["details"]
        assert figures[name]["details"]["routerd"]["errors"] == 0, figures[name]["details"]
        assert (
            figures[name]["values"]["haproxy"] == figures["artemis_core_redirect_rate"]["values"]["haproxy"]
        )
    session = figures["artemis_first_session"]["details"]
    assert [session[p]["errors"] for p in ("direct", "artemis", "routerd")] == [0, 0, 0]
    setup = figures["artemis_router_start"]["details"]["setup_s"]
    assert setup["total"] > setup["routers_start_to_first_redirect"]["artemis"] > 0
    artemis_goals = [g for g in doc["goals"] if "Artemis" in g["goal"]]
    assert len(artemis_goals) == 3
    assert all(isinstance(g["median"], float) for g in artemis_goals), artemis_goals
    header = result.stdout.splitlines()[0].split()
    assert header[-2:] == ["routerd/HAProxy", "routerd/Artemis"]
    started = dict(re.findall(r"started (.+) \(pid (\d+)\)", result.stderr))
    stopped = dict(re.findall(r"stopped (.+) \(pid (\d+)\)", result.stderr))
    assert ARTEMIS_PROCESSES | {"haproxy", "routerd"} <= set(started)
    assert started.items() <= stopped.items(), result.stderr
    assert not [name for name, pid in started.items() if pid_alive(int(pid))]


def test__parse_args_default_leaves_out_artemis() -> None:
    assert run._parse_args([]).groups == list(DEFAULT_GROUPS)
    assert run._parse_args(["--only", "artemis,rate"]).groups == ["rate", "artemis"]


def test_main_artemis_without_java_or_artemis_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "missing_artemis", lambda: ["javac"])
    assert run.main(["--quick", "--only", "artemis", "--json", str(tmp_path / "x.json")]) == 2
    assert "missing javac" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_main_instructions_without_valgrind_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "find_tool", lambda name: None if name == "callgrind_control" else name)
    assert run.main(["--quick", "--only", "instructions", "--json", str(tmp_path / "x.json")]) == 2
    assert "missing callgrind_control" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_main_only_decision_runs_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    assert run.main(["--quick", "--only", "decision", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["figures"]) == {
        "decision_miss_p50",
        "decision_miss_p99",
        "decision_hit_p50",
        "decision_hit_p99",
    }
    assert all(f["values"]["routerd"] > 0 for f in doc["figures"].values())
    assert "routing decision, cache hit, p50" in capsys.readouterr().out


def test_main_runs_twice_and_reports_medians(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    assert run.main(["--quick", "--only", "decision", "--runs", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["runs"] == 2
    assert len(doc["per_run"]) == 2
    per_run = [r["decision_miss_p99"]["values"]["routerd"] for r in doc["per_run"]]
    assert doc["figures"]["decision_miss_p99"]["values"]["routerd"] == pytest.approx(sum(per_run) / 2)
    (miss,) = [g for g in doc["goals"] if g["goal"] == "routing decision p99, cache miss (us)"]
    assert miss["per_run"] == [round(v, 4) for v in per_run]
    assert "medians of 2 runs:" in capsys.readouterr().out


@pytest.mark.integration
def test_event_log_pairs_measure_routerd_without_then_with_the_log(tmp_path: Path) -> None:
    """Scenario: `--event-log-pairs 2 --only rate --quick`: four fresh routerds, the second of
    each pair writing its event log; each pair's change and the goal's verdict come from them."""
    out = tmp_path / "pairs.json"
    result = _smoke("--quick", "--only", "rate", "--event-log-pairs", "2", "--json", str(out))
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    assert len(doc["pairs"]) == 2
    rates = [
        (
            pair["off"]["connection_rate"]["values"]["routerd"],
            pair["on"]["connection_rate"]["values"]["routerd"],
        )
        for pair in doc["pairs"]
    ]
    assert doc["changes"]["connection_rate"] == [round(on / off - 1, 4) for off, on in rates]
    median = sorted(on / off - 1 for off, on in rates)
    assert doc["goal"]["median"] == pytest.approx((median[0] + median[1]) / 2)
    assert doc["goal"]["met"] is (doc["goal"]["median"] >= -0.05)
    assert "goal: the event log costs <= 5% of the short-connection rate" in result.stdout


def test_pair_changes_are_with_over_without_per_pair() -> None:
    pairs = []
    for off, on in ((100.0, 90.0), (200.0, 190.0)):
        without, with_log = new_figures(), new_figures()
        without["connection_rate"].set("routerd", off)
        with_log["connection_rate"].set("routerd", on)
        pairs.append((without, with_log))
    assert run.pair_changes(pairs) == {"connection_rate": [pytest.approx(-0.1), pytest.approx(-0.05)]}


def test__parse_args_event_log_pairs_run_alone(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--event-log-pairs", "2", "--runs", "2"], ["--event-log-pairs", "2", "--event-log"]):
        with pytest.raises(SystemExit):
            run._parse_args(argv)
        assert "takes neither --runs nor --event-log" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run._parse_args(["--event-log-pairs", "21"])
    assert "--event-log-pairs must be 1-20" in capsys.readouterr().err


def test__parse_args_runs_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run._parse_args(["--runs", "0"])
    assert "--runs must be 1-10" in capsys.readouterr().err


def test_main_missing_tool_exits_2_and_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "find_tool", lambda name: None if name == "iperf3" else f"/usr/bin/{name}")
    assert run.main(["--quick", "--only", "bulk", "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "missing iperf3" in err
    assert "./run-tests" in err
    assert not (tmp_path / "x.json").exists()


def test__parse_args_only_keeps_run_order() -> None:
    args = run._parse_args(["--only", "decision,memory"])
    assert args.groups == ["memory", "decision"]


def test__parse_args_only_rejects_unknown_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run._parse_args(["--only", "memory,nope"])
    assert "--only takes names from" in capsys.readouterr().err


def test_default_json_path_is_outside_the_tree() -> None:
    assert not run.default_json_path().is_relative_to(ROOT)


def test_settings_quick_is_smaller_than_full() -> None:
    assert run.QUICK.rate_total < run.FULL.rate_total
    assert run.QUICK.idle_connections < run.FULL.idle_connections
    assert run.FULL.idle_connections == 5000
    assert run.FULL.rate_concurrency == 50
    assert sum(run.QUICK.instructions_batches) < sum(run.FULL.instructions_batches)
    for settings in (run.QUICK, run.FULL):
        first, second = settings.instructions_batches
        assert 0 < first < second


@pytest.fixture(params=[b"\x20\x02\x00\x00", b"\x20\x03\x00\x9c\x00"], ids=["connack-0", "connack-9c"])
def probed_bench(
    request: pytest.FixtureRequest, tmp_path: Path, fake_broker: Callable[[bytes | None], int]
) -> Iterator[tuple[run.Bench, bytes]]:
    redirect, probe = fake_broker(request.param), fake_broker(request.param)  # listening: not picked below
    ports = dataclasses.replace(
        Ports.from_numbers(pick_ports(Ports.COUNT)), routerd_redirect=redirect, routerd_probe=probe
    )
    with Fleet(tmp_path, say=lambda _t: None) as fleet:
        bench = run.Bench(fleet, run.QUICK, new_figures(), log_level="WARNING")
        bench.ports = ports
        bench.loadgen = Loadgen(tmp_path / "loadgen", fleet)
        yield bench, request.param


def test_bench_support_probes_explain_what_routerd_did(probed_bench: tuple[run.Bench, bytes]) -> None:
    """Scenario: a routerd that proxies everything (CONNACK 0x00) or answers everything with 0x9C."""
    bench, reply = probed_bench
    client_id, redirect = bench.client_id_support(), bench.redirect_support()
    if reply[3] == 0:
        assert client_id is not None
        assert "routed it as key NULL" in client_id
        assert redirect == "the mode=redirect acceptor proxied the MQTT 5 CONNECT to mosquitto (CONNACK 0x00)"
    else:
        assert client_id is not None
        assert "got 'connack 0x9c', not CONNACK 0x00" in client_id
        assert redirect is None
