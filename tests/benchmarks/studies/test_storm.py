"""The reconnect-storm benchmark: its pure helpers (back-off, mosquitto's log, binning per second,
the slow-start bound, the acceptance), and a `--quick` run end to end with real mosquitto brokers,
routerd and HAProxy."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import storm
from benchmarks.studies.storm import acceptance, backoff_s, parse_connects, per_second, slow_start_bound

ROOT = Path(__file__).resolve().parents[3]


class TestBackoff:
    def test_backoff_s_first_retry_is_jittered_between_a_tenth_and_one_second(self) -> None:
        rng = random.Random(7)
        waits = [backoff_s(0, rng) for _ in range(2000)]
        assert 0.1 <= min(waits) < 0.15
        assert 0.95 < max(waits) <= 1.0

    def test_backoff_s_doubles_with_each_failure_up_to_eight_times(self) -> None:
        rng = random.Random(7)
        for failures, factor in [(1, 2), (2, 4), (3, 8), (4, 8), (30, 8)]:
            waits = [backoff_s(failures, rng) for _ in range(500)]
            assert 0.1 * factor <= min(waits), failures
            assert max(waits) <= 1.0 * factor, failures

    def test_backoff_s_rejects_a_negative_count(self) -> None:
        with pytest.raises(ValueError, match="failures must be 0 or more"):
            backoff_s(-1, random.Random())


def test_parse_connects_reads_the_sessions_of_mosquittos_notices() -> None:
    """Scenario: mosquitto 2.0.11's own lines (log_type notice, default epoch timestamp): only the
    sessions count, not the bare TCP connections (probes) or the disconnections."""
    log = (
        "1795946393: mosquitto version 2.0.11 running\n"
        "1795946393: New connection from 127.0.0.1:50716 on port 21883.\n"
        "1795946393: New client connected from 127.0.0.1:50716 as storm-17 (p2, c1, k300).\n"
        "1795946393: Client storm-17 closed its connection.\n"
        "1795946394: New connection from 127.0.0.1:50718 on port 21883.\n"
        "1795946394: Client <unknown> closed its connection.\n"
        "1795946395: New client connected from 127.0.0.3:40000 as storm-2 (p2, c1, k300).\n"
    )
    assert parse_connects(log) == [(1795946393, "storm-17"), (1795946395, "storm-2")]


def test_per_second_bins_every_second_of_the_window_empty_ones_too() -> None:
    seconds = [99, 100, 100, 102, 102, 102, 104]
    assert per_second(seconds, 100, 103) == [2, 0, 3, 0]
    assert per_second([], 5, 5) == [0]


def test_slow_start_bound_grows_from_the_floor_to_the_rate() -> None:
    assert slow_start_bound(500, 10, 0) == pytest.approx(500 * 0.05 * 1.1)
    assert slow_start_bound(500, 10, 5) == pytest.approx(500 * 0.5 * 1.1)
    assert slow_start_bound(500, 10, 12) == pytest.approx(550)
    assert slow_start_bound(500, 0, 0) == pytest.approx(550)


class TestAcceptance:
    def test_acceptance_passes_within_every_bound(self) -> None:
        checks = acceptance(rate=500, peaks=[550, 0], back_s=9.2, orphans=2100, lost=0)
        assert [c.passed for c in checks] == [True, True, True]

    def test_acceptance_fails_each_bound_on_its_own(self) -> None:
        checks = acceptance(rate=500, peaks=[551, 0], back_s=9.3, orphans=2100, lost=1)
        assert [c.passed for c in checks] == [False, False, False]
        assert "551" in checks[0].detail

    def test_acceptance_fails_when_some_orphan_never_came_back(self) -> None:
        checks = acceptance(rate=500, peaks=[10], back_s=None, orphans=2100, lost=0)
        assert checks[1].passed is False
        assert checks[1].detail == "not all back"


@pytest.mark.integration
def test_storm_quick_run_meets_the_acceptance(tmp_path: Path) -> None:
    """Scenario: `--quick` (300 sessions, R 60/s): every scenario's orphans come back and no
    survivor session is lost; with the connect rate no survivor takes more than 66 in a second;
    the returned broker takes sessions again; every process is stopped (exit 0)."""
    out = tmp_path / "storm.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.storm", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["schema"] == storm.SCHEMA
    by_name = {s["scenario"]: s for s in document["scenarios"]}
    assert list(by_name) == list(storm.SCENARIOS)
    for figures in by_name.values():
        assert figures["all_back"] is True, figures
        assert figures["orphans"] > 0
        assert figures["orphans_back"] == figures["orphans"]
        assert figures["survivor_sessions_lost"] == 0, figures
        assert figures["proxy_cpu_s"] > 0
    limited = by_name["routerd-rate"]
    assert max(limited["peak_connects_per_s"].values()) <= 60 * 1.1
    assert limited["time_to_all_back_s"] <= limited["orphans"] / 60 + 5
    returned = limited["return"]
    assert returned["all_open_after"] is True
    assert returned["rebalance"]["state"] == "done"
    assert sum(r["connects"] for r in returned["ramp"]) > 0
    assert [a["passed"] for a in document["acceptance"]] == [True, True, True]
    assert "PASS: no survivor above R x 1.1" in result.stdout
