"""The event log's recorders: what a reporting thread does with a decision or a close, and the
frames that carry the events to the writer process (docs/event-log.md).

A recorder puts each logged event into the bounded ring at once and hands the ring's oldest events
over as one frame. There are two, with one interface (`Recorder`):

* `NativeRecorder`, the C extension `router.services._event_recorder` (`event_recorder.c`, built
  by `pip install`): it reads the event's slots in C and appends one encoded record to a ring of
  records, and the writer process decodes the records straight into Arrow's column layout. What it
  takes, field by field, is `event_records.RECORDER_PROGRAMS`, compiled from the same table as
  `event_values`, which gives the same values (a test checks it on every kind and key type).
* `ValuesRecorder`, pure Python, used when the extension is not built (an install without a C
  compiler): `event_values` tuples in a `router.core.ring.Ring`, sent `marshal`-ed. It costs the
  routing thread a few microseconds more per event.

Both rings have the same semantics (seed 001's ring queue; `router/core/ring.py`): a fixed size,
the oldest event dropped and counted when full, numbers counting every put, a resize taking effect
as the ring drains.

A frame is a 4-byte little-endian length, then a format byte and its payload:

* `M`: a `marshal`-ed list of `(number, event_values)`;
* `N`: the first event's number and the count (`<qI`), then the records (`event_recorder.c`).
"""

from __future__ import annotations

import marshal
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

from keys import KeyType
from router.core.event_records import COLUMN_CODES, RAW_KEY_CAP, RAW_KEY_OF, RECORDER_PROGRAMS, VALUE_MAKERS
from router.core.events import ConnectionRef
from router.core.ring import Ring

try:
    from router.services import _event_recorder as _native  # type: ignore[attr-defined]
except ImportError:  # not built: the Python recorder
    _native = None

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from router.core.event_records import EventValues
    from router.core.events import Event

__all__ = [
    "DEFAULT_KEY_TYPE",
    "FRAME_HEAD",
    "FRAME_MAX",
    "NATIVE",
    "Batch",
    "FrameError",
    "NativeBatch",
    "NativeRecorder",
    "Recorder",
    "ValuesRecorder",
    "columns",
    "decode_frame",
    "encode_frame",
    "events_of",
    "make_recorder",
]

NATIVE: Final = _native is not None
"""Whether the native recorder is built."""
DEFAULT_KEY_TYPE: Final = KeyType.SOURCE_IP
"""The raw key's type of a connection whose router the event log does not know (none: a bug's)."""
FRAME_HEAD: Final = struct.Struct("<I")
"""A frame's length (of what follows it)."""
FRAME_MAX: Final = 64 * 1024 * 1024
"""The largest frame the writer accepts (a batch is far smaller); a larger length is a broken
stream and ends the writer."""
_VALUES_FORMAT: Final = b"M"
_NATIVE_FORMAT: Final = b"N"
_NATIVE_HEAD: Final = struct.Struct("<qI")
_NATIVE_RECORDS_MAX: Final = FRAME_MAX - 1 - _NATIVE_HEAD.size
"""The records of one native frame, in bytes at most (a record is at most 16 MiB, event_recorder.c)."""


class FrameError(Exception):
    """Events were taken from the ring but cannot be sent (a value `marshal` cannot write: a bug's)."""

    def __init__(self, events: int, why: str) -> None:
        super().__init__(f"they cannot be sent ({why})")
        self.events = events


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


class Recorder(Protocol):
    """A ring of logged events and how they leave it."""

    @property
    def name(self) -> str:
        """`native` or `python` (the admin API and the start line say which)."""

    @property
    def size(self) -> int:
        """The ring size in force."""

    @property
    def puts(self) -> int:
        """Events recorded, dropped ones included."""

    @property
    def dropped(self) -> int:
        """Events the full ring dropped."""

    def __len__(self) -> int:
        """Events in the ring."""

    def record(self, event: Event) -> int:
        """Put a decision's or a close's record into the ring: how many events it holds then; -1
        for an event that is not logged (nothing happens).

        Raises:
            Exception: a value of the wrong type (a bug's): nothing was put.
        """

    def resize(self, size: int) -> None:
        """Change the ring size (it takes effect as the ring drains).

        Raises:
            ValueError: `size` < 1.
        """

    def take_frame(self, most: int) -> tuple[bytes, int]:
        """Remove up to `most` of the oldest events: a frame of them and how many (`b""`, 0 when
        the ring is empty).

        Raises:
            FrameError: they were taken but cannot be sent.
        """

    def discard(self, most: int) -> int:
        """Remove up to `most` of the oldest events: how many."""


