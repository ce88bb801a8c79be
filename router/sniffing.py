"""Reading a client's opening bytes until its sniffer knows the key (STYLE R2).

The router owns the buffer, the byte cap and the replay; the caller owns the deadline (wrap the
call in `trio.fail_after`). Sniffers are pure and re-parse the whole buffer each time. For
server-first handshakes a sniffer returns `Reply` with everything the client must have received
by now; we send the part not sent yet, and remember all of it, because in proxy mode the target
will answer the replayed handshake with its own version of those bytes, which must then be
dropped instead of reaching the client twice. That logic is `SniffBuffer`, without I/O: this
module drives it over trio streams, the fast path (router/fastpath.py) over non-blocking sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from keys import NEED_MORE, Reply, SniffError
from keys.proxy_protocol import parse_proxy_header

if TYPE_CHECKING:
    from collections.abc import Callable

    import trio

    from keys import NeedMore, Sniffed, Sniffer
    from keys.proxy_protocol import ProxyHeader

_T = TypeVar("_T")

__all__ = [
    "DEFAULT_MAX_SNIFF_BYTES",
    "SniffBuffer",
    "SniffOutcome",
    "SniffProgress",
    "read_parsed",
    "read_past_preamble",
    "read_proxy_header",
    "read_until_sniffed",
]

DEFAULT_MAX_SNIFF_BYTES: Final = 16 * 1024
"""Byte cap of an opening handshake. h11 caps incomplete HTTP heads at 16 KiB too; a CONNECT,
Open or ConnectionInfo with credentials is a few hundred bytes, a TLS ClientHello under 2 KiB
(post-quantum key shares push it towards 2-4 KiB)."""

_PROXY_HEADER_MAX_BYTES: Final = 16 + 65535
"""A v2 header is 16 bytes plus a 16-bit length; a v1 header is at most 107 bytes."""

_READ_BYTES: Final = 4096
"""Bytes asked per read while sniffing: openings are small, and a small read keeps a client that
sends its payload right behind the handshake from making us buffer much of it."""


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


class SniffBuffer:
    """The router's side of sniffing one opening, without I/O: the buffer, the byte cap, the chosen
    sniffer and what was answered (STYLE R2). `read_until_sniffed` drives it over a trio stream,
    the fast path (router/fastpath.py) over a non-blocking socket.

    The driver loops: `step()`; send what it returns, or stop at a result; `check_cap()`; read at
    most `read_size` bytes and `feed` them.
    """

    __slots__ = ("_detect", "max_bytes", "raw", "replied", "sniffer")

    def __init__(
        self,
        detect: Callable[[bytes], Sniffer | NeedMore | None],
        max_bytes: int = DEFAULT_MAX_SNIFF_BYTES,
        initial: bytes = b"",
    ) -> None:
        """Start sniffing.

        Args:
            detect: picks the sniffer from the first bytes; NEED_MORE to wait, None for unknown.
            max_bytes: the cap of the handshake.
            initial: bytes already read from the client (what followed a PROXY protocol header).
        """
        self._detect = detect
        self.max_bytes = max_bytes
        self.raw = initial
        """Every byte read from the client so far, to be replayed to the target unchanged."""
        self.replied = b""
        """What the router sent to the client itself (server-first handshakes), else b""."""
        self.sniffer: Sniffer | None = None
        """The sniffer the first bytes chose, None until they did."""

    @property
    def protocol(self) -> str:
        """The chosen sniffer's name; "detect" until the first bytes decided."""
        return "detect" if self.sniffer is None else self.sniffer.name

    @property
    def read_size(self) -> int:
        """How many bytes to ask for in the next read (small: see `_READ_BYTES`)."""
        return min(_READ_BYTES, self.max_bytes - len(self.raw))

    def step(self) -> Sniffed | bytes:
        """Look at the bytes read so far.

        Returns:
            What the handshake revealed once it is complete; else what to send the client before
            reading more (the part of a server-first reply it has not had yet), b"" for nothing.

        Raises:
            SniffError: unknown protocol, bad bytes, or a reply that does not extend the last one.
        """
        data = self.raw
        if self.sniffer is None:
            if not data:
                return b""
            chosen = self._detect(data)
            if chosen is None:
                raise SniffError("detect", f"unknown protocol, connection starts with {data[:16].hex()}")
            if chosen is NEED_MORE:
                return b""
            self.sniffer = chosen
        result = self.sniffer.sniff(data)
        if isinstance(result, Reply):
            said = result.to_client
            if not said.startswith(self.replied):
                raise SniffError(self.sniffer.name, "sniffer reply does not extend what was already sent")
            rest, self.replied = said[len(self.replied) :], said
            return rest
        return b"" if result is NEED_MORE else result

    def check_cap(self) -> None:
        """Raises SniffError when the cap is reached (call when `step` wants more bytes)."""
        if len(self.raw) >= self.max_bytes:
            raise SniffError(self.protocol, f"no complete handshake in the first {self.max_bytes} bytes")

    def feed(self, chunk: bytes | bytearray) -> None:
        """Add bytes read from the client; b"" is its EOF, which raises SniffError."""
        if not chunk:
            raise SniffError(
                self.protocol, f"client closed after {len(self.raw)} bytes, before the handshake was complete"
            )
        self.raw += chunk


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
        chunk = await stream.receive_some(_READ_BYTES)
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
