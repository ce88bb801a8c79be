"""AMQP 1.0 sniffer, broker-preamble measures and redirect/refusal encoders (no I/O here).

The sniffer reads a client's protocol header, its SASL exchange (when it starts with the SASL
header) and its Open performative, and returns what they reveal: container-id, Open hostname,
SASL PLAIN user and password. In AMQP 1.0 the server speaks first inside SASL (§5.3.2: the
server sends sasl-mechanisms before the client picks one), so the sniffer answers those steps
itself through `Reply`, cumulatively and without state: every call re-parses the whole buffer.

Also here, because they are the same wire format: `sniff_server_sasl_preamble` and
`sniff_server_plain_preamble` measure what a real broker sends back when the router replays the
client's handshake to it (the part the router already answered must be dropped), and pure
encoders for the frames the router sends on a redirect or refusal (SPEC A6). Just enough of the
AMQP type system (§1.6) is implemented to decode those frames with bounds checks everywhere.

The health probe (`probe=amqp`) is a client: its encoders (`encode_sasl_init`, `encode_open`,
`CLOSE_FRAME`) and the parsers of the broker's answers (`parse_sasl_mechanisms`,
`parse_sasl_outcome`, `parse_broker_open`, `parse_broker_close`) are at the end of the module.

This module does no I/O: no trio, no sockets, no clock, no logging.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Final, TypeAlias

from keys.sniff import NEED_MORE, NeedMore, Reply, Sniffed, SniffError, SniffResult, WireProtocol

__all__ = [
    "AMQP_HEADER",
    "CLOSE_FRAME",
    "MAX_HANDSHAKE_FRAME_SIZE",
    "SASL_HEADER",
    "SASL_MECHANISMS",
    "AmqpMap",
    "AmqpSniffer",
    "AmqpValue",
    "BrokerClose",
    "BrokerOpen",
    "Described",
    "Frame",
    "Symbol",
    "decode_performative",
    "decode_value",
    "encode_close",
    "encode_open",
    "encode_sasl_init",
    "encode_sasl_mechanisms",
    "encode_sasl_outcome",
    "parse_broker_close",
    "parse_broker_open",
    "parse_frame",
    "parse_sasl_mechanisms",
    "parse_sasl_outcome",
    "redirect_frames",
    "refusal_frames",
    "sasl_outcome_name",
    "sasl_plain_response",
    "server_preamble",
    "sniff_server_plain_preamble",
    "sniff_server_sasl_preamble",
]

_PROTOCOL: Final = WireProtocol.AMQP.value

# --- protocol headers (§2.2, §5.2, §5.3) --------------------------------------------------------

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
"""Protocol id 0 (plain AMQP), version 1.0.0 (§2.2)."""
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
"""Protocol id 3 (SASL security layer), version 1.0.0 (§5.3)."""
_AMQP_PROTOCOL_ID: Final = 0
_TLS_PROTOCOL_ID: Final = 2
"""Protocol id 2 asks for a TLS layer inside AMQP (§5.2); we expect TLS on the socket instead."""
_SASL_PROTOCOL_ID: Final = 3
_HEADER_SIZE: Final = 8
_MAGIC: Final = b"AMQP"

_KNOWN_HEADERS: Final[dict[bytes, str]] = {
    b"AMQP\x00\x00\x09\x01": "AMQP 0-9-1",
    b"AMQP\x01\x01\x00\x09": "AMQP 0-9",
    b"AMQP\x01\x01\x00\x0a": "AMQP 0-10",
    b"AMQP\x01\x01\x08\x00": "AMQP 0-8",
}
"""Headers of older AMQP versions, named in errors (they share the magic, not the protocol)."""

# --- frames (§2.3) ---------------------------------------------------------------------------

_FRAME_HEADER_SIZE: Final = 8
"""SIZE (4) + DOFF (1) + TYPE (1) + type-specific (2): the fixed frame header, also the minimum
SIZE (§2.3.1: "The frame is malformed if the size is less than the size of the frame header")."""
_MIN_DOFF: Final = 2
"""DOFF counts 4-byte words; 2 words is the fixed header itself (§2.3.1)."""
MAX_HANDSHAKE_FRAME_SIZE: Final = 64 * 1024
"""Largest frame accepted before Open has negotiated max-frame-size. The spec allows only 512
bytes (MIN-MAX-FRAME-SIZE, §2.4.1, §5.3) at this point; real Opens with long property maps may
be larger, so we are 128 times more lenient and still far below anything costly. The router's
own sniff cap (16 KiB) is reached first anyway."""
_FRAME_TYPE_AMQP: Final = 0
_FRAME_TYPE_SASL: Final = 1

# --- performative descriptors (§2.7, §2.8.14, §5.3.3) -----------------------------------------

_OPEN: Final = 0x10
_CLOSE: Final = 0x18
_ERROR: Final = 0x1D
_SASL_MECHANISMS: Final = 0x40
_SASL_INIT: Final = 0x41
_SASL_OUTCOME: Final = 0x44

_DESCRIPTOR_NAMES: Final[dict[int, str]] = {
    0x10: "open",
    0x11: "begin",
    0x12: "attach",
    0x13: "flow",
    0x14: "transfer",
    0x15: "disposition",
    0x16: "detach",
    0x17: "end",
    0x18: "close",
    0x1D: "error",
    0x40: "sasl-mechanisms",
    0x41: "sasl-init",
    0x42: "sasl-challenge",
    0x43: "sasl-response",
    0x44: "sasl-outcome",
}
"""Numeric descriptor (domain 0, §1.5) -> the name in `amqp:NAME:list`."""
_SYMBOLIC_DESCRIPTORS: Final[dict[str, int]] = {
    f"amqp:{name}:list": code for code, name in _DESCRIPTOR_NAMES.items()
}
"""A descriptor may also be sent as its symbolic name (§1.5); both mean the same."""

# --- SASL (§5.3.3.6) -------------------------------------------------------------------------

SASL_MECHANISMS: Final = ("PLAIN", "ANONYMOUS", "EXTERNAL")
"""What the router offers: the single-step mechanisms (no sasl-challenge round trip), which are
also the ones proton offers without Cyrus SASL (ENVIRONMENT.md §1)."""
_SASL_OUTCOME_CODES: Final[dict[int, str]] = {
    0: "ok",
    1: "auth",
    2: "sys",
    3: "sys-perm",
    4: "sys-temp",
}

# --- decoder limits --------------------------------------------------------------------------

_QUOTE_MAX: Final = 32
"""At most this many bytes of peer data go into an error message."""
_MAX_NESTING: Final = 32
"""Deepest nesting of described types, lists, maps and arrays we decode. Handshake frames nest
three or four levels (described list > map > value); the limit keeps hostile input from reaching
Python's recursion limit."""


