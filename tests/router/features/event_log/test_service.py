"""router/features/event_log/service.py: the event log with its writer process: the files, rotation,
recovery and bounds, on real files (no sockets: events are made by hand and reported as the data
paths report them), each test with each recorder (router/features/event_log/recorder.py), the
native one and the Python one; and the feature's service (`TestEventLogService`)."""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

import pytest

from event_format.frames import encode_frame
from event_format.schema import BOOT_SPAN
from keys import ConnectionFacts, KeyType
from router.config.settings import Config, EventFileFormat, EventLogConfig, RouterConfig
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import Accepted, Closed, CloseReason, ConnectionRef, Decided, Mode
from router.feature import OpenError
from router.features.event_log import recorder as event_recorder
from router.features.event_log import service as event_log_module
from router.features.event_log.metrics import EventLogMetrics
from router.features.event_log.service import (
    SEND_BATCH,
    EventLog,
    EventLogError,
    EventLogService,
    default_router_id,
    file_name_part,
)
from router.metrics import Metrics
from router.runtime import RouterRuntime
from tests.conftest import eventually
from tests.router.features.event_log.conftest import all_records, finished, records_in

if TYPE_CHECKING:
    from pathlib import Path

NOW = 1_795_435_200.0  # 2026-11-23T12:00:00Z


def _conn(n: int) -> ConnectionRef:
    return ConnectionRef(id=n, router="r1", acceptor="mqtt", peer=Address("10.0.0.1", 4000 + n))


def decided(n: int) -> Decided:
    """A decision of connection `n` (also the writer's tests' event)."""
    return Decided(
        conn=_conn(n),
        key=f"dev-{n}",
        status=RouteStatus.OK,
        reason=DecisionReason.POLICY,
        mode=Mode.PROXY,
        node_id="node4",
        facts=ConnectionFacts(client_id=f"dev-{n}"),
        latency_s=2e-6,
    )


def _closed(n: int) -> Closed:
    return Closed(
        conn=_conn(n), node_id="node4", bytes_in=5, bytes_out=7, duration_s=1.0, reason=CloseReason.CLOSED
    )


JSONL = EventFileFormat.JSONL


_NATIVE = {"native": True}
"""Whether `_log` makes an event log with the native recorder (the `recorders` fixture's)."""


@pytest.fixture(autouse=True, params=[True, False], ids=["native", "python"])
def recorders(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setitem(_NATIVE, "native", request.param)
    return bool(request.param)


def _log(
    directory: Path, metrics: Metrics | None = None, *, native: bool | None = None, **settings: object
) -> EventLog:
    config = EventLogConfig(directory=str(directory), **settings)  # type: ignore[arg-type]
    native = _NATIVE["native"] if native is None else native
    event_log = EventLog(
        config, "edge-1", {"r1": KeyType.CLIENT_ID}, metrics or Metrics(), clock=lambda: NOW, native=native
    )
    assert event_log.status()["recorder"] == ("native" if native else "python")
    return event_log


def test_decisions_and_closes_become_lines_of_one_compressed_file_at_stop(tmp_path):
    metrics = Metrics()
    event_log = _log(tmp_path, metrics)
    event_log.start()
    event_log.report(Accepted(conn=_conn(1)))  # not logged
    event_log.report(decided(1))
    event_log.report(_closed(1))
    assert event_log.stop(5)
    [path] = finished(tmp_path)
    assert path.name.startswith("events-edge-1-")
    assert path.name.endswith("-000001.parquet")  # the default format
    decision, close = records_in(path)
    boot = int(path.name.split("-")[3])
    assert abs(boot - NOW * 1000) <= 1
    assert (decision["kind"], decision["seq"], decision["conn"]) == (
        "decision",
        boot * BOOT_SPAN,
        boot * BOOT_SPAN + 1,
    )
    assert (close["kind"], close["seq"], close["conn"]) == (
        "close",
        boot * BOOT_SPAN + 1,
        boot * BOOT_SPAN + 1,
    )
    assert decision["ts"] == "2026-11-23T12:00:00.000000Z"
    assert decision["raw_key"] == "dev-1"
    assert metrics.feature(EventLogMetrics).event_log_events.value(("written",)) == 2
    assert metrics.feature(EventLogMetrics).event_log_files.value(("finished",)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".events")]  # nothing in progress


