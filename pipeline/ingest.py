"""Reading event files: malformed records set aside with a reason, duplicate events removed.

Input is any Spark path (local, `file:`, `hdfs://`, `s3a://`, ...): files, directories (read
recursively; names starting with `.` or `_` are skipped, so a file the router is still writing is
never read) or globs. In a directory, `*.jsonl`, `*.jsonl.zst`, `*.jsonl.gz` are JSON lines and
`*.parquet` is Parquet; anything else there (a `truth.json`) is ignored. A file named directly is
Parquet when it ends in `.parquet`, else JSON lines.

A damaged file never fails the job either: before Spark reads anything, each local file is checked
(`check_event_file`: a Parquet file's magic numbers, footer and row-group ranges; a compressed
file's whole stream, decompressed in small steps and thrown away) and an unreadable one (cut
short, a bad footer, not what its name says, no permission) is set aside whole, named with its
reason (`UnreadableFile`). Files on other file systems (`hdfs://`, `s3a://`) are not checked here.

Malformed records never fail the job: each gets the first rule it breaks (`REASONS`) and goes to
the quarantine table with its raw line. Duplicates (the same `router_id` and `seq`: a file shipped
twice, a log replayed after a failover) are removed the way an audit does it, remembering ids and
not rows (docs/pipeline.md, research §2.3), in two steps. One aggregation, which Spark's partial
aggregation shrinks before its shuffle, counts the rows of each bucket of `BUCKET_SIZE` sequence
numbers and marks the numbers it saw in a 64-bit mask: a bucket with more rows than marks holds a
repeated key (`suspect`). A second aggregation, over the rows of those buckets only, finds the
keys that occur more than once and names the copy of each to keep (`ROW`); every other row passes
a broadcast lookup untouched. Nothing large comes to the driver: only the counts per reason, of
suspect buckets and of duplicates.
"""

from __future__ import annotations

import bz2
import gzip
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Final
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from pyspark.sql import functions as F

from pipeline.schema import CORRUPT_COLUMN, EVENT_SCHEMA, READ_SCHEMA
from pipeline.session import setting

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "BROADCAST_DUP_KEYS",
    "BUCKET_SIZE",
    "EVENT_COLUMNS",
    "REASONS",
    "UNREADABLE",
    "Ingested",
    "InputError",
    "UnreadableError",
    "UnreadableFile",
    "check_event_file",
    "check_event_files",
    "event_files",
    "ingest",
    "write_text",
]

