"""The CORE sniffer (Artemis's own protocol, and its HORNETQ variant), the router's answers to what
a Java client waits for, and the redirect and refusal encoders (STYLE R1). Pure: no I/O, no
state, no clock.

A CORE connection starts with 7 magic bytes, `ARTEMIS` (the Artemis client,
`ActiveMQClientProtocolManager.sendHandshake`) or `HORNETQ` (HornetQ 2.4 clients; Artemis's
`ProtocolHandler` looks at the first 8 bytes and `HornetQProtocolManager.isProtocol` matches
`HORNETQ`), then packets (`PacketImpl.encode`): int32 length (big-endian, the bytes after it),
int8 type, int64 channel, then the body. Artemis's frame decoder has no size cap; this module
takes packets of at most `MAX_PACKET_BYTES`, and the router's byte cap (`sniffMaxBytes`) sees
each packet's announced end first (`CoreSniffer.announced_size`).

The user name, password and client ID come only in CREATESESSION (30) or CREATESESSION_V2 (-18),
and the Java client sends neither before it has heard from the server: after `ARTEMIS` it sends
PING (10) and SUBSCRIBE_TOPOLOGY_V2 (113) and blocks (`ServerLocatorImpl.createSessionFactory`,
`waitForTopology`, callTimeout 30 s) until a topology message with `last=true` arrives; it then
sends CREATESESSION_V2, the only variant with the client ID, if that message was
CLUSTER_TOPOLOGY_V4 (-17) with a server version of 131 or more (`isVersionSupportClientID`).
A client that reconnects sends CHECK_FOR_FAILOVER (-4) first and REATTACH_SESSION (32) for each
session it had, and blocks on both answers. So the sniffer answers, as a non-clustered Artemis
2.40 broker does (`CoreProtocolManager.LocalChannelHandler`, `ActiveMQPacketHandler`):

    client packet (channel)        the router's answer (channel)
    PING (0)                       PING (0), the same connection TTL
    SUBSCRIBE_TOPOLOGY_V2 (0)      CLUSTER_TOPOLOGY_V4 (0) for client version >= 131, _V2 for
                                   >= 122, CLUSTER_TOPOLOGY below: node ID `ROUTER_NODE_ID`, no
                                   connectors (the client uses the address it dialled), last=true,
                                   server version `SERVER_VERSION`
    SUBSCRIBE_TOPOLOGY (0)         CLUSTER_TOPOLOGY (0), as above
    CHECK_FOR_FAILOVER (1)         CHECK_FOR_FAILOVER_REPLY (1) true
    REATTACH_SESSION (1)           REATTACH_SESSION_RESP (1) -1, false: no such session, so the
                                   client creates it again (`reattachOnNewConnection`)

The answers are a function of the bytes alone (`Reply` is cumulative, keys/sniff.py), so the
topology's uniqueEventID is 0 (Topology.updateMember never rejects event 0 after a node-down)
where Artemis puts its clock. `parse_opening` reports what was answered, packet by packet, so
proxy mode can drop the broker's own answers when it replays the client's bytes.

`encode_create_session` writes what `parse_opening` reads (the CORE health probe opens its
session with it). The encoders at the end are what the data path sends instead of
CREATESESSION_RESP: the redirect (DISCONNECT_V3 naming the target's connector, then EXCEPTION
222) and the refusals in Artemis's words (ActiveMQRoutingHandler, ActiveMQMessageBundle).

Sources: apache/activemq-artemis at tag 2.40.0 (`PacketImpl`, the wireformat packets named at each
function, `ChannelBufferWrapper`, `UTF8Util`, `SimpleString`, `TransportConfiguration`).
"""

from __future__ import annotations

import enum
import functools
import struct
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from keys.sniff import NEED_MORE, NeedMore, Reply, Sniffed, SniffError, WireProtocol

if TYPE_CHECKING:
    from keys.sniff import SniffResult

__all__ = [
    "ARTEMIS_MAGIC",
    "HORNETQ_MAGIC",
    "MAX_PACKET_BYTES",
    "NETTY_CONNECTOR_FACTORY",
    "REMOTE_DISCONNECT",
    "ROUTER_NODE_ID",
    "ROUTING_EXCEPTION",
    "SECURITY_EXCEPTION",
    "SERVER_VERSION",
    "Answered",
    "CoreDisconnect",
    "CoreException",
    "CoreOpening",
    "CoreSniffer",
    "CreateSession",
    "DisconnectReason",
    "Packet",
    "PacketType",
    "TransportConfig",
    "decode_disconnect",
    "decode_exception",
    "decode_string",
    "encode_create_session",
    "encode_disconnect_v3",
    "encode_exception",
    "encode_not_authorized",
    "encode_packet",
    "encode_redirect",
    "encode_refusal",
    "encode_string",
    "parse_opening",
    "parse_packet",
    "server_preamble",
]

_NAME: Final = WireProtocol.CORE.value
"""The sniffer's name, in `Sniffed.protocol` and in every `SniffError`."""

ARTEMIS_MAGIC: Final = b"ARTEMIS"
"""What the Artemis client writes first (`ActiveMQClientProtocolManager`, `handshake`)."""
HORNETQ_MAGIC: Final = b"HORNETQ"
"""What a HornetQ 2.4 client writes first (`HornetQProtocolManager.isProtocol`)."""
_MAGIC_SIZE: Final = 7

MAX_PACKET_BYTES: Final = 64 * 1024
"""Largest packet length accepted in an opening. The Java client's CREATESESSION_V2 is about 130
bytes plus its strings; a packet near this size is garbage. The router's sniff cap (16 KiB) is
lower still, and `CoreSniffer.announced_size` lets it refuse a longer packet as soon as its
length has arrived."""

_HEADER_SIZE: Final = 1 + 8
"""Type (int8) and channel (int64): the part of a packet's length that every packet has."""
_PREFIX_SIZE: Final = 4
"""The int32 length before each packet (`PacketImpl.encodeSize`: it counts the bytes after it)."""

SERVER_VERSION: Final = 136
"""The server version the topology answer announces: `PacketImpl.ARTEMIS_2_37_0_VERSION`, still
the newest in 2.40 to 2.44 (what such a broker sends, `server.getVersion()`). 131 or more makes
the client send CREATESESSION_V2; the broker's CREATESESSION_RESP replaces it later."""
_CLIENT_ID_VERSION: Final = 131
"""`PacketImpl.ARTEMIS_2_18_0_VERSION`: CLUSTER_TOPOLOGY_V4, CREATESESSION_V2 and DISCONNECT_V3
from this channel version on (`ChannelImpl.supports`)."""
_TOPOLOGY_V2_VERSION: Final = 122
"""CLUSTER_TOPOLOGY_V2 from this channel version on (`ChannelImpl.supports`)."""

