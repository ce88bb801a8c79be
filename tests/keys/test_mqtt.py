"""keys.mqtt: the MQTT CONNECT sniffer (STYLE R10) and the CONNACK encoder (SPEC A6)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from paho.mqtt.client import Client
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from keys import NEED_MORE, Sniffed, SniffError, WireProtocol, mqtt
from keys.mqtt import (
    MQTT_V5_NOT_AUTHORIZED,
    MQTT_V5_SERVER_UNAVAILABLE,
    MQTT_V5_USE_ANOTHER_SERVER,
    PROTOCOL_LEVELS,
    MqttSniffer,
    encode_connack,
    encode_connack_v3_as_artemis,
)
from tests.keys.conftest import OneConnectionServer, mutate, read_until_sniffed, sniff_outcome

if TYPE_CHECKING:
    import socket

    from paho.mqtt.client import ConnectFlags
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

SNIFFER = MqttSniffer()

# The four frames below were captured from paho-mqtt 2.2.0 (Python 3.11.7): a throwaway script
# listened on 127.0.0.1 with a plain socket, recorded the first bytes the client sent, and closed.
# Each client was `paho.mqtt.client.Client(CallbackAPIVersion.VERSION2, client_id=..., protocol=...)`
# with `username_pw_set("alice", "s3cret")` (except the anonymous one) and `connect(..., keepalive=30)`.

# protocol=MQTTv31, client_id="paho-v31"
PAHO_V31 = bytes.fromhex(
    "10"  # CONNECT, flags 0
    "25"  # remaining length 37
    "0006 4d5149736470"  # protocol name "MQIsdp"
    "03"  # protocol level 3 (MQTT 3.1)
    "c2"  # connect flags: user name, password, clean session
    "001e"  # keep alive 30 s
    "0008 7061686f2d763331"  # client identifier "paho-v31"
    "0005 616c696365"  # user name "alice"
    "0006 733363726574"  # password "s3cret"
)

# protocol=MQTTv311, client_id="paho-v311"
PAHO_V311 = bytes.fromhex(
    "10"  # CONNECT, flags 0
    "24"  # remaining length 36
    "0004 4d515454"  # protocol name "MQTT"
    "04"  # protocol level 4 (MQTT 3.1.1)
    "c2"  # connect flags: user name, password, clean session
    "001e"  # keep alive 30 s
    "0009 7061686f2d76333131"  # client identifier "paho-v311"
    "0005 616c696365"  # user name "alice"
    "0006 733363726574"  # password "s3cret"
)

# protocol=MQTTv311, client_id="" (the server assigns one), no username_pw_set
PAHO_V311_ANONYMOUS = bytes.fromhex(
    "10"  # CONNECT, flags 0
    "0c"  # remaining length 12
    "0004 4d515454"  # protocol name "MQTT"
    "04"  # protocol level 4 (MQTT 3.1.1)
    "02"  # connect flags: clean session only
    "001e"  # keep alive 30 s
    "0000"  # client identifier "" (zero length)
)

# protocol=MQTTv5, client_id="paho-v5", CONNECT properties SessionExpiryInterval=3600 and
# UserProperty [("region", "eu"), ("tier", "gold")], passed to connect(properties=...);
# will_set("status/paho-v5", b"offline", qos=1, properties=WillDelayInterval 10 and
# UserProperty ("why", "gone")).
PAHO_V5 = bytes.fromhex(
    "10"  # CONNECT, flags 0
    "6d"  # remaining length 109
    "0004 4d515454"  # protocol name "MQTT"
    "05"  # protocol level 5
    "ce"  # connect flags: user name, password, will QoS 1, will, clean start
    "001e"  # keep alive 30 s
    "1f"  # properties length 31
    "11 00000e10"  # session expiry interval 3600 s
    "26"
    "0006"
    "726567696f6e"
    "0002 6575"  # user property "region" = "eu"
    "26"
    "0004"
    "74696572"
    "0004 676f6c64"  # user property "tier" = "gold"
    "0007 7061686f2d7635"  # client identifier "paho-v5"
    "11"  # will properties length 17
    "18 0000000a"  # will delay interval 10 s
    "26"
    "0003"
    "777879"
    "0004 676f6e65"  # user property "why" = "gone"
    "000e 7374617475732f7061686f2d7635"  # will topic "status/paho-v5"
    "0007 6f66666c696e65"  # will payload "offline"
    "0005 616c696365"  # user name "alice"
    "0006 733363726574"  # password "s3cret"
)

CAPTURED = [
    pytest.param(
        PAHO_V31,
        Sniffed(
            protocol=WireProtocol.MQTT,
            client_id="paho-v31",
            user_name="alice",
            password="s3cret",
            protocol_version="3.1",
            keepalive_s=30,
        ),
        id="paho-v31",
    ),
    pytest.param(
        PAHO_V311,
        Sniffed(
            protocol=WireProtocol.MQTT,
            client_id="paho-v311",
            user_name="alice",
            password="s3cret",
            protocol_version="3.1.1",
            keepalive_s=30,
        ),
        id="paho-v311",
    ),
    pytest.param(
        PAHO_V311_ANONYMOUS,
        Sniffed(protocol=WireProtocol.MQTT, protocol_version="3.1.1", keepalive_s=30),
        id="paho-v311-anonymous",
    ),
    pytest.param(
        PAHO_V5,
        Sniffed(
            protocol=WireProtocol.MQTT,
            client_id="paho-v5",
            user_name="alice",
            password="s3cret",
            protocol_version="5",
            keepalive_s=30,
        ),
        id="paho-v5",
    ),
]
CAPTURED_FRAMES = [PAHO_V31, PAHO_V311, PAHO_V311_ANONYMOUS, PAHO_V5]


def varint(value: int) -> bytes:
    """Variable byte integer (MQTT 5 §1.5.5), written independently of keys.mqtt."""
    out = bytearray()
    while True:
        out.append((value % 128) | (128 if value >= 128 else 0))
        value //= 128
        if not value:
            return bytes(out)


def string(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def connect_packet(
    *,
    name: bytes = b"MQTT",
    level: int = 4,
    flags: int | None = None,
    keepalive: int = 60,
    properties: bytes = b"",
    client_id: bytes = b"client-1",
    will: tuple[bytes, bytes, bytes] | None = None,
    will_qos: int = 0,
    user: bytes | None = None,
    password: bytes | None = None,
    extra: bytes = b"",
    remaining: int | None = None,
) -> bytes:
    """A CONNECT packet; `will` is (will properties, topic, payload); properties only for level 5.

    `flags` overrides the computed connect flags, `remaining` the computed remaining length.
    """
    v5 = level & 0x7F == 5
    if flags is None:
        flags = 0x02
        flags |= 0x04 | will_qos << 3 if will is not None else 0
        flags |= 0x80 if user is not None else 0
        flags |= 0x40 if password is not None else 0
    body = string(name) + bytes((level, flags)) + keepalive.to_bytes(2, "big")
    if v5:
        body += varint(len(properties)) + properties
    body += string(client_id)
    if will is not None:
        will_properties, topic, payload = will
        if v5:
            body += varint(len(will_properties)) + will_properties
        body += string(topic) + string(payload)
    if user is not None:
        body += string(user)
    if password is not None:
        body += string(password)
    body += extra
    return b"\x10" + varint(len(body) if remaining is None else remaining) + body


class TestCapturedConnects:
    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_sniff_mqtt_real_client_connect(self, frame: bytes, expected: Sniffed) -> None:
        result = SNIFFER.sniff(frame)
        assert result == expected
        assert isinstance(result, Sniffed)
        assert result.password == expected.password  # not shown in repr, so check it on its own

    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_sniff_mqtt_every_proper_prefix_needs_more(self, frame: bytes, expected: Sniffed) -> None:
        for i in range(len(frame)):
            assert SNIFFER.sniff(frame[:i]) is NEED_MORE, i

    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    @pytest.mark.parametrize(
        "trailing",
        [b"\xc0\x00", b"\x82\x0a\x00\x01\x00\x05a/b/c\x01", b"\x10\x00", b"\xff\xff\xff\xff\xff"],
        ids=["pingreq", "subscribe", "second-connect", "garbage"],
    )
    def test_sniff_mqtt_trailing_bytes_ignored(
        self, frame: bytes, expected: Sniffed, trailing: bytes
    ) -> None:
        assert SNIFFER.sniff(frame + trailing) == expected


class TestFields:
    def test_sniff_mqtt_v5_password_without_user_name(self) -> None:
        """Scenario: MQTT 5 §3.1.2.9 allows a password without a user name."""
        frame = connect_packet(level=5, password=b"token")
        assert SNIFFER.sniff(frame) == Sniffed(
            protocol=WireProtocol.MQTT,
            client_id="client-1",
            password="token",
            protocol_version="5",
            keepalive_s=60,
        )

    def test_sniff_mqtt_binary_password_is_none(self) -> None:
        result = SNIFFER.sniff(connect_packet(user=b"bob", password=b"\xff\xfe\x00"))
        assert isinstance(result, Sniffed)
        assert (result.user_name, result.password) == ("bob", None)

    def test_sniff_mqtt_empty_password_kept(self) -> None:
        result = SNIFFER.sniff(connect_packet(user=b"bob", password=b""))
        assert isinstance(result, Sniffed)
        assert result.password == ""

    def test_sniff_mqtt_unicode_client_id_and_user_name(self) -> None:
        frame = connect_packet(client_id="capteur-ç-客户".encode(), user="josé".encode())
        result = SNIFFER.sniff(frame)
        assert isinstance(result, Sniffed)
        assert (result.client_id, result.user_name) == ("capteur-ç-客户", "josé")

    @pytest.mark.parametrize("keepalive", [0, 1, 65535])
    def test_sniff_mqtt_keepalive(self, keepalive: int) -> None:
        result = SNIFFER.sniff(connect_packet(keepalive=keepalive))
        assert isinstance(result, Sniffed)
        assert result.keepalive_s == keepalive

    @pytest.mark.parametrize(
        ("name", "level", "version"),
        [(b"MQIsdp", 0x83, "3.1"), (b"MQTT", 0x84, "3.1.1")],
        ids=["3.1", "3.1.1"],
    )
    def test_sniff_mqtt_bridge_bit_accepted(self, name: bytes, level: int, version: str) -> None:
        """Scenario: mosquitto bridges (try_private) set 0x80 in the protocol level."""
        result = SNIFFER.sniff(connect_packet(name=name, level=level))
        assert isinstance(result, Sniffed)
        assert result.protocol_version == version

    def test_sniff_mqtt_v311_will_skipped(self) -> None:
        frame = connect_packet(will=(b"", b"status/1", b"x" * 300), will_qos=2, user=b"u")
        assert frame[1] & 0x80  # a two-byte remaining length
        result = SNIFFER.sniff(frame)
        assert isinstance(result, Sniffed)
        assert (result.client_id, result.user_name) == ("client-1", "u")

    def test_sniff_mqtt_v5_large_properties_skipped(self) -> None:
        properties = b"\x26" + string(b"k") + string(b"v" * 200)
        frame = connect_packet(level=5, properties=properties, will=(properties, b"t", b"p"), user=b"u")
        assert SNIFFER.sniff(frame) == Sniffed(
            protocol=WireProtocol.MQTT,
            client_id="client-1",
            user_name="u",
            protocol_version="5",
            keepalive_s=60,
        )

    def test_sniff_mqtt_non_minimal_remaining_length_accepted(self) -> None:
        frame = connect_packet()
        padded = frame[:1] + bytes((frame[1] | 0x80, 0x80, 0x00)) + frame[2:]
        assert SNIFFER.sniff(padded) == SNIFFER.sniff(frame)


ERRORS = [
    pytest.param(b"\x12", r"first byte must be 0x10 \(CONNECT, flags 0\), got 0x12", id="connect-flags"),
    pytest.param(b"\x20\x02\x00\x00", "got 0x20", id="connack"),
    pytest.param(b"AMQP\x00\x01\x00\x00", "got 0x41", id="amqp"),
    pytest.param(
        b"\x10\xff\xff\xff\xff\x01", "remaining length exceeds 4 bytes", id="remaining-length-5-bytes"
    ),
    pytest.param(
        b"\x10\x0c\x00\x05MQTTT", "protocol name length 5 fits neither 'MQTT' nor 'MQIsdp'", id="name-len"
    ),
    pytest.param(connect_packet(name=b"MQTX"), r"unknown protocol name b'MQTX'", id="name"),
    pytest.param(
        connect_packet(level=3), r"protocol level 3 does not go with protocol name b'MQTT'", id="MQTT-3"
    ),
    pytest.param(connect_packet(level=6), "protocol level 6 does not go", id="MQTT-6"),
    pytest.param(connect_packet(level=0x85), "protocol level 133 does not go", id="MQTT-5-bridge"),
    pytest.param(
        connect_packet(name=b"MQIsdp", level=4),
        r"level 4 does not go with protocol name b'MQIsdp'",
        id="MQIsdp-4",
    ),
    pytest.param(
        connect_packet(flags=0x03), r"reserved connect flag \(bit 0\) is set: flags 0x03", id="reserved"
    ),
    pytest.param(
        connect_packet(flags=0x0A), "will qos or will retain set without the will flag", id="qos-no-will"
    ),
    pytest.param(
        connect_packet(flags=0x22), "will qos or will retain set without the will flag", id="retain-no-will"
    ),
    pytest.param(
        connect_packet(will=(b"", b"t", b"p"), will_qos=3), "will qos is 3: flags 0x1e", id="will-qos-3"
    ),
    pytest.param(
        connect_packet(password=b"pw"),
        "password flag without user name flag is not allowed in MQTT 3.1.1",
        id="pw-311",
    ),
    pytest.param(
        connect_packet(name=b"MQIsdp", level=3, password=b"pw"),
        "not allowed in MQTT 3.1: flags 0x42",
        id="pw-31",
    ),
    pytest.param(
        connect_packet(client_id=b"\xc3\x28"), "client identifier is not valid UTF-8: c328", id="id-utf8"
    ),
    pytest.param(
        connect_packet(client_id=b"\xed\xa0\x80"), "client identifier is not valid UTF-8", id="surrogate"
    ),
    pytest.param(
        connect_packet(client_id=b"a\x00b"), "client identifier contains U\\+0000: 610062", id="id-nul"
    ),
    pytest.param(connect_packet(user=b"\xff"), "user name is not valid UTF-8: ff", id="user-utf8"),
    pytest.param(
        connect_packet(user=b"u", password=b"pw", remaining=24),
        "password length at offset 25 overruns the packet, which ends at offset 26",
        id="overrun",
    ),
    pytest.param(connect_packet(remaining=3), "protocol name at offset 4 overruns", id="tiny-remaining"),
    pytest.param(
        connect_packet(extra=b"\x00\x00\x00"), "extra bytes after the connect payload: 3", id="extra"
    ),
    pytest.param(
        b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x7f\x00\x00",  # properties length 127
        "connect properties at offset 13 overruns the packet, which ends at offset 15",
        id="v5-properties-overrun",
    ),
    pytest.param(
        b"\x10\x20\x00\x04MQTT\x05\x02\x00\x3c\xff\xff\xff\xff\x01",
        "connect properties length exceeds 4 bytes",
        id="v5-properties-length",
    ),
    pytest.param(
        b"\x10\x14\x00\x04MQTT\x05\x06\x00\x3c\x00\x00\x01c\x20\x00\x01t\x00\x01p",
        "will properties at offset 17 overruns the packet, which ends at offset 22",
        id="v5-will-properties",
    ),
]


@pytest.mark.parametrize(("frame", "message"), ERRORS)
def test_sniff_mqtt_malformed_raises(frame: bytes, message: str) -> None:
    with pytest.raises(SniffError, match=message) as info:
        SNIFFER.sniff(frame)
    assert info.value.protocol == "mqtt"
    assert info.value.reason[0].islower()
    assert not info.value.reason.endswith(".")


@pytest.mark.parametrize(
    ("name", "level"), [(b"MQIsdp", 0), (b"MQIsdp", 4), (b"MQTT", 3), (b"MQTT", 6), (b"MQTT", 0x85)]
)
def test_sniff_mqtt_unsupported_level_is_answered_with_connack_0x01(name: bytes, level: int) -> None:
    """Scenario: MQTT 3.1.1 [MQTT-3.1.2-2]: a protocol level the server does not support gets
    CONNACK 0x01 (unacceptable protocol version) before the disconnect, as from mosquitto, as soon
    as the level has arrived."""
    frame = connect_packet(name=name, level=level)
    for data in (frame, frame[: 5 + len(name)]):
        with pytest.raises(SniffError, match="does not go with protocol name") as info:
            SNIFFER.sniff(data)
        assert info.value.answer == b"\x20\x02\x00\x01"


def test_sniff_mqtt_other_errors_get_a_plain_close() -> None:
    """Scenario: [MQTT-3.1.2-1]: a wrong protocol name may just be disconnected, as mosquitto does."""
    with pytest.raises(SniffError) as info:
        SNIFFER.sniff(connect_packet(name=b"MQTX"))
    assert info.value.answer == b""


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (b"", None),
        (b"\x10", None),
        (b"\x10\x80", None),  # the remaining length goes on
        (b"\x10\x0c", 14),
        (b"\x10\xff\xff\xff\x7f", 5 + 268_435_455),
        (b"\x10\xff\xff\xff\xff\x01", None),  # malformed: sniff says why
        (b"\x20\x02", None),  # not a CONNECT
    ],
)
def test_mqtt_announced_size_is_the_whole_connect(data: bytes, size: int | None) -> None:
    assert SNIFFER.announced_size(data) == size


def test_mqtt_announced_size_of_a_real_connect() -> None:
    frame = connect_packet(client_id=b"x" * 300)
    assert SNIFFER.announced_size(frame[:3]) == len(frame)


def test_sniff_mqtt_rejects_garbage_before_the_packet_is_complete() -> None:
    """Scenario: a bad protocol name is an error at once, not after the declared 200 bytes."""
    with pytest.raises(SniffError, match="unknown protocol name b'HTTP'"):
        SNIFFER.sniff(b"\x10\xc8\x01\x00\x04HTTP")


def test_sniff_mqtt_empty_needs_more() -> None:
    assert SNIFFER.sniff(b"") is NEED_MORE


class TestLooksLike:
    @pytest.mark.parametrize("prefix", [b"\x10", PAHO_V31[:2], PAHO_V5])
    def test_looks_like_mqtt_connect(self, prefix: bytes) -> None:
        assert SNIFFER.looks_like(prefix)

    @pytest.mark.parametrize(
        "prefix", [b"", b"AMQP", b"CONNECT", b"STOMP", b"\x00\x00\x00", b"\x16\x03\x01", b"\x20", b"\x12"]
    )
    def test_looks_like_mqtt_false_for_other_protocols(self, prefix: bytes) -> None:
        assert not SNIFFER.looks_like(prefix)

    def test_mqtt_sniffer_name(self) -> None:
        assert SNIFFER.name == "mqtt"


def _sniff_only_allowed_outcomes(data: bytes) -> None:
    """NEED_MORE, a Sniffed or SniffError; IndexError, UnicodeDecodeError … fail the test."""
    result = sniff_outcome(SNIFFER.sniff, data)
    assert isinstance(result, SniffError) or result is NEED_MORE or isinstance(result, Sniffed)


class TestFuzz:
    @given(frame=st.sampled_from(CAPTURED_FRAMES), cut=st.integers(min_value=0), tail=st.binary(max_size=64))
    def test_sniff_mqtt_prefix_plus_garbage(self, frame: bytes, cut: int, tail: bytes) -> None:
        _sniff_only_allowed_outcomes(frame[: cut % (len(frame) + 1)] + tail)

    @given(data=st.binary(max_size=200))
    def test_sniff_mqtt_arbitrary_bytes(self, data: bytes) -> None:
        _sniff_only_allowed_outcomes(data)

    @given(body=st.binary(max_size=120))
    @example(body=b"\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00")
    def test_sniff_mqtt_arbitrary_body(self, body: bytes) -> None:
        """Scenario: random bytes behind a correct fixed header reach the field parser."""
        _sniff_only_allowed_outcomes(b"\x10" + varint(len(body)) + body)

    @given(
        frame=st.sampled_from(CAPTURED_FRAMES),
        edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
    )
    def test_sniff_mqtt_mutated_capture(self, frame: bytes, edits: list[tuple[int, int]]) -> None:
        _sniff_only_allowed_outcomes(mutate(frame, edits))

    @given(
        level=st.sampled_from([3, 4, 5]),
        client_id=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30),
        user=st.none() | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
        password=st.none() | st.binary(max_size=20),
        will=st.none() | st.tuples(st.binary(max_size=40), st.binary(max_size=20), st.binary(max_size=200)),
        will_qos=st.integers(0, 2),
        properties=st.binary(max_size=200),
        keepalive=st.integers(0, 0xFFFF),
    )
    def test_sniff_mqtt_generated_connect_round_trip(
        self,
        level: int,
        client_id: str,
        user: str | None,
        password: bytes | None,
        will: tuple[bytes, bytes, bytes] | None,
        will_qos: int,
        properties: bytes,
        keepalive: int,
    ) -> None:
        if level != 5 and user is None:
            password = None  # MQTT 3.1.1 §3.1.2.9: no password without a user name
        frame = connect_packet(
            name=b"MQIsdp" if level == 3 else b"MQTT",
            level=level,
            keepalive=keepalive,
            properties=properties,
            client_id=client_id.encode(),
            will=will,
            will_qos=will_qos if will is not None else 0,
            user=None if user is None else user.encode(),
            password=password,
        )
        try:
            text_password = None if password is None else password.decode()
        except UnicodeDecodeError:
            text_password = None
        assert SNIFFER.sniff(frame[:-1]) is NEED_MORE
        assert SNIFFER.sniff(frame) == Sniffed(
            protocol=WireProtocol.MQTT,
            client_id=client_id or None,
            user_name=user,
            password=text_password,
            protocol_version={3: "3.1", 4: "3.1.1", 5: "5"}[level],
            keepalive_s=keepalive,
        )


class TestEncodeConnack:
    @pytest.mark.parametrize(
        ("reason_code", "level", "expected"),
        [
            (MQTT_V5_USE_ANOTHER_SERVER, 4, "20020003"),  # CONNACK, length 2, flags 0, server unavailable
            (MQTT_V5_SERVER_UNAVAILABLE, 4, "20020003"),
            (MQTT_V5_NOT_AUTHORIZED, 4, "20020005"),  # not authorized
            (MQTT_V5_USE_ANOTHER_SERVER, 3, "20020003"),  # MQTT 3.1 uses the same codes
            (MQTT_V5_NOT_AUTHORIZED, 3, "20020005"),
            (0x00, 4, "20020000"),
            (0x84, 4, "20020001"),
            (0x85, 4, "20020002"),
            (0x86, 4, "20020004"),
            (0x89, 4, "20020003"),
            (0x9D, 4, "20020003"),
        ],
    )
    def test_encode_connack_v3_return_codes(self, reason_code: int, level: int, expected: str) -> None:
        assert encode_connack(reason_code, protocol_level=level) == bytes.fromhex(expected)

    def test_encode_connack_v311_drops_server_reference(self) -> None:
        encoded = encode_connack(
            MQTT_V5_USE_ANOTHER_SERVER, protocol_level=4, server_reference="b.example:1883"
        )
        assert encoded == bytes.fromhex("20020003")

    @pytest.mark.parametrize(
        ("reason_code", "expected"),
        [
            (MQTT_V5_SERVER_UNAVAILABLE, "2003008800"),  # CONNACK, length 3, flags, reason, no props
            (MQTT_V5_USE_ANOTHER_SERVER, "2003009c00"),
            (MQTT_V5_NOT_AUTHORIZED, "2003008700"),
        ],
    )
    def test_encode_connack_v5_without_properties(self, reason_code: int, expected: str) -> None:
        assert encode_connack(reason_code, protocol_level=5) == bytes.fromhex(expected)

    def test_encode_connack_v5_server_reference(self) -> None:
        expected = bytes.fromhex(
            "20"  # CONNACK
            "14"  # remaining length 20
            "00"  # acknowledge flags: session present 0
            "9c"  # reason code: use another server
            "11"  # properties length 17
            "1c"  # property: server reference
            "000e 622e6578616d706c653a31383833"  # "b.example:1883"
        )
        assert encode_connack(0x9C, protocol_level=5, server_reference="b.example:1883") == expected

    def test_encode_connack_v5_long_server_reference_uses_two_byte_lengths(self) -> None:
        reference = "h" * 195 + ":1883"
        encoded = encode_connack(0x9C, protocol_level=5, server_reference=reference)
        # properties 1 + 2 + 200 = 203 (varint cb 01); variable header 2 + 2 + 203 = 207 (cf 01)
        assert encoded[:7] == bytes.fromhex("20cf01009ccb01")
        assert encoded[7:10] == b"\x1c\x00\xc8"
        assert len(encoded) == 3 + 207

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"reason_code": 0x9C, "protocol_level": 6}, "unknown mqtt protocol level 6, expected 3, 4 or 5"),
            (
                {"reason_code": 0x01, "protocol_level": 5},
                "reason code 0x01 is not an mqtt 5 connack reason code",
            ),
            (
                {"reason_code": 0x80, "protocol_level": 4},
                "reason code 0x80 has no mqtt 3.1.1 connack return code",
            ),
            (
                {"reason_code": 0x9C, "protocol_level": 5, "server_reference": "x" * 65536},
                "server reference of 65536 bytes exceeds 65535",
            ),
            (
                {"reason_code": 0x9C, "protocol_level": 5, "server_reference": "a\x00b"},
                "server reference contains U\\+0000: 'a\\\\x00b'",
            ),
        ],
    )
    def test_encode_connack_invalid_arguments(self, kwargs: dict[str, int | str], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            encode_connack(**kwargs)  # type: ignore[arg-type]  # mypy cannot split the dict by key

    def test_protocol_levels_cover_sniffed_versions(self) -> None:
        assert PROTOCOL_LEVELS == {"3.1": 3, "3.1.1": 4, "5": 5}
        for frame, level in [(PAHO_V31, 3), (PAHO_V311, 4), (PAHO_V5, 5)]:
            result = SNIFFER.sniff(frame)
            assert isinstance(result, Sniffed)
            assert result.protocol_version is not None
            assert PROTOCOL_LEVELS[result.protocol_version] == level


@dataclass
class _RoundTrip:
    """What one live exchange produced: our sniff of paho's CONNECT, paho's view of our CONNACK."""

    sniffed: Sniffed | None = None
    reason: ReasonCode | None = None
    properties: Properties | None = None


def _paho_round_trip(
    protocol: MQTTProtocolVersion, reason_code: int, server_reference: str | None
) -> _RoundTrip:
    """A live paho client connects to a one-shot listener on 127.0.0.1 that sniffs its CONNECT with
    MqttSniffer and answers with encode_connack; paho's on_connect records what it parsed."""
    seen = _RoundTrip()

    def answer(conn: socket.socket) -> None:
        _, result, _ = read_until_sniffed(conn, SNIFFER)
        assert result.protocol_version is not None
        seen.sniffed = result
        level = PROTOCOL_LEVELS[result.protocol_version]
        conn.sendall(encode_connack(reason_code, protocol_level=level, server_reference=server_reference))
        conn.recv(16)  # until the client goes away

    def on_connect(
        client: Client,
        userdata: object,
        flags: ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        seen.reason, seen.properties = reason, properties

    server = OneConnectionServer(answer, timeout_s=5)
    client = Client(CallbackAPIVersion.VERSION2, client_id="round-trip", protocol=protocol)
    client.on_connect = on_connect
    try:
        client.connect("127.0.0.1", server.port, keepalive=15)
        deadline = time.monotonic() + 5
        while seen.reason is None and time.monotonic() < deadline:
            client.loop(timeout=0.05)
    finally:
        client.disconnect()
        server.join()
    return seen


class TestPahoRoundTrip:
    """A live paho-mqtt 2.2 client against the sniffer and the encoder, over 127.0.0.1."""

    @pytest.mark.parametrize(
        ("protocol", "reason_code", "paho_reason"),
        [
            # paho reports 3.1/3.1.1 return codes as MQTT 5 reason codes: 3 -> 0x88, 5 -> 0x87.
            (MQTTProtocolVersion.MQTTv31, MQTT_V5_USE_ANOTHER_SERVER, 0x88),
            (MQTTProtocolVersion.MQTTv311, MQTT_V5_SERVER_UNAVAILABLE, 0x88),
            (MQTTProtocolVersion.MQTTv311, MQTT_V5_NOT_AUTHORIZED, 0x87),
            (MQTTProtocolVersion.MQTTv5, MQTT_V5_SERVER_UNAVAILABLE, 0x88),
            (MQTTProtocolVersion.MQTTv5, MQTT_V5_NOT_AUTHORIZED, 0x87),
        ],
        ids=[
            "v31-use-another",
            "v311-unavailable",
            "v311-not-authorized",
            "v5-unavailable",
            "v5-not-authorized",
        ],
    )
    def test_encode_connack_paho_reads_refusal(
        self, protocol: MQTTProtocolVersion, reason_code: int, paho_reason: int
    ) -> None:
        seen = _paho_round_trip(protocol, reason_code, None)
        assert seen.sniffed is not None
        assert (seen.sniffed.client_id, seen.sniffed.keepalive_s) == ("round-trip", 15)
        assert seen.reason is not None
        assert seen.reason.value == paho_reason

    def test_encode_connack_paho_reads_v5_server_reference(self) -> None:
        seen = _paho_round_trip(MQTTProtocolVersion.MQTTv5, MQTT_V5_USE_ANOTHER_SERVER, "b.example:1883")
        assert seen.sniffed is not None
        assert seen.sniffed.protocol_version == "5"
        assert seen.reason is not None
        assert seen.reason.value == MQTT_V5_USE_ANOTHER_SERVER
        assert seen.properties is not None
        assert vars(seen.properties)["ServerReference"] == "b.example:1883"


@pytest.mark.parametrize("code", [0x9C, 0x88, 0x87])
def test_encode_connack_v3_as_artemis_keeps_the_v5_code(code: int) -> None:
    assert encode_connack_v3_as_artemis(code) == bytes((0x20, 0x02, 0x00, code))


def test_encode_connack_v3_as_artemis_rejects_other_codes() -> None:
    with pytest.raises(ValueError, match="reason code 0x00 is not one Artemis sends"):
        encode_connack_v3_as_artemis(0x00)


# --- The health probe's connection count (probeConnectionCount=true) ------------------------------
# Captured on 2026-11-22 from mosquitto 2.0.11 (Debian 12, `set_tcp_nodelay true`, loopback) by a
# throwaway socket client that sent CONNECT (clean session, client id "probe") and then
# `encode_subscribe(1, "$SYS/broker/clients/connected")`; three other clients were connected.

MOSQUITTO_COUNT = bytes.fromhex(
    "20"  # CONNACK
    "02"  # remaining length 2
    "00"  # acknowledge flags: no session present
    "00"  # return code 0: accepted
    "90"  # SUBACK
    "03"  # remaining length 3
    "0001"  # packet id 1
    "00"  # return code: granted QoS 0
    "31"  # PUBLISH, QoS 0, retain (the broker's retained value)
    "20"  # remaining length 32
    "001d" + b"$SYS/broker/clients/connected".hex() + "33"  # topic name, then payload "3"
)


def test_encode_subscribe_annotated() -> None:
    assert mqtt.encode_subscribe(1, mqtt.SYS_CLIENTS_CONNECTED) == bytes.fromhex(
        "82"  # SUBSCRIBE, reserved flags 0010
        "22"  # remaining length 34
        "0001"  # packet id 1
        "001d" + b"$SYS/broker/clients/connected".hex() + "00"  # topic filter, requested QoS 0
    )


@pytest.mark.parametrize("packet_id", [0, 65536])
def test_encode_subscribe_rejects_packet_ids_outside_1_65535(packet_id: int) -> None:
    with pytest.raises(ValueError, match="mqtt packet id must be 1-65535"):
        mqtt.encode_subscribe(packet_id, "t")


def _parse_count(data: bytes) -> bytes | object:
    return mqtt.parse_subscribed_value(data, topic=mqtt.SYS_CLIENTS_CONNECTED, packet_id=1)


def test_parse_subscribed_value_every_prefix_then_payload() -> None:
    for i in range(len(MOSQUITTO_COUNT)):
        assert _parse_count(MOSQUITTO_COUNT[:i]) is NEED_MORE, i
    assert _parse_count(MOSQUITTO_COUNT) == b"3"
    assert _parse_count(MOSQUITTO_COUNT + b"\xd0\x00") == b"3"  # a PINGRESP after it changes nothing


def test_parse_subscribed_value_skips_other_topics_and_reads_qos1_packet_id() -> None:
    other = bytes.fromhex("30050001783939")  # PUBLISH to "x", payload "99"
    qos1 = bytes.fromhex("3209000179000731313132")  # QoS 1 to "y", id 7, "1112"
    data = MOSQUITTO_COUNT[:4] + other + qos1
    assert mqtt.parse_subscribed_value(data, topic="y", packet_id=1) == b"1112"
    assert mqtt.parse_subscribed_value(data, topic="z", packet_id=1) is NEED_MORE


def test_parse_subscribed_value_refused_subscription() -> None:
    refused = MOSQUITTO_COUNT[:4] + bytes.fromhex("9003000180")  # SUBACK return code Failure
    with pytest.raises(
        SniffError, match=r"broker refused the subscription to '\$SYS/broker/clients/connected'"
    ):
        _parse_count(refused)
    other_id = MOSQUITTO_COUNT[:4] + bytes.fromhex("9003000280")  # another SUBSCRIBE's failure
    assert _parse_count(other_id) is NEED_MORE


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (bytes.fromhex("20ffffffff7f"), "remaining length exceeds 4 bytes"),
        (bytes.fromhex("3003000578"), "PUBLISH topic name at offset 4 overruns the packet"),
        (bytes.fromhex("30030001ff"), "PUBLISH topic name is not valid UTF-8"),
        (bytes.fromhex("900100"), "SUBACK packet id at offset 2 overruns the packet"),
    ],
)
def test_parse_subscribed_value_malformed(data: bytes, match: str) -> None:
    with pytest.raises(SniffError, match=match):
        _parse_count(data)


@given(cut=st.integers(min_value=0, max_value=len(MOSQUITTO_COUNT)), tail=st.binary(max_size=100))
def test_parse_subscribed_value_prefix_plus_junk_never_crashes(cut: int, tail: bytes) -> None:
    try:
        result = _parse_count(MOSQUITTO_COUNT[:cut] + tail)
    except SniffError as exc:
        result = exc
    assert result is NEED_MORE or isinstance(result, bytes | SniffError)


def test_parse_connack_reads_the_code_past_a_long_remaining_length() -> None:
    """Scenario: an MQTT 5 CONNACK whose properties make its remaining length two bytes."""
    encoded = mqtt.encode_connack(0x9C, protocol_level=5, server_reference="h" * 195 + ":1883")
    assert mqtt.parse_connack(encoded) == 0x9C
    assert mqtt.parse_connack(bytes.fromhex("20020003")) == 0x03
    for i in range(5):  # the fixed header, the flags and the code: nothing to say before them
        assert mqtt.parse_connack(encoded[:i]) is NEED_MORE
    with pytest.raises(SniffError, match="expected CONNACK"):
        mqtt.parse_connack(b"\x30\x00")
