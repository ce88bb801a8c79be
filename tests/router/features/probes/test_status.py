"""router/features/probes/status.py: a target's broker-reported connection count in its status
document and in a router's `routerctl status`."""

from __future__ import annotations

from policies import PolicyConfig
from pools import Connector, Pool, PoolConfig, PoolKind, Target
from router.config.settings import Config, RouterConfig
from router.core.engine import RoutingEngine
from router.core.live import LiveConnections
from router.core.status import CountReport, TargetHistory, snapshot
from router.ctl_render import router_blocks
from router.features.probes import FEATURE
from router.features.probes.service import Probes
from router.features.probes.status import (
    BROKER_COUNT,
    BrokerCountStatus,
    broker_count_blocks,
    broker_count_status,
)
from router.metrics import Metrics
from router.runtime import RouterRuntime


def test_broker_count_status_shows_the_count_with_its_age_only_where_one_is_read() -> None:
    counted = Connector.from_url("c", "tcp://127.0.0.1:20001?nodeId=counted;connectionCount=artemis-jolokia")
    plain = Connector.from_url("p", "tcp://127.0.0.1:20002?nodeId=plain")
    config = RouterConfig(
        name="r",
        policy=PolicyConfig(name="LEAST_CONNECTIONS"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("c", "p")),
    )
    pool = Pool("r", 1, [Target.remote(counted), Target.remote(plain)])
    connections, history = LiveConnections(), TargetHistory()
    engine = RoutingEngine(config, pool, Target.local_target(None), counts=connections)
    sections = {BROKER_COUNT: broker_count_status}
    before = snapshot(config, engine, pool, connections, history, now=1_700_000_010.0, sections=sections)
    connections.report_broker_count("counted", 12)
    history.counted("counted", 12, 1_700_000_000.0)
    after = snapshot(config, engine, pool, connections, history, now=1_700_000_002.5, sections=sections)
    no_clock = snapshot(config, engine, pool, connections, history, sections=sections)
    documents = (before.to_json(), after.to_json(), no_clock.to_json())
    targets = [t for document in documents for t in document["pool"]["targets"]]  # type: ignore[index]
    assert "broker_count" not in targets[1]
    assert targets[0]["broker_count"] == {
        "source": "artemis-jolokia",
        "count": None,
        "read_at": None,
        "age_s": None,
        "last_error": None,
        "last_error_at": None,
    }
    assert targets[2]["broker_count"] == {
        "source": "artemis-jolokia",
        "count": 12,
        "read_at": "2023-11-14T22:13:20.000Z",
        "age_s": 2.5,
        "last_error": None,
        "last_error_at": None,
    }
    assert targets[2]["connections"] == 12
    assert targets[4]["broker_count"]["age_s"] is None  # no clock given


def test_broker_count_status_document_after_a_failed_read() -> None:
    report = CountReport(
        read_at=1_700_000_000.0, last_error="jolokia status 403: Origin", last_error_at=1_700_000_003.0
    )
    document = BrokerCountStatus(source="activemq-jolokia", report=report, age_s=4.0004).to_json()
    assert document == {
        "source": "activemq-jolokia",
        "count": None,
        "read_at": "2023-11-14T22:13:20.000Z",
        "age_s": 4.0,
        "last_error": "jolokia status 403: Origin",
        "last_error_at": "2023-11-14T22:13:23.000Z",
    }


def test_probes_router_added_shows_the_broker_count_in_the_router_status() -> None:
    """Scenario: the service adds its member to each target's document when the router joins."""
    connectors = (Connector.from_url("a", "tcp://127.0.0.1:20001?connectionCount=artemis-jolokia"),)
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="LEAST_CONNECTIONS"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",)),
    )
    runtime = RouterRuntime(
        Config(source="t.xml", connectors=connectors, routers=(router,)), router, Metrics()
    )
    assert runtime.status().pool.targets[0].sections == {}  # type: ignore[union-attr]
    Probes().router_added(runtime)
    (target,) = runtime.status().pool.targets  # type: ignore[union-attr]
    assert target.sections[BROKER_COUNT]["source"] == "artemis-jolokia"  # type: ignore[index]
    runtime.retire()


def test_broker_count_blocks_show_a_table_only_when_a_target_reads_a_count() -> None:
    plain = {
        "node_id": "p",
        "state": "ready",
        "admin_state": "ready",
        "connections": 0,
        "connector": "tcp://h:1",
    }
    counted = {
        **plain,
        "node_id": "a",
        "connections": 12,
        "broker_count": {
            "source": "artemis-jolokia",
            "count": 12,
            "read_at": "2026-05-01T12:00:00.000Z",
            "age_s": 1.25,
            "last_error": None,
            "last_error_at": None,
        },
    }
    failing = {
        **plain,
        "node_id": "r",
        "broker_count": {
            "source": "rabbitmq-prometheus",
            "count": None,
            "read_at": None,
            "age_s": None,
            "last_error": "connect to http://h:15692/metrics failed: Connection refused",
            "last_error_at": "2026-05-01T12:00:01.000Z",
        },
    }

    def router(*targets: dict[str, object]) -> dict[str, object]:
        return {
            "name": "lc",
            "pool": {"kind": "static-connectors", "quorum_size": 1, "targets": list(targets)},
        }

    assert broker_count_blocks(router(plain)) == []
    assert broker_count_blocks({"name": "lc", "pool": None}) == []
    assert FEATURE.router_blocks is broker_count_blocks
    blocks = router_blocks(router(plain, counted, failing), [broker_count_blocks])
    table = blocks[-1]
    assert not isinstance(table, str)
    assert table.render().splitlines() == [
        "NODE_ID  COUNT_SOURCE         BROKER_COUNT  READ      LAST_ERROR",
        "a        artemis-jolokia      12            1.2s ago  -",
        "r        rabbitmq-prometheus  -             -         "
        "connect to http://h:15692/metrics failed: Connection refused",
    ]
