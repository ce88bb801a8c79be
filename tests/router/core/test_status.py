"""router/core/status.py: the snapshot the admin API shows, for single brokers and HA pairs."""

from __future__ import annotations

import pytest

from policies import PolicyConfig
from pools import AdminState, Connector, Pool, PoolConfig, PoolKind, Target, TargetState
from router.config.settings import RouterConfig
from router.core.engine import RoutingEngine
from router.core.live import LiveConnections
from router.core.status import (
    AcceptorStatus,
    CheckRecord,
    CountReport,
    OperationalState,
    ProcessStatus,
    ServerStatus,
    TargetHistory,
    ZooKeeperStatus,
    operational_state,
    rfc3339,
    snapshot,
)
from router.core.zookeeper_link import LinkState
from tests.router.core.test_live import live_connection


def test_snapshot_of_an_ha_pair_shows_its_members_and_the_active_one() -> None:
    pair = Connector.from_url("p", "(tcp://127.0.0.1:20001,tcp://127.0.0.1:20002)?nodeId=pair")
    single = Connector.from_url("s", "tcp://127.0.0.1:20003?nodeId=single")
    config = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("p", "s"), quorum_size=2),
    )
    pool = Pool("r", 2, [Target.remote(pair), Target.remote(single)])
    connections = LiveConnections()
    engine = RoutingEngine(config, pool, Target.local_target(None), counts=connections)
    pool.record_check("pair", False, "down", member=0)
    pool.record_check("pair", True, member=1)
    history = TargetHistory()
    history.observe("pair", OperationalState.DOWN, 1_700_000_000.0)
    history.observe("pair", OperationalState.UP, 1_700_000_001.5)
    history.checked(
        "pair", 0, CheckRecord(at=1_700_000_001.0, duration_s=0.0123456789, ok=False, reason="down")
    )
    history.checked("pair", 1, CheckRecord(at=1_700_000_001.5, duration_s=0.002, ok=True))
    connections.add(live_connection(node_id="pair", address=("127.0.0.1", 20002)))
    status = snapshot(config, engine, pool, connections, history)
    assert status.pool is not None
    assert (status.pool.active, status.pool.ready) == (False, ("pair",))
    assert status.to_json() == {
        "name": "r",
        "key_type": "SOURCE_IP",
        "key_filter": None,
        "local_target_filter": None,
        "policy": "FIRST_ELEMENT",
        "cache_entries": None,
        "pool": {
            "kind": "static-connectors",
            "active": False,
            "quorum_size": 2,
            "open": 1,
            "accepting": False,
            "not_accepting_reason": "pool below its quorum, 1 of 2 target(s) ready, quorum-size 2",
            "targets": [
                {
                    "node_id": "pair",
                    "local": False,
                    "connector": "(tcp://127.0.0.1:20001,tcp://127.0.0.1:20002)",
                    "state": "ready",
                    "admin_state": "ready",
                    "operational_state": "up",
                    "open": True,
                    "not_ready_reason": None,
                    "last_check": {"at": "2023-11-14T22:13:21.500Z", "duration_s": 0.002, "ok": True},
                    "last_change": "2023-11-14T22:13:21.500Z",
                    "check_failures": 1,
                    "down_s": 1.5,
                    "members": [
                        {
                            "connector": "tcp://127.0.0.1:20001",
                            "state": "not-ready",
                            "active": False,
                            "last_check": {
                                "at": "2023-11-14T22:13:21.000Z",
                                "duration_s": 0.012346,
                                "ok": False,
                                "reason": "down",
                            },
                        },
                        {
                            "connector": "tcp://127.0.0.1:20002",
                            "state": "ready",
                            "active": True,
                            "last_check": {"at": "2023-11-14T22:13:21.500Z", "duration_s": 0.002, "ok": True},
                        },
                    ],
                    "connections": 1,
                },
                {
                    "node_id": "single",
                    "local": False,
                    "connector": "tcp://127.0.0.1:20003",
                    "state": "unknown",
                    "admin_state": "ready",
                    "operational_state": "down",
                    "open": False,
                    "not_ready_reason": "not probed yet",
                    "last_check": None,
                    "last_change": None,
                    "check_failures": 0,
                    "down_s": 0.0,
                    "connections": 0,
                },
            ],
        },
    }
    assert status.pool.targets[1].state is TargetState.UNKNOWN


def test_snapshot_of_a_router_without_pool() -> None:
    config = RouterConfig(name="bare")
    engine = RoutingEngine(config, None, Target.local_target(None))
    status = snapshot(config, engine, None, LiveConnections())
    assert (status.pool, status.policy, status.to_json()["pool"]) == (None, None, None)


