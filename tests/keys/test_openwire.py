"""Tests of `keys.openwire`: the OpenWire sniffer, the router's WireFormatInfo echo, the broker
preamble measure and the ConnectionControl encoder (STYLE R10).

The fixtures are real bytes. They were captured on 2026-11-22 from the ActiveMQ Java client 5.17.2
(Debian libactivemq-java 5.17.2+dfsg-2+deb12u1, OpenJDK 17.0.15) by a throwaway capture server on
127.0.0.1 (in /tmp/capture, outside the repository): it answered the client's WireFormatInfo with
this module's echo and recorded everything the client sent in the next 1.5 s. The client program,
compiled at capture time, did `new ActiveMQConnectionFactory("alice", "s3cret", url)`,
`createConnection()`, `setClientID("client-42")`, `start()`, with url `tcp://127.0.0.1:PORT` or
`failover:(tcp://127.0.0.1:PORT)?maxReconnectAttempts=0`, plus the `wireFormat.*` options named
at each fixture. The broker's WireFormatInfo came from a Debian ActiveMQ 5.17.2 broker the same
way. The integration tests at the end start a real broker and run the real Java client.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import NEED_MORE, Reply, Sniffed, SniffError, WireProtocol, openwire
from keys.openwire import (
    MAX_COMMAND_BYTES,
    OpenWireSniffer,
    WireFormat,
    encode_connection_control,
    replayed_opening,
    sniff_server_preamble,
    sniff_wire_format,
)
from tests.conftest import JAVA_CLIENT_JARS, ActiveMQ, require_java
from tests.keys.conftest import OneConnectionServer, mutate, read_until_sniffed, sniff_outcome

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

SNIFFER = OpenWireSniffer()


def _hex(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts))


# --- Captured WireFormatInfo frames ---------------------------------------------------------------
# `WireFormatInfoMarshaller.looseMarshal` behind a 4-byte size prefix; the properties are a
# `MarshallingSupport` primitive map (a `writeUTF` name, then a type byte: 01 boolean, 05 int,
# 06 long, 09 string). The captures made with `wireFormat.cacheEnabled=false`,
# `wireFormat.sizePrefixDisabled=true` or `wireFormat.tightEncodingEnabled=false` differ from the
# default one only in the value byte of that property (checked byte for byte at capture time).


def _wfi_tcp(
    *, cache: str = "01", size_prefix_disabled: str = "00", tight: str = "01", host: bool = True
) -> bytes:
    """The client's WireFormatInfo on `tcp://127.0.0.1:PORT` (the Host property is set); without
    `host`, the one without a Host property (see `_wfi_no_host`)."""
    return _hex(
        "00000164" if host else "00000152",  # size prefix: 356 bytes follow (338 without Host)
        "01",  # data type 1: WireFormatInfo
        "4163746976654d51",  # magic "ActiveMQ"
        "0000000c",  # version 12
        "01",  # marshalledProperties present
        "00000152" if host else "00000140",  # properties: 338 bytes (320 without Host)
        "0000000e" if host else "0000000d",  # primitive map: 14 entries (13 without Host)
        "0011537461636b5472616365456e61626c65640101",  # StackTraceEnabled: boolean true
        "000f506c6174666f726d44657461696c730900044a617661",  # PlatformDetails: string "Java"
        "000c4361636865456e61626c656401" + cache,  # CacheEnabled: boolean (01 = true)
        "0004486f73740900093132372e302e302e31" if host else "",  # Host: string "127.0.0.1"
        "00115463704e6f44656c6179456e61626c65640101",  # TcpNoDelayEnabled: boolean true
        "001253697a6550726566697844697361626c656401" + size_prefix_disabled,  # SizePrefixDisabled
        "0009436163686553697a650500000400",  # CacheSize: int 1024
        "000c50726f76696465724e616d650900084163746976654d51",  # ProviderName: string "ActiveMQ"
        "00145469676874456e636f64696e67456e61626c656401" + tight,  # TightEncodingEnabled
        "000c4d61784672616d6553697a65067fffffffffffffff",  # MaxFrameSize: long 2**63-1
        "00154d6178496e61637469766974794475726174696f6e060000000000007530",  # MaxInactivityDuration
        # MaxInactivityDurationInitalDelay (sic): long 10000
        "00204d6178496e61637469766974794475726174696f6e496e6974616c44656c6179060000000000002710",
        "00134d61784672616d6553697a65456e61626c65640101",  # MaxFrameSizeEnabled: boolean true
        "000f50726f766964657256657273696f6e090006352e31372e32",  # ProviderVersion: string "5.17.2"
    )


def _cache_off(wfi: bytes) -> bytes:
    """A captured client WireFormatInfo with its CacheEnabled true turned false, as the router's
    echo and its replay to the broker send it."""
    on, off = _hex("000c4361636865456e61626c65640101"), _hex("000c4361636865456e61626c65640100")
    return wfi.replace(on, off)


def _wfi_no_host(*, tight: str = "01") -> bytes:
    """The WireFormatInfo without a Host property. The Debian ActiveMQ 5.17.2 broker sends exactly
    this (tight = 01); so does the 5.17.2 client on `failover:(tcp://…)`."""
    return _wfi_tcp(tight=tight, host=False)


BROKER_WFI = _wfi_no_host()
"""What the real Debian ActiveMQ 5.17.2 broker sent first."""

# --- Captured ConnectionInfo commands -------------------------------------------------------------
# `ConnectionInfoMarshaller` (v12), as the 5.17.2 client sends it after the router's echo, which
# turns the marshal cache off (re-captured on 2026-11-29 when the echo started to). Tight: a
# booleans stream (a length byte, then flags read from the least significant bit up) holds every
# flag; loose: each flag is its own byte. With the cache off, connectionId has no "new in cache"
# flag and no cache index (a client told the cache is on sends both).

CI_TCP_TIGHT = _hex(
    "00000043",  # size prefix: 67 bytes follow
    "03",  # data type 3: ConnectionInfo
    "03ff3300",  # booleans stream, 3 bytes. ff: responseRequired, connectionId present, its value
    # present + ASCII, clientId present + ASCII, password present + ASCII; 33: userName present +
    # ASCII, brokerPath null, brokerMasterConnector false, manageable, clientMaster, faultTolerant
    # false, failoverReconnect false; 00: clientIp null
    "00000001",  # BaseCommand.commandId 1
    "78",  # data type 120: ConnectionId
    "001d49443a766d2d34313130372d313739353933353133393634362d313a31",  # "ID:vm-41107-1795935139646-1:1"
    "0009636c69656e742d3432",  # clientId "client-42"
    "0006733363726574",  # password "s3cret"
    "0005616c696365",  # userName "alice"
)

CI_FAILOVER_TIGHT = _hex(
    "00000043",  # size prefix: 67 bytes follow
    "03",  # data type 3: ConnectionInfo
    "03ff7300",  # booleans stream as CI_TCP_TIGHT, but 73: faultTolerant true
    "00000001",  # commandId 1
    "78",  # data type 120: ConnectionId
    "001d49443a766d2d34363333332d313739353933353134303039312d313a31",  # "ID:vm-46333-1795935140091-1:1"
    "0009636c69656e742d3432",  # clientId "client-42"
    "0006733363726574",  # password "s3cret"
    "0005616c696365",  # userName "alice"
)

CI_TCP_TIGHT_NO_CACHE = _hex(  # wireFormat.cacheEnabled=false: the same layout as after the echo
    "00000043",  # size prefix: 67 bytes follow
    "03",  # data type 3: ConnectionInfo
    "03ff3300",  # booleans stream as CI_TCP_TIGHT
    "00000001",  # commandId 1
    "78",  # data type 120: ConnectionId (no cache index)
    "001d49443a766d2d33373236392d313739353331393436353536312d313a31",  # "ID:vm-37269-1795319465561-1:1"
    "0009636c69656e742d3432",  # clientId "client-42"
    "0006733363726574",  # password "s3cret"
    "0005616c696365",  # userName "alice"
)

CI_TCP_TIGHT_NO_PREFIX = _hex(  # wireFormat.sizePrefixDisabled=true
    "03",  # data type 3: ConnectionInfo (no size prefix)
    "03ff3300",  # booleans stream as CI_TCP_TIGHT
    "00000001",  # commandId 1
    "78",  # data type 120: ConnectionId
    "001d49443a766d2d34333637372d313739353933353836313432322d313a31",  # "ID:vm-43677-1795935861422-1:1"
    "0009636c69656e742d3432",  # clientId "client-42"
    "0006733363726574",  # password "s3cret"
    "0005616c696365",  # userName "alice"
)

CI_TCP_TIGHT_UNICODE = _hex(  # setClientID("kl\u00fcnt-\u20ac-\ud83d\ude00")
    "0000004b",  # size prefix: 75 bytes follow
    "03",  # data type 3: ConnectionInfo
    "03df3300",  # booleans stream: df has clientId ASCII false, so it is sent with writeUTF
    "00000001",  # commandId 1
    "78",  # data type 120: ConnectionId
    "001d49443a766d2d33343434332d313739353933353835373536332d313a31",  # "ID:vm-34443-1795935857563-1:1"
    "00116b6cc3bc6e742de282ac2deda0bdedb880",  # clientId: "klünt-€-", then U+1F600 as two
    # surrogates of 3 bytes each (Java modified UTF-8)
    "0006733363726574",  # password "s3cret"
    "0005616c696365",  # userName "alice"
)

CI_TCP_LOOSE = _hex(  # wireFormat.tightEncodingEnabled=false
    "0000004c",  # size prefix: 76 bytes follow
    "03",  # data type 3: ConnectionInfo
    "00000001",  # commandId 1
    "01",  # responseRequired true
    "0178",  # connectionId present (no cache flag or index), data type 120: ConnectionId
    "01001d49443a766d2d34303134352d313739353933353835373933312d313a31",  # "ID:vm-40145-1795935857931-1:1"
    "010009636c69656e742d3432",  # clientId "client-42"
    "010006733363726574",  # password "s3cret"
    "010005616c696365",  # userName "alice"
    "00",  # brokerPath null
    "0001010000",  # brokerMasterConnector, manageable, clientMaster, faultTolerant, failoverReconnect
    "00",  # clientIp null
)

CI_FAILOVER_LOOSE = _hex(  # failover:(tcp://…?wireFormat.tightEncodingEnabled=false)
    "0000004c",  # size prefix: 76 bytes follow
    "03",  # data type 3: ConnectionInfo
    "0000000101",  # commandId 1, responseRequired true
    "0178",  # connectionId present, data type 120: ConnectionId
    "01001d49443a766d2d34323535332d313739353933353835383237372d313a31",  # "ID:vm-42553-1795935858277-1:1"
    "010009636c69656e742d3432",  # clientId "client-42"
    "010006733363726574",  # password "s3cret"
    "010005616c696365",  # userName "alice"
    "00",  # brokerPath null
    "0001010100",  # brokerMasterConnector, manageable, clientMaster, faultTolerant (true), failoverReconnect
    "00",  # clientIp null
)

CI_TCP_LOOSE_NO_PREFIX_NO_CACHE = _hex(  # the three wireFormat options above all set "off"
    "03",  # data type 3: ConnectionInfo (no size prefix)
    "0000000101",  # commandId 1, responseRequired true
    "0178",  # connectionId present (no cache flag or index), data type 120: ConnectionId
    "01001d49443a766d2d33343331352d313739353331393437343833322d313a31",  # "ID:vm-34315-1795319474832-1:1"
    "010009636c69656e742d3432",  # clientId "client-42"
    "010006733363726574",  # password "s3cret"
    "010005616c696365",  # userName "alice"
    "00",  # brokerPath null
    "0001010000",  # brokerMasterConnector, manageable, clientMaster, faultTolerant, failoverReconnect
    "00",  # clientIp null
)

LOOSE_TAIL_AFTER_USER_NAME = 7
"""Bytes of a loose ConnectionInfo after userName (brokerPath null, five flags, clientIp null)."""


@dataclass(frozen=True, slots=True)
class Capture:
    wfi: bytes
    """The client's WireFormatInfo frame."""
    rest: bytes
    """What the client sent after the echo."""
    expected: Sniffed
    fmt: WireFormat
    """The options in effect after the echo."""
    sniffed_after: int
    """Length of the shortest prefix that gives `expected`: the whole capture, except without
    size prefixes, where the sniffer answers as soon as userName is read."""

    @property
    def full(self) -> bytes:
        return self.wfi + self.rest

    @property
    def echo(self) -> bytes:
        """The router's answer to `wfi`: the same frame, the cache off."""
        return _cache_off(self.wfi)


