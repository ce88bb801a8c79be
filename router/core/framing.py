"""Where the frames of a proxied connection end, so the router can speak to its client mid-stream.

An evacuation (router/features/moves/) asks a connected client to go elsewhere in its own
protocol: MQTT 5 DISCONNECT 0x9C, AMQP 1.0 Close `amqp:connection:redirect`, OpenWire
`ConnectionControl`. Those words may only be written between two of the broker's frames, so every
proxied connection whose protocol the router knows (its opening was sniffed) carries a
`FrameCursor` that follows the frame boundaries of the broker-to-client direction as the relay
passes the bytes. What it costs is a few integer operations per frame, on that direction only;
connections whose opening was not read (SOURCE_IP in proxy mode) carry none and can only be closed.

    protocol     frames                                           cursor
    MQTT         type byte, remaining length (1-4 byte varint)   MqttFrames
    AMQP 1.0     4-byte size including itself; 8-byte headers     SizePrefixedFrames(amqp=True)
    OpenWire     4-byte size after itself (unless disabled)       SizePrefixedFrames()

The relay starts every cursor at a boundary: the broker's side of a replayed opening is measured
and dropped before relaying (router/core/answers.py `target_preamble_measure`), and MQTT and
STOMP brokers speak only after the client. `Farewell` is what the client is told, chosen by
`farewell`; whether the broker has sent its first frame yet matters (an MQTT client must get
a CONNACK before a DISCONNECT; an AMQP client must get an Open before a Close).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, assert_never

from keys import WireProtocol, amqp, mqtt, openwire
from router.config.settings import AcceptorMode

if TYPE_CHECKING:
    from keys import Sniffed
    from pools import Connector

__all__ = [
    "Farewell",
    "FrameCursor",
    "MqttFrames",
    "SizePrefixedFrames",
    "farewell",
    "frame_cursor",
    "openwire_format",
]

_MQTT_VARINT_MAX_BYTES: Final = 4
_AMQP_HEADER: Final = b"AMQP"
_AMQP_HEADER_SIZE: Final = 8
_AMQP_MIN_FRAME: Final = 8
"""An AMQP frame is at least its 8-byte header (AMQP 1.0 §2.3.1)."""


class FrameCursor(Protocol):
    """Follows the frame boundaries of one direction of a connection.

    `lost` turns True when the bytes cannot be frames of the protocol (the broker speaks something
    else); a lost cursor never finds a boundary again, and the client can then only be closed.
    """

    frames: int
    """Frames completed so far (protocol headers not counted)."""
    lost: bool

    @property
    def at_boundary(self) -> bool:
        """Whether every byte fed so far belongs to complete frames."""
        ...

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Follow bytes passed on to the client."""
        ...

    def cut(self, data: bytes | bytearray | memoryview) -> int | None:
        """How many of `data`'s leading bytes complete the frame under way (0 at a boundary), having
        followed them; None when the frame does not end within `data` (all of it followed)."""
        ...


class _Frames:
    """What every cursor has: the frame under way, a header split over two reads, the count; each
    protocol's `_scan` follows its own headers (one loop each: a shared loop calling a header
    method per frame cost 25-60 % more per frame, and this runs on every frame relayed)."""

    __slots__ = ("_head", "_left", "frames", "lost")

    def __init__(self) -> None:
        self.frames = 0
        self.lost = False
        self._left = 0
        """Bytes of the frame under way still to come (its header complete)."""
        self._head = b""
        """The part of a header that came so far (empty at a boundary or inside a body)."""

    @property
    def at_boundary(self) -> bool:
        return not self._left and not self._head and not self.lost

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._scan(data, stop=False)

    def cut(self, data: bytes | bytearray | memoryview) -> int | None:
        return self._scan(data, stop=True)

    def _scan(self, data: bytes | bytearray | memoryview, *, stop: bool) -> int | None:
        """Follow `data`; with `stop`, up to the first boundary (see `cut`)."""
        raise NotImplementedError


