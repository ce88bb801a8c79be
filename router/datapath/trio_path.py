"""The trio data path: one trio task per client connection, through fixed phases.

    accept -> open -> decide -> plan -> answer                       (Refuse, Redirect)
                                     -> connect -> replay -> relay   (Proxy) -> closed

`open` reads a PROXY protocol header (acceptors that enable it), terminates TLS (acceptors that
do) and, when the key or the mode needs it (`plan.must_sniff`), the client's opening, all under
the acceptor's handshake deadline and byte cap. `decide` is the router's workflow, with the quorum
wait; `plan` (router/core/plan.py) says what to do, and the rest carries it out. Each step is
reported through the runtime as an event (router/core/events.py). The fast path
(router/datapath/fast_path.py) has the same phases; the connections it cannot finish without
waiting enter here at `resume_connection`, with what its phases gave.

This module decides nothing. Every phase has its own deadline. Closing has one owner per resource,
so the phases just return: the entry points close the client's socket, `_serve` the client's
stream (TLS included), `_connect_and_relay` the target's (the relay closes both when it ends).
"""

from __future__ import annotations

import contextlib
import math
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never

import trio

from keys import SniffError
from keys.detect import detect_tls
from router.core.address import Address, endpoint
from router.core.auth import authenticate
from router.core.engine import DecisionReason, RouteDecision, RouteStatus, Wait
from router.core.events import CloseReason, ConnectFailure, NotAuthorized, OpeningFailure
from router.core.live import LiveConnection
from router.core.opening import opening_failed
from router.core.plan import (
    Opening,
    Proxy,
    Redirect,
    Refuse,
    decided,
    must_sniff,
    not_authorized_answer,
    plan,
    routing_facts,
)
from router.datapath.net import connect_failed, open_connection
from router.datapath.reading import SniffProgress, read_past_preamble, read_proxy_header, read_until_sniffed
from router.datapath.relay import leave, relay
from router.datapath.tls import certificate_user, open_terminated

if TYPE_CHECKING:
    from keys import ConnectionFacts
    from router.core.events import ConnectionRef, OpeningFailed
    from router.datapath.acceptor import Pending, ServedAcceptor
    from router.datapath.fast_path import Departing, HandedOver