# ============================================================================================
# The type system (§1.6): decoded values
# ============================================================================================


class Symbol(str):
    """An AMQP symbol (§1.6.21): an ASCII string naming a value, kept apart from `str` strings."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str(self)!r})"


@dataclass(frozen=True, slots=True)
class Described:
    """A described value (§1.2): a descriptor (ulong code or symbol) and the value it describes."""

    descriptor: AmqpValue
    value: AmqpValue


@dataclass(frozen=True, slots=True)
class AmqpMap:
    """An AMQP map (§1.6.23) as its key-value pairs in wire order (keys may be unhashable)."""

    pairs: tuple[tuple[AmqpValue, AmqpValue], ...]

    def get(self, key: AmqpValue) -> AmqpValue:
        """The value of the first pair whose key equals `key`, else None."""
        for k, v in self.pairs:
            if k == key and type(k) is type(key):
                return v
        return None


AmqpValue: TypeAlias = (
    bool | int | float | str | bytes | uuid.UUID | list["AmqpValue"] | AmqpMap | Described | None
)
"""A decoded value. Lists and arrays both decode to `list`; symbols to `Symbol`, strings to `str`;
decimals to their raw bytes; timestamps to milliseconds since the epoch."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One complete frame (§2.3.1)."""

    type: int
    """0 = AMQP, 1 = SASL."""
    channel: int
    """The type-specific header field: the channel of an AMQP frame, ignored for SASL."""
    body: bytes
    """Everything after the extended header: a performative and, for transfers, a payload."""
    size: int
    """The SIZE field: the frame's length on the wire, header included."""


def _err(reason: str) -> SniffError:
    return SniffError(_PROTOCOL, reason)


class _Reader:
    """A cursor over one complete, bounded byte range; reading past its end is a malformed value."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end

    def take(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise _err(f"value needs {n} bytes at offset {self.pos}, only {self.end - self.pos} left")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def byte(self) -> int:
        return self.take(1)[0]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def sint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big", signed=True)

    def remaining(self) -> int:
        return self.end - self.pos


_FIXED_UNSIGNED: Final[dict[int, int]] = {
    0x50: 1,  # ubyte
    0x52: 1,  # smalluint
    0x53: 1,  # smallulong
    0x60: 2,  # ushort
    0x70: 4,  # uint
    0x80: 8,  # ulong
}
"""Format code -> width of the unsigned integer types (§1.6.3-1.6.6)."""
_FIXED_SIGNED: Final[dict[int, int]] = {
    0x51: 1,  # byte
    0x54: 1,  # smallint
    0x55: 1,  # smalllong
    0x61: 2,  # short
    0x71: 4,  # int
    0x81: 8,  # long
    0x83: 8,  # timestamp, ms since the Unix epoch (§1.6.17)
}
"""Format code -> width of the two's-complement integer types (§1.6.7-1.6.10, §1.6.17)."""
_RAW_FIXED: Final[dict[int, int]] = {
    0x74: 4,  # decimal32
    0x84: 8,  # decimal64
    0x94: 16,  # decimal128
}
"""Decimals (§1.6.13-1.6.15) are kept as raw IEEE 754 bytes: handshakes never carry them."""
_ZERO_WIDTH: Final[dict[int, AmqpValue]] = {
    0x40: None,  # null
    0x41: True,  # boolean true
    0x42: False,  # boolean false
    0x43: 0,  # uint0
    0x44: 0,  # ulong0
}
"""Format codes whose value is the code itself (§1.6.1-1.6.6); list0 is handled with lists."""
_LIST0: Final = 0x45


def _decode_primitive(r: _Reader, code: int, depth: int) -> AmqpValue:
    """Decode the value of format code `code` (the constructor is already read)."""
    if depth > _MAX_NESTING:  # also reached by arrays of arrays, which bypass `_decode`
        raise _err(f"values nested deeper than {_MAX_NESTING} levels")
    if code in _ZERO_WIDTH:
        return _ZERO_WIDTH[code]
    if code in _FIXED_UNSIGNED:
        return r.uint(_FIXED_UNSIGNED[code])
    if code in _FIXED_SIGNED:
        return r.sint(_FIXED_SIGNED[code])
    if code in _RAW_FIXED:
        return r.take(_RAW_FIXED[code])
    if code == 0x56:  # boolean with a one-byte value (§1.6.2)
        flag = r.byte()
        if flag > 1:
            raise _err(f"boolean byte must be 0 or 1, got {flag:#04x}")
        return flag == 1
    if code == 0x72:  # float, IEEE 754-2008 binary32 (§1.6.11)
        return float(struct.unpack(">f", r.take(4))[0])
    if code == 0x82:  # double, binary64 (§1.6.12)
        return float(struct.unpack(">d", r.take(8))[0])
    if code == 0x73:  # char, one UTF-32BE code point (§1.6.16)
        point = r.uint(4)
        if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
            raise _err(f"char is not a unicode scalar value: {point:#x}")
        return chr(point)
    if code == 0x98:  # uuid, RFC 4122 byte order (§1.6.18)
        return uuid.UUID(bytes=r.take(16))
    if code in (0xA0, 0xB0):  # vbin8, vbin32 (§1.6.19)
        return r.take(r.uint(1 if code == 0xA0 else 4))
    if code in (0xA1, 0xB1):  # str8-utf8, str32-utf8 (§1.6.20)
        raw = r.take(r.uint(1 if code == 0xA1 else 4))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _err(f"string is not valid utf-8: {raw[:_QUOTE_MAX]!r}") from None
    if code in (0xA3, 0xB3):  # sym8, sym32: ASCII (§1.6.21)
        raw = r.take(r.uint(1 if code == 0xA3 else 4))
        try:
            return Symbol(raw.decode("ascii"))
        except UnicodeDecodeError:
            raise _err(f"symbol is not ascii: {raw[:_QUOTE_MAX]!r}") from None
    if code == _LIST0:
        return []
    if code in (0xC0, 0xD0, 0xC1, 0xD1):  # list8, list32, map8, map32 (§1.6.22, §1.6.23)
        return _decode_compound(r, code, depth)
    if code in (0xE0, 0xF0):  # array8, array32 (§1.6.24)
        return _decode_array(r, code, depth)
    raise _err(f"unknown type code {code:#04x}")


