"""The event log's recorders: what a reporting thread does with a decision or a close, and the
frames that carry the events to the writer process (`event_format.frames`, docs/event-log.md).

A recorder puts each logged event into the bounded ring at once and hands the ring's oldest events
over as one frame. There are two, with one interface (`Recorder`):

* `NativeRecorder`, the C extension `event_format._native` (`event_format/_native.c`, built by
  `pip install`): it reads the event's slots in C and appends one encoded record to a ring of
  records, and the writer process decodes the records straight into Arrow's column layout. What it
  takes, field by field, is its program (`event_format/_native_program.h`), generated from the same
  table as `event_values` (`sources.py`), which gives the same values (a test checks it on every
  kind and key type).
* `ValuesRecorder`, pure Python, used when the extension is not built (an install without a C
  compiler): `event_values` tuples in a `ring.Ring`, sent `marshal`-ed. It costs the routing
  thread a few microseconds more per event.

Both rings have the same semantics (seed 001's ring queue; `ring.py`): a fixed size, the oldest
event dropped and counted when full, numbers counting every put, a resize taking effect as the
ring drains.

Pure: no I/O, no clock (the clock is the event log's, given), no logging; linted as pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from event_format.frames import NATIVE, NATIVE_RECORDS_MAX, encode_frame, native_frame
from keys import KeyType
from router.core.events import ConnectionRef
from router.features.event_log.records import RECORDER_EVENT_TYPES, RECORDER_IDENTITIES, VALUE_MAKERS
from router.features.event_log.ring import Ring
from router.features.event_log.sources import RAW_KEY_OF

if NATIVE:
    from event_format import _native  # type: ignore[attr-defined]

if TYPE_CHECKING:
    from collections.abc import Callable

    from event_format.schema import EventValues
    from router.core.events import Event

__all__ = [
    "DEFAULT_KEY_TYPE",
    "NATIVE",
    "FrameError",
    "NativeRecorder",
    "Recorder",
    "ValuesRecorder",
    "make_recorder",
]

DEFAULT_KEY_TYPE: Final = KeyType.SOURCE_IP
"""The raw key's type of a connection whose router the event log does not know (none: a bug's)."""


class FrameError(Exception):
    """Events were taken from the ring but cannot be sent (a value `marshal` cannot write: a bug's)."""

    def __init__(self, events: int, why: str) -> None:
        super().__init__(f"they cannot be sent ({why})")
        self.events = events


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
        assert NATIVE, "the C extension is built"
        self._ring = _native.Recorder(
            size=size,
            event_types=RECORDER_EVENT_TYPES,
            identities=RECORDER_IDENTITIES,
            ref_type=ConnectionRef,
            key_types=key_types,
            default_key_type=DEFAULT_KEY_TYPE,
            raw_of=RAW_KEY_OF,
            clock=clock,
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
        first, count, records = self._ring.take(most, NATIVE_RECORDS_MAX)
        if not count:
            return b"", 0
        return native_frame(first, count, records), count

    def discard(self, most: int) -> int:
        return int(self._ring.take(most, NATIVE_RECORDS_MAX)[1])


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
