"""Entry points: `routerd` runs the router; `routerctl` dry-runs the engine or talks to a router.

    routerd --config FILE [--admin ADDRESS | --no-admin] [--grace-period S] [--max-connections N]
                    [--admin-tokens FILE] [--admin-host NAME]... [--event-log DIR]
                    [--state-file FILE] [--discard-unreadable-cache] [--log-level L] [--version]
    routerctl route --config FILE --router NAME [--ready all|none|NODE,...] [--cache FILE] KEY...
    routerctl route --config FILE --router NAME [--client-id X] [--user U] [--sni H]
                    [--source-ip IP] [--role R]...
    routerctl target [--admin ADDRESS] [--dry-run] ROUTER KEY
    routerctl status [--admin ADDRESS] [ROUTER]
    routerctl state [--admin ADDRESS] ROUTER NODE_ID [ready|drain|maint]
    routerctl wait [--admin ADDRESS] [--timeout S] [--interval S] target ROUTER NODE_ID STATE
    routerctl wait [--admin ADDRESS] [--timeout S] [--interval S] router ROUTER ready|not-ready
    routerctl cache [--admin ADDRESS] list ROUTER [--prefix P] [--node-id N] [--after K] [--limit N] [--all]
    routerctl cache [--admin ADDRESS] get ROUTER KEY
    routerctl cache [--admin ADDRESS] evict ROUTER (--key K | --node-id N | --all)
    routerctl cache [--admin ADDRESS] pin ROUTER KEY NODE_ID [--for SECONDS]
    routerctl event-log [--admin ADDRESS] [--ring-size N]
    routerctl reload [--admin ADDRESS]
    routerctl evacuate | rebalance | shutdown ...   (router/features/moves/commands.py)
    routerctl analyze EVENTS... --out DIR [--master URL] [--conf K=V]...
    routerctl simulate EVENTS... --config NEW.xml [--router NAME] --out DIR [--master URL]
    routerctl generate-events DIR --events N [...]
    routerctl register --zookeeper HOST:PORT[,…] --path P --node-id ID --connector tcp://…
                       [--backup tcp://…] [--weight N] [--session-timeout MS]

routerd and routerctl take the admin address in the same forms (`parse_admin_address`); routerctl
also reads it from ROUTERCTL_ADMIN. Every routerctl command that prints data prints tables for
people, or JSON with `--json` (router/ctl_output.py); its exit statuses are `ExitCode`'s.

routerd drains on SIGTERM or SIGINT, moving its clients paced over the grace period; SIGHUP
reloads the configuration file (as `routerctl reload` and `POST /api/v1/reload` do): what can
change in place does, established connections stay.

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
import shlex
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Final, NoReturn, TypeVar

import trio

from keys import ConnectionFacts
from pipeline.cli import COMMANDS as PIPELINE_COMMANDS
from pipeline.cli import add_commands as add_pipeline_commands
from pipeline.cli import run as run_pipeline_command
from pools import Member, ready_node_ids
from pools.members import MAX_SESSION_TIMEOUT_MS
from router.config import ConfigError, load_config
from router.config.settings import EventLogConfig, ZooKeeperConfig
from router.core.admin_access import AdminAccess, Token, hosts_of, is_loopback, parse_tokens
from router.core.admission import descriptors_for
from router.core.engine import RoutingEngine, build_pool
from router.ctl_client import (
    ADMIN_ENV,
    ADMIN_SYNTAX,
    DEFAULT_ADMIN,
    MAX_TOKENS_BYTES,
    REQUEST_TIMEOUT_S,
    Ctl,
    admin_options,
    fields_blocks,
    parse_admin_address,
    quoted,
    request,
)
from router.ctl_output import (
    EXIT_CODES_HELP,
    CtlError,
    ExitCode,
    Fields,
    Output,
    Renderable,
    Table,
    add_json_option,
    finite_number,
    poll,
)
from router.datapath.net import describe_oserror
from router.features import commands as feature_commands
from router.logs import LOG_INTERVAL_S, flush_log_limits, install_log_limits
from router.server import StartupError, serve_router
from router.services.cache_store import CacheStore, CacheStoreError
from router.services.discovery import RegistrationError, serve_registration
from router.services.process import package_version
from router.services.state_file import default_state_file

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from router.config.settings import Config

__all__ = ["main_routerctl", "main_routerd", "routerctl_main", "routerd_main"]

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

_E = TypeVar("_E", bound=BaseException)


def _fail(prog: str, message: str, status: int = EXIT_FAILURE) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def _seconds(*, zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, >= 0 (`zero`) or > 0 (`finite_number`)."""
    return finite_number(zero=zero, unit="seconds")