ROUTER_NODE_ID: Final = str(uuid.uuid5(uuid.NAMESPACE_URL, "urn:connection-router:core-node"))
"""The node ID the router gives itself in topology answers and redirects: fixed, so every answer
and every router agrees (a client that reconnects asks CHECK_FOR_FAILOVER about it)."""

_TOPOLOGY_EVENT_ID: Final = 0
"""uniqueEventID of the topology answer. Artemis puts `System.currentTimeMillis()`; the sniffer
has no clock and its answers depend on the bytes alone. `Topology.updateMember` only rejects an
update older than a node-down when its event ID is not 0."""

NETTY_CONNECTOR_FACTORY: Final = "org.apache.activemq.artemis.core.remoting.impl.netty.NettyConnectorFactory"
"""`NettyConnectorFactory.class.getName()`: the factory of a TCP connector."""

ROUTING_EXCEPTION: Final = 222
"""`ActiveMQExceptionType.ROUTING_EXCEPTION`: redirected, or the router is not ready."""
REMOTE_DISCONNECT: Final = 119
"""`ActiveMQExceptionType.REMOTE_DISCONNECT`: the router rejected the connection."""
SECURITY_EXCEPTION: Final = 105
"""`ActiveMQExceptionType.SECURITY_EXCEPTION`: bad user name or password."""
_EXCEPTION_NAMES: Final = {
    105: "SECURITY_EXCEPTION",
    108: "INCOMPATIBLE_CLIENT_SERVER_VERSIONS",
    112: "SESSION_CREATION_REJECTED",
    119: "REMOTE_DISCONNECT",
    222: "ROUTING_EXCEPTION",
}
"""Names of the `ActiveMQExceptionType` codes a CREATESESSION may be answered with."""

_SHORT_STRING_UNITS: Final = 9
"""Strings of fewer UTF-16 units are sent unit by unit (`UTF8Util.writeString`)."""
_UTF_STRING_UNITS: Final = 0xFFF
"""Strings of fewer units (and at least `_SHORT_STRING_UNITS`) are sent as modified UTF-8 after a
2-byte byte count (`saveUTF`); longer ones as a SimpleString (int32 byte count, UTF-16LE)."""
_NULL: Final = 0
_NOT_NULL: Final = 1
"""`DataConstants.NULL` / `NOT_NULL`: the byte before a nullable String or SimpleString."""
_TRUE: Final = b"\xff"
_FALSE: Final = b"\x00"
"""`ChannelBufferWrapper.writeBoolean` writes -1 or 0; readers take any non-zero byte as true."""

_QUOTE_BYTES: Final = 32
"""At most this many bytes of client data go into an error message (STYLE R7)."""


class PacketType(enum.IntEnum):
    """The packet types this module reads or writes (`PacketImpl`)."""

    PING = 10
    DISCONNECT = 11
    EXCEPTION = 20
    NULL_RESPONSE = 21
    CREATESESSION = 30
    CREATESESSION_RESP = 31
    REATTACH_SESSION = 32
    REATTACH_SESSION_RESP = 33
    SESS_CLOSE = 69
    CLUSTER_TOPOLOGY = 110
    SUBSCRIBE_TOPOLOGY = 112
    SUBSCRIBE_TOPOLOGY_V2 = 113
    CLUSTER_TOPOLOGY_V2 = 114
    CLUSTER_TOPOLOGY_V3 = 122
    DISCONNECT_V2 = 124
    CHECK_FOR_FAILOVER = -4
    CHECK_FOR_FAILOVER_REPLY = -5
    CLUSTER_TOPOLOGY_V4 = -17
    CREATESESSION_V2 = -18
    DISCONNECT_V3 = -19


class DisconnectReason(enum.IntEnum):
    """`DisconnectReason`: the byte of DISCONNECT_V3 saying why."""

    REDIRECT = 0
    REDIRECT_ON_CRITICAL_ERROR = 1
    SCALE_DOWN = 2
    SCALE_DOWN_ON_CRITICAL_ERROR = 3
    SHUT_DOWN = 4
    SHUT_DOWN_ON_CRITICAL_ERROR = 5


_PING_CHANNEL: Final = 0
"""`ChannelImpl.CHANNEL_ID.PING`: ping, topology and disconnect."""
_SESSION_CHANNEL: Final = 1
"""`ChannelImpl.CHANNEL_ID.SESSION`: session create, reattach, check for failover."""

_OPENING_CHANNELS: Final[dict[int, int]] = {
    PacketType.PING: _PING_CHANNEL,
    PacketType.SUBSCRIBE_TOPOLOGY: _PING_CHANNEL,
    PacketType.SUBSCRIBE_TOPOLOGY_V2: _PING_CHANNEL,
    PacketType.CHECK_FOR_FAILOVER: _SESSION_CHANNEL,
    PacketType.REATTACH_SESSION: _SESSION_CHANNEL,
    PacketType.CREATESESSION: _SESSION_CHANNEL,
    PacketType.CREATESESSION_V2: _SESSION_CHANNEL,
}
"""What a client may send before its first session exists, and on which channel
(`ClientSessionFactoryImpl.getConnection`, `ActiveMQClientProtocolManager`)."""

_TOPOLOGY_TYPES: Final = frozenset(
    {
        PacketType.CLUSTER_TOPOLOGY,
        PacketType.CLUSTER_TOPOLOGY_V2,
        PacketType.CLUSTER_TOPOLOGY_V3,
        PacketType.CLUSTER_TOPOLOGY_V4,
    }
)


def _type_name(packet_type: int) -> str:
    """A packet type for messages, e.g. `PING (10)` or `type 99`."""
    try:
        return f"{PacketType(packet_type).name} ({packet_type})"
    except ValueError:
        return f"type {packet_type}"


def _err(reason: str) -> SniffError:
    return SniffError(_NAME, reason)


# --- primitive encodings: ChannelBufferWrapper, UTF8Util, SimpleString ------------------------


_U16: Final = struct.Struct(">H")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_TYPE_AND_CHANNEL: Final = struct.Struct(">bq")


