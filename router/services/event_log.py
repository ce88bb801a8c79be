"""The routing event log: every decision and every closed proxied connection as one record, in
rotating Parquet (or JSON lines) files that the PySpark pipeline reads (docs/event-log.md).

Routing never waits for it. The subscriber (`EventLog.report`, one more `RouterRuntime` subscriber
beside the log lines and the metrics) takes the event's values at once (`event_values`: a flat
tuple, while the event is fresh) and puts them into the bounded ring (`router.core.ring`) under a
lock. A sender thread takes them from the ring in batches and writes them, `marshal`-ed, to the
writer process (`router/services/event_writer.py`), which encodes the records and writes, rotates,
finishes and deletes the files (`router/services/event_files.py`) and reports back what it did:
the counts become metrics here, its log lines routerd's. When the ring is full the oldest event is
dropped, counted (`router_event_log_events_total{outcome="dropped"}`) and logged (rate-limited);
its `seq` is missing from the files.

The writer outlives a kill -9 of routerd long enough to finish its file; one that dies is started
again (at most every `WRITER_RESTART_S`) and the events sent meanwhile are counted as lost.

`seq` and `conn` are `boot * BOOT_SPAN + n` (`router.core.event_records.Sequence`); the boot time
is kept in `.boot-ID` and a new process starts above the last one, so a clock set back between two
runs cannot repeat a number.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from keys import KeyType
from router.core.event_records import event_values
from router.core.events import Closed, Decided
from router.core.ring import Ring
from router.services.event_files import directory_error
from router.services.event_writer import encode_frame, settings_argument

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from router.config.settings import EventLogConfig
    from router.core.event_records import EventValues
    from router.core.events import Event
    from router.metrics import Metrics

__all__ = ["EventLog", "EventLogError", "default_router_id", "file_name_part"]

log = logging.getLogger("router.eventlog")

TAKE_BATCH: Final = 1024
"""Events the sender takes from the ring and sends at a time (one `marshal` and one write)."""
SEND_INTERVAL_S: Final = 0.05
"""How long the sender sleeps once it has caught up with the ring: each wake-up takes the
interpreter from routing and wakes the writer process, so events go in batches, not one by one."""
WRITER_START_S: Final = 30.0
"""How long the writer process may take to start and finish the files a previous run left."""
WRITER_RESTART_S: Final = 5.0
"""A writer process that died is started again at most this often."""

_LOGGED: Final = frozenset({Decided, Closed})
_SAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[2])
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
    ) -> None:
        """Set up (nothing is opened or started until `start`).

        Args:
            config: `<event-log>`.
            router_id: this process in the records (`default_router_id` when not configured).
            key_types: connection router name -> its key type (the raw key of a decision).
            metrics: where the counts go.
            clock: the wall clock (epoch seconds) of the records' `ts`.
        """
        self.config = config
        self.router_id = router_id
        self._name = file_name_part(router_id)
        self._directory = Path(config.directory)
        self._key_types = dict(key_types)
        self._metrics = metrics
        self._clock = clock
        self._ring: Ring[EventValues] = Ring(config.ring_size)
        self._boot = 0
        self._stop = threading.Event()
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
        store, which the reporting threads read without a lock)."""
        self._key_types[router] = key_type

    # -- the reporting threads --

    def report(self, event: Event) -> None:
        """The subscriber: put a decision's or a close's values into the ring (any reporting
        thread; never raises)."""
        if type(event) in _LOGGED:
            try:
                key_type = self._key_types.get(event.conn.router, KeyType.SOURCE_IP)  # type: ignore[union-attr]
                values = event_values(event, key_type, self._clock())  # type: ignore[arg-type]  # checked above
            except Exception:  # a bug must not cost the connection its routing
                self._not_loggable(event)
                return
            self._ring.put(values)

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
            "event log: router_id=%s directory=%s ring-size=%d%s",
            self.router_id,
            self._directory,
            self._ring.size,
            f" (finished {recovered} file(s) left in progress)" if recovered else "",
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
        writer, reader = self._writer, self._reader
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
        if missing := self._missed():
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

    # -- the sender thread --

    def _run(self) -> None:
        while True:
            try:
                batch = self._ring.take(TAKE_BATCH)
                if batch:
                    self._send(batch)
                elif self._stop.is_set():
                    break
                if len(batch) < TAKE_BATCH:  # caught up: wait for more rather than send a few at a time
                    self._stop.wait(SEND_INTERVAL_S)
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

    def _send(self, batch: list[tuple[int, EventValues]]) -> None:
        writer = self._writer
        if writer is None and time.monotonic() - self._started_at >= WRITER_RESTART_S:
            try:
                self._start_writer()
            except EventLogError as exc:
                log.error("%s", exc)
            writer = self._writer
        if writer is None or writer.stdin is None:
            self._lose(len(batch), "no writer process")
            return
        try:
            view = memoryview(encode_frame(batch))
            while view:
                view = view[os.write(writer.stdin.fileno(), view) :]
        except OSError:
            self._writer = None
            _close_pipe(writer.stdin)
            with contextlib.suppress(subprocess.TimeoutExpired):
                writer.wait(WRITER_START_S)
            if self._reader is not None:
                self._reader.join(WRITER_START_S)  # its last reports, then EOF
            self._lose(
                len(batch) + self._missed(),
                f"the writer process ended (exit status {writer.returncode}); another one starts "
                f"within {WRITER_RESTART_S:g} s",
            )
            return
        self._sent += len(batch)

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
        self._started_at = time.monotonic()
        python_path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        try:
            writer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "router.services.event_writer",
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


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _close_pipe(pipe: IO[bytes] | None) -> None:
    if pipe is not None:
        with contextlib.suppress(OSError):
            pipe.close()