def _sized_body(r: _Reader, width: int, what: str) -> tuple[_Reader, int]:
    """Read a compound's size and count (each `width` bytes) and return a reader over its items.

    The size counts the count field and the items (§1.6.22). Every list or map item takes at
    least one byte (its constructor), so a larger count is malformed; arrays are bounded the same
    way (see `_decode_array`). Checking first keeps the work linear in the frame size.
    """
    size = r.uint(width)
    if size < width:
        raise _err(f"{what} size {size} is smaller than its count field")
    if size > r.remaining():
        raise _err(f"{what} size {size} runs past the end of its container ({r.remaining()} bytes left)")
    inner = _Reader(r.data, r.pos, r.pos + size)
    r.pos += size
    count = inner.uint(width)
    if count > inner.remaining():
        raise _err(f"{what} count {count} exceeds its {inner.remaining()} bytes of items")
    return inner, count


def _decode_compound(r: _Reader, code: int, depth: int) -> AmqpValue:
    width = 1 if code in (0xC0, 0xC1) else 4
    is_map = code in (0xC1, 0xD1)
    what = "map" if is_map else "list"
    inner, count = _sized_body(r, width, what)
    items = [_decode(inner, depth + 1) for _ in range(count)]
    if inner.remaining():
        raise _err(f"{what} has {inner.remaining()} bytes after its {count} items")
    if not is_map:
        return items
    if count % 2:
        raise _err(f"map has an odd number of items: {count}")
    return AmqpMap(tuple(zip(items[0::2], items[1::2], strict=True)))


def _decode_array(r: _Reader, code: int, depth: int) -> AmqpValue:
    # An array has one constructor for all its elements (§1.2); a zero-width element type
    # (null, true, uint0, list0...) could claim billions of elements in a few bytes, so
    # `_sized_body` bounds the count by the byte size for arrays too. No real client sends an
    # array of more zero-width elements than the array has bytes.
    inner, count = _sized_body(r, 1 if code == 0xE0 else 4, "array")
    descriptors, element_code = _read_constructor(inner, depth + 1)
    items: list[AmqpValue] = []
    for _ in range(count):
        value = _decode_primitive(inner, element_code, depth + 1)
        for descriptor in reversed(descriptors):
            value = Described(descriptor, value)
        items.append(value)
    if inner.remaining():
        raise _err(f"array has {inner.remaining()} bytes after its {count} elements")
    return items


def _read_constructor(r: _Reader, depth: int) -> tuple[list[AmqpValue], int]:
    """Read a constructor (§1.2): a format code, or 0x00 + descriptor + constructor.

    Returns the descriptors (outermost first) and the primitive format code.
    """
    descriptors: list[AmqpValue] = []
    code = r.byte()
    while code == 0x00:
        descriptors.append(_decode(r, depth + len(descriptors) + 1))
        code = r.byte()
    return descriptors, code


def _decode(r: _Reader, depth: int) -> AmqpValue:
    if depth > _MAX_NESTING:
        raise _err(f"values nested deeper than {_MAX_NESTING} levels")
    descriptors, code = _read_constructor(r, depth)
    value = _decode_primitive(r, code, depth + len(descriptors))
    for descriptor in reversed(descriptors):
        value = Described(descriptor, value)
    return value


def decode_value(data: bytes, offset: int = 0) -> tuple[AmqpValue, int]:
    """Decode one AMQP value (§1.2 encoding, §1.6 types).

    Args:
        data: bytes holding a complete encoded value at `offset`.
        offset: where the value starts.

    Returns:
        The value and the offset just after it.

    Raises:
        SniffError: the bytes end inside the value, or it is malformed (unknown type code,
            invalid UTF-8, a size or count that does not fit, nesting deeper than 32 levels).
    """
    r = _Reader(data, offset, len(data))
    value = _decode(r, 0)
    return value, r.pos


# ============================================================================================
# Frames and performatives
# ============================================================================================


def parse_frame(
    data: bytes, offset: int = 0, *, max_size: int = MAX_HANDSHAKE_FRAME_SIZE
) -> Frame | NeedMore:
    """Parse the frame starting at `offset` (§2.3.1), checking each header field as it arrives.

    Args:
        data: the buffer.
        offset: where the frame starts.
        max_size: the largest SIZE accepted.

    Returns:
        The frame, or NEED_MORE when the buffer ends inside it.

    Raises:
        SniffError: SIZE below 8 or above `max_size`, DOFF below 2 or pointing past the frame.
    """
    avail = len(data) - offset
    if avail < 4:
        return NEED_MORE
    size = int.from_bytes(data[offset : offset + 4], "big")
    if size < _FRAME_HEADER_SIZE:
        raise _err(f"frame size {size} is smaller than the {_FRAME_HEADER_SIZE}-byte frame header")
    if size > max_size:
        raise _err(f"frame size {size} exceeds the handshake limit of {max_size} bytes")
    if avail < 5:
        return NEED_MORE
    doff = data[offset + 4]
    if doff < _MIN_DOFF:
        raise _err(f"frame data offset {doff} is below the minimum of {_MIN_DOFF} words")
    if doff * 4 > size:
        raise _err(f"frame data offset {doff} words points past the frame size {size}")
    if avail < size:
        return NEED_MORE
    return Frame(
        type=data[offset + 5],
        channel=int.from_bytes(data[offset + 6 : offset + 8], "big"),
        body=data[offset + doff * 4 : offset + size],
        size=size,
    )


def _descriptor_code(descriptor: AmqpValue) -> int | None:
    """The numeric code of a performative descriptor given as ulong or symbol (§1.5)."""
    if isinstance(descriptor, Symbol):
        return _SYMBOLIC_DESCRIPTORS.get(str(descriptor))
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return descriptor
    return None


def _describe_code(code: int | None) -> str:
    if code is None:
        return "a non-amqp descriptor"
    return _DESCRIPTOR_NAMES.get(code, f"descriptor {code:#x}")


