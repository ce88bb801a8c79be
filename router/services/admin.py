"""The admin HTTP listener: management lookup API, router status, and Prometheus /metrics.

A small HTTP/1.1 server on h11 (one request per connection, then close). It binds to loopback by
default; who may call what (the Host rule, tokens and their levels) is router/core/admin_access.py,
checked before any resource is touched, and every state-changing or refused request is logged
with the caller. So are its limits, which keep /healthz and /readyz answering whoever else calls:
which connection a new one displaces (`AdminConnections`), how long an address that sent wrong
tokens waits (`AuthFailures`), the head and request deadlines and the Content-Length rule; this
module carries them out (one `_Guard` per listener) and reads nothing of a request's body before
its access is checked.

Endpoints (docs/admin-api.yaml describes each in OpenAPI 3.1; tests check this server against it):
  GET  /api/v1/status                         the process (pid, version, uptime, descriptors, client
                                              budget) and its acceptors with open and pending counts
  GET  /api/v1/routers                        every router with its filters and pool state
  GET  /api/v1/routers/{name}                 one router
  GET  /api/v1/routers/{name}/target?key=K    the management lookup (SPEC A7), as `routerctl route`;
                                              with &dry-run=true it changes nothing (no cache
                                              write, no round-robin move)
  PUT  /api/v1/routers/{name}/filters         JSON {"key_filter": …, "local_target_filter": …};
                                              blank disables, an absent field is left as it is
  GET  /api/v1/routers/{name}/cache?key=K     one cache entry (404 when absent)
  GET  /api/v1/routers/{name}/cache[?prefix=P&node_id=N&after=K&limit=L]
                                              a page of entries in key order: {"entries": […],
                                              "next": the `after` of the next page, or null}
  DELETE /api/v1/routers/{name}/cache?key=K | ?node_id=N | ?all=true
                                              evict one key, a target's entries, or everything:
                                              {"evicted": n}
  PUT  /api/v1/routers/{name}/cache           JSON {"key": K, "node_id": N, "duration_s": S}: pin
                                              K to N (for S seconds; null or absent: until
                                              evicted); the entry
  GET  /api/v1/routers/{name}/targets/{node_id}
                                              one target's status (state, admin state, ...)
  PUT  /api/v1/routers/{name}/targets/{node_id}
                                              JSON {"admin_state": "ready" | "drain" | "maint"};
                                              kept in the state file; the target's status
  POST /api/v1/routers/{name}/targets/{node_id}/evacuation
                                              JSON {"rate": conns/s, "order": "oldest" | "random"}
                                              (both optional): drain the target and move its
                                              clients elsewhere, paced; 202 and the status
  GET  /api/v1/routers/{name}/targets/{node_id}/evacuation
                                              its status: state, moved, left, rate, ETA
  DELETE /api/v1/routers/{name}/targets/{node_id}/evacuation
                                              abort it (what moved stays moved; still drained)
  POST /api/v1/routers/{name}/rebalance       JSON {"rate": …, "band": 0.1, "order": …}: move
                                              just enough clients off targets above the band
  GET | DELETE /api/v1/routers/{name}/rebalance
                                              its status | abort it
  POST /api/v1/shutdown                       (admin level) stop as on SIGTERM: no new
                                              connections, clients moved paced over the grace
                                              period, then exit; 202
  GET  /api/v1/moves                          every evacuation, rebalance and shutdown so far
  GET  /api/v1/event-log                      the event log: router id, ring size and use, counts
  PUT  /api/v1/event-log                      JSON {"ring_size": N}: resize the ring (takes effect
                                              as it drains; nothing in it is lost)
  POST /api/v1/reload                         read the configuration file again and apply it in
                                              place: what changed (router/core/reload.py); 400
                                              with the one-line reason when nothing changed
  GET  /metrics                               Prometheus text exposition
  GET  /healthz                               200 "ok" while the process serves
  GET  /readyz                                200 "ready" while every acceptor listens and every
                                              router's pool has its quorum; else 503 and one
                                              line saying why ("shutting down" from the moment a
                                              graceful shutdown starts)
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import re
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import h11
import trio

from pools import AdminState
from router.core.admin_access import (
    ADMIN_MAX_CONNECTIONS,
    ADMIN_MAX_PER_SOURCE,
    HEAD_TIMEOUT_S,
    MAX_REQUEST_BYTES,
    OPEN_PATHS,
    READ_METHODS,
    REQUEST_TIMEOUT_S,
    AdminAccess,
    AdminConnections,
    AuthFailures,
    Refused,
    check_content_length,
)
from router.core.reload import ReloadError
from router.datapath.net import open_listeners
from router.feature import Call, HttpError, Response, Route, json_object, json_response
from router.logs import shown

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from router.core.reload import ConfigDiff
    from router.metrics import Metrics
    from router.runtime import RouterRuntime
    from router.services.event_log import EventLog
    from router.services.process import ProcessView
    from router.services.state_file import KeptStates

__all__ = [
    "ADMIN_MAX_CONNECTIONS",
    "KERNEL_ROUTES",
    "MAX_REQUEST_BYTES",
    "AdminContext",
    "Lifecycle",
    "serve_admin",
]

log = logging.getLogger("router.admin")

CACHE_PAGE: Final = 100
"""Cache entries in a page when the request says no `limit`."""
CACHE_PAGE_MAX: Final = 10_000
"""The largest `limit` of a cache page (a page is built and sent in the trio thread)."""
STATE_WRITE_WAIT_S: Final = 3.0
"""How long a PUT of an administrative state waits for the state file (a write takes a few ms;
within `REQUEST_TIMEOUT_S`, and above the probe's 1 s of a frozen filesystem)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Lifecycle:
    """Where the process is in its life, as `GET /readyz` reports it (router/server.py sets both)."""

    accepting: trio.Event = dataclasses.field(default_factory=trio.Event)
    """Set once every acceptor listens."""
    shutdown: trio.Event = dataclasses.field(default_factory=trio.Event)
    """Set when a graceful shutdown starts: from then on /readyz answers 503, so that a load
    balancer or Kubernetes sends no new clients while the open ones drain."""


def _not_ready(runtimes: Mapping[str, RouterRuntime], lifecycle: Lifecycle) -> str | None:
    """Why the process is not ready for new clients (one line), or None when it is."""
    if lifecycle.shutdown.is_set():
        return "shutting down"
    if not lifecycle.accepting.is_set():
        return "starting: the acceptors are not listening yet"
    reasons = []
    for runtime in runtimes.values():
        pool = runtime.status().pool
        if pool is None or pool.active:
            continue
        reasons.append(
            f"router {runtime.name!r}: pool below its quorum, {pool.counted} of {len(pool.targets)} "
            f"target(s) ready, quorum-size {pool.quorum_size}"
        )
    return "; ".join(reasons) or None


@dataclass(frozen=True, slots=True)
class _Caller:
    """Who is on an admin connection: `peer` for log lines, `source` (its address) for the limits
    per address."""

    peer: str
    source: str


def _caller(stream: trio.SocketStream) -> _Caller:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return _Caller("?", "?")
    return _Caller(f"{host}:{port}", str(host))


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminContext:
    """What the admin API reads and sets in motion (router/server.py builds it)."""

    runtimes: Mapping[str, RouterRuntime]
    """The routers, shared with the server (a reload changes them in place)."""
    metrics: Metrics
    access: AdminAccess
    lifecycle: Lifecycle
    """Whether the process accepts clients, for /readyz."""
    reload: Callable[[], Awaitable[ConfigDiff]]
    """Reads the configuration file again and applies it (`ReloadError`: nothing changed)."""
    process: ProcessView
    """The process's status (`GET /api/v1/status`)."""
    event_log: EventLog | None = None
    """None: the event log is off."""
    states: KeptStates | None = None
    """Where administrative states are kept; None: in memory only."""
    routes: Sequence[Route] = ()
    """The features' routes (router/features/), served after the kernel's."""
    features: Mapping[type, object] = dataclasses.field(default_factory=dict)
    """The features' services by type, for their routes (`Call.service`)."""
    templates: tuple[tuple[str, list[str], Route], ...] = dataclasses.field(init=False)
    services: Mapping[type, object] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", _templates((*KERNEL_ROUTES, *self.routes)))
        object.__setattr__(self, "services", {AdminContext: self, **self.features})


def _parts(target: str) -> tuple[urllib.parse.SplitResult, list[str]]:
    """A request target and its path's parts, each percent-decoded: what access is checked on and
    what is routed (one reading, so `/api/v1/%73hutdown` is checked as the shutdown it is)."""
    url = urllib.parse.urlsplit(target)
    return url, [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]


_TEXT: Final = "text/plain; charset=utf-8"


def _readyz(call: Call) -> Response:
    why = _not_ready(call.runtimes, _admin(call).lifecycle)
    if why is None:
        return 200, _TEXT, b"ready\n"
    return 503, _TEXT, f"not ready: {why}\n".encode()


def _lookup(call: Call) -> Response:
    runtime = call.runtime
    keys = call.query.get("key")
    if not keys:
        raise HttpError(400, "query parameter 'key' is required")
    dry_run = _one(call.query, "dry-run")
    if dry_run not in (None, "true", "false"):
        raise HttpError(400, f"dry-run must be true or false, got {dry_run!r}")
    return json_response(200, runtime.lookup(keys[0], dry_run=dry_run == "true").to_json())


def _cache_resource(call: Call) -> Response:
    runtime = call.runtime
    try:
        return json_response(200, _cache(runtime, call.method, call.query, call.body))
    except LookupError as exc:
        raise HttpError(404, str(exc)) from None


def _admin(call: Call) -> AdminContext:
    return call.service(AdminContext)


KERNEL_ROUTES: Final = (
    Route(method="GET", template="/healthz", handler=lambda call: (200, _TEXT, b"ok\n")),
    Route(method="GET", template="/readyz", handler=_readyz),
    Route(
        method="GET",
        template="/metrics",
        handler=lambda call: (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            _admin(call).metrics.exposition(),
        ),
    ),
    Route(method="POST", template="/api/v1/reload", handler=lambda call: _reload(_admin(call).reload)),
    Route(
        method="GET",
        template="/api/v1/status",
        handler=lambda call: json_response(200, _admin(call).process.status().to_json()),
    ),
    Route(
        method="GET",
        template="/api/v1/routers",
        handler=lambda call: json_response(200, [r.status().to_json() for r in call.runtimes.values()]),
    ),
    Route(
        method="GET",
        template="/api/v1/routers/{name}",
        handler=lambda call: json_response(200, call.runtime.status().to_json()),
    ),
    Route(method="GET", template="/api/v1/routers/{name}/target", handler=_lookup),
    Route(
        method="PUT",
        template="/api/v1/routers/{name}/filters",
        handler=lambda call: json_response(200, _set_filters(call.runtime, call.body)),
    ),
    Route(
        method="GET", template="/api/v1/routers/{name}/targets/{node_id}", handler=lambda call: _target(call)
    ),
    Route(
        method="PUT", template="/api/v1/routers/{name}/targets/{node_id}", handler=lambda call: _target(call)
    ),
    Route(method="GET", template="/api/v1/routers/{name}/cache", handler=_cache_resource),
    Route(method="PUT", template="/api/v1/routers/{name}/cache", handler=_cache_resource),
    Route(method="DELETE", template="/api/v1/routers/{name}/cache", handler=_cache_resource),
    Route(
        method="GET",
        template="/api/v1/event-log",
        handler=lambda call: _event_log(call.method, call.body, _admin(call).event_log),
    ),
    Route(
        method="PUT",
        template="/api/v1/event-log",
        handler=lambda call: _event_log(call.method, call.body, _admin(call).event_log),
    ),
)
"""The kernel's own routes (HEAD too wherever GET is: the GET's headers); the features bring theirs
(router/feature.py `Route`). A path that matches a template but not its method is a 405, any other
a 404. docs/admin-api.yaml describes every route of both (router/server.py `ROUTES`)."""


def _templates(routes: Sequence[Route]) -> tuple[tuple[str, list[str], Route], ...]:
    return tuple((route.method, route.template.strip("/").split("/"), route) for route in routes)


async def _route(method: str, target: str, body: bytes, admin: AdminContext) -> Response:
    """The response to a request whose access is checked (`method`: HEAD as GET)."""
    url, parts = _parts(target)
    allowed: list[str] = []
    for served, template, route in admin.templates:
        params = _params(template, parts)
        if params is None:
            continue
        allowed.append(served)
        if served == method:
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            call = Call(
                method=method,
                params=params,
                query=query,
                body=body,
                runtimes=admin.runtimes,
                services=admin.services,
            )
            response = route.handler(call)
            return await response if inspect.isawaitable(response) else response
    if allowed:
        raise HttpError(405, f"{method} {url.path} is not supported (only {', '.join(allowed)})")
    raise HttpError(404, f"no such resource {url.path!r}")


def _params(template: list[str], parts: list[str]) -> dict[str, str] | None:
    """The values of a template's `{...}` parts in a path's parts, or None: it does not match."""
    if len(template) != len(parts):
        return None
    params = {}
    for want, got in zip(template, parts, strict=True):
        if want.startswith("{"):
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


async def _target(call: Call) -> Response:
    """A target's status document (GET), after setting its administrative state (PUT
    `{"admin_state": "ready" | "drain" | "maint"}`), kept in the state file: the answer waits up to
    `STATE_WRITE_WAIT_S` for the file, and is a 500 when it is not written (the state is in force,
    and the write is retried)."""
    runtime, node_id = call.runtime, call.params["node_id"]
    states = _admin(call).states
    if call.method == "PUT":
        document = json_object(call.body)
        values = [s.value for s in AdminState]
        state = document.get("admin_state")
        if set(document) != {"admin_state"} or state not in values:
            raise HttpError(400, f'body must be {{"admin_state": one of {values}}}, got {document!r}')
        try:
            changed = runtime.set_admin_state(node_id, AdminState(state))
        except LookupError as exc:
            raise HttpError(404, str(exc)) from None
        except ValueError as exc:
            raise HttpError(404, str(exc)) from None
        if changed and states is not None:
            error = await states.changed_and_written(STATE_WRITE_WAIT_S)
            if error is not None:
                log.error(
                    "router=%s target=%s admin state %s is in force but not kept yet: %s",
                    runtime.name,
                    shown(node_id),
                    state,
                    error,
                )
                raise HttpError(
                    500,
                    f"admin state {state} is in force, but not kept across a restart yet: {error}; "
                    "routerd retries the write (routerctl status shows when it is kept)",
                )
    return json_response(200, _target_document(runtime, node_id))


def _target_document(runtime: RouterRuntime, node_id: str) -> dict[str, object]:
    status = runtime.status().pool
    for target in () if status is None else status.targets:
        if target.node_id == node_id:
            return target.to_json()
    admin_state = runtime.admin_states().get(node_id)
    if admin_state is None:
        raise HttpError(404, f"no target with node id {node_id!r} in the pool of {runtime.name!r}")
    return {"node_id": node_id, "admin_state": admin_state.value, "in_pool": False}


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if values is not None and len(values) != 1:
        raise HttpError(400, f"query parameter {name!r} given {len(values)} times")
    return None if values is None else values[0]


def _cache(
    runtime: RouterRuntime, method: str, query: Mapping[str, list[str]], body: bytes
) -> dict[str, object]:
    """The cache resource (see the module docstring).

    Raises:
        LookupError: the router has no cache, or no entry for the key asked.
    """
    key, node_id = _one(query, "key"), _one(query, "node_id")
    if method == "PUT":
        return _pin(runtime, body)
    if method == "DELETE":
        every = _one(query, "all")
        if [key, node_id, every].count(None) != 2 or every not in (None, "true") or node_id == "":
            raise HttpError(400, "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true")
        evicted = runtime.cache_evict(key=key, node_id=node_id)
        what = "all" if every else f"key={shown(key)}" if key is not None else f"node_id={shown(node_id)}"
        log.info("router=%s cache evicted %s: %d entries", runtime.name, what, evicted)
        return {"evicted": evicted}
    if key is not None:
        entry = runtime.cache_entry(key)
        if entry is None:
            raise LookupError(f"no cache entry for key {key!r}")
        return entry.to_json()
    limit_text = _one(query, "limit") or str(CACHE_PAGE)
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= CACHE_PAGE_MAX:
        raise HttpError(400, f"limit must be an integer 1-{CACHE_PAGE_MAX}, got {limit_text!r}")
    limit = int(limit_text)
    page = runtime.cache_listing(
        prefix=_one(query, "prefix") or "", node_id=node_id, after=_one(query, "after") or "", limit=limit + 1
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
        entry = runtime.cache_pin(key, node_id, None if duration is None else float(duration))
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None
    until = "until evicted" if duration is None else f"for {float(duration):g} s"
    log.info(
        "router=%s cache key=%s pinned to node_id=%s %s", runtime.name, shown(key), shown(node_id), until
    )
    return entry.to_json()


def _event_log(method: str, body: bytes, event_log: EventLog | None) -> Response:
    """GET: the event log's status; PUT `{"ring_size": N}`: resize its ring."""
    if event_log is None:
        raise HttpError(404, "the event log is off (<event-log> or routerd --event-log DIR turns it on)")
    if method == "GET":
        return json_response(200, event_log.status())
    document = json_object(body)
    size = document.get("ring_size")
    if set(document) != {"ring_size"} or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise HttpError(400, f'body must be {{"ring_size": N}} with an integer N >= 1, got {document!r}')
    event_log.resize(size)
    return json_response(200, event_log.status())


def _set_filters(runtime: RouterRuntime, body: bytes) -> dict[str, object]:
    document = json_object(body)
    changes: dict[str, str | None] = {}
    for field in ("key_filter", "local_target_filter"):
        if field in document:
            value = document[field]
            if value is not None and not isinstance(value, str):
                raise HttpError(400, f"{field} must be a string or null, got {value!r}")
            changes[field] = value
    try:
        status = runtime.set_filters(**changes)
    except ValueError as exc:  # nothing changed
        raise HttpError(400, str(exc)) from None
    for field in changes:
        in_force = status.key_filter if field == "key_filter" else status.local_target_filter
        log.info("router=%s %s set to %r", runtime.name, field, in_force)
    return status.to_json()


async def _reload(reload: Callable[[], Awaitable[ConfigDiff]]) -> Response:
    """`POST /api/v1/reload`: what changed, or 400 with why nothing did."""
    try:
        diff = await reload()
    except ReloadError as exc:
        raise HttpError(400, str(exc)) from None
    return json_response(200, diff.to_json())


async def _read_head(conn: h11.Connection, stream: trio.SocketStream, seen: bytearray) -> h11.Request | None:
    """The request's head; None when the peer closed before sending one. What was received is
    added to `seen` (at most MAX_REQUEST_BYTES and one read more: h11 stops at its cap).

    Raises:
        h11.RemoteProtocolError: not HTTP/1.1, a bad header (a Content-Length that is not a
            number of at most 20 digits), or a head over MAX_REQUEST_BYTES.
    """
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(16384)
            seen += data
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            return event
        elif isinstance(event, h11.ConnectionClosed):
            return None


_CONTENT_LENGTH: Final = re.compile(rb"^content-length[ \t]*:(.*?)\r?$", re.IGNORECASE | re.MULTILINE)


def _bad_request(exc: h11.RemoteProtocolError, seen: bytes) -> tuple[int, str]:
    """The status and error of a request h11 refused: a Content-Length h11 will not read (over its
    20 digits) is still a 413 when it is a number (`check_content_length`)."""
    head = seen.partition(b"\r\n\r\n")[0]
    values = [m[1].decode("latin-1") for m in _CONTENT_LENGTH.finditer(head)]
    refused = check_content_length(values)
    if refused is not None:
        return refused.status, refused.message
    return exc.error_status_hint, f"bad request: {exc}"


async def _read_body(conn: h11.Connection, stream: trio.SocketStream) -> bytes:
    """The body of the request whose head was read.

    Raises:
        _HttpError: the body is over MAX_REQUEST_BYTES (413; a chunked one, or one that is longer
            than its Content-Length said).
        h11.RemoteProtocolError: the peer closed in the middle of it.
    """
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(16384))
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_REQUEST_BYTES:
                raise HttpError(413, f"request body over {MAX_REQUEST_BYTES} bytes")
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return bytes(body)


async def _respond(
    conn: h11.Connection, stream: trio.SocketStream, status: int, ctype: str, payload: bytes, *, head: bool
) -> None:
    headers = [("content-type", ctype), ("content-length", str(len(payload))), ("connection", "close")]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    if not head:  # a response to HEAD has the GET response's headers and no body (RFC 9110 §9.3.2)
        await stream.send_all(conn.send(h11.Data(data=payload)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


class _Guard:
    """The listener's share of rules 3 and 4 of router/core/admin_access.py: the open connections
    (each with the cancel scope that closes it when a new one takes its place) and the wrong
    tokens per address."""

    def __init__(self, metrics: Metrics) -> None:
        self.connections = AdminConnections()
        self.failures = AuthFailures()
        self.metrics = metrics
        self.scopes: dict[int, trio.CancelScope] = {}


async def _serve_one(
    stream: trio.SocketStream, admin: AdminContext, guard: _Guard, conn_id: int, caller: _Caller
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    seen = bytearray()
    peer, source = caller.peer, caller.source
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            with trio.fail_after(HEAD_TIMEOUT_S):
                request = await _read_head(conn, stream, seen)
            if request is None:
                return
            method = request.method.decode()
            head = method == "HEAD"
            target = request.target.decode()
            headers = {name.decode().lower(): value.decode("latin-1") for name, value in request.headers}
            _, parts = _parts(target)
            path = "/" + "/".join(parts)
            if admin.access.tokens and not (path in OPEN_PATHS and method in READ_METHODS):
                # Rule 4: an address that sent wrong tokens waits before its token is checked (it
                # holds no place meanwhile: the connection is still `waiting`).
                await trio.sleep(guard.failures.delay_s(source, trio.current_time()))
            verdict = admin.access.check(method, path, headers.get("host"), headers.get("authorization"))
            failures = 0
            if isinstance(verdict, Refused) and verdict.status == 401:
                failures = guard.failures.failed(source, trio.current_time())
                guard.metrics.admin_auth_failures.inc(())
            try:
                if isinstance(verdict, Refused):  # answered at once: nothing more of it is read
                    raise HttpError(verdict.status, verdict.message)
                guard.connections.serving(conn_id)
                too_long = check_content_length(
                    value.decode("latin-1") for name, value in request.headers if name == b"content-length"
                )
                if too_long is not None:
                    raise HttpError(too_long.status, too_long.message)
                body = await _read_body(conn, stream)
                status, ctype, payload = await _route("GET" if head else method, target, body, admin)
            except HttpError as exc:
                status, ctype, payload = json_response(exc.status, {"error": exc.message})
            if failures:  # WARNING: rate-limited, whoever sends them
                log.warning(
                    "admin request without a valid token from %s: %s %s -> %d (%d from %s in %g s; its "
                    "requests now wait %.2f s)",
                    peer,
                    method,
                    shown(target),
                    status,
                    failures,
                    source,
                    guard.failures.window_s,
                    guard.failures.delay_s(source, trio.current_time()),
                )
            elif isinstance(verdict, Refused):
                log.warning("admin request refused from %s: %s %s -> %d", peer, method, shown(target), status)
            elif method not in READ_METHODS:
                log.info("admin %s from %s: %s %s -> %d", verdict.who, peer, method, shown(target), status)
            await _respond(conn, stream, status, ctype, payload, head=head)
    except h11.RemoteProtocolError as exc:
        # A request h11 cannot read (a bad request line or header, a Content-Length that is not a
        # number, a head over the cap): its status (400, 413, 431) at once, if nothing was sent yet.
        log.info("admin request from %s failed: %s", peer, exc)
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            status, error = _bad_request(exc, bytes(seen))
            status, ctype, payload = json_response(status, {"error": error})
            response = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Bad Request')}\r\ncontent-type: {ctype}\r\n"
                f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
            ).encode() + payload
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(response)
    except (h11.LocalProtocolError, trio.TooSlowError, trio.BrokenResourceError) as exc:
        log.info("admin request from %s failed: %s", peer, exc or "too slow")
    except Exception:
        # The admin API must never take the router (and its proxied connections) down with it.
        log.exception("admin request handler failed")
    finally:
        await stream.aclose()


_REASONS: Final = {400: "Bad Request", 413: "Content Too Large", 431: "Request Header Fields Too Large"}


async def serve_admin(
    host: str,
    port: int,
    admin: AdminContext,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API until cancelled; `task_status.started((host, port))` once listening."""
    listeners = await open_listeners(host, port, f"the admin API on {host}:{port}")
    sockname = listeners[0].socket.getsockname()
    bound = (str(sockname[0]), int(sockname[1]))
    log.info("admin API listening on http://%s:%d", *bound)
    task_status.started(bound)
    guard = _Guard(admin.metrics)

    async def handler(stream: trio.SocketStream) -> None:
        caller = _caller(stream)
        peer = caller.peer
        admission = guard.connections.open(caller.source)
        if admission is None:  # their descriptors come out of the process's reserve
            log.warning(
                "admin API: no place for a new connection from %s: %d being served (at most %d, %d from "
                "one address)",
                peer,
                len(guard.connections),
                ADMIN_MAX_CONNECTIONS,
                ADMIN_MAX_PER_SOURCE,
            )
            await stream.aclose()
            return
        if admission.displaced is not None:
            guard.scopes.pop(admission.displaced).cancel(reason="its place went to a new connection")
            guard.metrics.admin_connections_displaced.inc(())
            log.warning(
                "admin API: a connection that sent no request yet was closed to make room for one from %s",
                peer,
            )
        # Cancelled when a new connection takes its place; `_serve_one` closes it on the way out.
        with trio.CancelScope() as scope:
            guard.scopes[admission.conn] = scope
            try:
                await _serve_one(stream, admin, guard, admission.conn, caller)
            finally:
                guard.connections.close(admission.conn)
                guard.scopes.pop(admission.conn, None)

    await trio.serve_listeners(handler, listeners)
