"""The pipeline benchmark: `routerctl analyze` on Spark `local[2]` against DuckDB (2 threads) doing
the same work on the same files, in the same run, plus the event log's cost inside the router.

    .venv/bin/python -m benchmarks.studies.pipeline [--events 10000000] [--runs 1] [--workdir DIR] [--keep]
                                                    [--json PATH] [--quick] [--only pipeline,event-log]
                                                    [--conf KEY=VALUE ...] [--timeout S]

Quoted by docs/pipeline.md ("What the job does": what it costs), docs/event-log.md ("Why
Parquet"), README.md and benchmarks/README.md ("The event pipeline").

1. **Data.** `pipeline.generate` writes N events of synthetic event files in both of the router's
   formats, each with its `truth.json`, 4 routing processes, 100,000 Zipf keys, 1 % duplicates:
   - **Parquet**, the router's default (`events-*.parquet`, written by the router's own writer code,
     `event_format.parquet.write_parquet`, as many files as its 64 MiB Arrow file in
     progress gives), no malformed record (a Parquet file has none);
   - **JSON lines** (`<format>jsonl</format>`: `events-*.jsonl.zst`, rotated like the router's
     64 MiB files), the same events and duplicates plus 0.1 % malformed lines.
   With `--workdir` a set generated before with the same arguments is reused.
2. **Spark**: `pipeline.analyze.analyze(spark, [input], out, report=False)` in one `local[2]`
   session (`pipeline.session.spark_session("local[2]", conf=...)`; the session's start is timed
   apart), over the JSON files, then over the Parquet files: ingest (quarantine with raw lines,
   staged Parquet for JSON, audit dedup), every table (`pipeline.analyze.TABLES`),
   `summary.json`. The HTML report is left out (≈1 s of matplotlib; DuckDB draws none).
3. **DuckDB** (`threads=2`) does the same work on the same files (`duckdb_analyze`): every line
   read as text (`read_csv`, one column; lines that are not UTF-8 come back as its rejects, with
   the line), a line is unparseable unless it is a JSON object whose typed fields among the
   columns analyze reads (`pipeline.analyze.COLUMNS`) convert (as Spark's PERMISSIVE reader with
   that schema), the same quarantine rules in the same order, the same audit dedup on (router_id,
   seq), and the same tables written as Parquet, one query per table (`DUCKDB_TABLES`), from the
   same two roll-ups and the same ordered per-key window. (Each engine plans the work its own
   way: Spark's roll-ups are one scan, one aggregation over every grouping column of both, and it
   keeps one copy of a repeated event by row id.)
4. **Checks.** Both engines' counts (events after dedup, duplicates, malformed by reason,
   decisions by status and by target, keys, moved keys, moves by cause, cache hits, NULL keys)
   must agree with each other and with the input's `truth.json`; a disagreement is a failure
   (exit 1).

It prints the table (time, events/s = input records / s, ratio Spark/DuckDB), the goals (10 M
events: ≤ 90 s from the router's files, which are Parquet by default, ≤ 50 s from Parquet, within
2x of DuckDB; the JSON-lines figures are judged beside them),
the load average and the CPU time other processes used during each measurement (research §method:
`cpu_others`), and writes everything (Spark conf, versions) to a JSON file. It stops the JVM it
started, deletes what it generated unless `--keep`, and is bounded by `--timeout`.

`--only event-log` runs only the event log's cost (`benchmarks.studies.event_log`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NoReturn

from benchmarks.studies.event_log import TRICKLE_RATE, EventLogCost, time_event_log
from event_format.schema import FIELDS, FieldType
from router.core.events import CloseReason

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import FrameType

    import duckdb
    from pyspark.sql import SparkSession

    from pipeline.generate import Truth

__all__ = [
    "DUCKDB_TABLES",
    "FULL_EVENTS",
    "GOAL_EVENTS",
    "QUICK_EVENTS",
    "Counts",
    "DataSet",
    "Measurement",
    "compare",
    "data_set",
    "duckdb_analyze",
    "expected_counts",
    "main",
]

ROOT: Final = Path(__file__).resolve().parents[2]
MASTER: Final = "local[2]"
"""The benchmark's Spark master: 2 cores, as DuckDB's 2 threads (passed to `spark_session`)."""
SPARK_CONF: Final[Mapping[str, str]] = {"spark.driver.memory": "6g"}
"""On top of `pipeline.session.DEFAULT_CONF`: the driver (which is the executor in local mode) gets
6 GiB, as in research §1 (the 1 GiB default: +13 % on Parquet, §2.3). `--conf` adds more."""
QUICK_SPARK_CONF: Final[Mapping[str, str]] = {"spark.sql.shuffle.partitions": "2"}
"""`--quick` also: tiny data, so fewer tasks per shuffle (the pipeline tests' setting)."""
DUCKDB_THREADS: Final = 2
FULL_EVENTS: Final = 10_000_000
QUICK_EVENTS: Final = 20_000
GOAL_EVENTS: Final = 10_000_000
"""The goals are stated for 10 M events; at other sizes they are shown, not judged."""
GOAL_FILES_S: Final = 90.0
"""From the router's own files: Parquet, its default format (and `.jsonl.zst`, shown beside)."""
GOAL_PARQUET_S: Final = 50.0
GOAL_RATIO: Final = 2.0
ROUTERS: Final = 4
KEYS: Final = 100_000
"""Distinct keys of the full data set (research §2.1); `--quick` uses 2,000."""
DUPLICATE_RATE: Final = 0.01
MALFORMED_RATE: Final = 0.001
ROTATE_BYTES: Final = 64 * 1024 * 1024
"""The router's default `rotate-size` (`EventLogConfig.rotate_size`): lines per file follow from it."""
LINE_BYTES: Final = 380
"""About what one synthetic line takes (research §2.1: 383 B)."""
ARROW_BYTES: Final = 180
"""About what one event takes in the router's Arrow file in progress (measured: 179 B), which
`rotate-size` bounds: events per Parquet file follow from it."""
SEED: Final = 0
PARAMS_FILE: Final = "bench-params.json"
EVENT_LOG_EVENTS: Final = 200_000
EVENT_LOG_EVENTS_QUICK: Final = 20_000
GROUPS: Final = ("pipeline", "event-log")

Engine = Literal["spark", "duckdb"]
InputKind = Literal["json", "parquet"]


def _say(text: str) -> None:
    print(f"pipeline-bench: {text}", file=sys.stderr, flush=True)


# -- the data ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSet:
    """Generated event files, their truth, and what it took to make them."""

    directory: Path
    truth: Truth
    params: dict[str, object]
    generated: bool
    """Made by this run (else reused)."""
    seconds: float
    """Generation time (0 when reused)."""

    @property
    def files(self) -> list[Path]:
        return [self.directory / name for name in self.truth.files]

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)