def decode_performative(frame: Frame) -> tuple[int | None, list[AmqpValue]]:
    """Decode the performative at the start of a frame body (§2.7, §5.3.3).

    Args:
        frame: a complete frame with a non-empty body.

    Returns:
        The descriptor code (None if it is neither a known symbol nor an integer) and the
        performative's fields (a described list).

    Raises:
        SniffError: the body is empty, not a described list, or malformed.
    """
    if not frame.body:
        raise _err("frame has no performative (empty body)")
    value, _ = decode_value(frame.body)
    if not isinstance(value, Described) or not isinstance(value.value, list):
        raise _err(f"frame body is not a described list: {frame.body[:_QUOTE_MAX]!r}")
    return _descriptor_code(value.descriptor), value.value


def _field(fields: list[AmqpValue], index: int) -> AmqpValue:
    """Field `index` of a performative; trailing null fields may be omitted (§1.4)."""
    return fields[index] if index < len(fields) else None


def _type_name(value: AmqpValue) -> str:
    return "symbol" if isinstance(value, Symbol) else type(value).__name__


# ============================================================================================
# Encoders (§1.2, §1.6) and the frames the router sends
# ============================================================================================


def _enc_variable(code8: int, code32: int, raw: bytes) -> bytes:
    if len(raw) <= 0xFF:
        return bytes((code8, len(raw))) + raw
    return bytes((code32,)) + len(raw).to_bytes(4, "big") + raw


def _enc_string(text: str) -> bytes:
    return _enc_variable(0xA1, 0xB1, text.encode("utf-8"))


def _enc_symbol(name: str) -> bytes:
    return _enc_variable(0xA3, 0xB3, name.encode("ascii"))


def _enc_bool(flag: bool) -> bytes:
    return b"\x41" if flag else b"\x42"


def _enc_int(number: int) -> bytes:
    if -128 <= number <= 127:
        return b"\x54" + number.to_bytes(1, "big", signed=True)  # smallint
    return b"\x71" + number.to_bytes(4, "big", signed=True)  # int


def _enc_compound(code8: int, code32: int, items: list[bytes]) -> bytes:
    """A list or map (§1.6.22-23): size counts the count field and the items."""
    payload = b"".join(items)
    if len(items) == 0 and code8 == 0xC0:
        return b"\x45"  # list0
    if len(payload) + 1 <= 0xFF and len(items) <= 0xFF:
        return bytes((code8, len(payload) + 1, len(items))) + payload
    return bytes((code32,)) + (len(payload) + 4).to_bytes(4, "big") + len(items).to_bytes(4, "big") + payload


def _enc_list(items: list[bytes]) -> bytes:
    while items and items[-1] == b"\x40":  # trailing nulls may be omitted (§1.4)
        items = items[:-1]
    return _enc_compound(0xC0, 0xD0, items)


def _enc_map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return _enc_compound(0xC1, 0xD1, [part for pair in pairs for part in pair])


def _enc_symbol_array(names: tuple[str, ...]) -> bytes:
    """An array of symbols (§1.6.24): one constructor, then each element without it."""
    raw = [n.encode("ascii") for n in names]
    if len(names) <= 0xFF and all(len(r) <= 0xFF for r in raw):
        payload = bytes((len(names), 0xA3)) + b"".join(bytes((len(r),)) + r for r in raw)
        if len(payload) <= 0xFF:
            return bytes((0xE0, len(payload))) + payload  # array8 of sym8
    elements = b"".join(len(r).to_bytes(4, "big") + r for r in raw)
    payload = len(names).to_bytes(4, "big") + b"\xb3" + elements
    return b"\xf0" + len(payload).to_bytes(4, "big") + payload  # array32 of sym32


def _enc_described(code: int, fields: list[bytes]) -> bytes:
    """A performative: descriptor as smallulong (§1.5), then its field list."""
    return bytes((0x00, 0x53, code)) + _enc_list(fields)


def _enc_frame(frame_type: int, body: bytes) -> bytes:
    """A frame with the minimal data offset of 2 words and channel 0 (§2.3.1)."""
    size = _FRAME_HEADER_SIZE + len(body)
    return size.to_bytes(4, "big") + bytes((_MIN_DOFF, frame_type, 0, 0)) + body


def encode_sasl_mechanisms(mechanisms: tuple[str, ...] = SASL_MECHANISMS) -> bytes:
    """A sasl-mechanisms frame (§5.3.3.1) offering `mechanisms`.

    Args:
        mechanisms: SASL mechanism names, ASCII.

    Returns:
        The complete SASL frame.
    """
    return _enc_frame(_FRAME_TYPE_SASL, _enc_described(_SASL_MECHANISMS, [_enc_symbol_array(mechanisms)]))


def encode_sasl_outcome(code: int = 0) -> bytes:
    """A sasl-outcome frame (§5.3.3.5) with `code` (0 = ok) and no additional-data.

    Args:
        code: the sasl-code, 0-4.

    Returns:
        The complete SASL frame.
    """
    return _enc_frame(_FRAME_TYPE_SASL, _enc_described(_SASL_OUTCOME, [bytes((0x50, code))]))


_MECHANISMS_FRAME: Final = encode_sasl_mechanisms()
_OUTCOME_OK_FRAME: Final = encode_sasl_outcome(0)
_SASL_PREAMBLE: Final = SASL_HEADER + _MECHANISMS_FRAME + _OUTCOME_OK_FRAME + AMQP_HEADER
"""Everything the router sends a SASL client before the client's Open, in order."""


def encode_open(container_id: str, *, properties: dict[str, bool] | None = None) -> bytes:
    """An Open frame (§2.7.1) with only container-id and, optionally, connection properties.

    Args:
        container_id: our container id (the router's name).
        properties: the Open `properties` map (the `fields` type: symbol keys), e.g.
            `{"amqp:connection-establishment-failed": True}` (SPEC A6: the hint that a Close
            follows at once).

    Returns:
        The complete AMQP frame on channel 0.
    """
    fields = [_enc_string(container_id)] + [b"\x40"] * 8
    if properties:
        fields.append(_enc_map([(_enc_symbol(k), _enc_bool(v)) for k, v in properties.items()]))
    return _enc_frame(_FRAME_TYPE_AMQP, _enc_described(_OPEN, fields))


