"""The event log's writer process: it turns the events routerd sends into files (Parquet or JSON
lines, `event_format.files.FileFormat`), so that neither the encoding nor the files cost the routing
process's interpreter (measured: formatting
in a thread of routerd cost a sixth of its short-connection rate; docs/event-log.md).

    python -m router.features.event_log.writer SETTINGS_JSON

routerd (`router/features/event_log/service.py`) starts it and talks to it over two pipes:

* **stdin**: frames of events (`event_format/frames.py`: each a 4-byte little-endian
  length and the events, as encoded records or a `marshal`-ed list of `(number, event_values)`,
  with the ring's number of each). EOF means routerd
  stopped, or died: the writer finishes its file and exits either way, so a kill -9 of routerd
  loses only what its ring held.
* **stdout**: one JSON object per line: `{"ready": N}` once the files a previous run left in
  progress are finished (N of them), or `{"failed": MESSAGE}` and exit 1; then
  `{"counts": {"written": n, "lost": n, "finished": n, "deleted": n}, "file": NAME}` (what
  happened since the last one, and the file in progress) and `{"log": [LEVEL, MESSAGE]}` (routerd
  logs it as its own line).

It ignores SIGINT and SIGTERM (a Ctrl-C or a service stop reaches the whole process group: routerd
stops it by closing the pipe, after the ring is written) and runs at niceness `WRITER_NICE`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Final

from event_format.frames import FRAME_HEAD, FRAME_MAX, decode_frame
from event_format.lines import JsonLines
from router.config.settings import EventFileFormat, EventLogConfig
from router.features.event_log.files import EventFiles, directory_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from event_format.files import FileFormat

__all__ = ["WRITER_NICE", "file_format", "main", "settings_argument"]

WRITER_NICE: Final = 10
"""The writer's scheduling niceness: when the CPUs are busy the kernel runs routing first; the
ring absorbs the writer's delay."""
GC_YOUNG_THRESHOLD: Final = 100_000
"""Allocations between the writer's young garbage collections (`main`)."""
READ_PAUSE_S: Final = 0.1
"""How long the writer lets events gather in the pipe after a read of fewer than `PAUSE_BELOW`
bytes (at most the flush interval): routerd sends a frame every few hundred events, and a writer
woken for each frame takes the second CPU from the load it serves more often than the events need
(the pipe holds about a second of them, and routerd's ring more). A writer with a backlog reads
on without a pause."""
PAUSE_BELOW: Final = 256 * 1024
"""A read of fewer bytes than this (about 3,000 events) means the writer has caught up."""
_READ_SIZE: Final = 1024 * 1024

log = logging.getLogger("router.eventlog")


def settings_argument(config: EventLogConfig, router_id: str, name: str, boot: int) -> str:
    """The writer's one argument: its settings as JSON."""
    fields = dataclasses.asdict(config) | {"format": config.format.value}
    return json.dumps({"config": fields, "router_id": router_id, "name": name, "boot": boot})


def file_format(config: EventLogConfig, router_id: str, boot: int) -> FileFormat:
    """The configured format's writer."""
    return _format_types()[config.format](router_id, boot)


def _format_types() -> dict[EventFileFormat, Callable[[str, int], FileFormat]]:
    from event_format.parquet import ParquetFormat  # pyarrow: in the writer process only

    return {EventFileFormat.PARQUET: ParquetFormat, EventFileFormat.JSONL: JsonLines}


class _Reports(logging.Handler):
    """Sends the writer's log records to routerd, which logs them."""

    def emit(self, record: logging.LogRecord) -> None:
        _send({"log": [record.levelno, record.getMessage()]})


