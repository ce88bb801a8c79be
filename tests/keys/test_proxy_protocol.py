"""PROXY protocol v1/v2 parsing and encoding (keys/proxy_protocol.py), STYLE R10.

The fixtures are real headers written by HAProxy 2.6.12 (Debian 12 package 2.6.12-1+deb12u4),
captured by a throwaway socket server on 127.0.0.1:17000 that wrote every connection's bytes to
a file. Clients bound to 127.0.0.5 (IPv4) or ::1 (IPv6) and sent b"PAYLOAD", which follows each
header in the capture. HAProxy ran in the foreground (`haproxy -db -f haproxy.cfg`) and was
stopped by its PID. The configuration:

    global
        log stdout format raw local0 info
    defaults
        mode tcp
        log global
        option tcplog
        timeout connect 2s
        timeout client 5s
        timeout server 5s
    frontend fe_v1
        bind 127.0.0.1:17001
        bind [::1]:17011
        default_backend be_v1
    frontend fe_v2
        bind 127.0.0.1:17002
        bind [::1]:17012
        default_backend be_v2
    frontend fe_v2_tlv
        bind 127.0.0.1:17003
        unique-id-format %{+X}o%ci:%cp_%fi:%fp_%Ts_%rt:%pid
        default_backend be_v2_tlv
    backend be_v1
        server cap 127.0.0.1:17000 send-proxy
    backend be_v2
        server cap 127.0.0.1:17000 send-proxy-v2
    backend be_v2_tlv
        server cap 127.0.0.1:17000 send-proxy-v2 proxy-v2-options crc32c,unique-id
    backend be_check
        server cap 127.0.0.1:17000 send-proxy-v2 check check-send-proxy inter 1h

`TestHaproxyAcceptsOurHeaders` checks the other direction against the same HAProxy: a frontend
with `accept-proxy` in front of an echo server takes what `encode_v1`/`encode_v2` produce.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import re
import shutil
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys.proxy_protocol import (
    PP2_TYPE_AUTHORITY,
    PP2_TYPE_CRC32C,
    PP2_TYPE_NOOP,
    PP2_TYPE_UNIQUE_ID,
    V1_MAX_LINE_BYTES,
    V2_SIGNATURE,
    ProxyHeader,
    _crc32c,
    encode_v1,
    encode_v2,
    encode_v2_local,
    looks_like_proxy_header,
    parse_proxy_header,
)
from keys.sniff import NEED_MORE, NeedMore, SniffError
from tests.conftest import free_port
from tests.keys.conftest import sniff_outcome

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

SIG = "0d0a0d0a000d0a515549540a"  # the v2 signature \r\n\r\n\0\r\nQUIT\n (section 2.2)

PAYLOAD = b"PAYLOAD"
"""What the capture clients sent after connecting: the bytes that follow each header."""

# HAProxy health check of `be_check` (`check check-send-proxy`): a LOCAL header.
V2_LOCAL = bytes.fromhex(
    SIG
    + "20"  # version 2, command LOCAL (the proxy's own connection)
    + "00"  # AF_UNSPEC, UNSPEC transport
    + "0000"  # length 0: no addresses
)

# fe_v1 -> be_v1 (`send-proxy`), client 127.0.0.5:58471 -> frontend 127.0.0.1:17001.
V1_TCP4 = bytes.fromhex(
    "50524f5859"  # "PROXY"
    + "20"  # one space
    + "54435034"  # "TCP4"
    + "20"
    + "3132372e302e302e35"  # source address "127.0.0.5"
    + "20"
    + "3132372e302e302e31"  # destination address "127.0.0.1"
    + "20"
    + "3538343731"  # source port "58471"
    + "20"
    + "3137303031"  # destination port "17001"
    + "0d0a"  # CRLF
)

# fe_v1 -> be_v1, client [::1]:37659 -> frontend [::1]:17011.
V1_TCP6 = bytes.fromhex(
    "50524f5859"  # "PROXY"
    + "20"
    + "54435036"  # "TCP6"
    + "20"
    + "3a3a31"  # source address "::1"
    + "20"
    + "3a3a31"  # destination address "::1"
    + "20"
    + "3337363539"  # source port "37659"
    + "20"
    + "3137303131"  # destination port "17011"
    + "0d0a"  # CRLF
)

# fe_v2 -> be_v2 (`send-proxy-v2`), client 127.0.0.5:48829 -> frontend 127.0.0.1:17002.
V2_TCP4 = bytes.fromhex(
    SIG
    + "21"  # version 2, command PROXY
    + "11"  # AF_INET, STREAM: TCP over IPv4
    + "000c"  # length 12: 2 * 4 address bytes + 2 * 2 port bytes, no TLVs
    + "7f000005"  # source address 127.0.0.5
    + "7f000001"  # destination address 127.0.0.1
    + "bebd"  # source port 48829
    + "426a"  # destination port 17002
)

# fe_v2 -> be_v2, client [::1]:54321 -> frontend [::1]:17012.
V2_TCP6 = bytes.fromhex(
    SIG
    + "21"  # version 2, command PROXY
    + "21"  # AF_INET6, STREAM: TCP over IPv6
    + "0024"  # length 36: 2 * 16 address bytes + 2 * 2 port bytes
    + "00000000000000000000000000000001"  # source address ::1
    + "00000000000000000000000000000001"  # destination address ::1
    + "d431"  # source port 54321
    + "4274"  # destination port 17012
)

# fe_v2_tlv -> be_v2_tlv (`proxy-v2-options crc32c,unique-id`), 127.0.0.5:46611 -> :17003.
UNIQUE_ID = b"7F000005:B613_7F000001:426B_6B02652C_0004:2B23"
V2_TCP4_TLVS = bytes.fromhex(
    SIG
    + "21"  # version 2, command PROXY
    + "11"  # TCP over IPv4
    + "0044"  # length 68: 12 address bytes + 7 CRC32C TLV bytes + 49 unique-id TLV bytes
    + "7f000005"  # source address 127.0.0.5
    + "7f000001"  # destination address 127.0.0.1
    + "b613"  # source port 46611
    + "426b"  # destination port 17003
    + "03"  # TLV type PP2_TYPE_CRC32C (section 2.2.3)
    + "0004"  # value length 4
    + "3c08ef2f"  # CRC32c of the whole header with these 4 bytes zeroed
    + "05"  # TLV type PP2_TYPE_UNIQUE_ID (section 2.2.5)
    + "002e"  # value length 46
    + UNIQUE_ID.hex()  # %{+X}o%ci:%cp_%fi:%fp_%Ts_%rt:%pid, in hex
)


def _header(**fields: object) -> ProxyHeader:
    return ProxyHeader(**({"local": False} | fields))  # type: ignore[arg-type]  # test shorthand


CAPTURES = [
    pytest.param(V2_LOCAL, _header(local=True, version=2, length=16), id="v2-local"),
    pytest.param(
        V1_TCP4,
        _header(
            source_ip="127.0.0.5",
            source_port=58471,
            dest_ip="127.0.0.1",
            dest_port=17001,
            version=1,
            length=44,
        ),
        id="v1-tcp4",
    ),
    pytest.param(
        V1_TCP6,
        _header(source_ip="::1", source_port=37659, dest_ip="::1", dest_port=17011, version=1, length=32),
        id="v1-tcp6",
    ),
    pytest.param(
        V2_TCP4,
        _header(
            source_ip="127.0.0.5",
            source_port=48829,
            dest_ip="127.0.0.1",
            dest_port=17002,
            version=2,
            length=28,
        ),
        id="v2-tcp4",
    ),
    pytest.param(
        V2_TCP6,
        _header(source_ip="::1", source_port=54321, dest_ip="::1", dest_port=17012, version=2, length=52),
        id="v2-tcp6",
    ),
    pytest.param(
        V2_TCP4_TLVS,
        _header(
            source_ip="127.0.0.5",
            source_port=46611,
            dest_ip="127.0.0.1",
            dest_port=17003,
            version=2,
            length=84,
            tlvs=((PP2_TYPE_CRC32C, bytes.fromhex("3c08ef2f")), (PP2_TYPE_UNIQUE_ID, UNIQUE_ID)),
        ),
        id="v2-tcp4-crc32c-unique-id",
    ),
]

V1_UNKNOWN_LONGEST = (
    b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    b" 65535 65535\r\n"
)
"""Section 2.1's worst case, exactly 107 bytes."""

