"""The admin HTTP listener: management lookup API, router status, and Prometheus /metrics.

A small HTTP/1.1 server on h11 (one request per connection, then close). It binds to loopback by
default; who may call what (the Host rule, tokens and their levels) is router/core/admin_access.py,
checked before any resource is touched, and every state-changing or refused request is logged
with the caller. So are its limits, which keep /healthz and /readyz answering whoever else calls:
which connection a new one displaces (`AdminConnections`), how long an address that sent wrong
tokens waits (`AuthFailures`), the head and request deadlines and the Content-Length rule; this
module carries them out (one `_Guard` per listener) and reads nothing of a request's body before
its access is checked.

The routes: the kernel's are `KERNEL_ROUTES` below (health, readiness, metrics, status, the
routers, the management lookup, filters, reload); each feature brings its own in its folder's
routes.py (router/features/: moves, cache, targets' administrative states, the event log), and
router/server.py hands them over. docs/admin-api.yaml describes every route in OpenAPI 3.1, and
tests check this server against it. `GET /healthz` answers 200 "ok" while the process serves;
`GET /readyz` 200 "ready" while every acceptor listens and every router's pool has its quorum,
else 503 and one line saying why ("shutting down" from the moment a graceful shutdown starts).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import h11
import trio

from router.core.admin_access import (
    ADMIN_MAX_CONNECTIONS,
    ADMIN_MAX_PER_SOURCE,
    HEAD_TIMEOUT_S,
    MAX_REQUEST_BYTES,
    OPEN_PATHS,
    READ_METHODS,
    REQUEST_TIMEOUT_S,
    AdminConnections,
    AuthFailures,
    Refused,
    check_content_length,
)
from router.datapath.net import open_listeners
from router.feature import Call, HttpError, Response, json_response
from router.logs import shown

if TYPE_CHECKING:
    from router.metrics import Metrics
    from router.services.admin_routes import AdminContext

__all__ = ["ADMIN_MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "serve_admin"]

log = logging.getLogger("router.admin")


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


def _parts(target: str) -> tuple[urllib.parse.SplitResult, list[str]]:
    """A request target and its path's parts, each percent-decoded: what access is checked on and
    what is routed (one reading, so `/api/v1/%73hutdown` is checked as the shutdown it is)."""
    url = urllib.parse.urlsplit(target)
    return url, [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]


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
