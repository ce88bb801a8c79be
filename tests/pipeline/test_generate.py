"""The synthetic event files: byte-compatible with the router's writer, exact truth, reproducible."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard

from event_format.lines import json_line
from event_format.parquet import ARROW_SCHEMA
from event_format.schema import BOOT_SPAN, RAW_KEY_CAP, CloseRecord, DecisionRecord
from keys import KeyType
from pipeline.generate import (
    _OUTCOMES_PER_CR,
    DETECT_S,
    FLEET,
    MALFORMED_KINDS,
    START_S,
    _connections,
    _Job,
    _key_values,
    _malformed_line,
    _outcome,
    _Part,
    _plan,
    _refusal,
    _router_id,
    _segment_exclusive_cumsum,
    _split,
    _timestamps,
    _with_duplicates,
    _with_malformed,
    generate,
    load_truth,
)
from policies import ConsistentHashPolicy
from pools.target import Connector, Target
from router.config import load_config
from router.config.settings import EventFileFormat
from tests.router.features.event_log.conftest import records_in


def _valid(line: str) -> dict[str, object] | None:
    """The record of a line the ingest step keeps, else None (the generator's malformed kinds)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("kind") not in ("decision", "close"):
        return None
    if not isinstance(record.get("seq"), int) or "router_id" not in record or record.get("ts") == "yesterday":
        return None
    if record["kind"] == "decision" and record.get("status") == "MAYBE":
        return None
    return record


def test_generate_lines_are_json_line_bytes_and_truth_counts_them(tmp_path):
    truth = generate(
        tmp_path,
        6000,
        routers=2,
        keys=300,
        duplicate_rate=0.02,
        malformed_rate=0.01,
        files=2,
        compress=False,
        span_s=600,
    )
    lines = [
        line + "\n"  # lines end in \n only (garbage may hold bytes str.splitlines would split at)
        for name in truth.files
        for line in (tmp_path / name).read_bytes().decode("latin-1").split("\n")[:-1]
    ]
    assert len(lines) == truth.lines == 6000
    valid = Counter[str]()
    malformed = 0
    for line in lines:
        record = _valid(line)
        if record is None:
            malformed += 1
            continue
        valid[line] += 1
        kind = DecisionRecord if record.pop("kind") == "decision" else CloseRecord
        assert json_line(kind(**record)) == line  # type: ignore[arg-type]
    assert malformed == truth.malformed == 60
    assert sum(valid.values()) - len(valid) == truth.duplicates == 120
    assert len(valid) == truth.events == truth.decisions + truth.closes
    assert sum(truth.malformed_by_reason.values()) == truth.malformed
    assert set(truth.malformed_by_reason) == {k.reason for k in MALFORMED_KINDS}
    assert sum(truth.decisions_by_status.values()) == truth.decisions
    assert sum(truth.decisions_by_target.values()) == truth.decisions_by_status["OK"]
    assert load_truth(tmp_path / "truth.json") == truth


def test_generate_parquet_is_the_same_events_as_the_routers_writer_writes_them(tmp_path):
    options = {"routers": 2, "keys": 300, "duplicate_rate": 0.02, "malformed_rate": 0.0, "span_s": 600}
    lines = generate(tmp_path / "jsonl", 3000, compress=False, **options)  # type: ignore[arg-type]
    truth = generate(tmp_path / "parquet", 3000, file_format=EventFileFormat.PARQUET, **options)  # type: ignore[arg-type]
    assert truth == dataclasses.replace(lines, files=[n.replace(".jsonl", ".parquet") for n in lines.files])
    for jsonl, parquet in zip(lines.files, truth.files, strict=True):
        assert pq.read_schema(tmp_path / "parquet" / parquet).equals(ARROW_SCHEMA)
        assert records_in(tmp_path / "parquet" / parquet) == [
            {name: line.get(name) for name in ARROW_SCHEMA.names}
            for line in records_in(tmp_path / "jsonl" / jsonl)
        ]


def test_generate_moves_keys_off_a_target_that_goes_down(tmp_path):
    """Scenario: the busiest target of each pool dies, is redispatched from, and its connections close."""
    truth = generate(tmp_path, 30_000, routers=2, keys=2000, span_s=600)
    assert truth.decisions_by_reason["redispatch"] > 0
    assert truth.closes_by_reason["target_not_ready"] > 0
    assert truth.closes_by_reason["shutdown"] > 0  # rtr-a restarts
    assert truth.cache_hits > 0
    assert truth.null_keys > 0
    assert set(truth.down) == set(truth.down) & set(truth.decisions_by_target)
    assert {"REFUSED_UNAVAILABLE", "REFUSED_USE_ANOTHER"} <= set(truth.decisions_by_status)


def test_generate_is_deterministic_per_seed(tmp_path):
    first = generate(tmp_path / "a", 2000, routers=2, keys=100, seed=7)
    again = generate(tmp_path / "b", 2000, routers=2, keys=100, seed=7)
    other = generate(tmp_path / "c", 2000, routers=2, keys=100, seed=8)
    data = [(tmp_path / d / first.files[0]).read_bytes() for d in "abc"]
    assert data[0] == data[1] != data[2]
    assert first == again
    assert other.files == first.files
    text = zstandard.ZstdDecompressor().decompressobj().decompress(data[0])
    assert text.startswith(b'{"kind":"decision","router_id":"rtr-a","seq":')


def test_generate_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="rates"):
        generate(tmp_path, 100, duplicate_rate=0.4, malformed_rate=0.2)
    with pytest.raises(ValueError, match=">= 1"):
        generate(tmp_path, 0)
    with pytest.raises(ValueError, match="Parquet files hold no malformed lines: malformed rate must be 0"):
        generate(tmp_path, 100, file_format=EventFileFormat.PARQUET)