V1_TCP6_LONGEST = (
    b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    b" 65535 65535\r\n"
)
"""Section 2.1's longest TCP6 line, 104 bytes."""

# Built by hand (HAProxy sends neither): UNIX stream and UDP over IPv4.
V2_UNIX_STREAM = (
    V2_SIGNATURE
    + b"\x21"  # version 2, command PROXY
    + b"\x31"  # AF_UNIX, STREAM
    + b"\x00\xd8"  # length 216: two 108-byte paths
    + b"/run/client.sock".ljust(108, b"\0")  # source path
    + bytes(108)  # destination path (unnamed)
)
V2_UDP4 = bytes.fromhex(
    SIG
    + "21"  # version 2, command PROXY
    + "12"  # AF_INET, DGRAM: UDP over IPv4
    + "000c"  # length 12
    + "c0000201"  # source 192.0.2.1
    + "c6336401"  # destination 198.51.100.1
    + "1f90"  # source port 8080
    + "0035"  # destination port 53
)

VALID_HEADERS = [
    V2_LOCAL,
    V1_TCP4,
    V1_TCP6,
    V2_TCP4,
    V2_TCP6,
    V2_TCP4_TLVS,
    V1_UNKNOWN_LONGEST,
    V1_TCP6_LONGEST,
    V2_UNIX_STREAM,
    V2_UDP4,
    b"PROXY UNKNOWN\r\n",
]


def _outcome(data: bytes) -> ProxyHeader | NeedMore | SniffError:
    """The parser's result, or the SniffError it raised; any other exception fails the test."""
    result = sniff_outcome(parse_proxy_header, data)
    if isinstance(result, SniffError):
        assert result.protocol == "proxy"
        return result
    if isinstance(result, ProxyHeader):
        assert 0 < result.length <= len(data)
    else:
        assert result is NEED_MORE
    return result


# --- R10 1-3: real captures, every prefix, trailing bytes ----------------------------------------