def _expected(client_id: str = "client-42") -> Sniffed:
    return Sniffed(
        protocol=WireProtocol.OPENWIRE,
        client_id=client_id,
        user_name="alice",
        password="s3cret",
        protocol_version="12",
    )


def _fmt(*, tight: bool, cache: bool, prefix: bool = True) -> WireFormat:
    return WireFormat(
        version=12,
        offered_version=12,
        tight_encoding=tight,
        size_prefix_disabled=not prefix,
        cache_enabled=cache,
        cache_size=1024 if cache else 0,
        max_inactivity_duration_ms=30000,
        max_frame_size=2**63 - 1,
    )


def _capture(wfi: bytes, rest: bytes, expected: Sniffed, fmt: WireFormat, tail: int = 0) -> Capture:
    return Capture(wfi, rest, expected, fmt, len(wfi) + len(rest) - tail)


ALL_CAPTURES: dict[str, Capture] = {
    "tcp-tight": _capture(_wfi_tcp(), CI_TCP_TIGHT, _expected(), _fmt(tight=True, cache=False)),
    "failover-tight": _capture(_wfi_no_host(), CI_FAILOVER_TIGHT, _expected(), _fmt(tight=True, cache=False)),
    "tcp-tight-no-cache": _capture(
        _wfi_tcp(cache="00"), CI_TCP_TIGHT_NO_CACHE, _expected(), _fmt(tight=True, cache=False)
    ),
    "tcp-tight-no-prefix": _capture(
        _wfi_tcp(size_prefix_disabled="01"),
        CI_TCP_TIGHT_NO_PREFIX,
        _expected(),
        _fmt(tight=True, cache=False, prefix=False),
    ),
    "tcp-tight-unicode-client-id": _capture(
        _wfi_tcp(),
        CI_TCP_TIGHT_UNICODE,
        _expected("kl\u00fcnt-\u20ac-\U0001f600"),
        _fmt(tight=True, cache=False),
    ),
    "tcp-loose": _capture(_wfi_tcp(tight="00"), CI_TCP_LOOSE, _expected(), _fmt(tight=False, cache=False)),
    "failover-loose": _capture(
        _wfi_no_host(tight="00"), CI_FAILOVER_LOOSE, _expected(), _fmt(tight=False, cache=False)
    ),
    "tcp-loose-no-prefix-no-cache": _capture(
        _wfi_tcp(cache="00", size_prefix_disabled="01", tight="00"),
        CI_TCP_LOOSE_NO_PREFIX_NO_CACHE,
        _expected(),
        _fmt(tight=False, cache=False, prefix=False),
        tail=LOOSE_TAIL_AFTER_USER_NAME,
    ),
}
CAPTURES = [pytest.param(cap, id=name) for name, cap in ALL_CAPTURES.items()]

# KeepAliveInfo (data type 10), which the Java inactivity monitor may send before ConnectionInfo:
# `KeepAliveInfoMarshaller` has only the BaseCommand fields. Built by hand from that layout.
KEEP_ALIVE = {
    (True, True): _hex("00000007", "0a", "0100", "00000002"),  # tight: size, type, booleans, commandId
    (False, True): _hex("00000006", "0a", "00000002", "00"),  # loose: size, type, commandId, responseRequired
    (True, False): _hex("0a", "0100", "00000002"),  # tight, no size prefix
    (False, False): _hex("0a", "00000002", "00"),  # loose, no size prefix
}

