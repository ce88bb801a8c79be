"""The kinds of configuration values, each with its rule worded once. No I/O, no documents here.

A value kind is a rule such as "an integer > 0" and the one sentence that says it. Every place a
value is checked words a broken rule with `reason`, so one rule reads the same wherever it breaks:

- the XML elements: the shipped XSD (router/config/schema/connection-router.xsd) states their rules
  (`positive-long-type`, `ttl-type`, `boolean-type`, …) and the loader words its errors by kind;
- the acceptor URL parameters (router/config/acceptor_params.py), which no schema covers, are read
  with `parse_integer`, `parse_flag` and `parse_names`;
- the dataclasses of router/config/settings.py check their fields with `check`.

The pure packages `pools`, `cache` and `policies` do not import `router`; their dataclasses word
their own rules, in the same words.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, assert_never

from keys import KeyType

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "ARTEMIS_PROTOCOLS",
    "LONG_MAX",
    "NumericKind",
    "ValueKind",
    "check",
    "is_valid",
    "one_of",
    "parse_flag",
    "parse_integer",
    "parse_names",
    "reason",
]

LONG_MAX: Final = 2**63 - 1
"""Upper bound of XSD `xsd:long` (Java's `long`), the type Artemis's schema gives periods and sizes."""

ARTEMIS_PROTOCOLS: Final = ("AMQP", "CORE", "HORNETQ", "MQTT", "OPENWIRE", "STOMP")
"""The protocol names an Artemis acceptor's `protocols` parameter may list (Artemis's own default
acceptor lists all six); the router sniffs AMQP, MQTT, OPENWIRE and STOMP (`keys.detect`)."""


class ValueKind(enum.Enum):
    """The kinds of values; the XSD's simple types have the same names (`positive` is
    `positive-long-type`, …)."""

    POSITIVE = "positive"
    """An integer from 1 to `LONG_MAX`."""
    NON_NEGATIVE = "non-negative"
    """An integer from 0 to `LONG_MAX`."""
    TTL = "ttl"
    """-1 (off), or an integer from 1 to `LONG_MAX` (Artemis's connection TTLs)."""
    PORT = "port"
    """A TCP port, 0 to 65535 (0: the system chooses)."""
    SNIFF_CAP = "sniff-cap"
    """A byte cap of an opening handshake (`sniffMaxBytes`), 64 to 1048576 (1 MiB): the bounds the
    parameter has had since it was introduced; the default is `settings.DEFAULT_MAX_SNIFF_BYTES`."""
    BOOLEAN = "boolean"
    """An XML boolean: true or false in any letter case, or xsd:boolean's 1 and 0."""
    FLAG = "flag"
    """A URL parameter's boolean: true or false in any letter case, nothing else (Artemis reads
    any other value of its URL parameters as false; we refuse it)."""
    KEY_TYPE = "key-type"
    """A `keys.KeyType` value."""
    PROTOCOL = "protocol"
    """An Artemis protocol name (`ARTEMIS_PROTOCOLS`), in any letter case."""
    NAME = "name"
    """A name: not empty after trimming."""
    EVENT_FORMAT = "event-format"
    """An `EventFileFormat` value: parquet or jsonl."""


NumericKind: TypeAlias = Literal[
    ValueKind.POSITIVE, ValueKind.NON_NEGATIVE, ValueKind.TTL, ValueKind.PORT, ValueKind.SNIFF_CAP
]
"""The kinds whose values are integers (`parse_integer`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Range:
    """The integers of a numeric kind: `low` to `high`, and `off` when the kind has an off value."""

    low: int
    high: int = LONG_MAX
    off: int | None = None

    def holds(self, value: int) -> bool:
        return value == self.off or self.low <= value <= self.high

    def rule(self, text: str) -> str:
        integer = _INTEGER.fullmatch(text) is not None
        if integer and self.high == LONG_MAX and int(text) > LONG_MAX:
            return f"must be at most {LONG_MAX}"
        if self.high == LONG_MAX:
            bound = "> 0" if self.low == 1 else f">= {self.low}"
        else:
            bound = f"{self.low}-{self.high}"
        if not integer:
            bound = f"an integer {bound}"
        if self.off is not None:
            bound = f"{self.off} (off) or {bound}"
        return f"must be {bound}"


_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
"""A decimal integer as xsd:long writes it (no `_`, no other digits than 0-9)."""

_RANGES: Final[Mapping[NumericKind, _Range]] = {
    ValueKind.POSITIVE: _Range(low=1),
    ValueKind.NON_NEGATIVE: _Range(low=0),
    ValueKind.TTL: _Range(low=1, off=-1),
    ValueKind.PORT: _Range(low=0, high=65535),
    ValueKind.SNIFF_CAP: _Range(low=64, high=1024 * 1024),
}

_BOOLEANS: Final[Mapping[str, bool]] = {"true": True, "false": False}
_EVENT_FORMATS: Final = ("parquet", "jsonl")
"""`settings.EventFileFormat`'s values (settings imports this module; a test checks they agree)."""


def one_of(choices: Iterable[str]) -> str:
    """The rule "one of these values": "must be a or b", "must be one of a, b, c"."""
    items = list(choices)
    if len(items) == 2:
        return f"must be {items[0]} or {items[1]}"
    return f"must be one of {', '.join(items)}"


def _rule(kind: ValueKind, text: str) -> str:
    match kind:
        case (
            ValueKind.POSITIVE | ValueKind.NON_NEGATIVE | ValueKind.TTL | ValueKind.PORT | ValueKind.SNIFF_CAP
        ):
            return _RANGES[kind].rule(text)
        case ValueKind.BOOLEAN | ValueKind.FLAG:
            return one_of(_BOOLEANS)
        case ValueKind.KEY_TYPE:
            return one_of(k.value for k in KeyType)
        case ValueKind.PROTOCOL:
            return one_of(ARTEMIS_PROTOCOLS)
        case ValueKind.NAME:
            return "must not be empty"
        case ValueKind.EVENT_FORMAT:
            return one_of(_EVENT_FORMATS)
        case _:
            assert_never(kind)


def is_valid(kind: ValueKind, text: str) -> bool:
    """Whether `text` (trimmed by the caller) is a value of `kind`."""
    match kind:
        case (
            ValueKind.POSITIVE | ValueKind.NON_NEGATIVE | ValueKind.TTL | ValueKind.PORT | ValueKind.SNIFF_CAP
        ):
            return _INTEGER.fullmatch(text) is not None and _RANGES[kind].holds(int(text))
        case ValueKind.BOOLEAN:
            return text.lower() in ("true", "false", "1", "0")
        case ValueKind.FLAG:
            return text.lower() in _BOOLEANS
        case ValueKind.KEY_TYPE:
            return text in {k.value for k in KeyType}
        case ValueKind.PROTOCOL:
            return text.upper() in ARTEMIS_PROTOCOLS
        case ValueKind.NAME:
            return bool(text.strip())
        case ValueKind.EVENT_FORMAT:
            return text in _EVENT_FORMATS
        case _:
            assert_never(kind)


def reason(kind: ValueKind, value: str | int) -> str:
    """Why `value` is not of `kind`: the kind's rule, worded for the value, and the value.

    An integer that is out of range gets the bound ("must be > 0, got '0'"), other text the type
    too ("must be an integer > 0, got 'abc'"); text is quoted, an int is not.
    """
    return f"{_rule(kind, str(value))}, got {value!r}"


def check(kind: ValueKind, what: str, value: int | str) -> None:
    """A dataclass field's check: `value` must be of `kind`.

    Raises:
        ValueError: it is not; the message is `what` and `reason`, e.g.
            "connectionTtl must be -1 (off) or > 0, got 0".
    """
    if not is_valid(kind, str(value)):
        raise ValueError(f"{what} {reason(kind, value)}")


def parse_integer(kind: NumericKind, what: str, text: str) -> int:
    """The integer a numeric kind's text (trimmed by the caller) stands for.

    Raises:
        ValueError: the text is not a value of `kind`; worded as by `check`, the text quoted.
    """
    if not is_valid(kind, text):
        raise ValueError(f"{what} {reason(kind, text)}")
    return int(text)


def parse_flag(what: str, text: str) -> bool:
    """A URL parameter's boolean (`ValueKind.FLAG`): true or false in any letter case.

    Raises:
        ValueError: anything else, "NAME must be true or false, got 'yes'".
    """
    if not is_valid(ValueKind.FLAG, text):
        raise ValueError(f"{what} {reason(ValueKind.FLAG, text)}")
    return _BOOLEANS[text.lower()]


def parse_names(kind: ValueKind, what: str, text: str) -> tuple[str, ...]:
    """A comma-separated list of values of `kind`, each trimmed and upper-cased; empty items are
    dropped, so empty text is the empty tuple.

    Raises:
        ValueError: an item is not a value of `kind`, worded for the item and naming the whole
            text, e.g. "protocols: each name must be one of AMQP, CORE, HORNETQ, MQTT, OPENWIRE,
            STOMP, got 'FOO' in 'MQTT,FOO'".
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        if not is_valid(kind, item):
            raise ValueError(f"{what}: each name {reason(kind, item)} in {text!r}")
    return tuple(item.upper() for item in items)
