"""Where each field of the event log's records comes from in routerd's connection events: one table
per logged event type (`SOURCES`), stated once.

A record is made from a connection's event (`records.record_of`); the event log takes the same
values from the event as a flat tuple (`records.event_values`, or the native recorder in C) and
its writer process writes the line or the row from the tuple, without the record in between.
`python -m tools.generate` writes both recorders' code from this table, ahead of time: the Python
that takes an event's values and its record (`_generated_records.py`) and the native recorder's
program (`event_format/_native_program.h`), so that they take the same values (a test checks it
on every kind and key type). A source names the event's slots it reads, so that C
can read them directly; each kind of source is one step of the native recorder. Enum values are
read as `_value_` (the `value` property is a Python-level call).

A field in `event_format.schema.ROUNDINGS` is taken as it is and made the record's value by the
writer (and by `record_of`): rounding costs the routing thread nothing.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias

from event_format.schema import WRITER_FIELDS, CloseRecord, DecisionRecord, value_names
from keys import KeyType
from keys.resolve import RAW_VALUE_OF
from router.core.address import Address
from router.core.engine import DecisionReason
from router.core.events import Closed, ConnectionRef, Decided

if TYPE_CHECKING:
    import enum
    from collections.abc import Callable

    from keys import ConnectionFacts

__all__ = [
    "EVENT_KINDS",
    "FACTS_SLOT",
    "KEY_TYPE",
    "RAW_KEY",
    "RAW_KEY_LENGTH",
    "RAW_KEY_OF",
    "REF_ID_SLOT",
    "REF_ROUTER_SLOT",
    "REF_SLOT",
    "SOURCES",
    "AddressHost",
    "EnumValue",
    "IsMember",
    "KeyTypeValue",
    "RawKey",
    "RawKeyLength",
    "Slot",
    "Source",
    "raw_key",
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


# -- the kinds of source: each is one step of the native recorder --------------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    """The value in one of the event's slots as it is (a string, a number, a boolean or None, as
    the record's field says)."""

    name: str
    on_ref: bool = False
    """The slot is the connection reference's (`REF_SLOT`), not the event's."""


@dataclass(frozen=True, slots=True)
class EnumValue:
    """The value of the enum member in one of the event's slots."""

    name: str
    optional: bool = False
    """The slot may hold None (then so does the field)."""


@dataclass(frozen=True, slots=True)
class IsMember:
    """Whether one of the event's slots holds `member` (an identity test)."""

    name: str
    member: enum.Enum


@dataclass(frozen=True, slots=True)
class AddressHost:
    """The host of the address in one of the event's slots, or, when that holds None, of the one in
    the connection reference's slot `fallback`."""

    name: str
    fallback: str


@dataclass(frozen=True, slots=True)
class KeyTypeValue:
    """The key type of the event's router (`KeyType`'s value)."""


@dataclass(frozen=True, slots=True)
class RawKey:
    """The decision's raw key (`raw_key`, read from the event's `FACTS_SLOT`), cut at
    `event_format.schema.RAW_KEY_CAP` characters; None when there is none."""


@dataclass(frozen=True, slots=True)
class RawKeyLength:
    """The whole length of the decision's raw key (0 when there is none)."""


Source: TypeAlias = Slot | EnumValue | IsMember | AddressHost | KeyTypeValue | RawKey | RawKeyLength

KEY_TYPE: Final = KeyTypeValue()
RAW_KEY: Final = RawKey()
RAW_KEY_LENGTH: Final = RawKeyLength()

REF_SLOT: Final = "conn"
"""The event's slot of its `ConnectionRef`."""
REF_ID_SLOT: Final = "id"
"""The reference's slot of the connection's process-local number (an event's third value)."""
REF_ROUTER_SLOT: Final = "router"
"""The reference's slot of the router's name (which says the key type)."""
FACTS_SLOT: Final = "facts"
"""What `raw_key` reads the raw key from."""

EVENT_KINDS: Final[dict[type, type[DecisionRecord] | type[CloseRecord]]] = {
    Decided: DecisionRecord,
    Closed: CloseRecord,
}
"""The logged event types, in the order of their records' kinds, and their record."""

_COMMON: Final[dict[str, Source]] = {
    "router": Slot(REF_ROUTER_SLOT, on_ref=True),
    "acceptor": Slot("acceptor", on_ref=True),
}

SOURCES: Final[dict[type, dict[str, Source]]] = {
    Decided: _COMMON
    | {
        "source": AddressHost("source", fallback="peer"),
        "protocol": EnumValue("protocol", optional=True),
        "key_type": KEY_TYPE,
        "raw_key": RAW_KEY,
        "raw_key_length": RAW_KEY_LENGTH,
        "key": Slot("key"),
        "status": EnumValue("status"),
        "reason": EnumValue("reason"),
        "mode": EnumValue("mode"),
        "node_id": Slot("node_id"),
        "local": Slot("local"),
        "cache_hit": IsMember("reason", DecisionReason.CACHE),
        "latency_us": Slot("latency_s"),
    },
    Closed: _COMMON
    | {
        "node_id": Slot("node_id"),
        "duration_s": Slot("duration_s"),
        "bytes_in": Slot("bytes_in"),
        "bytes_out": Slot("bytes_out"),
        "reason": EnumValue("reason"),
    },
}
"""Per logged event type: each field of its record but the writer's own
(`event_format.schema.WRITER_FIELDS`) -> where its value comes from."""


def _check_table() -> None:
    """What the generated code relies on (at import, so a wrong table fails at once).

    Raises:
        TypeError: a field without a source or a source without a field, out of order.
    """
    assert Address._fields[0] == "host", "AddressHost reads the address tuple's first item"
    assert {REF_ID_SLOT, REF_ROUTER_SLOT} <= set(ConnectionRef.__slots__)
    for event, kind in EVENT_KINDS.items():
        if tuple(SOURCES[event]) != value_names(kind):
            raise TypeError(f"{event.__name__}: a source for each of {value_names(kind)}, in order")
    assert not {name for sources in SOURCES.values() for name in sources} & set(WRITER_FIELDS)


_check_table()
