"""The OpenWire (ActiveMQ Classic) sniffer, the router's WireFormatInfo echo, and the redirect
encoder (STYLE R1, SPEC A2/A6 and part B). Pure: no I/O, no state, no clock.

An OpenWire connection starts with both sides sending a `WireFormatInfo` (data type 1); each
side then uses the options both offered (`OpenWireFormat.renegotiateWireFormat`: the lower
version, each flag only if both set it). The Java client sends its `WireFormatInfo` and waits
for the server's before it sends anything else, so the router has to answer first, before it
knows which broker the client goes to. It answers by echoing the client's own `WireFormatInfo`
(version capped at the newest this module knows, `CacheEnabled` false): negotiating with an echo
leaves the client with exactly the options it offered, less the marshal cache, and a broker with
default settings (ActiveMQ Classic: tight encoding, cache, size prefix, version 12; Artemis: the
same without the cache) agrees to those same options when the router later replays the client's
bytes to it with `CacheEnabled` false too (`replayed_opening`), so both ends of the spliced
connection encode alike. The cache is turned off because Artemis (2.40) never negotiates it:
echoing it would leave a default client and Artemis disagreeing. The one default that differs is
SizePrefixDisabled (off on brokers): a client that turns it on cannot be proxied to such a
broker. `sniff_server_preamble` measures the broker's own `WireFormatInfo` so the router can drop
it on replay (the client already has the echo), and checks that the broker negotiates what the
echo did.

After the echo the client sends `ConnectionInfo` (data type 3), possibly after `KeepAliveInfo`
(data type 10) and, when a failover client reconnects, after the `ConnectionControl` (data type
18, faultTolerant) that `FailoverTransport.restoreTransport` sends first, in the negotiated
encoding: "tight" (a leading booleans stream holds every flag,
null marker and ASCII marker) or "loose" (each in its own byte), with or without a 4-byte size
prefix per command, and with or without the marshal cache (cached `DataStructure`s are sent with
a cache index). The field layouts follow ActiveMQ's generated marshallers
(`org.apache.activemq.openwire.v1 … v12`); the fields read here are laid out the same in all
versions.

The health probe (`probe=openwire`) is a client in loose encoding: its encoders
(`encode_wire_format_info`, `encode_connection_info`, `encode_connection_close`,
`encode_shutdown`) and the parsers of the broker's answers (`parse_probe_wire_format`,
`parse_probe_response`) are at the end.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Final

from keys.sniff import NEED_MORE, NeedMore, Reply, Sniffed, SniffError, SniffResult, WireProtocol

__all__ = [
    "PROBE_WIRE_FORMAT",
    "BrokerResponse",
    "OpenWireSniffer",
    "WireFormat",
    "encode_connection_close",
    "encode_connection_control",
    "encode_connection_info",
    "encode_shutdown",
    "encode_wire_format_info",
    "parse_probe_response",
    "parse_probe_wire_format",
    "replayed_opening",
    "sniff_server_preamble",
    "sniff_wire_format",
]

_NAME: Final = WireProtocol.OPENWIRE.value
"""The sniffer's name, in `Sniffed.protocol` and in every `SniffError`."""

MAGIC: Final = b"ActiveMQ"
"""`WireFormatInfo.MAGIC`: the 8 bytes after the data type of every `WireFormatInfo`."""

MAX_VERSION: Final = 12
"""`CommandTypes.PROTOCOL_VERSION` of ActiveMQ 5.17 (still 12 in 5.18 and 6.x): the newest
marshaller set (`openwire/v12`) this module knows, so the highest version the echo offers."""

_MIN_REDIRECT_VERSION: Final = 6
"""`ConnectionControl` gained `connectedBrokers`, `reconnectTo` and `rebalanceConnection` in
`openwire/v6`; earlier clients cannot be redirected."""

_TOKEN_VERSION: Final = 8
"""`ConnectionControl.token` (a byte array) is marshalled from `openwire/v8` on."""

MAX_COMMAND_BYTES: Final = 64 * 1024
"""Largest size prefix accepted for a handshake command. The Java client's `WireFormatInfo` is
about 360 bytes and its `ConnectionInfo` about 50 plus the credentials; anything near this cap
is garbage. (The router's own sniff cap, 16 KiB, is lower still.)"""

_MAX_PROPERTY_NESTING: Final = 8
"""Depth limit of maps and lists inside `WireFormatInfo` properties; real ones are flat, and the
limit keeps a hostile nesting from exhausting the Python stack."""

_MAX_UTF_BYTES: Final = 32766
"""Longest string the encoder writes: `BaseDataStreamMarshaller.tightMarshalString1` refuses an
encoded length of `Short.MAX_VALUE` (32767) or more."""

_QUOTE_BYTES: Final = 32
"""At most this many bytes of client data are quoted in an error message (STYLE R7)."""

# Data types (`org.apache.activemq.command.CommandTypes`).
_WIREFORMAT_INFO: Final = 1
_CONNECTION_INFO: Final = 3
_KEEP_ALIVE_INFO: Final = 10
_CONNECTION_CONTROL: Final = 18
_CONNECTION_ID: Final = 120

_DATA_TYPE_NAMES: Final = {
    0: "null",
    1: "WireFormatInfo",
    2: "BrokerInfo",
    3: "ConnectionInfo",
    4: "SessionInfo",
    5: "ConsumerInfo",
    6: "ProducerInfo",
    7: "TransactionInfo",
    8: "DestinationInfo",
    9: "RemoveSubscriptionInfo",
    10: "KeepAliveInfo",
    11: "ShutdownInfo",
    12: "RemoveInfo",
    14: "ControlCommand",
    15: "FlushCommand",
    16: "ConnectionError",
    17: "ConsumerControl",
    18: "ConnectionControl",
    19: "ProducerAck",
    20: "MessagePull",
    21: "MessageDispatch",
    22: "MessageAck",
    23: "ActiveMQMessage",
    24: "ActiveMQBytesMessage",
    25: "ActiveMQMapMessage",
    26: "ActiveMQObjectMessage",
    27: "ActiveMQStreamMessage",
    28: "ActiveMQTextMessage",
    29: "ActiveMQBlobMessage",
    30: "Response",
    31: "ExceptionResponse",
    32: "DataResponse",
    33: "DataArrayResponse",
    34: "IntegerResponse",
    40: "DiscoveryEvent",
    50: "JournalTopicAck",
    52: "JournalQueueAck",
    53: "JournalTrace",
    54: "JournalTransaction",
    55: "SubscriptionInfo",
    60: "PartialCommand",
    61: "LastPartialCommand",
    65: "ReplayCommand",
    90: "MessageDispatchNotification",
    91: "NetworkBridgeFilter",
    92: "BrokerSubscriptionInfo",
    100: "ActiveMQQueue",
    101: "ActiveMQTopic",
    102: "ActiveMQTempQueue",
    103: "ActiveMQTempTopic",
    110: "MessageId",
    111: "LocalTransactionId",
    112: "XATransactionId",
    120: "ConnectionId",
    121: "SessionId",
    122: "ConsumerId",
    123: "ProducerId",
    124: "BrokerId",
}
"""Names of the data types in `CommandTypes`, for error messages."""

