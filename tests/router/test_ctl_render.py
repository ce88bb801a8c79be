"""router/ctl_render.py: what people see of the admin API's documents."""

from __future__ import annotations

from router.ctl_render import duration


def test__status_blocks_show_zookeeper_sessions_only_when_there_are_some() -> None:
    from router.ctl_render import status_blocks as _status_blocks

    document: dict[str, object] = {"process": {}, "acceptors": [], "routers": [], "zookeeper": []}
    assert len(_status_blocks(document)) == 3
    document["zookeeper"] = [
        {
            "router": "r",
            "use": "discovery",
            "connect": "127.0.0.1:2181",
            "path": "/members",
            "state": "suspended",
            "since": "2026-05-01T12:00:00.000Z",
            "session_timeout_ms": 10_000,
            "answer_timeout_ms": 2000,
        }
    ]
    blocks = _status_blocks(document)
    table = blocks[-1]
    assert not isinstance(table, str)
    assert table.render().splitlines() == [
        "ROUTER  ZOOKEEPER  STATE      SINCE                     AT",
        "r       discovery  suspended  2026-05-01T12:00:00.000Z  127.0.0.1:2181/members",
    ]


def test_duration_is_short_and_readable() -> None:
    assert [duration(s) for s in (12.34, 245, 3 * 3600 + 120, 2 * 86400 + 3 * 3600, None)] == [
        "12.3s",
        "4m05s",
        "3h02m",
        "2d03h",
        "-",
    ]


def test_router_blocks_show_broker_counts_only_when_a_target_reads_one() -> None:
    from router.ctl_render import router_blocks

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

    assert len(router_blocks(router(plain))) == 2
    blocks = router_blocks(router(plain, counted, failing))
    table = blocks[-1]
    assert not isinstance(table, str)
    assert table.render().splitlines() == [
        "NODE_ID  COUNT_SOURCE         BROKER_COUNT  READ      LAST_ERROR",
        "a        artemis-jolokia      12            1.2s ago  -",
        "r        rabbitmq-prometheus  -             -         "
        "connect to http://h:15692/metrics failed: Connection refused",
    ]
