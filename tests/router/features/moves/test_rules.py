"""router/features/moves/rules.py: pacing, order, rebalance arithmetic and requests."""

from __future__ import annotations

import random

import pytest

from router.core.address import Address
from router.core.events import ConnectionRef
from router.core.live import LiveConnection
from router.features.moves.rules import (
    MoveKind,
    MoveOrder,
    MoveRequest,
    due,
    first_to_move,
    rebalance_destination,
    rebalance_excess,
    rebalance_refusal,
    shutdown_rate,
)


def _conn(i: int, opened_at: float) -> LiveConnection:
    ref = ConnectionRef(id=i, router="r", acceptor="a", peer=Address("127.0.0.1", 1000 + i))
    return LiveConnection(
        conn=ref, node_id="n", address=Address("127.0.0.1", 1), closer=lambda _r: None, now=opened_at
    )


class TestDue:
    def test_one_at_once_then_rate_per_second(self) -> None:
        assert due(10, 0.0, 0) == 1
        assert due(10, 0.05, 1) == 0
        assert due(10, 0.1, 1) == 1
        assert due(10, 1.0, 2) == 9  # behind: catch up

    def test_a_shutdown_starts_one_interval_in(self) -> None:
        assert due(2, 0.0, 0, at_once=False) == 0
        assert due(2, 0.5, 0, at_once=False) == 1

    def test_never_negative(self) -> None:
        assert due(1, 0.0, 5) == 0


class TestOrder:
    def test_oldest_first(self) -> None:
        conns = [_conn(i, t) for i, t in enumerate([5.0, 1.0, 3.0])]
        assert [c.conn.id for c in first_to_move(conns, 2, MoveOrder.OLDEST, random.Random(0))] == [1, 2]

    def test_random_takes_distinct_connections(self) -> None:
        conns = [_conn(i, float(i)) for i in range(10)]
        chosen = first_to_move(conns, 4, MoveOrder.RANDOM, random.Random(1))
        assert len({c.conn.id for c in chosen}) == 4
        assert first_to_move(conns, 20, MoveOrder.RANDOM, random.Random(1)).__len__() == 10
        assert first_to_move(conns, 0, MoveOrder.OLDEST, random.Random(1)) == []


class TestRebalance:
    def test_moves_just_enough_above_the_band(self) -> None:
        assert rebalance_excess({"a": 6, "b": 6, "c": 0}, 0.1) == {"a": 2, "b": 2}
        assert rebalance_excess({"a": 11, "b": 10, "c": 9}, 0.1) == {}  # 11 <= floor(10 * 1.1)
        assert rebalance_excess({"a": 30, "b": 0}, 0.5) == {"a": 8}  # mean 15, ceiling 22

    def test_band_too_narrow_for_whole_connections_uses_the_mean(self) -> None:
        assert rebalance_excess({"a": 2, "b": 1}, 0.0) == {}  # mean 1.5: 2 is the best there is

    def test_one_target_has_nothing_to_balance(self) -> None:
        assert rebalance_excess({"a": 9}, 0.1) == {}

    def test_each_moved_connection_goes_to_the_emptiest_other_target(self) -> None:
        assert rebalance_destination({"a": 6, "b": 3, "c": 3}, "a") == "b"  # a tie: the first node id
        assert rebalance_destination({"a": 0, "b": 3}, "a") == "b"  # never back where it was
        assert rebalance_destination({"a": 6}, "a") is None

    def test_only_a_cache_or_least_connections_can_rebalance(self) -> None:
        from cache import CacheConfig
        from policies import PolicyConfig
        from router.config.settings import RouterConfig

        hashed = PolicyConfig(name="CONSISTENT_HASH")
        refusal = rebalance_refusal(RouterConfig(name="r", policy=hashed))
        assert refusal is not None
        assert "without a <cache> its CONSISTENT_HASH policy" in refusal
        assert (
            rebalance_refusal(RouterConfig(name="r", policy=hashed, cache=CacheConfig(timeout_ms=1000)))
            is None
        )
        assert (
            rebalance_refusal(RouterConfig(name="r", policy=PolicyConfig(name="LEAST_CONNECTIONS"))) is None
        )


def test_shutdown_rate_spreads_over_most_of_the_grace_period() -> None:
    assert shutdown_rate(8, 10.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="nothing to pace"):
        shutdown_rate(0, 10.0)


class TestRequest:
    @pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
    def test_rate_must_be_positive_and_finite(self, rate: float) -> None:
        with pytest.raises(ValueError, match="rate must be a positive number"):
            MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="n", rate=rate)

    def test_evacuation_names_one_target(self) -> None:
        with pytest.raises(ValueError, match="an evacuation names one target"):
            MoveRequest(kind=MoveKind.EVACUATE, router="r")
        with pytest.raises(ValueError, match="an evacuation names one target"):
            MoveRequest(kind=MoveKind.REBALANCE, router="r", node_id="n")

    def test_band_not_negative(self) -> None:
        with pytest.raises(ValueError, match="band must be 0 or more"):
            MoveRequest(kind=MoveKind.REBALANCE, router="r", band=-0.1)
