"""What the event log's writer asks of a file format (`FileFormat`): how events become a file in
progress and a finished file. Two formats: JSON lines (`event_format.lines.JsonLines`) and Parquet
(`event_format.parquet.ParquetFormat`); the writer (`router/features/event_log/files.py`) names,
rotates, locks and recovers the files whichever format they are in.

Files, per router id, in one of the two formats:

    .events-ID-BOOT-NNNNNN.arrows.part    in progress (a dot file: Spark and Hadoop skip it): an
                                          Arrow IPC stream, one record batch per hand-over
    events-ID-BOOT-NNNNNN.parquet         finished: complete or absent (written to a dot file,
                                          synced, then renamed)

    .events-ID-BOOT-NNNNNN.jsonl.part     in progress: JSON lines
    events-ID-BOOT-NNNNNN.jsonl.zst       finished (compressed to a dot file, synced, renamed)

Pure: nothing of `router`; a format does its I/O on the descriptor and path it is given.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from event_format.frames import Batch

__all__ = ["Encoded", "FileFormat", "Finished"]


@dataclass(frozen=True, slots=True)
class Encoded:
    """Events encoded for the file in progress."""

    data: bytes
    """Whole units (lines, Arrow batches): a file cut after any of them is readable."""
    events: int
    """Events in `data`."""
    failure: str | None = None
    """Why the other events of the batches have no unit (a bug's event: lost, counted)."""


class Finished(enum.Enum):
    """What `FileFormat.finish` made of a file in progress."""

    EMPTY = "empty"
    """It held no event: nothing was written, the file in progress goes."""
    WRITTEN = "written"
    """The finished file is at the target."""
    AS_IS = "as is"
    """The file in progress is the finished file (synced): renamed, not copied."""


class FileFormat(Protocol):
    """How events become a file in progress and a finished file."""

    @property
    def part_suffix(self) -> str:
        """The file in progress's suffix (after `.events-ID-BOOT-NNNNNN`)."""

    def final_suffix(self, *, compress: bool) -> str:
        """The finished file's suffix."""

    def header(self) -> bytes:
        """What a new file in progress starts with."""

    def encode(self, batches: list[Batch]) -> Encoded:
        """Events as whole units for the file in progress."""

    def finish(self, fd: int, target: Path, *, compress: bool, recovering: bool) -> Finished:
        """Write the finished file of the file in progress `fd` to `target` (a dot file, synced
        here; the caller renames it), from its whole units. `recovering`: the file may end in a
        unit cut short by a crash."""
