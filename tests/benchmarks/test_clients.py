"""Load clients: MQTT packets, CONNACK parsing and probes, the C tools against the C echo server."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from benchmarks.clients import (
    C_SOURCES,
    ClientError,
    Loadgen,
    PingResult,
    RateResult,
    build_c_tools,
    find_tool,
    mqtt_connect_packet,
    parse_connack,
    probe_connack,
)
from benchmarks.fleet import Fleet, pick_ports

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_mqtt_connect_packet_v311() -> None:
    assert mqtt_connect_packet("ab", "3.1.1") == bytes.fromhex(
        "10"  # CONNECT, flags 0 (MQTT 3.1.1 §3.1.1)
        "0e"  # remaining length 14
        "00044d515454"  # protocol name "MQTT"
        "04"  # protocol level 4 = 3.1.1
        "02"  # connect flags: clean session
        "003c"  # keep alive 60 s
        "00026162"  # client id "ab"
    )


def test_mqtt_connect_packet_v5_has_empty_properties() -> None:
    assert mqtt_connect_packet("ab", "5") == bytes.fromhex(
        "10"  # CONNECT
        "0f"  # remaining length 15
        "00044d515454"  # protocol name "MQTT"
        "05"  # protocol level 5 (MQTT 5 §3.1.2.2)
        "02"  # clean start
        "003c"  # keep alive 60 s
        "00"  # property length 0 (§3.1.2.11)
        "00026162"  # client id "ab"
    )


def test_mqtt_connect_packet_long_client_id_uses_two_byte_length() -> None:
    packet = mqtt_connect_packet("x" * 200, "3.1.1")
    assert packet[1:3] == bytes([(212 % 128) | 0x80, 212 // 128])
    assert len(packet) == 3 + 212


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", None),
        (b"\x20", None),
        (b"\x20\x02\x00", None),
        (b"\x20\x02\x00\x00", 0),  # 3.1.1 accepted
        (b"\x20\x03\x00\x9c\x00", 0x9C),  # MQTT 5 use another server, no properties
        (b"\x20\x02\x00\x05extra", 5),
    ],
)
def test_parse_connack(data: bytes, code: int | None) -> None:
    assert parse_connack(data) == code


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x30\x02\x00\x00", "expected a CONNACK"),
        (b"\x20\x01\x00", "< 2"),
        (b"\x20\xff\xff\xff\xff\x01", "4 bytes"),
    ],
)
def test_parse_connack_rejects_bad_bytes(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_connack(data)


@pytest.fixture
def redirecting_server(fake_broker: Callable[[bytes | None], int]) -> int:
    return fake_broker(b"\x20\x03\x00\x9c\x00")


@pytest.fixture
def closing_server(fake_broker: Callable[[bytes | None], int]) -> int:
    return fake_broker(None)


def test_probe_connack_reports_the_reason_code(redirecting_server: int) -> None:
    assert probe_connack(redirecting_server, "c", "5") == "connack 0x9c"


def test_probe_connack_reports_a_close(closing_server: int) -> None:
    assert probe_connack(closing_server, "c", "3.1.1") == "closed"


def test_rate_result_from_json_rejects_missing_numbers() -> None:
    with pytest.raises(ClientError, match="'rate'"):
        RateResult.from_json({"ok": 1, "errors": 0, "unfinished": 0, "seconds": 1.0})


def test_ping_result_without_round_trips_is_an_error() -> None:
    result = PingResult.from_json({"count": 0, "errors": 1, "last_error": "connect: refused"})
    assert result.errors == 1
    assert result.last_error == "connect: refused"


def _gcc() -> str:
    gcc = find_tool("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed: run ./run-tests, which installs it")
    return gcc


@pytest.mark.integration
@pytest.mark.parametrize("source", ["loadgen.c", "echo_srv.c"])
def test_c_sources_compile_without_warnings(source: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [_gcc(), "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "x"), str(C_SOURCES / source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.integration
def test_loadgen_against_echo_server(tmp_path: Path) -> None:
    """Scenario: the compiled loadgen's three modes against the compiled echo server."""
    _gcc()
    binaries = build_c_tools(tmp_path)
    port_a, port_b = pick_ports(2)
    with Fleet(tmp_path, say=lambda _text: None) as fleet:
        fleet.start(
            "echo", [str(binaries["echo_srv"]), "127.0.0.1", str(port_a), str(port_b)], ports=[port_a, port_b]
        )
        loadgen = Loadgen(binaries["loadgen"], fleet)
        rate = loadgen.rate(port_b, kind="echo", concurrency=10, total=200, seconds=20)
        assert (rate.ok, rate.errors, rate.unfinished) == (200, 0, 0)
        assert rate.rate > 0
        ping = loadgen.ping(port_a, count=100, seconds=20, warmup=10)
        assert (ping.count, ping.errors) == (100, 0)
        assert 0 < ping.p50_us <= ping.p99_us <= ping.max_us
        helper, idle = loadgen.open_idle(port_a, count=50, seconds=20)
        assert (idle.open, idle.errors) == (50, 0)
        fleet.stop(helper)
        assert helper.returncode is not None
        wrong = loadgen.rate(port_a, kind="mqtt3", concurrency=5, total=20, seconds=20)
        assert wrong.ok == 0
        assert wrong.errors == 20
        assert "CONNACK" in wrong.last_error