class _Reader:
    """Big-endian reads over `data[pos:end]`; reading past `end` is a SniffError naming the field."""

    __slots__ = ("_data", "end", "pos", "what")

    def __init__(self, data: bytes, pos: int, end: int, what: str) -> None:
        self._data = data
        self.pos = pos
        self.end = end
        self.what = what
        """The packet being read, for messages ("CREATESESSION_V2")."""

    def _short(self, n: int, field_name: str) -> SniffError:
        return _err(
            f"{self.what} {field_name} needs {n} bytes at offset {self.pos}, "
            f"only {self.end - self.pos} are left in the packet"
        )

    def take(self, n: int, field_name: str, suffix: str = "") -> bytes:
        """`n` bytes; `field_name` + `suffix` names them in the error (joined only then: this runs
        for every field of every opening)."""
        pos = self.pos
        if n > self.end - pos:
            raise self._short(n, field_name + suffix)
        self.pos = pos + n
        return self._data[pos : pos + n]

    def u8(self, field_name: str) -> int:
        pos = self.pos
        if pos >= self.end:
            raise self._short(1, field_name)
        self.pos = pos + 1
        return self._data[pos]

    def boolean(self, field_name: str) -> bool:
        """`readBoolean`: any non-zero byte is true."""
        return self.u8(field_name) != 0

    def u16(self, field_name: str, suffix: str = "") -> int:
        pos = self.pos
        if self.end - pos < 2:
            raise self._short(2, field_name + suffix)
        self.pos = pos + 2
        value: int = _U16.unpack_from(self._data, pos)[0]
        return value

    def i32(self, field_name: str, suffix: str = "") -> int:
        pos = self.pos
        if self.end - pos < 4:
            raise self._short(4, field_name + suffix)
        self.pos = pos + 4
        value: int = _I32.unpack_from(self._data, pos)[0]
        return value

    def i64(self, field_name: str) -> int:
        pos = self.pos
        if self.end - pos < 8:
            raise self._short(8, field_name)
        self.pos = pos + 8
        value: int = _I64.unpack_from(self._data, pos)[0]
        return value

    def present(self, field_name: str) -> bool:
        """The marker of a nullable value: 0 null, 1 present (`DataConstants`)."""
        marker = self.u8(field_name)
        if marker == _NOT_NULL:
            return True
        if marker != _NULL:
            raise _err(f"{self.what} {field_name}: nullable marker must be 0x00 or 0x01, got 0x{marker:02x}")
        return False

    def string(self, field_name: str) -> str:
        """`readString` (`ChannelBufferWrapper.readStringInternal`): int32 L = UTF-16 units, then
        L units (L < 9), or a uint16 byte count and modified UTF-8 (L < 4095), or a SimpleString."""
        units = self.i32(field_name, " length")
        if units < 0:
            raise _err(f"{self.what} {field_name}: string length {units} is negative")
        if units < _SHORT_STRING_UNITS:
            return self._units(self.take(2 * units, field_name), "utf-16-be", field_name)
        if units < _UTF_STRING_UNITS:
            raw = self.take(self.u16(field_name, " byte count"), field_name)
            if raw.isascii():  # the common case: one byte per unit
                if len(raw) != units:
                    raise _err(
                        f"{self.what} {field_name}: string length says {units} UTF-16 units, "
                        f"its modified UTF-8 holds {len(raw)}"
                    )
                return raw.decode("ascii")
            decoded = _decode_modified_utf8(raw)
            if decoded is None:
                raise _err(f"{self.what} {field_name}: bad modified UTF-8 {raw[:_QUOTE_BYTES].hex()}")
            if len(decoded) != 2 * units:
                raise _err(
                    f"{self.what} {field_name}: string length says {units} UTF-16 units, "
                    f"its modified UTF-8 holds {len(decoded) // 2}"
                )
            return self._units(decoded, "utf-16-be", field_name)
        size = self.i32(field_name, " byte count")
        if size != 2 * units:
            raise _err(
                f"{self.what} {field_name}: string of {units} UTF-16 units must have {2 * units} "
                f"bytes, its byte count is {size}"
            )
        return self._units(self.take(size, field_name), "utf-16-le", field_name)

    def nullable_string(self, field_name: str) -> str | None:
        return self.string(field_name) if self.present(field_name) else None

    def nullable_simple_string(self, field_name: str) -> str | None:
        """`readNullableSimpleString`: marker, int32 byte count, UTF-16LE."""
        if not self.present(field_name):
            return None
        size = self.i32(field_name, " byte count")
        if size < 0 or size % 2:
            raise _err(f"{self.what} {field_name}: SimpleString byte count must be even and >= 0, got {size}")
        return self._units(self.take(size, field_name), "utf-16-le", field_name)

    def _units(self, raw: bytes, codec: str, field_name: str) -> str:
        try:
            return raw.decode(codec)
        except UnicodeDecodeError:
            # Java strings may hold a lone surrogate; a key must be text, so refuse it.
            raise _err(f"{self.what} {field_name}: lone surrogate in {raw[:_QUOTE_BYTES].hex()}") from None


def _decode_modified_utf8(raw: bytes) -> bytes | None:
    """The UTF-16BE units of the modified UTF-8 `UTF8Util.saveUTF` writes: one unit per 1 to 3
    bytes, NUL as 0x00 (readers also take C0 80), surrogates one by one (CESU-8); None when a
    byte cannot start or continue a unit."""
    if raw.isascii():
        return raw.decode("ascii").encode("utf-16-be")
    units = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c < 0x80:
            unit, i = c, i + 1
        elif c >> 5 == 0b110 and i + 1 < n and raw[i + 1] >> 6 == 0b10:
            unit, i = ((c & 0x1F) << 6) | (raw[i + 1] & 0x3F), i + 2
        elif c >> 4 == 0b1110 and i + 2 < n and raw[i + 1] >> 6 == 0b10 and raw[i + 2] >> 6 == 0b10:
            unit, i = ((c & 0x0F) << 12) | ((raw[i + 1] & 0x3F) << 6) | (raw[i + 2] & 0x3F), i + 3
        else:
            return None
        units += unit.to_bytes(2, "big")
    return bytes(units)


def _encode_modified_utf8(units: bytes) -> bytes:
    """`UTF8Util.saveUTF`'s bytes (without the count) for UTF-16BE `units`: 0x0000-0x007F in one
    byte (NUL too, unlike Java's DataOutput), up to 0x07FF in two, the rest in three."""
    out = bytearray()
    for (unit,) in struct.iter_unpack(">H", units):
        if unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | (unit >> 6) & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def encode_string(value: str) -> bytes:
    """A String as `UTF8Util.writeString` writes it: int32 L (UTF-16 units), then L < 9: the units
    (UTF-16BE); 9 <= L < 4095: uint16 byte count + modified UTF-8; else int32 byte count +
    UTF-16LE (a SimpleString). A lone surrogate is written as Java would (it does not read back).

    Args:
        value: the text.

    Returns:
        The encoded String.
    """
    if value.isascii():  # the common case, without a pass over the units: one byte per unit
        count = len(value)
        if _SHORT_STRING_UNITS <= count < _UTF_STRING_UNITS:
            return struct.pack(">iH", count, count) + value.encode("ascii")
    units = value.encode("utf-16-be", "surrogatepass")
    count = len(units) // 2
    if count < _SHORT_STRING_UNITS:
        return struct.pack(">i", count) + units
    if count < _UTF_STRING_UNITS:
        utf = _encode_modified_utf8(units)  # at most 3 * 4094 bytes: the uint16 count holds it
        return struct.pack(">iH", count, len(utf)) + utf
    return struct.pack(">ii", count, len(units)) + value.encode("utf-16-le", "surrogatepass")