@pytest.mark.parametrize(("header", "expected"), CAPTURES)
def test_parse_proxy_header_real_capture_gives_expected_header(header: bytes, expected: ProxyHeader) -> None:
    assert parse_proxy_header(header) == expected
    assert expected.length == len(header)


@pytest.mark.parametrize(("header", "expected"), CAPTURES)
def test_parse_proxy_header_every_proper_prefix_needs_more(header: bytes, expected: ProxyHeader) -> None:
    for i in range(len(header)):
        assert parse_proxy_header(header[:i]) is NEED_MORE, f"prefix of {i} bytes"
    assert parse_proxy_header(header) == expected


@pytest.mark.parametrize(("header", "expected"), CAPTURES)
@pytest.mark.parametrize(
    "trailing",
    [PAYLOAD, b"\x10\x1c\x00\x04MQTT", V1_TCP4, V2_SIGNATURE, b"\r\n", bytes(4096)],
    ids=["captured-payload", "mqtt-connect", "another-v1-header", "v2-signature", "crlf", "4k-zeros"],
)
def test_parse_proxy_header_trailing_bytes_do_not_change_result(
    header: bytes, expected: ProxyHeader, trailing: bytes
) -> None:
    """Scenario: the client's first bytes arrive with the header; `length` says where they start."""
    data = header + trailing
    result = parse_proxy_header(data)
    assert result == expected
    assert data[expected.length :] == trailing


# --- The encoders against HAProxy's own bytes --------------------------------------------------


def test_encode_v1_matches_haproxy_bytes() -> None:
    assert encode_v1("127.0.0.5", 58471, "127.0.0.1", 17001) == V1_TCP4
    assert encode_v1("::1", 37659, "::1", 17011) == V1_TCP6


def test_encode_v2_matches_haproxy_bytes() -> None:
    assert encode_v2("127.0.0.5", 48829, "127.0.0.1", 17002) == V2_TCP4
    assert encode_v2("::1", 54321, "::1", 17012) == V2_TCP6


def test_encode_v2_fills_crc32c_like_haproxy() -> None:
    """Scenario: a CRC32C TLV passed with a zero value gets the checksum HAProxy computed."""
    tlvs = [(PP2_TYPE_CRC32C, bytes(4)), (PP2_TYPE_UNIQUE_ID, UNIQUE_ID)]
    assert encode_v2("127.0.0.5", 46611, "127.0.0.1", 17003, tlvs=tlvs) == V2_TCP4_TLVS


def test_encode_v2_local_matches_haproxy_health_check() -> None:
    assert encode_v2_local() == V2_LOCAL


def test__crc32c_check_value() -> None:
    """RFC 3720 B.4 / the common CRC catalogue check value of CRC-32C over "123456789"."""
    assert _crc32c(b"123456789") == 0xE3069283


# --- looks_like_proxy_header ---------------------------------------------------------------------


@pytest.mark.parametrize("header", VALID_HEADERS)
def test_looks_like_proxy_header_every_prefix_of_a_header(header: bytes) -> None:
    for i in range(len(header) + 1):
        assert looks_like_proxy_header(header[:i]), header[:i]
    assert looks_like_proxy_header(header + PAYLOAD)


@pytest.mark.parametrize(
    "prefix",
    [
        b"GET / HTTP/1.1\r\n",
        b"\x16\x03\x01\x02\x00",  # TLS ClientHello record
        b"\x10\x1c",  # MQTT CONNECT
        b"AMQP\x00\x01\x00\x00",
        b"PROXX",
        b"proxy ",
        b"PROXY\t",
        b"\r\n\r\n\x01",
        b"\r\n\r\n\x00\r\nQUIT\r",
    ],
)
def test_looks_like_proxy_header_false_for_other_protocols(prefix: bytes) -> None:
    assert not looks_like_proxy_header(prefix)


@given(st.binary(max_size=64))
def test_looks_like_proxy_header_agrees_with_parser_on_missing_header(data: bytes) -> None:
    """Scenario: whatever `looks_like` rejects, the parser rejects as a missing header."""
    if not looks_like_proxy_header(data):
        with pytest.raises(SniffError, match="missing PROXY protocol header"):
            parse_proxy_header(data)


# --- Errors ------------------------------------------------------------------------------------


