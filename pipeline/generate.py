"""Synthetic event files for tests and benchmarks: what a fleet of routers would write in an hour,
with the faults the pipeline must survive, and the exact numbers it must find (`truth.json`).

The fleet (`FLEET`): four connection routers, each with its own key type, mode and pool, behind
`routers` routing processes (router ids `rtr-a`, `rtr-b`, ...), each numbering its lines with its own
`seq` (`event_format.schema.Sequence`; `rtr-a` restarts once, so its numbers jump). Clients
pick a process at random and carry Zipf-distributed keys (some non-ASCII, some without a value,
some that the key filter turns to `NULL`). Targets are picked by the router's own Artemis
CONSISTENT_HASH (`policies.ConsistentHashPolicy`), with a per-process cache whose entries a hit
refreshes (`cache.Cache`). The busiest target of each pool goes down for a while: connections that the router
still sends to it fail over to another target (`redispatch`), then the policy avoids it; its open
connections close with `target_not_ready`; cached keys stay where they went until their entry
expires, and come back through the policy. Decision lines are formatted from pre-escaped fragments
(byte-identical to `json_line`, which a test checks), in worker processes per routing process when
the log is large.

Faults, at given rates of the lines written: duplicates (blocks of lines re-emitted byte-identically
after a "failover", as a log replayed) and malformed lines (truncated JSON, garbage bytes, wrong
types, missing router id or seq, unknown kind or status, a top-level array), each with the
quarantine reason the ingest step gives it.

The files are JSON lines (`.jsonl.zst`), or Parquet written by the router's own writer code
(`event_format.parquet`, without malformed lines). No Spark here: numpy, zstandard,
pyarrow and the router's modules only.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.json
import zstandard

from event_format.lines import ZSTD_LEVEL
from event_format.parquet import ARROW_SCHEMA, write_parquet
from event_format.schema import BOOT_SPAN, RAW_KEY_CAP
from keys import KeyType
from policies import ConsistentHashPolicy
from pools.target import Connector, Target
from router.config.settings import EventFileFormat

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import NDArray

__all__ = ["FLEET", "MALFORMED_KINDS", "CrSpec", "Truth", "generate", "load_truth"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CrSpec:
    """One connection router of the synthetic fleet."""

    name: str
    acceptor: str
    key_type: KeyType
    mode: str
    """proxy or redirect (the mode of its OK decisions)."""
    protocols: tuple[str | None, ...]
    """The protocols its clients speak (one per key)."""
    targets: tuple[str, ...]
    """Node ids of its pool, in pool order (the busiest goes down for a while)."""


FLEET: Final = (
    CrSpec(
        name="mqtt-cr",
        acceptor="mqtt",
        key_type=KeyType.CLIENT_ID,
        mode="proxy",
        protocols=("mqtt",),
        targets=tuple(f"mq{i}" for i in range(8)),
    ),
    CrSpec(
        name="amqp-cr",
        acceptor="amqp",
        key_type=KeyType.USER_NAME,
        mode="proxy",
        protocols=("amqp",),
        targets=tuple(f"amq{i}" for i in range(5)),
    ),
    CrSpec(
        name="tls-cr",
        acceptor="tls",
        key_type=KeyType.SNI_HOST,
        mode="redirect",
        protocols=("tls",),
        targets=tuple(f"tls{i}" for i in range(3)),
    ),
    CrSpec(
        name="ip-cr",
        acceptor="tcp",
        key_type=KeyType.SOURCE_IP,
        mode="proxy",
        protocols=("stomp", "openwire", None),
        targets=tuple(f"node{i}" for i in range(10)),
    ),
)
"""The connection routers; key `i` belongs to `FLEET[i % len(FLEET)]`."""

START_S: Final = 1_795_000_000.0
"""Default start of the log (2026-11-18T11:06:40Z): a fixed time, so files are reproducible."""
SPAN_S: Final = 3600.0
"""Default length of the log."""
DOWN: Final = (0.30, 0.55)
"""The busiest target of pool j is down over this fraction of the span, shifted by `DOWN_SHIFT * j`."""
DOWN_SHIFT: Final = 0.03
DETECT_S: Final = 5.0
"""After a target dies, connects to it fail for this long (until a probe notices): redispatch."""
RESTART: Final = 0.6
"""`rtr-a` restarts at this fraction of the span (a new boot: new seq numbers, an empty cache)."""
CACHE_TTL_S: Final = 60.0
"""A cache entry expires this long after its last hit."""
ZIPF_S: Final = 1.0
"""Key popularity exponent (rank r is drawn with weight 1/r^s): the top key carries ~8 % at 100 k."""
NULL_RAW: Final = 0.02
"""Share of keys with no value (raw key None)."""
FILTERED: Final = 0.03
"""Share of keys the key filter (or the key length limit) turns into `NULL`."""
NON_ASCII: Final = 0.05
REFUSED_UNAVAILABLE: Final = 0.015
REFUSED_USE_ANOTHER: Final = 0.015
CLOSED: Final = 0.9
"""Share of proxied OK connections whose close falls into the log (the rest stay open)."""
_PARALLEL_FROM: Final = 300_000
"""Below this many lines everything runs in this process (a worker costs ~0.3 s to start)."""

_NULL: Final = "NULL"
_REFUSALS: Final = (
    ("REFUSED_UNAVAILABLE", "no ready target"),
    ("REFUSED_USE_ANOTHER", "no pool or no policy"),
)
_OK_REASONS: Final = ("policy", "cache", "redispatch")
_CLOSE_REASONS: Final = ("closed", "reset", "connection_ttl", "target_not_ready", "shutdown")


@dataclass(frozen=True, slots=True)
class _Malformed:
    name: str
    reason: str
    """The quarantine reason `pipeline.ingest` gives such a line."""


MALFORMED_KINDS: Final = (
    _Malformed("truncated", "unparseable"),
    _Malformed("garbage", "unparseable"),
    _Malformed("seq not a number", "unparseable"),
    _Malformed("ts not a time", "unparseable"),
    _Malformed("top-level array", "unparseable"),
    _Malformed("no router_id", "missing router_id"),
    _Malformed("no seq", "missing seq"),
    _Malformed("unknown kind", "bad kind"),
    _Malformed("unknown status", "bad status"),
)
"""The malformed lines written, in turn, and the reason each is quarantined with."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Truth:
    """What the generated files contain: the numbers `routerctl analyze` must find.

    Keys are per connection router: (router, key), `NULL` not counted."""

    lines: int
    """Lines written (events, duplicates and malformed lines)."""
    events: int
    """Distinct valid events (after dedup)."""
    decisions: int
    closes: int
    duplicates: int
    """Extra copies of valid lines (what dedup removes)."""
    malformed: int
    malformed_by_reason: dict[str, int]
    decisions_by_status: dict[str, int]
    decisions_by_reason: dict[str, int]
    decisions_by_target: dict[str, int]
    """OK decisions per node id."""
    closes_by_reason: dict[str, int]
    cache_hits: int
    null_keys: int
    """Decisions whose key is `NULL`."""
    keys: int
    """Distinct (router, key) of decisions, `NULL` excepted."""
    router_ids: list[str]
    files: list[str]
    start: str
    span_s: float
    down: dict[str, list[float]]
    """Node id -> [from, until] epoch seconds it was down."""
    seed: int

    def to_json(self) -> str:
        """The `truth.json` text."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"


def load_truth(path: str | os.PathLike[str]) -> Truth:
    """Read a `truth.json` written by `generate`."""
    return Truth(**json.loads(Path(path).read_text()))


# -- the plan shared by every routing process -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    start_us: int
    span_us: int
    keys: int
    seed: int
    duplicate_rate: float
    malformed_rate: float
    key_cdf: NDArray[np.float64]
    key_frag: list[str]
    """Per key: `"source":…,"protocol":…,"key_type":…,"raw_key":…,"raw_key_length":…,"key":…`."""
    key_null: NDArray[np.bool_]
    primary: NDArray[np.int16]
    """Per key: its target's index in its pool with every target up."""
    alt: NDArray[np.int16]
    """Per key: its target's index while its pool's `down_node` is down."""
    down_node: NDArray[np.int16]
    """Per router: the index of the target that goes down (the one with most traffic)."""
    outcome_frag: list[str]
    """Per outcome id (`_outcome`): `"status":…,"cache_hit":…` up to and without latency."""
    close_frag: list[str]
    """Per (router, node): `"router":…,"acceptor":…,"node_id":…,"duration_s":`."""
    decision_head: list[str]
    """Per router: `"router":…,"acceptor":…,`."""
    down_us: NDArray[np.int64]
    """Per router: [from, until) of its `down_node`'s outage, µs from the start."""


