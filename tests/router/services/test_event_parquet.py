"""router/services/event_parquet.py: the event log's Parquet files, in process, on real files."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from keys import KeyType
from router.config.settings import EventFileFormat, EventLogConfig
from router.core.event_records import BOOT_SPAN, VALUE_HEAD, VALUE_NAMES, Sequence, event_values, values_line
from router.core.events import Closed, CloseReason, ConnectionRef, Decided
from router.services.event_parquet import ARROW_SCHEMA, read_part
from router.services.event_writer import file_format
from tests.router.services.conftest import finished, records_in
from tests.router.services.test_event_files import FORMATS, NOW, _batch, _files, _keys
from tests.router.services.test_event_log import decided


def test_a_parquet_file_in_progress_cut_by_a_crash_keeps_its_whole_batches(tmp_path):
    (tmp_path / "a").mkdir()
    writing = _files(tmp_path / "a", EventFileFormat.PARQUET)
    writing.add(_batch(1, 2))
    writing.tick(0.0, flush=True)  # one whole batch
    writing.add(_batch(3))
    writing.tick(0.0, flush=True)  # and one the crash cuts in half
    [part] = (tmp_path / "a").iterdir()
    data = part.read_bytes()
    crashed = tmp_path / ".events-edge-1-900-000001.arrows.part"
    crashed.write_bytes(data[: len(data) - 100])
    files = _files(tmp_path, EventFileFormat.PARQUET)
    assert files.recover() == 1
    [path] = finished(tmp_path)
    assert path.name == "events-edge-1-900-000001.parquet"
    assert [r["key"] for r in records_in(path)] == ["dev-1", "dev-2"]
    assert not crashed.exists()


def test_a_parquet_part_too_short_for_its_schema_is_empty_and_deleted(tmp_path):
    part = tmp_path / ".events-edge-1-900-000001.arrows.part"
    part.write_bytes(ARROW_SCHEMA.serialize().to_pybytes()[:10])
    files = _files(tmp_path, EventFileFormat.PARQUET)
    assert files.recover() == 0
    assert list(tmp_path.iterdir()) == []


def test_parquet_rows_say_what_the_json_lines_say(tmp_path):
    close = Closed(
        conn=ConnectionRef(id=5, router="r1", acceptor="mqtt", peer=decided(5).conn.peer),
        node_id="node4",
        bytes_in=11,
        bytes_out=13,
        duration_s=0.5,
        reason=CloseReason.RESET,
    )
    events: list[Decided | Closed] = [decided(1), decided(2), close]
    batch = [(n, event_values(e, KeyType.CLIENT_ID, NOW + n / 3)) for n, e in enumerate(events)]
    for form in FORMATS:
        (tmp_path / form.value).mkdir()
        files = _files(tmp_path / form.value, form, compress=True)
        files.add(batch)
        files.finish_part()
    parquet, jsonl = (records_in(p) for p in (*finished(tmp_path / "parquet"), *finished(tmp_path / "jsonl")))
    columns = [f.name for f in ARROW_SCHEMA]
    assert parquet == [{name: line.get(name) for name in columns} for line in jsonl]
    assert [r["seq"] for r in parquet] == [1000 * BOOT_SPAN + n for n in range(3)]
    assert pq.read_schema(finished(tmp_path / "parquet")[0]).equals(ARROW_SCHEMA)


def test_an_event_without_a_row_is_lost_counted_and_the_rest_written(tmp_path, caplog):
    files = _files(tmp_path, EventFileFormat.PARQUET)
    bad = list(event_values(decided(1), KeyType.CLIENT_ID, NOW))
    bad[VALUE_HEAD + VALUE_NAMES[0].index("raw_key_length")] = "long"  # a bug's value
    files.add([*_batch(0), (1, tuple(bad)), *_batch(2)])
    files.finish_part()
    assert _keys(tmp_path) == ["dev-0", "dev-2"]
    assert files.tally.take() == {"written": 2, "lost": 1, "finished": 1}
    assert "1 event(s) lost: an event has no row:" in caplog.text


def test_an_event_of_no_kind_is_lost_and_the_rest_written(tmp_path, caplog):
    files = _files(tmp_path, EventFileFormat.PARQUET)
    bad = (7, *event_values(decided(1), KeyType.CLIENT_ID, NOW)[1:])
    files.add([*_batch(0), (1, bad)])
    files.finish_part()
    assert _keys(tmp_path) == ["dev-0"]
    assert files.tally.take() == {"written": 1, "lost": 1, "finished": 1}
    assert "1 event(s) lost: an event has no row: no kind 7" in caplog.text


def test_parquet_timestamps_round_as_the_lines_do():
    sequence = Sequence(1)
    times = [NOW, 1_795_435_200.9999996, 1_795_435_200.0000004, 1_795_435_199.1234565]
    batch = [(n, event_values(decided(n), KeyType.CLIENT_ID, t)) for n, t in enumerate(times)]
    config = EventLogConfig(directory="/unused", format=EventFileFormat.PARQUET)
    encoded = file_format(config, "e", 1).encode([batch])
    table = pa.ipc.open_stream(ARROW_SCHEMA.serialize().to_pybytes() + encoded.data).read_all()
    lines = [json.loads(values_line(v, router_id="e", sequence=sequence, number=n)) for n, v in batch]
    stamps = [t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") for t in table.column("ts").to_pylist()]
    assert stamps == [line["ts"] for line in lines]


def test_read_part_of_an_empty_file_is_an_empty_table(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_part(fd).num_rows == 0
    finally:
        os.close(fd)
