"""The event files' records: what one record of an event file says (a Parquet row or a JSON line),
one frozen dataclass per kind, and the one field list the writer's Arrow schema
(`event_format.parquet`) and the PySpark pipeline's schema (`pipeline/schema.py`) come from, so a
field is declared once.

Every record carries `kind`, `router_id`, `seq` and `ts`. (`router_id`, `seq`) identifies an event:
`seq` is unique per router id across restarts (`Sequence`), so the same line shipped twice, or a
log replayed after a failover, is recognised as a duplicate. `conn` links a connection's decision
and close lines (unique per router id the same way).

Between routerd and its writer process an event travels as its values (`EventValues`: the kind,
the time, the connection's process-local number, then the kind's own fields in `VALUE_NAMES`'
order); the writer adds the router id and the numbers, and rounds what `ROUNDINGS` names, so the
routing thread never pays for either. Which value of a routerd event each field is taken from is
routerd's business (`router/features/event_log/sources.py`).

Pure: no I/O, no clock (the time is a field), no logging, nothing of `router`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias

__all__ = [
    "BOOT_SPAN",
    "COLUMN_CODES",
    "FIELDS",
    "KINDS",
    "RAW_KEY_CAP",
    "ROUNDINGS",
    "VALUE_HEAD",
    "VALUE_NAMES",
    "VALUE_ROUNDINGS",
    "WRITER_FIELDS",
    "CloseRecord",
    "DecisionRecord",
    "EventRecord",
    "EventValues",
    "Field",
    "FieldType",
    "Record",
    "Rounding",
    "Sequence",
    "Timestamp",
    "timestamp",
    "value_names",
]

RAW_KEY_CAP: Final = 256
"""Characters of the raw key a decision line keeps (`raw_key_length` is the whole length); the key
after filter and transform is kept whole (at most `<key-max-length>`)."""

BOOT_SPAN: Final = 10**6
"""`seq` and `conn` are `boot * BOOT_SPAN + n`, `boot` the start of the process in epoch
milliseconds: unique per router id across restarts as long as a process writes fewer than a
million events per millisecond it ran, and the clock does not go back across a restart (the writer
also keeps the last boot in its directory and starts above it)."""

EventValues: TypeAlias = tuple[Any, ...]
"""An event's values: the kind's index in `KINDS`, the epoch time, the connection's process-local
number, then the kind's fields in declaration order without the writer's own (`WRITER_FIELDS`):
`VALUE_NAMES`."""
VALUE_HEAD: Final = 3
"""The values before the kind's fields: the kind's index, the epoch time, the connection's number."""

Timestamp: TypeAlias = str
"""ISO-8601 UTC with microseconds, `2026-11-23T10:00:00.123456Z`; a timestamp column in Spark."""


class FieldType(enum.Enum):
    """The type of a record field, as the pipeline's schema knows it."""

    STRING = "string"
    LONG = "long"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"


_TYPES: Final = {
    "str": FieldType.STRING,
    "int": FieldType.LONG,
    "float": FieldType.DOUBLE,
    "bool": FieldType.BOOLEAN,
    "Timestamp": FieldType.TIMESTAMP,
}
"""Annotation (as written in this module) -> field type; a test checks every field maps."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    """What every line says: which event of which router, and when."""

    KIND: ClassVar[str] = ""

    router_id: str
    """The routing process (`<event-log><router-id>`; default: host name and acceptor names)."""
    seq: int
    """Unique per router id across restarts; increasing within one process. A gap means events
    dropped by a full ring (counted by `router_event_log_dropped_total`)."""
    ts: Timestamp
    conn: int
    """The connection (unique per router id, like `seq`): joins its decision and close lines."""
    router: str
    """The connection router (`<connection-router name>`)."""
    acceptor: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord(EventRecord):
    """A routing decision: which target a connection got, how, and what the router did with it."""

    KIND: ClassVar[str] = "decision"

    source: str
    """The client's address (behind a PROXY protocol header, the one it names)."""
    protocol: str | None
    """The client's protocol (`WireProtocol`: mqtt, amqp, stomp, openwire, ...), or None when its
    opening was not read."""
    key_type: str
    raw_key: str | None
    """The key's value before filter and transform, cut at `RAW_KEY_CAP` characters; None when the
    connection has none. ROLE_NAME: the user's roles, comma-separated."""
    raw_key_length: int
    key: str
    """After filter and transform; `NULL` when missing."""
    status: str
    """OK, REFUSED_USE_ANOTHER or REFUSED_UNAVAILABLE."""
    reason: str
    """Which workflow step decided (`DecisionReason`): cache, policy, no ready target, ..."""
    mode: str
    """proxy, redirect or refuse."""
    node_id: str | None
    local: bool
    cache_hit: bool
    latency_us: float
    """From the complete opening to the decision (a quorum wait included)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseRecord(EventRecord):
    """The end of a proxied connection."""

    KIND: ClassVar[str] = "close"

    node_id: str
    """The target the connection reached (after a redispatch, the second one)."""
    duration_s: float
    bytes_in: int
    """Client -> target."""
    bytes_out: int
    """Target -> client."""
    reason: str
    """`CloseReason`: closed, reset, connection_ttl, target_not_ready, failover, shutdown, ..."""


Record: TypeAlias = DecisionRecord | CloseRecord

KINDS: Final[tuple[type[DecisionRecord] | type[CloseRecord], ...]] = (DecisionRecord, CloseRecord)
"""The kinds, in the order of their index (an event's first value, a native record's kind byte)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One column of the event table."""

    name: str
    type: FieldType
    nullable: bool
    kinds: tuple[str, ...]
    """The kinds whose lines have it."""


def _fields() -> tuple[Field, ...]:
    """`kind`, then every field of every kind once, in declaration order."""
    seen: dict[str, Field] = {"kind": Field("kind", FieldType.STRING, False, tuple(k.KIND for k in KINDS))}
    for kind in KINDS:
        for field in dataclasses.fields(kind):
            annotation = str(field.type)
            nullable = annotation.endswith(" | None")
            base = annotation.removesuffix(" | None")
            if base not in _TYPES:
                raise TypeError(f"{kind.__name__}.{field.name}: no field type for {annotation!r}")
            known = seen.get(field.name)
            if known is None:
                seen[field.name] = Field(field.name, _TYPES[base], nullable, (kind.KIND,))
            elif known.type is not _TYPES[base]:
                raise TypeError(f"{kind.__name__}.{field.name}: {base} here, {known.type.value} elsewhere")
            else:
                seen[field.name] = Field(
                    field.name, known.type, known.nullable or nullable, (*known.kinds, kind.KIND)
                )
    return tuple(seen.values())


FIELDS: Final = _fields()
"""Every column of the event table: the pipeline's schema is made from this list."""