def _params(events: int, *, quick: bool, kind: InputKind) -> dict[str, object]:
    per_event = LINE_BYTES if kind == "json" else ARROW_BYTES
    files = max(1, math.ceil(events * per_event / ROTATE_BYTES / ROUTERS))
    return {
        "events": events,
        "routers": ROUTERS,
        "keys": 2_000 if quick else KEYS,
        "duplicate_rate": DUPLICATE_RATE,
        "malformed_rate": MALFORMED_RATE if kind == "json" else 0.0,
        "files": files,
        "compress": True,
        "file_format": "jsonl" if kind == "json" else "parquet",
        "seed": SEED,
    }


def data_set(root: Path, events: int, *, quick: bool, kind: InputKind = "json") -> DataSet:
    """The event files of `events` lines under `root`: reused when `truth.json` and the generator's
    arguments there match and every file is present, else generated.

    Args:
        root: a directory (the data go to `root/data-<events>-<seed>[-parquet]`).
        events: lines to generate.
        quick: the small key space of the smoke run.
        kind: the router's files as JSON lines (`.jsonl.zst`, with malformed lines), or as Parquet
            (its default format; the same events and duplicates, no malformed line).
    """
    from pipeline.generate import generate, load_truth
    from router.config.settings import EventFileFormat

    params = _params(events, quick=quick, kind=kind)
    suffix = ("-quick" if quick else "") + ("-parquet" if kind == "parquet" else "")
    directory = root / f"data-{events}-{params['seed']}{suffix}"
    truth_path, params_path = directory / "truth.json", directory / PARAMS_FILE
    if truth_path.exists() and params_path.exists():
        try:
            truth = load_truth(truth_path)
            same = json.loads(params_path.read_text()) == params and truth.lines == events
        except (OSError, ValueError, TypeError):
            same = False
        if same and all((directory / name).is_file() for name in truth.files):
            _say(f"reusing {truth.lines:,} generated lines in {directory}")
            return DataSet(directory=directory, truth=truth, params=params, generated=False, seconds=0.0)
    shutil.rmtree(directory, ignore_errors=True)
    _say(f"generating {events:,} lines into {directory}")
    started = time.monotonic()
    kwargs = {k: v for k, v in params.items() if k != "events"}
    kwargs["file_format"] = EventFileFormat(params["file_format"])
    truth = generate(directory, events, **kwargs)  # type: ignore[arg-type]  # the keyword arguments above
    params_path.write_text(json.dumps(params, indent=2) + "\n")
    seconds = time.monotonic() - started
    _say(f"generated in {seconds:.1f} s")
    return DataSet(directory=directory, truth=truth, params=params, generated=True, seconds=seconds)


# -- what was found ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """The numbers both engines must agree on (and, where it has them, with `truth.json`)."""

    events: int
    duplicates: int
    malformed: int
    malformed_by_reason: dict[str, int]
    decisions_by_status: dict[str, int]
    decisions_by_target: dict[str, int]
    keys: int
    cache_hits: int
    null_keys: int
    moved_keys: int | None = None
    """Not in `truth.json`: compared between the engines only."""
    moves_by_cause: dict[str, int] | None = None

    @classmethod
    def of_summary(cls, summary: Mapping[str, object]) -> Counts:
        """From a `summary.json` (`pipeline.analyze`)."""

        def ints(name: str) -> dict[str, int]:
            value = summary[name]
            assert isinstance(value, dict)
            return {str(k): int(v) for k, v in value.items() if int(v)}

        def one(name: str) -> int:
            value = summary[name]
            assert isinstance(value, int)
            return value

        return cls(
            events=one("events"),
            duplicates=one("duplicates_removed"),
            malformed=one("malformed"),
            malformed_by_reason=ints("malformed_by_reason"),
            decisions_by_status=ints("decisions_by_status"),
            decisions_by_target=ints("decisions_by_target"),
            keys=one("keys"),
            cache_hits=one("cache_hits"),
            null_keys=one("null_keys"),
            moved_keys=one("moved_keys"),
            moves_by_cause=ints("moves_by_cause"),
        )


def expected_counts(truth: Truth) -> Counts:
    """What the generator says the job must find."""
    by_reason = {k: v for k, v in truth.malformed_by_reason.items() if v}
    return Counts(
        events=truth.events,
        duplicates=truth.duplicates,
        malformed=sum(by_reason.values()),
        malformed_by_reason=by_reason,
        decisions_by_status={k: v for k, v in truth.decisions_by_status.items() if v},
        decisions_by_target={k: v for k, v in truth.decisions_by_target.items() if v},
        keys=truth.keys,
        cache_hits=truth.cache_hits,
        null_keys=truth.null_keys,
    )


def compare(found: Counts, expected: Counts, *, what: str) -> list[str]:
    """The fields where `found` differs from `expected` (fields `expected` lacks are skipped)."""
    problems: list[str] = []
    for name in (f.name for f in dataclasses.fields(Counts)):
        want = getattr(expected, name)
        got = getattr(found, name)
        if want is None or got == want:
            continue
        if isinstance(want, dict) and isinstance(got, dict):
            keys = sorted(set(want) | set(got))
            diff = {k: (got.get(k, 0), want.get(k, 0)) for k in keys if got.get(k, 0) != want.get(k, 0)}
            problems.append(f"{what}: {name} differs (found, expected): {dict(list(diff.items())[:8])}")
        else:
            problems.append(f"{what}: {name} is {got!r}, expected {want!r}")
    return problems


# -- measuring --------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Measurement:
    """One timed job."""

    engine: Engine
    input: InputKind
    run: int
    seconds: float = 0.0
    records: int = 0
    """Input records read (lines of the JSON files, rows of the Parquet copy)."""
    counts: Counts | None = None
    cpu_others_s: float | None = None
    """CPU time other processes used meanwhile (machine busy time - this process tree's)."""
    load_start: float = 0.0
    load_end: float = 0.0
    error: str | None = None

    @property
    def rate(self) -> float | None:
        return self.records / self.seconds if self.seconds > 0 and self.error is None else None

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "input": self.input,
            "run": self.run,
            "seconds": round(self.seconds, 2),
            "records": self.records,
            "events_per_s": None if self.rate is None else round(self.rate),
            "cpu_others_s": None if self.cpu_others_s is None else round(self.cpu_others_s, 1),
            "loadavg_start": self.load_start,
            "loadavg_end": self.load_end,
            "counts": None if self.counts is None else dataclasses.asdict(self.counts),
            "error": self.error,
        }


