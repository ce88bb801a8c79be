"""router/core/status.py: the snapshot the admin API shows, for single brokers and HA pairs."""

from __future__ import annotations

from policies import PolicyConfig
from pools import Connector, Pool, PoolConfig, PoolKind, Target, TargetState
from router.config.settings import RouterConfig
from router.core.engine import RoutingEngine
from router.core.live import LiveConnections
from router.core.status import AcceptorStatus, ProcessStatus, ServerStatus, snapshot
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
    connections.add(live_connection(node_id="pair", address=("127.0.0.1", 20002)))
    status = snapshot(config, engine, pool, connections)
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
            "targets": [
                {
                    "node_id": "pair",
                    "local": False,
                    "connector": "(tcp://127.0.0.1:20001,tcp://127.0.0.1:20002)",
                    "state": "ready",
                    "admin_state": "ready",
                    "members": [
                        {"connector": "tcp://127.0.0.1:20001", "state": "not-ready", "active": False},
                        {"connector": "tcp://127.0.0.1:20002", "state": "ready", "active": True},
                    ],
                    "connections": 1,
                },
                {
                    "node_id": "single",
                    "local": False,
                    "connector": "tcp://127.0.0.1:20003",
                    "state": "unknown",
                    "admin_state": "ready",
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
    assert ServerStatus(process=process, acceptors=(acceptor,)).to_json() == {
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
    }
