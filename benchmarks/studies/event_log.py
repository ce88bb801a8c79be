"""The routing event log's cost, in process: what the reporting thread pays per event to record it
and to send it, what the writer process takes per event, next to the routing decision itself.

    .venv/bin/python -m benchmarks.studies.pipeline --only event-log

Quoted by docs/event-log.md ("Why Parquet", "What it costs routerd") and benchmarks/README.md
("The event pipeline"). It has no command of its own: the pipeline study runs it.

`EventLog` (router/features/event_log/service.py) is built as routerd builds it, on a directory
under `/tmp`, with a ring large enough that nothing is dropped. Then:

* **report**: `EventLog.report(event)` for every event (the recorder's record into its ring: the
  native one's when it is built, router/features/event_log/recorder.py), each call timed with
  `time.perf_counter_ns` (whose own ~0.1 µs is included), in the calling thread as routing calls
  it. The ring is drained every `SEND_BATCH` events, where routerd's reporting thread sends them,
  and no writer runs meanwhile: the send is the next figure.
* **send**: what sending costs the reporting thread per event: the recorder's `take_frame` of
  `SEND_BATCH` events, timed alone; the pipe write after it releases the interpreter.
* **writer**, for each file format (Parquet, the default, and JSON lines): the writer process over
  the full ring: started, then the ring sent to it, and stopped when it has written, finished
  (Parquet from its Arrow batches; zstd level 3 of the lines), synced and renamed its file — wall
  time from `start()` returning to `stop()` returning, per event. The format's encoding alone
  (`FileFormat.encode` of `PENDING_EVENTS` at a time, as the writer encodes) is timed on the same
  events, as a breakdown, and the finished file's size per event is given. Then, as a router feeds
  it, the writer's own CPU time per event while events come at 16,000 a second (12.5 s for 200,000)
  (`TRICKLE_RATE`, `benchmarks.fleet.cpu_ns`; the finishing of its file is left out).
* **decision**: `benchmarks.decision.time_decisions` on the benchmark's routerd configuration
  (`echo`: SOURCE_IP, CONSISTENT_HASH over 2 targets, cache), cache miss and hit.

The events are what a short proxied MQTT connection produces: a `Decided` (CLIENT_ID key, OK by
policy, proxy) and a `Closed`, alternating, with distinct client ids and connection ids.

Routing pays `report` and the send; the writer process runs beside it
(another CPU when there is one). Neither is the router's connection rate: the lead measures that
with `benchmarks/bench --runs 3 [--event-log]` (benchmarks/README.md).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pyarrow.parquet as pq
import zstandard

from benchmarks.configs import Ports, routerd_config
from benchmarks.decision import percentile, time_decisions
from benchmarks.fleet import cpu_ns
from event_format.frames import FRAME_HEAD, Batch, decode_frame
from keys import ConnectionFacts, KeyType, WireProtocol
from router.config.settings import EventFileFormat, EventLogConfig
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import Closed, CloseReason, ConnectionRef, Decided, Mode
from router.features.event_log.files import PENDING_EVENTS
from router.features.event_log.recorder import make_recorder
from router.features.event_log.service import SEND_BATCH, EventLog
from router.features.event_log.writer import file_format
from router.metrics import Metrics

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["TRICKLE_RATE", "EventLogCost", "WriterCost", "make_events", "time_event_log"]

_ROUTER = "mqtt"
_ACCEPTOR = "mqtt"


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterCost:
    """The writer process's cost per event in one file format."""

    format: str
    """`EventFileFormat`'s value."""
    writer_us: float
    """Wall time per event: encoding, writing, and the file's finishing."""
    encode_us: float
    """Of which the format's `encode`, timed alone."""
    file_bytes_per_event: float
    """In the finished file (compressed)."""
    steady_cpu_us: float
    """The writer process's CPU time per event while events come at `TRICKLE_RATE` per second, as
    from a busy router (its file's finishing excluded)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogCost:
    """The event log's cost per event, in microseconds, and the decision it accompanies."""

    events: int
    """Events reported and written (half decisions, half closes)."""
    report_p50_us: float
    report_p99_us: float
    report_mean_us: float
    """`EventLog.report`: the reporting thread's cost (the recorder's record, clock read included)."""
    send_us: float
    """The reporting thread's `take_frame` per event, every `SEND_BATCH` events (routerd's
    interpreter)."""
    writers: tuple[WriterCost, ...]
    """The writer process, per file format (the default first)."""
    decision_miss_p50_us: float
    decision_hit_p50_us: float
    decision_keys: int

    @property
    def per_connection_us(self) -> float:
        """What a short proxied connection (one decision, one close) costs routerd's interpreter:
        two reports and two events sent (the writer process's work is beside it)."""
        return 2 * (self.report_mean_us + self.send_us)


