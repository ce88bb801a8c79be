"""router/ctl_render.py: what people see of the admin API's documents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.ctl_render import duration

if TYPE_CHECKING:
    from router.ctl_output import Renderable


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


def test_router_blocks_end_with_the_features_blocks_when_the_router_has_a_pool() -> None:
    """Scenario: a feature's part (`Feature.router_blocks`: the probes' broker counts) follows the
    kernel's fields and targets table, and is not asked for a router without a pool."""
    from router.ctl_render import router_blocks

    target = {
        "node_id": "p",
        "state": "ready",
        "admin_state": "ready",
        "connections": 0,
        "connector": "tcp://h:1",
    }
    router = {"name": "lc", "pool": {"kind": "static-connectors", "quorum_size": 1, "targets": [target]}}
    asked: list[object] = []

    def feature(document: object) -> list[Renderable]:
        asked.append(document)
        return ["a feature's line"]

    assert len(router_blocks(router)) == 2
    assert router_blocks(router, [feature])[2:] == ["a feature's line"]
    assert router_blocks({"name": "lc", "pool": None}, [feature])[1:] == []
    assert asked == [router]