class NativeRecorder:
    """The C recorder (module docstring)."""

    name: Final = "native"

    def __init__(self, size: int, key_types: dict[str, KeyType], clock: Callable[[], float]) -> None:
        """A ring of `size` (>= 1); `key_types` (router name -> key type, read at each decision,
        so the caller's changes count) and `clock` (epoch seconds) as the event log's.

        Raises:
            ValueError: `size` < 1.
        """
        assert _native is not None, "NATIVE"
        self._ring = _native.Recorder(
            size=size,
            programs=RECORDER_PROGRAMS,
            ref_type=ConnectionRef,
            key_types=key_types,
            default_key_type=DEFAULT_KEY_TYPE,
            raw_of=RAW_KEY_OF,
            clock=clock,
            raw_cap=RAW_KEY_CAP,
        )
        self.record: Callable[[Event], int] = self._ring.record
        """The C method itself: the reporting threads call it for every event."""

    @property
    def size(self) -> int:
        return int(self._ring.size)

    @property
    def puts(self) -> int:
        return int(self._ring.puts)

    @property
    def dropped(self) -> int:
        return int(self._ring.dropped)

    def __len__(self) -> int:
        return len(self._ring)

    def resize(self, size: int) -> None:
        self._ring.resize(size)

    def take_frame(self, most: int) -> tuple[bytes, int]:
        first, count, records = self._ring.take(most, _NATIVE_RECORDS_MAX)
        if not count:
            return b"", 0
        head = FRAME_HEAD.pack(1 + _NATIVE_HEAD.size + len(records)) + _NATIVE_FORMAT
        return b"".join((head, _NATIVE_HEAD.pack(first, count), records)), count

    def discard(self, most: int) -> int:
        return int(self._ring.take(most, _NATIVE_RECORDS_MAX)[1])


class ValuesRecorder:
    """The Python recorder (module docstring)."""

    name: Final = "python"

    def __init__(self, size: int, key_types: dict[str, KeyType], clock: Callable[[], float]) -> None:
        """As `NativeRecorder`.

        Raises:
            ValueError: `size` < 1.
        """
        self._ring: Ring[EventValues] = Ring(size)
        self._key_types = key_types
        self._clock = clock

    @property
    def size(self) -> int:
        return self._ring.size

    @property
    def puts(self) -> int:
        return self._ring.puts

    @property
    def dropped(self) -> int:
        return self._ring.dropped

    def __len__(self) -> int:
        return len(self._ring)

    def record(self, event: Event) -> int:
        make = VALUE_MAKERS.get(type(event))
        if make is None:
            return -1
        key_type = self._key_types.get(event.conn.router, DEFAULT_KEY_TYPE)  # type: ignore[union-attr]
        return self._ring.put(make(event, key_type, self._clock()))

    def resize(self, size: int) -> None:
        self._ring.resize(size)

    def take_frame(self, most: int) -> tuple[bytes, int]:
        batch = self._ring.take(most)
        if not batch:
            return b"", 0
        try:
            return encode_frame(batch), len(batch)
        except Exception as exc:
            raise FrameError(len(batch), str(exc)) from exc

    def discard(self, most: int) -> int:
        return len(self._ring.take(most))


def make_recorder(
    size: int, key_types: dict[str, KeyType], clock: Callable[[], float], *, native: bool = NATIVE
) -> Recorder:
    """The native recorder when it is built (and `native`), else the Python one.

    Raises:
        ValueError: `size` < 1.
    """
    if native and NATIVE:
        return NativeRecorder(size, key_types, clock)
    return ValuesRecorder(size, key_types, clock)


def encode_frame(batch: Sequence[tuple[int, EventValues]]) -> bytes:
    """A frame of numbered events' values (the Python recorder's).

    Raises:
        ValueError: a value `marshal` cannot write.
    """
    data = _VALUES_FORMAT + marshal.dumps(list(batch))
    return FRAME_HEAD.pack(len(data)) + data


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
