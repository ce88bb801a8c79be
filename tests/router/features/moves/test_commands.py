"""router/features/moves/commands.py: the evacuate, rebalance and shutdown commands' options (the commands
themselves run against a real routerd in test_routerd_evacuation.py)."""

from __future__ import annotations

import json
import re
import subprocess
from typing import TYPE_CHECKING

import pytest

from router.ctl import routerctl_parser as _routerctl_parser
from tests.router.conftest import ROUND_ROBIN_NODE_IDS, ROUTERCTL

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd


def test_evacuate_options_and_defaults() -> None:
    args = _routerctl_parser().parse_args(["evacuate", "rr", "m0"])
    assert (args.rate, args.order, args.refer, args.wait, args.status, args.abort) == (
        50.0,
        "oldest",
        None,
        False,
        False,
        False,
    )
    args = _routerctl_parser().parse_args(
        ["evacuate", "rr", "m0", "--rate", "2.5", "--no-refer", "--order", "random"]
    )
    assert (args.rate, args.refer, args.order) == (2.5, False, "random")


@pytest.mark.parametrize(
    "argv",
    [
        ["evacuate", "rr", "m0", "--rate", "0"],
        ["evacuate", "rr", "m0", "--status", "--abort"],
        ["rebalance", "rr", "--band", "nan"],
        ["rebalance", "rr", "--band", "-0.1"],
        ["wait", "--interval", "0.01", "router", "rr", "ready"],
        ["wait", "--interval", "inf", "router", "rr", "ready"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _routerctl_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"routerctl {argv[0]}: error:" in capsys.readouterr().err


def test_shutdown_and_rebalance_parse() -> None:
    args = _routerctl_parser().parse_args(["shutdown", "--wait", "--timeout", "25"])
    assert (args.wait, args.timeout) == (True, 25.0)
    args = _routerctl_parser().parse_args(["rebalance", "rr", "--band", "0.2"])
    assert args.band == 0.2


def test_progress_line_says_moved_left_rate_eta_and_why_it_waits() -> None:
    from router.features.moves.commands import _progress_line

    status = {
        "kind": "evacuate",
        "state": "running",
        "moved": 12,
        "left": 38,
        "achieved_rate": 9.84,
        "eta_s": 3.8,
    }
    assert _progress_line(status) == "evacuate running: moved 12 left 38 at 9.8/s eta 4 s"
    waiting = {**status, "state": "waiting", "eta_s": None, "note": "no other target open"}
    assert _progress_line(waiting) == "evacuate waiting: moved 12 left 38 at 9.8/s (no other target open)"


def test_progress_without_wait_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: --progress alone: exit status 2 before anything is asked (nothing listens on the
    admin address given)."""
    from router.ctl import main_routerctl
    from tests.conftest import free_port

    with pytest.raises(SystemExit) as exited:
        main_routerctl(["evacuate", "--admin", f"127.0.0.1:{free_port()}", "rr", "m0", "--progress"])
    assert exited.value.code == 2
    assert "--progress needs --wait" in capsys.readouterr().err


def test_evacuate_wait_progress_prints_each_change_on_stderr(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario: 6 clients, 2 per broker, evacuating one broker at 2/s with --wait --progress: the
    JSON status on stdout as without it, and on stderr one line per change, the count moved going
    up to 2, the last saying done."""
    from tests.router.test_routerd_evacuation import _Client, _client_ids, _config, _connections, _wait_until

    port = free_port()
    router = start_routerd(_config(mosquitto_fleet, port, fast_path=True))
    clients = [_Client(port, cid) for cid in _client_ids(6)]
    try:
        _wait_until(lambda: sorted(_connections(router).values()) == [2, 2, 2], "2 clients per broker")
        evacuate = ["evacuate", "--admin", router.admin, "--json", "rr", ROUND_ROBIN_NODE_IDS[0]]
        done = subprocess.run(
            [*ROUTERCTL, *evacuate, "--rate", "2", "--wait", "--progress", "--timeout", "30"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        for client in clients:
            client.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["moved"] == 2
    lines = done.stderr.splitlines()
    moved = [int(re.search(r"moved (\d+)", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert moved == sorted(moved), lines
    assert moved[-1] == 2, lines
    assert lines[-1].startswith("evacuate done: moved 2 left 0"), lines
    assert len(lines) == len(set(lines)), "a line only when the status changes"


def test_status_blocks_show_the_times_as_dates() -> None:
    """Scenario: the JSON's seconds since the epoch are RFC 3339 dates for people; other fields
    and a missing finish stay as they are."""
    from router.features.moves.commands import status_blocks

    (fields,) = status_blocks(
        {"state": "done", "started_at": 1_700_000_000.25, "finished_at": None, "achieved_rate": 9.5}
    )
    assert not isinstance(fields, str)
    text = fields.render()
    assert re.search(r"^started at: +2023-11-14T22:13:20\.250Z$", text, re.MULTILINE), text
    assert re.search(r"^finished at: +-$", text, re.MULTILINE), text
    assert re.search(r"^achieved rate: +9\.5$", text, re.MULTILINE), text
