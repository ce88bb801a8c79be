"""`routerctl analyze` / `generate-events`: end to end on a generated log, and the user errors."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from pipeline.cli import COMMANDS, INSTALL_HINT, add_commands, run
from pipeline.generate import load_truth


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="routerctl")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_run_without_pyspark_prints_the_install_hint(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ImportError
    assert run(_args("analyze", "x", "--out", "y")) == 1
    assert capsys.readouterr().err == f"routerctl analyze: {INSTALL_HINT}\n"


def test_add_commands_adds_every_command():
    assert set(COMMANDS) == {"analyze", "generate-events", "simulate"}
    args = _args("analyze", "a", "b", "--out", "o", "--master", "local[1]", "--conf", "k=v=w")
    assert (args.events, args.master, args.conf) == (["a", "b"], "local[1]", [("k", "v=w")])
    with pytest.raises(SystemExit):
        _args("analyze", "a", "--out", "o", "--conf", "novalue")


def test_analyze_generated_log_end_to_end(spark, tmp_path, capsys):
    """Scenario: generate-events, then analyze: summary.json has exactly the generated numbers."""
    log, out = tmp_path / "log", tmp_path / "out"
    assert run(_args("generate-events", str(log), "--events", "3000", "--routers", "2", "--keys", "300")) == 0
    truth = load_truth(log / "truth.json")
    assert json.loads(capsys.readouterr().out)["lines"] == 3000
    assert run(_args("analyze", str(log), "--out", str(out), "--no-staging")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == truth.events
    assert summary["duplicates_removed"] == truth.duplicates == 30
    assert summary["malformed"] == truth.malformed == 3
    assert summary["decisions_by_status"] == truth.decisions_by_status
    assert summary["decisions_by_target"] == truth.decisions_by_target
    assert summary["keys"] == truth.keys
    assert summary["cache_hits"] == truth.cache_hits
    assert 0 <= summary["moved_keys"] <= summary["keys"]
    assert json.loads(capsys.readouterr().out)["events"] == truth.events
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert spark.range(1).count() == 1  # the CLI left the test session running


def test_analyze_user_errors_are_one_line(spark, tmp_path, capsys):
    assert run(_args("analyze", str(tmp_path / "missing"), "--out", str(tmp_path / "out"))) == 1
    assert (
        capsys.readouterr().err
        == f"routerctl analyze: no such file or directory: {str(tmp_path / 'missing')!r}\n"
    )
    with pytest.raises(SystemExit):
        _args("generate-events", str(tmp_path), "--events", "0")
