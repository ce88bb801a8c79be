"""routerctl's own commands, the kernel's: `route` (the engine dry-run on a configuration file),
`target` (the management lookup), `status`, `wait` and `reload`. The features bring theirs
(router/features/); all are `Command`s (router/feature.py), composed by router/ctl.py.

    routerctl route --config FILE --router NAME [--ready all|none|NODE,...] [--cache FILE] KEY...
    routerctl route --config FILE --router NAME [--client-id X] [--user U] [--sni H]
                    [--source-ip IP] [--role R]...
    routerctl target [--admin ADDRESS] [--dry-run] ROUTER KEY
    routerctl status [--admin ADDRESS] [ROUTER]
    routerctl wait [--admin ADDRESS] [--timeout S] [--interval S] target ROUTER NODE_ID STATE
    routerctl wait [--admin ADDRESS] [--timeout S] [--interval S] router ROUTER ready|not-ready
    routerctl reload [--admin ADDRESS]
"""

from __future__ import annotations

import argparse
import functools
import time
import urllib.parse
from typing import TYPE_CHECKING, Final

from keys import ConnectionFacts
from pools import ready_node_ids
from router.config import ConfigError, load_config
from router.core.engine import RoutingEngine, build_pool
from router.ctl_client import REQUEST_TIMEOUT_S, admin_options, quoted
from router.ctl_output import CtlError, ExitCode, add_json_option, finite_number, poll, seconds
from router.ctl_render import decisions_blocks, router_blocks, status_blocks, targets_table
from router.feature import Command
from router.services.cache_store import CacheStore, CacheStoreError

if TYPE_CHECKING:
    from router.ctl_client import Ctl
    from router.ctl_output import Blocks

__all__ = ["COMMANDS", "ROUTER_CONDITIONS", "TARGET_CONDITIONS"]


WAIT_TIMEOUT_S: Final = 30.0
"""`wait --timeout` by default (as `kubectl wait`)."""
WAIT_INTERVAL_S: Final = 1.0
"""`wait --interval` by default: one small GET a second per waiting script."""
WAIT_INTERVAL_BOUNDS_S: Final = (0.1, 60.0)
"""`wait --interval` is bounded: no busy loop against the admin API, no minute-long naps."""

TARGET_CONDITIONS: Final = ("ready", "not-ready", "unknown", "open", "absent")
"""What `wait target` waits for: a probe state of the target, its taking new clients (`open`:
ready, not drained, in maintenance or ejected, its limit not full), or its absence from the pool."""
ROUTER_CONDITIONS: Final = ("ready", "not-ready")
"""What `wait router` waits for: it takes new clients (its pool's quorum holds and a target is
open, or it has no pool), or not."""


