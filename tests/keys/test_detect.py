"""Detection order: the first bytes pick the sniffer; `protocols=` narrows the candidates."""

from __future__ import annotations

import pytest

from keys import NEED_MORE
from keys.detect import ARTEMIS_PROTOCOLS, SNIFFERS, make_detector


@pytest.mark.parametrize(
    ("prefix", "name"),
    [
        (b"\x16\x03\x01", "tls"),
        (b"AMQP\x03\x01\x00\x00", "amqp"),
        (b"AM", "amqp"),
        (b"ARTEMIS", "core"),
        (b"AR", "core"),
        (b"HORNETQ", "core"),
        (b"\x10", "mqtt"),
        (b"\x00\x00\x01\x06\x01ActiveMQ", "openwire"),
        (b"CONNECT\n", "stomp"),
        (b"STOMP\n", "stomp"),
        (b"\n\nCONNECT\n", "stomp"),
    ],
)
def test_make_detector_picks_sniffer_from_first_bytes(prefix: bytes, name: str) -> None:
    chosen = make_detector()(prefix)
    assert chosen is not None
    assert chosen is not NEED_MORE
    assert getattr(chosen, "name", None) == name


@pytest.mark.parametrize("prefix", [b"GET / HTTP/1.1\r\n", b"\xff\xfe", b"\x20\x02"])
def test_make_detector_unknown_protocol_is_none(prefix: bytes) -> None:
    assert make_detector()(prefix) is None


def test_make_detector_empty_prefix_is_none() -> None:
    assert make_detector()(b"") is None


def test_one_a_is_amqp_or_core_until_the_second_byte() -> None:
    assert make_detector()(b"A") is NEED_MORE
    assert getattr(make_detector(("AMQP",))(b"A"), "name", None) == "amqp"


def test_hornetq_in_protocols_means_the_core_sniffer() -> None:
    assert getattr(make_detector(("HORNETQ",), tls=False)(b"HORNETQ"), "name", None) == "core"
    assert make_detector(("AMQP",), tls=False)(b"ARTEMIS") is None


def test_make_detector_protocols_narrow_candidates() -> None:
    mqtt_only = make_detector(("MQTT",), tls=False)
    assert getattr(mqtt_only(b"\x10"), "name", None) == "mqtt"
    assert mqtt_only(b"AMQP") is None
    assert mqtt_only(b"\x16\x03\x01") is None


def test_artemis_protocol_names_cover_every_sniffer() -> None:
    assert set(SNIFFERS) <= ARTEMIS_PROTOCOLS
    assert {"CORE", "HORNETQ"} <= ARTEMIS_PROTOCOLS
