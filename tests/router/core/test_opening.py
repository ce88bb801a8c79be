"""router/core/opening.py: the sans-IO opening buffer both data paths drive."""

from __future__ import annotations

import pytest

from keys import Sniffed, SniffError
from router.core.opening import SniffBuffer
from tests.router.datapath.test_reading import detect


def test_sniff_buffer_steps_without_io() -> None:
    """Scenario: the sans-IO core both drivers use (read_until_sniffed, the fast path): each step
    says what to send before reading on, or gives the result."""
    opening = SniffBuffer(detect, 64)
    assert (opening.step(), opening.protocol, opening.read_size) == (b"", "detect", 64)
    for chunk, reply in ((b"A", b"1"), (b"B", b"2")):
        opening.feed(chunk)
        assert opening.step() == reply  # only what the client has not had yet
        opening.check_cap()
    opening.feed(b"Cme;")
    result = opening.step()
    assert isinstance(result, Sniffed)
    assert (result.client_id, opening.raw, opening.replied) == ("me", b"ABCme;", b"12")


def test_sniff_buffer_rejects_an_opening_announced_over_the_cap_at_once() -> None:
    """Scenario: an opening that says it is bigger than the cap (an MQTT CONNECT's remaining
    length) is rejected as soon as it says so, not after reading up to the cap or the deadline."""
    opening = SniffBuffer(detect, 64)
    opening.feed(b"HELLO 64 ")
    assert opening.step() == b""
    opening.check_cap()  # 64 bytes fit
    opening = SniffBuffer(detect, 64)
    opening.feed(b"HELLO 65 ")
    assert opening.step() == b""
    with pytest.raises(SniffError, match=r"line: the opening announces 65 bytes, over the acceptor's cap"):
        opening.check_cap()


def test_sniff_buffer_cap_and_eof_are_errors() -> None:
    opening = SniffBuffer(detect, 8)
    opening.feed(b"HELLO bo")
    assert opening.step() == b""
    with pytest.raises(SniffError, match="line: no complete handshake in the first 8 bytes"):
        opening.check_cap()
    with pytest.raises(SniffError, match="line: client closed after 8 bytes, before the handshake"):
        opening.feed(b"")