def _wait_options(parser: argparse.ArgumentParser, *, again: bool = False) -> None:
    """`wait`'s own options, before or after what it waits for (`again`: after)."""
    low, high = WAIT_INTERVAL_BOUNDS_S
    parser.add_argument(
        "--timeout",
        type=seconds(zero=False),
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


def _route(args: argparse.Namespace, ctl: Ctl) -> int:
    for name in ("client_id", "user", "sni", "source_ip"):
        if getattr(args, name) == []:  # Python 3.11's argparse turns `--user=--` into []
            setattr(args, name, "--")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CtlError(str(exc), ExitCode.USAGE) from None
    try:
        router = config.router(args.router)
    except KeyError:
        names = ", ".join(r.name for r in config.routers) or "none"
        raise CtlError(
            f"no connection router {args.router!r} in {config.source} (has: {names})", ExitCode.USAGE
        ) from None
    has_facts = any(v is not None for v in (args.client_id, args.user, args.sni, args.source_ip))
    has_facts = has_facts or bool(args.role)
    if has_facts == bool(args.keys):
        raise CtlError(
            "give either KEY... or connection facts (--client-id, --user, --sni, "
            "--source-ip, --role), not both and not neither",
            ExitCode.USAGE,
        )
    pool, local = build_pool(config, router)
    if pool is not None:
        node_ids = [t.node_id for t in pool.targets]
        if args.ready not in ("all", "none"):
            unknown = sorted({n.strip() for n in args.ready.split(",") if n.strip()} - set(node_ids))
            if unknown:
                raise CtlError(
                    f"--ready names unknown node ids {unknown} (pool of {router.name!r} has {node_ids})",
                    ExitCode.USAGE,
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
            raise CtlError(f"--source-ip: {exc}", ExitCode.USAGE) from None
        decisions = [engine.route(facts, now)]
    else:
        decisions = [engine.lookup(key, now) for key in args.keys]
    ctl.out.emit_lines([d.to_json() for d in decisions], decisions_blocks)
    return ExitCode.OK


def _load_cache(engine: RoutingEngine, path: str, now: float) -> None:
    """`route --cache FILE`: the engine's cache holds the file's live entries (read-only)."""
    if engine.cache is None:
        raise CtlError(f"--cache: connection router {engine.name!r} has no <cache>", ExitCode.USAGE)
    try:
        store = CacheStore.open(path, read_only=True)
        try:
            rows = store.load(now, engine.cache.config.timeout_ms)
        finally:
            store.close()
    except CacheStoreError as exc:
        raise CtlError(f"--cache: {exc}", ExitCode.FAILED) from None
    engine.cache.restore(rows, now)


def _target(args: argparse.Namespace, ctl: Ctl) -> int:
    query = {"key": args.key, **({"dry-run": "true"} if args.dry_run else {})}
    decision = ctl.request(
        quoted("api", "v1", "routers", args.router, "target") + "?" + urllib.parse.urlencode(query)
    )
    ctl.out.emit_lines([decision], decisions_blocks)
    return ExitCode.OK


def _status(args: argparse.Namespace, ctl: Ctl) -> int:
    if args.router is not None:
        ctl.out.emit(ctl.request(quoted("api", "v1", "routers", args.router)), _router_blocks(ctl))
        return ExitCode.OK
    document = ctl.request("/api/v1/status")
    routers = ctl.request("/api/v1/routers")
    assert isinstance(document, dict)
    ctl.out.emit({**document, "routers": routers}, status_blocks)
    return ExitCode.OK


def _router_blocks(ctl: Ctl) -> Blocks:
    """A router's document for people, with the features' parts (`Ctl.router_blocks`)."""
    return functools.partial(router_blocks, features=ctl.router_blocks)


def _wait(args: argparse.Namespace, ctl: Ctl) -> int:
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
            document = ctl.request(router_path, timeout_s=max(0.1, min(REQUEST_TIMEOUT_S, left)))
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
    ctl.out.emit(found[0], _router_blocks(ctl) if node_id is None else (lambda t: [targets_table([t])]))
    return ExitCode.OK


def _condition(document: object, node_id: str | None, state: str) -> tuple[bool, str, object]:
    """Whether a router document shows `state` (for the router, or for its target `node_id`):
    (holds, what it shows in words, the document to print)."""
    if not isinstance(document, dict):
        return False, f"an answer that is not a router: {document!r}", document
    pool = document.get("pool")
    if node_id is None:
        why = None if pool is None else pool.get("not_accepting_reason")
        ready = why is None
        return ready == (state == "ready"), "ready" if ready else f"not-ready ({why})", document
    targets = [] if pool is None else [t for t in pool.get("targets", []) if t.get("node_id") == node_id]
    if not targets:
        return state == "absent", "absent from the pool", {"node_id": node_id, "in_pool": False}
    target = targets[0]
    shown = f"{target.get('state')}, {'open' if target.get('open') else 'not open'}"
    if state == "open":
        return bool(target.get("open")), shown, target
    return target.get("state") == state, shown, target


def _reload(_args: argparse.Namespace, ctl: Ctl) -> int:
    """`routerctl reload`: what changed in one line (the JSON answer with --json)."""
    answer = ctl.request("/api/v1/reload", method="POST")
    assert isinstance(answer, dict)
    ctl.out.emit(answer, lambda a: [f"reloaded: {a.get('summary', '') if isinstance(a, dict) else ''}"])
    return ExitCode.OK


def _route_arguments(route: argparse.ArgumentParser) -> None:
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


def _target_arguments(target: argparse.ArgumentParser) -> None:
    target.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: no cache write, no round-robin move (the plain lookup does both, as Artemis's)",
    )
    target.add_argument("router", metavar="ROUTER", help="the connection router")
    target.add_argument("key", metavar="KEY", help="the key, as after the key filter")


def _status_arguments(status: argparse.ArgumentParser) -> None:
    status.add_argument("router", nargs="?", metavar="ROUTER", help="show this router only")


def _wait_arguments(wait: argparse.ArgumentParser) -> None:
    _wait_options(wait)
    what = wait.add_subparsers(
        dest="what", required=True, metavar="WHAT", title="what to wait for", help="a target or a router"
    )
    wait_target = what.add_parser(
        "target",
        help="a target's probe state, its taking new clients, or its leaving the pool",
        description="ready, not-ready, unknown: the target's state as last probed (its "
        "administrative state aside: a drained target is ready); open: it takes new clients (ready, "
        "not drained, in maintenance or ejected, its maxConnections and queue not full); absent: "
        "no longer in the pool (a discovered broker that left).",
    )
    admin_options(wait_target, again=True)
    _wait_options(wait_target, again=True)
    wait_target.add_argument("router", metavar="ROUTER", help="the connection router")
    wait_target.add_argument("node_id", metavar="NODE_ID", help="the target's node id")
    wait_target.add_argument("state", choices=TARGET_CONDITIONS, help="the state to wait for")
    wait_router = what.add_parser(
        "router",
        help="a router's readiness: it takes new clients",
        description="ready: the router takes new clients, as /readyz counts it: its pool has its "
        "quorum of ready targets and at least one target is open (not every one drained, in "
        "maintenance, ejected or full); a router without a pool is always ready. not-ready: it "
        "refuses new clients.",
    )
    admin_options(wait_router, again=True)
    _wait_options(wait_router, again=True)
    wait_router.add_argument("router", metavar="ROUTER", help="the connection router")
    wait_router.add_argument("state", choices=ROUTER_CONDITIONS, help="the state to wait for")


COMMANDS: Final = (
    Command(
        name="route",
        help="dry-run the routing engine on a configuration file",
        description="The engine's decision for each KEY, or for one connection described by its "
        "facts. KEYs are treated as the management lookup treats them (from the key transform "
        "on); --client-id/--user/--sni/--source-ip/--role describe one connection and run the "
        "whole workflow. Nothing listens, nothing is probed.",
        arguments=_route_arguments,
        run=_route,
        admin=False,
    ),
    Command(
        name="target",
        help="ask a running router where a key goes (the management lookup)",
        description="The management lookup of a running router: the decision for KEY, with the "
        "router's cache and targets as they are now.",
        arguments=_target_arguments,
        run=_target,
    ),
    Command(
        name="status",
        help="show a running router: process, acceptors, routers; or one router's pool",
        description="Without ROUTER: the process (pid, version, uptime, descriptors, client "
        "budget), each acceptor with its open and pending connections, and each router with its "
        "pool. With ROUTER: that router's settings and its targets.",
        arguments=_status_arguments,
        run=_status,
    ),
    Command(
        name="reload",
        help="have a running routerd read its configuration file again and apply it",
        description="Ask a running routerd (POST /api/v1/reload, as SIGHUP does) to read its "
        "configuration file again and apply it in place; established connections stay, except "
        "those whose target left the file (moved, paced). Prints what changed (--json: the answer "
        "as it is). Exit status 1, with the reason on stderr, when nothing changed because the file "
        "is bad (or a port cannot be bound); 0 otherwise, also when the file is the same.",
        arguments=lambda _parser: None,
        run=_reload,
    ),
    Command(
        name="wait",
        help="wait until a target or a router is in a state (exit 5 on timeout)",
        description="Ask the admin API every --interval seconds until the condition holds (exit "
        "0, printing what was asked), or --timeout passes (exit 5). While the admin API cannot be "
        "reached (routerd starting) it keeps asking; an unknown router is exit 1 at once.",
        arguments=_wait_arguments,
        run=_wait,
    ),
)
"""The kernel's routerctl commands, in `routerctl --help` order."""