def make_events(count: int) -> list[Decided | Closed]:
    """`count` events of short proxied MQTT connections: decision, close, decision, close, ..."""
    events: list[Decided | Closed] = []
    for i in range(count):
        conn = ConnectionRef(
            id=i // 2,
            router=_ROUTER,
            acceptor=_ACCEPTOR,
            peer=Address(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 40000 + i % 20000),
        )
        if i % 2 == 0:
            client_id = f"client-{i // 2:07d}"
            events.append(
                Decided(
                    conn=conn,
                    key=client_id,
                    status=RouteStatus.OK,
                    reason=DecisionReason.POLICY,
                    mode=Mode.PROXY,
                    node_id=f"broker{i % 3}",
                    protocol=WireProtocol.MQTT,
                    facts=ConnectionFacts(source_ip=conn.peer.host, client_id=client_id),
                    latency_s=0.000_350,
                )
            )
        else:
            events.append(
                Closed(
                    conn=conn,
                    node_id=f"broker{(i - 1) % 3}",
                    bytes_in=64,
                    bytes_out=4,
                    duration_s=0.0021,
                    reason=CloseReason.CLOSED,
                )
            )
    return events


def _sent(events: list[Decided | Closed]) -> tuple[float, list[Batch]]:
    """Seconds to take every event from the ring as frames, as the reporting thread does, and the
    frames as the writer reads them."""
    recorder = make_recorder(len(events), {_ROUTER: KeyType.CLIENT_ID}, time.time)
    for event in events:
        recorder.record(event)
    frames = []
    started = time.perf_counter()
    for _ in range(0, len(events), SEND_BATCH):
        frames.append(recorder.take_frame(SEND_BATCH)[0])
    send_s = time.perf_counter() - started
    return send_s, [decode_frame(frame[FRAME_HEAD.size :]) for frame in frames]


def _encode_seconds(batches: list[Batch], config: EventLogConfig) -> float:
    """Seconds the format's `encode` takes for every event, `PENDING_EVENTS` at a time."""
    encoder = file_format(config, "bench", int(time.time() * 1000))
    per_encode = max(1, PENDING_EVENTS // SEND_BATCH)
    started = time.perf_counter()
    for begin in range(0, len(batches), per_encode):
        encoded = encoder.encode(batches[begin : begin + per_encode])
        if encoded.failure is not None:
            raise RuntimeError(f"the benchmark's events do not encode: {encoded.failure}")
    return time.perf_counter() - started


TRICKLE_RATE: Final = 16_000
"""Events per second of the steady measurement: a router at 8,000 short connections a second."""
_TRICKLE_SLICE_S: Final = 0.01


def _steady_cpu_us(config: EventLogConfig, items: list[Decided | Closed]) -> float:
    """The writer's CPU per event while `items` are reported at `TRICKLE_RATE` (module docstring)."""
    log = EventLog(config, "bench", {_ROUTER: KeyType.CLIENT_ID}, Metrics())
    log.start()
    try:
        writer = log._writer  # private: the benchmark reads its process's CPU time
        if writer is None:
            raise RuntimeError("the event log's writer did not start")
        before = cpu_ns(writer.pid)
        per_slice = round(TRICKLE_RATE * _TRICKLE_SLICE_S)
        started = time.monotonic()
        for number, begin in enumerate(range(0, len(items), per_slice), start=1):
            for event in items[begin : begin + per_slice]:
                log.report(event)
            time.sleep(max(0.0, started + number * _TRICKLE_SLICE_S - time.monotonic()))
        deadline = time.monotonic() + 30
        while log.written < len(items) and time.monotonic() < deadline:
            time.sleep(0.05)
        used_ns = cpu_ns(writer.pid) - before
    finally:
        if not log.stop(120):
            raise RuntimeError("the event log's writer did not finish within 120 s")
    return used_ns / 1e3 / len(items)


def _records(path: Path) -> int:
    if path.name.endswith(".parquet"):
        return int(pq.read_metadata(path).num_rows)
    return zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()).count(b"\n")


