"""The analysis on hand-written events: moves and their causes, balance, latency percentiles."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs in the pipeline extra
import pytest
from pyspark.sql import functions as F

from pipeline import analyze
from pipeline.analyze import (
    BUCKETS_PER_OCTAVE,
    COLUMNS,
    PERCENTILES,
    SHARED_ID,
    TABLE_BUILDERS,
    TABLES,
    _number,
    _summary,
    _sums,
    bucket_upper_us,
    latency_bucket,
    move_cause,
    per_key_flags,
    percentiles,
    quarantine_counts,
    tables,
)
from pipeline.ingest import UNREADABLE, Ingested, UnreadableFile
from pipeline.schema import EVENT_SCHEMA

T0 = datetime(2026, 11, 18, 11, 0, tzinfo=UTC)


def _decision(
    seq: int,
    minute: int,
    second: int,
    key: str,
    node: str | None,
    reason: str = "policy",
    *,
    status: str = "OK",
    cache: bool = False,
    latency: float = 100.0,
) -> dict[str, object]:
    return {
        "kind": "decision",
        "router_id": "r1",
        "seq": seq,
        "ts": T0 + timedelta(minutes=minute, seconds=second),
        "conn": seq,
        "router": "cr",
        "acceptor": "a",
        "source": "10.0.0.1",
        "protocol": "mqtt",
        "key_type": "CLIENT_ID",
        "raw_key": key,
        "raw_key_length": len(key),
        "key": key,
        "status": status,
        "reason": reason,
        "mode": "proxy" if status == "OK" else "refuse",
        "node_id": node,
        "local": False,
        "cache_hit": cache,
        "latency_us": latency,
    }


def _close(seq: int, minute: int, second: int, conn: int, node: str, reason: str) -> dict[str, object]:
    return {
        "kind": "close",
        "router_id": "r1",
        "seq": seq,
        "ts": T0 + timedelta(minutes=minute, seconds=second),
        "conn": conn,
        "router": "cr",
        "acceptor": "a",
        "node_id": node,
        "duration_s": 1.5,
        "bytes_in": 10,
        "bytes_out": 20,
        "reason": reason,
    }


EVENTS = [
    # a: policy n1, a cache hit, a refusal, then the policy again on n2 (n1 still serving): cache expiry
    _decision(1, 0, 1, "a", "n1"),
    _decision(2, 0, 2, "a", "n1", "cache", cache=True),
    _decision(15, 1, 0, "a", None, "no ready target", status="REFUSED_UNAVAILABLE"),
    _decision(3, 2, 1, "a", "n2"),
    # b: the connect to n1 failed, redispatched to n2: target down
    _decision(4, 0, 3, "b", "n1"),
    _decision(5, 0, 4, "b", "n2", "redispatch"),
    # c: its connection on n2 was closed with target_not_ready, then n1: target down
    _decision(6, 0, 5, "c", "n2"),
    _close(7, 0, 30, 6, "n2", "target_not_ready"),
    _decision(8, 0, 40, "c", "n1"),
    # d: n3, then n1 in a minute when n3 got nothing: target down
    _decision(9, 0, 6, "d", "n3", latency=1000.0),
    _decision(10, 3, 0, "d", "n1"),
    # e: n1 then n3 by the policy, no cache hits, n1 serving: policy
    _decision(11, 2, 0, "e", "n1"),
    _decision(12, 2, 30, "e", "n3"),
    # f: refused only; and a NULL key (not a key)
    _decision(13, 0, 7, "f", None, "no ready target", status="REFUSED_UNAVAILABLE", latency=0.5),
    _decision(14, 0, 8, "NULL", "n1"),
]
MOVES = {
    ("a", "n1", "n2", "cache_expiry"),
    ("b", "n1", "n2", "target_down"),
    ("c", "n2", "n1", "target_down"),
    ("d", "n3", "n1", "target_down"),
    ("e", "n1", "n3", "policy"),
}
"""EVENTS' moves (key, from, to, cause)."""


@pytest.fixture(scope="module")
def results(spark):
    rows = [tuple(event.get(name) for name in EVENT_SCHEMA.fieldNames()) for event in EVENTS]
    events = spark.createDataFrame(rows, EVENT_SCHEMA).select(*COLUMNS)  # all the tables read
    out = tables(events)
    yield out
    spark.catalog.clearCache()