def _enc_info_value(value: str | int) -> bytes:
    if isinstance(value, bool):
        return _enc_bool(value)
    if isinstance(value, int):
        return _enc_int(value)
    return _enc_string(value)


def encode_close(
    condition: str, description: str | None = None, info: dict[str, str | int] | None = None
) -> bytes:
    """A Close frame (§2.7.9) carrying an error (§2.8.14).

    Integers in `info` are encoded as AMQP `int` (signed 32-bit; smallint when they fit in a
    byte). That is the type proton-c's `pn_condition_redirect_port` reads (`pn_data_get_int`,
    anything else reads as 0), and what a Java broker puts for a Java `Integer`; clients that
    parse the port leniently (proton-python, qpid-jms) accept it as well.

    Args:
        condition: the error condition symbol, e.g. "amqp:connection:redirect".
        description: the human-readable description, or None.
        info: the error's info map, symbol keys, e.g. {"network-host": host, "port": 5672}.

    Returns:
        The complete AMQP frame on channel 0.
    """
    info_enc = _enc_map([(_enc_symbol(k), _enc_info_value(v)) for k, v in info.items()]) if info else b"\x40"
    description_enc = _enc_string(description) if description is not None else b"\x40"
    error = _enc_described(_ERROR, [_enc_symbol(condition), description_enc, info_enc])
    return _enc_frame(_FRAME_TYPE_AMQP, _enc_described(_CLOSE, [error]))


_ESTABLISHMENT_FAILED: Final = {"amqp:connection-establishment-failed": True}
"""The Open property saying a Close follows at once (SPEC A6)."""


def redirect_frames(router_name: str, host: str, port: int) -> bytes:
    """Open (hint) + Close `amqp:connection:redirect` with info {network-host, port} (SPEC A6).

    Send `server_preamble(sniffed)` (the part not yet sent) first.

    Args:
        router_name: our container id, and named in the description.
        host: the target's host.
        port: the target's port, 1-65535.

    Returns:
        The two frames.

    Raises:
        ValueError: `port` is out of range.
    """
    if not 0 < port <= 0xFFFF:
        raise ValueError(f"port must be 1-65535, got {port!r}")
    return encode_open(router_name, properties=_ESTABLISHMENT_FAILED) + encode_close(
        "amqp:connection:redirect",
        f"Connection router {router_name} redirected this connection to {host}:{port}",
        {"network-host": host, "port": port},
    )


def refusal_frames(router_name: str, *, unavailable: bool) -> bytes:
    """Open (hint) + Close `amqp:connection:forced` for a refused connection (SPEC A6).

    Args:
        router_name: our container id, and named in the description.
        unavailable: True for REFUSED_UNAVAILABLE ("is not ready", maybe transient), False
            for REFUSED_USE_ANOTHER ("rejected this connection").

    Returns:
        The two frames.
    """
    what = "is not ready" if unavailable else "rejected this connection"
    return encode_open(router_name, properties=_ESTABLISHMENT_FAILED) + encode_close(
        "amqp:connection:forced", f"Connection router {router_name} {what}"
    )


def server_preamble(sniffed: Sniffed) -> bytes:
    """Everything the router must have sent the client once its handshake is sniffed.

    A client that pipelines its handshake gets `Sniffed` before every `Reply` was seen, so
    after `Sniffed` the router sends `server_preamble(sniffed)[len(already_sent):]`, then either
    its own frames (redirect, refusal) or, in proxy mode, the broker's bytes after its preamble.

    Args:
        sniffed: the result of `AmqpSniffer.sniff`.

    Returns:
        SASL header + sasl-mechanisms + sasl-outcome(ok) + AMQP header for a SASL client, the
        AMQP header alone otherwise.
    """
    return _SASL_PREAMBLE if sniffed.sasl_mechanism is not None else AMQP_HEADER


# ============================================================================================
# The client sniffer
# ============================================================================================


def _describe_header(header: bytes) -> str:
    if header in _KNOWN_HEADERS:
        return _KNOWN_HEADERS[header]
    protocol_id, major, minor, revision = header[4:8]
    version = f"{major}.{minor}.{revision}"
    if protocol_id == _TLS_PROTOCOL_ID:
        return f"AMQP TLS layer {version}; use TLS on the socket instead"
    if protocol_id == _SASL_PROTOCOL_ID:
        return f"SASL layer version {version}"
    if protocol_id == _AMQP_PROTOCOL_ID:
        return f"AMQP version {version}"
    return f"unknown protocol id {protocol_id}, version {version}"


def _read_header(data: bytes, offset: int, expected: tuple[bytes, ...], what: str) -> bytes | NeedMore:
    """The 8-byte protocol header at `offset` if it is one of `expected` (§2.2).

    Raises at the first byte that cannot start "AMQP"; waits for all 8 bytes before naming an
    unsupported version.
    """
    got = data[offset : offset + _HEADER_SIZE]
    magic = got[:4]
    if not _MAGIC.startswith(magic):
        raise _err(f"{what} must start with b'AMQP', got {got!r}")
    if len(got) < _HEADER_SIZE:
        return NEED_MORE
    if got not in expected:
        raise _err(f"unsupported protocol header {got!r} ({_describe_header(got)})")
    return got


def _next_frame(data: bytes, offset: int, frame_type: int, phase: str) -> Frame | NeedMore:
    if data[offset : offset + 4] == _MAGIC:
        got = data[offset : offset + _HEADER_SIZE]
        raise _err(f"expected {phase} frame, got a protocol header {got!r}")
    frame = parse_frame(data, offset)
    if frame is NEED_MORE:
        return NEED_MORE
    if frame.type != frame_type:
        raise _err(f"expected {phase} frame (type {frame_type}), got frame type {frame.type}")
    return frame


@dataclass(frozen=True, slots=True, kw_only=True)
class _SaslInit:
    mechanism: str
    user_name: str | None
    password: str | None
    hostname: str | None


