"""The routing event log's records: what one record of an event file says (a Parquet row or a JSON
line), one frozen dataclass per kind, and the one field list the writer's Arrow schema and the
PySpark pipeline's schema come from.

Pure: no I/O, no clock (the time is a field), no logging. The event log
(`router/services/event_log.py`) takes a connection's event's values at once: in C, by the program
compiled here from the same table (`RECORDER_PROGRAMS`, `router/services/event_recorder.c`), or
without the C extension by `event_values`; its writer process encodes them: as a JSON line
(`values_line`: `json_line(record_of(event, ...))` without the record in between), or as columns
(`router/services/event_parquet.py`, by `VALUE_NAMES`), out of the routing process. The pipeline
(`pipeline/schema.py`) derives its Spark schema from `FIELDS`, so a field is declared once.

Every record carries `kind`, `router_id`, `seq` and `ts`. (`router_id`, `seq`) identifies an event:
`seq` is unique per router id across restarts (`Sequence`), so the same line shipped twice, or a
log replayed after a failover, is recognised as a duplicate. `conn` links a connection's decision
and close lines (unique per router id the same way).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias

from keys import KeyType
from keys.resolve import RAW_VALUE_OF
from router.core.address import Address
from router.core.engine import DecisionReason
from router.core.events import Closed, Decided
from router.core.records import quick_init

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import ConnectionFacts

__all__ = [
    "BOOT_SPAN",
    "COLUMN_CODES",
    "FIELDS",
    "KINDS",
    "RAW_KEY_CAP",
    "RAW_KEY_OF",
    "RECORDER_PROGRAMS",
    "VALUE_HEAD",
    "VALUE_MAKERS",
    "VALUE_NAMES",
    "VALUE_ROUNDINGS",
    "CloseRecord",
    "DecisionRecord",
    "EventRecord",
    "EventValues",
    "Field",
    "FieldType",
    "Record",
    "RecorderProgram",
    "RecorderStep",
    "Rounding",
    "Sequence",
    "event_values",
    "json_line",
    "raw_key",
    "record_of",
    "timestamp",
    "values_line",
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
"""An event's values (`event_values`): the kind's index in `KINDS`, the epoch time, the connection's
process-local number, then the kind's fields in declaration order without the writer's own
(`router_id`, `seq`, `ts`, `conn`): `VALUE_NAMES`."""
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


@quick_init
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


@quick_init
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


def raw_key(key_type: KeyType, decided: Decided) -> str | None:
    """The value a decision's key came from, before filter and transform (ROLE_NAME: the roles,
    comma-separated)."""
    facts = decided.facts
    return None if facts is None else RAW_KEY_OF[key_type](facts)


def _roles(facts: ConnectionFacts) -> str | None:
    return ",".join(facts.roles) or None


RAW_KEY_OF: Final[dict[KeyType, Callable[[ConnectionFacts], str | None]]] = {
    key_type: _roles if key_type is KeyType.ROLE_NAME else value_of  # type: ignore[misc]  # one fact, a string
    for key_type, value_of in RAW_VALUE_OF.items()
}
"""Key type -> the raw key's getter (`ConnectionFacts` -> str | None): `raw_key`'s, and the native
recorder's."""


# -- where each field's value comes from, once per kind ----------------------------------------
#
# A record is made from a connection's event (`record_of`); the event log takes the same values
# from the event as a flat tuple (`event_values`) and its writer process writes the line from the
# tuple (`values_line`), without the record in between. All three are generated, as `quick_init`
# generates `__init__`, from one table per kind: field -> a Python expression over the event `e`,
# its reference `ref`, the decision's raw key `raw`, and the arguments `router_id`, `seq`, `conn`,
# `ts`, `key_type`. Enum values are read as `_value_` (the `value` property is a Python-level
# call). A test checks the line from the values is the record's line on every kind.
#
# A field in `_FINISHED` is taken as it is and made the record's value by the writer: rounding a
# float to some digits costs a quarter of a microsecond, which the routing thread does not pay.

