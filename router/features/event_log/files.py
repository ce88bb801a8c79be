"""The event log's files: the file in progress, rotation, finishing, retention and recovery. Run
by the writer process (`router/features/event_log/writer.py`), never by routerd's routing threads.

Files, in the configured directory, per router id, in one of two formats (`event_format.files`:
`FileFormat`, its names; `event_format.lines.JsonLines`, `event_format.parquet.ParquetFormat`).

Events are collected and encoded when they are handed to the operating system: at least every
`flush-interval` (or per `PENDING_EVENTS` events), with one system call; they count as written when
that call succeeded. A file is finished when it holds `rotate-size` bytes or has been open
`rotate-interval`, and at the end. A write error (disk full) cuts the file back to its last whole
unit (line or batch), counts the events not written as lost, logs it, and the next events start a
new file. Finished files beyond `max-size` are deleted, oldest first (counted, logged).

A file in progress is locked (`flock`) by the process that writes or finishes it. At start, a file
left in progress by a process that is gone is finished from its whole units (a unit cut short by
a crash is left out); one that is still locked belongs to a writer that outlives its routerd
(killed) and is finishing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from event_format.files import Encoded, Finished

if TYPE_CHECKING:
    from event_format.files import FileFormat
    from event_format.frames import Batch
    from router.config.settings import EventLogConfig

__all__ = [
    "PENDING_EVENTS",
    "EventFiles",
    "Tally",
    "directory_error",
]

log = logging.getLogger("router.eventlog")

PENDING_EVENTS: Final = 8192
"""Events collected before they are encoded and written, at the latest (else every flush
interval): a few MB of the writer's memory."""


@dataclass(slots=True)
class Tally:
    """What happened since the last report: events written and lost, files finished and
    deleted."""

    written: int = 0
    lost: int = 0
    finished: int = 0
    deleted: int = 0

    def take(self) -> dict[str, int]:
        """The counts that are not zero, and zero them."""
        counts = {
            name: value
            for name, value in (
                ("written", self.written),
                ("lost", self.lost),
                ("finished", self.finished),
                ("deleted", self.deleted),
            )
            if value
        }
        self.written = self.lost = self.finished = self.deleted = 0
        return counts


@dataclass(slots=True)
class _Part:
    """The file in progress."""

    path: Path
    fd: int
    opened: float
    """Monotonic time it was opened."""
    size: int = 0
    """Bytes written to it (whole units only)."""
    pending: list[Batch] = field(default_factory=list)
    """Events not encoded and handed to the operating system yet (at most `PENDING_EVENTS`, one
    flush interval): counted as written once they are."""
    pending_events: int = 0


