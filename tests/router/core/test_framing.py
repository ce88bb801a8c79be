"""Frame cursors: boundaries found however the bytes are split; farewells in each protocol."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import Sniffed, WireProtocol, amqp, mqtt, openwire
from pools import Connector
from router.config.settings import AcceptorMode
from router.core.framing import (
    PLAIN_CLOSE,
    FrameCursor,
    MqttFrames,
    SizePrefixedFrames,
    farewell,
    frame_cursor,
    openwire_format,
)


def _mqtt_packet(kind: int, body: bytes) -> bytes:
    length, out = len(body), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        out.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes((kind,)) + bytes(out) + body


def _amqp_frame(body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body


def _openwire_command(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


_BODIES = st.lists(st.binary(max_size=300) | st.sampled_from([b"", b"x" * 20_000]), min_size=1, max_size=12)


def _ends(frames: list[bytes]) -> list[int]:
    return list(itertools.accumulate(len(f) for f in frames))


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _follow(cursor: FrameCursor, pieces: list[bytes]) -> list[int]:
    """Feed piece by piece; the offsets after which the cursor says it is at a boundary."""
    seen, offset = [], 0
    for piece in pieces:
        cursor.feed(piece)
        offset += len(piece)
        if cursor.at_boundary:
            seen.append(offset)
    return seen


class TestMqttFrames:
    @given(_BODIES, st.lists(st.integers(min_value=0), max_size=20))
    def test_boundaries_however_split(self, bodies: list[bytes], cuts: list[int]) -> None:
        frames = [_mqtt_packet(0x30, b) for b in bodies]
        data = b"".join(frames)
        pieces = _splits(data, cuts)
        seen = _follow(MqttFrames(), pieces)
        piece_ends = set(_ends(pieces))
        assert seen == [e for e in _ends(frames) if e in piece_ends]

    @given(_BODIES, st.integers(min_value=0))
    def test_cut_finds_the_end_of_the_frame_under_way(self, bodies: list[bytes], at: int) -> None:
        frames = [_mqtt_packet(0x30, b) for b in bodies]
        data = b"".join(frames)
        at %= len(data) + 1
        cursor = MqttFrames()
        cursor.feed(data[:at])
        cut = cursor.cut(data[at:])
        ends = [0, *_ends(frames)]
        expected = next(e for e in ends if e >= at) - at
        assert cut == expected

    def test_cut_none_when_the_frame_goes_on(self) -> None:
        cursor = MqttFrames()
        packet = _mqtt_packet(0x30, b"p" * 200)
        cursor.feed(packet[:10])
        assert cursor.cut(packet[10:50]) is None
        assert cursor.cut(packet[50:] + b"\xd0\x00") == len(packet) - 50

    def test_frames_counts_complete_packets(self) -> None:
        cursor = MqttFrames()
        cursor.feed(b"\x20\x03\x00\x00\x00")  # CONNACK
        assert cursor.frames == 1
        cursor.feed(b"\xd0")  # PINGRESP's first byte
        assert cursor.frames == 1
        assert not cursor.at_boundary
        cursor.feed(b"\x00")
        assert cursor.frames == 2
        assert cursor.at_boundary

    @given(_BODIES, st.lists(st.integers(min_value=0), max_size=20), st.integers(min_value=0))
    def test_resumed_goes_on_where_another_follower_stopped(
        self, bodies: list[bytes], cuts: list[int], stop: int
    ) -> None:
        data = b"".join(_mqtt_packet(0x30, b) for b in bodies)
        pieces = _splits(data, cuts)
        stop %= len(pieces) + 1
        first = MqttFrames()
        for piece in pieces[:stop]:
            first.feed(piece)
        resumed = MqttFrames.resumed(first.frames, first._left, first._head, first.lost)
        for piece in pieces[stop:]:  # the same steps as the follower that saw everything
            first.feed(piece)
            resumed.feed(piece)
            assert (resumed.frames, resumed.at_boundary) == (first.frames, first.at_boundary)
        assert resumed.frames == len(bodies)
        assert resumed.at_boundary

    def test_five_length_bytes_is_not_mqtt(self) -> None:
        cursor = MqttFrames()
        cursor.feed(b"\x30\xff\xff\xff\xff\x01")
        assert cursor.lost
        assert not cursor.at_boundary
        assert cursor.cut(b"\x00") is None


class TestSizePrefixedFrames:
    @given(_BODIES, st.lists(st.integers(min_value=0), max_size=20))
    def test_amqp_boundaries_however_split(self, bodies: list[bytes], cuts: list[int]) -> None:
        frames = [_amqp_frame(b) for b in bodies]
        data = b"".join(frames)
        pieces = _splits(data, cuts)
        seen = _follow(SizePrefixedFrames(amqp=True), pieces)
        piece_ends = set(_ends(pieces))
        assert seen == [e for e in _ends(frames) if e in piece_ends]

    @given(_BODIES, st.integers(min_value=0))
    def test_openwire_cut(self, bodies: list[bytes], at: int) -> None:
        frames = [_openwire_command(b) for b in bodies]
        data = b"".join(frames)
        at %= len(data) + 1
        cursor = SizePrefixedFrames()
        cursor.feed(data[:at])
        ends = [0, *_ends(frames)]
        assert cursor.cut(data[at:]) == next(e for e in ends if e >= at) - at

    def test_amqp_protocol_header_is_not_a_frame(self) -> None:
        cursor = SizePrefixedFrames(amqp=True)
        cursor.feed(amqp.AMQP_HEADER[:5])
        assert not cursor.at_boundary
        cursor.feed(amqp.AMQP_HEADER[5:])
        assert (cursor.at_boundary, cursor.frames) == (True, 0)
        cursor.feed(amqp.encode_open("broker"))
        assert (cursor.at_boundary, cursor.frames) == (True, 1)

    def test_amqp_size_below_the_frame_header_is_lost(self) -> None:
        cursor = SizePrefixedFrames(amqp=True)
        cursor.feed(b"\x00\x00\x00\x04")
        assert cursor.lost
        assert cursor.cut(b"x") is None


_CONNECTOR = Connector.from_url("node1", "tcp://10.0.0.5:1883")


def _sniffed(protocol: WireProtocol, version: str | None = None) -> Sniffed:
    return Sniffed(protocol=protocol, client_id="c1", protocol_version=version)


def _speaks(protocol: WireProtocol, version: str | None = None) -> tuple[WireProtocol, str | None]:
    return protocol, version


class TestFarewell:
    def test_mqtt5_redirect_acceptor_names_the_destination(self) -> None:
        said = farewell(*_speaks(WireProtocol.MQTT, "5"), None, AcceptorMode.REDIRECT, _CONNECTOR, "r")
        expected = mqtt.encode_disconnect_v5(0x9C, server_reference="10.0.0.5:1883")
        assert said.words(frames=3) == expected
        assert expected[:1] == b"\xe0"
        assert said.words(frames=0) == mqtt.encode_connack(
            0x9C, protocol_level=5, server_reference="10.0.0.5:1883"
        )

    def test_mqtt5_proxy_acceptor_sends_no_reference(self) -> None:
        said = farewell(*_speaks(WireProtocol.MQTT, "5"), None, AcceptorMode.PROXY, _CONNECTOR, "r")
        assert said.words(frames=1) == b"\xe0\x02\x9c\x00"  # reason 0x9c, no properties

    def test_mqtt5_shutdown(self) -> None:
        said = farewell(
            *_speaks(WireProtocol.MQTT, "5"), None, AcceptorMode.AUTO, _CONNECTOR, "r", shutting_down=True
        )
        assert said.words(frames=1) == b"\xe0\x02\x8b\x00"

    def test_mqtt311_is_closed(self) -> None:
        assert (
            farewell(*_speaks(WireProtocol.MQTT, "3.1.1"), None, AcceptorMode.AUTO, _CONNECTOR, "r")
            is PLAIN_CLOSE
        )

    def test_amqp_redirect_and_forced(self) -> None:
        redirect = farewell(*_speaks(WireProtocol.AMQP), None, AcceptorMode.AUTO, _CONNECTOR, "r")
        assert redirect.words(frames=1) == amqp.encode_close(
            "amqp:connection:redirect",
            "Connection router r moved this connection to 10.0.0.5:1883",
            {"network-host": "10.0.0.5", "port": 1883},
        )
        assert redirect.words(frames=0).startswith(amqp.encode_open("r"))
        forced = farewell(*_speaks(WireProtocol.AMQP), None, AcceptorMode.PROXY, _CONNECTOR, "r")
        assert b"amqp:connection:forced" in forced.words(frames=1)

    def test_openwire_connection_control(self) -> None:
        client_wfi = openwire.encode_wire_format_info()
        fmt = openwire_format(_sniffed(WireProtocol.OPENWIRE), client_wfi)
        assert fmt == openwire.sniff_wire_format(client_wfi)
        said = farewell(*_speaks(WireProtocol.OPENWIRE), fmt, AcceptorMode.REDIRECT, _CONNECTOR, "r")
        assert said.words(frames=2) == openwire.encode_connection_control(
            reconnect_to=_CONNECTOR.url, connected_brokers=_CONNECTOR.url, rebalance=True, encoding=fmt
        )

    @pytest.mark.parametrize("protocol", [WireProtocol.STOMP, WireProtocol.TLS])
    def test_others_are_closed(self, protocol: WireProtocol) -> None:
        assert farewell(*_speaks(protocol), None, AcceptorMode.AUTO, _CONNECTOR, "r") is PLAIN_CLOSE
        assert frame_cursor(_sniffed(protocol), None) is None

    def test_no_opening_no_cursor(self) -> None:
        assert frame_cursor(None, None) is None
        assert farewell(None, None, None, AcceptorMode.PROXY, _CONNECTOR, "r") is PLAIN_CLOSE