_REF_SLOT: Final = "conn"
"""The event's slot of its `ConnectionRef` (`ref`)."""
_PRELUDE: Final[dict[str, str]] = {
    "decision": f"ref = e.{_REF_SLOT}\n    raw = raw_key(key_type, e)",
    "close": f"ref = e.{_REF_SLOT}",
}
_COMMON: Final[dict[str, str]] = {
    "router_id": "router_id",
    "seq": "seq",
    "ts": "ts",
    "conn": "conn",
    "router": "ref.router",
    "acceptor": "ref.acceptor",
}
_VALUES: Final[dict[str, dict[str, str]]] = {
    "decision": _COMMON
    | {
        "source": "(ref.peer if e.source is None else e.source).host",
        "protocol": "None if e.protocol is None else e.protocol._value_",
        "key_type": "key_type._value_",
        "raw_key": "None if raw is None else raw[:RAW_KEY_CAP]",
        "raw_key_length": "0 if raw is None else len(raw)",
        "key": "e.key",
        "status": "e.status._value_",
        "reason": "e.reason._value_",
        "mode": "e.mode._value_",
        "node_id": "e.node_id",
        "local": "e.local",
        "cache_hit": "e.reason is _CACHE",
        "latency_us": "e.latency_s",
    },
    "close": _COMMON
    | {
        "node_id": "e.node_id",
        "duration_s": "e.duration_s",
        "bytes_in": "e.bytes_in",
        "bytes_out": "e.bytes_out",
        "reason": "e.reason._value_",
    },
}


@dataclass(frozen=True, slots=True)
class Rounding:
    """How a field's record value is made from the value taken: `round(value * scale, digits)`,
    Python's `round` (the decimal of that many digits nearest to the exact binary value, halves to
    even, as the nearest float)."""

    scale: float
    digits: int

    def expression(self, taken: str) -> str:
        """The Python expression of the record's value, given the expression of the value taken."""
        scaled = f"({taken})" if self.scale == 1.0 else f"({taken}) * {self.scale!r}"
        return f"round({scaled}, {self.digits})"


_FINISHED: Final[dict[str, Rounding]] = {
    "latency_us": Rounding(1e6, 1),
    "duration_s": Rounding(1.0, 6),
}
"""A record's value of these fields from the value taken: the decision's latency in µs to a tenth,
the close's duration in seconds to the microsecond."""


def _finished(name: str, taken: str) -> str:
    """The expression of a field's record value from the expression of the value taken."""
    rounding = _FINISHED.get(name)
    return taken if rounding is None else rounding.expression(taken)


_CHARS: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii
"""JSON's string encoder in C: quotes, escapes every control and non-ASCII character."""


def _string_or_null(value: str | None) -> str:
    return "null" if value is None else _CHARS(value)


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"a record field must be a finite number, got {value!r}")
    return float.__repr__(value)


_FORMATS: Final[dict[str, str]] = {
    "str": "_CHARS({v})",
    "Timestamp": "_CHARS({v})",
    "str | None": "_string_or_null({v})",
    "int": "{v}",
    "float": "_number({v})",
    "bool": "_BOOLEANS[{v}]",
}
"""How a value of each annotation is written into an f-string: the JSON text of `{v}`."""

_NAMESPACE: Final[dict[str, object]] = {
    "_CHARS": _CHARS,
    "_string_or_null": _string_or_null,
    "_number": _number,
    "_BOOLEANS": ("false", "true"),
    "_CACHE": DecisionReason.CACHE,
    "RAW_KEY_CAP": RAW_KEY_CAP,
    "raw_key": raw_key,
}


def _generated(name: str, source: str, **more: object) -> Callable[..., object]:
    namespace = {**_NAMESPACE, **more}
    exec(source, namespace)
    function = namespace[name]
    assert callable(function)
    return function


def _line_source(kind: type[EventRecord], value: Callable[[str], str]) -> str:
    """The f-string of one kind's line: `kind` first, then the fields in order; `value(name)`
    is where a field's value is."""
    text = ['f\'{{"kind":' + json.dumps(kind.KIND)]
    for field in dataclasses.fields(kind):
        text.append(f',"{field.name}":' + "{" + _FORMATS[str(field.type)].format(v=value(field.name)) + "}")
    return "".join(text) + "}}\\n'"


_ARGUMENTS: Final = "e, router_id, seq, conn, ts, key_type"


