"""router/acceptors.py: what the process says of a configuration it cannot serve as written (the
acceptors' start, stop and replacement run through serve_router in test_server.py and test_reload.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import trio

from keys import KeyType
from router.server import serve_router
from tests.router.test_server import _config

if TYPE_CHECKING:
    import pytest


async def test_serve_router_warns_about_what_this_release_cannot_do(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a ROLE_NAME router without a user store on its acceptor: routerd says so once."""
    config = _config([1])
    router = dataclasses.replace(config.routers[0], key_type=KeyType.ROLE_NAME)
    config = dataclasses.replace(config, routers=(router,))
    shutdown = trio.Event()
    await nursery.start(
        lambda task_status: serve_router(config, admin=None, shutdown=shutdown, task_status=task_status)
    )
    shutdown.set()
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "router.server"
    ]
    assert warnings == [
        "router=r key-type=ROLE_NAME: no acceptor of it has usersFile/rolesFile, so only client-certificate "
        "users have roles; every other connection's key is NULL",
    ]
