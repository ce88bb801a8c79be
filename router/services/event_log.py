"""The routing event log: every decision and every closed proxied connection as one JSON line, in
rotating, compressed files that the PySpark pipeline reads (docs/pipeline.md).

Routing never waits for it. The subscriber (`EventLog.report`, one more `RouterRuntime` subscriber
beside the log lines and the metrics) stamps the time and puts the event into the bounded ring
(`router.core.ring`): a lock and a deque append in the reporting thread. A writer thread takes
events from the ring in batches, turns each into its line (`router.core.event_records`), and
appends the lines to the file in progress. When the ring is full the oldest event is dropped,
counted (`router_event_log_events_total{outcome="dropped"}`) and logged (rate-limited); its `seq`
is missing from the files.

Files, in the configured directory, per router id:

    .events-ID-BOOT-NNNNNN.jsonl.part     in progress (a dot file: Spark and Hadoop skip it)
    events-ID-BOOT-NNNNNN.jsonl.zst       finished: complete or absent (compressed to a dot file,
                                          synced, then renamed into place)

A file is finished when it holds `rotate-size` bytes of lines or has been open `rotate-interval`,
and at shutdown. Lines reach the operating system at least every `flush-interval`; a kill -9 loses
what was in the ring and the buffer then. At the next start, a file left in progress is cut after
its last complete line and finished. Finished files beyond `max-size` are deleted, oldest first
(counted, logged). Lines are collected and written with one system call per flush interval (or
per `PENDING_MAX` bytes); they count as written when that call succeeded. A write error (disk
full) cuts the file back to its last whole line, counts the lines not written as lost, logs it,
and the writer starts a new file with the next batch: the router goes on routing.

`seq` and `conn` are `boot * BOOT_SPAN + n` (`router.core.event_records.Sequence`); the boot time
is kept in `.boot-ID` and a new process starts above the last one, so a clock set back between two
runs cannot repeat a number.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import zstandard

from keys import KeyType
from router.core.event_records import Sequence, event_line, timestamp
from router.core.events import Closed, Decided
from router.core.ring import Ring

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from router.config.settings import EventLogConfig
    from router.core.events import Event
    from router.metrics import Metrics

__all__ = ["EventLog", "EventLogError", "default_router_id", "file_name_part"]

log = logging.getLogger("router.eventlog")

TAKE_BATCH: Final = 256
"""Events the writer takes from the ring at a time; between two batches it lets the data paths'
threads have the interpreter (a batch is about 1 ms of Python), instead of holding it until
Python's 5 ms switch interval forces it off while a data path waits."""
WRITER_NICE: Final = 10
"""The writer thread's scheduling niceness (Linux: per thread): when the CPUs are busy the
kernel runs the threads that route first; the ring absorbs the writer's delay."""
IDLE_WAIT_S: Final = 0.05
"""How long the writer sleeps when the ring is empty."""
PENDING_MAX: Final = 1024 * 1024
"""Bytes of lines collected before they are written, at the latest (else every flush interval)."""
ZSTD_LEVEL: Final = 3
"""zstd's default level: about 9x smaller than the lines, hundreds of MB/s."""

_LOGGED: Final = frozenset({Decided, Closed})
_SAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
_FINISHED: Final = re.compile(r"events-(?P<name>.+)-(?P<boot>\d+)-(?P<index>\d{6})\.jsonl(?:\.zst)?")


class EventLogError(Exception):
    """The event log cannot start (its directory cannot be made or written); one line."""


def default_router_id(acceptors: Iterable[str]) -> str:
    """The router id when none is configured: the host name and the acceptor names."""
    return f"{os.uname().nodename}/{'+'.join(sorted(acceptors))}"


def file_name_part(router_id: str) -> str:
    """A router id as it appears in file names: letters, digits, `.`, `_` and `-` stay; any
    other character makes it `_` and adds a short hash of the whole id, so two ids never share
    a name."""
    safe = _SAFE.sub("_", router_id)
    if safe == router_id:
        return safe
    return f"{safe}_{hashlib.sha256(router_id.encode()).hexdigest()[:8]}"


