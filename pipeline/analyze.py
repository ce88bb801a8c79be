"""`routerctl analyze`: what the routers decided, how balanced and sticky it was, and why keys moved.

The job (`analyze`) ingests the event files (`pipeline.ingest`: quarantine, dedup), then computes,
with pure DataFrame functions a test can feed hand-written events:

* two small roll-ups from one scan (`rollups`): over the whole log per kind,
  router, process, target, status, reason, mode, cache hit and NULL key, and per minute, router,
  target, status, cache hit, NULL key and log2 latency bucket; every count table is derived from
  them;
* `per_key_flags`: one ordered window per (router, key) (partitioned by its 64-bit hash,
  `KEY_ID`, checked), over the few columns it needs, that finds the moves and keeps each key's
  running figures; `per_key_rows` keeps the few rows the tables need (each key's last decision,
  its moves), so the window runs once for `per_key_table` and for `moves_table`, which gives
  the moves their cause (`move_cause`) with small joins on the moves only.

`shared` computes those once (`Shared`); each table is then one function of them
(`TABLE_BUILDERS`, one entry per table, in `TABLES`' order).

Keys are per connection router: (router, key); `NULL` is not a key. It writes Parquet tables under
`--out` (`TABLES`), `summary.json` and `report.html` (`pipeline.report`), and brings to the driver
only aggregate tables (at most a few thousand rows) and counts. docs/pipeline.md describes the
tables.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pyspark import StorageLevel
from pyspark.sql import Window
from pyspark.sql import functions as F

from pipeline.ingest import UNREADABLE, ingest, write_text
from pipeline.session import SHUFFLE_PARTITIONS, setting
from router.core.events import CloseReason

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs in the pipeline extra
    from pyspark.sql import Column, DataFrame, SparkSession

    from pipeline.ingest import Ingested, UnreadableFile

__all__ = [
    "BUCKETS_PER_OCTAVE",
    "COLUMNS",
    "EVACUATED_CLOSE",
    "KEY_ID",
    "PERCENTILES",
    "PER_KEY_SHUFFLES",
    "PER_MINUTE",
    "SHARED_ID",
    "SMALL_WRITERS",
    "SUMMED",
    "TABLES",
    "TABLE_BUILDERS",
    "WHOLE_LOG",
    "Shared",
    "analyze",
    "balance",
    "bucket_upper_us",
    "key_id",
    "latency_bucket",
    "move_cause",
    "moves_table",
    "per_key_flags",
    "per_key_table",
    "percentiles",
    "quarantine_counts",
    "rollups",
    "shared",
    "tables",
]

BUCKETS_PER_OCTAVE: Final = 4
"""Latency buckets per doubling: each ≈19 % wide; counts add up exactly over any roll-up (research
§2.3: 1.6 s against 5.8 s for `percentile_approx` per minute on 10 M events)."""
PERCENTILES: Final = {"p50": 500, "p90": 900, "p99": 990, "p999": 999}
"""Name -> per mille (integer, so `cumulative * 1000 >= total * q` is exact)."""
TARGET_DOWN_CLOSES: Final = ("target_not_ready", "failover")
"""Close reasons that say the router took the connection off its target."""
EVACUATED_CLOSE: Final = CloseReason.EVACUATED.value
"""The close reason of a connection an operator's evacuation, rebalance or a reload moved."""
NULL_KEY: Final = "NULL"
KEY_ID: Final = "_key_id"
"""A (router, key)'s 64-bit hash (xxhash64): the per-key window partitions and sorts by it, a long
that the sort compares in its 8-byte prefix, where two strings (the router, often the same in every
row, then the key) made the sort compare whole rows. `per_key_flags` flags a key that shares its id
with another (`SHARED_ID`), and `shared` then partitions by the strings instead."""
SHARED_ID: Final = "_shared_id"
"""`per_key_flags`'s flag: this decision's (router, key) differs from the one before it in its
window, so two keys share a `KEY_ID`."""
COLUMNS: Final = (
    "kind",
    "router_id",
    "seq",
    "ts",
    "conn",
    "router",
    "key",
    "status",
    "reason",
    "mode",
    "node_id",
    "cache_hit",
    "latency_us",
    "duration_s",
    "bytes_in",
    "bytes_out",
)
"""The event columns the tables read: only these are staged (the source, protocol, acceptor and
raw key are `simulate`'s)."""
SMALL_WRITERS: Final = 4
"""Tables written, and aggregate tables read back for the report, at a time. An aggregate table is
a Spark job of a few hundred rows whose time is mostly the driver's (planning, scheduling, the
commit), so they overlap, and with the two large tables (started first): on 10 M events from
Parquet, local[2], the whole job took 63.6 and 62.6 s against 67.3 and 71.1 s written one by one;
overlapping the large tables and the reads too, 37.9-43.5 s (median 39.5) against 38.8-42.3 s
(median 40.6), six runs each."""