def test__router_id():
    assert [_router_id(i) for i in (0, 1, 25, 26, 27)] == ["rtr-a", "rtr-b", "rtr-z", "rtr-aa", "rtr-ab"]


def test_the_example_fleet_configuration_is_the_generators_fleet():
    """docs/examples/fleet.xml (the README's simulate recipe) has the generator's routers, key
    types and pools; fleet-plus-one.xml adds mq8 to mqtt-cr and nothing else."""
    root = Path(__file__).resolve().parents[2] / "docs" / "examples"
    fleet, plus = load_config(root / "fleet.xml"), load_config(root / "fleet-plus-one.xml")
    for spec in FLEET:
        router = fleet.router(spec.name)
        assert router.key_type is spec.key_type
        assert router.pool is not None
        assert router.pool.static_connectors == spec.targets
        extra = ("mq8",) if spec.name == "mqtt-cr" else ()
        plus_pool = plus.router(spec.name).pool
        assert plus_pool is not None
        assert plus_pool.static_connectors == (*spec.targets, *extra)
    assert {r.name for r in fleet.routers} == {spec.name for spec in FLEET}


# -- the pure parts: keys, the plan, connections, faults --------------------------------------------


@pytest.mark.parametrize("spec", FLEET, ids=[spec.name for spec in FLEET])
def test__key_values_per_kind(spec):
    """Kind 0 a plain key, 1 no value, 2 a value the filter turns to NULL, 3 a non-ASCII key."""
    for i in range(30):
        raw, key = _key_values(i, spec, 0)
        assert raw == key != "NULL"
        assert key.isascii()
        assert _key_values(i, spec, 1) == (None, "NULL")
        raw, key = _key_values(i, spec, 2)
        assert raw is not None
        assert key == "NULL"
        raw, key = _key_values(i, spec, 3)
        if spec.key_type is KeyType.SOURCE_IP:
            assert raw == key
            assert ipaddress.ip_address(key).version == 4  # an address has no non-ASCII form
        else:
            assert raw == key
            assert not key.isascii()


def test__key_values_filtered_client_ids_include_ones_past_the_raw_key_cap():
    (mqtt,) = [spec for spec in FLEET if spec.key_type is KeyType.CLIENT_ID]
    lengths = [len(raw) for i in range(6) if (raw := _key_values(i, mqtt, 2)[0]) is not None]
    assert [n > RAW_KEY_CAP for n in lengths] == [True, False, False, True, False, False]


def test__segment_exclusive_cumsum_restarts_at_each_run():
    values = np.array([1, 2, 3, 4, 5, 6], dtype=np.int64)
    first = np.array([True, False, True, False, False, True])
    assert _segment_exclusive_cumsum(values, first).tolist() == [0, 1, 0, 3, 7, 0]


def test__outcome_and__refusal_ids_never_collide():
    ids = [
        _outcome(cr, node, reason) for cr in range(len(FLEET)) for node in range(32) for reason in range(3)
    ] + [_refusal(cr, which) for cr in range(len(FLEET)) for which in range(2)]
    assert len(set(ids)) == len(ids)
    assert max(ids) < _OUTCOMES_PER_CR * len(FLEET)


@pytest.fixture(scope="module")
def plan():
    return _plan(events=0, keys=400, seed=1, start_s=START_S, span_s=600, dup=0, bad=0)


