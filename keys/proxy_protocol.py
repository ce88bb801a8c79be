"""PROXY protocol v1/v2 headers: parse the header a load balancer puts before the client's bytes,
and encode headers for targets (SPEC part B, A2 SOURCE_IP).

Follows HAProxy's "The PROXY protocol, Versions 1 & 2" (doc/proxy-protocol.txt, 2020/03/05;
section numbers below are that document's). The parser has the sniffer contract's shape
(`keys.sniff`, STYLE R1): a pure function of the bytes read so far that returns a `ProxyHeader`,
`NEED_MORE`, or raises `SniffError("proxy", reason)`. It is meant only for acceptors configured to
require a header (section 5: a receiver must never guess whether a header is present), so a
connection that does not start with one is an error. `ProxyHeader.length` tells the router how
many bytes to strip; everything after them is the client's own protocol.

No I/O here: no trio, sockets, clocks, logging or metrics.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from keys.sniff import NEED_MORE, SniffError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from keys.sniff import NeedMore

__all__ = [
    "PP2_TYPE_ALPN",
    "PP2_TYPE_AUTHORITY",
    "PP2_TYPE_CRC32C",
    "PP2_TYPE_NOOP",
    "PP2_TYPE_UNIQUE_ID",
    "V1_MAX_LINE_BYTES",
    "V1_PREFIX",
    "V2_SIGNATURE",
    "ProxyHeader",
    "encode_v1",
    "encode_v2",
    "encode_v2_local",
    "looks_like_proxy_header",
    "parse_proxy_header",
]

_PROTOCOL: Final = "proxy"
"""The name in `SniffError.protocol`."""

_QUOTE_BYTES: Final = 32
"""At most this many bytes (or characters) of client input are quoted in an error message."""

# --- Version 1 (section 2.1) -------------------------------------------------------------------

V1_PREFIX: Final = b"PROXY "
"""Section 2.1: "PROXY" and exactly one space start every v1 line."""

V1_MAX_LINE_BYTES: Final = 107
"""Section 2.1: the longest line, "PROXY UNKNOWN" with two full IPv6 addresses and two 5-digit
ports, is 107 bytes with the CRLF; no CRLF in the first 107 bytes makes the line invalid."""

_V1_PROTOCOLS: Final = (b"TCP4", b"TCP6", b"UNKNOWN")
"""Section 2.1: the only protocol/family words of version 1."""

_V1_FIELDS: Final = 6
"""Section 2.1: PROXY, TCP4|TCP6, source address, destination address, source port, dest port."""

_V1_PORT: Final = re.compile(r"0|[1-9][0-9]{0,4}")
"""Section 2.1: a port is decimal 0-65535, "heading zeroes are not permitted"."""

_MAX_PORT: Final = 65535
"""Section 2.1: ports are "in the range [0..65535] inclusive"; v2 sends them as 16-bit numbers."""

# --- Version 2 (section 2.2) -------------------------------------------------------------------

V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
"""Section 2.2: the 12-byte block that starts every v2 header (a NUL at byte 5, so never a
C string; chosen to make HTTP, TLS, SMTP, FTP and POP servers fail at once, section 6)."""

_V2_FIXED_BYTES: Final = 16
"""Section 2.2 `struct proxy_hdr_v2`: signature (12), ver_cmd (1), fam (1), len (2)."""

_V2_VERSION: Final = 0x2
"""Section 2.2: the high nibble of byte 13 "must always be sent as \\x2 and the receiver must only
accept this value"."""

_V2_CMD_LOCAL: Final = 0x0
"""Section 2.2: LOCAL, a connection the proxy made on its own (health check); keep the real
endpoints."""

_V2_CMD_PROXY: Final = 0x1
"""Section 2.2: PROXY, on behalf of another node; the block carries the original endpoints."""

_V2_MAX_BLOCK_BYTES: Final = 0xFFFF
"""Section 2.2: the 16-bit `len` field counts the addresses and TLVs after the fixed 16 bytes."""

_AF_INET: Final = 0x1
"""Section 2.2: the high nibble of byte 14 for IPv4 (4-byte addresses)."""
_AF_UNIX: Final = 0x3
"""Section 2.2: the high nibble of byte 14 for UNIX sockets (108-byte paths)."""
_V2_FAM_UNSPEC: Final = 0x00
"""Section 2.2: byte 14 for AF_UNSPEC with an UNSPEC transport, what LOCAL headers send."""

