"""benchmarks/studies/event_log_side.py: routerds with and without the event log, side by side."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from benchmarks.studies import event_log_side
from benchmarks.studies.event_log_side import Run, median_interval, report

if TYPE_CHECKING:
    from pathlib import Path


def _run(configuration: str, rate: float, routing_us: float) -> Run:
    return Run(
        configuration,
        0,
        rate,
        routing_us,
        routing_user_us=routing_us / 4,
        routing_system_us=routing_us * 3 / 4,
        other_threads_us=1.0,
        writer_us=0.0,
    )


def test_each_run_is_set_against_the_run_without_the_log_of_its_round() -> None:
    runs = [
        *(_run("off", 1000.0, 100.0), _run("on", 960.0, 103.0)),  # round 1: -4 %
        *(_run("off", 500.0, 200.0), _run("on", 490.0, 204.0)),  # round 2, the machine slower: -2 %
        *(_run("off", 800.0, 125.0), _run("on", 752.0, 130.0)),  # round 3: -6 %
    ]
    text = report(runs)
    # the medians of the rounds' changes
    assert "rate -4.0% [95 %: -6.0%, -2.0%], routing thread +4.0 µs (user +1.0)" in text
    assert text.endswith("goal: the event log costs <= 5% of the short-connection rate: -4.0%, met")
    runs[1] = _run("on", 900.0, 110.0)  # round 1: -10 %
    assert report(runs).endswith("-6.0%, not met")


def test_the_interval_of_a_median_holds_it_and_narrows_with_more_rounds() -> None:
    few = [-0.10, -0.02, -0.05, 0.01, -0.04, -0.03]
    low, high = median_interval(few)
    assert low <= -0.035 <= high  # the median of the six
    assert (low, high) == median_interval(few)  # seeded: the same runs, the same interval
    many_low, many_high = median_interval(few * 8)
    assert high - low > many_high - many_low
    assert median_interval([0.5]) == (0.5, 0.5)


@pytest.mark.parametrize(
    "argv", [["--rounds", "0"], ["--connections", "10"], ["--instances", "5"], ["--baseline", "/nonexistent"]]
)
def test_bad_arguments_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        event_log_side.main(argv)
    assert exited.value.code == 2
    assert "error: --" in capsys.readouterr().err


@pytest.mark.integration
def test_a_small_side_by_side_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "side.json"
    argv = ["--rounds", "2", "--connections", "300", "--instances", "1", "--json", str(path)]
    assert event_log_side.main(argv) == 0
    runs = json.loads(path.read_text())["runs"]
    assert [r["configuration"] for r in runs] == ["off", "on", "off", "on"]
    assert all(r["rate"] > 0 and r["routing_us"] > 0 for r in runs)
    assert all(r["routing_user_us"] + r["routing_system_us"] > 0 for r in runs)
    assert all(r["writer_us"] == 0 for r in runs if r["configuration"] == "off")  # no writer process
    assert "goal: the event log costs <= 5% of the short-connection rate" in capsys.readouterr().out


def _checkout(path: Path) -> Path:
    (path / "router").mkdir(parents=True)
    (path / "router" / "__main__.py").write_text("")
    return path


@pytest.mark.parametrize("names", [["a/same", "b/same"], ["a/on"], ["a/off"]])
def test_baselines_are_named_by_their_directories_which_must_differ(
    names: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [arg for name in names for arg in ("--baseline", str(_checkout(tmp_path / name)))]
    with pytest.raises(SystemExit) as exited:
        event_log_side.main(argv)
    assert exited.value.code == 2
    assert "error: --baseline: each directory's name names its configuration" in capsys.readouterr().err
