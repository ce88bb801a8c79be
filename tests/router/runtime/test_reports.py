"""Reports: every subscriber gets every event, in order, from the moment it subscribed."""

from __future__ import annotations

from router.core.engine import RouteStatus
from router.core.events import LookedUp
from router.metrics import Metrics
from router.reports import MetricUpdates
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


def test_metrics_are_a_subscriber_and_the_data_paths_way_to_count_without_events() -> None:
    got: list[object] = []
    metrics = Metrics()
    updates = MetricUpdates(metrics)
    report = Reports(got.append, updates=updates)
    assert report.updates is updates
    assert not report.subscribed  # nobody else: the events only the metrics read are not made
    one = LookedUp(router="r", key="a", status=RouteStatus.OK)
    report(one)
    assert got == [one]
    assert metrics.lookups.value(("r", "OK")) == 1
    report.subscribe(got.append)
    assert report.subscribed