def test_server_status_document() -> None:
    """Scenario: the document of GET /api/v1/status (docs/admin-api.yaml `ServerStatus`)."""
    process = ProcessStatus(
        pid=42,
        version="1.2.3",
        started_at=1_700_000_000.5,
        uptime_s=12.25,
        descriptor_limit=None,
        descriptors_open=None,
        client_budget=9000,
        client_connections=3,
    )
    acceptor = AcceptorStatus(
        name="mqtt",
        router="r",
        host="::1",
        port=1883,
        mode="redirect",
        data_path="trio",
        open=3,
        pending=1,
        connections_allowed=None,
        connections_allowed_per_source=2,
    )
    zookeeper = ZooKeeperStatus(
        router="r",
        use="shared_cache",
        connect="127.0.0.1:2181",
        path="/cache",
        state=LinkState.SUSPENDED,
        since=1_700_000_001.25,
        session_timeout_ms=10_000,
        answer_timeout_ms=2000,
    )
    features = {"state_file": None}  # a feature's member (`Service.process_status`)
    assert ServerStatus(
        process=process, acceptors=(acceptor,), features=features, zookeeper=(zookeeper,)
    ).to_json() == {
        "process": {
            "pid": 42,
            "version": "1.2.3",
            "started_at": 1_700_000_000.5,
            "uptime_s": 12.25,
            "descriptors": {"limit": None, "open": None},
            "client_connections": {"budget": 9000, "open": 3},
        },
        "acceptors": [
            {
                "name": "mqtt",
                "router": "r",
                "host": "::1",
                "port": 1883,
                "mode": "redirect",
                "data_path": "trio",
                "open": 3,
                "pending": 1,
                "connections_allowed": None,
                "connections_allowed_per_source": 2,
            }
        ],
        "state_file": None,
        "zookeeper": [
            {
                "router": "r",
                "use": "shared_cache",
                "connect": "127.0.0.1:2181",
                "path": "/cache",
                "state": "suspended",
                "since": "2023-11-14T22:13:21.250Z",
                "session_timeout_ms": 10_000,
                "answer_timeout_ms": 2000,
            }
        ],
    }


@pytest.mark.parametrize(
    ("state", "admin", "expected"),
    [
        (TargetState.READY, AdminState.READY, OperationalState.UP),
        (TargetState.READY, AdminState.DRAIN, OperationalState.DRAIN),
        (TargetState.READY, AdminState.MAINT, OperationalState.MAINT),
        (TargetState.NOT_READY, AdminState.READY, OperationalState.DOWN),
        (TargetState.NOT_READY, AdminState.DRAIN, OperationalState.DOWN),
        (TargetState.NOT_READY, AdminState.MAINT, OperationalState.MAINT),
        (TargetState.UNKNOWN, AdminState.READY, OperationalState.DOWN),
        (TargetState.UNKNOWN, AdminState.MAINT, OperationalState.MAINT),
    ],
)
def test_operational_state_of_readiness_and_admin_state(
    state: TargetState, admin: AdminState, expected: OperationalState
) -> None:
    assert operational_state(state, admin) is expected


def test_target_history_keeps_the_first_time_of_each_state_and_forgets_a_target() -> None:
    history = TargetHistory()
    assert history.observe("b1", OperationalState.DOWN, 10.0)
    assert not history.observe("b1", OperationalState.DOWN, 20.0)
    assert history.last_change("b1") == 10.0
    assert history.observe("b1", OperationalState.UP, 30.0)
    assert history.last_change("b1") == 30.0
    history.checked("b1", 0, CheckRecord(at=31.0, duration_s=0.5, ok=False, reason="refused"))
    history.checked("b1", 0, CheckRecord(at=36.0, duration_s=0.1, ok=True))
    assert history.reason("b1") == "refused"  # the last failure's, until another one
    history.failed("b1", "connect refused")
    assert history.reason("b1") == "connect refused"
    assert history.last_check("b1") == CheckRecord(at=36.0, duration_s=0.1, ok=True)
    assert history.last_check("b1", 1) is None
    history.forget("b1")
    assert (history.last_change("b1"), history.last_check("b1"), history.reason("b1")) == (None, None, "")


def _static_router(node_ids: tuple[str, ...] = ("b1",)) -> tuple[RouterConfig, Pool, RoutingEngine]:
    connectors = [
        Connector.from_url(n, f"tcp://127.0.0.1:{20010 + i}?nodeId={n}") for i, n in enumerate(node_ids)
    ]
    config = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=node_ids),
    )
    pool = Pool("r", 1, [Target.remote(c) for c in connectors])
    return config, pool, RoutingEngine(config, pool, Target.local_target(None))