_V2_ADDRESS_BYTES: Final[dict[int, int]] = {
    0x11: 12,  # TCP over IPv4: 2 * 4 address bytes + 2 * 2 port bytes
    0x12: 12,  # UDP over IPv4
    0x21: 36,  # TCP over IPv6: 2 * 16 address bytes + 2 * 2 port bytes
    0x22: 36,  # UDP over IPv6
    0x31: 216,  # UNIX stream: 2 * 108 path bytes (sun_path), no ports
    0x32: 216,  # UNIX datagram
}
"""Section 2.2 "In practice, the following protocol bytes are expected": the family/transport
byte (byte 14) of a PROXY header and the size of its address block. Other values "must be rejected
as invalid by receivers"; 0x00 (AF_UNSPEC) is handled apart (`_check_v2_proxy_family`)."""

_TLV_HEADER_BYTES: Final = 3
"""Section 2.2 `struct pp2_tlv`: type (1) and a big-endian value length (2)."""

PP2_TYPE_ALPN: Final = 0x01
"""Section 2.2.1: the ALPN the client negotiated."""
PP2_TYPE_AUTHORITY: Final = 0x02
"""Section 2.2.2: the host name the client asked for (TLS SNI), UTF-8."""
PP2_TYPE_CRC32C: Final = 0x03
"""Section 2.2.3: CRC32c of the whole header with this TLV's value zeroed; verified on parse."""
PP2_TYPE_NOOP: Final = 0x04
"""Section 2.2.4: padding, ignored by receivers."""
PP2_TYPE_UNIQUE_ID: Final = 0x05
"""Section 2.2.5: an opaque connection id of up to 128 bytes."""

_CRC32C_BYTES: Final = 4
"""Section 2.2.3: "a 32-bit number", sent in network byte order (as HAProxy does)."""

_CRC32C_POLY_REFLECTED: Final = 0x82F63B78
"""RFC 4960 appendix B (cited by section 2.2.3): the Castagnoli polynomial 0x1EDC6F41,
bit-reversed for the LSB-first table algorithm."""


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY_REFLECTED if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE: Final = _crc32c_table()


def _crc32c(data: bytes) -> int:
    """CRC32c (RFC 4960 appendix B): initial value and final XOR 0xFFFFFFFF."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyHeader:
    """A parsed PROXY protocol header.

    The address fields are None when the header carries no IP address: `local` headers, and v2
    AF_UNIX (a proxied connection from a UNIX socket, `local` False). The router then keeps the
    connection's own peer address.
    """

    source_ip: str | None = None
    """The original client's address, canonical text, IPv6 without brackets (SPEC A2)."""
    source_port: int | None = None
    """The original client's port."""
    dest_ip: str | None = None
    """The address the client connected to (the load balancer's frontend)."""
    dest_port: int | None = None
    """The port the client connected to."""
    local: bool
    """No address to use: v2 LOCAL (the proxy's own connection, e.g. a health check) or v1 UNKNOWN.
    The connection's own peer address stays in force."""
    version: int
    """1 (text line) or 2 (binary)."""
    length: int
    """Bytes the header occupies at the start of the stream; the client's data starts here."""
    tlvs: tuple[tuple[int, bytes], ...] = ()
    """v2 PROXY type-length-value extensions in wire order, as (type, value); see `PP2_TYPE_*`.
    Empty for v1 and for v2 LOCAL, whose block is discarded unread (section 2.2)."""

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"version must be 1 or 2, got {self.version!r}")
        if self.length <= 0:
            raise ValueError(f"length must be > 0, got {self.length!r}")
        _check_ports(self.source_port, self.dest_port)
        addresses = (self.source_ip, self.source_port, self.dest_ip, self.dest_port)
        if self.local and any(value is not None for value in addresses):
            raise ValueError(f"a local header carries no addresses, got {addresses!r}")


def _quote(value: bytes | str) -> str:
    """`repr` of at most `_QUOTE_BYTES` of client input, marked when cut."""
    if len(value) <= _QUOTE_BYTES:
        return repr(value)
    return f"{value[:_QUOTE_BYTES]!r}..."


def _error(reason: str) -> SniffError:
    return SniffError(_PROTOCOL, reason)


