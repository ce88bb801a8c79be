"""The event files' JSON lines: one record per line (`json_line`), written by the writer process
straight from an event's values (`values_line`, the same line without the record in between), and
the file format that holds them (`JsonLines`: a file of lines in progress, compressed whole with
zstd when finished).

A line is a JSON object, `kind` first, then the kind's fields in declaration order; it is ASCII
only (every control and non-ASCII character escaped, a lone surrogate too), so a client's key can
never split or forge a line. A test checks that the line from the values is the record's line on
every kind.

Pure: nothing of `router`; `JsonLines` does its I/O on the descriptor and path it is given.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Final

import zstandard

from event_format.files import Encoded, Finished
from event_format.frames import events_of
from event_format.schema import (
    KINDS,
    ROUNDINGS,
    VALUE_HEAD,
    WRITER_FIELDS,
    EventRecord,
    Record,
    Sequence,
    timestamp,
    value_names,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from event_format.frames import Batch
    from event_format.schema import EventValues

__all__ = ["ZSTD_LEVEL", "JsonLines", "json_line", "values_line"]

ZSTD_LEVEL: Final = 3
"""zstd's default level: about 9x smaller than the lines, hundreds of MB/s."""

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
}


def _generated(name: str, source: str) -> Callable[..., str]:
    namespace = dict(_NAMESPACE)
    exec(source, namespace)
    function = namespace[name]
    assert callable(function)
    return function


def _finished(name: str, taken: str) -> str:
    """The expression of a field's record value from the expression of the value taken."""
    rounding = ROUNDINGS.get(name)
    return taken if rounding is None else rounding.expression(taken)


def _line_source(kind: type[EventRecord], value: Callable[[str], str]) -> str:
    """The f-string of one kind's line: `kind` first, then the fields in order; `value(name)`
    is where a field's value is."""
    text = ['f\'{{"kind":' + json.dumps(kind.KIND)]
    for field in dataclasses.fields(kind):
        text.append(f',"{field.name}":' + "{" + _FORMATS[str(field.type)].format(v=value(field.name)) + "}")
    return "".join(text) + "}}\\n'"


def _values_writer(kind: type[EventRecord]) -> Callable[..., str]:
    position = {name: index for index, name in enumerate(value_names(kind), start=VALUE_HEAD)}
    line = _line_source(
        kind, lambda name: name if name in WRITER_FIELDS else _finished(name, f"v[{position[name]}]")
    )
    source = f"def write(v, router_id, seq, conn, ts):\n    return {line}\n"
    return _generated("write", source)


def _record_writer(kind: type[EventRecord]) -> Callable[[Record], str]:
    source = f"def write(r):\n    return {_line_source(kind, lambda name: f'r.{name}')}\n"
    return _generated("write", source)


_VALUE_LINES: Final = tuple(_values_writer(kind) for kind in KINDS)
_RECORD_LINES: Final = {kind: _record_writer(kind) for kind in KINDS}


def values_line(values: EventValues, *, router_id: str, sequence: Sequence, number: int) -> str:
    """`json_line(record)` from the event's values (`EventValues`): the line the writer process
    writes for the event the ring numbered `number`.

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


class JsonLines:
    """JSON lines (`values_line`), compressed whole with zstd on finishing (a `FileFormat`)."""

    part_suffix: Final = ".jsonl.part"

    def __init__(self, router_id: str, boot: int) -> None:
        """Lines of `router_id`, numbered from `boot` (epoch ms)."""
        self._router_id = router_id
        self._sequence = Sequence(boot)
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)

    def final_suffix(self, *, compress: bool) -> str:
        return ".jsonl.zst" if compress else ".jsonl"

    def header(self) -> bytes:
        return b""

    def encode(self, batches: list[Batch]) -> Encoded:
        router_id, sequence = self._router_id, self._sequence
        lines = []
        failure: str | None = None
        for batch in batches:
            try:
                events = events_of(batch)
            except ValueError as exc:  # broken records: the batch is lost, counted
                failure = f"{len(batch)} event(s) have no line: {exc}"
                continue
            for number, values in events:
                try:
                    lines.append(values_line(values, router_id=router_id, sequence=sequence, number=number))
                except (ValueError, TypeError, IndexError, ArithmeticError) as exc:  # a bug's: lose it alone
                    failure = f"an event has no line: {exc}"  # the text: the exception would hold `lines`
        return Encoded("".join(lines).encode("ascii"), len(lines), failure)  # the lines escape the rest

    def finish(self, fd: int, target: Path, *, compress: bool, recovering: bool) -> Finished:
        if recovering:
            _cut_after_last_line(fd)
        if os.fstat(fd).st_size == 0:
            return Finished.EMPTY
        if not compress:
            os.fsync(fd)
            return Finished.AS_IS
        with os.fdopen(os.dup(fd), "rb") as source, target.open("wb") as out:
            source.seek(0)
            self._compressor.copy_stream(source, out)
            out.flush()
            os.fsync(out.fileno())
        return Finished.WRITTEN


def _cut_after_last_line(fd: int) -> None:
    """Drop a partial last line (a write cut short by a crash)."""
    end = os.lseek(fd, 0, os.SEEK_END)
    position = end
    while position > 0:
        start = max(0, position - 65536)
        chunk = os.pread(fd, position - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            if keep != end:
                os.ftruncate(fd, keep)
            return
        position = start
    os.ftruncate(fd, 0)