__all__ = ["depart", "handle_connection", "resume_connection"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Opened:
    """What the open phase gave: the client's stream from now on and what its opening said."""

    stream: trio.abc.Stream
    """The socket, or TLS terminated by us."""
    opening: Opening
    sni_host: str | None = None
    """server_name of a TLS hello we terminated."""
    certificate_user: str | None = None
    """Subject CN of the client certificate we verified."""


class _Undecided:
    """Counts a connection in its acceptor's `Pending` from its accept (or hand-over) until its
    decision, or its end when it gets none."""

    __slots__ = ("_pending",)

    def __init__(self, pending: Pending) -> None:
        pending.count += 1
        self._pending: Pending | None = pending

    def decided(self) -> None:
        """The connection has its decision, or has ended (idempotent)."""
        if self._pending is not None:
            self._pending.count -= 1
            self._pending = None


async def handle_connection(client: trio.SocketStream, acceptor: ServedAcceptor, peer: Address) -> None:
    """One accepted client connection from `peer`, admitted (`ServedAcceptor.admit`): open,
    decide, plan, then answer or proxy; released when its socket is closed."""
    # The socket is closed here however the connection ends, also when cancelled before any
    # close (shutdown): never left to the GC. The stream on top is closed by `_serve`.
    undecided = _Undecided(acceptor.pending)
    try:
        with contextlib.closing(client.socket):
            try:
                local = Address.of(client.socket.getsockname())
            except OSError:  # the client reset before we looked
                return
            conn = acceptor.runtime.accept(acceptor.name, peer)
            opened = await _open(client, acceptor, conn, local)
            if opened is not None:
                await _serve(acceptor, conn, opened, undecided=undecided)
    finally:
        undecided.decided()
        acceptor.release(peer)


async def resume_connection(client: trio.SocketStream, acceptor: ServedAcceptor, handed: HandedOver) -> None:
    """Continue a connection the fast path opened (and maybe decided and planned): carry out its
    Proxy, or wait for the quorum and go on as for any other connection."""
    undecided = None if isinstance(handed.then, Proxy) else _Undecided(acceptor.pending)
    try:
        with contextlib.closing(client.socket):  # as in handle_connection
            opened = _Opened(stream=client, opening=handed.opening)
            await _serve(
                acceptor, handed.conn, opened, then=handed.then, retry=handed.retry, undecided=undecided
            )
    finally:
        if undecided is not None:
            undecided.decided()
        acceptor.release(handed.conn.peer)


async def depart(acceptor: ServedAcceptor, departing: Departing) -> None:
    """Finish a connection the fast path moves (`relay.leave`), then report its end and release its
    acceptor slot, as the fast path would have."""
    live = departing.conn
    client = trio.SocketStream(trio.socket.from_stdlib_socket(departing.client))
    upstream = trio.SocketStream(trio.socket.from_stdlib_socket(departing.upstream))
    try:
        async with client, upstream:
            await leave(client, upstream, live, departing.pending)
    finally:
        acceptor.runtime.unregister(live)
        try:
            acceptor.runtime.report(
                live.ended(trio.current_time() - departing.connected_at, CloseReason.EVACUATED)
            )
        finally:
            acceptor.release(live.conn.peer)


async def _open(
    client: trio.SocketStream, acceptor: ServedAcceptor, conn: ConnectionRef, local: Address
) -> _Opened | None:
    """The open phase under the handshake deadline; None when the client was closed (reported)."""
    config = acceptor.config
    timeout_s = config.handshake_timeout_ms / 1000 if config.handshake_timeout_ms else math.inf
    progress = SniffProgress()
    failed: OpeningFailed | None = None
    try:
        with trio.fail_after(timeout_s):
            return await _read_opening(client, acceptor, progress, conn.peer, local)
    except SniffError as exc:
        failed = opening_failed(conn, exc, bytes_read=progress.bytes_read)
    except trio.TooSlowError:
        failed = opening_failed(
            conn,
            OpeningFailure.TIMEOUT,
            protocol=progress.protocol,
            bytes_read=progress.bytes_read,
            timeout_s=timeout_s,
        )
    except trio.BrokenResourceError as exc:
        # Gone while we answered its opening, or a failed TLS handshake (the cause says why).
        if isinstance(exc.__cause__, ssl.SSLError):
            reason = str(exc.__cause__.reason or exc.__cause__)
            failed = opening_failed(conn, OpeningFailure.TLS, detail=reason)
    except trio.ClosedResourceError:
        pass
    if failed is not None:
        acceptor.runtime.report(failed)
    return None


async def _read_opening(
    client: trio.SocketStream,
    acceptor: ServedAcceptor,
    progress: SniffProgress,
    peer: Address,
    local: Address,
) -> _Opened:
    """PROXY header, TLS, then the client's opening when the key or the mode needs it.

    Raises:
        SniffError: bad bytes; trio.BrokenResourceError: a failed TLS handshake (as its cause).
    """
    config, source, initial = acceptor.config, peer, b""
    if config.proxy_protocol:
        progress.protocol = "proxy"
        header, initial = await read_proxy_header(client, progress)
        if header.source_ip is not None and not header.local:
            source = Address(
                header.source_ip, header.source_port if header.source_port is not None else peer.port
            )
            if header.dest_ip is not None and header.dest_port is not None:
                local = Address(header.dest_ip, header.dest_port)
    stream: trio.abc.Stream = client
    detect, sni_host, user = acceptor.detect, None, None
    if acceptor.tls is not None:
        hello = await read_until_sniffed(
            client, detect_tls, max_bytes=config.sniff_max_bytes, initial=initial, progress=progress
        )
        tls_stream = await open_terminated(client, hello.raw, acceptor.tls)
        stream, detect, initial = tls_stream, acceptor.detect_inner, b""
        sni_host, user = hello.sniffed.sni_host, certificate_user(tls_stream)
    opening = Opening(source=source, local=local, raw=initial)
    key_type = acceptor.runtime.config.key_type
    if must_sniff(config, key_type, terminated=acceptor.tls is not None, certificate_user=user is not None):
        progress.protocol = "detect"
        try:
            outcome = await read_until_sniffed(
                stream, detect, max_bytes=config.sniff_max_bytes, initial=initial, progress=progress
            )
        except SniffError as exc:
            await _answer(stream, exc.answer)  # what the protocol says before the close, if anything
            raise
        opening = Opening(
            source=source, local=local, raw=outcome.raw, sniffed=outcome.sniffed, replied=outcome.replied
        )
    return _Opened(stream=stream, opening=opening, sni_host=sni_host, certificate_user=user)


async def _serve(
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opened: _Opened,
    *,
    then: Proxy | Wait | None = None,
    retry: bool = True,
    undecided: _Undecided | None = None,
) -> None:
    """Decide (unless `then` says how far the fast path got), plan, and carry the plan out. The
    client's stream is closed on return, whichever way the connection ended (with TLS terminated
    by us, its close_notify goes first). `undecided` is told once the decision is made."""
    runtime, opening = acceptor.runtime, opened.opening
    async with opened.stream as client:
        if isinstance(then, Proxy):  # decided, planned and reported by the fast path
            await _proxy_or_refuse(client, acceptor, conn, opening, then, retry=retry)
            return
        started = trio.current_time()
        decision: RouteDecision | Wait
        if then is None:
            outcome = _decide_now(acceptor, conn, opened)
            if outcome is None:  # refused by the router's own authentication
                await _answer(client, not_authorized_answer(runtime.name, opening))
                return
            facts, decision = outcome
        else:  # a wait handed over by the fast path, which serves no TLS or authentication
            facts, decision = routing_facts(opening), then
        if not isinstance(decision, RouteDecision):
            decision = await _wait(acceptor, decision)
        action = plan(acceptor.config, runtime.name, opening, decision)
        latency_s = trio.current_time() - started
        runtime.report(decided(conn, opening, action, facts=facts, latency_s=latency_s))
        if undecided is not None:
            undecided.decided()
        match action:
            case Refuse() | Redirect():
                await _answer(client, action.answer)
            case Proxy():
                await _proxy_or_refuse(client, acceptor, conn, opening, action)
            case _:
                assert_never(action)


def _decide_now(
    acceptor: ServedAcceptor, conn: ConnectionRef, opened: _Opened
) -> tuple[ConnectionFacts, RouteDecision | Wait] | None:
    """Authenticate (the router's own store), gather the facts and decide as far as possible
    without waiting; None when authentication refused the client (reported)."""
    runtime, opening = acceptor.runtime, opened.opening
    sniffed = opening.sniffed
    auth = authenticate(
        acceptor.users,
        key_type=runtime.config.key_type,
        required=acceptor.config.require_authentication,
        certificate_user=opened.certificate_user,
        wire_user=None if sniffed is None else sniffed.user_name,
        password=None if sniffed is None else sniffed.password,
    )
    if auth.refused:
        runtime.report(NotAuthorized(conn=conn, reason=auth.reason))
        return None
    facts = routing_facts(opening, user=auth.user, roles=auth.roles, sni_host=opened.sni_host)
    return facts, runtime.decide_now(facts, trio.current_time())


async def _wait(acceptor: ServedAcceptor, wait: Wait) -> RouteDecision:
    """The shared cache's answer or the quorum wait, bounded by the routing deadline as well."""
    try:
        with trio.fail_after(acceptor.limits.route_timeout_s):
            return await acceptor.runtime.resolve(wait)
    except trio.TooSlowError:
        return RouteDecision(
            key=wait.key, status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.ROUTING_TIMED_OUT
        )


async def _answer(client: trio.abc.Stream, answer: bytes) -> None:
    """Send what the router says itself (nothing to send: just close); a client that is gone
    already is not an error."""
    if answer:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await client.send_all(answer)


class _Proxied:
    """How far a proxied connection got, for the events that end it."""

    __slots__ = ("connected_at", "detail", "failed", "reason")

    def __init__(self) -> None:
        self.connected_at: float | None = None
        self.failed: OSError | trio.TooSlowError | None = None
        """Why the connect failed, once it did."""
        self.reason = CloseReason.INTERNAL_ERROR
        """How it ended, unless the router closed it (`LiveConnection.closed_by`)."""
        self.detail = ""


async def _proxy_or_refuse(
    client: trio.abc.Stream,
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opening: Opening,
    action: Proxy,
    *,
    retry: bool = True,
) -> None:
    """Proxy; when the connect fails, once more to another ready target (redispatch, unless
    `retry` is False: the fast path redispatched already), and then, when that fails too or there
    is none, refuse in the client's protocol."""
    then = await _proxy(client, acceptor, conn, opening, action, retry=retry)
    if isinstance(then, Proxy):
        then = await _proxy(client, acceptor, conn, opening, then, retry=False)
    if isinstance(then, Refuse):
        await _answer(client, then.answer)


async def _proxy(
    client: trio.abc.Stream,
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opening: Opening,
    action: Proxy,
    *,
    retry: bool,
) -> Proxy | Refuse | None:
    """Connect, replay, relay; registered with the runtime meanwhile, so the router can close it
    (the TTL checker, a target that becomes not ready, a failover, shutdown) by cancelling its scope.

    Returns:
        What to do after a failed connect (`RouterRuntime.after_connect_failed`); None otherwise.
    """
    runtime, connector = acceptor.runtime, action.connector
    scope = trio.CancelScope()
    live = LiveConnection(
        conn=conn,
        node_id=action.target.node_id,
        address=endpoint(connector.host, connector.port),
        closer=lambda reason: scope.cancel(reason=reason.value),
        now=trio.current_time(),
        ttl_ms=acceptor.connection_ttl_ms,
        sniffed=opening.sniffed,
        opening=opening.raw,
        key=action.key,
        mode=acceptor.config.mode,
    )
    state = _Proxied()
    runtime.register(live)
    try:
        with scope:
            await _connect_and_relay(client, acceptor, conn, opening, action, live, state)
    except trio.Cancelled:
        state.reason = CloseReason.SHUTDOWN  # the only cancellation from outside: the grace period ended
        raise
    finally:
        runtime.unregister(live)  # before a refused connect makes the target un-ready
        then = _report_end(acceptor, conn, opening, action, live, state, retry=retry)
    return then


async def _connect_and_relay(
    client: trio.abc.Stream,
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opening: Opening,
    action: Proxy,
    live: LiveConnection,
    state: _Proxied,
) -> None:
    connector, began = action.connector, trio.current_time()
    try:
        with trio.fail_after(acceptor.limits.connect_timeout_s):
            upstream = await open_connection(connector.host, connector.port)
    except (OSError, trio.TooSlowError) as exc:
        state.failed = exc
        return
    state.connected_at = connected_at = trio.current_time()
    acceptor.runtime.report(live.connected_in(connected_at - began))
    async with upstream:  # closed by the relay, or here when the replay failed or was cancelled
        live.counts[0] = len(opening.raw)  # the client's replayed bytes count, as on the fast path
        state.detail = await _replay(client, upstream, acceptor, action, opening)
        if state.detail:
            state.reason = CloseReason.REPLAY_FAILED
            return
        activity = None if live.ttl_s == math.inf else live
        movable = None if live.cursor is None else live
        runtime = acceptor.runtime
        state.reason = await relay(
            client,
            upstream,
            live.counts,
            activity=activity,
            live=movable,
            first_answer=lambda data: runtime.first_answer(live, data),
        )


def _report_end(
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opening: Opening,
    action: Proxy,
    live: LiveConnection,
    state: _Proxied,
    *,
    retry: bool,
) -> Proxy | Refuse | None:
    """Report how a proxied connection ended: Closed once connected, else ConnectFailed, with
    what the client gets next when the connect itself failed."""
    runtime = acceptor.runtime
    if state.connected_at is not None:
        closed = live.ended(trio.current_time() - state.connected_at, state.reason, state.detail)
        runtime.report(closed)
        runtime.broker_failed(closed)  # passive health: nothing unless the broker dropped it
        return None
    then: Proxy | Refuse | None = None
    if state.failed is None:  # closed by the router (or shutdown) while connecting
        failed = live.connect_failed(state.reason)
    else:
        failure = connect_failed(state.failed)
        then = runtime.after_connect_failed(
            acceptor.config, opening, action, trio.current_time(), retry=retry
        )
        failed = live.connect_failed(failure, then)
    runtime.report(failed)
    if failed.cause is ConnectFailure.REFUSED:  # certain, unlike a timeout: skip the wait for a probe
        runtime.connect_refused(action.target, action.connector, failed.reason)
    return then


async def _replay(
    client: trio.abc.Stream,
    upstream: trio.SocketStream,
    acceptor: ServedAcceptor,
    action: Proxy,
    opening: Opening,
) -> str:
    """Hand the connection over to the target: what to replay, then, when the router answered a
    server-first opening itself, the target's version of that answer is read and dropped.

    Returns:
        "" when done; else what went wrong (the client got `action.if_rejected` when the target
        rejected the opening). Both streams are closed by their owners.
    """
    timeout_s = acceptor.limits.connect_timeout_s
    try:
        if action.replay:
            await upstream.send_all(action.replay)
        if action.preamble is None:
            return ""
        with trio.fail_after(timeout_s):
            protocol = "target" if opening.sniffed is None else opening.sniffed.protocol.value
            rest = await read_past_preamble(upstream, action.preamble, protocol=protocol)
        if action.owed or rest:
            await client.send_all(action.owed + rest)
    except SniffError as exc:
        await _answer(client, action.if_rejected)
        return f"target's opening rejected: {exc}"
    except trio.TooSlowError:
        return f"target sent no complete opening in {timeout_s:g} s"
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return "connection closed during the replay"
    return ""