class MqttFrames(_Frames):
    """MQTT control packets (MQTT 3.1.1 §2.2, MQTT 5 §2.1): a type byte, then the remaining length
    as a variable byte integer of 1 to 4 bytes, then that many bytes."""

    __slots__ = ()

    @classmethod
    def resumed(cls, frames: int, left: int, head: bytes, lost: bool) -> MqttFrames:
        """A cursor where another follower of the same bytes stopped (the native core's, for a
        connection it carried alone until now): its frames, the bytes of the frame under way still
        to come, the part of a header that came, whether it is lost."""
        cursor = cls()
        cursor.frames, cursor._left, cursor._head, cursor.lost = frames, left, head, lost
        return cursor

    def _scan(self, data: bytes | bytearray | memoryview, *, stop: bool) -> int | None:
        if self.lost:
            return None
        if stop and self.at_boundary:
            return 0
        n = len(data)
        i = 0
        left = self._left
        while True:
            if left:
                if left > n - i:
                    self._left = left - (n - i)
                    return None
                i += left
                left = 0
                self.frames += 1
                if stop:
                    self._left = 0
                    return i
            if i >= n:
                self._left = 0
                return None
            if not self._head and i + 1 < n and data[i + 1] < 0x80:  # most packets: a 1-byte length
                left = data[i + 1]
                i += 2
                if not left:
                    self.frames += 1
                    if stop:
                        self._left = 0
                        return i
                continue
            # A header: from the part kept from the last read, or from `data` at i.
            head = self._head + bytes(data[i : i + 1 + _MQTT_VARINT_MAX_BYTES - len(self._head)])
            length, multiplier, used = 0, 1, 0
            for used in range(1, len(head)):
                byte = head[used]
                length += (byte & 0x7F) * multiplier
                multiplier <<= 7
                if not byte & 0x80:
                    break
            else:
                if len(head) >= 1 + _MQTT_VARINT_MAX_BYTES:  # a fifth length byte: not MQTT
                    self.lost = True
                    return None
                self._head = head  # the header goes on in the next read
                self._left = 0
                return None
            i += used + 1 - len(self._head)
            self._head = b""
            left = length
            if not left:
                self.frames += 1
                if stop:
                    self._left = 0
                    return i


class SizePrefixedFrames(_Frames):
    """Frames led by a 4-byte big-endian size: AMQP 1.0 (§2.3.1, the size counts itself, and the
    8-byte protocol headers `AMQP…` appear between frames) or OpenWire (the size of what follows)."""

    __slots__ = ("_amqp",)

    def __init__(self, *, amqp: bool = False) -> None:
        super().__init__()
        self._amqp = amqp

    def _scan(self, data: bytes | bytearray | memoryview, *, stop: bool) -> int | None:
        if self.lost:
            return None
        if stop and self.at_boundary:
            return 0
        n = len(data)
        i = 0
        left = self._left
        while True:
            if left:
                if left > n - i:
                    self._left = left - (n - i)
                    return None
                i += left
                left = 0
                self.frames += 1
                if stop:
                    self._left = 0
                    return i
            if i >= n:
                self._left = 0
                return None
            want = 4 - len(self._head)
            head = self._head + bytes(data[i : i + want])
            if len(head) < 4:
                self._head = head
                self._left = 0
                return None
            i += want
            self._head = b""
            if self._amqp and head == _AMQP_HEADER:
                left = _AMQP_HEADER_SIZE - 4
                if left > n - i:
                    self._left = left - (n - i)
                    self.frames -= 1  # a header is not a frame: completing it counts one back
                    return None
                i += left
                left = 0
                continue
            size = int.from_bytes(head, "big")
            if self._amqp:
                if size < _AMQP_MIN_FRAME:
                    self.lost = True
                    return None
                size -= 4
            left = size
            if not left:
                self.frames += 1
                if stop:
                    self._left = 0
                    return i


def openwire_format(sniffed: Sniffed | None, raw: bytes) -> openwire.WireFormat | None:
    """The OpenWire options of a client whose opening was sniffed as OpenWire, read once from its
    opening `raw` (its cursor and its farewell depend on them); None for other protocols."""
    if sniffed is None or sniffed.protocol is not WireProtocol.OPENWIRE:
        return None
    fmt = openwire.sniff_wire_format(raw)
    return fmt if isinstance(fmt, openwire.WireFormat) else None


def frame_cursor(sniffed: Sniffed | None, fmt: openwire.WireFormat | None) -> FrameCursor | None:
    """The cursor for a proxied connection's broker-to-client direction; None when the router
    cannot speak to the client mid-stream (its opening was not read, STOMP, TLS passed through,
    OpenWire without size prefixes). `fmt`: an OpenWire client's options (`openwire_format`)."""
    if sniffed is None:
        return None
    match sniffed.protocol:
        case WireProtocol.MQTT:
            return MqttFrames()
        case WireProtocol.AMQP:
            return SizePrefixedFrames(amqp=True)
        case WireProtocol.OPENWIRE:
            return None if fmt is None or fmt.size_prefix_disabled else SizePrefixedFrames()
        case WireProtocol.STOMP | WireProtocol.TLS | WireProtocol.CORE:
            return None
        case _:
            assert_never(sniffed.protocol)