PER_KEY_SHUFFLES: Final = 2
"""The per-key window's shuffle writes this many times the session's shuffle partitions
(`spark.sql.shuffle.partitions`): Zipf keys make its tasks uneven (on 10 M events, 4 tasks of
3.8-7.0 s on 2 cores, one core idle at the end), and smaller tasks even them out: that step took
11.5-13.6 s against 12.0-13.5 s (medians 11.7 and 12.8 s, six runs each, a cold first run of
19.7 s left out)."""


def latency_bucket(latency_us: Column) -> Column:
    """The log2 bucket of a latency: `floor(4 * log2(µs))`, latencies under 1 µs in bucket 0."""
    return F.floor(F.log2(F.greatest(latency_us, F.lit(1.0))) * BUCKETS_PER_OCTAVE).cast("int")


def bucket_upper_us(bucket: Column) -> Column:
    """The upper bound of a bucket in µs (what a percentile reports: "p99 <= x"), 0.1 µs."""
    return F.round(F.pow(F.lit(2.0), (bucket + 1) / BUCKETS_PER_OCTAVE), 1)


def _count_if(condition: Column, weight: Column | None = None) -> Column:
    return F.sum(F.when(condition, weight if weight is not None else F.lit(1)).otherwise(0))


WHOLE_LOG: Final = (
    "kind",
    "router",
    "router_id",
    "node_id",
    "status",
    "reason",
    "mode",
    "cache_hit",
    "null_key",
)
"""The whole-log roll-up's grouping (with bytes and durations summed)."""
SUMMED: Final = ("bytes_in", "bytes_out", "duration_s")
"""What the whole-log roll-up sums (closes)."""
PER_MINUTE: Final = ("minute", "kind", "router", "node_id", "status", "cache_hit", "null_key", "bucket")
"""The per-minute roll-up's grouping (`bucket`: the latency bucket, null for closes)."""


