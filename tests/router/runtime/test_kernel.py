"""RouterRuntime, the kernel: decisions and the quorum wait (SPEC A1 step 7) on trio's virtual
clock, lookups, accepting, the status snapshot and filter changes, the samplers, and a reload's
reconfiguring and retiring. Its helpers build the runtimes the pool's and connections' tests use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from cache import CacheConfig
from keys import ConnectionFacts
from policies import PolicyConfig
from pools import (
    Connector,
    OutlierConfig,
    PoolConfig,
    PoolEvent,
    PoolEventKind,
    PoolKind,
    Target,
    TargetState,
)
from router.config.settings import Config, RouterConfig
from router.core.address import Address
from router.core.engine import QuorumWait, RouteDecision, RouteStatus
from router.core.events import Accepted, CloseReason, LookedUp
from router.core.reload import Departed
from router.features.cache.service import cache_entries
from router.metrics import Metrics
from router.runtime import RouterRuntime, decide
from tests.router.core.test_live import Closer, live_connection

if TYPE_CHECKING:
    from router.core.events import Event
    from router.core.status import RouterStatus


def set_filters(runtime: RouterRuntime, **patterns: str | None) -> RouterStatus:
    """What `PUT /api/v1/routers/{name}/filters` does (router/services/admin_routes.py)."""
    with runtime.held() as state:
        state.engine.set_filters(**patterns)
    return runtime.status()


def make_runtime(
    quorum_size: int = 1,
    quorum_timeout_ms: int = 0,
    policy: str = "FIRST_ELEMENT",
    *,
    cache_ms: int | None = None,
    cache_entries: int = 100,
) -> RouterRuntime:
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{20000 + i}") for i in (1, 2, 3))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name=policy),
        cache=None if cache_ms is None else CacheConfig(timeout_ms=cache_ms, max_entries=cache_entries),
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


def recorded(runtime: RouterRuntime) -> list[Event]:
    events: list[Event] = []
    runtime.report.subscribe(events.append)
    return events


class TestDecide:
    async def test_decide_waits_for_quorum_then_routes(self, autojump_clock: trio.testing.MockClock) -> None:
        """Scenario: quorum 2 of 3, one ready; the second becomes ready after 1.5 s of a 3 s wait."""
        runtime = make_runtime(quorum_size=2, quorum_timeout_ms=3000)
        runtime.pool.record_check("b2", True)
        start = trio.current_time()

        async def second_ready() -> None:
            await trio.sleep(1.5)
            runtime.pool.record_check("b3", True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second_ready)
            decision = await decide(runtime, FACTS)
        assert trio.current_time() - start == 1.5
        assert decision.status is RouteStatus.OK
        assert decision.target is not None
        assert decision.target.node_id == "b2"  # FIRST_ELEMENT: first ready in pool order

    async def test_decide_refuses_after_quorum_timeout(self, autojump_clock: trio.testing.MockClock) -> None:
        runtime = make_runtime(quorum_size=2, quorum_timeout_ms=3000)
        runtime.pool.record_check("b1", True)
        start = trio.current_time()
        decision = await decide(runtime, FACTS)
        assert trio.current_time() - start == 3.0
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    async def test_decide_does_not_wait_with_zero_quorum_timeout(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        runtime = make_runtime(quorum_size=1, quorum_timeout_ms=0)
        start = trio.current_time()
        decision = await decide(runtime, FACTS)
        assert trio.current_time() == start
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    async def test_decide_ignores_unrelated_changes_until_quorum(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        """Scenario: a change that does not reach quorum (a target going down) keeps the wait going."""
        runtime = make_runtime(quorum_size=3, quorum_timeout_ms=5000)
        runtime.pool.record_check("b1", True)

        async def changes() -> None:
            await trio.sleep(1)
            runtime.pool.record_check("b2", True)
            await trio.sleep(1)
            runtime.pool.record_check("b2", False, "down")
            await trio.sleep(1)
            runtime.pool.record_check("b2", True)
            runtime.pool.record_check("b3", True)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(changes)
            decision = await decide(runtime, FACTS)
        assert trio.current_time() - start == 3.0
        assert decision.status is RouteStatus.OK

    def test_decide_now_says_when_the_quorum_must_be_waited_for(self) -> None:
        runtime = make_runtime(quorum_size=2, quorum_timeout_ms=3000)
        runtime.pool.record_check("b1", True)
        assert runtime.decide_now(FACTS, 0.0) == QuorumWait(key="127.0.0.2", timeout_s=3.0)
        runtime.pool.record_check("b2", True)
        decision = runtime.decide_now(FACTS, 0.0)
        assert isinstance(decision, RouteDecision)
        assert decision.status is RouteStatus.OK

    async def test_decide_spreads_a_burst_with_least_connections(self) -> None:
        """Scenario: connections registered at their decision make LEAST_CONNECTIONS spread a burst."""
        runtime = make_runtime(policy="LEAST_CONNECTIONS")
        for node in ("b1", "b2", "b3"):
            runtime.pool.record_check(node, True)
        picks: dict[str, int] = {}
        for port in range(30):
            decision = await decide(runtime, FACTS)
            assert decision.target is not None
            node_id = decision.target.node_id
            runtime.connections.register(live_connection(f"10.1.0.1:{port}", node_id=node_id))
            picks[node_id] = picks.get(node_id, 0) + 1
        assert picks == {"b1": 10, "b2": 10, "b3": 10}
        assert [runtime.connections.open_connections(n) for n in ("b1", "b2", "b3")] == [10, 10, 10]
        assert runtime.connections.open_connections() == 30

    def test_lookup_outside_trio_raises_and_reports_nothing(self) -> None:
        runtime = make_runtime()
        events = recorded(runtime)
        runtime.pool.record_check("b1", True)
        with pytest.raises(RuntimeError):  # outside trio: the lookup reads the trio clock
            runtime.lookup("k")
        assert [e for e in events if isinstance(e, LookedUp)] == []

    async def test_lookup_in_trio_is_reported_and_counted(self) -> None:
        runtime = make_runtime()
        events = recorded(runtime)
        runtime.pool.record_check("b1", True)
        assert runtime.lookup("k").status is RouteStatus.OK
        assert [e for e in events if isinstance(e, LookedUp)] == [
            LookedUp(router="r", key="k", status=RouteStatus.OK)
        ]
        labels = {"router": "r", "status": "OK"}
        assert runtime.metrics.registry.get_sample_value("router_lookups_total", labels) == 1.0


class TestStatusAndFilters:
    def test_status_is_a_snapshot_of_filters_cache_and_pool(self) -> None:
        runtime = make_runtime(quorum_size=2, cache_ms=0)
        runtime.pool.record_check("b2", True)
        runtime.connections.register(live_connection(node_id="b2"))
        status = runtime.status()
        assert (status.name, status.key_type, status.policy, status.cache_entries) == (
            "r",
            "SOURCE_IP",
            "FIRST_ELEMENT",
            0,
        )
        assert status.pool is not None
        assert (status.pool.active, status.pool.quorum_size, status.pool.ready) == (False, 2, ("b2",))
        assert [(t.node_id, t.state, t.connections) for t in status.pool.targets] == [
            ("b1", TargetState.UNKNOWN, 0),
            ("b2", TargetState.READY, 1),
            ("b3", TargetState.UNKNOWN, 0),
        ]
        assert status.to_json()["pool"] == {
            "kind": "static-connectors",
            "active": False,
            "quorum_size": 2,
            "open": 1,
            "accepting": False,
            "not_accepting_reason": "pool below its quorum, 1 of 3 target(s) ready, quorum-size 2",
            "targets": [t.to_json() for t in status.pool.targets],
        }

    def test_set_filters_changes_both_or_neither(self) -> None:
        runtime = make_runtime()
        status = set_filters(runtime, key_filter="^127", local_target_filter="x")
        assert (status.key_filter, status.local_target_filter) == ("^127", "x")
        with pytest.raises(ValueError, match="not a valid regular expression"):
            set_filters(runtime, key_filter="^10", local_target_filter="(")
        after = runtime.status()
        assert (after.key_filter, after.local_target_filter) == ("^127", "x")
        status = set_filters(runtime, local_target_filter="")  # blank disables; the other stays
        assert (status.key_filter, status.local_target_filter) == ("^127", None)

    async def test_cache_size_and_evictions_are_sampled_when_scraped(self) -> None:
        """Scenario: <max-entries> 2 and five keys: two entries, three evictions, as the metrics say
        at each scrape (counted once, not again at the next scrape)."""
        runtime = make_runtime(cache_ms=0, cache_entries=2)
        runtime.pool.record_check("b1", True)
        for key in "abcde":
            runtime.lookup(key)
        metrics = runtime.metrics
        for _ in range(2):
            metrics.exposition()
            assert metrics.cache_entries.value(("r",)) == 2
            assert metrics.cache_evictions.value(("r",)) == 3


def reloaded(
    runtime: RouterRuntime,
    pool: tuple[str, ...],
    *,
    policy: str = "FIRST_ELEMENT",
    cache_ms: int | None = None,
    outlier: OutlierConfig | None = None,
) -> RouterConfig:
    """Reconfigure `runtime` as `_runtime` would build it, with the targets `pool` (of b1-b4)."""
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{20000 + i}") for i in (1, 2, 3, 4))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name=policy),
        cache=None if cache_ms is None else CacheConfig(timeout_ms=cache_ms, max_entries=100),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=pool,
            quorum_timeout_ms=0,
            outlier_detection=outlier or OutlierConfig(),
        ),
    )
    runtime.reconfigure(Config(source="test.xml", connectors=connectors, routers=(router,)), router)
    return router


class TestAccept:
    def test_accept_gives_each_connection_its_own_id_and_reports_it(self) -> None:
        runtime = make_runtime()
        events = recorded(runtime)
        first = runtime.accept("a", Address("127.0.0.2", 5000))
        second = runtime.accept("a", Address("::1", 5001))
        assert first.id != second.id
        assert events == [Accepted(conn=first), Accepted(conn=second)]
        assert (str(first.peer), str(second.peer)) == ("127.0.0.2:5000", "[::1]:5001")
        labels = {"acceptor": "a", "router": "r"}
        assert runtime.metrics.registry.get_sample_value("router_connections_accepted_total", labels) == 2.0


class TestReconfigure:
    async def test_reconfigure_keeps_unchanged_targets_policy_and_cache(self) -> None:
        runtime = make_runtime(policy="ROUND_ROBIN", cache_ms=60_000)
        for node_id in ("b1", "b2", "b3"):
            runtime.pool.record_check(node_id, True)
        assert runtime.lookup("k1").target == Target.remote(Connector.from_url("b1", "tcp://127.0.0.1:20001"))
        reloaded(runtime, ("b1", "b2", "b3", "b4"), policy="ROUND_ROBIN", cache_ms=60_000)
        assert [t.node_id for t in runtime.pool.targets()] == ["b1", "b2", "b3", "b4"]
        assert runtime.pool.target_state("b2") is TargetState.READY
        assert runtime.pool.target_state("b4") is TargetState.UNKNOWN
        assert cache_entries(runtime) == {"k1": "b1"}  # the cache's settings did not change
        decision = runtime.lookup("k2")
        assert decision.target is not None
        assert decision.target.node_id == "b2"  # the round-robin position went on

    async def test_reconfigure_with_new_cache_settings_starts_an_empty_cache(self) -> None:
        runtime = make_runtime(cache_ms=60_000)
        runtime.pool.record_check("b1", True)
        runtime.lookup("k1")
        reloaded(runtime, ("b1", "b2", "b3"), cache_ms=5_000)
        assert cache_entries(runtime) == {}
        assert runtime.pool.target_state("b1") is TargetState.READY

    def test_reconfigure_keeps_a_run_time_filter_the_file_did_not_change(self) -> None:
        runtime = make_runtime()
        set_filters(runtime, key_filter="^[a-z]+")
        reloaded(runtime, ("b1", "b2"))
        assert runtime.status().key_filter == "^[a-z]+"

    def test_close_departed_closes_the_connections_of_departed_targets_only(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        runtime = make_runtime()
        closers = [Closer(), Closer(), Closer()]
        for port, node_id, closer in zip((1, 2, 3), ("b1", "b3", "b3"), closers, strict=True):
            runtime.connections.register(live_connection(f"127.0.0.2:{port}", node_id=node_id, closer=closer))
        reloaded(runtime, ("b1", "b2"))
        assert runtime.connections.close_departed([Departed(node_id="b3")]) == 2
        assert [c.calls for c in closers] == [[], [CloseReason.TARGET_REMOVED], [CloseReason.TARGET_REMOVED]]
        assert (
            "router=r target=b3 left the configuration: closing its 2 proxied connection(s)"
            in caplog.messages
        )

    def test_retire_removes_the_targets(self) -> None:
        runtime = make_runtime()
        events = recorded(runtime)
        runtime.retire()
        assert runtime.pool.targets() == ()
        removed = [
            e.node_id for e in events if isinstance(e, PoolEvent) and e.kind is PoolEventKind.TARGET_REMOVED
        ]
        assert removed == ["b1", "b2", "b3"]


def test_the_kernel_has_at_most_fifteen_public_members() -> None:
    """Issue 31: what the data paths need, nothing a single feature alone uses."""
    runtime = make_runtime()
    public = sorted(name for name in {*dir(runtime), *vars(runtime)} if not name.startswith("_"))
    assert len(public) <= 15, public
