"""Reading over trio streams until a pure parser answers: client openings, PROXY headers, and the
target's answer to a replayed opening.

The caller owns the deadline (wrap the call in `trio.fail_after`); the byte caps are here. The
opening of a client is read through `router.core.opening.SniffBuffer`, the same buffer the fast
path drives over non-blocking sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from keys import NEED_MORE, SniffError
from keys.proxy_protocol import parse_proxy_header
from router.core.opening import DEFAULT_MAX_SNIFF_BYTES, READ_BYTES, SniffBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    import trio

    from keys import NeedMore, Sniffed, Sniffer
    from keys.proxy_protocol import ProxyHeader

_T = TypeVar("_T")

__all__ = [
    "SniffOutcome",
    "SniffProgress",
    "read_parsed",
    "read_past_preamble",
    "read_proxy_header",
    "read_until_sniffed",
]

_PROXY_HEADER_MAX_BYTES: Final = 16 + 65535
"""A v2 header is 16 bytes plus a 16-bit length; a v1 header is at most 107 bytes."""


@dataclass(slots=True)
class SniffProgress:
    """How far sniffing got, kept up to date for the log line of a connection whose handshake
    deadline expires (the deadline's cancellation carries no such detail)."""

    protocol: str = "detect"
    """The sniffer chosen so far ("detect" until the first bytes decided, "proxy" for a header)."""
    bytes_read: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SniffOutcome:
    """What sniffing a connection produced."""

    raw: bytes
    """Every byte read from the client, to be replayed to the target unchanged."""
    sniffed: Sniffed
    """What the handshake revealed."""
    replied: bytes
    """What the router sent to the client itself (server-first handshakes), else b""."""


async def read_until_sniffed(
    stream: trio.abc.Stream,
    detect: Callable[[bytes], Sniffer | NeedMore | None],
    *,
    max_bytes: int = DEFAULT_MAX_SNIFF_BYTES,
    initial: bytes = b"",
    progress: SniffProgress | None = None,
) -> SniffOutcome:
    """Read until the client's protocol is known and its sniffer returns a result.

    Args:
        stream: the client connection.
        detect: picks the sniffer from the first bytes; NEED_MORE to wait, None for unknown.
        max_bytes: the cap of the handshake.
        initial: bytes already read from the client (what followed a PROXY protocol header).
        progress: updated with the protocol and byte count as sniffing goes on.

    Returns:
        The bytes read, the result, and what was answered.

    Raises:
        SniffError: unknown protocol, bad bytes, the cap reached, or EOF before a result.
        trio.BrokenResourceError: the client went away while we answered it.
    """
    opening = SniffBuffer(detect, max_bytes, initial)
    while True:
        result = opening.step()
        if progress is not None and opening.sniffer is not None:
            progress.protocol = opening.sniffer.name
        if not isinstance(result, bytes):
            return SniffOutcome(raw=opening.raw, sniffed=result, replied=opening.replied)
        if result:
            await stream.send_all(result)
        opening.check_cap()
        opening.feed(await stream.receive_some(opening.read_size))
        if progress is not None:
            progress.bytes_read = len(opening.raw)


async def read_parsed(
    stream: trio.abc.ReceiveStream,
    parse: Callable[[bytes], _T | NeedMore],
    *,
    protocol: str,
    max_bytes: int,
    too_long: str,
    closed: str,
    progress: SniffProgress | None = None,
) -> tuple[_T, bytes]:
    """Read until `parse(everything read so far)` answers (the one loop behind every opening read).

    The caller owns the deadline.

    Args:
        stream: where to read.
        parse: the pure parser; NEED_MORE until it can answer, SniffError when it never will.
        protocol: for errors.
        max_bytes: the cap.
        too_long: the error reason at the cap (`{max_bytes}` is filled in).
        closed: the error reason at EOF (`{size}` is filled in).
        progress: updated with the byte count.

    Returns:
        The parser's answer and every byte read (the answer may cover only a prefix of them).

    Raises:
        SniffError: from the parser, at the cap, or at EOF.
    """
    buf = bytearray()
    while True:
        result = parse(bytes(buf))
        if result is not NEED_MORE:
            return result, bytes(buf)
        if len(buf) >= max_bytes:
            raise SniffError(protocol, too_long.format(max_bytes=max_bytes))
        chunk = await stream.receive_some(READ_BYTES)
        if not chunk:
            raise SniffError(protocol, closed.format(size=len(buf)))
        buf += chunk
        if progress is not None:
            progress.bytes_read = len(buf)


async def read_past_preamble(
    upstream: trio.abc.ReceiveStream,
    measure: Callable[[bytes], int | NeedMore],
    *,
    protocol: str,
    max_bytes: int = DEFAULT_MAX_SNIFF_BYTES,
) -> bytes:
    """Read the target's answer to a replayed server-first handshake and drop what we answered.

    The client already got the router's own version of the target's opening (SASL mechanisms
    and outcome, a WireFormatInfo); `measure` tells how long the target's version is. The caller
    owns the deadline.

    Args:
        upstream: the target connection.
        measure: the protocol's preamble measure (length, or NEED_MORE).
        protocol: for errors.
        max_bytes: cap of the preamble.

    Returns:
        The bytes after the preamble, to be sent to the client before relaying.

    Raises:
        SniffError: the target's answer is malformed or refuses, the cap, or EOF.
    """
    length, data = await read_parsed(
        upstream,
        measure,
        protocol=protocol,
        max_bytes=max_bytes,
        too_long="target sent no complete opening in {max_bytes} bytes",
        closed="target closed after {size} bytes of its opening",
    )
    return data[length:]


async def read_proxy_header(
    stream: trio.abc.ReceiveStream, progress: SniffProgress | None = None
) -> tuple[ProxyHeader, bytes]:
    """Read the PROXY protocol header a load balancer sends first (acceptors that enable it).

    The caller owns the deadline. A v1 header is at most 107 bytes and a v2 header is bounded by
    its 16-bit length, so the cap is the protocol's own.

    Returns:
        The header, and the bytes read after it (the start of the client's own handshake).

    Raises:
        SniffError: no header, a malformed one, or EOF before it was complete.
    """
    header, data = await read_parsed(
        stream,
        parse_proxy_header,
        protocol="proxy",
        max_bytes=_PROXY_HEADER_MAX_BYTES,
        too_long="no complete PROXY protocol header in {max_bytes} bytes",
        closed="client closed after {size} bytes, before the PROXY header ended",
        progress=progress,
    )
    return header, data[header.length :]
