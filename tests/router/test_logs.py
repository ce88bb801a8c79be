"""router/logs.py: `shown` (client values in log lines) and `LogLimiter` (repeated lines)."""

from __future__ import annotations

import ast
import atexit
import logging
import re
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import logs
from router.logs import (
    LOG_BURST,
    LOG_INTERVAL_S,
    MAX_SHOWN_CHARS,
    LogLimiter,
    flush_log_limits,
    install_log_limits,
    shown,
)
from router.metrics import Metrics

_CUT = re.compile(r'(".*")\.\.\.\(len=(\d+)\)', re.DOTALL)


def _unshown(text: str) -> tuple[str, int]:
    """What a reader of the log gets back from `shown`'s text: (the value or its first characters,
    the value's length), as docs/operations.md describes it."""
    cut = _CUT.fullmatch(text)
    if cut is not None:
        return ast.literal_eval(cut.group(1)), int(cut.group(2))
    if text.startswith('"'):
        value = ast.literal_eval(text)
        return value, len(value)
    return text, len(text)


class TestShown:
    @pytest.mark.parametrize(
        "value",
        ["client-1", "orders.service_7", "user@example.com", "host.example:8883", "a/b+c", "0", "NULL"],
    )
    def test_shown_plain_value_is_bare(self, value: str) -> None:
        assert shown(value) == value

    def test_shown_none_is_the_null_key(self) -> None:
        assert shown(None) == "NULL"

    @pytest.mark.parametrize(
        ("value", "text"),
        [
            ("", '""'),
            ("a b", '"a b"'),
            ("evil\nINFO router.conn: peer=x outcome=OK", '"evil\\nINFO router.conn: peer=x outcome=OK"'),
            ("cr\rx", '"cr\\rx"'),
            ("tab\tx", '"tab\\tx"'),
            ("\x1b[31mred\x1b[0m", '"\\x1b[31mred\\x1b[0m"'),
            ('say "hi"', '"say \\"hi\\""'),
            ("back\\slash", '"back\\\\slash"'),
            ("x outcome=OK", '"x outcome=OK"'),
            ("k=v", '"k=v"'),
            ("nul\x00del\x7f", '"nul\\x00del\\x7f"'),
            ("jürgen", '"j\\xfcrgen"'),
            ("\u202eevil", '"\\u202eevil"'),  # RIGHT-TO-LEFT OVERRIDE
            ("😀", '"\\U0001f600"'),
            ("\ud800", '"\\ud800"'),  # a lone surrogate (Python strings may hold one)
            ("'single'", "\"'single'\""),
        ],
    )
    def test_shown_other_value_is_quoted_and_escaped(self, value: str, text: str) -> None:
        assert shown(value) == text
        assert ast.literal_eval(text) == value

    def test_shown_long_value_is_cut_with_its_length(self) -> None:
        value = "k" * 15000
        assert shown(value) == '"' + "k" * MAX_SHOWN_CHARS + '"...(len=15000)'

    def test_shown_value_at_the_cap_is_whole(self) -> None:
        assert shown("k" * MAX_SHOWN_CHARS) == "k" * MAX_SHOWN_CHARS
        assert shown("k" * 5, cap=4) == '"kkkk"...(len=5)'

    def test_shown_cut_counts_characters_not_escapes(self) -> None:
        assert shown("\n" * 10, cap=3) == '"\\n\\n\\n"...(len=10)'

    @given(st.text(), st.integers(min_value=1, max_value=40))
    def test_shown_any_value_is_printable_ascii_and_gives_its_prefix_back(self, value: str, cap: int) -> None:
        text = shown(value, cap)
        assert text
        assert all(" " <= char <= "~" for char in text), text
        assert " " not in text or text.startswith('"')
        prefix, length = _unshown(text)
        assert length == len(value)
        assert prefix == value[:cap]
        if len(value) <= cap:
            assert prefix == value


class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _FakeClock:
    return _FakeClock()


@pytest.fixture
def written() -> list[logging.LogRecord]:
    return []


@pytest.fixture
def limiter(clock: _FakeClock, written: list[logging.LogRecord]) -> LogLimiter:
    """A limiter of 3 lines per 10 s that writes into `written`, as a handler would."""

    def handle(record: logging.LogRecord) -> None:
        if made.filter(record):
            written.append(record)

    made = LogLimiter(handle, burst=3, interval_s=10.0, clock=clock)
    return made


