"""`routerd`: run the router on a configuration file until SIGTERM.

    routerd --config FILE [--admin ADDRESS | --no-admin] [--grace-period S] [--max-connections N]
                    [--admin-tokens FILE] [--admin-host NAME]... [--event-log DIR]
                    [--state-file FILE] [--discard-unreadable-cache] [--workers N] [--log-level L]
                    [--version]

routerd takes the admin address in the forms routerctl does (router/ctl_client.py
`parse_admin_address`). It drains on SIGTERM or SIGINT, moving its clients paced over the grace
period; SIGHUP reloads the configuration file (as `routerctl reload` and `POST /api/v1/reload`
do): what can change in place does, established connections stay. `routerctl` is router/ctl.py.

Errors a person can fix (bad configuration, a bad option value, a port in use, a router that is
not running) are one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import resource
import signal
import sys
from typing import TYPE_CHECKING, Final, NoReturn

import trio

from router import conn_lines
from router.config import ConfigError, load_config
from router.config.settings import EventLogConfig
from router.core.admin_access import AdminAccess, Token, hosts_of, is_loopback, parse_tokens
from router.core.admission import descriptors_for
from router.ctl_client import (
    ADMIN_SYNTAX,
    DEFAULT_ADMIN,
    MAX_TOKENS_BYTES,
    parse_admin_address,
)
from router.ctl_output import (
    ExitCode,
    integer,
    only_error,
    seconds,
)
from router.datapath.native_path import DATA_PATH_ENV, DATA_PATHS, data_path_problem, default_data_path
from router.datapath.net import describe_oserror
from router.features import FEATURES
from router.logs import LOG_INTERVAL_S, flush_log_limits, install_log_limits
from router.processes import Processes, processes_of
from router.processes import add_arguments as add_process_arguments
from router.server import StartupError, serve_router
from router.services.process import package_version

if TYPE_CHECKING:
    from collections.abc import Sequence

    from router.config.settings import Config
    from router.feature import Option

__all__ = ["main_routerd", "routerd_main"]

EXIT_USAGE: Final = ExitCode.USAGE
EXIT_FAILURE: Final = ExitCode.FAILED


MAX_CONNECTIONS_OPTION: Final = 500_000
"""Upper bound of `--max-connections` (two descriptors each: within Linux's default fs.nr_open)."""
GC_YOUNG_THRESHOLD: Final = 10_000
"""Net allocations between routerd's young garbage collections (Python's default: 700). Each
collection walks every young object still alive, and what survives it is walked again by the
older generations' collections: the objects of the connections in flight, and the event log's
events on their way to its writer, which at the default made the collections tens of times more
frequent (measured with the event log on: 2-5 µs of the routing thread per short connection,
docs/event-log.md). Garbage cycles wait a little longer: at most this many objects."""


def _fail(prog: str, message: str, status: int = EXIT_FAILURE) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def _load(prog: str, path: str) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        _fail(prog, str(exc), EXIT_USAGE)


def _load_routerd(path: str, event_log: str | None) -> Config:
    """routerd's configuration: the file with `--event-log DIR` applied, and at least one acceptor
    that names a router (at start and at each reload).

    Raises:
        ConfigError: a bad file, worded as the loader words it.
    """
    config = _with_event_log(load_config(path), event_log)
    if not config.acceptors:
        raise ConfigError(config.source, None, "", "no <acceptor> names a router (URL parameter router=NAME)")
    return config


# -- routerd ----------------------------------------------------------------------------------


def _routerd_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="routerd",
        description="Run the connection router. SIGTERM or SIGINT drains and stops it (clients moved "
        "paced over the grace period); SIGHUP (or routerctl reload) reads the configuration file again "
        "and applies it in place: routers, pools, filters, policies, caches, connectors and acceptors "
        "change, established connections stay (only those whose target left the file are moved); a "
        "bad file changes nothing and is logged in one line. The command-line options stay as they were.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"routerd {package_version()}",
        help="print the version and exit",
    )
    parser.add_argument(
        "--config", required=True, help="broker.xml-style configuration file (read again on SIGHUP)"
    )
    parser.add_argument(
        "--admin",
        type=parse_admin_address,
        default=DEFAULT_ADMIN,
        metavar="ADDRESS",
        help=f"admin API and /metrics listener: {ADMIN_SYNTAX} (default 127.0.0.1:9180)",
    )
    parser.add_argument("--no-admin", action="store_true", help="do not open the admin listener")
    parser.add_argument(
        "--admin-tokens",
        metavar="FILE",
        help="the admin API's tokens, lines NAME LEVEL TOKEN (LEVEL user, operator or admin): every "
        "request but GET /healthz and /readyz then needs 'Authorization: Bearer TOKEN'; required "
        "when --admin is not a loopback address",
    )
    parser.add_argument(
        "--admin-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients use for the admin API (its Host header); IP literals and "
        "localhost are always accepted (repeatable)",
    )
    parser.add_argument(
        "--grace-period",
        type=seconds(zero=True),
        default=10.0,
        metavar="SECONDS",
        help="seconds over which open connections are moved (clients told to go in their "
        "protocol) after SIGTERM, then the rest closed (default 10)",
    )
    parser.add_argument(
        "--max-connections",
        type=integer(1, MAX_CONNECTIONS_OPTION),
        default=None,
        metavar="N",
        help="client connections served at once (HAProxy's maxconn); routerd raises its descriptor "
        "limit to fit them, the hard limit too when it may (root or CAP_SYS_RESOURCE); default: "
        "what the hard limit allows",
    )
    parser.add_argument(
        "--event-log",
        metavar="DIR",
        help="write the routing event log (one line per decision and per closed connection) into "
        "DIR; the configuration's <event-log> settings apply, with this directory (docs/pipeline.md)",
    )
    for option in _feature_options():
        if option.metavar is None:
            parser.add_argument(option.flag, dest=option.name, action="store_true", help=option.help)
        else:
            parser.add_argument(option.flag, dest=option.name, metavar=option.metavar, help=option.help)
    parser.add_argument(
        "--data-path",
        choices=DATA_PATHS,
        default=default_data_path(),
        help="what carries plain-TCP acceptors: native (the C core, the default when it is built) or "
        f"python (the Python fast path); default from ${DATA_PATH_ENV}, else native when built",
    )
    add_process_arguments(parser)
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO"
    )
    return parser


