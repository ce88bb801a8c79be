"""`routerctl analyze` / `generate-events`: end to end on a generated log, and the user errors."""

from __future__ import annotations

import argparse
import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import (
    COMMANDS,
    EXIT_STATUS_HELP,
    EXIT_UNREADABLE,
    INSTALL_HINT,
    _conf,
    _positive,
    _rate,
    add_commands,
    job_failed,
    report_unreadable,
    run,
)
from pipeline.generate import generate, load_truth
from pipeline.ingest import InputError, UnreadableError, UnreadableFile
from router.config.settings import EventFileFormat
from tests.pipeline.conftest import damaged_log

PARQUET = EventFileFormat.PARQUET
ROUTERCTL = Path(sys.executable).with_name("routerctl")


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


def test_analyze_command_sets_damaged_files_aside(tmp_path):
    """Scenario: `routerctl analyze` (its own process and JVM, as a user runs it) over a log with a
    Parquet file cut short and a truncated .jsonl.zst: exit 0, both named with their reason in
    summary.json, report.html and quarantine_counts, every event of the other files counted, and
    no stack trace on stderr."""
    made = damaged_log(tmp_path)
    log, intact, damaged = made.log, made.intact, made.damaged
    out = tmp_path / "out"
    done = subprocess.run(
        [str(ROUTERCTL), "analyze", str(log), "--out", str(out), "--master", "local[1]", "--no-staging"],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},  # Spark's Python workers
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "\tat " not in done.stderr  # a Java stack trace's frames
    assert "Exception" not in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    reasons = {Path(u["file"]).name: u["reason"] for u in summary["unreadable_files"]}
    assert reasons == {
        damaged[0]: "parquet: no magic number at the end (cut short, or not a Parquet file)",
        damaged[1]: "zstd: the stream is cut short (its last frame has no end)",
    }
    assert summary["events"] == intact
    assert json.loads(done.stdout)["unreadable_files"] == 2
    for name, reason in reasons.items():
        assert f"set aside file:{log / name}: {reason}\n" in done.stderr
    report = (out / "report.html").read_text()
    assert all(f"{name}" in report and html.escape(reason) in report for name, reason in reasons.items())
    counts = pq.read_table(out / "quarantine_counts").to_pylist()
    assert {"reason": "unreadable file", "records": None, "files": 2} in counts


def test_analyze_every_file_unreadable_is_status_6(spark, tmp_path, capsys):
    log = damaged_log(tmp_path).log
    for intact in sorted(log.glob("*.parquet"))[1:]:
        intact.write_text('{"kind": "close"}\n')  # not what the name says
    assert run(_args("analyze", str(log), "--out", str(tmp_path / "out"))) == 6 == int(EXIT_UNREADABLE)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6
    assert err[-1].startswith("routerctl analyze: every event file is unreadable (5): file:")
    assert "parquet: no magic number at the start (not a Parquet file)" in err[1]
    assert EXIT_STATUS_HELP in " ".join(_help("analyze").split())


def _help(command: str) -> str:
    subparsers = argparse.ArgumentParser(prog="routerctl").add_subparsers(dest="command")
    add_commands(subparsers)
    return subparsers.choices[command].format_help()


def test_analyze_damage_no_check_sees_is_one_line(spark, tmp_path, capsys):
    """Scenario: a Parquet file whose pages are overwritten and whose footer is intact passes the
    check; Spark fails on it and the command says so in one line (status 1), not a traceback."""
    log = tmp_path / "log"
    generate(log, 300, routers=1, keys=30, duplicate_rate=0, malformed_rate=0, file_format=PARQUET)
    (written,) = log.glob("*.parquet")
    data = bytearray(written.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[4 : len(data) - 8 - footer] = b"\xa5" * (len(data) - 12 - footer)
    written.write_bytes(bytes(data))
    assert run(_args("analyze", str(log), "--out", str(tmp_path / "out"), "--no-staging")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("routerctl analyze: the Spark job failed: org.apache.spark.SparkException: ")
    assert written.name in err


# -- the parts without Spark -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (_conf, "spark.executor.memory=4g", ("spark.executor.memory", "4g")),
        (_conf, "k=", ("k", "")),
        (_positive, "3", 3),
        (_rate, "0", 0.0),
        (_rate, "0.49", 0.49),
    ],
)
def test_argument_types_accept(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (_conf, "novalue", "expected KEY=VALUE, got 'novalue'"),
        (_conf, "=v", "expected KEY=VALUE, got '=v'"),
        (_positive, "0", "must be >= 1, got 0"),
        (_positive, "2.5", "expected an integer, got '2.5'"),
        (_rate, "0.5", r"must be in \[0, 0.5\), got 0.5"),
        (_rate, "-0.1", r"must be in \[0, 0.5\), got -0.1"),
        (_rate, "half", "expected a number, got 'half'"),
    ],
)
def test_argument_types_reject_with_the_value(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}$"):
        parse(text)


def test_report_unreadable_names_at_most_ten(capsys):
    files = [UnreadableFile(file=f"file:/log/{i:02d}.parquet", reason="cut short") for i in range(12)]
    report_unreadable("analyze", files[:2])
    assert capsys.readouterr().err.splitlines() == [
        "routerctl analyze: set aside file:/log/00.parquet: cut short",
        "routerctl analyze: set aside file:/log/01.parquet: cut short",
    ]
    report_unreadable("simulate", files)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 11
    assert err[9] == "routerctl simulate: set aside file:/log/09.parquet: cut short"
    assert err[10] == "routerctl simulate: set aside 2 more unreadable files (summary.json names them all)"


def test_job_failed_says_one_line_and_gives_the_status(capsys):
    assert job_failed("analyze", InputError("no event files (*.jsonl) in ['/x']\nmore")) == 1
    assert capsys.readouterr().err == "routerctl analyze: no event files (*.jsonl) in ['/x']\n"
    unreadable = UnreadableError([UnreadableFile(file="file:/a.parquet", reason="cut short")])
    assert job_failed("simulate", unreadable) == int(EXIT_UNREADABLE)
    assert capsys.readouterr().err.splitlines() == [
        "routerctl simulate: set aside file:/a.parquet: cut short",
        "routerctl simulate: every event file is unreadable (1): file:/a.parquet: cut short",
    ]
    assert job_failed("analyze", KeyError("a bug")) is None  # re-raised by the caller
    assert capsys.readouterr().err == ""


def test_generate_events_refusals_are_one_line(tmp_path, capsys):
    """Scenario: Parquet files cannot hold malformed lines, and the default rate asks for some."""
    assert run(_args("generate-events", str(tmp_path), "--events", "10", "--parquet")) == 1
    assert capsys.readouterr().err == (
        "routerctl generate-events: Parquet files hold no malformed lines: "
        "malformed rate must be 0, got 0.001\n"
    )
    assert not list(tmp_path.iterdir())


def test_generate_events_parquet_writes_the_routers_files(tmp_path, capsys):
    argv = ("--events", "400", "--routers", "2", "--files", "2", "--malformed-rate", "0", "--parquet")
    assert run(_args("generate-events", str(tmp_path), *argv)) == 0
    printed = json.loads(capsys.readouterr().out)
    truth = load_truth(tmp_path / "truth.json")
    assert printed == {"lines": 400, "events": truth.events, "duplicates": truth.duplicates, "malformed": 0}
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == truth.files
    assert len(truth.files) == 4