_J: Final = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
_OUTCOMES_PER_CR: Final = 32 * 3 + 2
"""Outcome ids of one router: node index * 3 + OK reason, then the two refusals (pools <= 32)."""


def _outcome(cr: int, node: int, ok_reason: int) -> int:
    return cr * _OUTCOMES_PER_CR + node * 3 + ok_reason


def _refusal(cr: int, which: int) -> int:
    return cr * _OUTCOMES_PER_CR + 32 * 3 + which


def _key_values(i: int, cr: CrSpec, kind: int) -> tuple[str | None, str]:
    """Raw key and key of key number `i`; kind 0 plain, 1 no value, 2 filtered, 3 non-ASCII."""
    if kind == 1:
        return None, _NULL
    match cr.key_type:
        case KeyType.CLIENT_ID:
            if kind == 2:
                return ("guest-" + "x" * (RAW_KEY_CAP + i % 64) if i % 3 == 0 else f"guest-{i}"), _NULL
            if kind == 3:
                value = ("café", "客户端", "Zürich", "\U0001f600dev", "ÅSA")[i % 5] + f"-{i}"
                return value, value
            return f"client-{i:07d}", f"client-{i:07d}"
        case KeyType.USER_NAME:
            if kind == 2:
                return f"anonymous-{i}", _NULL
            value = f"usér{i}" if kind == 3 else f"user{i}"
            return value, value
        case KeyType.SNI_HOST:
            if kind == 2:
                return f"h{i}.internal", _NULL
            value = f"h{i}.bücher.example" if kind == 3 else f"h{i}.example.com"
            return value, value
        case _:
            ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
            if kind == 2:
                return f"192.168.{(i >> 8) & 255}.{i & 255}", _NULL
            return ip, ip


