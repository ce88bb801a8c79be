"""What the router says itself (SPEC A6): exact bytes per protocol and outcome."""

from __future__ import annotations

import pytest

from keys import Reply, Sniffed, WireProtocol, amqp, openwire, stomp
from pools import Connector
from router.config.settings import AcceptorMode
from router.core import answers
from router.core.engine import RouteStatus

TARGET = Connector.from_url("b", "tcp://127.0.0.1:61617?nodeId=node-b")
MQTT5 = Sniffed(protocol=WireProtocol.MQTT, protocol_version="5")
MQTT311 = Sniffed(protocol=WireProtocol.MQTT, protocol_version="3.1.1")
AMQP_SASL = Sniffed(protocol=WireProtocol.AMQP, sasl_mechanism="PLAIN")
AMQP_PLAIN = Sniffed(protocol=WireProtocol.AMQP)
STOMP = Sniffed(protocol=WireProtocol.STOMP)
TLS = Sniffed(protocol=WireProtocol.TLS, sni_host="a.example")


@pytest.mark.parametrize(
    ("sniffed", "can"),
    [
        (MQTT5, True),
        (MQTT311, False),
        (AMQP_PLAIN, True),
        (Sniffed(protocol=WireProtocol.OPENWIRE), True),
        (STOMP, False),
        (TLS, False),
    ],
)
def test_can_follow_redirect(sniffed: Sniffed, can: bool) -> None:
    assert answers.can_follow_redirect(sniffed) is can


def test_redirect_mqtt5_is_connack_0x9c_with_server_reference() -> None:
    reference = b"127.0.0.1:61617"
    body = b"\x00\x9c" + bytes([3 + len(reference)]) + b"\x1c" + len(reference).to_bytes(2, "big") + reference
    assert answers.redirect(MQTT5, b"", TARGET, "r") == b"\x20" + bytes([len(body)]) + body


def test_redirect_mqtt311_is_artemis_connack_0x9c() -> None:
    assert answers.redirect(MQTT311, b"", TARGET, "r") == b"\x20\x02\x00\x9c"


def test_redirect_amqp_is_the_redirect_frames() -> None:
    assert answers.redirect(AMQP_PLAIN, b"", TARGET, "r") == amqp.redirect_frames("r", "127.0.0.1", 61617)


def test_redirect_stomp_is_an_error_frame_naming_the_target() -> None:
    said = answers.redirect(STOMP, b"", TARGET, "r")
    assert said == stomp.encode_error("Connection router r redirects to tcp://127.0.0.1:61617")


def test_redirect_tls_cannot_be_said() -> None:
    assert answers.redirect(TLS, b"", TARGET, "r") == b""  # closing is the answer


def test_redirect_goes_to_the_connector_given_not_the_pair_primary() -> None:
    backup = Connector.from_url("p", "(tcp://127.0.0.1:1,tcp://127.0.0.1:2)?nodeId=n").members[1]
    assert answers.redirect(STOMP, b"", backup, "r") == stomp.encode_error(
        "Connection router r redirects to tcp://127.0.0.1:2"
    )


@pytest.mark.parametrize(
    ("sniffed", "status", "expected"),
    [
        (MQTT5, RouteStatus.REFUSED_UNAVAILABLE, b"\x20\x03\x00\x88\x00"),
        (MQTT5, RouteStatus.REFUSED_USE_ANOTHER, b"\x20\x03\x00\x9c\x00"),
        (MQTT311, RouteStatus.REFUSED_UNAVAILABLE, b"\x20\x02\x00\x88"),
        (MQTT311, RouteStatus.REFUSED_USE_ANOTHER, b"\x20\x02\x00\x9c"),
        (AMQP_PLAIN, RouteStatus.REFUSED_UNAVAILABLE, amqp.refusal_frames("r", unavailable=True)),
        (AMQP_PLAIN, RouteStatus.REFUSED_USE_ANOTHER, amqp.refusal_frames("r", unavailable=False)),
        (STOMP, RouteStatus.REFUSED_UNAVAILABLE, stomp.encode_error("Connection router r is not ready")),
        (
            STOMP,
            RouteStatus.REFUSED_USE_ANOTHER,
            stomp.encode_error("Connection router r rejected this connection"),
        ),
        (Sniffed(protocol=WireProtocol.OPENWIRE), RouteStatus.REFUSED_UNAVAILABLE, b""),
        (TLS, RouteStatus.REFUSED_USE_ANOTHER, b""),
    ],
)
def test_refusal_per_protocol(sniffed: Sniffed, status: RouteStatus, expected: bytes) -> None:
    assert answers.refusal(sniffed, status, "r") == expected


def test_owed_opening_amqp_is_what_was_not_yet_sent() -> None:
    full = amqp.server_preamble(AMQP_SASL)
    assert answers.owed_opening(AMQP_SASL, b"", b"") == full
    assert answers.owed_opening(AMQP_SASL, b"", full[:8]) == full[8:]
    assert answers.owed_opening(AMQP_PLAIN, b"", b"") == amqp.AMQP_HEADER
    assert answers.owed_opening(MQTT5, b"", b"") == b""


def test_target_preamble_measure_per_protocol() -> None:
    assert answers.target_preamble_measure(AMQP_SASL, b"") is amqp.sniff_server_sasl_preamble
    assert answers.target_preamble_measure(AMQP_PLAIN, b"") is amqp.sniff_server_plain_preamble
    assert answers.target_preamble_measure(MQTT5, b"") is None
    assert answers.target_preamble_measure(STOMP, b"") is None


def test_owed_opening_openwire_pipelined_client_gets_the_echo() -> None:
    """Scenario: an OpenWire client that did not wait is owed the echo of its WireFormatInfo."""
    wire_format_info = _openwire_wfi()
    echo = openwire.OpenWireSniffer().sniff(wire_format_info)
    assert isinstance(echo, Reply)
    sniffed = Sniffed(protocol=WireProtocol.OPENWIRE)
    assert answers.owed_opening(sniffed, wire_format_info + b"more", b"") == echo.to_client
    assert answers.owed_opening(sniffed, wire_format_info, echo.to_client) == b""


def _openwire_wfi() -> bytes:
    """A minimal loose-encoded WireFormatInfo: magic, version 12, an empty property map."""
    body = (
        b"\x01"
        + b"ActiveMQ"
        + (12).to_bytes(4, "big")
        + b"\x01"
        + (4).to_bytes(4, "big")
        + (0).to_bytes(4, "big")
    )
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    ("mode", "sniffed", "expected"),
    [
        (AcceptorMode.REDIRECT, MQTT311, True),
        (AcceptorMode.REDIRECT, None, False),
        (AcceptorMode.AUTO, MQTT5, True),
        (AcceptorMode.AUTO, MQTT311, False),
        (AcceptorMode.PROXY, MQTT5, False),
    ],
)
def test_redirects_by_mode_and_client(mode: AcceptorMode, sniffed: Sniffed | None, expected: bool) -> None:
    assert answers.redirects(mode, sniffed) is expected
