"""routerctl's `event-log`: a running router's event log (ring, counts), or its ring resized.

routerctl event-log [--admin ADDRESS] [--ring-size N]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from router.ctl_client import fields_blocks
from router.ctl_output import ExitCode, integer
from router.feature import Command

if TYPE_CHECKING:
    import argparse

    from router.ctl_client import Ctl

__all__ = ["COMMANDS"]


def _arguments(event_log: argparse.ArgumentParser) -> None:
    event_log.add_argument(
        "--ring-size",
        type=integer(1, 2**31 - 1),
        metavar="N",
        help="set the ring size (takes effect as the ring drains; nothing in it is lost)",
    )


def _event_log(args: argparse.Namespace, ctl: Ctl) -> int:
    if args.ring_size is None:
        document = ctl.request("/api/v1/event-log")
    else:
        document = ctl.request("/api/v1/event-log", method="PUT", body={"ring_size": args.ring_size})
    ctl.out.emit(document, fields_blocks)
    return ExitCode.OK


COMMANDS: Final = (
    Command(
        name="event-log",
        help="show a running router's event log (ring, counts), or resize its ring",
        description="show a running router's event log (ring, counts), or resize its ring",
        arguments=_arguments,
        run=_event_log,
    ),
)