class EventFiles:
    """One router id's files in one directory, written by one process."""

    def __init__(
        self,
        config: EventLogConfig,
        name: str,
        boot: int,
        file_format: FileFormat,
        others: tuple[FileFormat, ...] = (),
    ) -> None:
        """Files named `events-NAME-BOOT-…` (nothing is opened until events come).

        Args:
            config: `<event-log>`.
            name: the router id as it appears in file names (`file_name_part`).
            boot: the routing process's boot time (epoch ms), in its file names.
            file_format: how events become files (`JsonLines`, `ParquetFormat`: `event_format`).
            others: the other formats, to finish what a run with another `<format>` left in
                progress (`recover`).
        """
        self.config = config
        self.format = file_format
        self._formats = (file_format, *others)
        suffixes = sorted({f.final_suffix(compress=c) for f in self._formats for c in (True, False)})
        endings = "|".join(map(re.escape, suffixes))
        self._finished_name = re.compile(
            rf"events-(?P<name>.+)-(?P<boot>\d+)-(?P<index>\d{{6}})(?:{endings})"
        )
        """A finished file of any of the formats (`max-size` counts them all)."""
        self.tally = Tally()
        self._directory = Path(config.directory)
        self._name = name
        self._boot = boot
        self._index = 0
        self._part: _Part | None = None
        self._unfinished: list[Path] = []
        """Files in progress that could not be finished yet (tried again at each rotation)."""

    @property
    def current_file(self) -> str | None:
        """The name of the file in progress, if one is open."""
        return None if self._part is None else self._part.path.name

    def add(self, batch: Batch) -> None:
        """Events, to the file in progress (encoded and written by `PENDING_EVENTS` or at the next
        `tick` that flushes; the file is finished once it holds `rotate-size` bytes)."""
        if not batch:
            return
        part = self._part
        if part is None:
            try:
                part = self._open_part()
            except OSError as exc:
                self.lose(len(batch), exc)
                return
        part.pending.append(batch)
        part.pending_events += len(batch)
        if part.pending_events >= PENDING_EVENTS and self._hand_over(part):
            self._rotate_if_full(part)

    def _rotate_if_full(self, part: _Part) -> None:
        if part.size >= self.config.rotate_size:
            self.finish_part()

    def lose(self, count: int, why: OSError | str) -> None:
        """Events could not be written: count them and say so."""
        self.tally.lost += count
        reason = why if isinstance(why, str) else why.strerror or str(why)
        log.warning("event log: %d event(s) lost: %s", count, reason)

    def tick(self, now: float, *, flush: bool) -> None:
        """Finish the file in progress if it has been open `rotate-interval`, else, with `flush`,
        hand what is pending to the operating system (`now`: monotonic time)."""
        due = self.rotation_due()
        if due is None:
            return
        if now >= due:
            self.finish_part()
        elif flush and self._part is not None and self._hand_over(self._part):
            self._rotate_if_full(self._part)

    def rotation_due(self) -> float | None:
        """When the file in progress is due to be finished (monotonic time); None: no file."""
        part = self._part
        return None if part is None else part.opened + self.config.rotate_interval_ms / 1000

    def finish_part(self) -> None:
        """Finish the file in progress (and any that could not be finished before)."""
        part = self._part
        if part is not None:
            handed = self._hand_over(part)
            if handed:  # else it is closed and queued already
                self._part = None
                _close(part.fd)  # `_finish` takes the lock again: a writer in between finishes it
                self._unfinished.append(part.path)
        # Files that could not be finished before (disk full) are tried again with each new one.
        self._unfinished = [path for path in self._unfinished if not self._finish(path)]

    def recover(self) -> int:
        """Finish the files of this router id left in progress by a process that is gone; how many.

        Raises:
            OSError: the directory cannot be read.
        """
        before = self.tally.finished
        prefix = f".events-{self._name}-"
        with os.scandir(self._directory) as entries:  # raises for a directory that is not one
            parts = sorted(
                e.name
                for e in entries
                if e.name.startswith(prefix) and any(e.name.endswith(f.part_suffix) for f in self._formats)
            )
        for name in parts:
            self._finish(self._directory / name, recovering=True)
        return self.tally.finished - before

    # -- the file in progress --

    def _open_part(self) -> _Part:
        self._index += 1
        name = f".events-{self._name}-{self._boot}-{self._index:06d}{self.format.part_suffix}"
        path = self._directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else holds it
            header = self.format.header()
            _write_all(fd, header)
        except OSError:
            _close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        self._part = _Part(path=path, fd=fd, opened=time.monotonic(), size=len(header))
        return self._part

    def _hand_over(self, part: _Part) -> bool:
        """Encode what the file in progress has pending and write it to the operating system; on
        a failure (disk full) cut the file back to its last whole unit, count the events lost and
        close it (it is finished with the next rotation, or deleted if it holds nothing). False
        when it failed."""
        if not part.pending:
            return True
        pending, events = part.pending, part.pending_events
        part.pending = []
        part.pending_events = 0
        try:
            encoded = self.format.encode(pending)
        except Exception as exc:  # a bug must cost these events, counted, not the writer
            log.exception("event log: cannot encode %d event(s)", events)
            encoded = Encoded(b"", 0, f"cannot encode them: {exc}")
        lost = events - encoded.events
        if lost:
            self.lose(lost, encoded.failure or "an event has no record")
        try:
            _write_all(part.fd, encoded.data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(part.fd, part.size)  # a partial unit would corrupt the file
            self.lose(encoded.events, exc)
            self._part = None
            if part.size == len(self.format.header()):  # nothing to finish: files do not pile up
                with contextlib.suppress(OSError):
                    part.path.unlink()
            else:
                self._unfinished.append(part.path)
            _close(part.fd)
            return False
        part.size += len(encoded.data)
        self.tally.written += encoded.events
        return True

    # -- finished files --

    def _format_of(self, part: Path) -> FileFormat:
        return next((f for f in self._formats if part.name.endswith(f.part_suffix)), self.format)

    def _final_path(self, part: Path, file_format: FileFormat) -> Path:
        name = part.name.removeprefix(".").removesuffix(file_format.part_suffix)
        return part.with_name(name + file_format.final_suffix(compress=self.config.compress))

    def _finish(self, part: Path, *, recovering: bool = False) -> bool:
        """Make a file in progress a finished one, atomically, under its lock; False when it
        failed (left in progress: finished at the next start). A file another process holds is
        that process's to finish (True, not counted here)."""
        try:
            fd = os.open(part, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return not recovering  # finished meanwhile by another writer
        except OSError as exc:
            log.warning("event log: cannot finish %s: %s", part.name, exc.strerror or exc)
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return not recovering
            made = self._finish_locked(part, fd, recovering=recovering)
        except OSError as exc:
            log.warning("event log: cannot finish %s: %s", part.name, exc.strerror or exc)
            return False
        except Exception as exc:  # not the disk: the file itself (a bug's values, a garbled file)
            self._set_aside(part, exc)
            return True
        finally:
            _close(fd)
        if made:
            self.tally.finished += 1
            self._keep_within_max_size()
        return True

    def _set_aside(self, part: Path, error: Exception) -> None:
        """A file in progress that cannot be finished for what it holds: renamed `….bad` (still a
        dot file, never read by the pipeline, never tried again) so that it does not stop every
        later start; logged with its name for a person to look at."""
        bad = part.with_name(part.name + ".bad")
        try:
            part.replace(bad)
        except OSError as exc:
            log.error("event log: cannot finish %s (%s) nor set it aside: %s", part.name, error, exc)
            return
        log.error("event log: cannot finish %s (%s); set aside as %s", part.name, error, bad.name)

    def _finish_locked(self, part: Path, fd: int, *, recovering: bool) -> bool:
        """Whether a finished file was made (not when the part was empty or finished before)."""
        file_format = self._format_of(part)
        final = self._final_path(part, file_format)
        temporary = part.with_name(f".{final.name}.tmp")
        if recovering:
            temporary.unlink(missing_ok=True)  # a finishing cut short; its part is still here
        if final.exists():  # finished before a crash
            part.unlink()
            return False
        try:
            finished = file_format.finish(fd, temporary, compress=self.config.compress, recovering=recovering)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        if finished is Finished.AS_IS:
            part.replace(final)
        else:
            if finished is Finished.WRITTEN:
                temporary.replace(final)
            part.unlink()
        if finished is not Finished.EMPTY:
            _sync_directory(final.parent)
        return finished is not Finished.EMPTY

    def _keep_within_max_size(self) -> None:
        """Delete the oldest finished files of this router id beyond `max-size` (never the newest)."""
        files = sorted(self._finished_files())
        total = sum(size for _, size, _ in files)
        for _, size, path in files[:-1]:
            if total <= self.config.max_size:
                break
            try:
                path.unlink()
            except OSError as exc:
                log.warning("event log: cannot delete %s: %s", path.name, exc.strerror or exc)
                continue
            total -= size
            self.tally.deleted += 1
            log.warning(
                "event log: deleted %s (%d bytes): finished files over max-size=%d",
                path.name,
                size,
                self.config.max_size,
            )

    def _finished_files(self) -> list[tuple[tuple[int, int], int, Path]]:
        found = []
        for path in self._directory.iterdir():
            match = self._finished_name.fullmatch(path.name)
            if match is not None and match["name"] == self._name:
                with contextlib.suppress(OSError):
                    found.append(((int(match["boot"]), int(match["index"])), path.stat().st_size, path))
        return found


def directory_error(directory: str, exc: OSError) -> str:
    """The one line that says the event log's directory cannot be used."""
    return f"event log directory {directory!r}: {exc.strerror or exc}"


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