def rollups(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Two small roll-ups from one scan, kept: `n` events per `WHOLE_LOG` (with the `SUMMED`
    columns summed) and per `PER_MINUTE`. The scan aggregates over every grouping column of both
    at once (a few hundred thousand rows on 10 M events, kept), and each roll-up is summed from that:
    on 10 M events, 4.8-6.2 s against 5.5-6.4 s for grouping sets, which aggregate every event
    twice (medians 4.9 and 6.0 s of seven runs each, the cold first run left out of the ranges)."""
    dims = events.select(
        *(name for name in WHOLE_LOG if name != "null_key"),
        (F.col("key") == NULL_KEY).alias("null_key"),
        F.date_trunc("minute", "ts").alias("minute"),
        latency_bucket(F.col("latency_us")).alias("bucket"),
        *SUMMED,
    )
    finest = (
        dims.groupBy(*dict.fromkeys(WHOLE_LOG + PER_MINUTE))
        .agg(F.count("*").alias("n"), *(F.sum(name).alias(name) for name in SUMMED))
        .localCheckpoint()  # computed now (one scan), and a plain relation for the roll-ups' self-joins
    )
    whole = (
        finest.groupBy(*WHOLE_LOG)
        .agg(F.sum("n").alias("n"), *(F.sum(name).alias(name) for name in SUMMED))
        .localCheckpoint()
    )
    return whole, finest.groupBy(*PER_MINUTE).agg(F.sum("n").alias("n")).localCheckpoint()


def percentiles(hist: DataFrame, group: list[str]) -> DataFrame:
    """Latency percentiles (`PERCENTILES`, as bucket upper bounds in µs) per group of a histogram
    with columns `group + [bucket, n]`: the smallest bucket whose cumulative count reaches q of the
    total (nearest rank)."""
    upto = Window.partitionBy(*group).orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    whole = Window.partitionBy(*group)
    ranked = hist.withColumn("cum", F.sum("n").over(upto)).withColumn("total", F.sum("n").over(whole))
    return ranked.groupBy(*group).agg(
        F.first("total").alias("decisions"),
        *(
            bucket_upper_us(F.min(F.when(F.col("cum") * 1000 >= F.col("total") * q, F.col("bucket")))).alias(
                f"{name}_us"
            )
            for name, q in PERCENTILES.items()
        ),
    )


def balance(ok_counts: DataFrame, targets: DataFrame, group: list[str]) -> DataFrame:
    """Balance of OK decisions over a router's targets per group (e.g. window): `max_mean` (the
    busiest target against the mean) and `cv` (population standard deviation / mean). Every target
    the router used in the whole log counts, with 0 where it got nothing (a target down).

    Args:
        ok_counts: `group + [router, node_id, decisions]`.
        targets: `[router, node_id]`, the targets of each router.
        group: the grouping columns besides `router` (empty: the whole log).
    """
    keys = [*group, "router"]
    grid = ok_counts.select(*keys).distinct().join(targets, "router")
    filled = grid.join(ok_counts, [*keys, "node_id"], "left").fillna(0, subset=["decisions"])
    return (
        filled.groupBy(*keys)
        .agg(
            F.count("*").alias("targets"),
            F.sum("decisions").alias("decisions"),
            F.avg("decisions").alias("mean"),
            F.max("decisions").alias("max"),
            F.stddev_pop("decisions").alias("std"),
        )
        .select(
            *keys,
            "targets",
            "decisions",
            "mean",
            "max",
            (F.col("max") / F.col("mean")).alias("max_mean"),
            (F.col("std") / F.col("mean")).alias("cv"),
        )
    )


def move_cause(reason: Column, prev_close: Column, prev_active: Column, hits_before: Column) -> Column:
    """Why a key moved to another target (the rule, first match wins):

    1. `evacuated`: the key's previous connection, on the previous target, was moved by the
       router (close reason `evacuated`: an evacuation, a rebalance, a target a reload removed);
    2. `target_down`: the move's decision is a `redispatch` (the connect to the first pick failed),
       or the key's previous connection, on the previous target, was closed by the router with
       `target_not_ready` or `failover`, or the previous target got no OK decision of this
       connection router in the minute of the move (it was out of the pool);
    3. `cache_expiry`: the move's decision came from the `policy` and the key had cache hits
       before (on this connection router): its entry expired, so the policy picked again;
    4. `policy`: anything else (the policy's pick changed, e.g. a target came back or joined; or
       another routing process had another entry cached).
    """
    return (
        F.when(F.coalesce(prev_close == EVACUATED_CLOSE, F.lit(False)), F.lit("evacuated"))
        .when(
            (reason == "redispatch")
            | F.coalesce(prev_close.isin(*TARGET_DOWN_CLOSES), F.lit(False))
            | ~prev_active,
            F.lit("target_down"),
        )
        .when((reason == "policy") & hits_before, F.lit("cache_expiry"))
        .otherwise(F.lit("policy"))
    )


def key_id() -> Column:
    """`KEY_ID` of a row's (router, key)."""
    return F.xxhash64("router", "key")