_WFI_MIN_SIZE: Final = 1 + len(MAGIC) + 4 + 1
"""Smallest `WireFormatInfo` frame body: data type, magic, version, properties-present flag."""

_WFI_VERSION_AT: Final = 4 + 1 + len(MAGIC)
"""Offset of the version field in a `WireFormatInfo` frame: after size prefix, data type, magic."""


def _type_name(data_type: int) -> str:
    """The name of a data type for messages, e.g. `ProducerInfo (data type 6)` or `data type 200`."""
    name = _DATA_TYPE_NAMES.get(data_type)
    return f"data type {data_type}" if name is None else f"{name} (data type {data_type})"


@dataclass(frozen=True, slots=True, kw_only=True)
class WireFormat:
    """The options of one `WireFormatInfo`, or those in effect after negotiation.

    Property names are `WireFormatInfo`'s: a flag counts only if the property is the boolean
    true (`Boolean.TRUE == getProperty(...)`), a missing number is 0.
    """

    version: int
    """The OpenWire version: which marshaller set (`openwire/vN`) encodes commands."""
    offered_version: int | None = None
    """For the client's options after the router's echo: the version the client offered (higher
    than `version` only if it offered more than `MAX_VERSION`); None otherwise."""
    tight_encoding: bool = False
    """`TightEncodingEnabled`: flags packed in a leading booleans stream."""
    size_prefix_disabled: bool = False
    """`SizePrefixDisabled`: commands are not preceded by their 4-byte size."""
    cache_enabled: bool = False
    """`CacheEnabled`: marshalled `DataStructure`s such as `ConnectionId` carry cache indexes."""
    cache_size: int = 0
    """`CacheSize`: entries of the marshal cache (0 means `OpenWireFormat`'s 16383)."""
    max_inactivity_duration_ms: int = 0
    """`MaxInactivityDuration`: the inactivity monitor's read timeout (0 = off)."""
    max_frame_size: int = 0
    """`MaxFrameSize`: the largest command a side accepts (0 if not sent)."""

    def negotiate(self, other: WireFormat) -> WireFormat:
        """The options in effect between two sides that sent `self` and `other`.

        Mirrors `OpenWireFormat.renegotiateWireFormat` (the lower version and frame size, each
        flag only if both set it, the smaller cache) and `AbstractInactivityMonitor` (the
        shorter inactivity duration).

        Args:
            other: what the other side sent.

        Returns:
            The negotiated options; `offered_version` is None.
        """
        cache = self.cache_enabled and other.cache_enabled
        return WireFormat(
            version=min(self.version, other.version),
            tight_encoding=self.tight_encoding and other.tight_encoding,
            size_prefix_disabled=self.size_prefix_disabled and other.size_prefix_disabled,
            cache_enabled=cache,
            cache_size=min(self.cache_size, other.cache_size) if cache else 0,
            max_inactivity_duration_ms=min(self.max_inactivity_duration_ms, other.max_inactivity_duration_ms),
            max_frame_size=min(self.max_frame_size, other.max_frame_size),
        )


class _Short(Exception):
    """Internal: a read ran past the bytes available."""


class _Reader:
    """Big-endian `DataInput` over `data[pos:end]`; raises `_Short` past `end`."""

    __slots__ = ("_data", "_end", "pos")

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self._data = data
        self.pos = pos
        self._end = end

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self._end:
            raise _Short
        chunk = self._data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def boolean(self) -> bool:
        """`DataInput.readBoolean`: any non-zero byte is true."""
        return self.u8() != 0

    def i16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def u16(self) -> int:
        value: int = struct.unpack(">H", self.take(2))[0]
        return value

    def i32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def i64(self) -> int:
        value: int = struct.unpack(">q", self.take(8))[0]
        return value


class _Bits:
    """A `BooleanStream` being read: flags are taken from the least significant bit up."""

    __slots__ = ("_data", "_i", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._i = 0
        self._what = what

    def read(self) -> bool:
        if self._i >= 8 * len(self._data):
            raise SniffError(
                _NAME, f"truncated booleans stream in {self._what}: it holds only {8 * len(self._data)} flags"
            )
        byte = self._data[self._i >> 3]
        bit = (byte >> (self._i & 7)) & 1
        self._i += 1
        return bit == 1


def _read_bits(r: _Reader, what: str) -> _Bits:
    """`BooleanStream.unmarshal`: a length byte (0xC0 then a byte, 0x80 then a short, else the
    length itself), then that many bytes of flags."""
    size = r.u8()
    if size == 0xC0:
        size = r.u8()
    elif size == 0x80:
        size = r.i16()
        if size < 0:
            raise SniffError(_NAME, f"negative length {size!r} of the booleans stream in {what}")
    return _Bits(r.take(size), what)


def _decode_modified_utf8(raw: bytes, field: str) -> str:
    """Decode Java's modified UTF-8 (`DataInput.readUTF`): 1 to 3 bytes per UTF-16 code unit,
    NUL as C0 80, and characters outside the BMP as two encoded surrogates."""
    if raw.isascii():
        return raw.decode("ascii")
    units: list[int] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c < 0x80:
            units.append(c)
            i += 1
        elif c >> 5 == 0b110 and i + 1 < n and raw[i + 1] >> 6 == 0b10:
            units.append(((c & 0x1F) << 6) | (raw[i + 1] & 0x3F))
            i += 2
        elif c >> 4 == 0b1110 and i + 2 < n and raw[i + 1] >> 6 == 0b10 and raw[i + 2] >> 6 == 0b10:
            units.append(((c & 0x0F) << 12) | ((raw[i + 1] & 0x3F) << 6) | (raw[i + 2] & 0x3F))
            i += 3
        else:
            raise SniffError(_NAME, f"bad modified UTF-8 at byte {i} of {field}: {raw[:_QUOTE_BYTES]!r}")
    try:
        return struct.pack(f">{len(units)}H", *units).decode("utf-16-be")
    except UnicodeDecodeError as exc:
        # Java strings may hold a lone surrogate; a Python key must be text, so refuse it.
        raise SniffError(_NAME, f"lone surrogate in {field}: {raw[:_QUOTE_BYTES]!r}") from exc


def _encode_modified_utf8(value: str) -> bytes:
    """Java's `DataOutput.writeUTF` body (without its length)."""
    out = bytearray()
    for (unit,) in struct.iter_unpack(">H", value.encode("utf-16-be", "surrogatepass")):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | (unit >> 6), 0x80 | (unit & 0x3F)))
        else:
            out += bytes((0xE0 | (unit >> 12), 0x80 | ((unit >> 6) & 0x3F), 0x80 | (unit & 0x3F)))
    return bytes(out)


