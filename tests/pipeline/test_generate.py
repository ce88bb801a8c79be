"""The synthetic event files: byte-compatible with the router's writer, exact truth, reproducible."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from event_format.lines import json_line
from event_format.parquet import ARROW_SCHEMA
from event_format.schema import CloseRecord, DecisionRecord
from pipeline.generate import FLEET, MALFORMED_KINDS, _router_id, generate, load_truth
from router.config import load_config
from router.config.settings import EventFileFormat
from tests.router.services.conftest import records_in


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