def _nullable_string(value: str | None) -> bytes:
    """`writeNullableString`: 0x00, or 0x01 and the String."""
    return bytes((_NULL,)) if value is None else bytes((_NOT_NULL,)) + encode_string(value)


def _nullable_simple_string(value: str | None) -> bytes:
    """`writeNullableSimpleString`: 0x00, or 0x01, int32 byte count and UTF-16LE."""
    if value is None:
        return bytes((_NULL,))
    raw = value.encode("utf-16-le", "surrogatepass")
    return bytes((_NOT_NULL,)) + struct.pack(">i", len(raw)) + raw


def _boolean(value: bool) -> bytes:
    return _TRUE if value else _FALSE


def decode_string(data: bytes, offset: int = 0) -> tuple[str, int]:
    """Read one String (the encoding of `encode_string`) at `offset`.

    Args:
        data: bytes holding the whole String at `offset`.
        offset: where it starts.

    Returns:
        The text and the offset after it.

    Raises:
        SniffError: a negative length, a byte count that does not fit the length, bad modified
            UTF-8, a lone surrogate, or a String that runs past the end of `data`.
    """
    r = _Reader(data, offset, len(data), "String")
    return r.string("value"), r.pos


# --- packets ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Packet:
    """One whole packet in a buffer (`PacketImpl.encode`)."""

    type: int
    """The packet type, a signed byte (`PacketType` for those this module knows)."""
    channel: int
    """The channel ID (0 ping and topology, 1 session create, 10 and up sessions)."""
    body: bytes
    """What follows type and channel."""
    start: int
    """Offset of the packet's length field in the buffer."""
    end: int
    """Offset just past the packet."""


def encode_packet(packet_type: int, channel: int, body: bytes) -> bytes:
    """A packet on the wire: int32 length (of what follows it), int8 type, int64 channel, body.

    Raises:
        ValueError: a type outside -128..127.
    """
    if not -128 <= packet_type <= 127:
        raise ValueError(f"packet type must be a signed byte, got {packet_type!r}")
    return struct.pack(">ibq", _HEADER_SIZE + len(body), packet_type, channel) + body


def _check_length(length: int, offset: int, max_size: int) -> None:
    if length < _HEADER_SIZE:
        raise _err(
            f"packet length {length} at offset {offset} is below the {_HEADER_SIZE} bytes of type and channel"
        )
    if length > max_size:
        raise _err(f"packet length {length} at offset {offset} exceeds {max_size}")


def parse_packet(data: bytes, offset: int = 0, *, max_size: int = MAX_PACKET_BYTES) -> Packet | NeedMore:
    """The packet at `offset`, once all of it is in `data`.

    Args:
        data: the buffer.
        offset: where the packet's length field starts.
        max_size: the largest length accepted (the broker's packets in proxy mode may be larger
            than an opening's; pass what the caller's buffer allows).

    Returns:
        The packet, or NEED_MORE while `data` ends inside it.

    Raises:
        SniffError: a length below 9 (type and channel) or above `max_size`.
    """
    if len(data) - offset < _PREFIX_SIZE:
        return NEED_MORE
    length = int.from_bytes(data[offset : offset + _PREFIX_SIZE], "big", signed=True)
    _check_length(length, offset, max_size)
    end = offset + _PREFIX_SIZE + length
    if len(data) < end:
        return NEED_MORE
    head = offset + _PREFIX_SIZE
    packet_type, channel = _TYPE_AND_CHANNEL.unpack_from(data, head)
    return Packet(
        type=packet_type, channel=channel, body=data[head + _HEADER_SIZE : end], start=offset, end=end
    )


_TYPE_NAMES: Final = {int(kind): kind.name for kind in PacketType}


def _reader(packet: Packet) -> _Reader:
    """A reader over a packet's body whose errors name the packet."""
    what = _TYPE_NAMES.get(packet.type) or f"packet type {packet.type}"
    return _Reader(packet.body, 0, len(packet.body), what)


# --- the opening: what the client sends, what the router answers -----------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateSession:
    """A CREATESESSION or CREATESESSION_V2 (`CreateSessionMessage(_V2).decodeRest`)."""

    packet_type: int
    """`PacketType.CREATESESSION` (V1, no client ID) or `CREATESESSION_V2`."""
    name: str
    """The session's name (a UUID)."""
    session_channel: int
    """The channel the session will use."""
    version: int
    """The client's version (`getIncrementingVersion`, 136 for 2.37 and later)."""
    user_name: str | None
    password: str | None = field(repr=False)
    """Plain text, as sent; never logged."""
    min_large_message_size: int
    xa: bool
    auto_commit_sends: bool
    auto_commit_acks: bool
    window_size: int
    pre_acknowledge: bool
    default_address: str | None
    client_id: str | None
    """V2 only: the connection factory's client ID; None for V1 and for a null ID."""


def _read_create_session(packet: Packet) -> CreateSession:
    """The fields in `CreateSessionMessage.encodeRest` order, then V2's clientID. Bytes after
    them are ignored, as Artemis's decoders ignore the rest of a packet."""
    r = _reader(packet)
    name = r.string("name")
    session_channel = r.i64("sessionChannelID")
    version = r.i32("version")
    user_name = r.nullable_string("username")
    password = r.nullable_string("password")
    min_large = r.i32("minLargeMessageSize")
    xa = r.boolean("xa")
    auto_commit_sends = r.boolean("autoCommitSends")
    auto_commit_acks = r.boolean("autoCommitAcks")
    window_size = r.i32("windowSize")
    pre_acknowledge = r.boolean("preAcknowledge")
    default_address = r.nullable_string("defaultAddress")
    client_id = r.nullable_string("clientID") if packet.type == PacketType.CREATESESSION_V2 else None
    return CreateSession(
        packet_type=packet.type,
        name=name,
        session_channel=session_channel,
        version=version,
        user_name=user_name,
        password=password,
        min_large_message_size=min_large,
        xa=xa,
        auto_commit_sends=auto_commit_sends,
        auto_commit_acks=auto_commit_acks,
        window_size=window_size,
        pre_acknowledge=pre_acknowledge,
        default_address=default_address,
        client_id=client_id,
    )