def _read_utf(r: _Reader, field: str) -> str:
    """`DataInput.readUTF`: an unsigned 2-byte length, then modified UTF-8."""
    return _decode_modified_utf8(r.take(r.u16()), field)


def _tight_string(r: _Reader, bits: _Bits, field: str) -> str | None:
    """`BaseDataStreamMarshaller.tightUnmarshalString`: flags "present" and "ASCII only"; ASCII
    strings are a signed short length and bytes read as ISO-8859-1 (`new String(bytes, 0)`),
    others `readUTF`."""
    if not bits.read():
        return None
    if bits.read():
        size = r.i16()
        if size < 0:
            raise SniffError(_NAME, f"negative length {size!r} of {field}")
        return r.take(size).decode("latin-1")
    return _read_utf(r, field)


def _loose_string(r: _Reader, field: str) -> str | None:
    """`BaseDataStreamMarshaller.looseUnmarshalString`: a present byte, then `readUTF`."""
    return _read_utf(r, field) if r.boolean() else None


# WireFormatInfo properties: `MarshallingSupport.marshalPrimitiveMap` (an int count, then per
# entry a `writeUTF` name and a type-tagged value).


def _read_primitive(r: _Reader, depth: int) -> object:
    """`MarshallingSupport.unmarshalPrimitive`: a type byte, then the value."""
    tag = r.u8()
    match tag:
        case 0:  # NULL
            return None
        case 1:  # BOOLEAN_TYPE
            return r.boolean()
        case 2:  # BYTE_TYPE
            return _signed8(r.u8())
        case 3:  # CHAR_TYPE
            return r.u16()
        case 4:  # SHORT_TYPE
            return r.i16()
        case 5:  # INTEGER_TYPE
            return r.i32()
        case 6:  # LONG_TYPE
            return r.i64()
        case 7:  # DOUBLE_TYPE
            value: float = struct.unpack(">d", r.take(8))[0]
            return value
        case 8:  # FLOAT_TYPE
            fvalue: float = struct.unpack(">f", r.take(4))[0]
            return fvalue
        case 9:  # STRING_TYPE: readUTF
            return _read_utf(r, "WireFormatInfo property")
        case 10:  # BYTE_ARRAY_TYPE: int length, bytes
            return r.take(_non_negative(r.i32(), "WireFormatInfo byte array"))
        case 11:  # MAP_TYPE
            return _read_map(r, depth + 1)
        case 12:  # LIST_TYPE: int count, values
            _check_depth(depth + 1)
            count = _non_negative(r.i32(), "WireFormatInfo list")
            return [_read_primitive(r, depth + 1) for _ in range(count)]
        case 13:  # BIG_STRING_TYPE: int length, modified UTF-8
            raw = r.take(_non_negative(r.i32(), "WireFormatInfo string"))
            return _decode_modified_utf8(raw, "WireFormatInfo property")
        case _:
            raise SniffError(_NAME, f"unknown WireFormatInfo property type {tag!r}")


def _signed8(value: int) -> int:
    return value - 256 if value >= 128 else value


def _non_negative(value: int, what: str) -> int:
    if value < 0:
        raise SniffError(_NAME, f"negative length {value!r} of {what}")
    return value


def _check_depth(depth: int) -> None:
    if depth > _MAX_PROPERTY_NESTING:
        raise SniffError(_NAME, f"properties of WireFormatInfo nested deeper than {_MAX_PROPERTY_NESTING}")


def _read_map(r: _Reader, depth: int, flags: dict[str, int] | None = None) -> dict[str, object]:
    """`MarshallingSupport.unmarshalPrimitiveMap`; a negative count is a null map. `flags`, if
    given, gets the offset of each boolean value read (for `_without_cache`)."""
    _check_depth(depth)
    count = r.i32()
    result: dict[str, object] = {}
    for _ in range(max(count, 0)):
        name = _read_utf(r, "WireFormatInfo property name")
        at = r.pos + 1
        result[name] = value = _read_primitive(r, depth)
        if flags is not None and value is True:
            flags[name] = at
    return result


def _flag(props: dict[str, object], name: str) -> bool:
    return props.get(name) is True


def _number(props: dict[str, object], name: str) -> int:
    value = props.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class _Opening:
    """A parsed `WireFormatInfo` frame at the start of a stream."""

    offer: WireFormat
    """The options as sent."""
    end: int
    """Offset just past the frame."""
    cache_flag_at: int | None = None
    """Offset of the byte that says `CacheEnabled` true (the boolean's value); None if the
    frame does not turn the cache on."""


def _check_wfi_prefix(data: bytes, who: str) -> None:
    """Reject a stream that cannot start with a `WireFormatInfo` frame, from as few bytes as
    are there: a size prefix in range, data type 1, the magic."""
    if len(data) >= 4:
        size = int.from_bytes(data[:4], "big")
        if size > MAX_COMMAND_BYTES:
            raise SniffError(_NAME, f"{who} WireFormatInfo size {size!r} exceeds {MAX_COMMAND_BYTES}")
        if size < _WFI_MIN_SIZE:
            raise SniffError(_NAME, f"{who} WireFormatInfo size {size!r} is below {_WFI_MIN_SIZE}")
    elif data[:1] not in (b"", b"\x00"):
        raise SniffError(
            _NAME, f"{who} WireFormatInfo size starts with {data[:4]!r}, above {MAX_COMMAND_BYTES}"
        )
    if len(data) >= 5 and data[4] != _WIREFORMAT_INFO:
        raise SniffError(
            _NAME, f"{who} sent {_type_name(data[4])} first, expected WireFormatInfo (data type 1)"
        )
    magic = data[5 : 5 + len(MAGIC)]
    if not MAGIC.startswith(magic):
        raise SniffError(_NAME, f"bad {who} WireFormatInfo magic {magic!r}, expected {MAGIC!r}")


