"""Ingest: exact quarantine and duplicate counts, JSON and Parquet input, user errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipeline.generate import generate
from pipeline.ingest import (
    REASONS,
    InputError,
    UnreadableError,
    check_event_file,
    event_files,
    ingest,
    write_text,
)
from router.config.settings import EventFileFormat
from tests.pipeline.conftest import damaged_log

PARQUET = EventFileFormat.PARQUET


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


# -- damaged files ------------------------------------------------------------------------------


def test_check_event_file_names_each_damage(tmp_path):
    """Scenario: files cut short, with a bad footer, not what their name says, unreadable: each one
    gets a one-line reason; intact files get none."""
    log = damaged_log(tmp_path).log
    good = sorted(log.glob("*.parquet"))[1]
    (zst,) = (tmp_path / "json").glob("*.jsonl.zst")
    data = good.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    bad_footer = tmp_path / "bad-footer.parquet"
    bad_footer.write_bytes(data[: -8 - footer] + b"\xff" * footer + data[-8:])
    (tmp_path / "json.parquet").write_text('{"kind": "close"}\n')
    (tmp_path / "plain.jsonl.zst").write_text('{"kind": "close"}\n')
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"kind": "close"}\n' * 1000)[:100])
    (tmp_path / "dir.parquet").mkdir()
    corrupt = bytearray(zst.read_bytes())
    corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 64] = b"\xff" * 64  # a compressed block overwritten
    (tmp_path / "corrupt.jsonl.zst").write_bytes(bytes(corrupt))
    names = ("bad-footer.parquet", "json.parquet", "plain.jsonl.zst", "corrupt.jsonl.zst", "cut.jsonl.gz")
    reasons = {name: check_event_file(f"file:{tmp_path / name}") for name in (*names, "dir.parquet")}
    assert check_event_file(f"file:{sorted(log.glob('*.parquet'))[0]}") == (
        "parquet: no magic number at the end (cut short, or not a Parquet file)"
    )
    assert check_event_file(f"file:{log / 'events-rtr-z-0000.jsonl.zst'}") == (
        "zstd: the stream is cut short (its last frame has no end)"
    )
    assert reasons["bad-footer.parquet"] is not None
    assert reasons["bad-footer.parquet"].startswith("parquet: bad footer: ")
    assert reasons == reasons | {
        "json.parquet": "parquet: no magic number at the start (not a Parquet file)",
        "plain.jsonl.zst": "zstd: Unknown frame descriptor",
        "corrupt.jsonl.zst": "zstd: Data corruption detected",
        "cut.jsonl.gz": "gzip: Compressed file ended before the end-of-stream marker was reached",
        "dir.parquet": "cannot read: Is a directory",
    }
    assert all("\n" not in str(reason) for reason in reasons.values())
    assert check_event_file(f"file:{good}") is None
    assert check_event_file(str(zst)) is None
    assert check_event_file("s3a://bucket/events.parquet") is None  # another file system: Spark's


def test_ingest_sets_damaged_files_aside_and_reads_the_rest(spark, tmp_path):
    """Scenario: one Parquet file cut short and one truncated zstd stream among intact files."""
    made = damaged_log(tmp_path)
    log, intact = made.log, made.intact
    result = ingest(spark, [str(log)])
    assert [(Path(u.file).name, u.reason.split(":")[0]) for u in result.unreadable] == [
        ("events-rtr-a-0000.parquet", "parquet"),
        ("events-rtr-z-0000.jsonl.zst", "zstd"),
    ]
    assert result.events.count() == intact
    assert result.malformed == result.duplicates == 0


def test_ingest_every_file_unreadable_is_an_error(spark, tmp_path):
    log = damaged_log(tmp_path).log
    for intact in sorted(log.glob("*.parquet"))[1:]:
        intact.write_bytes(b"")
    with pytest.raises(UnreadableError, match=r"^every event file is unreadable \(5\): file:") as raised:
        ingest(spark, [str(log)])
    assert len(raised.value.files) == 5