def _is_prefix_of(data: bytes, signature: bytes) -> bool:
    """Whether `data` and `signature` agree on their common length."""
    return data[: len(signature)] == signature[: len(data)]


def looks_like_proxy_header(prefix: bytes) -> bool:
    """Whether a connection that starts with `prefix` may start with a PROXY protocol header.

    Cheap, never raises. True for every prefix of "PROXY " and of the v2 signature (including
    the empty prefix) and for longer data that starts with either.

    Args:
        prefix: the first bytes of the connection, any length.

    Returns:
        True if the bytes so far agree with the v1 or the v2 signature.
    """
    return _is_prefix_of(prefix, V1_PREFIX) or _is_prefix_of(prefix, V2_SIGNATURE)


def parse_proxy_header(data: bytes) -> ProxyHeader | NeedMore:
    """Parse the PROXY protocol header at the start of a connection (section 2).

    Pure and stateless: call it again with the whole buffer after every read. Bytes after the
    header (the client's payload) are not looked at.

    Args:
        data: everything the connection has sent so far.

    Returns:
        The header, or NEED_MORE while `data` is a valid but incomplete header.

    Raises:
        SniffError: ("proxy", reason) when `data` does not start with a PROXY header or the header
            is malformed (signature, v1 line length or CRLF, address or port syntax, v2 version,
            command, family, length, TLVs, CRC32c).
    """
    if _is_prefix_of(data, V2_SIGNATURE):
        return NEED_MORE if len(data) < len(V2_SIGNATURE) else _parse_v2(data)
    if _is_prefix_of(data, V1_PREFIX):
        return NEED_MORE if len(data) < len(V1_PREFIX) else _parse_v1(data)
    raise _error(f"missing PROXY protocol header, connection starts with {_quote(data)}")


# --- Version 1 ---------------------------------------------------------------------------------


def _parse_v1(data: bytes) -> ProxyHeader | NeedMore:
    """Section 2.1: one US-ASCII line ending in CRLF, at most 107 bytes."""
    window = data[:V1_MAX_LINE_BYTES]
    line_feed = window.find(b"\n")
    if line_feed < 0:
        # "must not tolerate a single CR or LF character to end the line"
        carriage_return = window.find(b"\r")
        if 0 <= carriage_return < len(window) - 1:
            raise _error(f"v1 line has a CR not followed by LF: {_quote(window)}")
        _check_v1_protocol_so_far(window)
        if len(window) >= V1_MAX_LINE_BYTES:
            raise _error(f"v1 line has no CRLF in the first {V1_MAX_LINE_BYTES} bytes: {_quote(window)}")
        return NEED_MORE
    line = window[: line_feed + 1]
    if not line.endswith(b"\r\n"):
        raise _error(f"v1 line ends with a bare LF: {_quote(line)}")
    if b"\r" in line[:-2]:
        raise _error(f"v1 line has a CR not followed by LF: {_quote(line)}")
    fields = line[:-2].split(b" ")
    protocol = fields[1]
    if protocol == b"UNKNOWN":
        # "the receiver must ignore anything presented before the CRLF is found"
        return ProxyHeader(local=True, version=1, length=len(line))
    if protocol not in _V1_PROTOCOLS:
        raise _error(f"v1 protocol must be TCP4, TCP6 or UNKNOWN, got {_quote(protocol)}")
    try:
        text = line[:-2].decode("ascii")
    except UnicodeDecodeError:
        raise _error(f"v1 line is not US-ASCII: {_quote(line)}") from None
    parts = text.split(" ")
    if len(parts) != _V1_FIELDS:
        raise _error(
            f"v1 {protocol.decode()} line needs {_V1_FIELDS} fields separated by single spaces, "
            f"got {len(parts)}: {_quote(text)}"
        )
    _, _, source_ip, dest_ip, source_port, dest_port = parts
    family = protocol.decode()
    return ProxyHeader(
        source_ip=_parse_v1_address(family, "source", source_ip),
        source_port=_parse_v1_port("source", source_port),
        dest_ip=_parse_v1_address(family, "destination", dest_ip),
        dest_port=_parse_v1_port("destination", dest_port),
        local=False,
        version=1,
        length=len(line),
    )