EVENT_COLUMNS: Final = tuple(f.name for f in EVENT_SCHEMA.fields)
REASONS: Final = ("unparseable", "missing router_id", "missing seq", "missing ts", "bad kind", "bad status")
"""Quarantine reasons, in the order the rules are checked: a JSON line Spark cannot read into the
schema (not JSON, truncated, not an object, a value of the wrong type or a time it cannot parse in
a column the job reads), a line without `router_id`, `seq` or `ts`, a `kind` other than
decision/close, a decision whose `status` is none of OK, REFUSED_USE_ANOTHER, REFUSED_UNAVAILABLE."""
KINDS: Final = ("decision", "close")
STATUSES: Final = ("OK", "REFUSED_USE_ANOTHER", "REFUSED_UNAVAILABLE")
BROADCAST_DUP_KEYS: Final = 2_000_000
"""Up to this many repeated (router_id, seq) keys, or suspect buckets, are broadcast (≈100 MB of
JVM memory at ~50 B a key); beyond it they are joined by a shuffle."""
BUCKET_BITS: Final = 6
BUCKET_SIZE: Final = 1 << BUCKET_BITS
"""Sequence numbers per bucket of the first step (module docstring): 64, so that a bucket's mask of
the numbers seen is one long and the aggregation's buffer has a fixed width (Spark's fast hash
map). A router numbers its events one by one, so on 10 M events (1 % repeated in replayed blocks)
the first step leaves 1,582 suspect buckets, 2 % of the rows, and ingest took 4.2 s where one
aggregation over every (router_id, seq) made it 7.4 s (a warm run, Spark's event log). When nearly every
bucket holds one row (numbers far apart), the first step costs what that aggregation did, and the
second runs over the suspect buckets only."""
BUCKET: Final = "_bucket"
JSON_SPLIT_BYTES: Final = 16 * 1024 * 1024
"""`spark.sql.files.maxPartitionBytes` while JSON is parsed and staged. A compressed file cannot be
split, and Spark's default (128 MiB, plus 4 MiB of open cost per file) packed the router's 60 files
of 10 M events (≈7 MB of zstd each) into 5 tasks on 2 cores; at 16 MiB each file is one task."""
JSON_SUFFIXES: Final = (".jsonl", ".jsonl.zst", ".jsonl.gz", ".jsonl.bz2")
PARQUET_SUFFIX: Final = ".parquet"
REASON: Final = "_reason"
RAW: Final = "_raw"
ROW: Final = "_row"
"""A row's identity: the xxhash64 of its Parquet file's path and its index in the file. The copy of
a repeated event with the smallest one is kept; two copies would both be kept only if they had
the same hash (a chance of 2^-64 per pair), never both dropped."""
KEEP: Final = "_keep"
UNREADABLE: Final = "unreadable file"
"""The quarantine reason of a whole file that cannot be read (`UnreadableFile`)."""
CHECK_READ_BYTES: Final = 1024
"""Compressed bytes decompressed at a time when a file is checked. zstd expands at most ≈32,768
times (a 3-byte block header and one byte make a 128 KiB RLE block), so a step's output is at most
32 MiB whatever the file holds; on the generator's 5 MB files 1 KiB steps were as fast as 64 KiB
ones (0.09 s a file), and the benchmark's 60 files of 10 M events (312 MB, 3.44 GB of JSON) took
3.7-4.2 s with 4 threads (zstandard's own `read_to_iter` decompresses them in 3.7 CPU-s);
docs/pipeline.md."""
CHECK_THREADS: Final = 4
"""Files checked at a time (zstandard, zlib and pyarrow release the GIL while they work)."""
PARQUET_MAGIC: Final = b"PAR1"
PARQUET_TAIL: Final = 8
"""A Parquet file ends in its footer's length (4 bytes, little-endian) and `PARQUET_MAGIC`."""


class InputError(ValueError):
    """The input paths name no event file (missing, empty, or only other files)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadableFile:
    """An event file set aside whole because it cannot be read (`check_event_file`)."""

    file: str
    """The file's path as Spark names it (`file:/var/log/router/events-rtr-a-0001.parquet`)."""
    reason: str
    """Why, in one line (`parquet: no magic number at the end (cut short, or not Parquet)`)."""


class UnreadableError(InputError):
    """Every event file the input paths name is unreadable: nothing is left to read."""

    def __init__(self, files: Sequence[UnreadableFile]) -> None:
        first = files[0]
        super().__init__(
            f"every event file is unreadable ({len(files)}): {first.file}: {first.reason}"
            + (f" (and {len(files) - 1} more)" if len(files) > 1 else "")
        )
        self.files = tuple(files)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ingested:
    """The ingested log: deduplicated events, the quarantine, and their counts."""

    events: DataFrame
    """Valid events, each (router_id, seq) once; the columns asked for (`ingest`)."""
    quarantine: DataFrame
    """Malformed records: `reason` (one of `REASONS`), `raw` (the line as read, or the parsed
    record's columns the job reads as JSON when the line parsed), `file`."""
    malformed_by_reason: Mapping[str, int]
    """Quarantined records per reason (every reason present, 0 when none)."""
    duplicates: int
    """Extra copies removed."""
    unreadable: tuple[UnreadableFile, ...] = ()
    """Files set aside whole (`check_event_file`), in the order of their paths."""

    @property
    def malformed(self) -> int:
        """Quarantined records."""
        return sum(self.malformed_by_reason.values())