def test_tables_are_the_registry_in_tables_order(results):
    """`tables` gives one DataFrame per `TABLE_BUILDERS` entry, in the order `summary.json` lists
    `TABLES`; `analyze` adds the top keys and the two quarantine tables."""
    assert list(results) == list(TABLE_BUILDERS)
    assert TABLES == (
        "per_target",
        "per_router",
        "per_process",
        "refusals",
        "close_reasons",
        "balance",
        "per_minute",
        "latency",
        "latency_hist",
        "per_key",
        "moves",
        "moves_by_cause",
        "top_keys",
        "quarantine",
        "quarantine_counts",
    )


def test_moves_and_their_causes(results):
    moves = {(r.key, r.from_target, r.to_target, r.cause) for r in results["moves"].collect()}
    assert moves == MOVES
    per_key = {r.key: r for r in results["per_key"].collect()}
    assert sorted(per_key) == ["a", "b", "c", "d", "e", "f"]
    a = per_key["a"]
    assert (a.decisions, a.ok, a.refused, a.cache_hits, a.targets, a.moves, a.last_target) == (
        4,
        3,
        1,
        1,
        2,
        1,
        "n2",
    )
    assert (per_key["f"].ok, per_key["f"].moves, per_key["f"].last_target) == (0, 0, None)


def test_counts_balance_and_latency(results):
    (router,) = results["per_router"].collect()
    assert (router.decisions, router.ok, router.refused, router.connections) == (14, 12, 2, 1)
    assert (router.cache_hits, router.null_keys) == (1, 1)
    assert router.max_mean == pytest.approx(7 / 4)  # n1 7, n2 3, n3 2
    assert router.cv == pytest.approx((14 / 3) ** 0.5 / 4)
    balance = {r.window_start.minute: r for r in results["balance"].collect()}
    assert (balance[0].targets, balance[0].max, balance[0].max_mean) == (3, 5, pytest.approx(5 / (8 / 3)))
    assert (balance[3].max_mean, balance[3].cv) == (pytest.approx(3.0), pytest.approx(2**0.5))
    latency = {r.router: r for r in results["latency"].collect()}
    # 0.5 µs (bucket 0), twelve at 100 µs (bucket 26, up to 2^(27/4)), 1000 µs (bucket 39)
    assert latency["*"].decisions == 14
    assert (latency["*"].p50_us, latency["*"].p90_us, latency["*"].p99_us) == (107.6, 107.6, 1024.0)
    refusals = [(r.status, r.reason, r.decisions) for r in results["refusals"].collect()]
    assert refusals == [("REFUSED_UNAVAILABLE", "no ready target", 2)]


def test_a_key_moved_by_an_evacuation_says_so(spark):
    """Scenario: the key's connection on n1 was closed with `evacuated` (an operator's evacuation,
    a rebalance, a reload); its next decision is a cache hit on n2 (the evacuation routed the key
    again and cached it): the move's cause is `evacuated`, not `policy`."""
    events = [
        _decision(1, 0, 1, "g", "n1"),
        _decision(2, 0, 2, "h", "n2"),
        _close(3, 0, 20, 1, "n1", "evacuated"),
        _decision(4, 0, 21, "g", "n2", "cache", cache=True),
    ]
    rows = [tuple(event.get(name) for name in EVENT_SCHEMA.fieldNames()) for event in events]
    out = tables(spark.createDataFrame(rows, EVENT_SCHEMA).select(*COLUMNS))
    try:
        moves = {(r.key, r.from_target, r.to_target, r.cause) for r in out["moves"].collect()}
        assert moves == {("g", "n1", "n2", "evacuated")}
        assert [(r.cause, r.moves) for r in out["moves_by_cause"].collect()] == [("evacuated", 1)]
    finally:
        spark.catalog.clearCache()


def test_keys_that_share_an_id_are_told_apart_by_their_names(spark, monkeypatch):
    """Two (router, key) with the same `KEY_ID` (a 64-bit hash: a chance in 2^64 per pair, forced
    here by giving every key the same id): the window flags the shared id, and `tables`
    partitions the window by the router and the key instead, with the same moves and counts as
    `results`."""
    rows = [tuple(event.get(name) for name in EVENT_SCHEMA.fieldNames()) for event in EVENTS]
    events = spark.createDataFrame(rows, EVENT_SCHEMA).select(*COLUMNS)
    monkeypatch.setattr(analyze, "key_id", lambda: F.lit(7).cast("long"))
    assert per_key_flags(events).where(F.col(SHARED_ID)).count() > 0  # in time order the keys alternate
    out = tables(events)
    try:
        moves = {(r.key, r.from_target, r.to_target, r.cause) for r in out["moves"].collect()}
        assert moves == MOVES
        per_key = {r.key: (r.decisions, r.ok, r.moves, r.last_target) for r in out["per_key"].collect()}
        assert per_key == {
            "a": (4, 3, 1, "n2"),
            "b": (2, 2, 1, "n2"),
            "c": (2, 2, 1, "n1"),
            "d": (2, 2, 1, "n1"),
            "e": (2, 2, 1, "n3"),
            "f": (1, 0, 0, None),
        }
        assert SHARED_ID not in out["per_key"].columns
    finally:
        spark.catalog.clearCache()


