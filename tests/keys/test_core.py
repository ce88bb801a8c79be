"""Tests of `keys.core`: the CORE sniffer, its answers, and the redirect and refusal encoders
(STYLE R10).

The openings are real: the Artemis 2.40.0 Java client's bytes, captured against a loopback server
that answered with this module (tests/keys/captures/README.md says how). The HORNETQ opening is
built by hand (the Artemis client cannot send that magic).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import NEED_MORE, KeyType, Reply, Sniffed, SniffError, WireProtocol, resolve_key
from keys.core import (
    MAX_PACKET_BYTES,
    NETTY_CONNECTOR_FACTORY,
    REMOTE_DISCONNECT,
    ROUTER_NODE_ID,
    ROUTING_EXCEPTION,
    SECURITY_EXCEPTION,
    SERVER_VERSION,
    CoreDisconnect,
    CoreException,
    CoreSniffer,
    CreateSession,
    DisconnectReason,
    PacketType,
    TransportConfig,
    decode_disconnect,
    decode_exception,
    decode_string,
    encode_create_session,
    encode_disconnect_v3,
    encode_exception,
    encode_not_authorized,
    encode_packet,
    encode_redirect,
    encode_refusal,
    encode_string,
    parse_opening,
    parse_packet,
    server_preamble,
)
from keys.resolve import ConnectionFacts
from router.core.opening import SniffBuffer
from tests.keys.conftest import mutate, sniff_outcome

SNIFFER = CoreSniffer()
CAPTURES_DIR = Path(__file__).resolve().parent / "captures"


def _hex(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts))


def load_capture(name: str) -> bytes:
    """A capture file: the hex lines that are not comments, joined."""
    lines = (CAPTURES_DIR / f"{name}.hex").read_text().splitlines()
    return bytes.fromhex("".join(line for line in lines if line and not line.startswith("#")))


# --- The annotated opening ----------------------------------------------------------------------
# tests/keys/captures/v2-client-id.hex, field by field (`PacketImpl.encode`: int32 length of what
# follows, int8 type, int64 channel, body; Strings per `UTF8Util.writeString`).

V2_CLIENT_ID = _hex(
    "415254454d4953",  # "ARTEMIS" (ActiveMQClientProtocolManager.handshake)
    # PING, twice: the scheduled pinger's first run and schedulePing's own send
    "00000011",  # length 17
    "0a",  # type 10: PING
    "0000000000000000",  # channel 0
    "000000000000ea60",  # connectionTTL 60000 ms
    "000000110a0000000000000000000000000000ea60",  # the second PING, the same 21 bytes
    "0000000e",  # length 14
    "71",  # type 113: SUBSCRIBE_TOPOLOGY_V2
    "0000000000000000",  # channel 0
    "00",  # clusterConnection false
    "00000088",  # clientVersion 136 (2.37 and later)
    # ... the client now waits for the topology; then:
    "0000007c",  # length 124
    "ee",  # type -18: CREATESESSION_V2
    "0000000000000001",  # channel 1
    "000000240024",  # name: int32 36 UTF-16 units (9 to 4094: modified UTF-8), uint16 36 bytes
    b"ba532819-ebac-11f1-b825-02fc00000001".hex(),
    "000000000000000a",  # sessionChannelID 10 (the client's channel IDs start at 10)
    "00000088",  # version 136
    "01000000050061006c006900630065",  # username: 01 present, int32 5 units (< 9: UTF-16BE) "alice"
    "0100000006007300330063007200650074",  # password: 01 present, 6 units, "s3cret"
    "00019000",  # minLargeMessageSize 102400
    "00",  # xa false
    "00",  # autoCommitSends false (the JMS connection's own session)
    "00",  # autoCommitAcks false
    "ffffffff",  # windowSize -1
    "00",  # preAcknowledge false
    "00",  # defaultAddress null
    "01000000090009636c69656e742d3432",  # clientID: 01 present, 9 units, 9 bytes "client-42"
)
OPENING_END = len(V2_CLIENT_ID)
PING = V2_CLIENT_ID[7:28]
SUBSCRIBE_V2 = V2_CLIENT_ID[49:67]
CREATE_SESSION_V2 = V2_CLIENT_ID[67:]

PING_ECHO = PING
"""The broker echoes the PING (`LocalChannelHandler`): the same packet, re-encoded."""

TOPOLOGY_V4 = _hex(
    "00000045",  # length 69
    "ef",  # type -17: CLUSTER_TOPOLOGY_V4
    "0000000000000000",  # channel 0
    "00",  # exit false
    "000000240024",  # nodeID: 36 units, modified UTF-8
    ROUTER_NODE_ID.encode().hex(),
    "0000000000000000",  # uniqueEventID 0 (no clock here)
    "00",  # hasPrimary false: the client uses the connector it dialled
    "00",  # hasBackup false
    "ff",  # last true: the client stops waiting for the topology
    "00",  # backupGroupName null
    "00",  # scaleDownGroupName null
    "00000088",  # serverVersion 136: >= 131, so the client sends CREATESESSION_V2
)


def _expected(
    client_id: str | None = "client-42", user: str | None = "alice", password: str | None = "s3cret"
):
    return Sniffed(
        protocol=WireProtocol.CORE,
        client_id=client_id,
        user_name=user,
        password=password,
        protocol_version="136",
    )


CAPTURES = {
    "v2-client-id": _expected(),
    "v2-no-client-id": _expected(client_id=None),
    "v2-no-credentials": _expected(user=None, password=None),
    "v2-unicode-client-id": _expected(client_id="kl\u00fcnt-\u20ac-\U0001f600-\x00"),
    "v2-long-client-id": _expected(client_id="c" * 4095),
    "unavailable": _expected(),
    "redirect": _expected(),
    "after-redirect": _expected(),
}
CAPTURE_NAMES = list(CAPTURES)


def test_annotated_opening_is_the_capture() -> None:
    """Scenario: the annotated fixture is exactly the captured file (re-running the capture
    changes the session name: copy the new one here)."""
    assert load_capture("v2-client-id") == V2_CLIENT_ID


class TestCaptures:
    """R10 1-3 over every capture of the real Java client."""

    @pytest.mark.parametrize("name", CAPTURE_NAMES)
    def test_sniff_core_capture_returns_user_password_and_client_id(self, name: str) -> None:
        result = SNIFFER.sniff(load_capture(name))
        assert result == CAPTURES[name]
        assert isinstance(result, Sniffed)
        assert result.password == CAPTURES[name].password

    def test_sniff_core_without_client_id_is_the_null_key(self) -> None:
        """Scenario: a factory without a client ID sends CREATESESSION_V2 with a null clientID:
        `client_id` None, which `resolve_key` turns into NULL, as Artemis's KeyResolver does."""
        result = SNIFFER.sniff(load_capture("v2-no-client-id"))
        assert isinstance(result, Sniffed)
        assert result.client_id is None
        assert resolve_key(KeyType.CLIENT_ID, None, ConnectionFacts(client_id=result.client_id)) == "NULL"

    @pytest.mark.parametrize("name", CAPTURE_NAMES)
    def test_sniff_core_every_prefix_needs_more_or_replies_never_a_key(self, name: str) -> None:
        full = load_capture(name)
        preamble = server_preamble(full)
        for i in range(len(full)):
            result = SNIFFER.sniff(full[:i])
            assert result is NEED_MORE or isinstance(result, Reply), (i, result)
            if isinstance(result, Reply):
                assert preamble.startswith(result.to_client), i

    def test_sniff_core_prefixes_of_annotated_opening_reply_step_by_step(self) -> None:
        """Scenario: NEED_MORE until the first PING is whole, then its echo, the second echo, then
        the topology once SUBSCRIBE_TOPOLOGY_V2 is whole; still that until CREATESESSION_V2 ends."""
        steps = [(28, NEED_MORE), (49, Reply(PING_ECHO)), (67, Reply(PING_ECHO * 2))]
        start = 0
        for end, expected in steps:
            for i in range(start, end):
                assert SNIFFER.sniff(V2_CLIENT_ID[:i]) == expected, i
            start = end
        for i in range(67, OPENING_END):
            assert SNIFFER.sniff(V2_CLIENT_ID[:i]) == Reply(PING_ECHO * 2 + TOPOLOGY_V4), i
        assert SNIFFER.sniff(V2_CLIENT_ID) == _expected()

    @pytest.mark.parametrize("name", CAPTURE_NAMES)
    @pytest.mark.parametrize("trailing", [b"\x00", b"\xff" * 40, PING, bytes(range(256))])
    def test_sniff_core_trailing_bytes_do_not_change_result(self, name: str, trailing: bytes) -> None:
        full = load_capture(name)
        assert SNIFFER.sniff(full + trailing) == CAPTURES[name]

    def test_parse_opening_reports_what_was_answered(self) -> None:
        opening = parse_opening(V2_CLIENT_ID)
        assert opening is not NEED_MORE
        assert opening.magic == b"ARTEMIS"
        assert [(a.packet_type, a.channel) for a in opening.answered] == [
            (PacketType.PING, 0),
            (PacketType.PING, 0),
            (PacketType.SUBSCRIBE_TOPOLOGY_V2, 0),
        ]
        assert [a.answer for a in opening.answered] == [PING_ECHO, PING_ECHO, TOPOLOGY_V4]
        assert opening.answered[0].broker_answers == {PacketType.PING}
        assert opening.answered[2].broker_answers == {
            PacketType.CLUSTER_TOPOLOGY,
            PacketType.CLUSTER_TOPOLOGY_V2,
            PacketType.CLUSTER_TOPOLOGY_V3,
            PacketType.CLUSTER_TOPOLOGY_V4,
        }
        assert opening.to_client == server_preamble(V2_CLIENT_ID) == PING_ECHO * 2 + TOPOLOGY_V4
        assert opening.end == OPENING_END
        session = opening.session
        assert session is not None
        assert (session.packet_type, session.name, session.session_channel, session.version) == (
            PacketType.CREATESESSION_V2,
            "ba532819-ebac-11f1-b825-02fc00000001",
            10,
            136,
        )
        assert (session.min_large_message_size, session.window_size, session.default_address) == (
            102400,
            -1,
            None,
        )
        assert "s3cret" not in repr(session)

    def test_parse_opening_after_redirect_answers_check_for_failover(self) -> None:
        """Scenario: the client that followed our DISCONNECT_V3 asks CHECK_FOR_FAILOVER about the
        node it learnt from our topology (our own ID) before it subscribes; the answer is yes."""
        opening = parse_opening(load_capture("after-redirect"))
        assert opening is not NEED_MORE
        kinds = [a.packet_type for a in opening.answered]
        assert kinds == [
            PacketType.PING,
            PacketType.PING,
            PacketType.CHECK_FOR_FAILOVER,
            PacketType.SUBSCRIBE_TOPOLOGY_V2,
        ]
        check = opening.answered[2]
        assert check.channel == 1
        assert check.answer == _hex(
            "0000000a", "fb", "0000000000000001", "ff"
        )  # CHECK_FOR_FAILOVER_REPLY true
        assert ROUTER_NODE_ID.encode() in load_capture("after-redirect")

    def test_server_preamble_of_pipelined_opening_is_every_answer(self) -> None:
        """Scenario: a client that sends its whole opening at once gets Sniffed before any Reply;
        the router then owes it `server_preamble`, the same bytes as the Replies would have been."""
        assert SNIFFER.sniff(V2_CLIENT_ID) == _expected()
        last_reply = SNIFFER.sniff(V2_CLIENT_ID[:-1])
        assert isinstance(last_reply, Reply)
        assert server_preamble(V2_CLIENT_ID) == last_reply.to_client