_TICK_S: Final = 1 / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU time all processes have used since boot (user, nice, system, irq, softirq of /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) * _TICK_S


def _tree_cpu_s() -> float:
    """CPU time of this process and its descendants, the reaped ones included (via cutime)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        parents[int(name)] = int(rest[1])
        times[int(name)] = sum(int(x) for x in rest[11:15]) * _TICK_S  # utime stime cutime cstime
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(times.get(pid, 0.0) for pid in tree)


class _Meter:
    """Times a block, with the load average and the CPU others used meanwhile."""

    def __init__(self, measurement: Measurement) -> None:
        self.m = measurement

    def __enter__(self) -> _Meter:
        self.m.load_start = round(os.getloadavg()[0], 2)
        self._busy, self._ours = _machine_busy_s(), _tree_cpu_s()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.m.seconds = time.perf_counter() - self._started
        others = (_machine_busy_s() - self._busy) - (_tree_cpu_s() - self._ours)
        self.m.cpu_others_s = max(0.0, others)
        self.m.load_end = round(os.getloadavg()[0], 2)


# -- Spark --------------------------------------------------------------------------------------------


def _start_spark(conf: Mapping[str, str]) -> tuple[SparkSession, float]:
    from pipeline.session import spark_session

    started = time.perf_counter()
    spark = spark_session(MASTER, app="pipeline-benchmark", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark, time.perf_counter() - started


def _stop_spark(spark: SparkSession) -> int | None:
    """Stop the session and the JVM this process started; its pid."""
    context = spark.sparkContext
    gateway = context._gateway
    spark.stop()
    process: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if gateway is not None:
        gateway.shutdown()
    if process is None:
        return None
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    from pyspark import SparkContext

    SparkContext._gateway = None
    SparkContext._jvm = None
    return process.pid


def spark_analyze(spark: SparkSession, source: Path, out: Path) -> Counts:
    """`routerctl analyze` without the HTML report, on one input; the counts of its summary."""
    from pipeline.analyze import analyze

    summary = analyze(spark, [str(source)], str(out), report=False)
    return Counts.of_summary(summary)


# -- DuckDB -------------------------------------------------------------------------------------------

_DUCK_TYPES: Final = {
    FieldType.STRING: "VARCHAR",
    FieldType.LONG: "BIGINT",
    FieldType.DOUBLE: "DOUBLE",
    FieldType.BOOLEAN: "BOOLEAN",
    FieldType.TIMESTAMP: "TIMESTAMP",
}
_FIELD_TYPES: Final = {f.name: f.type for f in FIELDS}


def _columns() -> tuple[str, ...]:
    """The event columns `pipeline.analyze` reads, parses and checks (`pipeline.analyze.COLUMNS`);
    the rest of a line is neither parsed nor checked, in either engine."""
    from pipeline.analyze import COLUMNS  # imports pyspark: only when the pipeline is measured

    return COLUMNS


_KINDS: Final = ("decision", "close")
_STATUSES: Final = ("OK", "REFUSED_USE_ANOTHER", "REFUSED_UNAVAILABLE")
_TARGET_DOWN_CLOSES: Final = ("target_not_ready", "failover")
_EVACUATED_CLOSE: Final = CloseReason.EVACUATED.value
_TEMP_TABLES: Final = ("flagged", "dup_keys", "kept", "roll", "minutes", "flags")


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _typed(name: str, field_type: FieldType) -> tuple[str, str]:
    """A field of the all-VARCHAR struct `j` as its type, and the test that it did not convert."""
    text = f"j.{name}"
    if field_type is FieldType.STRING:
        return text, "false"
    if field_type is FieldType.TIMESTAMP:
        typed = f"TRY_CAST({text} AS TIMESTAMPTZ)::TIMESTAMP"
    else:
        typed = f"TRY_CAST({text} AS {_DUCK_TYPES[field_type]})"
    return typed, f"({text} IS NOT NULL AND {typed} IS NULL)"


_REASON_SQL: Final = f"""CASE
    WHEN corrupt THEN 'unparseable'
    WHEN router_id IS NULL THEN 'missing router_id'
    WHEN seq IS NULL THEN 'missing seq'
    WHEN ts IS NULL THEN 'missing ts'
    WHEN kind IS NULL OR kind NOT IN ({_sql_list(_KINDS)}) THEN 'bad kind'
    WHEN kind = 'decision' AND (status IS NULL OR status NOT IN ({_sql_list(_STATUSES)})) THEN 'bad status'
  END"""
"""`pipeline.ingest.REASONS`, in the same order."""

REASONS: Final = ("unparseable", "missing router_id", "missing seq", "missing ts", "bad kind", "bad status")


def _parse_json_sql(files: Sequence[Path]) -> str:
    """Every line of the files as text, parsed into the event columns plus `corrupt`, `raw`, `file`."""
    names = _columns()
    struct = "{" + ", ".join(f'"{name}": "VARCHAR"' for name in names) + "}"
    typed = [_typed(name, _FIELD_TYPES[name]) for name in names]
    columns = ",\n      ".join(f"{t} AS {name}" for (t, _), name in zip(typed, names, strict=True))
    broken = " OR ".join(test for _, test in typed if test != "false")
    paths = ", ".join(f"'{p}'" for p in files)
    return f"""
    WITH l AS (
      SELECT line, filename AS file,
             json_valid(line) AND starts_with(ltrim(line), '{{') AS object
      FROM read_csv([{paths}], columns = {{'line': 'VARCHAR'}}, delim = '\\x01', quote = '', escape = '',
                    header = false, auto_detect = false, new_line = '\\n', filename = true,
                    store_rejects = true, ignore_errors = true)
    ), j AS (
      SELECT line, file, object,
             CASE WHEN object THEN json_transform(line, '{struct}') END AS j
      FROM l
    )
    SELECT {columns},
      (NOT object) OR {broken} AS corrupt,
      line AS raw, file
    FROM j"""


def _parse_parquet_sql(directory: Path) -> str:
    columns = ", ".join(_columns())
    pack = ", ".join(f"{c} := {c}" for c in _columns())
    return f"""
    SELECT {columns}, false AS corrupt, to_json(struct_pack({pack})) AS raw, filename AS file
    FROM read_parquet('{directory}/*.parquet', filename = true)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    """What a table's query needs besides the shared tables and views (`_shared`)."""

    out: Path
    """Where the tables go: `top_keys` reads the written `per_key`."""
    window_minutes: int
    """The balance table's window."""
    top: int
    """Rows of `top_keys`."""