def _parse_wfi(data: bytes, who: str) -> _Opening | NeedMore:
    """Parse the size-prefixed, loose `WireFormatInfo` at the start of `data`.

    Every side sends it before negotiation, with `OpenWireFormat`'s initial settings (loose, size
    prefix on). `WireFormatInfoMarshaller.looseUnmarshal`: magic (8 bytes, no present flag),
    version (int), marshalledProperties (present byte, int length, bytes).
    """
    _check_wfi_prefix(data, who)
    if len(data) < 4:
        return NEED_MORE
    end = 4 + int.from_bytes(data[:4], "big")
    if len(data) < end:
        return NEED_MORE
    r = _Reader(data, _WFI_VERSION_AT, end)
    try:
        version = r.i32()
        props: dict[str, object] = {}
        flags: dict[str, int] = {}
        if r.boolean():
            length = _non_negative(r.i32(), f"{who} WireFormatInfo properties")
            r.take(length)
            props = _read_map(_Reader(data, r.pos - length, r.pos), 0, flags)
    except _Short:
        raise SniffError(_NAME, f"{who} WireFormatInfo is shorter than its fields") from None
    if version < 1:
        raise SniffError(_NAME, f"{who} WireFormatInfo has unsupported version {version!r}")
    offer = WireFormat(
        version=version,
        tight_encoding=_flag(props, "TightEncodingEnabled"),
        size_prefix_disabled=_flag(props, "SizePrefixDisabled"),
        cache_enabled=_flag(props, "CacheEnabled"),
        cache_size=_number(props, "CacheSize"),
        max_inactivity_duration_ms=_number(props, "MaxInactivityDuration"),
        max_frame_size=_number(props, "MaxFrameSize"),
    )
    cache_flag_at = flags.get("CacheEnabled") if offer.cache_enabled else None
    return _Opening(offer=offer, end=end, cache_flag_at=cache_flag_at)


def _echo_offer(offer: WireFormat) -> WireFormat:
    """The options of the echo frame."""
    return dataclasses.replace(
        offer, version=min(offer.version, MAX_VERSION), cache_enabled=False, cache_size=0
    )


def _without_cache(frame: bytes, opening: _Opening) -> bytes:
    """`frame` (starting with the `WireFormatInfo` of `opening`) with its `CacheEnabled` true
    turned false in place: same length, so the size prefix still holds."""
    at = opening.cache_flag_at
    if at is None:
        return frame
    return frame[:at] + b"\x00" + frame[at + 1 :]


def _echo_frame(data: bytes, opening: _Opening) -> bytes:
    """The client's own `WireFormatInfo` frame with the version field (after size, data type and
    magic) replaced by min(client version, `MAX_VERSION`) and `CacheEnabled` false.

    Echoing the client's bytes, rather than offering options of our own, is what makes the
    options the client negotiates with the router equal those it would negotiate with a broker
    that accepts its offer (see the module docstring); the cap keeps the client on a marshaller
    version this module can encode `ConnectionControl` for; the cache is off because not every
    broker turns it on (see `replayed_opening`).
    """
    version = min(opening.offer.version, MAX_VERSION)
    frame = data[:_WFI_VERSION_AT] + struct.pack(">i", version) + data[_WFI_VERSION_AT + 4 : opening.end]
    return _without_cache(frame, opening)


def replayed_opening(data: bytes) -> bytes:
    """What the router replays to the broker of a proxied client: the client's bytes, with its
    `WireFormatInfo` saying `CacheEnabled` false.

    The client negotiated the cache off with the router's echo, so the broker must negotiate it
    off too (a broker that turns the cache on would read the client's commands as cached). Off is
    the one choice every broker agrees to: Artemis never turns it on, ActiveMQ Classic turns it on
    only if both sides offer it.

    Args:
        data: the bytes the client sent, from the start of the connection (its whole
            `WireFormatInfo` among them).

    Raises:
        SniffError: the bytes do not start with a complete, valid `WireFormatInfo`.
    """
    opening = _parse_wfi(data, "client")
    if opening is NEED_MORE:
        raise SniffError(_NAME, "the client's WireFormatInfo is incomplete")
    return _without_cache(data, opening)


def _negotiated_with_echo(offer: WireFormat) -> WireFormat:
    """What the client uses after negotiating with the echo (`offered_version` kept)."""
    return dataclasses.replace(offer.negotiate(_echo_offer(offer)), offered_version=offer.version)


def sniff_wire_format(data: bytes) -> WireFormat | NeedMore:
    """The options in effect between a client and the router once the client has the echo.

    Args:
        data: the bytes the client sent, from the start of the connection.

    Returns:
        NEED_MORE until the client's `WireFormatInfo` is complete; then its options with the
        version capped at `MAX_VERSION` (`offered_version` keeps what the client sent). Pass
        this to `encode_connection_control` and to `sniff_server_preamble`.

    Raises:
        SniffError: the bytes do not start with a valid `WireFormatInfo`.
    """
    opening = _parse_wfi(data, "client")
    if opening is NEED_MORE:
        return NEED_MORE
    return _negotiated_with_echo(opening.offer)


def _read_flag(r: _Reader, bits: _Bits | None) -> bool:
    """A boolean field: the next flag of the booleans stream (tight), else its own byte (loose)."""
    return bits.read() if bits is not None else r.boolean()


def _read_string(r: _Reader, bits: _Bits | None, field: str) -> str | None:
    """A string field in tight (`bits` given) or loose encoding."""
    return _tight_string(r, bits, field) if bits is not None else _loose_string(r, field)


def _read_base_command(r: _Reader, fmt: WireFormat, what: str) -> _Bits | None:
    """A command's start after its data type: the booleans stream (tight encoding only), then the
    `BaseCommand` fields commandId (int) and responseRequired, skipped.

    Returns:
        The booleans stream in tight encoding, for the command's own fields; None in loose.
    """
    bits = _read_bits(r, what) if fmt.tight_encoding else None
    r.i32()
    _read_flag(r, bits)
    return bits


