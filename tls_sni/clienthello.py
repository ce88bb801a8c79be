"""Parse a TLS ClientHello from the first bytes of a connection, for SNI routing and TLS passthrough.

A pure function of the bytes received so far, in the style of mitmproxy's `parse_client_hello`:
`None` means "a valid but incomplete prefix, read more", a `ClientHello` is the result, and
`ValueError` means the bytes cannot be the opening of a TLS connection. No I/O, no state, and no
imports from the rest of the router (this package is a leaf); `keys.tls` adapts the result to the
sniffer contract. The caller re-parses the whole buffer after every read and caps its size.

Record layer per RFC 8446 §5.1 (a ClientHello may be split over several handshake records, which
must not be interleaved with other record types); message per RFC 8446 §4.1.2 and RFC 5246
§7.4.1.2; extensions server_name (RFC 6066 §3), application_layer_protocol_negotiation (RFC 7301
§3.1) and supported_versions (RFC 8446 §4.2.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ClientHello", "parse_client_hello", "starts_like_tls_record"]

_CONTENT_TYPE_HANDSHAKE: Final = 22
"""TLSPlaintext.type of handshake records (RFC 8446 §5.1, B.1)."""

_CONTENT_TYPE_NAMES: Final = {20: "change_cipher_spec", 21: "alert", 22: "handshake", 23: "application_data"}
"""Record content types of RFC 8446 §5.1 / B.1, for error messages."""

_HANDSHAKE_CLIENT_HELLO: Final = 1
"""HandshakeType.client_hello (RFC 8446 §4, B.3)."""

_RECORD_HEADER_LEN: Final = 5
"""type (1) + legacy_record_version (2) + length (2), RFC 8446 §5.1."""

_HANDSHAKE_HEADER_LEN: Final = 4
"""msg_type (1) + uint24 length (3), RFC 8446 §4."""

_MAX_RECORD_FRAGMENT: Final = 2**14
"""A TLSPlaintext fragment "MUST NOT exceed 2^14 bytes" (RFC 8446 §5.1)."""

_MAX_RECORD_MINOR_VERSION: Final = 0x04
"""Record versions 0x0300 (SSL 3.0) to 0x0304 are accepted; clients send 0x0301 or 0x0303 in
practice (RFC 8446 §5.1 legacy_record_version, Appendix D)."""

_MAX_SESSION_ID_LEN: Final = 32
"""legacy_session_id<0..32> (RFC 8446 §4.1.2)."""

_MAX_CLIENT_HELLO_LEN: Final = 2 + 32 + (1 + 32) + (2 + 2**16 - 2) + (1 + 2**8 - 1) + (2 + 2**16 - 1)
"""The largest body RFC 8446 §4.1.2 allows: legacy_version, random, legacy_session_id<0..32>,
cipher_suites<2..2^16-2>, legacy_compression_methods<1..2^8-1>, extensions<8..2^16-1>. A larger
handshake length can be rejected before its bytes arrive."""

_EXT_SERVER_NAME: Final = 0
"""ExtensionType.server_name (RFC 6066 §3, RFC 8446 §4.2)."""

_EXT_ALPN: Final = 16
"""ExtensionType.application_layer_protocol_negotiation (RFC 7301 §3.1)."""

_EXT_SUPPORTED_VERSIONS: Final = 43
"""ExtensionType.supported_versions (RFC 8446 §4.2.1)."""

_NAME_TYPE_HOST_NAME: Final = 0
"""NameType.host_name, the only name type defined by RFC 6066 §3."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientHello:
    """The parts of a ClientHello the router routes on."""

    sni: str | None
    """The host_name of the server_name extension (RFC 6066 §3) exactly as sent (ASCII; IDNs
    arrive as A-labels), or None when the client sent no server_name."""
    alpn: tuple[str, ...]
    """ALPN protocol names in the client's order (RFC 7301 §3.1), decoded as Latin-1 so any byte
    string maps to a str and ASCII names read as usual; empty when the extension is absent."""
    legacy_version: int
    """ClientHello.legacy_version: 0x0303 for TLS 1.2 and 1.3, the highest version before 1.3."""
    supported_versions: tuple[int, ...]
    """The supported_versions extension (RFC 8446 §4.2.1) in the client's order, GREASE values
    included; empty when absent (a client that does not offer TLS 1.3)."""


def starts_like_tls_record(prefix: bytes) -> bool:
    """Whether a connection that starts with `prefix` may be TLS: a handshake record header.

    Checks the bytes that are there against 0x16 (handshake), 0x03 (major version), 0x00-0x04
    (minor version, SSL 3.0 to TLS 1.3 record versions), so `b"\\x16"` alone is True: such a
    connection may still turn out to be TLS.

    Args:
        prefix: the first bytes of the connection, possibly only one.

    Returns:
        True if the bytes present match; False for an empty prefix or any mismatch. Never raises.
    """
    if not prefix or prefix[0] != _CONTENT_TYPE_HANDSHAKE:
        return False
    if len(prefix) >= 2 and prefix[1] != 0x03:
        return False
    return len(prefix) < 3 or prefix[2] <= _MAX_RECORD_MINOR_VERSION