_IS_DECISION: Final = "kind = 'decision'"
_IS_OK: Final = "(kind = 'decision' AND status = 'OK')"
_IS_CLOSE: Final = "kind = 'close'"
_REFUSED: Final = "(kind = 'decision' AND status <> 'OK')"
_DOWN: Final = _sql_list(_TARGET_DOWN_CLOSES)
_LATENCY_HIST: Final = (
    "WITH b AS (SELECT router, bucket, sum(n) AS n FROM hist GROUP BY ALL) "
    "SELECT * FROM b UNION ALL SELECT '*' AS router, bucket, sum(n) AS n FROM b GROUP BY ALL"
)
"""`latency_hist`'s rows: per router, and over every router as `*`."""


def _shared(con: duckdb.DuckDBPyConnection, parse: str, rejects: str) -> None:
    """The parts several tables read, made once, as `pipeline.analyze.tables` makes them once:
    `flagged` (every record with its quarantine reason), `quarantined` (with the lines the reader
    rejected), the audit dedup (`dup_keys`, `kept`, the view `events`), the two roll-ups (`roll`,
    `minutes`), `per_target` and its `used` targets, the latency histogram `hist`, and the
    per-key window with each move's cause (`flags`).

    Args:
        con: the connection.
        parse: the query of every record (`_parse_json_sql` or `_parse_parquet_sql`).
        rejects: the query of the lines the reader rejected (`reason, raw, file`).
    """
    x = con.execute
    cols = ", ".join(_columns())
    x(
        "CREATE TEMP TABLE flagged AS SELECT * EXCLUDE (raw), "
        "CASE WHEN _reason IS NOT NULL THEN raw END AS raw "
        f"FROM (SELECT *, {_REASON_SQL} AS _reason FROM ({parse}))"
    )  # the raw line is kept for quarantined records only, as ingest's staged copy does
    x(
        "CREATE OR REPLACE TEMP VIEW quarantined AS "
        f"SELECT _reason AS reason, raw, file FROM flagged WHERE _reason IS NOT NULL UNION ALL {rejects}"
    )
    valid = f"(SELECT {cols} FROM flagged WHERE _reason IS NULL)"
    x(
        f"CREATE TEMP TABLE dup_keys AS SELECT router_id, seq, count(*) AS copies FROM {valid} "
        "GROUP BY ALL HAVING count(*) > 1"
    )
    x(
        f"CREATE TEMP TABLE kept AS SELECT DISTINCT ON (router_id, seq) * FROM {valid} v "
        "SEMI JOIN dup_keys USING (router_id, seq)"
    )
    x(
        f"CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM {valid} v "
        f"ANTI JOIN dup_keys USING (router_id, seq) UNION ALL SELECT {cols} FROM kept"
    )
    x(
        "CREATE TEMP TABLE roll AS SELECT kind, router, router_id, node_id, status, reason, mode, cache_hit, "
        "key = 'NULL' AS null_key, count(*) AS n, sum(bytes_in) AS bytes_in, sum(bytes_out) AS bytes_out, "
        "sum(duration_s) AS duration_s FROM events GROUP BY ALL"
    )
    bucket = "floor(log2(greatest(latency_us, 1.0)) * 4)::INTEGER"
    x(
        "CREATE TEMP TABLE minutes AS SELECT date_trunc('minute', ts) AS minute, kind, router, node_id, "
        f"status, cache_hit, key = 'NULL' AS null_key, {bucket} AS bucket, count(*) AS n "
        "FROM events GROUP BY ALL"
    )
    per_target = (
        f"SELECT router, node_id, {_count_if(_IS_OK)} AS decisions, {_count_if(_IS_CLOSE)} AS connections, "
        f"{_count_if(f'{_IS_CLOSE} AND reason IN ({_DOWN})')} AS closed_by_router, "
        "sum(bytes_in) AS bytes_in, sum(bytes_out) AS bytes_out "
        "FROM roll WHERE node_id IS NOT NULL GROUP BY ALL"
    )
    x(
        "CREATE OR REPLACE TEMP VIEW per_target AS "
        f"SELECT *, decisions / sum(decisions) OVER (PARTITION BY router) AS share FROM ({per_target})"
    )
    x("CREATE OR REPLACE TEMP VIEW used AS SELECT router, node_id FROM per_target WHERE decisions > 0")
    x(
        "CREATE OR REPLACE TEMP VIEW hist AS SELECT minute, router, bucket, sum(n) AS n FROM minutes "
        f"WHERE {_IS_DECISION} GROUP BY ALL"
    )
    before = (
        "(PARTITION BY router, key ORDER BY ts, router_id, seq "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
    )
    x(
        f"""CREATE TEMP TABLE flags AS
        WITH closed AS (
          SELECT DISTINCT router_id, conn, reason AS close_reason FROM events
          WHERE {_IS_CLOSE} AND reason IN ({_DOWN}, '{_EVACUATED_CLOSE}')
        ),
        d AS (
          SELECT router, key, ts, router_id, seq, conn, status, reason, node_id, cache_hit, close_reason
          FROM events LEFT JOIN closed USING (router_id, conn)
          WHERE {_IS_DECISION} AND key <> 'NULL'
        ),
        f AS (
          SELECT *, CASE WHEN status = 'OK' THEN node_id END AS ok_node,
            last_value(CASE WHEN status = 'OK' THEN node_id END IGNORE NULLS) OVER w AS prev_target,
            last_value(CASE WHEN status = 'OK' THEN coalesce(close_reason, '') END IGNORE NULLS)
              OVER w AS prev_close,
            coalesce(max(status = 'OK' AND cache_hit) OVER w, false) AS hits_before,
            date_trunc('minute', ts) AS minute
          FROM d WINDOW w AS {before}
        ),
        m AS (
          SELECT *, coalesce(status = 'OK' AND prev_target IS NOT NULL AND node_id <> prev_target, false)
                    AS is_move
          FROM f
        ),
        active AS (
          SELECT DISTINCT router, minute, node_id AS prev_target, true AS prev_active
          FROM minutes WHERE {_IS_OK}
        )
        SELECT m.*, coalesce(a.prev_active, false) AS prev_active,
          CASE WHEN is_move THEN CASE
            WHEN prev_close = '{_EVACUATED_CLOSE}' THEN 'evacuated'
            WHEN reason = 'redispatch' OR coalesce(prev_close IN ({_DOWN}), false)
                 OR NOT coalesce(a.prev_active, false) THEN 'target_down'
            WHEN reason = 'policy' AND hits_before THEN 'cache_expiry'
            ELSE 'policy' END END AS cause
        FROM m LEFT JOIN active a USING (router, minute, prev_target)"""
    )


