"""One client connection through fixed phases: opening -> route -> answer, or connect -> replay -> relay.

The opening phase reads a PROXY protocol header (acceptors that enable it) and, when the key or
the mode needs the protocol, sniffs the handshake (answering server-first steps itself), all
under the acceptor's handshake deadline and byte cap.

This module turns routing decisions into actions and decides nothing itself. Every phase has its
own deadline. Relaying is two pump tasks in one nursery: EOF in one direction becomes `send_eof()`
on the other (half-close), and the connection is closed only when both directions are done; a
reset in either direction closes both at once.

Closing has one owner per resource, so the phases just return: the entry points
(`handle_connection`, `resume_connection`) close the client's socket, `_route_and_serve` the
client's stream (TLS included), `_proxy` the target's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from keys import ConnectionFacts, KeyType, SniffError, WireProtocol
from keys.detect import detect_tls
from keys.proxy_protocol import encode_v1, encode_v2
from router.config.settings import AcceptorMode
from router.core import answers
from router.core.auth import authenticate
from router.core.engine import RouteStatus
from router.core.live import ProxiedConnection
from router.datapath.net import describe_oserror, open_connection
from router.datapath.reading import SniffProgress, read_past_preamble, read_proxy_header, read_until_sniffed
from router.datapath.tls import PrefixedStream, certificate_user

if TYPE_CHECKING:
    from keys import Sniffed
    from keys.detect import Detector
    from keys.users import UserStore
    from pools import Connector, Target
    from router.config.settings import AcceptorConfig
    from router.core.engine import RouteDecision
    from router.datapath.fast_path import HandedOver
    from router.runtime import RouterRuntime

__all__ = ["RELAY_CHUNK_BYTES", "AcceptorIO", "ConnectionLimits", "handle_connection", "relay"]

log = logging.getLogger("router.conn")

RELAY_CHUNK_BYTES: Final = 256 * 1024
"""Bytes asked per read while relaying. Large reads cut syscalls per byte: with 64 KiB a trio relay
moved 3.4 Gbit/s on loopback, with 1 MiB 8.7 (ENVIRONMENT.md §6a); 256 KiB keeps most of that."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """Deadlines of the phases of one connection."""

    route_timeout_s: float = 10.0
    """Upper bound of the routing phase (the quorum wait is bounded by quorum-timeout first)."""
    connect_timeout_s: float = 5.0
    """Deadline of the connect to the chosen target (HAProxy's usual `timeout connect 5s`)."""


def _peer_of(stream: trio.SocketStream) -> tuple[str, int]:
    name = stream.socket.getpeername()
    return str(name[0]), int(name[1])


def _local_of(stream: trio.SocketStream) -> tuple[str, int]:
    name = stream.socket.getsockname()
    return str(name[0]), int(name[1])


async def _pump(
    source: trio.abc.ReceiveStream,
    sink: trio.abc.SendStream,
    counter: list[int],
    activity: ProxiedConnection | None = None,
) -> bool:
    """Copy until EOF; half-close the sink. Returns False when the sink cannot half-close (TLS).

    With `activity` (the client's direction of a connection under a TTL) each read stamps
    `activity.last_read_at`, a float store; the TTL checker reads it (`router/services/ttl_checks.py`).
    """
    while True:
        data = await source.receive_some(RELAY_CHUNK_BYTES)
        if not data:
            break
        if activity is not None:
            activity.last_read_at = trio.current_time()
            if activity.peek_first_bytes:  # once: an unsniffed client may be exempt MQTT
                activity.first_bytes(data)
        counter[0] += len(data)
        await sink.send_all(data)
    if not isinstance(sink, trio.abc.HalfCloseableStream):
        return False
    # Half-close: the other direction keeps flowing until its own EOF.
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await sink.send_eof()
    return True


async def relay(
    client: trio.abc.Stream,
    upstream: trio.abc.Stream,
    counts: list[int],
    *,
    activity: ProxiedConnection | None = None,
) -> None:
    """Relay bytes both ways until both directions ended or one broke, then close both streams.

    Args:
        client: the client's stream (a socket, or TLS terminated by us).
        upstream: the target's stream.
        counts: `[client -> target, target -> client]` byte counters, updated as bytes flow (so
            they are right even when the relay is cancelled).
        activity: a connection under a connection TTL: the time of every read from the client is
            stored in its `last_read_at`. None when there is no TTL (nothing done per read).
    """
    up, down = [0], [0]
    try:
        async with trio.open_nursery() as nursery:

            async def guarded(
                src: trio.abc.Stream,
                dst: trio.abc.Stream,
                c: list[int],
                activity: ProxiedConnection | None = None,
            ) -> None:
                try:
                    if not await _pump(src, dst, c, activity):
                        # TLS has no half-close: the target's EOF ends the whole connection.
                        nursery.cancel_scope.cancel(reason="EOF towards a stream without half-close")
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    # A reset or failure in one direction ends the whole connection.
                    nursery.cancel_scope.cancel(reason="the other direction broke")

            nursery.start_soon(guarded, client, upstream, up, activity)
            nursery.start_soon(guarded, upstream, client, down)
    finally:
        with trio.CancelScope(shield=True):  # closing must finish even when we are cancelled
            await upstream.aclose()
            await client.aclose()
            counts[0], counts[1] = up[0], down[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptorIO:
    """What an acceptor's connections share: how to detect protocols, and TLS termination."""

    detect: Detector
    """Detection of the first bytes (TLS included, for SNI peeking on passthrough)."""
    detect_inner: Detector
    """Detection inside TLS terminated by us."""
    tls: ssl.SSLContext | None = None
    """The server context when the acceptor terminates TLS."""
    users: UserStore | None = None
    """The acceptor's user/role store for the router's own authentication."""
    connection_ttl_ms: int = -1
    """The connection TTL in force on the acceptor (`<connection-ttl-override>` applied); -1 = none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Opening:
    """What the opening phase learnt about a connection."""

    stream: trio.abc.Stream
    """The client's stream from now on: the socket, or TLS terminated by us."""
    peer: str
    """`ip:port` of the TCP peer (the load balancer, behind a PROXY header)."""
    source_ip: str
    """The client's address: the peer's, or the one in the PROXY header."""
    source_port: int
    """The client's port, from the same place as `source_ip`."""
    local: tuple[str, int]
    """The address the client connected to: ours, or the original one in the PROXY header (a
    PROXY header we send towards the target names it, so chains keep the original)."""
    raw: bytes = b""
    """Client bytes read so far (inside TLS when terminated), replayed to the target unchanged."""
    sniffed: Sniffed | None = None
    replied: bytes = b""
    """What the router already answered (server-first openings)."""
    sni_host: str | None = None
    """server_name of a TLS hello we terminated."""
    certificate_user: str | None = None
    """Subject CN of the client certificate we verified."""


def _needs_sniffing(
    acceptor: AcceptorConfig, runtime: RouterRuntime, *, terminated: bool, certificate_user: bool
) -> bool:
    # SOURCE_IP in proxy mode needs no protocol knowledge: any protocol passes untouched and the
    # connection goes to the target at once, which is also the fastest path. With TLS terminated
    # by us SNI is already known, and a verified client certificate names the user (it comes
    # before the name on the wire, SPEC A2), so those keys need nothing more either.
    key_type = runtime.config.key_type
    if acceptor.mode is not AcceptorMode.PROXY or acceptor.require_authentication:
        return True
    if key_type is KeyType.ROLE_NAME:
        return not certificate_user
    if key_type is KeyType.SOURCE_IP:
        return False
    if terminated and key_type is KeyType.SNI_HOST:
        return False
    return not (certificate_user and key_type is KeyType.USER_NAME)


async def _open(
    client: trio.SocketStream,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    io: AcceptorIO,
    progress: SniffProgress,
    *,
    peer: str,
    source: tuple[str, int],
) -> _Opening:
    source_ip, source_port = source
    local = _local_of(client)
    initial = b""
    if acceptor.proxy_protocol:
        progress.protocol = "proxy"
        header, initial = await read_proxy_header(client, progress)
        if header.source_ip is not None and not header.local:
            source_ip = header.source_ip
            source_port = header.source_port if header.source_port is not None else source_port
            if header.dest_ip is not None and header.dest_port is not None:
                local = (header.dest_ip, header.dest_port)
    stream: trio.abc.Stream = client
    detect, sni_host, user = io.detect, None, None
    if io.tls is not None:
        hello = await read_until_sniffed(
            client, detect_tls, max_bytes=acceptor.sniff_max_bytes, initial=initial, progress=progress
        )
        tls_stream = trio.SSLStream(PrefixedStream(client, hello.raw), io.tls, server_side=True)
        await tls_stream.do_handshake()
        stream, detect, initial = tls_stream, io.detect_inner, b""
        sni_host, user = hello.sniffed.sni_host, certificate_user(tls_stream)
    base = _Opening(
        stream=stream,
        peer=peer,
        source_ip=source_ip,
        source_port=source_port,
        local=local,
        raw=initial,
        sni_host=sni_host,
        certificate_user=user,
    )
    if not _needs_sniffing(
        acceptor, runtime, terminated=io.tls is not None, certificate_user=user is not None
    ):
        return base
    progress.protocol = "detect"
    outcome = await read_until_sniffed(
        stream, detect, max_bytes=acceptor.sniff_max_bytes, initial=initial, progress=progress
    )
    return dataclasses.replace(base, raw=outcome.raw, sniffed=outcome.sniffed, replied=outcome.replied)


async def handle_connection(
    client: trio.SocketStream,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
    io: AcceptorIO,
) -> None:
    """One accepted client connection: opening, decision, then an answer or a proxied session."""
    # The socket is closed here however the connection ends, also when cancelled before any
    # close (shutdown): never left to the GC. The stream on top is closed by `_route_and_serve`.
    with contextlib.closing(client.socket):
        try:
            source = _peer_of(client)
        except OSError:  # the client reset before we looked
            return
        peer = f"{source[0]}:{source[1]}"
        runtime.count_accepted(acceptor.name)
        timeout_s = acceptor.handshake_timeout_ms / 1000 if acceptor.handshake_timeout_ms else math.inf
        progress = SniffProgress()
        try:
            with trio.fail_after(timeout_s):
                opening = await _open(client, acceptor, runtime, io, progress, peer=peer, source=source)
        except SniffError as exc:
            runtime.report_opening_rejected(acceptor.name, peer, exc)
            return
        except trio.TooSlowError:
            runtime.report_opening_timeout(
                acceptor.name, peer, progress.protocol, timeout_s, progress.bytes_read
            )
            return
        except trio.BrokenResourceError as exc:
            # Gone while we answered its opening, or a failed TLS handshake (the cause says why).
            if isinstance(exc.__cause__, ssl.SSLError):
                runtime.metrics.client_errors.labels(acceptor.name, "tls").inc()
                log.warning(
                    "peer=%s acceptor=%s protocol=tls handshake failed: %s",
                    peer,
                    acceptor.name,
                    exc.__cause__.reason or exc.__cause__,
                )
            return
        except trio.ClosedResourceError:
            return
        await _route_and_serve(acceptor, runtime, limits, io, opening)


async def resume_connection(
    client: trio.SocketStream,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
    io: AcceptorIO,
    handed: HandedOver,
) -> None:
    """Continue a connection whose opening the fast path read (router/datapath/fast_path.py): the decision
    (unless the fast path took it) with the quorum wait, then an answer or a proxied session, as
    for any other connection."""
    with contextlib.closing(client.socket):  # as in handle_connection
        peer = handed.peer
        source_ip, _, port_text = peer.rpartition(":")
        try:
            local = _local_of(client)
        except OSError:  # the client reset meanwhile
            return
        opening = _Opening(
            stream=client,
            peer=peer,
            source_ip=source_ip.strip("[]"),
            source_port=int(port_text),
            local=local,
            raw=handed.raw,
            sniffed=handed.sniffed,
            replied=handed.replied,
        )
        await _route_and_serve(acceptor, runtime, limits, io, opening, decided=handed.decision)


async def _route_and_serve(
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
    io: AcceptorIO,
    opening: _Opening,
    *,
    decided: RouteDecision | None = None,
) -> None:
    """Authenticate, decide (unless `decided` already is), then answer or proxy. The client's
    stream is closed on return, whichever way the connection ended (with TLS terminated by us,
    its close_notify goes first)."""
    async with opening.stream as client:
        peer, sniffed = opening.peer, opening.sniffed
        auth = authenticate(
            io.users,
            key_type=runtime.config.key_type,
            required=acceptor.require_authentication,
            certificate_user=opening.certificate_user,
            wire_user=None if sniffed is None else sniffed.user_name,
            password=None if sniffed is None else sniffed.password,
        )
        if auth.refused:
            runtime.metrics.auth_failures.labels(acceptor.name).inc()
            log.warning(
                "peer=%s acceptor=%s router=%s outcome=NOT_AUTHORIZED reason=%s",
                peer,
                acceptor.name,
                runtime.name,
                auth.reason,
            )
            if sniffed is not None:
                await _say(client, opening, answers.not_authorized(sniffed, runtime.name))
            return
        facts = ConnectionFacts(
            source_ip=opening.source_ip,
            client_id=None if sniffed is None else sniffed.client_id,
            # SPEC A2: the user the router authenticated (certificate or store) before the wire's name.
            user_name=auth.user or (None if sniffed is None else sniffed.user_name),
            sni_host=opening.sni_host or (None if sniffed is None else sniffed.sni_host),
            roles=auth.roles,
        )
        try:
            with trio.fail_after(limits.route_timeout_s):
                decision = decided or await runtime.decide(facts)
        except trio.TooSlowError:
            log.warning(
                "peer=%s router=%s outcome=REFUSED_UNAVAILABLE reason=routing timed out", peer, runtime.name
            )
            await _refuse(client, runtime, RouteStatus.REFUSED_UNAVAILABLE, opening)
            return
        target = decision.target
        if decision.status is not RouteStatus.OK or target is None:
            log.info(
                "peer=%s router=%s key=%s outcome=%s reason=%s",
                peer,
                runtime.name,
                decision.key,
                decision.status.value,
                decision.reason,
            )
            await _refuse(client, runtime, decision.status, opening)
            return
        connector = decision.connector  # the active member of an HA pair
        if connector is None:
            log.warning(
                "peer=%s router=%s key=%s outcome=REFUSED_USE_ANOTHER reason=the decision is the local "
                "target and no <local-target-connector-ref> is configured",
                peer,
                runtime.name,
                decision.key,
            )
            await _refuse(client, runtime, RouteStatus.REFUSED_USE_ANOTHER, opening)
            return
        if answers.redirects(acceptor.mode, sniffed) and sniffed is not None:
            runtime.report_redirect(peer, decision.key, target.node_id, sniffed.protocol)
            await _say(client, opening, answers.redirect(sniffed, opening.raw, connector, runtime.name))
            return
        runtime.count_decision(RouteStatus.OK)
        runtime.counts.opened(target.node_id)
        conn = ProxiedConnection(
            peer=peer,
            acceptor=acceptor.name,
            node_id=target.node_id,
            address=(connector.host, connector.port),
            ttl_ms=io.connection_ttl_ms,
            sniffed=sniffed,
            now=trio.current_time(),
            opening=opening.raw if sniffed is None else b"",
        )
        runtime.connections.add(conn)
        try:
            # The TTL checker and pool changes cancel this scope to close the connection.
            with conn.cancel_scope:
                await _proxy(
                    client, acceptor, runtime, limits, opening, decision.key, target, connector, conn
                )
        finally:
            runtime.connections.discard(conn)
            runtime.counts.closed(target.node_id)


async def _refuse(
    client: trio.abc.Stream, runtime: RouterRuntime, status: RouteStatus, opening: _Opening
) -> None:
    """Count what the client gets, and tell it in its protocol where SPEC A6 says how."""
    runtime.count_decision(status)
    if opening.sniffed is not None:
        await _say(client, opening, answers.refusal(opening.sniffed, status, runtime.name))


async def _say(client: trio.abc.Stream, opening: _Opening, said: bytes) -> None:
    """Send the client what it is still owed of the opening, then `said` (nothing when empty);
    a client that is gone already is not an error."""
    if not said or opening.sniffed is None:
        return
    owed = answers.owed_opening(opening.sniffed, opening.raw, opening.replied)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await client.send_all(owed + said)


async def _proxy(
    client: trio.abc.Stream,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
    opening: _Opening,
    key: str,
    target: Target,
    connector: Connector,
    conn: ProxiedConnection,
) -> None:
    peer = opening.peer
    try:
        with trio.fail_after(limits.connect_timeout_s):
            upstream = await open_connection(connector.host, connector.port)
    except (OSError, trio.TooSlowError) as exc:
        runtime.connections.discard(conn)  # never established: not one for the pool to close
        reason = "timed out" if isinstance(exc, trio.TooSlowError) else describe_oserror(exc)
        if isinstance(exc, ConnectionRefusedError):  # certain, unlike a timeout: skip the wait for a probe
            runtime.connect_refused(target, connector, reason)
        runtime.report_connect_failure(peer, key, target.node_id, reason)
        return
    runtime.report_connected(peer, key, target.node_id)
    counts = [0, 0]
    active = runtime.relay_metrics(target.node_id).active
    active.inc()
    started = trio.current_time()
    try:
        async with upstream:  # closed by the relay, or here when the replay failed or was cancelled
            if await _replay(client, upstream, acceptor, limits, opening, runtime.name):
                await relay(client, upstream, counts, activity=None if conn.ttl_s == math.inf else conn)
    finally:
        active.dec()
        # conn.closed_by: the reason when the router closed it itself
        runtime.report_closed(peer, target.node_id, counts, trio.current_time() - started, conn.closed_by)


async def _replay(
    client: trio.abc.Stream,
    upstream: trio.SocketStream,
    acceptor: AcceptorConfig,
    limits: ConnectionLimits,
    opening: _Opening,
    router_name: str,
) -> bool:
    """Hand the connection over to the target: PROXY header, the client's bytes, and the opening.

    Returns:
        False when the target's opening was unusable (logged); both streams are closed by their
        owners (see the module docstring).
    """
    peer, sniffed = opening.peer, opening.sniffed
    try:
        if acceptor.send_proxy_protocol is not None:
            await upstream.send_all(_proxy_header_for(opening, acceptor.send_proxy_protocol))
        if opening.raw:
            await upstream.send_all(opening.raw)
        if sniffed is None:
            return True
        owed = answers.owed_opening(sniffed, opening.raw, opening.replied)
        measure = answers.target_preamble_measure(sniffed, opening.raw)
        rest = b""
        if measure is not None:
            with trio.fail_after(limits.connect_timeout_s):
                rest = await read_past_preamble(upstream, measure, protocol=sniffed.protocol.value)
        if owed or rest:
            await client.send_all(owed + rest)
        return True
    except SniffError as exc:
        log.warning("peer=%s protocol=%s target's opening rejected: %s", peer, exc.protocol, exc.reason)
        if sniffed is not None and sniffed.protocol is WireProtocol.AMQP:
            # The client already heard "SASL ok" from us and waits for the AMQP header: tell it
            # in AMQP that the broker refused, instead of a bare close it reads as a framing error.
            await _say(client, opening, answers.not_authorized(sniffed, router_name))
    except trio.TooSlowError:
        log.warning("peer=%s target sent no complete opening in %g s", peer, limits.connect_timeout_s)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("peer=%s connection closed during the replay", peer)
    return False


def _proxy_header_for(opening: _Opening, version: str) -> bytes:
    dest_ip, dest_port = opening.local
    if version == "v1":
        return encode_v1(opening.source_ip, opening.source_port, dest_ip, dest_port)
    return encode_v2(opening.source_ip, opening.source_port, dest_ip, dest_port)