def _plan(
    *, events: int, keys: int, seed: int, start_s: float, span_s: float, dup: float, bad: float
) -> _Plan:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    kinds = rng.choice(4, size=keys, p=[1 - NULL_RAW - FILTERED - NON_ASCII, NULL_RAW, FILTERED, NON_ASCII])
    protocol_pick = rng.integers(0, 3, size=keys)
    weights = 1.0 / np.arange(1, keys + 1, dtype=np.float64) ** ZIPF_S
    cdf = np.cumsum(weights)
    rings = [
        [Target.remote(Connector(name=n, host="127.0.0.1", port=61616)) for n in cr.targets] for cr in FLEET
    ]
    policy = ConsistentHashPolicy({})
    primary = np.empty(keys, dtype=np.int16)
    alt = np.empty(keys, dtype=np.int16)
    key_frag: list[str] = []
    index: list[dict[str, int]] = [{n: j for j, n in enumerate(cr.targets)} for cr in FLEET]
    names: list[str] = []
    for i in range(keys):
        c = i % len(FLEET)
        cr = FLEET[c]
        raw, key = _key_values(i, cr, int(kinds[i]))
        names.append(key)
        if cr.key_type is KeyType.SOURCE_IP and raw is not None:
            source = raw
        else:
            source = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        protocol = cr.protocols[int(protocol_pick[i]) % len(cr.protocols)]
        key_frag.append(
            f'"source":{_J(source)},"protocol":{_J(protocol)},"key_type":"{cr.key_type.value}",'
            f'"raw_key":{_J(None if raw is None else raw[:RAW_KEY_CAP])},'
            f'"raw_key_length":{0 if raw is None else len(raw)},"key":{_J(key)}'
        )
    # The router's own policy picks each key's target; the busiest target of each pool goes down.
    picks: dict[tuple[int, str], int] = {}
    for i, key in enumerate(names):
        c = i % len(FLEET)
        if (c, key) not in picks:
            target = policy.select(rings[c], key)
            assert target is not None
            picks[c, key] = index[c][target.node_id]
        primary[i] = picks[c, key]
    crs = np.arange(keys) % len(FLEET)
    down_node = np.array(
        [
            int(np.argmax(np.bincount(primary[crs == c], weights[crs == c], minlength=len(cr.targets))))
            for c, cr in enumerate(FLEET)
        ],
        dtype=np.int16,
    )
    fallback: dict[tuple[int, str], int] = {}
    for i, key in enumerate(names):
        c = i % len(FLEET)
        if primary[i] != down_node[c]:
            alt[i] = primary[i]
            continue
        if (c, key) not in fallback:
            up = [t for j, t in enumerate(rings[c]) if j != down_node[c]]
            target = policy.select(up, key)
            assert target is not None
            fallback[c, key] = index[c][target.node_id]
        alt[i] = fallback[c, key]
    key_null = np.array([int(k) in (1, 2) for k in kinds], dtype=np.bool_)
    outcome_frag = [""] * (_OUTCOMES_PER_CR * len(FLEET))
    close_frag: list[str] = []
    for c, cr in enumerate(FLEET):
        for j, node in enumerate(cr.targets):
            for r, reason in enumerate(_OK_REASONS):
                outcome_frag[_outcome(c, j, r)] = (
                    f'"status":"OK","reason":"{reason}","mode":"{cr.mode}","node_id":{_J(node)},'
                    f'"local":false,"cache_hit":{"true" if reason == "cache" else "false"}'
                )
            close_frag.append(f'"router":{_J(cr.name)},"acceptor":{_J(cr.acceptor)},"node_id":{_J(node)}')
        for w, (status, reason) in enumerate(_REFUSALS):
            outcome_frag[_refusal(c, w)] = (
                f'"status":"{status}","reason":"{reason}","mode":"refuse","node_id":null,'
                '"local":false,"cache_hit":false'
            )
    span_us = round(span_s * 1e6)
    down_us = np.array(
        [
            [round((DOWN[0] + DOWN_SHIFT * c) * span_us), round((DOWN[1] + DOWN_SHIFT * c) * span_us)]
            for c in range(len(FLEET))
        ],
        dtype=np.int64,
    )
    del events
    return _Plan(
        start_us=round(start_s * 1e6),
        span_us=span_us,
        keys=keys,
        seed=seed,
        duplicate_rate=dup,
        malformed_rate=bad,
        key_cdf=cdf,
        key_frag=key_frag,
        key_null=key_null,
        primary=primary,
        alt=alt,
        outcome_frag=outcome_frag,
        close_frag=close_frag,
        decision_head=[f'"router":{_J(cr.name)},"acceptor":{_J(cr.acceptor)},' for cr in FLEET],
        down_us=down_us,
        down_node=down_node,
    )


