"""tls_sni.clienthello: ClientHello reassembly and parsing (STYLE R10: fixture, prefixes, trailing, fuzz)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tls_sni import ClientHello, parse_client_hello, starts_like_tls_record

# Captured from Python 3.11.7's `ssl` (OpenSSL 3.0.19): `ssl.create_default_context()` with
# `set_alpn_protocols(["mqtt", "amqp"])`, `wrap_socket(sock, server_hostname="a.example")`
# against a throwaway listener on 127.0.0.1 that recorded the first bytes and closed.
PYTHON_SSL_TLS13_HELLO = bytes.fromhex(
    "".join(
        [
            "16",  # record: handshake
            "0301",  # legacy_record_version TLS 1.0
            "0200",  # record length 512
            "01",  # handshake: client_hello
            "0001fc",  # handshake length 508
            "0303",  # legacy_version TLS 1.2
            "7730997fef646e5ff3d0d40389a366345c9481d04444eda959342d3558a6ff30",  # random
            "20",  # legacy_session_id length 32 (middlebox compatibility mode)
            "4c48a0d80175f993f50666a6247395bcd14bd4d567dd7754bf7df968fe8e0037",  # session id
            "0024",  # cipher_suites length 36 (18 suites)
            "130213031301c02cc030c02bc02fcca9cca8c024c028c023c027009f009e006b006700ff",  # suites
            "01",  # legacy_compression_methods length 1
            "00",  # null compression
            "018f",  # extensions length 399
            "0000",  # ext server_name
            "000e",  # ext length 14
            "000c",  # server_name_list length 12
            "00",  # name type host_name
            "0009",  # host name length 9
            "612e6578616d706c65",  # "a.example"
            "000b 0004 03000102",  # ext ec_point_formats
            "000a 0016 0014001d0017001e0019001801000101010201030104",  # ext supported_groups
            "0023 0000",  # ext session_ticket, empty
            "0010",  # ext application_layer_protocol_negotiation
            "000c",  # ext length 12
            "000a",  # protocol_name_list length 10
            "04 6d717474",  # "mqtt"
            "04 616d7170",  # "amqp"
            "0016 0000",  # ext encrypt_then_mac
            "0017 0000",  # ext extended_master_secret
            "000d 002a",  # ext signature_algorithms, length 42, then the list: length 40, 20 schemes
            "0028 040305030603080708080809080a080b080408050806040105010601030303010302040205020602",
            "002b",  # ext supported_versions
            "0005",  # ext length 5
            "04",  # versions length 4
            "0304",  # TLS 1.3
            "0303",  # TLS 1.2
            "002d 0002 0101",  # ext psk_key_exchange_modes: psk_dhe_ke
            "0033 0026",  # ext key_share, length 38
            "0024001d0020a3b9149d42f64b14ac6faa7a2634050d27cafda2d789892b7edaac0fbdfd347a",  # x25519
            "0015 00d4",  # ext padding, length 212
            "00" * 212,
        ]
    )
)
PYTHON_SSL_TLS13_EXPECTED = ClientHello(
    sni="a.example", alpn=("mqtt", "amqp"), legacy_version=0x0303, supported_versions=(0x0304, 0x0303)
)

# Captured the same way from a TLS 1.2-only context without SNI or ALPN:
# `ssl.SSLContext(PROTOCOL_TLS_CLIENT)`, `check_hostname = False`, `verify_mode = CERT_NONE`,
# `maximum_version = TLSVersion.TLSv1_2`, `wrap_socket(sock, server_hostname=None)`.
PYTHON_SSL_TLS12_HELLO = bytes.fromhex(
    "".join(
        [
            "16 0301 009d",  # record: handshake, TLS 1.0, length 157
            "01 000099",  # client_hello, length 153
            "0303",  # legacy_version TLS 1.2
            "c52a212de025823a63a02b71cc5442e32b0d8927c543f50461f3d9af73cf5059",  # random
            "00",  # legacy_session_id length 0
            "001e",  # cipher_suites length 30
            "c02cc030c02bc02fcca9cca8c024c028c023c027009f009e006b006700ff",  # suites
            "01 00",  # compression methods: null
            "0052",  # extensions length 82
            "000b 0004 03000102",  # ext ec_point_formats
            "000a 000c 000a001d0017001e00190018",  # ext supported_groups
            "0023 0000",  # ext session_ticket
            "0016 0000",  # ext encrypt_then_mac
            "0017 0000",  # ext extended_master_secret
            "000d 002a",  # ext signature_algorithms, length 42, then the list: length 40, 20 schemes
            "0028 040305030603080708080809080a080b080408050806040105010601030303010302040205020602",
        ]
    )
)
PYTHON_SSL_TLS12_EXPECTED = ClientHello(sni=None, alpn=(), legacy_version=0x0303, supported_versions=())

CAPTURED = [
    pytest.param(PYTHON_SSL_TLS13_HELLO, PYTHON_SSL_TLS13_EXPECTED, id="python-ssl-tls13"),
    pytest.param(PYTHON_SSL_TLS12_HELLO, PYTHON_SSL_TLS12_EXPECTED, id="python-ssl-tls12-no-sni"),
]


def reframe(single_record_hello: bytes, *sizes: int) -> bytes:
    """Re-frame a one-record ClientHello into records whose fragments have the given sizes (the
    last fragment takes the rest), as RFC 8446 §5.1 allows."""
    handshake = single_record_hello[5:]
    records = []
    pos = 0
    for size in [*sizes, len(handshake)]:
        fragment = handshake[pos : pos + size]
        if fragment:
            records.append(record(fragment))
        pos += size
    return b"".join(records)


def record(fragment: bytes, *, content_type: int = 0x16, version: bytes = b"\x03\x01") -> bytes:
    return bytes((content_type,)) + version + len(fragment).to_bytes(2, "big") + fragment


def handshake(body: bytes, *, msg_type: int = 1) -> bytes:
    return bytes((msg_type,)) + len(body).to_bytes(3, "big") + body


def ext(ext_type: int, data: bytes) -> bytes:
    return ext_type.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


def vec16(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def sni_ext(*names: bytes, name_type: int = 0) -> bytes:
    return ext(0, vec16(b"".join(bytes((name_type,)) + vec16(name) for name in names)))


def alpn_ext(*names: bytes) -> bytes:
    return ext(16, vec16(b"".join(bytes((len(name),)) + name for name in names)))


def versions_ext(*versions: int) -> bytes:
    raw = b"".join(v.to_bytes(2, "big") for v in versions)
    return ext(43, bytes((len(raw),)) + raw)


def hello_body(
    *,
    legacy_version: bytes = b"\x03\x03",
    session_id: bytes = b"",
    cipher_suites: bytes = b"\x13\x01",
    compression: bytes = b"\x00",
    extensions: bytes | None = b"",
    after: bytes = b"",
) -> bytes:
    body = (
        legacy_version
        + bytes(32)
        + bytes((len(session_id),))
        + session_id
        + vec16(cipher_suites)
        + bytes((len(compression),))
        + compression
    )
    if extensions is not None:
        body += vec16(extensions)
    return body + after


def hello(*, extensions: bytes | None = b"", **fields: bytes) -> bytes:
    """A one-record ClientHello built from `hello_body` fields."""
    return record(handshake(hello_body(extensions=extensions, **fields)))


class TestCapturedHellos:
    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_parse_client_hello_real_client(self, frame: bytes, expected: ClientHello) -> None:
        assert parse_client_hello(frame) == expected

    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_parse_client_hello_every_proper_prefix_needs_more(
        self, frame: bytes, expected: ClientHello
    ) -> None:
        for i in range(len(frame)):
            assert parse_client_hello(frame[:i]) is None, i

    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    @pytest.mark.parametrize(
        "trailing",
        [b"\x14\x03\x03\x00\x01\x01", b"\x17\x03\x03\x00\x05hello", b"\x00" * 100, b"\xff"],
        ids=["change-cipher-spec", "early-data", "zeros", "garbage"],
    )
    def test_parse_client_hello_ignores_trailing_bytes(
        self, frame: bytes, expected: ClientHello, trailing: bytes
    ) -> None:
        assert parse_client_hello(frame + trailing) == expected


class TestReassembly:
    @pytest.mark.parametrize(
        "sizes",
        [(1,), (4,), (5,), (100,), (511,), (200, 200), (1,) * 511],
        ids=["1", "header-only", "header+1", "100", "all-but-1", "3-records", "1-byte-records"],
    )
    def test_parse_client_hello_split_over_records(self, sizes: tuple[int, ...]) -> None:
        """Scenario: the captured ClientHello re-framed into several handshake records."""
        frame = reframe(PYTHON_SSL_TLS13_HELLO, *sizes)
        assert frame.count(b"\x16\x03\x01") >= len(sizes) + 1
        assert parse_client_hello(frame) == PYTHON_SSL_TLS13_EXPECTED

    def test_parse_client_hello_split_over_two_records_every_prefix_needs_more(self) -> None:
        frame = reframe(PYTHON_SSL_TLS13_HELLO, 300)
        assert len(frame) == len(PYTHON_SSL_TLS13_HELLO) + 5
        for i in range(len(frame)):
            assert parse_client_hello(frame[:i]) is None, i
        assert parse_client_hello(frame) == PYTHON_SSL_TLS13_EXPECTED
        assert parse_client_hello(frame + b"\x15\x03\x03\x00\x02\x02\x28") == PYTHON_SSL_TLS13_EXPECTED

    def test_parse_client_hello_ignores_handshake_bytes_after_hello_in_its_record(self) -> None:
        frame = record(PYTHON_SSL_TLS13_HELLO[5:] + handshake(b"", msg_type=20))
        assert parse_client_hello(frame) == PYTHON_SSL_TLS13_EXPECTED

    def test_parse_client_hello_record_versions_ssl3_to_tls13_accepted(self) -> None:
        for minor in range(5):
            frame = record(PYTHON_SSL_TLS13_HELLO[5:], version=bytes((3, minor)))
            assert parse_client_hello(frame) == PYTHON_SSL_TLS13_EXPECTED


class TestFields:
    def test_parse_client_hello_without_extensions(self) -> None:
        """Scenario: a TLS 1.2 hello may end after the compression methods (RFC 5246 §7.4.1.2)."""
        parsed = parse_client_hello(hello(extensions=None))
        assert parsed == ClientHello(sni=None, alpn=(), legacy_version=0x0303, supported_versions=())

    def test_parse_client_hello_grease_and_unknown_name_type(self) -> None:
        extensions = (
            ext(0x0A0A, b"")
            + sni_ext(b"other", name_type=7)
            + alpn_ext(b"\x8a\x8a", b"h2")
            + versions_ext(0x1A1A, 0x0304)
        )
        parsed = parse_client_hello(hello(extensions=extensions))
        assert parsed == ClientHello(
            sni=None, alpn=("\x8a\x8a", "h2"), legacy_version=0x0303, supported_versions=(0x1A1A, 0x0304)
        )

    def test_parse_client_hello_sni_kept_as_sent(self) -> None:
        parsed = parse_client_hello(hello(extensions=sni_ext(b"Broker-1.xn--bcher-kva.example")))
        assert parsed is not None
        assert parsed.sni == "Broker-1.xn--bcher-kva.example"


MALFORMED = [
    pytest.param(b"\x15\x03\x03\x00\x02\x02\x28", "not a tls handshake record: content type 21", id="alert"),
    pytest.param(b"\x17", r"content type 23 \(application_data\)", id="application-data"),
    pytest.param(b"GET / HTTP/1.1\r\n", "content type 71 \\(unknown\\)", id="http"),
    pytest.param(bytes.fromhex("802e0103010015"), "sslv2-style client hello", id="sslv2"),
    pytest.param(b"\x16\x02", "major version is not 3", id="record-major-2"),
    pytest.param(b"\x16\x03\x05", "unsupported record version 0305", id="record-minor-5"),
    pytest.param(b"\x16\x03\x01\x00\x00", "zero-length handshake record", id="empty-record"),
    pytest.param(
        b"\x16\x03\x01\x40\x01", "record length 16385 at offset 0 exceeds 16384", id="record-too-long"
    ),
    pytest.param(
        record(b"\x02"),
        "expected a client hello \\(handshake type 1\\), got handshake type 2",
        id="server-hello",
    ),
    pytest.param(record(b"\x01\xff\xff\xff"), "client hello length 16777215 exceeds", id="hello-too-long"),
    pytest.param(
        reframe(PYTHON_SSL_TLS13_HELLO, 100)[:105] + b"\x15\x03\x03",
        r"record of content type 21 \(alert\) inside the client hello",
        id="interleaved-alert",
    ),
    pytest.param(
        hello(legacy_version=b"\x02\x00"), "legacy_version 0x0200 is older than ssl 3.0", id="version"
    ),
    pytest.param(
        hello(session_id=bytes(33)), "legacy_session_id length 33 is outside 0..32", id="session-id"
    ),
    pytest.param(hello(cipher_suites=b""), "cipher_suites length 0 is outside 2..65534", id="no-suites"),
    pytest.param(hello(cipher_suites=b"\x13\x01\x13"), "cipher_suites length 3 is odd", id="odd-suites"),
    pytest.param(
        hello(compression=b""), "legacy_compression_methods length 0 is outside 1..255", id="no-comp"
    ),
    pytest.param(
        hello(after=b"\x00"), "extra bytes after the client hello extensions: 1", id="after-extensions"
    ),
    pytest.param(hello(extensions=b"\x00\x00\x00\x05\x00"), "extension 0 needs 5 bytes", id="ext-overrun"),
    pytest.param(hello(extensions=b"\x00"), "extension type needs 2 bytes", id="ext-type-cut"),
    pytest.param(
        hello(extensions=ext(23, b"") + ext(23, b"")), "extension 23 appears twice", id="duplicate-ext"
    ),
    pytest.param(hello(extensions=ext(0, b"")), "server_name_list length needs 2 bytes", id="empty-sni-ext"),
    pytest.param(
        hello(extensions=ext(0, b"\x00\x00")), "server_name_list length 0 is outside", id="empty-sni-list"
    ),
    pytest.param(hello(extensions=sni_ext(b"")), "server name length 0 is outside 1..65535", id="empty-host"),
    pytest.param(
        hello(extensions=sni_ext("bücher.example".encode())), "server name is not ascii", id="utf8-host"
    ),
    pytest.param(hello(extensions=sni_ext(b"a.example", b"b.example")), "name type 0 twice", id="two-hosts"),
    pytest.param(
        hello(extensions=ext(0, vec16(b"\x00\x00\x01a") + b"x")),
        "extra bytes after the server_name_list: 1",
        id="sni-tail",
    ),
    pytest.param(
        hello(extensions=alpn_ext(b"", b"h2")),
        "alpn protocol name length 0 is outside 1..255",
        id="alpn-empty-name",
    ),
    pytest.param(
        hello(extensions=ext(16, b"\x00\x00")),
        "protocol_name_list length 0 is outside 2..65535",
        id="alpn-empty",
    ),
    pytest.param(
        hello(extensions=ext(16, b"\x00\x02\x01h\x00")),
        "extra bytes after the alpn protocol_name_list: 1",
        id="alpn-tail",
    ),
    pytest.param(
        hello(extensions=ext(43, b"\x03\x03\x04\x03")),
        "supported_versions length 3 is odd",
        id="odd-versions",
    ),
    pytest.param(
        hello(extensions=ext(43, b"\x00")), "supported_versions length 0 is outside 2..254", id="no-versions"
    ),
    pytest.param(
        hello(extensions=ext(43, b"\x02\x03\x04\x00")),
        "extra bytes after the supported_versions list: 1",
        id="versions-tail",
    ),
]


@pytest.mark.parametrize(("frame", "message"), MALFORMED)
def test_parse_client_hello_malformed_raises(frame: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_client_hello(frame)
    assert type(info.value) is ValueError
    assert str(info.value) == str(info.value).rstrip(".")
    assert str(info.value)[0].islower()


def test_parse_client_hello_rejects_garbage_before_the_record_is_complete() -> None:
    """Scenario: a bad handshake type is reported from the first fragment byte, not after 16 KiB."""
    with pytest.raises(ValueError, match="handshake type 2"):
        parse_client_hello(b"\x16\x03\x01\x40\x00\x02")


def test_parse_client_hello_empty_needs_more() -> None:
    assert parse_client_hello(b"") is None


class TestStartsLikeTlsRecord:
    @pytest.mark.parametrize(
        "prefix",
        [b"\x16", b"\x16\x03", b"\x16\x03\x00", b"\x16\x03\x01", b"\x16\x03\x04", PYTHON_SSL_TLS13_HELLO],
    )
    def test_starts_like_tls_record_true(self, prefix: bytes) -> None:
        assert starts_like_tls_record(prefix)

    @pytest.mark.parametrize(
        "prefix",
        [
            b"",
            b"AMQP",
            b"CONNECT",
            b"\x00\x00\x00",
            b"\x10",
            b"\x80\x2e\x01",
            b"\x16\x02",
            b"\x16\x03\x05",
            b"\x15",
        ],
    )
    def test_starts_like_tls_record_false(self, prefix: bytes) -> None:
        assert not starts_like_tls_record(prefix)


def _parse_only_allowed_outcomes(data: bytes) -> ClientHello | None:
    """None, a ClientHello, or exactly ValueError (not UnicodeDecodeError, a ValueError too)."""
    try:
        result = parse_client_hello(data)
    except ValueError as exc:
        if type(exc) is not ValueError:
            pytest.fail(f"raised {exc!r}, a subclass of ValueError")
        return None
    assert result is None or isinstance(result, ClientHello)
    return result


class TestFuzz:
    @given(
        frame=st.sampled_from(
            [PYTHON_SSL_TLS13_HELLO, PYTHON_SSL_TLS12_HELLO, reframe(PYTHON_SSL_TLS13_HELLO, 7, 300)]
        ),
        cut=st.integers(min_value=0),
        tail=st.binary(max_size=64),
    )
    def test_parse_client_hello_prefix_plus_garbage(self, frame: bytes, cut: int, tail: bytes) -> None:
        _parse_only_allowed_outcomes(frame[: cut % (len(frame) + 1)] + tail)

    @given(data=st.binary(max_size=600))
    @example(data=b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x03")
    def test_parse_client_hello_arbitrary_bytes(self, data: bytes) -> None:
        _parse_only_allowed_outcomes(data)

    @given(
        data=st.binary(max_size=200).map(
            lambda b: (
                b"\x16\x03\x01" + (len(b) + 4).to_bytes(2, "big") + b"\x01" + len(b).to_bytes(3, "big") + b
            )
        )
    )
    def test_parse_client_hello_arbitrary_body(self, data: bytes) -> None:
        """Scenario: random bytes inside a well-framed record reach the body parser."""
        _parse_only_allowed_outcomes(data)

    @given(
        frame=st.sampled_from([PYTHON_SSL_TLS13_HELLO, PYTHON_SSL_TLS12_HELLO]),
        edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
    )
    def test_parse_client_hello_mutated_capture(self, frame: bytes, edits: list[tuple[int, int]]) -> None:
        mutated = bytearray(frame)
        for index, value in edits:
            mutated[index % len(mutated)] = value
        _parse_only_allowed_outcomes(bytes(mutated))

    @given(
        sni=st.none() | st.from_regex(r"\A[a-z0-9][a-z0-9.-]{0,60}\Z"),
        alpn=st.lists(st.binary(min_size=1, max_size=12), max_size=4),
        versions=st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=8) | st.none(),
        split=st.integers(min_value=1, max_value=200),
    )
    def test_parse_client_hello_round_trip(
        self, sni: str | None, alpn: list[bytes], versions: list[int] | None, split: int
    ) -> None:
        extensions = ext(0x0A0A, b"\x00")
        if sni is not None:
            extensions += sni_ext(sni.encode())
        if alpn:
            extensions += alpn_ext(*alpn)
        if versions is not None:
            extensions += versions_ext(*versions)
        frame = reframe(hello(extensions=extensions), split)
        assert parse_client_hello(frame) == ClientHello(
            sni=sni,
            alpn=tuple(name.decode("latin-1") for name in alpn),
            legacy_version=0x0303,
            supported_versions=tuple(versions or ()),
        )
        assert parse_client_hello(frame[:-1]) is None