def _parse_sasl_init(frame: Frame) -> _SaslInit:
    """The client's sasl-init (§5.3.3.2): mechanism, initial-response, hostname."""
    code, fields = decode_performative(frame)
    if code != _SASL_INIT:
        raise _err(f"expected sasl-init from the client, got {_describe_code(code)}")
    mechanism = _field(fields, 0)
    if not isinstance(mechanism, Symbol):
        raise _err(f"sasl-init mechanism must be a symbol, got {_type_name(mechanism)}")
    if mechanism not in SASL_MECHANISMS:
        offered = ", ".join(SASL_MECHANISMS)
        raise _err(f"unsupported sasl mechanism {str(mechanism)[:_QUOTE_MAX]!r} (offered {offered})")
    response = _field(fields, 1)
    if response is not None and not isinstance(response, bytes):
        raise _err(f"sasl-init initial-response must be binary, got {_type_name(response)}")
    hostname = _field(fields, 2)
    if hostname is not None and (not isinstance(hostname, str) or isinstance(hostname, Symbol)):
        raise _err(f"sasl-init hostname must be a string, got {_type_name(hostname)}")
    user_name = password = None
    if mechanism == "PLAIN":
        user_name, password = _parse_plain(response)
    # ANONYMOUS carries an optional trace string (RFC 4505) and EXTERNAL an optional authzid
    # (RFC 4422 App. A); neither names a user: with EXTERNAL the TLS layer knows who it is.
    return _SaslInit(mechanism=str(mechanism), user_name=user_name, password=password, hostname=hostname)


def _parse_plain(response: bytes | None) -> tuple[str, str]:
    """RFC 4616 §2: `[authzid] NUL authcid NUL passwd`, UTF-8; returns (authcid, passwd)."""
    if response is None:
        raise _err("sasl plain needs an initial-response, got none")
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise _err(f"sasl plain response must hold exactly 2 NUL separators, got {len(parts) - 1}")
    try:
        _authzid, authcid, passwd = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        raise _err("sasl plain response is not valid utf-8") from None
    if not authcid:
        raise _err("sasl plain authcid is empty")
    return authcid, passwd


def _parse_open(data: bytes, offset: int) -> tuple[str, str | None] | NeedMore:
    """Skip empty frames (heartbeats, §2.4.5), then the client's Open (§2.7.1).

    Returns (container-id, hostname).
    """
    while True:
        frame = _next_frame(data, offset, _FRAME_TYPE_AMQP, "an amqp")
        if frame is NEED_MORE:
            return NEED_MORE
        if frame.body:
            break
        offset += frame.size
    code, fields = decode_performative(frame)
    if code != _OPEN:
        raise _err(f"expected open as the first performative, got {_describe_code(code)}")
    container_id = _field(fields, 0)
    if container_id is None:
        raise _err("open container-id is missing (it is mandatory, §2.7.1)")
    if not isinstance(container_id, str) or isinstance(container_id, Symbol):
        raise _err(f"open container-id must be a string, got {_type_name(container_id)}")
    hostname = _field(fields, 1)
    if hostname is not None and (not isinstance(hostname, str) or isinstance(hostname, Symbol)):
        raise _err(f"open hostname must be a string, got {_type_name(hostname)}")
    return container_id, hostname


class AmqpSniffer:
    """Sniffs an AMQP 1.0 client: optional SASL exchange (answered by us), then its Open.

    With the SASL header the exchange is (§5.3.2): client SASL header -> we send SASL header +
    sasl-mechanisms (PLAIN, ANONYMOUS, EXTERNAL); client sasl-init -> we add sasl-outcome(ok);
    client AMQP header -> we add the AMQP header; client Open -> `Sniffed`. Without SASL: client
    AMQP header -> we send the AMQP header; client Open -> `Sniffed`. Each `Reply` holds all of
    it so far. A client may pipeline any of its steps; see `server_preamble`.
    """

    name = _PROTOCOL

    def looks_like(self, prefix: bytes) -> bool:
        """Whether `prefix` may start an AMQP protocol header (b"AMQP"). Never raises."""
        return _MAGIC.startswith(prefix[:4])

    def announced_size(self, data: bytes) -> int | None:
        """None: the byte cap bounds the SASL and Open frames, whose sizes the sniffer checks
        (keys.sniff.Sniffer)."""
        return None

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the client's handshake from the start of the connection.

        Args:
            data: every byte the client sent so far.

        Returns:
            NEED_MORE before the protocol header is complete; `Reply` while the client waits
            for our part of the handshake; `Sniffed` once the Open is complete.

        Raises:
            SniffError: not AMQP, an unsupported protocol header (AMQP 0-9-1, TLS, other
                versions), a malformed or oversized frame, an unexpected performative, an
                unsupported SASL mechanism, a bad PLAIN response or a missing container-id.
        """
        header = _read_header(data, 0, (SASL_HEADER, AMQP_HEADER), "protocol header")
        if header is NEED_MORE:
            return NEED_MORE
        if header == AMQP_HEADER:
            opened = _parse_open(data, _HEADER_SIZE)
            if opened is NEED_MORE:
                return Reply(AMQP_HEADER)
            container_id, hostname = opened
            return Sniffed(
                protocol=WireProtocol.AMQP, client_id=container_id, hostname=hostname, protocol_version="1.0"
            )
        return self._sniff_sasl(data)

    def _sniff_sasl(self, data: bytes) -> SniffResult:
        reply = SASL_HEADER + _MECHANISMS_FRAME
        frame = _next_frame(data, _HEADER_SIZE, _FRAME_TYPE_SASL, "a sasl")
        if frame is NEED_MORE:
            return Reply(reply)
        init = _parse_sasl_init(frame)
        offset = _HEADER_SIZE + frame.size
        reply += _OUTCOME_OK_FRAME
        if _read_header(data, offset, (AMQP_HEADER,), "header after sasl") is NEED_MORE:
            return Reply(reply)
        reply += AMQP_HEADER
        opened = _parse_open(data, offset + _HEADER_SIZE)
        if opened is NEED_MORE:
            return Reply(reply)
        container_id, hostname = opened
        return Sniffed(
            protocol=WireProtocol.AMQP,
            client_id=container_id,
            hostname=hostname if hostname is not None else init.hostname,
            user_name=init.user_name,
            password=init.password,
            sasl_mechanism=init.mechanism,
            protocol_version="1.0",
        )


# ============================================================================================
# The broker's answer to a replayed handshake (proxy mode)
# ============================================================================================


# The broker's SASL frames after its SASL header, shared by the proxy-mode measure below and the
# health probe's parsers at the end: sasl-mechanisms, then sasl-outcome, then the AMQP header.


def _broker_sasl_frame(data: bytes, offset: int, expected: int) -> tuple[list[AmqpValue], int] | NeedMore:
    """The broker's SASL frame at `offset`, which must carry `expected`: (its fields, offset after it)."""
    frame = _next_frame(data, offset, _FRAME_TYPE_SASL, "a broker sasl")
    if frame is NEED_MORE:
        return NEED_MORE
    code, fields = decode_performative(frame)
    if code != expected:
        # After the mechanisms, a sasl-challenge: only single-step mechanisms are relayed or probed.
        raise _err(f"broker sent {_describe_code(code)} where {_describe_code(expected)} was expected")
    return fields, offset + frame.size


