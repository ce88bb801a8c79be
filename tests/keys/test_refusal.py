"""The broker's first answer read as a refusal (keys/refusal.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import WireProtocol
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
    ],
)
def test_parse_refusal_reads_protocol_refusals(
    protocol: WireProtocol | None, data: bytes, expected: str | None
) -> None:
    assert parse_refusal(protocol, data) == expected


def test_parse_refusal_every_prefix_of_connack_is_no_refusal() -> None:
    for i in range(len(CONNACK_UNAVAILABLE)):
        assert parse_refusal(MQTT, CONNACK_UNAVAILABLE[:i]) is None


@given(st.sampled_from([*WireProtocol, None]), st.binary(max_size=64))
def test_parse_refusal_never_raises(protocol: WireProtocol | None, data: bytes) -> None:
    result = parse_refusal(protocol, data)
    assert result is None or isinstance(result, str)
