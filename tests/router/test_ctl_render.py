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