def _count_if(condition: str) -> str:
    """The events of a roll-up's rows that meet `condition` (0 when none do)."""
    return f"coalesce(sum(n) FILTER (WHERE {condition}), 0)"


def _counts(group: str) -> str:
    """Decisions, OK, refused, connections, cache hits and NULL keys of `roll` per `group`."""
    return (
        f"SELECT {group}, {_count_if(_IS_DECISION)} AS decisions, {_count_if(_IS_OK)} AS ok, "
        f"{_count_if(_REFUSED)} AS refused, {_count_if(_IS_CLOSE)} AS connections, "
        f"{_count_if(f'{_IS_OK} AND cache_hit')} AS cache_hits, "
        f"{_count_if(f'{_IS_DECISION} AND null_key')} AS null_keys FROM roll GROUP BY ALL"
    )


def _balance(ok_counts: str, group: Sequence[str]) -> str:
    """`pipeline.analyze.balance`: OK decisions over every `used` target of a router, per group."""
    keys = ", ".join([*group, "router"])
    return f"""
        WITH c AS ({ok_counts}),
        grid AS (SELECT DISTINCT {keys} FROM c),
        filled AS (
          SELECT {", ".join(f"g.{k}" for k in [*group, "router"])}, u.node_id,
                 coalesce(c.decisions, 0) AS decisions
          FROM grid g JOIN used u USING (router)
          LEFT JOIN c ON {" AND ".join(f"c.{k} = g.{k}" for k in [*group, "router"])}
                     AND c.node_id = u.node_id
        ),
        agg AS (
          SELECT {keys}, count(*) AS targets, sum(decisions) AS decisions, avg(decisions) AS mean,
                 max(decisions) AS max, stddev_pop(decisions) AS std FROM filled GROUP BY ALL
        )
        SELECT {keys}, targets, decisions, mean, max, max / mean AS max_mean, std / mean AS cv FROM agg"""


def _percentiles(source: str, group: Sequence[str]) -> str:
    """`pipeline.analyze.percentiles` of a histogram `group + [bucket, n]`."""
    keys = ", ".join(group)
    picks = ", ".join(
        f"round(pow(2.0, (min(bucket) FILTER (WHERE cum * 1000 >= total * {q}) + 1) / 4), 1) AS {name}_us"
        for name, q in (("p50", 500), ("p90", 900), ("p99", 990), ("p999", 999))
    )
    return f"""
        WITH r AS (
          SELECT *, sum(n) OVER (PARTITION BY {keys} ORDER BY bucket
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
                 sum(n) OVER (PARTITION BY {keys}) AS total FROM ({source})
        )
        SELECT {keys}, first(total) AS decisions, {picks} FROM r GROUP BY ALL"""


def _per_router(_job: _Job) -> str:
    overall = _balance("SELECT router, node_id, decisions FROM per_target", [])
    return (
        "SELECT r.*, r.cache_hits / r.ok AS cache_hit_ratio, r.null_keys / r.decisions AS null_key_rate, "
        f"b.max_mean, b.cv FROM ({_counts('router')}) r LEFT JOIN ({overall}) b USING (router)"
    )


def _balance_table(job: _Job) -> str:
    seconds = job.window_minutes * 60
    ok_windows = (
        f"SELECT to_timestamp(floor(epoch(minute) / {seconds}) * {seconds})::TIMESTAMP AS window_start, "
        f"router, node_id, sum(n) AS decisions FROM minutes WHERE {_IS_OK} GROUP BY ALL"
    )
    return _balance(ok_windows, ["window_start"])


def _per_minute(_job: _Job) -> str:
    minute_counts = (
        f"SELECT minute, router, {_count_if(_IS_DECISION)} AS decisions, {_count_if(_IS_OK)} AS ok, "
        f"{_count_if(_REFUSED)} AS refused, {_count_if(f'{_IS_OK} AND cache_hit')} AS cache_hits, "
        f"{_count_if(f'{_IS_DECISION} AND null_key')} AS null_keys, {_count_if(_IS_CLOSE)} AS connections "
        "FROM minutes GROUP BY ALL"
    )
    return (
        f"SELECT c.*, p.p50_us, p.p99_us FROM ({minute_counts}) c "
        f"LEFT JOIN ({_percentiles('SELECT * FROM hist', ['minute', 'router'])}) p USING (minute, router)"
    )


def _per_key(_job: _Job) -> str:
    return (
        "SELECT router, key, count(*) AS decisions, count(*) FILTER (WHERE status = 'OK') AS ok, "
        "count(*) FILTER (WHERE status <> 'OK') AS refused, "
        "count(*) FILTER (WHERE status = 'OK' AND cache_hit) AS cache_hits, "
        "count(DISTINCT ok_node) AS targets, "
        "count(*) FILTER (WHERE is_move) AS moves, "
        "arg_max(ok_node, (ts, router_id, seq)) FILTER (WHERE status = 'OK') AS last_target, "
        "min(ts) AS first_ts, max(ts) AS last_ts FROM flags GROUP BY ALL"
    )


def _quarantine_counts(_job: _Job) -> str:
    """Records set aside per reason, every reason of `REASONS` in its order (0 when none), with
    analyze's columns (`files` null: no file is set aside whole here)."""
    reasons = ", ".join(f"('{reason}', {i})" for i, reason in enumerate(REASONS))
    return (
        "SELECT reason, coalesce(q.records, 0) AS records, NULL::BIGINT AS files "
        f"FROM (VALUES {reasons}) r(reason, i) "
        "LEFT JOIN (SELECT reason, count(*) AS records FROM quarantined GROUP BY ALL) q USING (reason) "
        "ORDER BY i"
    )