def _jvm_path(spark: SparkSession, uri: str) -> tuple[object, object]:
    """A Hadoop `Path` and its `FileSystem` (through the JVM gateway, so any scheme works)."""
    sc = spark.sparkContext
    jvm = sc._jvm
    assert jvm is not None, "a classic (JVM) Spark session"
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path, path.getFileSystem(sc._jsc.hadoopConfiguration())


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small file (summary.json, report.html) to any Spark path, replacing it: through the
    Hadoop FileSystem API, so `s3a://`, `hdfs://` and local paths all work."""
    path, fs = _jvm_path(spark, uri)
    stream = fs.create(path, True)  # type: ignore[attr-defined]  # py4j proxy
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def event_files(spark: SparkSession, paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """The JSON-lines files and the Parquet files the input paths name (module docstring).

    Raises:
        InputError: a path that does not exist, or no event file at all.
    """
    json_files: list[str] = []
    parquet_files: list[str] = []
    given = list(paths)
    for uri in given:
        path, fs = _jvm_path(spark, uri)
        statuses = fs.globStatus(path)  # type: ignore[attr-defined]  # py4j proxy
        if statuses is None or len(statuses) == 0:
            raise InputError(f"no such file or directory: {uri!r}")
        for status in statuses:
            if not status.isDirectory():
                name = str(status.getPath().toString())
                (parquet_files if name.endswith(PARQUET_SUFFIX) else json_files).append(name)
                continue
            root = str(status.getPath().toString()).rstrip("/") + "/"
            found = fs.listFiles(status.getPath(), True)  # type: ignore[attr-defined]  # py4j proxy
            while found.hasNext():
                name = str(found.next().getPath().toString())
                if any(_hidden(part) for part in name.removeprefix(root).split("/")):
                    continue
                if name.endswith(JSON_SUFFIXES):
                    json_files.append(name)
                elif name.endswith(PARQUET_SUFFIX):
                    parquet_files.append(name)
    if not json_files and not parquet_files:
        raise InputError(f"no event files (*.jsonl, *.jsonl.zst, *.parquet) in {given!r}")
    return sorted(json_files), sorted(parquet_files)


def _local_path(uri: str) -> str | None:
    """The local path of a `file:` URI or a plain absolute path, else None (another file system)."""
    parts = urlsplit(uri)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return parts.path
    return uri if not parts.scheme and uri.startswith("/") else None


def _parquet_problem(stream: BinaryIO, size: int) -> str | None:
    """What is wrong with a Parquet file, from its two magic numbers and its footer (Parquet's
    file format: `PAR1`, the column chunks, the footer, its length, `PAR1`), or None."""
    least = 2 * len(PARQUET_MAGIC) + 4
    if size < least:
        return f"parquet: {size} bytes, fewer than the {least} of the smallest Parquet file (cut short)"
    if stream.read(len(PARQUET_MAGIC)) != PARQUET_MAGIC:
        return "parquet: no magic number at the start (not a Parquet file)"
    stream.seek(size - PARQUET_TAIL)
    tail = stream.read(PARQUET_TAIL)
    if tail[4:] != PARQUET_MAGIC:
        return "parquet: no magic number at the end (cut short, or not a Parquet file)"
    footer = int.from_bytes(tail[:4], "little")
    data_end = size - PARQUET_TAIL - footer
    if data_end < len(PARQUET_MAGIC):
        return f"parquet: a footer of {footer} bytes in a file of {size} (cut short)"
    stream.seek(0)
    try:
        metadata = pq.ParquetFile(stream).metadata
    except (pa.ArrowException, OSError) as exc:
        return f"parquet: bad footer: {_line(exc)}"
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for column in range(row_group.num_columns):
            chunk = row_group.column(column)
            start = chunk.dictionary_page_offset or chunk.data_page_offset
            if start + chunk.total_compressed_size > data_end:
                return (
                    f"parquet: row group {group} runs to byte {start + chunk.total_compressed_size}, "
                    f"past the footer at {data_end}"
                )
    return None


def _zstd_problem(stream: BinaryIO) -> str | None:
    """What is wrong with a zstd stream (one or more frames), decompressed in `CHECK_READ_BYTES`
    steps and thrown away, or None. A frame without its end is a stream cut short."""
    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    inside = False
    try:
        while chunk := stream.read(CHECK_READ_BYTES):
            while chunk:
                frame.decompress(chunk)
                inside = True
                if not frame.eof:
                    break
                chunk, frame, inside = frame.unused_data, decompressor.decompressobj(), False
    except zstandard.ZstdError as exc:
        return f"zstd: {_line(exc).removeprefix('zstd decompressor error: ')}"
    return "zstd: the stream is cut short (its last frame has no end)" if inside else None


def _stream_problem(name: str, opened: gzip.GzipFile | bz2.BZ2File) -> str | None:
    """What is wrong with a gzip or bzip2 stream (`opened` decompresses it), or None."""
    try:
        with opened:
            while opened.read(64 * CHECK_READ_BYTES):
                pass
    except (EOFError, OSError, zlib.error) as exc:
        return f"{name}: {_line(exc)}"
    return None


def check_event_file(uri: str) -> str | None:
    """Why an event file cannot be read, in one line, or None (readable, or not a local file).

    Cheap: a Parquet file's footer only (`_parquet_problem`); a compressed JSON-lines file is
    decompressed in small steps and thrown away (bounded memory, `CHECK_READ_BYTES`); a plain
    `.jsonl` is only opened (any bytes are lines: a bad one is a malformed record).
    """
    path = _local_path(uri)
    if path is None:
        return None
    try:
        with open(path, "rb") as stream:
            if uri.endswith(PARQUET_SUFFIX):
                return _parquet_problem(stream, os.fstat(stream.fileno()).st_size)
            if uri.endswith(".zst"):
                return _zstd_problem(stream)
            if uri.endswith(".gz"):
                return _stream_problem("gzip", gzip.GzipFile(fileobj=stream))
            if uri.endswith(".bz2"):
                return _stream_problem("bzip2", bz2.BZ2File(stream))
    except OSError as exc:
        return f"cannot read: {exc.strerror or _line(exc)}"
    return None


def check_event_files(files: Sequence[str]) -> tuple[UnreadableFile, ...]:
    """The unreadable ones of `files` (`check_event_file`, `CHECK_THREADS` at a time)."""
    with ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="ingest-check") as pool:
        problems = list(pool.map(check_event_file, files))
    return tuple(
        UnreadableFile(file=file, reason=reason)
        for file, reason in zip(files, problems, strict=True)
        if reason is not None
    )


def _line(exc: BaseException) -> str:
    """An exception's message, first line only."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_json(spark: SparkSession, files: list[str]) -> DataFrame:
    return (
        spark.read.schema(READ_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .json(files)
        .withColumn("_file", F.col("_metadata.file_path"))
    )


def _row_id() -> Column:
    """A row's identity in the Parquet file it is read from (`ROW`)."""
    return F.xxhash64(F.col("_metadata.file_path"), F.col("_metadata.row_index"))


def _read_parquet(spark: SparkSession, files: list[str]) -> DataFrame:
    """The Parquet files in the `READ_SCHEMA` columns, plus `_file` and `ROW`."""
    table = spark.read.parquet(*files)
    columns = [
        (F.col(f.name) if f.name in table.columns else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in EVENT_SCHEMA.fields
    ]
    return table.select(
        *columns,
        F.lit(None).cast("string").alias(CORRUPT_COLUMN),
        F.col("_metadata.file_path").alias("_file"),
        _row_id().alias(ROW),
    )


def _union(frames: list[DataFrame]) -> DataFrame:
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _reason() -> Column:
    """The first rule a record breaks (`REASONS`), or null."""
    rules = (
        F.col(CORRUPT_COLUMN).isNotNull(),
        F.col("router_id").isNull(),
        F.col("seq").isNull(),
        F.col("ts").isNull(),
        F.col("kind").isNull() | ~F.col("kind").isin(*KINDS),
        (F.col("kind") == "decision") & (F.col("status").isNull() | ~F.col("status").isin(*STATUSES)),
    )
    reason = F.lit(None).cast("string")
    for rule, name in reversed(list(zip(rules, REASONS, strict=True))):
        reason = F.when(rule, F.lit(name)).otherwise(reason)
    return reason


def flag(raw: DataFrame, columns: Sequence[str]) -> DataFrame:
    """`raw` narrowed to `columns` (and the identity, router_id and seq), with `_reason` (null for
    a valid record), and `_raw` (the line, or the parsed record's columns as JSON) and `_file` of a
    malformed one only. Only these columns are parsed and checked (`ingest`)."""
    reason = _reason()
    kept = list(dict.fromkeys([*columns, "router_id", "seq"]))
    line = F.coalesce(F.col(CORRUPT_COLUMN), F.to_json(F.struct(*kept)))
    row = F.col(ROW) if ROW in raw.columns else F.lit(None).cast("long")
    return raw.select(
        *kept,
        reason.alias(REASON),
        F.when(reason.isNotNull(), line).alias(RAW),
        F.when(reason.isNotNull(), F.col("_file")).alias("_file"),
        row.alias(ROW),
    )


_LOOKUP_KEY: Final = "_lookup_key"
_LOOKUP_ROUTER: Final = "_lookup_router_id"
_SEEN: Final = "_seen"


def _bucket() -> Column:
    """A row's bucket of `BUCKET_SIZE` sequence numbers."""
    return F.shiftright(F.col("seq"), BUCKET_BITS)


def _seen() -> Column:
    """A row's sequence number as one bit of its bucket's mask."""
    return F.expr(f"shiftleft(1L, cast(seq & {BUCKET_SIZE - 1} as int))")


def _lookup(ids: DataFrame, key: str, row_key: Column, *, broadcast: bool) -> tuple[DataFrame, Column]:
    """`ids` (router_id, `key`, and any other column) named apart, and the condition that a row
    is one of them: the row's `row_key` is their `key`, a long, the join's key alone (a lookup
    without building a key row per event, ≈1 s less per scan of 10 M events than with the router
    id), and the router id is compared only where the key matches (`coalesce` keeps it out of the
    join's key)."""
    named = ids.withColumnsRenamed({key: _LOOKUP_KEY, "router_id": _LOOKUP_ROUTER})
    same_router = F.coalesce(F.col("router_id") == F.col(_LOOKUP_ROUTER), F.lit(False))
    return (F.broadcast(named) if broadcast else named), (row_key == F.col(_LOOKUP_KEY)) & same_router


def ingest(
    spark: SparkSession,
    paths: Iterable[str],
    *,
    staging: str | None = None,
    columns: Sequence[str] = EVENT_COLUMNS,
) -> Ingested:
    """Read, quarantine and deduplicate event files.

    One aggregation on (`_reason`, router_id, bucket of seq) gives the quarantine's counts and the
    buckets that hold a repeated event; a second, over those buckets' rows, gives the repeated
    events with the copy of each to keep (the smallest `ROW`). Every later scan of the events
    drops the other copies by a broadcast lookup (an anti-join on `seq`), so the repeated rows are
    never written apart. Without staging (small logs) the repeated events are dropped by a
    shuffle. When the counts find no malformed record (the router's own files), the quarantine is
    an empty relation that reads nothing, and the later scans check no rule.

    Args:
        spark: the session.
        paths: Spark paths (module docstring).
        staging: a Spark path for intermediate Parquet (the parsed JSON, narrowed to `columns`,
            the suspect buckets and the repeated keys): JSON is then parsed once, and each later
            step reads only the columns it needs. None: nothing is written and the buckets and
            repeated keys are cached (tests, small logs).
        columns: the event columns the job reads (`EVENT_COLUMNS` by default). Only these are
            parsed and checked: a value of the wrong type in a column the job does not read does
            not set the record aside (Spark's JSON reader skips what is not asked for, which
            saves a fifth of the parse).

    Returns:
        The events (a view over the input or the staged copy), the quarantine, the counts and the
        unreadable files set aside.

    Raises:
        InputError: no event file in `paths`.
        UnreadableError: every event file is unreadable (`check_event_file`).
    """
    json_files, parquet_files = event_files(spark, paths)
    unreadable = check_event_files(sorted([*json_files, *parquet_files]))
    if unreadable:
        bad = {u.file for u in unreadable}
        json_files = [f for f in json_files if f not in bad]
        parquet_files = [f for f in parquet_files if f not in bad]
        if not json_files and not parquet_files:
            raise UnreadableError(unreadable)
    parts: list[DataFrame] = []
    if json_files:
        parsed = flag(_read_json(spark, json_files), columns)
        if staging is not None:
            staged = f"{staging.rstrip('/')}/parsed"
            with setting(spark, "spark.sql.files.maxPartitionBytes", str(JSON_SPLIT_BYTES)):
                parsed.drop(ROW).write.mode("overwrite").option("compression", "zstd").parquet(staged)
            parsed = spark.read.parquet(staged).withColumn(ROW, _row_id())
        parts.append(parsed)
    if parquet_files:  # already columnar: read as it is, never staged
        parts.append(flag(_read_parquet(spark, parquet_files), columns))
    flagged = _union(parts)
    quarantine = flagged.where(F.col(REASON).isNotNull()).select(
        F.col(REASON).alias("reason"), F.col(RAW).alias("raw"), F.col("_file").alias("file")
    )

    def kept(frame: DataFrame, name: str) -> DataFrame:
        if staging is None:
            return frame.cache()
        path = f"{staging.rstrip('/')}/{name}"
        frame.write.mode("overwrite").parquet(path)
        return spark.read.parquet(path)

    buckets = kept(
        flagged.groupBy(REASON, "router_id", _bucket().alias(BUCKET))
        .agg(F.count("*").alias("copies"), F.bit_or(_seen()).alias(_SEEN))
        .where(F.col(REASON).isNotNull() | (F.col("copies") > F.bit_count(_SEEN)))
        .drop(_SEEN),
        "buckets",
    )
    by_reason = (
        buckets.groupBy(REASON).agg(F.sum("copies").alias("n"), F.count("*").alias("buckets")).collect()
    )
    counted = {row[REASON]: int(row["n"]) for row in by_reason if row[REASON] is not None}
    suspect = sum(int(row["buckets"]) for row in by_reason if row[REASON] is None)
    if not counted:  # no malformed record: the quarantine is empty without another scan of the input
        quarantine = quarantine.limit(0)
    # No malformed record (the router's own files): no rule is checked again in the later scans.
    valid = flagged.where(F.col(REASON).isNull()) if counted else flagged
    keys = extra = 0
    if suspect:
        ids, inside = _lookup(
            buckets.where(F.col(REASON).isNull()).select("router_id", BUCKET),
            BUCKET,
            _bucket(),
            broadcast=suspect <= BROADCAST_DUP_KEYS,
        )
        dup_keys = kept(
            valid.join(ids, inside, "left_semi")
            .groupBy("router_id", "seq")
            .agg(F.count("*").alias("copies"), F.min(ROW).alias(KEEP))
            .where(F.col("copies") > 1),
            "repeated",
        )
        stats = dup_keys.agg(F.count("*").alias("keys"), F.sum(F.col("copies") - 1).alias("extra")).first()
        assert stats is not None
        keys, extra = int(stats["keys"]), int(stats["extra"] or 0)
    if keys == 0:
        events = valid
    elif staging is None:
        events = valid.dropDuplicates(["router_id", "seq"])
    else:
        repeated = dup_keys.select("router_id", "seq", KEEP)
        ids, is_repeated = _lookup(repeated, "seq", F.col("seq"), broadcast=keys <= BROADCAST_DUP_KEYS)
        events = valid.join(ids, is_repeated & (F.col(ROW) != F.col(KEEP)), "left_anti")  # a copy not kept
    return Ingested(
        events=events.select(*columns),
        quarantine=quarantine,
        malformed_by_reason={reason: counted.get(reason, 0) for reason in REASONS},
        duplicates=extra,
        unreadable=unreadable,
    )
