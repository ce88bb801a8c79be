"""routerctl's cache commands: list, get, evict and pin a running router's cache entries.

routerctl cache [--admin ADDRESS] list ROUTER [--prefix P] [--node-id N] [--after K] [--limit N] [--all]
routerctl cache [--admin ADDRESS] get ROUTER KEY
routerctl cache [--admin ADDRESS] evict ROUTER (--key K | --node-id N | --all)
routerctl cache [--admin ADDRESS] pin ROUTER KEY NODE_ID [--for SECONDS]
"""

from __future__ import annotations

import shlex
import urllib.parse
from typing import TYPE_CHECKING, Final

from router.ctl_client import admin_options, quoted
from router.ctl_output import CtlError, ExitCode, Renderable, Table, integer, seconds
from router.ctl_render import field, items
from router.feature import Command

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from router.ctl_client import Ctl

__all__ = ["COMMANDS"]


def _arguments(cache: argparse.ArgumentParser) -> None:
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
        "--limit", type=integer(1, 10_000), default=100, metavar="N", help="entries per page (default 100)"
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
        type=seconds(zero=False),
        metavar="SECONDS",
        help="how long the pin holds (default: until evicted)",
    )


def _cache(args: argparse.Namespace, ctl: Ctl) -> int:
    out = ctl.out
    base = quoted("api", "v1", "routers", args.router, "cache")
    if args.action == "get":
        entry = ctl.request(base + "?" + urllib.parse.urlencode({"key": args.key}))
        out.emit(entry, lambda e: [_cache_table([e])])
        return ExitCode.OK
    if args.action == "evict":
        if args.node_id is not None and not args.node_id:
            raise CtlError("cache evict: --node-id must not be empty", ExitCode.USAGE)
        what = {"all": "true"} if args.all else {"key": args.key} if args.key is not None else {}
        selector = urllib.parse.urlencode(what or {"node_id": args.node_id})
        evicted = ctl.request(f"{base}?{selector}", method="DELETE")
        out.emit(evicted, lambda d: [_evicted_line(field(d, "evicted"))])
        return ExitCode.OK
    if args.action == "pin":
        pin = {"key": args.key, "node_id": args.node_id, "duration_s": args.duration}
        entry = ctl.request(base, method="PUT", body=pin)
        out.emit(entry, lambda e: [_cache_table([e])])
        return ExitCode.OK
    after, entries = args.after, []
    while True:
        query: dict[str, str | int] = {"prefix": args.prefix, "after": after, "limit": args.limit}
        if args.node_id is not None:
            query["node_id"] = args.node_id
        page = ctl.request(f"{base}?{urllib.parse.urlencode(query)}")
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


def _cache_table(entries: Sequence[object]) -> Table:
    table = Table(["key", "node_id", "idle_s", "expires_in_s", "pinned"])
    for e in entries:
        table.add(
            field(e, "key"),
            field(e, "node_id"),
            field(e, "idle_s"),
            field(e, "expires_in_s"),
            field(e, "pinned"),
        )
    return table


def _cache_page_blocks(page: object) -> list[Renderable]:
    blocks: list[Renderable] = [_cache_table(items(page, "entries"))]
    following = field(page, "next")
    if following is not None:
        blocks.append(f"more: --after {shlex.quote(str(following))}")
    return blocks


def _cache_rows_blocks(entries: list[object]) -> list[Renderable]:
    return [_cache_table(entries)]


def _evicted_line(count: object) -> str:
    return f"evicted {count} {'entry' if count == 1 else 'entries'}"


COMMANDS: Final = (
    Command(
        name="cache",
        help="list, show, evict or pin a running router's cache entries",
        description="The sticky cache of a running router, through its admin API.",
        arguments=_arguments,
        run=_cache,
    ),
)