# -- one routing process ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    plan: _Plan
    index: int
    unique: int
    duplicates: int
    malformed: int
    files: int
    out_dir: str
    compress: bool
    file_format: EventFileFormat
    """The router's files as JSON lines or as Parquet."""


@dataclass(slots=True, kw_only=True)
class _Part:
    """What one routing process's files hold."""

    lines: int = 0
    decisions: int = 0
    closes: int = 0
    malformed_by_reason: Counter[str] = dataclasses.field(default_factory=Counter)
    by_status: Counter[str] = dataclasses.field(default_factory=Counter)
    by_reason: Counter[str] = dataclasses.field(default_factory=Counter)
    by_target: Counter[str] = dataclasses.field(default_factory=Counter)
    closes_by_reason: Counter[str] = dataclasses.field(default_factory=Counter)
    cache_hits: int = 0
    null_keys: int = 0
    key_ids: NDArray[np.int64] = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    files: list[str] = dataclasses.field(default_factory=list)


def _router_id(index: int) -> str:
    name = ""
    n = index
    while True:
        name = chr(ord("a") + n % 26) + name
        n = n // 26 - 1
        if n < 0:
            return f"rtr-{name}"


def _segment_exclusive_cumsum(values: NDArray[np.int64], first: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Per run of rows (a run starts where `first`), the sum of `values` before each row."""
    total = np.cumsum(values) - values
    starts = np.flatnonzero(first)
    run = np.cumsum(first) - 1
    result: NDArray[np.int64] = total - total[starts][run]
    return result


def _connections(job: _Job, rng: np.random.Generator, n: int) -> dict[str, NDArray[np.generic]]:
    """`n` connections of one process, in time order: key, outcome, target, latency, close."""
    plan = job.plan
    restarts = job.index == 0
    restart_us = round(RESTART * plan.span_us) if restarts else plan.span_us + 1
    t = np.sort(rng.integers(0, plan.span_us, size=n, dtype=np.int64))
    key = np.searchsorted(plan.key_cdf, rng.random(n) * plan.key_cdf[-1]).astype(np.int64)
    key = np.minimum(key, plan.keys - 1)
    cr = key % len(FLEET)
    epoch = (t >= restart_us).astype(np.int64)
    u = rng.random(n)
    refused = np.full(n, -1, dtype=np.int64)
    refused[u < REFUSED_UNAVAILABLE + REFUSED_USE_ANOTHER] = 1
    refused[u < REFUSED_UNAVAILABLE] = 0
    ok = refused < 0
    down_from = plan.down_us[cr, 0]
    down_until = plan.down_us[cr, 1]
    down = (t >= down_from) & (t < down_until)
    detect = down & (t < down_from + round(DETECT_S * 1e6))
    primary = plan.primary[key].astype(np.int64)
    alt = plan.alt[key].astype(np.int64)
    # Cache sessions: OK connections of one key (and process epoch) whose gaps are within the TTL.
    order = np.lexsort((t, key))
    order = order[ok[order]]
    ks, ts, es = key[order], t[order], epoch[order]
    first = np.ones(len(order), dtype=np.bool_)
    if len(order) > 1:
        first[1:] = (ks[1:] != ks[:-1]) | (es[1:] != es[:-1]) | (ts[1:] - ts[:-1] > round(CACHE_TTL_S * 1e6))
    p0, a0, dn, dt = primary[order], alt[order], down[order], detect[order]
    gone = plan.down_node[cr].astype(np.int64)
    on_node0 = p0 == gone[order]
    # The session's first connection: the policy's pick (the dead target avoided once the probe
    # noticed; before that, a connect to it fails and the router redispatches).
    first_target = np.where(dn & ~dt & on_node0, a0, p0)
    first_redispatch = dt & on_node0
    first_final = np.where(first_redispatch, a0, first_target)
    session = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    stayed_primary = (first_final == p0)[starts][session]
    earlier_down = _segment_exclusive_cumsum(dn.astype(np.int64), first) > 0
    cached = np.where(stayed_primary & ~earlier_down, p0, a0)
    hit_down = (cached == p0) & on_node0 & dn
    node_s = np.where(first, first_final, np.where(hit_down, a0, cached))
    reason_s = np.where(
        first,
        np.where(first_redispatch, 2, 0),
        np.where(hit_down, np.where(dt, 2, 0), 1),
    )
    node = np.full(n, -1, dtype=np.int64)
    reason = np.full(n, -1, dtype=np.int64)
    node[order] = node_s
    reason[order] = reason_s
    outcome = np.where(ok, cr * _OUTCOMES_PER_CR + node * 3 + reason, cr * _OUTCOMES_PER_CR + 96 + refused)
    latency = np.exp(rng.normal(np.log(180.0), 0.6, size=n))
    latency = np.where(reason == 1, latency * 0.4, latency)
    latency = np.where(reason == 2, latency + 1500.0, latency)
    latency = np.round(latency, 1)
    # Closes: proxied OK connections; those open on the target when it dies close then.
    proxied = ok & np.array([c.mode == "proxy" for c in FLEET])[cr]
    closes = rng.random(n) < CLOSED
    duration = np.round(np.exp(rng.normal(np.log(20.0), 1.4, size=n)), 3)
    close_reason = rng.choice(3, size=n, p=[0.85, 0.10, 0.05]).astype(np.int64)
    end = t + np.round(duration * 1e6).astype(np.int64)
    killed = (node == gone) & (t < down_from) & (end > down_from)
    kill_at = down_from + rng.integers(0, 1_000_000, size=n)
    end = np.where(killed, kill_at, end)
    close_reason = np.where(killed, 3, close_reason)
    closes = proxied & (closes | killed)
    shut = (epoch == 0) & (end > restart_us)
    end = np.where(shut, restart_us, end)
    close_reason = np.where(shut, 4, close_reason)
    duration = np.where(killed | shut, np.maximum(end - t, 0) / 1e6, duration)
    return {
        "t": t,
        "key": key,
        "cr": cr,
        "epoch": epoch,
        "ok": ok,
        "refused": refused,
        "node": node,
        "reason": reason,
        "outcome": outcome,
        "latency": latency,
        "closes": closes,
        "end": end,
        "duration": duration,
        "close_reason": close_reason,
        "bytes_in": np.round(np.exp(rng.normal(8.0, 2.0, size=n))).astype(np.int64),
        "bytes_out": np.round(np.exp(rng.normal(9.0, 2.0, size=n))).astype(np.int64),
    }


def _timestamps(start_us: int, us: NDArray[np.int64]) -> list[str]:
    """`timestamp()` of many times at once: ISO UTC with microseconds and a `Z`."""
    text = np.datetime_as_string((us + start_us).astype("datetime64[us]"), unit="us")
    return [s + "Z" for s in text.tolist()]


def _stream(job: _Job) -> _Part:
    """Generate, format and write one routing process's files."""
    plan = job.plan
    rng = np.random.default_rng(np.random.SeedSequence([plan.seed, 2, job.index]))
    router_id = _router_id(job.index)
    expect_close = CLOSED * (1 - REFUSED_UNAVAILABLE - REFUSED_USE_ANOTHER) * 0.75
    factor = 1.15
    while True:
        n = int(job.unique / (1 + expect_close) * factor) + 20
        conns = _connections(job, rng, n)
        total = n + int(conns["closes"].sum())
        if total >= job.unique:
            break
        factor *= 1.5
    # Events of the process in the order it wrote them: by boot, time, decision before close.
    conn_idx = np.concatenate([np.arange(n), np.flatnonzero(conns["closes"])])
    is_close = np.concatenate([np.zeros(n, dtype=np.bool_), np.ones(len(conn_idx) - n, dtype=np.bool_)])
    when = np.where(is_close, conns["end"][conn_idx], conns["t"][conn_idx])
    epoch = conns["epoch"][conn_idx]
    order = np.lexsort((is_close, when, epoch))
    # The first `unique` events by time are the log; later ones fall after its end.
    keep = np.sort(np.argsort(when[order], kind="stable")[: job.unique])
    order = order[keep]
    conn_idx, is_close, when, epoch = conn_idx[order], is_close[order], when[order], epoch[order]
    restart_ms = (plan.start_us + round(RESTART * plan.span_us)) // 1000
    boots = np.array([plan.start_us // 1000 - 3_600_000 - job.index * 1000, restart_ms + 1], dtype=np.int64)
    base = boots[epoch] * BOOT_SPAN
    seq = base + (np.arange(len(order)) - np.searchsorted(epoch, epoch, side="left"))
    conn_epoch = conns["epoch"]
    conn_no = np.arange(n) - np.searchsorted(conn_epoch, conn_epoch, side="left")
    conn_id = boots[conn_epoch][conn_idx] * BOOT_SPAN + conn_no[conn_idx]
    ts = _timestamps(plan.start_us, when)
    head = f'"router_id":{_J(router_id)},"seq":'
    decision_fmt = '{"kind":"decision",' + head + '%d,"ts":"%s","conn":%d,%s%s,%s,"latency_us":%r}\n'
    close_fmt = (
        '{"kind":"close",' + head + '%d,"ts":"%s","conn":%d,%s,"duration_s":%r,"bytes_in":%d,'
        '"bytes_out":%d,"reason":"%s"}\n'
    )
    key_l = conns["key"][conn_idx].tolist()
    cr_l = conns["cr"][conn_idx].tolist()
    outcome_l = conns["outcome"][conn_idx].tolist()
    node_l = conns["node"][conn_idx].tolist()
    latency_l = conns["latency"][conn_idx].tolist()
    duration_l = conns["duration"][conn_idx].tolist()
    bin_l = conns["bytes_in"][conn_idx].tolist()
    bout_l = conns["bytes_out"][conn_idx].tolist()
    creason_l = conns["close_reason"][conn_idx].tolist()
    seq_l, conn_l, close_l = seq.tolist(), conn_id.tolist(), is_close.tolist()
    key_frag, outcome_frag, close_frag, heads = (
        plan.key_frag,
        plan.outcome_frag,
        plan.close_frag,
        plan.decision_head,
    )
    offsets = np.cumsum([0] + [len(c.targets) for c in FLEET]).tolist()
    lines = [
        close_fmt
        % (
            seq_l[i],
            ts[i],
            conn_l[i],
            close_frag[offsets[cr_l[i]] + node_l[i]],
            duration_l[i],
            bin_l[i],
            bout_l[i],
            _CLOSE_REASONS[creason_l[i]],
        )
        if close_l[i]
        else decision_fmt
        % (
            seq_l[i],
            ts[i],
            conn_l[i],
            heads[cr_l[i]],
            key_frag[key_l[i]],
            outcome_frag[outcome_l[i]],
            latency_l[i],
        )
        for i in range(len(seq_l))
    ]
    part = _Part()
    _count(part, conns, conn_idx, is_close, plan.key_null)
    lines = _with_duplicates(lines, job.duplicates, rng)
    lines = _with_malformed(lines, job.malformed, rng, part, job.index)
    part.lines = len(lines)
    part.files = _write(lines, job, router_id)
    return part


def _count(
    part: _Part,
    conns: dict[str, NDArray[np.generic]],
    conn_idx: NDArray[np.int64],
    is_close: NDArray[np.bool_],
    key_null: NDArray[np.bool_],
) -> None:
    decided = conn_idx[~is_close]
    closed = conn_idx[is_close]
    part.decisions = len(decided)
    part.closes = len(closed)
    ok = conns["ok"][decided].astype(np.bool_)
    refused = conns["refused"][decided]
    part.by_status["OK"] = int(ok.sum())
    for w, (status, refusal) in enumerate(_REFUSALS):
        part.by_status[status] = int((refused == w).sum())
        part.by_reason[refusal] = int((refused == w).sum())
    reasons = conns["reason"][decided][ok]
    for r, name in enumerate(_OK_REASONS):
        part.by_reason[name] = int((reasons == r).sum())
    part.cache_hits = int((reasons == 1).sum())
    crs = conns["cr"][decided][ok]
    nodes = conns["node"][decided][ok]
    offsets = np.cumsum([0] + [len(c.targets) for c in FLEET])
    flat = np.bincount(offsets[crs] + nodes, minlength=int(offsets[-1]))
    names = [node for cr in FLEET for node in cr.targets]
    part.by_target.update({names[j]: int(v) for j, v in enumerate(flat.tolist()) if v})
    creason = np.bincount(conns["close_reason"][closed], minlength=len(_CLOSE_REASONS))
    part.closes_by_reason.update({_CLOSE_REASONS[j]: int(v) for j, v in enumerate(creason.tolist()) if v})
    keys = conns["key"][decided]
    null = key_null[keys]
    part.null_keys = int(null.sum())
    part.key_ids = np.unique(keys[~null])


def _with_duplicates(lines: list[str], count: int, rng: np.random.Generator) -> list[str]:
    """`count` extra copies: up to five "failovers", each re-emitting the block of lines before it."""
    if count <= 0 or not lines:
        return lines
    blocks = min(5, count)
    sizes = np.full(blocks, count // blocks, dtype=np.int64)
    sizes[: count % blocks] += 1
    sizes = np.minimum(sizes, len(lines))
    sizes[-1] += count - int(sizes.sum())
    spans: list[tuple[int, int]] = []
    remaining = count
    for size in sizes.tolist():
        while size > 0:
            take = min(size, len(lines))
            end = int(rng.integers(take, len(lines) + 1))
            spans.append((end - take, end))
            size -= take
            remaining -= take
    assert remaining == 0
    spans.sort(key=lambda s: s[1])
    out: list[str] = []
    at = 0
    for begin, end in spans:
        out.extend(lines[at:end])
        out.extend(lines[begin:end])
        at = end
    out.extend(lines[at:])
    return out


def _malformed_line(kind: str, line: str, rng: np.random.Generator) -> str:
    record = json.loads(line)
    match kind:
        case "truncated":
            return line[: max(1, len(line) // 2)] + "\n"
        case "garbage":
            raw = rng.integers(0, 256, size=40, dtype=np.uint8)
            raw[(raw == 10) | (raw == 13)] = 0xFE
            # latin-1 keeps every line one byte per character: the garbage bytes come out as drawn
            return (b"\xff" + raw.tobytes()).decode("latin-1") + "\n"
        case "seq not a number":
            record["seq"] = f"x{record['seq']}"
        case "ts not a time":
            record["ts"] = "yesterday"
        case "top-level array":
            return "[1,2,3]\n"
        case "no router_id":
            del record["router_id"]
        case "no seq":
            del record["seq"]
        case "unknown kind":
            record["kind"] = "heartbeat"
        case "unknown status":
            record["kind"] = "decision"
            record["status"] = "MAYBE"
        case _:
            raise ValueError(f"unknown malformed kind {kind!r}")
    return _J(record) + "\n"


def _with_malformed(
    lines: list[str], count: int, rng: np.random.Generator, part: _Part, index: int
) -> list[str]:
    """`count` malformed lines at random places, the kinds in turn (from `index`)."""
    if count <= 0:
        return lines
    places = np.sort(rng.integers(0, len(lines) + 1, size=count)).tolist()
    sources = rng.integers(0, max(1, len(lines)), size=count).tolist()
    out: list[str] = []
    at = 0
    for j, place in enumerate(places):
        out.extend(lines[at:place])
        at = place
        kind = MALFORMED_KINDS[(index + j) % len(MALFORMED_KINDS)]
        source = lines[sources[j]] if lines else '{"kind":"decision","router_id":"rtr-a","seq":0}\n'
        out.append(_malformed_line(kind.name, source, rng))
        part.malformed_by_reason[kind.reason] += 1
    out.extend(lines[at:])
    return out


def _write(lines: list[str], job: _Job, router_id: str) -> list[str]:
    """Split into `job.files` files, each written under a dot name and renamed when complete:
    JSON lines, or the same events as the router's writer process writes them in Parquet."""
    names: list[str] = []
    out = Path(job.out_dir)
    bounds = np.linspace(0, len(lines), job.files + 1).round().astype(np.int64).tolist()
    parquet = job.file_format is EventFileFormat.PARQUET
    for f in range(job.files):
        if parquet:
            name = f"events-{router_id}-{f:04d}.parquet"
        else:
            name = f"events-{router_id}-{f:04d}.jsonl" + (".zst" if job.compress else "")
        data = "".join(lines[bounds[f] : bounds[f + 1]]).encode("latin-1")
        temporary = out / f".{name}.tmp"
        if parquet:
            write_parquet(_as_table(data), temporary, compress=job.compress)
        elif job.compress:
            temporary.write_bytes(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))
        else:
            temporary.write_bytes(data)
        temporary.replace(out / name)
        names.append(name)
    return names


def _as_table(lines: bytes) -> pa.Table:
    """Well-formed lines as the router's Parquet writer's table (`ARROW_SCHEMA`)."""
    options = pyarrow.json.ParseOptions(explicit_schema=ARROW_SCHEMA, unexpected_field_behavior="error")
    table = pyarrow.json.read_json(pa.BufferReader(lines), parse_options=options)
    return table.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def generate(
    out_dir: str | os.PathLike[str],
    events: int,
    *,
    routers: int = 4,
    keys: int = 10_000,
    duplicate_rate: float = 0.01,
    malformed_rate: float = 0.001,
    files: int = 1,
    compress: bool = True,
    file_format: EventFileFormat = EventFileFormat.JSONL,
    seed: int = 0,
    start_s: float = START_S,
    span_s: float = SPAN_S,
    processes: int | None = None,
) -> Truth:
    """Write synthetic event files and their `truth.json` into `out_dir` (created if missing).

    Args:
        out_dir: a local directory.
        events: lines to write in all (valid events, duplicates and malformed lines).
        routers: routing processes (router ids), each with its own files and seq numbers.
        keys: distinct keys drawn from (Zipf), spread over the connection routers of `FLEET`.
        duplicate_rate: share of the lines that are extra copies of valid lines.
        malformed_rate: share of the lines that are malformed.
        files: files per routing process.
        compress: `.jsonl.zst` files, else `.jsonl` (Parquet: zstd pages, else none).
        file_format: JSON lines, or Parquet as the router's writer writes it (`malformed_rate`
            must then be 0: a Parquet file has no malformed lines).
        seed: the same seed and arguments give the same bytes.
        start_s: the log's first second (epoch seconds).
        span_s: the log's length in seconds.
        processes: worker processes (default: one per core, only for large logs).

    Returns:
        The numbers the files hold (also written as `truth.json`).

    Raises:
        ValueError: a count or rate out of range.
    """
    if events < 1 or routers < 1 or keys < 1 or files < 1:
        raise ValueError(
            f"events, routers, keys and files must be >= 1, got {events}, {routers}, {keys}, {files}"
        )
    if min(duplicate_rate, malformed_rate) < 0 or duplicate_rate + malformed_rate >= 0.5:
        raise ValueError(f"rates must be >= 0 and sum below 0.5, got {duplicate_rate} and {malformed_rate}")
    if file_format is EventFileFormat.PARQUET and malformed_rate:
        raise ValueError(
            f"Parquet files hold no malformed lines: malformed rate must be 0, got {malformed_rate}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    duplicates = round(events * duplicate_rate)
    malformed = round(events * malformed_rate)
    unique = events - duplicates - malformed
    plan = _plan(
        events=events,
        keys=keys,
        seed=seed,
        start_s=start_s,
        span_s=span_s,
        dup=duplicate_rate,
        bad=malformed_rate,
    )
    jobs = [
        _Job(
            plan=plan,
            index=i,
            unique=u,
            duplicates=d,
            malformed=m,
            files=files,
            out_dir=str(out),
            compress=compress,
            file_format=file_format,
        )
        for i, (u, d, m) in enumerate(
            zip(_split(unique, routers), _split(duplicates, routers), _split(malformed, routers), strict=True)
        )
    ]
    workers = processes if processes is not None else min(routers, os.cpu_count() or 1)
    if workers > 1 and events >= _PARALLEL_FROM:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            parts = pool.map(_stream, jobs, chunksize=1)
    else:
        parts = [_stream(job) for job in jobs]
    return _truth(plan, parts, seed=seed, start_s=start_s, span_s=span_s, out=out, routers=routers)


def _truth(
    plan: _Plan, parts: Sequence[_Part], *, seed: int, start_s: float, span_s: float, out: Path, routers: int
) -> Truth:
    def total(name: str) -> dict[str, int]:
        counter: Counter[str] = Counter()
        for part in parts:
            counter.update(getattr(part, name))
        return {k: v for k, v in sorted(counter.items()) if v}

    decisions = sum(p.decisions for p in parts)
    closes = sum(p.closes for p in parts)
    malformed = sum(sum(p.malformed_by_reason.values()) for p in parts)
    lines = sum(p.lines for p in parts)
    down = {
        cr.targets[int(plan.down_node[c])]: [
            (plan.start_us + int(plan.down_us[c, 0])) / 1e6,
            (plan.start_us + int(plan.down_us[c, 1])) / 1e6,
        ]
        for c, cr in enumerate(FLEET)
    }
    truth = Truth(
        lines=lines,
        events=decisions + closes,
        decisions=decisions,
        closes=closes,
        duplicates=lines - malformed - decisions - closes,
        malformed=malformed,
        malformed_by_reason=total("malformed_by_reason"),
        decisions_by_status=total("by_status"),
        decisions_by_reason=total("by_reason"),
        decisions_by_target=total("by_target"),
        closes_by_reason=total("closes_by_reason"),
        cache_hits=sum(p.cache_hits for p in parts),
        null_keys=sum(p.null_keys for p in parts),
        keys=len(np.unique(np.concatenate([p.key_ids for p in parts]))),
        router_ids=[_router_id(i) for i in range(routers)],
        files=sorted(f for p in parts for f in p.files),
        start=_timestamps(0, np.array([plan.start_us], dtype=np.int64))[0],
        span_s=span_s,
        down=down,
        seed=seed,
    )
    (out / "truth.json").write_text(truth.to_json())
    del start_s
    return truth
