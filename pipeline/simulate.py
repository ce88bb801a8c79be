"""`routerctl simulate`: what a new configuration would do to the traffic in an event log.

The distinct keys of a connection router's decisions (with the target each last reached and the
connections and bytes it carried) are replayed through the router of the NEW configuration by the
router's own engine (`RoutingEngine`, built once per batch iterator inside the Spark executors,
`mapInPandas`), with every pool target ready as `routerctl route --ready all` (or the `--ready`
given). The answer: which keys and connections would move, from where to where, and the new
balance. Parquet tables and `summary.json` under `--out`.

What is replayed (the unit called a *key* here, one row of the `keys` table):
- the new key type equals the logged one: the raw value (`raw_key`: before filter and transform)
  through the new key filter and transform, as a connection would be (`RoutingEngine.route`;
  the same as `routerctl route --client-id/--user/--sni/--role RAW`), so a changed filter shows;
- the new key type is SOURCE_IP: the logged client address (`source`);
- any other key type: an error (the log has no such value).
A raw key the log cut at `RAW_KEY_CAP` characters cannot be filtered again: such a key replays
its logged key from the transform on (`RoutingEngine.lookup`, as `routerctl route KEY`), counted
as `fallback_keys`; a raw key longer than the new `<key-max-length>` is NULL all the same.

Policies whose pick depends on engine state (ROUND_ROBIN, LEAST_CONNECTIONS, CONSISTENT_HASH with
LOAD_FACTOR: a position, live counts) give a fresh engine's arbitrary pick, meaningless for moves:
a key that reaches such a policy (or a cache filled by one) is reported *unpredictable*, with no
target after, and left out of the moved fractions and the balance after (`unpredictable_keys`,
`unpredictable_connections`). FIRST_ELEMENT, CONSISTENT_HASH (either ring) and
CONSISTENT_HASH_MODULO (a key transform that picks nothing), the local-target filter and refusals
are simulated exactly.

Driver side only small tables: the logged key types per router, and the transitions aggregate
(routers x targets before x targets after); the per-key table goes from executor to `--out`.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from keys import NULL_KEY, ConnectionFacts, KeyType
from pools import ready_node_ids
from router.config import ConfigError, load_config
from router.core.engine import DecisionReason, RouteDecision, RoutingEngine, build_pool

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs in the pipeline extra
    from pyspark.sql import DataFrame, Row, SparkSession

    from pipeline.ingest import UnreadableFile
    from router.config.settings import Config, RouterConfig

__all__ = [
    "AFTER_COLUMNS",
    "KEY_SCHEMA_FIELDS",
    "Replay",
    "RouterPlan",
    "SimulateError",
    "arguments",
    "key_table",
    "logged_key_types",
    "plan_routers",
    "read_events",
    "replay",
    "replay_one",
    "run",
    "simulate",
    "summarize",
]

NOW: Final = 0.0
"""The engine's clock in a replay, as in `routerctl route` (a fresh cache: nothing expires)."""

NONE_TARGET: Final = "(none)"
"""How the moves table's readers see a missing target (refused, or never reached) in text."""


class SimulateError(ValueError):
    """A simulation that cannot be run as asked (router, key type, `--ready`); one line."""


class Replay(enum.Enum):
    """Which logged value a router's keys are replayed from."""

    RAW_KEY = "raw_key"
    """The raw key (same key type as logged), through the new filter and transform."""
    SOURCE = "source"
    """The client's address (the new key type is SOURCE_IP)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterPlan:
    """How one connection router of the new configuration is simulated."""

    name: str
    """The `<connection-router name>` (in the log and in the new configuration)."""
    key_type: KeyType
    """The new configuration's key type."""
    replay: Replay
    ready: frozenset[str]
    """Node ids of the pool counted as ready."""
    targets: tuple[str, ...]
    """Node ids of the pool, in pool order (the balance after lists the ready ones, even idle)."""
    policy: str | None
    """The new policy's name."""
    deterministic: bool
    """Whether the new policy, with its properties, picks by the key and the ready targets alone
    (`PolicyConfig.keyed`; no policy: True)."""