# --- Hand-built openings: HORNETQ, SUBSCRIBE_TOPOLOGY (V1), REATTACH_SESSION ---------------------


def _create_session(
    *,
    v2: bool = True,
    version: int = 136,
    user: str | None = "alice",
    password: str | None = "s3cret",
    client_id: str | None = "client-42",
) -> bytes:
    """A CREATESESSION(_V2) in `CreateSessionMessage(_V2).encodeRest` order."""

    def nullable(value: str | None) -> bytes:
        return b"\x00" if value is None else b"\x01" + encode_string(value)

    body = encode_string("ba532819-ebac-11f1-b825-02fc00000001") + struct.pack(">qi", 10, version)
    body += nullable(user) + nullable(password) + struct.pack(">i", 102400) + b"\x00\x00\x00"
    body += struct.pack(">i", -1) + b"\x00" + nullable(None)
    if v2:
        body += nullable(client_id)
    return encode_packet(PacketType.CREATESESSION_V2 if v2 else PacketType.CREATESESSION, 1, body)


def _subscribe(version: int | None) -> bytes:
    if version is None:
        return encode_packet(PacketType.SUBSCRIBE_TOPOLOGY, 0, b"\x00")
    return encode_packet(PacketType.SUBSCRIBE_TOPOLOGY_V2, 0, b"\x00" + struct.pack(">i", version))