def timestamp(epoch_s: float) -> Timestamp:
    """An epoch time as the `ts` of a line (UTC, microseconds)."""
    seconds = int(epoch_s)
    micros = int((epoch_s - seconds) * 1_000_000 + 0.5)
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    return f"{_second(seconds)}.{micros:06d}Z"


@functools.lru_cache(maxsize=64)
def _second(seconds: int) -> str:
    """A whole second formatted (no clock is read); events come in time order, so few distinct."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


class Sequence:
    """The `seq` (and `conn`) numbers of one process: `boot * BOOT_SPAN + n`. Not thread-safe by
    itself (the ring takes them under its lock)."""

    __slots__ = ("_base", "_next")

    def __init__(self, boot_ms: int) -> None:
        """Numbers of a process that started at `boot_ms` (epoch milliseconds)."""
        if boot_ms < 0:
            raise ValueError(f"a boot time is epoch milliseconds >= 0, got {boot_ms}")
        self._base = boot_ms * BOOT_SPAN
        self._next = 0

    def take(self) -> int:
        """The next number."""
        n = self._next
        self._next = n + 1
        return self._base + n

    def of(self, n: int) -> int:
        """Process-local number `n` (a connection id) as a number unique per router id."""
        return self._base + n


# -- an event's values, as routerd takes them and its writer receives them ----------------------


@dataclass(frozen=True, slots=True)
class Rounding:
    """How a field's record value is made from the value taken: `round(value * scale, digits)`,
    Python's `round` (the decimal of that many digits nearest to the exact binary value, halves to
    even, as the nearest float)."""

    scale: float
    digits: int

    def expression(self, taken: str) -> str:
        """The Python expression of the record's value, given the expression of the value taken
        (what the generated code runs, `tools/generate.py`)."""
        scaled = f"({taken})" if self.scale == 1.0 else f"({taken}) * {self.scale!r}"
        return f"round({scaled}, {self.digits})"


ROUNDINGS: Final[dict[str, Rounding]] = {
    "latency_us": Rounding(1e6, 1),
    "duration_s": Rounding(1.0, 6),
}
"""A record's value of these fields from the value taken: the decision's latency in µs to a tenth,
the close's duration in seconds to the microsecond. The value is taken as it is and made the
record's value by the writer: rounding a float to some digits costs a quarter of a microsecond,
which the routing thread does not pay."""

WRITER_FIELDS: Final = ("router_id", "seq", "ts", "conn")
"""What the writer process adds to an event's values: the router id, the numbers, the time."""


def value_names(kind: type[EventRecord]) -> tuple[str, ...]:
    """A kind's fields in an event's values (after the `VALUE_HEAD`), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(kind) if f.name not in WRITER_FIELDS)


VALUE_NAMES: Final = tuple(value_names(kind) for kind in KINDS)
"""Per kind (its index in `KINDS`): the names of its fields in an event's values, after the
`VALUE_HEAD`; the Parquet writer makes its columns from them (a value of a field in
`VALUE_ROUNDINGS` is rounded as it says)."""

VALUE_ROUNDINGS: Final = tuple(
    {
        position: ROUNDINGS[name]
        for position, name in enumerate(value_names(kind), start=VALUE_HEAD)
        if name in ROUNDINGS
    }
    for kind in KINDS
)
"""Per kind: position in an event's values -> how the value taken is made the record's (the
decision's latency in µs, the close's duration): the writer applies it, a whole column at a time
in the Parquet writer (`event_format.parquet.rounded`), exactly as the record's and the line's
code do."""

_COLUMN_CODE: Final = {
    FieldType.STRING: "s",
    FieldType.LONG: "q",
    FieldType.DOUBLE: "d",
    FieldType.BOOLEAN: "b",
}
_FIELD_TYPES: Final = {f.name: f.type for f in FIELDS}
COLUMN_CODES: Final = tuple(
    "".join(_COLUMN_CODE[_FIELD_TYPES[name]] for name in names).encode() for names in VALUE_NAMES
)
"""Per kind: the column type of each of its values after the `VALUE_HEAD` (s string, q int64,
d double, b boolean), as the native decoder builds the columns."""
