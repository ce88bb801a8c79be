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

Only INFO lines of `router.conn` go this way (router/reports.py's `info`, `connected` and
`closed`); WARNING and above go through `logging` and its `LogLimiter`. Without `install` (tests
in process, an embedding application, a handler routerd did not make), they are `logging`'s.

The buffer is C's when the extension `router._conn_lines` (router/_conn_lines.c) is built
(`NativeConnLines`): the two lines of every proxied connection (`connected`, `closed`) are then
formatted there from their fields, client-chosen values through a C port of `logs.shown`: at
INFO a proxied connection's two lines cost routerd's data path 13,000 instructions instead of
34,000 (callgrind, `benchmarks/bench --only instructions --routerd-log-level INFO`), and about
9,000 when the native core writes those of its lean connections itself (`line_writers`). `ConnLines`
is the Python buffer: the fallback, and the reference the C one is tested against, line for line.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

from router.logs import shown

try:
    from router import _conn_lines  # type: ignore[attr-defined]  # the C extension has no stubs
except ImportError:  # built without a C compiler: the Python buffer formats the lines
    _conn_lines = None

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import TextIO

__all__ = [
    "CLOSED_LINE",
    "CONNECTED_LINE",
    "EXTENSION",
    "FLUSH_BYTES",
    "FLUSH_INTERVAL_S",
    "NATIVE",
    "ROUTERD_FORMAT",
    "ConnLines",
    "NativeConnLines",
    "closed",
    "connected",
    "flush",
    "info",
    "install",
    "line_writers",
    "log",
]