@dataclass(slots=True)
class _Part:
    """The file in progress."""

    path: Path
    fd: int
    opened: float
    """Monotonic time it was opened."""
    size: int = 0
    """Bytes written to it (whole lines only)."""
    pending: list[bytes] = field(default_factory=list)
    """Lines not handed to the operating system yet (at most `PENDING_MAX` bytes, one flush
    interval): counted as written once they are."""
    pending_bytes: int = 0
    pending_events: int = 0


class EventLog:
    """One process's event log: the subscriber, the ring and the writer thread."""

    def __init__(
        self,
        config: EventLogConfig,
        router_id: str,
        key_types: Mapping[str, KeyType],
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Set up (nothing is opened until `start`).

        Args:
            config: `<event-log>`.
            router_id: this process in the lines (`default_router_id` when not configured).
            key_types: connection router name -> its key type (the raw key of a decision).
            metrics: where the counts go.
            clock: the wall clock (epoch seconds) of the lines' `ts`.
        """
        self.config = config
        self.router_id = router_id
        self._name = file_name_part(router_id)
        self._directory = Path(config.directory)
        self._key_types = dict(key_types)
        self._metrics = metrics
        self._clock = clock
        self._ring: Ring[tuple[float, Decided | Closed]] = Ring(config.ring_size)
        self._sequence = Sequence(0)
        self._boot = 0
        self._index = 0
        self._part: _Part | None = None
        self._unfinished: list[Path] = []
        """Files in progress that could not be finished yet (tried again at each rotation)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counted_drops = 0
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        metrics.sample_when_scraped(self._sample)

    # -- the reporting threads --

    def report(self, event: Event) -> None:
        """The subscriber: put a decision or a close into the ring (any reporting thread)."""
        if type(event) in _LOGGED:
            self._ring.put((self._clock(), event))  # type: ignore[arg-type]  # checked just above

    # -- control (the trio thread) --

    def start(self) -> None:
        """Make the directory, take a boot time, finish files a previous run left in progress,
        and start the writer thread.

        Raises:
            EventLogError: the directory cannot be made or written.
        """
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
            self._boot = self._take_boot()
            recovered = self._recover()
        except OSError as exc:
            raise EventLogError(
                f"event log directory {str(self._directory)!r}: {exc.strerror or exc}"
            ) from exc
        self._sequence = Sequence(self._boot)
        log.info(
            "event log: router_id=%s directory=%s ring-size=%d%s",
            self.router_id,
            self._directory,
            self._ring.size,
            f" (finished {recovered} file(s) left in progress)" if recovered else "",
        )
        self._thread = threading.Thread(target=self._run, name="event-log-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Write what is in the ring, finish the file in progress and end the writer thread.

        Returns:
            Whether the writer ended within `timeout_s`.
        """
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def resize(self, ring_size: int) -> None:
        """Change the ring size at run time (it takes effect as the ring drains).

        Raises:
            ValueError: `ring_size` < 1.
        """
        self._ring.resize(ring_size)
        log.info("event log: ring-size set to %d", ring_size)

    def status(self) -> dict[str, object]:
        """What the admin API shows."""
        part = self._part
        return {
            "router_id": self.router_id,
            "directory": str(self._directory),
            "ring_size": self._ring.size,
            "ring_used": len(self._ring),
            "events": self._ring.puts,
            "written": self.written,
            "dropped": self._ring.dropped,
            "lost": self.lost,
            "files": self.files,
            "current_file": None if part is None else part.path.name,
        }

    @property
    def written(self) -> int:
        """Events written so far (the metric's count: one place keeps it)."""
        return int(self._metrics.event_log_events.value(("written",)) or 0)

    @property
    def lost(self) -> int:
        """Events lost to write errors so far."""
        return int(self._metrics.event_log_events.value(("lost",)) or 0)

    @property
    def files(self) -> int:
        """Files finished so far."""
        return int(self._metrics.event_log_files.value(("finished",)) or 0)

    def _sample(self) -> None:
        metrics = self._metrics
        metrics.event_log_ring_size.set((), self._ring.size)
        metrics.event_log_ring_used.set((), len(self._ring))

    # -- the writer thread --

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # best effort (Linux only)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        flush_s = self.config.flush_interval_ms / 1000
        rotate_s = self.config.rotate_interval_ms / 1000
        last_flush = time.monotonic()
        while True:
            try:
                batch = self._ring.take(TAKE_BATCH)
                if batch:
                    self._write(batch)
                    time.sleep(0)  # releases the interpreter: a waiting data path takes it now
                elif self._stop.is_set():
                    break
                else:
                    self._stop.wait(IDLE_WAIT_S)
                now = time.monotonic()
                part = self._part
                if part is not None and (
                    part.size + part.pending_bytes >= self.config.rotate_size or now - part.opened >= rotate_s
                ):
                    self._finish_part()
                if now - last_flush >= flush_s:
                    last_flush = now
                    self._flush()
            except Exception:  # the writer must outlive a bug; routing goes on regardless
                log.exception("event log: writer error")
                self._stop.wait(1.0)
        try:
            self._flush()
            self._finish_part()
        except Exception:
            log.exception("event log: writer error at shutdown")
        log.info(
            "event log: stopped; events=%d written=%d dropped=%d lost=%d",
            self._ring.puts,
            self.written,
            self._ring.dropped,
            self.lost,
        )

    def _write(self, batch: list[tuple[int, tuple[float, Decided | Closed]]]) -> None:
        sequence, key_types, router_id = self._sequence, self._key_types, self.router_id
        lines = []
        for number, (when, event) in batch:
            lines.append(
                event_line(
                    event,
                    router_id=router_id,
                    seq=sequence.of(number),
                    conn=sequence.of(event.conn.id),
                    ts=timestamp(when),
                    key_type=key_types.get(event.conn.router, KeyType.SOURCE_IP),
                )
            )
        data = "".join(lines).encode("ascii")  # event_line escapes everything else
        part = self._part
        if part is None:
            try:
                part = self._open_part()
            except OSError as exc:
                self._lose(len(batch), exc)
                return
        part.pending.append(data)
        part.pending_bytes += len(data)
        part.pending_events += len(batch)
        if part.pending_bytes >= PENDING_MAX:
            self._hand_over(part)

    def _hand_over(self, part: _Part) -> bool:
        """Write what the file in progress has pending to the operating system; on a failure
        (disk full) cut the file back to its last whole line, count the events lost and close
        it (it is finished with the next rotation). False when it failed."""
        if not part.pending:
            return True
        data = b"".join(part.pending)
        events = part.pending_events
        part.pending.clear()
        part.pending_bytes = part.pending_events = 0
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(part.fd, view) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(part.fd, part.size)  # a partial line would corrupt the file
            self._lose(events, exc)
            self._part = None
            self._close(part)
            self._unfinished.append(part.path)
            return False
        part.size += len(data)
        self._metrics.event_log_events.inc(("written",), events)
        return True

    def _lose(self, count: int, exc: OSError) -> None:
        """Events could not be written: count them and say so."""
        self._metrics.event_log_events.inc(("lost",), count)
        log.warning("event log: %d event(s) lost: %s", count, exc.strerror or exc)

    @staticmethod
    def _close(part: _Part) -> None:
        with contextlib.suppress(OSError):
            os.close(part.fd)

    def _flush(self) -> None:
        part = self._part
        if part is not None:
            self._hand_over(part)
        dropped = self._ring.dropped
        if dropped > self._counted_drops:
            new = dropped - self._counted_drops
            self._counted_drops = dropped
            self._metrics.event_log_events.inc(("dropped",), new)
            log.warning(
                "event log: ring full: %d event(s) dropped (ring-size=%d); the writer falls behind",
                new,
                self._ring.size,
            )

    def _open_part(self) -> _Part:
        self._index += 1
        path = self._directory / f".events-{self._name}-{self._boot}-{self._index:06d}.jsonl.part"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._part = _Part(path=path, fd=fd, opened=time.monotonic())
        return self._part

    def _finish_part(self) -> None:
        part = self._part
        if part is None:
            return
        handed = self._hand_over(part)
        if handed:  # else it is closed and queued already
            self._part = None
            self._close(part)
            self._unfinished.append(part.path)
        # Files that could not be finished before (disk full) are tried again with each new one.
        self._unfinished = [path for path in self._unfinished if not self._finish(path)]

    def _final_path(self, part: Path) -> Path:
        name = part.name.removeprefix(".").removesuffix(".part")
        return part.with_name(name + ".zst" if self.config.compress else name)

    def _finish(self, part: Path) -> bool:
        """Make a file in progress a finished one, atomically; False when it failed (left in
        progress: finished at the next start)."""
        final = self._final_path(part)
        try:
            if part.stat().st_size == 0 or final.exists():  # empty, or finished before a crash
                part.unlink()
                return True
            if self.config.compress:
                temporary = part.with_name(f".{final.name}.tmp")
                with part.open("rb") as source, temporary.open("wb") as target:
                    self._compressor.copy_stream(source, target)
                    target.flush()
                    os.fsync(target.fileno())
                temporary.replace(final)
                _sync_directory(final.parent)
                part.unlink()
            else:
                with part.open("rb") as source:
                    os.fsync(source.fileno())
                part.replace(final)
                _sync_directory(final.parent)
        except OSError as exc:
            log.warning("event log: cannot finish %s: %s", part.name, exc.strerror or exc)
            return False
        self._metrics.event_log_files.inc(("finished",))
        self._keep_within_max_size()
        return True

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
            self._metrics.event_log_files.inc(("deleted",))
            log.warning(
                "event log: deleted %s (%d bytes): finished files over max-size=%d",
                path.name,
                size,
                self.config.max_size,
            )

    def _finished_files(self) -> list[tuple[tuple[int, int], int, Path]]:
        found = []
        for path in self._directory.iterdir():
            match = _FINISHED.fullmatch(path.name)
            if match is not None and match["name"] == self._name:
                with contextlib.suppress(OSError):
                    found.append(((int(match["boot"]), int(match["index"])), path.stat().st_size, path))
        return found

    # -- start --

    def _take_boot(self) -> int:
        """This process's boot time (epoch ms), above the last one kept in `.boot-ID`."""
        state = self._directory / f".boot-{self._name}"
        last = -1
        with contextlib.suppress(OSError, ValueError):
            last = int(state.read_text().strip())
        boot = max(int(self._clock() * 1000), last + 1)
        temporary = state.with_name(state.name + ".tmp")
        temporary.write_text(f"{boot}\n")
        temporary.replace(state)
        return boot

    def _recover(self) -> int:
        """Finish the files a previous run of this router id left in progress; how many."""
        for leftover in self._directory.glob(f".events-{self._name}-*.tmp"):
            leftover.unlink()  # a compression cut short; its part is still there
        count = 0
        for part in sorted(self._directory.glob(f".events-{self._name}-*.jsonl.part")):
            _cut_after_last_line(part)
            if self._finish(part):
                count += 1
        return count


def _cut_after_last_line(path: Path) -> None:
    """Drop a partial last line (a write cut short by a crash)."""
    with path.open("r+b") as file:
        end = file.seek(0, os.SEEK_END)
        position = end
        while position > 0:
            start = max(0, position - 65536)
            file.seek(start)
            chunk = file.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                if keep != end:
                    file.truncate(keep)
                return
            position = start
        file.truncate(0)


def _sync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