def plan_routers(
    config: Config, logged: Mapping[str, Iterable[str]], *, router: str | None = None, ready: str = "all"
) -> tuple[RouterPlan, ...]:
    """The routers to simulate and how.

    Args:
        config: the new configuration.
        logged: router name -> the key types its decision lines carry.
        router: simulate only this router; None: every router of `config` the log has.
        ready: the `--ready` value.

    Returns:
        One plan per router, in configuration order.

    Raises:
        SimulateError: the router is not in the configuration or the log, no router is in both,
            `--ready` names a node no simulated pool has, or a key type cannot be replayed.
    """
    names = [r.name for r in config.routers]
    if router is not None:
        if router not in names:
            raise SimulateError(
                f"no connection router {router!r} in {config.source} (has: {', '.join(names) or 'none'})"
            )
        if router not in logged:
            raise SimulateError(
                f"the event log has no decisions of router {router!r} (has: {_names(logged)})"
            )
        chosen = [config.router(router)]
    else:
        chosen = [r for r in config.routers if r.name in logged]
        if not chosen:
            raise SimulateError(
                f"no connection router of {config.source} ({', '.join(names) or 'none'}) "
                f"is in the event log (has: {_names(logged)})"
            )
    plans = tuple(_plan(config, r, sorted(set(logged[r.name])), ready) for r in chosen)
    if ready not in ("all", "none"):
        named = {n.strip() for n in ready.split(",") if n.strip()}
        known = {node for plan in plans for node in plan.targets}
        unknown = sorted(named - known)
        if unknown:
            raise SimulateError(f"--ready names unknown node ids {unknown} (pools have {sorted(known)})")
    return plans


def _names(logged: Mapping[str, Iterable[str]]) -> str:
    return ", ".join(sorted(logged)) or "none"


def _plan(config: Config, router: RouterConfig, logged_types: Sequence[str], ready: str) -> RouterPlan:
    new = router.key_type
    if new is KeyType.SOURCE_IP:
        replay = Replay.SOURCE
    elif logged_types == [new.value]:
        replay = Replay.RAW_KEY
    else:
        raise SimulateError(
            f"router {router.name!r}: the new key type {new.value} cannot be replayed from a log of "
            f"{'/'.join(logged_types)} keys (a decision line keeps its own key type's raw value and the "
            "source address only: keep the key type, or simulate SOURCE_IP)"
        )
    pool, _ = build_pool(config, router)
    targets = () if pool is None else tuple(t.node_id for t in pool.targets)
    return RouterPlan(
        name=router.name,
        key_type=new,
        replay=replay,
        ready=frozenset() if pool is None else ready_node_ids(pool, ready),
        targets=targets,
        policy=None if router.policy is None else router.policy.name,
        deterministic=router.policy is None or router.policy.keyed,
    )


# -- Spark side ---------------------------------------------------------------------------------


