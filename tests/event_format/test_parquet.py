"""event_format/parquet.py: the event log's Parquet files, in process, on real files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import struct
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from event_format.frames import FRAME_HEAD, NativeBatch, decode_frame
from event_format.lines import values_line
from event_format.parquet import ARROW_SCHEMA, ParquetFormat, read_part, rounded
from event_format.schema import (
    BOOT_SPAN,
    VALUE_HEAD,
    VALUE_NAMES,
    VALUE_ROUNDINGS,
    Rounding,
    Sequence,
)
from keys import KeyType
from router.config.settings import EventFileFormat, EventLogConfig
from router.core.events import Closed, CloseReason, ConnectionRef, Decided
from router.features.event_log.recorder import make_recorder
from router.features.event_log.records import event_values
from router.features.event_log.writer import file_format
from tests.router.features.event_log.conftest import all_records, finished, records_in
from tests.router.features.event_log.test_files import FORMATS, NOW, _batch, _files, _keys
from tests.router.features.event_log.test_service import decided

if TYPE_CHECKING:
    from collections.abc import Sequence as Seq

    from event_format.schema import EventValues


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
        duration_s=0.123_456_789,  # the writer rounds it, to 0.123457 in both
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
    assert [r["latency_us"] for r in parquet] == [2.0, 2.0, None]
    assert parquet[2]["duration_s"] == 0.123457
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


def test_a_batch_garbled_by_a_crash_ends_what_recovery_keeps(tmp_path):
    (tmp_path / "a").mkdir()
    writing = _files(tmp_path / "a", EventFileFormat.PARQUET)
    for n in range(3):
        writing.add(_batch(n))
        writing.tick(0.0, flush=True)  # three whole batches
    [part] = (tmp_path / "a").iterdir()
    data = bytearray(part.read_bytes())
    header = len(ARROW_SCHEMA.serialize().to_pybytes())
    second = header + (len(data) - header) // 3  # the batches are the same size
    data[second + 300 : second + 364] = bytes(64)  # zeros in the second batch, as a power cut leaves
    crashed = tmp_path / ".events-edge-1-900-000001.arrows.part"
    crashed.write_bytes(bytes(data))
    assert _files(tmp_path, EventFileFormat.PARQUET).recover() == 1
    assert [r["key"] for r in records_in(tmp_path / "events-edge-1-900-000001.parquet")] == ["dev-0"]


def test_a_file_that_cannot_be_finished_for_what_it_holds_is_set_aside(tmp_path, monkeypatch, caplog):
    part = tmp_path / ".events-edge-1-900-000001.arrows.part"
    part.write_bytes(b"x")

    def broken(*_args: object, **_kwargs: object) -> object:
        raise ValueError("a garbled file")

    monkeypatch.setattr(ParquetFormat, "finish", broken)
    assert _files(tmp_path, EventFileFormat.PARQUET).recover() == 0  # and the start goes on
    assert [p.name for p in tmp_path.iterdir()] == [part.name + ".bad"]
    assert f"cannot finish {part.name} (a garbled file); set aside as {part.name}.bad" in caplog.text
    assert _files(tmp_path, EventFileFormat.PARQUET).recover() == 0  # never tried again


def test_a_record_without_a_field_a_kind_has_is_still_written(tmp_path):
    files = _files(tmp_path, EventFileFormat.PARQUET)
    values = list(event_values(decided(1), KeyType.CLIENT_ID, NOW))
    values[VALUE_HEAD + VALUE_NAMES[0].index("router")] = None  # a bug's: the pipeline quarantines it
    files.add([(0, tuple(values))])
    files.finish_part()
    [record] = all_records(tmp_path)
    assert (record["router"], record["key"]) == (None, "dev-1")


def test_numbers_out_of_range_and_failed_encodings_are_lost_and_counted(tmp_path, monkeypatch, caplog):
    files = _files(tmp_path, EventFileFormat.PARQUET)
    close = list(event_values(decided(1), KeyType.CLIENT_ID, NOW))
    close[VALUE_HEAD + VALUE_NAMES[0].index("raw_key_length")] = 2**64
    files.add([*_batch(0), (1, tuple(close)), (2, ())])
    files.finish_part()
    assert _keys(tmp_path) == ["dev-0"]
    assert files.tally.take() == {"written": 1, "lost": 2, "finished": 1}

    def failing(*_args: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ParquetFormat, "encode", failing)
    files.add(_batch(3, 4))
    files.finish_part()
    assert files.tally.take() == {"lost": 2}
    assert "2 event(s) lost: cannot encode them: a bug" in caplog.text


def _bits(value: float | None) -> object:
    return None if value is None else struct.pack("<d", value)


def _hard_values(rounding: Rounding) -> list[float | None]:
    """Values whose scaled product is at, next to and near a half, with random ones of every
    size, both signs, zeros, infinities, NaN, nulls and the extremes."""
    rng = random.Random(11)
    power = 10.0**rounding.digits
    values: list[float | None] = [None, 0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1e300, -1e300]
    for whole in range(-3000, 3000):
        half = (whole + 0.5) / power / rounding.scale
        values += [half, math.nextafter(half, math.inf), math.nextafter(half, -math.inf)]
        values.append((whole + 0.5 + rng.uniform(-1e-3, 1e-3)) / power / rounding.scale)
    values += [rng.uniform(-1, 1) * 10 ** rng.uniform(-12, 12) for _ in range(20_000)]
    values += [float(n) for n in range(-50, 50)]
    return values


def test_rounded_columns_are_bit_for_bit_the_records_values():
    """The Parquet writer's rounding in C gives what the record's and the line's code give with
    Python's `round`, on every rounded field, at and next to every half."""
    roundings = {rounding for kind in VALUE_ROUNDINGS for rounding in kind.values()}
    assert roundings == {Rounding(1e6, 1), Rounding(1.0, 6)}
    for rounding in roundings:
        record_value = eval(f"lambda v: {rounding.expression('v')}")  # the generated code's expression
        values = _hard_values(rounding)
        expected = [None if v is None else record_value(v) for v in values]
        got = rounded(values, rounding).to_pylist()
        assert [_bits(v) for v in got] == [_bits(v) for v in expected], rounding


