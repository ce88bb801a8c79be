"""The TLS sniffer: adapts `tls_sni.parse_client_hello` to the sniffer contract (STYLE R1).

`tls_sni` answers None for "incomplete" and `ValueError` for "not TLS", as mitmproxy's parser
does; this module turns those into `NEED_MORE` and `SniffError("tls", ...)`, as mitmproxy's
`next_layer.py` turns None into `NeedsMoreData`. Used for TLS passthrough, where the router reads
the SNI host (RFC 6066 §3) without terminating TLS. Pure: no I/O, no state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from keys.sniff import NEED_MORE, Sniffed, SniffError, WireProtocol
from tls_sni import parse_client_hello, starts_like_tls_record

if TYPE_CHECKING:
    from keys.sniff import SniffResult
    from tls_sni import ClientHello

__all__ = ["TlsSniffer"]

_TLS_1_3: Final = 0x0304
"""ProtocolVersion of TLS 1.3 (RFC 8446 §4.2.1); offered only in supported_versions."""

_VERSION_NAMES: Final = {0x0300: "ssl3", 0x0301: "1.0", 0x0302: "1.1", 0x0303: "1.2", _TLS_1_3: "1.3"}
"""ProtocolVersion values (RFC 8446 Appendix D, RFC 5246 Appendix E) to `Sniffed.protocol_version`."""


def _highest_version(hello: ClientHello) -> str | None:
    """The highest TLS version the client offers: from supported_versions when present (GREASE
    and unknown values skipped, RFC 8701), else legacy_version (RFC 8446 §4.1.2); None if unknown."""
    if _TLS_1_3 in hello.supported_versions:
        return "1.3"
    known = [v for v in hello.supported_versions if v in _VERSION_NAMES]
    if known:
        return _VERSION_NAMES[max(known)]
    return _VERSION_NAMES.get(hello.legacy_version)


class TlsSniffer:
    """Sniffs a TLS ClientHello: the SNI host and the highest offered TLS version."""

    name = WireProtocol.TLS.value

    def looks_like(self, prefix: bytes) -> bool:
        """Whether the bytes present match a TLS handshake record header (0x16 0x03 0x00-0x04).

        Args:
            prefix: the first bytes of the connection, possibly only one.

        Returns:
            True if they may start a TLS connection; never raises.
        """
        return starts_like_tls_record(prefix)

    def announced_size(self, data: bytes) -> int | None:
        """None: the sniffer rejects records over the TLS maximum itself (keys.sniff.Sniffer)."""
        return None

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the ClientHello, reassembled across records and reads.

        Args:
            data: every byte the client has sent so far.

        Returns:
            NEED_MORE for a valid incomplete prefix, else Sniffed with `sni_host` (None if the
            client sent no server_name) and `protocol_version` ("1.3", "1.2", "1.1", "1.0",
            "ssl3", or None for an unknown version).

        Raises:
            SniffError: the bytes are not a TLS ClientHello (the `tls_sni` reason is kept).
        """
        try:
            hello = parse_client_hello(data)
        except ValueError as exc:
            raise SniffError(self.name, str(exc)) from exc
        if hello is None:
            return NEED_MORE
        return Sniffed(
            protocol=WireProtocol.TLS, sni_host=hello.sni, protocol_version=_highest_version(hello)
        )