ROUTERD_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""routerd's log format (router/cli.py's `logging.basicConfig`): what the buffered lines repeat."""
FLUSH_BYTES: Final = 64 * 1024
"""A buffer this full is written at once (nginx's `buffer=64k`)."""
FLUSH_INTERVAL_S: Final = 0.1
"""How often routerd writes what the buffer holds: a line is never later than this."""

CONNECTED_LINE: Final = "peer=%s router=%s key=%s target=%s outcome=OK"
"""A proxied connection's line once its target answered the connect (its key through `shown`)."""
CLOSED_LINE: Final = "peer=%s router=%s target=%s closed bytes_in=%d bytes_out=%d duration_s=%.3f reason=%s%s"
"""A proxied connection's line once it ended; the last field is `closed_detail`'s."""
EXTENSION: Final[ModuleType | None] = _conn_lines
"""`router._conn_lines` (router/_conn_lines.c), or None when it is not built."""
NATIVE: Final = _conn_lines is not None
"""Whether the C buffer is built."""

conn_log = logging.getLogger("router.conn")


class Address(Protocol):
    """A peer as the lines print it (router/core/address.py's, a layer above this one)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


def closed_detail(detail: str) -> str:
    """The end of a `CLOSED_LINE`: the close's detail, when it has one, through `shown`."""
    return f" ({shown(detail)})" if detail else ""


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

    def connected(self, peer: Address, router: str, key: str, node_id: str) -> None:
        """Buffer a proxied connection's `CONNECTED_LINE`."""
        self.info(CONNECTED_LINE % (peer, router, shown(key), node_id))

    def closed(
        self,
        peer: Address,
        router: str,
        node_id: str,
        bytes_in: int,
        bytes_out: int,
        duration_s: float,
        reason: str,
        detail: str,
    ) -> None:
        """Buffer a proxied connection's `CLOSED_LINE`."""
        args = (peer, router, node_id, bytes_in, bytes_out, duration_s, reason, closed_detail(detail))
        self.info(CLOSED_LINE % args)

    def flush(self) -> None:
        """Write what the buffer holds (one `write`), in order, whichever thread calls."""
        with self._lock:
            text = self._take()
            if not text:
                return
            with self._write_lock:
                try:
                    self._stream.write(text)
                    self._stream.flush()
                except (OSError, ValueError):  # stderr closed or broken: as logging, lose the lines
                    pass

    def _take(self) -> str:
        """The buffered lines, the buffer left empty (under `_lock`)."""
        if not self._lines:
            return ""
        lines, self._lines, self._size = self._lines, [], 0
        return "".join(lines)


class NativeConnLines(ConnLines):
    """`ConnLines` with the lines formatted and buffered in C (router/_conn_lines.c)."""

    __slots__ = ("_c", "_now")

    def __init__(
        self, stream: TextIO, write_lock: threading.RLock, clock: Callable[[], float] = time.time
    ) -> None:
        assert _conn_lines is not None, "NativeConnLines needs router._conn_lines (NATIVE)"
        super().__init__(stream, write_lock, clock)
        self._c = _conn_lines.Lines(FLUSH_BYTES)
        self._now = None if clock is time.time else clock
        """None: C reads the wall clock itself (`time.time`'s); a test's clock is passed on."""

    def info(self, message: str) -> None:
        now = self._now
        if self._c.info(message) if now is None else self._c.info(message, now()):
            self.flush()

    def connected(self, peer: Address, router: str, key: str, node_id: str) -> None:
        now = self._now
        if now is None:
            full = self._c.connected(peer.host, peer.port, router, key, node_id)
        else:
            full = self._c.connected(peer.host, peer.port, router, key, node_id, now())
        if full:
            self.flush()

    def closed(
        self,
        peer: Address,
        router: str,
        node_id: str,
        bytes_in: int,
        bytes_out: int,
        duration_s: float,
        reason: str,
        detail: str,
    ) -> None:
        args = (peer.host, peer.port, router, node_id, bytes_in, bytes_out, duration_s, reason, detail)
        now = self._now
        if self._c.closed(*args) if now is None else self._c.closed(*args, now()):
            self.flush()

    def _take(self) -> str:
        return str(self._c.take().decode("utf-8"))


class _FlushFirst(logging.Filter):
    """On routerd's handler: the buffered lines go out before any line `logging` writes."""

    def __init__(self, lines: ConnLines) -> None:
        super().__init__()
        self.lines = lines

    def filter(self, record: logging.LogRecord) -> bool:
        self.lines.flush()
        return True


_installed: ConnLines | None = None


def install(*, native: bool = NATIVE) -> bool:
    """Buffer `router.conn`'s INFO lines when logging is routerd's: the root logger's one handler
    writes to a stream and formats a record as `ROUTERD_FORMAT` with the default date format does,
    and `router.conn` has no handler of its own. Call it once logging is configured (routerd's
    `main_routerd`).

    Args:
        native: format and buffer in C (`NativeConnLines`; the default when it is built).

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
    lines = (NativeConnLines if native else ConnLines)(handler.stream, handler.lock)
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


LineWriters: TypeAlias = (
    "tuple[Callable[..., bool] | None, Callable[..., bool] | None, Callable[[], None] | None]"
)
"""`line_writers`' answer: the C buffer's `connected` and `closed`, and the buffer's flush."""
_NO_LINES: Final[LineWriters] = (None, None, None)


def line_writers() -> LineWriters | None:
    """How a C core writes the two lines of a proxied connection itself (router/datapath/_core.c's
    lean connections): the C buffer's `connected(host, port, router, key, node_id)` and
    `closed(host, port, router, node_id, bytes_in, bytes_out, duration_s, reason, detail)`, which
    answer whether the buffer is full, and the flush to call then; three Nones when router.conn's
    INFO lines are off. None: it cannot, the lines are on but do not go through the C buffer."""
    if not conn_log.isEnabledFor(logging.INFO):
        return _NO_LINES
    lines = _installed
    if not isinstance(lines, NativeConnLines) or lines._now is not None:
        return None
    return lines._c.connected, lines._c.closed, lines.flush


def connected(peer: Address, router: str, key: str, node_id: str) -> None:
    """A proxied connection's INFO `CONNECTED_LINE` (the caller checked INFO is enabled)."""
    lines = _installed
    if lines is None:
        conn_log.info(CONNECTED_LINE, peer, router, shown(key), node_id)
    else:
        lines.connected(peer, router, key, node_id)


def closed(
    level: int,
    peer: Address,
    router: str,
    node_id: str,
    bytes_in: int,
    bytes_out: int,
    duration_s: float,
    reason: str,
    detail: str,
) -> None:
    """A proxied connection's `CLOSED_LINE` at `level` (the caller checked it is enabled): INFO
    through the buffer, the rest through `logging`."""
    lines = _installed
    if lines is None or level != logging.INFO:
        args = (peer, router, node_id, bytes_in, bytes_out, duration_s, reason, closed_detail(detail))
        conn_log.log(level, CLOSED_LINE, *args)
    else:
        lines.closed(peer, router, node_id, bytes_in, bytes_out, duration_s, reason, detail)


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