def test_parse_proxy_header_missing_header_quotes_first_bytes() -> None:
    with pytest.raises(
        SniffError, match=re.escape(r"proxy: missing PROXY protocol header, connection starts with b'GET / H")
    ):
        parse_proxy_header(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")


def test_parse_proxy_header_error_quotes_at_most_32_bytes() -> None:
    with pytest.raises(SniffError) as info:
        parse_proxy_header(b"G" * 100)
    assert info.value.reason == f"missing PROXY protocol header, connection starts with {b'G' * 32!r}..."


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"PROXY TCP4 ::1 ::1 1 2\r\n", "v1 TCP4 source address '::1' is not IPv4"),
        (b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n", "v1 TCP4 destination address '::1' is not IPv4"),
        (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "v1 TCP6 source address '1.2.3.4' is not IPv6"),
        (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "v1 TCP4 source address '01.2.3.4' is not IPv4"),
        (b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n", "source address '1.2.3.256' is not IPv4"),
        (b"PROXY TCP4 localhost 5.6.7.8 1 2\r\n", "source address 'localhost' is not IPv4"),
        (b"PROXY TCP6 fe80::1%lo ::1 1 2\r\n", "v1 TCP6 source address 'fe80::1%lo' is not IPv6"),
        (b"PROXY TCP6 [::1] ::1 1 2\r\n", r"source address '\[::1\]' is not IPv6"),
        (b"PROXY TCP6 1::2::3 ::1 1 2\r\n", "source address '1::2::3' is not IPv6"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 80\r\n", "v1 source port must be decimal 0-65535.*got '65536'"),
        (
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80 080\r\n",
            "v1 destination port .* without leading zeroes, got '080'",
        ),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 80\r\n", "v1 source port .* got '-1'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 0x50 80\r\n", "v1 source port .* got '0x50'"),
        (
            b"PROXY TCP4 1.2.3.4  5.6.7.8 80 80\r\n",
            "v1 TCP4 line needs 6 fields separated by single spaces, got 7",
        ),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 80 80 \r\n", "needs 6 fields .* got 7"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 80\r\n", "needs 6 fields .* got 5"),
        (b"PROXY TCP4\r\n", "needs 6 fields .* got 2"),
        (b"PROXY TCP5 1.2.3.4 5.6.7.8 80 80\r\n", "v1 protocol must be TCP4, TCP6 or UNKNOWN, got b'TCP5'"),
        (b"PROXY \r\n", "v1 protocol must be TCP4, TCP6 or UNKNOWN, got b''"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 80 80\n", "v1 line ends with a bare LF"),
        (b"PROXY TCP4 1.2.3.4\r5.6.7.8 80 80\r\n", "v1 line has a CR not followed by LF"),
        (b"PROXY TCP4 1.2.3.\xff 5.6.7.8 80 80\r\n", "v1 line is not US-ASCII"),
    ],
)
def test_parse_proxy_header_v1_malformed_line_raises(data: bytes, match: str) -> None:
    with pytest.raises(SniffError, match=match):
        parse_proxy_header(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"PROXY HTTP", "v1 protocol must be TCP4, TCP6 or UNKNOWN, got b'HTTP'"),
        (b"PROXY TCP4X", "got b'TCP4X'"),
        (b"PROXY TCP ", "got b'TCP'"),
        (b"PROXY TCP4 1.2.3.4\rX", "v1 line has a CR not followed by LF"),
        (b"PROXY TCP6 " + b"f" * 200, "v1 line has no CRLF in the first 107 bytes"),
        (V1_UNKNOWN_LONGEST[:-2] + b"5\r\n", "v1 line has no CRLF in the first 107 bytes"),
    ],
    ids=["bad-word", "long-word", "short-word", "lone-cr", "no-crlf", "108-byte-line"],
)
def test_parse_proxy_header_v1_error_before_crlf(data: bytes, match: str) -> None:
    """Scenario: a line that can never become valid fails at once, without waiting for the CRLF."""
    with pytest.raises(SniffError, match=match):
        parse_proxy_header(data)


def _v2(ver_cmd: int, fam: int, block: bytes, *, length: int | None = None) -> bytes:
    size = len(block) if length is None else length
    return V2_SIGNATURE + bytes([ver_cmd, fam]) + size.to_bytes(2, "big") + block


ADDR4 = bytes.fromhex(
    "cb007107"  # source 203.0.113.7
    + "c6336401"  # destination 198.51.100.1
    + "1092"  # source port 4242
    + "1628"  # destination port 5672
)
"""An AF_INET address block for hand-built v2 headers."""


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_v2(0x11, 0x11, ADDR4), r"v2 version must be 2, got 1 \(byte 0x11\)"),
        (_v2(0x31, 0x11, ADDR4), r"v2 version must be 2, got 3 \(byte 0x31\)"),
        (_v2(0x22, 0x11, ADDR4), r"v2 command must be LOCAL \(0\) or PROXY \(1\), got 2"),
        (_v2(0x2F, 0x11, ADDR4), "v2 command .* got 15"),
        (_v2(0x21, 0x13, ADDR4), "v2 family/transport byte must be one of 0x11, 0x12, .* got 0x13"),
        (_v2(0x21, 0x10, ADDR4), "v2 family/transport byte .* got 0x10"),
        (_v2(0x21, 0x01, ADDR4), "v2 family/transport byte .* got 0x01"),
        (_v2(0x21, 0x41, ADDR4), "v2 family/transport byte .* got 0x41"),
        (_v2(0x21, 0x00, b""), r"v2 PROXY command with AF_UNSPEC \(byte 0x00\) carries no address"),
        (
            _v2(0x21, 0x11, ADDR4[:4]),
            r"v2 length 4 is too short for family/transport 0x11 \(12 address bytes\)",
        ),
        (_v2(0x21, 0x21, ADDR4), r"v2 length 12 is too short for family/transport 0x21 \(36 address bytes\)"),
        (_v2(0x21, 0x32, bytes(100)), r"v2 length 100 is too short for family/transport 0x32 \(216"),
        (_v2(0x21, 0x11, ADDR4 + b"\x05\x00"), "v2 TLV at offset 28 is cut short: 2 bytes left"),
        (
            _v2(0x21, 0x11, ADDR4 + b"\x05\x00\x09x"),
            "v2 TLV 0x05 at offset 28 has length 9, past the header end at 32",
        ),
        (_v2(0x21, 0x11, ADDR4 + b"\x03\x00\x03abc"), "v2 CRC32C TLV must be 4 bytes, got 3"),
        (
            V2_TCP4_TLVS[:-1] + b"X",
            "v2 CRC32C mismatch: header says 0x3c08ef2f, computed 0x",
        ),
        (
            V2_TCP4_TLVS[:12] + b"\x21\x11\x00\x4b" + V2_TCP4_TLVS[16:] + b"\x03\x00\x04\x3c\x08\xef\x2f",
            "v2 header has more than one CRC32C TLV",
        ),
    ],
    ids=[
        "version-1",
        "version-3",
        "command-2",
        "command-15",
        "family-0x13",
        "family-inet-unspec",
        "family-unspec-stream",
        "family-0x41",
        "proxy-unspec",
        "length-short-inet",
        "length-short-inet6",
        "length-short-unix",
        "tlv-cut",
        "tlv-overrun",
        "crc-length",
        "crc-mismatch",
        "two-crcs",
    ],
)
def test_parse_proxy_header_v2_malformed_raises(data: bytes, match: str) -> None:
    with pytest.raises(SniffError, match=match):
        parse_proxy_header(data)
    with pytest.raises(SniffError, match=match):
        parse_proxy_header(data + PAYLOAD)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (V2_SIGNATURE + b"\x31", "v2 version must be 2"),
        (V2_SIGNATURE + b"\x23", "v2 command must be"),
        (V2_SIGNATURE + b"\x21\x13", "v2 family/transport byte"),
        (V2_SIGNATURE + b"\x21\x11\x00\x04", "v2 length 4 is too short"),
    ],
    ids=["version", "command", "family", "length"],
)
def test_parse_proxy_header_v2_error_as_soon_as_the_byte_arrives(data: bytes, match: str) -> None:
    with pytest.raises(SniffError, match=match):
        parse_proxy_header(data)


