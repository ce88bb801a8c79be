"""router/features/admin_states/commands.py: `routerctl state` against a server running in process
(kept across restarts: tests/router/test_routerd_admin_state.py)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest
import trio

from pools import TargetState
from router.server import ServerInfo, serve_router
from tests.router.test_ctl_commands import _admin_config, _routerctl

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def admin(nursery: trio.Nursery) -> AsyncIterator[str]:
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            _admin_config(), admin=("127.0.0.1", 0), shutdown=shutdown, task_status=task_status
        )
    )
    runtime = info.runtimes["r"]
    await runtime.pool.wait_until(lambda: runtime.pool.target_state("b1") is not TargetState.UNKNOWN)
    assert info.admin is not None
    yield f"127.0.0.1:{info.admin[1]}"
    shutdown.set()


async def test_state_sets_shows_and_refuses(admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: drain a target (its row says drain), show it as JSON, and an unknown target is
    exit status 1 with the admin API's reason."""
    assert await _routerctl("state", "--admin", admin, "r", "b1", "drain") == 0
    assert re.search(r"^b1 +not-ready +drain +no +0 ", capsys.readouterr().out, re.MULTILINE)
    assert await _routerctl("state", "--json", "--admin", admin, "r", "b1") == 0
    assert json.loads(capsys.readouterr().out)["admin_state"] == "drain"
    assert await _routerctl("state", "--admin", admin, "r", "nope", "ready") == 1
    assert "no target" in capsys.readouterr().err


def test_state_takes_only_the_three_states(capsys: pytest.CaptureFixture[str]) -> None:
    from router.ctl import main_routerctl

    with pytest.raises(SystemExit) as exited:
        main_routerctl(["state", "r", "b1", "paused"])
    assert exited.value.code == 2
    assert "invalid choice: 'paused'" in capsys.readouterr().err