def test_files_rotate_by_size_and_none_is_lost(tmp_path):
    event_log = _log(tmp_path, rotate_size=2000, compress=False, format=JSONL, flush_interval_ms=1)
    event_log.start()
    for n in range(100):
        event_log.report(decided(n))
        if n % 10 == 9:
            assert eventually(lambda: len(event_log._ring) == 0)
    assert event_log.stop(5)
    files = finished(tmp_path)
    assert len(files) > 5
    assert all(p.suffix == ".jsonl" for p in files)
    keys = [line["key"] for line in all_records(tmp_path)]
    assert keys == [f"dev-{n}" for n in range(100)]


def test_files_rotate_by_time(tmp_path):
    event_log = _log(tmp_path, rotate_interval_ms=1)
    event_log.start()
    event_log.report(decided(1))
    assert eventually(lambda: len(finished(tmp_path)) == 1)
    event_log.report(decided(2))
    assert eventually(lambda: len(finished(tmp_path)) == 2)
    assert event_log.stop(5)
    assert [line["key"] for line in all_records(tmp_path)] == ["dev-1", "dev-2"]


def test_a_file_left_in_progress_is_cut_after_its_last_line_and_finished_at_start(tmp_path):
    name = file_name_part("edge-1")
    part = tmp_path / f".events-{name}-1000-000001.jsonl.part"
    part.write_bytes(b'{"kind":"decision","seq":1}\n{"kind":"decision","seq":2}\n{"kind":"deci')
    (tmp_path / f".events-{name}-1000-000001.jsonl.zst.tmp").write_bytes(b"half")
    done = tmp_path / f".events-{name}-999-000003.jsonl.part"  # renamed before the crash, not unlinked
    done.write_bytes(b"{}\n")
    (tmp_path / f"events-{name}-999-000003.jsonl.zst").write_bytes(b"the finished one")
    event_log = _log(tmp_path, format=JSONL)
    event_log.start()
    assert event_log.stop(5)
    recovered = tmp_path / f"events-{name}-1000-000001.jsonl.zst"
    assert records_in(recovered) == [{"kind": "decision", "seq": 1}, {"kind": "decision", "seq": 2}]
    assert (tmp_path / f"events-{name}-999-000003.jsonl.zst").read_bytes() == b"the finished one"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".events")) == []


def test_boot_is_above_the_last_one_kept_so_seq_never_repeats(tmp_path):
    name = file_name_part("edge-1")
    future = int(NOW * 1000) + 60_000  # the clock was set back a minute since the last run
    (tmp_path / f".boot-{name}").write_text(f"{future}\n")
    event_log = _log(tmp_path)
    event_log.start()
    event_log.report(decided(1))
    assert event_log.stop(5)
    [line] = all_records(tmp_path)
    assert line["seq"] == (future + 1) * BOOT_SPAN
    assert (tmp_path / f".boot-{name}").read_text() == f"{future + 1}\n"


def test_a_full_ring_drops_the_oldest_counts_it_and_leaves_a_gap(tmp_path, caplog):
    metrics = Metrics()
    event_log = _log(tmp_path, metrics, ring_size=3)
    for n in range(5):  # before start: nothing drains the ring
        event_log.report(decided(n))
    event_log.start()
    assert event_log.stop(5)
    lines = all_records(tmp_path)
    assert [line["key"] for line in lines] == ["dev-2", "dev-3", "dev-4"]
    assert [int(str(line["seq"])) % BOOT_SPAN for line in lines] == [2, 3, 4]  # 0 and 1 are the gap
    assert metrics.feature(EventLogMetrics).event_log_events.value(("dropped",)) == 2
    assert "ring full: 2 event(s) dropped (ring-size=3)" in caplog.text