# ConnectionControl (data type 18) with faultTolerant true, which `FailoverTransport.restoreTransport`
# sends before ConnectionInfo on every reconnect (not on the first connect). Marshalled on
# 2026-11-24 by the 5.17.2 client's own `OpenWireFormat.marshal` (version 12, cache on) from
# `new ConnectionControl()` + `setFaultTolerant(true)`, as restoreTransport builds it; commandId 0
# (it goes to the transport below the response correlator). connectedBrokers and reconnectTo
# default to "" (present, empty), not null.
FAILOVER_CONTROL = {
    (True, True): _hex(
        "0000000c",  # size prefix: 12 bytes follow
        "12",  # data type 18: ConnectionControl
        "02c803",  # booleans stream, 2 bytes. c8: responseRequired, close, exit false, faultTolerant
        # true, resume, suspend false, connectedBrokers present + ASCII; 03: reconnectTo present +
        # ASCII, rebalanceConnection false, token null
        "00000000",  # BaseCommand.commandId 0
        "0000",  # connectedBrokers ""
        "0000",  # reconnectTo ""
    ),
    (False, True): _hex(
        "00000013",  # size prefix: 19 bytes follow
        "12",  # data type 18: ConnectionControl
        "0000000000",  # commandId 0, responseRequired false
        "0000010000",  # close, exit, faultTolerant (true), resume, suspend
        "010000",  # connectedBrokers present, "" (writeUTF)
        "010000",  # reconnectTo present, ""
        "00",  # rebalanceConnection false
        "00",  # token null
    ),
    (True, False): _hex("12", "02c803", "00000000", "0000", "0000"),  # tight, no size prefix
    (False, False): _hex("12", "0000000000", "0000010000", "010000", "010000", "00", "00"),  # loose
}


class TestCaptures:
    """R10 1-3 over every capture."""

    @pytest.mark.parametrize("cap", CAPTURES)
    def test_sniff_openwire_capture_returns_credentials(self, cap: Capture) -> None:
        result = SNIFFER.sniff(cap.full)
        assert result == cap.expected
        assert isinstance(result, Sniffed)
        assert result.password == "s3cret"

    @pytest.mark.parametrize("cap", CAPTURES)
    def test_sniff_openwire_every_prefix_needs_more_or_echoes(self, cap: Capture) -> None:
        """Scenario: before the WireFormatInfo is complete NEED_MORE, then the echo (the client's own
        frame: it offered version 12 already) until ConnectionInfo is there."""
        for i in range(len(cap.wfi)):
            assert SNIFFER.sniff(cap.full[:i]) is NEED_MORE, i
        for i in range(len(cap.wfi), cap.sniffed_after):
            assert SNIFFER.sniff(cap.full[:i]) == Reply(to_client=cap.echo), i
        for i in range(cap.sniffed_after, len(cap.full) + 1):
            assert SNIFFER.sniff(cap.full[:i]) == cap.expected, i

    @pytest.mark.parametrize("cap", CAPTURES)
    @pytest.mark.parametrize("trailing", [b"\x00", b"\xff" * 40, CI_TCP_TIGHT, bytes(range(256))])
    def test_sniff_openwire_trailing_bytes_do_not_change_result(self, cap: Capture, trailing: bytes) -> None:
        assert SNIFFER.sniff(cap.full + trailing) == cap.expected

    @pytest.mark.parametrize("cap", CAPTURES)
    def test_sniff_wire_format_returns_options_after_echo(self, cap: Capture) -> None:
        assert sniff_wire_format(cap.wfi[:-1]) is NEED_MORE
        assert sniff_wire_format(cap.full) == cap.fmt

    @pytest.mark.parametrize("cap", CAPTURES)
    def test_sniff_openwire_skips_keep_alive_before_connection_info(self, cap: Capture) -> None:
        keep_alive = KEEP_ALIVE[cap.fmt.tight_encoding, not cap.fmt.size_prefix_disabled]
        data = cap.wfi + keep_alive + keep_alive + cap.rest
        assert SNIFFER.sniff(data) == cap.expected
        for i in range(len(cap.wfi), len(cap.wfi) + 2 * len(keep_alive) + 1):
            assert SNIFFER.sniff(data[:i]) == Reply(to_client=cap.echo), i

    @pytest.mark.parametrize("cap", CAPTURES)
    def test_sniff_openwire_skips_failover_connection_control_before_connection_info(
        self, cap: Capture
    ) -> None:
        """Scenario: a failover client reconnecting (after a broker failure or an evacuation)
        sends ConnectionControl{faultTolerant} between its WireFormatInfo and its ConnectionInfo;
        the sniffer reads past it (it used to refuse the client)."""
        control = FAILOVER_CONTROL[cap.fmt.tight_encoding, not cap.fmt.size_prefix_disabled]
        data = cap.wfi + control + cap.rest
        assert SNIFFER.sniff(data) == cap.expected
        for i in range(len(cap.wfi), len(cap.wfi) + len(control) + 1):
            assert SNIFFER.sniff(data[:i]) == Reply(to_client=cap.echo), i

    @pytest.mark.parametrize(
        ("version", "tight", "control"),
        [
            # Marshalled as FAILOVER_CONTROL, without size prefix, in older versions.
            pytest.param(6, True, _hex("12", "02c803", "00000000", "0000", "0000"), id="v6-tight"),
            pytest.param(1, True, _hex("12", "0108", "00000000"), id="v1-tight"),  # five flags only
            pytest.param(
                6, False, _hex("12", "0000000000", "0000010000", "010000", "010000", "00"), id="v6-loose"
            ),
            pytest.param(1, False, _hex("12", "0000000000", "0000010000"), id="v1-loose"),
            # By hand, version 12 with a token of 3 bytes (present flag, int length, bytes).
            pytest.param(
                12,
                True,
                _hex("12", "02c80b", "00000000", "0000", "0000", "00000003", "010203"),
                id="v12-token-tight",
            ),
            pytest.param(
                12,
                False,
                _hex("12", "0000000000", "0000010000", "010000", "010000", "00", "01", "00000003", "010203"),
                id="v12-token-loose",
            ),
        ],
    )
    def test_sniff_openwire_without_size_prefix_parses_connection_control_of_each_version(
        self, version: int, tight: bool, control: bytes
    ) -> None:
        """Scenario: without size prefixes the only way past ConnectionControl is its fields, which
        grew in v6 (connectedBrokers, reconnectTo, rebalanceConnection) and v8 (token)."""
        if tight:
            wfi = _version(_wfi_tcp(size_prefix_disabled="01"), version)
            connection_info = CI_TCP_TIGHT_NO_PREFIX
        else:
            wfi = _version(_wfi_tcp(cache="00", size_prefix_disabled="01", tight="00"), version)
            connection_info = CI_TCP_LOOSE_NO_PREFIX_NO_CACHE
        result = SNIFFER.sniff(wfi + control + connection_info)
        assert isinstance(result, Sniffed), result
        assert (result.client_id, result.user_name, result.protocol_version) == (
            "client-42",
            "alice",
            str(version),
        )
        for i in range(len(wfi), len(wfi) + len(control) + 1):
            assert SNIFFER.sniff((wfi + control)[:i]) == Reply(to_client=_cache_off(wfi)), i

    def test_sniff_openwire_rejects_connection_control_with_negative_token_length(self) -> None:
        wfi = _wfi_tcp(cache="00", size_prefix_disabled="01", tight="00")
        control = _hex("12", "0000000000", "0000010000", "010000", "010000", "00", "01", "ffffffff")
        with pytest.raises(SniffError, match=r"negative length -1 of ConnectionControl\.token"):
            SNIFFER.sniff(wfi + control + CI_TCP_LOOSE_NO_PREFIX_NO_CACHE)


# --- A small WireFormatInfo builder for the cases no client sends ----------------------------------