# --- Accepted variants ---------------------------------------------------------------------------


def test_parse_proxy_header_v1_unknown_is_local() -> None:
    header = parse_proxy_header(b"PROXY UNKNOWN\r\n" + PAYLOAD)
    assert header == _header(local=True, version=1, length=15)


def test_parse_proxy_header_v1_unknown_ignores_rest_of_line() -> None:
    """Scenario: section 2.1, "the receiver must ignore anything presented before the CRLF"
    after UNKNOWN (HAProxy 2.6 rejects anything there; we follow the spec)."""
    assert parse_proxy_header(V1_UNKNOWN_LONGEST) == _header(local=True, version=1, length=V1_MAX_LINE_BYTES)
    line = b"PROXY UNKNOWN \xff\xfe anything\r\n"
    assert parse_proxy_header(line + PAYLOAD) == _header(local=True, version=1, length=len(line))


def test_parse_proxy_header_v1_longest_tcp6_line() -> None:
    header = parse_proxy_header(V1_TCP6_LONGEST)
    assert isinstance(header, ProxyHeader)
    assert (header.source_ip, header.dest_port, header.length) == (
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        65535,
        104,
    )


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        ("::ffff:192.0.2.1", "::ffff:c000:201"),
        ("0:0:0:0:0:0:0:0", "::"),
    ],
)
def test_parse_proxy_header_v1_ipv6_is_canonicalised(text: str, canonical: str) -> None:
    header = parse_proxy_header(f"PROXY TCP6 {text} ::1 1 2\r\n".encode())
    assert isinstance(header, ProxyHeader)
    assert header.source_ip == canonical


def test_parse_proxy_header_v1_port_bounds() -> None:
    header = parse_proxy_header(b"PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n")
    assert isinstance(header, ProxyHeader)
    assert (header.source_ip, header.dest_ip, header.source_port, header.dest_port) == (
        "0.0.0.0",
        "255.255.255.255",
        0,
        65535,
    )


def test_parse_proxy_header_v2_local_ignores_family_and_block() -> None:
    """Scenario: section 2.2, LOCAL "must use the real connection endpoints and discard the protocol
    block including the family which is ignored"; `len` still says how much to skip."""
    data = _v2(0x20, 0x41, b"\x05\x00\x09 not TLVs")
    assert parse_proxy_header(data + PAYLOAD) == _header(local=True, version=2, length=len(data))
    for i in range(len(data)):
        assert parse_proxy_header(data[:i]) is NEED_MORE


def test_parse_proxy_header_v2_local_with_addresses_drops_them() -> None:
    data = _v2(0x20, 0x11, ADDR4)
    assert parse_proxy_header(data) == _header(local=True, version=2, length=28)


def test_parse_proxy_header_v2_udp_over_ipv4_gives_addresses() -> None:
    assert parse_proxy_header(V2_UDP4) == _header(
        source_ip="192.0.2.1", source_port=8080, dest_ip="198.51.100.1", dest_port=53, version=2, length=28
    )


def test_parse_proxy_header_v2_udp_over_ipv6_gives_addresses() -> None:
    data = bytearray(encode_v2("2001:db8::7", 5353, "2001:db8::1", 53))
    data[13] = 0x22  # DGRAM
    header = parse_proxy_header(bytes(data))
    assert isinstance(header, ProxyHeader)
    assert (header.source_ip, header.source_port, header.local) == ("2001:db8::7", 5353, False)


