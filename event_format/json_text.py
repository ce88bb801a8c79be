"""How a record's value of each type is written in a JSON line: the pieces the generated line
writers (`_generated_lines.py`, `event_format.lines`) put together.

Keys come from clients, so a string is written as ASCII with every control and non-ASCII
character escaped (a lone surrogate too): a line is always one event and always valid UTF-8. JSON
has no NaN or infinity, so such a number is refused rather than written as something a reader
rejects.

Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BOOLEANS", "number", "string", "string_or_null"]

string: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii
"""A string's JSON text: JSON's string encoder in C, quoted, every control and non-ASCII character
escaped."""

BOOLEANS: Final = ("false", "true")
"""A boolean's JSON text, by the boolean (`BOOLEANS[value]`)."""


def string_or_null(value: str | None) -> str:
    """An optional string's JSON text."""
    return "null" if value is None else string(value)


def number(value: float) -> str:
    """A float's JSON text: its shortest repr, which reads back as the same float.

    Raises:
        ValueError: `value` is NaN or infinite.
    """
    if not math.isfinite(value):
        raise ValueError(f"a record field must be a finite number, got {value!r}")
    return float.__repr__(value)