def _utf(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def _entry(name: str, tagged_value: bytes) -> bytes:
    return _utf(name) + tagged_value


def _bool(value: bool) -> bytes:
    return bytes((1, value))


def _int(value: int) -> bytes:
    return b"\x05" + struct.pack(">i", value)


def _map(*entries: bytes) -> bytes:
    return struct.pack(">i", len(entries)) + b"".join(entries)


def _wfi(version: int = 12, props: bytes | None = None, magic: bytes = b"ActiveMQ") -> bytes:
    body = b"\x01" + magic + struct.pack(">i", version)
    body += b"\x00" if props is None else b"\x01" + struct.pack(">i", len(props)) + props
    return struct.pack(">i", len(body)) + body


def _version(frame: bytes, version: int) -> bytes:
    return frame[:13] + struct.pack(">i", version) + frame[17:]


class TestEcho:
    def test_sniff_openwire_echo_caps_version_at_12(self) -> None:
        wfi13 = _version(_wfi_tcp(), 13)
        data = wfi13 + CI_TCP_TIGHT
        assert SNIFFER.sniff(wfi13) == Reply(to_client=_wfi_tcp(cache="00"))
        assert SNIFFER.sniff(data) == _expected()
        fmt = sniff_wire_format(data)
        assert isinstance(fmt, WireFormat)
        assert (fmt.version, fmt.offered_version) == (12, 13)

    def test_sniff_openwire_echo_keeps_older_version(self) -> None:
        wfi9 = _version(_wfi_tcp(), 9)
        assert SNIFFER.sniff(wfi9) == Reply(to_client=_cache_off(wfi9))
        result = SNIFFER.sniff(wfi9 + CI_TCP_TIGHT)
        assert isinstance(result, Sniffed)
        assert result.protocol_version == "9"

    def test_sniff_openwire_without_properties_means_loose_uncached_prefixed(self) -> None:
        """Scenario: a WireFormatInfo with no properties: every flag is false (`Boolean.TRUE ==
        getProperty(...)`), so ConnectionInfo is loose, size-prefixed, without cache fields."""
        wfi = _wfi(props=None)
        assert sniff_wire_format(wfi) == WireFormat(version=12, offered_version=12)
        ci_body = CI_TCP_LOOSE_NO_PREFIX_NO_CACHE
        assert SNIFFER.sniff(wfi + struct.pack(">i", len(ci_body)) + ci_body) == _expected()

    def test_sniff_openwire_properties_of_every_type_are_skipped(self) -> None:
        props = _map(
            _entry("n", b"\x00"),
            _entry("b", b"\x02\xff"),
            _entry("c", b"\x03\x00A"),
            _entry("s", b"\x04\xff\xff"),
            _entry("d", b"\x07" + struct.pack(">d", 1.5)),
            _entry("f", b"\x08" + struct.pack(">f", 1.5)),
            _entry("a", b"\x0a\x00\x00\x00\x02hi"),
            _entry("m", b"\x0b" + _map(_entry("x", _bool(True)))),
            _entry("l", b"\x0c\x00\x00\x00\x02" + _bool(True) + b"\x05\x00\x00\x00\x01"),
            _entry("B", b"\x0d\x00\x00\x00\x03big"),
            _entry("TightEncodingEnabled", _bool(True)),
            _entry("CacheSize", _int(7)),
            _entry("CacheEnabled", _int(1)),  # not a boolean: Boolean.TRUE == 1 is false in Java
        )
        fmt = sniff_wire_format(_wfi(props=props))
        assert fmt == WireFormat(version=12, offered_version=12, tight_encoding=True)


class TestErrors:
    @pytest.mark.parametrize(
        ("data", "match"),
        [
            (b"\x01", r"client WireFormatInfo size starts with b'\\x01'"),
            (b"\x00\x01\x00\x01", "client WireFormatInfo size 65537 exceeds 65536"),
            (b"\x00\x00\x00\x05\x01", "client WireFormatInfo size 5 is below 14"),
            (
                b"\x00\x00\x00\x45\x03",
                r"client sent ConnectionInfo \(data type 3\) first, expected WireFormatInfo",
            ),
            (b"\x00\x00\x00\x45\xc8", r"client sent data type 200 first"),
            (
                b"\x00\x00\x01\x64\x01ActiveMX",
                "bad client WireFormatInfo magic b'ActiveMX', expected b'ActiveMQ'",
            ),
            (b"\x00\x00\x01\x64\x01GET", "bad client WireFormatInfo magic b'GET'"),
            (_version(_wfi_tcp(), 0), "client WireFormatInfo has unsupported version 0"),
            (_version(_wfi_tcp(), -3), "unsupported version -3"),
            (_wfi(props=_map(_entry("x", b"\x0e"))), "unknown WireFormatInfo property type 14"),
            (_wfi(props=b"\x00\x00\x00\x01"), "client WireFormatInfo is shorter than its fields"),
            (
                _wfi(props=_map(_entry("x", b"\x0a\xff\xff\xff\xff"))),
                "negative length -1 of WireFormatInfo byte array",
            ),
            (
                _wfi(props=_map(_entry("x", b"\x0c\x80\x00\x00\x00"))),
                "negative length -2147483648 of WireFormatInfo list",
            ),
            (
                _wfi(props=b"\x00\x00\x00\x01\x00\x02\xff\xfe\x00"),
                "bad modified UTF-8 at byte 0 of WireFormatInfo property name",
            ),
            (
                _wfi(props=_map(_entry("x", b"\x09\x00\x03\xed\xa0\xbd"))),
                "lone surrogate in WireFormatInfo property",
            ),
        ],
        ids=lambda v: v if isinstance(v, str) else None,
    )
    def test_sniff_openwire_rejects_bad_wire_format_info(self, data: bytes, match: str) -> None:
        with pytest.raises(SniffError, match=match) as info:
            SNIFFER.sniff(data)
        assert info.value.protocol == "openwire"

    def test_sniff_openwire_rejects_deeply_nested_properties(self) -> None:
        value = _bool(True)
        for _ in range(9):
            value = b"\x0b" + _map(_entry("x", value))
        with pytest.raises(SniffError, match="properties of WireFormatInfo nested deeper than 8"):
            SNIFFER.sniff(_wfi(props=_map(_entry("x", value))))

    @pytest.mark.parametrize(
        ("after_wfi", "match"),
        [
            (b"\x00\x00\x00\x00", "command size 0 leaves no room for its data type"),
            (struct.pack(">i", MAX_COMMAND_BYTES + 1), "command size 65537 exceeds 65536"),
            (b"\x00\x00\x00\x10\x06", r"unexpected ProducerInfo \(data type 6\) before ConnectionInfo"),
            (b"\x00\x00\x00\x10\xc8", "unexpected data type 200 before ConnectionInfo"),
            (b"\x00\x00\x00\x10\x01", r"unexpected WireFormatInfo \(data type 1\) before ConnectionInfo"),
            # A booleans stream of 1 byte (fe: responseRequired false, connectionId present, its
            # value present + ASCII, clientId and password present + ASCII), so userName's present
            # flag is missing.
            (
                _hex("00000011", "03", "01fe", "00000001", "78", "000163", "000161", "000162"),
                "truncated booleans stream in ConnectionInfo: it holds only 8 flags",
            ),
            # A frame too short for userName.
            (
                CI_TCP_TIGHT[:3] + b"\x3d" + CI_TCP_TIGHT[4:-6],
                "truncated ConnectionInfo: its fields run past its size 61",
            ),
            (
                CI_TCP_TIGHT.replace(b"\x78\x00\x1d", b"\x79\x00\x1d"),
                r"connectionId of ConnectionInfo is SessionId \(data type 121\)",
            ),
            # clientId flagged ASCII with a negative length.
            (
                CI_TCP_TIGHT.replace(b"\x00\x09client", b"\xff\xf9client"),
                "negative length -7 of ConnectionInfo.clientId",
            ),
            # booleans stream length 0x80 then a negative short.
            (
                _hex("00000008", "03", "80ffff", "00000001"),
                "negative length -1 of the booleans stream in ConnectionInfo",
            ),
            # Booleans 04: connectionId null, clientId present and not ASCII (so writeUTF), password
            # and userName null. Here clientId is a lone high surrogate.
            (
                _hex("0000000c", "03", "0104", "00000001", "0003", "eda0bd"),
                "lone surrogate in ConnectionInfo.clientId",
            ),
            (
                _hex("0000000b", "03", "0104", "00000001", "0002", "c328"),
                r"bad modified UTF-8 at byte 0 of ConnectionInfo.clientId: b'\\xc3\('",
            ),
        ],
    )
    def test_sniff_openwire_rejects_bad_commands(self, after_wfi: bytes, match: str) -> None:
        with pytest.raises(SniffError, match=match):
            SNIFFER.sniff(_wfi_tcp() + after_wfi)

    def test_sniff_openwire_error_quotes_at_most_32_bytes(self) -> None:
        raw = "\u00e9".encode() * 40 + b"\xed\xb0\x80"  # then a lone low surrogate, U+DC00
        ci = _hex("03", "0104", "00000001") + struct.pack(">H", len(raw)) + raw
        with pytest.raises(SniffError) as info:
            SNIFFER.sniff(_wfi_tcp() + struct.pack(">i", len(ci)) + ci)
        assert repr(raw[:32]) in info.value.reason
        assert repr(raw[:33]) not in info.value.reason

    def test_sniff_openwire_messages_follow_house_style(self) -> None:
        with pytest.raises(SniffError) as info:
            SNIFFER.sniff(b"\x00\x00\x01\x64\x01ActiveMX")
        assert str(info.value).startswith("openwire: bad")
        assert not info.value.reason.endswith(".")


class TestLooksLike:
    @pytest.mark.parametrize("cap", CAPTURES)
    def test_looks_like_every_prefix_of_a_capture(self, cap: Capture) -> None:
        for i in range(len(cap.full) + 1):
            assert SNIFFER.looks_like(cap.full[:i]), i

    @pytest.mark.parametrize(
        "prefix",
        [
            b"\x10",
            b"AMQP\x00\x01\x00\x00",
            b"CONNECT\n",
            b"\x16\x03\x01",
            b"PROXY TCP4",
            b"\x00\x00\x01\x64\x03",
        ],
    )
    def test_looks_like_rejects_other_protocols(self, prefix: bytes) -> None:
        assert not SNIFFER.looks_like(prefix)


class TestReplayedOpening:
    @pytest.mark.parametrize("cap", CAPTURES)
    def test_replayed_opening_turns_the_cache_off_and_keeps_the_rest(self, cap: Capture) -> None:
        """Scenario: proxy mode replays the client's bytes with CacheEnabled false, what the client
        negotiated with the echo; nothing else changes (same length, same ConnectionInfo)."""
        assert replayed_opening(cap.full) == cap.echo + cap.rest

    def test_replayed_opening_changes_only_the_last_cache_flag_the_map_holds(self) -> None:
        """A property map naming CacheEnabled twice means what Java's HashMap keeps: the last."""
        props = _map(_entry("CacheEnabled", _bool(True)), _entry("CacheEnabled", _bool(True)))
        frame = _wfi(props=props)
        assert replayed_opening(frame) == frame[:-1] + b"\x00"
        assert sniff_server_preamble(replayed_opening(frame)) == len(frame)

    def test_replayed_opening_leaves_a_nested_cache_flag_alone(self) -> None:
        frame = _wfi(props=_map(_entry("x", b"\x0b" + _map(_entry("CacheEnabled", _bool(True))))))
        assert replayed_opening(frame) == frame

    def test_replayed_opening_of_an_incomplete_frame_is_an_error(self) -> None:
        with pytest.raises(SniffError, match="the client's WireFormatInfo is incomplete"):
            replayed_opening(_wfi_tcp()[:-1])


class TestServerPreamble:
    BROKER_INFO_START = _hex("000001a6", "02")  # the next frame: size prefix and data type 2, BrokerInfo

    def test_sniff_server_preamble_measures_real_broker_wire_format_info(self) -> None:
        data = BROKER_WFI + self.BROKER_INFO_START
        for i in range(len(BROKER_WFI)):
            assert sniff_server_preamble(data[:i]) is NEED_MORE, i
        assert sniff_server_preamble(data) == len(BROKER_WFI) == 342

    @pytest.mark.parametrize("cap", CAPTURES)
    def test_sniff_server_preamble_checks_real_broker_against_each_capture(self, cap: Capture) -> None:
        """Scenario: a default broker agrees to everything the captured clients offered except
        SizePrefixDisabled, which it does not set; such a client cannot be proxied after the echo."""
        if not cap.fmt.size_prefix_disabled:
            assert sniff_server_preamble(BROKER_WFI, client=cap.fmt) == len(BROKER_WFI)
            return
        with pytest.raises(
            SniffError, match="broker negotiates SizePrefixDisabled False but the client was told True"
        ):
            sniff_server_preamble(BROKER_WFI, client=cap.fmt)

    @pytest.mark.parametrize(
        ("broker", "client", "match"),
        [
            (_version(BROKER_WFI, 11), _wfi_tcp(), "broker negotiates version 11 but the client was told 12"),
            (
                _version(BROKER_WFI, 13),
                _version(_wfi_tcp(), 13),
                "broker negotiates version 13 but the client was told 12",
            ),
            (
                _wfi_no_host(tight="00"),
                _wfi_tcp(),
                "broker negotiates TightEncodingEnabled False but the client was told True",
            ),
            # The cache is off between the client and the echo, and in the replay: a broker that
            # never turns it on (Artemis) agrees, so does one that offers a smaller cache.
            (_wfi(props=None), _wfi(props=None), None),
            (
                _wfi(props=_map(_entry("CacheEnabled", _bool(True)), _entry("CacheSize", _int(10)))),
                _wfi_tcp(tight="00"),
                None,
            ),
            (
                _wfi(props=_map(_entry("SizePrefixDisabled", _bool(True)))),
                _wfi(props=_map(_entry("SizePrefixDisabled", _bool(True)))),
                None,
            ),
        ],
    )
    def test_sniff_server_preamble_checks_negotiation(
        self, broker: bytes, client: bytes, match: str | None
    ) -> None:
        fmt = sniff_wire_format(client)
        assert isinstance(fmt, WireFormat)
        if match is None:
            assert sniff_server_preamble(broker, client=fmt) == len(broker)
            return
        with pytest.raises(SniffError, match=match):
            sniff_server_preamble(broker, client=fmt)

    @pytest.mark.parametrize(
        ("data", "match"),
        [
            (b"\x00\x00\x00\x10\x02", r"broker sent BrokerInfo \(data type 2\) first"),
            (b"HTTP/1.1 400", "broker WireFormatInfo size 1213486160 exceeds 65536"),
            (b"\x15\x03", r"broker WireFormatInfo size starts with b'\\x15\\x03'"),
            (_wfi(magic=b"ActiveMX"), "bad broker WireFormatInfo magic"),
        ],
    )
    def test_sniff_server_preamble_rejects_other_answers(self, data: bytes, match: str) -> None:
        with pytest.raises(SniffError, match=match):
            sniff_server_preamble(data)


def test_wire_format_negotiate_mirrors_renegotiate_wire_format() -> None:
    a = WireFormat(version=12, tight_encoding=True, cache_enabled=True, cache_size=1024, max_frame_size=100)
    b = WireFormat(
        version=9, tight_encoding=False, cache_enabled=True, cache_size=10, max_inactivity_duration_ms=5
    )
    assert a.negotiate(b) == WireFormat(version=9, cache_enabled=True, cache_size=10)
    assert a.negotiate(a) == a


# --- ConnectionControl encoder -------------------------------------------------------------------
TARGET = "tcp://127.0.0.1:21618"
TARGET_HEX = "00157463703a2f2f3132372e302e302e313a3231363138"  # writeUTF "tcp://127.0.0.1:21618"


class TestEncodeConnectionControl:
    def test_encode_connection_control_tight_v12(self) -> None:
        """Scenario: the bytes the real Java failover client followed (see the integration test)."""
        assert encode_connection_control(
            reconnect_to=TARGET,
            connected_brokers=TARGET,
            rebalance=True,
            encoding=_fmt(tight=True, cache=True),
        ) == _hex(
            "00000036",  # size prefix: 54 bytes follow
            "12",  # data type 18: ConnectionControl
            "02c007",  # booleans stream, 2 bytes. c0: responseRequired, close, exit, faultTolerant,
            # resume, suspend all false, connectedBrokers present + ASCII; 07: reconnectTo present +
            # ASCII, rebalanceConnection true, token null
            "00000000",  # BaseCommand.commandId 0
            TARGET_HEX,  # connectedBrokers
            TARGET_HEX,  # reconnectTo
        )

    def test_encode_connection_control_loose_without_prefix(self) -> None:
        assert encode_connection_control(
            reconnect_to=TARGET,
            connected_brokers=TARGET,
            rebalance=True,
            encoding=_fmt(tight=False, cache=False, prefix=False),
        ) == _hex(
            "12",  # data type 18: ConnectionControl (no size prefix)
            "0000000000",  # commandId 0, responseRequired false
            "0000000000",  # close, exit, faultTolerant, resume, suspend
            "01" + TARGET_HEX,  # connectedBrokers
            "01" + TARGET_HEX,  # reconnectTo
            "01",  # rebalanceConnection true
            "00",  # token null
        )

    def test_encode_connection_control_spec_a6_without_reconnect_to(self) -> None:
        assert encode_connection_control(
            reconnect_to=None, connected_brokers=TARGET, rebalance=True, encoding=_fmt(tight=True, cache=True)
        ) == _hex(
            "0000001f",  # size prefix: 31 bytes follow
            "12",  # data type 18: ConnectionControl
            "02c002",  # booleans stream, 2 bytes. c0: connectedBrokers present + ASCII; 02: reconnectTo
            # null, rebalanceConnection true, token null
            "00000000",  # commandId 0
            TARGET_HEX,  # connectedBrokers
        )

    def test_encode_connection_control_v7_has_no_token(self) -> None:
        tight = encode_connection_control(
            reconnect_to=None,
            connected_brokers=TARGET,
            rebalance=False,
            encoding=WireFormat(version=7, tight_encoding=True),
        )
        assert tight == _hex("0000001f", "12", "02c000", "00000000", TARGET_HEX)
        loose = encode_connection_control(
            reconnect_to=None, connected_brokers=TARGET, rebalance=False, encoding=WireFormat(version=7)
        )
        assert loose == _hex("00000025", "12", "0000000000", "0000000000", "01" + TARGET_HEX, "00", "00")

    def test_encode_connection_control_non_ascii_uses_write_utf(self) -> None:
        out = encode_connection_control(
            reconnect_to=None,
            connected_brokers="tcp://b\u00f6rse:1\u0000",
            rebalance=False,
            encoding=WireFormat(version=12, tight_encoding=True),
        )
        # ASCII flag off (bit 7 of the first flag byte); "ö" is c3 b6 and NUL is c0 80 in modified UTF-8.
        assert out == _hex("0000001a", "12", "024000", "00000000", "0010", "7463703a2f2f62c3b67273653a31c080")

    @pytest.mark.parametrize("version", [1, 5, 13])
    def test_encode_connection_control_rejects_versions_without_redirect(self, version: int) -> None:
        with pytest.raises(ValueError, match=f"needs OpenWire version 6 to 12, got {version}"):
            encode_connection_control(
                reconnect_to=None,
                connected_brokers=TARGET,
                rebalance=True,
                encoding=WireFormat(version=version),
            )

    def test_encode_connection_control_rejects_too_long_uri(self) -> None:
        with pytest.raises(ValueError, match="connectedBrokers encodes to 40000 bytes, above 32766"):
            encode_connection_control(
                reconnect_to=None,
                connected_brokers="x" * 40000,
                rebalance=True,
                encoding=WireFormat(version=12),
            )


# --- R10 4: fuzzing --------------------------------------------------------------------------------


def _sniff_outcome(data: bytes) -> object:
    result = sniff_outcome(SNIFFER.sniff, data)
    if isinstance(result, SniffError):
        assert result.protocol == "openwire"
        assert result.reason[:1].islower()
        assert not result.reason.endswith(".")
        return result
    assert result is NEED_MORE or isinstance(result, Reply | Sniffed)
    return result


@given(
    cap=st.sampled_from(list(ALL_CAPTURES.values())),
    cut=st.integers(min_value=0, max_value=500),
    tail=st.binary(max_size=200),
)
def test_sniff_openwire_prefix_plus_junk_never_crashes(cap: Capture, cut: int, tail: bytes) -> None:
    _sniff_outcome(cap.full[:cut] + tail)


@given(
    cap=st.sampled_from(list(ALL_CAPTURES.values())),
    at=st.integers(min_value=0, max_value=500),
    byte=st.integers(min_value=0, max_value=255),
)
def test_sniff_openwire_one_changed_byte_never_crashes(cap: Capture, at: int, byte: int) -> None:
    _sniff_outcome(mutate(cap.full, [(at, byte)]))


@given(data=st.binary(max_size=400))
def test_sniff_openwire_arbitrary_bytes_never_crash(data: bytes) -> None:
    _sniff_outcome(data)
    assert isinstance(SNIFFER.looks_like(data), bool)
    for measure in (sniff_server_preamble, sniff_wire_format):
        with contextlib.suppress(SniffError):
            measure(data)


@given(
    tight=st.booleans(),
    prefix=st.booleans(),
    version=st.integers(min_value=6, max_value=12),
    uri=st.text(max_size=50),
    reconnect=st.none() | st.text(max_size=50),
    rebalance=st.booleans(),
)
def test_encode_connection_control_size_prefix_matches_length(
    tight: bool, prefix: bool, version: int, uri: str, reconnect: str | None, rebalance: bool
) -> None:
    fmt = WireFormat(version=version, tight_encoding=tight, size_prefix_disabled=not prefix)
    out = encode_connection_control(
        reconnect_to=reconnect, connected_brokers=uri, rebalance=rebalance, encoding=fmt
    )
    if prefix:
        assert struct.unpack(">i", out[:4])[0] == len(out) - 4
        out = out[4:]
    assert out[0] == 18


# --- Integration: the real Java client and a real ActiveMQ Classic broker -------------------------

_TIMEOUT_S = 60.0
"""Bound of every wait in these tests; the broker starts in about 2 s, the Java client runs in 1 s."""

_PROBE_JAVA = """
import javax.jms.*;
import org.apache.activemq.ActiveMQConnection;
import org.apache.activemq.ActiveMQConnectionFactory;
public class Probe {
  public static void main(String[] a) throws Exception {
    Connection c = new ActiveMQConnectionFactory("alice", "s3cret", a[0]).createConnection();
    c.setClientID("client-42");
    c.start();
    Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
    Queue q = s.createQueue(a[1]);
    s.createProducer(q).send(s.createTextMessage("hello-openwire"));
    TextMessage m = (TextMessage) s.createConsumer(q).receive(10000);
    System.out.println("got=" + (m == null ? null : m.getText()));
    System.out.println("remote=" + ((ActiveMQConnection) c).getTransport().getRemoteAddress());
    c.close();
  }
}
"""


@dataclass(frozen=True, slots=True)
class _Broker:
    port: int


@pytest.fixture(scope="module")
def activemq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Broker]:
    """One real ActiveMQ Classic 5.17 broker (ENVIRONMENT.md §3.3), non-persistent, stopped by PID."""
    require_java()
    broker = ActiveMQ("openwire-test", tmp_path_factory.mktemp("activemq"))
    try:
        broker.start()
        broker.wait_ready()
        yield _Broker(port=broker.openwire)
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Probe.java compiled with javac against the Debian jars."""
    out = tmp_path_factory.mktemp("probe")
    (out / "Probe.java").write_text(_PROBE_JAVA)
    subprocess.run(
        ["javac", "-cp", ":".join(JAVA_CLIENT_JARS), "-d", str(out), str(out / "Probe.java")],
        check=True,
        timeout=_TIMEOUT_S,
    )
    return out


def _run_probe(probe_dir: Path, url: str, queue: str) -> str:
    done = subprocess.run(
        ["java", "-cp", ":".join([*JAVA_CLIENT_JARS, str(probe_dir)]), "Probe", url, queue],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


REDIRECT_CASES = [
    pytest.param("", TARGET, id="tight-reconnect-to"),
    pytest.param(
        "?wireFormat.tightEncodingEnabled=false&wireFormat.sizePrefixDisabled=true", TARGET, id="loose"
    ),
    pytest.param("", None, id="spec-a6-connected-brokers-only"),
]


@pytest.mark.integration
class TestRealJavaClient:
    @pytest.fixture(autouse=True)
    def _require_java(self) -> None:
        require_java()

    @pytest.mark.parametrize(("tcp_options", "reconnect_to"), REDIRECT_CASES)
    def test_connection_control_redirects_java_failover_client_to_real_broker(
        self, activemq_broker: _Broker, probe_dir: Path, tcp_options: str, reconnect_to: str | None
    ) -> None:
        """Scenario: the Java client accepts the echo; our ConnectionControl makes its failover
        transport go to the real broker, where it sends a message and consumes it back."""
        target = f"tcp://127.0.0.1:{activemq_broker.port}"
        seen: list[Sniffed] = []

        def redirect(conn: socket.socket) -> None:
            raw, sniffed, _ = read_until_sniffed(conn, SNIFFER)
            seen.append(sniffed)
            fmt = sniff_wire_format(raw)
            assert isinstance(fmt, WireFormat)
            conn.sendall(
                encode_connection_control(
                    reconnect_to=None if reconnect_to is None else target,
                    connected_brokers=target,
                    rebalance=True,
                    encoding=fmt,
                )
            )

        fake = OneConnectionServer(redirect, timeout_s=_TIMEOUT_S)
        url = (
            f"failover:(tcp://127.0.0.1:{fake.port}{tcp_options})"
            "?reconnectSupported=true&updateURIsSupported=true&maxReconnectAttempts=5"
        )
        out = _run_probe(probe_dir, url, f"redirect.{fake.port}")
        fake.join()
        assert "got=hello-openwire" in out
        assert f"remote={target}" in out
        assert seen == [_expected()]

    @pytest.mark.parametrize(
        "tcp_options", ["", "?wireFormat.tightEncodingEnabled=false&wireFormat.cacheEnabled=false"]
    )
    def test_echo_then_replay_to_real_broker_works(
        self, activemq_broker: _Broker, probe_dir: Path, tcp_options: str
    ) -> None:
        """Scenario: proxy mode. The client got the echo; the router replays its bytes to the real
        broker, drops the broker's WireFormatInfo (checking it negotiates the same) and relays."""
        dropped: list[bytes] = []

        def proxy(conn: socket.socket) -> None:
            raw, _, _ = read_until_sniffed(conn, SNIFFER)
            fmt = sniff_wire_format(raw)
            assert isinstance(fmt, WireFormat)
            with socket.create_connection(("127.0.0.1", activemq_broker.port), timeout=_TIMEOUT_S) as up:
                up.sendall(replayed_opening(raw))
                buf = b""
                while (length := sniff_server_preamble(buf, client=fmt)) is NEED_MORE:
                    chunk = up.recv(4096)
                    assert chunk, "broker closed during its WireFormatInfo"
                    buf += chunk
                dropped.append(buf[:length])
                conn.sendall(buf[length:])
                pump = threading.Thread(target=_pump, args=(up, conn), daemon=True)
                pump.start()
                _pump(conn, up)
                pump.join(_TIMEOUT_S)

        fake = OneConnectionServer(proxy, timeout_s=_TIMEOUT_S)
        out = _run_probe(probe_dir, f"tcp://127.0.0.1:{fake.port}{tcp_options}", f"proxy.{fake.port}")
        fake.join()
        assert "got=hello-openwire" in out
        assert dropped == [BROKER_WFI]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
        dst.shutdown(socket.SHUT_WR)