def read_events(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """The valid, deduplicated events of the event files (`pipeline.ingest`, nothing staged): each
    (router_id, seq) once, malformed lines left out."""
    from pipeline.ingest import ingest

    return ingest(spark, paths).events


def logged_key_types(events: DataFrame) -> dict[str, list[str]]:
    """Router name -> the key types of its decision lines (a tiny collect: routers x key types)."""
    rows = events.where("kind = 'decision'").select("router", "key_type").distinct().collect()
    found: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        if row["router"] is not None and row["key_type"] is not None:
            found[row["router"]].append(row["key_type"])
    return dict(found)


KEY_SCHEMA_FIELDS: Final = (
    "router",
    "input",
    "fallback",
    "raw_length",
    "key_before",
    "target_before",
    "connections",
    "bytes_in",
    "bytes_out",
)
"""The columns of `key_table`, in order (`replay` adds `AFTER_COLUMNS` and `moved`)."""


def key_table(events: DataFrame, plans: Sequence[RouterPlan]) -> DataFrame:
    """One row per distinct replayed value of each planned router.

    Columns: `router`; `input` (the value replayed: raw key, source address, or for `fallback`
    rows the logged key); `fallback` (the raw key was cut at the cap); `raw_length`; `key_before`
    (the last logged key); `target_before` (the node id of its last decision that had one);
    `connections` (its decision lines); `bytes_in`, `bytes_out` (of their close lines, joined by
    router id and connection id).
    """
    from pyspark.sql import functions as F

    decisions = events.where(F.col("kind") == "decision")
    by_source = [p.name for p in plans if p.replay is Replay.SOURCE]
    by_raw = [p.name for p in plans if p.replay is Replay.RAW_KEY]
    cut = F.col("raw_key").isNotNull() & (F.col("raw_key_length") > F.length("raw_key"))
    from_source = F.col("router").isin(by_source)
    decisions = decisions.where(F.col("router").isin(by_source + by_raw)).select(
        "router_id",
        "conn",
        "router",
        "ts",
        "seq",
        "key",
        "node_id",
        F.when(from_source, F.col("source"))
        .when(cut, F.col("key"))
        .otherwise(F.col("raw_key"))
        .alias("input"),
        F.coalesce(~from_source & cut, F.lit(False)).alias("fallback"),
        F.when(from_source, F.length("source")).otherwise(F.col("raw_key_length")).alias("raw_length"),
    )
    closes = (
        events.where(F.col("kind") == "close")
        .groupBy("router_id", "conn")
        .agg(F.sum("bytes_in").alias("close_in"), F.sum("bytes_out").alias("close_out"))
    )
    order = F.struct("ts", "router_id", "seq")
    joined = decisions.join(closes, ["router_id", "conn"], "left")
    keys = joined.groupBy("router", "input", "fallback").agg(
        F.coalesce(F.max("raw_length"), F.lit(0)).cast("long").alias("raw_length"),
        F.max_by("key", order).alias("key_before"),
        F.max_by("node_id", F.when(F.col("node_id").isNotNull(), order)).alias("target_before"),
        F.count(F.lit(1)).alias("connections"),
        F.coalesce(F.sum("close_in"), F.lit(0)).cast("long").alias("bytes_in"),
        F.coalesce(F.sum("close_out"), F.lit(0)).cast("long").alias("bytes_out"),
    )
    return keys.select(*KEY_SCHEMA_FIELDS)


AFTER_COLUMNS: Final = (
    ("key_after", "string"),
    ("status_after", "string"),
    ("reason_after", "string"),
    ("target_after", "string"),
    ("predictable", "boolean"),
)
"""The columns `replay` adds (name, Spark type), in order."""


def replay(keys: DataFrame, config: Config, plans: Sequence[RouterPlan]) -> DataFrame:
    """Each key through the new configuration's engine, in the executors (`mapInPandas`).

    Adds `key_after`, `status_after`, `reason_after`, `target_after` (None when not OK or
    unpredictable), `predictable`, and `moved`: the key had a target and gets another one or none
    (None when unpredictable).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    kinds = {"string": StringType(), "boolean": BooleanType()}
    schema = StructType(
        [*keys.schema.fields, *(StructField(name, kinds[kind], True) for name, kind in AFTER_COLUMNS)]
    )
    replayed = keys.mapInPandas(_Replayer(config, tuple(plans)), schema)
    moved = F.col("target_before").isNotNull() & ~F.col("target_before").eqNullSafe(F.col("target_after"))
    return replayed.withColumn("moved", F.when(F.col("predictable"), moved))


class _Replayer:
    """The `mapInPandas` function: picklable (configuration and plans only); one engine per router
    per batch iterator, never per row."""

    def __init__(self, config: Config, plans: tuple[RouterPlan, ...]) -> None:
        self.config = config
        self.plans = {p.name: p for p in plans}

    def engines(self) -> dict[str, RoutingEngine]:
        """Fresh engines of the planned routers, their pools' targets ready as planned."""
        engines: dict[str, RoutingEngine] = {}
        for name, plan in self.plans.items():
            router = self.config.router(name)
            pool, local = build_pool(self.config, router)
            if pool is not None:
                for target in pool.targets:
                    pool.record_check(target.node_id, target.node_id in plan.ready)
            engines[name] = RoutingEngine(router, pool, local)
        return engines

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        engines = self.engines()
        for frame in batches:
            rows = zip(frame["router"], frame["input"], frame["fallback"], frame["raw_length"], strict=True)
            after = [self.one(engines[r], self.plans[r], v, bool(f), int(n)) for r, v, f, n in rows]
            columns: list[tuple[object, ...]] = list(zip(*after, strict=True))
            if not after:
                columns = [() for _ in AFTER_COLUMNS]
            yield frame.assign(
                **{name: list(values) for (name, _), values in zip(AFTER_COLUMNS, columns, strict=True)}
            )

    @staticmethod
    def one(
        engine: RoutingEngine, plan: RouterPlan, value: str | None, fallback: bool, raw_length: int
    ) -> tuple[str, str, str, str | None, bool]:
        """(key after, status, reason, target, predictable) of one key."""
        decision = replay_one(engine, plan, value, fallback=fallback, raw_length=raw_length)
        target = decision.target
        picked = decision.reason in (DecisionReason.POLICY, DecisionReason.CACHE)
        predictable = plan.deterministic or not picked
        return (
            decision.key,
            decision.status.value,
            decision.reason.value,
            target.node_id if target is not None and predictable else None,
            predictable,
        )


def replay_one(
    engine: RoutingEngine, plan: RouterPlan, value: str | None, *, fallback: bool, raw_length: int
) -> RouteDecision:
    """The new engine's decision for one logged key (what `routerctl route` says for it).

    Args:
        engine: the new router's engine.
        plan: its plan.
        value: the replayed value (`key_table`'s `input`).
        fallback: `value` is the logged key (the raw key was cut): from the transform on.
        raw_length: the raw key's whole length.
    """
    if fallback:
        if raw_length > engine.config.key_max_length:
            return engine.decide(NULL_KEY, NOW)  # too long for the new router too: missing
        return engine.lookup(value or NULL_KEY, NOW)
    return engine.route(_facts(plan, value), NOW)


def _facts(plan: RouterPlan, value: str | None) -> ConnectionFacts:
    """The connection facts a logged value stands for under the router's key type."""
    if value is None:
        return ConnectionFacts()
    match plan.key_type:
        case KeyType.SOURCE_IP:
            try:
                return ConnectionFacts(source_ip=value)
            except ValueError:  # not an IP address (a Unix socket peer): no source key
                return ConnectionFacts()
        case KeyType.CLIENT_ID:
            return ConnectionFacts(client_id=value)
        case KeyType.USER_NAME:
            return ConnectionFacts(user_name=value)
        case KeyType.SNI_HOST:
            return ConnectionFacts(sni_host=value)
        case KeyType.ROLE_NAME:
            # the log joins the roles with commas (the event log's `sources.raw_key`): a role
            # holding a comma comes back as two
            return ConnectionFacts(roles=tuple(value.split(",")))


# -- results ------------------------------------------------------------------------------------


def _balance(loads: Mapping[str, int]) -> dict[str, float | int | None]:
    """max/mean and the coefficient of variation (population) of per-target connections."""
    values = list(loads.values())
    if not values:
        return {"targets": 0, "max_over_mean": None, "cv": None}
    mean = sum(values) / len(values)
    if mean == 0:
        return {"targets": len(values), "max_over_mean": None, "cv": None}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {"targets": len(values), "max_over_mean": max(values) / mean, "cv": std / mean}


def _fraction(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def summarize(transitions: Sequence[Row], plans: Sequence[RouterPlan]) -> dict[str, object]:
    """`summary.json` from the transitions aggregate (one row per router, target before, target
    after, predictable, moved, fallback: `keys`, `connections`, `bytes`).

    Per router and over all of them: keys and connections (and bytes) moved and their fractions
    (of the predictable ones), per-target connections before (each key's connections on its last
    target) and after, and their balance. The balance after lists every ready target of the new
    pool, idle ones too.
    """
    per_router = {p.name: _Tally(plan=p, after=dict.fromkeys(sorted(p.ready), 0)) for p in plans}
    every_ready = sorted({node for p in plans for node in p.ready})
    total = _Tally(plan=None, after=dict.fromkeys(every_ready, 0))
    for row in transitions:
        for tally in (per_router[row["router"]], total):
            tally.add(row)
    summary = total.summary()
    summary["routers"] = {name: tally.summary() for name, tally in per_router.items()}
    return summary


@dataclass(slots=True, kw_only=True)
class _Tally:
    plan: RouterPlan | None
    after: dict[str, int]
    """Connections per target after; every ready target from the start (idle ones count)."""
    before: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    keys: int = 0
    connections: int = 0
    bytes: int = 0
    fallback_keys: int = 0
    unpredictable_keys: int = 0
    unpredictable_connections: int = 0
    moved_keys: int = 0
    moved_connections: int = 0
    moved_bytes: int = 0
    refused_after_keys: int = 0

    def add(self, row: Row) -> None:
        keys, connections, nbytes = int(row["keys"]), int(row["connections"]), int(row["bytes"])
        self.keys += keys
        self.connections += connections
        self.bytes += nbytes
        if row["fallback"]:
            self.fallback_keys += keys
        if row["target_before"] is not None:
            self.before[row["target_before"]] += connections
        if not row["predictable"]:
            self.unpredictable_keys += keys
            self.unpredictable_connections += connections
            return
        if row["target_after"] is None:
            self.refused_after_keys += keys
        else:
            self.after[row["target_after"]] = self.after.get(row["target_after"], 0) + connections
        if row["moved"]:
            self.moved_keys += keys
            self.moved_connections += connections
            self.moved_bytes += nbytes

    def summary(self) -> dict[str, object]:
        predictable_keys = self.keys - self.unpredictable_keys
        predictable_connections = self.connections - self.unpredictable_connections
        out: dict[str, object] = {}
        if self.plan is not None:
            out["key_type"] = self.plan.key_type.value
            out["replayed_from"] = self.plan.replay.value
            out["policy"] = self.plan.policy
            out["deterministic"] = self.plan.deterministic
            out["ready"] = sorted(self.plan.ready)
        out |= {
            "keys": self.keys,
            "moved_keys": self.moved_keys,
            "moved_fraction": _fraction(self.moved_keys, predictable_keys),
            "connections": self.connections,
            "moved_connections": self.moved_connections,
            "moved_connections_fraction": _fraction(self.moved_connections, predictable_connections),
            "bytes": self.bytes,
            "moved_bytes": self.moved_bytes,
            "fallback_keys": self.fallback_keys,
            "unpredictable_keys": self.unpredictable_keys,
            "unpredictable_connections": self.unpredictable_connections,
            "refused_after_keys": self.refused_after_keys,
            "decisions_by_target_before": dict(sorted(self.before.items())),
            "decisions_by_target_after": dict(sorted(self.after.items())),
            "balance_before": _balance(self.before),
            "balance_after": _balance(self.after),
        }
        return out


def simulate(
    spark: SparkSession,
    events: DataFrame,
    config: Config,
    out: str,
    *,
    router: str | None = None,
    ready: str = "all",
    unreadable: Sequence[UnreadableFile] = (),
) -> dict[str, object]:
    """Replay the log's keys through the new configuration and write the results under `out`.

    Writes `out/keys` (one row per key: before, after, moved), `out/moves` (per router, target
    before and after: keys, connections, bytes), `out/balance` (per router and target:
    connections and keys before and after) and `out/summary.json`.

    Args:
        spark: the session.
        events: the valid deduplicated events (`read_events`).
        config: the new configuration.
        out: the output directory (any Spark/Hadoop path).
        router: only this connection router (default: every one of `config` in the log).
        ready: `all`, `none` or `NODE,...` as `routerctl route --ready`.
        unreadable: event files set aside whole (`pipeline.ingest.Ingested.unreadable`), named
            in the summary's `unreadable_files`.

    Returns:
        The summary (also written as `summary.json`).

    Raises:
        SimulateError: see `plan_routers`.
    """
    from pyspark.sql import functions as F

    from pipeline.ingest import write_text

    logged = logged_key_types(events)
    plans = plan_routers(config, logged, router=router, ready=ready)
    keys_path = _join(out, "keys")
    replay(key_table(events, plans), config, plans).write.mode("overwrite").parquet(keys_path)
    replayed = spark.read.parquet(keys_path)
    transitions = (
        replayed.groupBy("router", "target_before", "target_after", "predictable", "moved", "fallback")
        .agg(
            F.count(F.lit(1)).alias("keys"),
            F.sum("connections").alias("connections"),
            F.sum(F.col("bytes_in") + F.col("bytes_out")).alias("bytes"),
        )
        .collect()  # small: routers x targets before x targets after x 2^3 flags
    )
    summary = summarize(transitions, plans)
    _write_moves(spark, transitions, _join(out, "moves"))
    _write_balance(spark, summary, _join(out, "balance"))
    summary["routers_not_simulated"] = sorted(set(logged) - {p.name for p in plans})
    summary["config"] = config.source
    summary["out"] = out
    summary["unreadable_files"] = [{"file": u.file, "reason": u.reason} for u in unreadable]
    write_text(spark, _join(out, "summary.json"), json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _write_moves(spark: SparkSession, transitions: Sequence[Row], path: str) -> None:
    """The moves matrix: per router, target before and after (None: none), the keys, connections
    and bytes going that way; `moved` marks the rows that move (None: unpredictable)."""
    totals: dict[tuple[str, str | None, str | None, bool | None], list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in transitions:
        tally = totals[(row["router"], row["target_before"], row["target_after"], row["moved"])]
        tally[0] += int(row["keys"])
        tally[1] += int(row["connections"])
        tally[2] += int(row["bytes"])
    rows = [(*k, *v) for k, v in sorted(totals.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]
    schema = (
        "router string, target_before string, target_after string, moved boolean, "
        "keys long, connections long, bytes long"
    )
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(path)


def _write_balance(spark: SparkSession, summary: Mapping[str, object], path: str) -> None:
    """Per router and target: connections before and after."""
    rows: list[tuple[str, str, int, int]] = []
    routers = summary["routers"]
    assert isinstance(routers, dict)
    for name, router in routers.items():
        before, after = router["decisions_by_target_before"], router["decisions_by_target_after"]
        for node in sorted(set(before) | set(after)):
            rows.append((name, node, before.get(node, 0), after.get(node, 0)))
    schema = "router string, node_id string, connections_before long, connections_after long"
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(path)


def _delete(spark: SparkSession, path: str) -> None:
    """Remove a directory at any Hadoop path, if it is there."""
    jvm = spark.sparkContext._jvm  # py4j gateway: PySpark's way to the Hadoop API
    assert jvm is not None, "a classic (JVM) Spark session"
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(hadoop_path, True)


# -- command line -------------------------------------------------------------------------------


def arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `routerctl simulate` (Spark's `--master`/`--conf` come from the caller)."""
    parser.add_argument(
        "events", nargs="+", metavar="EVENTS", help="event files or directories (any Spark path)"
    )
    parser.add_argument("--config", required=True, metavar="NEW.xml", help="the new configuration")
    parser.add_argument(
        "--router", metavar="NAME", help="only this connection router (default: every one in both)"
    )
    parser.add_argument(
        "--ready",
        default="all",
        help="targets counted as ready, as routerctl route: all, none, or NODE,NODE,... (default all)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (any Spark path)")


def run(args: argparse.Namespace) -> int:
    """`routerctl simulate`: 0 done (unreadable event files set aside, named on stderr and in
    summary.json); 2 with one line on stderr for a bad configuration or a simulation that cannot
    be run as asked (router, key type, --ready); 1 for missing input or a failed Spark job; 6 when
    every event file is unreadable (`pipeline.cli.EXIT_UNREADABLE`)."""
    from pyspark.sql import SparkSession

    from pipeline.cli import job_failed, report_unreadable
    from pipeline.ingest import ingest
    from pipeline.session import quiet, spark_session

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"routerctl simulate: {exc}", file=sys.stderr)
        return 2
    owned = SparkSession.getActiveSession() is None
    spark = spark_session(args.master, app="routerctl simulate", conf=dict(getattr(args, "conf", [])))
    if owned:
        quiet(spark)
    staging = _join(args.out, "_staging")
    try:
        ingested = ingest(spark, args.events, staging=staging)
        report_unreadable("simulate", ingested.unreadable)
        summary = simulate(
            spark,
            ingested.events,
            config,
            args.out,
            router=args.router,
            ready=args.ready,
            unreadable=ingested.unreadable,
        )
    except SimulateError as exc:
        print(f"routerctl simulate: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        status = job_failed("simulate", exc)
        if status is None:
            raise
        return status
    finally:
        _delete(spark, staging)
        if owned:
            spark.stop()
    routers = summary["routers"]
    assert isinstance(routers, dict)
    for name, router in routers.items():
        print(_line(name, router))
    print(f"results in {args.out}: summary.json, keys/, moves/, balance/")
    return 0


def _line(name: str, router: Mapping[str, object]) -> str:
    fraction = router["moved_fraction"]
    share = "n/a" if not isinstance(fraction, float) else f"{fraction:.1%}"
    text = f"{name}: {router['keys']} keys, {router['moved_keys']} would move ({share}), "
    text += f"{router['moved_connections']} of {router['connections']} connections"
    if router["unpredictable_keys"]:
        text += f"; {router['unpredictable_keys']} keys unpredictable ({router['policy']})"
    if router["fallback_keys"]:
        text += f"; {router['fallback_keys']} replayed from the logged key (raw key cut)"
    return text