def test_snapshot_says_why_a_target_is_not_ready() -> None:
    config, pool, engine = _static_router(("b1", "b2", "b3", "b4"))
    history = TargetHistory()
    pool.record_check("b1", False, "connect to tcp://127.0.0.1:20010 failed: Connection refused")
    history.failed("b1", "connect to tcp://127.0.0.1:20010 failed: Connection refused")
    pool.record_check("b2", True)
    pool.record_check("b3", False, "x")
    pool.set_admin_state("b4", AdminState.MAINT)
    status = snapshot(config, engine, pool, LiveConnections(), history)
    assert status.pool is not None
    reasons = {t.node_id: (t.operational_state, t.not_ready_reason) for t in status.pool.targets}
    assert reasons == {
        "b1": (OperationalState.DOWN, "connect to tcp://127.0.0.1:20010 failed: Connection refused"),
        "b2": (OperationalState.UP, None),
        "b3": (OperationalState.DOWN, "its probe failed"),  # nothing in the history
        "b4": (OperationalState.MAINT, "in maintenance: not probed"),
    }


def test_snapshot_of_a_local_target_without_connector_says_so() -> None:
    config = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("b1",), local_target_enabled=True),
    )
    local = Target.local_target(None)
    pool = Pool("r", 1, [local])
    status = snapshot(config, RoutingEngine(config, pool, local), pool, LiveConnections())
    assert status.pool is not None
    assert status.pool.targets[0].not_ready_reason == (
        "no connector: a local target without <local-target-connector-ref> is never ready"
    )


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.1234) == "2023-11-14T22:13:20.123Z"


def test_target_history_count_reads_keep_the_last_success_and_the_last_error() -> None:
    """Scenario: a broker's connection count (a connector's `connectionCount=`) is read, fails, is
    read again; the probes' status (router/features/probes/status.py) shows the report."""
    history = TargetHistory()
    assert history.count_report("a") == CountReport()
    assert history.counted("a", 5, 100.0) == CountReport()  # the report before
    history.counted("a", "HTTP status 401", 102.0)
    assert history.count_report("a") == CountReport(
        count=None, read_at=100.0, last_error="HTTP status 401", last_error_at=102.0
    )
    history.counted("a", 7, 104.0)
    assert history.count_report("a") == CountReport(
        count=7, read_at=104.0, last_error="HTTP status 401", last_error_at=102.0
    )
    history.forget("a")
    assert history.count_report("a") == CountReport()


def test_snapshot_adds_the_features_members_of_a_target_after_the_kernels() -> None:
    """Scenario: a feature's `TargetSection` gives one target a member and not the other; it is
    given the router's history and the snapshot's time."""
    config, pool, engine = _static_router(("b1", "b2"))
    history = TargetHistory()
    seen: list[tuple[str, TargetHistory, float | None]] = []

    def section(target: Target, given: TargetHistory, now: float | None) -> object | None:
        seen.append((target.node_id, given, now))
        return {"seen_at": now} if target.node_id == "b1" else None

    status = snapshot(config, engine, pool, LiveConnections(), history, now=5.0, sections={"extra": section})
    first, second = status.to_json()["pool"]["targets"]  # type: ignore[index]
    assert list(first)[-2:] == ["connections", "extra"]
    assert first["extra"] == {"seen_at": 5.0}
    assert "extra" not in second
    assert seen == [("b1", history, 5.0), ("b2", history, 5.0)]
    without = snapshot(config, engine, pool, LiveConnections(), history).to_json()
    assert "extra" not in without["pool"]["targets"][0]  # type: ignore[index]


def test_history_counts_failed_probes_and_down_time() -> None:
    """Scenario: b1 is down 10 s, up 5 s, down again; two of its probes failed. Its down time is
    both spells (the current one to `now`), as HAProxy's downtime; forgetting it resets both."""
    history = TargetHistory()
    history.observe("b1", OperationalState.DOWN, 100.0)
    history.checked("b1", 0, CheckRecord(at=101.0, duration_s=0.001, ok=False, reason="refused"))
    history.observe("b1", OperationalState.UP, 110.0)
    history.checked("b1", 0, CheckRecord(at=111.0, duration_s=0.001, ok=True))
    assert (history.check_failures("b1"), history.down_s("b1", 112.0)) == (1, 10.0)
    history.observe("b1", OperationalState.DOWN, 115.0)
    history.checked("b1", 0, CheckRecord(at=116.0, duration_s=0.001, ok=False, reason="refused"))
    assert (history.check_failures("b1"), history.down_s("b1", 118.0)) == (2, 13.0)
    assert history.down_s("b1", None) == 10.0  # past spells only
    history.observe("b1", OperationalState.DRAIN, 120.0)  # drained: not down
    assert history.down_s("b1", 200.0) == 15.0
    history.forget("b1")
    assert (history.check_failures("b1"), history.down_s("b1", 300.0)) == (0, 0.0)