def test__plan_picks_targets_with_the_routers_policy(plan):
    """Scenario: every key's target is CONSISTENT_HASH's pick over its pool; while the pool's
    busiest target is down, the pick over the others; a NULL key is flagged as one."""
    policy = ConsistentHashPolicy({})
    for i in range(0, 400, 7):
        spec = FLEET[i % len(FLEET)]
        key = json.loads("{" + plan.key_frag[i] + "}")["key"]
        pool = [Target.remote(Connector(name=n, host="127.0.0.1", port=61616)) for n in spec.targets]
        picked = policy.select(pool, key)
        assert picked is not None
        assert spec.targets[plan.primary[i]] == picked.node_id
        down = int(plan.down_node[i % len(FLEET)])
        assert plan.alt[i] != down
        if plan.primary[i] != down:
            assert plan.alt[i] == plan.primary[i]
        else:
            fallback = policy.select([t for j, t in enumerate(pool) if j != down], key)
            assert fallback is not None
            assert spec.targets[plan.alt[i]] == fallback.node_id
        assert bool(plan.key_null[i]) == (key == "NULL")


def test__plan_takes_down_the_busiest_target_of_each_pool(plan):
    weights = 1.0 / np.arange(1, plan.keys + 1)
    for c, spec in enumerate(FLEET):
        mine = np.arange(plan.keys) % len(FLEET) == c
        load = np.bincount(plan.primary[mine], weights[mine], minlength=len(spec.targets))
        assert plan.down_node[c] == int(np.argmax(load))
        start, end = plan.down_us[c]
        assert 0 < start < end < plan.span_us


def test__connections_avoid_the_target_while_it_is_down(plan):
    """Scenario: 20,000 connections of one process. While a pool's target is down no OK decision
    lands on it; in the first `DETECT_S` the connects to it fail over (`redispatch`), and never
    otherwise; refusals have no target; only proxied OK connections close."""
    job = _Job(
        plan=plan,
        index=1,
        unique=0,
        duplicates=0,
        malformed=0,
        files=1,
        out_dir="",
        compress=False,
        file_format=EventFileFormat.JSONL,
    )
    c = _connections(job, np.random.default_rng(3), 20_000)
    t, cr, node, reason, end = (c[name].astype(np.int64) for name in ("t", "cr", "node", "reason", "end"))
    ok, closes = c["ok"].astype(np.bool_), c["closes"].astype(np.bool_)
    assert (np.diff(t) >= 0).all()
    down_from, down_until = plan.down_us[cr, 0], plan.down_us[cr, 1]
    down = (t >= down_from) & (t < down_until)
    gone = plan.down_node[cr]
    assert not (ok & down & (node == gone)).any()
    detect = down & (t < down_from + round(DETECT_S * 1e6))
    redispatched = ok & (reason == 2)
    assert redispatched.any()
    assert not (redispatched & ~detect).any()
    assert ((node == -1) == ~ok).all()
    assert set(reason[ok].tolist()) == {0, 1, 2}  # policy, cache, redispatch
    proxied = np.array([spec.mode == "proxy" for spec in FLEET])[cr]
    assert not (closes & ~(ok & proxied)).any()
    assert (end[closes] >= t[closes]).all()


def test__with_duplicates_re_emits_earlier_lines():
    lines = [f"{i}\n" for i in range(100)]
    out = _with_duplicates(lines, 17, np.random.default_rng(0))
    assert len(out) == 117
    assert list(dict.fromkeys(out)) == lines  # first occurrences in order: nothing new, nothing lost
    assert sum(Counter(out).values()) - len(set(out)) == 17
    assert _with_duplicates(lines, 0, np.random.default_rng(0)) == lines


def test__with_duplicates_more_copies_than_lines():
    out = _with_duplicates(["a\n", "b\n"], 7, np.random.default_rng(1))
    assert len(out) == 9
    assert list(dict.fromkeys(out)) == ["a\n", "b\n"]


