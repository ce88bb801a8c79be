"""RouterRuntime: the quorum wait (SPEC A1 step 7) on trio's virtual clock, live counts, and closing the
proxied connections of a target that is not ready."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
import trio.testing

from keys import ConnectionFacts
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, Target
from router.config.settings import Config, RouterConfig
from router.core.engine import RouteStatus
from router.core.live import ProxiedConnection
from router.metrics import Metrics
from router.runtime import LiveConnectionCounts, RouterRuntime

if TYPE_CHECKING:
    from collections.abc import Callable


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


async def _closed_by(
    runtime: RouterRuntime, conns: list[ProxiedConnection], act: Callable[[], object]
) -> list[str]:
    """Hold `conns` open (registered with the runtime) and run `act`; the peers it closed, in order."""
    ended: list[str] = []

    async def hold(conn: ProxiedConnection) -> None:
        with conn.cancel_scope:
            await trio.sleep_forever()
        ended.append(conn.peer)

    async with trio.open_nursery() as nursery:
        for conn in conns:
            runtime.connections.add(conn)
            nursery.start_soon(hold, conn)
        await trio.testing.wait_all_tasks_blocked()
        act()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return ended


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


def test_live_connection_counts_broker_report_plus_our_changes_since() -> None:
    """Scenario: a broker reports 40 clients (ours included); connections we open or close
    afterwards move the count until the next report; a failed read falls back to ours."""
    counts = LiveConnectionCounts()
    counts.opened("x")
    counts.report("x", 40)
    assert counts.connection_count("x") == 40
    counts.opened("x")
    counts.opened("x")
    assert counts.connection_count("x") == 42  # a burst between two probes still spreads
    for _ in range(3):
        counts.closed("x")
    assert counts.connection_count("x") == 39
    for _ in range(3):
        counts.opened("x")
    counts.report("x", 1)  # the broker saw fewer than we hold (handshakes in flight)
    for _ in range(3):
        counts.closed("x")
    assert counts.connection_count("x") == 0  # never negative
    counts.opened("x")
    counts.report("x", None)  # the probe could not read it: our own count again
    assert counts.connection_count("x") == 1
    assert counts.connection_count("y") == 0


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


async def test_apply_events_closes_the_connections_to_a_target_that_is_not_ready(caplog) -> None:
    """Scenario: b1 fails its probe; its two proxied connections are cancelled at once and logged
    once with the count, b2's stays open."""
    runtime = _runtime(quorum_size=1, quorum_timeout_ms=0)
    pool = runtime.pool
    assert pool is not None
    runtime.apply_events(pool.record_check("b1", True))
    runtime.apply_events(pool.record_check("b2", True))
    conns = [
        ProxiedConnection(
            peer=f"127.0.0.2:{port}",
            acceptor="a",
            node_id=node_id,
            address=("127.0.0.1", 20000),
            ttl_ms=-1,
            sniffed=None,
            now=trio.current_time(),
        )
        for port, node_id in ((1, "b1"), (2, "b1"), (3, "b2"))
    ]

    def refuse_twice() -> None:
        runtime.apply_events(pool.record_check("b1", False, "refused"))
        runtime.apply_events(pool.record_check("b1", False, "refused"))  # no change: nothing more

    ended = await _closed_by(runtime, conns, refuse_twice)
    assert sorted(ended) == ["127.0.0.2:1", "127.0.0.2:2"]
    messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
    assert messages == ["router=r target=b1 is not ready: closing its 2 proxied connection(s)"]
    value = runtime.metrics.registry.get_sample_value(
        "router_proxied_connections_closed_total", {"router": "r", "reason": "target_not_ready"}
    )
    assert value == 2.0


async def test_add_and_remove_target_log_export_and_wake_waiters(caplog) -> None:
    """Scenario: a discovered target joins a running pool, gets ready, serves a waiting decision,
    then leaves: one line each, its metrics go, and the pool becomes inactive."""
    caplog.set_level(logging.INFO, logger="router.pool")
    runtime = _runtime(quorum_size=1, quorum_timeout_ms=0)
    pool = runtime.pool
    assert pool is not None
    for node_id in ("b1", "b2", "b3"):
        runtime.remove_target(node_id)
    assert pool.targets == ()
    joined = Target(node_id="z1", connector=Connector(name="z1", host="127.0.0.1", port=20009))
    woken: list[str] = []

    async def wait_for_z1() -> None:
        await runtime.wait_until(lambda: pool.target("z1") is not None)
        woken.append("z1")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_z1)
        await trio.testing.wait_all_tasks_blocked()
        runtime.add_target(joined)
        await trio.testing.wait_all_tasks_blocked()
    assert woken == ["z1"]
    runtime.apply_events(pool.record_check("z1", True))
    assert runtime.engine.lookup("k", 0.0).target == joined
    metrics = runtime.metrics.registry
    assert metrics.get_sample_value("router_target_ready", {"router": "r", "node_id": "z1"}) == 1.0
    runtime.metrics.connect_failures.labels("r", "z1").inc()

    runtime.remove_target("z1")
    assert metrics.get_sample_value("router_target_ready", {"router": "r", "node_id": "z1"}) is None
    assert (
        metrics.get_sample_value("router_target_connect_failures_total", {"router": "r", "node_id": "z1"})
        is None
    )
    assert metrics.get_sample_value("router_pool_active", {"router": "r"}) == 0.0
    assert runtime.engine.lookup("k", 0.0).status is RouteStatus.REFUSED_UNAVAILABLE
    messages = [r.getMessage() for r in caplog.records if "target=z1" in r.getMessage()]
    assert messages == [
        "router=r target=z1 joined the pool (tcp://127.0.0.1:20009)",
        "router=r target=z1 is ready",
        "router=r target=z1 left the pool (it was ready)",
    ]


async def test_failover_closes_only_the_connections_to_the_former_member(caplog) -> None:
    """Scenario: an HA pair fails over from primary to backup; connections that went to the
    primary are closed (their clients reconnect to the backup), the backup's stay open."""
    pair = Connector.from_url("p", "(tcp://127.0.0.1:20001,tcp://127.0.0.1:20002)?nodeId=pair")
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("p",)),
    )
    runtime = RouterRuntime(Config(source="t.xml", connectors=(pair,), routers=(router,)), router, Metrics())
    pool = runtime.pool
    assert pool is not None
    runtime.apply_events(pool.record_check("pair", True, member=0))
    runtime.apply_events(pool.record_check("pair", True, member=1))
    conns = [
        ProxiedConnection(
            peer=f"127.0.0.2:{port}",
            acceptor="a",
            node_id="pair",
            address=("127.0.0.1", address_port),
            ttl_ms=-1,
            sniffed=None,
            now=trio.current_time(),
        )
        for port, address_port in ((1, 20001), (2, 20002))
    ]
    ended = await _closed_by(
        runtime, conns, lambda: runtime.apply_events(pool.record_check("pair", False, "killed", member=0))
    )
    assert ended == ["127.0.0.2:1"]
    messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
    assert messages == [
        "router=r target=pair member 127.0.0.1:20001 is not active: closing its 1 proxied connection(s)"
    ]
    value = runtime.metrics.registry.get_sample_value(
        "router_proxied_connections_closed_total", {"router": "r", "reason": "failover"}
    )
    assert value == 1
