"""The routing event log in routerd: every decision and every closed proxied connection as one
record, in rotating Parquet (or JSON lines) files that the PySpark pipeline reads
(docs/event-log.md); and the feature's service (`EventLogService`, router/feature.py), which opens
it at start (`open_files`: its directory and its writer process, before any listener), subscribes
it to each router's reports (`router_added`; `router_changed` when a reload changes a router's key
type) and, at exit, has what its ring holds written and the file finished (`close_files`).

Routing never waits for it. The subscriber (`EventLog.report`, one more `RouterRuntime` subscriber
beside the log lines and the metrics) records the event at once into the bounded ring of its
recorder (`recorder.py`: in C, one encoded record read from the event's slots; without the C
extension, the `event_values` tuple in `ring.py`'s ring). Once `SEND_BATCH` events are in the ring,
the reporting thread takes them and writes them as one frame to the writer process (`writer.py`)
itself, without waiting: the pipe is non-blocking, and what it does not take waits for the next send
(meanwhile the ring fills). A sender thread sends what is left when traffic is light (every
`SEND_INTERVAL_S`), at the end, and starts a writer that died again. Sending from the reporting
thread is cheaper than handing each batch to another thread: the events do not wait long enough in
the ring for the garbage collector to walk them, and the interpreter lock does not change hands.

The writer process encodes the records and writes, rotates, finishes and deletes the files
(`files.py`) and reports back what it did: the counts become metrics here, its log lines routerd's.
When the ring is full the oldest event is dropped, counted
(`router_event_log_events_total{outcome="dropped"}`) and logged (rate-limited); its `seq` is missing
from the files.

The writer outlives a kill -9 of routerd long enough to finish its file; one that dies is started
again (at most every `WRITER_RESTART_S`) and the events sent meanwhile are counted as lost.

`seq` and `conn` are `boot * BOOT_SPAN + n` (`event_format.schema.Sequence`); the boot time
is kept in `.boot-ID` and a new process starts above the last one, so a clock set back between two
runs cannot repeat a number.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import trio

from router.feature import OpenError, Service
from router.features.event_log.files import directory_error
from router.features.event_log.metrics import EventLogMetrics
from router.features.event_log.recorder import NATIVE, FrameError, make_recorder

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from keys import KeyType
    from router.config.settings import Config, EventLogConfig
    from router.core.events import Event
    from router.feature import Kernel
    from router.metrics import Metrics
    from router.runtime import RouterRuntime

__all__ = ["EventLog", "EventLogError", "EventLogService", "default_router_id", "file_name_part", "start"]

log = logging.getLogger("router.eventlog")
_exit_log = logging.getLogger("router.server")
"""The exit's lines are the process's (router/kept_files.py runs the files' last writes)."""

TAKE_BATCH: Final = 1024
"""Events taken from the ring and sent at a time, at most (one frame, one write)."""
SEND_BATCH: Final = 256
"""Events in the ring at which the reporting thread sends them itself (module docstring): a
frame of about 33 kB (native records; 20 kB `marshal`-ed), well within the pipe's buffer."""
SEND_INTERVAL_S: Final = 0.05
"""How often the sender thread sends what the reporting threads left in the ring (fewer than
`SEND_BATCH` events): each wake-up takes the interpreter from routing and wakes the writer
process, so events go in batches, not one by one."""
PIPE_BYTES: Final = 1024 * 1024
"""The pipe to the writer process holds this much (Linux's `pipe-max-size` default; 64 kB when
the system allows less): about a second of events at 15,000 connections a second, on top of the
ring, while the writer finishes a file."""
WRITER_START_S: Final = 30.0
"""How long the writer process may take to start and finish the files a previous run left."""
WRITER_RESTART_S: Final = 5.0
"""A writer process that died is started again at most this often."""

_SAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[3])
"""Where the `router` package is, for the writer process's `python -m`."""


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