HORNETQ_OPENING = b"HORNETQ" + PING + _subscribe(123) + _create_session(v2=False, version=123)
"""As a HornetQ 2.4 client sends it: version 123 (`HornetQClientProtocolManager.VERSION_PLAYED`),
CREATESESSION without client ID, no CHECK_FOR_FAILOVER (HornetQ has none)."""

TOPOLOGY_V2 = _hex(
    "00000040",  # length 64
    "72",  # type 114: CLUSTER_TOPOLOGY_V2 (what Artemis sends a non-clustered client of 122-130)
    "0000000000000000",  # channel 0
    "00",  # exit false
    "000000240024",
    ROUTER_NODE_ID.encode().hex(),  # nodeID
    "0000000000000000",  # uniqueEventID 0
    "0000ff",  # hasPrimary false, hasBackup false, last true
    "00",  # backupGroupName null
)
TOPOLOGY_V1 = _hex(
    "00000037",  # length 55
    "6e",  # type 110: CLUSTER_TOPOLOGY (no version known: SUBSCRIBE_TOPOLOGY has none)
    "0000000000000000",  # channel 0
    "00",  # exit false
    "000000240024",
    ROUTER_NODE_ID.encode().hex(),  # nodeID
    "0000ff",  # hasPrimary false, hasBackup false, last true
)


