"""The trio path's relay: two pump tasks in one nursery moving bytes both ways.

EOF in one direction becomes `send_eof()` on the other (half-close), and the connection is closed
only when both directions are done; a reset in either direction closes both at once. A stream
that cannot half-close (TLS terminated by the router) ends the whole connection at its peer's EOF.

A connection the router can speak in (its `LiveConnection.cursor`) is relayed with the broker's
frame boundaries followed, and can be moved (`LiveConnection.move`): `leave` finishes the frame
under way, closes the broker's side, tells the client the farewell, and waits a little for the
client to close its side, so its last reads are not lost to a reset. The fast path hands its
connections that move over to `leave` too.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Final

import trio

from router.core.events import CloseReason

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from router.core.live import LiveConnection
    from router.core.stream_filter import StreamFilter

__all__ = ["FAREWELL_LINGER_S", "FRAME_END_WAIT_S", "RELAY_CHUNK_BYTES", "leave", "relay"]

RELAY_CHUNK_BYTES: Final = 256 * 1024
"""Bytes asked per read while relaying. Large reads cut syscalls per byte: with 64 KiB a trio relay
moved 3.4 Gbit/s on loopback, with 1 MiB 8.7 (ENVIRONMENT.md §6a); 256 KiB keeps most of that."""

FRAME_END_WAIT_S: Final = 5.0
"""How long a moved connection waits for the broker to finish the frame under way; then the
client is closed without words (a broker that stalls mid-frame cannot be waited for)."""
FAREWELL_LINGER_S: Final = 5.0
"""How long the client of a moved connection has to take its farewell and close its side. Closing
before it read everything would reset the connection, and a reset can discard the farewell."""

_BROKEN: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _Receiving:
    """Whether a framed pump waits in a receive: only then may a move interrupt it (a cancelled
    send would leave part of a frame unsent)."""

    __slots__ = ("now", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.now = False
        self.scope = scope

    def interrupt(self) -> None:
        if self.now:
            self.scope.cancel(reason="the connection is moved")


async def _pump_framed(
    source: trio.abc.ReceiveStream,
    sink: trio.abc.SendStream,
    live: LiveConnection,
    first: Callable[[bytes | bytearray], None] | None = None,
) -> bool | None:
    """`_pump` from the broker to the client of a connection that can be moved (counted into its
    `counts`): each read is fed to its cursor. Returns None when it is to be moved (then
    `leave`), else as `_pump`."""
    cursor, counts = live.cursor, live.counts
    assert cursor is not None, "only connections with a cursor are relayed framed"
    receiving = _Receiving(trio.CancelScope())
    live.on_depart = receiving.interrupt
    with receiving.scope:
        while live.farewell is None:
            receiving.now = True
            data = await source.receive_some(RELAY_CHUNK_BYTES)
            receiving.now = False
            if first is not None and not counts[1]:
                first(data)
            if not data:
                break
            cursor.feed(data)
            counts[1] += len(data)
            await sink.send_all(data)
        else:
            return None
    if receiving.scope.cancelled_caught:
        return None
    return await _pass_eof(sink)


async def leave(
    client: trio.abc.Stream,
    upstream: trio.abc.Stream,
    live: LiveConnection,
    pending: bytes = b"",
) -> None:
    """Move a connection's client: finish the broker's frame under way (at most `FRAME_END_WAIT_S`),
    close the broker's side, send what is pending for the client and the farewell (none when the
    frame did not end), half-close, and read the client until it closes (at most
    `FAREWELL_LINGER_S`). Closes neither stream: the caller does.

    Args:
        client: the client's stream.
        upstream: the broker's stream.
        live: the connection, moved (`farewell` set, `cursor` fed with every byte sent so far); the
            frame's rest is added to its `counts`.
        pending: bytes for the client read (and fed to the cursor) before, not yet sent.
    """
    cursor, farewell = live.cursor, live.farewell
    assert cursor is not None, "only a connection with a cursor is moved by leave()"
    assert farewell is not None, "leave() follows LiveConnection.move"
    said = cursor.at_boundary
    with contextlib.suppress(*_BROKEN):
        if not said:
            with trio.move_on_after(FRAME_END_WAIT_S):
                while data := await upstream.receive_some(RELAY_CHUNK_BYTES):
                    cut = cursor.cut(data)
                    rest = data if cut is None else data[:cut]
                    live.counts[1] += len(rest)
                    pending += rest
                    if cut is not None:
                        said = True
                        break
    with trio.CancelScope(shield=True):
        await upstream.aclose()
    words = farewell.words(cursor.frames) if said else b""
    with contextlib.suppress(*_BROKEN), trio.move_on_after(FAREWELL_LINGER_S):
        await client.send_all(pending + words)
        if isinstance(client, trio.abc.HalfCloseableStream):
            await client.send_eof()
        while await client.receive_some(RELAY_CHUNK_BYTES):
            pass


async def _pump(
    source: trio.abc.ReceiveStream,
    sink: trio.abc.SendStream,
    counts: list[int],
    side: int,
    activity: LiveConnection | None = None,
    first: Callable[[bytes | bytearray], None] | None = None,
    send_broke: Callable[[], None] | None = None,
    sift: StreamFilter | None = None,
) -> bool:
    """Copy until EOF, adding each read to `counts[side]`; half-close the sink. Returns False when
    the sink cannot half-close (TLS). With `sift` what is sent is what it lets through (the bytes
    read are counted).

    With `activity` (the client's direction of a connection under a TTL) each read stamps
    `activity.last_read_at`, a float store; the TTL checker reads it. `first` is given the first
    read (b"": EOF before any byte); `send_broke` is called when a send to the sink breaks.
    """
    while True:
        data = await source.receive_some(RELAY_CHUNK_BYTES)
        if first is not None and not counts[side]:
            first(data)
        if not data:
            break
        if activity is not None:
            activity.last_read_at = trio.current_time()
            if activity.peek_first_bytes:  # once: an unsniffed client may be exempt MQTT
                activity.first_bytes(data)
        counts[side] += len(data)
        if sift is not None:
            data = sift.feed(data)
            if not data:
                continue
        try:
            await sink.send_all(data)
        except _BROKEN:
            if send_broke is not None:
                send_broke()
            raise
    return await _pass_eof(sink)


async def _pass_eof(sink: trio.abc.SendStream) -> bool:
    """Half-close the sink after its source's EOF (the other direction keeps flowing until its
    own); False when it cannot half-close (TLS)."""
    if not isinstance(sink, trio.abc.HalfCloseableStream):
        return False
    with contextlib.suppress(*_BROKEN):
        await sink.send_eof()
    return True


async def relay(
    client: trio.abc.Stream,
    upstream: trio.abc.Stream,
    counts: list[int],
    *,
    activity: LiveConnection | None = None,
    live: LiveConnection | None = None,
    first_answer: Callable[[bytes | bytearray], None] | None = None,
    sift: StreamFilter | None = None,
) -> CloseReason:
    """Relay bytes both ways until both directions ended or one broke, then close both streams.

    Args:
        client: the client's stream (a socket, or TLS terminated by us).
        upstream: the target's stream.
        counts: the connection's `LiveConnection.counts` (`[client -> target, target -> client]`),
            to which each read is added as it passes (a scrape reads them while it lives).
        activity: a connection under a connection TTL: the time of every read from the client is
            stored in its `last_read_at`. None when there is no TTL (nothing done per read).
        live: the connection, when it can be moved (it has a `cursor`): relayed framed, and
            moved by `leave` when `LiveConnection.move` asks.
        first_answer: given the target's first read, once, or b"" when the target ended its side
            (EOF or a reset) before sending a byte (passive health).
        sift: what the target's bytes pass through to the client (`Proxy.target_filter`; a
            connection with one has no cursor: it is not relayed framed).

    Returns:
        CLOSED when both directions ended (or a stream without half-close did), RESET when one broke.
    """
    broke = moving = False

    def target_broke() -> None:
        """A send to or a receive from the target broke (it reset the connection): before its
        first byte, that is its answer (a broker at its connection limit closes at once)."""
        if first_answer is not None and not counts[1]:
            first_answer(b"")

    try:
        async with trio.open_nursery() as nursery:

            async def guarded(pump: Callable[[], Awaitable[bool | None]], side: int = 0) -> None:
                nonlocal broke, moving
                try:
                    done = await pump()
                except _BROKEN:
                    if side:  # a receive from the target broke
                        target_broke()
                    # A reset or failure in one direction ends the whole connection.
                    broke = True
                    nursery.cancel_scope.cancel(reason="the other direction broke")
                    return
                if done is None:
                    moving = True
                    nursery.cancel_scope.cancel(reason="the connection is moved")
                elif not done:
                    # TLS has no half-close: the target's EOF ends the whole connection.
                    nursery.cancel_scope.cancel(reason="EOF towards a stream without half-close")

            from_client = functools.partial(_pump, client, upstream, counts, 0, activity, None, target_broke)
            nursery.start_soon(guarded, from_client)
            pump: Callable[[], Awaitable[bool | None]]
            if live is not None and live.cursor is not None:
                pump = functools.partial(_pump_framed, upstream, client, live, first_answer)
            else:
                pump = functools.partial(_pump, upstream, client, counts, 1, None, first_answer, None, sift)
            nursery.start_soon(guarded, pump, 1)
        if moving:
            assert live is not None
            await leave(client, upstream, live)
    finally:
        with trio.CancelScope(shield=True):  # closing must finish even when we are cancelled
            await upstream.aclose()
            await client.aclose()
    return CloseReason.RESET if broke else CloseReason.CLOSED