def _check_v1_protocol_so_far(window: bytes) -> None:
    """Reject a wrong protocol word before the CRLF arrives: the spec recommends aborting "as soon
    as possible" (section 2.1), and a bad word never becomes valid with more bytes."""
    rest = window[len(V1_PREFIX) :]
    end = min((i for i in (rest.find(b" "), rest.find(b"\r")) if i >= 0), default=-1)
    word = rest if end < 0 else rest[:end]
    complete = end >= 0
    if not any(known == word if complete else known.startswith(word) for known in _V1_PROTOCOLS):
        raise _error(f"v1 protocol must be TCP4, TCP6 or UNKNOWN, got {_quote(word)}")


def _parse_v1_address(family: str, which: str, text: str) -> str:
    """Section 2.1: IPv4 as 4 decimal numbers without leading zeroes; IPv6 as hex groups with at
    most one "::". `ipaddress` enforces both (it rejects leading zeroes since Python 3.9.5); it
    also accepts an IPv6 scope ("%eth0"), which the spec does not, so that is refused here."""
    try:
        if family == "TCP4":
            address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(text)
        else:
            if "%" in text:
                raise ValueError(text)
            address = ipaddress.IPv6Address(text)
    except ValueError:
        kind = "IPv4" if family == "TCP4" else "IPv6"
        raise _error(f"v1 {family} {which} address {_quote(text)} is not {kind}") from None
    return str(address)


def _parse_v1_port(which: str, text: str) -> int:
    """Section 2.1: decimal 0-65535, no leading zeroes."""
    if _V1_PORT.fullmatch(text) is None or int(text) > _MAX_PORT:
        raise _error(f"v1 {which} port must be decimal 0-65535 without leading zeroes, got {_quote(text)}")
    return int(text)


# --- Version 2 ---------------------------------------------------------------------------------


def _parse_v2(data: bytes) -> ProxyHeader | NeedMore:
    """Section 2.2: 16 fixed bytes, then `len` bytes of addresses and TLVs."""
    sig_end = len(V2_SIGNATURE)
    if len(data) > sig_end:
        ver_cmd = data[sig_end]
        if ver_cmd >> 4 != _V2_VERSION:
            raise _error(f"v2 version must be 2, got {ver_cmd >> 4} (byte 0x{ver_cmd:02x})")
        if ver_cmd & 0x0F not in (_V2_CMD_LOCAL, _V2_CMD_PROXY):
            raise _error(f"v2 command must be LOCAL (0) or PROXY (1), got {ver_cmd & 0x0F}")
        if ver_cmd & 0x0F == _V2_CMD_PROXY and len(data) > sig_end + 1:
            _check_v2_proxy_family(data[sig_end + 1])
    if len(data) < _V2_FIXED_BYTES:
        return NEED_MORE
    length = _V2_FIXED_BYTES + int.from_bytes(data[sig_end + 2 : _V2_FIXED_BYTES], "big")
    if data[sig_end] & 0x0F == _V2_CMD_LOCAL:
        # LOCAL: "the receiver must accept this connection as valid and must use the real
        # connection endpoints and discard the protocol block including the family which is
        # ignored". So neither the family nor the block is checked (HAProxy 2.6 does the same);
        # only `len` counts, to skip the block.
        if len(data) < length:
            return NEED_MORE
        return ProxyHeader(local=True, version=2, length=length)
    fam = data[sig_end + 1]
    address_bytes = _V2_ADDRESS_BYTES[fam]
    if length - _V2_FIXED_BYTES < address_bytes:
        raise _error(
            f"v2 length {length - _V2_FIXED_BYTES} is too short for family/transport 0x{fam:02x} "
            f"({address_bytes} address bytes)"
        )
    if len(data) < length:
        return NEED_MORE
    header = data[:length]
    tlvs = _parse_v2_tlvs(header, _V2_FIXED_BYTES + address_bytes)
    block = header[_V2_FIXED_BYTES : _V2_FIXED_BYTES + address_bytes]
    if fam >> 4 == _AF_UNIX:
        # Two 108-byte socket paths: no IP address and no ports.
        return ProxyHeader(local=False, version=2, length=length, tlvs=tlvs)
    size = 4 if fam >> 4 == _AF_INET else 16
    ip_type = ipaddress.IPv4Address if fam >> 4 == _AF_INET else ipaddress.IPv6Address
    return ProxyHeader(
        source_ip=str(ip_type(block[:size])),
        dest_ip=str(ip_type(block[size : 2 * size])),
        source_port=int.from_bytes(block[2 * size : 2 * size + 2], "big"),
        dest_port=int.from_bytes(block[2 * size + 2 : 2 * size + 4], "big"),
        local=False,
        version=2,
        length=length,
        tlvs=tlvs,
    )