def _feature_options() -> list[Option]:
    """The features' routerd options (router/feature.py `Option`), in `FEATURES` order."""
    return [option for feature in FEATURES for option in feature.options]


def _with_event_log(config: Config, directory: str | None) -> Config:
    """The configuration with `--event-log DIR` applied."""
    if directory is None:
        return config
    if not directory.strip():
        _fail("routerd", "--event-log: expected a directory, got ''", EXIT_USAGE)
    if config.event_log is None:
        return dataclasses.replace(config, event_log=EventLogConfig(directory=directory))
    return dataclasses.replace(config, event_log=dataclasses.replace(config.event_log, directory=directory))


async def _run_routerd(
    config: Config, args: argparse.Namespace, access: AdminAccess, processes: Processes
) -> None:
    shutdown = trio.Event()
    log = logging.getLogger("routerd")
    # SIGHUPs wait here while a reload runs; reloading once more covers any number of them.
    request_reload, reloads = trio.open_memory_channel[None](1)
    async with trio.open_nursery() as nursery:

        async def watch_signals(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                task_status.started()  # the handlers are in place before the listeners open
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP received: reloading %s", config.source)
                        with contextlib.suppress(trio.WouldBlock):  # one is waiting already
                            request_reload.send_nowait(None)
                        continue
                    if shutdown.is_set():
                        if processes.worker:  # systemd signals the whole cgroup, its supervisor again
                            name = signal.Signals(signum).name
                            log.info("worker %d: %s received, stopping already", processes.index, name)
                            continue
                        log.warning("second signal: stopping now")
                        nursery.cancel_scope.cancel()
                        return
                    log.info("%s received", signal.Signals(signum).name)
                    shutdown.set()

        async def flush_log_summaries() -> None:
            while True:
                await trio.sleep(LOG_INTERVAL_S)
                flush_log_limits()

        async def flush_conn_lines() -> None:
            while True:
                await trio.sleep(conn_lines.FLUSH_INTERVAL_S)
                conn_lines.flush()

        await nursery.start(watch_signals)
        nursery.start_soon(flush_log_summaries)
        nursery.start_soon(flush_conn_lines)
        await serve_router(
            config,
            admin=None if args.no_admin else args.admin,
            grace_s=args.grace_period,
            shutdown=shutdown,
            max_connections=args.max_connections,
            options={o.name: o.value(getattr(args, o.name), config) for o in _feature_options()},
            admin_access=access,
            load=functools.partial(_load_routerd, args.config, args.event_log),
            reloads=reloads,
            data_path=args.data_path,
            lean=True,
            processes=processes,
        )
        nursery.cancel_scope.cancel()


def main_routerd(argv: Sequence[str] | None = None) -> int:
    """`routerd`: load the configuration and serve until SIGTERM; 0 after a clean drain."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _routerd_parser().parse_args(argv)
    try:
        processes = processes_of(args, argv)
    except ValueError as exc:
        _fail("routerd", str(exc), EXIT_USAGE)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_limits()  # repeated WARNING-and-above lines are rate-limited (router/logs.py)
    conn_lines.install()  # the per-connection INFO lines go through a buffer (router/conn_lines.py)
    _check_data_path(args.data_path)
    try:
        config = _load_routerd(args.config, args.event_log)
    except ConfigError as exc:
        _fail("routerd", str(exc), EXIT_USAGE)
    access = _admin_access(args)
    _raise_descriptor_limit(args.max_connections)
    # What exists now (modules, the configuration) lives as long as the process: keep it out of
    # the garbage collector's full passes, which otherwise walk all of it again and again while
    # connections come and go (measured: ~12k instructions less per short fast-path connection).
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    try:
        trio.run(_run_routerd, config, args, access, processes)
    except (OSError, StartupError, BaseExceptionGroup) as exc:
        error = only_error(exc, (OSError, StartupError))
        if error is None:
            raise
        if isinstance(error, OSError):
            _fail("routerd", error.strerror or describe_oserror(error))
        _fail("routerd", str(error), EXIT_USAGE)
    return 0


def _check_data_path(data_path: str) -> None:
    """Exit 2 on a `--data-path` routerd cannot serve with (argparse checks the option's own value;
    one from `$ROUTERD_DATA_PATH` comes here unchecked)."""
    problem = data_path_problem(data_path)
    if problem is not None:
        option = "--data-path" if data_path in DATA_PATHS else f"--data-path (${DATA_PATH_ENV})"
        _fail("routerd", f"{option} {problem}", EXIT_USAGE)


def _admin_access(args: argparse.Namespace) -> AdminAccess:
    """The admin API's rules from `--admin-tokens` and `--admin-host` (exit 2 on a bad file, or
    on a non-loopback `--admin` without tokens)."""
    tokens: tuple[Token, ...] = ()
    if args.admin_tokens is not None:
        try:
            with open(args.admin_tokens, encoding="utf-8") as file:
                tokens = parse_tokens(file.read(MAX_TOKENS_BYTES), args.admin_tokens)
            mode = os.stat(args.admin_tokens).st_mode
        except OSError as exc:
            _fail("routerd", f"--admin-tokens {args.admin_tokens!r}: {exc.strerror}", EXIT_USAGE)
        except (ValueError, UnicodeDecodeError) as exc:
            _fail("routerd", f"--admin-tokens: {exc}", EXIT_USAGE)
        if mode & 0o077:
            logging.getLogger("routerd").warning(
                "--admin-tokens %s can be read by other users (mode %o): chmod 600 it",
                args.admin_tokens,
                mode & 0o777,
            )
    if not args.no_admin and not is_loopback(args.admin[0]):
        if not tokens:
            _fail(
                "routerd",
                f"--admin {args.admin[0]}:{args.admin[1]} is reachable from other hosts: give "
                "--admin-tokens FILE (anyone reaching it could drain brokers and read the cache), "
                "or listen on loopback",
                EXIT_USAGE,
            )
        logging.getLogger("routerd").warning(
            "the admin API on %s:%d is reachable from other hosts; every request but GET /healthz "
            "and /readyz needs one of the %d token(s)",
            args.admin[0],
            args.admin[1],
            len(tokens),
        )
    return AdminAccess(tokens=tokens, hosts=hosts_of(args.admin_host))


def _raise_descriptor_limit(max_connections: int | None) -> None:
    """Raise RLIMIT_NOFILE as HAProxy and nginx do: every client connection costs descriptors, and
    the server derives its client budget from this limit (router/core/admission.py), logging it.
    The soft limit goes to the hard one; with `--max-connections` both go as high as those
    connections need when the process may raise the hard limit (root, CAP_SYS_RESOURCE)."""
    log = logging.getLogger("routerd")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if max_connections is None else max(hard, descriptors_for(max_connections))
    if wanted > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        except (ValueError, OSError) as exc:  # not privileged, or over the kernel's fs.nr_open
            log.warning(
                "--max-connections %d needs %d descriptors; the hard limit %d stays (raising it "
                "needs root or CAP_SYS_RESOURCE: %s), so fewer connections are served",
                max_connections,
                wanted,
                hard,
                exc,
            )
            wanted = hard
        else:
            log.info("descriptor limit raised from %d to %d (soft and hard)", soft, wanted)
            return
    if soft == wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        log.warning("descriptor limit stays at %d: raising it to %d failed: %s", soft, wanted, exc)
        return
    log.info("descriptor limit raised from %d to %d", soft, wanted)


def routerd_main() -> None:
    """Console-script wrapper of `main_routerd`."""
    raise SystemExit(main_routerd())
