"""routerctl's `state`: show or set a target's administrative state (ready, drain, maint).

routerctl state [--admin ADDRESS] ROUTER NODE_ID [ready|drain|maint]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from router.ctl_client import quoted
from router.ctl_output import ExitCode
from router.ctl_render import targets_table
from router.feature import Command

if TYPE_CHECKING:
    import argparse

    from router.ctl_client import Ctl

__all__ = ["COMMANDS"]


def _arguments(state: argparse.ArgumentParser) -> None:
    state.add_argument("router", metavar="ROUTER", help="the connection router")
    state.add_argument("node_id", metavar="NODE_ID", help="the target's node id")
    state.add_argument(
        "state", nargs="?", choices=["ready", "drain", "maint"], help="the state to set (default: just show)"
    )


def _state(args: argparse.Namespace, ctl: Ctl) -> int:
    path = quoted("api", "v1", "routers", args.router, "targets", args.node_id)
    if args.state is None:
        target = ctl.request(path)
    else:
        target = ctl.request(path, method="PUT", body={"admin_state": args.state})
    ctl.out.emit(target, lambda t: [targets_table([t])])
    return ExitCode.OK


COMMANDS: Final = (
    Command(
        name="state",
        help="show or set a target's administrative state (ready, drain, maint)",
        description="ready: takes new connections. drain: no new connections (cached keys "
        "included), probed; open connections stay. maint: as drain, and not probed. The state is "
        "kept across restarts (routerd's --state-file). Prints the target's status.",
        arguments=_arguments,
        run=_state,
    ),
)
