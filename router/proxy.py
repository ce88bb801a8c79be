"""One client connection through fixed phases: facts -> route -> connect -> relay.

This module turns routing decisions into actions and decides nothing itself. Every phase has its
own deadline. Relaying is two pump tasks in one nursery: EOF in one direction becomes `send_eof()`
on the other (half-close), and the connection is closed only when both directions are done; a
reset in either direction closes both at once.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from keys import ConnectionFacts
from router.engine import RouteStatus
from router.net import describe_oserror, open_connection

if TYPE_CHECKING:
    from router.routing import RouterRuntime
    from router.settings import AcceptorConfig

__all__ = ["RELAY_CHUNK_BYTES", "ConnectionLimits", "handle_connection", "relay"]

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


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, counter: list[int]) -> None:
    while True:
        data = await source.receive_some(RELAY_CHUNK_BYTES)
        if not data:
            break
        counter[0] += len(data)
        await sink.send_all(data)
    # Half-close: the other direction keeps flowing until its own EOF.
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await sink.send_eof()


async def relay(client: trio.SocketStream, upstream: trio.SocketStream, counts: list[int]) -> None:
    """Relay bytes both ways until both directions ended or one broke, then close both streams.

    Args:
        client: the client's stream.
        upstream: the target's stream.
        counts: `[client -> target, target -> client]` byte counters, updated as bytes flow (so
            they are right even when the relay is cancelled).
    """
    up, down = [0], [0]
    try:
        async with trio.open_nursery() as nursery:

            async def guarded(src: trio.SocketStream, dst: trio.SocketStream, c: list[int]) -> None:
                try:
                    await _pump(src, dst, c)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    # A reset or failure in one direction ends the whole connection.
                    nursery.cancel_scope.cancel(reason="the other direction broke")

            nursery.start_soon(guarded, client, upstream, up)
            nursery.start_soon(guarded, upstream, client, down)
    finally:
        with trio.CancelScope(shield=True):  # closing must finish even when we are cancelled
            await upstream.aclose()
            await client.aclose()
            counts[0], counts[1] = up[0], down[0]


async def _refuse(client: trio.SocketStream, runtime: RouterRuntime, status: RouteStatus) -> None:
    """Count the refusal the client gets, and close its connection."""
    runtime.metrics.decisions.labels(runtime.name, status.value).inc()
    await client.aclose()


async def handle_connection(
    client: trio.SocketStream,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
) -> None:
    """Route one accepted client connection and proxy it, or close it when routing refuses."""
    metrics = runtime.metrics
    try:
        peer_ip, peer_port = _peer_of(client)
    except OSError:  # the client reset before we looked
        await client.aclose()
        return
    peer = f"{peer_ip}:{peer_port}"
    metrics.connections_accepted.labels(acceptor.name, runtime.name).inc()
    try:
        facts = ConnectionFacts(source_ip=peer_ip)
        with trio.fail_after(limits.route_timeout_s):
            decision = await runtime.decide(facts)
    except trio.TooSlowError:
        log.warning(
            "peer=%s router=%s outcome=REFUSED_UNAVAILABLE reason=routing timed out", peer, runtime.name
        )
        await _refuse(client, runtime, RouteStatus.REFUSED_UNAVAILABLE)
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
        await _refuse(client, runtime, decision.status)
        return
    connector = target.connector
    if connector is None:
        log.warning(
            "peer=%s router=%s key=%s outcome=REFUSED_USE_ANOTHER reason=the decision is the local "
            "target and no <local-target-connector-ref> is configured",
            peer,
            runtime.name,
            decision.key,
        )
        await _refuse(client, runtime, RouteStatus.REFUSED_USE_ANOTHER)
        return
    metrics.decisions.labels(runtime.name, RouteStatus.OK.value).inc()
    runtime.counts.opened(target.node_id)
    active = metrics.active_connections.labels(runtime.name, target.node_id)
    try:
        try:
            with trio.fail_after(limits.connect_timeout_s):
                upstream = await open_connection(connector.host, connector.port)
        except (OSError, trio.TooSlowError) as exc:
            metrics.connect_failures.labels(runtime.name, target.node_id).inc()
            reason = "timed out" if isinstance(exc, trio.TooSlowError) else describe_oserror(exc)
            log.warning(
                "peer=%s router=%s key=%s target=%s outcome=CONNECT_FAILED reason=%s",
                peer,
                runtime.name,
                decision.key,
                target.node_id,
                reason,
            )
            await client.aclose()
            return
        log.info(
            "peer=%s router=%s key=%s target=%s outcome=OK reason=%s",
            peer,
            runtime.name,
            decision.key,
            target.node_id,
            decision.reason,
        )
        active.inc()
        started = trio.current_time()
        counts = [0, 0]
        try:
            await relay(client, upstream, counts)
        finally:
            active.dec()
            metrics.proxied_bytes.labels(runtime.name, "client_to_target").inc(counts[0])
            metrics.proxied_bytes.labels(runtime.name, "target_to_client").inc(counts[1])
            log.info(
                "peer=%s router=%s target=%s closed bytes_in=%d bytes_out=%d duration_s=%.3f",
                peer,
                runtime.name,
                target.node_id,
                counts[0],
                counts[1],
                trio.current_time() - started,
            )
    finally:
        runtime.counts.closed(target.node_id)