def test_a_column_with_a_value_that_is_not_a_number_does_not_round():
    with pytest.raises(pa.ArrowException):
        rounded([1.0, "long"], Rounding(1.0, 6))


def _both_batches(events: Seq[Decided | Closed]) -> tuple[NativeBatch, list[tuple[int, EventValues]]]:
    """The events as the native recorder sends them, and as the Python recorder does."""
    sent = []
    for native in (True, False):
        recorder = make_recorder(len(events), {"r1": KeyType.CLIENT_ID}, lambda: NOW + 0.25, native=native)
        for event in events:
            recorder.record(event)
        frame, _ = recorder.take_frame(len(events))
        sent.append(decode_frame(frame[FRAME_HEAD.size :]))
    native_batch, values_batch = sent
    assert isinstance(native_batch, NativeBatch)
    assert isinstance(values_batch, list)
    return native_batch, values_batch


@pytest.mark.parametrize("form", FORMATS)
def test_the_native_recorder_s_records_make_the_same_files(tmp_path, form):
    """Decoded into Arrow's buffers (Parquet) or into values (JSON lines), the native records give
    the rows the Python recorder's values give, a rounded field and a null included."""
    events: list[Decided | Closed] = [decided(n) for n in range(300)]
    events += [dataclasses.replace(decided(300), node_id=None, latency_s=0.123_456_789e-3)]
    events += [
        Closed(conn=e.conn, node_id="n", bytes_in=n, bytes_out=7, duration_s=n / 7, reason=CloseReason.RESET)
        for n, e in enumerate(events[:50])
    ]
    native_batch, values_batch = _both_batches(events)
    for name, batch in (("native", native_batch), ("values", values_batch)):
        (tmp_path / name).mkdir()
        files = _files(tmp_path / name, form, compress=True)
        files.add(batch)
        files.finish_part()
    [native_file], [values_file] = finished(tmp_path / "native"), finished(tmp_path / "values")
    assert records_in(native_file) == records_in(values_file)
    assert len(records_in(native_file)) == len(events)


def test_a_key_that_is_not_utf_8_costs_the_parquet_file_that_event_alone(tmp_path):
    """A lone surrogate (keys/users.py keeps one) is no Arrow string: the batch is decoded again
    event by event, and only that event is lost, as with the Python recorder."""
    events = [decided(1), dataclasses.replace(decided(2), key="bad \udc80"), decided(3)]
    native_batch, values_batch = _both_batches(events)
    for batch in (native_batch, values_batch):
        encoded = file_format(EventLogConfig(directory=str(tmp_path)), "edge-1", 900).encode([batch])
        assert encoded.events == 2
        assert encoded.failure is not None
        assert "surrogate" in encoded.failure
