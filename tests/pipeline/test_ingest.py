"""Ingest: exact quarantine and duplicate counts, JSON and Parquet input, user errors."""

from __future__ import annotations

import bz2
import gzip
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from pyspark.sql import functions as F

from pipeline.generate import generate
from pipeline.ingest import (
    RAW,
    REASON,
    REASONS,
    ROW,
    InputError,
    UnreadableError,
    UnreadableFile,
    _line,
    _local_path,
    check_event_file,
    check_event_files,
    event_files,
    flag,
    ingest,
    write_text,
)
from pipeline.schema import CORRUPT_COLUMN, READ_SCHEMA
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


# -- the parts on their own ---------------------------------------------------------------------------


def test_flag_gives_the_first_rule_a_record_breaks(spark):
    """Scenario: one record per rule, some breaking later rules too: each gets the first in
    `REASONS`' order; `_raw` and `_file` are kept for flagged records only, and only the columns
    asked for (with router_id and seq) are kept."""
    ts = datetime(2026, 11, 18, 11, tzinfo=UTC)
    good = {"kind": "decision", "router_id": "r", "seq": 1, "ts": ts, "status": "OK", "key": "k"}
    cases = [
        (good, None),
        (good | {"router_id": None, CORRUPT_COLUMN: "{not json"}, "unparseable"),
        (good | {"router_id": None, "kind": "heartbeat"}, "missing router_id"),
        (good | {"seq": None, "ts": None}, "missing seq"),
        (good | {"ts": None, "kind": None}, "missing ts"),
        (good | {"kind": None}, "bad kind"),
        (good | {"kind": "heartbeat"}, "bad kind"),
        (good | {"status": "MAYBE"}, "bad status"),
        (good | {"status": None}, "bad status"),
        (good | {"kind": "close", "status": "MAYBE"}, None),  # a close's status is not checked
    ]
    rows = [tuple(record.get(name) for name in READ_SCHEMA.fieldNames()) for record, _ in cases]
    raw = spark.createDataFrame(rows, READ_SCHEMA).withColumn("_file", F.lit("file:/log/a.jsonl"))
    flagged = flag(raw, ["kind", "key"])
    assert flagged.columns == ["kind", "key", "router_id", "seq", REASON, RAW, "_file", ROW]
    found = flagged.collect()
    assert [r[REASON] for r in found] == [reason for _, reason in cases]
    for row, (_, reason) in zip(found, cases, strict=True):
        assert (row[RAW] is None, row["_file"] is None) == (reason is None, reason is None)
    assert found[1][RAW] == "{not json"  # the line as read
    assert json.loads(found[2][RAW]) == {"kind": "heartbeat", "key": "k", "seq": 1}  # the columns read


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("file:/var/log/a.parquet", "/var/log/a.parquet"),
        ("file://localhost/var/log/a.parquet", "/var/log/a.parquet"),
        ("/var/log/a.parquet", "/var/log/a.parquet"),
        ("file://other-host/var/log/a.parquet", None),
        ("relative/a.parquet", None),
        ("s3a://bucket/a.parquet", None),
        ("hdfs://namenode/a.parquet", None),
    ],
)
def test__local_path(uri, path):
    assert _local_path(uri) == path


@pytest.fixture
def parquet_bytes(tmp_path):
    pq.write_table(pa.table({"seq": list(range(1000))}), tmp_path / "whole.parquet")
    return (tmp_path / "whole.parquet").read_bytes()


def test_check_event_file_parquet_pages_cut_out_before_the_footer(tmp_path, parquet_bytes):
    """Scenario: the footer is intact and parses, but the bytes of the column chunk it points to
    are no longer all there: the row group runs past where the footer starts."""
    footer = int.from_bytes(parquet_bytes[-8:-4], "little")
    data_end = len(parquet_bytes) - 8 - footer
    (tmp_path / "hole.parquet").write_bytes(parquet_bytes[: data_end - 100] + parquet_bytes[data_end:])
    reason = check_event_file(str(tmp_path / "hole.parquet"))
    assert reason is not None
    assert re.fullmatch(
        rf"parquet: row group 0 runs to byte \d+, past the footer at {data_end - 100}", reason
    )
    assert check_event_file(str(tmp_path / "whole.parquet")) is None


def test_check_event_file_parquet_too_short_for_its_footer_or_at_all(tmp_path):
    (tmp_path / "long.parquet").write_bytes(b"PAR1" + b"x" * 10 + (10**6).to_bytes(4, "little") + b"PAR1")
    (tmp_path / "tiny.parquet").write_bytes(b"PAR1PAR1")
    assert check_event_file(str(tmp_path / "long.parquet")) == (
        "parquet: a footer of 1000000 bytes in a file of 22 (cut short)"
    )
    assert check_event_file(str(tmp_path / "tiny.parquet")) == (
        "parquet: 8 bytes, fewer than the 12 of the smallest Parquet file (cut short)"
    )