def test_parse_proxy_header_v2_unix_has_no_ip() -> None:
    """Scenario: AF_UNIX is parsed and skipped: no IP address, no ports, but not `local` either."""
    assert parse_proxy_header(V2_UNIX_STREAM + PAYLOAD) == _header(version=2, length=16 + 216)


def test_parse_proxy_header_v2_tlvs_in_wire_order() -> None:
    tlvs = ((PP2_TYPE_NOOP, b""), (PP2_TYPE_AUTHORITY, b"broker.example"), (0xE0, b"\x00\x01"))
    data = _v2(0x21, 0x11, ADDR4 + b"".join(bytes([t]) + len(v).to_bytes(2, "big") + v for t, v in tlvs))
    header = parse_proxy_header(data)
    assert isinstance(header, ProxyHeader)
    assert header.tlvs == tlvs
    assert header.source_ip == "203.0.113.7"


def test_parse_proxy_header_v2_ipv4_mapped_ipv6_stays_ipv6() -> None:
    header = parse_proxy_header(encode_v2("::ffff:192.0.2.1", 1, "::1", 2))
    assert isinstance(header, ProxyHeader)
    assert header.source_ip == "::ffff:c000:201"


# --- ProxyHeader validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"version": 3, "length": 16}, "version must be 1 or 2, got 3"),
        ({"version": 2, "length": 0}, "length must be > 0, got 0"),
        ({"version": 1, "length": 9, "source_port": 65536}, "port must be 0-65535, got 65536"),
        (
            {"version": 1, "length": 9, "local": True, "source_ip": "1.2.3.4"},
            "a local header carries no addresses",
        ),
    ],
)
def test_proxy_header_rejects_bad_values(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _header(**fields)


# --- Encoders ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: encode_v1("1.2.3.4", 1, "::1", 2), "same address family, got '1.2.3.4' and '::1'"),
        (lambda: encode_v2("::1", 1, "1.2.3.4", 2), "same address family, got '::1' and '1.2.3.4'"),
        (lambda: encode_v1("1.2.3.4", 65536, "5.6.7.8", 2), "port must be 0-65535, got 65536"),
        (lambda: encode_v2("1.2.3.4", 1, "5.6.7.8", -1), "port must be 0-65535, got -1"),
        (
            lambda: encode_v1("broker.example", 1, "5.6.7.8", 2),
            "does not appear to be an IPv4 or IPv6 address",
        ),
        (lambda: encode_v2("fe80::1%eth0", 1, "::1", 2), "cannot carry an IPv6 scope, got 'fe80::1%eth0'"),
        (lambda: encode_v2("1.2.3.4", 1, "5.6.7.8", 2, tlvs=[(256, b"")]), "TLV type must be 0-255, got 256"),
        (
            lambda: encode_v2("1.2.3.4", 1, "5.6.7.8", 2, tlvs=[(5, bytes(65536))]),
            "TLV value must be at most 65535 bytes, got 65536",
        ),
        (
            lambda: encode_v2("1.2.3.4", 1, "5.6.7.8", 2, tlvs=[(5, bytes(40000)), (5, bytes(40000))]),
            "v2 addresses and TLVs must fit in 65535 bytes, got 80018",
        ),
        (
            lambda: encode_v2("1.2.3.4", 1, "5.6.7.8", 2, tlvs=[(PP2_TYPE_CRC32C, b"")]),
            "one CRC32C TLV of 4 bytes at most",
        ),
        (
            lambda: encode_v2("1.2.3.4", 1, "5.6.7.8", 2, tlvs=[(PP2_TYPE_CRC32C, bytes(4))] * 2),
            "one CRC32C TLV of 4 bytes at most",
        ),
    ],
    ids=[
        "v1-mixed",
        "v2-mixed",
        "v1-port",
        "v2-port",
        "hostname",
        "scope",
        "tlv-type",
        "tlv-value",
        "block",
        "crc-length",
        "two-crcs",
    ],
)
def test_encode_rejects_bad_arguments(call: Callable[[], bytes], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


ips = st.one_of(
    st.tuples(st.ip_addresses(v=4), st.ip_addresses(v=4)),
    st.tuples(st.ip_addresses(v=6), st.ip_addresses(v=6)),
)
ports = st.integers(0, 65535)
tlv_lists = st.lists(
    st.tuples(st.integers(0, 255).filter(lambda t: t != PP2_TYPE_CRC32C), st.binary(max_size=40)), max_size=5
)


@given(ips, ports, ports, st.binary(max_size=32))
def test_encode_v1_round_trip(
    addresses: tuple[object, object], sport: int, dport: int, payload: bytes
) -> None:
    source, dest = (str(a) for a in addresses)
    data = encode_v1(source, sport, dest, dport)
    assert len(data) <= V1_MAX_LINE_BYTES
    header = parse_proxy_header(data + payload)
    assert header == _header(
        source_ip=source, source_port=sport, dest_ip=dest, dest_port=dport, version=1, length=len(data)
    )


@given(ips, ports, ports, tlv_lists, st.none() | st.integers(0, 5), st.binary(max_size=32))
def test_encode_v2_round_trip(
    addresses: tuple[object, object],
    sport: int,
    dport: int,
    tlvs: list[tuple[int, bytes]],
    crc_at: int | None,
    payload: bytes,
) -> None:
    """Scenario: any addresses, ports and TLVs, with or without a CRC32C TLV somewhere."""
    source, dest = (str(a) for a in addresses)
    sent = list(tlvs)
    if crc_at is not None:
        sent.insert(min(crc_at, len(sent)), (PP2_TYPE_CRC32C, bytes(4)))
    data = encode_v2(source, sport, dest, dport, tlvs=sent)
    header = parse_proxy_header(data + payload)
    assert isinstance(header, ProxyHeader)
    assert (header.source_ip, header.source_port, header.dest_ip, header.dest_port) == (
        source,
        sport,
        dest,
        dport,
    )
    assert (header.local, header.version, header.length) == (False, 2, len(data))
    assert [t for t, _ in header.tlvs] == [t for t, _ in sent]
    assert [v for t, v in header.tlvs if t != PP2_TYPE_CRC32C] == [v for t, v in tlvs]


def test_encode_v2_local_round_trip() -> None:
    assert parse_proxy_header(encode_v2_local() + PAYLOAD) == _header(local=True, version=2, length=16)


# --- R10 4: fuzz -------------------------------------------------------------------------------


def _check_stable(data: bytes, extra: bytes) -> None:
    """The parser's outcome on `data`, and that more bytes never change a result or an error (the
    router re-parses a growing buffer) and that a NEED_MORE buffer has only NEED_MORE prefixes."""
    outcome = _outcome(data)
    longer = _outcome(data + extra)
    if isinstance(outcome, ProxyHeader):
        assert longer == outcome
        assert _outcome(data[: outcome.length]) == outcome
    elif isinstance(outcome, SniffError):
        assert isinstance(longer, SniffError)
    else:
        for i in range(len(data)):
            assert parse_proxy_header(data[:i]) is NEED_MORE


@given(st.sampled_from(VALID_HEADERS), st.integers(0, 300), st.binary(max_size=300), st.binary(max_size=16))
def test_parse_proxy_header_fuzz_prefix_of_valid_header_plus_bytes(
    header: bytes, cut: int, tail: bytes, extra: bytes
) -> None:
    _check_stable(header[:cut] + tail, extra)


@given(st.binary(max_size=300), st.binary(max_size=16))
def test_parse_proxy_header_fuzz_any_bytes(data: bytes, extra: bytes) -> None:
    _check_stable(data, extra)


@given(st.text(alphabet="PROXYTCUNKW46 .:0123456789abcdef%\r\n", max_size=120), st.binary(max_size=16))
def test_parse_proxy_header_fuzz_v1_like_lines(text: str, extra: bytes) -> None:
    _check_stable(b"PROXY " + text.encode(), extra)


@given(
    st.sampled_from([0x20, 0x21, 0x11, 0x22]),
    st.sampled_from([0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32, 0x13, 0x41]),
    st.integers(0, 300),
    st.binary(max_size=300),
    st.binary(max_size=16),
)
def test_parse_proxy_header_fuzz_v2_like_headers(
    ver_cmd: int, fam: int, length: int, block: bytes, extra: bytes
) -> None:
    _check_stable(_v2(ver_cmd, fam, block, length=length), extra)


# --- Bonus: HAProxy accepts what we encode ---------------------------------------------------------

_HAPROXY = shutil.which("haproxy")
_DEADLINE_S = 10.0
"""Upper bound for HAProxy to start, for one exchange, and for a log line; it takes milliseconds."""

_HAPROXY_CONFIG = """\
global
    log stdout format raw local0 info
defaults
    mode tcp
    log global
    option tcplog
    timeout connect 2s
    timeout client 5s
    timeout server 5s
frontend fe_accept
    bind 127.0.0.1:{listen_port} accept-proxy
    default_backend be_echo
backend be_echo
    server echo 127.0.0.1:{echo_port}
"""


class _EchoServer:
    """Echoes each connection's bytes until EOF, one connection at a time, in a thread."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="echo", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(_DEADLINE_S)
                try:
                    while data := conn.recv(65536):
                        conn.sendall(data)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_DEADLINE_S)
        self._listener.close()


class _Haproxy:
    """HAProxy in the foreground (-db) with its log lines collected from stdout."""

    def __init__(self, config_path: Path, listen_port: int) -> None:
        if _HAPROXY is None:
            pytest.fail("haproxy is not installed: run ./run-tests, which installs it (Debian: haproxy)")
        self.port = listen_port
        self._lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        self._proc = subprocess.Popen(
            [_HAPROXY, "-db", "-f", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name="haproxy-log", daemon=True)
        self._reader.start()
        self._wait_port()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line.rstrip("\n"))

    def _wait_port(self) -> None:
        deadline = time.monotonic() + _DEADLINE_S
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self._proc.returncode}: {self.drain()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"haproxy does not listen on {self.port}") from None
                time.sleep(0.02)  # polling another process's listen(): nothing to wait on

    def drain(self) -> list[str]:
        while True:
            try:
                self.log.append(self._lines.get_nowait())
            except queue.Empty:
                return self.log

    def mark(self) -> int:
        """Where the next log line will be: pass it to `wait_for_log` to skip older lines."""
        return len(self.drain())

    def wait_for_log(self, pattern: str, *, after: int = 0) -> str:
        deadline = time.monotonic() + _DEADLINE_S
        regex = re.compile(pattern)
        seen = after
        while True:
            for line in self.log[seen:]:
                if regex.search(line):
                    return line
            seen = len(self.log)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no haproxy log line matches {pattern!r}; log: {self.log}")
            with contextlib.suppress(queue.Empty):
                self.log.append(self._lines.get(timeout=remaining))

    def stop(self) -> None:
        self._proc.terminate()  # by the PID we started
        try:
            self._proc.wait(_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(_DEADLINE_S)
        self._reader.join(_DEADLINE_S)
        assert self._proc.stdout is not None
        self._proc.stdout.close()


_DROPPED = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN})
"""How a connection that HAProxy reset shows up in the client's next socket call."""


def _exchange(port: int, data: bytes) -> tuple[bytes, int]:
    """Send `data` then EOF through HAProxy; return what came back before EOF and our port."""
    with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE_S) as conn:
        client_port: int = conn.getsockname()[1]
        received = b""
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(65536):
                received += chunk
        except OSError as exc:
            # HAProxy aborts a bad header with our bytes unread: a reset, which the next send,
            # shutdown or receive reports. Anything else (a timeout) is a failure.
            if exc.errno not in _DROPPED:
                raise
    return received, client_port


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Haproxy]:
    """HAProxy with an `accept-proxy` frontend in front of an `_EchoServer`."""
    echo = _EchoServer()
    config = tmp_path_factory.mktemp("haproxy") / "haproxy.cfg"
    listen_port = free_port()
    config.write_text(_HAPROXY_CONFIG.format(listen_port=listen_port, echo_port=echo.port))
    try:
        proxy = _Haproxy(config, listen_port)
    except BaseException:
        echo.close()
        raise
    try:
        yield proxy
    finally:
        proxy.stop()
        echo.close()