def _integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a decimal integer from `low` to `high`; anything else is a usage error."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer {low}-{high}, got {text!r}")
        return value

    return parse


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
        type=_seconds(zero=True),
        default=10.0,
        metavar="SECONDS",
        help="seconds over which open connections are moved (clients told to go in their "
        "protocol) after SIGTERM, then the rest closed (default 10)",
    )
    parser.add_argument(
        "--max-connections",
        type=_integer(1, MAX_CONNECTIONS_OPTION),
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
    parser.add_argument(
        "--state-file",
        metavar="FILE",
        help="where targets' administrative states (drain, maint) are kept across restarts "
        "(default: beside the configuration file, NAME-state.json for NAME.xml)",
    )
    parser.add_argument(
        "--discard-unreadable-cache",
        action="store_true",
        help="start with an empty cache when a persisted cache's file cannot be read (damaged, not "
        "a database); the file is renamed to FILE.unreadable-TIME, not deleted",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO"
    )
    return parser


def _with_event_log(config: Config, directory: str | None) -> Config:
    """The configuration with `--event-log DIR` applied."""
    if directory is None:
        return config
    if not directory.strip():
        _fail("routerd", "--event-log: expected a directory, got ''", EXIT_USAGE)
    if config.event_log is None:
        return dataclasses.replace(config, event_log=EventLogConfig(directory=directory))
    return dataclasses.replace(config, event_log=dataclasses.replace(config.event_log, directory=directory))


async def _run_routerd(config: Config, args: argparse.Namespace, access: AdminAccess) -> None:
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
                        log.warning("second signal: stopping now")
                        nursery.cancel_scope.cancel()
                        return
                    log.info("%s received", signal.Signals(signum).name)
                    shutdown.set()

        async def flush_log_summaries() -> None:
            while True:
                await trio.sleep(LOG_INTERVAL_S)
                flush_log_limits()

        await nursery.start(watch_signals)
        nursery.start_soon(flush_log_summaries)
        await serve_router(
            config,
            admin=None if args.no_admin else args.admin,
            grace_s=args.grace_period,
            shutdown=shutdown,
            max_connections=args.max_connections,
            discard_unreadable_cache=args.discard_unreadable_cache,
            state_file=args.state_file or default_state_file(config.source),
            admin_access=access,
            load=functools.partial(_load_routerd, args.config, args.event_log),
            reloads=reloads,
        )
        nursery.cancel_scope.cancel()


def main_routerd(argv: Sequence[str] | None = None) -> int:
    """`routerd`: load the configuration and serve until SIGTERM; 0 after a clean drain."""
    args = _routerd_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_limits()  # repeated WARNING-and-above lines are rate-limited (router/logs.py)
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
        trio.run(_run_routerd, config, args, access)
    except (OSError, StartupError, BaseExceptionGroup) as exc:
        error = _only_error(exc, (OSError, StartupError))
        if error is None:
            raise
        if isinstance(error, OSError):
            _fail("routerd", error.strerror or describe_oserror(error))
        _fail("routerd", str(error), EXIT_USAGE)
    return 0


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


def _only_error(exc: BaseException, kinds: type[_E] | tuple[type[_E], ...]) -> _E | None:
    """`exc` when it is one of `kinds`, or the first one of a group holding nothing else (an error
    raised inside a nursery, such as a listener failing to bind, arrives as a group); None
    otherwise."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(kinds)
        if matched is not None and rest is None:
            return _only_error(matched.exceptions[0], kinds)
    return None


def routerd_main() -> None:
    """Console-script wrapper of `main_routerd`."""
    raise SystemExit(main_routerd())


# -- routerctl --------------------------------------------------------------------------------

WAIT_TIMEOUT_S: Final = 30.0
"""`wait --timeout` by default (as `kubectl wait`)."""
WAIT_INTERVAL_S: Final = 1.0
"""`wait --interval` by default: one small GET a second per waiting script."""
WAIT_INTERVAL_BOUNDS_S: Final = (0.1, 60.0)
"""`wait --interval` is bounded: no busy loop against the admin API, no minute-long naps."""

TARGET_CONDITIONS: Final = ("ready", "not-ready", "unknown", "absent")
"""What `wait target` waits for: a probe state of the target, or its absence from the pool."""
ROUTER_CONDITIONS: Final = ("ready", "not-ready")
"""What `wait router` waits for: its pool's quorum holds (or it has no pool), or not."""

_EPILOG: Final = f"""{EXIT_CODES_HELP}

environment:
  {ADMIN_ENV}       the admin API when --admin is not given (default 127.0.0.1:9180)
  ROUTERCTL_TOKEN_FILE  a file holding the admin API token (sent as Authorization: Bearer)
  ROUTERCTL_TOKEN       the token itself (ROUTERCTL_TOKEN_FILE is preferred)
  NO_COLOR              set: no colours, even on a terminal

docs/operations.md describes every command, its output and the admin API."""


def _wait_options(parser: argparse.ArgumentParser, *, again: bool = False) -> None:
    """`wait`'s own options, before or after what it waits for (`again`: after)."""
    low, high = WAIT_INTERVAL_BOUNDS_S
    parser.add_argument(
        "--timeout",
        type=_seconds(zero=False),
        default=argparse.SUPPRESS if again else WAIT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up after this long, exit status 5 (default {WAIT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--interval",
        type=finite_number(zero=False, unit="seconds", least=low, most=high),
        default=argparse.SUPPRESS if again else WAIT_INTERVAL_S,
        metavar="SECONDS",
        help=f"ask this often, {low:g}-{high:g} (default {WAIT_INTERVAL_S:g})",
    )


def _routerctl_parser() -> argparse.ArgumentParser:
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

    route = sub.add_parser(
        "route",
        help="dry-run the routing engine on a configuration file",
        description="The engine's decision for each KEY, or for one connection described by its "
        "facts. KEYs are treated as the management lookup treats them (from the key transform "
        "on); --client-id/--user/--sni/--source-ip/--role describe one connection and run the "
        "whole workflow. Nothing listens, nothing is probed.",
    )
    route.add_argument("--config", required=True, metavar="FILE", help="the broker.xml-style configuration")
    route.add_argument("--router", required=True, metavar="NAME", help="the connection router to ask")
    route.add_argument(
        "--ready",
        default="all",
        help="which targets count as ready: all, none, or NODE,NODE,... (default all)",
    )
    route.add_argument(
        "--round-robin-start",
        type=int,
        default=None,
        metavar="N",
        help="first round-robin position (default random, as Artemis)",
    )
    route.add_argument(
        "--cache",
        metavar="FILE",
        help="a persisted cache's file (read, never written): cached keys go where the router "
        "would send them now (its entries' targets when those are ready)",
    )
    route.add_argument(
        "--client-id", metavar="ID", help="the connection's client id (MQTT, AMQP, STOMP, OpenWire)"
    )
    route.add_argument("--user", metavar="USER", help="the connection's user name")
    route.add_argument("--sni", metavar="HOST", help="the server name of the connection's TLS hello")
    route.add_argument("--source-ip", metavar="IP", help="the connection's source address")
    route.add_argument(
        "--role", action="append", default=[], metavar="ROLE", help="a role of the user (repeat for several)"
    )
    add_json_option(route)
    route.add_argument("keys", nargs="*", metavar="KEY", help="keys to look up (instead of connection facts)")

    target = sub.add_parser(
        "target",
        help="ask a running router where a key goes (the management lookup)",
        description="The management lookup of a running router: the decision for KEY, with the "
        "router's cache and targets as they are now.",
    )
    admin_options(target)
    target.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: no cache write, no round-robin move (the plain lookup does both, as Artemis's)",
    )
    target.add_argument("router", metavar="ROUTER", help="the connection router")
    target.add_argument("key", metavar="KEY", help="the key, as after the key filter")

    status = sub.add_parser(
        "status",
        help="show a running router: process, acceptors, routers; or one router's pool",
        description="Without ROUTER: the process (pid, version, uptime, descriptors, client "
        "budget), each acceptor with its open and pending connections, and each router with its "
        "pool. With ROUTER: that router's settings and its targets.",
    )
    admin_options(status)
    status.add_argument("router", nargs="?", metavar="ROUTER", help="show this router only")

    state = sub.add_parser(
        "state",
        help="show or set a target's administrative state (ready, drain, maint)",
        description="ready: takes new connections. drain: no new connections (cached keys "
        "included), probed; open connections stay. maint: as drain, and not probed. The state is "
        "kept across restarts (routerd's --state-file). Prints the target's status.",
    )
    admin_options(state)
    state.add_argument("router", metavar="ROUTER", help="the connection router")
    state.add_argument("node_id", metavar="NODE_ID", help="the target's node id")
    state.add_argument(
        "state", nargs="?", choices=["ready", "drain", "maint"], help="the state to set (default: just show)"
    )

    reload = sub.add_parser(
        "reload",
        help="have a running routerd read its configuration file again and apply it",
        description="Ask a running routerd (POST /api/v1/reload, as SIGHUP does) to read its "
        "configuration file again and apply it in place; established connections stay, except "
        "those whose target left the file (moved, paced). Prints what changed (--json: the answer "
        "as it is). Exit status 1, with the reason on stderr, when nothing changed because the file "
        "is bad (or a port cannot be bound); 0 otherwise, also when the file is the same.",
    )
    admin_options(reload)

    wait = sub.add_parser(
        "wait",
        help="wait until a target or a router is in a state (exit 5 on timeout)",
        description="Ask the admin API every --interval seconds until the condition holds (exit "
        "0, printing what was asked), or --timeout passes (exit 5). While the admin API cannot be "
        "reached (routerd starting) it keeps asking; an unknown router is exit 1 at once.",
    )
    admin_options(wait)
    _wait_options(wait)
    what = wait.add_subparsers(
        dest="what", required=True, metavar="WHAT", title="what to wait for", help="a target or a router"
    )
    wait_target = what.add_parser(
        "target",
        help="a target's probe state, or its leaving the pool",
        description="ready, not-ready, unknown: the target's state as last probed (its "
        "administrative state aside); absent: no longer in the pool (a discovered broker that left).",
    )
    admin_options(wait_target, again=True)
    _wait_options(wait_target, again=True)
    wait_target.add_argument("router", metavar="ROUTER", help="the connection router")
    wait_target.add_argument("node_id", metavar="NODE_ID", help="the target's node id")
    wait_target.add_argument("state", choices=TARGET_CONDITIONS, help="the state to wait for")
    wait_router = what.add_parser(
        "router",
        help="a router's readiness: its pool's quorum holds",
        description="ready: the router's pool has its quorum of ready targets (a router without a "
        "pool is always ready); not-ready: it has not.",
    )
    admin_options(wait_router, again=True)
    _wait_options(wait_router, again=True)
    wait_router.add_argument("router", metavar="ROUTER", help="the connection router")
    wait_router.add_argument("state", choices=ROUTER_CONDITIONS, help="the state to wait for")

    cache = sub.add_parser(
        "cache",
        help="list, show, evict or pin a running router's cache entries",
        description="The sticky cache of a running router, through its admin API.",
    )
    admin_options(cache)
    actions = cache.add_subparsers(
        dest="action", required=True, metavar="ACTION", title="actions", help="what to do with the cache"
    )
    listing = actions.add_parser("list", help="entries in key order, a page at a time")
    admin_options(listing, again=True)
    listing.add_argument("router", metavar="ROUTER", help="the connection router")
    listing.add_argument("--prefix", default="", help="only keys that start with this")
    listing.add_argument("--node-id", help="only entries of this target")
    listing.add_argument(
        "--after", default="", metavar="KEY", help="start after this key (the previous page's next)"
    )
    listing.add_argument(
        "--limit", type=_integer(1, 10_000), default=100, metavar="N", help="entries per page (default 100)"
    )
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    show = actions.add_parser("get", help="one key's entry (exit 1 when it has none)")
    admin_options(show, again=True)
    show.add_argument("router", metavar="ROUTER", help="the connection router")
    show.add_argument("key", metavar="KEY", help="the cached key")
    evict = actions.add_parser("evict", help="evict one key, every entry of a target, or everything")
    admin_options(evict, again=True)
    evict.add_argument("router", metavar="ROUTER", help="the connection router")
    victims = evict.add_mutually_exclusive_group(required=True)
    victims.add_argument("--key", help="evict this key")
    victims.add_argument("--node-id", help="evict every entry (and pin) of this target")
    victims.add_argument("--all", action="store_true", help="evict everything")
    pin = actions.add_parser(
        "pin", help="send a key to a target whatever the policy says (while that target is ready)"
    )
    admin_options(pin, again=True)
    pin.add_argument("router", metavar="ROUTER", help="the connection router")
    pin.add_argument("key", metavar="KEY", help="the key to pin")
    pin.add_argument("node_id", metavar="NODE_ID", help="the target it goes to")
    pin.add_argument(
        "--for",
        dest="duration",
        type=_seconds(zero=False),
        metavar="SECONDS",
        help="how long the pin holds (default: until evicted)",
    )

    add_pipeline_commands(sub)  # analyze, simulate, generate-events (pipeline/, docs/pipeline.md)
    for command in feature_commands():  # router/features/: evacuate, rebalance, shutdown, ...
        feature_parser = sub.add_parser(
            command.name, help=command.help, description=command.description, epilog=command.epilog
        )
        if command.admin:
            admin_options(feature_parser)
        command.arguments(feature_parser)

    event_log = sub.add_parser(
        "event-log", help="show a running router's event log (ring, counts), or resize its ring"
    )
    admin_options(event_log)
    event_log.add_argument(
        "--ring-size",
        type=_integer(1, 2**31 - 1),
        metavar="N",
        help="set the ring size (takes effect as the ring drains; nothing in it is lost)",
    )

    register = sub.add_parser(
        "register",
        help="register a broker in a ZooKeeper discovery group until stopped",
        description="Create the broker's ephemeral member znode PATH/NODE-ID and keep it until "
        "SIGTERM or SIGINT, then delete it and exit 0. Routers whose pool uses the discovery "
        "group add the broker while it is registered (and ready), and remove it when the znode "
        "goes: at once on a clean stop, after the session timeout if this process dies.",
    )
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
        type=_integer(1, MAX_SESSION_TIMEOUT_MS),
        default=10_000,
        metavar="MS",
        help="ZooKeeper session timeout: how long the member outlives this process if it dies "
        "(default 10000; the server clamps it to 2-20 times its tickTime)",
    )
    register.add_argument(
        "--connect-timeout",
        type=_seconds(zero=False),
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for ZooKeeper at start (default 10)",
    )
    return parser


# -- routerctl: the dry run -------------------------------------------------------------------


def _dry_run(args: argparse.Namespace, out: Output) -> int:
    config = _load("routerctl", args.config)
    try:
        router = config.router(args.router)
    except KeyError:
        names = ", ".join(r.name for r in config.routers) or "none"
        _fail(
            "routerctl", f"no connection router {args.router!r} in {config.source} (has: {names})", EXIT_USAGE
        )
    has_facts = any(v is not None for v in (args.client_id, args.user, args.sni, args.source_ip))
    has_facts = has_facts or bool(args.role)
    if has_facts == bool(args.keys):
        _fail(
            "routerctl",
            "give either KEY... or connection facts (--client-id, --user, --sni, "
            "--source-ip, --role), not both and not neither",
            EXIT_USAGE,
        )
    pool, local = build_pool(config, router)
    if pool is not None:
        node_ids = [t.node_id for t in pool.targets]
        if args.ready not in ("all", "none"):
            unknown = sorted({n.strip() for n in args.ready.split(",") if n.strip()} - set(node_ids))
            if unknown:
                _fail(
                    "routerctl",
                    f"--ready names unknown node ids {unknown} (pool of {router.name!r} has {node_ids})",
                    EXIT_USAGE,
                )
        ready = ready_node_ids(pool, args.ready)
        for node_id in node_ids:
            pool.record_check(node_id, node_id in ready)
    engine = RoutingEngine(router, pool, local, round_robin_start=args.round_robin_start)
    now = time.time()  # the persisted cache's times are wall-clock times
    if args.cache is not None:
        _load_cache(engine, args.cache, now)
    if has_facts:
        try:
            facts = ConnectionFacts(
                client_id=args.client_id,
                user_name=args.user,
                sni_host=args.sni,
                source_ip=args.source_ip,
                roles=tuple(args.role),
            )
        except ValueError as exc:
            _fail("routerctl", f"--source-ip: {exc}", EXIT_USAGE)
        decisions = [engine.route(facts, now)]
    else:
        decisions = [engine.lookup(key, now) for key in args.keys]
    out.emit_lines([d.to_json() for d in decisions], _decisions_blocks)
    return ExitCode.OK


def _load_cache(engine: RoutingEngine, path: str, now: float) -> None:
    """`route --cache FILE`: the engine's cache holds the file's live entries (read-only)."""
    if engine.cache is None:
        _fail("routerctl", f"--cache: connection router {engine.name!r} has no <cache>", EXIT_USAGE)
    try:
        store = CacheStore.open(path, read_only=True)
        try:
            rows = store.load(now, engine.cache.config.timeout_ms)
        finally:
            store.close()
    except CacheStoreError as exc:
        _fail("routerctl", f"--cache: {exc}")
    engine.cache.restore(rows, now)


# -- routerctl: the admin API -----------------------------------------------------------------


def _target_command(args: argparse.Namespace, out: Output) -> int:
    query = {"key": args.key, **({"dry-run": "true"} if args.dry_run else {})}
    decision = request(
        args, quoted("api", "v1", "routers", args.router, "target") + "?" + urllib.parse.urlencode(query)
    )
    out.emit_lines([decision], _decisions_blocks)
    return ExitCode.OK


def _status_command(args: argparse.Namespace, out: Output) -> int:
    if args.router is not None:
        out.emit(request(args, quoted("api", "v1", "routers", args.router)), _router_blocks)
        return ExitCode.OK
    document = request(args, "/api/v1/status")
    routers = request(args, "/api/v1/routers")
    assert isinstance(document, dict)
    out.emit({**document, "routers": routers}, _status_blocks)
    return ExitCode.OK


def _state_command(args: argparse.Namespace, out: Output) -> int:
    path = quoted("api", "v1", "routers", args.router, "targets", args.node_id)
    if args.state is None:
        target = request(args, path)
    else:
        target = request(args, path, method="PUT", body={"admin_state": args.state})
    out.emit(target, lambda t: [_targets_table([t])])
    return ExitCode.OK


def _event_log_command(args: argparse.Namespace, out: Output) -> int:
    if args.ring_size is None:
        document = request(args, "/api/v1/event-log")
    else:
        document = request(args, "/api/v1/event-log", method="PUT", body={"ring_size": args.ring_size})
    out.emit(document, fields_blocks)
    return ExitCode.OK


def _cache_command(args: argparse.Namespace, out: Output) -> int:
    base = quoted("api", "v1", "routers", args.router, "cache")
    if args.action == "get":
        entry = request(args, base + "?" + urllib.parse.urlencode({"key": args.key}))
        out.emit(entry, lambda e: [_cache_table([e])])
        return ExitCode.OK
    if args.action == "evict":
        if args.node_id is not None and not args.node_id:
            raise CtlError("cache evict: --node-id must not be empty", ExitCode.USAGE)
        what = {"all": "true"} if args.all else {"key": args.key} if args.key is not None else {}
        selector = urllib.parse.urlencode(what or {"node_id": args.node_id})
        evicted = request(args, f"{base}?{selector}", method="DELETE")
        out.emit(evicted, lambda d: [_evicted_line(_field(d, "evicted"))])
        return ExitCode.OK
    if args.action == "pin":
        pin = {"key": args.key, "node_id": args.node_id, "duration_s": args.duration}
        entry = request(args, base, method="PUT", body=pin)
        out.emit(entry, lambda e: [_cache_table([e])])
        return ExitCode.OK
    after, entries = args.after, []
    while True:
        query: dict[str, str | int] = {"prefix": args.prefix, "after": after, "limit": args.limit}
        if args.node_id is not None:
            query["node_id"] = args.node_id
        page = request(args, f"{base}?{urllib.parse.urlencode(query)}")
        if not isinstance(page, dict):
            raise CtlError(f"cache list: the admin API answered {page!r}", ExitCode.UNREACHABLE)
        if not args.all:
            out.emit(page, _cache_page_blocks)
            return ExitCode.OK
        if out.json:  # one line per entry as each page arrives
            out.emit_lines(page["entries"], _cache_rows_blocks)
        else:
            entries.extend(page["entries"])
        if page["next"] is None:
            if not out.json:
                out.blocks(_cache_rows_blocks(entries))
            return ExitCode.OK
        after = page["next"]


def _wait_command(args: argparse.Namespace, out: Output) -> int:
    """Poll the router's document until the condition holds (module docstring of ctl_output for
    the exit codes)."""
    router_path = quoted("api", "v1", "routers", args.router)
    node_id: str | None = getattr(args, "node_id", None)
    subject = (
        f"router {args.router!r}" if node_id is None else f"target {node_id!r} of router {args.router!r}"
    )
    seen = "nothing yet"

    def ask(left: float) -> tuple[object] | None:
        nonlocal seen
        try:
            document = request(args, router_path, timeout_s=max(0.1, min(REQUEST_TIMEOUT_S, left)))
        except CtlError as exc:
            if exc.code is not ExitCode.UNREACHABLE:
                raise
            seen = exc.message
            return None
        held, seen, shown = _condition(document, node_id, args.state)
        return (shown,) if held else None

    found = poll(ask, timeout_s=args.timeout, interval_s=args.interval)
    if found is None:
        raise CtlError(
            f"wait: {subject} did not become {args.state} within {args.timeout:g} s (last: {seen})",
            ExitCode.TIMED_OUT,
        )
    out.emit(found[0], _router_blocks if node_id is None else (lambda t: [_targets_table([t])]))
    return ExitCode.OK


def _condition(document: object, node_id: str | None, state: str) -> tuple[bool, str, object]:
    """Whether a router document shows `state` (for the router, or for its target `node_id`):
    (holds, what it shows in words, the document to print)."""
    if not isinstance(document, dict):
        return False, f"an answer that is not a router: {document!r}", document
    pool = document.get("pool")
    if node_id is None:
        ready = pool is None or bool(pool.get("active"))
        return ready == (state == "ready"), "ready" if ready else "not-ready (no quorum)", document
    targets = [] if pool is None else [t for t in pool.get("targets", []) if t.get("node_id") == node_id]
    if not targets:
        return state == "absent", "absent from the pool", {"node_id": node_id, "in_pool": False}
    target = targets[0]
    return target.get("state") == state, str(target.get("state")), target


# -- routerctl: what people see ---------------------------------------------------------------


def _field(document: object, name: str) -> object:
    return document.get(name) if isinstance(document, dict) else None


def _items(document: object, name: str) -> list[object]:
    """A list field of a document ([] when it has none)."""
    value = _field(document, name)
    return value if isinstance(value, list) else []


def _duration(seconds: object) -> str:
    """12.3 s, 4m05s, 3h02m, 2d03h."""
    if not isinstance(seconds, (int, float)):
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def _of(used: object, total: object) -> str:
    return f"{_text_of(used)} of {_text_of(total)}"


def _text_of(value: object) -> str:
    return "unlimited" if value is None else str(value)


def _decisions_blocks(decisions: list[object]) -> list[Renderable]:
    table = Table(["key", "status", "node_id", "connector"])
    for d in decisions:
        node_id = _field(d, "node_id")
        if node_id not in (None, "local") and _field(d, "local"):
            node_id = f"{node_id} (local)"
        table.add(_field(d, "key"), _field(d, "status"), node_id, _field(d, "connector"))
    return [table]


def _targets_table(targets: Sequence[object]) -> Table:
    table = Table(["node_id", "state", "admin_state", "connections", "connector"])
    for t in targets:
        if _field(t, "in_pool") is False:
            table.add(_field(t, "node_id"), "absent", _field(t, "admin_state"), None, None)
            continue
        ejected = _field(t, "operational_state") == "ejected"  # ready, but passive health took it out
        table.add(
            _field(t, "node_id"),
            "ejected" if ejected else _field(t, "state"),
            _field(t, "admin_state"),
            _field(t, "connections"),
            _field(t, "connector"),
        )
    return table


def _router_blocks(router: object) -> list[Renderable]:
    pool = _field(router, "pool")
    fields = Fields()
    for name in ("name", "key_type", "key_filter", "local_target_filter", "policy", "cache_entries"):
        fields.add(name.replace("_", " "), _field(router, name))
    if not isinstance(pool, dict):
        fields.add("pool", None)
        return [fields]
    fields.add("pool", f"{pool.get('kind')}, quorum {pool.get('quorum_size')}")
    fields.add("pool state", "active" if pool.get("active") else "inactive")
    targets = pool.get("targets", [])
    blocks: list[Renderable] = [fields, _targets_table(targets)]
    members = Table(["member_of", "connector", "state", "active"])
    for t in targets:
        for m in t.get("members", ()):
            members.add(t.get("node_id"), m.get("connector"), m.get("state"), m.get("active"))
    if members.rows:
        blocks.append(members)
    return blocks


def _status_blocks(document: object) -> list[Renderable]:
    process = _field(document, "process")
    descriptors = _field(process, "descriptors")
    clients = _field(process, "client_connections")
    fields = Fields()
    fields.add("pid", _field(process, "pid"))
    fields.add("version", _field(process, "version"))
    fields.add("uptime", _duration(_field(process, "uptime_s")))
    fields.add("descriptors", _of(_field(descriptors, "open"), _field(descriptors, "limit")))
    fields.add("client connections", _of(_field(clients, "open"), _field(clients, "budget")))
    state_file = _field(document, "state_file")
    if state_file is not None:
        path, error = _field(state_file, "path"), _field(state_file, "error")
        if _field(state_file, "persisted"):
            fields.add("state file", f"{path} (drain/maint states kept)")
        else:
            why = "a write is under way" if error is None else f"{error}; retried"
            lost = "a restart would lose drain/maint states"
            fields.add("state file", f"{path}: NOT PERSISTED, {lost} ({why})")
    acceptors = Table(["acceptor", "router", "address", "mode", "path", "open", "pending", "limit"])
    for a in _items(document, "acceptors"):
        host = str(_field(a, "host"))
        address = f"[{host}]:{_field(a, 'port')}" if ":" in host else f"{host}:{_field(a, 'port')}"
        acceptors.add(
            _field(a, "name"),
            _field(a, "router"),
            address,
            _field(a, "mode"),
            _field(a, "data_path"),
            _field(a, "open"),
            _field(a, "pending"),
            _field(a, "connections_allowed"),
        )
    routers = Table(["router", "key_type", "policy", "pool", "ready", "cache"])
    for r in _items(document, "routers"):
        pool = _field(r, "pool")
        targets = _items(pool, "targets")
        ready = sum(_field(t, "state") == "ready" for t in targets)
        routers.add(
            _field(r, "name"),
            _field(r, "key_type"),
            _field(r, "policy"),
            None if pool is None else ("active" if _field(pool, "active") else "inactive"),
            None if pool is None else f"{ready}/{len(targets)}",
            _field(r, "cache_entries"),
        )
    blocks: list[Renderable] = [fields, acceptors, routers]
    sessions = _items(document, "zookeeper")
    if sessions:  # only where a router uses ZooKeeper
        zookeeper = Table(["router", "zookeeper", "state", "since", "at"])
        for z in sessions:
            at = f"{_field(z, 'connect')}{_field(z, 'path')}"
            zookeeper.add(_field(z, "router"), _field(z, "use"), _field(z, "state"), _field(z, "since"), at)
        blocks.append(zookeeper)
    return blocks


def _cache_table(entries: Sequence[object]) -> Table:
    table = Table(["key", "node_id", "idle_s", "expires_in_s", "pinned"])
    for e in entries:
        table.add(
            _field(e, "key"),
            _field(e, "node_id"),
            _field(e, "idle_s"),
            _field(e, "expires_in_s"),
            _field(e, "pinned"),
        )
    return table


def _cache_page_blocks(page: object) -> list[Renderable]:
    blocks: list[Renderable] = [_cache_table(_items(page, "entries"))]
    following = _field(page, "next")
    if following is not None:
        blocks.append(f"more: --after {shlex.quote(str(following))}")
    return blocks


def _cache_rows_blocks(entries: list[object]) -> list[Renderable]:
    return [_cache_table(entries)]


def _evicted_line(count: object) -> str:
    return f"evicted {count} {'entry' if count == 1 else 'entries'}"


# -- routerctl: register ----------------------------------------------------------------------


def _register(args: argparse.Namespace, out: Output) -> int:
    try:
        zookeeper = ZooKeeperConfig(
            connect=args.zookeeper, path=args.path, session_timeout_ms=args.session_timeout
        )
        member = Member.from_fields(
            node_id=args.node_id, connector=args.connector, backup=args.backup, weight=args.weight
        )
    except ValueError as exc:
        _fail("routerctl", f"register: {exc}", EXIT_USAGE)
    try:
        trio.run(_run_register, zookeeper, member, args.connect_timeout)
    except (RegistrationError, BaseExceptionGroup) as exc:
        error = _only_error(exc, RegistrationError)
        if error is None:
            raise
        _fail("routerctl", f"register: {error}")
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


def _reload(args: argparse.Namespace, out: Output) -> int:
    """`routerctl reload`: what changed in one line (the JSON answer with --json)."""
    answer = request(args, "/api/v1/reload", method="POST")
    assert isinstance(answer, dict)
    out.emit(answer, lambda a: [f"reloaded: {a.get('summary', '') if isinstance(a, dict) else ''}"])
    return ExitCode.OK


_COMMANDS: Final[dict[str, Callable[[argparse.Namespace, Output], int]]] = {
    "route": _dry_run,
    "target": _target_command,
    "status": _status_command,
    "state": _state_command,
    "wait": _wait_command,
    "cache": _cache_command,
    "event-log": _event_log_command,
    "register": _register,
    "reload": _reload,
}
"""routerctl's own commands (the features' come from router/features/, the pipeline's from
pipeline.cli)."""


def main_routerctl(argv: Sequence[str] | None = None) -> int:
    """`routerctl`: see the module docstring; the exit status (`ExitCode`)."""
    args = _routerctl_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.command == "register" else logging.WARNING,
        stream=sys.stderr,
        format="routerctl: %(levelname)s: %(message)s",
    )
    if args.command in PIPELINE_COMMANDS:
        return run_pipeline_command(args)
    out = Output(json_output=getattr(args, "json", False))
    features = {command.name: command for command in feature_commands()}
    try:
        if args.command in features:
            return features[args.command].run(args, Ctl(args, out))
        return _COMMANDS[args.command](args, out)
    except CtlError as exc:
        _fail("routerctl", exc.message, exc.code)


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
        status = EXIT_FAILURE
    raise SystemExit(status)
