"""Log-line hygiene for every layer of the router: `shown` prints a client-supplied value so that one
line stays one event, and `LogLimiter` rate-limits repeated WARNING-and-above lines.

`shown` is pure formatting. `LogLimiter` is a `logging.Filter` that `routerd` installs on its
handlers (`install_log_limits`); its clock is an argument, so tests drive it with a fake one. This
module imports nothing of `router` (the lowest layer of router/__init__.py): the data paths, the
services and the reports all use it. No trio here: two threads log (trio's and the fast path's),
so the limiter takes a `threading.Lock`.
"""

from __future__ import annotations

import atexit
import logging
import math
import re
import threading
import time
from typing import TYPE_CHECKING, Final

from keys import NULL_KEY

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "LOG_BURST",
    "LOG_INTERVAL_S",
    "MAX_SHOWN_CHARS",
    "LogLimiter",
    "flush_log_limits",
    "install_log_limits",
    "shown",
    "suppressed_log_lines",
]

# -- shown: client-supplied values in key=value lines ---------------------------------------------

MAX_SHOWN_CHARS: Final = 256
"""The characters of a value `shown` prints; a longer one is cut and followed by its length. The
longest DNS name (253, RFC 1035 §2.3.4) fits whole, and so does a sniffer's reason with its quote of
at most 32 client bytes; an MQTT client id may be 65535 bytes (MQTT 3.1.1 §1.5.3), an AMQP
container-id as long as the opening frame, and those are what the cap is for."""

_SAFE: Final = re.compile(r"[A-Za-z0-9._:/@+-]+")
"""Characters printed bare: no space, `=`, quote, backslash or control character, so a bare value
can never end a pair early or start another one."""
_is_safe: Final = _SAFE.fullmatch


def shown(value: str | None, cap: int = MAX_SHOWN_CHARS) -> str:
    """A client-supplied value as it goes into a `key=value` log line (logfmt style).

    - None: `NULL` (the NULL key's own spelling, keys.NULL_KEY).
    - Only letters, digits and `._:/@+-`, at most `cap` characters: the value itself.
    - Otherwise a double-quoted Python string literal that holds only printable ASCII: `\\\\`,
      `\\"`, `\\n`, `\\r`, `\\t`, and every other character outside printable ASCII as `\\xNN`,
      `\\uNNNN` or `\\UNNNNNNNN` (`ast.literal_eval` gives the value back).
    - Longer than `cap` characters: the first `cap` characters so quoted, then `...(len=N)` with the
      value's length N in characters: `"abcd"...(len=15000)`.

    Args:
        value: the value, as received (a client id, a user name, an SNI host, a reason quoting
            client bytes).
        cap: how many characters of it to print.

    Returns:
        The text to print after `key=`; never empty, never holding a space outside its quotes, a
        line break or any other control character.
    """
    if value is None:
        return NULL_KEY
    if len(value) <= cap and _is_safe(value) is not None:
        return value
    if len(value) <= cap:
        return f'"{_escaped(value)}"'
    return f'"{_escaped(value[:cap])}"...(len={len(value)})'


def _escaped(value: str) -> str:
    # unicode_escape escapes the backslash, \t \n \r, every other character outside printable
    # ASCII (\xNN, \uNNNN, \UNNNNNNNN; lone surrogates too); only the double quote is left.
    return value.encode("unicode_escape").decode("ascii").replace('"', '\\"')


# -- LogLimiter: repeated lines ------------------------------------------------------------------

LOG_BURST: Final = 10
"""Lines of one template (logger and message format) written per interval before the rest are
suppressed: enough for every line of a short incident, few enough that a client (or an accept loop
at the descriptor limit, measured at 960,000 lines in 10 s) cannot fill the disk."""
LOG_INTERVAL_S: Final = 10.0
"""The interval of `LOG_BURST`, and at most how late the summary of suppressed lines is written."""
_MAX_TEMPLATES: Final = 1000
"""Templates tracked per limiter; the router has fewer than 200. Past this (messages formatted
before logging, by some library), a logger's further templates share one count."""
_OTHER_TEMPLATES: Final = "(another message of this logger)"
_SUMMARY: Final = "... and %d more lines like %s in the last %g s were suppressed"
_NEVER: Final = math.inf
_SUMMARY_MARK: Final = "log_limiter_summary"
"""The LogRecord attribute that marks a summary line: written, never limited or counted."""


