"""Passive health's pure rule (pools/outlier.py) and its place in the pool (pools/pool.py)."""

from __future__ import annotations

import pytest

from pools import BrokerFailure, OutlierConfig, Pool, PoolEventKind, Target
from pools.outlier import Outliers, OutlierState
from pools.target import Connector

CLOSED = BrokerFailure.CLOSED_EARLY


def _outliers(**settings: int | bool) -> Outliers:
    return Outliers(OutlierConfig(**settings))  # type: ignore[arg-type]  # each field's own type


def _fail(outliers: Outliers, node_id: str, times: int, now: float = 0.0, pool_size: int = 3) -> list[object]:
    return [outliers.failed(node_id, CLOSED, now, pool_size=pool_size) for _ in range(times)]


def test_outliers_eject_after_consecutive_failures_within_window() -> None:
    outliers = _outliers(consecutive_failures=3)
    assert _fail(outliers, "a", 2) == [None, None]
    ejection = outliers.failed("a", CLOSED, 1.0, pool_size=3, detail="x")
    assert ejection is not None
    assert (ejection.until, ejection.failures, ejection.reason) == (31.0, 3, CLOSED)
    assert outliers.state("a") is OutlierState.EJECTED
    assert "ejected by outlier detection for 30 s: 3 consecutive failures" in ejection.why


def test_outliers_answer_resets_count() -> None:
    outliers = _outliers(consecutive_failures=3)
    _fail(outliers, "a", 2)
    assert outliers.failing("a")
    assert outliers.answered("a")
    assert not outliers.failing("a")
    assert _fail(outliers, "a", 2) == [None, None]
    assert not outliers.answered("b")  # nothing counted: nothing to change


def test_outliers_failures_outside_window_start_again() -> None:
    outliers = _outliers(consecutive_failures=2, window_ms=1000)
    assert outliers.failed("a", CLOSED, 0.0, pool_size=3) is None
    assert outliers.failed("a", CLOSED, 1.5, pool_size=3) is None  # the first is too old
    assert outliers.failed("a", CLOSED, 2.0, pool_size=3) is not None


def test_outliers_return_after_ejection_time_and_back_off_doubles() -> None:
    outliers = _outliers(consecutive_failures=1, base_ejection_ms=10_000, max_ejection_ms=25_000)
    first = outliers.failed("a", CLOSED, 0.0, pool_size=3)
    assert first is not None
    assert first.until == 10.0
    assert outliers.failed("a", CLOSED, 5.0, pool_size=3) is None  # ejected: not counted
    assert outliers.returns(9.9) == []
    assert outliers.next_return() == 10.0
    assert [e.node_id for e in outliers.returns(10.0)] == ["a"]
    assert outliers.state("a") is OutlierState.IN
    assert outliers.next_return() is None
    second = outliers.failed("a", CLOSED, 11.0, pool_size=3)
    assert second is not None
    assert second.duration_s == 20.0
    outliers.returns(31.0)
    third = outliers.failed("a", CLOSED, 32.0, pool_size=3)
    assert third is not None
    assert third.duration_s == 25.0
    outliers.returns(57.0)
    fourth = outliers.failed("a", CLOSED, 57.0 + 26.0, pool_size=3)  # quiet longer than the max
    assert fourth is not None
    assert fourth.duration_s == 10.0


def test_outliers_never_eject_last_target_and_respect_percent() -> None:
    outliers = _outliers(consecutive_failures=1)
    assert outliers.failed("a", CLOSED, 0.0, pool_size=2) is not None
    assert outliers.failed("b", CLOSED, 0.0, pool_size=2) is None  # the last one stays
    limited = _outliers(consecutive_failures=1, max_ejected_percent=10)
    assert limited.failed("a", CLOSED, 0.0, pool_size=4) is not None  # at least one, as Envoy
    assert limited.failed("b", CLOSED, 0.0, pool_size=4) is None


def test_outliers_disabled_never_eject_and_reload_ends_ejections() -> None:
    assert _fail(_outliers(enabled=False, consecutive_failures=1), "a", 3) == [None, None, None]
    outliers = _outliers(consecutive_failures=1)
    outliers.failed("a", CLOSED, 0.0, pool_size=3)
    assert outliers.reconfigure(OutlierConfig(consecutive_failures=2)) == []  # kept
    assert outliers.state("a") is OutlierState.EJECTED
    assert [e.node_id for e in outliers.reconfigure(OutlierConfig(enabled=False))] == ["a"]
    assert outliers.state("a") is OutlierState.IN


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"consecutive_failures": 0}, "consecutive-failures must be > 0"),
        ({"window_ms": 0}, "window must be > 0"),
        ({"base_ejection_ms": 0}, "base-ejection-time must be > 0"),
        ({"base_ejection_ms": 10, "max_ejection_ms": 5}, "max-ejection-time must be >= base"),
        ({"max_ejected_percent": 101}, "max-ejected-percent must be in 0..100, got 101"),
    ],
)
def test_outlier_config_rejects_bad_values(settings: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OutlierConfig(**settings)  # type: ignore[arg-type]  # each field its own type


def _pool() -> Pool:
    targets = [Target(node_id=n, connector=Connector(name=f"c-{n}", host="10.0.0.1", port=1)) for n in "abc"]
    pool = Pool("r", 1, targets, OutlierConfig(consecutive_failures=2, base_ejection_ms=1000))
    for node_id in "abc":
        pool.record_check(node_id, True)
    return pool


def test_pool_ejected_target_not_routed_but_counts_for_quorum_and_probe_does_not_return_it() -> None:
    pool = _pool()
    assert pool.broker_failed("a", CLOSED, 0.0) == []
    events = pool.broker_failed("a", CLOSED, 0.1, "x")
    assert [e.kind for e in events] == [PoolEventKind.TARGET_EJECTED]
    assert [t.node_id for t in pool.routing_targets()] == ["b", "c"]
    assert pool.ready_target("a") is None
    assert pool.ready_count() == 3
    assert pool.record_check("a", True) == []  # a probe's success does not end the ejection
    assert pool.ready_target("a") is None
    assert pool.return_ejected(1.0) == []
    assert [e.kind for e in pool.return_ejected(1.1)] == [PoolEventKind.TARGET_RETURNED]
    assert [t.node_id for t in pool.routing_targets()] == ["a", "b", "c"]


def test_pool_reconfigure_keeps_ejection_of_unchanged_target_and_forgets_removed() -> None:
    pool = _pool()
    pool.broker_failed("a", CLOSED, 0.0)
    pool.broker_failed("a", CLOSED, 0.0)
    pool.reconfigure(1, pool.targets)
    assert pool.ejection("a") is not None
    pool.reconfigure(1, pool.targets[1:])
    assert pool.ejection("a") is None
    assert pool.next_return() is None
    assert pool.broker_failed("a", CLOSED, 0.0) == []  # left the pool: not counted
