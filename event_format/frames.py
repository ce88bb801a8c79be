"""The frames that carry events from routerd to the event log's writer process, and the native
records they may hold (docs/event-log.md).

A frame is a 4-byte little-endian length, then a format byte and its payload:

* `M`: a `marshal`-ed list of `(number, event_values)` (routerd's Python recorder's);
* `N`: the first event's number and the count (`<qI`), then the records of the native recorder
  (the C extension `event_format._native`, `_native.c`, which also decodes them: as values tuples
  for JSON lines, `events_of`, or straight into Arrow's column layout, `columns`).

The numbers are the ring's, one per event put, so a gap is an event the ring dropped. A native
record, little-endian: u32 length (the whole record) | u8 kind | f64 epoch time | i64 connection
number | each field a tag byte and its value (`_native.c`).

Pure: nothing of `router`; routerd's recorders (`router/features/event_log/recorder.py`) make the
frames, the writer reads them.
"""

from __future__ import annotations

import marshal
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias

from event_format.schema import COLUMN_CODES

try:
    from event_format import _native  # type: ignore[attr-defined]
except ImportError:  # not built: routerd records through its Python recorder
    _native = None

if TYPE_CHECKING:
    from collections.abc import Sequence

    from event_format.schema import EventValues

__all__ = [
    "FRAME_HEAD",
    "FRAME_MAX",
    "NATIVE",
    "NATIVE_RECORDS_MAX",
    "Batch",
    "ColumnBuffers",
    "KindColumns",
    "NativeBatch",
    "columns",
    "decode_frame",
    "encode_frame",
    "events_of",
    "native_frame",
]

NATIVE: Final = _native is not None
"""Whether the C extension (the native recorder and decoder) is built."""
FRAME_HEAD: Final = struct.Struct("<I")
"""A frame's length (of what follows it)."""
FRAME_MAX: Final = 64 * 1024 * 1024
"""The largest frame the writer accepts (a batch is far smaller); a larger length is a broken
stream and ends the writer."""
_VALUES_FORMAT: Final = b"M"
_NATIVE_FORMAT: Final = b"N"
_NATIVE_HEAD: Final = struct.Struct("<qI")
NATIVE_RECORDS_MAX: Final = FRAME_MAX - 1 - _NATIVE_HEAD.size
"""The records of one native frame, in bytes at most (a record is at most 16 MiB, `_native.c`)."""


@dataclass(frozen=True, slots=True)
class NativeBatch:
    """Events as the native recorder sends them: numbers `first`, `first + 1`, ... of `count`
    encoded records."""

    first: int
    count: int
    records: bytes | memoryview
    """The records (a slice of what the writer read)."""

    def __len__(self) -> int:
        return self.count


Batch: TypeAlias = "list[tuple[int, EventValues]] | NativeBatch"
"""Events as routerd sends them: the ring's number of each and its `event_values`, or records."""


def encode_frame(batch: Sequence[tuple[int, EventValues]]) -> bytes:
    """A frame of numbered events' values (the Python recorder's).

    Raises:
        ValueError: a value `marshal` cannot write.
    """
    data = _VALUES_FORMAT + marshal.dumps(list(batch))
    return FRAME_HEAD.pack(len(data)) + data


def native_frame(first: int, count: int, records: bytes) -> bytes:
    """A frame of `count` native records (at most `NATIVE_RECORDS_MAX` bytes of them) numbered from
    `first` (the native recorder's)."""
    head = FRAME_HEAD.pack(1 + _NATIVE_HEAD.size + len(records)) + _NATIVE_FORMAT
    return b"".join((head, _NATIVE_HEAD.pack(first, count), records))


def decode_frame(payload: bytes | memoryview) -> Batch:
    """The events of a frame's payload (what follows its length).

    Raises:
        ValueError: not a frame of either format (the stream is broken); a native batch's records
            are checked when they are decoded (`events_of`, `columns`).
    """
    form, body = payload[:1], payload[1:]
    if form == _NATIVE_FORMAT:
        if len(body) < _NATIVE_HEAD.size:
            raise ValueError(f"a native frame of {len(payload)} bytes")
        first, count = _NATIVE_HEAD.unpack_from(body)
        return NativeBatch(first, count, body[_NATIVE_HEAD.size :])
    if form == _VALUES_FORMAT:
        try:
            batch = marshal.loads(body)
        except (EOFError, TypeError, ValueError) as exc:
            raise ValueError(f"a frame marshal cannot read: {exc}") from exc
        if not isinstance(batch, list):
            raise ValueError(f"a frame of {type(batch).__name__}, not a list of events")
        return batch
    raise ValueError(f"a frame of format {bytes(form)!r} (M or N)")


def events_of(batch: Batch) -> list[tuple[int, EventValues]]:
    """A batch's numbered `event_values`.

    Raises:
        ValueError: a native batch's records are broken (none of them is read).
    """
    if isinstance(batch, NativeBatch):
        if _native is None:
            raise ValueError("native records, but the native recorder is not built here")
        rows: list[tuple[int, EventValues]]
        rows = _native.rows(batch.first, batch.count, batch.records, COLUMN_CODES)
        return rows
    return batch


ColumnBuffers: TypeAlias = tuple[bytes | None, bytes | None, bytes]
"""One column in Arrow's layout: its validity bitmap (None: no null), its offsets (strings), its
values."""
KindColumns: TypeAlias = tuple[int, bytes, bytes, bytes, list[ColumnBuffers]]
"""One kind's events as columns: how many, their numbers (int64), epoch times (double),
connection numbers (int64), and one `ColumnBuffers` per `VALUE_NAMES` field."""


def columns(batches: Sequence[NativeBatch]) -> tuple[KindColumns | None, ...]:
    """The records of native batches as columns, per kind (None: no event of that kind).

    Raises:
        ValueError: a record is broken (none is read).
    """
    assert _native is not None, "native batches come from a routerd with the native recorder"
    frames = [(batch.first, batch.count, batch.records) for batch in batches]
    result: tuple[KindColumns | None, ...] = _native.columns(frames, COLUMN_CODES)
    return result