def parse_client_hello(data: bytes) -> ClientHello | None:
    """Parse the ClientHello at the start of a connection, reassembled from its handshake records.

    Records after the one that completes the ClientHello, and handshake bytes after it inside
    that record, are ignored.

    Args:
        data: every byte the client has sent so far.

    Returns:
        The ClientHello, or None if `data` is a valid prefix that does not yet hold it whole.

    Raises:
        ValueError: `data` cannot start a TLS connection: not a handshake record (including
            SSLv2-style hellos), a record or field length out of range, another handshake message
            than ClientHello, or a malformed extension.
    """
    handshake = bytearray()
    pos = 0
    while True:
        _check_record_header(data[pos : pos + _RECORD_HEADER_LEN], first=pos == 0)
        if len(data) < pos + _RECORD_HEADER_LEN:
            return None
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if length == 0:
            # RFC 8446 §5.1: "Implementations MUST NOT send zero-length fragments of Handshake types".
            raise ValueError(f"zero-length handshake record at offset {pos}")
        if length > _MAX_RECORD_FRAGMENT:
            raise ValueError(f"record length {length} at offset {pos} exceeds {_MAX_RECORD_FRAGMENT}")
        fragment = data[pos + _RECORD_HEADER_LEN : pos + _RECORD_HEADER_LEN + length]
        handshake += fragment
        _check_handshake_header(handshake)
        if len(fragment) < length:
            return None
        pos += _RECORD_HEADER_LEN + length
        if len(handshake) >= _HANDSHAKE_HEADER_LEN:
            body_len = int.from_bytes(handshake[1:4], "big")
            end = _HANDSHAKE_HEADER_LEN + body_len
            if len(handshake) >= end:
                return _parse_client_hello_body(bytes(handshake[_HANDSHAKE_HEADER_LEN:end]))


def _check_record_header(header: bytes, *, first: bool) -> None:
    """Validate the bytes present of a record header (up to 5) as a handshake record."""
    if not header:
        return
    content_type = header[0]
    if content_type != _CONTENT_TYPE_HANDSHAKE:
        if first and content_type & 0x80:
            # SSL 2.0 records start with a 2-byte length whose top bit is set; a "v2-compatible"
            # ClientHello (RFC 5246 Appendix E.2) is followed by msg type 1.
            raise ValueError(f"sslv2-style client hello is not supported: {header.hex()}")
        name = _CONTENT_TYPE_NAMES.get(content_type, "unknown")
        if first:
            raise ValueError(f"not a tls handshake record: content type {content_type} ({name})")
        # RFC 8446 §5.1: handshake messages MUST NOT be interleaved with other record types.
        raise ValueError(f"record of content type {content_type} ({name}) inside the client hello")
    if len(header) >= 2 and header[1] != 0x03:
        raise ValueError(f"unsupported record version {header[1:3].hex()}: major version is not 3")
    if len(header) >= 3 and header[2] > _MAX_RECORD_MINOR_VERSION:
        raise ValueError(f"unsupported record version 03{header[2]:02x}")


def _check_handshake_header(handshake: bytearray) -> None:
    """Validate the bytes present of the handshake message header (up to 4)."""
    if handshake and handshake[0] != _HANDSHAKE_CLIENT_HELLO:
        raise ValueError(f"expected a client hello (handshake type 1), got handshake type {handshake[0]}")
    if len(handshake) >= _HANDSHAKE_HEADER_LEN:
        body_len = int.from_bytes(handshake[1:4], "big")
        if body_len > _MAX_CLIENT_HELLO_LEN:
            raise ValueError(f"client hello length {body_len} exceeds the maximum {_MAX_CLIENT_HELLO_LEN}")


