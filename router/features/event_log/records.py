"""How routerd takes the event log's records from its connection events: a `Decided` or a `Closed`
becomes its values (`event_values`, what the event log sends its writer) or its record
(`record_of`); the records themselves, their fields and their lines are the event files' format
(`event_format`).

Where each field comes from is stated once, in the table of `sources.py`; the code that takes it
is generated from that table ahead of time by `python -m tools.generate`: the Python here
(`_generated_records.py`) and the native recorder's program in C
(`event_format/_native_program.h`), so the two recorders take the same values (a test checks it
on every kind and key type).

Re-exported from the generated module: `VALUE_MAKERS` (per logged event type, what takes its values
as `event_values` does: a subscriber looks its event's type up once, and other events are not in
it), and what `NativeRecorder` gives the C recorder besides its program, in its order:
`RECORDER_EVENT_TYPES` and `RECORDER_IDENTITIES` (what its identity tests compare with).

Pure: no I/O, no clock (the time is an argument), no logging. The event log (`service.py`) takes
a connection's event's values at once, in C or without the C extension by `event_values`; its
writer process encodes them (`event_format.lines.values_line`, `event_format.parquet`), out of the
routing process. `record_of` makes the record itself, which
`event_format.lines.json_line` writes as the same line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.features.event_log._generated_records import RECORD_MAKERS
from router.features.event_log._generated_records import RECORDER_EVENT_TYPES as RECORDER_EVENT_TYPES
from router.features.event_log._generated_records import RECORDER_IDENTITIES as RECORDER_IDENTITIES
from router.features.event_log._generated_records import VALUE_MAKERS as VALUE_MAKERS

if TYPE_CHECKING:
    from event_format.schema import EventValues, Record, Timestamp
    from keys import KeyType
    from router.core.events import Closed, Decided

__all__ = [
    "RECORDER_EVENT_TYPES",
    "RECORDER_IDENTITIES",
    "VALUE_MAKERS",
    "event_values",
    "record_of",
]


def record_of(
    event: Decided | Closed, *, router_id: str, seq: int, conn: int, ts: Timestamp, key_type: KeyType
) -> Record:
    """The record of a connection's event."""
    return RECORD_MAKERS[type(event)](event, router_id, seq, conn, ts, key_type)


def event_values(event: Decided | Closed, key_type: KeyType, when: float) -> EventValues:
    """What the line of a connection's event will say, taken at once in the reporting thread: a
    flat tuple of strings, numbers, booleans and None (`marshal` sends it to the writer process);
    `when` is the epoch time of the line's `ts`."""
    return VALUE_MAKERS[type(event)](event, key_type, when)