# --- The health probe's side (probe=openwire) ------------------------------------------------------
# The broker fixtures are real bytes: what the Debian ActiveMQ 5.17.2 broker (tests.conftest
# ActiveMQ with a simpleAuthenticationPlugin, user "prober"/"s3cret") sent on 2026-11-22 to this
# module's probe WireFormatInfo and ConnectionInfo (commandId 1), recorded by a throwaway socket
# client: its WireFormatInfo (BROKER_WFI above), a BrokerInfo, then the answer.

BROKER_INFO_LOOSE = _hex(
    "0000005a",  # size prefix: 90 bytes follow
    "02",  # data type 2: BrokerInfo, loose (negotiated with the probe)
    "00000000",  # commandId 0
    "00",  # responseRequired false
    "017c",  # brokerId: present, data type 124 (BrokerId)
    "01001d" + b"ID:vm-40797-1795325056876-0:1".hex(),  # its value
    "010015" + b"tcp://127.0.0.1:29547".hex(),  # brokerURL
    "00",  # peerBrokerInfos: null
    "010007" + b"capture".hex(),  # brokerName
    "0000000000",  # slaveBroker, masterBroker, faultTolerantConfiguration, duplex, network
    "0000000000000000",  # connectionId (long) 0
    "0000",  # brokerUploadUrl, networkProperties: null
)
RESPONSE = _hex(
    "0000000a",  # size prefix: 10 bytes follow
    "1e",  # data type 30: Response
    "00000000",  # commandId 0
    "00",  # responseRequired false
    "00000001",  # correlationId 1: the probe's ConnectionInfo
)
EXCEPTION_RESPONSE = _hex(
    "00000056",  # size prefix: 86 bytes follow
    "1f",  # data type 31: ExceptionResponse
    "00000000",  # commandId 0
    "00",  # responseRequired false
    "00000001",  # correlationId 1
    "01",  # exception present
    "01001b" + b"java.lang.SecurityException".hex(),  # class (loose string)
    "01002a" + b"User name [prober] or password is invalid.".hex(),  # message; no stack trace
)
BROKER_ACCEPTS = BROKER_WFI + BROKER_INFO_LOOSE + RESPONSE
BROKER_REFUSES = BROKER_WFI + BROKER_INFO_LOOSE + EXCEPTION_RESPONSE