class _Template:
    """The current interval of one template."""

    __slots__ = ("levelno", "passed", "start", "suppressed")

    def __init__(self, start: float) -> None:
        self.start = start
        """When this interval began."""
        self.passed = 0
        self.suppressed = 0
        self.levelno = logging.NOTSET
        """The highest level suppressed in this interval (the summary's level)."""

    def restart(self, now: float) -> None:
        """Begin a new interval."""
        self.start, self.passed, self.suppressed, self.levelno = now, 0, 0, logging.NOTSET


class LogLimiter(logging.Filter):
    """Lets at most `burst` lines of each template (logger name and `record.msg`) at `level` and
    above through per interval; the rest are suppressed and counted, and one summary line per
    template says how many: `... and N more lines like "TEMPLATE" in the last S s were suppressed`.

    The summary is written through `emit` (the handler's `handle`) when the interval is over: before
    the next line of any template (every record checks, INFO ones included), or when `flush` is
    called. Lines below `level` (the access log) pass unlimited. Thread-safe; a record costs one
    lock and a dict lookup (INFO: one comparison).
    """

    def __init__(
        self,
        emit: Callable[[logging.LogRecord], object],
        *,
        burst: int = LOG_BURST,
        interval_s: float = LOG_INTERVAL_S,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            emit: writes a summary record (for a handler: its `handle`, which filters it again;
                summaries pass unlimited).
            burst: lines of one template per interval.
            interval_s: the interval, in the clock's seconds.
            level: lines at this level and above are limited.
            clock: seconds, monotonic.
        """
        super().__init__()
        if burst < 1 or not interval_s > 0:
            raise ValueError(f"burst must be >= 1 and interval_s > 0, got {burst!r} and {interval_s!r}")
        self._emit = emit
        self._burst = burst
        self._interval_s = interval_s
        self._level = level
        self._clock = clock
        self._lock = threading.Lock()
        self._templates: dict[tuple[str, str], _Template] = {}
        self._due = _NEVER
        """When the earliest interval with suppressed lines ends (inf: none has any)."""
        self._suppressed: dict[str, int] = {}
        """Lines suppressed since the start, by logger name."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to write `record`; first writes the summaries that are due."""
        if record.levelno < self._level or _SUMMARY_MARK in record.__dict__:
            if self._due != _NEVER and self._due <= self._clock():
                self.flush()
            return True
        now = self._clock()
        if self._due <= now:
            self.flush(now)
        msg = record.msg
        key = (record.name, msg if type(msg) is str else f"<{type(msg).__name__}>")
        summary = None
        with self._lock:
            template = self._templates.get(key)
            if template is None:
                key, template = self._new_template(key, now)
            if now - template.start >= self._interval_s:
                if template.suppressed:  # another thread's line, suppressed since the last check
                    summary = self._summary(key, template, now)
                template.restart(now)
            if template.passed < self._burst:
                template.passed += 1
            else:
                if not template.suppressed:
                    self._due = min(self._due, template.start + self._interval_s)
                template.suppressed += 1
                if record.levelno > template.levelno:
                    template.levelno = record.levelno
                counts, name = self._suppressed, record.name
                counts[name] = counts.get(name, 0) + 1
                return False
        if summary is not None:
            self._emit(summary)
        return True

    def flush(self, now: float | None = None, *, everything: bool = False) -> None:
        """Write the summary of every template whose interval with suppressed lines is over, and
        start a new interval for it.

        Args:
            now: the clock's time, when the caller has read it.
            everything: write the summaries whose interval is not over too (at exit).
        """
        if now is None:
            now = self._clock()
        summaries: list[logging.LogRecord] = []
        with self._lock:
            due = _NEVER
            for key, template in self._templates.items():
                if not template.suppressed:
                    continue
                if everything or now - template.start >= self._interval_s:
                    summaries.append(self._summary(key, template, now))
                    template.restart(now)
                else:
                    due = min(due, template.start + self._interval_s)
            self._due = due
        for summary in summaries:  # outside the lock: emitting filters the summary again
            self._emit(summary)

    def suppressed_lines(self) -> dict[str, int]:
        """Lines suppressed since the start, by logger name."""
        with self._lock:
            return dict(self._suppressed)

    def _new_template(self, key: tuple[str, str], now: float) -> tuple[tuple[str, str], _Template]:
        """Track a template not seen before (the lock is held)."""
        templates = self._templates
        if len(templates) >= _MAX_TEMPLATES:
            for idle in [
                k for k, t in templates.items() if not t.suppressed and now - t.start >= self._interval_s
            ]:
                del templates[idle]
            if len(templates) >= _MAX_TEMPLATES:
                key = (key[0], _OTHER_TEMPLATES)
                template = templates.get(key)
                if template is not None:
                    return key, template
        template = templates[key] = _Template(now)
        return key, template

    def _summary(self, key: tuple[str, str], template: _Template, now: float) -> logging.LogRecord:
        """The summary record of a template's interval with suppressed lines."""
        name, msg = key
        return logging.makeLogRecord(
            {
                "name": name,
                "levelno": template.levelno,
                "levelname": logging.getLevelName(template.levelno),
                "msg": _SUMMARY,
                "args": (template.suppressed, shown(msg), round(now - template.start, 1)),
                _SUMMARY_MARK: True,
            }
        )


_INSTALLED: list[LogLimiter] = []
"""The limiters `install_log_limits` installed (their counts are `suppressed_log_lines`)."""
_INSTALLED_LOCK: Final = threading.Lock()


def install_log_limits(
    *,
    burst: int = LOG_BURST,
    interval_s: float = LOG_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
) -> list[LogLimiter]:
    """Rate-limit the repeated WARNING-and-above lines of the whole process: a `LogLimiter` on each
    handler of the root logger (the ones `logging.basicConfig` made), each writing its summaries
    through its own handler. A handler that has one already keeps it. Pending summaries are
    written at exit.

    Call it once logging is configured (routerd's `main_routerd`).

    Returns:
        The limiters added.
    """
    added: list[LogLimiter] = []
    with _INSTALLED_LOCK:
        for handler in logging.getLogger().handlers:
            if any(isinstance(f, LogLimiter) for f in handler.filters):
                continue
            limiter = LogLimiter(handler.handle, burst=burst, interval_s=interval_s, clock=clock)
            handler.addFilter(limiter)
            added.append(limiter)
        if added and not _INSTALLED:
            atexit.register(_flush_installed)  # runs before logging's own atexit closes the handlers
        _INSTALLED.extend(added)
    return added


def suppressed_log_lines() -> dict[str, int]:
    """Lines the installed limiters suppressed since the start, by logger name (a line suppressed
    by two handlers' limiters counts twice; routerd has one handler)."""
    with _INSTALLED_LOCK:
        limiters = list(_INSTALLED)
    totals: dict[str, int] = {}
    for limiter in limiters:
        for name, count in limiter.suppressed_lines().items():
            totals[name] = totals.get(name, 0) + count
    return totals


def flush_log_limits(*, everything: bool = False) -> None:
    """Write the summary lines the installed limiters owe (those whose interval is over; all of
    them with `everything`). routerd calls it every `LOG_INTERVAL_S`, so a flood's summary appears
    even when no other line follows it."""
    with _INSTALLED_LOCK:
        limiters = list(_INSTALLED)
    for limiter in limiters:
        limiter.flush(everything=everything)


def _flush_installed() -> None:
    flush_log_limits(everything=True)