def _send(message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


class _Writer:
    """Frames in, events to the files, reports out."""

    def __init__(self, files: EventFiles) -> None:
        self.files = files
        self._rest: list[bytes] = []
        """The reads a frame spans, while it is not whole (its start, then what came after it)."""
        self._rest_size = 0
        self._rest_needed = 0
        """Bytes the first frame in `_rest` needs (its head's, until the head is whole)."""
        self._reported_file: str | None = None

    def feed(self, chunk: bytes) -> None:
        """Bytes from stdin: write every complete frame. The frames are slices of the read, not
        copies (a native batch holds on to its read until it is encoded); a frame cut by reads is
        joined once, when it is whole.

        Raises:
            ValueError: a frame longer than `FRAME_MAX`, or not a frame (the stream is broken).
        """
        if self._rest:
            self._rest.append(chunk)
            self._rest_size += len(chunk)
            if self._rest_size < self._rest_needed:
                return
            chunk = b"".join(self._rest)
            self._rest = []
        data = memoryview(chunk)
        start = 0
        needed = FRAME_HEAD.size
        while len(data) - start >= FRAME_HEAD.size:
            (size,) = FRAME_HEAD.unpack_from(data, start)
            if size > FRAME_MAX:
                raise ValueError(f"a frame of {size} bytes (at most {FRAME_MAX})")
            end = start + FRAME_HEAD.size + size
            if len(data) < end:
                needed = FRAME_HEAD.size + size
                break
            self.files.add(decode_frame(data[start + FRAME_HEAD.size : end]))
            start = end
        if start < len(data):
            self._rest = [bytes(data[start:])]
            self._rest_size, self._rest_needed = len(data) - start, needed

    def report(self) -> None:
        """Send what happened since the last report, if anything did."""
        counts = self.files.tally.take()
        current = self.files.current_file
        if counts or current != self._reported_file:
            self._reported_file = current
            _send({"counts": counts, "file": current})


def main(argv: list[str] | None = None) -> int:
    """Run the writer until stdin ends; the exit status (0, or 1 when it could not start)."""
    arguments = sys.argv[1:] if argv is None else argv
    settings = json.loads(arguments[0])
    fields = settings["config"]
    config = EventLogConfig(**(fields | {"format": EventFileFormat(fields["format"])}))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(WRITER_NICE)
    # Young collections 140 times rarer than the default's (every 700 allocations): the events
    # waiting for a hand-over are tuples, which each collection walked. Measured with
    # `python -m benchmarks.studies.pipeline --only event-log`: Parquet 2.1-2.3 µs of CPU per event
    # against 3.0-3.3. The collector stays on: a cycle is still collected.
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    log.addHandler(_Reports())
    log.setLevel(logging.INFO)
    log.propagate = False
    formats = {name: make(settings["router_id"], settings["boot"]) for name, make in _format_types().items()}
    chosen = formats.pop(config.format)
    files = EventFiles(config, settings["name"], settings["boot"], chosen, tuple(formats.values()))
    try:
        recovered = files.recover()
    except OSError as exc:
        _send({"failed": directory_error(config.directory, exc)})
        return 1
    writer = _Writer(files)
    _send({"ready": recovered})
    writer.report()
    _run(writer, config)
    files.finish_part()
    writer.report()
    return 0


def _run(writer: _Writer, config: EventLogConfig) -> None:
    files = writer.files
    flush_s = config.flush_interval_ms / 1000
    pause_s = min(READ_PAUSE_S, flush_s)
    last_flush = time.monotonic()
    stdin = sys.stdin.fileno()
    while True:
        now = time.monotonic()
        wake = last_flush + flush_s
        due = files.rotation_due()
        if due is not None:
            wake = min(wake, due)
        readable, _, _ = select.select([stdin], [], [], max(0.0, wake - now))
        caught_up = False
        if readable:
            chunk = os.read(stdin, _READ_SIZE)
            if not chunk:
                return  # routerd closed the pipe, or ended
            caught_up = len(chunk) < PAUSE_BELOW
            try:
                writer.feed(chunk)
            except ValueError as exc:
                log.error("event log: the writer's input is broken (%s); it stops", exc)
                return
        now = time.monotonic()
        flush = now - last_flush >= flush_s
        if flush:
            last_flush = now
        files.tick(now, flush=flush)
        writer.report()
        if caught_up:  # the pipe is empty now: let the next events gather in it
            time.sleep(pause_s)


if __name__ == "__main__":
    sys.exit(main())