def _prop(name: str, tag: str, value: str) -> str:
    """One annotated property of the probe's WireFormatInfo: `writeUTF` name, type, value."""
    return f"{len(name):04x}" + name.encode().hex() + tag + value


class TestProbeEncoders:
    def test_encode_wire_format_info_annotated(self) -> None:
        assert openwire.encode_wire_format_info() == _hex(
            "000000b5",  # size prefix: 181 bytes follow
            "01",  # data type 1: WireFormatInfo
            "4163746976654d51",  # magic "ActiveMQ"
            "0000000c",  # version 12
            "01",  # marshalledProperties present
            "000000a3",  # 163 bytes of properties
            "00000007",  # primitive map of 7 entries
            _prop("TightEncodingEnabled", "01", "00"),  # boolean false: loose encoding
            _prop("CacheEnabled", "01", "00"),
            _prop("SizePrefixDisabled", "01", "00"),
            _prop("StackTraceEnabled", "01", "00"),  # exceptions without stack traces
            _prop("TcpNoDelayEnabled", "01", "01"),
            _prop("MaxFrameSize", "06", "7fffffffffffffff"),  # long, as the broker casts it
            _prop("MaxInactivityDuration", "06", "0000000000000000"),  # long 0: no monitor
        )

    def test_encode_wire_format_info_offers_every_option_off(self) -> None:
        offer = sniff_wire_format(openwire.encode_wire_format_info())
        assert offer == WireFormat(version=12, offered_version=12, max_frame_size=2**63 - 1)

    def test_encode_connection_info_v12_annotated(self) -> None:
        encoded = openwire.encode_connection_info(
            command_id=1,
            connection_id="ID:p-1",
            client_id="$.artemis.internal.router.client.r.amq",
            user_name="prober",
            password="s3cret",
            version=12,
        )
        assert encoded == _hex(
            "00000053",  # size prefix: 83 bytes follow
            "03",  # data type 3: ConnectionInfo
            "00000001",  # commandId 1
            "01",  # responseRequired true
            "0178",  # connectionId: present, data type 120 (ConnectionId), no cache index
            "010006" + b"ID:p-1".hex(),  # its value
            "010026" + b"$.artemis.internal.router.client.r.amq".hex(),  # clientId
            "010006" + b"s3cret".hex(),  # password
            "010006" + b"prober".hex(),  # userName
            "000000",  # brokerPath null, brokerMasterConnector false, manageable false
            "01",  # clientMaster true (v2+)
            "0000",  # faultTolerant, failoverReconnect false (v6+)
            "00",  # clientIp null (v8+)
        )

    @pytest.mark.parametrize(("version", "tail"), [(1, 0), (2, 1), (5, 1), (6, 3), (7, 3), (8, 4), (12, 4)])
    def test_encode_connection_info_fields_follow_the_version(self, version: int, tail: int) -> None:
        """Scenario: each marshaller version adds fields at the end (v1 stops after manageable)."""
        encoded = openwire.encode_connection_info(
            command_id=7, connection_id="ID:x", client_id="c", user_name=None, password=None, version=version
        )
        base = 4 + 1 + 5 + 2 + 7 + 4 + 1 + 1 + 3  # size, type, BaseCommand, id, value, strings, 3 flags
        assert len(encoded) == base + tail
        assert struct.unpack(">i", encoded[:4])[0] == len(encoded) - 4

    def test_encode_connection_info_is_read_by_our_sniffer(self) -> None:
        """Scenario: our sniffer, which knows the Java client's bytes, reads the probe's too."""
        sent = openwire.encode_wire_format_info() + openwire.encode_connection_info(
            command_id=1, connection_id="ID:p", client_id="cid", user_name="u", password="p", version=12
        )
        assert SNIFFER.sniff(sent) == Sniffed(
            protocol=WireProtocol.OPENWIRE,
            client_id="cid",
            user_name="u",
            password="p",
            protocol_version="12",
        )

    def test_encode_connection_close_annotated(self) -> None:
        assert openwire.encode_connection_close(command_id=2, connection_id="ID:p-1", version=12) == _hex(
            "00000019",  # size prefix: 25 bytes follow
            "0c",  # data type 12: RemoveInfo
            "00000002",  # commandId 2
            "01",  # responseRequired true: the broker answers once the client id is released
            "0178010006" + b"ID:p-1".hex(),  # objectId: the ConnectionId
            "fffffffffffffffe",  # lastDeliveredSequenceId -2, LAST_DELIVERED_UNKNOWN (v5+)
        )

    def test_encode_shutdown_annotated(self) -> None:
        assert openwire.encode_shutdown(command_id=3) == _hex(
            "00000006",  # size prefix: 6 bytes follow
            "0b",  # data type 11: ShutdownInfo
            "00000003",  # commandId 3
            "00",  # responseRequired false
        )

    def test_encode_connection_close_before_v5_has_no_sequence_id(self) -> None:
        v4 = openwire.encode_connection_close(command_id=2, connection_id="ID:p-1", version=4)
        v5 = openwire.encode_connection_close(command_id=2, connection_id="ID:p-1", version=5)
        assert len(v5) - len(v4) == 8

    @pytest.mark.parametrize("version", [0, 13])
    def test_encode_probe_commands_reject_unknown_versions(self, version: int) -> None:
        with pytest.raises(ValueError, match=f"OpenWire version must be 1 to 12, got {version}"):
            openwire.encode_connection_close(command_id=2, connection_id="ID:x", version=version)
        with pytest.raises(ValueError, match="OpenWire version must be 1 to 12"):
            openwire.encode_connection_info(
                command_id=1, connection_id="x", client_id="c", user_name=None, password=None, version=version
            )


