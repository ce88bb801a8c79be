"""The routing event log: every routing decision and every closed proxied connection as one record,
in rotating Parquet (or JSON lines) files that the pipeline reads (docs/event-log.md).

Pure (linted as `core/` is: no trio, no socket):

    sources.py   the one table of where each field of a record comes from in an event
    records.py   an event's values and its record, by the code generated from that table
                 (`_generated_records.py`, `python -m tools.generate`)
    ring.py      the bounded ring between routing and the writer (the Python recorder's)
    recorder.py  what a reporting thread does with an event: the C recorder
                 (`event_format._native`) or the Python one, and the frames to the writer

In routerd and its writer process:

    service.py   `EventLog` (the subscriber, the ring's sender, the writer process started and
                 watched) and `EventLogService`: the log opened at start, each router subscribed,
                 its rest written at exit
    writer.py    the writer process (`python -m router.features.event_log.writer`)
    files.py     its files: the file in progress, rotation, finishing, retention, recovery
    routes.py    `/api/v1/event-log`
    commands.py  `routerctl event-log`
    metrics.py   router_event_log_events_total, router_event_log_files_total,
                 router_event_log_ring_size, router_event_log_ring_used

The files' format is event_format/'s (shared with pipeline/ and fuzz/); `<event-log>` is read by
router/config/ (`EventLogConfig`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.feature import Feature

    FEATURE: Feature

__all__ = ["FEATURE"]


def __getattr__(name: str) -> object:
    """`FEATURE`, imported on first use: the writer process (writer.py) imports this package and
    needs none of the feature's routerd side (its service, routes, commands)."""
    if name != "FEATURE":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _feature()


@functools.cache
def _feature() -> Feature:
    from router.feature import Feature
    from router.features.event_log.commands import COMMANDS
    from router.features.event_log.metrics import EventLogMetrics
    from router.features.event_log.routes import ROUTES
    from router.features.event_log.service import start

    return Feature(
        name="event_log",
        in_workers=False,
        routes=ROUTES,
        commands=COMMANDS,
        metrics=EventLogMetrics,
        start=start,
    )