def _record_maker(kind: type[EventRecord]) -> Callable[..., Record]:
    values = _VALUES[kind.KIND]
    fields = ", ".join(f"{f.name}={_finished(f.name, values[f.name])}" for f in dataclasses.fields(kind))
    source = f"def make({_ARGUMENTS}):\n    {_PRELUDE[kind.KIND]}\n    return Kind({fields})\n"
    return _generated("make", source, Kind=kind)  # type: ignore[return-value]


_WRITER_FIELDS: Final = ("router_id", "seq", "ts", "conn")
"""What the writer process adds to an event's values: the router id, the numbers, the time."""


def _value_names(kind: type[EventRecord]) -> list[str]:
    return [f.name for f in dataclasses.fields(kind) if f.name not in _WRITER_FIELDS]


def _values_maker(kind: type[EventRecord]) -> Callable[..., EventValues]:
    values = _VALUES[kind.KIND]
    items = "".join(f", {values[name]}" for name in _value_names(kind))
    code = KINDS.index(kind)
    body = f"{_PRELUDE[kind.KIND]}\n    return ({code}, when, ref.id{items})"
    source = f"def values(e, key_type, when):\n    {body}\n"
    return _generated("values", source)  # type: ignore[return-value]


def _values_writer(kind: type[EventRecord]) -> Callable[..., str]:
    position = {name: index for index, name in enumerate(_value_names(kind), start=VALUE_HEAD)}
    line = _line_source(
        kind, lambda name: name if name in _WRITER_FIELDS else _finished(name, f"v[{position[name]}]")
    )
    source = f"def write(v, router_id, seq, conn, ts):\n    return {line}\n"
    return _generated("write", source)  # type: ignore[return-value]


def _record_writer(kind: type[EventRecord]) -> Callable[[Record], str]:
    source = f"def write(r):\n    return {_line_source(kind, lambda name: f'r.{name}')}\n"
    return _generated("write", source)  # type: ignore[return-value]


VALUE_NAMES: Final = tuple(tuple(_value_names(kind)) for kind in KINDS)
"""Per kind (its index in `KINDS`): the names of its fields in an event's values, after the
`VALUE_HEAD`; the Parquet writer makes its columns from them (a value of a field in
`VALUE_ROUNDINGS` is rounded as it says)."""

VALUE_ROUNDINGS: Final = tuple(
    {
        position: _FINISHED[name]
        for position, name in enumerate(_value_names(kind), start=VALUE_HEAD)
        if name in _FINISHED
    }
    for kind in KINDS
)
"""Per kind: position in an event's values -> how the value taken is made the record's (the
decision's latency in µs, the close's duration): the writer applies it, a whole column at a time
in the Parquet writer (`event_parquet.rounded`), exactly as the record's and the line's code do."""

_EVENT_KINDS: Final[dict[type, type[EventRecord]]] = {Decided: DecisionRecord, Closed: CloseRecord}
_MAKERS: Final = {event: _record_maker(kind) for event, kind in _EVENT_KINDS.items()}
VALUE_MAKERS: Final[dict[type, Callable[..., EventValues]]] = {
    event: _values_maker(kind) for event, kind in _EVENT_KINDS.items()
}
"""Per logged event type (`Decided`, `Closed`): what takes its values, `(event, key_type, when)`
as `event_values` takes them; a subscriber looks its event's type up once, and other events are
not in it."""
_VALUE_LINES: Final = tuple(_values_writer(kind) for kind in KINDS)
_RECORD_LINES: Final = {kind: _record_writer(kind) for kind in KINDS}


def record_of(
    event: Decided | Closed, *, router_id: str, seq: int, conn: int, ts: Timestamp, key_type: KeyType
) -> Record:
    """The record of a connection's event."""
    return _MAKERS[type(event)](event, router_id, seq, conn, ts, key_type)


def event_values(event: Decided | Closed, key_type: KeyType, when: float) -> EventValues:
    """What the line of a connection's event will say, taken at once in the reporting thread: a
    flat tuple of strings, numbers, booleans and None (`marshal` sends it to the writer process);
    `when` is the epoch time of the line's `ts`."""
    return VALUE_MAKERS[type(event)](event, key_type, when)


