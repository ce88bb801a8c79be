"""RouterRuntime: the quorum wait (SPEC A1 step 7) on trio's virtual clock, and live counts."""

from __future__ import annotations

import trio

from keys import ConnectionFacts
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.engine import RouteStatus
from router.metrics import Metrics
from router.routing import LiveConnectionCounts, RouterRuntime
from router.settings import Config, RouterConfig


def _runtime(quorum_size: int, quorum_timeout_ms: int, policy: str = "FIRST_ELEMENT") -> RouterRuntime:
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{20000 + i}") for i in (1, 2, 3))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name=policy),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("b1", "b2", "b3"),
            quorum_size=quorum_size,
            quorum_timeout_ms=quorum_timeout_ms,
        ),
    )
    config = Config(source="test.xml", connectors=connectors, routers=(router,))
    return RouterRuntime(config, router, Metrics(), round_robin_start=0)


FACTS = ConnectionFacts(source_ip="127.0.0.2")


async def test_decide_waits_for_quorum_then_routes(autojump_clock: trio.testing.MockClock) -> None:
    """Scenario: quorum 2 of 3, one ready; the second becomes ready after 1.5 s of a 3 s wait."""
    runtime = _runtime(quorum_size=2, quorum_timeout_ms=3000)
    assert runtime.pool is not None
    runtime.apply_events(runtime.pool.record_check("b2", True))
    start = trio.current_time()

    async def second_ready() -> None:
        await trio.sleep(1.5)
        assert runtime.pool is not None
        runtime.apply_events(runtime.pool.record_check("b3", True))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second_ready)
        decision = await runtime.decide(FACTS)
    assert trio.current_time() - start == 1.5
    assert decision.status is RouteStatus.OK
    assert decision.target is not None
    assert decision.target.node_id == "b2"  # FIRST_ELEMENT: first ready in pool order


async def test_decide_refuses_after_quorum_timeout(autojump_clock: trio.testing.MockClock) -> None:
    runtime = _runtime(quorum_size=2, quorum_timeout_ms=3000)
    assert runtime.pool is not None
    runtime.apply_events(runtime.pool.record_check("b1", True))
    start = trio.current_time()
    decision = await runtime.decide(FACTS)
    assert trio.current_time() - start == 3.0
    assert decision.status is RouteStatus.REFUSED_UNAVAILABLE


async def test_decide_does_not_wait_with_zero_quorum_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(quorum_size=1, quorum_timeout_ms=0)
    start = trio.current_time()
    decision = await runtime.decide(FACTS)
    assert trio.current_time() == start
    assert decision.status is RouteStatus.REFUSED_UNAVAILABLE


async def test_decide_ignores_unrelated_changes_until_quorum(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: a change that does not reach quorum (a target going down) keeps the wait going."""
    runtime = _runtime(quorum_size=3, quorum_timeout_ms=5000)
    pool = runtime.pool
    assert pool is not None
    runtime.apply_events(pool.record_check("b1", True))

    async def changes() -> None:
        await trio.sleep(1)
        runtime.apply_events(pool.record_check("b2", False))
        await trio.sleep(1)
        runtime.apply_events(pool.record_check("b2", True))
        await trio.sleep(1)
        runtime.apply_events(pool.record_check("b3", True))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(changes)
        decision = await runtime.decide(FACTS)
    assert trio.current_time() - start == 3.0
    assert decision.status is RouteStatus.OK


def test_apply_events_exports_readiness_metrics() -> None:
    runtime = _runtime(quorum_size=1, quorum_timeout_ms=0)
    assert runtime.pool is not None
    reg = runtime.metrics.registry
    assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 0.0
    runtime.apply_events(runtime.pool.record_check("b1", True))
    assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 1.0
    assert reg.get_sample_value("router_pool_active", {"router": "r"}) == 1.0
    runtime.apply_events(runtime.pool.record_check("b1", False, "refused"))
    assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 0.0
    assert reg.get_sample_value("router_pool_active", {"router": "r"}) == 0.0


async def test_decide_spreads_a_burst_with_least_connections() -> None:
    """Scenario: connections counted as opened make LEAST_CONNECTIONS spread a burst evenly."""
    runtime = _runtime(quorum_size=1, quorum_timeout_ms=0, policy="LEAST_CONNECTIONS")
    pool = runtime.pool
    assert pool is not None
    for node in ("b1", "b2", "b3"):
        runtime.apply_events(pool.record_check(node, True))
    picks: dict[str, int] = {}
    for _ in range(30):
        decision = await runtime.decide(FACTS)
        assert decision.target is not None
        runtime.counts.opened(decision.target.node_id)
        picks[decision.target.node_id] = picks.get(decision.target.node_id, 0) + 1
    assert picks == {"b1": 10, "b2": 10, "b3": 10}


def test_live_connection_counts_open_and_close() -> None:
    counts = LiveConnectionCounts()
    assert counts.connection_count("x") == 0
    counts.opened("x")
    counts.opened("x")
    counts.closed("x")
    assert counts.connection_count("x") == 1


async def test_serve_cache_purge_drops_expired_entries(autojump_clock: trio.testing.MockClock) -> None:
    from cache import CacheConfig

    connectors = (Connector.from_url("b1", "tcp://127.0.0.1:20001"),)
    router = RouterConfig(
        name="r",
        cache=CacheConfig(timeout_ms=2000),
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("b1",)),
    )
    runtime = RouterRuntime(Config(source="t", connectors=connectors, routers=(router,)), router, Metrics())
    cache = runtime.engine.cache
    assert cache is not None
    cache.put("k", "b1", trio.current_time())
    with trio.move_on_after(1.9):
        await runtime.serve_cache_purge()
    assert len(cache) == 1
    with trio.move_on_after(2.2):  # the sweep at t=3.9 finds the entry 3.9 s old
        await runtime.serve_cache_purge()
    assert len(cache) == 0
