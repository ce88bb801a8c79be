"""The opening buffer: the router's side of sniffing one client's opening, without I/O (STYLE R2).

The router owns the buffer, the byte cap and the replay; sniffers are pure and re-parse the whole
buffer each time. For server-first handshakes a sniffer returns `Reply` with everything the client
must have received by now; the router sends the part not sent yet, and remembers all of it,
because in proxy mode the target will answer the replayed handshake with its own version of those
bytes, which must then be dropped instead of reaching the client twice. `SniffBuffer` is that
logic; both data paths drive it (router/datapath/reading.py over trio streams, the fast path over
non-blocking sockets). How an opening failed is reported is here too (`opening_failed`), once for
both. No I/O, no clock here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from keys import NEED_MORE, Reply, SniffError
from router.config.settings import DEFAULT_MAX_SNIFF_BYTES as DEFAULT_MAX_SNIFF_BYTES
from router.core.events import OpeningFailed, OpeningFailure

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import NeedMore, Sniffed, Sniffer
    from router.core.events import ConnectionRef

__all__ = ["DEFAULT_MAX_SNIFF_BYTES", "READ_BYTES", "SniffBuffer", "opening_failed"]

READ_BYTES: Final = 4096
"""Bytes asked per read while sniffing: openings are small, and a small read keeps a client that
sends its payload right behind the handshake from making us buffer much of it."""


class SniffBuffer:
    """The router's side of sniffing one opening, without I/O: the buffer, the byte cap, the chosen
    sniffer and what was answered (STYLE R2). `read_until_sniffed` drives it over a trio stream,
    the fast path (router/datapath/fast_path.py) over a non-blocking socket.

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
        """How many bytes to ask for in the next read (small: see `READ_BYTES`)."""
        return min(READ_BYTES, self.max_bytes - len(self.raw))

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
        """Raises SniffError when the cap is reached, or when the opening announces a size over it
        (call when `step` wants more bytes): a client that announces more than the router will
        read is rejected at once instead of holding its connection until the deadline."""
        if len(self.raw) >= self.max_bytes:
            raise SniffError(self.protocol, f"no complete handshake in the first {self.max_bytes} bytes")
        announced = None if self.sniffer is None else self.sniffer.announced_size(self.raw)
        if announced is not None and announced > self.max_bytes:
            raise SniffError(
                self.protocol,
                f"the opening announces {announced} bytes, over the acceptor's cap of {self.max_bytes} "
                "(sniffMaxBytes)",
            )

    def feed(self, chunk: bytes | bytearray) -> None:
        """Add bytes read from the client; b"" is its EOF, which raises SniffError."""
        if not chunk:
            raise SniffError(
                self.protocol, f"client closed after {len(self.raw)} bytes, before the handshake was complete"
            )
        self.raw += chunk


def opening_failed(
    conn: ConnectionRef,
    why: SniffError | OpeningFailure,
    *,
    protocol: str = "",
    bytes_read: int = 0,
    detail: str = "",
    timeout_s: float = 0.0,
) -> OpeningFailed:
    """The report of a client closed during its opening, built here once for both data paths.

    Args:
        conn: the connection.
        why: the `SniffError` that rejected its bytes (REJECTED: the error names the protocol and
            what was wrong); TIMEOUT: the handshake deadline passed; TLS: the TLS handshake with
            the router failed.
        protocol: the sniffer as far as known when the deadline passed (TIMEOUT).
        bytes_read: the client's bytes read so far (REJECTED, TIMEOUT).
        detail: why the TLS handshake failed (TLS).
        timeout_s: the deadline that passed (TIMEOUT).
    """
    if isinstance(why, SniffError):
        failure, protocol, detail = OpeningFailure.REJECTED, why.protocol, why.reason
    else:
        failure = why
        if failure is OpeningFailure.TLS:
            protocol = "tls"
    return OpeningFailed(
        conn=conn,
        failure=failure,
        protocol=protocol,
        detail=detail,
        bytes_read=bytes_read,
        timeout_s=timeout_s,
    )