def test__malformed_line_breaks_the_rule_its_reason_names():
    source = (
        '{"kind":"decision","router_id":"rtr-a","seq":5,"ts":"2026-11-18T11:00:00.000000Z",'
        '"status":"OK","key":"k"}\n'
    )
    rng = np.random.default_rng(0)
    made = {kind.name: _malformed_line(kind.name, source, rng) for kind in MALFORMED_KINDS}
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in made.values())
    with pytest.raises(json.JSONDecodeError):
        json.loads(made["truncated"])
    assert made["garbage"].startswith("\xff")
    assert isinstance(json.loads(made["seq not a number"])["seq"], str)
    assert json.loads(made["ts not a time"])["ts"] == "yesterday"
    assert json.loads(made["top-level array"]) == [1, 2, 3]
    assert "router_id" not in json.loads(made["no router_id"])
    assert "seq" not in json.loads(made["no seq"])
    assert json.loads(made["unknown kind"])["kind"] not in ("decision", "close")
    unknown = json.loads(made["unknown status"])
    assert (unknown["kind"], unknown["status"]) == ("decision", "MAYBE")
    assert {kind.name: _valid(line) for kind, line in zip(MALFORMED_KINDS, made.values(), strict=True)} == (
        dict.fromkeys(made)
    )  # the test's own reader of valid lines (above) drops every one
    with pytest.raises(ValueError, match="unknown malformed kind 'late'"):
        _malformed_line("late", source, rng)


def test__with_malformed_inserts_the_kinds_in_turn_and_counts_their_reasons():
    lines = [
        f'{{"kind":"close","router_id":"rtr-a","seq":{i},"ts":"2026-11-18T11:00:00.000000Z"}}\n'
        for i in range(50)
    ]
    part = _Part()
    out = _with_malformed(lines, 12, np.random.default_rng(2), part, 3)
    assert len(out) == 62
    assert [line for line in out if line in lines] == lines  # the valid lines stay, in order
    reasons = [MALFORMED_KINDS[(3 + j) % len(MALFORMED_KINDS)].reason for j in range(12)]
    assert part.malformed_by_reason == Counter(reasons)
    assert sum(1 for line in out if _valid(line) is None) == 12


def test__timestamps_are_iso_utc_with_microseconds():
    start = round(START_S * 1e6)
    stamps = _timestamps(start, np.array([0, 1, 1_500_000], dtype=np.int64))
    assert stamps == [
        "2026-11-18T11:06:40.000000Z",
        "2026-11-18T11:06:40.000001Z",
        "2026-11-18T11:06:41.500000Z",
    ]
    assert datetime.fromisoformat(stamps[0]) == datetime.fromtimestamp(START_S, UTC)


@pytest.mark.parametrize(
    ("total", "parts", "expected"), [(10, 4, [3, 3, 2, 2]), (3, 5, [1, 1, 1, 0, 0]), (8, 2, [4, 4])]
)
def test__split_gives_the_remainder_to_the_first(total, parts, expected):
    assert _split(total, parts) == expected


def test_truth_round_trips_through_its_json(tmp_path):
    truth = generate(tmp_path, 500, routers=1, keys=40, seed=4)
    text = (tmp_path / "truth.json").read_text()
    assert text == truth.to_json()
    assert json.loads(text)["router_ids"] == ["rtr-a"]
    assert load_truth(tmp_path / "truth.json") == truth


def test_generate_numbers_each_process_s_lines_in_order_and_rtr_a_restarts(tmp_path):
    """Scenario: without faults, each routing process's files, read in order, are its lines:
    `seq` counts up by one from each boot (`BOOT_SPAN` apart), `rtr-a` boots twice (the restart),
    times never go back within a boot, and a close names a connection decided before it."""
    truth = generate(
        tmp_path, 3000, routers=2, keys=100, duplicate_rate=0, malformed_rate=0, files=3, compress=False
    )
    assert truth.files == [f"events-rtr-{r}-{f:04d}.jsonl" for r in "ab" for f in range(3)]
    assert not list(tmp_path.glob(".*"))  # written under dot names, then renamed
    for router_id in truth.router_ids:
        files = [name for name in truth.files if router_id in name]
        sizes = [len((tmp_path / name).read_text().splitlines()) for name in files]
        assert max(sizes) - min(sizes) <= 1
        records = [json.loads(line) for name in files for line in (tmp_path / name).read_text().splitlines()]
        assert {r["router_id"] for r in records} == {router_id}
        boots = [r["seq"] // BOOT_SPAN for r in records]
        assert boots == sorted(boots)
        assert len(set(boots)) == (2 if router_id == "rtr-a" else 1)
        decided: set[int] = set()
        for boot in sorted(set(boots)):
            mine = [r for r in records if r["seq"] // BOOT_SPAN == boot]
            assert [r["seq"] % BOOT_SPAN for r in mine] == list(range(len(mine)))
            assert [r["ts"] for r in mine] == sorted(r["ts"] for r in mine)
            for record in mine:
                if record["kind"] == "decision":
                    decided.add(record["conn"])
                else:
                    assert record["conn"] in decided
