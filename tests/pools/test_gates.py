"""The storm protection rules (pools/gates.py): token buckets, target gates with
their FIFO queue, slow start. Pure: time is an argument, so each test walks its own clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.gates import (
    SLOW_START_FLOOR,
    AcceptRate,
    TargetGate,
    TokenBucket,
    Verdict,
    slow_start_share,
)
from pools.limits import TargetLimits


class TestTokenBucket:
    def test_starts_full_then_refills_at_its_rate(self) -> None:
        bucket = TokenBucket(rate=10, burst=2, now=0.0)
        assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
        assert bucket.ready_at(0.0) == pytest.approx(0.1)
        assert not bucket.take(0.05)
        assert bucket.take(0.1)

    def test_never_saves_more_than_its_burst(self) -> None:
        bucket = TokenBucket(rate=10, burst=3, now=0.0)
        assert sum(bucket.take(100.0) for _ in range(10)) == 3

    @given(
        rate=st.floats(min_value=1, max_value=5000),
        times=st.lists(st.floats(min_value=0, max_value=20), min_size=1, max_size=300),
    )
    @settings(max_examples=200, deadline=None)
    def test_no_window_of_one_second_sees_more_than_rate_plus_burst(
        self, rate: float, times: list[float]
    ) -> None:
        burst = max(1.0, rate / 10)
        bucket = TokenBucket(rate=rate, burst=burst, now=0.0)
        taken = [t for t in sorted(times) if bucket.take(t)]
        for start in taken:
            in_window = sum(1 for t in taken if start <= t < start + 1.0)
            assert in_window <= math.floor(rate + burst) + 1

    def test_retune_keeps_what_was_saved_within_the_new_burst(self) -> None:
        bucket = TokenBucket(rate=10, burst=5, now=0.0)
        bucket.retune(rate=1, burst=2, now=0.0)
        assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
        assert bucket.ready_at(0.0) == pytest.approx(1.0)

    @pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (math.inf, 1), (math.nan, 1), (1, 0.5)])
    def test_rejects_bad_rates_and_bursts(self, rate: float, burst: float) -> None:
        with pytest.raises(ValueError, match="must be"):
            TokenBucket(rate=rate, burst=burst, now=0.0)


def test_accept_rate_takes_its_burst_then_its_rate() -> None:
    rate = AcceptRate(rate=100, burst=5)
    assert rate.ready_at(0.0) == 0.0
    assert sum(rate.take(0.0) for _ in range(10)) == 5
    assert rate.ready_at(0.0) == pytest.approx(0.01)
    assert sum(rate.take(1.0) for _ in range(10)) == 5


class TestSlowStart:
    def test_share_grows_linearly_from_the_floor(self) -> None:
        assert slow_start_share(None, 10.0, 5.0) == 1.0
        assert slow_start_share(0.0, 0.0, 5.0) == 1.0
        assert slow_start_share(0.0, 10.0, 0.0) == SLOW_START_FLOOR
        assert slow_start_share(0.0, 10.0, 5.0) == pytest.approx(0.5)
        assert slow_start_share(0.0, 10.0, 10.0) == 1.0

    def test_gate_limit_ramps_only_after_becoming_ready(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=100, max_queue=10, slow_start_s=10.0), now=0.0)
        assert gate.limit(0.0) == 100  # ready at router start: no slow start
        gate.became_ready(50.0)
        assert [gate.limit(50.0 + s) for s in (0, 2.5, 5, 9.99, 10)] == [5, 25, 50, 99, 100]

    def test_slow_start_ramps_the_connect_rate_too(self) -> None:
        gate = TargetGate(TargetLimits(connect_rate=100, max_queue=1000, slow_start_s=10.0), now=0.0)
        gate.became_ready(0.0)
        admitted = sum(gate.offer(i, t / 100) is Verdict.ADMIT for i, t in enumerate(range(100)))
        assert admitted <= 100 * 0.1 * 1.1 + 1  # the first second: at most ~10% of the rate
        late = TargetGate(TargetLimits(connect_rate=100, max_queue=1000, slow_start_s=10.0), now=0.0)
        late.became_ready(0.0)
        assert sum(late.offer(i, 20 + t / 100) is Verdict.ADMIT for i, t in enumerate(range(100))) >= 95

    def test_slow_start_admits_a_growing_number(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=20, max_queue=100, slow_start_s=10.0), now=0.0)
        gate.became_ready(0.0)
        verdicts = [gate.offer(i, 0.0) for i in range(20)]
        assert verdicts.count(Verdict.ADMIT) == 1  # max(1, floor(20 * 0.05))
        admitted = gate.admit_waiting(5.0)
        assert len(admitted.admitted) == 9  # 10 at half the window, one was in
        assert admitted.retry_at is not None  # the limit grows: look again
        assert len(gate.admit_waiting(10.0).admitted) == 10


class TestTargetGate:
    def test_no_limits_admits_everything(self) -> None:
        gate = TargetGate(TargetLimits(), now=0.0)
        assert all(gate.offer(i, 0.0) is Verdict.ADMIT for i in range(1000))

    def test_limit_then_queue_then_full(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=2, max_queue=2), now=0.0)
        assert [gate.offer(i, 0.0) for i in range(5)] == [
            Verdict.ADMIT,
            Verdict.ADMIT,
            Verdict.QUEUED,
            Verdict.QUEUED,
            Verdict.FULL,
        ]
        assert gate.state(0.0).open == 2
        assert gate.state(0.0).queued == 2

    def test_release_admits_the_head_of_the_queue_first(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1, max_queue=5), now=0.0)
        assert gate.offer(0, 0.0) is Verdict.ADMIT
        for waiter in (7, 3, 9):
            assert gate.offer(waiter, 0.0) is Verdict.QUEUED
        gate.release()
        assert gate.admit_waiting(1.0).admitted == (7,)
        assert gate.waiting == (3, 9)
        assert gate.head == 3

    def test_head_is_none_without_waiters(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1, max_queue=5), now=0.0)
        assert gate.head is None
        gate.offer(0, 0.0)
        assert gate.head is None  # admitted, not waiting

    def test_a_newcomer_does_not_overtake_the_queue(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1, max_queue=5), now=0.0)
        gate.offer(0, 0.0)
        gate.offer(1, 0.0)
        gate.release()  # a slot is free, but waiter 1 has not been let in yet
        assert gate.offer(2, 0.0) is Verdict.QUEUED
        assert gate.admit_waiting(0.0).admitted == (1,)

    def test_cancel_removes_a_waiter_and_says_whether_it_was_waiting(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1, max_queue=5), now=0.0)
        gate.offer(0, 0.0)
        gate.offer(1, 0.0)
        gate.offer(2, 0.0)
        assert gate.cancel(1)
        assert not gate.cancel(1)
        gate.release()
        assert gate.admit_waiting(0.0).admitted == (2,)

    def test_no_queue_refuses_at_once(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1), now=0.0)
        assert gate.offer(0, 0.0) is Verdict.ADMIT
        assert gate.offer(1, 0.0) is Verdict.FULL

    def test_connect_rate_spaces_admissions_and_says_when_to_look_again(self) -> None:
        gate = TargetGate(TargetLimits(connect_rate=10, max_queue=100), now=0.0)
        verdicts = [gate.offer(i, 0.0) for i in range(5)]
        assert verdicts == [Verdict.ADMIT] + [Verdict.QUEUED] * 4  # burst: 1 (a tenth of 10/s)
        first = gate.admit_waiting(0.0)
        assert first.admitted == ()
        assert first.retry_at == pytest.approx(0.1)
        assert gate.admit_waiting(0.1).admitted == (1,)
        late = gate.admit_waiting(0.35)  # 2.5 tokens' worth of time, but the bucket holds 1
        assert late.admitted == (2,)
        assert late.retry_at == pytest.approx(0.45)

    def test_redirects_take_tokens_but_no_slot(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1, connect_rate=10, max_queue=10), now=0.0)
        assert gate.offer(0, 0.0, slot=False) is Verdict.ADMIT
        assert gate.state(0.0).open == 0
        assert gate.offer(1, 0.0, slot=False) is Verdict.QUEUED
        assert gate.admit_waiting(0.1).admitted == (1,)
        assert gate.state(0.1).open == 0

    @given(
        events=st.lists(
            st.tuples(st.sampled_from(["offer", "release", "cancel", "pump"]), st.integers(0, 30)),
            max_size=200,
        )
    )
    @settings(max_examples=200, deadline=None)
    def test_never_more_open_than_the_limit_nor_more_waiting_than_the_queue(
        self, events: list[tuple[str, int]]
    ) -> None:
        gate = TargetGate(TargetLimits(max_connections=3, max_queue=4, connect_rate=50), now=0.0)
        now, holding, next_id = 0.0, 0, 0
        for kind, arg in events:
            now += arg / 100
            if kind == "offer":
                if gate.offer(next_id, now) is Verdict.ADMIT:
                    holding += 1
                next_id += 1
            elif kind == "release" and holding:
                gate.release()
                holding -= 1
            elif kind == "cancel" and gate.waiting:
                gate.cancel(gate.waiting[arg % len(gate.waiting)])
            else:
                holding += len(gate.admit_waiting(now).admitted)
            assert gate.open == holding <= 3
            assert len(gate.waiting) <= 4

    def test_retune_keeps_open_and_waiting_connections(self) -> None:
        gate = TargetGate(TargetLimits(max_connections=1, max_queue=5), now=0.0)
        gate.offer(0, 0.0)
        gate.offer(1, 0.0)
        gate.offer(2, 0.0)
        gate.retune(TargetLimits(max_connections=3, max_queue=5), now=1.0)
        assert gate.admit_waiting(1.0).admitted == (1, 2)
        assert gate.open == 3