class _Cursor:
    """Reads fields from a complete byte string; running past its end is a ValueError."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def at_end(self) -> bool:
        return self._pos == len(self._data)

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining:
            raise ValueError(f"{what} needs {n} bytes at offset {self._pos}, only {self.remaining} left")
        chunk = self._data[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def uint(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "big")

    def vector(self, length_size: int, what: str, *, min_len: int, max_len: int) -> bytes:
        """A `<min_len..max_len>` vector with a `length_size`-byte length (RFC 8446 §3.4)."""
        length = self.uint(length_size, f"{what} length")
        if not min_len <= length <= max_len:
            raise ValueError(f"{what} length {length} is outside {min_len}..{max_len}")
        return self.take(length, what)


def _parse_client_hello_body(body: bytes) -> ClientHello:
    """The ClientHello structure of RFC 8446 §4.1.2 (also RFC 5246 §7.4.1.2)."""
    cursor = _Cursor(body)
    legacy_version = cursor.uint(2, "legacy_version")
    if legacy_version >> 8 != 0x03:
        raise ValueError(f"client hello legacy_version 0x{legacy_version:04x} is older than ssl 3.0")
    cursor.take(32, "random")
    cursor.vector(1, "legacy_session_id", min_len=0, max_len=_MAX_SESSION_ID_LEN)
    suites = cursor.vector(2, "cipher_suites", min_len=2, max_len=2**16 - 2)
    if len(suites) % 2:
        raise ValueError(f"cipher_suites length {len(suites)} is odd")
    cursor.vector(1, "legacy_compression_methods", min_len=1, max_len=2**8 - 1)
    if cursor.at_end:
        # RFC 5246 §7.4.1.2: a TLS 1.2 client may send no extensions at all; their presence "can be
        # detected by determining whether there are bytes following the compression_methods".
        extensions = b""
    else:
        extensions = cursor.vector(2, "extensions", min_len=0, max_len=2**16 - 1)
        if not cursor.at_end:
            raise ValueError(f"extra bytes after the client hello extensions: {cursor.remaining}")

    sni: str | None = None
    alpn: tuple[str, ...] = ()
    supported_versions: tuple[int, ...] = ()
    seen: set[int] = set()
    ext_cursor = _Cursor(extensions)
    while not ext_cursor.at_end:
        ext_type = ext_cursor.uint(2, "extension type")
        ext_data = ext_cursor.vector(2, f"extension {ext_type}", min_len=0, max_len=2**16 - 1)
        if ext_type in seen:
            # RFC 8446 §4.2: "There MUST NOT be more than one extension of the same type".
            raise ValueError(f"extension {ext_type} appears twice")
        seen.add(ext_type)
        if ext_type == _EXT_SERVER_NAME:
            sni = _parse_server_name(ext_data)
        elif ext_type == _EXT_ALPN:
            alpn = _parse_alpn(ext_data)
        elif ext_type == _EXT_SUPPORTED_VERSIONS:
            supported_versions = _parse_supported_versions(ext_data)
    return ClientHello(
        sni=sni, alpn=alpn, legacy_version=legacy_version, supported_versions=supported_versions
    )


def _parse_server_name(ext_data: bytes) -> str | None:
    """ServerNameList (RFC 6066 §3): `ServerName server_name_list<1..2^16-1>`.

    Every ServerName is read as name_type plus a 2-byte-length name, the only layout in use; the
    list "MUST NOT contain more than one name of the same name_type".
    """
    outer = _Cursor(ext_data)
    names = _Cursor(outer.vector(2, "server_name_list", min_len=1, max_len=2**16 - 1))
    if not outer.at_end:
        raise ValueError(f"extra bytes after the server_name_list: {outer.remaining}")
    host_name: str | None = None
    seen: set[int] = set()
    while not names.at_end:
        name_type = names.uint(1, "server name type")
        name = names.vector(2, "server name", min_len=1, max_len=2**16 - 1)
        if name_type in seen:
            raise ValueError(f"server_name_list holds name type {name_type} twice")
        seen.add(name_type)
        if name_type == _NAME_TYPE_HOST_NAME:
            # RFC 6066 §3: HostName is "represented as a byte string using ASCII encoding".
            try:
                host_name = name.decode("ascii")
            except UnicodeDecodeError:
                raise ValueError(f"server name is not ascii: {name[:32].hex()}") from None
    return host_name


def _parse_alpn(ext_data: bytes) -> tuple[str, ...]:
    """ProtocolNameList (RFC 7301 §3.1): `ProtocolName protocol_name_list<2..2^16-1>`, each
    `opaque ProtocolName<1..2^8-1>`."""
    outer = _Cursor(ext_data)
    names = _Cursor(outer.vector(2, "protocol_name_list", min_len=2, max_len=2**16 - 1))
    if not outer.at_end:
        raise ValueError(f"extra bytes after the alpn protocol_name_list: {outer.remaining}")
    protocols: list[str] = []
    while not names.at_end:
        protocols.append(names.vector(1, "alpn protocol name", min_len=1, max_len=2**8 - 1).decode("latin-1"))
    return tuple(protocols)


def _parse_supported_versions(ext_data: bytes) -> tuple[int, ...]:
    """ClientHello form of supported_versions (RFC 8446 §4.2.1):
    `ProtocolVersion versions<2..254>`."""
    outer = _Cursor(ext_data)
    raw = outer.vector(1, "supported_versions", min_len=2, max_len=254)
    if not outer.at_end:
        raise ValueError(f"extra bytes after the supported_versions list: {outer.remaining}")
    if len(raw) % 2:
        raise ValueError(f"supported_versions length {len(raw)} is odd")
    return tuple(int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2))
