"""The cache's admin API resource (docs/admin-api.yaml):

GET    /api/v1/routers/{name}/cache?key=K     one entry (404 when absent)
GET    /api/v1/routers/{name}/cache[?prefix=P&node_id=N&after=K&limit=L]
                                               a page of entries in key order: {"entries":
                                               […], "next": the `after` of the next page}
DELETE /api/v1/routers/{name}/cache?key=K | ?node_id=N | ?all=true
                                               evict one key, a target's entries, or all
PUT    /api/v1/routers/{name}/cache            JSON {"key": K, "node_id": N, "duration_s": S}:
                                               pin K to N (for S seconds; null: until evicted)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from router.feature import Call, HttpError, Response, Route, json_object, json_response
from router.features.cache.service import cache_entry, cache_evict, cache_listing, cache_pin
from router.logs import shown

if TYPE_CHECKING:
    from router.runtime import RouterRuntime

__all__ = ["CACHE_PAGE", "CACHE_PAGE_MAX", "ROUTES"]

log = logging.getLogger("router.admin")

CACHE_PAGE: Final = 100
"""Cache entries in a page when the request says no `limit`."""
CACHE_PAGE_MAX: Final = 10_000
"""The largest `limit` of a cache page (a page is built and sent in the trio thread)."""


def _cache_resource(call: Call) -> Response:
    try:
        return json_response(200, _cache(call))
    except LookupError as exc:
        raise HttpError(404, str(exc)) from None


def _cache(call: Call) -> dict[str, object]:
    """The cache resource (see the module docstring).

    Raises:
        LookupError: the router has no cache, or no entry for the key asked.
    """
    runtime, key, node_id = call.runtime, call.one("key"), call.one("node_id")
    if call.method == "PUT":
        return _pin(runtime, call.body)
    if call.method == "DELETE":
        every = call.one("all")
        if [key, node_id, every].count(None) != 2 or every not in (None, "true") or node_id == "":
            raise HttpError(400, "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true")
        evicted = cache_evict(runtime, key=key, node_id=node_id)
        what = "all" if every else f"key={shown(key)}" if key is not None else f"node_id={shown(node_id)}"
        log.info("router=%s cache evicted %s: %d entries", runtime.name, what, evicted)
        return {"evicted": evicted}
    if key is not None:
        entry = cache_entry(runtime, key)
        if entry is None:
            raise LookupError(f"no cache entry for key {key!r}")
        return entry.to_json()
    limit_text = call.one("limit") or str(CACHE_PAGE)
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= CACHE_PAGE_MAX:
        raise HttpError(400, f"limit must be an integer 1-{CACHE_PAGE_MAX}, got {limit_text!r}")
    limit = int(limit_text)
    page = cache_listing(
        runtime,
        prefix=call.one("prefix") or "",
        node_id=node_id,
        after=call.one("after") or "",
        limit=limit + 1,
    )
    more = len(page) > limit
    page = page[:limit]
    return {"entries": [e.to_json() for e in page], "next": page[-1].key if more else None}


def _pin(runtime: RouterRuntime, body: bytes) -> dict[str, object]:
    document = json_object(body)
    key, node_id, duration = document.get("key"), document.get("node_id"), document.get("duration_s")
    if (
        not set(document) <= {"key", "node_id", "duration_s"}
        or not isinstance(key, str)
        or not key
        or not isinstance(node_id, str)
        or not (duration is None or (isinstance(duration, (int, float)) and not isinstance(duration, bool)))
    ):
        raise HttpError(
            400, f'body must be {{"key": K, "node_id": N, "duration_s": seconds or null}}, got {document!r}'
        )
    try:
        entry = cache_pin(runtime, key, node_id, None if duration is None else float(duration))
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None
    until = "until evicted" if duration is None else f"for {float(duration):g} s"
    log.info(
        "router=%s cache key=%s pinned to node_id=%s %s", runtime.name, shown(key), shown(node_id), until
    )
    return entry.to_json()


ROUTES: Final = tuple(
    Route(method=method, template="/api/v1/routers/{name}/cache", handler=_cache_resource)
    for method in ("GET", "PUT", "DELETE")
)
"""The feature's admin API routes."""