def _record(
    msg: str = "acceptor=%s accept failed (%s)", level: int = logging.ERROR, name: str = "router.conn"
):
    return logging.makeLogRecord(
        {
            "name": name,
            "levelno": level,
            "levelname": logging.getLevelName(level),
            "msg": msg,
            "args": ("a", "x"),
        }
    )


def _log(limiter: LogLimiter, written: list[logging.LogRecord], record: logging.LogRecord) -> None:
    if limiter.filter(record):
        written.append(record)


class TestLogLimiter:
    def test_log_limiter_lets_a_burst_through_then_suppresses(
        self, limiter: LogLimiter, written: list[logging.LogRecord]
    ) -> None:
        for _ in range(100):
            _log(limiter, written, _record())
        assert len(written) == 3
        assert limiter.suppressed_lines() == {"router.conn": 97}

    def test_log_limiter_summary_before_the_next_line_after_the_interval(
        self, limiter: LogLimiter, written: list[logging.LogRecord], clock: _FakeClock
    ) -> None:
        for _ in range(100):
            _log(limiter, written, _record())
        clock.now += 10.0
        _log(limiter, written, _record())
        lines = [(r.name, r.levelno, r.getMessage()) for r in written[3:]]
        assert lines == [
            (
                "router.conn",
                logging.ERROR,
                '... and 97 more lines like "acceptor=%s accept failed (%s)" '
                "in the last 10 s were suppressed",
            ),
            ("router.conn", logging.ERROR, "acceptor=a accept failed (x)"),
        ]

    def test_log_limiter_new_interval_has_a_new_burst(
        self, limiter: LogLimiter, written: list[logging.LogRecord], clock: _FakeClock
    ) -> None:
        for _ in range(5):
            _log(limiter, written, _record())
        clock.now += 10.0
        for _ in range(5):
            _log(limiter, written, _record())
        assert len(written) == 3 + 1 + 3  # burst, summary, burst
        assert limiter.suppressed_lines() == {"router.conn": 4}

    def test_log_limiter_lines_within_the_burst_give_no_summary(
        self, limiter: LogLimiter, written: list[logging.LogRecord], clock: _FakeClock
    ) -> None:
        for _ in range(3):
            _log(limiter, written, _record())
            clock.now += 20.0
        assert [r.getMessage() for r in written] == ["acceptor=a accept failed (x)"] * 3

    def test_log_limiter_summary_due_is_written_before_any_other_line(
        self, limiter: LogLimiter, written: list[logging.LogRecord], clock: _FakeClock
    ) -> None:
        """Scenario: the flood stops; the next line of anything, an INFO one too, brings its summary."""
        for _ in range(4):
            _log(limiter, written, _record())
        clock.now += 12.5
        _log(limiter, written, _record("peer=%s key=%s outcome=OK", logging.INFO))
        assert [(r.levelno, r.getMessage()) for r in written[3:]] == [
            (
                logging.ERROR,
                '... and 1 more lines like "acceptor=%s accept failed (%s)" '
                "in the last 12.5 s were suppressed",
            ),
            (logging.INFO, "peer=a key=x outcome=OK"),
        ]

    def test_log_limiter_flush_writes_only_summaries_that_are_due(
        self, limiter: LogLimiter, written: list[logging.LogRecord], clock: _FakeClock
    ) -> None:
        for _ in range(4):
            _log(limiter, written, _record())
        limiter.flush()
        assert len(written) == 3
        clock.now += 10.0
        limiter.flush()
        assert len(written) == 4
        limiter.flush()
        assert len(written) == 4

    def test_log_limiter_flush_everything_at_exit(
        self, limiter: LogLimiter, written: list[logging.LogRecord]
    ) -> None:
        for _ in range(4):
            _log(limiter, written, _record())
        limiter.flush(everything=True)
        assert written[-1].getMessage().startswith("... and 1 more lines like")

    def test_log_limiter_info_lines_are_not_limited(
        self, limiter: LogLimiter, written: list[logging.LogRecord]
    ) -> None:
        for _ in range(100):
            _log(limiter, written, _record("peer=%s outcome=%s", logging.INFO))
        assert len(written) == 100
        assert limiter.suppressed_lines() == {}

    def test_log_limiter_counts_each_template_and_logger_apart(
        self, limiter: LogLimiter, written: list[logging.LogRecord]
    ) -> None:
        for _ in range(5):
            _log(limiter, written, _record("one %s %s"))
            _log(limiter, written, _record("two %s %s"))
            _log(limiter, written, _record("one %s %s", name="router.server"))
        assert len(written) == 9
        assert limiter.suppressed_lines() == {"router.conn": 4, "router.server": 2}

    def test_log_limiter_summary_has_the_highest_suppressed_level(
        self, limiter: LogLimiter, written: list[logging.LogRecord], clock: _FakeClock
    ) -> None:
        for level in (logging.WARNING,) * 3 + (logging.WARNING, logging.ERROR, logging.WARNING):
            _log(limiter, written, _record("m", level))
        clock.now += 10.0
        limiter.flush()
        assert written[-1].levelno == logging.ERROR
        assert written[-1].getMessage() == "... and 3 more lines like m in the last 10 s were suppressed"

    def test_log_limiter_bounds_its_templates(
        self, limiter: LogLimiter, written: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Scenario: messages formatted before logging (a new template each) share one count."""
        monkeypatch.setattr(logs, "_MAX_TEMPLATES", 5)
        for i in range(100):
            _log(limiter, written, _record(f"line {i}"))
        assert set(limiter._templates) == {
            *(("router.conn", f"line {i}") for i in range(5)),
            ("router.conn", "(another message of this logger)"),
        }
        assert len(written) == 5 + 3
        assert limiter.suppressed_lines() == {"router.conn": 92}

    def test_log_limiter_forgets_idle_templates_when_full(
        self,
        limiter: LogLimiter,
        written: list[logging.LogRecord],
        clock: _FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setattr(logs, "_MAX_TEMPLATES", 5)
        for i in range(5):
            _log(limiter, written, _record(f"line {i}"))
        clock.now += 10.0
        _log(limiter, written, _record("line 5"))
        assert set(limiter._templates) == {("router.conn", "line 5")}

    def test_log_limiter_non_string_messages_share_a_template(
        self, limiter: LogLimiter, written: list[logging.LogRecord]
    ) -> None:
        for i in range(5):
            record = _record()
            record.msg, record.args = {"n": i}, ()
            _log(limiter, written, record)
        assert len(written) == 3

    def test_log_limiter_rejects_a_bad_burst_or_interval(self) -> None:
        with pytest.raises(ValueError, match="burst must be >= 1"):
            LogLimiter(print, burst=0)
        with pytest.raises(ValueError, match="interval_s > 0"):
            LogLimiter(print, interval_s=float("nan"))

    def test_log_limiter_is_thread_safe(self, clock: _FakeClock) -> None:
        """Scenario: four threads log one template at once; every line is written or counted once."""
        lock = threading.Lock()
        written: list[logging.LogRecord] = []

        def handle(record: logging.LogRecord) -> None:
            if made.filter(record):
                with lock:
                    written.append(record)

        made = LogLimiter(handle, burst=7, interval_s=10.0, clock=clock)

        def flood() -> None:
            for _ in range(5000):
                handle(_record())

        threads = [threading.Thread(target=flood) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(written) == 7
        assert made.suppressed_lines() == {"router.conn": 20000 - 7}


def test_install_log_limits_filters_the_root_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario: routerd's start; summaries go through the same handler, the count to the metric."""
    clock = _FakeClock()
    lines: list[str] = []

    class ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = ListHandler()
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(logs, "_INSTALLED", [])
    monkeypatch.setattr(atexit, "register", lambda function: function)
    (limiter,) = install_log_limits(clock=clock)
    assert install_log_limits(clock=clock) == []  # once per handler
    log = logging.getLogger("router.test_logs")
    for _ in range(LOG_BURST + 5):
        log.warning("accept failed (%s)", "Too many open files")
    assert len(lines) == LOG_BURST
    assert logs.suppressed_log_lines() == {"router.test_logs": 5}
    exposition = Metrics().exposition().decode()
    assert 'router_log_lines_suppressed_total{logger="router.test_logs"} 5.0' in exposition
    clock.now += LOG_INTERVAL_S
    log.warning("accept failed (%s)", "Too many open files")
    assert lines[LOG_BURST:] == [
        '... and 5 more lines like "accept failed (%s)" in the last 10 s were suppressed',
        "accept failed (Too many open files)",
    ]
    assert limiter in logs._INSTALLED
    for _ in range(LOG_BURST + 2):
        log.warning("another (%s)", "x")
    clock.now += LOG_INTERVAL_S
    flush_log_limits()  # routerd's periodic flush: the summary comes without a following line
    assert lines[-1] == '... and 2 more lines like "another (%s)" in the last 10 s were suppressed'
