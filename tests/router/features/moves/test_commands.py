"""router/features/moves/commands.py: the evacuate, rebalance and shutdown commands' options (the commands
themselves run against a real routerd in test_routerd_evacuation.py)."""

from __future__ import annotations

import pytest

from router.cli import _routerctl_parser


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
