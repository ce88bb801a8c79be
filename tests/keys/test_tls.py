"""keys.tls: the TLS sniffer adapting tls_sni to the sniffer contract (STYLE R10)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import NEED_MORE, Sniffed, SniffError, WireProtocol
from keys.tls import TlsSniffer
from tests.keys.conftest import mutate, sniff_outcome
from tests.tls_sni.test_clienthello import hello, reframe, versions_ext

SNIFFER = TlsSniffer()

# Captured from Python 3.11.7's `ssl` (OpenSSL 3.0.19), TLS 1.3 only:
# `ctx = ssl.create_default_context()`, `ctx.minimum_version = TLSVersion.TLSv1_3`,
# `ctx.set_alpn_protocols(["mqtt"])`, `ctx.wrap_socket(sock, server_hostname="broker.example")`
# against a throwaway listener on 127.0.0.1 that recorded the first bytes and closed.
TLS13_HELLO = bytes.fromhex(
    "".join(
        [
            "16 0301 00fe",  # record: handshake, TLS 1.0, length 254
            "01 0000fa",  # client_hello, length 250
            "0303",  # legacy_version TLS 1.2
            "ea085a13b018259e7a2988b9265689fbff9f9f02256350b837dbb2fceae54e7b",  # random
            "20",  # legacy_session_id length 32
            "c76a5fbfe9da2eb467b526e01737ef85c837830cc20877fb4ce5b9df76234e1b",
            "0008 13021303130100ff",  # cipher_suites: 3 TLS 1.3 suites + renegotiation SCSV
            "01 00",  # compression methods: null
            "00a9",  # extensions length 169
            "0000 0013",  # ext server_name, length 19
            "0011 00 000e",  # list length 17, host_name, length 14
            "62726f6b65722e6578616d706c65",  # "broker.example"
            "000b 0004 03000102",  # ext ec_point_formats
            "000a 0016 0014001d0017001e0019001801000101010201030104",  # ext supported_groups
            "0023 0000",  # ext session_ticket
            "0010 0007 0005 04 6d717474",  # ext alpn: "mqtt"
            "0016 0000",  # ext encrypt_then_mac
            "0017 0000",  # ext extended_master_secret
            "000d 001e 001c040305030603080708080809080a080b080408050806040105010601",  # sig algs
            "002b 0003 02 0304",  # ext supported_versions: TLS 1.3 only
            "002d 0002 0101",  # ext psk_key_exchange_modes
            "0033 0026",  # ext key_share, length 38
            "0024001d00209bb6a7abb1759878bcac7af9710f170e1fc57c813e85cb712c0a6bf08ab2de57",  # x25519
        ]
    )
)

# Captured the same way with `ctx.maximum_version = TLSVersion.TLSv1_2` and
# `server_hostname="broker.example"`, no ALPN: no supported_versions extension.
TLS12_HELLO = bytes.fromhex(
    "".join(
        [
            "16 0301 00b4",  # record: handshake, TLS 1.0, length 180
            "01 0000b0",  # client_hello, length 176
            "0303",  # legacy_version TLS 1.2
            "3fcb54ca58660bc37a6007392d2bc03a3df0f5aaf73c8eba438b7549a118cc13",  # random
            "00",  # legacy_session_id length 0
            "001e c02cc030c02bc02fcca9cca8c024c028c023c027009f009e006b006700ff",  # 15 suites
            "01 00",  # compression methods: null
            "0069",  # extensions length 105
            "0000 0013 0011 00 000e",  # ext server_name, length 19: list length 17, host_name, length 14
            "62726f6b65722e6578616d706c65",  # "broker.example"
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

CAPTURED = [
    pytest.param(
        TLS13_HELLO,
        Sniffed(protocol=WireProtocol.TLS, sni_host="broker.example", protocol_version="1.3"),
        id="tls13",
    ),
    pytest.param(
        TLS12_HELLO,
        Sniffed(protocol=WireProtocol.TLS, sni_host="broker.example", protocol_version="1.2"),
        id="tls12",
    ),
]


def hello_with(*, legacy_version: int = 0x0303, extensions: bytes = b"") -> bytes:
    """A minimal one-record ClientHello with the given legacy_version and extensions."""
    return hello(legacy_version=legacy_version.to_bytes(2, "big"), extensions=extensions)


class TestCaptured:
    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_sniff_tls_real_client_hello(self, frame: bytes, expected: Sniffed) -> None:
        assert SNIFFER.sniff(frame) == expected

    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_sniff_tls_every_proper_prefix_needs_more(self, frame: bytes, expected: Sniffed) -> None:
        for i in range(len(frame)):
            assert SNIFFER.sniff(frame[:i]) is NEED_MORE, i

    @pytest.mark.parametrize(("frame", "expected"), CAPTURED)
    def test_sniff_tls_trailing_bytes_ignored(self, frame: bytes, expected: Sniffed) -> None:
        assert SNIFFER.sniff(frame + b"\x14\x03\x03\x00\x01\x01" + bytes(range(256))) == expected

    def test_sniff_tls_split_over_two_records(self) -> None:
        """Scenario: the captured ClientHello re-framed into two handshake records (RFC 8446 §5.1)."""
        frame = reframe(TLS13_HELLO, 100)
        for i in range(len(frame)):
            assert SNIFFER.sniff(frame[:i]) is NEED_MORE, i
        assert SNIFFER.sniff(frame) == Sniffed(
            protocol=WireProtocol.TLS, sni_host="broker.example", protocol_version="1.3"
        )


@pytest.mark.parametrize(
    ("frame", "version"),
    [
        pytest.param(hello_with(), "1.2", id="legacy-1.2"),
        pytest.param(hello_with(legacy_version=0x0301), "1.0", id="legacy-1.0"),
        pytest.param(hello_with(legacy_version=0x0302), "1.1", id="legacy-1.1"),
        pytest.param(hello_with(legacy_version=0x0300), "ssl3", id="legacy-ssl3"),
        pytest.param(hello_with(legacy_version=0x0305), None, id="legacy-unknown"),
        pytest.param(hello_with(extensions=versions_ext(0x7A7A, 0x0304, 0x0303)), "1.3", id="grease-1.3"),
        pytest.param(hello_with(extensions=versions_ext(0x0302, 0x0303, 0x8A8A)), "1.2", id="versions-1.2"),
        pytest.param(
            hello_with(legacy_version=0x0301, extensions=versions_ext(0x2A2A)), "1.0", id="grease-only"
        ),
    ],
)
def test_sniff_tls_protocol_version(frame: bytes, version: str | None) -> None:
    assert SNIFFER.sniff(frame) == Sniffed(protocol=WireProtocol.TLS, protocol_version=version)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        pytest.param(
            b"\x15\x03\x03\x00\x02\x02\x28", r"^tls: not a tls handshake record: content type 21", id="alert"
        ),
        pytest.param(bytes.fromhex("802e0103010015"), "^tls: sslv2-style client hello", id="sslv2"),
        pytest.param(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "handshake type 2", id="server-hello"),
        pytest.param(b"\x16\x03\x01\x00\x00", "zero-length handshake record", id="empty-record"),
        pytest.param(
            TLS12_HELLO.replace(bytes.fromhex("000000130011"), bytes.fromhex("000000130012")),
            "server_name_list needs 18 bytes",
            id="bad-sni-length",
        ),
    ],
)
def test_sniff_tls_malformed_raises_sniff_error(frame: bytes, message: str) -> None:
    with pytest.raises(SniffError, match=message) as info:
        SNIFFER.sniff(frame)
    assert info.value.protocol == "tls"
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("prefix", [b"\x16", b"\x16\x03\x01", TLS13_HELLO])
def test_looks_like_tls_handshake_record(prefix: bytes) -> None:
    assert SNIFFER.looks_like(prefix)


@pytest.mark.parametrize("prefix", [b"", b"AMQP", b"CONNECT", b"\x00\x00\x00", b"\x10", b"\x16\x02"])
def test_looks_like_tls_false_for_other_protocols(prefix: bytes) -> None:
    assert not SNIFFER.looks_like(prefix)


def test_tls_sniffer_name() -> None:
    assert SNIFFER.name == "tls"


def _sniff_only_allowed_outcomes(data: bytes) -> None:
    """NEED_MORE, a Sniffed or exactly SniffError; anything else fails the test."""
    result = sniff_outcome(SNIFFER.sniff, data)
    assert isinstance(result, SniffError) or result is NEED_MORE or isinstance(result, Sniffed)


@given(
    frame=st.sampled_from([TLS13_HELLO, TLS12_HELLO]),
    cut=st.integers(min_value=0),
    tail=st.binary(max_size=64),
)
def test_sniff_tls_prefix_plus_garbage(frame: bytes, cut: int, tail: bytes) -> None:
    _sniff_only_allowed_outcomes(frame[: cut % (len(frame) + 1)] + tail)


@given(data=st.binary(max_size=400))
def test_sniff_tls_arbitrary_bytes(data: bytes) -> None:
    _sniff_only_allowed_outcomes(data)


@given(
    frame=st.sampled_from([TLS13_HELLO, TLS12_HELLO]),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_sniff_tls_mutated_capture(frame: bytes, edits: list[tuple[int, int]]) -> None:
    _sniff_only_allowed_outcomes(mutate(frame, edits))