class EventLog:
    """One routerd's event log: the subscriber, the ring, the sender thread and the writer process."""

    def __init__(
        self,
        config: EventLogConfig,
        router_id: str,
        key_types: Mapping[str, KeyType],
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        native: bool = True,
    ) -> None:
        """Set up (nothing is opened or started until `start`).

        Args:
            config: `<event-log>`.
            router_id: this process in the records (`default_router_id` when not configured).
            key_types: connection router name -> its key type (the raw key of a decision).
            metrics: where the counts go (its families: `EventLogMetrics`).
            clock: the wall clock (epoch seconds) of the records' `ts`.
            native: record in C when the extension is built (False: the Python recorder).
        """
        self.config = config
        self.router_id = router_id
        self._name = file_name_part(router_id)
        self._directory = Path(config.directory)
        self._key_types = dict(key_types)
        self._metrics = metrics.feature(EventLogMetrics)
        self._clock = clock
        self._ring = make_recorder(config.ring_size, self._key_types, clock, native=native)
        self._record = self._ring.record
        self._boot = 0
        self._stop = threading.Event()
        self._sending = threading.Lock()
        """Held while events are taken from the ring and written to the writer: the reporting
        threads only try it (another thread is sending: the ring keeps the events)."""
        self._frame: memoryview | None = None
        """What the pipe has not taken yet of the last frame (under `_sending`)."""
        self._frame_events = 0
        """Events in `_frame`."""
        self._broken = False
        """A write to the writer failed: the sender thread ends it and starts another."""
        self._send_at = SEND_BATCH
        """Events in the ring at which a reporting thread sends: `SEND_BATCH` more than the ring
        held when the pipe was last found full, so that a full pipe costs routing one attempt
        per `SEND_BATCH` events, not one per event (the sender thread waits for the pipe)."""
        self._sender: threading.Thread | None = None
        self._writer: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._started_at = 0.0
        """Monotonic time the writer process was last started."""
        self._current_file: str | None = None
        self._counted_drops = 0
        self._drops_logged_at = 0.0
        self._unloggable_logged = False
        self._sent = 0
        """Events sent to the writer process now running."""
        self._accounted = 0
        """Of which it reported written or lost."""
        metrics.sample_when_scraped(self._sample)

    def set_key_type(self, router: str, key_type: KeyType) -> None:
        """A configuration reload added a router or changed its key type (trio thread; one dict
        store, which the recorder reads without a lock)."""
        self._key_types[router] = key_type

    # -- the reporting threads --

    def report(self, event: Event) -> None:
        """The subscriber: record a decision or a close into the ring (any reporting thread;
        never raises)."""
        try:
            held = self._record(event)  # -1: not a decision or a close
        except Exception:  # a bug must not cost the connection its routing
            self._not_loggable(event)
            return
        if held >= self._send_at and self._sending.acquire(blocking=False):
            try:
                self._send_ready()
            except Exception:  # a bug: the sender thread mends the pipe; routing goes on
                self._broken = True
                log.exception("event log: send error (the writer process is started again)")
            finally:
                self._sending.release()

    def _not_loggable(self, event: Event) -> None:
        self._metrics.event_log_events.inc(("lost",))
        if not self._unloggable_logged:
            self._unloggable_logged = True
            log.exception("event log: cannot log %r (counted as lost; later ones are not logged)", event)

    # -- control (the trio thread) --

    def start(self) -> None:
        """Make the directory, take a boot time, start the writer process (which finishes the
        files a previous run left in progress) and the sender thread.

        Raises:
            EventLogError: the directory cannot be made or written, or the writer cannot start.
        """
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
            self._boot = self._take_boot()
        except OSError as exc:
            raise EventLogError(directory_error(str(self._directory), exc)) from exc
        recovered = self._start_writer()
        log.info(
            "event log: router_id=%s directory=%s ring-size=%d recorder=%s%s",
            self.router_id,
            self._directory,
            self._ring.size,
            self._ring.name,
            f" (finished {recovered} file(s) left in progress)" if recovered else "",
        )
        if not NATIVE:
            log.warning(
                "event log: the native recorder is not built (no C compiler at install?): the Python "
                "recorder costs routing more per connection (docs/event-log.md)"
            )
        self._sender = threading.Thread(target=self._run, name="event-log-sender", daemon=True)
        self._sender.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Send what is in the ring, then have the writer finish its file and end.

        Returns:
            Whether everything ended within `timeout_s`.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._stop.set()
        if self._sender is not None:
            self._sender.join(_left(deadline))
            if self._sender.is_alive():
                return False
        with self._sending:  # a reporting thread sends no more: the pipe closes
            writer, reader = self._writer, self._reader
            self._writer = None
            if writer is None or reader is None:
                return True
            _close_pipe(writer.stdin)
        try:
            writer.wait(_left(deadline))
        except subprocess.TimeoutExpired:
            return False  # it goes on finishing its file, and ends
        reader.join(_left(deadline))
        if reader.is_alive():
            return False
        if missing := self._frame_events + self._missed():
            self._lose(missing, f"the writer process ended (exit status {writer.returncode}) without them")
        return True

    def resize(self, ring_size: int) -> None:
        """Change the ring size at run time (it takes effect as the ring drains).

        Raises:
            ValueError: `ring_size` < 1.
        """
        self._ring.resize(ring_size)
        log.info("event log: ring-size set to %d", ring_size)

    def status(self) -> dict[str, object]:
        """What the admin API shows."""
        return {
            "router_id": self.router_id,
            "directory": str(self._directory),
            "recorder": self._ring.name,
            "ring_size": self._ring.size,
            "ring_used": len(self._ring),
            "events": self._ring.puts,
            "written": self.written,
            "dropped": self._ring.dropped,
            "lost": self.lost,
            "files": self.files,
            "current_file": self._current_file,
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

    # -- sending (a reporting thread or the sender thread, under `_sending`) --

    def _send_ready(self) -> bool:
        """Write what the pipe has not taken of the last frame, then a frame of the oldest events
        in the ring, without waiting. Whether all of it was written (False: the pipe is full,
        broken, or there is no writer: a reporting thread tries again `SEND_BATCH` events later)."""
        sent = self._send_frame()
        self._send_at = SEND_BATCH if sent else len(self._ring) + SEND_BATCH
        return sent

    def _send_frame(self) -> bool:
        writer = self._writer
        if writer is None or writer.stdin is None or self._broken:
            return False
        if self._frame is not None and not self._write_frame(writer.stdin.fileno()):
            return False
        try:
            frame, events = self._ring.take_frame(TAKE_BATCH)
        except FrameError as exc:  # a value marshal cannot write (a bug's): the batch is lost, counted
            self._lose(exc.events, str(exc))
            return True
        if not events:
            return True
        self._frame, self._frame_events = memoryview(frame), events
        return self._write_frame(writer.stdin.fileno())

    def _write_frame(self, fd: int) -> bool:
        view = self._frame
        assert view is not None, "a frame to write"
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BlockingIOError:
            self._frame = view
            return False
        except OSError:  # the writer ended: the sender thread counts the frame lost
            self._frame = view
            self._broken = True
            return False
        self._sent += self._frame_events
        self._frame, self._frame_events = None, 0
        return True

    # -- the sender thread --

    def _run(self) -> None:
        while True:
            try:
                with self._sending:
                    self._mend()
                    caught_up = self._send_all()
                if caught_up and self._stop.is_set():
                    break
                self._wait(caught_up)
                self._count_drops()
            except Exception:  # the sender must outlive a bug; routing goes on regardless
                log.exception("event log: sender error")
                self._stop.wait(1.0)
        self._count_drops(final=True)
        log.info(
            "event log: stopped; events=%d dropped=%d (the writer reports what it wrote)",
            self._ring.puts,
            self._ring.dropped,
        )

    def _send_all(self) -> bool:
        """Send the ring's events until it is empty (True) or the pipe is full (False); without a
        writer process, they are lost."""
        while True:
            if self._writer is None:
                taken = self._ring.discard(TAKE_BATCH)
                if not taken:
                    return True
                self._lose(taken, "no writer process")
            elif not self._send_ready():
                return False  # the pipe is full, or broken (mended on the next round)
            elif self._frame is None and not len(self._ring):
                return True

    def _wait(self, caught_up: bool) -> None:
        """Until the next round: `SEND_INTERVAL_S`, or until the pipe takes more (or the stop)."""
        writer = self._writer
        if caught_up or writer is None or writer.stdin is None or self._broken:
            self._stop.wait(SEND_INTERVAL_S)
            return
        with contextlib.suppress(OSError, ValueError):  # closed meanwhile: the next round mends it
            select.select([], [writer.stdin], [], SEND_INTERVAL_S)

    def _mend(self) -> None:
        """End a writer whose pipe broke and count what it lost; start another one when due."""
        writer = self._writer
        if self._broken and writer is not None:
            self._writer, self._broken = None, False
            _close_pipe(writer.stdin)
            with contextlib.suppress(subprocess.TimeoutExpired):
                writer.wait(WRITER_START_S)
            if self._reader is not None:
                self._reader.join(WRITER_START_S)  # its last reports, then EOF
            self._lose(
                self._frame_events + self._missed(),
                f"the writer process ended (exit status {writer.returncode}); another one starts "
                f"within {WRITER_RESTART_S:g} s",
            )
            self._frame, self._frame_events = None, 0
        if self._writer is None and time.monotonic() - self._started_at >= WRITER_RESTART_S:
            try:
                self._start_writer()
            except EventLogError as exc:
                log.error("%s", exc)

    def _missed(self) -> int:
        """Of the events sent to the writer that ended, those it neither wrote nor counted lost
        (once its reports are all read)."""
        return self._sent - self._accounted

    def _lose(self, count: int, why: str) -> None:
        self._metrics.event_log_events.inc(("lost",), count)
        log.warning("event log: %d event(s) lost: %s", count, why)

    def _count_drops(self, *, final: bool = False) -> None:
        """Count the events the ring dropped, and say so at most once a second."""
        dropped = self._ring.dropped
        if dropped == self._counted_drops:
            return
        now = time.monotonic()
        if not final and now - self._drops_logged_at < 1.0:
            return
        new = dropped - self._counted_drops
        self._counted_drops = dropped
        self._drops_logged_at = now
        self._metrics.event_log_events.inc(("dropped",), new)
        log.warning(
            "event log: ring full: %d event(s) dropped (ring-size=%d); the writer falls behind",
            new,
            self._ring.size,
        )

    # -- the writer process --

    def _start_writer(self) -> int:
        """Start a writer process and wait until it has finished what a previous run left in
        progress: how many files that was.

        Raises:
            EventLogError: it failed to start, said why, or did not answer in time.
        """
        # Imported here, not with the module: `python -m` of the writer imports its package, this
        # module with it, and a module imported before `-m` runs it would run twice (runpy warns).
        from router.features.event_log.writer import settings_argument

        self._started_at = time.monotonic()
        python_path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        try:
            writer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "router.features.event_log.writer",
                    settings_argument(self.config, self.router_id, self._name, self._boot),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                env={**os.environ, "PYTHONPATH": python_path},
                start_new_session=True,  # a Ctrl-C reaches routerd, which stops the writer
            )
        except OSError as exc:
            raise EventLogError(f"event log: cannot start the writer process: {exc}") from exc
        answer: queue.Queue[dict[str, object] | None] = queue.Queue()
        reader = threading.Thread(
            target=self._read_reports, args=(writer, answer), name="event-log-reports", daemon=True
        )
        reader.start()
        try:
            first = answer.get(timeout=WRITER_START_S)
        except queue.Empty:
            first = {"failed": f"event log: the writer process did not start within {WRITER_START_S:g} s"}
        if first is None or "failed" in first:
            _close_pipe(writer.stdin)
            with contextlib.suppress(OSError):
                writer.kill()  # ours, by its PID
            writer.wait()
            reader.join()
            why = f"event log: the writer process ended at start (exit status {writer.returncode})"
            raise EventLogError(why if first is None else str(first["failed"]))
        assert writer.stdin is not None, "started with stdin=PIPE"
        with contextlib.suppress(OSError):  # not allowed this big: the system's default
            fcntl.fcntl(writer.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(writer.stdin.fileno(), False)  # routing never waits for the writer
        self._writer, self._reader = writer, reader
        self._sent = self._accounted = 0
        recovered = first["ready"]
        assert isinstance(recovered, int), first  # the writer's protocol
        return recovered

    def _read_reports(
        self, writer: subprocess.Popen[bytes], answer: queue.Queue[dict[str, object] | None]
    ) -> None:
        """The reports thread: the writer's messages become metrics and log lines."""
        assert writer.stdout is not None
        metrics = self._metrics
        # Buffered: the pipe is raw (bufsize=0, for the sender's os.write), and a raw file's lines
        # are read a byte per system call, each taking the interpreter lock from the data path.
        reports = open(writer.stdout.fileno(), "rb", closefd=False)  # noqa: SIM115  # closed below
        for line in reports:
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("event log: the writer said %r", line[:200])
                continue
            counts = message.get("counts")
            if counts is not None:
                for outcome in ("written", "lost"):
                    if counts.get(outcome):
                        metrics.event_log_events.inc((outcome,), counts[outcome])
                        self._accounted += counts[outcome]
                for outcome in ("finished", "deleted"):
                    if counts.get(outcome):
                        metrics.event_log_files.inc((outcome,), counts[outcome])
                self._current_file = message.get("file")
            elif "log" in message:
                level, text = message["log"]
                log.log(level, "%s", text)
            else:
                answer.put(message)
        reports.close()
        writer.stdout.close()
        self._current_file = None
        answer.put(None)

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


def start(kernel: Kernel) -> EventLogService:
    """The feature's service for one routerd."""
    return EventLogService(kernel.config, kernel.metrics)


class EventLogService(Service):
    """One routerd's event log, when `<event-log>` (or `routerd --event-log DIR`) turns it on."""

    def __init__(self, config: Callable[[], Config], metrics: Metrics) -> None:
        self._config = config
        """The configuration in force (the event log's own section does not change on a reload:
        router/core/reload.py)."""
        self._metrics = metrics
        self.event_log: EventLog | None = None
        """The running log (the admin API's `/api/v1/event-log`); None while it is off."""

    def open_files(self) -> None:
        """Start the event log when it is configured, writing (its router id: the configured one,
        else `default_router_id`).

        Raises:
            OpenError: its directory cannot be made or written, or its writer cannot start.
        """
        config = self._config()
        settings = config.event_log
        if settings is None:
            return
        router_id = settings.router_id or default_router_id(a.name for a in config.acceptors)
        key_types = {r.name: r.key_type for r in config.routers}
        event_log = EventLog(settings, router_id, key_types, self._metrics)
        try:
            event_log.start()
        except EventLogError as exc:
            raise OpenError(str(exc)) from exc
        self.event_log = event_log

    def router_added(self, runtime: RouterRuntime) -> None:
        """Log the router's decisions and closes, with its key type."""
        if self.event_log is not None:
            self.event_log.set_key_type(runtime.name, runtime.config.key_type)
            runtime.report.subscribe(self.event_log.report)

    def router_changed(self, runtime: RouterRuntime) -> None:
        """The router's key type may have changed."""
        if self.event_log is not None:
            self.event_log.set_key_type(runtime.name, runtime.config.key_type)

    async def close_files(self, timeout_s: float) -> None:
        """What the ring holds is sent to the writer process, which finishes its file."""
        event_log = self.event_log
        if event_log is None:
            return
        if not await trio.to_thread.run_sync(event_log.stop, timeout_s, abandon_on_cancel=True):
            _exit_log.error(
                "event log %s: the writer did not finish within %g s (a hung or frozen filesystem?): "
                "events not yet written may be lost",
                event_log.config.directory,
                timeout_s,
            )


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _close_pipe(pipe: IO[bytes] | None) -> None:
    if pipe is not None:
        with contextlib.suppress(OSError):
            pipe.close()