def _read_cached_connection_id(r: _Reader, bits: _Bits | None, fmt: WireFormat) -> None:
    """Skip `ConnectionInfo.connectionId`, a cached object (`tightUnmarsalCachedObject`,
    `looseUnmarsalCachedObject`): with the cache on, a "new" flag and a short index precede the
    object, and a known object is sent as the index alone; then a nested object (present flag,
    data type, `ConnectionIdMarshaller`'s one string `value`)."""
    if fmt.cache_enabled:
        is_new = _read_flag(r, bits)
        r.i16()
        if not is_new:
            return
    if not _read_flag(r, bits):
        return
    data_type = r.u8()
    if data_type != _CONNECTION_ID:
        raise SniffError(
            _NAME, f"connectionId of ConnectionInfo is {_type_name(data_type)}, expected ConnectionId"
        )
    _read_string(r, bits, "ConnectionId.value")


def _read_connection_info(r: _Reader, fmt: WireFormat) -> tuple[str | None, str | None, str | None]:
    """`ConnectionInfoMarshaller` (the same leading fields in v1 … v12), after the data type:
    [booleans stream,] `BaseCommand` commandId (int) and responseRequired, then connectionId,
    clientId, password, userName; the fields after those are not needed.

    Returns:
        (clientId, userName, password).
    """
    bits = _read_base_command(r, fmt, "ConnectionInfo")
    _read_cached_connection_id(r, bits, fmt)
    client_id = _read_string(r, bits, "ConnectionInfo.clientId")
    password = _read_string(r, bits, "ConnectionInfo.password")
    user_name = _read_string(r, bits, "ConnectionInfo.userName")
    return client_id, user_name, password


_Credentials = tuple[str | None, str | None, str | None]


def _find_connection_info(data: bytes, pos: int, fmt: WireFormat) -> _Credentials | None:
    """Walk the commands after the `WireFormatInfo` up to `ConnectionInfo`.

    Returns:
        (clientId, userName, password), or None while `ConnectionInfo` is incomplete.
    """
    while True:
        if fmt.size_prefix_disabled:
            # Without size prefixes the only way past a command is to parse it.
            r = _Reader(data, pos, len(data))
            try:
                data_type = r.u8()
                _check_pre_connection_type(data_type)
                if data_type == _CONNECTION_INFO:
                    return _read_connection_info(r, fmt)
                if data_type == _CONNECTION_CONTROL:
                    _skip_connection_control(r, fmt)
                else:
                    _read_base_command(r, fmt, "KeepAliveInfo")  # `KeepAliveInfoMarshaller`: nothing more
            except _Short:
                return None
            pos = r.pos
            continue
        size = _command_size(data, pos, "")
        if size is None or len(data) < pos + 5:
            return None
        data_type = data[pos + 4]
        _check_pre_connection_type(data_type)
        end = pos + 4 + size
        if len(data) < end:
            return None
        if data_type == _CONNECTION_INFO:
            try:
                return _read_connection_info(_Reader(data, pos + 5, end), fmt)
            except _Short:
                raise SniffError(
                    _NAME, f"truncated ConnectionInfo: its fields run past its size {size!r}"
                ) from None
        pos = end


def _command_size(data: bytes, pos: int, who: str) -> int | None:
    """The size prefix of the command at `pos` (after the `WireFormatInfo`), None while it is
    incomplete; `who` ("", "broker ") starts the errors."""
    if len(data) < pos + 4:
        return None
    size = int.from_bytes(data[pos : pos + 4], "big")
    if size > MAX_COMMAND_BYTES:
        raise SniffError(_NAME, f"{who}command size {size!r} exceeds {MAX_COMMAND_BYTES}")
    if size == 0:
        raise SniffError(_NAME, f"{who}command size 0 leaves no room for its data type")
    return size


def _skip_connection_control(r: _Reader, fmt: WireFormat) -> None:
    """Read past a `ConnectionControl` (`ConnectionControlMarshaller` v1 … v12), as a failover
    client sends before `ConnectionInfo` when it reconnects: after the `BaseCommand` fields the
    flags close, exit, faultTolerant, resume and suspend; from v6 connectedBrokers and reconnectTo
    (strings, empty rather than null by default) and rebalanceConnection; from v8 token (a byte
    array: a present flag, an int length, the bytes)."""
    bits = _read_base_command(r, fmt, "ConnectionControl")
    for _ in range(5):
        _read_flag(r, bits)
    if fmt.version >= _MIN_REDIRECT_VERSION:
        _read_string(r, bits, "ConnectionControl.connectedBrokers")
        _read_string(r, bits, "ConnectionControl.reconnectTo")
        _read_flag(r, bits)
    if fmt.version >= _TOKEN_VERSION and _read_flag(r, bits):
        r.take(_non_negative(r.i32(), "ConnectionControl.token"))


_PRE_CONNECTION_TYPES: Final = frozenset({_CONNECTION_INFO, _KEEP_ALIVE_INFO, _CONNECTION_CONTROL})
"""What a client may send between its `WireFormatInfo` and its `ConnectionInfo` (included)."""


def _check_pre_connection_type(data_type: int) -> None:
    if data_type not in _PRE_CONNECTION_TYPES:
        raise SniffError(_NAME, f"unexpected {_type_name(data_type)} before ConnectionInfo")


