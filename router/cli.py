"""Entry points: `routerd` runs the router; `routerctl` dry-runs the engine or talks to a router.

    routerd --config FILE [--admin HOST:PORT | --no-admin] [--grace-period S] [--max-connections N]
                    [--admin-tokens FILE] [--admin-host NAME]... [--event-log DIR]
                    [--state-file FILE] [--discard-unreadable-cache] [--log-level L]
    routerctl route --config FILE --router NAME [--ready all|none|NODE,...] [--cache FILE] KEY...
    routerctl route --config FILE --router NAME [--client-id X] [--user U] [--sni H]
                    [--source-ip IP] [--role R]...
    routerctl target --admin URL [--dry-run] ROUTER KEY
    routerctl status --admin URL [ROUTER]
    routerctl state --admin URL ROUTER NODE_ID [ready|drain|maint]
    routerctl cache --admin URL list ROUTER [--prefix P] [--node-id N] [--after K] [--limit N] [--all]
    routerctl cache --admin URL get ROUTER KEY
    routerctl cache --admin URL evict ROUTER (--key K | --node-id N | --all)
    routerctl cache --admin URL pin ROUTER KEY NODE_ID [--for SECONDS]
    routerctl event-log --admin URL [--ring-size N]
    routerctl evacuate --admin URL ROUTER NODE_ID [--rate R] [--order oldest|random] [--wait]
    routerctl rebalance --admin URL ROUTER [--rate R] [--band B] [--wait]
    routerctl shutdown --admin URL [--wait]
    routerctl analyze EVENTS... --out DIR [--master URL] [--conf K=V]...
    routerctl simulate EVENTS... --config NEW.xml [--router NAME] --out DIR [--master URL]
    routerctl generate-events DIR --events N [...]
    routerctl register --zookeeper HOST:PORT[,…] --path P --node-id ID --connector tcp://…
                       [--backup tcp://…] [--weight N] [--session-timeout MS]

    routerctl reload --admin URL

routerd drains on SIGTERM or SIGINT; SIGHUP reloads the configuration file (as `routerctl reload`
and `POST /api/v1/reload` do): what can change in place does, established connections stay.

Errors a person can fix (bad configuration, a bad option value, a port in use, a router that is
not running) are one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import logging
import math
import os
import resource
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
from router.ctl_moves import COMMANDS as MOVE_COMMANDS
from router.ctl_moves import add_commands as add_move_commands
from router.ctl_moves import run_command as run_move_command
from router.datapath.net import describe_oserror
from router.logs import LOG_INTERVAL_S, flush_log_limits, install_log_limits
from router.server import StartupError, serve_router
from router.services.cache_store import CacheStore, CacheStoreError
from router.services.discovery import RegistrationError, serve_registration
from router.services.state_file import default_state_file

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from router.config.settings import Config

__all__ = ["main_routerctl", "main_routerd", "routerctl_main", "routerd_main"]

EXIT_USAGE = 2
EXIT_FAILURE = 1


MAX_CONNECTIONS_OPTION: Final = 500_000
"""Upper bound of `--max-connections` (two descriptors each: within Linux's default fs.nr_open)."""

_E = TypeVar("_E", bound=BaseException)


def _fail(prog: str, message: str, status: int = EXIT_FAILURE) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _seconds(*, zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, >= 0 (`zero`) or > 0; anything else
    (`nan`, `inf`, `-1`) is a usage error, exit status 2."""
    rule = ">= 0" if zero else "> 0"

    def parse(text: str) -> float:
        try:
            value: float | None = float(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds {rule}, got {text!r}")
        return value

    return parse


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
        description="Run the connection router. SIGTERM or SIGINT drains and stops it; SIGHUP (or "
        "routerctl reload) reads the configuration file again and applies it in place: routers, "
        "pools, filters, policies, caches, connectors and acceptors change, established "
        "connections stay (only those whose target left the file are closed); a bad file changes "
        "nothing and is logged in one line. The command-line options stay as they were.",
    )
    parser.add_argument(
        "--config", required=True, help="broker.xml-style configuration file (read again on SIGHUP)"
    )
    parser.add_argument(
        "--admin",
        type=_host_port,
        default=("127.0.0.1", 9180),
        help="admin API and /metrics listener (default 127.0.0.1:9180)",
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


def _routerctl_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="routerctl", description="Operate a connection router.")
    sub = parser.add_subparsers(dest="command", required=True)

    route = sub.add_parser(
        "route",
        help="dry-run the routing engine on a configuration file",
        description="Print the engine's decision as one JSON object per line. "
        "KEYs are treated as the management lookup treats them (from the key "
        "transform on); --client-id/--user/--sni/--source-ip/--role describe one "
        "connection and run the whole workflow.",
    )
    route.add_argument("--config", required=True)
    route.add_argument("--router", required=True)
    route.add_argument(
        "--ready",
        default="all",
        help="which targets count as ready: all, none, or NODE,NODE,... (default all)",
    )
    route.add_argument(
        "--round-robin-start",
        type=int,
        default=None,
        help="first round-robin position (default random, as Artemis)",
    )
    route.add_argument(
        "--cache",
        metavar="FILE",
        help="a persisted cache's file (read, never written): cached keys go where the router "
        "would send them now (its entries' targets when those are ready)",
    )
    route.add_argument("--client-id")
    route.add_argument("--user")
    route.add_argument("--sni")
    route.add_argument("--source-ip")
    route.add_argument("--role", action="append", default=[], help="repeat for several roles")
    route.add_argument("keys", nargs="*", metavar="KEY")

    target = sub.add_parser("target", help="ask a running router's management API for a target")
    target.add_argument("--admin", default="http://127.0.0.1:9180")
    target.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: no cache write, no round-robin move (the plain lookup does both, as Artemis's)",
    )
    target.add_argument("router")
    target.add_argument("key")

    cache = sub.add_parser(
        "cache",
        help="list, show, evict or pin a running router's cache entries",
        description="The sticky cache of a running router, through its admin API. Output: JSON.",
    )
    cache.add_argument("--admin", default="http://127.0.0.1:9180")
    actions = cache.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="entries in key order, a page at a time")
    listing.add_argument("router")
    listing.add_argument("--prefix", default="", help="only keys that start with this")
    listing.add_argument("--node-id", help="only entries of this target")
    listing.add_argument(
        "--after", default="", metavar="KEY", help="start after this key (the previous page's next)"
    )
    listing.add_argument(
        "--limit", type=_integer(1, 10_000), default=100, help="entries per page (default 100)"
    )
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    show = actions.add_parser("get", help="one key's entry (exit 1 when it has none)")
    show.add_argument("router")
    show.add_argument("key")
    evict = actions.add_parser("evict", help="evict one key, every entry of a target, or everything")
    evict.add_argument("router")
    what = evict.add_mutually_exclusive_group(required=True)
    what.add_argument("--key")
    what.add_argument("--node-id")
    what.add_argument("--all", action="store_true")
    pin = actions.add_parser(
        "pin", help="send a key to a target whatever the policy says (while that target is ready)"
    )
    pin.add_argument("router")
    pin.add_argument("key")
    pin.add_argument("node_id", metavar="NODE_ID")
    pin.add_argument(
        "--for", dest="duration", type=_seconds(zero=False), metavar="SECONDS", help="default: until evicted"
    )

    state = sub.add_parser(
        "state",
        help="show or set a target's administrative state (ready, drain, maint)",
        description="ready: takes new connections. drain: no new connections (cached keys "
        "included), probed; open connections stay. maint: as drain, and not probed. The state is "
        "kept across restarts (routerd's --state-file). Output: the target's status, JSON.",
    )
    state.add_argument("--admin", default="http://127.0.0.1:9180")
    state.add_argument("router")
    state.add_argument("node_id", metavar="NODE_ID")
    state.add_argument("state", nargs="?", choices=["ready", "drain", "maint"])

    reload = sub.add_parser(
        "reload",
        help="have a running routerd read its configuration file again and apply it",
        description="Ask a running routerd (POST /api/v1/reload, as SIGHUP does) to read its "
        "configuration file again and apply it in place; established connections stay, except "
        "those whose target left the file. Prints what changed (--json: the answer as it is). "
        "Exit status 1, with the reason on stderr, when nothing changed because the file is bad "
        "(or a port cannot be bound); 0 otherwise, also when the file is the same.",
    )
    reload.add_argument("--admin", default="http://127.0.0.1:9180")
    reload.add_argument("--json", action="store_true", help="print the JSON answer")

    status = sub.add_parser("status", help="show a running router's routers and pool states")
    status.add_argument("--admin", default="http://127.0.0.1:9180")
    status.add_argument("router", nargs="?")

    add_pipeline_commands(sub)  # analyze, simulate, generate-events (pipeline/, docs/pipeline.md)
    add_move_commands(sub, "http://127.0.0.1:9180")  # evacuate, rebalance, shutdown

    event_log = sub.add_parser(
        "event-log", help="show a running router's event log (ring, counts), or resize its ring"
    )
    event_log.add_argument("--admin", default="http://127.0.0.1:9180")
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
    register.add_argument("--zookeeper", required=True, metavar="HOST:PORT[,HOST:PORT...]")
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


def _dry_run(args: argparse.Namespace) -> int:
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
    for decision in decisions:
        print(json.dumps(decision.to_json()))
    return 0


def _cache_command(args: argparse.Namespace) -> int:
    base = f"/api/v1/routers/{urllib.parse.quote(args.router, safe='')}/cache"
    if args.action == "get":
        print(json.dumps(_get(args.admin, base + "?" + urllib.parse.urlencode({"key": args.key}))))
        return 0
    if args.action == "evict":
        if args.node_id is not None and not args.node_id:
            _fail("routerctl", "cache evict: --node-id must not be empty", EXIT_USAGE)
        what = {"all": "true"} if args.all else {"key": args.key} if args.key is not None else {}
        selector = urllib.parse.urlencode(what or {"node_id": args.node_id})
        print(json.dumps(_get(args.admin, f"{base}?{selector}", method="DELETE")))
        return 0
    if args.action == "pin":
        pin = {"key": args.key, "node_id": args.node_id, "duration_s": args.duration}
        print(json.dumps(_get(args.admin, base, put=pin)))
        return 0
    after = args.after
    while True:
        query: dict[str, str | int] = {"prefix": args.prefix, "after": after, "limit": args.limit}
        if args.node_id is not None:
            query["node_id"] = args.node_id
        page = _get(args.admin, f"{base}?{urllib.parse.urlencode(query)}")
        assert isinstance(page, dict)
        if not args.all:
            print(json.dumps(page, indent=2))
            return 0
        for entry in page["entries"]:
            print(json.dumps(entry))
        if page["next"] is None:
            return 0
        after = page["next"]


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


def _register(args: argparse.Namespace) -> int:
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
    return 0


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


MAX_TOKENS_BYTES: Final = 1024 * 1024
"""Largest tokens file read (routerd's `--admin-tokens`, routerctl's ROUTERCTL_TOKEN_FILE)."""


def _token() -> str | None:
    """The admin API token for routerctl: the file ROUTERCTL_TOKEN_FILE names, or ROUTERCTL_TOKEN."""
    path = os.environ.get("ROUTERCTL_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as file:
                return file.read(MAX_TOKENS_BYTES).strip() or None
        except OSError as exc:
            _fail("routerctl", f"ROUTERCTL_TOKEN_FILE {path!r}: {exc.strerror}", EXIT_USAGE)
    return os.environ.get("ROUTERCTL_TOKEN") or None


def _get(admin: str, path: str, *, put: object = None, method: str = "GET") -> object:
    """GET a resource of the admin API (PUT `put` as JSON when given, or another method); one error
    line otherwise."""
    url = admin.rstrip("/") + path
    request = urllib.request.Request(url, method=method)
    if put is not None:  # a body: PUT unless another method was asked (POST)
        body_method = "PUT" if method == "GET" else method
        request = urllib.request.Request(url, data=json.dumps(put).encode(), method=body_method)
    token = _token()
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            detail = exc.reason
        _fail("routerctl", f"{url}: {exc.code} {detail}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        _fail("routerctl", f"cannot reach the router's admin API at {admin}: {reason}")


def _reload(args: argparse.Namespace) -> int:
    """`routerctl reload`: what changed, one line per part (the JSON answer with --json)."""
    answer = _get(args.admin, "/api/v1/reload", method="POST")
    assert isinstance(answer, dict)
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print(f"reloaded: {answer.get('summary', '')}")
    return 0


def main_routerctl(argv: Sequence[str] | None = None) -> int:
    """`routerctl`: see the module docstring."""
    args = _routerctl_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.command == "register" else logging.WARNING,
        stream=sys.stderr,
        format="routerctl: %(levelname)s: %(message)s",
    )
    if args.command in PIPELINE_COMMANDS:
        return run_pipeline_command(args)
    if args.command in MOVE_COMMANDS:
        return run_move_command(args, _get)
    if args.command == "route":
        return _dry_run(args)
    if args.command == "register":
        return _register(args)
    if args.command == "cache":
        return _cache_command(args)
    if args.command == "state":
        path = f"/api/v1/routers/{urllib.parse.quote(args.router, safe='')}/targets/"
        path += urllib.parse.quote(args.node_id, safe="")
        change = None if args.state is None else {"admin_state": args.state}
        print(json.dumps(_get(args.admin, path, put=change)))
        return 0
    if args.command == "reload":
        return _reload(args)
    if args.command == "event-log":
        change = None if args.ring_size is None else {"ring_size": args.ring_size}
        print(json.dumps(_get(args.admin, "/api/v1/event-log", put=change), indent=2))
        return 0
    if args.command == "target":
        query = {"key": args.key, **({"dry-run": "true"} if args.dry_run else {})}
        path = f"/api/v1/routers/{urllib.parse.quote(args.router, safe='')}/target?" + urllib.parse.urlencode(
            query
        )
        print(json.dumps(_get(args.admin, path)))
        return 0
    path = "/api/v1/routers" + (f"/{urllib.parse.quote(args.router, safe='')}" if args.router else "")
    print(json.dumps(_get(args.admin, path), indent=2))
    return 0


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
