"""`routerctl`: dry-run the engine on a configuration file, or ask and steer a running routerd.

Every command is a `Command` (router/feature.py): the kernel's (router/ctl_commands.py: route,
target, status, reload, wait), the features' (router/features/: state, cache, evacuate, rebalance,
shutdown, event-log, register, ...) and those of installed packages that offer some through the
entry point group `connection_router.routerctl` (the pipeline's analyze, simulate and
generate-events). Each command's synopsis is in its module; docs/operations.md describes them all.

routerctl takes the admin address as routerd does (router/ctl_client.py), also from
ROUTERCTL_ADMIN. Every command that prints data prints tables for people, or JSON with `--json`
(router/ctl_output.py); its exit statuses are `ExitCode`'s. Errors a person can fix are one line
on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
from typing import TYPE_CHECKING, Final

from router.ctl_client import ADMIN_ENV, Ctl, admin_options
from router.ctl_commands import COMMANDS as KERNEL_COMMANDS
from router.ctl_output import EXIT_CODES_HELP, CtlError, ExitCode, Output
from router.features import commands as feature_commands
from router.features import router_blocks as feature_router_blocks
from router.services.process import package_version

if TYPE_CHECKING:
    from collections.abc import Sequence

    from router.feature import Command

__all__ = ["ENTRY_POINTS", "commands", "main_routerctl", "routerctl_main", "routerctl_parser"]

ENTRY_POINTS: Final = "connection_router.routerctl"
"""The entry point group whose members are tuples of more routerctl commands."""

_EPILOG: Final = f"""{EXIT_CODES_HELP}

environment:
  {ADMIN_ENV}       the admin API when --admin is not given (default 127.0.0.1:9180)
  ROUTERCTL_TOKEN_FILE  a file holding the admin API token (sent as Authorization: Bearer)
  ROUTERCTL_TOKEN       the token itself (ROUTERCTL_TOKEN_FILE is preferred)
  NO_COLOR              set: no colours, even on a terminal

docs/operations.md describes every command, its output and the admin API."""


def commands() -> tuple[Command, ...]:
    """Every routerctl command: the kernel's, the features', then the entry points'.

    Raises:
        ValueError: two commands of one name.
    """
    found = [*KERNEL_COMMANDS, *feature_commands()]
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        found.extend(entry.load())
    names = [command.name for command in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"routerctl commands offered twice: {twice}")
    return tuple(found)


def routerctl_parser(offered: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """routerctl's parser: one sub-command per command (`offered`, by default `commands()`)."""
    parser = argparse.ArgumentParser(
        prog="routerctl",
        description="Operate a connection router: dry-run its engine on a configuration file, or\n"
        "ask and steer a running routerd through its admin API. Output: tables for people,\n"
        "--json for scripts.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"routerctl {package_version()}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        title="commands",
        help="`routerctl COMMAND --help` tells more",
    )
    for command in commands() if offered is None else offered:
        one = sub.add_parser(
            command.name, help=command.help, description=command.description, epilog=command.epilog
        )
        if command.admin:
            admin_options(one)
        command.arguments(one)
    return parser


def main_routerctl(argv: Sequence[str] | None = None) -> int:
    """`routerctl`: see the module docstring; the exit status (`ExitCode`)."""
    offered = {command.name: command for command in commands()}
    args = routerctl_parser(tuple(offered.values())).parse_args(argv)
    command = offered[args.command]
    logging.basicConfig(
        level=command.log_level, stream=sys.stderr, format="routerctl: %(levelname)s: %(message)s"
    )
    out = Output(json_output=getattr(args, "json", False))
    try:
        return command.run(args, Ctl(args, out, feature_router_blocks()))
    except CtlError as exc:
        print(f"routerctl: error: {exc.message}", file=sys.stderr)
        raise SystemExit(exc.code) from None


def routerctl_main() -> None:
    """Console-script wrapper of `main_routerctl`."""
    try:
        status = main_routerctl()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`routerctl status | head`): no traceback. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again (Python's documented
        # recipe for SIGPIPE), and exit 1 as a pipe writer that lost its reader.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = ExitCode.FAILED
    raise SystemExit(status)