def _check_v2_proxy_family(fam: int) -> None:
    """Section 2.2: byte 14 of a PROXY header must be one of the "expected" combinations; other
    values "must be rejected as invalid by receivers". AF_UNSPEC is refused too: with the PROXY
    command "the receiver is free to accept the connection anyway [...] or to reject" it, and a
    PROXY header without an address would silently key SOURCE_IP on the load balancer (HAProxy
    2.6 rejects it as well). Senders without an address use LOCAL."""
    if fam == _V2_FAM_UNSPEC:
        raise _error("v2 PROXY command with AF_UNSPEC (byte 0x00) carries no address")
    if fam not in _V2_ADDRESS_BYTES:
        known = ", ".join(f"0x{known:02x}" for known in _V2_ADDRESS_BYTES)
        raise _error(f"v2 family/transport byte must be one of {known}, got 0x{fam:02x}")


def _parse_v2_tlvs(header: bytes, start: int) -> tuple[tuple[int, bytes], ...]:
    """Section 2.2: TLVs fill the block after the addresses exactly; a PP2_TYPE_CRC32C TLV is
    verified (section 2.2.3: a receiver that supports it "MUST" reject a mismatch)."""
    tlvs: list[tuple[int, bytes]] = []
    crc_offset: int | None = None
    offset = start
    while offset < len(header):
        if len(header) - offset < _TLV_HEADER_BYTES:
            raise _error(f"v2 TLV at offset {offset} is cut short: {len(header) - offset} bytes left")
        tlv_type = header[offset]
        value_bytes = int.from_bytes(header[offset + 1 : offset + _TLV_HEADER_BYTES], "big")
        value_start = offset + _TLV_HEADER_BYTES
        if value_start + value_bytes > len(header):
            raise _error(
                f"v2 TLV 0x{tlv_type:02x} at offset {offset} has length {value_bytes}, "
                f"past the header end at {len(header)}"
            )
        value = header[value_start : value_start + value_bytes]
        if tlv_type == PP2_TYPE_CRC32C:
            if value_bytes != _CRC32C_BYTES:
                raise _error(f"v2 CRC32C TLV must be {_CRC32C_BYTES} bytes, got {value_bytes}")
            if crc_offset is not None:
                raise _error("v2 header has more than one CRC32C TLV")
            crc_offset = value_start
        tlvs.append((tlv_type, value))
        offset = value_start + value_bytes
    if crc_offset is not None:
        zeroed = header[:crc_offset] + bytes(_CRC32C_BYTES) + header[crc_offset + _CRC32C_BYTES :]
        sent = int.from_bytes(header[crc_offset : crc_offset + _CRC32C_BYTES], "big")
        computed = _crc32c(zeroed)
        if sent != computed:
            raise _error(f"v2 CRC32C mismatch: header says 0x{sent:08x}, computed 0x{computed:08x}")
    return tuple(tlvs)


# --- Encoders (for targets) --------------------------------------------------------------------


def _ip_pair(
    source_ip: str, dest_ip: str
) -> (
    tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | tuple[ipaddress.IPv6Address, ipaddress.IPv6Address]
):
    source = ipaddress.ip_address(source_ip)
    dest = ipaddress.ip_address(dest_ip)
    for address in (source, dest):
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
            raise ValueError(f"a PROXY header cannot carry an IPv6 scope, got {str(address)!r}")
    if isinstance(source, ipaddress.IPv4Address) and isinstance(dest, ipaddress.IPv4Address):
        return source, dest
    if isinstance(source, ipaddress.IPv6Address) and isinstance(dest, ipaddress.IPv6Address):
        return source, dest
    raise ValueError(
        f"source and destination must be the same address family, got {source_ip!r} and {dest_ip!r}"
    )


def _check_ports(*ports: int | None) -> None:
    """Every port given is 0-65535 (None: no port, as in a header without addresses)."""
    for port in ports:
        if port is not None and not 0 <= port <= _MAX_PORT:
            raise ValueError(f"port must be 0-65535, got {port!r}")


