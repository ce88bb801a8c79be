"""router/features/moves/service.py on trio's virtual clock: pacing, the drain an evacuation starts,
abort, a rebalance's plan and its refusal without a cache, with a real `RouterRuntime` whose
connections are registered as the data paths register them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from pools import AdminState
from router.core.events import CloseReason
from router.features.cache.service import cache_entries
from router.features.moves.rules import MoveKind, MoveRequest, MoveState
from router.features.moves.service import MoveConflict, Moves
from tests.router.core.test_live import live_connection
from tests.router.runtime.test_kernel import make_runtime as runtime_of

if TYPE_CHECKING:
    from router.runtime import RouterRuntime

NODES = ("b1", "b2", "b3")


def make_runtime(*, cache: bool = True) -> RouterRuntime:
    runtime = runtime_of(policy="ROUND_ROBIN", cache_ms=60_000 if cache else None)
    for node in NODES:
        runtime.pool.record_check(node, True)
    return runtime


def _connect(
    runtime: RouterRuntime, node_id: str, count: int, closes: list[tuple[float, str, CloseReason]]
) -> None:
    for i in range(count):
        port = 30000 + len(runtime.connections.movable()) + i
        live = live_connection(f"127.0.0.2:{port}", node_id=node_id, ttl_ms=-1, now=trio.current_time())
        live.key = f"key-{node_id}-{i}"
        live.on_depart = None
        live._closer = lambda reason, n=node_id: closes.append((trio.current_time(), n, reason))
        runtime.connections.register(live)


async def _started(moves: Moves, nursery: trio.Nursery) -> None:
    await nursery.start(moves.serve)


async def test_evacuation_moves_at_the_rate_and_drains_the_target(autojump_clock: object) -> None:
    runtime = make_runtime()
    closes: list[tuple[float, str, CloseReason]] = []
    _connect(runtime, "b1", 5, closes)
    _connect(runtime, "b2", 2, closes)
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        start = trio.current_time()
        status = moves.start(MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="b1", rate=10))
        assert (status.state, status.left) == (MoveState.RUNNING, 5)
        await trio.sleep(1)
        status = moves.status(MoveKind.EVACUATE, "r", "b1")
        assert (status.state, status.moved, status.left) == (MoveState.DONE, 5, 0)
        nursery.cancel_scope.cancel()
    assert [(n, r) for _, n, r in closes] == [("b1", CloseReason.EVACUATED)] * 5
    offsets = [round(t - start, 2) for t, _, _ in closes]
    assert offsets == [0.0, 0.1, 0.2, 0.3, 0.4]  # one at once, then 10 a second
    assert runtime.pool.admin_states() == {"b1": AdminState.DRAIN}
    cached = {cache_entries(runtime).get(f"key-b1-{i}") for i in range(5)}
    assert cached <= {"b2", "b3"}  # their keys now route elsewhere


async def test_abort_keeps_what_moved(autojump_clock: object) -> None:
    runtime = make_runtime()
    closes: list[tuple[float, str, CloseReason]] = []
    _connect(runtime, "b3", 4, closes)
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        moves.start(MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="b3", rate=1))
        await trio.sleep(1.15)  # moves at 0 and about 1 s (steps of 0.1 s)
        status = moves.abort(MoveKind.EVACUATE, "r", "b3")
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert (status.state, status.moved, status.left) == (MoveState.ABORTED, 2, 2)
    assert len(closes) == 2
    with pytest.raises(LookupError, match="no evacuate of r/b1 so far"):
        moves.status(MoveKind.EVACUATE, "r", "b1")


async def test_a_second_evacuation_of_the_same_target_is_a_conflict(autojump_clock: object) -> None:
    runtime = make_runtime()
    _connect(runtime, "b1", 3, [])
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        moves.start(MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="b1", rate=0.5))
        with pytest.raises(MoveConflict, match="an evacuation of target=b1 is running already"):
            moves.start(MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="b1"))
        nursery.cancel_scope.cancel()


async def test_rebalance_plans_once_and_sends_each_to_the_emptiest(autojump_clock: object) -> None:
    runtime = make_runtime()
    closes: list[tuple[float, str, CloseReason]] = []
    _connect(runtime, "b1", 6, closes)
    _connect(runtime, "b2", 6, closes)
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        status = moves.start(MoveRequest(kind=MoveKind.REBALANCE, router="r", rate=100, band=0.1))
        assert status.left == 4
        await trio.sleep(2)  # the moved clients never come back here: the plan must not grow
        status = moves.status(MoveKind.REBALANCE, "r")
        nursery.cancel_scope.cancel()
    assert (status.state, status.moved) == (MoveState.DONE, 4)
    assert sorted(n for _, n, _ in closes) == ["b1", "b1", "b2", "b2"]
    moved_keys = [
        k
        for k in (f"key-{n}-{i}" for n in ("b1", "b2") for i in range(6))
        if cache_entries(runtime).get(k) == "b3"
    ]
    assert len(moved_keys) == 4


async def test_a_finished_moves_rate_stays_and_nothing_to_do_says_so(autojump_clock: object) -> None:
    """Scenario: 5 clients evacuated at 10/s are done in 0.4 s: the achieved rate is 5 / 0.4 s and
    stays so 10 s later. A rebalance of a balanced router, and an evacuation of an empty target,
    end done with a note saying there was nothing to do."""
    runtime = make_runtime()
    _connect(runtime, "b1", 5, [])
    for node in ("b2", "b3"):
        _connect(runtime, node, 2, [])
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        moves.start(MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="b1", rate=10))
        await trio.sleep(1)
        done = moves.status(MoveKind.EVACUATE, "r", "b1")
        await trio.sleep(10)
        later = moves.status(MoveKind.EVACUATE, "r", "b1")
        assert (done.state, done.moved, done.note) == (MoveState.DONE, 5, "")
        assert done.rate == pytest.approx(5 / 0.4, rel=0.3)
        assert later.rate == done.rate
        moves.start(MoveRequest(kind=MoveKind.REBALANCE, router="r", rate=10, band=0.5))
        moves.start(MoveRequest(kind=MoveKind.EVACUATE, router="r", node_id="b1", rate=10))
        await trio.sleep(1)
        rebalance = moves.status(MoveKind.REBALANCE, "r")
        empty = moves.status(MoveKind.EVACUATE, "r", "b1")
        nursery.cancel_scope.cancel()
    assert (rebalance.state, rebalance.moved) == (MoveState.DONE, 0)
    assert rebalance.note == "nothing to do: every target was within the band of the mean"
    assert (empty.state, empty.moved) == (MoveState.DONE, 0)
    assert empty.note == "nothing to do: the target had no connection to move"


def test_rebalance_without_a_cache_is_refused() -> None:
    runtime = make_runtime(cache=False)
    moves = Moves({"r": runtime})
    with pytest.raises(MoveConflict, match="cannot rebalance: without a <cache> its ROUND_ROBIN policy"):
        moves.start(MoveRequest(kind=MoveKind.REBALANCE, router="r"))


async def test_stopping_moves_every_router_over_the_grace_period(autojump_clock: object) -> None:
    """Scenario: a graceful shutdown with 4 open connections and 2 s of grace: a shutdown move
    takes them all before the grace period ends."""
    runtime = make_runtime()
    closes: list[tuple[float, str, CloseReason]] = []
    _connect(runtime, "b1", 4, closes)
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        start = trio.current_time()
        moves.stopping(2.0)
        assert moves.status(MoveKind.SHUTDOWN, "r").state is MoveState.RUNNING
        await trio.sleep(2.0)
        nursery.cancel_scope.cancel()
    assert [r for _, _, r in closes] == [CloseReason.SHUTDOWN] * 4
    assert max(t - start for t, _, _ in closes) < 2.0


async def test_stopping_without_connections_starts_nothing(autojump_clock: object) -> None:
    moves = Moves({"r": make_runtime()})
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        moves.stopping(2.0)
        assert moves.all_statuses() == []
        nursery.cancel_scope.cancel()


async def test_targets_left_are_evacuated_and_ha_members_left_to_the_kernel(autojump_clock: object) -> None:
    """Scenario: a reload removed target b1 (moved as an evacuation moves it), a target without
    connections (nothing to do) and a member address of an HA pair (returned: the kernel closes
    those at once)."""
    from router.core.address import Address
    from router.core.reload import Departed

    runtime = make_runtime()
    closes: list[tuple[float, str, CloseReason]] = []
    _connect(runtime, "b1", 2, closes)
    moves = Moves({"r": runtime})
    member = Departed(node_id="b2", addresses=(Address("127.0.0.9", 1883),))
    async with trio.open_nursery() as nursery:
        await _started(moves, nursery)
        left = moves.targets_left(runtime, [Departed(node_id="b1"), member, Departed(node_id="b9")])
        assert left == [member]
        assert moves.status(MoveKind.EVACUATE, "r", "b1").state is MoveState.RUNNING
        with pytest.raises(LookupError):  # b9 had no connection: nothing to move
            moves.status(MoveKind.EVACUATE, "r", "b9")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [r for _, _, r in closes] == [CloseReason.EVACUATED] * 2


def test_shutdown_calls_the_kernels_stop_or_is_refused() -> None:
    stopped: list[bool] = []
    Moves({}, stop=lambda: stopped.append(True)).shutdown()
    assert stopped == [True]
    with pytest.raises(MoveConflict, match="cannot be shut down through its admin API"):
        Moves({}).shutdown()


def test_moves_registers_its_families_once() -> None:
    from router.features.moves.metrics import MoveMetrics
    from router.metrics import Metrics

    metrics = Metrics()
    Moves({}, metrics)
    Moves({}, metrics)
    exposition = metrics.exposition().decode()
    assert exposition.count("# TYPE router_evacuation_moved_total counter") == 1
    assert "# TYPE router_evacuation_remaining gauge" in exposition
    assert metrics.feature(MoveMetrics) is metrics.feature(MoveMetrics)
