"""The per-connection INFO lines of `router.conn` through a buffer, as nginx's `access_log buffer=`.

A proxied connection writes two INFO lines (`outcome=OK`, then `closed`), a redirect or a refusal
one. Through `logging` each costs a `LogRecord`, the handler's lock, the `Formatter` and a
`write(2)` with a flush: about 90,000 instructions, as much as the rest of the connection's work
in Python (measured with callgrind, ../shared/research/native-path.md §5). routerd installs
`ConnLines` on its one stderr handler instead (`install`): the line is formatted here with the
same text (routerd's format, `ROUTERD_FORMAT`, and the same timestamp: `install` checks the
handler formats a record so), appended to a buffer, and written with one `write` when the buffer holds
`FLUSH_BYTES`, every `FLUSH_INTERVAL_S` (routerd's task calls `flush`), before any other line the
process logs (a filter on the handler flushes first, so every line keeps its order) and at exit.

Only INFO lines of `router.conn` go this way (router/reports.py's `info`); WARNING and above go
through `logging` and its `LogLimiter`. Without `install` (tests in process, an embedding
application, a handler routerd did not make), `info` is `logging`'s.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

__all__ = [
    "FLUSH_BYTES",
    "FLUSH_INTERVAL_S",
    "ROUTERD_FORMAT",
    "ConnLines",
    "flush",
    "info",
    "install",
    "log",
]

ROUTERD_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""routerd's log format (router/cli.py's `logging.basicConfig`): what the buffered lines repeat."""
FLUSH_BYTES: Final = 64 * 1024
"""A buffer this full is written at once (nginx's `buffer=64k`)."""
FLUSH_INTERVAL_S: Final = 0.1
"""How often routerd writes what the buffer holds: a line is never later than this."""

conn_log = logging.getLogger("router.conn")


class ConnLines:
    """The buffer of `router.conn`'s INFO lines and its writes to one stream."""

    __slots__ = ("_clock", "_lines", "_lock", "_second", "_size", "_stamp", "_stream", "_write_lock")

    def __init__(
        self, stream: TextIO, write_lock: threading.RLock, clock: Callable[[], float] = time.time
    ) -> None:
        """Buffer lines for `stream`.

        Args:
            stream: where the handler writes (routerd: stderr).
            write_lock: the handler's own lock, held around each write so that a buffer and a line
                `logging` writes never interleave.
            clock: the wall clock (`time.time`, as `LogRecord.created`).
        """
        self._stream = stream
        self._write_lock = write_lock
        self._clock = clock
        self._lines: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        self._second = -1
        self._stamp = ""

    def info(self, message: str) -> None:
        """Buffer one INFO line of `router.conn` (from any thread)."""
        now = self._clock()
        second = int(now)
        if second != self._second:  # `Formatter.formatTime`'s default: local time, then ",mmm"
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._second = second
        line = f"{self._stamp},{int((now - second) * 1000):03d} INFO router.conn: {message}\n"
        self._lines.append(line)
        self._size += len(line)
        if self._size >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write what the buffer holds (one `write`), in order, whichever thread calls."""
        with self._lock:
            if not self._lines:
                return
            lines, self._lines, self._size = self._lines, [], 0
            text = "".join(lines)
            with self._write_lock:
                try:
                    self._stream.write(text)
                    self._stream.flush()
                except (OSError, ValueError):  # stderr closed or broken: as logging, lose the lines
                    pass


class _FlushFirst(logging.Filter):
    """On routerd's handler: the buffered lines go out before any line `logging` writes."""

    def __init__(self, lines: ConnLines) -> None:
        super().__init__()
        self.lines = lines

    def filter(self, record: logging.LogRecord) -> bool:
        self.lines.flush()
        return True


_installed: ConnLines | None = None


def install() -> bool:
    """Buffer `router.conn`'s INFO lines when logging is routerd's: the root logger's one handler
    writes to a stream and formats a record as `ROUTERD_FORMAT` with the default date format does,
    and `router.conn` has no handler of its own. Call it once logging is configured (routerd's
    `main_routerd`).

    Returns:
        Whether it installed the buffer (False: lines go through `logging`, as before).
    """
    global _installed  # the process's one buffer, like logging's own state
    handlers = logging.getLogger().handlers
    if _installed is not None or len(handlers) != 1 or conn_log.handlers or not conn_log.propagate:
        return False
    handler = handlers[0]
    if (
        not isinstance(handler, logging.StreamHandler)
        or handler.lock is None
        or not _formats_as_routerd(handler)
    ):
        return False
    lines = ConnLines(handler.stream, handler.lock)
    handler.filters.insert(0, _FlushFirst(lines))  # before a LogLimiter: its lines come after ours
    atexit.register(lines.flush)
    _installed = lines
    return True


def _formats_as_routerd(handler: logging.Handler) -> bool:
    """Whether the handler's formatter writes a line as `ConnLines` does (tried on a record)."""
    probe = logging.LogRecord(conn_log.name, logging.INFO, __file__, 0, "probe %s", ("line",), None)
    probe.created, probe.msecs = 0.25, 250.0
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(0))
    formatter = handler.formatter or logging.Formatter()
    return formatter.format(probe) == f"{stamp},250 INFO router.conn: probe line"


def info(message: str, *args: object) -> None:
    """`conn_log.info(message, *args)`, through the buffer when it is installed (the caller has
    checked that INFO is enabled for `router.conn`)."""
    lines = _installed
    if lines is None:
        conn_log.info(message, *args)
    else:
        lines.info(message % args)


def log(level: int, message: str, *args: object) -> None:
    """`conn_log.log(level, message, *args)`: INFO through `info`, the rest through `logging`."""
    if level == logging.INFO:
        info(message, *args)
    else:
        conn_log.log(level, message, *args)


def flush() -> None:
    """Write the buffered lines now (routerd calls it every `FLUSH_INTERVAL_S`)."""
    if _installed is not None:
        _installed.flush()