def _broker_outcome(data: bytes, offset: int) -> tuple[int, int] | NeedMore:
    """The broker's sasl-outcome at `offset`, after its mechanisms: (code, offset after it)."""
    found = _broker_sasl_frame(data, offset, _SASL_OUTCOME)
    if found is NEED_MORE:
        return NEED_MORE
    fields, end = found
    outcome = _field(fields, 0)
    if not isinstance(outcome, int) or isinstance(outcome, bool):
        raise _err(f"broker sasl-outcome code must be a ubyte, got {_type_name(outcome)}")
    return outcome, end


def _broker_amqp_start(data: bytes, offset: int) -> int | NeedMore:
    """The offset after the broker's sasl-outcome, which must be ok, and the AMQP header that
    follows it; `offset` is where the sasl-outcome starts."""
    found = _broker_outcome(data, offset)
    if found is NEED_MORE:
        return NEED_MORE
    outcome, offset = found
    if outcome != 0:
        raise _err(f"broker rejected authentication: code {outcome} ({sasl_outcome_name(outcome)})")
    if _read_header(data, offset, (AMQP_HEADER,), "broker header after sasl") is NEED_MORE:
        return NEED_MORE
    return offset + _HEADER_SIZE


def sniff_server_sasl_preamble(data: bytes) -> int | NeedMore:
    """Measure a broker's SASL header + sasl-mechanisms + sasl-outcome + AMQP header.

    In proxy mode the router replays the client's SASL header, sasl-init, AMQP header and Open
    to the broker. The client already got the router's own version of everything up to the
    broker's AMQP header, so those leading bytes are dropped and the rest (the broker's Open
    onwards) is relayed.

    Args:
        data: the bytes the broker sent so far.

    Returns:
        How many leading bytes to drop, or NEED_MORE.

    Raises:
        SniffError: the broker answered with another header, sent an unexpected or malformed
            frame (a sasl-challenge: only single-step mechanisms are relayed), or its outcome
            is not ok: "broker rejected authentication: code 1 (auth)".
    """
    if _read_header(data, 0, (SASL_HEADER,), "broker protocol header") is NEED_MORE:
        return NEED_MORE
    mechanisms = _broker_sasl_frame(data, _HEADER_SIZE, _SASL_MECHANISMS)
    if mechanisms is NEED_MORE:
        return NEED_MORE
    return _broker_amqp_start(data, mechanisms[1])


def sniff_server_plain_preamble(data: bytes) -> int | NeedMore:
    """Measure a broker's AMQP header, the answer to a replayed non-SASL client header.

    Args:
        data: the bytes the broker sent so far.

    Returns:
        8, or NEED_MORE.

    Raises:
        SniffError: the broker sent another header (the SASL header when it requires SASL).
    """
    got = _read_header(data, 0, (AMQP_HEADER, SASL_HEADER), "broker protocol header")
    if got is NEED_MORE:
        return NEED_MORE
    if got == SASL_HEADER:
        raise _err(f"broker requires sasl: it answered {got!r} to a client without sasl")
    return _HEADER_SIZE


# ============================================================================================
# The health probe: the client side of a handshake with a broker
# ============================================================================================
#
# The probe speaks first and waits for each answer (§5.3.2): SASL header -> the broker's SASL
# header and sasl-mechanisms; sasl-init -> sasl-outcome; AMQP header + Open -> the broker's AMQP
# header and Open (or a Close with an error); Close -> the broker's Close. Each parser below
# takes everything the broker sent since the connection opened and re-parses it from the start,
# like the sniffers, so the caller keeps one growing buffer and no parser state.


def encode_sasl_init(mechanism: str, initial_response: bytes | None = None) -> bytes:
    """A sasl-init frame (§5.3.3.2): the chosen mechanism and its initial response, no hostname.

    Args:
        mechanism: a mechanism the broker offered, e.g. "PLAIN" or "ANONYMOUS".
        initial_response: the mechanism's first message (`sasl_plain_response` for PLAIN).

    Returns:
        The complete SASL frame.
    """
    response = b"\x40" if initial_response is None else _enc_variable(0xA0, 0xB0, initial_response)
    return _enc_frame(_FRAME_TYPE_SASL, _enc_described(_SASL_INIT, [_enc_symbol(mechanism), response]))


def sasl_plain_response(user_name: str, password: str) -> bytes:
    """The PLAIN initial response (RFC 4616 §2): empty authzid, NUL, authcid, NUL, passwd (UTF-8).

    Raises:
        ValueError: the user name is empty or either value holds a NUL, which PLAIN cannot carry.
    """
    if not user_name:
        raise ValueError("sasl plain needs a non-empty user name")
    if "\x00" in user_name or "\x00" in password:
        raise ValueError("sasl plain user name and password must not contain NUL")
    return b"\x00" + user_name.encode("utf-8") + b"\x00" + password.encode("utf-8")


CLOSE_FRAME: Final = _enc_frame(_FRAME_TYPE_AMQP, _enc_described(_CLOSE, []))
"""A Close without an error (§2.7.9): the polite end of a probe's connection."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerClose:
    """A Close (§2.7.9) the broker sent, with its error (§2.8.14) if it carried one."""

    condition: str | None = None
    """The error condition symbol, e.g. "amqp:unauthorized-access"; None for a clean Close."""
    description: str | None = None
    """The error's description, if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerOpen:
    """The broker's answer to the probe's Open: its own Open, or a Close instead of it."""

    container_id: str | None
    """The broker's container-id; None when it sent Close before any Open."""
    close: BrokerClose | None = None
    """The Close that came instead of the Open (its error says why); None after an Open."""