class TestHandBuilt:
    def test_sniff_hornetq_opening_answers_topology_v2_and_has_no_client_id(self) -> None:
        result = SNIFFER.sniff(HORNETQ_OPENING)
        assert result == Sniffed(
            protocol=WireProtocol.CORE,
            client_id=None,
            user_name="alice",
            password="s3cret",
            protocol_version="123",
        )
        assert server_preamble(HORNETQ_OPENING) == PING_ECHO + TOPOLOGY_V2
        opening = parse_opening(HORNETQ_OPENING)
        assert opening is not NEED_MORE
        assert opening.magic == b"HORNETQ"
        for i in range(len(HORNETQ_OPENING)):
            assert not isinstance(SNIFFER.sniff(HORNETQ_OPENING[:i]), Sniffed), i

    @pytest.mark.parametrize(
        ("subscribe", "answer"),
        [
            pytest.param(_subscribe(None), TOPOLOGY_V1, id="subscribe-v1"),
            pytest.param(_subscribe(121), TOPOLOGY_V1, id="v2-version-121"),
            pytest.param(_subscribe(122), TOPOLOGY_V2, id="v2-version-122"),
            pytest.param(_subscribe(130), TOPOLOGY_V2, id="v2-version-130"),
            pytest.param(_subscribe(131), TOPOLOGY_V4, id="v2-version-131"),
            pytest.param(_subscribe(140), TOPOLOGY_V4, id="v2-version-140"),
        ],
    )
    def test_sniff_core_topology_answer_follows_client_version(self, subscribe: bytes, answer: bytes) -> None:
        """Scenario: `ChannelImpl.supports`: V4 from 131, V2 from 122 (Artemis skips V3 for a
        non-clustered broker), the first variant below; the V4 server version is always 136."""
        assert SNIFFER.sniff(b"ARTEMIS" + subscribe) == Reply(answer)
        assert struct.unpack(">i", TOPOLOGY_V4[-4:])[0] == SERVER_VERSION

    def test_sniff_core_answers_reattach_session_with_unknown_session(self) -> None:
        """Scenario: a reconnecting client asks to reattach its session; the router knows none, so it
        answers as Artemis does for an unknown session and the client creates it again (V1)."""
        reattach = encode_packet(
            PacketType.REATTACH_SESSION, 1, encode_string("session-1") + struct.pack(">i", 7)
        )
        data = b"ARTEMIS" + PING + _subscribe(136) + reattach
        answer = _hex(
            "0000000e",  # length 14
            "21",  # type 33: REATTACH_SESSION_RESP
            "0000000000000001",  # channel 1
            "ffffffff",  # lastConfirmedCommandID -1
            "00",  # reattached false
        )
        assert SNIFFER.sniff(data) == Reply(PING_ECHO + TOPOLOGY_V4 + answer)
        result = SNIFFER.sniff(data + _create_session(v2=False))
        assert isinstance(result, Sniffed)
        assert (result.client_id, result.user_name) == (None, "alice")

    def test_sniff_core_check_for_failover_with_null_node_is_answered_yes(self) -> None:
        check = encode_packet(PacketType.CHECK_FOR_FAILOVER, 1, b"\x00")
        assert SNIFFER.sniff(b"ARTEMIS" + check) == Reply(_hex("0000000a", "fb", "0000000000000001", "ff"))

    def test_sniff_core_create_session_without_anything_before_it(self) -> None:
        """Scenario: a client that does not wait for the topology (the .NET client sends V1 at once)."""
        result = SNIFFER.sniff(b"ARTEMIS" + _create_session(v2=False, version=135))
        assert result == Sniffed(
            protocol=WireProtocol.CORE, user_name="alice", password="s3cret", protocol_version="135"
        )
        assert server_preamble(b"ARTEMIS" + _create_session()) == b""

    def test_sniff_core_ignores_bytes_after_a_packets_fields(self) -> None:
        """Scenario: Artemis's decoders read their fields from a packet and ignore the rest."""
        ping = encode_packet(PacketType.PING, 0, struct.pack(">q", 60000) + b"extra")
        assert SNIFFER.sniff(b"ARTEMIS" + ping) == Reply(PING_ECHO)


# --- Looks like, announced size and the byte cap ------------------------------------------------


class TestDetection:
    @pytest.mark.parametrize("magic", [b"ARTEMIS", b"HORNETQ"])
    def test_looks_like_every_prefix_of_the_magic(self, magic: bytes) -> None:
        full = magic + PING
        for i in range(len(full) + 1):
            assert SNIFFER.looks_like(full[:i]), i

    @pytest.mark.parametrize(
        "prefix",
        [
            b"AMQP\x00\x01\x00\x00",
            b"\x10",
            b"CONNECT\n",
            b"\x00\x00\x01\x06\x01ActiveMQ",
            b"\x16\x03\x01",
            b"ARTEMIX",
        ],
    )
    def test_looks_like_rejects_other_protocols(self, prefix: bytes) -> None:
        assert not SNIFFER.looks_like(prefix)

    def test_announced_size_is_the_end_of_the_packet_being_read(self) -> None:
        assert SNIFFER.announced_size(b"ARTEMIS") is None
        assert SNIFFER.announced_size(V2_CLIENT_ID[:10]) is None  # the length is not complete
        assert SNIFFER.announced_size(V2_CLIENT_ID[:11]) == 28
        assert SNIFFER.announced_size(V2_CLIENT_ID[:70]) is None  # 3 of its 4 length bytes
        assert SNIFFER.announced_size(V2_CLIENT_ID[:71]) == 67 + 4 + 0x7C
        assert SNIFFER.announced_size(V2_CLIENT_ID) == OPENING_END
        assert SNIFFER.announced_size(V2_CLIENT_ID + PING) == OPENING_END
        assert SNIFFER.announced_size(b"HTTP/1.1") is None

    def test_sniff_buffer_refuses_a_packet_over_the_cap_as_soon_as_its_length_arrives(self) -> None:
        """Scenario: a packet announcing more than what is left of the acceptor's cap is refused
        when its 4 length bytes are in, not after reading up to the cap."""
        buffer = SniffBuffer(lambda prefix: SNIFFER, max_bytes=1024)
        buffer.feed(b"ARTEMIS" + struct.pack(">i", 2000) + b"\x0a")
        assert buffer.step() == b""
        with pytest.raises(
            SniffError, match=r"core: the opening announces 2011 bytes, over the acceptor's cap of 1024"
        ):
            buffer.check_cap()


# --- Errors name the rule and the value ---------------------------------------------------------


def _string_field(raw_field: bytes) -> bytes:
    """The opening with CREATESESSION_V2's clientID replaced by `raw_field` (marker and String)."""
    body = CREATE_SESSION_V2[13:]
    client_id_at = len(body) - len(b"\x01" + encode_string("client-42"))
    return b"ARTEMIS" + encode_packet(PacketType.CREATESESSION_V2, 1, body[:client_id_at] + raw_field)