DUCKDB_TABLES: Final[Mapping[str, Callable[[_Job], str]]] = {
    "per_target": lambda _: "SELECT * FROM per_target",
    "per_router": _per_router,
    "per_process": lambda _: _counts("router_id, router"),
    "refusals": lambda _: (
        f"SELECT router, status, reason, sum(n) AS decisions FROM roll WHERE {_REFUSED} GROUP BY ALL"
    ),
    "close_reasons": lambda _: (
        f"SELECT router, node_id, reason, sum(n) AS connections FROM roll WHERE {_IS_CLOSE} GROUP BY ALL"
    ),
    "balance": _balance_table,
    "per_minute": _per_minute,
    "latency": lambda _: _percentiles(_LATENCY_HIST, ["router"]),
    "latency_hist": lambda _: (
        "SELECT router, bucket, round(pow(2.0, bucket / 4), 1) AS lower_us, "
        f"round(pow(2.0, (bucket + 1) / 4), 1) AS upper_us, n AS decisions FROM ({_LATENCY_HIST})"
    ),
    "per_key": _per_key,
    "moves": lambda _: (
        "SELECT router, key, ts, router_id, seq, prev_target AS from_target, node_id AS to_target, "
        "reason, cause FROM flags WHERE is_move"
    ),
    "moves_by_cause": lambda _: (
        "SELECT router, cause, count(*) AS moves, count(DISTINCT key) AS keys "
        "FROM flags WHERE is_move GROUP BY ALL"
    ),
    "top_keys": lambda job: (  # after per_key, which it reads as written
        f"SELECT * FROM read_parquet('{job.out / 'per_key.parquet'}') "
        f"ORDER BY decisions DESC, router, key LIMIT {job.top}"
    ),
    "quarantine": lambda _: "SELECT * FROM quarantined",
    "quarantine_counts": _quarantine_counts,
}
"""`pipeline.analyze.TABLES`, in its order, each as the query that makes it in DuckDB from the
shared tables and views (`_shared`)."""


