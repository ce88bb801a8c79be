"""router/ctl.py: routerctl's commands, composed: every one has help, the exit statuses are listed,
the pipeline's arrive through the entry point, and no name is offered twice."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import pytest

from router.ctl import commands, main_routerctl
from router.ctl import routerctl_parser as _routerctl_parser
from router.ctl_output import EXIT_CODES_HELP
from router.feature import Command

if TYPE_CHECKING:
    from collections.abc import Iterator


def _actions(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every action of a parser and of its subcommands, with the command path it belongs to."""
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest}", choice
            for name, subparser in action.choices.items():
                yield from _actions(subparser, f"{path} {name}")


def test_routerctl_every_command_and_option_has_help() -> None:
    """Scenario: the real argparse tree (routerctl's commands and the pipeline's), walked: every
    command, subcommand, option and positional says what it is for."""
    walked = list(_actions(_routerctl_parser(), "routerctl"))
    missing = [
        f"{path}: {action.option_strings or action.dest}" for path, action in walked if not action.help
    ]
    assert missing == []
    commands = {path for path, _ in walked}
    assert {
        "routerctl wait target",
        "routerctl wait router",
        "routerctl cache pin",
        "routerctl simulate",
    } <= commands


def test_routerctl_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main_routerctl(["--help"])
    out = capsys.readouterr().out
    assert EXIT_CODES_HELP in out
    assert "ROUTERCTL_ADMIN" in out


def test_commands_are_the_kernels_the_features_and_the_pipelines_once_each() -> None:
    names = [command.name for command in commands()]
    assert len(names) == len(set(names))
    assert {
        "route",
        "status",
        "wait",
        "state",
        "cache",
        "evacuate",
        "register",
        "analyze",
        "simulate",
    } <= set(names)
    assert (
        names.index("route") < names.index("evacuate") < names.index("analyze")
    )  # kernel, features, entry points


def test_a_command_offered_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from router import ctl

    twin = Command(name="status", help="h", description="d", arguments=lambda _p: None, run=lambda _a, _c: 0)
    monkeypatch.setattr(ctl, "feature_commands", lambda: (twin,))
    with pytest.raises(ValueError, match=r"routerctl commands offered twice: \['status'\]"):
        commands()