class TestErrors:
    @pytest.mark.parametrize(
        ("data", "match"),
        [
            (b"ARTEMIX", r"connection must start with b'ARTEMIS' or b'HORNETQ', got b'ARTEMIX'"),
            (b"AMQP", r"connection must start with b'ARTEMIS' or b'HORNETQ', got b'AMQP'"),
            (
                b"ARTEMIS\x00\x00\x00\x05",
                r"packet length 5 at offset 7 is below the 9 bytes of type and channel",
            ),
            (b"ARTEMIS\xff\xff\xff\xff", r"packet length -1 at offset 7 is below the 9 bytes"),
            (b"ARTEMIS\x00\x01\x00\x01", rf"packet length 65537 at offset 7 exceeds {MAX_PACKET_BYTES}"),
            (b"ARTEMIS" + encode_packet(71, 11, b""), r"unexpected type 71 at offset 7 before CREATESESSION"),
            (b"ARTEMIS\x00\x00\x00\x09\x14", r"unexpected EXCEPTION \(20\) at offset 7 before CREATESESSION"),
            (
                b"ARTEMIS" + encode_packet(10, 1, bytes(8)),
                r"PING \(10\) at offset 7 must come on channel 0, got 1",
            ),
            (
                b"ARTEMIS" + encode_packet(-18, 0, b""),
                r"CREATESESSION_V2 \(-18\) at offset 7 must come on channel 1, got 0",
            ),
            (
                b"ARTEMIS" + encode_packet(10, 0, bytes(7)),
                r"PING connectionTTL needs 8 bytes at offset 0, only 7 are left",
            ),
            (
                _string_field(b"\x02"),
                r"CREATESESSION_V2 clientID: nullable marker must be 0x00 or 0x01, got 0x02",
            ),
            (
                _string_field(b"\x01\xff\xff\xff\xfe"),
                r"CREATESESSION_V2 clientID: string length -2 is negative",
            ),
            (
                _string_field(b"\x01\x00\x00\x00\x09\x00\x03abc"),
                r"CREATESESSION_V2 clientID: string length says 9 UTF-16 units, its modified UTF-8 holds 3",
            ),
            (_string_field(b"\x01\x00\x00\x00\x09\x00\x02\xc3\x28"), r"clientID: bad modified UTF-8 c328"),
            (
                _string_field(b"\x01\x00\x00\x00\x01\xd8\x00"),
                r"CREATESESSION_V2 clientID: lone surrogate in d800",
            ),
            (
                _string_field(b"\x01\x00\x00\x10\x00\x00\x00\x00\x02ab"),
                r"clientID: string of 4096 UTF-16 units must have 8192 bytes, its byte count is 2",
            ),
            (
                _string_field(b"\x01\x00\x00\x00\x05ab"),
                r"CREATESESSION_V2 clientID needs 10 bytes at offset \d+, only 2 are left",
            ),
        ],
    )
    def test_sniff_core_rejects_bad_openings_naming_rule_and_value(self, data: bytes, match: str) -> None:
        with pytest.raises(SniffError, match=match) as raised:
            SNIFFER.sniff(data)
        assert raised.value.protocol == "core"

    def test_sniff_core_messages_end_without_full_stop(self) -> None:
        with pytest.raises(SniffError) as raised:
            SNIFFER.sniff(b"ARTEMIS" + encode_packet(10, 0, bytes(7)))
        assert not raised.value.reason.endswith(".")


# --- Strings: every length class ----------------------------------------------------------------

ANY_CHAR = st.characters(codec="utf-8")  # every character but a lone surrogate


def _units(text: str) -> int:
    return len(text.encode("utf-16-be")) // 2


CHARS = st.one_of(ANY_CHAR, st.sampled_from(["\x00", "\U0001f600", "\u00e9", "\u20ac", "\u07ff", "\u0800"]))
"""Any character, and often NUL, one outside the BMP (a surrogate pair), and the 2- and 3-byte
edges of modified UTF-8."""