class OpenWireSniffer:
    """Sniffs an OpenWire opening: answers the client's `WireFormatInfo` with its echo, then
    reads clientId, userName and password from `ConnectionInfo`."""

    name = _NAME

    def looks_like(self, prefix: bytes) -> bool:
        """Whether the bytes present fit a `WireFormatInfo` frame header: a size below
        `MAX_COMMAND_BYTES`, data type 1, the magic `ActiveMQ`.

        Args:
            prefix: the first bytes of the connection, possibly only one.

        Returns:
            True if they may start an OpenWire connection; never raises.
        """
        try:
            _check_wfi_prefix(prefix[:_WFI_VERSION_AT], "client")
        except SniffError:
            return False
        return True

    def announced_size(self, data: bytes) -> int | None:
        """None: the sniffer rejects frames over `MAX_COMMAND_BYTES` itself (keys.sniff.Sniffer)."""
        return None

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the client's `WireFormatInfo` and then its `ConnectionInfo`.

        Args:
            data: every byte the client has sent so far.

        Returns:
            NEED_MORE until the `WireFormatInfo` is complete; then `Reply` with the echo frame
            until `ConnectionInfo` is complete; then `Sniffed` with client_id, user_name,
            password and protocol_version (the negotiated version as a string).

        Raises:
            SniffError: bad magic or size, a version below 1, an unexpected data type before
                `ConnectionInfo`, a truncated booleans stream or field, bad modified UTF-8.
        """
        opening = _parse_wfi(data, "client")
        if opening is NEED_MORE:
            return NEED_MORE
        fmt = _negotiated_with_echo(opening.offer)
        found = _find_connection_info(data, opening.end, fmt)
        if found is None:
            return Reply(to_client=_echo_frame(data, opening))
        client_id, user_name, password = found
        return Sniffed(
            protocol=WireProtocol.OPENWIRE,
            client_id=client_id,
            user_name=user_name,
            password=password,
            protocol_version=str(fmt.version),
        )


def sniff_server_preamble(data: bytes, *, client: WireFormat | None = None) -> int | NeedMore:
    """Measure the broker's `WireFormatInfo` at the start of what a real broker sends.

    In proxy mode the router replays the client's bytes to the broker; the broker answers with
    its own `WireFormatInfo` (then `BrokerInfo`, a `Response` and more). The client already has
    the router's echo, so the router drops this many bytes and relays the rest.

    Args:
        data: the bytes received from the broker so far.
        client: the client's options from `sniff_wire_format`; if given, the broker's offer must
            lead to the same version, encoding, size prefix and cache as the echo did, because
            from here on both ends speak directly.

    Returns:
        The length of the broker's `WireFormatInfo` frame, or NEED_MORE.

    Raises:
        SniffError: the broker did not start with a valid `WireFormatInfo`, or it negotiates
            other options than the client was told.
    """
    opening = _parse_wfi(data, "broker")
    if opening is NEED_MORE:
        return NEED_MORE
    if client is not None:
        _check_same_negotiation(client, opening.offer)
    return opening.end


def _check_same_negotiation(client: WireFormat, broker: WireFormat) -> None:
    offered = WireFormat(
        version=client.offered_version if client.offered_version is not None else client.version,
        tight_encoding=client.tight_encoding,
        size_prefix_disabled=client.size_prefix_disabled,
        cache_enabled=client.cache_enabled,
        cache_size=client.cache_size,
    )
    real = offered.negotiate(broker)
    for field, told, got in (
        ("version", client.version, real.version),
        ("TightEncodingEnabled", client.tight_encoding, real.tight_encoding),
        ("SizePrefixDisabled", client.size_prefix_disabled, real.size_prefix_disabled),
        ("CacheEnabled", client.cache_enabled, real.cache_enabled),
        ("CacheSize", client.cache_size if client.cache_enabled else 0, real.cache_size),
    ):
        if told != got:
            raise SniffError(_NAME, f"broker negotiates {field} {got!r} but the client was told {told!r}")


class _BitWriter:
    """A `BooleanStream` being written (`BooleanStream.writeBoolean` / `marshal`)."""

    __slots__ = ("_bits",)

    def __init__(self) -> None:
        self._bits: list[bool] = []

    def write(self, value: bool) -> None:
        self._bits.append(value)

    def marshal(self) -> bytes:
        data = bytearray((len(self._bits) + 7) // 8)
        for i, bit in enumerate(self._bits):
            if bit:
                data[i >> 3] |= 1 << (i & 7)
        n = len(data)
        if n < 64:
            head = bytes((n,))
        elif n < 256:
            head = bytes((0xC0, n))
        else:
            head = b"\x80" + struct.pack(">h", n)
        return head + bytes(data)


def _utf(value: str, field: str) -> bytes:
    raw = _encode_modified_utf8(value)
    if len(raw) > _MAX_UTF_BYTES:
        raise ValueError(f"{field} encodes to {len(raw)} bytes, above {_MAX_UTF_BYTES}")
    return struct.pack(">H", len(raw)) + raw


def _tight_put_string(bits: _BitWriter, out: bytearray, value: str | None, field: str) -> None:
    """`tightMarshalString1/2`: present flag, ASCII flag (every code unit 1..127), then the
    length and bytes (the same bytes `writeUTF` gives for ASCII)."""
    bits.write(value is not None)
    if value is None:
        return
    bits.write(all(0 < ord(c) < 0x80 for c in value))
    out += _utf(value, field)


def _loose_put_string(out: bytearray, value: str | None, field: str) -> None:
    """`looseMarshalString`: present byte, then `writeUTF`."""
    out.append(value is not None)
    if value is not None:
        out += _utf(value, field)


def encode_connection_control(
    *,
    reconnect_to: str | None,
    connected_brokers: str,
    rebalance: bool,
    encoding: WireFormat,
) -> bytes:
    """Encode a `ConnectionControl` command that redirects a failover client (SPEC A6).

    The Java `FailoverTransport.handleConnectionControl` reconnects to `reconnectTo` (if the URI
    has `reconnectSupported=true`, the default) and, with `updateURIsSupported=true`, replaces
    its broker list with `connectedBrokers`, reconnecting if `rebalanceConnection` is set. The
    `close`, `exit`, `faultTolerant`, `resume` and `suspend` flags stay false (`close` would make
    `ActiveMQConnection` close itself instead of failing over); the router closes the socket.

    `ConnectionControlMarshaller` (v6 … v12) field order, after `BaseCommand` commandId (0) and
    responseRequired (false): close, exit, faultTolerant, resume, suspend, connectedBrokers,
    reconnectTo, rebalanceConnection, and from v8 token (null).

    Args:
        reconnect_to: the broker URI to reconnect to now, e.g. "tcp://10.0.0.5:61616", or None.
        connected_brokers: comma-separated broker URIs, e.g. "tcp://10.0.0.5:61616".
        rebalance: `rebalanceConnection`: reconnect so that the new list takes effect.
        encoding: the options in effect on the client connection (`sniff_wire_format`).

    Returns:
        The command as it goes on the wire, with its size prefix unless it is disabled.

    Raises:
        ValueError: the version is below 6 (no redirect fields), or a URI is too long.
    """
    if not _MIN_REDIRECT_VERSION <= encoding.version <= MAX_VERSION:
        raise ValueError(
            f"ConnectionControl redirect needs OpenWire version {_MIN_REDIRECT_VERSION} to "
            f"{MAX_VERSION}, got {encoding.version!r}"
        )
    has_token = encoding.version >= _TOKEN_VERSION
    body = bytearray()
    flags = (False, False, False, False, False)  # close, exit, faultTolerant, resume, suspend
    if encoding.tight_encoding:
        bits = _BitWriter()
        bits.write(False)  # responseRequired
        for flag in flags:
            bits.write(flag)
        body += struct.pack(">i", 0)  # commandId
        _tight_put_string(bits, body, connected_brokers, "connectedBrokers")
        _tight_put_string(bits, body, reconnect_to, "reconnectTo")
        bits.write(rebalance)
        if has_token:
            bits.write(False)  # token: null
        command = bytes((_CONNECTION_CONTROL,)) + bits.marshal() + bytes(body)
    else:
        body += struct.pack(">i?", 0, False)  # commandId, responseRequired
        body += bytes(flags)
        _loose_put_string(body, connected_brokers, "connectedBrokers")
        _loose_put_string(body, reconnect_to, "reconnectTo")
        body.append(rebalance)
        if has_token:
            body.append(False)  # token: null
        command = bytes((_CONNECTION_CONTROL,)) + bytes(body)
    if encoding.size_prefix_disabled:
        return command
    return struct.pack(">i", len(command)) + command


# --- The health probe (`probe=openwire`): a client in loose encoding ---------------------------
#
# The probe sends its `WireFormatInfo` (loose encoding, size prefix, no cache, no stack traces),
# reads the broker's, and sends a `ConnectionInfo` with responseRequired in the negotiated
# version: every flag the probe leaves off is off for both sides (`renegotiateWireFormat`), so
# from then on both speak loose, size-prefixed, uncached commands. The broker answers with a
# `Response` (connection accepted) or an `ExceptionResponse` (e.g. a `SecurityException` for bad
# credentials), both carrying the probe's commandId as correlationId; it may send `BrokerInfo`
# and other commands first, which are skipped by their size. Then the probe sends `RemoveInfo`
# for its connection and `ShutdownInfo`, as `ActiveMQConnection.close` does.

_SHUTDOWN_INFO: Final = 11
_REMOVE_INFO: Final = 12
_CONNECTION_ERROR: Final = 16
_RESPONSE: Final = 30
_EXCEPTION_RESPONSE: Final = 31

_CLIENT_MASTER_VERSION: Final = 2
"""`ConnectionInfo.clientMaster` is marshalled from `openwire/v2` on."""
_FAULT_TOLERANT_VERSION: Final = 6
"""`ConnectionInfo.faultTolerant` and `failoverReconnect` are marshalled from `openwire/v6` on."""
_CLIENT_IP_VERSION: Final = 8
"""`ConnectionInfo.clientIp` is marshalled from `openwire/v8` on."""
_LAST_DELIVERED_VERSION: Final = 5
"""`RemoveInfo.lastDeliveredSequenceId` is marshalled from `openwire/v5` on."""
_LAST_DELIVERED_UNKNOWN: Final = -2
"""`RemoveInfo.LAST_DELIVERED_UNKNOWN`, the default the Java client leaves on a connection."""
_JAVA_LONG_MAX: Final = 2**63 - 1

PROBE_WIRE_FORMAT: Final = WireFormat(version=MAX_VERSION, max_frame_size=_JAVA_LONG_MAX)
"""What the probe offers: the newest version this module knows, every option off, no frame limit."""


def _put_property(out: bytearray, name: str, tag: int, value: bytes) -> None:
    """One entry of a `MarshallingSupport` primitive map: `writeUTF` name, type byte, value."""
    out += _utf(name, "WireFormatInfo property name")
    out.append(tag)
    out += value


def encode_wire_format_info() -> bytes:
    """The probe's `WireFormatInfo` (`WireFormatInfoMarshaller.looseMarshal` behind a size prefix).

    Its flags are the booleans `OpenWireFormat` negotiates, all false but TcpNoDelayEnabled;
    MaxFrameSize and MaxInactivityDuration are Java `long`s (the broker casts them to `Long`):
    no frame limit of our own (the Java client's default, 2^63-1) and 0, which turns the
    inactivity monitor off for this short connection.

    Returns:
        The command as it goes on the wire.
    """
    props = bytearray(struct.pack(">i", 7))
    for name in ("TightEncodingEnabled", "CacheEnabled", "SizePrefixDisabled", "StackTraceEnabled"):
        _put_property(props, name, 1, b"\x00")  # BOOLEAN_TYPE false
    _put_property(props, "TcpNoDelayEnabled", 1, b"\x01")
    _put_property(props, "MaxFrameSize", 6, struct.pack(">q", _JAVA_LONG_MAX))  # LONG_TYPE
    _put_property(props, "MaxInactivityDuration", 6, struct.pack(">q", 0))
    command = (
        bytes((_WIREFORMAT_INFO,))
        + MAGIC
        + struct.pack(">i", PROBE_WIRE_FORMAT.version)
        + b"\x01"  # marshalledProperties present
        + struct.pack(">i", len(props))
        + bytes(props)
    )
    return struct.pack(">i", len(command)) + command


def parse_probe_wire_format(data: bytes) -> WireFormat | NeedMore:
    """The options in effect between the probe and a broker, once the broker's `WireFormatInfo`
    (the first command it sends) is complete.

    Args:
        data: every byte the broker sent so far.

    Returns:
        `PROBE_WIRE_FORMAT` negotiated with the broker's offer (loose, size prefix, no cache,
        the lower version), or NEED_MORE.

    Raises:
        SniffError: the broker did not start with a valid `WireFormatInfo`.
    """
    opening = _parse_wfi(data, "broker")
    if opening is NEED_MORE:
        return NEED_MORE
    return PROBE_WIRE_FORMAT.negotiate(opening.offer)


def _loose_command(data_type: int, command_id: int, response_required: bool, body: bytes) -> bytes:
    """A loose command with its size prefix: data type, `BaseCommand` commandId and
    responseRequired, then the command's own fields."""
    command = bytes((data_type,)) + struct.pack(">i?", command_id, response_required) + body
    return struct.pack(">i", len(command)) + command


