"""Load clients: MQTT packets, CONNACK parsing and probes, the C tools against the C echo server; the
CORE and AMQP openings and redirect probes, and loadgen's core and amqp kinds against fake routers."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from benchmarks.clients import (
    C_SOURCES,
    CORE_CAPTURE,
    REDIRECTED,
    ClientError,
    Loadgen,
    PingResult,
    RateResult,
    amqp_opening,
    build_c_tools,
    core_template,
    find_tool,
    load_capture,
    mqtt_connect_packet,
    parse_connack,
    probe_amqp_redirect,
    probe_connack,
    probe_core_redirect,
)
from benchmarks.fleet import Fleet, pick_ports
from keys import amqp, core
from keys.amqp import AmqpSniffer
from keys.core import CoreSniffer
from keys.sniff import Sniffed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.benchmarks.conftest import _FakeBroker


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


# --- CORE and AMQP (the artemis group) ------------------------------------------------------------

CORE_REDIRECT = core.server_preamble(load_capture()) + core.encode_redirect(
    router="bench", connector_name="target-1", host="127.0.0.1", port=21001
)
"""What a router answers the captured opening with: PING twice, the topology, DISCONNECT_V3, 222."""
CORE_NOT_READY = core.server_preamble(load_capture()) + core.encode_refusal("bench", unavailable=True)
AMQP_PREAMBLE = (
    amqp.SASL_HEADER + amqp.encode_sasl_mechanisms() + amqp.encode_sasl_outcome(0) + amqp.AMQP_HEADER
)
AMQP_REDIRECT = AMQP_PREAMBLE + amqp.redirect_frames("bench", "127.0.0.1", 21001)
AMQP_REFUSAL = AMQP_PREAMBLE + amqp.refusal_frames("bench", unavailable=False)


def test_core_template_rebuilds_the_capture() -> None:
    template = core_template(load_capture())
    assert template.opening("client-42") == load_capture()
    assert load_capture().startswith(template.head)
    assert template.head[template.length_at + 4] == 0xEE  # CREATESESSION_V2 (-18)


@pytest.mark.parametrize("client_id", ["c", "12345678", "bench-ca-00000001", "x" * 60])
def test_core_template_opening_is_sniffed_with_its_client_id(client_id: str) -> None:
    """Scenario: short ids (fewer than 9 UTF-16 units) and long ones are encoded as Artemis does."""
    result = CoreSniffer().sniff(core_template(load_capture()).opening(client_id))
    assert isinstance(result, Sniffed)
    assert (result.client_id, result.user_name) == (client_id, "alice")


def test_core_template_needs_a_client_id() -> None:
    with pytest.raises(ValueError, match="no client ID"):
        core_template(load_capture(CORE_CAPTURE.with_name("v2-no-client-id.hex")))
    with pytest.raises(ValueError, match="whole CREATESESSION"):
        core_template(load_capture()[:-3])


def test_amqp_opening_is_sniffed_with_its_container_id() -> None:
    result = AmqpSniffer().sniff(amqp_opening("bench-aa-00000001"))
    assert isinstance(result, Sniffed)
    assert (result.client_id, result.user_name) == ("bench-aa-00000001", "admin")


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        (CORE_REDIRECT, f"{REDIRECTED} to TransportConfiguration(name=target-1, factory="),
        (CORE_NOT_READY, "EXCEPTION 222 (ROUTING_EXCEPTION): AMQ229238: Connection router bench not ready"),
        (None, "closed"),
    ],
)
def test_probe_core_redirect(
    reply: bytes | None, answer: str, fake_broker: Callable[[bytes | None], int]
) -> None:
    assert probe_core_redirect(fake_broker(reply), load_capture()).startswith(answer)


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        (
            AMQP_REDIRECT,
            f"{REDIRECTED}: Connection router bench redirected this connection to 127.0.0.1:21001",
        ),
        (AMQP_REFUSAL, "Close amqp:connection:forced: Connection router bench rejected this connection"),
    ],
)
def test_probe_amqp_redirect(reply: bytes, answer: str, fake_broker: Callable[[bytes | None], int]) -> None:
    assert probe_amqp_redirect(fake_broker(reply), "c") == answer


@pytest.fixture
def loadgen(tmp_path: Path) -> Iterator[Loadgen]:
    _gcc()
    binaries = build_c_tools(tmp_path)
    with Fleet(tmp_path, say=lambda _text: None) as fleet:
        yield Loadgen(binaries["loadgen"], fleet)


@pytest.mark.integration
def test_loadgen_core_sends_the_capture_with_its_client_ids(
    loadgen: Loadgen, recording_broker: Callable[[bytes | None], _FakeBroker]
) -> None:
    """Scenario: each connection sends the captured opening whole with ID_PREFIX + its number as the
    client ID (here 8 characters: the short String form), and a redirect counts as done."""
    broker = recording_broker(CORE_REDIRECT)
    template = core_template(load_capture())
    result = loadgen.rate(
        broker.port, kind="core", concurrency=2, total=4, seconds=20, id_prefix="", core_opening=template
    )
    assert (result.ok, result.errors) == (4, 0)
    assert sorted(broker.received) == [template.opening(f"{n:08d}") for n in range(4)]


@pytest.mark.integration
def test_loadgen_core_counts_a_refusal_as_an_error(
    loadgen: Loadgen, fake_broker: Callable[[bytes | None], int]
) -> None:
    port = fake_broker(CORE_NOT_READY)
    result = loadgen.rate(
        port, kind="core", concurrency=2, total=3, seconds=20, core_opening=core_template(load_capture())
    )
    assert (result.ok, result.errors) == (0, 3)
    assert result.last_error == "EXCEPTION 222 without DISCONNECT_V3"


def test_loadgen_core_needs_the_opening(tmp_path: Path) -> None:
    with (
        Fleet(tmp_path, say=lambda _text: None) as fleet,
        pytest.raises(ClientError, match="needs the opening"),
    ):
        Loadgen(tmp_path / "loadgen", fleet).rate(1, kind="core", concurrency=1, total=1, seconds=1)


@pytest.mark.integration
def test_loadgen_amqp_sends_sasl_plain_and_open(
    loadgen: Loadgen, recording_broker: Callable[[bytes | None], _FakeBroker]
) -> None:
    broker = recording_broker(AMQP_REDIRECT)
    result = loadgen.rate(broker.port, kind="amqp", concurrency=2, total=3, seconds=20, id_prefix="bench-aa-")
    assert (result.ok, result.errors) == (3, 0)
    sniffed = [AmqpSniffer().sniff(opening) for opening in broker.received]
    assert sorted(str(s.client_id) for s in sniffed if isinstance(s, Sniffed)) == [
        f"bench-aa-{n:08d}" for n in range(3)
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (AMQP_REFUSAL, "Close without amqp:connection:redirect"),
        (
            amqp.SASL_HEADER + amqp.encode_sasl_mechanisms() + amqp.encode_sasl_outcome(1),
            "sasl-outcome is not ok",
        ),
    ],
)
def test_loadgen_amqp_counts_other_answers_as_errors(
    reply: bytes, error: str, loadgen: Loadgen, fake_broker: Callable[[bytes | None], int]
) -> None:
    result = loadgen.rate(fake_broker(reply), kind="amqp", concurrency=1, total=2, seconds=20)
    assert (result.ok, result.errors, result.last_error) == (0, 2, error)
