"""routerctl's paced moves: `evacuate`, `rebalance` and `shutdown` (rules.py).

    routerctl evacuate --admin URL ROUTER NODE_ID [--rate R] [--order oldest|random]
                       [--refer | --no-refer] [--wait [--timeout S] [--progress]]
                       | --status | --abort
    routerctl rebalance --admin URL ROUTER [--rate R] [--band B] [--order …]
                        [--wait [--timeout S] [--progress]] | --status | --abort
    routerctl shutdown --admin URL [--wait [--timeout S]]

Each prints the move's status (with --wait, the last one), as fields or, with --json, JSON; with
--wait --progress, a line on stderr each time the move's count changes while it runs. Exit
status (routerctl's `ExitCode`): 0 when it started (with --wait: when it is done), was shown or
aborted; 1 when, with --wait, it ended aborted, or the admin API answered an error; 5 when, with
--wait, it did not finish within --timeout; 2 for bad usage; 3 admin API unreachable.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Final

from router.core.status import rfc3339
from router.ctl_client import fields_blocks
from router.ctl_output import CtlError, ExitCode, finite_number, poll
from router.feature import Command
from router.features.moves.rules import DEFAULT_BAND, DEFAULT_RATE, MoveOrder

if TYPE_CHECKING:
    import argparse

    from router.ctl_client import Ctl
    from router.ctl_output import Renderable

__all__ = ["COMMANDS", "status_blocks"]

POLL_S: Final = 0.5
"""How often --wait asks for the status."""
_UNFINISHED: Final = ("running", "waiting")
"""A move's states before it ends."""
DEFAULT_WAIT_S: Final = 600.0


def _wait_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--wait", action="store_true", help=f"wait until the {what} is done, then print its status"
    )
    parser.add_argument(
        "--timeout",
        type=finite_number(zero=False, unit="seconds"),
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"with --wait: give up after this long, exit 5 (default {DEFAULT_WAIT_S:g})",
    )


def _pace_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate",
        type=finite_number(zero=False, unit="connections per second"),
        default=DEFAULT_RATE,
        metavar="CONNS_PER_S",
        help=f"connections moved per second (default {DEFAULT_RATE:g})",
    )
    parser.add_argument(
        "--order",
        choices=[o.value for o in MoveOrder],
        default=MoveOrder.OLDEST.value,
        help="which connections go first (default oldest)",
    )


def _progress_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help=f"with --wait: a line on stderr each time the {what}'s count changes (moved, left, ETA)",
    )


def status_blocks(status: object) -> list[Renderable]:
    """A move's status for people: its fields, with `started_at` and `finished_at` (seconds since
    the epoch in the JSON) as RFC 3339 dates."""
    if isinstance(status, dict):
        status = {
            name: rfc3339(value) if name in _DATES and isinstance(value, int | float) else value
            for name, value in status.items()
        }
    return fields_blocks(status)


_DATES: Final = frozenset({"started_at", "finished_at"})


def _progress_line(status: object) -> str:
    """`evacuate running: moved 12 left 38 at 9.8/s eta 4 s`, from a move's status (its note, if
    any, after it: why it waits)."""
    if not isinstance(status, dict):
        return ""
    eta = status.get("eta_s")
    rate = status.get("achieved_rate")
    return (
        f"{status.get('kind', 'move')} {status.get('state', '')}: moved {status.get('moved')} "
        f"left {status.get('left')}"
        + (f" at {rate:.1f}/s" if isinstance(rate, int | float) else "")
        + (f" eta {eta:.0f} s" if isinstance(eta, int | float) else "")
        + (f" ({note})" if (note := status.get("note")) else "")
    )


def _control_options(parser: argparse.ArgumentParser, what: str) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--status", action="store_true", help=f"show the last {what}'s status instead")
    group.add_argument(
        "--abort", action="store_true", help=f"stop the running {what} (what moved stays moved)"
    )


def _evacuate_arguments(evacuate: argparse.ArgumentParser) -> None:
    evacuate.add_argument("router", help="the connection router's name")
    evacuate.add_argument("node_id", metavar="NODE_ID", help="the target to evacuate")
    _pace_options(evacuate)
    refer = evacuate.add_mutually_exclusive_group()
    refer.add_argument(
        "--refer",
        dest="refer",
        action="store_true",
        default=None,
        help="tell clients the new target's address (MQTT 5 Server Reference, AMQP redirect) even "
        "on a proxy acceptor (default: only on redirect and auto acceptors)",
    )
    refer.add_argument(
        "--no-refer",
        dest="refer",
        action="store_false",
        help="never tell clients an address: they come back to us",
    )
    _wait_options(evacuate, "evacuation")
    _progress_option(evacuate, "evacuation")
    _control_options(evacuate, "evacuation")


