"""A router's target gates at run time (router/runtime/gates.py), on trio's virtual clock: waiting
in FIFO order, the queue timeout, a full queue, cancellation, limits changed while clients wait,
slow start only after a return."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from pools import Connector, Target
from router.core.events import GateOutcome
from router.runtime.gates import RouterGates


def _target(node_id: str, params: str = "") -> Target:
    query = f";{params}" if params else ""
    return Target.remote(Connector.from_url(node_id, f"tcp://127.0.0.1:1883?nodeId={node_id}{query}"))


LIMITED = "maxConnections=1;maxQueue=2;queueTimeout=1000"


def _gates(*targets: Target) -> RouterGates:
    return RouterGates(targets, trio.current_time)


async def test_a_target_without_limits_has_no_gate() -> None:
    gates = _gates(_target("free"))
    assert not gates.limited("free")
    assert await gates.enter("free", slot=True) is None
    gates.release("free")  # nothing to give back: no error


async def test_waiters_get_in_first_come_first_served_when_slots_free() -> None:
    gates = _gates(_target("b", LIMITED))
    assert await gates.enter("b", slot=True) is None
    order: list[str] = []

    async def wait(name: str) -> None:
        order.append(f"{name}:{await gates.enter('b', slot=True)}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "first")
        await trio.sleep(0.01)
        nursery.start_soon(wait, "second")
        await trio.sleep(0.01)
        assert gates.states()["b"].queued == 2
        assert await gates.enter("b", slot=True) is GateOutcome.QUEUE_FULL
        gates.release("b")
        await trio.sleep(0.1)
        assert order == ["first:GateOutcome.ADMITTED"]
        gates.release("b")
    assert order == ["first:GateOutcome.ADMITTED", "second:GateOutcome.ADMITTED"]
    assert gates.states()["b"].open == 1


async def test_a_waiter_is_refused_at_its_queue_timeout(autojump_clock: trio.testing.MockClock) -> None:
    gates = _gates(_target("b", LIMITED))
    await gates.enter("b", slot=True)
    began = trio.current_time()
    assert await gates.enter("b", slot=True) is GateOutcome.QUEUE_TIMEOUT
    assert trio.current_time() - began == pytest.approx(1.0)
    assert gates.states()["b"].queued == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gates = _gates(_target("b", LIMITED))
    await gates.enter("b", slot=True)
    with trio.move_on_after(0.5):
        await gates.enter("b", slot=True)
    assert gates.states()["b"].queued == 0
    gates.release("b")
    assert gates.states()["b"].open == 0


async def test_a_reload_raising_the_limit_lets_waiters_in(autojump_clock: trio.testing.MockClock) -> None:
    gates = _gates(_target("b", LIMITED))
    await gates.enter("b", slot=True)
    outcomes: list[GateOutcome | None] = []

    async def wait() -> None:
        outcomes.append(await gates.enter("b", slot=True))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        nursery.start_soon(wait)
        await trio.sleep(0.1)
        gates.reconfigure([_target("b", "maxConnections=3;maxQueue=2;queueTimeout=1000")])
    assert outcomes == [GateOutcome.ADMITTED, GateOutcome.ADMITTED]
    assert gates.states()["b"].open == 3


async def test_a_reload_removing_the_limits_removes_the_gate() -> None:
    gates = _gates(_target("b", LIMITED))
    gates.reconfigure([_target("b")])
    assert not gates.limited("b")


async def test_connect_rate_paces_waiters(autojump_clock: trio.testing.MockClock) -> None:
    gates = _gates(_target("b", "connectRate=10"))
    times: list[float] = []

    async def one() -> None:
        assert await gates.enter("b", slot=False) in (None, GateOutcome.ADMITTED)
        times.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one)
    assert [round(t, 2) for t in sorted(times)] == [0.0, 0.1, 0.2, 0.3, 0.4]


async def test_slow_start_only_after_a_return(autojump_clock: trio.testing.MockClock) -> None:
    gates = _gates(_target("b", "maxConnections=100;slowStart=10000"))
    gates.became_ready("b")  # the router's start: full share
    assert gates.states()["b"].limit == 100
    gates.became_ready("b")  # a return
    assert gates.states()["b"].limit == 5
    await trio.sleep(5)
    assert gates.states()["b"].limit == 50
    assert gates.states()["b"].share == pytest.approx(0.5)


async def test_ramping_names_targets_in_slow_start_with_their_share(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: slowStart=10000 on b, none on c. At router start nothing ramps (an empty mapping,
    no lock taken); after b's return its share grows with the clock (what ROUND_ROBIN,
    LEAST_CONNECTIONS and bounded-load ketama weigh it by) and b leaves the mapping at the end."""
    gates = _gates(_target("b", "slowStart=10000"), _target("c"))
    gates.became_ready("b")  # the router's start
    gates.became_ready("c")
    assert gates.ramping() == {}
    gates.became_ready("b")  # a return
    gates.became_ready("c")  # no slow start: never ramps
    assert gates.ramping() == {"b": pytest.approx(0.05)}
    await trio.sleep(5)
    assert gates.ramping() == {"b": pytest.approx(0.5)}
    await trio.sleep(5)
    assert gates.ramping() == {}
    gates.became_ready("b")  # returns again later: ramps again
    assert gates.ramping() == {"b": pytest.approx(0.05)}


class _CountingGates(RouterGates):
    """RouterGates that counts how often a gate is pumped (the work its waiters cause)."""

    __slots__ = ("pumps",)

    def __init__(self, targets: list[Target]) -> None:
        self.pumps = 0
        super().__init__(targets, trio.current_time)

    def pump(self, node_id: str) -> float | None:
        self.pumps += 1
        return super().pump(node_id)


async def test_connect_rate_wakes_only_the_head_of_a_long_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: 300 clients wait for a target with connectRate=100 (a reconnect storm). Each token
    is taken by the head of the queue, in order, one every 10 ms; the waiters behind it are not all
    woken at each token (that would be 300 x 300 / 2 pumps: a routerd at 100 % CPU in a storm)."""
    gates = _CountingGates([_target("b", "connectRate=100;maxQueue=1000;queueTimeout=10000")])
    admitted: list[tuple[int, float]] = []

    async def one(n: int) -> None:
        assert await gates.enter("b", slot=False) in (None, GateOutcome.ADMITTED)
        admitted.append((n, trio.current_time()))

    async with trio.open_nursery() as nursery:
        for n in range(300):
            nursery.start_soon(one, n)
            await trio.lowlevel.checkpoint()  # they queue in this order
    assert [n for n, _ in admitted] == list(range(300))
    assert admitted[-1][1] == pytest.approx((300 - 10) / 100, abs=0.02)  # 10 from the full bucket
    assert gates.pumps < 4 * 300, gates.pumps  # 61,605 when every waiter woke at each token