# -- the parts on their own ---------------------------------------------------------------------------


def _frames(**overrides: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The aggregate tables `_summary` reads, for two routers."""
    frames = {
        "per_router": pd.DataFrame(
            {
                "router": ["b", "a"],
                "decisions": [10, 6],
                "connections": [7, 5],
                "ok": [8, 4],
                "cache_hits": [2, 1],
                "null_keys": [1, 0],
                "max_mean": [1.5, float("nan")],
                "cv": [0.25, None],
            }
        ),
        "refusals": pd.DataFrame(
            {
                "router": ["b", "a", "a"],
                "status": ["REFUSED_UNAVAILABLE", "REFUSED_UNAVAILABLE", "REFUSED_USE_ANOTHER"],
                "reason": ["no ready target", "no ready target", "no pool or no policy"],
                "decisions": [2, 1, 1],
            }
        ),
        "per_target": pd.DataFrame(
            {"router": ["b", "b", "a"], "node_id": ["n2", "n1", "n0"], "decisions": [5, 3, 0]}
        ),
        "moves_by_cause": pd.DataFrame(
            {"router": ["b", "a"], "cause": ["policy", "policy"], "moves": [2, 1]}
        ),
        "latency": pd.DataFrame(
            {
                "router": ["*", "a"],
                "p50_us": [107.6, 90.5],
                "p90_us": [1.0, 1.0],
                "p99_us": [1024.0, 2.0],
                "p999_us": [2048.0, 2.0],
            }
        ),
    }
    return frames | overrides


def test__summary_sums_the_aggregate_tables():
    summary = _summary(
        _frames(),
        duplicates=3,
        malformed={"unparseable": 2, "bad kind": 0},
        unreadable=[UnreadableFile(file="file:/x.parquet", reason="cut short")],
        paths=["/logs"],
        keys=9,
        moved_keys=2,
    )
    assert (summary["events"], summary["decisions"], summary["connections"]) == (28, 16, 12)
    assert summary["decisions_by_status"] == {"OK": 12, "REFUSED_UNAVAILABLE": 3, "REFUSED_USE_ANOTHER": 1}
    assert summary["refusals_by_reason"] == {"no pool or no policy": 1, "no ready target": 3}
    assert summary["decisions_by_target"] == {"n1": 3, "n2": 5}  # n0 got nothing: not listed
    assert (summary["moves"], summary["moves_by_cause"]) == (3, {"policy": 3})
    assert summary["cache_hit_ratio"] == 3 / 12
    assert summary["null_key_rate"] == 1 / 16
    assert (summary["malformed"], summary["duplicates_removed"]) == (2, 3)
    assert summary["unreadable_files"] == [{"file": "file:/x.parquet", "reason": "cut short"}]
    assert summary["latency_us"] == {"p50": 107.6, "p90": 1.0, "p99": 1024.0, "p999": 2048.0}  # router "*"
    assert summary["balance"] == {"a": {"max_mean": None, "cv": None}, "b": {"max_mean": 1.5, "cv": 0.25}}
    assert list(summary["balance"]) == ["a", "b"]
    assert summary["tables"] == list(TABLES)
    json.dumps(summary, allow_nan=False)  # NaN became null: valid JSON


def test__summary_of_an_empty_log_has_no_ratios():
    empty = _frames(
        per_router=pd.DataFrame(
            columns=["router", "decisions", "connections", "ok", "cache_hits", "null_keys"]
        ),
        refusals=pd.DataFrame(columns=["status", "reason", "decisions"]),
        per_target=pd.DataFrame(columns=["node_id", "decisions"]),
        moves_by_cause=pd.DataFrame(columns=["cause", "moves"]),
        latency=pd.DataFrame(columns=["router", "p50_us", "p90_us", "p99_us", "p999_us"]),
    )
    summary = _summary(empty, duplicates=0, malformed={}, unreadable=[], paths=[], keys=0, moved_keys=0)
    assert (summary["events"], summary["cache_hit_ratio"], summary["null_key_rate"]) == (0, None, None)
    assert summary["decisions_by_status"] == {"OK": 0}
    assert summary["latency_us"] == dict.fromkeys(PERCENTILES)
    assert summary["balance"] == {}


def test__sums_and__number():
    frame = pd.DataFrame({"k": ["b", "a", "b"], "v": [1, 2, 3]})
    assert list(_sums(frame, "k", "v").items()) == [("a", 2), ("b", 4)]
    assert _sums(frame.iloc[0:0], "k", "v") == {}
    assert (_number(None), _number(float("nan")), _number(np.float64(0.5)), _number(2)) == (
        None,
        None,
        0.5,
        2.0,
    )


def test_quarantine_counts_has_every_reason_and_the_unreadable_files(spark):
    ingested = Ingested(
        events=spark.range(0),
        quarantine=spark.range(0),
        malformed_by_reason={"missing seq": 2, "bad kind": 0, "unparseable": 5},
        duplicates=0,
        unreadable=(UnreadableFile(file="a", reason="x"), UnreadableFile(file="b", reason="y")),
    )
    table = quarantine_counts(spark, ingested)
    assert table.schema.simpleString() == "struct<reason:string,records:bigint,files:bigint>"
    assert [tuple(r) for r in table.collect()] == [
        ("bad kind", 0, None),
        ("missing seq", 2, None),
        ("unparseable", 5, None),
        (UNREADABLE, None, 2),
    ]
    ingested = dataclasses.replace(ingested, unreadable=())
    assert UNREADABLE not in {r.reason for r in quarantine_counts(spark, ingested).collect()}


def test_move_cause_takes_the_first_rule_that_matches(spark):
    """The rules in order: evacuated, target down (redispatch, closed by the router, or the
    target inactive that minute), cache expiry (the policy picked again after hits), policy."""
    cases = [
        # reason, previous close, previous target active, hits before -> cause
        ("redispatch", "evacuated", False, True, "evacuated"),
        ("policy", "evacuated", True, True, "evacuated"),
        ("redispatch", None, True, True, "target_down"),
        ("policy", "failover", True, True, "target_down"),
        ("policy", "target_not_ready", True, False, "target_down"),
        ("policy", None, False, True, "target_down"),
        ("policy", None, True, True, "cache_expiry"),
        ("cache", None, True, True, "policy"),
        ("policy", "closed", True, False, "policy"),
        ("policy", None, True, False, "policy"),
    ]
    frame = spark.createDataFrame(
        [case[:4] for case in cases], "reason string, prev_close string, prev_active boolean, hits boolean"
    )
    causes = frame.select(
        move_cause(F.col("reason"), F.col("prev_close"), F.col("prev_active"), F.col("hits")).alias("cause")
    )
    assert [r.cause for r in causes.collect()] == [case[4] for case in cases]


def test_percentiles_are_the_nearest_rank_bucket_upper_bounds(spark):
    """Scenario: 1,000 decisions, 500 in bucket 4, 400 in bucket 8, 90 in bucket 12, 10 in bucket
    40: p50 is bucket 4's upper bound (exactly half reach it), p90 bucket 8's, p99 bucket 12's, p99.9
    bucket 40's; another router's single decision is its every percentile."""
    hist = spark.createDataFrame(
        [("a", 4, 500), ("a", 8, 400), ("a", 12, 90), ("a", 40, 10), ("b", 0, 1)],
        "router string, bucket int, n long",
    )
    rows = {r.router: r for r in percentiles(hist, ["router"]).collect()}
    upper = {b: round(2 ** ((b + 1) / BUCKETS_PER_OCTAVE), 1) for b in (0, 4, 8, 12, 40)}
    a = rows["a"]
    assert (a.decisions, a.p50_us, a.p90_us, a.p99_us, a.p999_us) == (
        1000,
        upper[4],
        upper[8],
        upper[12],
        upper[40],
    )
    b = rows["b"]
    assert (b.decisions, b.p50_us, b.p999_us) == (1, upper[0], upper[0])


def test_latency_bucket_and_its_bounds(spark):
    """A bucket is a quarter of an octave; under 1 µs is bucket 0; a bucket's upper bound is what a
    percentile reports, and the next bucket's lower bound."""
    latencies = spark.createDataFrame([(0.5,), (1.0,), (1.18,), (100.0,), (1000.0,)], "us double")
    rows = latencies.select(latency_bucket(F.col("us")).alias("bucket")).select(
        "bucket", bucket_upper_us(F.col("bucket")).alias("upper")
    )
    assert [(r.bucket, r.upper) for r in rows.collect()] == [
        (0, 1.2),
        (0, 1.2),
        (0, 1.2),
        (26, 107.6),
        (39, 1024.0),
    ]