def per_key_flags(events: DataFrame, *, by_id: bool = True) -> DataFrame:
    """Every decision with a key, narrow, in one ordered window per (router, key) (order: `ts,
    router_id, seq`), with what the key's previous OK decision said: `prev_target`, `prev_conn`
    (its `router_id` and `conn`, to look up how its connection was closed), `hits_before` (the
    key had cache hits before), `is_move` (an OK decision on another target than `prev_target`);
    and the key's running figures, whole at its last decision (`is_last`): `decisions`,
    `ok_count`, `cache_hits`, `first_ts`, `first_target` and `last_target` (of the OK decisions so
    far).
    `SHARED_ID` marks a decision whose (router, key) differs from the one before it in the same
    window (by id only: two keys share an id). One window, no join, no aggregation.

    Args:
        events: deduplicated events.
        by_id: partition the window by `KEY_ID` (fast; wrong where two keys share an id, which
            `SHARED_ID` flags), else by the router and the key themselves.
    """
    is_ok = F.col("status") == "OK"
    decisions = events.where((F.col("kind") == "decision") & (F.col("key") != NULL_KEY)).select(
        key_id().alias(KEY_ID),
        "router",
        "key",
        "ts",
        "router_id",
        "seq",
        "conn",
        is_ok.alias("ok"),
        "reason",
        "node_id",
        "cache_hit",
    )
    window = Window.partitionBy(*([KEY_ID] if by_id else ["router", "key"])).orderBy("ts", "router_id", "seq")
    before = window.rowsBetween(Window.unboundedPreceding, -1)
    upto = window.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ok = F.col("ok")
    ok_node = F.when(ok, F.col("node_id"))
    other_key = (F.col("key") != F.lag("key").over(window)) | (
        F.col("router") != F.lag("router").over(window)
    )
    return decisions.select(
        KEY_ID,
        "router",
        "key",
        "ts",
        "router_id",
        "seq",
        "ok",
        "reason",
        "node_id",
        F.last(ok_node, ignorenulls=True).over(before).alias("prev_target"),
        F.last(F.when(ok, F.struct("router_id", "conn")), ignorenulls=True).over(before).alias("prev_conn"),
        F.coalesce(F.max(ok & F.col("cache_hit")).over(before), F.lit(False)).alias("hits_before"),
        F.count("*").over(upto).alias("decisions"),
        F.sum(ok.cast("long")).over(upto).alias("ok_count"),
        F.sum((ok & F.col("cache_hit")).cast("long")).over(upto).alias("cache_hits"),
        F.first("ts").over(upto).alias("first_ts"),
        F.first(ok_node, ignorenulls=True).over(upto).alias("first_target"),
        F.last(ok_node, ignorenulls=True).over(upto).alias("last_target"),
        F.lead(F.lit(True)).over(window).isNull().alias("is_last"),
        F.coalesce(other_key, F.lit(False)).alias(SHARED_ID),
    ).withColumn(
        "is_move", ok & F.col("prev_target").isNotNull() & (F.col("node_id") != F.col("prev_target"))
    )


def per_key_rows(flags: DataFrame) -> DataFrame:
    """The few rows of `per_key_flags` the tables need: each key's last decision (its figures),
    its moves, and any decision that flags a shared id."""
    return flags.where(F.col("is_last") | F.col("is_move") | F.col(SHARED_ID)).drop("ok")


def per_key_table(rows: DataFrame) -> DataFrame:
    """The `per_key` table, one row per (router, key), from `per_key_rows`: a key's last decision
    holds its running figures; its moves give `moves` and, with its first OK target, `targets`
    (every target a key was routed to is its first or the target of a move)."""
    moved = (
        rows.where(F.col("is_move"))
        .groupBy(KEY_ID, "router", "key")
        .agg(F.count("*").alias("moves"), F.collect_set("node_id").alias("_to"))
    )
    first = F.when(F.col("first_target").isNotNull(), F.array("first_target")).otherwise(F.array())
    targets = F.array_union(first, F.coalesce(F.col("_to"), F.array()))
    return (
        rows.where(F.col("is_last"))
        .join(moved, [KEY_ID, "router", "key"], "left")
        .select(
            "router",
            "key",
            "decisions",
            F.col("ok_count").alias("ok"),
            (F.col("decisions") - F.col("ok_count")).alias("refused"),
            "cache_hits",
            F.size(targets).cast("long").alias("targets"),
            F.coalesce(F.col("moves"), F.lit(0)).alias("moves"),
            "last_target",
            "first_ts",
            F.col("ts").alias("last_ts"),
        )
    )


