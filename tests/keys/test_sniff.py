"""The sniffer contract's own types."""

from __future__ import annotations

import pytest

from keys import NEED_MORE, Reply, Sniffed, SniffError, WireProtocol


def test_sniff_error_message_names_protocol_and_reason() -> None:
    err = SniffError("mqtt", "remaining length exceeds 4 bytes")
    assert str(err) == "mqtt: remaining length exceeds 4 bytes"
    assert (err.protocol, err.reason) == ("mqtt", "remaining length exceeds 4 bytes")
    with pytest.raises(ValueError, match="remaining length"):
        raise err


def test_sniffed_repr_never_shows_password() -> None:
    sniffed = Sniffed(protocol=WireProtocol.MQTT, user_name="bob", password="s3cret")
    assert "s3cret" not in repr(sniffed)
    assert sniffed.password == "s3cret"


def test_need_more_and_reply_are_distinct_results() -> None:
    results: list[object] = [Reply(b"AMQP\x03\x01\x00\x00"), NEED_MORE]
    assert results[0] != results[1]
    assert isinstance(results[0], Reply)
    assert results[0].to_client.startswith(b"AMQP")
