"""The pipeline benchmark: DuckDB's side against the generator's truth, the count comparison, and a
smoke run of the whole command (Spark and DuckDB on ~20,000 events, counts agreeing)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from benchmarks.fleet import pid_alive
from benchmarks.studies.pipeline import (
    DUCKDB_TABLES,
    Counts,
    compare,
    data_set,
    duckdb_analyze,
    expected_counts,
)
from pipeline.generate import generate

ROOT = Path(__file__).resolve().parents[3]
SMOKE_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("events")
    generate(directory, 6_000, keys=500, files=2, seed=3)
    return directory


def _duckdb() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute("SET TimeZone = 'UTC'")
    return con


def test_duckdb_analyze_json_matches_truth(events: Path, tmp_path: Path) -> None:
    """Scenario: DuckDB's quarantine, dedup and tables on the router's files find the known counts."""
    from pipeline.generate import load_truth

    truth = load_truth(events / "truth.json")
    con = _duckdb()
    found = duckdb_analyze(con, json_files=[events / f for f in truth.files], out=tmp_path / "out")
    assert compare(found, expected_counts(truth), what="duckdb") == []
    assert found.malformed_by_reason["unparseable"] > 0
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"per_key.parquet", "moves.parquet", "quarantine.parquet", "top_keys.parquet"} <= written


def test_duckdb_analyze_routers_parquet_matches_truth(tmp_path: Path) -> None:
    """Scenario: the same on the router's Parquet files (no malformed record)."""
    data = data_set(tmp_path, 3_000, quick=True, kind="parquet")
    assert all(p.name.endswith(".parquet") for p in data.files)
    found = duckdb_analyze(_duckdb(), parquet_dir=data.directory, out=tmp_path / "out")
    assert compare(found, expected_counts(data.truth), what="duckdb") == []
    assert found.duplicates > 0
    assert found.malformed == 0


def test_duckdb_tables_are_analyzes_tables_in_its_order() -> None:
    from pipeline.analyze import TABLES

    assert list(DUCKDB_TABLES) == list(TABLES)
    assert list(DUCKDB_TABLES).index("per_key") < list(DUCKDB_TABLES).index("top_keys")  # reads it


def test_duckdb_analyze_quarantine_counts_has_every_reason_in_order(events: Path, tmp_path: Path) -> None:
    """Scenario: the records set aside per reason come in ingest's order, 0 where a reason had
    none, the same as the summary's; analyze's columns, `files` null."""
    from pipeline.generate import load_truth
    from pipeline.ingest import REASONS

    truth = load_truth(events / "truth.json")
    con = _duckdb()
    found = duckdb_analyze(con, json_files=[events / f for f in truth.files], out=tmp_path / "out")
    counts = con.execute(f"SELECT * FROM read_parquet('{tmp_path / 'out' / 'quarantine_counts.parquet'}')")
    assert [d[0] for d in counts.description] == ["reason", "records", "files"]
    rows = counts.fetchall()
    assert [reason for reason, _, _ in rows] == list(REASONS)
    assert {reason: n for reason, n, _ in rows if n} == found.malformed_by_reason
    assert {files for _, _, files in rows} == {None}
    assert 0 in {n for _, n, _ in rows}  # the generator's malformed lines leave a reason out


def test_compare_names_each_difference() -> None:
    base = Counts(
        events=10,
        duplicates=1,
        malformed=2,
        malformed_by_reason={"unparseable": 2},
        decisions_by_status={"OK": 8},
        decisions_by_target={"a": 5, "b": 3},
        keys=4,
        cache_hits=1,
        null_keys=0,
    )
    other = dataclasses.replace(base, events=11, decisions_by_target={"a": 5, "b": 2}, moved_keys=3)
    problems = compare(other, base, what="x")
    assert len(problems) == 2
    assert "events is 11, expected 10" in problems[0]
    assert "'b': (2, 3)" in problems[1]


def test_data_set_reuses_matching_files(tmp_path: Path) -> None:
    first = data_set(tmp_path, 2_000, quick=True)
    assert first.generated
    again = data_set(tmp_path, 2_000, quick=True)
    assert not again.generated
    assert again.truth == first.truth
    other = data_set(tmp_path, 3_000, quick=True)
    assert other.generated
    assert other.directory != first.directory


@pytest.mark.integration
def test_pipeline_quick_counts_agree(tmp_path: Path) -> None:
    """Scenario: `python -m benchmarks.studies.pipeline --quick` runs Spark and DuckDB on the same ~20,000
    events, both find truth.json's counts, and the JVM and the data are gone afterwards."""
    out = tmp_path / "x.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.pipeline", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    assert doc["quick"] is True
    measured = {(m["engine"], m["input"]) for m in doc["measurements"]}
    assert measured == {("spark", "json"), ("spark", "parquet"), ("duckdb", "json"), ("duckdb", "parquet")}
    for m in doc["measurements"]:
        assert m["error"] is None, m
        assert m["seconds"] > 0
        assert m["counts"]["events"] > 0
    spark = {m["input"]: m["counts"] for m in doc["measurements"] if m["engine"] == "spark"}
    duck = {m["input"]: m["counts"] for m in doc["measurements"] if m["engine"] == "duckdb"}
    assert spark == duck
    assert doc["event_log"]["report_p50_us"] > 0
    assert [w["format"] for w in doc["event_log"]["writers"]] == ["parquet", "jsonl"]
    assert all(w["writer_us"] > 0 for w in doc["event_log"]["writers"])
    assert "Spark/DuckDB" in result.stdout
    assert "event log, in process" in result.stdout
    jvm = re.search(r"stopped the JVM \(pid (\d+)\)", result.stderr)
    assert jvm is not None, result.stderr[-3000:]
    assert not pid_alive(int(jvm.group(1)))
    assert not Path(doc["data"]["directory"]).exists()
    assert not Path(doc["parquet_data"]["directory"]).exists()
