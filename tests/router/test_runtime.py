"""RouterRuntime: the quorum wait (SPEC A1 step 7) on trio's virtual clock, pool changes and what
they close, the live-connection registry behind the lock, the status snapshot and filter changes,
and the events it reports."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from cache import CacheConfig
from keys import ConnectionFacts
from policies import PolicyConfig
from pools import (
    AdminState,
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
from router.core.events import Accepted, Closed, CloseReason, ConnectionsClosed, LookedUp
from router.core.reload import Departed
from router.core.status import OperationalState, TargetStatus
from router.metrics import Metrics
from router.runtime import RouterRuntime, close_removed
from tests.router.core.test_live import Closer, live_connection

if TYPE_CHECKING:
    from router.core.events import Event


def _runtime(
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


def _recorded(runtime: RouterRuntime) -> list[Event]:
    events: list[Event] = []
    runtime.subscribe(events.append)
    return events


class TestDecide:
    async def test_decide_waits_for_quorum_then_routes(self, autojump_clock: trio.testing.MockClock) -> None:
        """Scenario: quorum 2 of 3, one ready; the second becomes ready after 1.5 s of a 3 s wait."""
        runtime = _runtime(quorum_size=2, quorum_timeout_ms=3000)
        runtime.record_check("b2", True)
        start = trio.current_time()

        async def second_ready() -> None:
            await trio.sleep(1.5)
            runtime.record_check("b3", True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second_ready)
            decision = await runtime.decide(FACTS)
        assert trio.current_time() - start == 1.5
        assert decision.status is RouteStatus.OK
        assert decision.target is not None
        assert decision.target.node_id == "b2"  # FIRST_ELEMENT: first ready in pool order

    async def test_decide_refuses_after_quorum_timeout(self, autojump_clock: trio.testing.MockClock) -> None:
        runtime = _runtime(quorum_size=2, quorum_timeout_ms=3000)
        runtime.record_check("b1", True)
        start = trio.current_time()
        decision = await runtime.decide(FACTS)
        assert trio.current_time() - start == 3.0
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    async def test_decide_does_not_wait_with_zero_quorum_timeout(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        runtime = _runtime(quorum_size=1, quorum_timeout_ms=0)
        start = trio.current_time()
        decision = await runtime.decide(FACTS)
        assert trio.current_time() == start
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    async def test_decide_ignores_unrelated_changes_until_quorum(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        """Scenario: a change that does not reach quorum (a target going down) keeps the wait going."""
        runtime = _runtime(quorum_size=3, quorum_timeout_ms=5000)
        runtime.record_check("b1", True)

        async def changes() -> None:
            await trio.sleep(1)
            runtime.record_check("b2", True)
            await trio.sleep(1)
            runtime.record_check("b2", False, "down")
            await trio.sleep(1)
            runtime.record_check("b2", True)
            runtime.record_check("b3", True)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(changes)
            decision = await runtime.decide(FACTS)
        assert trio.current_time() - start == 3.0
        assert decision.status is RouteStatus.OK

    def test_decide_now_says_when_the_quorum_must_be_waited_for(self) -> None:
        runtime = _runtime(quorum_size=2, quorum_timeout_ms=3000)
        runtime.record_check("b1", True)
        assert runtime.decide_now(FACTS, 0.0) == QuorumWait(key="127.0.0.2", timeout_s=3.0)
        runtime.record_check("b2", True)
        decision = runtime.decide_now(FACTS, 0.0)
        assert isinstance(decision, RouteDecision)
        assert decision.status is RouteStatus.OK

    async def test_decide_spreads_a_burst_with_least_connections(self) -> None:
        """Scenario: connections registered at their decision make LEAST_CONNECTIONS spread a burst."""
        runtime = _runtime(policy="LEAST_CONNECTIONS")
        for node in ("b1", "b2", "b3"):
            runtime.record_check(node, True)
        picks: dict[str, int] = {}
        for port in range(30):
            decision = await runtime.decide(FACTS)
            assert decision.target is not None
            node_id = decision.target.node_id
            runtime.register(live_connection(f"10.1.0.1:{port}", node_id=node_id))
            picks[node_id] = picks.get(node_id, 0) + 1
        assert picks == {"b1": 10, "b2": 10, "b3": 10}
        assert [runtime.open_connections(n) for n in ("b1", "b2", "b3")] == [10, 10, 10]
        assert runtime.open_connections() == 30

    def test_lookup_outside_trio_raises_and_reports_nothing(self) -> None:
        runtime = _runtime()
        events = _recorded(runtime)
        runtime.record_check("b1", True)
        with pytest.raises(RuntimeError):  # outside trio: the lookup reads the trio clock
            runtime.lookup("k")
        assert [e for e in events if isinstance(e, LookedUp)] == []

    async def test_lookup_in_trio_is_reported_and_counted(self) -> None:
        runtime = _runtime()
        events = _recorded(runtime)
        runtime.record_check("b1", True)
        assert runtime.lookup("k").status is RouteStatus.OK
        assert [e for e in events if isinstance(e, LookedUp)] == [
            LookedUp(router="r", key="k", status=RouteStatus.OK)
        ]
        labels = {"router": "r", "status": "OK"}
        assert runtime.metrics.registry.get_sample_value("router_lookups_total", labels) == 1.0


class TestPoolChanges:
    def test_record_check_exports_readiness_metrics(self) -> None:
        runtime = _runtime()
        reg = runtime.metrics.registry
        assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 0.0
        runtime.record_check("b1", True)
        assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 1.0
        assert reg.get_sample_value("router_pool_active", {"router": "r"}) == 1.0
        runtime.record_check("b1", False, "refused")
        assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 0.0
        assert reg.get_sample_value("router_pool_active", {"router": "r"}) == 0.0

    def test_a_target_that_is_not_ready_has_its_connections_closed(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: b1 fails its probe; its two proxied connections are closed through their
        closers at once, reported once with the count; b2's stays open."""
        runtime = _runtime()
        events = _recorded(runtime)
        runtime.record_check("b1", True)
        runtime.record_check("b2", True)
        closers = [Closer(), Closer(), Closer()]
        for port, node_id, closer in zip((1, 2, 3), ("b1", "b1", "b2"), closers, strict=True):
            runtime.register(live_connection(f"127.0.0.2:{port}", node_id=node_id, closer=closer))
        runtime.record_check("b1", False, "refused")
        runtime.record_check("b1", False, "refused")  # no change: nothing more
        assert [c.calls for c in closers] == [[CloseReason.TARGET_NOT_READY]] * 2 + [[]]
        assert [e for e in events if isinstance(e, ConnectionsClosed)] == [
            ConnectionsClosed(
                router="r", node_id="b1", address=None, reason=CloseReason.TARGET_NOT_READY, count=2
            )
        ]
        messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
        assert messages == ["router=r target=b1 is not ready: closing its 2 proxied connection(s)"]

    def test_failover_closes_only_the_connections_to_the_former_member(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: an HA pair fails over from primary to backup; connections that went to the
        primary are closed (their clients reconnect to the backup), the backup's stay open."""
        pair = Connector.from_url("p", "(tcp://127.0.0.1:20001,tcp://127.0.0.1:20002)?nodeId=pair")
        router = RouterConfig(
            name="r",
            policy=PolicyConfig(name="FIRST_ELEMENT"),
            pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("p",)),
        )
        runtime = RouterRuntime(
            Config(source="t.xml", connectors=(pair,), routers=(router,)), router, Metrics()
        )
        runtime.record_check("pair", True, member=0)
        runtime.record_check("pair", True, member=1)
        to_primary, to_backup = Closer(), Closer()
        for port, address, closer in (
            (1, ("127.0.0.1", 20001), to_primary),
            (2, ("127.0.0.1", 20002), to_backup),
        ):
            runtime.register(
                live_connection(f"127.0.0.2:{port}", node_id="pair", address=address, closer=closer)
            )
        runtime.record_check("pair", False, "killed", member=0)
        assert (to_primary.calls, to_backup.calls) == ([CloseReason.FAILOVER], [])
        assert runtime.active_member("pair") == 1
        messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
        assert messages == [
            "router=r target=pair member 127.0.0.1:20001 is not active: closing its 1 proxied connection(s)"
        ]

    def test_a_refused_connect_makes_the_member_not_ready_unless_the_target_changed(self) -> None:
        runtime = _runtime()
        runtime.record_check("b1", True)
        b1 = runtime.target("b1")
        assert b1 is not None
        assert b1.connector is not None
        stale = Target(node_id="b1", connector=b1.connector)  # equal, but not the pool's target
        runtime.connect_refused(stale, b1.connector, "Connection refused")
        assert runtime.status().pool is not None
        assert runtime.ready_count() == 1
        runtime.connect_refused(b1, b1.connector, "Connection refused")
        assert runtime.ready_count() == 0
        status = runtime.status().pool
        assert status is not None
        assert status.targets[0].state is TargetState.NOT_READY

    async def test_add_and_remove_target_log_export_and_wake_waiters(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: a discovered target joins a running pool, gets ready, serves a waiting decision,
        then leaves: one line each, its metrics go, and the pool becomes inactive."""
        caplog.set_level(logging.INFO, logger="router.pool")
        runtime = _runtime()
        for node_id in ("b1", "b2", "b3"):
            runtime.remove_target(node_id)
        assert runtime.targets() == ()
        joined = Target(node_id="z1", connector=Connector(name="z1", host="127.0.0.1", port=20009))
        woken: list[str] = []

        async def wait_for_z1() -> None:
            await runtime.wait_until(lambda: runtime.target("z1") is not None)
            woken.append("z1")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_z1)
            await trio.testing.wait_all_tasks_blocked()
            runtime.add_target(joined)
            await trio.testing.wait_all_tasks_blocked()
        assert woken == ["z1"]
        runtime.record_check("z1", True)
        assert runtime.lookup("k").target == joined
        metrics = runtime.metrics.registry
        assert metrics.get_sample_value("router_target_ready", {"router": "r", "node_id": "z1"}) == 1.0
        assert (
            metrics.get_sample_value("router_target_state", {"router": "r", "node_id": "z1", "state": "up"})
            == 1
        )
        runtime.metrics.connect_failures.inc(("r", "z1", "refused"))

        runtime.remove_target("z1")
        assert metrics.get_sample_value("router_target_ready", {"router": "r", "node_id": "z1"}) is None
        z1_failures = {"router": "r", "node_id": "z1", "reason": "refused"}
        assert metrics.get_sample_value("router_target_connect_failures_total", z1_failures) is None
        assert 'node_id="z1"' not in runtime.metrics.exposition().decode()
        assert metrics.get_sample_value("router_pool_active", {"router": "r"}) == 0.0
        assert runtime.lookup("k").status is RouteStatus.REFUSED_UNAVAILABLE
        messages = [r.getMessage() for r in caplog.records if "target=z1" in r.getMessage()]
        assert messages == [
            "router=r target=z1 joined the pool (tcp://127.0.0.1:20009)",
            "router=r target=z1 is ready",
            "router=r target=z1 left the pool (it was ready)",
        ]

    def test_pool_events_reach_subscribers(self) -> None:
        runtime = _runtime()
        events = _recorded(runtime)
        runtime.record_check("b1", True)
        kinds = [e.kind for e in events if isinstance(e, PoolEvent)]
        assert kinds == [PoolEventKind.TARGET_READY, PoolEventKind.POOL_ACTIVE]


class TestStatusAndFilters:
    def test_status_is_a_snapshot_of_filters_cache_and_pool(self) -> None:
        runtime = _runtime(quorum_size=2, cache_ms=0)
        runtime.record_check("b2", True)
        runtime.register(live_connection(node_id="b2"))
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
            "targets": [t.to_json() for t in status.pool.targets],
        }

    def test_set_filters_changes_both_or_neither(self) -> None:
        runtime = _runtime()
        status = runtime.set_filters(key_filter="^127", local_target_filter="x")
        assert (status.key_filter, status.local_target_filter) == ("^127", "x")
        with pytest.raises(ValueError, match="not a valid regular expression"):
            runtime.set_filters(key_filter="^10", local_target_filter="(")
        after = runtime.status()
        assert (after.key_filter, after.local_target_filter) == ("^127", "x")
        status = runtime.set_filters(local_target_filter="")  # blank disables; the other stays
        assert (status.key_filter, status.local_target_filter) == ("^127", None)

    async def test_serve_cache_purge_drops_expired_entries(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        runtime = _runtime(cache_ms=2000)
        runtime.record_check("b1", True)
        runtime.lookup("k")  # cached at t=0
        with trio.move_on_after(1.9):
            await runtime.serve_cache_purge()
        assert runtime.status().cache_entries == 1
        with trio.move_on_after(2.2):  # the sweep at t=3.9 finds the entry 3.9 s old
            await runtime.serve_cache_purge()
        assert runtime.status().cache_entries == 0

    async def test_cache_size_and_evictions_are_sampled_when_scraped(self) -> None:
        """Scenario: <max-entries> 2 and five keys: two entries, three evictions, as the metrics say
        at each scrape (counted once, not again at the next scrape)."""
        runtime = _runtime(cache_ms=0, cache_entries=2)
        runtime.record_check("b1", True)
        for key in "abcde":
            runtime.lookup(key)
        metrics = runtime.metrics
        for _ in range(2):
            metrics.exposition()
            assert metrics.cache_entries.value(("r",)) == 2
            assert metrics.cache_evictions.value(("r",)) == 3


class TestConnections:
    def test_accept_gives_each_connection_its_own_id_and_reports_it(self) -> None:
        runtime = _runtime()
        events = _recorded(runtime)
        first = runtime.accept("a", Address("127.0.0.2", 5000))
        second = runtime.accept("a", Address("::1", 5001))
        assert first.id != second.id
        assert events == [Accepted(conn=first), Accepted(conn=second)]
        assert (str(first.peer), str(second.peer)) == ("127.0.0.2:5000", "[::1]:5001")
        labels = {"acceptor": "a", "router": "r"}
        assert runtime.metrics.registry.get_sample_value("router_connections_accepted_total", labels) == 2.0

    def test_close_all_closes_every_connection_and_says_so_once(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="router.pool")
        runtime = _runtime()
        closers = [Closer(), Closer()]
        for port, (node_id, closer) in enumerate(zip(("b1", "b2"), closers, strict=True)):
            runtime.register(live_connection(f"127.0.0.2:{port + 1}", node_id=node_id, closer=closer))
        assert runtime.close_all(CloseReason.SHUTDOWN) == 2
        assert runtime.close_all(CloseReason.SHUTDOWN) == 0
        assert [c.calls for c in closers] == [[CloseReason.SHUTDOWN]] * 2
        messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
        assert messages == ["router=r grace period over: closing its 2 proxied connection(s)"]

    def test_unregister_forgets_a_connection(self) -> None:
        runtime = _runtime()
        conn = live_connection()
        runtime.register(conn)
        assert runtime.open_connections("b1") == 1
        runtime.unregister(conn)
        runtime.unregister(conn)  # twice is harmless
        assert runtime.open_connections() == 0
        runtime.record_check("b1", True)
        runtime.record_check("b1", False, "down")
        assert conn.closed_by is None  # not registered: not closed by the pool

    def test_a_scrape_counts_the_bytes_of_open_connections(self) -> None:
        """Scenario: a long-lived connection relays bytes between scrapes, then ends, then its
        router retires: the counter follows the bytes while they flow, never counts one twice and
        keeps what a retired router relayed."""
        runtime = _runtime()
        registry = runtime.metrics.registry

        def scraped() -> tuple[float | None, ...]:
            runtime.metrics.exposition()
            return tuple(
                registry.get_sample_value("router_proxied_bytes_total", {"router": "r", "direction": d})
                for d in ("client_to_target", "target_to_client")
            )

        conn = live_connection()
        runtime.register(conn)
        conn.counts[0] += 100
        assert scraped() == (100.0, None)  # no traffic that way yet: no series
        conn.counts[1] += 7000
        assert scraped() == (100.0, 7000.0)
        conn.counts[0] += 1
        runtime.unregister(conn)
        runtime.unregister(conn)
        assert scraped() == (101.0, 7000.0)
        other = live_connection("127.0.0.2:5001")
        runtime.register(other)
        other.counts[1] += 9
        runtime.retire()
        assert scraped() == (101.0, 7009.0)


def _reloaded(
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


class TestReconfigure:
    async def test_reconfigure_keeps_unchanged_targets_policy_and_cache(self) -> None:
        runtime = _runtime(policy="ROUND_ROBIN", cache_ms=60_000)
        for node_id in ("b1", "b2", "b3"):
            runtime.record_check(node_id, True)
        assert runtime.lookup("k1").target == Target.remote(Connector.from_url("b1", "tcp://127.0.0.1:20001"))
        _reloaded(runtime, ("b1", "b2", "b3", "b4"), policy="ROUND_ROBIN", cache_ms=60_000)
        assert [t.node_id for t in runtime.targets()] == ["b1", "b2", "b3", "b4"]
        assert runtime.target_state("b2") is TargetState.READY
        assert runtime.target_state("b4") is TargetState.UNKNOWN
        assert runtime.cache_entries() == {"k1": "b1"}  # the cache's settings did not change
        decision = runtime.lookup("k2")
        assert decision.target is not None
        assert decision.target.node_id == "b2"  # the round-robin position went on

    async def test_reconfigure_with_new_cache_settings_starts_an_empty_cache(self) -> None:
        runtime = _runtime(cache_ms=60_000)
        runtime.record_check("b1", True)
        runtime.lookup("k1")
        _reloaded(runtime, ("b1", "b2", "b3"), cache_ms=5_000)
        assert runtime.cache_entries() == {}
        assert runtime.target_state("b1") is TargetState.READY

    def test_reconfigure_keeps_a_run_time_filter_the_file_did_not_change(self) -> None:
        runtime = _runtime()
        runtime.set_filters(key_filter="^[a-z]+")
        _reloaded(runtime, ("b1", "b2"))
        assert runtime.status().key_filter == "^[a-z]+"

    def test_close_removed_closes_the_connections_of_departed_targets_only(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        runtime = _runtime()
        closers = [Closer(), Closer(), Closer()]
        for port, node_id, closer in zip((1, 2, 3), ("b1", "b3", "b3"), closers, strict=True):
            runtime.register(live_connection(f"127.0.0.2:{port}", node_id=node_id, closer=closer))
        _reloaded(runtime, ("b1", "b2"))
        assert close_removed(runtime, [Departed(node_id="b3")]) == 2
        assert [c.calls for c in closers] == [[], [CloseReason.TARGET_REMOVED], [CloseReason.TARGET_REMOVED]]
        assert (
            "router=r target=b3 left the configuration: closing its 2 proxied connection(s)"
            in caplog.messages
        )

    def test_retire_removes_the_targets(self) -> None:
        runtime = _runtime()
        events = _recorded(runtime)
        runtime.retire()
        assert runtime.targets() == ()
        removed = [
            e.node_id for e in events if isinstance(e, PoolEvent) and e.kind is PoolEventKind.TARGET_REMOVED
        ]
        assert removed == ["b1", "b2", "b3"]


def _target_status(runtime: RouterRuntime, node_id: str) -> TargetStatus:
    pool = runtime.status().pool
    assert pool is not None
    return next(t for t in pool.targets if t.node_id == node_id)


class TestTargetHistory:
    """What the status and the metrics show of each target beyond its readiness: its last probe,
    why it is not ready, and when its operational state last changed."""

    def test_a_probe_is_shown_with_its_time_and_duration(self) -> None:
        before = time.time()
        runtime = _runtime()
        started = time.time()
        b1 = _target_status(runtime, "b1")
        assert (b1.operational_state, b1.last_check, b1.not_ready_reason) == (
            OperationalState.DOWN,
            None,
            "not probed yet",
        )
        assert b1.last_change is not None
        assert before <= b1.last_change <= started
        runtime.record_check("b1", True, duration_s=0.125)
        b1 = _target_status(runtime, "b1")
        assert b1.last_check is not None
        assert (b1.last_check.ok, b1.last_check.duration_s, b1.operational_state) == (
            True,
            0.125,
            OperationalState.UP,
        )
        assert started <= b1.last_check.at <= time.time()
        assert b1.last_change is not None
        assert started <= b1.last_change <= time.time()
        registry, labels = runtime.metrics.registry, {"router": "r", "node_id": "b1"}
        assert registry.get_sample_value("router_target_check_duration_seconds", labels) == 0.125
        assert (
            registry.get_sample_value("router_target_last_change_timestamp_seconds", labels) == b1.last_change
        )
        assert registry.get_sample_value("router_target_state", {**labels, "state": "up"}) == 1.0
        assert registry.get_sample_value("router_target_state", {**labels, "state": "down"}) == 0.0
        changed = b1.last_change
        runtime.record_check("b1", True, duration_s=0.5)  # no change of state: the time stays
        assert _target_status(runtime, "b1").last_change == changed
        runtime.record_check("b1", False, "mqtt probe of tcp://127.0.0.1:20001 failed: boom", duration_s=3.0)
        b1 = _target_status(runtime, "b1")
        assert (b1.operational_state, b1.not_ready_reason) == (
            OperationalState.DOWN,
            "mqtt probe of tcp://127.0.0.1:20001 failed: boom",
        )
        assert b1.last_change is not None
        assert b1.last_change >= changed
        assert registry.get_sample_value("router_target_check_duration_seconds", labels) == 3.0

    def test_a_refused_connect_is_the_reason(self) -> None:
        runtime = _runtime()
        runtime.record_check("b1", True)
        b1 = runtime.target("b1")
        assert b1 is not None
        assert b1.connector is not None
        runtime.connect_refused(b1, b1.connector, "Connection refused")
        assert _target_status(runtime, "b1").not_ready_reason == (
            "connect to tcp://127.0.0.1:20001 failed: Connection refused"
        )

    def test_administrative_states_show_as_drain_and_maint(self) -> None:
        """Scenario: a ready target is drained, put in maintenance (its probes are no longer
        recorded) and made ready again: unknown, so down, until its next probe."""
        runtime = _runtime()
        registry = runtime.metrics.registry

        def one_hot() -> dict[str, float | None]:
            return {
                s.value: registry.get_sample_value(
                    "router_target_state", {"router": "r", "node_id": "b1", "state": s.value}
                )
                for s in OperationalState
            }

        runtime.record_check("b1", True, duration_s=0.01)
        runtime.set_admin_state("b1", AdminState.DRAIN)
        assert one_hot() == {"up": 0.0, "down": 0.0, "drain": 1.0, "maint": 0.0, "ejected": 0.0}
        runtime.set_admin_state("b1", AdminState.MAINT)
        assert one_hot() == {"up": 0.0, "down": 0.0, "drain": 0.0, "maint": 1.0, "ejected": 0.0}
        runtime.record_check("b1", False, "late", duration_s=9.0)  # began before maintenance
        b1 = _target_status(runtime, "b1")
        assert b1.last_check is not None
        assert b1.last_check.duration_s == 0.01
        runtime.set_admin_state("b1", AdminState.READY)
        assert one_hot() == {"up": 0.0, "down": 1.0, "drain": 0.0, "maint": 0.0, "ejected": 0.0}
        assert _target_status(runtime, "b1").not_ready_reason == "not probed yet"


class TestPassiveHealth:
    def _closed(self, node_id: str, reason: CloseReason = CloseReason.BROKER_CLOSED_EARLY) -> Closed:
        conn = live_connection(node_id=node_id)
        return Closed(conn=conn.conn, node_id=node_id, bytes_in=1, bytes_out=0, duration_s=0.0, reason=reason)

    async def test_ejected_after_failures_returns_after_its_time_whatever_probes_say(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        """Scenario: five early closes eject b1 for 30 s; probes keep passing meanwhile; it returns
        at 30 s (virtual), logged and counted once each."""
        runtime = _runtime()
        for node_id in ("b1", "b2", "b3"):
            runtime.record_check(node_id, True)
        events = _recorded(runtime)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.serve_outlier_returns)
            await trio.sleep(1)
            runtime.broker_failed(self._closed("b1", CloseReason.CLOSED))  # not a failure
            for _ in range(5):
                runtime.broker_failed(self._closed("b1"))
            assert [e.kind for e in events if isinstance(e, PoolEvent)] == [PoolEventKind.TARGET_EJECTED]
            assert not runtime.target_ready("b1")
            assert runtime.status().pool is not None
            (b1,) = [t for t in runtime.status().pool.targets if t.node_id == "b1"]  # type: ignore[union-attr]
            assert b1.operational_state is OperationalState.EJECTED
            assert b1.not_ready_reason is not None
            assert "ejected by outlier detection for 30 s" in b1.not_ready_reason
            runtime.record_check("b1", True)  # a probe's success does not end it
            assert not runtime.target_ready("b1")
            await trio.sleep(29.5)
            assert not runtime.target_ready("b1")
            await trio.sleep(1)
            assert runtime.target_ready("b1")
            kinds = [e.kind for e in events if isinstance(e, PoolEvent)]
            assert kinds == [PoolEventKind.TARGET_EJECTED, PoolEventKind.TARGET_RETURNED]
            registry = runtime.metrics.registry
            assert (
                registry.get_sample_value("router_target_ejections_total", {"router": "r", "node_id": "b1"})
                == 1
            )
            failures = {"router": "r", "reason": "broker_closed_early"}
            assert registry.get_sample_value("router_target_outlier_failures_total", failures) == 5
            nursery.cancel_scope.cancel()

    async def test_reload_keeps_an_ejection_and_turning_it_off_ends_it(self) -> None:
        runtime = _runtime()
        for node_id in ("b1", "b2", "b3"):
            runtime.record_check(node_id, True)
        for _ in range(5):
            runtime.broker_failed(self._closed("b1"))
        _reloaded(runtime, ("b1", "b2", "b3"), outlier=OutlierConfig(consecutive_failures=3))
        assert not runtime.target_ready("b1")  # kept across a reload
        events = _recorded(runtime)
        _reloaded(runtime, ("b1", "b2", "b3"), outlier=OutlierConfig(enabled=False))
        assert runtime.target_ready("b1")
        assert [e.kind for e in events if isinstance(e, PoolEvent)] == [PoolEventKind.TARGET_RETURNED]