@dataclass(frozen=True, slots=True)
class Farewell:
    """What a client is told when the router moves it, before the router closes the connection."""

    before_first_frame: bytes
    """When the broker has not sent its first frame yet (MQTT: a CONNACK; AMQP: Open + Close)."""
    after_first_frame: bytes
    """Otherwise (MQTT 5: DISCONNECT; AMQP: Close; OpenWire: ConnectionControl)."""
    says: str
    """How it is described in logs and the evacuation's status, e.g. "mqtt 5 DISCONNECT 0x9c"."""

    def words(self, frames: int) -> bytes:
        """The bytes for a connection whose broker has sent `frames` frames so far."""
        return self.after_first_frame if frames else self.before_first_frame


PLAIN_CLOSE: Final = Farewell(b"", b"", "close")


def farewell(
    protocol: WireProtocol | None,
    version: str | None,
    fmt: openwire.WireFormat | None,
    mode: AcceptorMode,
    destination: Connector | None,
    router: str,
    *,
    shutting_down: bool = False,
    refer: bool | None = None,
) -> Farewell:
    """What to tell a client that is moved off its broker.

    Clients of a redirect or auto acceptor can reach the brokers, so they are sent to
    `destination`, the target their key routes to now (MQTT 5 Server Reference, AMQP redirect,
    OpenWire reconnectTo). Clients of a proxy acceptor reach the brokers only through the router:
    they are told to go (MQTT 5 0x9C without a reference, AMQP `amqp:connection:forced`) and
    reconnect to the address they know, the router, whose cache then sends them to `destination`.
    When the router shuts down, MQTT 5 clients get 0x8B "Server shutting down".

    Args:
        protocol: the client's protocol, as its opening was sniffed; None (not read) gets a plain
            close.
        version: its protocol version as sniffed (MQTT: "3.1", "3.1.1" or "5").
        fmt: an OpenWire client's options (`openwire_format`); None for other protocols.
        mode: the acceptor's mode.
        destination: where the client's key routes now; None when nowhere is ready.
        router: the router's name (AMQP container id and descriptions).
        shutting_down: the router is stopping rather than moving one broker's clients.
        refer: name `destination` (True) or not (False) whatever the mode; None: by the mode.
    """
    if protocol is None:
        return PLAIN_CLOSE
    if refer is None:
        refer = mode is not AcceptorMode.PROXY
    refer = refer and destination is not None and not shutting_down
    match protocol:
        case WireProtocol.MQTT:
            if version != "5":
                return PLAIN_CLOSE  # MQTT 3.1.1 has no DISCONNECT from the server
            if shutting_down:
                code = mqtt.MQTT_V5_SERVER_SHUTTING_DOWN
                return Farewell(
                    mqtt.encode_connack(mqtt.MQTT_V5_SERVER_UNAVAILABLE, protocol_level=5),
                    mqtt.encode_disconnect_v5(code),
                    "mqtt 5 DISCONNECT 0x8b",
                )
            reference = f"{destination.host}:{destination.port}" if refer and destination else None
            return Farewell(
                mqtt.encode_connack(
                    mqtt.MQTT_V5_USE_ANOTHER_SERVER, protocol_level=5, server_reference=reference
                ),
                mqtt.encode_disconnect_v5(mqtt.MQTT_V5_USE_ANOTHER_SERVER, server_reference=reference),
                f"mqtt 5 DISCONNECT 0x9c{f' to {reference}' if reference else ''}",
            )
        case WireProtocol.AMQP:
            if refer and destination is not None:
                where = f"{destination.host}:{destination.port}"
                close = amqp.encode_close(
                    "amqp:connection:redirect",
                    f"Connection router {router} moved this connection to {where}",
                    {"network-host": destination.host, "port": destination.port},
                )
                says = f"amqp Close amqp:connection:redirect to {where}"
            else:
                what = "is shutting down" if shutting_down else "moved this connection"
                close = amqp.encode_close(
                    "amqp:connection:forced", f"Connection router {router} {what}", None
                )
                says = "amqp Close amqp:connection:forced"
            return Farewell(amqp.encode_open(router) + close, close, says)
        case WireProtocol.OPENWIRE:
            if not refer or destination is None or fmt is None:
                return PLAIN_CLOSE
            url = destination.url
            try:
                control = openwire.encode_connection_control(
                    reconnect_to=url, connected_brokers=url, rebalance=True, encoding=fmt
                )
            except ValueError:  # a version before ConnectionControl could redirect
                return PLAIN_CLOSE
            return Farewell(control, control, f"openwire ConnectionControl reconnectTo {url}")
        case WireProtocol.STOMP | WireProtocol.TLS | WireProtocol.CORE:
            return PLAIN_CLOSE
        case _:
            assert_never(protocol)
