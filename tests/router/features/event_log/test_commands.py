"""router/features/event_log/commands.py: `routerctl event-log` (with the event log on:
tests/router/services/test_admin.py and tests/router/test_routerd_event_log.py)."""

from __future__ import annotations

import pytest

from router.ctl import main_routerctl
from tests.router.features.admin_states.test_commands import admin
from tests.router.test_ctl_commands import _routerctl

__all__ = ["admin"]  # the fixture, shared


async def test_event_log_of_a_routerd_without_one_is_exit_1_saying_so(
    admin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _routerctl("event-log", "--admin", admin) == 1
    assert "the event log is off" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["0", "-1", "many"])
def test_event_log_ring_size_must_be_a_positive_integer(
    size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main_routerctl(["event-log", "--ring-size", size])
    assert exited.value.code == 2
    assert "argument --ring-size: must be an integer 1-2147483647" in capsys.readouterr().err
