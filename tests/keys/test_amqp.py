"""AMQP 1.0 sniffer, broker-preamble measures and encoders (keys/amqp.py).

The client fixtures were captured from python-qpid-proton 0.40.0 (`proton.utils.BlockingConnection`)
connecting to a throwaway plain-socket server on 127.0.0.1 that answered with this module's own
sniffer and encoders (SASL header + sasl-mechanisms, sasl-outcome ok, AMQP header, then Open +
Close redirect), which proton accepted. Each capture notes how the client split its writes.
The broker fixtures were captured by replaying those client bytes to a proton 0.40.0
`Container.listen` server (built-in SASL: offers ANONYMOUS only, so PLAIN fails with code 1).
"""

from __future__ import annotations

import ctypes
import re
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

import keys.amqp as amqp
from keys import WireProtocol
from keys.amqp import (
    AMQP_HEADER,
    SASL_HEADER,
    AmqpMap,
    AmqpSniffer,
    Described,
    Frame,
    Symbol,
    decode_performative,
    decode_value,
    encode_close,
    encode_open,
    encode_sasl_mechanisms,
    encode_sasl_outcome,
    parse_frame,
    redirect_frames,
    refusal_frames,
    server_preamble,
    sniff_server_plain_preamble,
    sniff_server_sasl_preamble,
)
from keys.sniff import NEED_MORE, NeedMore, Reply, Sniffed, SniffError
from tests.keys.conftest import OneConnectionServer, assert_sniff_outcome, read_until_sniffed, sniff_outcome

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

    from proton import Connection

    from keys.sniff import Sniffer, SniffResult


def _hex(*fields: str) -> bytes:
    return bytes.fromhex("".join(fields))


# --- server side: what the router answers (these bytes made proton go on) ---------------------

MECHANISMS_FRAME = _hex(
    "0000002b",  # frame size 43
    "02",  # doff: 2 words
    "01",  # type 1: SASL
    "0000",  # ignored
    "005340",  # described, smallulong 0x40: sasl-mechanisms
    "c01e01",  # list8, size 30, 1 field
    "e01b03a3",  # array8, size 27, 3 elements of sym8
    "05504c41494e",  # "PLAIN"
    "09414e4f4e594d4f5553",  # "ANONYMOUS"
    "0845585445524e414c",  # "EXTERNAL"
)
OUTCOME_OK_FRAME = _hex(
    "00000010",  # frame size 16
    "02010000",  # doff 2, type SASL, ignored
    "005344",  # sasl-outcome
    "c00301",  # list8, size 3, 1 field
    "5000",  # code: ubyte 0 (ok)
)

# --- client captures ----------------------------------------------------------------------------

# proton 0.40.0, BlockingConnection("amqp://user:pass@127.0.0.1:PORT", allowed_mechs="PLAIN",
# container_id="capture-proton-plain"). Three writes: SASL header | sasl-init | AMQP header + Open.
PROTON_PLAIN = _hex(
    # write 1: protocol header
    "414d5150",  # "AMQP"
    "03",  # protocol id 3: SASL
    "010000",  # version 1.0.0
    # write 2: sasl-init frame
    "00000021",  # frame size 33
    "02",  # doff 2
    "01",  # type SASL
    "0000",  # ignored
    "005341",  # described, smallulong 0x41: sasl-init
    "c01402",  # list8, size 20, 2 fields
    "a305504c41494e",  # mechanism: sym8 "PLAIN"
    "a00a",  # initial-response: vbin8, 10 bytes
    "00757365720070617373",  # authzid "" NUL authcid "user" NUL passwd "pass"
    # write 3: AMQP header, then the Open frame
    "414d515000010000",  # "AMQP" 0 1.0.0
    "00000037",  # frame size 55
    "02",  # doff 2
    "00",  # type AMQP
    "0000",  # channel 0
    "005310",  # described, smallulong 0x10: open
    "c02a04",  # list8, size 42, 4 fields
    "a114" + b"capture-proton-plain".hex(),  # container-id: str8
    "a109" + b"127.0.0.1".hex(),  # hostname: str8
    "7000008000",  # max-frame-size: uint 32768
    "607fff",  # channel-max: ushort 32767
)
PROTON_PLAIN_STAGES = (8, 41, 49)
"""Ends of the SASL header, the sasl-init frame and the AMQP header in PROTON_PLAIN."""

# proton 0.40.0, BlockingConnection("amqp://127.0.0.1:PORT", allowed_mechs="ANONYMOUS",
# container_id="capture-proton-anon"). Same three writes as PLAIN.
PROTON_ANONYMOUS = _hex(
    "414d515003010000",  # SASL header
    "00000024",  # frame size 36
    "02010000",  # doff 2, type SASL, ignored
    "005341",  # sasl-init
    "c01702",  # list8, size 23, 2 fields
    "a309" + b"ANONYMOUS".hex(),  # mechanism: sym8
    "a009" + b"anonymous".hex(),  # initial-response: vbin8 trace "anonymous" (RFC 4505)
    "414d515000010000",  # AMQP header
    "00000036",  # frame size 54
    "02000000",  # doff 2, type AMQP, channel 0
    "005310",  # open
    "c02904",  # list8, size 41, 4 fields
    "a113" + b"capture-proton-anon".hex(),  # container-id
    "a109" + b"127.0.0.1".hex(),  # hostname
    "7000008000",  # max-frame-size: uint 32768
    "607fff",  # channel-max: ushort 32767
)
PROTON_ANONYMOUS_STAGES = (8, 44, 52)

# proton 0.40.0, BlockingConnection("amqp://127.0.0.1:PORT", sasl_enabled=False,
# container_id="capture-proton-nosasl"). One write: AMQP header + Open.
PROTON_NO_SASL = _hex(
    "414d515000010000",  # AMQP header: protocol id 0, version 1.0.0
    "00000038",  # frame size 56
    "02000000",  # doff 2, type AMQP, channel 0
    "005310",  # open
    "c02b04",  # list8, size 43, 4 fields
    "a115" + b"capture-proton-nosasl".hex(),  # container-id
    "a109" + b"127.0.0.1".hex(),  # hostname
    "7000008000",  # max-frame-size
    "607fff",  # channel-max
)

SASL_REPLIES = (
    SASL_HEADER + MECHANISMS_FRAME,
    SASL_HEADER + MECHANISMS_FRAME + OUTCOME_OK_FRAME,
    SASL_HEADER + MECHANISMS_FRAME + OUTCOME_OK_FRAME + AMQP_HEADER,
)

PLAIN_SNIFFED = Sniffed(
    protocol=WireProtocol.AMQP,
    client_id="capture-proton-plain",
    hostname="127.0.0.1",
    user_name="user",
    password="pass",
    sasl_mechanism="PLAIN",
    protocol_version="1.0",
)
ANONYMOUS_SNIFFED = Sniffed(
    protocol=WireProtocol.AMQP,
    client_id="capture-proton-anon",
    hostname="127.0.0.1",
    sasl_mechanism="ANONYMOUS",
    protocol_version="1.0",
)
NO_SASL_SNIFFED = Sniffed(
    protocol=WireProtocol.AMQP,
    client_id="capture-proton-nosasl",
    hostname="127.0.0.1",
    protocol_version="1.0",
)

# --- broker captures ----------------------------------------------------------------------------

