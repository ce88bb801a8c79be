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

A connection is one `_Connection`: what its phases learn (its stream, opening, action, the connect
under way) is kept there, not passed from phase to phase. Its events are built in router/core
(`opening_failed`, `decided`, and its `LiveConnection`'s `connected_in`, `connect_failed`,
`ended`); this module reports them.

This module decides nothing. Every phase has its own deadline. Closing has one owner per resource,
so the phases just return: the entry points close the client's socket, `_Connection.serve` the
client's stream (TLS included), `_Connection._connect_and_relay` the target's (the relay closes
both when it ends).
"""

from __future__ import annotations

import contextlib
import math
import ssl
from typing import TYPE_CHECKING, assert_never

import trio

from keys import SniffError
from keys.detect import detect_tls
from router.core.address import Address, endpoint
from router.core.auth import authenticate
from router.core.engine import DecisionReason, RouteDecision, RouteStatus, Wait
from router.core.events import CloseReason, ConnectFailure, GateOutcome, Held, NotAuthorized, OpeningFailure
from router.core.live import LiveConnection
from router.core.opening import opening_failed
from router.core.plan import (
    Opening,
    Proxy,
    Redirect,
    Refuse,
    decided,
    held_back,
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
    from router.core.stream_filter import StreamFilter
    from router.datapath.acceptor import Pending, ServedAcceptor
    from router.datapath.fast_path import Departing, HandedOver

__all__ = ["depart", "handle_connection", "resume_connection"]


async def handle_connection(client: trio.SocketStream, acceptor: ServedAcceptor, peer: Address) -> None:
    """One accepted client connection from `peer`, admitted (`ServedAcceptor.admit`): open,
    decide, plan, then answer or proxy; released when its socket is closed."""
    # The socket is closed here however the connection ends, also when cancelled before any
    # close (shutdown): never left to the GC. The stream on top is closed by `_Connection.serve`.
    connection: _Connection | None = None
    try:
        with contextlib.closing(client.socket):
            try:
                local = Address.of(client.socket.getsockname())
            except OSError:  # the client reset before we looked
                return
            connection = _Connection(acceptor, acceptor.runtime.accept(acceptor.name, peer), client)
            if await connection.open(client, local):
                await connection.serve()
    finally:
        if connection is not None:
            connection.decided()
        acceptor.release(peer)


async def resume_connection(client: trio.SocketStream, acceptor: ServedAcceptor, handed: HandedOver) -> None:
    """Continue a connection the fast path opened (and maybe decided and planned): carry out its
    Proxy, or wait for the quorum and go on as for any other connection."""
    decided_already = isinstance(handed.then, Proxy | Redirect)
    connection = _Connection(acceptor, handed.conn, client, undecided=not decided_already)
    connection.opening = handed.opening
    try:
        with contextlib.closing(client.socket):  # as in handle_connection
            await connection.serve(handed.then, retry=handed.retry)
    finally:
        connection.decided()
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
        acceptor.runtime.connections.unregister(live)
        try:
            acceptor.runtime.report(
                live.ended(trio.current_time() - departing.connected_at, CloseReason.EVACUATED)
            )
        finally:
            acceptor.release(live.conn.peer)


class _Connection:
    """One client connection on the trio path, from its accept (or hand-over) to its close: what
    its phases learn, kept in one place instead of passed from phase to phase.

    A plain slotted class rather than a dataclass: one is made for every connection, and the
    phases fill it in as they go (`opening` once opened, the connect under way once proxied).
    """

    __slots__ = (
        "acceptor",
        "action",
        "certificate_user",
        "conn",
        "connected_at",
        "detail",
        "failed",
        "live",
        "opening",
        "pending",
        "reason",
        "sift",
        "sni_host",
        "stream",
    )

    opening: Opening
    """What its opening phase read (set by `open`, or by the fast path before a hand-over)."""
    # The connect under way (set by `_proxy`, once per connect: a redispatch is a second one).
    action: Proxy
    """What the plan said: the target, its connector and what to replay."""
    live: LiveConnection
    """Its entry in the runtime's registry while connected or connecting."""
    connected_at: float | None
    """When the connect completed; None while connecting, or when it failed."""
    failed: OSError | trio.TooSlowError | None
    """Why the connect failed, once it did."""
    reason: CloseReason
    """How it ended, unless the router closed it (`LiveConnection.closed_by`)."""
    detail: str
    """More about REPLAY_FAILED."""
    sift: StreamFilter | None
    """What the target's bytes pass through on their way to the client (`Proxy.target_filter`)."""

    def __init__(
        self,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        stream: trio.abc.Stream,
        *,
        undecided: bool = True,
    ) -> None:
        """Start a connection's bookkeeping.

        Args:
            acceptor: the acceptor it came in on.
            conn: its reference (reported Accepted already).
            stream: its client's socket.
            undecided: whether it has no decision yet: it counts in its acceptor's `Pending` until
                `decided`.
        """
        self.acceptor = acceptor
        self.conn = conn
        self.stream = stream
        """The client's stream: its socket, or TLS terminated by us once `open` set it up."""
        self.sni_host: str | None = None
        """server_name of a TLS hello we terminated."""
        self.certificate_user: str | None = None
        """Subject CN of the client certificate we verified."""
        self.pending: Pending | None = None
        """The acceptor's count of undecided connections while this one is in it."""
        if undecided:
            self.pending = acceptor.pending
            self.pending.count += 1

    def decided(self) -> None:
        """The connection has its decision, or has ended: it leaves its acceptor's `Pending`
        (idempotent)."""
        if self.pending is not None:
            self.pending.count -= 1
            self.pending = None

    # -- open --

    async def open(self, client: trio.SocketStream, local: Address) -> bool:
        """The open phase under the handshake deadline; False when the client was closed (reported).

        Args:
            client: its socket (`stream` until TLS is terminated).
            local: the address it connected to.
        """
        config = self.acceptor.config
        timeout_s = config.handshake_timeout_ms / 1000 if config.handshake_timeout_ms else math.inf
        progress = SniffProgress()
        failed: OpeningFailed | None = None
        try:
            with trio.fail_after(timeout_s):
                await self._read_opening(client, progress, local)
                return True
        except SniffError as exc:
            failed = opening_failed(self.conn, exc, bytes_read=progress.bytes_read)
        except trio.TooSlowError:
            failed = opening_failed(
                self.conn,
                OpeningFailure.TIMEOUT,
                protocol=progress.protocol,
                bytes_read=progress.bytes_read,
                timeout_s=timeout_s,
            )
        except trio.BrokenResourceError as exc:
            # Gone while we answered its opening, or a failed TLS handshake (the cause says why).
            if isinstance(exc.__cause__, ssl.SSLError):
                reason = str(exc.__cause__.reason or exc.__cause__)
                failed = opening_failed(self.conn, OpeningFailure.TLS, detail=reason)
        except trio.ClosedResourceError:
            pass
        if failed is not None:
            self.acceptor.runtime.report(failed)
        return False

    async def _read_opening(self, client: trio.SocketStream, progress: SniffProgress, local: Address) -> None:
        """PROXY header, TLS, then the client's opening when the key or the mode needs it; sets
        `stream`, `opening`, `sni_host` and `certificate_user` once done.

        Raises:
            SniffError: bad bytes; trio.BrokenResourceError: a failed TLS handshake (as its cause).
        """
        acceptor, peer = self.acceptor, self.conn.peer
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
        if must_sniff(
            config, key_type, terminated=acceptor.tls is not None, certificate_user=user is not None
        ):
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
        self.stream, self.opening, self.sni_host, self.certificate_user = stream, opening, sni_host, user

    # -- decide, plan, answer --

    async def serve(self, then: Proxy | Redirect | Wait | None = None, *, retry: bool = True) -> None:
        """Decide (unless `then` says how far the fast path got), plan, and carry the plan out. The
        client's stream is closed on return, whichever way the connection ended (with TLS terminated
        by us, its close_notify goes first). The connection is `decided` once its decision is made.

        Args:
            then: a Proxy or Redirect the fast path decided, planned and reported (a Redirect waits
                for its target's gate here); a wait it handed over; None
                for a connection this path opened.
            retry: whether a failed connect of `then` may still go to another target.
        """
        runtime, opening = self.acceptor.runtime, self.opening
        async with self.stream as client:
            if isinstance(then, Proxy):  # decided, planned and reported by the fast path
                await self._proxy_or_refuse(then, retry=retry)
                return
            if isinstance(then, Redirect):  # likewise; its target's gate makes it wait
                await self._redirect(then)
                return
            started = trio.current_time()
            decision: RouteDecision | Wait
            if then is None:
                outcome = self._decide_now()
                if outcome is None:  # refused by the router's own authentication
                    await _answer(client, not_authorized_answer(runtime.name, opening))
                    return
                facts, decision = outcome
            else:  # a wait handed over by the fast path, which serves no TLS or authentication
                facts, decision = routing_facts(opening), then
            if not isinstance(decision, RouteDecision):
                decision = await self._wait(decision)
            action = plan(self.acceptor.config, runtime.name, opening, decision)
            latency_s = trio.current_time() - started
            runtime.report(decided(self.conn, opening, action, facts=facts, latency_s=latency_s))
            self.decided()
            match action:
                case Refuse():
                    await _answer(client, action.answer)
                case Redirect():
                    await self._redirect(action)
                case Proxy():
                    await self._proxy_or_refuse(action)
                case _:
                    assert_never(action)

    def _decide_now(self) -> tuple[ConnectionFacts, RouteDecision | Wait] | None:
        """Authenticate (the router's own store), gather the facts and decide as far as possible
        without waiting; None when authentication refused the client (reported)."""
        acceptor, opening = self.acceptor, self.opening
        runtime, sniffed = acceptor.runtime, opening.sniffed
        auth = authenticate(
            acceptor.users,
            key_type=runtime.config.key_type,
            required=acceptor.config.require_authentication,
            certificate_user=self.certificate_user,
            wire_user=None if sniffed is None else sniffed.user_name,
            password=None if sniffed is None else sniffed.password,
        )
        if auth.refused:
            runtime.report(NotAuthorized(conn=self.conn, reason=auth.reason))
            return None
        facts = routing_facts(opening, user=auth.user, roles=auth.roles, sni_host=self.sni_host)
        return facts, runtime.decide_now(facts, trio.current_time())

    async def _wait(self, wait: Wait) -> RouteDecision:
        """The shared cache's answer or the quorum wait, bounded by the routing deadline as well."""
        try:
            with trio.fail_after(self.acceptor.limits.route_timeout_s):
                return await self.acceptor.runtime.resolve(wait)
        except trio.TooSlowError:
            return RouteDecision(
                key=wait.key, status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.ROUTING_TIMED_OUT
            )

    # -- connect, replay, relay --

    async def _pass_gate(self, node_id: str, *, slot: bool) -> tuple[GateOutcome, float] | None:
        """Pass the target's gate (`maxConnections`, `connectRate`: router/runtime/gates.py),
        waiting in its queue if it must. None: let in at once; else how the wait ended and how long
        it took (let in after waiting, or held back: QUEUE_FULL, QUEUE_TIMEOUT). Let in, it holds a
        slot when `slot`, released when the connection ends."""
        gates = self.acceptor.runtime.pool.gates
        if not gates.limited(node_id):
            return None
        began = trio.current_time()
        outcome = await gates.enter(node_id, slot=slot)
        return None if outcome is None else (outcome, trio.current_time() - began)

    def _held(
        self, key: str, node_id: str, waited: tuple[GateOutcome, float], moved_to: str | None = None
    ) -> None:
        outcome, waited_s = waited
        self.acceptor.runtime.report(
            Held(
                conn=self.conn,
                key=key,
                node_id=node_id,
                outcome=outcome,
                waited_s=waited_s,
                moved_to=moved_to,
            )
        )

    async def _redirect(self, action: Redirect) -> None:
        """Send the redirect once the target's gate lets one more client go to it (a redirect takes
        a connect token); held back, the client is refused instead."""
        node_id = action.target.node_id
        waited = await self._pass_gate(node_id, slot=False)
        answer = action.answer
        if waited is not None:
            self._held(action.key, node_id, waited)
            if waited[0] is not GateOutcome.ADMITTED:
                answer = held_back(self.acceptor.runtime.name, self.opening, action.key, waited[0]).answer
        await _answer(self.stream, answer)

    async def _proxy_or_refuse(self, action: Proxy, *, retry: bool = True) -> None:
        """Pass the target's gate, then proxy; when the connect fails, once more to another ready
        target (redispatch, unless `retry` is False: the fast path redispatched already), and then,
        when that fails too or there is none, refuse in the client's protocol. Held back by the
        gate, a key that may move goes to another target (once), else it is refused."""
        runtime = self.acceptor.runtime
        then: Proxy | Refuse | None = action
        for again in (retry, False):
            if not isinstance(then, Proxy):
                break
            node_id, key = then.target.node_id, then.key
            waited = await self._pass_gate(node_id, slot=True)
            if waited is not None and waited[0] is not GateOutcome.ADMITTED:
                then = runtime.after_connect_failed(
                    self.acceptor.config,
                    self.opening,
                    then,
                    trio.current_time(),
                    retry=again,
                    held=waited[0],
                )
                self._held(key, node_id, waited, then.target.node_id if isinstance(then, Proxy) else None)
                continue
            if waited is not None:
                self._held(key, node_id, waited)
            try:
                then = await self._proxy(then, retry=again)
            finally:
                runtime.pool.gates.release(node_id)
        if isinstance(then, Refuse):
            await _answer(self.stream, then.answer)

    async def _proxy(self, action: Proxy, *, retry: bool) -> Proxy | Refuse | None:
        """Connect, replay, relay; registered with the runtime meanwhile, so the router can close
        it (the TTL checker, a target that becomes not ready, a failover, shutdown) by cancelling
        its scope.

        Returns:
            What to do after a failed connect (`RouterRuntime.after_connect_failed`); None otherwise.
        """
        runtime, connector = self.acceptor.runtime, action.connector
        scope = trio.CancelScope()
        live = LiveConnection(
            conn=self.conn,
            node_id=action.target.node_id,
            address=endpoint(connector.host, connector.port),
            closer=lambda reason: scope.cancel(reason=reason.value),
            now=trio.current_time(),
            ttl_ms=self.acceptor.connection_ttl_ms,
            sniffed=self.opening.sniffed,
            opening=self.opening.raw,
            key=action.key,
            mode=self.acceptor.config.mode,
        )
        self.action, self.live = action, live
        self.connected_at, self.failed, self.reason, self.detail = None, None, CloseReason.INTERNAL_ERROR, ""
        runtime.connections.register(live)
        try:
            with scope:
                await self._connect_and_relay()
        except trio.Cancelled:
            self.reason = CloseReason.SHUTDOWN  # the only cancellation from outside: the grace period ended
            raise
        finally:
            runtime.connections.unregister(live)  # before a refused connect makes the target un-ready
            then = self._report_end(retry=retry)
        return then

    async def _connect_and_relay(self) -> None:
        acceptor, live = self.acceptor, self.live
        connector, began = self.action.connector, trio.current_time()
        try:
            with trio.fail_after(acceptor.limits.connect_timeout_s):
                upstream = await open_connection(connector.host, connector.port)
        except (OSError, trio.TooSlowError) as exc:
            self.failed = exc
            return
        self.connected_at = connected_at = trio.current_time()
        acceptor.runtime.report(live.connected_in(connected_at - began))
        async with upstream:  # closed by the relay, or here when the replay failed or was cancelled
            make_filter = self.action.target_filter
            self.sift = None if make_filter is None else make_filter()
            live.counts[0] = len(self.opening.raw)  # the client's replayed bytes count, as on the fast path
            self.detail = await self._replay(upstream)
            if self.detail:
                self.reason = CloseReason.REPLAY_FAILED
                return
            activity = None if live.ttl_s == math.inf else live
            movable = None if live.cursor is None else live
            runtime = acceptor.runtime
            self.reason = await relay(
                self.stream,
                upstream,
                live.counts,
                activity=activity,
                live=movable,
                first_answer=lambda data: runtime.pool.first_answer(live, data),
                sift=self.sift,
            )

    def _report_end(self, *, retry: bool) -> Proxy | Refuse | None:
        """Report how a proxied connection ended: Closed once connected, else ConnectFailed, with
        what the client gets next when the connect itself failed."""
        runtime, live, action = self.acceptor.runtime, self.live, self.action
        if self.connected_at is not None:
            closed = live.ended(trio.current_time() - self.connected_at, self.reason, self.detail)
            runtime.report(closed)
            runtime.pool.broker_failed(closed)  # passive health: nothing unless the broker dropped it
            return None
        then: Proxy | Refuse | None = None
        if self.failed is None:  # closed by the router (or shutdown) while connecting
            failed = live.connect_failed(self.reason)
        else:
            failure = connect_failed(self.failed)
            then = runtime.after_connect_failed(
                self.acceptor.config, self.opening, action, trio.current_time(), retry=retry
            )
            failed = live.connect_failed(failure, then)
        runtime.report(failed)
        if failed.cause is ConnectFailure.REFUSED:  # certain, unlike a timeout: skip the wait for a probe
            runtime.pool.connect_refused(action.target, action.connector, failed.reason)
        return then

    async def _replay(self, upstream: trio.SocketStream) -> str:
        """Hand the connection over to the target: what to replay, then, when the router answered a
        server-first opening itself, the target's version of that answer is read and dropped.

        Returns:
            "" when done; else what went wrong (the client got `action.if_rejected` when the target
            rejected the opening). Both streams are closed by their owners.
        """
        action, client = self.action, self.stream
        timeout_s = self.acceptor.limits.connect_timeout_s
        try:
            if action.replay:
                await upstream.send_all(action.replay)
            if action.preamble is None:
                return ""
            with trio.fail_after(timeout_s):
                sniffed = self.opening.sniffed
                protocol = "target" if sniffed is None else sniffed.protocol.value
                rest = await read_past_preamble(upstream, action.preamble, protocol=protocol)
            if rest and self.sift is not None:
                rest = bytes(self.sift.feed(rest))
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


async def _answer(client: trio.abc.Stream, answer: bytes) -> None:
    """Send what the router says itself (nothing to send: just close); a client that is gone
    already is not an error."""
    if answer:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await client.send_all(answer)