def values_line(values: EventValues, *, router_id: str, sequence: Sequence, number: int) -> str:
    """`json_line(record_of(event, ...))` from `event_values(event, ...)`: the line the writer
    process writes for the event the ring numbered `number`.

    Raises:
        ValueError: a number field is NaN or infinite.
    """
    write = _VALUE_LINES[values[0]]
    return write(values, router_id, sequence.of(number), sequence.of(values[2]), timestamp(values[1]))


def json_line(record: Record) -> str:
    """One line of an event file: a JSON object, `kind` first, then the fields in declaration
    order; ends in a newline. Keys come from clients: every control and non-ASCII character is
    escaped (a lone surrogate too), so a line is always one event and always valid UTF-8.

    Raises:
        ValueError: a number field is NaN or infinite (JSON has no such numbers).
    """
    return _RECORD_LINES[type(record)](record)


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


# -- the native recorder's program, compiled from the same table --------------------------------
#
# The event log's native recorder (`router/services/event_recorder.c`) takes the same values as
# `VALUE_MAKERS`, reading the event's slots in C: each expression of `_VALUES` is one of a few
# forms, and each form is a step the C code runs. An expression of another form is an error here,
# at import; a test checks the recorder's values are `event_values`' on every kind.

RecorderStep: TypeAlias = tuple[str, bool, str | None, str | None, object]
"""(step, on the connection reference, its slot, a second slot of the reference, an argument)."""
RecorderProgram: TypeAlias = tuple[type, int, str, tuple[RecorderStep, ...]]
"""(event type, kind index, the event's slot of its `ConnectionRef`, a step per `VALUE_NAMES`)."""

_FACTS_SLOT: Final = "facts"
"""What `raw_key` reads the raw key from."""
_BY_ANNOTATION: Final = {
    "str": "str",
    "str | None": "opt_str",
    "int": "int",
    "float": "float",
    "bool": "bool",
}
_FORMS: Final[tuple[tuple[re.Pattern[str], Callable[[re.Match[str], str], RecorderStep]], ...]] = (
    (re.compile(r"(e|ref)\.(\w+)"), lambda m, a: (_BY_ANNOTATION[a], m[1] == "ref", m[2], None, None)),
    (re.compile(r"e\.(\w+)\._value_"), lambda m, a: ("enum", False, m[1], None, None)),
    (
        re.compile(r"None if e\.(\w+) is None else e\.\1\._value_"),
        lambda m, a: ("opt_enum", False, m[1], None, None),
    ),
    (re.compile(r"e\.(\w+) is (_\w+)"), lambda m, a: ("is", False, m[1], None, _NAMESPACE[m[2]])),
    (
        re.compile(r"\(ref\.(\w+) if e\.(\w+) is None else e\.\2\)\.host"),
        lambda m, a: ("address_host", False, m[2], m[1], None),
    ),
    (re.compile(r"key_type\._value_"), lambda m, a: ("key_type", False, None, None, None)),
    (
        re.compile(r"None if raw is None else raw\[:RAW_KEY_CAP\]"),
        lambda m, a: ("raw_key", False, _FACTS_SLOT, None, None),
    ),
    (
        re.compile(r"0 if raw is None else len\(raw\)"),
        lambda m, a: ("raw_key_length", False, None, None, None),
    ),
)
assert Address._fields[0] == "host", "address_host reads the address tuple's first item"


def _recorder_step(kind: type[EventRecord], name: str) -> RecorderStep:
    expression = _VALUES[kind.KIND][name]
    annotation = str(next(f.type for f in dataclasses.fields(kind) if f.name == name))
    for pattern, step in _FORMS:
        match = pattern.fullmatch(expression)
        if match is not None:
            return step(match, annotation)
    raise TypeError(f"{kind.__name__}.{name}: no recorder step for {expression!r}")


RECORDER_PROGRAMS: Final[tuple[RecorderProgram, ...]] = tuple(
    (event, KINDS.index(kind), _REF_SLOT, tuple(_recorder_step(kind, name) for name in _value_names(kind)))
    for event, kind in _EVENT_KINDS.items()
)
"""The native recorder's program, per logged event type."""

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