def moves_table(rows: DataFrame, events: DataFrame, active: DataFrame) -> DataFrame:
    """The `moves` table: every move of `per_key_rows` with its `cause` (`move_cause`).

    Args:
        rows: `per_key_rows`.
        events: deduplicated events (for the connections closed with a `TARGET_DOWN_CLOSES`
            or the `EVACUATED_CLOSE` reason).
        active: `[router, minute, node_id]` with an OK decision (from `rollups`).
    """
    closed = (
        events.where((F.col("kind") == "close") & F.col("reason").isin(*TARGET_DOWN_CLOSES, EVACUATED_CLOSE))
        .select(F.struct("router_id", "conn").alias("prev_conn"), F.col("reason").alias("prev_close"))
        .distinct()
    )
    seen = active.select(
        "router", "minute", F.col("node_id").alias("from_target"), F.lit(True).alias("prev_active")
    )
    found = (
        rows.where(F.col("is_move"))
        .select(
            "router",
            "key",
            "ts",
            "router_id",
            "seq",
            F.col("prev_target").alias("from_target"),
            F.col("node_id").alias("to_target"),
            "reason",
            "hits_before",
            "prev_conn",
        )
        .withColumn("minute", F.date_trunc("minute", "ts"))
        .join(closed, "prev_conn", "left")
        .join(seen, ["router", "minute", "from_target"], "left")
    )
    return found.select(
        "router",
        "key",
        "ts",
        "router_id",
        "seq",
        "from_target",
        "to_target",
        "reason",
        move_cause(
            F.col("reason"),
            F.col("prev_close"),
            F.coalesce(F.col("prev_active"), F.lit(False)),
            F.col("hits_before"),
        ).alias("cause"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Shared:
    """What several tables read, computed once (`shared`): the roll-ups, every count table's
    source, and the per-key window's kept rows and moves, which `per_key`, `moves` and
    `moves_by_cause` read."""

    whole: DataFrame
    """`rollups`' whole-log roll-up (checkpointed)."""
    minutes: DataFrame
    """`rollups`' per-minute roll-up (checkpointed)."""
    rows: DataFrame
    """`per_key_rows`, computed and persisted: by `KEY_ID`, or by the strings when two keys
    shared an id."""
    moves: DataFrame
    """`moves_table` over `rows`, persisted (computed when first written)."""
    window_minutes: int
    """The balance table's window."""


def shared(events: DataFrame, *, window_minutes: int = 1) -> Shared:
    """The parts several tables share, over deduplicated events.

    `rollups` are checkpointed (small: one scan of the events for every count table); the per-key
    window's kept rows (`per_key_rows`: each key's last decision and its moves) are computed and
    kept (small; by `KEY_ID`, and again by the strings when two keys shared an id), and the moves
    are persisted, since `per_key`, `moves` and `moves_by_cause` read them; `analyze` unpersists
    them when the tables are written."""
    whole, minutes = rollups(events)
    active = minutes.where(_is_ok()).select("router", "minute", "node_id").distinct()
    spark = events.sparkSession
    shuffles = int(str(spark.conf.get(SHUFFLE_PARTITIONS)))  # Spark's default when unset
    with setting(spark, SHUFFLE_PARTITIONS, str(PER_KEY_SHUFFLES * shuffles)):
        rows = per_key_rows(per_key_flags(events)).persist(StorageLevel.MEMORY_AND_DISK)
        if rows.where(F.col(SHARED_ID)).count():  # computes the kept rows: two keys share an id
            rows.unpersist()
            rows = per_key_rows(per_key_flags(events, by_id=False)).persist(StorageLevel.MEMORY_AND_DISK)
    moves = moves_table(rows, events, active).persist(StorageLevel.MEMORY_AND_DISK)
    return Shared(whole=whole, minutes=minutes, rows=rows, moves=moves, window_minutes=window_minutes)


def _is_decision() -> Column:
    return F.col("kind") == "decision"


def _is_ok() -> Column:
    return _is_decision() & (F.col("status") == "OK")


def _is_close() -> Column:
    return F.col("kind") == "close"


def _refused() -> Column:
    return _is_decision() & (F.col("status") != "OK")


def _per_target(s: Shared) -> DataFrame:
    """OK decisions, connections, closes by the router and bytes per (router, target), and each
    target's share of its router's OK decisions."""
    n = F.col("n")
    per_target = (
        s.whole.where(F.col("node_id").isNotNull())
        .groupBy("router", "node_id")
        .agg(
            _count_if(_is_ok(), n).alias("decisions"),
            _count_if(_is_close(), n).alias("connections"),
            _count_if(_is_close() & F.col("reason").isin(*TARGET_DOWN_CLOSES), n).alias("closed_by_router"),
            F.sum("bytes_in").alias("bytes_in"),
            F.sum("bytes_out").alias("bytes_out"),
        )
    )
    return per_target.withColumn(
        "share", F.col("decisions") / F.sum("decisions").over(Window.partitionBy("router"))
    )


def _used(s: Shared) -> DataFrame:
    """`[router, node_id]`: every target a router sent an OK decision to (`balance`'s targets)."""
    return _per_target(s).where(F.col("decisions") > 0).select("router", "node_id")


def _counts(s: Shared, *group: str) -> DataFrame:
    n = F.col("n")
    return s.whole.groupBy(*group).agg(
        _count_if(_is_decision(), n).alias("decisions"),
        _count_if(_is_ok(), n).alias("ok"),
        _count_if(_refused(), n).alias("refused"),
        _count_if(_is_close(), n).alias("connections"),
        _count_if(_is_ok() & F.col("cache_hit"), n).alias("cache_hits"),
        _count_if(_is_decision() & F.col("null_key"), n).alias("null_keys"),
    )


def _per_router(s: Shared) -> DataFrame:
    ok_by_target = _per_target(s).select("router", "node_id", "decisions")
    overall = balance(ok_by_target, _used(s), []).select("router", "max_mean", "cv")
    return (
        _counts(s, "router")
        .withColumn("cache_hit_ratio", F.col("cache_hits") / F.col("ok"))
        .withColumn("null_key_rate", F.col("null_keys") / F.col("decisions"))
        .join(overall, "router", "left")
    )


def _balance_table(s: Shared) -> DataFrame:
    seconds = s.window_minutes * 60
    window = F.timestamp_seconds(F.floor(F.unix_timestamp("minute") / seconds) * seconds)
    ok_windows = (
        s.minutes.where(_is_ok())
        .groupBy(window.alias("window_start"), "router", "node_id")
        .agg(F.sum("n").alias("decisions"))
    )
    return balance(ok_windows, _used(s), ["window_start"])


def _hist(s: Shared) -> DataFrame:
    """Decisions per (minute, router, latency bucket)."""
    return s.minutes.where(_is_decision()).groupBy("minute", "router", "bucket").agg(F.sum("n").alias("n"))


def _per_minute(s: Shared) -> DataFrame:
    n = F.col("n")
    minute_counts = s.minutes.groupBy("minute", "router").agg(
        _count_if(_is_decision(), n).alias("decisions"),
        _count_if(_is_ok(), n).alias("ok"),
        _count_if(_refused(), n).alias("refused"),
        _count_if(_is_ok() & F.col("cache_hit"), n).alias("cache_hits"),
        _count_if(_is_decision() & F.col("null_key"), n).alias("null_keys"),
        _count_if(_is_close(), n).alias("connections"),
    )
    minute_pct = percentiles(_hist(s), ["minute", "router"]).select("minute", "router", "p50_us", "p99_us")
    return minute_counts.join(minute_pct, ["minute", "router"], "left")


def _router_hist(s: Shared) -> DataFrame:
    """Decisions per (router, latency bucket), and per bucket over every router as router `*`."""
    by_router = _hist(s).groupBy("router", "bucket").agg(F.sum("n").alias("n"))
    all_routers = (
        by_router.groupBy("bucket")
        .agg(F.sum("n").alias("n"))
        .select(F.lit("*").alias("router"), "bucket", "n")
    )
    return by_router.unionByName(all_routers)


def _latency_hist(s: Shared) -> DataFrame:
    return _router_hist(s).select(
        "router",
        "bucket",
        F.round(F.pow(F.lit(2.0), F.col("bucket") / BUCKETS_PER_OCTAVE), 1).alias("lower_us"),
        bucket_upper_us(F.col("bucket")).alias("upper_us"),
        F.col("n").alias("decisions"),
    )


TABLE_BUILDERS: Final[Mapping[str, Callable[[Shared], DataFrame]]] = {
    "per_target": _per_target,
    "per_router": _per_router,
    "per_process": lambda s: _counts(s, "router_id", "router"),
    "refusals": lambda s: (
        s.whole.where(_refused()).groupBy("router", "status", "reason").agg(F.sum("n").alias("decisions"))
    ),
    "close_reasons": lambda s: (
        s.whole.where(_is_close()).groupBy("router", "node_id", "reason").agg(F.sum("n").alias("connections"))
    ),
    "balance": _balance_table,
    "per_minute": _per_minute,
    "latency": lambda s: percentiles(_router_hist(s), ["router"]),
    "latency_hist": _latency_hist,
    "per_key": lambda s: per_key_table(s.rows),
    "moves": lambda s: s.moves,
    "moves_by_cause": lambda s: s.moves.groupBy("router", "cause").agg(
        F.count("*").alias("moves"), F.countDistinct("key").alias("keys")
    ),
}
"""One function per table of the events (`tables`), in `TABLES`' order: each builds its table,
computed when written, from the `Shared` parts."""
TABLES: Final = (*TABLE_BUILDERS, "top_keys", "quarantine", "quarantine_counts")
"""The Parquet tables `analyze` writes under `--out` (each a directory): `TABLE_BUILDERS`', then
the top keys (from the written `per_key`) and ingest's two quarantine tables."""
SMALL: Final = frozenset(TABLES) - {"per_key", "moves", "quarantine"}
"""Aggregate tables: written as one file each, read by the report."""


def tables(events: DataFrame, *, window_minutes: int = 1) -> dict[str, DataFrame]:
    """Every analysis table over deduplicated events (quarantine tables and `top_keys` excepted),
    in `TABLES`' order: `TABLE_BUILDERS` over the `shared` parts, which are computed here; the
    tables are computed when written."""
    parts = shared(events, window_minutes=window_minutes)
    return {name: build(parts) for name, build in TABLE_BUILDERS.items()}


def quarantine_counts(spark: SparkSession, ingested: Ingested) -> DataFrame:
    """The `quarantine_counts` table: records set aside per reason (`files` null), and the whole
    files set aside as unreadable (`UNREADABLE`, `records` null: unknown, the file was not read)."""
    rows: list[tuple[str, int | None, int | None]] = [
        (reason, n, None) for reason, n in sorted(ingested.malformed_by_reason.items())
    ]
    if ingested.unreadable:
        rows.append((UNREADABLE, None, len(ingested.unreadable)))
    return spark.createDataFrame(rows, "reason string, records long, files long")


def _top_keys(per_key: DataFrame, top: int) -> DataFrame:
    return per_key.orderBy(F.desc("decisions"), "router", "key").limit(top)


def analyze(
    spark: SparkSession,
    paths: Iterable[str],
    out: str,
    *,
    window_minutes: int = 1,
    top: int = 20,
    stage: bool = True,
    report: bool = True,
) -> dict[str, object]:
    """Run the whole job: ingest, every table, `summary.json`, `report.html`.

    Args:
        spark: the session.
        paths: event files or directories (any Spark path).
        out: the output directory (any Spark path); tables are replaced.
        window_minutes: the balance table's window.
        top: rows of `top_keys`.
        stage: parse JSON once into `out/_staging` (Parquet; kept, Spark ignores `_` names when
            reading `out`), else work on the input directly (small logs).
        report: write `report.html`.

    Returns:
        The summary (also written as `summary.json`).

    Raises:
        pipeline.ingest.InputError: no event files in `paths`.
        pipeline.ingest.UnreadableError: every event file is unreadable (some are set aside,
            named in the summary's `unreadable_files`, and the job goes on).
    """
    base = out.rstrip("/")
    given = list(paths)
    ingested = ingest(spark, given, staging=f"{base}/_staging" if stage else None, columns=COLUMNS)
    results = tables(ingested.events, window_minutes=window_minutes)
    results["quarantine"] = ingested.quarantine
    results["quarantine_counts"] = quarantine_counts(spark, ingested)

    def write(name: str) -> None:
        frame = results[name]
        (frame.coalesce(1) if name in SMALL else frame).write.mode("overwrite").parquet(f"{base}/{name}")

    large = [name for name in TABLES if name not in SMALL]
    with ThreadPoolExecutor(SMALL_WRITERS, thread_name_prefix="analyze-write") as pool:
        list(pool.map(write, large + [name for name in TABLES if name in SMALL and name != "top_keys"]))
    spark.catalog.clearCache()  # the per-key table and the moves (and ingest's repeated keys unstaged)
    per_key = spark.read.parquet(f"{base}/per_key")
    _top_keys(per_key, top).coalesce(1).write.mode("overwrite").parquet(f"{base}/top_keys")
    from pipeline.report import REPORT_TABLES, render

    def read(name: str) -> pd.DataFrame:
        return spark.read.parquet(f"{base}/{name}").toPandas()

    with ThreadPoolExecutor(SMALL_WRITERS, thread_name_prefix="analyze-read") as pool:
        frames = dict(zip(REPORT_TABLES, pool.map(read, REPORT_TABLES), strict=True))
    keyed = per_key.agg(F.count("*").alias("keys"), _count_if(F.col("moves") > 0).alias("moved")).first()
    assert keyed is not None
    summary = _summary(
        frames,
        duplicates=ingested.duplicates,
        malformed=ingested.malformed_by_reason,
        unreadable=ingested.unreadable,
        paths=given,
        keys=int(keyed["keys"]),
        moved_keys=int(keyed["moved"] or 0),
    )
    write_text(spark, f"{base}/summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if report:
        write_text(spark, f"{base}/report.html", render(summary, frames))
    return summary


def _summary(
    frames: Mapping[str, pd.DataFrame],
    *,
    duplicates: int,
    malformed: Mapping[str, int],
    unreadable: Sequence[UnreadableFile],
    paths: list[str],
    keys: int,
    moved_keys: int,
) -> dict[str, object]:
    """`summary.json` from the aggregate tables (read back as pandas: a few thousand rows)."""
    per_router = frames["per_router"]
    decisions = int(per_router["decisions"].sum())
    connections = int(per_router["connections"].sum())
    ok = int(per_router["ok"].sum())
    cache_hits = int(per_router["cache_hits"].sum())
    null_keys = int(per_router["null_keys"].sum())
    refusals = frames["refusals"]
    by_status = {"OK": ok} | _sums(refusals, "status", "decisions")
    per_target = frames["per_target"]
    by_target = _sums(per_target[per_target["decisions"] > 0], "node_id", "decisions")
    by_cause = _sums(frames["moves_by_cause"], "cause", "moves")
    latency = frames["latency"]
    overall = latency[latency["router"] == "*"]
    return {
        "input": paths,
        "events": decisions + connections,
        "decisions": decisions,
        "connections": connections,
        "duplicates_removed": duplicates,
        "malformed": sum(malformed.values()),
        "malformed_by_reason": dict(malformed),
        "unreadable_files": [{"file": u.file, "reason": u.reason} for u in unreadable],
        "decisions_by_status": dict(sorted(by_status.items())),
        "refusals_by_reason": _sums(refusals, "reason", "decisions"),
        "decisions_by_target": by_target,
        "keys": keys,
        "moved_keys": moved_keys,
        "moves": sum(by_cause.values()),
        "moves_by_cause": by_cause,
        "cache_hits": cache_hits,
        "cache_hit_ratio": cache_hits / ok if ok else None,
        "null_keys": null_keys,
        "null_key_rate": null_keys / decisions if decisions else None,
        "latency_us": {
            name: (None if overall.empty else float(overall[f"{name}_us"].iloc[0])) for name in PERCENTILES
        },
        "balance": {
            str(row.router): {"max_mean": _number(row.max_mean), "cv": _number(row.cv)}
            for row in per_router.sort_values("router").itertuples()
        },
        "tables": list(TABLES),
    }


def _sums(frame: pd.DataFrame, key: str, value: str) -> dict[str, int]:
    """{key: sum of value}, sorted by key."""
    if frame.empty:
        return {}
    sums = frame.groupby(key)[value].sum()
    return {str(k): int(v) for k, v in sorted(sums.items())}


def _number(value: object) -> float | None:
    """A float for JSON (NaN and None as null)."""
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]  # a pandas scalar
    return None if number != number else number