# proton 0.40.0 Container.listen() answering the replayed PROTON_ANONYMOUS bytes: SASL header,
# mechanisms (ANONYMOUS), outcome ok, AMQP header, then its Open (relayed to the client).
BROKER_ANONYMOUS_OK = _hex(
    "414d515003010000",  # SASL header
    "0000001c02010000",  # frame size 28, doff 2, SASL
    "005340c00f01",  # sasl-mechanisms, list8 size 15, 1 field
    "e00c01a309" + b"ANONYMOUS".hex(),  # array8 of one sym8
    "0000001002010000",  # frame size 16, doff 2, SASL
    "005344c003015000",  # sasl-outcome, code ubyte 0 (ok)
    "414d515000010000",  # AMQP header
    # the broker's Open, to be relayed:
    "0000001902000000",  # frame size 25, doff 2, AMQP, channel 0
    "005310c00c04",  # open, list8 size 12, 4 fields
    "a100",  # container-id: "" (the listening container's)
    "40",  # hostname: null
    "7000008000",  # max-frame-size 32768
    "607fff",  # channel-max 32767
)
BROKER_PREAMBLE_LEN = 8 + 28 + 16 + 8
# The same server answering the replayed PROTON_PLAIN bytes: PLAIN is not offered, so code 1.
BROKER_PLAIN_REJECTED = _hex(
    "414d515003010000",  # SASL header
    "0000001c02010000005340c00f01e00c01a309" + b"ANONYMOUS".hex(),  # mechanisms
    "0000001002010000005344c00301",  # sasl-outcome
    "5001",  # code: ubyte 1 (auth)
)
# The same server answering PROTON_NO_SASL: AMQP header, then its Open.
BROKER_NO_SASL = _hex(
    "414d515000010000",  # AMQP header
    "0000001902000000005310c00c04a100407000008000607fff",  # Open
)

SNIFFER = AmqpSniffer()


def _expected_for_prefix(length: int, stages: tuple[int, ...], replies: tuple[bytes, ...]) -> SniffResult:
    result: SniffResult = NEED_MORE
    for end, reply in zip(stages, replies, strict=True):
        if length >= end:
            result = Reply(reply)
    return result


def _with_header(header: bytes, *frames: bytes) -> bytes:
    return header + b"".join(frames)


def _frame(frame_type: int, body: bytes, *, doff: int = 2) -> bytes:
    extended = b"\x00" * (doff * 4 - 8)
    return (
        (8 + len(extended) + len(body)).to_bytes(4, "big") + bytes((doff, frame_type, 0, 0)) + extended + body
    )


def _sasl_init(mechanism: bytes, response: bytes | None = None, hostname: bytes | None = None) -> bytes:
    fields = b"\xa3" + bytes((len(mechanism),)) + mechanism
    fields += b"\x40" if response is None else b"\xa0" + bytes((len(response),)) + response
    fields += b"\x40" if hostname is None else b"\xa1" + bytes((len(hostname),)) + hostname
    body = b"\x00\x53\x41\xc0" + bytes((len(fields) + 1, 3)) + fields
    return _frame(1, body)


def _open(fields: bytes, count: int, descriptor: bytes = b"\x00\x53\x10") -> bytes:
    return _frame(0, descriptor + b"\xc0" + bytes((len(fields) + 1, count)) + fields)


def _str8(text: str) -> bytes:
    raw = text.encode()
    return b"\xa1" + bytes((len(raw),)) + raw


# ===============================================================================================
# R10 1-3: real captures, every prefix, trailing data
# ===============================================================================================


class TestCaptures:
    def test_sniffer_satisfies_contract(self) -> None:
        sniffer: Sniffer = AmqpSniffer()
        assert sniffer.name == "amqp"

    @pytest.mark.parametrize(
        ("capture", "stages", "expected"),
        [
            (PROTON_PLAIN, PROTON_PLAIN_STAGES, PLAIN_SNIFFED),
            (PROTON_ANONYMOUS, PROTON_ANONYMOUS_STAGES, ANONYMOUS_SNIFFED),
        ],
        ids=["plain", "anonymous"],
    )
    def test_sniff_amqp_sasl_every_prefix_then_sniffed(
        self, capture: bytes, stages: tuple[int, ...], expected: Sniffed
    ) -> None:
        """Scenario: the handshake arrives split at every offset; each prefix gets the cumulative
        reply due at that point."""
        for i in range(len(capture)):
            assert SNIFFER.sniff(capture[:i]) == _expected_for_prefix(i, stages, SASL_REPLIES), i
        assert SNIFFER.sniff(capture) == expected

    def test_sniff_amqp_plain_password_is_kept(self) -> None:
        result = SNIFFER.sniff(PROTON_PLAIN)
        assert isinstance(result, Sniffed)
        assert result.password == "pass"

    def test_sniff_amqp_without_sasl_every_prefix_then_sniffed(self) -> None:
        for i in range(len(PROTON_NO_SASL)):
            expected: SniffResult = Reply(AMQP_HEADER) if i >= 8 else NEED_MORE
            assert SNIFFER.sniff(PROTON_NO_SASL[:i]) == expected, i
        assert SNIFFER.sniff(PROTON_NO_SASL) == NO_SASL_SNIFFED

    @pytest.mark.parametrize(
        ("capture", "expected"),
        [
            (PROTON_PLAIN, PLAIN_SNIFFED),
            (PROTON_ANONYMOUS, ANONYMOUS_SNIFFED),
            (PROTON_NO_SASL, NO_SASL_SNIFFED),
        ],
        ids=["plain", "anonymous", "no-sasl"],
    )
    @pytest.mark.parametrize(
        "trailing",
        [b"\x00", b"\x00\x00\x00\x08\x02\x00\x00\x00", b"garbage that is not a frame", bytes(range(256))],
    )
    def test_sniff_amqp_trailing_bytes_do_not_change_result(
        self, capture: bytes, expected: Sniffed, trailing: bytes
    ) -> None:
        assert SNIFFER.sniff(capture + trailing) == expected

    def test_sniff_amqp_pipelined_sasl_handshake_in_one_buffer(self) -> None:
        """Scenario: a client sends SASL header, sasl-init, AMQP header and Open at once; the
        router learns what it still owes from `server_preamble`."""
        result = SNIFFER.sniff(PROTON_PLAIN)
        assert isinstance(result, Sniffed)
        assert server_preamble(result) == SASL_REPLIES[-1]
        assert server_preamble(NO_SASL_SNIFFED) == AMQP_HEADER

    def test_sniff_amqp_replies_only_grow(self) -> None:
        sent = b""
        for i in range(len(PROTON_PLAIN)):
            result = SNIFFER.sniff(PROTON_PLAIN[:i])
            if isinstance(result, Reply):
                assert result.to_client.startswith(sent)
                sent = result.to_client
        assert sent == SASL_REPLIES[-1]


# ===============================================================================================
# R10 4: fuzz
# ===============================================================================================

CAPTURES = [PROTON_PLAIN, PROTON_ANONYMOUS, PROTON_NO_SASL]


@given(capture=st.sampled_from(CAPTURES), data=st.data(), tail=st.binary(max_size=200))
def test_sniff_amqp_prefix_plus_garbage_never_crashes(
    capture: bytes, data: st.DataObject, tail: bytes
) -> None:
    cut = data.draw(st.integers(0, len(capture)))
    assert_sniff_outcome(SNIFFER, capture[:cut] + tail)


@given(capture=st.sampled_from(CAPTURES), data=st.data())
def test_sniff_amqp_mutated_capture_never_crashes(capture: bytes, data: st.DataObject) -> None:
    """Scenario: one to three bytes of a real handshake changed, reaching the decoder's depths."""
    mutated = bytearray(capture)
    for _ in range(data.draw(st.integers(1, 3))):
        mutated[data.draw(st.integers(0, len(capture) - 1))] = data.draw(st.integers(0, 255))
    assert_sniff_outcome(SNIFFER, bytes(mutated))