def _broker_sasl_header(data: bytes) -> bool | NeedMore:
    got = _read_header(data, 0, (SASL_HEADER, AMQP_HEADER), "broker protocol header")
    if got is NEED_MORE:
        return NEED_MORE
    if got == AMQP_HEADER:
        raise _err(f"broker does not offer sasl: it answered the sasl header with {got!r}")
    return True


def _symbols(value: AmqpValue, what: str) -> tuple[str, ...]:
    """A `multiple="true"` symbol field (§1.4): one symbol, an array of them, or null."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, Symbol) for item in items):
        raise _err(f"{what} must be symbols, got {_type_name(value)}")
    return tuple(str(item) for item in items)


def _broker_mechanisms(data: bytes) -> tuple[tuple[str, ...], int] | NeedMore:
    """The broker's SASL header and sasl-mechanisms: (mechanisms, offset after them)."""
    if _broker_sasl_header(data) is NEED_MORE:
        return NEED_MORE
    found = _broker_sasl_frame(data, _HEADER_SIZE, _SASL_MECHANISMS)
    if found is NEED_MORE:
        return NEED_MORE
    fields, end = found
    return _symbols(_field(fields, 0), "sasl-server-mechanisms"), end


def parse_sasl_mechanisms(data: bytes) -> tuple[str, ...] | NeedMore:
    """The mechanisms a broker offers, from the start of its answer to the probe's SASL header.

    Args:
        data: every byte the broker sent so far.

    Returns:
        The mechanism names in the broker's order (§5.3.3.1), or NEED_MORE.

    Raises:
        SniffError: another protocol header (a broker without SASL), a malformed frame, or a
            first frame that is not sasl-mechanisms.
    """
    found = _broker_mechanisms(data)
    return NEED_MORE if found is NEED_MORE else found[0]


def parse_sasl_outcome(data: bytes) -> int | NeedMore:
    """The sasl-code of the broker's sasl-outcome (§5.3.3.6: 0 ok, 1 auth, 2 sys, 3 sys-perm,
    4 sys-temp), after its mechanisms.

    Args:
        data: every byte the broker sent so far.

    Returns:
        The code, or NEED_MORE.

    Raises:
        SniffError: malformed frames, or a sasl-challenge instead of the outcome.
    """
    found = _broker_mechanisms(data)
    if found is NEED_MORE:
        return NEED_MORE
    outcome = _broker_outcome(data, found[1])
    return NEED_MORE if outcome is NEED_MORE else outcome[0]


def sasl_outcome_name(code: int) -> str:
    """The name of a sasl-code (§5.3.3.6), e.g. "auth" for 1; "unknown" for others."""
    return _SASL_OUTCOME_CODES.get(code, "unknown")


def _broker_frames(data: bytes, *, until_close: bool) -> list[tuple[int | None, list[AmqpValue]]] | NeedMore:
    """The complete performatives the broker sent after SASL ok and its AMQP header, empty frames
    (heartbeats, §2.4.5) skipped, up to the first one (`until_close`: the first Close); the bytes
    after it are not read, so they cannot change the answer. NEED_MORE until the AMQP header is
    complete."""
    found = _broker_mechanisms(data)
    if found is NEED_MORE:
        return NEED_MORE
    offset = _broker_amqp_start(data, found[1])
    if offset is NEED_MORE:
        return NEED_MORE
    performatives: list[tuple[int | None, list[AmqpValue]]] = []
    while True:
        frame = _next_frame(data, offset, _FRAME_TYPE_AMQP, "an amqp")
        if frame is NEED_MORE:
            return performatives
        offset += frame.size
        if frame.body:
            performatives.append(decode_performative(frame))
            if not until_close or performatives[-1][0] == _CLOSE:
                return performatives


def _close_of(fields: list[AmqpValue]) -> BrokerClose:
    """The error of a Close (§2.7.9, §2.8.14): condition and description."""
    error = _field(fields, 0)
    if error is None:
        return BrokerClose()
    if not isinstance(error, Described) or not isinstance(error.value, list):
        raise _err(f"close error must be a described list, got {_type_name(error)}")
    if _descriptor_code(error.descriptor) != _ERROR:
        raise _err(f"close error has descriptor {_describe_code(_descriptor_code(error.descriptor))}")
    condition = _field(error.value, 0)
    if not isinstance(condition, Symbol):
        raise _err(f"close error condition must be a symbol, got {_type_name(condition)}")
    description = _field(error.value, 1)
    if description is not None and (not isinstance(description, str) or isinstance(description, Symbol)):
        raise _err(f"close error description must be a string, got {_type_name(description)}")
    return BrokerClose(condition=str(condition), description=description)


def parse_broker_open(data: bytes) -> BrokerOpen | NeedMore:
    """The broker's answer to the probe's AMQP header and Open: its Open, or a Close before it.

    Args:
        data: every byte the broker sent so far, from its SASL header on.

    Returns:
        NEED_MORE until the first performative after the broker's AMQP header is complete.

    Raises:
        SniffError: malformed frames, a sasl-outcome other than ok, another header, or a first
            performative that is neither Open nor Close.
    """
    performatives = _broker_frames(data, until_close=False)
    if performatives is NEED_MORE or not performatives:
        return NEED_MORE
    code, fields = performatives[0]
    if code == _CLOSE:
        return BrokerOpen(container_id=None, close=_close_of(fields))
    if code != _OPEN:
        raise _err(f"broker sent {_describe_code(code)} where open was expected")
    container_id = _field(fields, 0)
    if not isinstance(container_id, str) or isinstance(container_id, Symbol):
        raise _err(f"broker open container-id must be a string, got {_type_name(container_id)}")
    return BrokerOpen(container_id=container_id)


def parse_broker_close(data: bytes) -> BrokerClose | NeedMore:
    """The first Close the broker sent after its AMQP header: its answer to the probe's Close, or
    the Close with an error that it sent on its own right after its Open.

    Args:
        data: every byte the broker sent so far, from its SASL header on.

    Returns:
        The Close, or NEED_MORE.

    Raises:
        SniffError: malformed frames or a sasl-outcome other than ok.
    """
    performatives = _broker_frames(data, until_close=True)
    if performatives is NEED_MORE:
        return NEED_MORE
    for code, fields in performatives:
        if code == _CLOSE:
            return _close_of(fields)
    return NEED_MORE
