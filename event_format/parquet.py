"""The event files' Parquet format, written by the event log's writer process
(`router/features/event_log/writer.py`) with pyarrow, and by the pipeline's generator of synthetic
logs; routerd itself never imports this module.

The schema is generated from the records' one field list (`event_format.schema.FIELDS`), as the
pipeline's Spark schema is: every column of every kind, a column a kind does not have null on
its rows, `ts` a UTC timestamp in microseconds. The pipeline reads the files as they are
(`pipeline/ingest.py`).

A Parquet file is readable only once its footer is written, so the file in progress is an Arrow
IPC stream instead (`.arrows.part`): the schema, then one record batch per hand-over, each
appended whole with one system call. A file cut short by a crash keeps every batch before the cut.
Finishing reads the stream's whole batches and writes them as one Parquet file (zstd pages unless
`compress` is false), one row group per `ROW_GROUP_ROWS` rows.

Events are grouped by kind, and each kind's values become columns at once, not row by row. The
native recorder's records (`event_format.frames.NativeBatch`) are decoded in C straight into Arrow's
buffers, which pyarrow wraps without a Python object per value; the Python recorder's values
tuples become one `pyarrow.array` per column. The rounded fields are rounded a column at a time
too (`rounded`).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq

from event_format.files import Encoded, Finished
from event_format.frames import NativeBatch, columns, events_of
from event_format.schema import (
    FIELDS,
    KINDS,
    VALUE_HEAD,
    VALUE_NAMES,
    VALUE_ROUNDINGS,
    FieldType,
    Rounding,
    Sequence,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from event_format.frames import Batch, KindColumns

__all__ = [
    "ARROW_SCHEMA",
    "ROW_GROUP_ROWS",
    "ParquetFormat",
    "arrow_type",
    "read_part",
    "rounded",
    "write_parquet",
]

_ARROW_TYPES: Final[dict[FieldType, pa.DataType]] = {
    FieldType.STRING: pa.string(),
    FieldType.LONG: pa.int64(),
    FieldType.DOUBLE: pa.float64(),
    FieldType.BOOLEAN: pa.bool_(),
    FieldType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
}


def arrow_type(field_type: FieldType) -> pa.DataType:
    """The Arrow type of a record field type."""
    return _ARROW_TYPES[field_type]


ARROW_SCHEMA: Final = pa.schema([pa.field(f.name, arrow_type(f.type), nullable=True) for f in FIELDS])
"""Every column of every kind (`FIELDS`), all nullable as in the pipeline's schema: a column a kind
lacks is null on its rows, and a record a bug left without a field is still written (the
pipeline's quarantine says which rule it breaks) rather than failing its whole file."""

ROW_GROUP_ROWS: Final = 1024 * 1024
"""Rows per Parquet row group: a file of the default `rotate-size` is one row group, which Spark
reads as one task."""

_ROW_ERRORS: Final = (pa.ArrowException, ValueError, TypeError, IndexError, ArithmeticError)
"""What a bug's values make pyarrow raise (a string where a number goes, a number out of range)."""


class ParquetFormat:
    """Arrow IPC batches in progress, Parquet when finished (module docstring)."""

    part_suffix: Final = ".arrows.part"

    def __init__(self, router_id: str, boot: int) -> None:
        """Rows of `router_id`, numbered from `boot` (epoch ms)."""
        self._router_id = pa.scalar(router_id, pa.string())
        self._base = Sequence(boot).of(0)
        self._header: bytes = ARROW_SCHEMA.serialize().to_pybytes()

    def final_suffix(self, *, compress: bool) -> str:
        return ".parquet"

    def header(self) -> bytes:
        return self._header

    def encode(self, batches: list[Batch]) -> Encoded:
        native = [batch for batch in batches if isinstance(batch, NativeBatch)]
        record_batches: list[pa.RecordBatch] = []
        failure: str | None = None
        in_columns = False
        if native:
            # Broken records, or text that is not UTF-8 (a lone surrogate in a key): the batches
            # are decoded again as values, below, and only the events that have no row are lost.
            with contextlib.suppress(ValueError, pa.ArrowException):
                record_batches, in_columns = self._native_batches(native), True
        numbers: tuple[list[int], ...] = tuple([] for _ in KINDS)
        rows: tuple[list[tuple[object, ...]], ...] = tuple([] for _ in KINDS)
        for batch in batches:
            if isinstance(batch, NativeBatch):
                if in_columns:
                    continue
                try:
                    events = events_of(batch)
                except ValueError as exc:  # broken records: the batch is lost, counted
                    failure = f"{len(batch)} event(s) have no row: {exc}"
                    continue
            else:
                events = batch
            for event in events:
                try:
                    number, values = event
                    kind = values[0]
                    if type(kind) is not int or not 0 <= kind < len(KINDS):
                        raise ValueError(f"no kind {kind!r}")
                except (ValueError, TypeError, IndexError) as exc:  # a bug's event: lose it
                    failure = f"an event has no row: {exc}"
                    continue
                numbers[kind].append(number)
                rows[kind].append(values)
        for kind, kind_rows in enumerate(rows):
            if not kind_rows:
                continue
            try:
                record_batch = self._record_batch(kind, numbers[kind], kind_rows)
            except _ROW_ERRORS as exc:
                record_batch, failure = self._salvage(kind, numbers[kind], kind_rows, f"{exc}")
            if record_batch is not None:
                record_batches.append(record_batch)
        data = b"".join(batch.serialize().to_pybytes() for batch in record_batches)
        return Encoded(data, sum(batch.num_rows for batch in record_batches), failure)

    def _native_batches(self, batches: list[NativeBatch]) -> list[pa.RecordBatch]:
        """The native recorder's records as one record batch per kind, checked whole.

        Raises:
            ValueError: a record is broken.
            pyarrow.ArrowException: a string is not UTF-8.
        """
        made = []
        for kind, decoded in enumerate(columns(batches)):
            if decoded is not None:
                record_batch = self._columns_batch(kind, decoded)
                record_batch.validate(full=True)
                made.append(record_batch)
        return made

    def _columns_batch(self, kind: int, decoded: KindColumns) -> pa.RecordBatch:
        count, numbers, whens, conns, fields = decoded
        taken = []
        for name, (validity, offsets, values) in zip(VALUE_NAMES[kind], fields, strict=True):
            buffers = [_buffer(validity), *([] if offsets is None else [_buffer(offsets)]), _buffer(values)]
            taken.append(pa.Array.from_buffers(ARROW_SCHEMA.field(name).type, count, buffers))
        return self._batch(
            kind,
            count,
            numbers=pa.Array.from_buffers(pa.int64(), count, [None, _buffer(numbers)]),
            whens=pa.Array.from_buffers(pa.float64(), count, [None, _buffer(whens)]),
            conns=pa.Array.from_buffers(pa.int64(), count, [None, _buffer(conns)]),
            taken=taken,
        )

    def _salvage(
        self, kind: int, numbers: list[int], rows: list[tuple[object, ...]], error: str
    ) -> tuple[pa.RecordBatch | None, str]:
        """A batch with an event that has no row (a bug's): the events that have one, one by one."""
        good = []
        for number, values in zip(numbers, rows, strict=True):
            try:
                self._record_batch(kind, [number], [values])
            except _ROW_ERRORS:
                continue
            good.append((number, values))
        failure = f"an event has no row: {error}"
        if not good:
            return None, failure
        return self._record_batch(kind, [n for n, _ in good], [v for _, v in good]), failure

    def _record_batch(self, kind: int, numbers: list[int], rows: list[tuple[object, ...]]) -> pa.RecordBatch:
        values = list(zip(*rows, strict=True))
        taken = [
            pa.array(values[position], ARROW_SCHEMA.field(name).type)
            for position, name in enumerate(VALUE_NAMES[kind], start=VALUE_HEAD)
        ]
        return self._batch(
            kind,
            len(rows),
            numbers=pa.array(numbers, pa.int64()),
            whens=pa.array(values[1], pa.float64()),
            conns=pa.array(values[2], pa.int64()),
            taken=taken,
        )

    def _batch(
        self,
        kind: int,
        count: int,
        *,
        numbers: pa.Array,
        whens: pa.Array,
        conns: pa.Array,
        taken: list[pa.Array],
    ) -> pa.RecordBatch:
        """A kind's record batch from the ring's numbers, the values' head and the values taken
        (`VALUE_NAMES`' order), whichever recorder took them."""
        given: dict[str, pa.Array] = {
            "kind": pa.repeat(pa.scalar(KINDS[kind].KIND, pa.string()), count),
            "router_id": pa.repeat(self._router_id, count),
            "seq": pc.add(numbers, self._base),
            "ts": _timestamps(whens),
            "conn": pc.add(conns, self._base),
        }
        roundings = VALUE_ROUNDINGS[kind]
        named = zip(VALUE_NAMES[kind], taken, strict=True)
        for position, (name, column) in enumerate(named, start=VALUE_HEAD):
            rounding = roundings.get(position)
            given[name] = column if rounding is None else rounded(column, rounding)
        arrays = [given[f.name] if f.name in given else pa.nulls(count, f.type) for f in ARROW_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

    def finish(self, fd: int, target: Path, *, compress: bool, recovering: bool) -> Finished:
        table = read_part(fd)
        if table.num_rows == 0:
            return Finished.EMPTY
        write_parquet(table, target, compress=compress)
        return Finished.WRITTEN


_NEAR_HALF: Final = 2.0**-10
"""`rounded` leaves to `round` a value whose scaled product lies this close to a half."""
_COARSE: Final = 2.0**40
"""`rounded` leaves to `round` a value whose scaled product is this large or larger (its fraction
is too coarse to tell how near a half it is)."""


def rounded(column: Iterable[object] | pa.Array, rounding: Rounding) -> pa.Array:
    """The record's values of a column of values taken (a null stays null), bit for bit as the
    record's code gives them with Python's `round`, a column at a time in C (`round` is a quarter
    of a microsecond per value).

    The scaled value times 10^digits is rounded to a whole number (halves to even) and divided
    back by 10^digits: the nearest float to that decimal, which is what `round` returns. The
    product's own rounding error (half a unit in its last place) can decide the result only when
    the exact product is near a half, so a value whose product is within `_NEAR_HALF` of one, or
    at least `_COARSE` (or infinite), is rounded by `round` itself.

    Raises:
        pyarrow.ArrowException: a value that is not a number (an event with no row).
    """
    taken = column if isinstance(column, pa.Array) else pa.array(column, pa.float64())
    scaled = taken if rounding.scale == 1.0 else pc.multiply(taken, rounding.scale)
    power = 10.0**rounding.digits
    product = pc.multiply(scaled, power)
    whole = pc.round(product, 0, round_mode="half_to_even")
    result = pc.divide(whole, power)
    off_half = pc.abs(pc.subtract(pc.abs(pc.subtract(product, whole)), 0.5))
    slow = pc.fill_null(
        pc.or_(pc.less(off_half, _NEAR_HALF), pc.greater_equal(pc.abs(product), _COARSE)), False
    )
    if not pc.any(slow).as_py():
        return result
    exact = [round(scaled[index].as_py(), rounding.digits) for index in pc.indices_nonzero(slow).to_pylist()]
    return pc.replace_with_mask(result, slow, pa.array(exact, pa.float64()))


def _buffer(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def _timestamps(epoch_s: pa.Array) -> pa.Array:
    """Epoch seconds as `ts`, rounded to the microsecond as `event_format.schema.timestamp` rounds."""
    seconds = pc.floor(epoch_s)
    micros = pc.floor(pc.add(pc.multiply(pc.subtract(epoch_s, seconds), 1e6), 0.5))
    total = pc.add(pc.multiply(seconds.cast(pa.int64()), 1_000_000), micros.cast(pa.int64()))
    return total.cast(pa.timestamp("us", tz="UTC"))


def read_part(fd: int) -> pa.Table:
    """The whole, valid batches of a file in progress, in the schema it was written with: a batch
    cut short or garbled by a crash (a power cut can leave a range of zeros) ends the table; a file
    too short for its schema is an empty table. The file is read into memory: at most `rotate-size`
    and one hand-over (a mapping would turn an I/O error into a signal that kills the writer)."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    try:
        reader = pyarrow.ipc.open_stream(pa.BufferReader(data))
    except (pa.ArrowException, OSError):  # OSError: pyarrow's IOError
        return ARROW_SCHEMA.empty_table()
    batches: list[pa.RecordBatch] = []
    try:
        while True:
            batch = reader.read_next_batch()
            batch.validate(full=True)
            batches.append(batch)
    except StopIteration:
        pass
    except (pa.ArrowException, OSError):  # cut short or garbled: the batches before it
        pass
    return pa.Table.from_batches(batches, schema=reader.schema)


def write_parquet(table: pa.Table, target: Path, *, compress: bool) -> None:
    """A finished event file: `table` (in `ARROW_SCHEMA`) as Parquet at `target`, synced."""
    with target.open("wb") as out:
        pq.write_table(
            table,
            out,
            compression="zstd" if compress else "none",
            row_group_size=ROW_GROUP_ROWS,
        )
        out.flush()
        os.fsync(out.fileno())