def test_check_event_file_zstd_reads_every_frame(tmp_path):
    """Scenario: a stream of two frames (a file appended to) is readable; cut inside the second
    frame it is not; an empty file has no frame to be cut short."""
    compress = zstandard.ZstdCompressor().compress
    two = compress(b'{"kind":"close"}\n' * 2000) + compress(b'{"kind":"decision"}\n' * 2000)
    (tmp_path / "two.jsonl.zst").write_bytes(two)
    (tmp_path / "cut.jsonl.zst").write_bytes(two[:-5])
    (tmp_path / "empty.jsonl.zst").write_bytes(b"")
    assert check_event_file(str(tmp_path / "two.jsonl.zst")) is None
    assert check_event_file(str(tmp_path / "cut.jsonl.zst")) == (
        "zstd: the stream is cut short (its last frame has no end)"
    )
    assert check_event_file(str(tmp_path / "empty.jsonl.zst")) is None


def test_check_event_file_other_kinds(tmp_path):
    (tmp_path / "cut.jsonl.bz2").write_bytes(bz2.compress(b'{"kind":"close"}\n' * 5000)[:-10])
    (tmp_path / "whole.jsonl.gz").write_bytes(gzip.compress(b'{"kind":"close"}\n' * 5000))
    (tmp_path / "garbage.jsonl").write_bytes(b"\xff\x00 not json at all")
    assert check_event_file(str(tmp_path / "cut.jsonl.bz2")) == (
        "bzip2: Compressed file ended before the end-of-stream marker was reached"
    )
    assert check_event_file(str(tmp_path / "whole.jsonl.gz")) is None
    assert check_event_file(str(tmp_path / "garbage.jsonl")) is None  # its lines are malformed records
    assert check_event_file(str(tmp_path / "missing.jsonl")) == "cannot read: No such file or directory"


def test_check_event_files_names_the_unreadable_ones_in_order(tmp_path):
    (tmp_path / "b.parquet").write_bytes(b"PAR1")
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "c.jsonl.zst").write_bytes(b"not zstd")
    files = [str(tmp_path / name) for name in ("b.parquet", "a.jsonl", "c.jsonl.zst")]
    found = check_event_files(files)
    assert [(Path(u.file).name, u.reason.split(":")[0]) for u in found] == [
        ("b.parquet", "parquet"),
        ("c.jsonl.zst", "zstd"),
    ]
    assert check_event_files([files[1]]) == ()


def test_unreadable_error_names_the_first_file_and_counts_the_rest():
    one = UnreadableFile(file="file:/a.parquet", reason="cut short")
    other = UnreadableFile(file="file:/b.parquet", reason="bad footer")
    assert str(UnreadableError([one])) == "every event file is unreadable (1): file:/a.parquet: cut short"
    error = UnreadableError([one, other, other])
    assert str(error) == "every event file is unreadable (3): file:/a.parquet: cut short (and 2 more)"
    assert error.files == (one, other, other)
    assert isinstance(error, InputError)


def test__line_is_the_first_line_or_the_exceptions_name():
    assert _line(OSError("first\nsecond")) == "first"
    assert _line(ValueError("  ")) == "ValueError"


def test_event_files_sorts_files_by_format_and_skips_hidden_ones(spark, tmp_path):
    """Scenario: a directory with both formats (in a subdirectory too), files being written (dot
    names) or Spark's own (`_` names, also as a directory), and a truth.json; and a file named
    directly, which is JSON lines unless it ends in .parquet."""
    log = tmp_path / "log"
    for name in (
        "a.jsonl",
        "b.jsonl.zst",
        "c.jsonl.gz",
        "d.jsonl.bz2",
        "e.parquet",
        "sub/f.parquet",
        ".g.jsonl.zst.tmp",
        ".h.parquet",
        "_SUCCESS",
        "_staging/i.parquet",
        "truth.json",
    ):
        (log / name).parent.mkdir(parents=True, exist_ok=True)
        (log / name).write_text("")
    (tmp_path / "named.log").write_text("")
    json_files, parquet_files = event_files(spark, [str(log), str(tmp_path / "named.log")])
    assert [Path(f).name for f in json_files] == [
        "a.jsonl",
        "b.jsonl.zst",
        "c.jsonl.gz",
        "d.jsonl.bz2",
        "named.log",
    ]
    assert [f.removeprefix(f"file:{log}/") for f in parquet_files] == ["e.parquet", "sub/f.parquet"]