def test_the_reporting_thread_sends_a_full_batch_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(event_log_module, "SEND_INTERVAL_S", 3600.0)  # the sender thread sleeps
    event_log = _log(tmp_path, flush_interval_ms=10)
    event_log.start()
    for n in range(SEND_BATCH - 1):
        event_log.report(decided(n))
    assert event_log.status()["ring_used"] == SEND_BATCH - 1
    event_log.report(decided(SEND_BATCH - 1))
    assert event_log.status()["ring_used"] == 0  # taken and written to the pipe in `report`
    assert eventually(lambda: event_log.written == SEND_BATCH)
    event_log.report(decided(SEND_BATCH))  # a few: they wait for the sender thread, here the stop
    assert event_log.stop(5)
    assert [line["key"] for line in all_records(tmp_path)] == [f"dev-{n}" for n in range(SEND_BATCH + 1)]


def test_a_batch_that_cannot_be_sent_is_counted_lost_and_the_next_ones_go(tmp_path, monkeypatch, caplog):
    calls = []

    def encode_once_broken(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise ValueError("unmarshallable object")  # what marshal says of a bug's value
        return encode_frame(batch)

    monkeypatch.setattr(event_recorder, "encode_frame", encode_once_broken)
    event_log = _log(tmp_path, native=False)  # the native recorder's records are bytes already
    event_log.start()
    for n in range(SEND_BATCH + 1):
        event_log.report(decided(n))
    assert event_log.stop(5)
    assert event_log.lost == SEND_BATCH
    assert "256 event(s) lost: they cannot be sent (unmarshallable object)" in caplog.text
    assert [line["key"] for line in all_records(tmp_path)] == [f"dev-{SEND_BATCH}"]


def test_a_writer_that_reads_nothing_costs_routing_no_wait_and_the_ring_drops_the_oldest(tmp_path):
    metrics = Metrics()
    event_log = _log(tmp_path, metrics, ring_size=1000)
    event_log.start()
    writer = event_log._writer
    assert writer is not None
    os.kill(writer.pid, signal.SIGSTOP)  # the writer this test started, by its PID
    try:
        count = 40_000  # more than the pipe (at most 1 MB) and the ring hold
        for n in range(count):
            event_log.report(decided(n))  # a blocking write would hang here
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    assert event_log.stop(30)
    dropped = int(metrics.feature(EventLogMetrics).event_log_events.value(("dropped",)) or 0)
    assert dropped > 0
    assert event_log.lost == 0
    numbers = [int(str(line["seq"])) % BOOT_SPAN for line in all_records(tmp_path)]
    assert len(numbers) == event_log.written == count - dropped
    assert numbers == sorted(set(numbers))  # each once, in order; the gaps are the drops
    assert numbers[-1] == count - 1  # the newest are kept


def test_resize_at_run_time_keeps_what_the_ring_holds(tmp_path):
    event_log = _log(tmp_path, ring_size=10)
    for n in range(8):
        event_log.report(decided(n))
    event_log.resize(2)
    event_log.start()
    assert event_log.stop(5)
    assert len(all_records(tmp_path)) == 8
    assert event_log.status()["ring_size"] == 2
    with pytest.raises(ValueError, match="at least 1"):
        event_log.resize(0)


def test_a_write_error_loses_that_batch_only_and_the_writer_goes_on(tmp_path, caplog):
    metrics = Metrics()
    event_log = _log(tmp_path, metrics)
    event_log.start()
    name = file_name_part("edge-1")
    boot = event_log._boot
    (tmp_path / f".events-{name}-{boot}-000001.arrows.part").mkdir()  # the first file cannot be opened
    event_log.report(decided(1))
    assert eventually(lambda: event_log.lost == 1)
    event_log.report(decided(2))
    assert event_log.stop(5)
    assert [line["key"] for line in all_records(tmp_path)] == ["dev-2"]
    assert metrics.feature(EventLogMetrics).event_log_events.value(("lost",)) == 1
    assert "event log: 1 event(s) lost" in caplog.text


@pytest.mark.parametrize(
    ("form", "max_size"),  # a file of one event: ≈ 330 B of JSON, ≈ 5.6 kB of Parquet (its footer)
    [(JSONL, 1500), (EventFileFormat.PARQUET, 15000)],
)
def test_finished_files_beyond_max_size_are_deleted_oldest_first(tmp_path, caplog, form, max_size):
    metrics = Metrics()
    event_log = _log(
        tmp_path, metrics, rotate_size=1, max_size=max_size, compress=False, format=form, flush_interval_ms=1
    )
    event_log.start()
    for n in range(6):
        event_log.report(decided(n))
        assert eventually(lambda: event_log.files == n + 1)  # noqa: B023  # called before n moves on
    assert event_log.stop(5)
    files = finished(tmp_path)
    assert 1 < len(files) < 6
    assert sum(p.stat().st_size for p in files) <= max_size
    assert [line["key"] for line in all_records(tmp_path)] == [f"dev-{n}" for n in range(6 - len(files), 6)]
    assert metrics.feature(EventLogMetrics).event_log_files.value(("deleted",)) == 6 - len(files)
    assert f"over max-size={max_size}" in caplog.text


def test_an_unusable_directory_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    event_log = _log(blocker / "events")
    with pytest.raises(EventLogError, match=r"event log directory '.*/file/events': Not a directory"):
        event_log.start()


def test_status_says_where_and_how_much():
    event_log = EventLog(EventLogConfig(directory="/nonexistent"), "edge-1", {}, Metrics(), clock=lambda: NOW)
    event_log.report(decided(1))
    status = event_log.status()
    assert status["events"] == 1
    assert status["ring_used"] == 1
    assert status["current_file"] is None


def test_router_ids_and_file_names():
    assert default_router_id(["mqtt", "amqp"]) == f"{os.uname().nodename}/amqp+mqtt"
    assert file_name_part("edge-1.eu_west") == "edge-1.eu_west"
    assert file_name_part("host/a+b").startswith("host_a_b_")
    assert file_name_part("host/a+b") != file_name_part("host_a_b")


def test_a_writer_process_that_dies_is_started_again_and_what_it_missed_is_counted_lost(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(event_log_module, "WRITER_RESTART_S", 0.0)
    metrics = Metrics()
    event_log = _log(tmp_path, metrics, flush_interval_ms=60_000)
    event_log.start()
    first = event_log._writer
    assert first is not None
    event_log.report(decided(1))
    assert eventually(lambda: event_log.status()["current_file"] is not None)  # the first has it
    first.kill()  # the process this test started, by its PID, before it wrote the line
    first.wait()
    event_log.report(decided(2))  # sent into the dead one's pipe
    assert eventually(lambda: event_log.lost == 2)  # that one, and the one the first held
    assert "2 event(s) lost: the writer process ended (exit status -9)" in caplog.text
    event_log.report(decided(3))  # to a new writer (which finishes the first's empty file: deletes it)
    assert event_log.stop(5)
    assert event_log._writer is not first
    assert [line["key"] for line in all_records(tmp_path)] == ["dev-3"]
    assert metrics.feature(EventLogMetrics).event_log_events.value(("lost",)) == 2
    assert metrics.feature(EventLogMetrics).event_log_events.value(("written",)) == 1
    assert metrics.feature(EventLogMetrics).event_log_files.value(("finished",)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".events")]


def test_the_writers_log_lines_are_routerds(tmp_path, caplog):
    name = file_name_part("edge-1")
    (tmp_path / f"events-{name}-4-000001.jsonl").write_bytes(b"{}\n")
    (tmp_path / f".events-{name}-5-000001.jsonl.part").write_bytes(b"{}\n")
    event_log = _log(tmp_path, max_size=1, compress=False, format=JSONL)
    event_log.start()  # the writer finishes the leftover, then deletes the older file (max-size)
    assert event_log.stop(5)
    [record] = [r for r in caplog.records if "max-size" in r.getMessage()]
    assert (record.name, record.levelname) == ("router.eventlog", "WARNING")
    assert record.getMessage() == (
        f"event log: deleted events-{name}-4-000001.jsonl (3 bytes): finished files over max-size=1"
    )
    assert [p.name for p in finished(tmp_path)] == [f"events-{name}-5-000001.jsonl"]


def test_without_the_native_recorder_the_python_one_logs_and_routerd_says_so(tmp_path, monkeypatch, caplog):
    """An install without a C compiler: the same files, through the Python recorder, and a WARNING."""
    caplog.set_level(logging.INFO, "router.eventlog")
    monkeypatch.setattr(event_recorder, "NATIVE", False)
    monkeypatch.setattr(event_log_module, "NATIVE", False)
    config = EventLogConfig(directory=str(tmp_path))
    event_log = EventLog(config, "edge-1", {"r1": KeyType.CLIENT_ID}, Metrics(), clock=lambda: NOW)
    assert event_log.status()["recorder"] == "python"
    event_log.start()
    event_log.report(decided(1))
    assert event_log.stop(5)
    assert [r["key"] for r in all_records(tmp_path)] == ["dev-1"]
    assert "recorder=python" in caplog.text
    assert "the native recorder is not built" in caplog.text


def _service_config(*routers: RouterConfig, event_log: EventLogConfig | None = None) -> Config:
    return Config(source="t.xml", routers=routers, event_log=event_log)


def _runtime(key_type: KeyType) -> RouterRuntime:
    """Router `r1`, the router of `decided`'s events."""
    router = RouterConfig(name="r1", key_type=key_type)
    return RouterRuntime(_service_config(router), router, Metrics())


class TestEventLogService:
    """`EventLogService`: the log opened at start only when configured, each router's events logged
    with its key type, its rest written at exit (through a real routerd: test_routerd_event_log.py).
    Once each: the service's log records with the recorder that is built."""

    @pytest.fixture(autouse=True)
    def recorders(self) -> bool:
        return True

    async def test_no_event_log_without_its_configuration(self) -> None:
        service = EventLogService(_service_config, Metrics())
        service.open_files()
        assert service.event_log is None
        runtime = _runtime(KeyType.SOURCE_IP)
        service.router_added(runtime)
        service.router_changed(runtime)
        await service.close_files(5.0)
        assert service.event_log is None

    def test_an_unusable_directory_is_an_open_error_of_one_line(self, tmp_path: Path) -> None:
        blocker = tmp_path / "file"
        blocker.write_text("")
        settings = EventLogConfig(directory=str(blocker / "e"))
        service = EventLogService(lambda: _service_config(event_log=settings), Metrics())
        with pytest.raises(OpenError, match=r"^event log directory '.*/file/e': Not a directory$"):
            service.open_files()
        assert service.event_log is None

    async def test_each_router_s_events_are_logged_with_its_key_type_until_the_exit(
        self, tmp_path: Path
    ) -> None:
        """Scenario: the router is added with key type SOURCE_IP, then a reload makes it CLIENT_ID;
        at exit the file holds both decisions, each with the raw key of its time (the events' facts
        have a client id and no source IP)."""
        settings = EventLogConfig(directory=str(tmp_path), router_id="edge-1")
        service = EventLogService(lambda: _service_config(event_log=settings), Metrics())
        service.open_files()
        assert service.event_log is not None
        assert service.event_log.router_id == "edge-1"
        runtime = _runtime(KeyType.SOURCE_IP)
        service.router_added(runtime)
        runtime.report(decided(1))
        client_id = RouterConfig(name="r1", key_type=KeyType.CLIENT_ID)
        runtime.reconfigure(_service_config(client_id, event_log=settings), client_id)
        service.router_changed(runtime)
        runtime.report(decided(2))
        await service.close_files(5.0)
        logged = [(int(str(r["conn"])) % BOOT_SPAN, r["raw_key"]) for r in all_records(tmp_path)]
        assert logged == [(1, None), (2, "dev-2")]

    async def test_a_writer_that_does_not_finish_in_time_is_an_error_naming_the_directory(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        service = EventLogService(
            lambda: _service_config(event_log=EventLogConfig(directory=str(tmp_path))), Metrics()
        )
        service.open_files()
        assert service.event_log is not None
        await service.close_files(0.0)
        [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert record.name == "router.server"
        assert record.getMessage().startswith(f"event log {tmp_path}: the writer did not finish within 0 s")
        assert service.event_log.stop(5.0)
