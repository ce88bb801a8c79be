"""RouterPool: probes, discovery, refused connects and administrative states change the pool;
what those changes close and wake; the history of target states; passive health's ejections."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio
import trio.testing

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
from router.core.engine import RouteStatus
from router.core.events import Closed, CloseReason, ConnectionsClosed
from router.core.status import OperationalState, TargetStatus
from router.metrics import Metrics
from router.runtime import RouterRuntime
from tests.router.core.test_live import Closer, live_connection
from tests.router.runtime.test_kernel import make_runtime, recorded, reloaded

if TYPE_CHECKING:
    import pytest


class TestPoolChanges:
    def test_record_check_exports_readiness_metrics(self) -> None:
        runtime = make_runtime()
        reg = runtime.metrics.registry
        assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 0.0
        runtime.pool.record_check("b1", True)
        assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 1.0
        assert reg.get_sample_value("router_pool_active", {"router": "r"}) == 1.0
        runtime.pool.record_check("b1", False, "refused")
        assert reg.get_sample_value("router_target_ready", {"router": "r", "node_id": "b1"}) == 0.0
        assert reg.get_sample_value("router_pool_active", {"router": "r"}) == 0.0

    def test_a_target_that_is_not_ready_has_its_connections_closed(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: b1 fails its probe; its two proxied connections are closed through their
        closers at once, reported once with the count; b2's stays open."""
        runtime = make_runtime()
        events = recorded(runtime)
        runtime.pool.record_check("b1", True)
        runtime.pool.record_check("b2", True)
        closers = [Closer(), Closer(), Closer()]
        for port, node_id, closer in zip((1, 2, 3), ("b1", "b1", "b2"), closers, strict=True):
            runtime.connections.register(live_connection(f"127.0.0.2:{port}", node_id=node_id, closer=closer))
        runtime.pool.record_check("b1", False, "refused")
        runtime.pool.record_check("b1", False, "refused")  # no change: nothing more
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
        runtime.pool.record_check("pair", True, member=0)
        runtime.pool.record_check("pair", True, member=1)
        to_primary, to_backup = Closer(), Closer()
        for port, address, closer in (
            (1, ("127.0.0.1", 20001), to_primary),
            (2, ("127.0.0.1", 20002), to_backup),
        ):
            runtime.connections.register(
                live_connection(f"127.0.0.2:{port}", node_id="pair", address=address, closer=closer)
            )
        runtime.pool.record_check("pair", False, "killed", member=0)
        assert (to_primary.calls, to_backup.calls) == ([CloseReason.FAILOVER], [])
        assert runtime.pool.active_member("pair") == 1
        messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
        assert messages == [
            "router=r target=pair member 127.0.0.1:20001 is not active: closing its 1 proxied connection(s)"
        ]

    def test_a_refused_connect_makes_the_member_not_ready_unless_the_target_changed(self) -> None:
        runtime = make_runtime()
        runtime.pool.record_check("b1", True)
        b1 = runtime.pool.target("b1")
        assert b1 is not None
        assert b1.connector is not None
        stale = Target(node_id="b1", connector=b1.connector)  # equal, but not the pool's target
        runtime.pool.connect_refused(stale, b1.connector, "Connection refused")
        assert runtime.status().pool is not None
        assert runtime.pool.ready_count() == 1
        runtime.pool.connect_refused(b1, b1.connector, "Connection refused")
        assert runtime.pool.ready_count() == 0
        status = runtime.status().pool
        assert status is not None
        assert status.targets[0].state is TargetState.NOT_READY

    async def test_add_and_remove_target_log_export_and_wake_waiters(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: a discovered target joins a running pool, gets ready, serves a waiting decision,
        then leaves: one line each, its metrics go, and the pool becomes inactive."""
        caplog.set_level(logging.INFO, logger="router.pool")
        runtime = make_runtime()
        for node_id in ("b1", "b2", "b3"):
            runtime.pool.remove_target(node_id)
        assert runtime.pool.targets() == ()
        joined = Target(node_id="z1", connector=Connector(name="z1", host="127.0.0.1", port=20009))
        woken: list[str] = []

        async def wait_for_z1() -> None:
            await runtime.pool.wait_until(lambda: runtime.pool.target("z1") is not None)
            woken.append("z1")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_z1)
            await trio.testing.wait_all_tasks_blocked()
            runtime.pool.add_target(joined)
            await trio.testing.wait_all_tasks_blocked()
        assert woken == ["z1"]
        runtime.pool.record_check("z1", True)
        assert runtime.lookup("k").target == joined
        metrics = runtime.metrics.registry
        assert metrics.get_sample_value("router_target_ready", {"router": "r", "node_id": "z1"}) == 1.0
        assert (
            metrics.get_sample_value("router_target_state", {"router": "r", "node_id": "z1", "state": "up"})
            == 1
        )
        runtime.metrics.connect_failures.inc(("r", "z1", "refused"))

        runtime.pool.remove_target("z1")
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
        runtime = make_runtime()
        events = recorded(runtime)
        runtime.pool.record_check("b1", True)
        kinds = [e.kind for e in events if isinstance(e, PoolEvent)]
        assert kinds == [PoolEventKind.TARGET_READY, PoolEventKind.POOL_ACTIVE]


def _target_status(runtime: RouterRuntime, node_id: str) -> TargetStatus:
    pool = runtime.status().pool
    assert pool is not None
    return next(t for t in pool.targets if t.node_id == node_id)


class TestTargetHistory:
    """What the status and the metrics show of each target beyond its readiness: its last probe,
    why it is not ready, and when its operational state last changed."""

    def test_a_probe_is_shown_with_its_time_and_duration(self) -> None:
        before = time.time()
        runtime = make_runtime()
        started = time.time()
        b1 = _target_status(runtime, "b1")
        assert (b1.operational_state, b1.last_check, b1.not_ready_reason) == (
            OperationalState.DOWN,
            None,
            "not probed yet",
        )
        assert b1.last_change is not None
        assert before <= b1.last_change <= started
        runtime.pool.record_check("b1", True, duration_s=0.125)
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
        runtime.pool.record_check("b1", True, duration_s=0.5)  # no change of state: the time stays
        assert _target_status(runtime, "b1").last_change == changed
        runtime.pool.record_check(
            "b1", False, "mqtt probe of tcp://127.0.0.1:20001 failed: boom", duration_s=3.0
        )
        b1 = _target_status(runtime, "b1")
        assert (b1.operational_state, b1.not_ready_reason) == (
            OperationalState.DOWN,
            "mqtt probe of tcp://127.0.0.1:20001 failed: boom",
        )
        assert b1.last_change is not None
        assert b1.last_change >= changed
        assert registry.get_sample_value("router_target_check_duration_seconds", labels) == 3.0

    def test_a_refused_connect_is_the_reason(self) -> None:
        runtime = make_runtime()
        runtime.pool.record_check("b1", True)
        b1 = runtime.pool.target("b1")
        assert b1 is not None
        assert b1.connector is not None
        runtime.pool.connect_refused(b1, b1.connector, "Connection refused")
        assert _target_status(runtime, "b1").not_ready_reason == (
            "connect to tcp://127.0.0.1:20001 failed: Connection refused"
        )

    def test_administrative_states_show_as_drain_and_maint(self) -> None:
        """Scenario: a ready target is drained, put in maintenance (its probes are no longer
        recorded) and made ready again: unknown, so down, until its next probe."""
        runtime = make_runtime()
        registry = runtime.metrics.registry

        def one_hot() -> dict[str, float | None]:
            return {
                s.value: registry.get_sample_value(
                    "router_target_state", {"router": "r", "node_id": "b1", "state": s.value}
                )
                for s in OperationalState
            }

        runtime.pool.record_check("b1", True, duration_s=0.01)
        runtime.pool.set_admin_state("b1", AdminState.DRAIN)
        assert one_hot() == {"up": 0.0, "down": 0.0, "drain": 1.0, "maint": 0.0, "ejected": 0.0}
        runtime.pool.set_admin_state("b1", AdminState.MAINT)
        assert one_hot() == {"up": 0.0, "down": 0.0, "drain": 0.0, "maint": 1.0, "ejected": 0.0}
        runtime.pool.record_check("b1", False, "late", duration_s=9.0)  # began before maintenance
        b1 = _target_status(runtime, "b1")
        assert b1.last_check is not None
        assert b1.last_check.duration_s == 0.01
        runtime.pool.set_admin_state("b1", AdminState.READY)
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
        runtime = make_runtime()
        for node_id in ("b1", "b2", "b3"):
            runtime.pool.record_check(node_id, True)
        events = recorded(runtime)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.pool.serve_outlier_returns)
            await trio.sleep(1)
            runtime.pool.broker_failed(self._closed("b1", CloseReason.CLOSED))  # not a failure
            for _ in range(5):
                runtime.pool.broker_failed(self._closed("b1"))
            assert [e.kind for e in events if isinstance(e, PoolEvent)] == [PoolEventKind.TARGET_EJECTED]
            assert not runtime.pool.target_ready("b1")
            assert runtime.status().pool is not None
            (b1,) = [t for t in runtime.status().pool.targets if t.node_id == "b1"]  # type: ignore[union-attr]
            assert b1.operational_state is OperationalState.EJECTED
            assert b1.not_ready_reason is not None
            assert "ejected by outlier detection for 30 s" in b1.not_ready_reason
            runtime.pool.record_check("b1", True)  # a probe's success does not end it
            assert not runtime.pool.target_ready("b1")
            await trio.sleep(29.5)
            assert not runtime.pool.target_ready("b1")
            await trio.sleep(1)
            assert runtime.pool.target_ready("b1")
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
        runtime = make_runtime()
        for node_id in ("b1", "b2", "b3"):
            runtime.pool.record_check(node_id, True)
        for _ in range(5):
            runtime.pool.broker_failed(self._closed("b1"))
        reloaded(runtime, ("b1", "b2", "b3"), outlier=OutlierConfig(consecutive_failures=3))
        assert not runtime.pool.target_ready("b1")  # kept across a reload
        events = recorded(runtime)
        reloaded(runtime, ("b1", "b2", "b3"), outlier=OutlierConfig(enabled=False))
        assert runtime.pool.target_ready("b1")
        assert [e.kind for e in events if isinstance(e, PoolEvent)] == [PoolEventKind.TARGET_RETURNED]