def duckdb_analyze(
    con: duckdb.DuckDBPyConnection,
    *,
    json_files: Sequence[Path] | None = None,
    parquet_dir: Path | None = None,
    out: Path,
    window_minutes: int = 1,
    top: int = 20,
) -> Counts:
    """What `pipeline.analyze.analyze` does, in DuckDB SQL: quarantine, audit dedup, the same
    tables written as Parquet under `out` (module docstring, step 3), one query per table
    (`DUCKDB_TABLES`), and the summary's counts from the written tables.

    Args:
        con: a connection (threads and time zone set).
        json_files: the router's files, or
        parquet_dir: the Parquet copy.
        out: where the tables go (created).
        window_minutes: the balance table's window.
        top: rows of `top_keys`.

    Returns:
        The counts of its summary.
    """
    out.mkdir(parents=True, exist_ok=True)
    if json_files is not None:
        parse = _parse_json_sql(json_files)
        rejects = (
            "SELECT 'unparseable' AS reason, e.csv_line AS raw, s.file_path AS file "
            "FROM reject_errors e JOIN reject_scans s USING (scan_id, file_id) "
            "QUALIFY row_number() OVER (PARTITION BY e.scan_id, e.file_id, e.line) = 1"
        )
    elif parquet_dir is not None:
        parse = _parse_parquet_sql(parquet_dir)
        rejects = "SELECT NULL::VARCHAR AS reason, NULL::VARCHAR AS raw, NULL::VARCHAR AS file WHERE false"
    else:
        raise ValueError("json_files or parquet_dir")
    x = con.execute
    for name in _TEMP_TABLES:
        x(f"DROP TABLE IF EXISTS {name}")
    _shared(con, parse, rejects)
    job = _Job(out=out, window_minutes=window_minutes, top=top)
    for name, query in DUCKDB_TABLES.items():
        x(f"COPY ({query(job)}) TO '{out / name}.parquet' (FORMAT parquet, COMPRESSION zstd)")

    # The summary, from the written tables as `pipeline.analyze` makes it.
    def written(name: str) -> str:
        return f"read_parquet('{out / name}.parquet')"

    row = x("SELECT coalesce(sum(copies - 1), 0) FROM dup_keys").fetchone()
    assert row is not None
    duplicates = int(row[0])
    by_reason = {
        str(reason): int(n)
        for reason, n in x(f"SELECT reason, records FROM {written('quarantine_counts')}").fetchall()
    }
    row = x(
        "SELECT sum(decisions), sum(connections), sum(ok), sum(cache_hits), sum(null_keys) "
        f"FROM {written('per_router')}"
    ).fetchone()
    assert row is not None
    decisions, connections, ok, cache_hits, null_keys = (int(v or 0) for v in row)
    by_status = {"OK": ok}
    for status, n in x(f"SELECT status, sum(decisions) FROM {written('refusals')} GROUP BY ALL").fetchall():
        by_status[str(status)] = int(n)
    by_target = {
        str(node): int(n)
        for node, n in x(
            f"SELECT node_id, sum(decisions) FROM {written('per_target')} GROUP BY ALL"
        ).fetchall()
        if n
    }
    by_cause = {
        str(cause): int(n)
        for cause, n in x(
            f"SELECT cause, sum(moves) FROM {written('moves_by_cause')} GROUP BY ALL"
        ).fetchall()
    }
    row = x(f"SELECT count(*), count(*) FILTER (WHERE moves > 0) FROM {written('per_key')}").fetchone()
    assert row is not None
    summary = {
        "events": decisions + connections,
        "duplicates_removed": duplicates,
        "malformed": sum(by_reason.values()),
        "malformed_by_reason": by_reason,
        "decisions_by_status": by_status,
        "decisions_by_target": by_target,
        "keys": int(row[0]),
        "moved_keys": int(row[1]),
        "moves_by_cause": by_cause,
        "cache_hits": cache_hits,
        "null_keys": null_keys,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for name in _TEMP_TABLES:
        x(f"DROP TABLE IF EXISTS {name}")
    return Counts.of_summary(summary)


def _duckdb(temp: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {DUCKDB_THREADS}")
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET temp_directory = '{temp}'")
    return con


# -- the run ----------------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class _Run:
    """Everything one invocation measured."""

    data: DataSet | None = None
    """The router's files as JSON lines (`<format>jsonl</format>`)."""
    parquet: DataSet | None = None
    """The router's files as Parquet (its default format)."""
    spark_start_s: float | None = None
    jvm_pid: int | None = None
    measurements: list[Measurement] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    event_log: EventLogCost | None = None


def _measure(
    run: _Run,
    engine: Engine,
    kind: InputKind,
    number: int,
    work: Path,
    spark: SparkSession | None,
) -> None:
    data = run.data if kind == "json" else run.parquet
    assert data is not None
    m = Measurement(engine=engine, input=kind, run=number)
    m.records = data.truth.lines
    out = work / f"out-{engine}-{kind}-{number}"
    shutil.rmtree(out, ignore_errors=True)
    _say(f"run {number}: {engine} on {kind}")
    try:
        if engine == "spark":
            assert spark is not None
            source = data.directory
            with _Meter(m):
                m.counts = spark_analyze(spark, source, out)
        else:
            temp = work / "duckdb.tmp"
            con = _duckdb(temp)
            try:
                with _Meter(m):
                    m.counts = duckdb_analyze(
                        con,
                        json_files=data.files if kind == "json" else None,
                        parquet_dir=data.directory if kind == "parquet" else None,
                        out=out,
                    )
            finally:
                con.close()
                shutil.rmtree(temp, ignore_errors=True)
    except Exception as exc:  # a failed job is a figure that failed, not the end of the run
        m.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        run.failures.append(f"{engine}/{kind} run {number}: {m.error}")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if m.counts is not None:
        run.failures += compare(
            m.counts, expected_counts(data.truth), what=f"{engine}/{kind} run {number} vs truth.json"
        )
    _say(
        f"run {number}: {engine} on {kind}: {m.seconds:.1f} s"
        + (f", others used {m.cpu_others_s:.1f} CPU-s" if m.cpu_others_s is not None else "")
        + (f", FAILED {m.error}" if m.error else "")
    )
    run.measurements.append(m)


def _cross_check(run: _Run) -> None:
    """Spark and DuckDB must agree on every count, moved keys and moves included."""
    for kind in ("json", "parquet"):
        for number in sorted({m.run for m in run.measurements}):
            pair = {m.engine: m for m in run.measurements if m.input == kind and m.run == number}
            spark, duck = pair.get("spark"), pair.get("duckdb")
            if spark is None or duck is None or spark.counts is None or duck.counts is None:
                continue
            run.failures += compare(spark.counts, duck.counts, what=f"{kind} run {number}: spark vs duckdb")


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _seconds(run: _Run, engine: Engine, kind: InputKind) -> list[float]:
    return [m.seconds for m in run.measurements if m.engine == engine and m.input == kind and m.error is None]


def _goals(run: _Run, events: int) -> list[dict[str, object]]:
    spark_json = _median(_seconds(run, "spark", "json"))
    spark_pq = _median(_seconds(run, "spark", "parquet"))
    duck_json = _median(_seconds(run, "duckdb", "json"))
    duck_pq = _median(_seconds(run, "duckdb", "parquet"))
    judged = events >= GOAL_EVENTS

    def goal(name: str, value: float | None, limit: float, unit: str) -> dict[str, object]:
        met = None if value is None or not judged else value <= limit
        return {"goal": name, "value": value, "limit": limit, "unit": unit, "met": met}

    return [
        goal("Spark from the router's files (Parquet)", spark_pq, GOAL_FILES_S, "s"),
        goal("Spark from Parquet", spark_pq, GOAL_PARQUET_S, "s"),
        goal(
            "Spark/DuckDB, Parquet",
            None if spark_pq is None or not duck_pq else spark_pq / duck_pq,
            GOAL_RATIO,
            "x",
        ),
        goal("Spark from .jsonl.zst (<format>jsonl)", spark_json, GOAL_FILES_S, "s"),
        goal(
            "Spark/DuckDB, .jsonl.zst",
            None if spark_json is None or not duck_json else spark_json / duck_json,
            GOAL_RATIO,
            "x",
        ),
    ]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(run: _Run, events: int) -> str:
    """The figures of every run, the medians and the goals, as text."""
    lines: list[str] = []
    numbers = sorted({m.run for m in run.measurements})
    header = f"{'input':<22} {'engine':<7} " + " ".join(f"{'run ' + str(n) + ' s':>10}" for n in numbers)
    header += f" {'median s':>9} {'events/s':>10} {'others CPU-s':>13} {'Spark/DuckDB':>13}"
    lines.append(header)
    labels = {"json": "router's .jsonl.zst", "parquet": "router's Parquet"}
    for kind in ("json", "parquet"):
        for engine in ("spark", "duckdb"):
            ms = [m for m in run.measurements if m.engine == engine and m.input == kind]
            if not ms:
                continue
            per_run = {m.run: m for m in ms}
            cells = " ".join(
                f"{('FAILED' if per_run[n].error else _fmt(per_run[n].seconds)) if n in per_run else '-':>10}"
                for n in numbers
            )
            med = _median(_seconds(run, engine, kind))
            rate = None if med is None else ms[0].records / med
            others = _median([m.cpu_others_s for m in ms if m.cpu_others_s is not None])
            ratio = ""
            if engine == "spark":
                duck = _median(_seconds(run, "duckdb", kind))
                ratio = _fmt(med / duck, 2) + "x" if med is not None and duck else "-"
            lines.append(
                f"{labels[kind]:<22} {engine:<7} {cells} {_fmt(med):>9} {_fmt(rate, 0):>10} "
                f"{_fmt(others):>13} {ratio:>13}"
            )
    lines.append("")
    judged = (
        "" if events >= GOAL_EVENTS else f" (shown, not judged: the goals are for {GOAL_EVENTS:,} events)"
    )
    lines.append(f"goals at {events:,} events, medians{judged}:")
    for g in _goals(run, events):
        value = g["value"]
        shown = "-" if not isinstance(value, float) else f"{value:.2f}{g['unit']}"
        verdict = {True: "met", False: "NOT met", None: "-"}[g["met"]]  # type: ignore[index]
        lines.append(f"  {g['goal']:<45} {shown:>9}  <= {g['limit']}{g['unit']}  {verdict}")
    return "\n".join(lines)


def format_event_log(cost: EventLogCost) -> str:
    """The event log's cost per event, next to the decision."""
    return "\n".join(
        [
            f"event log, in process ({cost.events:,} events, half decisions, half closes):",
            f"  report (reporting thread: the recorder's record)  p50 {cost.report_p50_us:.2f} µs, "
            f"p99 {cost.report_p99_us:.2f} µs, mean {cost.report_mean_us:.2f} µs per event",
            f"  send (the frame of a batch)        {cost.send_us:.2f} µs per event",
            *(
                f"  writer process, {w.format} (encode, write, finish, fsync)  {w.writer_us:.2f} µs "
                f"per event (encoding alone {w.encode_us:.2f}); {w.file_bytes_per_event:.1f} B per event; "
                f"CPU {w.steady_cpu_us:.2f} µs per event at {TRICKLE_RATE:,} events/s"
                for w in cost.writers
            ),
            f"  per short connection (decision + close): {cost.per_connection_us:.2f} µs of routerd's "
            "interpreter (the writer process's work beside it)",
            "  routing decision (echo, SOURCE_IP, CONSISTENT_HASH): "
            f"miss p50 {cost.decision_miss_p50_us:.2f} µs, hit p50 {cost.decision_hit_p50_us:.2f} µs",
        ]
    )


def _versions() -> dict[str, str]:
    import duckdb
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30, check=False)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
    )
    return {
        "python": sys.version.split()[0],
        "pyspark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "java": (java.stderr or java.stdout).splitlines()[0] if (java.stderr or java.stdout) else "unknown",
        "commit": commit.stdout.strip() or "unknown",
    }


