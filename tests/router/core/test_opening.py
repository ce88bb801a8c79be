"""router/core/opening.py: the sans-IO opening buffer both data paths drive."""

from __future__ import annotations

import pytest

from keys import Sniffed, SniffError
from router.core.address import Address
from router.core.events import ConnectionRef, OpeningFailed, OpeningFailure
from router.core.opening import SniffBuffer, opening_failed
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


class TestOpeningFailed:
    """The OpeningFailed both data paths report for a client closed during its opening."""

    CONN = ConnectionRef(id=7, router="r", acceptor="a", peer=Address("127.0.0.2", 5000))

    def test_rejected_bytes_name_the_sniffer_and_what_was_wrong(self) -> None:
        error = SniffError("mqtt", "remaining length exceeds 4 bytes")
        assert opening_failed(self.CONN, error, bytes_read=6) == OpeningFailed(
            conn=self.CONN,
            failure=OpeningFailure.REJECTED,
            protocol="mqtt",
            detail="remaining length exceeds 4 bytes",
            bytes_read=6,
        )

    def test_a_timeout_names_the_sniffer_as_far_as_known_and_the_deadline(self) -> None:
        failed = opening_failed(
            self.CONN, OpeningFailure.TIMEOUT, protocol="detect", bytes_read=0, timeout_s=1.5
        )
        assert failed == OpeningFailed(
            conn=self.CONN, failure=OpeningFailure.TIMEOUT, protocol="detect", timeout_s=1.5
        )

    def test_a_failed_tls_handshake_is_tls_with_its_reason(self) -> None:
        failed = opening_failed(self.CONN, OpeningFailure.TLS, detail="UNKNOWN_CA")
        assert failed == OpeningFailed(
            conn=self.CONN, failure=OpeningFailure.TLS, protocol="tls", detail="UNKNOWN_CA"
        )