def _loose_connection_id(connection_id: str) -> bytes:
    """`looseMarshalCachedObject` of a `ConnectionId` with the cache off: a nested object (present
    flag, data type 120, `ConnectionIdMarshaller`'s one string `value`)."""
    out = bytearray(b"\x01")
    out.append(_CONNECTION_ID)
    _loose_put_string(out, connection_id, "ConnectionId.value")
    return bytes(out)


def _check_probe_version(version: int) -> None:
    if not 1 <= version <= MAX_VERSION:
        raise ValueError(f"OpenWire version must be 1 to {MAX_VERSION}, got {version!r}")


def encode_connection_info(
    *,
    command_id: int,
    connection_id: str,
    client_id: str,
    user_name: str | None,
    password: str | None,
    version: int,
) -> bytes:
    """A `ConnectionInfo` with responseRequired, loose and uncached (`ConnectionInfoMarshaller`).

    Fields after `BaseCommand`: connectionId, clientId, password, userName, brokerPath (null),
    brokerMasterConnector and manageable (false); from v2 clientMaster (true, the Java default);
    from v6 faultTolerant and failoverReconnect (false); from v8 clientIp (null).

    Args:
        command_id: the command's id; the broker's answer carries it as correlationId.
        connection_id: the `ConnectionId` value, unique per connection (the Java client uses
            `ID:host-port-time-n:1`).
        client_id: the JMS client id.
        user_name: the user, or None.
        password: the password, or None.
        version: the negotiated OpenWire version (`parse_probe_wire_format`).

    Returns:
        The command with its size prefix.

    Raises:
        ValueError: a version outside 1 to `MAX_VERSION`, or a string too long for `writeUTF`.
    """
    _check_probe_version(version)
    body = bytearray(_loose_connection_id(connection_id))
    _loose_put_string(body, client_id, "clientId")
    _loose_put_string(body, password, "password")
    _loose_put_string(body, user_name, "userName")
    body += b"\x00\x00\x00"  # brokerPath null, brokerMasterConnector, manageable
    if version >= _CLIENT_MASTER_VERSION:
        body.append(1)  # clientMaster
    if version >= _FAULT_TOLERANT_VERSION:
        body += b"\x00\x00"  # faultTolerant, failoverReconnect
    if version >= _CLIENT_IP_VERSION:
        body.append(0)  # clientIp null
    return _loose_command(_CONNECTION_INFO, command_id, True, bytes(body))