def _time_reports(log: EventLog, items: list[Decided | Closed]) -> list[float]:
    """Each `report` call's time (µs), in batches of `SEND_BATCH`, the ring drained between batches
    where the reporting thread would send them (timed apart: `_send_seconds`), so it stays as
    short as in a router that keeps up."""
    report: Callable[[Decided | Closed], None] = log.report
    clock = time.perf_counter_ns
    for event in items[:200]:  # the first calls pay for lazy work; not in the figures
        report(event)
    ring = log._ring  # private: the sending side of the ring, taken here without a writer
    ring.discard(len(items))
    samples: list[float] = [0.0] * len(items)
    for begin in range(0, len(items), SEND_BATCH):
        for n in range(begin, min(begin + SEND_BATCH, len(items))):
            event = items[n]
            start = clock()
            report(event)
            samples[n] = (clock() - start) / 1000
        ring.discard(SEND_BATCH)
    return samples


def time_event_log(events: int = 200_000, *, decision_keys: int = 20_000) -> EventLogCost:
    """Measure the event log's cost on `events` events (module docstring).

    Args:
        events: events to report and write (>= 2).
        decision_keys: keys for the decision figures (`time_decisions`).

    Returns:
        The figures.

    Raises:
        RuntimeError: the writer did not finish, or its file does not hold every event.
    """
    if events < 2:
        raise ValueError(f"events must be >= 2, got {events}")
    items = make_events(events)
    # The benchmark's own objects (the events) are frozen out of the garbage collector: a
    # collection then walks what the event log allocates, not the benchmark's heap.
    gc.collect()
    gc.freeze()
    try:
        return _measure(items, decision_keys)
    finally:
        gc.unfreeze()


def _measure(items: list[Decided | Closed], decision_keys: int) -> EventLogCost:
    events = len(items)
    send_s, batches = _sent(items)
    with tempfile.TemporaryDirectory(prefix="router-eventlog-bench-") as directory:
        config = EventLogConfig(directory=directory, router_id="bench", ring_size=events + 1)
        samples = _time_reports(EventLog(config, "bench", {_ROUTER: KeyType.CLIENT_ID}, Metrics()), items)
    writers = tuple(_writer_cost(form, items, batches) for form in EventFileFormat)
    decision = time_decisions(
        routerd_config(Ports.from_numbers(range(20001, 20001 + Ports.COUNT))), "echo", keys=decision_keys
    )
    return EventLogCost(
        events=events,
        report_p50_us=percentile(samples, 0.50),
        report_p99_us=percentile(samples, 0.99),
        report_mean_us=statistics.fmean(samples),
        send_us=send_s * 1e6 / events,
        writers=writers,
        decision_miss_p50_us=decision.miss_p50_us,
        decision_hit_p50_us=decision.hit_p50_us,
        decision_keys=decision.keys,
    )


def _writer_cost(form: EventFileFormat, items: list[Decided | Closed], batches: list[Batch]) -> WriterCost:
    """The writer process's figures in one format (module docstring), each run on a directory of
    its own."""
    events = len(items)
    with (
        tempfile.TemporaryDirectory(prefix="router-eventlog-bench-") as full,
        tempfile.TemporaryDirectory(prefix="router-eventlog-bench-") as steady,
    ):
        config = EventLogConfig(directory=full, router_id="bench", ring_size=events + 1, format=form)
        writer_s, file_bytes = _time_writer(config, items)
        steady_cpu_us = _steady_cpu_us(dataclasses.replace(config, directory=steady), items)
    return WriterCost(
        format=form.value,
        writer_us=writer_s * 1e6 / events,
        encode_us=_encode_seconds(batches, config) * 1e6 / events,
        file_bytes_per_event=file_bytes / events,
        steady_cpu_us=steady_cpu_us,
    )


def _time_writer(config: EventLogConfig, items: list[Decided | Closed]) -> tuple[float, int]:
    """The writer process's wall time over the full ring (module docstring), and the bytes of the
    files it finished.

    Raises:
        RuntimeError: it did not finish, or its files do not hold every event.
    """
    events = len(items)
    log = EventLog(config, "bench", {_ROUTER: KeyType.CLIENT_ID}, Metrics())
    for event in items:
        log.report(event)
    log.start()
    started = time.perf_counter()
    if not log.stop(120):
        raise RuntimeError("the event log's writer did not finish within 120 s")
    writer_s = time.perf_counter() - started
    status = log.status()
    if status["written"] != events or status["dropped"] != 0 or status["lost"] != 0:
        raise RuntimeError(f"the writer wrote {status['written']} of {events} events: {status}")
    finished = list(Path(config.directory).glob("events-*"))
    records = sum(_records(p) for p in finished)
    if records != events:
        raise RuntimeError(f"the finished files hold {records} records, not {events}")
    return writer_s, sum(p.stat().st_size for p in finished)
