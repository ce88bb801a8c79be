"""Tests of the CORE probe's bytes (router/features/probes/core_session.py): what it sends, read
back with `keys.core.parse_opening`, and how it reads real Artemis 2.40 answers (STYLE R10).

The broker's bytes are real: what Artemis 2.40.0 (tests.conftest `Artemis`, login admin/admin)
sent on 2026-11-29 to this module's opening and SESSION_CLOSE, recorded by a throwaway socket
client on 127.0.0.1.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import NEED_MORE, SniffError
from keys.core import (
    ARTEMIS_MAGIC,
    MAX_PACKET_BYTES,
    SECURITY_EXCEPTION,
    CoreException,
    PacketType,
    encode_exception,
    encode_packet,
    parse_opening,
)
from router.features.probes.checks import probe_client_id
from router.features.probes.core_session import (
    CONNECTION_TTL_MS,
    PROBE_VERSION,
    SESSION_CHANNEL,
    SESSION_CLOSE,
    ProbeAnswer,
    encode_opening,
    parse_close_answer,
    parse_session_answer,
)


def _hex(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts))


SESSION_NAME = "0b9c2a5e-8d1f-4f43-9a55-3c1e4a7b2d10"
CLIENT_ID = probe_client_id("r", "a1")

OPENING = _hex(
    "415254454d4953",  # "ARTEMIS"
    "00000011",  # length 17
    "0a",  # type 10: PING
    "0000000000000000",  # channel 0
    f"{CONNECTION_TTL_MS:016x}",  # connectionTTL 60000 ms, the Java client's
    "00000096",  # length 150
    "ee",  # type -18: CREATESESSION_V2
    "0000000000000001",  # channel 1
    "000000240024",  # name: 36 UTF-16 units, modified UTF-8 of 36 bytes
    SESSION_NAME.encode().hex(),
    "000000000000000a",  # sessionChannelID 10
    "00000083",  # version 131 (2.18): every Artemis with routers takes it
    "010000000500610064006d0069006e",  # username: present, 5 units (UTF-16BE) "admin"
    "010000000500610064006d0069006e",  # password: present, "admin"
    "00019000",  # minLargeMessageSize 102400
    "000000",  # xa, autoCommitSends, autoCommitAcks: false
    "ffffffff",  # windowSize -1
    "00",  # preAcknowledge false
    "00",  # defaultAddress null
    "01000000250025",  # clientID: present, 37 units, modified UTF-8 of 37 bytes
    CLIENT_ID.encode().hex(),
)

PING_ECHO = _hex("00000011", "0a", "0000000000000000", "000000000000ea60")
"""The broker echoes the PING on channel 0 (`LocalChannelHandler`)."""

ACCEPTED = PING_ECHO + _hex(
    "0000000d",  # length 13
    "1f",  # type 31: CREATESESSION_RESP
    "0000000000000001",  # channel 1
    "00000088",  # serverVersion 136 (Artemis 2.40)
)
REFUSED_MESSAGE = (
    "AMQ229031: Unable to validate user from 127.0.0.1:59262. Username: admin; "
    "SSL certificate subject DN: unavailable"
)
REFUSED = PING_ECHO + _hex(
    "00000085",  # length 133
    "14",  # type 20: EXCEPTION
    "0000000000000001",  # channel 1
    "00000069",  # code 105: SECURITY_EXCEPTION
    "01000000710071",  # message: present, 113 units, modified UTF-8 of 113 bytes
    REFUSED_MESSAGE.encode().hex(),
)
CLOSED = _hex(
    "00000011",  # length 17
    "15",  # type 21: NULL_RESPONSE
    "000000000000000a",  # channel 10, the session's
    "ffffffffffffffff",  # correlationID -1 (NullResponseMessage_V2)
)


class TestOpening:
    def test_encode_opening_annotated(self) -> None:
        opening = encode_opening(
            session_name=SESSION_NAME, user_name="admin", password="admin", client_id=CLIENT_ID
        )
        assert opening == OPENING

    @pytest.mark.parametrize(("user", "password"), [("admin", "s3cret"), (None, None), ("", "")])
    def test_encode_opening_reads_back_as_a_java_clients(
        self, user: str | None, password: str | None
    ) -> None:
        """Scenario: the router's own CORE sniffer reads the probe's opening as it reads the Java
        client's: the PING answered, then the session's user, password and client ID."""
        opening = parse_opening(
            encode_opening(session_name=SESSION_NAME, user_name=user, password=password, client_id=CLIENT_ID)
        )
        assert opening is not NEED_MORE
        assert opening.magic == ARTEMIS_MAGIC
        assert [a.packet_type for a in opening.answered] == [PacketType.PING]
        assert opening.to_client == PING_ECHO
        session = opening.session
        assert session is not None
        assert (session.packet_type, session.name, session.session_channel, session.version) == (
            PacketType.CREATESESSION_V2,
            SESSION_NAME,
            SESSION_CHANNEL,
            PROBE_VERSION,
        )
        assert (session.user_name, session.password, session.client_id) == (user, password, CLIENT_ID)

    def test_session_close_is_an_empty_sess_close_on_the_session_channel(self) -> None:
        expected = _hex(
            "00000009",  # length 9: type and channel only
            "45",  # type 69: SESS_CLOSE
            "000000000000000a",  # channel 10, the session's
        )
        assert expected == SESSION_CLOSE


class TestAnswers:
    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            pytest.param(ACCEPTED, ProbeAnswer(exception=None, end=len(ACCEPTED)), id="accepted"),
            pytest.param(
                REFUSED,
                ProbeAnswer(
                    exception=CoreException(code=SECURITY_EXCEPTION, message=REFUSED_MESSAGE),
                    end=len(REFUSED),
                ),
                id="refused",
            ),
        ],
    )
    def test_parse_session_answer_real_artemis(self, data: bytes, expected: ProbeAnswer) -> None:
        for i in range(len(data)):
            assert parse_session_answer(data[:i]) is NEED_MORE, i
        assert parse_session_answer(data) == expected
        assert parse_session_answer(data + CLOSED + b"\x00\x00") == expected  # trailing bytes

    def test_parse_close_answer_after_the_session_answer(self) -> None:
        data = ACCEPTED + CLOSED
        for i in range(len(ACCEPTED), len(data)):
            assert parse_close_answer(data[:i], len(ACCEPTED)) is NEED_MORE, i
        assert parse_close_answer(data, len(ACCEPTED)) == ProbeAnswer(exception=None, end=len(data))

    def test_parse_answers_skip_channel_zero(self) -> None:
        """Scenario: a broker that sends more on channel 0 (a second PING echo, a topology
        message, a DISCONNECT) before answering: skipped."""
        noise = PING_ECHO + encode_packet(PacketType.CLUSTER_TOPOLOGY_V4, 0, b"\x00" * 30)
        noise += encode_packet(PacketType.DISCONNECT, 0, b"\x00")
        data = noise + ACCEPTED + noise + CLOSED
        answer = parse_session_answer(data)
        assert answer == ProbeAnswer(exception=None, end=len(noise + ACCEPTED))
        assert parse_close_answer(data, answer.end) == ProbeAnswer(exception=None, end=len(data))

    def test_parse_close_answer_exception_on_the_session_channel(self) -> None:
        refusal = encode_exception(119, "no")
        on_session = refusal[:5] + struct.pack(">q", SESSION_CHANNEL) + refusal[13:]
        assert parse_close_answer(ACCEPTED + on_session, len(ACCEPTED)) == ProbeAnswer(
            exception=CoreException(code=119, message="no"), end=len(ACCEPTED + on_session)
        )

    @pytest.mark.parametrize(
        ("data", "match"),
        [
            pytest.param(
                PING_ECHO + struct.pack(">i", MAX_PACKET_BYTES + 1),
                r"^core: packet length 65537 at offset 21 exceeds 65536$",
                id="packet-over-the-cap",
            ),
            pytest.param(
                _hex("00000008", "1f"),
                r"^core: packet length 8 at offset 0 is below the 9 bytes",
                id="too-short",
            ),
            pytest.param(
                encode_packet(PacketType.REATTACH_SESSION_RESP, 1, b"\xff\xff\xff\xff\x00"),
                r"^core: unexpected REATTACH_SESSION_RESP \(33\) on channel 1 at offset 0 "
                r"while waiting for CREATESESSION_RESP$",
                id="another-packet",
            ),
            pytest.param(
                encode_packet(PacketType.CREATESESSION_RESP, 10, b"\x00\x00\x00\x88"),
                r"^core: unexpected CREATESESSION_RESP \(31\) on channel 10",
                id="wrong-channel",
            ),
            pytest.param(
                encode_packet(99, 1, b""), r"^core: unexpected type 99 on channel 1", id="unknown-type"
            ),
            pytest.param(
                encode_packet(PacketType.EXCEPTION, 1, b"\x00\x00"),
                r"^core: EXCEPTION code needs 4 bytes at offset 0, only 2 are left",
                id="truncated-exception",
            ),
        ],
    )
    def test_parse_session_answer_errors_name_rule_and_value(self, data: bytes, match: str) -> None:
        with pytest.raises(SniffError, match=match):
            parse_session_answer(data)

    def test_parse_close_answer_waits_for_null_response(self) -> None:
        with pytest.raises(
            SniffError, match=r"unexpected CREATESESSION_RESP \(31\) on channel 1 at offset 38"
        ):
            parse_close_answer(ACCEPTED + ACCEPTED[21:], len(ACCEPTED))


@given(st.sampled_from([ACCEPTED, REFUSED, ACCEPTED + CLOSED]), st.integers(0, 300), st.binary(max_size=64))
def test_parse_answers_prefix_plus_junk_never_crash(data: bytes, cut: int, tail: bytes) -> None:
    """Scenario: any prefix of a real answer plus arbitrary bytes: an answer, NEED_MORE or a
    SniffError, never IndexError, struct.error or UnicodeDecodeError."""
    buffer = data[:cut] + tail
    for parse in (parse_session_answer, lambda b: parse_close_answer(b, min(cut, len(ACCEPTED)))):
        try:
            result = parse(buffer)
        except SniffError:
            continue
        assert result is NEED_MORE or isinstance(result, ProbeAnswer)