def encode_create_session(
    *,
    name: str,
    session_channel: int,
    version: int,
    user_name: str | None,
    password: str | None,
    client_id: str | None = None,
    v2: bool = True,
    min_large_message_size: int = 102400,
    xa: bool = False,
    auto_commit_sends: bool = False,
    auto_commit_acks: bool = False,
    window_size: int = -1,
    pre_acknowledge: bool = False,
    default_address: str | None = None,
) -> bytes:
    """CREATESESSION_V2 (-18), or CREATESESSION (30) without the client ID, on channel 1
    (`CreateSessionMessage(_V2).encodeRest`, the fields `parse_opening` reads back). The defaults
    are what the Java client's JMS connection sends for its first session: 100 KiB large messages
    (`ActiveMQClient.DEFAULT_MIN_LARGE_MESSAGE_SIZE`), nothing auto-committed, window -1.

    Args:
        name: the session's name, unique on the broker (the Java client takes a UUID).
        session_channel: the channel the session will use (the Java client's start at 10).
        version: the client's version (`PacketImpl`: 131 = 2.18, the first with CREATESESSION_V2;
            136 = 2.37 and later); the broker refuses one outside its compatible list.
        user_name: the user name, or None.
        password: the password, or None.
        client_id: V2's client ID, or None.
        v2: CREATESESSION_V2 (with the client ID) or CREATESESSION.

    Returns:
        The packet.

    Raises:
        ValueError: a number that does not fit its field, or a client ID with `v2=False`.
    """
    if not v2 and client_id is not None:
        raise ValueError(f"CREATESESSION carries no client ID, got {client_id!r}")
    for field_name, value, bits in (
        ("session_channel", session_channel, 64),
        ("version", version, 32),
        ("min_large_message_size", min_large_message_size, 32),
        ("window_size", window_size, 32),
    ):
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise ValueError(f"{field_name} must fit an int{bits}, got {value!r}")
    body = encode_string(name) + struct.pack(">qi", session_channel, version)
    body += _nullable_string(user_name) + _nullable_string(password)
    body += struct.pack(">i", min_large_message_size)
    body += _boolean(xa) + _boolean(auto_commit_sends) + _boolean(auto_commit_acks)
    body += struct.pack(">i", window_size) + _boolean(pre_acknowledge) + _nullable_string(default_address)
    if v2:
        body += _nullable_string(client_id)
    packet_type = PacketType.CREATESESSION_V2 if v2 else PacketType.CREATESESSION
    return encode_packet(packet_type, _SESSION_CHANNEL, body)


_PARSED_OPENINGS: Final = 64
"""`parse_opening` results kept: a connection's opening is read a few times within one step, so a
few per connection being opened at once is plenty; each is a few hundred bytes."""
_MADE_ANSWERS: Final = 1024
"""Redirect packets kept, one per (router, target, TLS), more than a fleet has; and PING answers,
one per connection TTL (clients of one configuration send the same)."""


def _topology_variant(client_version: int | None) -> int:
    """The lowest client version of the topology variant `client_version` gets: the topology a
    non-clustered Artemis broker sends (`LocalChannelHandler`) comes in the newest variant the
    client's version takes (None: the client sent SUBSCRIBE_TOPOLOGY, which carries no version, so
    its channel version is 0)."""
    version = client_version or 0
    if version >= _CLIENT_ID_VERSION:
        return _CLIENT_ID_VERSION
    if version >= _TOPOLOGY_V2_VERSION:
        return _TOPOLOGY_V2_VERSION
    return 0


@functools.cache
def _topology_packet(version: int) -> bytes:
    """The topology answer of a variant (`_topology_variant`): one node, no connectors,
    last=true; made once per variant (three in all)."""
    # ClusterTopologyChangeMessage(_V2).encodeRest: exit, nodeID, [uniqueEventID,] then, as exit
    # is false, hasPrimary, hasBackup (no TransportConfiguration follows either) and last.
    node = encode_string(ROUTER_NODE_ID)
    member = _FALSE + _FALSE + _TRUE
    if version >= _CLIENT_ID_VERSION:
        # _V2: backupGroupName; _V3: scaleDownGroupName; _V4: serverVersion.
        event = struct.pack(">q", _TOPOLOGY_EVENT_ID)
        body = _FALSE + node + event + member + _nullable_string(None) + _nullable_string(None)
        return encode_packet(
            PacketType.CLUSTER_TOPOLOGY_V4, _PING_CHANNEL, body + struct.pack(">i", SERVER_VERSION)
        )
    if version >= _TOPOLOGY_V2_VERSION:
        # Artemis answers a non-clustered subscription with _V2 here, not _V3.
        event = struct.pack(">q", _TOPOLOGY_EVENT_ID)
        body = _FALSE + node + event + member + _nullable_string(None)
        return encode_packet(PacketType.CLUSTER_TOPOLOGY_V2, _PING_CHANNEL, body)
    return encode_packet(PacketType.CLUSTER_TOPOLOGY, _PING_CHANNEL, _FALSE + node + member)


@dataclass(frozen=True, slots=True, kw_only=True)
class Answered:
    """A client packet the router answered itself during the opening."""

    packet_type: int
    """What the client sent (`PacketType.PING`, `SUBSCRIBE_TOPOLOGY_V2`, ...)."""
    channel: int
    """The channel it came on, which the answer goes back on."""
    answer: bytes
    """The router's answer, a whole packet."""
    broker_answers: frozenset[int]
    """The packet types a broker answers it with when proxy mode replays it, which the client
    must not get a second time. A subscription to the topology is answered with one topology
    message per cluster member at first and with every change later, in any variant: proxy mode
    drops the broker's channel-0 topology messages for the whole connection (else clients learn
    the brokers' own connectors and bypass the router)."""


def _answer(packet: Packet) -> Answered:
    """The router's answer to a packet of the opening other than CREATESESSION (the packet's
    fields are read for their checks; answers that do not depend on them are made once)."""
    r = _reader(packet)
    kind = packet.type
    if kind == PacketType.PING:
        # Ping.decodeRest: connectionTTL; the broker echoes the packet (`channel0.send(packet)`).
        return _ping_answered(packet.channel, r.i64("connectionTTL"))
    if kind == PacketType.SUBSCRIBE_TOPOLOGY or kind == PacketType.SUBSCRIBE_TOPOLOGY_V2:
        # SubscribeClusterTopologyUpdatesMessage(V2).decodeRest: clusterConnection[, clientVersion].
        r.boolean("clusterConnection")
        version = r.i32("clientVersion") if kind == PacketType.SUBSCRIBE_TOPOLOGY_V2 else None
        return _topology_answered(kind, packet.channel, _topology_variant(version))
    if kind == PacketType.CHECK_FOR_FAILOVER:
        # CheckFailoverMessage: nullable nodeID.
        r.nullable_string("nodeID")
        return _constant_answered(kind, packet.channel)
    if kind == PacketType.REATTACH_SESSION:
        # ReattachSessionMessage: name, lastConfirmedCommandID.
        r.string("name")
        r.i32("lastConfirmedCommandID")
        return _constant_answered(kind, packet.channel)
    raise AssertionError(f"no answer for {_type_name(packet.type)}")  # _check_opening_packet ran first


@functools.lru_cache(maxsize=_MADE_ANSWERS)
def _ping_answered(channel: int, ttl: int) -> Answered:
    answer = encode_packet(PacketType.PING, _PING_CHANNEL, struct.pack(">q", ttl))
    return Answered(
        packet_type=PacketType.PING,
        channel=channel,
        answer=answer,
        broker_answers=frozenset({PacketType.PING}),
    )