def encode_connection_close(*, command_id: int, connection_id: str, version: int) -> bytes:
    """`RemoveInfo` for the connection, asking for a `Response`: how a Java client closes
    (`ActiveMQConnection.close` sends it synchronously, then `ShutdownInfo`). Once the broker has
    answered, the connection and its client id are gone from the broker, so the next connection
    with the same client id is accepted.

    Args:
        command_id: the id of the `RemoveInfo`; its `Response` carries it as correlationId.
        connection_id: the `ConnectionId` value sent in `ConnectionInfo`.
        version: the negotiated OpenWire version.

    Returns:
        The command with its size prefix.

    Raises:
        ValueError: a version outside 1 to `MAX_VERSION`.
    """
    _check_probe_version(version)
    body = _loose_connection_id(connection_id)
    if version >= _LAST_DELIVERED_VERSION:
        body += struct.pack(">q", _LAST_DELIVERED_UNKNOWN)
    return _loose_command(_REMOVE_INFO, command_id, True, body)


def encode_shutdown(*, command_id: int) -> bytes:
    """`ShutdownInfo`, which a client sends last (no answer; the broker then closes the socket).

    Args:
        command_id: the command's id.

    Returns:
        The command with its size prefix.
    """
    return _loose_command(_SHUTDOWN_INFO, command_id, False, b"")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerResponse:
    """The broker's answer to the probe's `ConnectionInfo`."""

    exception_class: str | None = None
    """None for a `Response`; for an `ExceptionResponse` or a `ConnectionError`, the Java class
    of its exception, e.g. "java.lang.SecurityException"."""
    exception_message: str | None = None
    """The exception's message, e.g. "User name [x] or password is invalid."."""

    @property
    def ok(self) -> bool:
        """Whether the broker accepted the connection."""
        return self.exception_class is None


def _read_throwable(r: _Reader, what: str) -> tuple[str, str | None]:
    """`looseUnmarsalThrowable` without stack traces (the probe turns StackTraceEnabled off):
    a present flag, then the class name and the message as loose strings."""
    if not r.boolean():
        return f"{what} without exception", None
    clazz = _loose_string(r, f"{what} exception class")
    message = _loose_string(r, f"{what} exception message")
    return clazz or "unknown exception", message


def parse_probe_response(data: bytes, *, command_id: int) -> BrokerResponse | NeedMore:
    """The broker's answer to one of the probe's commands (`ConnectionInfo`, then the closing
    `RemoveInfo`), from the start of what it sent.

    Args:
        data: every byte the broker sent so far, its `WireFormatInfo` first.
        command_id: the commandId of the command answered.

    Returns:
        The `Response` or `ExceptionResponse` whose correlationId is `command_id`, or a
        `ConnectionError` (a failure), whichever comes first; NEED_MORE before it is complete.

    Raises:
        SniffError: a bad `WireFormatInfo`, a command size above `MAX_COMMAND_BYTES` or zero,
            or an answer whose fields run past its size.
    """
    opening = _parse_wfi(data, "broker")
    if opening is NEED_MORE:
        return NEED_MORE
    pos = opening.end
    while True:
        size = _command_size(data, pos, "broker ")
        if size is None:
            return NEED_MORE
        end = pos + 4 + size
        if len(data) < end:
            return NEED_MORE
        data_type = data[pos + 4]
        if data_type in (_RESPONSE, _EXCEPTION_RESPONSE, _CONNECTION_ERROR):
            r = _Reader(data, pos + 5, end)
            try:
                answer = _read_answer(r, data_type, command_id)
            except _Short:
                raise SniffError(
                    _NAME, f"truncated {_type_name(data_type)}: its fields run past its size {size!r}"
                ) from None
            if answer is not None:
                return answer
        pos = end


def _read_answer(r: _Reader, data_type: int, command_id: int) -> BrokerResponse | None:
    """A `Response`, `ExceptionResponse` (`BaseCommand` fields, correlationId, then for the latter
    the exception) or `ConnectionError` (`BaseCommand` fields, exception); None when it answers
    another command."""
    r.i32()  # commandId
    r.boolean()  # responseRequired
    if data_type == _CONNECTION_ERROR:
        clazz, message = _read_throwable(r, "ConnectionError")
        return BrokerResponse(exception_class=clazz, exception_message=message)
    if r.i32() != command_id:
        return None
    if data_type == _RESPONSE:
        return BrokerResponse()
    clazz, message = _read_throwable(r, "ExceptionResponse")
    return BrokerResponse(exception_class=clazz, exception_message=message)
