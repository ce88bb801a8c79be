"""router/conn_lines.py and router/_conn_lines.c: the buffered per-connection INFO lines, byte for
byte what `logging` writes, the C buffer's the same as the Python one's."""

from __future__ import annotations

import io
import logging
import threading
import time
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

if TYPE_CHECKING:
    from collections.abc import Callable

from router import conn_lines
from router.conn_lines import (
    CLOSED_LINE,
    CONNECTED_LINE,
    FLUSH_BYTES,
    ROUTERD_FORMAT,
    ConnLines,
    NativeConnLines,
    closed_detail,
)
from router.core.address import Address
from router.logs import MAX_SHOWN_CHARS, shown

_native = conn_lines.EXTENSION

CREATED = 1_795_961_196.534325
"""A wall-clock time with milliseconds (…,534) to format."""


def _logging_line(message: str, created: float) -> str:
    """The line routerd's handler writes for an INFO record of router.conn made at `created`."""
    record = logging.LogRecord("router.conn", logging.INFO, __file__, 1, message, (), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    return logging.Formatter(ROUTERD_FORMAT).format(record) + "\n"


@pytest.fixture(params=["python", "native"])
def kind(request: pytest.FixtureRequest) -> type[ConnLines]:
    """Each buffer: the Python one (the reference) and the C one."""
    if request.param == "python":
        return ConnLines
    assert _native is not None, "router._conn_lines is not built: ./run-tests builds it"
    return NativeConnLines


def _written(kind: type[ConnLines], write: Callable[[ConnLines], None], created: float = CREATED) -> str:
    stream = io.StringIO()
    lines = kind(stream, threading.RLock(), clock=lambda: created)
    write(lines)
    lines.flush()
    return stream.getvalue()


class TestConnLines:
    def test_line_is_the_one_logging_writes(self, kind: type[ConnLines]) -> None:
        stream = io.StringIO()
        lines = kind(stream, threading.RLock(), clock=lambda: CREATED)
        message = 'peer=127.0.0.1:40000 router=r key="a b" target=b0 outcome=OK'
        lines.info(message)
        assert stream.getvalue() == ""  # buffered
        lines.flush()
        assert stream.getvalue() == _logging_line(message, CREATED)
        assert ",534 INFO router.conn: peer=" in stream.getvalue()

    def test_lines_keep_their_order_and_go_in_one_write(self, kind: type[ConnLines]) -> None:
        writes: list[str] = []

        class Stream(io.StringIO):
            def write(self, text: str) -> int:
                writes.append(text)
                return len(text)

        times = iter([CREATED, CREATED + 0.5, CREATED + 1.25])
        lines = kind(Stream(), threading.RLock(), clock=lambda: next(times))
        for n in range(3):
            lines.info(f"line {n}")
        lines.flush()
        lines.flush()  # nothing left: no write
        assert writes == [
            "".join(
                _logging_line(f"line {n}", t) for n, t in enumerate((CREATED, CREATED + 0.5, CREATED + 1.25))
            )
        ]

    def test_full_buffer_is_written_at_once(self, kind: type[ConnLines]) -> None:
        stream = io.StringIO()
        lines = kind(stream, threading.RLock(), clock=lambda: CREATED)
        message = "x" * 1000
        count = FLUSH_BYTES // len(_logging_line(message, CREATED)) + 1
        for _ in range(count):
            lines.info(message)
        assert stream.getvalue().count("\n") == count  # the last line filled it: all written

    def test_a_closed_stream_loses_the_lines_without_raising(self, kind: type[ConnLines]) -> None:
        stream = io.StringIO()
        lines = kind(stream, threading.RLock(), clock=lambda: CREATED)
        lines.info("lost")
        stream.close()
        lines.flush()  # as logging, which does not raise for a broken stream either
        lines.info("next")
        lines.flush()

    def test_connection_lines_are_their_formats(self, kind: type[ConnLines]) -> None:
        def write(lines: ConnLines) -> None:
            lines.connected(Address("::1", 1883), "fleet", "a b", "b-0")
            lines.closed(Address("127.0.0.1", 40000), "fleet", "b-0", 12, 3456, 1.2345, "closed", "")
            lines.closed(Address("127.0.0.1", 40001), "fleet", "b-1", 0, 0, 0.0, "replay_failed", 'x"\n')

        detail = closed_detail('x"\n')
        assert detail == ' ("x\\"\\n")'  # quoted, the quote and the line break escaped
        assert _written(kind, write) == (
            _logging_line(CONNECTED_LINE % (Address("::1", 1883), "fleet", '"a b"', "b-0"), CREATED)
            + _logging_line(
                CLOSED_LINE % (Address("127.0.0.1", 40000), "fleet", "b-0", 12, 3456, 1.2345, "closed", ""),
                CREATED,
            )
            + _logging_line(
                CLOSED_LINE
                % (Address("127.0.0.1", 40001), "fleet", "b-1", 0, 0, 0.0, "replay_failed", detail),
                CREATED,
            )
        )

    def test_time_is_local_and_cached_per_second_only(self, kind: type[ConnLines]) -> None:
        times = [CREATED, CREATED + 0.4, CREATED + 1.0, CREATED + 3600.999]

        def write(lines: ConnLines) -> None:
            for n, _ in enumerate(times):
                lines.info(f"line {n}")

        clock = iter(times)
        stream = io.StringIO()
        lines = kind(stream, threading.RLock(), clock=lambda: next(clock))
        write(lines)
        lines.flush()
        assert stream.getvalue() == "".join(_logging_line(f"line {n}", t) for n, t in enumerate(times))

    def test_real_clock_stamps_now(self, kind: type[ConnLines]) -> None:
        stream = io.StringIO()
        lines = kind(stream, threading.RLock())
        before = time.time()
        lines.info("now")
        lines.flush()
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(before))
        after = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time()))
        assert stream.getvalue()[:16] in (stamp, after)
        assert stream.getvalue()[16:].startswith(":")  # the seconds follow
        assert " INFO router.conn: now\n" in stream.getvalue()


_texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=300) | st.text(max_size=40)
"""Any text, lone surrogates and astral characters included, and short common ones."""


@pytest.mark.skipif(_native is None, reason="never: ./run-tests builds router._conn_lines")
class TestNativeAgainstPython:
    @given(value=_texts | st.none(), cap=st.integers(min_value=0, max_value=MAX_SHOWN_CHARS + 5))
    def test_shown_is_logs_shown(self, value: str | None, cap: int) -> None:
        assert _native is not None
        assert _native.shown(value, cap) == shown(value, cap)

    def test_shown_edges(self) -> None:
        assert _native is not None
        assert _native.MAX_SHOWN_CHARS == MAX_SHOWN_CHARS
        for value in (
            "",
            "a",
            "a" * 256,
            "a" * 257,
            "é",
            "\ud800",
            "\U0001f600",
            '"',
            "\\",
            "\x7f",
            "=",
            None,
        ):
            assert _native.shown(value) == shown(value), value
        with pytest.raises(TypeError, match="str or None"):
            _native.shown(b"bytes")
        with pytest.raises(ValueError, match="negative"):
            _native.shown("a", -1)

    @given(
        host=st.sampled_from(["127.0.0.1", "::1", "fe80::1%eth0", "broker.example"]),
        port=st.integers(min_value=0, max_value=65535),
        router=st.text(min_size=1, max_size=20),
        key=_texts,
        detail=_texts,
        bytes_in=st.integers(min_value=0, max_value=2**62),
        duration=st.floats(min_value=0, max_value=1e7, allow_nan=False),
        created=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    )
    def test_lines_are_the_python_ones(
        self,
        host: str,
        port: int,
        router: str,
        key: str,
        detail: str,
        bytes_in: int,
        duration: float,
        created: float,
    ) -> None:
        def write(lines: ConnLines) -> None:
            lines.connected(Address(host, port), router, key, "b-0")
            lines.closed(Address(host, port), router, "b-0", bytes_in, 7, duration, "closed", detail)
            lines.info(f"peer={Address(host, port)} key={shown(key)}")

        assert _written(NativeConnLines, write, created) == _written(ConnLines, write, created)

    def test_wrong_fields_are_type_errors_and_leave_no_half_line(self) -> None:
        assert _native is not None
        lines = _native.Lines(1000)
        with pytest.raises(TypeError):
            lines.connected("127.0.0.1", 1, "r", 5, "b-0", CREATED)
        with pytest.raises(TypeError):
            lines.closed("127.0.0.1", 1, "r", "b-0", 1, 2, 0.5, "closed", None, CREATED)
        with pytest.raises(TypeError):
            lines.connected("127.0.0.1", 1, "r")
        with pytest.raises(OverflowError):
            lines.closed("127.0.0.1", 1, "r", "b-0", 2**70, 2, 0.5, "closed", "", CREATED)
        assert lines.size == 0
        with pytest.raises(ValueError, match="positive"):
            _native.Lines(0)

    def test_take_empties_the_buffer_and_says_when_full(self) -> None:
        assert _native is not None
        lines = _native.Lines(100)
        assert lines.info("short", CREATED) is False
        assert lines.info("x" * 100, CREATED) is True
        taken = lines.take()
        assert taken.count(b"\n") == 2
        assert lines.size == 0
        assert lines.take() == b""


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

    @pytest.mark.parametrize("native", [False, True])
    def test_connection_lines_through_the_buffer_and_a_warning_close_through_logging(
        self, native: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        routerd_logging = _routerd_logging(monkeypatch)
        assert conn_lines.install(native=native)
        assert isinstance(conn_lines._installed, NativeConnLines) is native
        peer = Address("127.0.0.1", 40000)
        conn_lines.connected(peer, "fleet", "c-1", "b-0")
        conn_lines.closed(logging.INFO, peer, "fleet", "b-0", 1, 2, 0.5, "closed", "")
        assert routerd_logging.getvalue() == ""
        conn_lines.closed(logging.WARNING, peer, "fleet", "b-0", 1, 2, 0.5, "replay_failed", "no")
        text = routerd_logging.getvalue().splitlines()  # the warning flushed the buffer first
        assert text[0].endswith(
            " INFO router.conn: peer=127.0.0.1:40000 router=fleet key=c-1 target=b-0 outcome=OK"
        )
        assert text[1].endswith(
            " INFO router.conn: peer=127.0.0.1:40000 router=fleet target=b-0 closed bytes_in=1 bytes_out=2 "
            "duration_s=0.500 reason=closed"
        )
        assert text[2].endswith(
            " WARNING router.conn: peer=127.0.0.1:40000 router=fleet target=b-0 closed "
            "bytes_in=1 bytes_out=2 duration_s=0.500 reason=replay_failed (no)"
        )

    def test_connection_lines_without_the_buffer_are_loggings(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.INFO, "router.conn")
        peer = Address("::1", 1)
        conn_lines.connected(peer, "fleet", "a b", "b-0")
        conn_lines.closed(logging.INFO, peer, "fleet", "b-0", 1, 2, 0.5, "closed", "")
        assert caplog.messages == [
            'peer=[::1]:1 router=fleet key="a b" target=b-0 outcome=OK',
            "peer=[::1]:1 router=fleet target=b-0 closed bytes_in=1 bytes_out=2 "
            "duration_s=0.500 reason=closed",
        ]

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