@st.composite
def strings_of_units(draw: st.DrawFn, low: int, high: int) -> str:
    """Text of `low` to `high` UTF-16 units: a drawn piece repeated (long strings stay cheap to
    draw), cut to the length, padded with "x" where a surrogate pair would not fit."""
    target = draw(st.integers(min_value=low, max_value=high))
    piece = draw(st.text(alphabet=CHARS, min_size=1, max_size=20))
    text = piece * (target // _units(piece) + 1)
    while _units(text) > target:
        text = text[:-1]
    return text + "x" * (target - _units(text))


class TestStrings:
    @given(strings_of_units(0, 8))
    def test_encode_string_short_is_utf16_units(self, text: str) -> None:
        encoded = encode_string(text)
        assert encoded == struct.pack(">i", _units(text)) + text.encode("utf-16-be")
        assert decode_string(encoded) == (text, len(encoded))

    @given(strings_of_units(9, 4094))
    def test_encode_string_medium_is_modified_utf8(self, text: str) -> None:
        encoded = encode_string(text)
        units, size = struct.unpack(">iH", encoded[:6])
        assert units == _units(text)
        assert size == len(encoded) - 6
        assert decode_string(encoded) == (text, len(encoded))

    @given(strings_of_units(4095, 5000))
    def test_encode_string_long_is_utf16le(self, text: str) -> None:
        encoded = encode_string(text)
        assert encoded == struct.pack(">ii", _units(text), 2 * _units(text)) + text.encode("utf-16-le")
        assert decode_string(encoded) == (text, len(encoded))

    def test_encode_string_medium_writes_nul_as_one_byte_and_surrogates_one_by_one(self) -> None:
        """Scenario: `UTF8Util.saveUTF` writes U+0000 as 0x00 (not Java's C0 80) and a character
        outside the BMP as its two surrogates of 3 bytes each (CESU-8)."""
        assert encode_string("\x00\U0001f600abcdef") == _hex(
            "00000009", "000d", "00", "eda0bdedb880", "616263646566"
        )
        assert decode_string(_hex("00000009", "000a", "c080", "6162636465666768")) == ("\x00abcdefgh", 16)

    @given(st.text(alphabet=ANY_CHAR, max_size=30), st.binary(max_size=8))
    def test_decode_string_reads_only_its_own_bytes(self, text: str, tail: bytes) -> None:
        encoded = encode_string(text)
        assert decode_string(b"\xaa" + encoded + tail, 1) == (text, 1 + len(encoded))

    @given(
        strings_of_units(0, 20), strings_of_units(0, 20), st.none() | strings_of_units(0, 4200), st.booleans()
    )
    def test_sniff_core_reads_back_what_create_session_carries(
        self, user: str, password: str, client_id: str | None, v2: bool
    ) -> None:
        data = b"ARTEMIS" + PING + _create_session(v2=v2, user=user, password=password, client_id=client_id)
        result = SNIFFER.sniff(data)
        assert isinstance(result, Sniffed)
        assert (result.user_name, result.password) == (user, password)
        assert result.client_id == (client_id if v2 else None)


# --- CREATESESSION(_V2), as the CORE health probe sends it ------------------------------------


class TestCreateSession:
    def test_encode_create_session_is_the_java_clients_bytes(self) -> None:
        """Scenario: with the captured client's values and the encoder's defaults (the JMS
        connection's first session), the bytes are the Artemis 2.40 client's, field by field."""
        encoded = encode_create_session(
            name="ba532819-ebac-11f1-b825-02fc00000001",
            session_channel=10,
            version=136,
            user_name="alice",
            password="s3cret",
            client_id="client-42",
        )
        assert encoded == CREATE_SESSION_V2

    def test_encode_create_session_v1_is_the_hand_built_one(self) -> None:
        encoded = encode_create_session(
            name="ba532819-ebac-11f1-b825-02fc00000001",
            session_channel=10,
            version=123,
            user_name="alice",
            password="s3cret",
            v2=False,
        )
        assert encoded == _create_session(v2=False, version=123)

    @given(
        name=strings_of_units(0, 40),
        user=st.none() | strings_of_units(0, 20),
        password=st.none() | strings_of_units(0, 20),
        client_id=st.none() | strings_of_units(0, 4200),
        v2=st.booleans(),
        numbers=st.tuples(
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(-(2**31), 2**31 - 1),
        ),
        flags=st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
        default_address=st.none() | strings_of_units(0, 12),
    )
    def test_encode_create_session_round_trips(
        self,
        name: str,
        user: str | None,
        password: str | None,
        client_id: str | None,
        v2: bool,
        numbers: tuple[int, int, int, int],
        flags: tuple[bool, bool, bool, bool],
        default_address: str | None,
    ) -> None:
        channel, version, min_large, window = numbers
        xa, sends, acks, pre_ack = flags
        fields: dict[str, Any] = {
            "name": name,
            "session_channel": channel,
            "version": version,
            "user_name": user,
            "password": password,
            "client_id": client_id if v2 else None,
            "min_large_message_size": min_large,
            "xa": xa,
            "auto_commit_sends": sends,
            "auto_commit_acks": acks,
            "window_size": window,
            "pre_acknowledge": pre_ack,
            "default_address": default_address,
        }
        encoded = encode_create_session(v2=v2, **fields)
        opening = parse_opening(b"ARTEMIS" + encoded)
        assert opening is not NEED_MORE
        assert opening.session == CreateSession(
            packet_type=PacketType.CREATESESSION_V2 if v2 else PacketType.CREATESESSION,
            **fields,
        )
        assert opening.end == len(encoded) + 7

    @pytest.mark.parametrize(
        ("fields", "match"),
        [
            ({"client_id": "c", "v2": False}, r"CREATESESSION carries no client ID, got 'c'"),
            ({"version": 2**31}, r"version must fit an int32, got 2147483648"),
            (
                {"session_channel": -(2**63) - 1},
                r"session_channel must fit an int64, got -9223372036854775809",
            ),
            ({"window_size": 2**31}, r"window_size must fit an int32"),
            ({"min_large_message_size": -(2**31) - 1}, r"min_large_message_size must fit an int32"),
        ],
    )
    def test_encode_create_session_rejects_what_does_not_fit(
        self, fields: dict[str, object], match: str
    ) -> None:
        base: dict[str, object] = {
            "name": "s",
            "session_channel": 10,
            "version": 131,
            "user_name": None,
            "password": None,
        }
        with pytest.raises(ValueError, match=match):
            encode_create_session(**{**base, **fields})  # type: ignore[arg-type]  # mixed test values


# --- The redirect and the refusals --------------------------------------------------------------

REDIRECT = _hex(
    # DISCONNECT_V3 on channel 0 (DisconnectMessage_V3.encodeRest)
    "000000ec",  # length 236
    "ed",  # type -19: DISCONNECT_V3
    "0000000000000000",  # channel 0
    "0100000048",  # nodeID present, SimpleString of 72 bytes (UTF-16LE)
    ROUTER_NODE_ID.encode("utf-16-le").hex(),
    "00",  # reason 0: REDIRECT
    "00",  # targetNodeID null
    "ff",  # hasTargetConnector true
    "0000000200620032",  # TransportConfiguration name "b2"
    "0000004a004a",  # factoryClassName, 74 units, modified UTF-8
    NETTY_CONNECTOR_FACTORY.encode().hex(),
    "00000002",  # 2 parameters
    "000000040068006f00730074",  # "host"
    "03",  # type 3: String
    "0000000900093132372e302e302e31",  # "127.0.0.1"
    "000000040070006f00720074",  # "port"
    "03",  # type 3: String, as a connector configured by URL has it
    "0000000500360031003600310037",  # "61617"
    # EXCEPTION on channel 1, the answer to CREATESESSION (ActiveMQExceptionMessage.encodeRest)
    "000000de",  # length 222
    "14",  # type 20: EXCEPTION
    "0000000000000001",  # channel 1
    "000000de",  # code 222: ROUTING_EXCEPTION
    "01000000ca00ca",  # message: 01 present, int32 202 units, uint16 202 bytes (modified UTF-8)
    b"AMQ229237: Connection router r1 redirected the connection to TransportConfiguration(name=b2, "
    b"factory=org-apache-activemq-artemis-core-remoting-impl-netty-NettyConnectorFactory)"
    b"?host=127-0-0-1&port=61617".hex(),
)


class TestRedirect:
    def test_encode_redirect_annotated(self) -> None:
        assert encode_redirect(router="r1", connector_name="b2", host="127.0.0.1", port=61617) == REDIRECT

    def test_encode_redirect_tls_names_ssl_enabled(self) -> None:
        out = encode_redirect(
            router="r1", connector_name="b2", host="b2.example", port=61617, ssl_enabled=True
        )
        disconnect = parse_packet(out)
        assert disconnect is not NEED_MORE
        decoded = decode_disconnect(disconnect)
        assert decoded.connector == TransportConfig(
            name="b2", params=(("host", "b2.example"), ("port", "61617"), ("sslEnabled", "true"))
        )
        exception = parse_packet(out, disconnect.end)
        assert exception is not NEED_MORE
        assert exception.end == len(out)
        assert decode_exception(exception).message is not None
        assert "sslEnabled=true" in (decode_exception(exception).message or "")

    @given(
        router=st.text(min_size=1, max_size=40),
        name=st.text(alphabet=ANY_CHAR, min_size=1, max_size=40),
        host=st.text(alphabet=ANY_CHAR, min_size=1, max_size=300),
        port=st.integers(min_value=1, max_value=65535),
        ssl=st.booleans(),
        target=st.none() | st.text(alphabet=ANY_CHAR, max_size=40),
    )
    def test_encode_redirect_round_trips(
        self, router: str, name: str, host: str, port: int, ssl: bool, target: str | None
    ) -> None:
        out = encode_redirect(
            router=router, connector_name=name, host=host, port=port, ssl_enabled=ssl, target_node_id=target
        )
        disconnect = parse_packet(out)
        assert disconnect is not NEED_MORE
        assert (disconnect.type, disconnect.channel) == (PacketType.DISCONNECT_V3, 0)
        decoded = decode_disconnect(disconnect)
        assert (decoded.node_id, decoded.reason, decoded.target_node_id) == (
            ROUTER_NODE_ID,
            DisconnectReason.REDIRECT,
            target,
        )
        assert decoded.connector is not None
        assert decoded.connector.factory == NETTY_CONNECTOR_FACTORY
        assert dict(decoded.connector.params) == {"host": host, "port": str(port)} | (
            {"sslEnabled": "true"} if ssl else {}
        )
        exception = parse_packet(out, disconnect.end)
        assert exception is not NEED_MORE
        assert (exception.type, exception.channel, exception.end) == (PacketType.EXCEPTION, 1, len(out))
        error = decode_exception(exception)
        assert error.code == ROUTING_EXCEPTION
        where = decoded.connector.describe()
        assert error.message == f"AMQ229237: Connection router {router} redirected the connection to {where}"

    @given(
        params=st.lists(
            st.tuples(
                st.text(alphabet=ANY_CHAR, max_size=12),
                st.booleans() | st.integers(-(2**31), 2**31 - 1) | st.text(alphabet=ANY_CHAR, max_size=12),
            ),
            max_size=5,
        ),
        reason=st.sampled_from(list(DisconnectReason)),
        node=st.none() | st.text(alphabet=ANY_CHAR, max_size=20),
    )
    def test_encode_disconnect_v3_round_trips(
        self, params: list[tuple[str, bool | int | str]], reason: DisconnectReason, node: str | None
    ) -> None:
        connector = TransportConfig(name="c", params=tuple(params))
        packet = parse_packet(encode_disconnect_v3(reason=reason, connector=connector, node_id=node))
        assert packet is not NEED_MORE
        assert decode_disconnect(packet) == CoreDisconnect(
            node_id=node, reason=reason, target_node_id=None, connector=connector
        )

    def test_encode_disconnect_v3_without_connector(self) -> None:
        packet = parse_packet(encode_disconnect_v3(reason=DisconnectReason.SHUT_DOWN, connector=None))
        assert packet is not NEED_MORE
        assert decode_disconnect(packet).connector is None

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"host": "", "port": 1}, "host and connector name must not be empty"),
            ({"host": "h", "port": 0}, "port must be 1-65535, got 0"),
            ({"host": "h", "port": 65536}, "port must be 1-65535, got 65536"),
        ],
    )
    def test_encode_redirect_rejects_bad_targets(self, kwargs: dict[str, object], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            encode_redirect(router="r1", connector_name="b2", **kwargs)  # type: ignore[arg-type]  # test input

    def test_decoders_reject_other_packets(self) -> None:
        ping = parse_packet(PING)
        assert ping is not NEED_MORE
        with pytest.raises(SniffError, match=r"expected DISCONNECT_V3 \(-19\), got PING \(10\)"):
            decode_disconnect(ping)
        with pytest.raises(SniffError, match=r"expected EXCEPTION \(20\), got PING \(10\)"):
            decode_exception(ping)


class TestRefusals:
    @pytest.mark.parametrize(
        ("unavailable", "code", "message"),
        [
            (True, ROUTING_EXCEPTION, "AMQ229238: Connection router r1 not ready"),
            (False, REMOTE_DISCONNECT, "AMQ229240: Connection router r1 rejected the connection"),
        ],
    )
    def test_encode_refusal_in_artemis_words(self, unavailable: bool, code: int, message: str) -> None:
        out = encode_refusal("r1", unavailable=unavailable)
        packet = parse_packet(out)
        assert packet is not NEED_MORE
        assert (packet.type, packet.channel, packet.end) == (PacketType.EXCEPTION, 1, len(out))
        error = decode_exception(packet)
        assert (error.code, error.message) == (code, message)

    def test_encode_refusal_use_another_annotated(self) -> None:
        assert encode_refusal("r1", unavailable=False) == _hex(
            "0000004b",  # length 75
            "14",  # type 20: EXCEPTION
            "0000000000000001",  # channel 1
            "00000077",  # code 119: REMOTE_DISCONNECT
            "01000000370037",  # message: 01 present, int32 55 units, uint16 55 bytes (modified UTF-8)
            b"AMQ229240: Connection router r1 rejected the connection".hex(),
        )

    def test_encode_not_authorized_in_artemis_words(self) -> None:
        packet = parse_packet(encode_not_authorized("/127.0.0.1:53124", None))
        assert packet is not NEED_MORE
        error = decode_exception(packet)
        assert error.code == SECURITY_EXCEPTION
        assert error.message == (
            "AMQ229031: Unable to validate user from /127.0.0.1:53124. Username: null; "
            "SSL certificate subject DN: unavailable"
        )
        assert error.describe().startswith("EXCEPTION 105 (SECURITY_EXCEPTION): AMQ229031: ")

    @given(
        code=st.integers(-(2**31), 2**31 - 1), message=st.none() | st.text(alphabet=ANY_CHAR, max_size=5000)
    )
    def test_encode_exception_round_trips(self, code: int, message: str | None) -> None:
        packet = parse_packet(encode_exception(code, message), max_size=1 << 16)
        assert packet is not NEED_MORE
        assert decode_exception(packet) == CoreException(code=code, message=message)


# --- R10 4: fuzzing -----------------------------------------------------------------------------


def _sniff_never_crashes(data: bytes) -> object:
    result = sniff_outcome(SNIFFER.sniff, data)
    assert result is NEED_MORE or isinstance(result, Reply | Sniffed | SniffError)
    if isinstance(result, SniffError):
        assert result.protocol == "core"
        assert re.fullmatch(r"[^\n]+", result.reason)
    announced = SNIFFER.announced_size(data)
    assert announced is None or announced >= 0
    return result


@given(
    name=st.sampled_from([*CAPTURE_NAMES[:4], CAPTURE_NAMES[-1]]),
    cut=st.integers(min_value=0, max_value=300),
    tail=st.binary(max_size=200),
)
def test_sniff_core_prefix_plus_junk_never_crashes(name: str, cut: int, tail: bytes) -> None:
    _sniff_never_crashes(load_capture(name)[:cut] + tail)


@given(
    name=st.sampled_from([*CAPTURE_NAMES[:4], CAPTURE_NAMES[-1]]),
    at=st.integers(min_value=0, max_value=300),
    byte=st.integers(min_value=0, max_value=255),
)
def test_sniff_core_one_changed_byte_never_crashes(name: str, at: int, byte: int) -> None:
    _sniff_never_crashes(mutate(load_capture(name), [(at, byte)]))


@given(data=st.binary(max_size=400))
def test_sniff_core_arbitrary_bytes_after_the_magic_never_crash(data: bytes) -> None:
    _sniff_never_crashes(b"ARTEMIS" + data)
    _sniff_never_crashes(data)
    assert isinstance(SNIFFER.looks_like(data), bool)
    for decode in (decode_disconnect, decode_exception):
        for packet_type in (PacketType.DISCONNECT_V3, PacketType.EXCEPTION):
            packet = parse_packet(encode_packet(packet_type, 0, data))
            assert packet is not NEED_MORE
            sniff_outcome(decode, packet)  # type: ignore[arg-type]  # both decoders take a Packet