class TestProbeParsers:
    def test_parse_probe_wire_format_every_prefix_then_negotiated(self) -> None:
        for i in range(len(BROKER_WFI)):
            assert openwire.parse_probe_wire_format(BROKER_ACCEPTS[:i]) is NEED_MORE, i
        expected = WireFormat(version=12, max_frame_size=2**63 - 1)  # every option off, no monitor
        assert openwire.parse_probe_wire_format(BROKER_WFI) == expected
        assert openwire.parse_probe_wire_format(BROKER_ACCEPTS) == expected

    def test_parse_probe_wire_format_takes_the_lower_version(self) -> None:
        old = _version(BROKER_WFI, 6)
        assert openwire.parse_probe_wire_format(old) == WireFormat(version=6, max_frame_size=2**63 - 1)

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            (BROKER_ACCEPTS, openwire.BrokerResponse()),
            (
                BROKER_REFUSES,
                openwire.BrokerResponse(
                    exception_class="java.lang.SecurityException",
                    exception_message="User name [prober] or password is invalid.",
                ),
            ),
        ],
    )
    def test_parse_probe_response_every_prefix_then_answer(
        self, data: bytes, expected: openwire.BrokerResponse
    ) -> None:
        for i in range(len(data)):
            assert openwire.parse_probe_response(data[:i], command_id=1) is NEED_MORE, i
        assert openwire.parse_probe_response(data, command_id=1) == expected
        assert openwire.parse_probe_response(data + RESPONSE[:5], command_id=1) == expected  # trailing
        answer = openwire.parse_probe_response(data, command_id=1)
        assert isinstance(answer, openwire.BrokerResponse)
        assert answer.ok is (data == BROKER_ACCEPTS)

    def test_parse_probe_response_skips_answers_to_other_commands(self) -> None:
        assert openwire.parse_probe_response(BROKER_ACCEPTS, command_id=2) is NEED_MORE

    def test_parse_probe_response_connection_error_is_a_failure(self) -> None:
        error = _hex(
            "00000010",  # size prefix: 16 bytes follow
            "10",  # data type 16: ConnectionError
            "0000000000",  # commandId 0, responseRequired false
            "01",  # exception present
            "010003" + b"Bad".hex(),  # class
            "00",  # message null
            "0000",  # (connectionId, not read)
        )
        answer = openwire.parse_probe_response(BROKER_WFI + error, command_id=1)
        assert answer == openwire.BrokerResponse(exception_class="Bad")
        null = _hex("00000007", "10", "0000000000", "00")  # ConnectionError without exception
        answer = openwire.parse_probe_response(BROKER_WFI + null, command_id=1)
        assert answer == openwire.BrokerResponse(exception_class="ConnectionError without exception")

    @pytest.mark.parametrize(
        ("after_wfi", "match"),
        [
            ("00010001" + "02", "broker command size 65537 exceeds 65536"),
            ("00000000", "broker command size 0 leaves no room for its data type"),
            ("00000006" + "1e" + "0000000000", "truncated Response (data type 30): its fields run past"),
            ("00000007" + "1f" + "00000000" + "00" + "01", "truncated ExceptionResponse"),
        ],
    )
    def test_parse_probe_response_malformed(self, after_wfi: str, match: str) -> None:
        with pytest.raises(SniffError, match=re.escape(match)):
            openwire.parse_probe_response(BROKER_WFI + _hex(after_wfi), command_id=1)

    def test_parse_probe_response_bad_wire_format(self) -> None:
        with pytest.raises(SniffError, match="broker sent BrokerInfo"):
            openwire.parse_probe_response(BROKER_INFO_LOOSE, command_id=1)


