"""STOMP sniffer and ERROR encoder (keys/stomp.py).

The fixtures were captured from stomp.py 9.0.0 (`stomp.Connection10/11/12(...).connect("user",
"pass", headers={"client-id": ...})`) connecting to a throwaway plain-socket server on 127.0.0.1
that recorded what it received and answered with `encode_error`. Each client wrote its whole
frame in one send; stomp.py sorts headers by name.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

import pytest
import stomp  # type: ignore[import-untyped]  # stomp.py ships no type hints
import stomp.utils  # type: ignore[import-untyped]  # as above
from hypothesis import given
from hypothesis import strategies as st

from keys import WireProtocol
from keys.sniff import NEED_MORE, Sniffed, SniffError
from keys.stomp import MAX_BODY_BYTES, MAX_HEADER_BYTES, StompSniffer, encode_error
from tests.keys.conftest import OneConnectionServer, assert_sniff_outcome, read_until_sniffed

if TYPE_CHECKING:
    import socket

    from keys.sniff import Sniffer

# stomp.py 9.0.0, stomp.Connection12([("127.0.0.1", PORT)]).connect("user", "pass",
# headers={"client-id": "capture-stomp12"}): STOMP command, `host` defaults to the address.
STOMP_PY_12 = (
    b"STOMP\n"  # command: STOMP (1.2's name for CONNECT); LF line ends
    b"accept-version:1.2\n"  # versions the client speaks
    b"client-id:capture-stomp12\n"  # the client id (CLIENT_ID key)
    b"host:127.0.0.1\n"  # virtual host
    b"login:user\n"  # user (USER_NAME key)
    b"passcode:pass\n"  # password
    b"\n"  # blank line: end of headers
    b"\x00"  # NUL: end of the (empty) body
)
# stomp.py 9.0.0, stomp.Connection11(...): STOMP command, no `host` header.
STOMP_PY_11 = (
    b"STOMP\n"  # command
    b"accept-version:1.1\n"
    b"client-id:capture-stomp11\n"
    b"login:user\n"
    b"passcode:pass\n"
    b"\n"  # end of headers
    b"\x00"  # end of frame
)
# stomp.py 9.0.0, stomp.Connection10(...): CONNECT command (stomp.py adds accept-version:1.0).
STOMP_PY_10 = (
    b"CONNECT\n"  # command: CONNECT
    b"accept-version:1.0\n"
    b"client-id:capture-stomp10\n"
    b"login:user\n"
    b"passcode:pass\n"
    b"\n"  # end of headers
    b"\x00"  # end of frame
)
# stomp.py 9.0.0, stomp.Connection12(..., vhost="/", heartbeats=(4000, 4000)).connect(...,
# with_connect_command=True): the CONNECT form of 1.2, with heart-beat. (The two options were
# captured separately and are combined here; the bytes are what each capture showed.)
STOMP_PY_12_CONNECT = (
    b"CONNECT\n"  # command: CONNECT
    b"accept-version:1.2\n"
    b"client-id:capture-stomp12\n"
    b"heart-beat:4000,4000\n"  # cx,cy in ms (ignored by the sniffer)
    b"host:/\n"  # vhost "/"
    b"login:user\n"
    b"passcode:pass\n"
    b"\n"  # end of headers
    b"\x00"  # end of frame
)


def _sniffed(client_id: str, version: str, host: str | None = None) -> Sniffed:
    return Sniffed(
        protocol=WireProtocol.STOMP,
        client_id=client_id,
        user_name="user",
        password="pass",
        hostname=host,
        protocol_version=version,
    )


CAPTURES = [
    (STOMP_PY_12, _sniffed("capture-stomp12", "1.2", "127.0.0.1")),
    (STOMP_PY_11, _sniffed("capture-stomp11", "1.1")),
    (STOMP_PY_10, _sniffed("capture-stomp10", "1.0")),
    (STOMP_PY_12_CONNECT, _sniffed("capture-stomp12", "1.2", "/")),
]
CAPTURE_IDS = ["stomp.py-1.2", "stomp.py-1.1", "stomp.py-1.0", "stomp.py-1.2-connect"]

SNIFFER = StompSniffer()


def _sniff(data: bytes) -> Sniffed:
    result = SNIFFER.sniff(data)
    assert isinstance(result, Sniffed), result
    return result


# ===============================================================================================
# R10 1-3: real captures, every prefix, trailing data
# ===============================================================================================


def test_stomp_sniffer_satisfies_contract() -> None:
    sniffer: Sniffer = StompSniffer()
    assert sniffer.name == "stomp"


@pytest.mark.parametrize(("capture", "expected"), CAPTURES, ids=CAPTURE_IDS)
def test_sniff_stomp_every_prefix_then_sniffed(capture: bytes, expected: Sniffed) -> None:
    for i in range(len(capture)):
        assert SNIFFER.sniff(capture[:i]) is NEED_MORE, i
    assert SNIFFER.sniff(capture) == expected


def test_sniff_stomp_keeps_password() -> None:
    assert _sniff(STOMP_PY_12).password == "pass"


@pytest.mark.parametrize(("capture", "expected"), CAPTURES, ids=CAPTURE_IDS)
@pytest.mark.parametrize(
    "trailing",
    [b"\n", b"\r\n\r\n", b"SUBSCRIBE\nid:0\ndestination:/queue/a\n\n\x00", b"\xff\xfe garbage", b"\x00" * 10],
)
def test_sniff_stomp_trailing_bytes_do_not_change_result(
    capture: bytes, expected: Sniffed, trailing: bytes
) -> None:
    assert SNIFFER.sniff(capture + trailing) == expected


# ===============================================================================================
# R10 4: fuzz
# ===============================================================================================


@given(capture=st.sampled_from([c for c, _ in CAPTURES]), data=st.data(), tail=st.binary(max_size=200))
def test_sniff_stomp_prefix_plus_garbage_never_crashes(
    capture: bytes, data: st.DataObject, tail: bytes
) -> None:
    cut = data.draw(st.integers(0, len(capture)))
    assert_sniff_outcome(SNIFFER, capture[:cut] + tail)


@given(capture=st.sampled_from([c for c, _ in CAPTURES]), data=st.data())
def test_sniff_stomp_mutated_capture_never_crashes(capture: bytes, data: st.DataObject) -> None:
    mutated = bytearray(capture)
    for _ in range(data.draw(st.integers(1, 3))):
        mutated[data.draw(st.integers(0, len(capture) - 1))] = data.draw(
            st.sampled_from([0, 10, 13, ord(":"), ord("\\"), 0xFF, ord("x")])
        )
    assert_sniff_outcome(SNIFFER, bytes(mutated))


@given(st.binary(max_size=400))
def test_sniff_stomp_random_bytes_never_crash(blob: bytes) -> None:
    for candidate in (blob, b"CONNECT\n" + blob, b"STOMP\r\n" + blob):
        assert_sniff_outcome(SNIFFER, candidate)


# ===============================================================================================
# Errors
# ===============================================================================================


class TestErrors:
    def test_sniff_stomp_other_command_first(self) -> None:
        with pytest.raises(
            SniffError, match=re.escape("stomp: first frame must be CONNECT or STOMP, got 'SEND'")
        ):
            SNIFFER.sniff(b"SEND\ndestination:/queue/a\n\nhi\x00")

    def test_sniff_stomp_waits_for_the_whole_command_to_name_it(self) -> None:
        assert SNIFFER.sniff(b"SUBSCR") is NEED_MORE
        with pytest.raises(SniffError, match="got 'SUBSCRIBE'"):
            SNIFFER.sniff(b"SUBSCRIBE\r\n")

    @pytest.mark.parametrize(
        ("data", "got"),
        [
            (b"GET / HTTP/1.1\r\n", "'GET / HTTP/1.1'"),
            (b"GE", "'GE'"),
            (b"\x16\x03\x01", "'\\x16\\x03\\x01'"),
        ],
    )
    def test_sniff_stomp_not_stomp_fails_early(self, data: bytes, got: str) -> None:
        with pytest.raises(SniffError, match=re.escape(f"got {got}")):
            SNIFFER.sniff(data)

    def test_sniff_stomp_lowercase_command_is_not_connect(self) -> None:
        with pytest.raises(SniffError, match="got 'connect'"):
            SNIFFER.sniff(b"connect\n\n\x00")

    def test_sniff_stomp_error_quotes_at_most_32_characters(self) -> None:
        with pytest.raises(SniffError) as info:
            SNIFFER.sniff(b"X" * 100 + b"\n")
        assert "X" * 33 not in str(info.value)

    def test_sniff_stomp_header_without_colon(self) -> None:
        with pytest.raises(SniffError, match="header line without a colon: 'login user'"):
            SNIFFER.sniff(b"CONNECT\nlogin user\n\n\x00")

    def test_sniff_stomp_header_section_too_large_without_eol(self) -> None:
        data = b"CONNECT\nlogin:" + b"a" * MAX_HEADER_BYTES
        with pytest.raises(SniffError, match="header section exceeds 8192 bytes"):
            SNIFFER.sniff(data)
        assert SNIFFER.sniff(data[: MAX_HEADER_BYTES - 1]) is NEED_MORE

    def test_sniff_stomp_header_section_too_large_with_many_lines(self) -> None:
        data = b"CONNECT\n" + b"x-pad:0123456789\n" * 1000 + b"\n\x00"
        with pytest.raises(SniffError, match="header section exceeds 8192 bytes"):
            SNIFFER.sniff(data)

    def test_sniff_stomp_header_section_just_below_cap_is_fine(self) -> None:
        head = b"CONNECT\nlogin:u\n"
        pad = b"x:" + b"a" * (MAX_HEADER_BYTES - len(head) - 5) + b"\n"
        data = head + pad + b"\n\x00"
        assert len(data) - 2 < MAX_HEADER_BYTES
        assert _sniff(data).user_name == "u"

    @pytest.mark.parametrize(("line", "what"), [(b"login:\xff", "header value"), (b"\xc3(:x", "header name")])
    def test_sniff_stomp_header_not_utf8(self, line: bytes, what: str) -> None:
        with pytest.raises(SniffError, match=f"{what} is not valid utf-8"):
            SNIFFER.sniff(b"CONNECT\n" + line + b"\n\n\x00")

    @pytest.mark.parametrize("value", [b"abc", b"-1", b"1.5", b"", b"\xd9\xa3"])
    def test_sniff_stomp_bad_content_length(self, value: bytes) -> None:
        with pytest.raises(SniffError, match="content-length must be a decimal number of octets"):
            SNIFFER.sniff(b"CONNECT\ncontent-length:" + value + b"\n\n\x00")

    def test_sniff_stomp_content_length_too_large(self) -> None:
        with pytest.raises(SniffError, match="content-length 8193 exceeds the 8192-byte body limit"):
            SNIFFER.sniff(b"CONNECT\ncontent-length:8193\n\n")

    def test_sniff_content_length_of_thousands_of_digits_is_refused_as_too_large(self) -> None:
        """Scenario: 5,000 digits (past int()'s own limit, whose ValueError the sniffer used to let
        through): refused for the body limit; leading zeros do not count."""
        with pytest.raises(SniffError, match=r"content-length 9{16}\.\.\. exceeds the 8192-byte body limit"):
            SNIFFER.sniff(b"CONNECT\ncontent-length:" + b"9" * 5000 + b"\n\n")
        padded = b"CONNECT\nlogin:u\ncontent-length:" + b"0" * 5000 + b"1\n\na\x00"
        assert SNIFFER.sniff(padded) is not None

    def test_sniff_stomp_body_not_terminated_by_nul(self) -> None:
        with pytest.raises(SniffError, match="body of content-length 2 is not followed by NUL, got b'c'"):
            SNIFFER.sniff(b"CONNECT\ncontent-length:2\n\nabc\x00")

    def test_sniff_stomp_body_without_nul_too_large(self) -> None:
        head = b"CONNECT\nlogin:u\n\n"
        assert SNIFFER.sniff(head + b"a" * MAX_BODY_BYTES) is NEED_MORE
        with pytest.raises(SniffError, match="body exceeds 8192 bytes without a terminating NUL"):
            SNIFFER.sniff(head + b"a" * (MAX_BODY_BYTES + 1))

    def test_sniff_stomp_bare_cr_before_frame(self) -> None:
        assert SNIFFER.sniff(b"\n\r") is NEED_MORE
        with pytest.raises(SniffError, match="carriage return not followed by line feed before the frame"):
            SNIFFER.sniff(b"\n\rCONNECT\n\n\x00")


# ===============================================================================================
# Variants the captures do not cover
# ===============================================================================================


class TestVariants:
    def test_sniff_stomp_heartbeat_eols_before_frame(self) -> None:
        data = b"\n\r\n\n" + STOMP_PY_11
        for i in range(len(data)):
            assert SNIFFER.sniff(data[:i]) is NEED_MORE
        assert _sniff(data).client_id == "capture-stomp11"

    def test_sniff_stomp_crlf_line_endings(self) -> None:
        data = (
            b"CONNECT\r\naccept-version:1.1,1.2\r\nclient-id:c\r\nlogin:u\r\npasscode:p\r\nhost:h\r\n\r\n\x00"
        )
        assert _sniff(data) == Sniffed(
            protocol=WireProtocol.STOMP,
            client_id="c",
            user_name="u",
            password="p",
            hostname="h",
            protocol_version="1.1,1.2",
        )

    def test_sniff_stomp_repeated_header_first_wins(self) -> None:
        result = _sniff(b"CONNECT\nclient-id:first\nclient-id:second\nlogin:a\nlogin:b\n\n\x00")
        assert (result.client_id, result.user_name) == ("first", "a")

    def test_sniff_stomp_no_headers_defaults(self) -> None:
        assert _sniff(b"CONNECT\n\n\x00") == Sniffed(protocol=WireProtocol.STOMP, protocol_version="1.0")

    def test_sniff_stomp_values_are_literal_in_connect(self) -> None:
        """Scenario: CONNECT header values are not unescaped (STOMP 1.2 §Value Encoding exempts
        CONNECT), so a backslash, even an undefined escape, is kept and is not an error."""
        result = _sniff(
            b"STOMP\naccept-version:1.2\nclient-id:a\\cb\nlogin:dom\\user\npasscode:p:w\\x\n\n\x00"
        )
        assert (result.client_id, result.user_name, result.password) == ("a\\cb", "dom\\user", "p:w\\x")

    def test_sniff_stomp_empty_values_and_spaces_are_kept(self) -> None:
        result = _sniff(b"CONNECT\nclient-id:\nlogin: bob \n\n\x00")
        assert (result.client_id, result.user_name) == ("", " bob ")

    def test_sniff_stomp_content_length_body_may_hold_nul(self) -> None:
        data = b"CONNECT\nlogin:u\ncontent-length:3\n\na\x00b\x00"
        for i in range(len(data)):
            assert SNIFFER.sniff(data[:i]) is NEED_MORE
        assert _sniff(data).user_name == "u"

    def test_sniff_stomp_empty_body_with_content_length_zero(self) -> None:
        assert _sniff(b"CONNECT\ncontent-length:0\nlogin:u\n\n\x00").user_name == "u"

    def test_sniff_stomp_body_without_content_length_ends_at_nul(self) -> None:
        assert _sniff(b"CONNECT\nlogin:u\n\nhello\x00").user_name == "u"

    def test_sniff_stomp_utf8_values(self) -> None:
        assert _sniff("CONNECT\nclient-id:gerät-ü\n\n\x00".encode()).client_id == "gerät-ü"

    @pytest.mark.parametrize(
        ("prefix", "expected"),
        [
            (b"", True),
            (b"C", True),
            (b"CONN", True),
            (b"CONNECT\n", True),
            (b"S", True),
            (b"STOMP\r\n", True),
            (b"\n\r\nSTO", True),
            (b"\n", True),
            (b"SEND\n", False),
            (b"SE", False),
            (b"A", False),
            (b"AMQP", False),
            (b"\x10", False),
            (b"CONNECTED", False),
        ],
    )
    def test_looks_like_stomp(self, prefix: bytes, expected: bool) -> None:
        assert SNIFFER.looks_like(prefix) is expected


# ===============================================================================================
# encode_error
# ===============================================================================================


def _parse_with_stomp_py(frame: bytes) -> stomp.utils.Frame:
    assert frame.endswith(b"\x00")
    parsed = stomp.utils.parse_frame(frame[:-1])
    assert parsed is not None
    return parsed


class TestEncodeError:
    def test_encode_error_bytes(self) -> None:
        assert encode_error("Connection router r1 is not ready", detail="try later") == (
            b"ERROR\n"
            b"message:Connection router r1 is not ready\n"
            b"content-type:text/plain\n"
            b"content-length:9\n"
            b"\n"
            b"try later\x00"
        )

    def test_encode_error_without_detail(self) -> None:
        assert encode_error("m") == b"ERROR\nmessage:m\ncontent-type:text/plain\ncontent-length:0\n\n\x00"

    def test_encode_error_escapes_message(self) -> None:
        frame = encode_error("a:b\nc\\d\re")
        assert b"message:a\\cb\\nc\\\\d\\re\n" in frame
        parsed = _parse_with_stomp_py(frame)
        assert parsed.cmd == "ERROR"
        assert parsed.headers["message"] == "a:b\nc\\d\re"

    def test_encode_error_utf8_detail_length_in_bytes(self) -> None:
        frame = encode_error("m", detail="grüße")
        assert b"content-length:7\n" in frame
        assert frame.endswith("grüße".encode() + b"\x00")

    def test_stomp_py_client_surfaces_error_message(self) -> None:
        """Scenario: a real stomp.py 1.2 client connects to a socket server that sniffs its frame
        and answers `encode_error`; the client's on_error listener gets message and body."""
        seen: list[Sniffed] = []

        def refuse(conn: socket.socket) -> None:
            _, sniffed, _ = read_until_sniffed(conn, SNIFFER)
            seen.append(sniffed)
            conn.sendall(encode_error("Connection router r1 rejected this connection", detail="go away"))

        errors: list[tuple[dict[str, str], str]] = []
        got_error = threading.Event()

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]  # stomp.py is untyped
            def on_error(self, frame: stomp.utils.Frame) -> None:
                errors.append((frame.headers, frame.body))
                got_error.set()

        server = OneConnectionServer(refuse, timeout_s=10)
        client = stomp.Connection12([("127.0.0.1", server.port)], reconnect_attempts_max=1, timeout=10)
        client.set_listener("test", Listener())
        try:
            client.connect("bob", "secret", wait=False, headers={"client-id": "stomp-test"})
            assert got_error.wait(10)
        finally:
            if client.is_connected():
                client.disconnect()
        server.join()
        assert seen == [
            Sniffed(
                protocol=WireProtocol.STOMP,
                client_id="stomp-test",
                user_name="bob",
                password="secret",
                hostname="127.0.0.1",
                protocol_version="1.2",
            )
        ]
        headers, body = errors[0]
        assert headers["message"] == "Connection router r1 rejected this connection"
        assert body == "go away"
