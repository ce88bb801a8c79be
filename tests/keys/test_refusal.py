"""The broker's first answer read as a refusal (keys/refusal.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import WireProtocol, core
from keys.refusal import parse_refusal

MQTT, STOMP = WireProtocol.MQTT, WireProtocol.STOMP

CONNACK_OK = bytes.fromhex(
    "20"  # CONNACK
    "02"  # remaining length
    "00"  # acknowledge flags
    "00"  # return code 0: accepted (MQTT 3.1.1 §3.2.2.3)
)
CONNACK_UNAVAILABLE = bytes.fromhex("20 02 00 03")  # return code 3: server unavailable
CONNACK_V5_BUSY = bytes.fromhex(
    "20"  # CONNACK
    "03"  # remaining length
    "00"  # acknowledge flags
    "89"  # reason code 0x89: server busy (MQTT 5 §3.2.2.2)
    "00"  # property length 0
)


CORE = WireProtocol.CORE
CORE_PING_ECHO = bytes.fromhex(
    "00000011"  # length 17
    "0a"  # PING
    "0000000000000000"  # channel 0
    "000000000000ea60"  # connectionTTL 60000
)
CORE_TOPOLOGY = core.server_preamble(
    b"ARTEMIS" + core.encode_packet(core.PacketType.SUBSCRIBE_TOPOLOGY_V2, 0, bytes.fromhex("00 00000088"))
)
CORE_SESSION_OK = bytes.fromhex(
    "0000000d"  # length 13
    "1f"  # CREATESESSION_RESP
    "0000000000000001"  # channel 1
    "00000088"  # serverVersion 136
)
CORE_BAD_USER = core.encode_not_authorized("/127.0.0.1:53124", "bob")
"""EXCEPTION 105 with AMQ229031, as an Artemis broker answers bad credentials."""


@pytest.mark.parametrize(
    ("protocol", "data", "expected"),
    [
        (MQTT, CONNACK_OK, None),
        (MQTT, CONNACK_UNAVAILABLE, "mqtt CONNACK 0x03 server unavailable"),
        (MQTT, CONNACK_V5_BUSY, "mqtt CONNACK 0x89 server busy"),
        (MQTT, CONNACK_UNAVAILABLE + b"\x30\x00", "mqtt CONNACK 0x03 server unavailable"),
        (MQTT, bytes.fromhex("20 02 00 fe"), "mqtt CONNACK 0xfe refused"),
        (STOMP, b"ERROR\nmessage:too many connections\n\n\x00", "stomp ERROR: too many connections"),
        (STOMP, b"\nERROR\r\ncontent-type:text/plain\r\n\r\n\x00", "stomp ERROR"),
        (STOMP, b"CONNECTED\nversion:1.2\n\n\x00", None),
        (WireProtocol.AMQP, b"AMQP\x03\x01\x00\x00", None),
        (None, CONNACK_UNAVAILABLE, None),
        (CORE, CORE_PING_ECHO + CORE_TOPOLOGY + CORE_SESSION_OK, None),
        (
            CORE,
            CORE_PING_ECHO + CORE_TOPOLOGY + CORE_BAD_USER,
            "core EXCEPTION 105 (SECURITY_EXCEPTION): AMQ229031: Unable to validate user "
            "from /127.0.0.1:53124. Username: bob; SSL cer",  # the message cut at 80 characters
        ),
        (
            CORE,
            core.encode_refusal("r", unavailable=True),
            "core EXCEPTION 222 (ROUTING_EXCEPTION): AMQ229238: Connection router r not ready",
        ),
        (CORE, CORE_SESSION_OK + CORE_BAD_USER, None),
        (CORE, CORE_PING_ECHO + core.encode_exception(99, None), "core EXCEPTION 99"),
        (CORE, b"\x00\x00\x00\x01garbage", None),
    ],
)
def test_parse_refusal_reads_protocol_refusals(
    protocol: WireProtocol | None, data: bytes, expected: str | None
) -> None:
    assert parse_refusal(protocol, data) == expected


def test_parse_refusal_every_prefix_of_connack_is_no_refusal() -> None:
    for i in range(len(CONNACK_UNAVAILABLE)):
        assert parse_refusal(MQTT, CONNACK_UNAVAILABLE[:i]) is None


def test_parse_refusal_core_every_prefix_of_exception_is_no_refusal() -> None:
    answer = CORE_PING_ECHO + CORE_BAD_USER
    for i in range(len(answer)):
        assert parse_refusal(CORE, answer[:i]) is None
    assert parse_refusal(CORE, answer + b"\xff" * 9) is not None


@given(st.sampled_from([*WireProtocol, None]), st.binary(max_size=64))
def test_parse_refusal_never_raises(protocol: WireProtocol | None, data: bytes) -> None:
    result = parse_refusal(protocol, data)
    assert result is None or isinstance(result, str)