@given(st.binary(max_size=400))
def test_sniff_amqp_random_bytes_never_crash(blob: bytes) -> None:
    for candidate in (blob, SASL_HEADER + blob, AMQP_HEADER + blob):
        assert_sniff_outcome(SNIFFER, candidate)


@given(st.binary(max_size=300))
def test_decode_value_random_bytes_only_sniff_error(blob: bytes) -> None:
    result = sniff_outcome(decode_value, blob)
    assert isinstance(result, (tuple, SniffError))


@given(data=st.data(), tail=st.binary(max_size=100))
def test_sniff_server_sasl_preamble_prefix_plus_garbage_never_crashes(
    data: st.DataObject, tail: bytes
) -> None:
    cut = data.draw(st.integers(0, len(BROKER_ANONYMOUS_OK)))
    for measure in (sniff_server_sasl_preamble, sniff_server_plain_preamble):
        result = sniff_outcome(measure, BROKER_ANONYMOUS_OK[:cut] + tail)
        assert result is NEED_MORE or isinstance(result, (int, SniffError))


# ===============================================================================================
# Errors
# ===============================================================================================


class TestErrors:
    def test_sniff_amqp_0_9_1_header_is_named(self) -> None:
        msg = "amqp: unsupported protocol header b'AMQP\\x00\\x00\\t\\x01' (AMQP 0-9-1)"
        with pytest.raises(SniffError, match=re.escape(msg)):
            SNIFFER.sniff(b"AMQP\x00\x00\x09\x01")

    @pytest.mark.parametrize(
        ("header", "name"),
        [
            (b"AMQP\x01\x01\x00\x0a", "AMQP 0-10"),
            (b"AMQP\x01\x01\x08\x00", "AMQP 0-8"),
            (b"AMQP\x02\x01\x00\x00", "AMQP TLS layer 1.0.0; use TLS on the socket instead"),
            (b"AMQP\x00\x02\x00\x00", "AMQP version 2.0.0"),
            (b"AMQP\x03\x01\x01\x00", "SASL layer version 1.1.0"),
            (b"AMQP\x09\x01\x00\x00", "unknown protocol id 9, version 1.0.0"),
        ],
    )
    def test_sniff_amqp_other_headers_are_named(self, header: bytes, name: str) -> None:
        with pytest.raises(SniffError, match=re.escape(f"({name})")):
            SNIFFER.sniff(header)

    @pytest.mark.parametrize("data", [b"G", b"GET / HTTP/1.1\r\n", b"AMQX", b"\x10\x20"])
    def test_sniff_amqp_not_amqp_fails_at_first_wrong_byte(self, data: bytes) -> None:
        with pytest.raises(SniffError, match=r"protocol header must start with b'AMQP'"):
            SNIFFER.sniff(data)

    def test_sniff_amqp_error_quotes_at_most_32_bytes(self) -> None:
        with pytest.raises(SniffError) as info:
            SNIFFER.sniff(b"X" * 1000)
        assert "X" * 9 not in str(info.value)

    @pytest.mark.parametrize(
        ("frame_head", "match"),
        [
            (b"\x00\x00\x00\x04", "frame size 4 is smaller than the 8-byte frame header"),
            (b"\x00\x01\x00\x01", "frame size 65537 exceeds the handshake limit of 65536 bytes"),
            (b"\xff\xff\xff\xff", "frame size 4294967295 exceeds"),
            (b"\x00\x00\x00\x10\x01", "frame data offset 1 is below the minimum of 2 words"),
            (b"\x00\x00\x00\x10\x05", "frame data offset 5 words points past the frame size 16"),
        ],
    )
    def test_sniff_amqp_bad_frame_header_fails_early(self, frame_head: bytes, match: str) -> None:
        """Scenario: a bad field fails as soon as it arrives, not when the frame is complete."""
        with pytest.raises(SniffError, match=match):
            SNIFFER.sniff(SASL_HEADER + frame_head)
        with pytest.raises(SniffError, match=match):
            SNIFFER.sniff(AMQP_HEADER + frame_head)

    def test_sniff_amqp_amqp_frame_during_sasl(self) -> None:
        with pytest.raises(SniffError, match=re.escape("expected a sasl frame (type 1), got frame type 0")):
            SNIFFER.sniff(SASL_HEADER + _frame(0, b"\x00\x53\x41\x45"))

    def test_sniff_amqp_sasl_frame_after_amqp_header(self) -> None:
        with pytest.raises(SniffError, match=re.escape("expected an amqp frame (type 0), got frame type 1")):
            SNIFFER.sniff(AMQP_HEADER + _sasl_init(b"PLAIN", b"\x00u\x00p"))

    def test_sniff_amqp_amqp_header_instead_of_sasl_init(self) -> None:
        with pytest.raises(
            SniffError, match=re.escape("expected a sasl frame, got a protocol header b'AMQP\\x00")
        ):
            SNIFFER.sniff(SASL_HEADER + PROTON_NO_SASL)

    def test_sniff_amqp_client_sends_wrong_sasl_performative(self) -> None:
        with pytest.raises(SniffError, match="expected sasl-init from the client, got sasl-response"):
            SNIFFER.sniff(SASL_HEADER + _frame(1, b"\x00\x53\x43\x45"))

    def test_sniff_amqp_unsupported_mechanism(self) -> None:
        msg = "unsupported sasl mechanism 'SCRAM-SHA-256' (offered PLAIN, ANONYMOUS, EXTERNAL)"
        with pytest.raises(SniffError, match=re.escape(msg)):
            SNIFFER.sniff(SASL_HEADER + _sasl_init(b"SCRAM-SHA-256", b"n,,n=user,r=abc"))

    def test_sniff_amqp_mechanism_must_be_symbol(self) -> None:
        body = b"\x00\x53\x41\xc0\x08\x01" + _str8("PLAIN")
        with pytest.raises(SniffError, match="sasl-init mechanism must be a symbol, got str"):
            SNIFFER.sniff(SASL_HEADER + _frame(1, body))

    @pytest.mark.parametrize(
        ("response", "match"),
        [
            (None, "sasl plain needs an initial-response, got none"),
            (b"user\x00pass", "exactly 2 NUL separators, got 1"),
            (b"\x00user\x00pa\x00ss", "exactly 2 NUL separators, got 3"),
            (b"\x00\x00pass", "sasl plain authcid is empty"),
            (b"\x00us\xffer\x00pass", "sasl plain response is not valid utf-8"),
        ],
    )
    def test_sniff_amqp_bad_plain_response(self, response: bytes | None, match: str) -> None:
        with pytest.raises(SniffError, match=match):
            SNIFFER.sniff(SASL_HEADER + _sasl_init(b"PLAIN", response))

    def test_sniff_amqp_missing_amqp_header_after_sasl(self) -> None:
        data = SASL_HEADER + _sasl_init(b"ANONYMOUS") + SASL_HEADER
        with pytest.raises(
            SniffError, match=re.escape("unsupported protocol header b'AMQP\\x03\\x01\\x00\\x00'")
        ):
            SNIFFER.sniff(data)
        with pytest.raises(SniffError, match="header after sasl must start with b'AMQP'"):
            SNIFFER.sniff(SASL_HEADER + _sasl_init(b"ANONYMOUS") + _open(_str8("c"), 1))

    def test_sniff_amqp_first_performative_not_open(self) -> None:
        begin = _frame(0, b"\x00\x53\x11\xc0\x03\x02\x40\x40")
        with pytest.raises(SniffError, match="expected open as the first performative, got begin"):
            SNIFFER.sniff(AMQP_HEADER + begin)

    def test_sniff_amqp_open_without_container_id(self) -> None:
        with pytest.raises(SniffError, match="open container-id is missing"):
            SNIFFER.sniff(AMQP_HEADER + _frame(0, b"\x00\x53\x10\x45"))

    def test_sniff_amqp_open_container_id_wrong_type(self) -> None:
        with pytest.raises(SniffError, match="open container-id must be a string, got symbol"):
            SNIFFER.sniff(AMQP_HEADER + _open(b"\xa3\x01c", 1))

    def test_sniff_amqp_open_hostname_wrong_type(self) -> None:
        with pytest.raises(SniffError, match="open hostname must be a string, got int"):
            SNIFFER.sniff(AMQP_HEADER + _open(_str8("c") + b"\x52\x07", 2))

    def test_sniff_amqp_body_not_described_list(self) -> None:
        with pytest.raises(SniffError, match="frame body is not a described list"):
            SNIFFER.sniff(AMQP_HEADER + _frame(0, _str8("hello")))

    def test_sniff_amqp_unknown_type_code(self) -> None:
        with pytest.raises(SniffError, match="unknown type code 0xff"):
            SNIFFER.sniff(AMQP_HEADER + _open(_str8("c") + b"\xff", 2))

    def test_sniff_amqp_container_id_not_utf8(self) -> None:
        with pytest.raises(SniffError, match="string is not valid utf-8"):
            SNIFFER.sniff(AMQP_HEADER + _open(b"\xa1\x02\xc3\x28", 1))

    def test_sniff_amqp_list_count_larger_than_its_bytes(self) -> None:
        body = b"\x00\x53\x10\xc0\x03\xff\x40\x40"
        with pytest.raises(SniffError, match="list count 255 exceeds its 2 bytes of items"):
            SNIFFER.sniff(AMQP_HEADER + _frame(0, body))

    def test_sniff_amqp_value_runs_past_frame(self) -> None:
        with pytest.raises(SniffError, match="value needs 16 bytes"):
            SNIFFER.sniff(AMQP_HEADER + _open(b"\xa1\x10abc", 1))

    def test_sniff_amqp_deep_nesting_is_an_error_not_recursion(self) -> None:
        nested = b"\x00\x53\x10" + b"\x00\x53\x00" * 5000 + b"\x45"
        with pytest.raises(SniffError, match="nested deeper than 32 levels"):
            SNIFFER.sniff(AMQP_HEADER + _frame(0, nested))
        lists = b"\x45"
        for _ in range(40):
            lists = b"\xc0" + bytes((len(lists) + 1, 1)) + lists
        with pytest.raises(SniffError, match="nested deeper than 32 levels"):
            SNIFFER.sniff(AMQP_HEADER + _frame(0, b"\x00\x53\x10" + lists))

    def test_sniff_amqp_nested_arrays_are_an_error_not_recursion(self) -> None:
        """Scenario: arrays whose element type is array nest without a constructor per level."""
        arrays = b"\xe0\x00\x00\x45"
        for _ in range(3000):  # would be ~9000 Python frames deep without the limit
            arrays = b"\xf0" + (len(arrays) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + arrays
        body = b"\x00\x53\x10\xd0" + (len(arrays) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + arrays
        with pytest.raises(SniffError, match="nested deeper than 32 levels"):
            SNIFFER.sniff(AMQP_HEADER + _frame(0, body))

    def test_sniff_amqp_empty_sasl_frame(self) -> None:
        with pytest.raises(SniffError, match="frame has no performative"):
            SNIFFER.sniff(SASL_HEADER + _frame(1, b""))


# ===============================================================================================
# Variants the captures do not cover
# ===============================================================================================


class TestVariants:
    def test_sniff_amqp_skips_empty_frames_before_open(self) -> None:
        """Scenario: heartbeat (empty) frames before the Open (§2.4.5) are skipped."""
        data = AMQP_HEADER + _frame(0, b"") + _frame(0, b"") + _open(_str8("c1"), 1)
        assert SNIFFER.sniff(data) == Sniffed(
            protocol=WireProtocol.AMQP, client_id="c1", protocol_version="1.0"
        )

    def test_sniff_amqp_symbolic_descriptor_and_wide_encodings(self) -> None:
        """Scenario: descriptor as symbol `amqp:open:list`, list32, str32, extended header."""
        name = b"amqp:open:list"
        fields = b"\xb1\x00\x00\x00\x02c2" + b"\xb1\x00\x00\x00\x04host"
        body = b"\x00\xa3" + bytes((len(name),)) + name + b"\xd0" + (len(fields) + 4).to_bytes(4, "big")
        body += (2).to_bytes(4, "big") + fields
        data = AMQP_HEADER + _frame(0, body, doff=3)
        assert SNIFFER.sniff(data) == Sniffed(
            protocol=WireProtocol.AMQP, client_id="c2", hostname="host", protocol_version="1.0"
        )

    def test_sniff_amqp_hostname_falls_back_to_sasl_init(self) -> None:
        data = (
            SASL_HEADER + _sasl_init(b"PLAIN", b"\x00u\x00p", b"vhost") + AMQP_HEADER + _open(_str8("c"), 1)
        )
        result = SNIFFER.sniff(data)
        assert isinstance(result, Sniffed)
        assert (result.hostname, result.user_name, result.password) == ("vhost", "u", "p")

    def test_sniff_amqp_external_has_no_user_name(self) -> None:
        data = SASL_HEADER + _sasl_init(b"EXTERNAL", b"") + AMQP_HEADER + _open(_str8("c"), 1)
        assert SNIFFER.sniff(data) == Sniffed(
            protocol=WireProtocol.AMQP, client_id="c", sasl_mechanism="EXTERNAL", protocol_version="1.0"
        )

    def test_sniff_amqp_plain_authzid_is_ignored(self) -> None:
        data = SASL_HEADER + _sasl_init(b"PLAIN", b"admin\x00bob\x00s3cret") + AMQP_HEADER
        data += _open(_str8("c"), 1)
        result = SNIFFER.sniff(data)
        assert isinstance(result, Sniffed)
        assert (result.user_name, result.password) == ("bob", "s3cret")

    @pytest.mark.parametrize(
        ("prefix", "expected"),
        [
            (b"", True),
            (b"A", True),
            (b"AMQ", True),
            (b"AMQP\x00\x00\x09\x01", True),
            (b"B", False),
            (b"AMQX", False),
            (b"\x10", False),
            (b"CONNECT", False),
        ],
    )
    def test_looks_like_amqp(self, prefix: bytes, expected: bool) -> None:
        assert SNIFFER.looks_like(prefix) is expected


# ===============================================================================================
# The type system
# ===============================================================================================


@pytest.mark.parametrize(
    ("encoded", "value"),
    [
        ("40", None),
        ("41", True),
        ("42", False),
        ("5600", False),
        ("5601", True),
        ("50ff", 255),
        ("51ff", -1),
        ("60ffff", 65535),
        ("61ff00", -256),
        ("70ffffffff", 4294967295),
        ("71fffffffe", -2),
        ("52ff", 255),
        ("43", 0),
        ("80ffffffffffffffff", 2**64 - 1),
        ("81ffffffffffffffff", -1),
        ("53ff", 255),
        ("44", 0),
        ("54ff", -1),
        ("55fe", -2),
        ("723fc00000", 1.5),
        ("823ff8000000000000", 1.5),
        ("7300000041", "A"),
        ("830000000000000001", 1),
        ("7401020304", bytes.fromhex("01020304")),
        ("a003010203", b"\x01\x02\x03"),
        ("b00000000101", b"\x01"),
        ("a102c3a9", "é"),
        ("b10000000178", "x"),
        ("a30161", Symbol("a")),
        ("b30000000162", Symbol("b")),
        ("45", []),
        ("c003024041", [None, True]),
        ("d0000000050000000142", [False]),
        ("c10502a3016141", AmqpMap(((Symbol("a"), True),))),
        ("d100000006000000024040", AmqpMap(((None, None),))),
        ("e00402500102", [1, 2]),
        ("f00000000700000002500102", [1, 2]),
        ("e0050200531045", [Described(0x10, []), Described(0x10, [])]),
        ("00531045", Described(0x10, [])),
    ],
)
def test_decode_value_types(encoded: str, value: object) -> None:
    data = bytes.fromhex(encoded)
    decoded, end = decode_value(data)
    assert decoded == value
    assert type(decoded) is type(value)
    assert end == len(data)


def test_decode_value_uuid() -> None:
    decoded, _ = decode_value(b"\x98" + bytes(range(16)))
    assert str(decoded) == "00010203-0405-0607-0809-0a0b0c0d0e0f"


@pytest.mark.parametrize(
    ("encoded", "match"),
    [
        ("5602", "boolean byte must be 0 or 1"),
        ("7300110000", "char is not a unicode scalar value"),
        ("a302ff00", "symbol is not ascii"),
        ("c00101", "list count 1 exceeds its 0 bytes of items"),
        ("c005014040", "list size 5 runs past the end"),
        ("c003014040", "list has 1 bytes after its 1 items"),
        ("c1020140", "map has an odd number of items: 1"),
        ("c000", "list size 0 is smaller than its count field"),
        ("e002ff40", "array count 255 exceeds its 1 bytes of items"),
        ("e003014040", "array has 1 bytes after its 1 elements"),
        ("", "value needs 1 bytes at offset 0, only 0 left"),
    ],
)
def test_decode_value_malformed(encoded: str, match: str) -> None:
    with pytest.raises(SniffError, match=match):
        decode_value(bytes.fromhex(encoded))


def test_amqp_map_get_distinguishes_symbol_from_string() -> None:
    mapping = AmqpMap(((Symbol("port"), 1), ("port", 2)))
    assert mapping.get(Symbol("port")) == 1
    assert mapping.get("port") == 2
    assert mapping.get("other") is None


def test_parse_frame_need_more_and_complete() -> None:
    frame = OUTCOME_OK_FRAME
    for i in range(len(frame)):
        assert parse_frame(frame[:i]) is NEED_MORE
    assert parse_frame(frame + b"tail") == Frame(type=1, channel=0, body=frame[8:], size=16)
    assert parse_frame(b"xx" + frame, 2) == Frame(type=1, channel=0, body=frame[8:], size=16)


# ===============================================================================================
# Encoders
# ===============================================================================================


def _performative(data: bytes, offset: int = 0) -> tuple[int | None, list[object], int]:
    frame = parse_frame(data, offset)
    assert isinstance(frame, Frame)
    code, fields = decode_performative(frame)
    return code, list(fields), offset + frame.size


class TestEncoders:
    def test_encode_sasl_mechanisms_long_list_uses_array32(self) -> None:
        names = tuple(f"MECH-{i:03d}-" + "X" * 20 for i in range(20))
        _code, fields, _ = _performative(encode_sasl_mechanisms(names))
        assert fields == [list(names)]
        mechanisms = fields[0]
        assert isinstance(mechanisms, list)
        assert all(isinstance(name, Symbol) for name in mechanisms)

    def test_encode_sasl_frames_match_annotated_bytes(self) -> None:
        assert encode_sasl_mechanisms() == MECHANISMS_FRAME
        assert encode_sasl_outcome() == OUTCOME_OK_FRAME
        assert encode_sasl_outcome(1)[-1] == 1

    def test_encode_open_decodes(self) -> None:
        data = encode_open("r1", properties={"amqp:connection-establishment-failed": True})
        code, fields, end = _performative(data)
        assert (code, end) == (0x10, len(data))
        assert fields[0] == "r1"
        assert fields[1:9] == [None] * 8
        assert fields[9] == AmqpMap(((Symbol("amqp:connection-establishment-failed"), True),))

    def test_encode_open_without_properties_omits_trailing_nulls(self) -> None:
        assert encode_open("r1") == _hex("00000012", "02000000", "005310", "c00501", "a1027231")

    def test_encode_close_decodes(self) -> None:
        data = encode_close("amqp:connection:redirect", "moved", {"network-host": "h", "port": 5673})
        code, fields, end = _performative(data)
        assert (code, end) == (0x18, len(data))
        assert fields == [
            Described(
                0x1D,
                [
                    Symbol("amqp:connection:redirect"),
                    "moved",
                    AmqpMap(((Symbol("network-host"), "h"), (Symbol("port"), 5673))),
                ],
            )
        ]
        assert b"\xa3\x04port\x71\x00\x00\x16\x29" in data  # port: AMQP int (0x71), see docstring

    def test_encode_close_without_description_or_info(self) -> None:
        _code, fields, _ = _performative(encode_close("amqp:connection:forced"))
        assert fields == [Described(0x1D, [Symbol("amqp:connection:forced")])]

    def test_encode_close_long_values_use_wide_encodings(self) -> None:
        long = "x" * 300
        _code, fields, _ = _performative(encode_close("amqp:internal-error", long, {"k": long, "n": -5}))
        error = fields[0]
        assert isinstance(error, Described)
        assert error.value == [
            Symbol("amqp:internal-error"),
            long,
            AmqpMap(((Symbol("k"), long), (Symbol("n"), -5))),
        ]

    def test_redirect_frames_decode(self) -> None:
        data = redirect_frames("r1", "10.0.0.5", 5673)
        code, fields, end = _performative(data)
        assert code == 0x10
        assert fields[0] == "r1"
        code, fields, end2 = _performative(data, end)
        assert (code, end2) == (0x18, len(data))
        assert fields == [
            Described(
                0x1D,
                [
                    Symbol("amqp:connection:redirect"),
                    "Connection router r1 redirected this connection to 10.0.0.5:5673",
                    AmqpMap(((Symbol("network-host"), "10.0.0.5"), (Symbol("port"), 5673))),
                ],
            )
        ]

    @pytest.mark.parametrize("port", [0, -1, 65536])
    def test_redirect_frames_rejects_bad_port(self, port: int) -> None:
        with pytest.raises(ValueError, match="port must be 1-65535"):
            redirect_frames("r1", "h", port)

    @pytest.mark.parametrize(
        ("unavailable", "description"),
        [
            (False, "Connection router r1 rejected this connection"),
            (True, "Connection router r1 is not ready"),
        ],
    )
    def test_refusal_frames_decode(self, unavailable: bool, description: str) -> None:
        data = refusal_frames("r1", unavailable=unavailable)
        code, fields, end = _performative(data)
        assert code == 0x10
        assert fields[9] == AmqpMap(((Symbol("amqp:connection-establishment-failed"), True),))
        code, fields, end2 = _performative(data, end)
        assert (code, end2) == (0x18, len(data))
        assert fields == [Described(0x1D, [Symbol("amqp:connection:forced"), description])]


# ===============================================================================================
# Broker preamble measures (proxy mode)
# ===============================================================================================


class TestServerPreamble:
    def test_sniff_server_sasl_preamble_real_broker_every_prefix(self) -> None:
        for i in range(BROKER_PREAMBLE_LEN):
            assert sniff_server_sasl_preamble(BROKER_ANONYMOUS_OK[:i]) is NEED_MORE, i
        for i in range(BROKER_PREAMBLE_LEN, len(BROKER_ANONYMOUS_OK) + 1):
            assert sniff_server_sasl_preamble(BROKER_ANONYMOUS_OK[:i]) == BROKER_PREAMBLE_LEN
        rest = BROKER_ANONYMOUS_OK[BROKER_PREAMBLE_LEN:]
        code, fields, _ = _performative(rest)
        assert code == 0x10  # what is relayed to the client starts with the broker's Open
        assert fields[0] == ""

    def test_sniff_server_sasl_preamble_measures_our_own_preamble(self) -> None:
        assert sniff_server_sasl_preamble(SASL_REPLIES[-1] + b"\x00") == len(SASL_REPLIES[-1])

    def test_sniff_server_sasl_preamble_broker_rejects(self) -> None:
        with pytest.raises(
            SniffError, match=re.escape("amqp: broker rejected authentication: code 1 (auth)")
        ):
            sniff_server_sasl_preamble(BROKER_PLAIN_REJECTED)

    def test_sniff_server_sasl_preamble_unknown_code(self) -> None:
        data = SASL_HEADER + MECHANISMS_FRAME + OUTCOME_OK_FRAME[:-1] + b"\x09"
        with pytest.raises(SniffError, match=re.escape("code 9 (unknown)")):
            sniff_server_sasl_preamble(data)

    def test_sniff_server_sasl_preamble_code_not_a_ubyte(self) -> None:
        outcome = _frame(1, b"\x00\x53\x44\xc0\x02\x01\x40")
        with pytest.raises(SniffError, match="broker sasl-outcome code must be a ubyte, got NoneType"):
            sniff_server_sasl_preamble(SASL_HEADER + MECHANISMS_FRAME + outcome)

    def test_sniff_server_sasl_preamble_challenge_is_an_error(self) -> None:
        challenge = _frame(1, b"\x00\x53\x42\xc0\x03\x01\xa0\x00")
        with pytest.raises(SniffError, match="broker sent sasl-challenge where sasl-outcome was expected"):
            sniff_server_sasl_preamble(SASL_HEADER + MECHANISMS_FRAME + challenge)

    def test_sniff_server_sasl_preamble_broker_without_sasl(self) -> None:
        with pytest.raises(SniffError, match=re.escape("unsupported protocol header b'AMQP\\x00\\x01")):
            sniff_server_sasl_preamble(BROKER_NO_SASL)

    def test_sniff_server_plain_preamble_real_broker(self) -> None:
        for i in range(8):
            assert sniff_server_plain_preamble(BROKER_NO_SASL[:i]) is NEED_MORE
        assert sniff_server_plain_preamble(BROKER_NO_SASL) == 8

    def test_sniff_server_plain_preamble_broker_requires_sasl(self) -> None:
        with pytest.raises(SniffError, match="broker requires sasl"):
            sniff_server_plain_preamble(BROKER_ANONYMOUS_OK)


# ===============================================================================================
# proton accepts our frames
# ===============================================================================================


def _proton_client_after(server_bytes: bytes) -> Connection:
    """Feed `server_bytes` to an in-memory proton client connection (no socket)."""
    from proton import Connection, Transport

    connection = Connection()
    transport = Transport()
    transport.bind(connection)
    connection.container = "test-client"
    connection.open()
    transport.push(server_bytes)
    return connection


def _redirect_port_seen_by_proton_c(connection: Connection) -> int:
    """proton-c's own `pn_condition_redirect_port` (not wrapped by the Python binding)."""
    import cproton_ffi  # type: ignore[import-not-found]  # proton's cffi extension ships no stubs

    condition = cproton_ffi.lib.pn_connection_remote_condition(connection._impl)
    library = ctypes.CDLL(cproton_ffi.__file__)
    library.pn_condition_redirect_port.argtypes = [ctypes.c_void_p]
    port: int = library.pn_condition_redirect_port(int(cproton_ffi.ffi.cast("uintptr_t", condition)))
    return port


class TestProtonAccepts:
    def test_proton_reads_redirect_condition_info_and_port(self) -> None:
        from proton import symbol

        connection = _proton_client_after(AMQP_HEADER + redirect_frames("r1", "10.0.0.5", 5673))
        assert connection.remote_container == "r1"
        assert connection.remote_properties == {symbol("amqp:connection-establishment-failed"): True}
        condition = connection.remote_condition
        assert condition is not None
        assert condition.name == "amqp:connection:redirect"
        assert condition.info == {symbol("network-host"): "10.0.0.5", symbol("port"): 5673}
        assert _redirect_port_seen_by_proton_c(connection) == 5673

    def test_proton_c_reads_a_ushort_port_as_zero(self) -> None:
        """Scenario: why `port` is an AMQP int: proton-c's redirect helper reads only int."""
        info = amqp._enc_map(
            [
                (amqp._enc_symbol("network-host"), amqp._enc_string("h")),
                (amqp._enc_symbol("port"), b"\x60\x16\x29"),  # ushort 5673
            ]
        )
        error = amqp._enc_described(0x1D, [amqp._enc_symbol("amqp:connection:redirect"), b"\x40", info])
        close = amqp._enc_frame(0, amqp._enc_described(0x18, [error]))
        connection = _proton_client_after(AMQP_HEADER + encode_open("r1") + close)
        assert _redirect_port_seen_by_proton_c(connection) == 0

    @pytest.mark.parametrize("unavailable", [False, True])
    def test_proton_reads_refusal(self, unavailable: bool) -> None:
        connection = _proton_client_after(AMQP_HEADER + refusal_frames("r1", unavailable=unavailable))
        condition = connection.remote_condition
        assert condition is not None
        assert condition.name == "amqp:connection:forced"
        expected = "is not ready" if unavailable else "rejected this connection"
        assert condition.description == f"Connection router r1 {expected}"

    def test_proton_blocking_connection_sees_redirect(self) -> None:
        """Scenario: a plain-socket server runs the sniffer, answers SASL, then redirects; a real
        proton BlockingConnection fails with the redirect condition and its info map."""
        from proton.utils import BlockingConnection, ConnectionClosed

        seen: list[Sniffed] = []

        def redirect(conn: socket.socket) -> None:
            _, sniffed, sent = read_until_sniffed(conn, SNIFFER)
            seen.append(sniffed)
            conn.sendall(server_preamble(sniffed)[len(sent) :])
            conn.sendall(redirect_frames("r1", "127.0.0.1", 5673))
            conn.recv(4096)  # the client's Close, or EOF

        server = OneConnectionServer(redirect, timeout_s=10)
        with pytest.raises(ConnectionClosed) as info:
            BlockingConnection(
                f"amqp://bob:secret@127.0.0.1:{server.port}",
                timeout=10,
                allowed_mechs="PLAIN",
                container_id="redirect-test",
            )
        server.join()
        assert info.value.condition == "amqp:connection:redirect"
        assert "network-host" in str(info.value)
        assert "5673" in str(info.value)
        assert seen == [
            Sniffed(
                protocol=WireProtocol.AMQP,
                client_id="redirect-test",
                hostname="127.0.0.1",
                user_name="bob",
                password="secret",
                sasl_mechanism="PLAIN",
                protocol_version="1.0",
            )
        ]


# ===============================================================================================
# The health probe's side (probe=amqp): its encoders, and the broker's answers
# ===============================================================================================
# The broker fixtures are real bytes: everything RabbitMQ 3.10.8 (rabbitmq_amqp1_0, Debian
# 12, loopback) sent on 2026-11-22 to this module's own probe frames, recorded by a throwaway
# socket client (SASL PLAIN as alice, container id "$.artemis.internal.router.client.r.rmq-probe",
# then Close); the node's cluster_name was "rmq-probe".

RABBITMQ_SASL = _hex(
    "414d515003010000",  # SASL header (protocol id 3, version 1.0.0)
    "00000034",  # frame size 52
    "02010000",  # doff 2, type 1 (SASL), ignored
    "005340",  # described, smallulong 0x40: sasl-mechanisms
    "c02701",  # list8, size 39, 1 field
    "e02403b3",  # array8, size 36, 3 elements of sym32
    "00000009" + b"ANONYMOUS".hex(),
    "00000005" + b"PLAIN".hex(),
    "00000008" + b"AMQPLAIN".hex(),
)
RABBITMQ_OUTCOME_OK = _hex(
    "00000011",  # frame size 17
    "02010000",  # doff 2, SASL
    "005344",  # sasl-outcome
    "c00402",  # list8, size 4, 2 fields
    "5000",  # code: ubyte 0 (ok)
    "40",  # additional-data: null
)
RABBITMQ_OPEN = _hex(
    "414d515000010000",  # AMQP header (protocol id 0, version 1.0.0)
    "00000114",  # frame size 276
    "02000000",  # doff 2, type 0 (AMQP), channel 0
    "005310",  # open
    "d0000001040000000a",  # list32, size 260, 10 fields
    "a109" + b"rmq-probe".hex(),  # container-id (RabbitMQ's cluster_name)
    "404040",  # hostname, max-frame-size, channel-max: null (defaults)
    "700000ea60",  # idle-time-out: uint 60000 ms
    "40404040",  # outgoing-locales, incoming-locales, offered- and desired-capabilities: null
    "c1e70c",  # properties: map8, size 231, 12 items
    "a30c" + b"cluster_name".hex(),  # sym8 key, then a str8 value
    "a109" + b"rmq-probe".hex(),
    "a309" + b"copyright".hex(),
    "a137" + b"Copyright (c) 2007-2022 VMware, Inc. or its affiliates.".hex(),
    "a30b" + b"information".hex(),
    "a139" + b"Licensed under the MPL 2.0. Website: https://rabbitmq.com".hex(),
    "a308" + b"platform".hex(),
    "a111" + b"Erlang/OTP 25.2.3".hex(),
    "a307" + b"product".hex(),
    "a108" + b"RabbitMQ".hex(),
    "a307" + b"version".hex(),
    "a106" + b"3.10.8".hex(),
)
RABBITMQ_CLOSE = _hex(
    "0000000f",  # frame size 15
    "02000000",  # doff 2, AMQP, channel 0
    "005318",  # close
    "c00201",  # list8, size 2, 1 field
    "40",  # error: null
)
RABBITMQ_SESSION = RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + RABBITMQ_OPEN + RABBITMQ_CLOSE
"""Everything the broker sent in one probe, in order."""

PROBE_CONTAINER_ID = "$.artemis.internal.router.client.r.rmq-probe"


def _broker_frame(code: int, fields: bytes, count: int, frame_type: int = 0) -> bytes:
    """A performative `code` with list8 `fields` (`count` items) in a frame of `frame_type`."""
    return _frame(frame_type, bytes((0x00, 0x53, code, 0xC0, len(fields) + 1, count)) + fields)


def _close_with_error(condition: str, description: str) -> bytes:
    error = bytes((0x00, 0x53, 0x1D, 0xC0))
    items = bytes((0xA3, len(condition))) + condition.encode() + _str8(description)
    error += bytes((len(items) + 1, 2)) + items
    return _broker_frame(0x18, error, 1)


class TestProbeEncoders:
    def test_encode_sasl_init_plain_annotated(self) -> None:
        assert amqp.encode_sasl_init("PLAIN", amqp.sasl_plain_response("alice", "pw-alice")) == _hex(
            "00000026",  # frame size 38
            "02010000",  # doff 2, SASL
            "005341",  # sasl-init
            "c01902",  # list8, size 25, 2 fields (hostname null, omitted)
            "a305" + b"PLAIN".hex(),  # mechanism: sym8
            "a00f" + b"\x00alice\x00pw-alice".hex(),  # initial-response: vbin8, RFC 4616 message
        )

    def test_encode_sasl_init_anonymous_has_no_response(self) -> None:
        assert amqp.encode_sasl_init("ANONYMOUS") == _hex(
            "00000019", "02010000", "005341", "c00c01", "a309" + b"ANONYMOUS".hex()
        )

    def test_close_frame_has_no_error(self) -> None:
        close = _hex("0000000c", "02000000", "005318", "45")  # close, list0 (no error)
        assert close == amqp.CLOSE_FRAME

    def test_probe_handshake_is_a_valid_client_handshake(self) -> None:
        """Scenario: our own sniffer reads the probe's bytes as a SASL PLAIN client."""
        sent = (
            SASL_HEADER
            + amqp.encode_sasl_init("PLAIN", amqp.sasl_plain_response("alice", "pw-alice"))
            + AMQP_HEADER
            + encode_open(PROBE_CONTAINER_ID)
        )
        assert SNIFFER.sniff(sent) == Sniffed(
            protocol=WireProtocol.AMQP,
            client_id=PROBE_CONTAINER_ID,
            user_name="alice",
            password="pw-alice",
            sasl_mechanism="PLAIN",
            protocol_version="1.0",
        )

    @pytest.mark.parametrize(
        ("user", "password", "match"),
        [("", "pw", "non-empty user name"), ("a\x00b", "pw", "NUL"), ("alice", "p\x00w", "NUL")],
    )
    def test_sasl_plain_response_rejects_what_plain_cannot_carry(
        self, user: str, password: str, match: str
    ) -> None:
        with pytest.raises(ValueError, match=match):
            amqp.sasl_plain_response(user, password)

    def test_sasl_plain_response_is_utf8(self) -> None:
        assert amqp.sasl_plain_response("jürgen", "pä") == "\x00jürgen\x00pä".encode()


class TestProbeParsers:
    STAGES = (
        (amqp.parse_sasl_mechanisms, len(RABBITMQ_SASL), ("ANONYMOUS", "PLAIN", "AMQPLAIN")),
        (amqp.parse_sasl_outcome, len(RABBITMQ_SASL + RABBITMQ_OUTCOME_OK), 0),
        (
            amqp.parse_broker_open,
            len(RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + RABBITMQ_OPEN),
            amqp.BrokerOpen(container_id="rmq-probe"),
        ),
        (amqp.parse_broker_close, len(RABBITMQ_SESSION), amqp.BrokerClose()),
    )

    @pytest.mark.parametrize(("parse", "end", "expected"), STAGES)
    def test_parse_rabbitmq_every_prefix_then_answer(
        self, parse: Callable[[bytes], object], end: int, expected: object
    ) -> None:
        for i in range(end):
            assert parse(RABBITMQ_SESSION[:i]) is NEED_MORE, i
        assert parse(RABBITMQ_SESSION[:end]) == expected

    @pytest.mark.parametrize(("parse", "end", "expected"), STAGES)
    def test_parse_rabbitmq_trailing_bytes_change_nothing(
        self, parse: Callable[[bytes], object], end: int, expected: object
    ) -> None:
        assert parse(RABBITMQ_SESSION) == expected
        assert parse(RABBITMQ_SESSION[:end] + b"\x00\x00\x00") == expected  # a frame beginning

    @pytest.mark.parametrize(("parse", "end", "expected"), STAGES)
    def test_parse_rabbitmq_malformed_frame_after_the_answer_changes_nothing(
        self, parse: Callable[[bytes], object], end: int, expected: object
    ) -> None:
        """Scenario: a bad frame follows the answer in the same read (found by `fuzz/run amqp_broker`)."""
        bad = _hex("0000000b", "02000000", "a101ff")  # a complete frame; its str8 b"\xff" is not UTF-8
        assert parse(RABBITMQ_SESSION[:end] + bad) == expected

    def test_parse_broker_open_skips_heartbeats(self) -> None:
        heartbeat = _hex("00000008", "02000000")  # an empty frame (§2.4.5)
        data = RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + AMQP_HEADER + heartbeat + RABBITMQ_OPEN[8:]
        assert amqp.parse_broker_open(data) == amqp.BrokerOpen(container_id="rmq-probe")

    def test_parse_broker_close_finds_an_error_right_after_open(self) -> None:
        """Scenario: the broker opens, then closes at once with an error (a refused connection)."""
        close = _close_with_error("amqp:unauthorized-access", "vhost / denied")
        data = RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + RABBITMQ_OPEN + close
        assert amqp.parse_broker_open(data) == amqp.BrokerOpen(container_id="rmq-probe")
        assert amqp.parse_broker_close(data) == amqp.BrokerClose(
            condition="amqp:unauthorized-access", description="vhost / denied"
        )

    def test_parse_broker_open_reports_a_close_before_open(self) -> None:
        close = _close_with_error("amqp:connection:forced", "Connection router r is not ready")
        data = RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + AMQP_HEADER + close
        expected = amqp.BrokerClose(
            condition="amqp:connection:forced", description="Connection router r is not ready"
        )
        assert amqp.parse_broker_open(data) == amqp.BrokerOpen(container_id=None, close=expected)
        assert amqp.parse_broker_close(data) == expected

    def test_parse_sasl_outcome_auth_failure_code(self) -> None:
        failed = _broker_frame(0x44, b"\x50\x01", 1, frame_type=1)  # code 1 (auth)
        assert amqp.parse_sasl_outcome(RABBITMQ_SASL + failed) == 1
        assert amqp.sasl_outcome_name(1) == "auth"
        assert amqp.sasl_outcome_name(9) == "unknown"
        with pytest.raises(SniffError, match=re.escape("broker rejected authentication: code 1 (auth)")):
            amqp.parse_broker_open(RABBITMQ_SASL + failed + AMQP_HEADER)

    def test_parse_sasl_mechanisms_single_symbol_and_null(self) -> None:
        single = _broker_frame(0x40, b"\xa3\x05PLAIN", 1, frame_type=1)
        assert amqp.parse_sasl_mechanisms(SASL_HEADER + single) == ("PLAIN",)
        assert amqp.parse_sasl_mechanisms(SASL_HEADER + _broker_frame(0x40, b"", 0, 1)) == ()

    def test_parse_sasl_mechanisms_broker_without_sasl(self) -> None:
        msg = "amqp: broker does not offer sasl: it answered the sasl header with b'AMQP\\x00\\x01\\x00\\x00'"
        with pytest.raises(SniffError, match=re.escape(msg)):
            amqp.parse_sasl_mechanisms(AMQP_HEADER)

    @pytest.mark.parametrize(
        ("parse", "data", "match"),
        [
            (
                amqp.parse_sasl_mechanisms,
                SASL_HEADER + _broker_frame(0x44, b"\x50\x00", 1, frame_type=1),
                "broker sent sasl-outcome where sasl-mechanisms was expected",
            ),
            (
                amqp.parse_sasl_mechanisms,
                SASL_HEADER + _broker_frame(0x40, b"\xa1\x01x", 1, frame_type=1),
                "sasl-server-mechanisms must be symbols, got str",
            ),
            (
                amqp.parse_sasl_outcome,
                RABBITMQ_SASL + _broker_frame(0x42, b"\xa0\x00", 1, frame_type=1),
                "broker sent sasl-challenge where sasl-outcome was expected",
            ),
            (
                amqp.parse_sasl_outcome,
                RABBITMQ_SASL + _broker_frame(0x44, b"\xa1\x00", 1, frame_type=1),
                "broker sasl-outcome code must be a ubyte, got str",
            ),
            (
                amqp.parse_broker_open,
                RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + AMQP_HEADER + _broker_frame(0x11, b"", 0),
                "broker sent begin where open was expected",
            ),
            (
                amqp.parse_broker_open,
                RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + AMQP_HEADER + _broker_frame(0x10, b"\x40", 1),
                "broker open container-id must be a string, got NoneType",
            ),
        ],
    )
    def test_parse_broker_answers_malformed(
        self, parse: Callable[[bytes], object], data: bytes, match: str
    ) -> None:
        with pytest.raises(SniffError, match=re.escape(match)):
            parse(data)

    @pytest.mark.parametrize(
        ("error", "match"),
        [
            (b"\xa1\x01x", "close error must be a described list, got str"),
            (b"\x00\x53\x18\x45", "close error has descriptor close"),
            (b"\x00\x53\x1d\xc0\x03\x01\xa1\x00", "close error condition must be a symbol, got str"),
            (b"\x00\x53\x1d\xc0\x05\x02\xa3\x00\xa3\x00", "close error description must be a string"),
        ],
    )
    def test_parse_broker_close_malformed_error(self, error: bytes, match: str) -> None:
        data = RABBITMQ_SASL + RABBITMQ_OUTCOME_OK + RABBITMQ_OPEN + _broker_frame(0x18, error, 1)
        with pytest.raises(SniffError, match=re.escape(match)):
            amqp.parse_broker_close(data)


PROBE_PARSERS = [
    amqp.parse_sasl_mechanisms,
    amqp.parse_sasl_outcome,
    amqp.parse_broker_open,
    amqp.parse_broker_close,
]
PROBE_RESULTS = (tuple, int, amqp.BrokerOpen, amqp.BrokerClose, NeedMore, SniffError)


@given(parse=st.sampled_from(PROBE_PARSERS), data=st.data(), tail=st.binary(max_size=200))
def test_parse_broker_answers_prefix_plus_garbage_never_crash(
    parse: Callable[[bytes], object], data: st.DataObject, tail: bytes
) -> None:
    cut = data.draw(st.integers(0, len(RABBITMQ_SESSION)))
    assert isinstance(sniff_outcome(parse, RABBITMQ_SESSION[:cut] + tail), PROBE_RESULTS)


@given(parse=st.sampled_from(PROBE_PARSERS), data=st.data())
def test_parse_broker_answers_mutated_capture_never_crash(
    parse: Callable[[bytes], object], data: st.DataObject
) -> None:
    mutated = bytearray(RABBITMQ_SESSION)
    for _ in range(data.draw(st.integers(1, 3))):
        mutated[data.draw(st.integers(0, len(mutated) - 1))] = data.draw(st.integers(0, 255))
    assert isinstance(sniff_outcome(parse, bytes(mutated)), PROBE_RESULTS)