def _rebalance_arguments(rebalance: argparse.ArgumentParser) -> None:
    rebalance.add_argument("router", help="the connection router's name")
    _pace_options(rebalance)
    rebalance.add_argument(
        "--band",
        type=finite_number(zero=True, unit="(a fraction of the mean)"),
        default=DEFAULT_BAND,
        metavar="FRACTION",
        help=f"tolerance above the mean, 0.1 = 10 %% (default {DEFAULT_BAND:g})",
    )
    _wait_options(rebalance, "rebalance")
    _progress_option(rebalance, "rebalance")
    _control_options(rebalance, "rebalance")


def _shutdown_arguments(shutdown: argparse.ArgumentParser) -> None:
    _wait_options(shutdown, "shutdown")


def _shutdown(args: argparse.Namespace, ctl: Ctl) -> int:
    ctl.out.emit(ctl.request("/api/v1/shutdown", method="POST", body={}), fields_blocks)
    if args.wait and not _gone(ctl.admin_url, args.timeout):
        raise CtlError(f"routerd still answers after {args.timeout:g} s", ExitCode.TIMED_OUT)
    return ExitCode.OK


def _move(args: argparse.Namespace, ctl: Ctl) -> int:
    """`evacuate` or `rebalance`: start (with --wait, until done, --progress on stderr), show or
    abort."""
    if args.progress and not args.wait:
        raise CtlError("--progress needs --wait", ExitCode.USAGE)
    router = urllib.parse.quote(args.router, safe="")
    if args.command == "evacuate":
        path = f"/api/v1/routers/{router}/targets/{urllib.parse.quote(args.node_id, safe='')}/evacuation"
        body: dict[str, object] = {"rate": args.rate, "order": args.order, "refer": args.refer}
    else:
        path = f"/api/v1/routers/{router}/rebalance"
        body = {"rate": args.rate, "order": args.order, "band": args.band}
    if args.status:
        status = ctl.request(path)
    elif args.abort:
        status = ctl.request(path, method="DELETE")
    else:
        status = ctl.request(path, method="POST", body=body)
        shown = ""
        if args.wait and _state(status) in _UNFINISHED:

            def ask(_left: float) -> tuple[object] | None:
                nonlocal status, shown
                status = ctl.request(path)
                line = _progress_line(status)
                if args.progress and line != shown:
                    print(line, file=sys.stderr, flush=True)
                    shown = line
                return None if _state(status) in _UNFINISHED else (status,)

            poll(ask, timeout_s=args.timeout, interval_s=POLL_S)
    ctl.out.emit(status, status_blocks)
    if args.wait and not (args.status or args.abort):
        state = _state(status)
        if state in _UNFINISHED:
            raise CtlError(f"not done after {args.timeout:g} s", ExitCode.TIMED_OUT)
        if state != "done":
            raise CtlError(f"the {args.command} ended {state}", ExitCode.FAILED)
    return ExitCode.OK


COMMANDS: Final = (
    Command(
        name="evacuate",
        help="move a target's clients elsewhere, paced, in their protocol",
        description="Drain the target (no new connections), then tell its clients to go, RATE a "
        "second: MQTT 5 DISCONNECT 0x9C, AMQP Close (redirect or forced), OpenWire "
        "ConnectionControl; other clients are closed. Each client's key is routed again (and "
        "cached), so it lands elsewhere when it comes back. Output: the evacuation's status (--json: JSON).",
        arguments=_evacuate_arguments,
        run=_move,
    ),
    Command(
        name="rebalance",
        help="move just enough clients to bring every target within a band of the mean",
        description="From each ready target with more than BAND above the mean of the ready "
        "targets, move just enough clients, each to the target with the fewest connections. Needs "
        "a <cache> (or LEAST_CONNECTIONS). Output: the rebalance's status (--json: JSON).",
        arguments=_rebalance_arguments,
        run=_move,
    ),
    Command(
        name="shutdown",
        help="stop the router as SIGTERM does (admin level)",
        description="No new connections; open ones are moved paced over routerd's grace period, "
        "then routerd exits. With --wait, returns once the admin API no longer answers.",
        arguments=_shutdown_arguments,
        run=_shutdown,
    ),
)
"""The feature's routerctl commands."""


def _state(status: object) -> str:
    return str(status.get("state", "")) if isinstance(status, dict) else ""


def _gone(admin_url: str, timeout_s: float) -> bool:
    """Wait until the admin API refuses connections (the process ended); False after `timeout_s`.
    Anything else (a slow answer while routerd drains, a connection closed at the admin API's
    connection limit, an HTTP error) is not an end: a preStop hook that returned early would let
    the kubelet's SIGTERM cut the paced shutdown short."""

    def refused(_left: float) -> bool | None:
        try:
            with urllib.request.urlopen(admin_url.rstrip("/") + "/healthz", timeout=2):
                pass
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                return True
        except ConnectionRefusedError:
            return True
        except OSError:
            pass  # e.g. a reset or a timeout: ask again
        return None

    return poll(refused, timeout_s=timeout_s, interval_s=POLL_S) is not None
