"""How routerd takes the event log's records from its connection events: one table per kind of
where each field's value comes from in a `Decided` or a `Closed` (the record itself, its fields and
its line are the event files' format, `event_format`).

Pure: no I/O, no clock (the time is an argument), no logging. The event log
(`router/services/event_log.py`) takes a connection's event's values at once: in C, by the program
compiled here from the same table (`RECORDER_PROGRAMS`, `event_format/_native.c`), or without the
C extension by `event_values`; its writer process encodes them (`event_format.lines.values_line`,
`event_format.parquet`), out of the routing process. `record_of` makes the record itself, which
`event_format.lines.json_line` writes as the same line.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Final, TypeAlias

from event_format.schema import (
    KINDS,
    RAW_KEY_CAP,
    ROUNDINGS,
    CloseRecord,
    DecisionRecord,
    EventRecord,
    EventValues,
    Record,
    Timestamp,
    value_names,
)
from keys import KeyType
from keys.resolve import RAW_VALUE_OF
from router.core.address import Address
from router.core.engine import DecisionReason
from router.core.events import Closed, Decided

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import ConnectionFacts

__all__ = [
    "RAW_KEY_OF",
    "RECORDER_PROGRAMS",
    "VALUE_MAKERS",
    "RecorderProgram",
    "RecorderStep",
    "event_values",
    "raw_key",
    "record_of",
]


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
# tuple (`event_format.lines.values_line`), without the record in between. The first two are
# generated here, from one table per kind: field -> a Python expression over the event `e`,
# its reference `ref`, the decision's raw key `raw`, and the arguments `router_id`, `seq`, `conn`,
# `ts`, `key_type`. Enum values are read as `_value_` (the `value` property is a Python-level
# call). A test checks the line from the values is the record's line on every kind.
#
# A field in `event_format.schema.ROUNDINGS` is taken as it is and made the record's value by the
# writer (and by `record_of`).

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


def _finished(name: str, taken: str) -> str:
    """The expression of a field's record value from the expression of the value taken."""
    rounding = ROUNDINGS.get(name)
    return taken if rounding is None else rounding.expression(taken)


_NAMESPACE: Final[dict[str, object]] = {
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


_ARGUMENTS: Final = "e, router_id, seq, conn, ts, key_type"


def _record_maker(kind: type[EventRecord]) -> Callable[..., Record]:
    values = _VALUES[kind.KIND]
    fields = ", ".join(f"{f.name}={_finished(f.name, values[f.name])}" for f in dataclasses.fields(kind))
    source = f"def make({_ARGUMENTS}):\n    {_PRELUDE[kind.KIND]}\n    return Kind({fields})\n"
    return _generated("make", source, Kind=kind)  # type: ignore[return-value]


def _values_maker(kind: type[EventRecord]) -> Callable[..., EventValues]:
    values = _VALUES[kind.KIND]
    items = "".join(f", {values[name]}" for name in value_names(kind))
    code = KINDS.index(kind)
    body = f"{_PRELUDE[kind.KIND]}\n    return ({code}, when, ref.id{items})"
    source = f"def values(e, key_type, when):\n    {body}\n"
    return _generated("values", source)  # type: ignore[return-value]


_EVENT_KINDS: Final[dict[type, type[EventRecord]]] = {Decided: DecisionRecord, Closed: CloseRecord}
_MAKERS: Final = {event: _record_maker(kind) for event, kind in _EVENT_KINDS.items()}
VALUE_MAKERS: Final[dict[type, Callable[..., EventValues]]] = {
    event: _values_maker(kind) for event, kind in _EVENT_KINDS.items()
}
"""Per logged event type (`Decided`, `Closed`): what takes its values, `(event, key_type, when)`
as `event_values` takes them; a subscriber looks its event's type up once, and other events are
not in it."""


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


# -- the native recorder's program, compiled from the same table --------------------------------
#
# The event log's native recorder (`event_format/_native.c`) takes the same values as
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
    (event, KINDS.index(kind), _REF_SLOT, tuple(_recorder_step(kind, name) for name in value_names(kind)))
    for event, kind in _EVENT_KINDS.items()
)
"""The native recorder's program, per logged event type."""