@pytest.mark.integration
class TestHaproxyAcceptsOurHeaders:
    """HAProxy (`accept-proxy`) in front of an echo server: the echo proves a header was accepted,
    HAProxy's tcplog line (client address first) proves what it read from it."""

    @pytest.mark.parametrize(
        ("header", "logged_client"),
        [
            (encode_v2("203.0.113.7", 4242, "198.51.100.1", 5672), "203.0.113.7:4242"),
            (
                encode_v2(
                    "203.0.113.9",
                    4244,
                    "198.51.100.1",
                    5672,
                    tlvs=[(PP2_TYPE_CRC32C, bytes(4)), (PP2_TYPE_UNIQUE_ID, b"id-1"), (0xE0, b"x")],
                ),
                "203.0.113.9:4244",
            ),
            (encode_v2("2001:db8::7", 4243, "2001:db8::1", 5672), "2001:db8::7:4243"),
            (encode_v1("203.0.113.8", 4245, "198.51.100.1", 1883), "203.0.113.8:4245"),
            (encode_v1("2001:db8::8", 4246, "2001:db8::1", 1883), "2001:db8::8:4246"),
        ],
        ids=["v2-ipv4", "v2-ipv4-crc32c-tlvs", "v2-ipv6", "v1-ipv4", "v1-ipv6"],
    )
    def test_haproxy_accepts_encoded_header(
        self, haproxy: _Haproxy, header: bytes, logged_client: str
    ) -> None:
        received, _ = _exchange(haproxy.port, header + PAYLOAD)
        assert received == PAYLOAD
        haproxy.wait_for_log(rf"^{re.escape(logged_client)} \[.*\] fe_accept be_echo/echo ")

    def test_haproxy_accepts_local_header_with_real_address(self, haproxy: _Haproxy) -> None:
        received, client_port = _exchange(haproxy.port, encode_v2_local() + PAYLOAD)
        assert received == PAYLOAD
        haproxy.wait_for_log(rf"^127\.0\.0\.1:{client_port} \[.*\] fe_accept be_echo/echo ")

    @pytest.mark.parametrize(
        "header",
        [
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80 80 \r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80 80\n",
            _v2(0x31, 0x11, ADDR4),
            _v2(0x22, 0x11, ADDR4),
            _v2(0x21, 0x13, ADDR4),
            _v2(0x21, 0x21, ADDR4),
            _v2(0x21, 0x11, ADDR4 + b"\x05\x00\x09x"),
            V2_TCP4_TLVS[:-1] + b"X",
        ],
        ids=[
            "v1-tcp4-ipv6",
            "v1-trailing-space",
            "v1-bare-lf",
            "v2-version-3",
            "v2-command-2",
            "v2-family-0x13",
            "v2-length-short",
            "v2-tlv-overrun",
            "v2-crc-mismatch",
        ],
    )
    def test_haproxy_and_parser_both_reject(self, haproxy: _Haproxy, header: bytes) -> None:
        """Scenario: a header our parser rejects is one HAProxy drops too (cross-check). HAProxy
        logs the rejection under whatever address it had read by then, so match any."""
        with pytest.raises(SniffError):
            parse_proxy_header(header)
        mark = haproxy.mark()
        received, _ = _exchange(haproxy.port, header + PAYLOAD)
        assert received == b""
        haproxy.wait_for_log(r"\] fe_accept/1: .*PROXY protocol header", after=mark)