@functools.cache
def _topology_answered(kind: int, channel: int, variant: int) -> Answered:
    """Bounded: `_check_opening_packet` allows one channel per type, and there are three variants."""
    return Answered(
        packet_type=PacketType(kind),
        channel=channel,
        answer=_topology_packet(variant),
        broker_answers=_TOPOLOGY_TYPES,
    )


@functools.cache
def _constant_answered(kind: int, channel: int) -> Answered:
    """The answers that depend on nothing the client sent (bounded as `_topology_answered`)."""
    if kind == PacketType.CHECK_FOR_FAILOVER:
        # Artemis says yes unless it has scaled down (`ActiveMQPacketHandler.handleCheckForFailover`);
        # the router has nothing to scale down.
        answer = encode_packet(PacketType.CHECK_FOR_FAILOVER_REPLY, _SESSION_CHANNEL, _TRUE)
        reply = frozenset({PacketType.CHECK_FOR_FAILOVER_REPLY})
    else:
        # For a session it does not know Artemis answers lastConfirmedCommandID -1, reattached
        # false (`handleReattachSession`).
        answer = encode_packet(
            PacketType.REATTACH_SESSION_RESP, _SESSION_CHANNEL, struct.pack(">i", -1) + _FALSE
        )
        reply = frozenset({PacketType.REATTACH_SESSION_RESP})
    return Answered(packet_type=PacketType(kind), channel=channel, answer=answer, broker_answers=reply)