def encode_v1(source_ip: str, source_port: int, dest_ip: str, dest_port: int) -> bytes:
    """Encode a v1 line (section 2.1), "TCP4" or "TCP6" after the addresses' family.

    Args:
        source_ip: the client's address (IPv6 without brackets).
        source_port: the client's port.
        dest_ip: the address the client connected to.
        dest_port: the port the client connected to.

    Returns:
        The line with its CRLF, at most 104 bytes.

    Raises:
        ValueError: an address is not an IP address, the two families differ, an IPv6 scope is
            given, or a port is outside 0-65535.
    """
    source, dest = _ip_pair(source_ip, dest_ip)
    _check_ports(source_port, dest_port)
    family = "TCP4" if source.version == 4 else "TCP6"
    return f"PROXY {family} {source} {dest} {source_port} {dest_port}\r\n".encode("ascii")


def encode_v2(
    source_ip: str,
    source_port: int,
    dest_ip: str,
    dest_port: int,
    *,
    tlvs: Sequence[tuple[int, bytes]] = (),
) -> bytes:
    """Encode a v2 PROXY header for TCP (section 2.2), over IPv4 (0x11) or IPv6 (0x21) after the
    addresses' family, followed by `tlvs` in order. A PP2_TYPE_CRC32C TLV (value: any 4 bytes,
    e.g. 4 zero bytes) gets the header's checksum as its value (section 2.2.3).

    Args:
        source_ip: the client's address (IPv6 without brackets).
        source_port: the client's port.
        dest_ip: the address the client connected to.
        dest_port: the port the client connected to.
        tlvs: (type, value) extensions, e.g. (PP2_TYPE_AUTHORITY, b"broker.example").

    Returns:
        The header: 28 bytes for IPv4, 52 for IPv6, plus 3 + len(value) per TLV.

    Raises:
        ValueError: bad or mixed-family addresses, a port outside 0-65535, a TLV type outside
            0-255, a TLV value or the whole block longer than 65535 bytes, or a CRC32C TLV that
            is not 4 bytes or not the only one.
    """
    source, dest = _ip_pair(source_ip, dest_ip)
    _check_ports(source_port, dest_port)
    fam = 0x11 if source.version == 4 else 0x21
    block = bytearray(source.packed + dest.packed)
    block += source_port.to_bytes(2, "big") + dest_port.to_bytes(2, "big")
    crc_offset: int | None = None
    for tlv_type, value in tlvs:
        if not 0 <= tlv_type <= 0xFF:
            raise ValueError(f"TLV type must be 0-255, got {tlv_type!r}")
        if len(value) > _V2_MAX_BLOCK_BYTES:
            raise ValueError(f"TLV value must be at most 65535 bytes, got {len(value)}")
        if tlv_type == PP2_TYPE_CRC32C:
            if len(value) != _CRC32C_BYTES or crc_offset is not None:
                raise ValueError(f"one CRC32C TLV of {_CRC32C_BYTES} bytes at most, got {value!r}")
            crc_offset = _V2_FIXED_BYTES + len(block) + _TLV_HEADER_BYTES
            value = bytes(_CRC32C_BYTES)  # zero while the checksum is computed (section 2.2.3)
        block += bytes([tlv_type]) + len(value).to_bytes(2, "big") + value
    if len(block) > _V2_MAX_BLOCK_BYTES:
        raise ValueError(f"v2 addresses and TLVs must fit in 65535 bytes, got {len(block)}")
    ver_cmd = _V2_VERSION << 4 | _V2_CMD_PROXY
    header = V2_SIGNATURE + bytes([ver_cmd, fam]) + len(block).to_bytes(2, "big") + bytes(block)
    if crc_offset is None:
        return header
    crc = _crc32c(header).to_bytes(_CRC32C_BYTES, "big")
    return header[:crc_offset] + crc + header[crc_offset + _CRC32C_BYTES :]


def encode_v2_local() -> bytes:
    """Encode a v2 LOCAL header (section 2.2) for connections the router makes on its own
    behalf, such as health probes: AF_UNSPEC, no addresses, length 0 (as the spec recommends).

    Returns:
        The 16-byte header.
    """
    ver_cmd = _V2_VERSION << 4 | _V2_CMD_LOCAL
    return V2_SIGNATURE + bytes([ver_cmd, _V2_FAM_UNSPEC]) + (0).to_bytes(2, "big")
