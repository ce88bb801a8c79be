"""The trio path's relay: two pump tasks in one nursery moving bytes both ways.

EOF in one direction becomes `send_eof()` on the other (half-close), and the connection is closed
only when both directions are done; a reset in either direction closes both at once. A stream
that cannot half-close (TLS terminated by the router) ends the whole connection at its peer's EOF.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Final

import trio

from router.core.events import CloseReason

if TYPE_CHECKING:
    from router.core.live import LiveConnection

__all__ = ["RELAY_CHUNK_BYTES", "relay"]

RELAY_CHUNK_BYTES: Final = 256 * 1024
"""Bytes asked per read while relaying. Large reads cut syscalls per byte: with 64 KiB a trio relay
moved 3.4 Gbit/s on loopback, with 1 MiB 8.7 (ENVIRONMENT.md §6a); 256 KiB keeps most of that."""

_BROKEN: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


async def _pump(
    source: trio.abc.ReceiveStream,
    sink: trio.abc.SendStream,
    counter: list[int],
    activity: LiveConnection | None = None,
) -> bool:
    """Copy until EOF; half-close the sink. Returns False when the sink cannot half-close (TLS).

    With `activity` (the client's direction of a connection under a TTL) each read stamps
    `activity.last_read_at`, a float store; the TTL checker reads it.
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
    with contextlib.suppress(*_BROKEN):
        await sink.send_eof()
    return True


async def relay(
    client: trio.abc.Stream,
    upstream: trio.abc.Stream,
    counts: list[int],
    *,
    activity: LiveConnection | None = None,
) -> CloseReason:
    """Relay bytes both ways until both directions ended or one broke, then close both streams.

    Args:
        client: the client's stream (a socket, or TLS terminated by us).
        upstream: the target's stream.
        counts: `[client -> target, target -> client]` byte counters, to which the relayed bytes
            are added (also when the relay is cancelled).
        activity: a connection under a connection TTL: the time of every read from the client is
            stored in its `last_read_at`. None when there is no TTL (nothing done per read).

    Returns:
        CLOSED when both directions ended (or a stream without half-close did), RESET when one broke.
    """
    up, down = [0], [0]
    broke = False
    try:
        async with trio.open_nursery() as nursery:

            async def guarded(
                src: trio.abc.Stream,
                dst: trio.abc.Stream,
                c: list[int],
                activity: LiveConnection | None = None,
            ) -> None:
                nonlocal broke
                try:
                    if not await _pump(src, dst, c, activity):
                        # TLS has no half-close: the target's EOF ends the whole connection.
                        nursery.cancel_scope.cancel(reason="EOF towards a stream without half-close")
                except _BROKEN:
                    # A reset or failure in one direction ends the whole connection.
                    broke = True
                    nursery.cancel_scope.cancel(reason="the other direction broke")

            nursery.start_soon(guarded, client, upstream, up, activity)
            nursery.start_soon(guarded, upstream, client, down)
    finally:
        with trio.CancelScope(shield=True):  # closing must finish even when we are cancelled
            await upstream.aclose()
            await client.aclose()
            counts[0] += up[0]
            counts[1] += down[0]
    return CloseReason.RESET if broke else CloseReason.CLOSED