def _check_opening_packet(data: bytes, start: int) -> None:
    """Reject a packet that cannot be part of an opening, from as few bytes as are there: its type
    (byte 4 after the length) and its channel (bytes 5-12)."""
    if len(data) <= start + _PREFIX_SIZE:
        return
    packet_type = struct.unpack_from(">b", data, start + _PREFIX_SIZE)[0]
    channel = _OPENING_CHANNELS.get(packet_type)
    if channel is None:
        raise _err(f"unexpected {_type_name(packet_type)} at offset {start} before CREATESESSION")
    if len(data) >= start + _PREFIX_SIZE + _HEADER_SIZE:
        got = struct.unpack_from(">q", data, start + _PREFIX_SIZE + 1)[0]
        if got != channel:
            raise _err(
                f"{_type_name(packet_type)} at offset {start} must come on channel {channel}, got {got}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreOpening:
    """What the client sent of its opening so far and what the router answered."""

    magic: bytes
    """`ARTEMIS_MAGIC` or `HORNETQ_MAGIC`."""
    answered: tuple[Answered, ...]
    """The packets before CREATESESSION the router answered, in the order the client sent them."""
    session: CreateSession | None
    """The CREATESESSION(_V2), once it is complete; None before."""
    end: int
    """Offset after the last whole packet read (the CREATESESSION when `session` is set)."""
    pending_end: int | None
    """Where the packet the buffer ends inside will end, once its length has arrived; None when
    `session` is set or the length is not complete yet."""

    @property
    def to_client(self) -> bytes:
        """Everything the router must have sent the client: the answers, in order."""
        return b"".join(a.answer for a in self.answered)


def _check_magic(data: bytes) -> bytes | None:
    """The magic at the start of `data`, None while it is incomplete; raises at the first byte
    that starts neither."""
    got = data[:_MAGIC_SIZE]
    for magic in (ARTEMIS_MAGIC, HORNETQ_MAGIC):
        if magic.startswith(got):
            return magic if len(got) == _MAGIC_SIZE else None
    raise _err(f"connection must start with {ARTEMIS_MAGIC!r} or {HORNETQ_MAGIC!r}, got {got!r}")


@functools.lru_cache(maxsize=_PARSED_OPENINGS)
def parse_opening(data: bytes) -> CoreOpening | NeedMore:
    """Read a client's opening: the magic, then packets up to its first CREATESESSION(_V2).

    The last few results are kept (the sniffer, the preamble the client is owed and the redirect
    read one connection's opening several times); the result is immutable.

    Args:
        data: every byte the client sent so far.

    Returns:
        NEED_MORE until the 7 magic bytes are in; then what was read and answered so far (its
        `session` is set once the CREATESESSION is complete; bytes after it are not read).

    Raises:
        SniffError: another magic, a packet length below 9 or above `MAX_PACKET_BYTES`, a packet
            type that is no part of an opening or on the wrong channel, or a field that is
            malformed or runs past its packet (the message names the packet and the field).
    """
    magic = _check_magic(data)
    if magic is None:
        return NEED_MORE
    answered: list[Answered] = []
    pos, size = _MAGIC_SIZE, len(data)
    while True:
        pending: int | None = None
        if size - pos >= _PREFIX_SIZE:
            length = _I32.unpack_from(data, pos)[0]
            _check_length(length, pos, MAX_PACKET_BYTES)
            pending = pos + _PREFIX_SIZE + length
        _check_opening_packet(data, pos)
        if pending is None or size < pending:
            return CoreOpening(
                magic=magic, answered=tuple(answered), session=None, end=pos, pending_end=pending
            )
        head = pos + _PREFIX_SIZE
        packet_type, channel = _TYPE_AND_CHANNEL.unpack_from(data, head)
        packet = Packet(
            type=packet_type,
            channel=channel,
            body=data[head + _HEADER_SIZE : pending],
            start=pos,
            end=pending,
        )
        if packet_type == PacketType.CREATESESSION_V2 or packet_type == PacketType.CREATESESSION:
            session = _read_create_session(packet)
            return CoreOpening(
                magic=magic, answered=tuple(answered), session=session, end=pending, pending_end=None
            )
        answered.append(_answer(packet))
        pos = pending


def server_preamble(data: bytes) -> bytes:
    """What the router must have sent a client whose opening is `data`: the answers to its packets
    before CREATESESSION. A client that sent its whole opening at once got `Sniffed` before any
    `Reply`, so the router sends `server_preamble(raw)[len(already_sent):]` before its own words
    (redirect, refusal) or, in proxy mode, before the broker's answers it relays.

    Raises:
        SniffError: `data` is not a valid opening (see `parse_opening`).
    """
    opening = parse_opening(data)
    return b"" if opening is NEED_MORE else opening.to_client


class CoreSniffer:
    """Sniffs a CORE (or HORNETQ) opening: answers PING, the topology subscription, CHECK_FOR_FAILOVER
    and REATTACH_SESSION, then reads user name, password and client ID from CREATESESSION(_V2)."""

    name = _NAME

    def looks_like(self, prefix: bytes) -> bool:
        """Whether `prefix` may start `ARTEMIS` or `HORNETQ` (what Artemis's protocol managers
        match in the first bytes). Never raises.

        Args:
            prefix: the first bytes of the connection, possibly only one.
        """
        got = prefix[:_MAGIC_SIZE]
        return ARTEMIS_MAGIC.startswith(got) or HORNETQ_MAGIC.startswith(got)

    def announced_size(self, data: bytes) -> int | None:
        """Where the packet the buffer ends inside will end (so the router refuses a packet that
        would take it over its byte cap as soon as its length has arrived); the end of the
        CREATESESSION once it is complete; None otherwise and for bytes `sniff` rejects. Never
        raises.

        Args:
            data: every byte the client has sent so far.
        """
        try:
            opening = parse_opening(data)
        except SniffError:
            return None
        if opening is NEED_MORE:
            return None
        return opening.end if opening.session is not None else opening.pending_end

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the client's opening.

        Args:
            data: every byte the client has sent so far.

        Returns:
            NEED_MORE while nothing needs an answer; `Reply` with every answer so far while the
            client waits; `Sniffed` once the CREATESESSION(_V2) is complete, with `client_id`
            (None for CREATESESSION and for a null client ID: the NULL key), `user_name`,
            `password` and `protocol_version` (the CREATESESSION's version, e.g. "136").

        Raises:
            SniffError: see `parse_opening`.
        """
        opening = parse_opening(data)
        if opening is NEED_MORE:
            return NEED_MORE
        session = opening.session
        if session is None:
            said = opening.to_client
            return Reply(to_client=said) if said else NEED_MORE
        return Sniffed(
            protocol=WireProtocol.CORE,
            client_id=session.client_id,
            user_name=session.user_name,
            password=session.password,
            protocol_version=str(session.version),
        )


# --- what the router says instead of CREATESESSION_RESP: redirect and refusals -----------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """A `TransportConfiguration`: how a client reaches a broker (name, factory, parameters)."""

    name: str
    """The connector's name (`<connector name="...">`)."""
    factory: str = NETTY_CONNECTOR_FACTORY
    """The connector factory's class name."""
    params: tuple[tuple[str, bool | int | str], ...] = ()
    """Parameters in order: `host`, `port`, `sslEnabled`, ... A connector configured by URL has
    every value as a String (`BeanSupport`), which `ConfigurationHelper` parses."""

    def describe(self) -> str:
        """`TransportConfiguration.toString()`, as Artemis puts it into AMQ229237: dots turned to
        dashes (`replaceWildcardChars`), passwords masked."""
        query = "&".join(
            f"{key}={'****' if 'password' in key.lower() else _java_text(value)}"
            for key, value in self.params
        ).replace(".", "-")
        factory = self.factory.replace(".", "-")
        return f"TransportConfiguration(name={self.name}, factory={factory}){'?' if query else ''}{query}"


def _java_text(value: bool | int | str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_PARAM_TYPES: Final = {bool: 0, int: 1, str: 3}
"""`TransportConfiguration.TYPE_BOOLEAN`, `TYPE_INT`, `TYPE_STRING` (2, `TYPE_LONG`, is read
as an int here)."""


def _encode_transport_config(config: TransportConfig) -> bytes:
    """`TransportConfiguration.encode`: String name, String factoryClassName, int32 count, then per
    parameter a String key, a type byte and the value."""
    out = bytearray(encode_string(config.name) + encode_string(config.factory))
    out += struct.pack(">i", len(config.params))
    for key, value in config.params:
        out += encode_string(key)
        if isinstance(value, bool):
            out += bytes((_PARAM_TYPES[bool],)) + _boolean(value)
        elif isinstance(value, int):
            if not -(2**31) <= value < 2**31:
                raise ValueError(f"connector parameter {key!r} does not fit an int32: {value!r}")
            out += bytes((_PARAM_TYPES[int],)) + struct.pack(">i", value)
        else:
            out += bytes((_PARAM_TYPES[str],)) + encode_string(value)
    return bytes(out)


def _read_transport_config(r: _Reader) -> TransportConfig:
    """`TransportConfiguration.decode`."""
    name = r.string("connector name")
    factory = r.string("connector factory")
    count = r.i32("connector parameter count")
    if count < 0:
        raise _err(f"{r.what} connector parameter count {count} is negative")
    params: list[tuple[str, bool | int | str]] = []
    for _ in range(count):
        if r.pos >= r.end:  # each parameter takes bytes: a count above them is malformed
            raise _err(f"{r.what} connector parameter count {count} runs past the packet")
        key = r.string("connector parameter name")
        kind = r.u8("connector parameter type")
        value: bool | int | str
        if kind == 0:
            value = r.boolean(key)
        elif kind == 1:
            value = r.i32(key)
        elif kind == 2:
            value = r.i64(key)
        elif kind == 3:
            value = r.string(key)
        else:
            raise _err(f"{r.what} connector parameter {key!r}: unknown type {kind}")
        params.append((key, value))
    return TransportConfig(name=name, factory=factory, params=tuple(params))


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreDisconnect:
    """A DISCONNECT_V3 (`DisconnectMessage_V3`)."""

    node_id: str | None
    """The node of the server that disconnects (the router's `ROUTER_NODE_ID`)."""
    reason: int
    """A `DisconnectReason` value (0 = REDIRECT)."""
    target_node_id: str | None
    """The node the client should go to, when known."""
    connector: TransportConfig | None
    """How to reach it; for a redirect the client takes only these parameters."""


def encode_disconnect_v3(
    *,
    reason: DisconnectReason,
    connector: TransportConfig | None,
    node_id: str | None = ROUTER_NODE_ID,
    target_node_id: str | None = None,
) -> bytes:
    """DISCONNECT_V3 (-19) on channel 0 (`DisconnectMessage_V3.encodeRest`): nullable SimpleString
    nodeID, byte reason, nullable SimpleString targetNodeID, bool hasConnector and the
    TransportConfiguration. Only clients of version 131 and up read it (`ChannelImpl.supports`).

    Raises:
        ValueError: a parameter value that does not fit its type.
    """
    body = (
        _nullable_simple_string(node_id) + struct.pack(">b", reason) + _nullable_simple_string(target_node_id)
    )
    body += _FALSE if connector is None else _TRUE + _encode_transport_config(connector)
    return encode_packet(PacketType.DISCONNECT_V3, _PING_CHANNEL, body)


def decode_disconnect(packet: Packet) -> CoreDisconnect:
    """Read a DISCONNECT_V3.

    Raises:
        SniffError: another packet type, or a malformed or truncated field.
    """
    if packet.type != PacketType.DISCONNECT_V3:
        raise _err(f"expected DISCONNECT_V3 (-19), got {_type_name(packet.type)}")
    r = _reader(packet)
    node_id = r.nullable_simple_string("nodeID")
    reason = int.from_bytes(r.take(1, "reason"), "big", signed=True)
    target_node_id = r.nullable_simple_string("targetNodeID")
    connector = _read_transport_config(r) if r.boolean("hasTargetConnector") else None
    return CoreDisconnect(node_id=node_id, reason=reason, target_node_id=target_node_id, connector=connector)


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreException:
    """An EXCEPTION packet (`ActiveMQExceptionMessage`): the answer to a refused CREATESESSION."""

    code: int
    """The `ActiveMQExceptionType` code, e.g. `ROUTING_EXCEPTION`."""
    message: str | None
    """The message, starting with its AMQ id, e.g. "AMQ229238: Connection router r not ready"."""

    def describe(self) -> str:
        """e.g. "EXCEPTION 119 (REMOTE_DISCONNECT): AMQ229240: ..."."""
        name = _EXCEPTION_NAMES.get(self.code)
        head = f"EXCEPTION {self.code}" + (f" ({name})" if name else "")
        return f"{head}: {self.message}" if self.message else head


def encode_exception(code: int, message: str | None) -> bytes:
    """EXCEPTION (20) on channel 1 (`ActiveMQExceptionMessage.encodeRest`: int32 code, nullable
    String message), what Artemis answers a CREATESESSION it refuses with. Artemis sends this
    first variant, without a correlation ID; the client reads it as `_V2` with ID 0.

    Raises:
        ValueError: a code that does not fit an int32.
    """
    if not -(2**31) <= code < 2**31:
        raise ValueError(f"exception code must fit an int32, got {code!r}")
    return encode_packet(
        PacketType.EXCEPTION, _SESSION_CHANNEL, struct.pack(">i", code) + _nullable_string(message)
    )


def decode_exception(packet: Packet) -> CoreException:
    """Read an EXCEPTION packet (with or without `_V2`'s trailing correlation ID).

    Raises:
        SniffError: another packet type, or a malformed or truncated field.
    """
    if packet.type != PacketType.EXCEPTION:
        raise _err(f"expected EXCEPTION (20), got {_type_name(packet.type)}")
    r = _reader(packet)
    return CoreException(code=r.i32("code"), message=r.nullable_string("message"))


def encode_redirect(
    *,
    router: str,
    connector_name: str,
    host: str,
    port: int,
    ssl_enabled: bool = False,
    target_node_id: str | None = None,
) -> bytes:
    """Artemis's CORE redirect (`ActiveMQRoutingHandler.redirect`): DISCONNECT_V3 on channel 0 with
    reason REDIRECT and the target's connector, then, as the answer to CREATESESSION, EXCEPTION
    222 "AMQ229237: Connection router R redirected the connection to TransportConfiguration(...)".

    The Java client takes the connector as its next one and reconnects there, only if
    `reconnectAttempts` or `failoverAttempts` is not 0 (both default to 0); it uses the
    connector's parameters alone (`getCombinedParams`), so a client that came over TLS is told
    `sslEnabled=true` (its key and trust stores are not passed on: it needs them in its defaults
    or system properties). Send `server_preamble(raw)` (the part not sent yet) before this.

    Args:
        router: the router's name, in the message.
        connector_name: the target connector's name.
        host: the target's host.
        port: the target's port, 1-65535.
        ssl_enabled: the acceptor terminates TLS: the client must use TLS to the target too.
        target_node_id: the target broker's node ID, when known (the client only uses it for
            scale-down).

    Returns:
        The two packets.

    Raises:
        ValueError: an empty host or connector name, or a port out of range.
    """
    return _redirect(router, connector_name, host, port, ssl_enabled, target_node_id)


@functools.lru_cache(maxsize=_MADE_ANSWERS)
def _redirect(
    router: str, connector_name: str, host: str, port: int, ssl_enabled: bool, target_node_id: str | None
) -> bytes:
    """`encode_redirect`, made once per target and kept: every redirect to one target is the same."""
    if not host or not connector_name:
        raise ValueError(f"host and connector name must not be empty, got {host!r} and {connector_name!r}")
    if not 0 < port <= 0xFFFF:
        raise ValueError(f"port must be 1-65535, got {port!r}")
    params: list[tuple[str, bool | int | str]] = [("host", host), ("port", str(port))]
    if ssl_enabled:
        params.append(("sslEnabled", "true"))
    connector = TransportConfig(name=connector_name, params=tuple(params))
    disconnect = encode_disconnect_v3(
        reason=DisconnectReason.REDIRECT, connector=connector, target_node_id=target_node_id
    )
    message = f"AMQ229237: Connection router {router} redirected the connection to {connector.describe()}"
    return disconnect + encode_exception(ROUTING_EXCEPTION, message)


def encode_refusal(router: str, *, unavailable: bool) -> bytes:
    """The answer to a CREATESESSION the router refuses, in Artemis's words
    (`ActiveMQRoutingHandler.refuse`):

    - REFUSED_USE_ANOTHER: EXCEPTION 119 (REMOTE_DISCONNECT) "AMQ229240: Connection router R
      rejected the connection". The client's createSession throws it to the application (a
      JMSException); close the connection after it.
    - REFUSED_UNAVAILABLE: EXCEPTION 222 (ROUTING_EXCEPTION) "AMQ229238: Connection router R not
      ready". The Java client treats 222 as "try again" and re-sends CREATESESSION at once, with
      no delay and no limit (`ActiveMQClientProtocolManager.createSessionContext`: `retry = true;
      continue`), so answering it on an open connection makes the client spin as fast as the
      round trip allows, which is what Artemis itself does. We recommend that the data path
      sends this and then closes the connection (not answering after a delay): the client then
      fails over to its own reconnect policy, `retryInterval` (2 s by default, growing with
      `retryIntervalMultiplier`) when `reconnectAttempts` is not 0 and an immediate
      connection-failure exception otherwise; a delayed answer would hold a connection and a
      timer in the router per refused client and still be re-asked once per delay, forever.

    Args:
        router: the router's name, in the message.
        unavailable: True for REFUSED_UNAVAILABLE, False for REFUSED_USE_ANOTHER.

    Returns:
        The EXCEPTION packet (channel 1).
    """
    if unavailable:
        return encode_exception(ROUTING_EXCEPTION, f"AMQ229238: Connection router {router} not ready")
    return encode_exception(
        REMOTE_DISCONNECT, f"AMQ229240: Connection router {router} rejected the connection"
    )


def encode_not_authorized(remote_address: str, user_name: str | None) -> bytes:
    """Artemis's answer to a CREATESESSION with bad credentials (`SecurityStoreImpl`):
    EXCEPTION 105 (SECURITY_EXCEPTION) "AMQ229031: Unable to validate user from A. Username: U;
    SSL certificate subject DN: unavailable".

    Args:
        remote_address: the client's address as Netty prints it, e.g. "/127.0.0.1:53124".
        user_name: the user name the client sent (None prints "null", as Java does).
    """
    user = "null" if user_name is None else user_name
    message = (
        f"AMQ229031: Unable to validate user from {remote_address}. Username: {user}; "
        "SSL certificate subject DN: unavailable"
    )
    return encode_exception(SECURITY_EXCEPTION, message)
