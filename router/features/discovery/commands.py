"""routerctl's `register`: a broker registered in a ZooKeeper discovery group until stopped.

routerctl register --zookeeper HOST:PORT[,…] --path P --node-id ID --connector tcp://…
                   [--backup tcp://…] [--weight N] [--session-timeout MS]
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Final

import trio

from pools import Member
from pools.members import MAX_SESSION_TIMEOUT_MS
from router.config.settings import ZooKeeperConfig
from router.ctl_output import CtlError, ExitCode, integer, only_error, seconds
from router.feature import Command
from router.features.discovery.service import RegistrationError, serve_registration

if TYPE_CHECKING:
    import argparse

    from router.ctl_client import Ctl

__all__ = ["COMMANDS"]


def _arguments(register: argparse.ArgumentParser) -> None:
    register.add_argument(
        "--zookeeper",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the ZooKeeper ensemble (its connect string)",
    )
    register.add_argument(
        "--path", required=True, help="the discovery group's path, e.g. /connection-router/fleet"
    )
    register.add_argument("--node-id", required=True, help="the broker's node id (unique in the group)")
    register.add_argument(
        "--connector", required=True, metavar="tcp://HOST:PORT[?PARAMS]", help="the primary"
    )
    register.add_argument("--backup", metavar="tcp://HOST:PORT", help="the backup of the broker's HA pair")
    register.add_argument("--weight", type=int, default=1, help="relative weight, default 1")
    register.add_argument(
        "--session-timeout",
        type=integer(1, MAX_SESSION_TIMEOUT_MS),
        default=10_000,
        metavar="MS",
        help="ZooKeeper session timeout: how long the member outlives this process if it dies "
        "(default 10000; the server clamps it to 2-20 times its tickTime)",
    )
    register.add_argument(
        "--connect-timeout",
        type=seconds(zero=False),
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for ZooKeeper at start (default 10)",
    )


def _register(args: argparse.Namespace, _ctl: Ctl) -> int:
    try:
        zookeeper = ZooKeeperConfig(
            connect=args.zookeeper, path=args.path, session_timeout_ms=args.session_timeout
        )
        member = Member.from_fields(
            node_id=args.node_id, connector=args.connector, backup=args.backup, weight=args.weight
        )
    except ValueError as exc:
        raise CtlError(f"register: {exc}", ExitCode.USAGE) from None
    try:
        trio.run(_run_register, zookeeper, member, args.connect_timeout)
    except (RegistrationError, BaseExceptionGroup) as exc:
        error = only_error(exc, RegistrationError)
        if error is None:
            raise
        raise CtlError(f"register: {error}", ExitCode.FAILED) from None
    return ExitCode.OK


async def _run_register(zookeeper: ZooKeeperConfig, member: Member, connect_timeout_s: float) -> None:
    async with trio.open_nursery() as nursery:

        async def stop_on_signal(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                task_status.started()
                async for signum in signals:
                    logging.getLogger("routerctl").info(
                        "%s received: deregistering", signal.Signals(signum).name
                    )
                    nursery.cancel_scope.cancel(reason="signal")
                    return

        await nursery.start(stop_on_signal)
        await serve_registration(zookeeper, member, connect_timeout_s=connect_timeout_s)


COMMANDS: Final = (
    Command(
        name="register",
        help="register a broker in a ZooKeeper discovery group until stopped",
        description="Create the broker's ephemeral member znode PATH/NODE-ID and keep it until "
        "SIGTERM or SIGINT, then delete it and exit 0. Routers whose pool uses the discovery "
        "group add the broker while it is registered (and ready), and remove it when the znode "
        "goes: at once on a clean stop, after the session timeout if this process dies.",
        arguments=_arguments,
        run=_register,
        admin=False,
        log_level=logging.INFO,
    ),
)
