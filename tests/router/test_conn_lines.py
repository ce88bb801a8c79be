"""router/conn_lines.py: the buffered per-connection INFO lines, byte for byte what `logging` writes."""

from __future__ import annotations

import io
import logging
import threading
import time

import pytest

from router import conn_lines
from router.conn_lines import FLUSH_BYTES, ROUTERD_FORMAT, ConnLines

CREATED = 1_795_961_196.534325
"""A wall-clock time with milliseconds (…,534) to format."""


def _logging_line(message: str, created: float) -> str:
    """The line routerd's handler writes for an INFO record of router.conn made at `created`."""
    record = logging.LogRecord("router.conn", logging.INFO, __file__, 1, message, (), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    return logging.Formatter(ROUTERD_FORMAT).format(record) + "\n"


class TestConnLines:
    def test_line_is_the_one_logging_writes(self) -> None:
        stream = io.StringIO()
        lines = ConnLines(stream, threading.RLock(), clock=lambda: CREATED)
        message = 'peer=127.0.0.1:40000 router=r key="a b" target=b0 outcome=OK'
        lines.info(message)
        assert stream.getvalue() == ""  # buffered
        lines.flush()
        assert stream.getvalue() == _logging_line(message, CREATED)
        assert ",534 INFO router.conn: peer=" in stream.getvalue()

    def test_lines_keep_their_order_and_go_in_one_write(self) -> None:
        writes: list[str] = []

        class Stream(io.StringIO):
            def write(self, text: str) -> int:
                writes.append(text)
                return len(text)

        times = iter([CREATED, CREATED + 0.5, CREATED + 1.25])
        lines = ConnLines(Stream(), threading.RLock(), clock=lambda: next(times))
        for n in range(3):
            lines.info(f"line {n}")
        lines.flush()
        lines.flush()  # nothing left: no write
        assert writes == [
            "".join(
                _logging_line(f"line {n}", t) for n, t in enumerate((CREATED, CREATED + 0.5, CREATED + 1.25))
            )
        ]

    def test_full_buffer_is_written_at_once(self) -> None:
        stream = io.StringIO()
        lines = ConnLines(stream, threading.RLock(), clock=lambda: CREATED)
        message = "x" * 1000
        count = FLUSH_BYTES // len(_logging_line(message, CREATED)) + 1
        for _ in range(count):
            lines.info(message)
        assert stream.getvalue().count("\n") == count  # the last line filled it: all written

    def test_a_closed_stream_loses_the_lines_without_raising(self) -> None:
        stream = io.StringIO()
        lines = ConnLines(stream, threading.RLock(), clock=lambda: CREATED)
        lines.info("lost")
        stream.close()
        lines.flush()  # as logging, which does not raise for a broken stream either
        lines.info("next")
        lines.flush()


def _routerd_logging(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """The root logger set up as routerd does (one stderr-like handler, routerd's format) until the
    test ends, conn_lines not installed yet. Called in the test itself: pytest adds its capturing
    handlers to the root logger when the test's call starts, after its fixtures."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(ROUTERD_FORMAT))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", logging.INFO)
    monkeypatch.setattr(conn_lines, "_installed", None)
    monkeypatch.setattr("atexit.register", lambda f: f)
    return stream


class TestInstall:
    def test_routerd_logging_gets_the_buffer_and_other_lines_flush_it_first(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        routerd_logging = _routerd_logging(monkeypatch)
        assert conn_lines.install()
        assert not conn_lines.install()  # once
        conn_lines.info("peer=%s outcome=OK", "127.0.0.1:1")
        assert routerd_logging.getvalue() == ""
        logging.getLogger("router.pool").warning("router=r pool is inactive")
        text = routerd_logging.getvalue().splitlines()
        assert text[0].endswith(" INFO router.conn: peer=127.0.0.1:1 outcome=OK")
        assert text[1].endswith(" WARNING router.pool: router=r pool is inactive")
        conn_lines.log(logging.WARNING, "peer=%s outcome=CONNECT_FAILED", "127.0.0.1:2")  # not buffered
        assert (
            routerd_logging.getvalue()
            .splitlines()[2]
            .endswith(" WARNING router.conn: peer=127.0.0.1:2 outcome=CONNECT_FAILED")
        )
        conn_lines.log(logging.INFO, "closed %d", 3)
        conn_lines.flush()
        assert routerd_logging.getvalue().splitlines()[3].endswith(" INFO router.conn: closed 3")

    @pytest.mark.parametrize("change", ["format", "datefmt", "two handlers", "own handler"])
    def test_other_logging_is_left_to_logging(self, change: str, monkeypatch: pytest.MonkeyPatch) -> None:
        routerd_logging = _routerd_logging(monkeypatch)
        root = logging.getLogger()
        match change:
            case "format":
                root.handlers[0].setFormatter(logging.Formatter("%(message)s"))
            case "datefmt":
                root.handlers[0].setFormatter(logging.Formatter(ROUTERD_FORMAT, datefmt="%H:%M:%S"))
            case "two handlers":
                monkeypatch.setattr(root, "handlers", [*root.handlers, logging.NullHandler()])
            case "own handler":
                monkeypatch.setattr(conn_lines.conn_log, "handlers", [logging.NullHandler()])
        assert not conn_lines.install()
        conn_lines.info("peer=%s outcome=OK", "127.0.0.1:1")  # through logging: written at once
        assert "peer=127.0.0.1:1 outcome=OK\n" in routerd_logging.getvalue()


def test_line_costs_a_fraction_of_logging() -> None:
    """Not a timing assertion: the buffered line does less work (no LogRecord, no handler call),
    checked by counting the logging calls it makes (none)."""
    calls: list[object] = []
    lines = ConnLines(io.StringIO(), threading.RLock(), clock=time.time)
    original = logging.Logger.handle
    try:
        logging.Logger.handle = lambda self, record: calls.append(record)  # type: ignore[method-assign]
        lines.info("peer=127.0.0.1:1 outcome=OK")
    finally:
        logging.Logger.handle = original  # type: ignore[method-assign]
    assert calls == []
