"""The event files' JSON lines: one record per line (`json_line`), written by the writer process
straight from an event's values (`values_line`, the same line without the record in between), and
the file format that holds them (`JsonLines`: a file of lines in progress, compressed whole with
zstd when finished).

A line is a JSON object, `kind` first, then the kind's fields in declaration order; it is ASCII
only (every control and non-ASCII character escaped, a lone surrogate too), so a client's key can
never split or forge a line (`json_text`). Each kind's two writers, from a record and from values,
are generated ahead of time from the records by `python -m tools.generate`
(`_generated_lines.py`); a test checks that the line from the values is the record's line on
every kind.

Pure: nothing of `router`; `JsonLines` does its I/O on the descriptor and path it is given.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

import zstandard

from event_format._generated_lines import RECORD_LINES, VALUE_LINES
from event_format.files import Encoded, Finished
from event_format.frames import events_of
from event_format.schema import Sequence, timestamp

if TYPE_CHECKING:
    from pathlib import Path

    from event_format.frames import Batch
    from event_format.schema import EventValues, Record

__all__ = ["ZSTD_LEVEL", "JsonLines", "json_line", "values_line"]

ZSTD_LEVEL: Final = 3
"""zstd's default level: about 9x smaller than the lines, hundreds of MB/s."""


def values_line(values: EventValues, *, router_id: str, sequence: Sequence, number: int) -> str:
    """`json_line(record)` from the event's values (`EventValues`): the line the writer process
    writes for the event the ring numbered `number`.

    Raises:
        ValueError: a number field is NaN or infinite.
    """
    write = VALUE_LINES[values[0]]
    return write(values, router_id, sequence.of(number), sequence.of(values[2]), timestamp(values[1]))


def json_line(record: Record) -> str:
    """One line of an event file: a JSON object, `kind` first, then the fields in declaration
    order; ends in a newline. Keys come from clients: every control and non-ASCII character is
    escaped (a lone surrogate too), so a line is always one event and always valid UTF-8.

    Raises:
        ValueError: a number field is NaN or infinite (JSON has no such numbers).
    """
    return RECORD_LINES[type(record)](record)


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