def default_json_path() -> Path:
    """Where the JSON goes without --json: the system's temporary directory, never the tree."""
    return Path(tempfile.gettempdir()) / "router-bench" / "pipeline.json"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.pipeline",
        description="routerctl analyze on Spark local[2] against DuckDB on the same files "
        "(see benchmarks/README.md).",
    )
    parser.add_argument(
        "--events", type=int, default=None, help=f"lines to generate (default {FULL_EVENTS:,})"
    )
    parser.add_argument("--runs", type=int, default=1, help="measure each job this many times (1-10)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="data and outputs (default: a new /tmp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep what this run generated")
    parser.add_argument("--json", type=Path, default=None, help=f"figures (default {default_json_path()})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS:,} events: the smoke run")
    parser.add_argument("--only", default=",".join(GROUPS), help=f"groups to run: {','.join(GROUPS)}")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="one more Spark setting (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="bound on the whole run, seconds")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 10:
        parser.error(f"--runs must be 1-10, got {args.runs}")
    args.events = args.events or (QUICK_EVENTS if args.quick else FULL_EVENTS)
    if args.events < 1_000:
        parser.error(f"--events must be >= 1000, got {args.events}")
    groups = [g.strip() for g in str(args.only).split(",") if g.strip()]
    if not groups or any(g not in GROUPS for g in groups):
        parser.error(f"--only takes names from {','.join(GROUPS)}, got {args.only!r}")
    args.groups = groups
    conf = dict(SPARK_CONF) | (dict(QUICK_SPARK_CONF) if args.quick else {})
    for item in args.conf:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            parser.error(f"--conf takes KEY=VALUE, got {item!r}")
        conf[key.strip()] = value.strip()
    args.spark_conf = conf
    if args.timeout is None:
        args.timeout = 600.0 if args.quick else 300.0 + args.events / 10_000_000 * 900 * args.runs
    return args


class _Timeout(Exception):
    pass


def _on_alarm(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise _Timeout


def _on_sigterm(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def _pipeline(run: _Run, args: argparse.Namespace, work: Path) -> None:
    run.data = data_set(work, args.events, quick=args.quick)
    run.parquet = data_set(work, args.events, quick=args.quick, kind="parquet")
    spark, run.spark_start_s = _start_spark(args.spark_conf)
    gateway = spark.sparkContext._gateway
    process = getattr(gateway, "proc", None)
    run.jvm_pid = None if process is None else process.pid
    _say(f"Spark {MASTER} session started in {run.spark_start_s:.1f} s (JVM pid {run.jvm_pid})")
    try:
        for number in range(1, args.runs + 1):
            for engine, kind in (
                ("spark", "json"),
                ("spark", "parquet"),
                ("duckdb", "json"),
                ("duckdb", "parquet"),
            ):
                _measure(run, engine, kind, number, work, spark)  # type: ignore[arg-type]  # the literals above
    finally:
        pid = _stop_spark(spark)
        _say(f"stopped the JVM (pid {pid})")
    _cross_check(run)


def _data_json(data: DataSet | None) -> dict[str, object] | None:
    if data is None:
        return None
    return {
        "directory": str(data.directory),
        "params": data.params,
        "lines": data.truth.lines,
        "files": len(data.truth.files),
        "bytes": data.bytes if data.directory.exists() else None,
        "generated": data.generated,
        "generate_s": round(data.seconds, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 0, 1 (a job failed or the counts disagree), 124 (timeout),
    130 (interrupted)."""
    args = _parse_args(argv)
    json_path: Path = args.json or default_json_path()
    made_workdir = args.workdir is None
    work: Path = Path(tempfile.mkdtemp(prefix="router-pipeline-bench-")) if made_workdir else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    run = _Run()
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    versions = _versions()  # the commit the run started from
    status = 0
    handlers = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, _on_sigterm),
        signal.SIGALRM: signal.signal(signal.SIGALRM, _on_alarm),
    }
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    try:
        if "event-log" in args.groups:
            _say("measuring the event log's cost in process")
            run.event_log = time_event_log(EVENT_LOG_EVENTS_QUICK if args.quick else EVENT_LOG_EVENTS)
        if "pipeline" in args.groups:
            _pipeline(run, args, work)
    except _Timeout:
        status = 124
        run.failures.append(f"timed out after {args.timeout:.0f} s (--timeout)")
    except KeyboardInterrupt:
        status = 130
        run.failures.append("interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    for data in (run.data, run.parquet):
        if data is not None and data.generated and not args.keep:
            shutil.rmtree(data.directory, ignore_errors=True)
    if not args.keep and made_workdir:
        shutil.rmtree(work, ignore_errors=True)
    doc: dict[str, object] = {
        "schema": "router-pipeline-bench/1",
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "command": " ".join(
            ["python -m benchmarks.studies.pipeline", *(argv if argv is not None else sys.argv[1:])]
        ),
        "events": args.events,
        "quick": bool(args.quick),
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "versions": versions,
        "spark": {"master": MASTER, "conf": dict(args.spark_conf), "session_start_s": run.spark_start_s},
        "duckdb": {"threads": DUCKDB_THREADS},
        "data": _data_json(run.data),
        "parquet_data": _data_json(run.parquet),
        "measurements": [m.to_json() for m in run.measurements],
        "goals": _goals(run, args.events),
        "event_log": None
        if run.event_log is None
        else {**dataclasses.asdict(run.event_log), "per_connection_us": run.event_log.per_connection_us},
        "failures": run.failures,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    if run.measurements:
        print(format_table(run, args.events))
        files = [
            f"{d.truth.lines:,} {what} in {len(d.truth.files)} files"
            for d, what in ((run.data, ".jsonl.zst lines"), (run.parquet, "Parquet rows"))
            if d is not None
        ]
        print(
            f"\n{'; '.join(files)}; Spark {MASTER} session start {_fmt(run.spark_start_s)} s (not in the "
            f"times); conf {dict(args.spark_conf)}"
        )
    if run.event_log is not None:
        print("\n" + format_event_log(run.event_log))
    print(
        f"\n{os.cpu_count()} CPUs; load average {load_start[0]} at start, {os.getloadavg()[0]:.2f} at end. "
        f"JSON: {json_path}",
        flush=True,
    )
    for failure in run.failures:
        _say(f"FAILED {failure}")
    if status:
        return status
    return 1 if run.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
