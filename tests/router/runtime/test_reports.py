"""Reports: every subscriber gets every event, in order, from the moment it subscribed."""

from __future__ import annotations

from router.core.engine import RouteStatus
from router.core.events import LookedUp
from router.runtime.reports import Reports


def test_each_subscriber_gets_the_events_from_when_it_subscribed() -> None:
    first: list[object] = []
    later: list[object] = []
    report = Reports(first.append)
    one = LookedUp(router="r", key="a", status=RouteStatus.OK)
    two = LookedUp(router="r", key="b", status=RouteStatus.OK)
    report(one)
    report.subscribe(later.append)
    report(two)
    assert first == [one, two]
    assert later == [two]
