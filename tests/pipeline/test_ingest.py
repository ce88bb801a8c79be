"""Ingest: exact quarantine and duplicate counts, JSON and Parquet input, user errors."""

from __future__ import annotations

import json

import pytest

from pipeline.generate import generate
from pipeline.ingest import REASONS, InputError, event_files, ingest, write_text


def test_ingest_generated_files_gives_the_known_counts(spark, tmp_path):
    """Scenario: a generated log with known duplicates and malformed lines, staged as Parquet."""
    truth = generate(tmp_path / "log", 4000, routers=2, keys=200, duplicate_rate=0.03, malformed_rate=0.01)
    (tmp_path / "log" / ".events-rtr-z-0000.jsonl.zst.tmp").write_bytes(b"still being written")
    result = ingest(spark, [str(tmp_path / "log")], staging=str(tmp_path / "staging"))
    assert dict(result.malformed_by_reason) == {r: truth.malformed_by_reason.get(r, 0) for r in REASONS}
    assert result.malformed == truth.malformed == 40
    assert result.duplicates == truth.duplicates == 120
    assert result.events.count() == truth.events


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
def test_ingest_mixes_json_and_parquet_and_keeps_one_copy(spark, tmp_path, staged):
    """Scenario: seq 1 in a JSON file and a Parquet file, seq 2 twice in the JSON file: in place
    the copies are dropped by a shuffle, staged each repeated key keeps its row with the smallest
    row id (one copy, from whichever file)."""
    line = (
        '{"kind":"close","router_id":"r1","seq":%d,"ts":"2026-11-18T11:00:00.000000Z","conn":1,'
        '"router":"cr","acceptor":"a","node_id":"n1","duration_s":1.0,"bytes_in":1,"bytes_out":2,'
        '"reason":"closed"}\n'
    )
    (tmp_path / "a.jsonl").write_text(line % 1 + line % 2 + line % 2 + '{"kind":"close","seq":3}\n')
    parquet = str(tmp_path / "p.parquet")
    spark.read.json(str(tmp_path / "a.jsonl")).where("seq = 1").write.parquet(parquet)
    staging = str(tmp_path / "staging") if staged else None
    result = ingest(spark, [str(tmp_path / "a.jsonl"), parquet], staging=staging)
    assert result.duplicates == 2  # seq 1 in both files, seq 2 twice in the JSON
    assert result.malformed_by_reason["missing router_id"] == 1
    assert sorted(r.seq for r in result.events.select("seq").collect()) == [1, 2]
    assert result.quarantine.count() == 1


def test_event_files_user_errors(spark, tmp_path):
    with pytest.raises(InputError, match="no such file"):
        event_files(spark, [str(tmp_path / "missing")])
    write_text(spark, str(tmp_path / "only" / "truth.json"), "{}")
    with pytest.raises(InputError, match="no event files"):
        event_files(spark, [str(tmp_path / "only")])
    assert (tmp_path / "only" / "truth.json").read_text() == "{}"


def test_ingest_without_malformed_records_quarantines_without_reading(spark, tmp_path):
    """Scenario: a log with duplicates and no malformed line (the router's own files): the counts
    say so, and the quarantine is an empty relation that reads no file."""
    truth = generate(tmp_path / "log", 1000, routers=2, keys=50, duplicate_rate=0.02, malformed_rate=0.0)
    result = ingest(spark, [str(tmp_path / "log")], staging=str(tmp_path / "staging"))
    assert truth.malformed == result.malformed == 0
    assert result.duplicates == truth.duplicates > 0
    assert result.quarantine.columns == ["reason", "raw", "file"]
    assert result.quarantine.count() == 0
    plan = result.quarantine._jdf.queryExecution().optimizedPlan().toString()
    assert "Relation" not in plan.replace("LocalRelation", ""), plan


@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
def test_ingest_finds_repeated_events_at_bucket_edges_and_far_apart(spark, tmp_path, staged):
    """Scenario: sequence numbers at the edges of the first step's buckets (63, 64, -1, -64),
    far apart (2^62), the same number under two router ids (two events, not a copy), and a
    bucket holding 128, 129, 130 and 130 again (four rows, as many as 128-131 would be: only the
    mask of the numbers seen tells). Exactly the copies go, whatever the bucket."""
    copies = [63, 64, -1, -64, 1 << 62, 130]
    once = [0, 62, 65, -2, -65, (1 << 62) + 1, 1 << 40, 128, 129]
    rows = [
        {"kind": "close", "router_id": "r1", "seq": seq, "ts": "2026-11-18T11:00:00Z", "conn": 1}
        for seq in copies * 2 + once
    ] + [{"kind": "close", "router_id": "r2", "seq": 63, "ts": "2026-11-18T11:00:00Z", "conn": 2}]
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    staging = str(tmp_path / "staging") if staged else None
    result = ingest(spark, [str(tmp_path / "log")], staging=staging)
    assert result.duplicates == len(copies)
    assert result.malformed == 0
    kept = sorted((r.router_id, r.seq) for r in result.events.select("router_id", "seq").collect())
    assert kept == sorted([("r1", seq) for seq in copies + once] + [("r2", 63)])
