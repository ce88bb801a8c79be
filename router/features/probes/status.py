"""A target's broker-reported connection count as operators see it: the `broker_count` member of
the target's status document (the admin API's router and target documents), and its table in a
router's `routerctl status`.

Pure: `broker_count_status` is a `TargetSection` (router/core/status.py), a target, the router's
history (where service.py records each read) and a time in, a JSON value out; `broker_count_blocks`
a router's document in, a table out. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from router.core.status import rfc3339
from router.ctl_output import Table
from router.ctl_render import duration, field, items

if TYPE_CHECKING:
    from pools import Target
    from router.core.status import CountReport, TargetHistory
    from router.ctl_output import Renderable

__all__ = ["BROKER_COUNT", "BrokerCountStatus", "broker_count_blocks", "broker_count_status"]

BROKER_COUNT: Final = "broker_count"
"""The member's name in a target's document."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerCountStatus:
    """A target's broker-reported connection count, as the status shows it."""

    source: str
    """Its connector's `connectionCount=` (pools.COUNT_SOURCES)."""
    report: CountReport
    age_s: float | None = None
    """How old `report.read_at` was when the snapshot was taken; None: never read, or no clock given."""

    def to_json(self) -> dict[str, object]:
        report = self.report
        return {
            "source": self.source,
            "count": report.count,
            "read_at": None if report.read_at is None else rfc3339(report.read_at),
            "age_s": None if self.age_s is None else round(self.age_s, 3),
            "last_error": report.last_error,
            "last_error_at": None if report.last_error_at is None else rfc3339(report.last_error_at),
        }


def broker_count_status(
    target: Target, history: TargetHistory, now: float | None
) -> dict[str, object] | None:
    """The target's `broker_count` member (a `TargetSection`): its broker's last reported count,
    with its age at `now` (seconds since the epoch; None: no age); None when its connector reads
    no count (no `connectionCount=`)."""
    source = None if target.connector is None else target.connector.connection_count
    if source is None:
        return None
    report = history.count_report(target.node_id)
    age_s = None if now is None or report.read_at is None else max(0.0, now - report.read_at)
    return BrokerCountStatus(source=source.kind, report=report, age_s=age_s).to_json()


def broker_count_blocks(router: object) -> list[Renderable]:
    """A router's table of broker-reported counts in `routerctl status ROUTER` (a `Feature`'s
    `router_blocks`): one row per target that reads one; no table when none does."""
    counts = Table(["node_id", "count_source", "broker_count", "read", "last_error"])
    for t in items(field(router, "pool"), "targets"):
        report = field(t, BROKER_COUNT)
        if isinstance(report, dict):
            age = report.get("age_s")
            read = None if report.get("read_at") is None else f"{duration(age)} ago"
            counts.add(
                field(t, "node_id"), report.get("source"), report.get("count"), read, report.get("last_error")
            )
    return [counts] if counts.rows else []
