"""The routing event log's cost inside the router, in process: what the reporting thread pays per
event, what the writer thread pays per event, next to the routing decision itself.

`EventLog` (router/services/event_log.py) is built as routerd builds it, on a directory under
`/tmp`, with a ring large enough that nothing is dropped. Then:

* **report**: `EventLog.report(event)` for every event (a wall-clock read and a ring put under
  its lock), each call timed with `time.perf_counter_ns` (whose own ~0.1 µs is included), in the
  calling thread as routing calls it. The writer is not running meanwhile, so the lock is
  uncontended (in routerd it is almost always: the writer takes `TAKE_BATCH` at a time).
* **writer**: the writer thread started over the full ring and stopped when it has drained it:
  `timestamp` + `event_line` + the file write per batch, then at stop the finishing of the file
  (zstd level 3, fsync, rename) — wall time from `start()` to `stop()` returning, per event. The
  writer's format and compress steps are also timed alone on the same events (`timestamp` +
  `event_line`, as the writer formats; `ZstdCompressor.compress` of the lines), as a breakdown.
* **decision**: `benchmarks.decision.time_decisions` on the benchmark's routerd configuration
  (`echo`: SOURCE_IP, CONSISTENT_HASH over 2 targets, cache), cache miss and hit.

The events are what a short proxied MQTT connection produces: a `Decided` (CLIENT_ID key, OK by
policy, proxy) and a `Closed`, alternating, with distinct client ids and connection ids.

Routing pays `report` on its own thread; the writer runs on its own thread (at niceness
`WRITER_NICE`) but under the same GIL, so its CPU is the process's too. Neither is the router's
connection rate: the lead measures that with `benchmarks/bench --runs 3 [--event-log]`
(benchmarks/README.md).
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zstandard

from benchmarks.configs import Ports, routerd_config
from benchmarks.decision import percentile, time_decisions
from keys import ConnectionFacts, KeyType, WireProtocol
from router.config.settings import EventLogConfig
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.event_records import Sequence, event_line, timestamp
from router.core.events import Closed, CloseReason, ConnectionRef, Decided, Mode
from router.metrics import Metrics
from router.services.event_log import TAKE_BATCH, ZSTD_LEVEL, EventLog

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["EventLogCost", "make_events", "time_event_log"]

_ROUTER = "mqtt"
_ACCEPTOR = "mqtt"


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogCost:
    """The event log's cost per event, in microseconds, and the decision it accompanies."""

    events: int
    """Events reported and written (half decisions, half closes)."""
    report_p50_us: float
    report_p99_us: float
    report_mean_us: float
    """`EventLog.report`: the reporting thread's cost (clock read + ring put)."""
    writer_us: float
    """The writer thread's wall time per event: record, line, write, and the file's finishing."""
    format_us: float
    """Of which `timestamp` + `event_line` (the writer's formatting), timed alone."""
    compress_us: float
    """Of which zstd (level 3) of the lines, timed alone."""
    bytes_per_event: float
    """Uncompressed line length."""
    compressed_bytes_per_event: float
    """In the finished `.jsonl.zst` file."""
    decision_miss_p50_us: float
    decision_hit_p50_us: float
    decision_keys: int

    @property
    def per_connection_us(self) -> float:
        """What a short proxied connection (one decision, one close) costs the process in all:
        two reports and two lines written."""
        return 2 * (self.report_mean_us + self.writer_us)


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


def _format_and_compress(events: list[Decided | Closed]) -> tuple[float, float, int, int]:
    """Seconds to format every event as the writer does, seconds to compress the lines, and the
    bytes before and after."""
    sequence = Sequence(int(time.time() * 1000))
    key_types = {_ROUTER: KeyType.CLIENT_ID}
    now = time.time()
    clock = time.perf_counter
    started = clock()
    lines = [
        event_line(
            event,
            router_id="bench",
            seq=sequence.of(n),
            conn=sequence.of(event.conn.id),
            ts=timestamp(now + n * 1e-4),
            key_type=key_types.get(event.conn.router, KeyType.SOURCE_IP),
        )
        for n, event in enumerate(events)
    ]
    formatted = clock() - started
    data = "".join(lines).encode("ascii")
    started = clock()
    compressed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    return formatted, clock() - started, len(data), len(compressed)


def _time_reports(log: EventLog, items: list[Decided | Closed]) -> list[float]:
    """Each `report` call's time (µs), in batches of the writer's `TAKE_BATCH`, the ring drained
    between batches as the writer drains it, so it stays as short as in a router that keeps up."""
    report: Callable[[Decided | Closed], None] = log.report
    clock = time.perf_counter_ns
    for event in items[:200]:  # the first calls pay for lazy work; not in the figures
        report(event)
    ring = log._ring  # private: the writer's side of the ring, taken here without a writer
    ring.take(len(items))
    samples: list[float] = [0.0] * len(items)
    for begin in range(0, len(items), TAKE_BATCH):
        for n in range(begin, min(begin + TAKE_BATCH, len(items))):
            event = items[n]
            start = clock()
            report(event)
            samples[n] = (clock() - start) / 1000
        ring.take(TAKE_BATCH)
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
    formatted_s, compressed_s, raw_bytes, _ = _format_and_compress(items)
    with tempfile.TemporaryDirectory(prefix="router-eventlog-bench-") as directory:
        config = EventLogConfig(directory=directory, router_id="bench", ring_size=events + 1)
        samples = _time_reports(EventLog(config, "bench", {_ROUTER: KeyType.CLIENT_ID}, Metrics()), items)
        log = EventLog(config, "bench", {_ROUTER: KeyType.CLIENT_ID}, Metrics())
        for event in items:
            log.report(event)
        started = time.perf_counter()
        log.start()
        if not log.stop(120):
            raise RuntimeError("the event log's writer did not finish within 120 s")
        writer_s = time.perf_counter() - started
        status = log.status()
        if status["written"] != events or status["dropped"] != 0 or status["lost"] != 0:
            raise RuntimeError(f"the writer wrote {status['written']} of {events} events: {status}")
        finished = list(Path(directory).glob("events-*.jsonl.zst"))
        compressed_bytes = sum(p.stat().st_size for p in finished)
        lines = sum(
            zstandard.ZstdDecompressor().decompressobj().decompress(p.read_bytes()).count(b"\n")
            for p in finished
        )
        if lines != events:
            raise RuntimeError(f"the finished files hold {lines} lines, not {events}")
    decision = time_decisions(
        routerd_config(Ports.from_numbers(range(20001, 20001 + Ports.COUNT))), "echo", keys=decision_keys
    )
    return EventLogCost(
        events=events,
        report_p50_us=percentile(samples, 0.50),
        report_p99_us=percentile(samples, 0.99),
        report_mean_us=statistics.fmean(samples),
        writer_us=writer_s * 1e6 / events,
        format_us=formatted_s * 1e6 / events,
        compress_us=compressed_s * 1e6 / events,
        bytes_per_event=raw_bytes / events,
        compressed_bytes_per_event=compressed_bytes / events,
        decision_miss_p50_us=decision.miss_p50_us,
        decision_hit_p50_us=decision.hit_p50_us,
        decision_keys=decision.keys,
    )
