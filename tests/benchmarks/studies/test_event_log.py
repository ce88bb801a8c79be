"""The event log's cost in process: a tiny run of the real EventLog."""

from __future__ import annotations

from benchmarks.studies.event_log import make_events, time_event_log
from router.core.events import Closed, Decided


def test_make_events_alternates_decision_and_close() -> None:
    events = make_events(4)
    assert [type(e) for e in events] == [Decided, Closed, Decided, Closed]
    assert events[0].conn.id == events[1].conn.id != events[2].conn.id


def test_time_event_log_gives_positive_figures() -> None:
    cost = time_event_log(2_000, decision_keys=300)
    assert cost.events == 2_000
    assert 0 < cost.report_p50_us <= cost.report_p99_us
    assert cost.send_us > 0
    assert [w.format for w in cost.writers] == ["parquet", "jsonl"]
    for writer in cost.writers:
        assert 0 < writer.encode_us < writer.writer_us
        assert 0 < writer.file_bytes_per_event < 400  # compressed, below a line's length
        assert 0 < writer.steady_cpu_us < 1000
    assert cost.decision_miss_p50_us > 0
    assert cost.per_connection_us > 0
