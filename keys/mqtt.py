"""The MQTT sniffer (CONNECT of MQTT 3.1, 3.1.1 and 5) and the CONNACK the router answers with.

`MqttSniffer.sniff` is a pure function of the bytes a client has sent so far (STYLE R1): it
returns NEED_MORE until the whole CONNECT packet is there, then the client identifier, user name,
password, protocol version and keep-alive; bytes after the CONNECT are ignored (the router replays
them to the target unchanged). `encode_connack` builds the refusal or redirect of SPEC A6. The
health probe's side of a session is here too: `encode_connect`, `parse_connack`, and
`encode_subscribe` / `parse_subscribed_value` to read a broker's retained `$SYS` connection
count. No I/O, no state, no clock.

References: MQTT 3.1 (IBM/Eurotech, 2010), MQTT 3.1.1 (OASIS, 2014) §2.2 fixed header, §3.1
CONNECT, §3.2 CONNACK, §3.3 PUBLISH, §3.8 SUBSCRIBE, §3.9 SUBACK; MQTT 5.0 (OASIS, 2019) §1.5
data types, §3.1 CONNECT, §3.2 CONNACK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from keys.sniff import NEED_MORE, NeedMore, Sniffed, SniffError, WireProtocol

if TYPE_CHECKING:
    from keys.sniff import SniffResult

__all__ = [
    "MQTT_DISCONNECT",
    "MQTT_V5_NOT_AUTHORIZED",
    "MQTT_V5_SERVER_SHUTTING_DOWN",
    "MQTT_V5_SERVER_UNAVAILABLE",
    "MQTT_V5_USE_ANOTHER_SERVER",
    "PROTOCOL_LEVELS",
    "SYS_CLIENTS_CONNECTED",
    "MqttSniffer",
    "encode_connack",
    "encode_connack_v3_as_artemis",
    "encode_connect",
    "encode_disconnect_v5",
    "encode_subscribe",
    "parse_connack",
    "parse_subscribed_value",
]

_NAME: Final = WireProtocol.MQTT.value

MQTT_V5_USE_ANOTHER_SERVER: Final = 0x9C
"""CONNACK reason "Use another server" (MQTT 5 §3.2.2.2): REFUSED_USE_ANOTHER and redirects."""
MQTT_V5_SERVER_UNAVAILABLE: Final = 0x88
"""CONNACK reason "Server unavailable" (MQTT 5 §3.2.2.2): REFUSED_UNAVAILABLE."""
MQTT_V5_NOT_AUTHORIZED: Final = 0x87
"""CONNACK reason "Not authorized" (MQTT 5 §3.2.2.2)."""

PROTOCOL_LEVELS: Final = {"3.1": 3, "3.1.1": 4, "5": 5}
"""`Sniffed.protocol_version` -> the protocol level to pass to `encode_connack`."""

_CONNECT_FIRST_BYTE: Final = 0x10
"""Packet type 1 (CONNECT) in the high nibble, flags 0000 in the low one: the flags of CONNECT are
reserved and must be 0 (MQTT 3.1.1 §2.2.2, MQTT 5 §2.1.3)."""

_CONNACK_FIRST_BYTE: Final = 0x20
"""Packet type 2 (CONNACK), flags 0 (MQTT 3.1.1 §3.2.1, MQTT 5 §3.2.1)."""

_MAX_FIXED_HEADER: Final = 5
"""One type-and-flags byte plus a remaining length of at most 4 bytes (MQTT 3.1.1 §2.2.3)."""

_VARINT_MAX_BYTES: Final = 4
"""A variable byte integer has at most 4 bytes (MQTT 3.1.1 §2.2.3, MQTT 5 §1.5.5)."""

_VERSIONS: Final = {(b"MQIsdp", 3): "3.1", (b"MQTT", 4): "3.1.1", (b"MQTT", 5): "5"}
"""Protocol name and level pairs: MQTT 3.1 §3.1 ("MQIsdp", 3), MQTT 3.1.1 §3.1.2.1-2 ("MQTT", 4),
MQTT 5 §3.1.2.1-2 ("MQTT", 5)."""

_BRIDGE_BIT: Final = 0x80
"""Set in the protocol level by bridges (mosquitto `try_private`, EMQX `bridge_mode`, MQTTnet):
a de-facto extension for levels 3 and 4 that the brokers behind us accept, so we accept it too."""

# Connect flags, MQTT 3.1.1 §3.1.2.3 / MQTT 5 §3.1.2.3 (bit 1, clean session/start, not needed).
_FLAG_RESERVED: Final = 0x01
_FLAG_WILL: Final = 0x04
_FLAG_WILL_QOS: Final = 0x18
_FLAG_WILL_RETAIN: Final = 0x20
_FLAG_PASSWORD: Final = 0x40
_FLAG_USER_NAME: Final = 0x80

_CONNACK_V5_REASONS: Final = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C}
    | {0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
"""The reason codes a CONNACK may carry (MQTT 5 §3.2.2.2)."""

_V3_RETURN_CODES: Final = {
    0x00: 0x00,  # Success -> Connection Accepted
    0x84: 0x01,  # Unsupported Protocol Version -> unacceptable protocol version
    0x85: 0x02,  # Client Identifier not valid -> identifier rejected
    0x88: 0x03,  # Server unavailable -> Server unavailable
    0x89: 0x03,  # Server busy -> Server unavailable
    0x9C: 0x03,  # Use another server -> Server unavailable (3.1.1 has no redirect)
    0x9D: 0x03,  # Server moved -> Server unavailable
    0x86: 0x04,  # Bad User Name or Password -> bad user name or password
    0x87: 0x05,  # Not authorized -> not authorized
}
"""MQTT 5 CONNACK reason codes (§3.2.2.2) -> MQTT 3.1 / 3.1.1 return codes (3.1.1 §3.2.2.3),
which are 0 to 5 only."""

_PROPERTY_SERVER_REFERENCE: Final = 0x1C
"""Server Reference property identifier, a UTF-8 string (MQTT 5 §3.2.2.3.16, §4.11)."""

_MAX_TWO_BYTE_LENGTH: Final = 0xFFFF
"""UTF-8 strings and binary data carry a 2-byte length (MQTT 3.1.1 §1.5.3, MQTT 5 §1.5.4, §1.5.6)."""


_UNACCEPTABLE_PROTOCOL_VERSION: Final = bytes((_CONNACK_FIRST_BYTE, 2, 0, 0x01))
"""CONNACK, no session present, return code 0x01 "unacceptable protocol version" (MQTT 3.1.1
§3.2.2.3)."""


class _Incomplete(Exception):
    """The packet goes on beyond the bytes received so far (internal; becomes NEED_MORE)."""


class _PacketReader:
    """Reads the fields of one packet that ends at `end`.

    Reading past `end` is a SniffError (a field claims more than the remaining length holds);
    reading past the bytes received so far, while still inside the packet, raises _Incomplete.
    Parsing the received prefix this way rejects garbage without waiting for the whole packet.
    """

    __slots__ = ("_data", "_end", "pos")

    def __init__(self, data: bytes, start: int, end: int) -> None:
        self._data = data
        self._end = end
        self.pos = start

    def take(self, n: int, what: str) -> bytes:
        stop = self.pos + n
        if stop > self._end:
            raise SniffError(
                _NAME, f"{what} at offset {self.pos} overruns the packet, which ends at offset {self._end}"
            )
        if stop > len(self._data):
            raise _Incomplete
        chunk = self._data[self.pos : stop]
        self.pos = stop
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int.from_bytes(self.take(2, what), "big")

    def varint(self, what: str) -> int:
        """A variable byte integer: 7 bits a byte, least significant first, high bit = "more"
        (MQTT 3.1.1 §2.2.3, MQTT 5 §1.5.5). Non-minimal encodings are accepted."""
        value = 0
        for i in range(_VARINT_MAX_BYTES):
            byte = self.u8(what)
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                return value
        raise SniffError(_NAME, f"{what} exceeds {_VARINT_MAX_BYTES} bytes")

    def length_prefixed(self, what: str) -> bytes:
        """UTF-8 string or binary data: a 2-byte length, then the bytes (MQTT 3.1.1 §1.5.3)."""
        return self.take(self.u16(f"{what} length"), what)

    def utf8(self, what: str) -> str:
        """A UTF-8 encoded string: well-formed UTF-8 without U+0000 (MQTT 3.1.1 §1.5.3, MQTT 5
        §1.5.4); Python's strict codec already rejects surrogates and overlong forms."""
        raw = self.length_prefixed(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SniffError(_NAME, f"{what} is not valid UTF-8: {raw[:32].hex()}") from None
        if "\x00" in text:
            raise SniffError(_NAME, f"{what} contains U+0000: {raw[:32].hex()}")
        return text


class MqttSniffer:
    """Sniffs an MQTT CONNECT (3.1, 3.1.1, 5): client id, user name, password, version, keep-alive."""

    name = _NAME

    def looks_like(self, prefix: bytes) -> bool:
        """Whether the connection starts like a CONNECT: its first byte is 0x10.

        No other protocol the router sniffs starts with 0x10 (AMQP "A", STOMP "C"/"S", OpenWire
        0x00, TLS 0x16).

        Args:
            prefix: the first bytes of the connection, possibly only one.

        Returns:
            True if the first byte is 0x10; False otherwise and for an empty prefix. Never raises.
        """
        return prefix[:1] == bytes((_CONNECT_FIRST_BYTE,))

    def announced_size(self, data: bytes) -> int | None:
        """The CONNECT's whole size (fixed header plus remaining length) once the remaining length
        has arrived; None before, and for bytes that are not a CONNECT (`sniff` says why).

        Args:
            data: every byte the client has sent so far.
        """
        header = _PacketReader(data, 0, _MAX_FIXED_HEADER)
        try:
            if header.u8("packet type") != _CONNECT_FIRST_BYTE:
                return None
            remaining = header.varint("remaining length")
        except (_Incomplete, SniffError):
            return None
        return header.pos + remaining

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the CONNECT packet at the start of `data`.

        Args:
            data: every byte the client has sent so far.

        Returns:
            NEED_MORE until the whole CONNECT is there, then Sniffed with `client_id` (None for
            the empty client id a server is asked to assign), `user_name`, `password` (None if
            absent or not UTF-8), `protocol_version` ("3.1", "3.1.1" or "5") and `keepalive_s`.

        Raises:
            SniffError: the bytes are not a valid CONNECT; the reason names the field.
        """
        try:
            return _parse_connect(data)
        except _Incomplete:
            return NEED_MORE


def _parse_connect(data: bytes) -> Sniffed:
    """Parse a CONNECT; raises _Incomplete if `data` stops inside it."""
    header = _PacketReader(data, 0, _MAX_FIXED_HEADER)
    first = header.u8("packet type")
    if first != _CONNECT_FIRST_BYTE:
        raise SniffError(_NAME, f"first byte must be 0x10 (CONNECT, flags 0), got 0x{first:02x}")
    remaining = header.varint("remaining length")
    packet = _PacketReader(data, header.pos, header.pos + remaining)

    # Variable header: MQTT 3.1.1 §3.1.2, MQTT 5 §3.1.2.
    name_len = packet.u16("protocol name length")
    if name_len not in (4, 6):
        raise SniffError(_NAME, f"protocol name length {name_len} fits neither 'MQTT' nor 'MQIsdp'")
    protocol_name = packet.take(name_len, "protocol name")
    if protocol_name not in (b"MQTT", b"MQIsdp"):
        raise SniffError(_NAME, f"unknown protocol name {protocol_name!r}")
    level = packet.u8("protocol level")
    bridge = bool(level & _BRIDGE_BIT) and (level & ~_BRIDGE_BIT) in (3, 4)
    version = _VERSIONS.get((protocol_name, level & ~_BRIDGE_BIT if bridge else level))
    if version is None:
        # MQTT 3.1.1 §3.1.2.2 [MQTT-3.1.2-2]: the server answers a level it does not support with
        # CONNACK 0x01 (unacceptable protocol version) and disconnects, as mosquitto does (with a
        # 3.1.1 CONNACK whatever the level; MQTT 5 §3.1.2.2 allows that for unknown levels).
        raise SniffError(
            _NAME,
            f"protocol level {level} does not go with protocol name {protocol_name!r}",
            answer=_UNACCEPTABLE_PROTOCOL_VERSION,
        )
    v5 = version == "5"

    flags = packet.u8("connect flags")
    if flags & _FLAG_RESERVED:
        # MQTT 3.1.1 §3.1.2.3 [MQTT-3.1.2-3], MQTT 5 §3.1.2.3: the reserved flag must be 0.
        raise SniffError(_NAME, f"reserved connect flag (bit 0) is set: flags 0x{flags:02x}")
    will = bool(flags & _FLAG_WILL)
    will_qos = (flags & _FLAG_WILL_QOS) >> 3
    if not will and flags & (_FLAG_WILL_QOS | _FLAG_WILL_RETAIN):
        # MQTT 3.1.1 §3.1.2.6-7 [MQTT-3.1.2-13, -15], MQTT 5 §3.1.2.6-7: no will, no will QoS/retain.
        raise SniffError(_NAME, f"will qos or will retain set without the will flag: flags 0x{flags:02x}")
    if will_qos == 3:
        # MQTT 3.1.1 §3.1.2.6 [MQTT-3.1.2-14], MQTT 5 §3.1.2.6: will QoS 3 is malformed.
        raise SniffError(_NAME, f"will qos is 3: flags 0x{flags:02x}")
    has_user = bool(flags & _FLAG_USER_NAME)
    has_password = bool(flags & _FLAG_PASSWORD)
    if has_password and not has_user and not v5:
        # MQTT 3.1.1 §3.1.2.9 [MQTT-3.1.2-22] (and MQTT 3.1 §3.1 "Password flag"): no password
        # without a user name. MQTT 5 §3.1.2.9 allows it.
        raise SniffError(
            _NAME,
            f"password flag without user name flag is not allowed in MQTT {version}: flags 0x{flags:02x}",
        )
    keepalive = packet.u16("keep alive")
    if v5:
        # MQTT 5 §3.1.2.11: CONNECT properties, a variable byte integer length; skipped.
        packet.take(packet.varint("connect properties length"), "connect properties")

    # Payload, in this order: MQTT 3.1.1 §3.1.3, MQTT 5 §3.1.3.
    client_id = packet.utf8("client identifier")
    if will:
        if v5:
            # MQTT 5 §3.1.3.2: will properties, skipped like the CONNECT properties.
            packet.take(packet.varint("will properties length"), "will properties")
        packet.length_prefixed("will topic")
        packet.length_prefixed("will payload")
    user_name = packet.utf8("user name") if has_user else None
    password = _decode_password(packet.length_prefixed("password")) if has_password else None

    leftover = header.pos + remaining - packet.pos
    if leftover:
        raise SniffError(_NAME, f"extra bytes after the connect payload: {leftover}")
    return Sniffed(
        protocol=WireProtocol.MQTT,
        # MQTT 3.1.1 §3.1.3.1, MQTT 5 §3.1.3.1: a zero-length client id asks the server for one.
        client_id=client_id or None,
        user_name=user_name,
        password=password,
        protocol_version=version,
        keepalive_s=keepalive,
    )


def _decode_password(raw: bytes) -> str | None:
    """The password is binary data (MQTT 3.1.1 §3.1.3.5, MQTT 5 §3.1.3.6); keep it only as text."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _encode_varint(value: int) -> bytes:
    """A variable byte integer (MQTT 3.1.1 §2.2.3, MQTT 5 §1.5.5), minimal length."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _packet(first_byte: int, body: bytes) -> bytes:
    """A packet: its fixed header (type and flags, remaining length; MQTT 3.1.1 §2.2), then `body`."""
    return bytes((first_byte,)) + _encode_varint(len(body)) + body


def encode_connack_v3_as_artemis(reason_code: int) -> bytes:
    """A 3.1/3.1.1 CONNACK carrying an MQTT 5 reason code unchanged, as Artemis sends it (SPEC A6).

    MQTT 3.1.1 §3.2.2.3 only defines return codes 0-5, but Artemis's router answers 3.1.1 clients
    in redirect-only mode with 0x9C (use another server) and 0x88 (server unavailable) all the
    same; SPEC A6 asks for the same codes, so clients written against Artemis see what they expect.
    `encode_connack` is the mapped alternative.

    Args:
        reason_code: 0x9C, 0x88 or 0x87.

    Returns:
        The whole CONNACK packet.

    Raises:
        ValueError: any other code.
    """
    if reason_code not in (MQTT_V5_USE_ANOTHER_SERVER, MQTT_V5_SERVER_UNAVAILABLE, MQTT_V5_NOT_AUTHORIZED):
        raise ValueError(f"reason code 0x{reason_code:02x} is not one Artemis sends to mqtt 3.1.1 clients")
    # MQTT 3.1.1 §3.2: acknowledge flags 0, the code in the return-code byte.
    return _packet(_CONNACK_FIRST_BYTE, bytes((0, reason_code)))


def encode_connack(reason_code: int, *, protocol_level: int, server_reference: str | None = None) -> bytes:
    """Build the CONNACK that answers a client's CONNECT (SPEC A6), with session present 0.

    `reason_code` is an MQTT 5 CONNACK reason code (MQTT 5 §3.2.2.2). MQTT 3.1 and 3.1.1 only
    know return codes 0 to 5 (3.1.1 §3.2.2.3), so for protocol levels 3 and 4 it is mapped:

    - 0x00 Success -> 0x00 Connection Accepted
    - 0x9C Use another server, 0x9D Server moved, 0x88 Server unavailable, 0x89 Server busy
      -> 0x03 Server unavailable (3.1.1 has no redirect)
    - 0x87 Not authorized -> 0x05 Not authorized
    - 0x86 Bad User Name or Password -> 0x04; 0x84 Unsupported Protocol Version -> 0x01;
      0x85 Client Identifier not valid -> 0x02

    and `server_reference` is dropped: those versions have no properties. For level 5 the reason
    code is written as given and `server_reference`, when given, becomes the Server Reference
    property (0x1C, MQTT 5 §3.2.2.3.16), normally `host:port` with 0x9C or 0x9D (§4.11).

    Args:
        reason_code: the MQTT 5 reason code, e.g. MQTT_V5_USE_ANOTHER_SERVER.
        protocol_level: 3 (MQTT 3.1), 4 (3.1.1) or 5, see PROTOCOL_LEVELS.
        server_reference: where the client should connect instead (level 5 only).

    Returns:
        The whole CONNACK packet.

    Raises:
        ValueError: an unknown protocol level, a reason code a CONNACK cannot carry (or, for levels
            3 and 4, one without a 3.1.1 equivalent), or a server reference that is too long or
            contains U+0000.
    """
    if protocol_level in (3, 4):
        return_code = _V3_RETURN_CODES.get(reason_code)
        if return_code is None:
            raise ValueError(f"reason code 0x{reason_code:02x} has no mqtt 3.1.1 connack return code")
        # MQTT 3.1.1 §3.2: acknowledge flags 0, return code.
        return _packet(_CONNACK_FIRST_BYTE, bytes((0, return_code)))
    if protocol_level != 5:
        raise ValueError(f"unknown mqtt protocol level {protocol_level!r}, expected 3, 4 or 5")
    if reason_code not in _CONNACK_V5_REASONS:
        raise ValueError(f"reason code 0x{reason_code:02x} is not an mqtt 5 connack reason code")
    properties = _server_reference_property(server_reference)
    # MQTT 5 §3.2.2: acknowledge flags 0, reason code, properties with their length.
    variable_header = bytes((0, reason_code)) + _encode_varint(len(properties)) + properties
    return _packet(_CONNACK_FIRST_BYTE, variable_header)


def _server_reference_property(server_reference: str | None) -> bytes:
    """The Server Reference property (0x1C, MQTT 5 §3.2.2.3.16), or nothing for None."""
    if server_reference is None:
        return b""
    encoded = server_reference.encode("utf-8")
    if len(encoded) > _MAX_TWO_BYTE_LENGTH:
        raise ValueError(f"server reference of {len(encoded)} bytes exceeds {_MAX_TWO_BYTE_LENGTH}")
    if "\x00" in server_reference:
        raise ValueError(f"server reference contains U+0000: {server_reference[:32]!r}")
    return bytes((_PROPERTY_SERVER_REFERENCE,)) + len(encoded).to_bytes(2, "big") + encoded


MQTT_V5_SERVER_SHUTTING_DOWN: Final = 0x8B
"""DISCONNECT reason code "Server shutting down" (MQTT 5 §3.14.2.1)."""

_SERVER_DISCONNECT_REASONS: Final = frozenset({MQTT_V5_USE_ANOTHER_SERVER, MQTT_V5_SERVER_SHUTTING_DOWN})
_DISCONNECT_FIRST_BYTE: Final = 0xE0


def encode_disconnect_v5(reason_code: int, *, server_reference: str | None = None) -> bytes:
    """An MQTT 5 DISCONNECT sent by the server (MQTT 5 §3.14): how a broker, or the router on its
    behalf, asks a connected client to go elsewhere (0x9C Use another server, with the Server
    Reference property `host:port` when given, §4.11) or says it is shutting down (0x8B).
    MQTT 3.1.1 has no DISCONNECT from the server: closing is all it can be told.

    Raises:
        ValueError: another reason code, or a bad server reference (see `encode_connack`).
    """
    if reason_code not in _SERVER_DISCONNECT_REASONS:
        raise ValueError(f"reason code 0x{reason_code:02x} is not a disconnect reason the router sends")
    properties = _server_reference_property(server_reference)
    return _packet(
        _DISCONNECT_FIRST_BYTE, bytes((reason_code,)) + _encode_varint(len(properties)) + properties
    )


def _utf8_field(text: str) -> bytes:
    encoded = text.encode("utf-8")
    if len(encoded) > _MAX_TWO_BYTE_LENGTH:
        raise ValueError(f"mqtt string of {len(encoded)} bytes exceeds {_MAX_TWO_BYTE_LENGTH}")
    return len(encoded).to_bytes(2, "big") + encoded


def encode_connect(
    client_id: str, *, user_name: str | None = None, password: str | None = None, keepalive_s: int = 60
) -> bytes:
    """An MQTT 3.1.1 CONNECT with clean session (MQTT 3.1.1 §3.1), as the router's health probe sends.

    Raises:
        ValueError: a field too long for MQTT, or a password without a user name (§3.1.2.9).
    """
    if password is not None and user_name is None:
        raise ValueError("mqtt 3.1.1 has no password without a user name")
    flags = 0x02  # clean session
    payload = _utf8_field(client_id)
    if user_name is not None:
        flags |= _FLAG_USER_NAME
        payload += _utf8_field(user_name)
    if password is not None:
        flags |= _FLAG_PASSWORD
        payload += _utf8_field(password)
    body = _utf8_field("MQTT") + bytes((4, flags)) + keepalive_s.to_bytes(2, "big") + payload
    return _packet(_CONNECT_FIRST_BYTE, body)


MQTT_DISCONNECT: Final = b"\xe0\x00"
"""DISCONNECT with no reason (MQTT 3.1.1 §3.14): the polite end of a probe session."""


def parse_connack(data: bytes) -> int | NeedMore:
    """The return/reason code of a CONNACK at the start of `data` (3.1.1 §3.2, 5 §3.2).

    Raises:
        SniffError: the first packet is not a CONNACK.
    """
    if not data:
        return NEED_MORE
    if data[0] != _CONNACK_FIRST_BYTE:
        raise SniffError(_NAME, f"expected CONNACK, got packet type byte 0x{data[0]:02x}")
    header = _PacketReader(data, 1, _MAX_FIXED_HEADER)
    try:
        # The remaining length is one byte in 3.1.1 (2); in 5 the properties make it longer.
        length = header.varint("CONNACK remaining length")
        body = _PacketReader(data, header.pos, header.pos + length)
        body.u8("CONNACK acknowledge flags")
        return body.u8("CONNACK return code")
    except _Incomplete:
        return NEED_MORE


SYS_CLIENTS_CONNECTED: Final = "$SYS/broker/clients/connected"
"""Mosquitto's retained count of connected clients, republished every `sys_interval` seconds
(default 10), so as old as that; the health probe reads it for LEAST_CONNECTIONS."""

_SUBSCRIBE_FIRST_BYTE: Final = 0x82
"""Packet type 8 (SUBSCRIBE) with the reserved flags 0010 (MQTT 3.1.1 §3.8.1)."""
_SUBACK_TYPE: Final = 9
_PUBLISH_TYPE: Final = 3
_SUBACK_FAILURE: Final = 0x80
"""SUBACK return code "Failure" (MQTT 3.1.1 §3.9.3)."""


def encode_subscribe(packet_id: int, topic_filter: str) -> bytes:
    """A SUBSCRIBE to one topic filter at QoS 0 (MQTT 3.1.1 §3.8).

    Raises:
        ValueError: a packet id outside 1-65535 (§2.3.1) or a filter too long for MQTT.
    """
    if not 0 < packet_id <= _MAX_TWO_BYTE_LENGTH:
        raise ValueError(f"mqtt packet id must be 1-65535, got {packet_id!r}")
    return _packet(_SUBSCRIBE_FIRST_BYTE, packet_id.to_bytes(2, "big") + _utf8_field(topic_filter) + b"\x00")


def parse_subscribed_value(data: bytes, *, topic: str, packet_id: int) -> bytes | NeedMore:
    """The payload of the first PUBLISH to `topic` a broker sent, e.g. a retained message it
    delivers right after subscribing (MQTT 3.1.1 §3.3.1.3).

    Packets are walked from the start of `data` (the CONNACK included) by their fixed headers
    (§2.2); anything but SUBACK and PUBLISH is skipped.

    Args:
        data: every byte the broker sent so far.
        topic: the topic name wanted.
        packet_id: the id of the SUBSCRIBE, whose SUBACK must not report a failure.

    Returns:
        The payload, or NEED_MORE.

    Raises:
        SniffError: a malformed packet, or a SUBACK refusing the subscription (e.g. an ACL).
    """
    pos = 0
    while pos < len(data):
        header = _PacketReader(data, pos, pos + _MAX_FIXED_HEADER)
        try:
            first = header.u8("packet type")
            length = header.varint("remaining length")
        except _Incomplete:
            return NEED_MORE
        end = header.pos + length
        if len(data) < end:
            return NEED_MORE
        body = _PacketReader(data, header.pos, end)
        if first >> 4 == _SUBACK_TYPE:
            if body.u16("SUBACK packet id") == packet_id and _SUBACK_FAILURE in data[body.pos : end]:
                raise SniffError(_NAME, f"broker refused the subscription to {topic!r}")
        elif first >> 4 == _PUBLISH_TYPE:
            name = body.utf8("PUBLISH topic name")
            if first & 0x06:  # QoS 1 or 2: a packet id follows the topic (§3.3.2.2)
                body.u16("PUBLISH packet id")
            if name == topic:
                return data[body.pos : end]
        pos = end
    return NEED_MORE