_PROBE_RESULTS = (WireFormat, openwire.BrokerResponse, type(NEED_MORE), SniffError)


def _probe_outcome(parse: Callable[[bytes], object], data: bytes) -> object:
    result = sniff_outcome(parse, data)
    if isinstance(result, SniffError):
        assert result.protocol == "openwire"
        return result
    assert isinstance(result, _PROBE_RESULTS)
    return result


_PROBE_PARSERS = [openwire.parse_probe_wire_format, lambda d: openwire.parse_probe_response(d, command_id=1)]


@given(
    parse=st.sampled_from(_PROBE_PARSERS),
    data=st.sampled_from([BROKER_ACCEPTS, BROKER_REFUSES]),
    cut=st.integers(min_value=0, max_value=600),
    tail=st.binary(max_size=200),
)
def test_parse_probe_answers_prefix_plus_junk_never_crash(
    parse: Callable[[bytes], object], data: bytes, cut: int, tail: bytes
) -> None:
    _probe_outcome(parse, data[:cut] + tail)


@given(
    parse=st.sampled_from(_PROBE_PARSERS),
    data=st.sampled_from([BROKER_ACCEPTS, BROKER_REFUSES]),
    at=st.integers(min_value=0, max_value=600),
    byte=st.integers(min_value=0, max_value=255),
)
def test_parse_probe_answers_one_changed_byte_never_crash(
    parse: Callable[[bytes], object], data: bytes, at: int, byte: int
) -> None:
    _probe_outcome(parse, mutate(data, [(at, byte)]))
