"""The C CONNECT parsers (keys/_native.c) against the Python sniffers, and their wrapper (keys/native.py).

Every check goes through `fuzz.targets.check_native_agrees`, the differential check the fuzz targets
`mqtt_native` and `stomp_native` and the sanitized run (test_native_sanitized.py) use too: the C
gives NEED_MORE, the same fields, or a refusal whose code names the Python sniffer's reason, and
the wrapping `Native*Sniffer` gives exactly the Python sniffer's result or error. Frames are
checked at every prefix (the "need more" side), whole, and with bytes after them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from keys import mqtt, native, stomp
from keys.sniff import Sniffed, SniffError, WireProtocol
from tests.keys.test_mqtt import CAPTURED, CAPTURED_FRAMES, ERRORS, connect_packet
from tests.keys.test_stomp import CAPTURE_IDS, CAPTURES

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # fuzz/ is not an installed package (tests/fuzz/test_fuzz.py)
    sys.path.insert(0, str(ROOT))

from fuzz.targets import check_native_agrees  # noqa: E402 - needs ROOT on sys.path

if TYPE_CHECKING:
    from keys.sniff import Sniffer

MQTT = native.NativeMqttSniffer()
STOMP = native.NativeStompSniffer()


def _agree_at_every_prefix(data: bytes, *, stomp_frame: bool) -> None:
    for cut in range(len(data) + 1):
        check_native_agrees(data[:cut], stomp_frame=stomp_frame)


def test_native_extension_is_built() -> None:
    """Scenario: the test run builds keys._native (./run-tests, deploy/bootstrap.sh); without it the
    differential tests would compare Python with itself."""
    assert native.NATIVE
    assert native.EXTENSION is not None
    assert Path(native.EXTENSION.__file__ or "").parent == ROOT / "keys"


def test_native_limits_and_refusal_codes_match_the_python_modules() -> None:
    c = native.EXTENSION
    assert c is not None
    assert (c.STOMP_MAX_HEADER_BYTES, c.STOMP_MAX_BODY_BYTES) == (
        stomp.MAX_HEADER_BYTES,
        stomp.MAX_BODY_BYTES,
    )
    mqtt_codes = {getattr(c, name) for name in dir(c) if name.startswith("MQTT_ERR_")}
    stomp_codes = {getattr(c, name) for name in dir(c) if name.startswith("STOMP_ERR_")}
    assert mqtt_codes == set(native.MQTT_REFUSALS)
    assert stomp_codes == set(native.STOMP_REFUSALS)
    assert c.DEFER not in mqtt_codes | stomp_codes


# -- MQTT ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("frame", CAPTURED_FRAMES, ids=["paho-3.1", "paho-3.1.1", "paho-anonymous", "paho-5"])
def test_mqtt_connect_captured_frames_agree_at_every_prefix(frame: bytes) -> None:
    _agree_at_every_prefix(frame + b"\xe0\x00", stomp_frame=False)  # and a DISCONNECT after it
    assert isinstance(MQTT.sniff(frame), Sniffed)


@pytest.mark.parametrize(("frame", "expected"), CAPTURED)
def test_native_mqtt_sniffer_captures_give_the_expected_sniffed(frame: bytes, expected: Sniffed) -> None:
    """Scenario: test_mqtt.py's annotated captures and what they must give, through the C parser."""
    assert MQTT.sniff(frame) == expected
    assert MQTT.sniff(frame + b"\xe0\x00") == expected


@pytest.mark.parametrize(("frame", "expected"), CAPTURES, ids=CAPTURE_IDS)
def test_native_stomp_sniffer_captures_give_the_expected_sniffed(frame: bytes, expected: Sniffed) -> None:
    """Scenario: test_stomp.py's annotated captures and what they must give, through the C parser."""
    assert STOMP.sniff(frame) == expected
    assert STOMP.sniff(frame + b"SEND\n\n\x00") == expected


def test_mqtt_connect_v5_returns_plain_values() -> None:
    frame = connect_packet(
        level=5, properties=b"\x11\x00\x00\x0e\x10", client_id=b"c", user=b"u", password=b"\xff", keepalive=7
    )
    assert native.EXTENSION is not None
    assert native.EXTENSION.mqtt_connect(frame) == (5, "c", "u", None, 7, len(frame))
    assert native.EXTENSION.mqtt_connect(bytearray(frame)) == native.EXTENSION.mqtt_connect(memoryview(frame))
    assert native.EXTENSION.mqtt_connect(frame[:-1]) is None
    assert MQTT.sniff(frame) == Sniffed(
        protocol=WireProtocol.MQTT, client_id="c", user_name="u", protocol_version="5", keepalive_s=7
    )


def test_mqtt_connect_rejects_what_is_not_a_buffer() -> None:
    assert native.EXTENSION is not None
    with pytest.raises(TypeError):
        native.EXTENSION.mqtt_connect("\x10\x00")


@pytest.mark.parametrize(("frame", "reason"), ERRORS)
def test_mqtt_connect_refuses_what_the_python_sniffer_refuses(frame: bytes, reason: str) -> None:
    _agree_at_every_prefix(frame, stomp_frame=False)
    with pytest.raises(SniffError, match=reason) as raised:
        MQTT.sniff(frame)
    with pytest.raises(SniffError) as expected:
        mqtt.MqttSniffer().sniff(frame)
    assert raised.value.answer == expected.value.answer  # the CONNACK 0x01 for a bad level


UTF8_CASES = [
    b"",
    b"plain",
    "é€𝄞".encode(),
    b"\x00",  # U+0000: refused in MQTT, a character in STOMP
    b"a\x00b",
    b"\xc0\x80",  # overlong NUL
    b"\xc1\xbf",
    b"\xe0\x80\xaf",  # overlong
    b"\xe0\xa0\x80",  # U+0800, the first 3-byte one
    b"\xed\x9f\xbf",  # U+D7FF
    b"\xed\xa0\x80",  # U+D800, a surrogate
    b"\xed\xbf\xbf",
    b"\xee\x80\x80",
    b"\xef\xbf\xbf",  # U+FFFF
    b"\xf0\x8f\xbf\xbf",  # overlong
    b"\xf0\x90\x80\x80",  # U+10000
    b"\xf4\x8f\xbf\xbf",  # U+10FFFF
    b"\xf4\x90\x80\x80",  # over U+10FFFF
    b"\xf5\x80\x80\x80",
    b"\xff",
    b"\x80",  # a lone continuation byte
    b"\xe2\x82",  # truncated
    b"ok\xe2\x82\xac\xe2",
]


@pytest.mark.parametrize("raw", UTF8_CASES, ids=[raw.hex() or "empty" for raw in UTF8_CASES])
def test_mqtt_connect_utf8_rules_match_the_python_codec(raw: bytes) -> None:
    for frame in (
        connect_packet(client_id=raw),
        connect_packet(user=raw, password=raw),
        connect_packet(level=5, password=raw),
        connect_packet(will=(b"", raw, raw), user=b"u"),  # will topic and payload are not checked
    ):
        _agree_at_every_prefix(frame, stomp_frame=False)


VARINT_CASES = [
    b"\x00",
    b"\x7f",
    b"\x80\x01",
    b"\xff\x7f",
    b"\x80\x80\x80\x00",
    b"\xff\xff\xff\x7f",
    b"\x80" * 4,
]


@pytest.mark.parametrize("length", VARINT_CASES, ids=[v.hex() for v in VARINT_CASES])
def test_mqtt_connect_variable_byte_integers_agree(length: bytes) -> None:
    """Scenario: the remaining length and MQTT 5's property lengths, minimal or not, up to the largest
    and one byte too many (MQTT 5 §1.5.5)."""
    tail = connect_packet(level=5)[2:]
    _agree_at_every_prefix(b"\x10" + length + tail, stomp_frame=False)
    header = b"\x00\x04MQTT\x05\x02\x00\x3c"
    body = header + length + b"\x00\x01c"
    _agree_at_every_prefix(b"\x10" + bytes((len(body),)) + body, stomp_frame=False)


@st.composite
def mqtt_connects(draw: st.DrawFn) -> bytes:
    """A CONNECT of any version with any fields, often valid, sometimes with flags, lengths or
    strings that are not."""
    name, level = draw(
        st.sampled_from([(b"MQTT", 4), (b"MQTT", 5), (b"MQIsdp", 3), (b"MQTT", 0x84), (b"MQIsdp", 0x83)])
        | st.tuples(st.sampled_from([b"MQTT", b"MQIsdp", b"MQTX", b"MQ"]), st.integers(0, 255))
    )
    text = st.text(max_size=12).map(str.encode) | st.binary(max_size=12) | st.sampled_from(UTF8_CASES)
    will = draw(st.none() | st.tuples(st.binary(max_size=6), text, st.binary(max_size=6)))
    return connect_packet(
        name=name,
        level=level,
        flags=draw(st.none() | st.none() | st.integers(0, 255)),
        keepalive=draw(st.integers(0, 0xFFFF)),
        properties=draw(st.binary(max_size=8)),
        client_id=draw(text),
        will=will,
        will_qos=draw(st.integers(0, 3)) if will is not None else 0,
        user=draw(st.none() | text),
        password=draw(st.none() | text),
        extra=draw(st.just(b"") | st.just(b"") | st.binary(max_size=3)),
        remaining=draw(st.none() | st.none() | st.integers(0, 300)),
    )


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    """A frame with a few bytes replaced, inserted or deleted, and maybe bytes after it."""
    data = bytearray(draw(frames))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        byte = draw(st.integers(0, 255))
        if op == "insert":
            data.insert(at, byte)
        elif at < len(data):
            if op == "set":
                data[at] = byte
            else:
                del data[at]
    return bytes(data) + draw(st.binary(max_size=4))


@given(mqtt_connects())
@example(connect_packet(level=5, will=(b"\x18\x00\x00\x00\x0a", b"t", b"p"), user=b"u", password=b"p"))
def test_mqtt_connect_generated_frames_agree_at_every_prefix(frame: bytes) -> None:
    _agree_at_every_prefix(frame, stomp_frame=False)


@given(mutated(mqtt_connects() | st.sampled_from(CAPTURED_FRAMES)))
def test_mqtt_connect_mutated_frames_agree_at_every_prefix(frame: bytes) -> None:
    _agree_at_every_prefix(frame, stomp_frame=False)


@given(st.binary(max_size=64))
def test_mqtt_connect_any_bytes_agree(data: bytes) -> None:
    check_native_agrees(b"\x10" + data, stomp_frame=False)
    check_native_agrees(data, stomp_frame=False)


# -- STOMP -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [capture[0] for capture in CAPTURES])
def test_stomp_connect_captured_frames_agree_at_every_prefix(frame: bytes) -> None:
    _agree_at_every_prefix(frame + b"SEND\n\n\x00", stomp_frame=True)
    assert STOMP.sniff(frame) == stomp.StompSniffer().sniff(frame)


def test_stomp_connect_returns_plain_values() -> None:
    frame = b"\r\n\nSTOMP\r\nlogin:a:b\r\nhost:h\nlogin:second\nclient-id:c\\cd\n\n\x00"
    assert native.EXTENSION is not None
    assert native.EXTENSION.stomp_connect(frame) == ("c\\cd", "a:b", None, "h", None, len(frame))
    assert STOMP.sniff(frame) == Sniffed(
        protocol=WireProtocol.STOMP, client_id="c\\cd", user_name="a:b", hostname="h", protocol_version="1.0"
    )


def _frame(*headers: bytes, body: bytes = b"", end: bytes = b"\x00") -> bytes:
    return b"CONNECT\n" + b"".join(header + b"\n" for header in headers) + b"\n" + body + end


LIMIT_CASES = [
    pytest.param(_frame(b"x:" + b"a" * (stomp.MAX_HEADER_BYTES - 13)), id="headers-just-fit"),
    pytest.param(_frame(b"x:" + b"a" * (stomp.MAX_HEADER_BYTES - 12)), id="headers-one-over"),
    pytest.param(_frame(b"x:" + b"a" * stomp.MAX_HEADER_BYTES), id="headers-over"),
    pytest.param(_frame(body=b"b" * stomp.MAX_BODY_BYTES), id="body-just-fits"),
    pytest.param(_frame(body=b"b" * (stomp.MAX_BODY_BYTES + 1)), id="body-one-over"),
    pytest.param(_frame(b"content-length:8192", body=b"\x00" * 8192), id="content-length-max"),
    pytest.param(_frame(b"content-length:8193", body=b"\x00" * 8193), id="content-length-over"),
    pytest.param(_frame(b"content-length:" + b"0" * 640 + b"3", body=b"abc"), id="content-length-641-digits"),
    pytest.param(_frame(b"content-length:" + b"0" * 639 + b"3", body=b"abc"), id="content-length-640-digits"),
    pytest.param(_frame(b"content-length:" + b"9" * 700), id="content-length-700-digits"),
    pytest.param(_frame(b"content-length:" + b"0" * 4301), id="content-length-over-int-limit"),
    pytest.param(_frame(b"content-length:99999"), id="content-length-5-digits"),
    pytest.param(_frame(b"content-length:100000"), id="content-length-6-digits"),
    pytest.param(_frame(b"content-length:", body=b""), id="content-length-empty"),
    pytest.param(_frame(b"content-length:+1", body=b"a"), id="content-length-sign"),
    pytest.param(_frame(b"content-length:\xd9\xa1", body=b"a"), id="content-length-arabic-digit"),
    pytest.param(_frame(b"content-length:2", body=b"a\x00"), id="content-length-nul-inside"),
    pytest.param(_frame(b"content-length:1", body=b"ab"), id="content-length-no-nul"),
    pytest.param(_frame(b"content-length:1\r", body=b"a"), id="content-length-crlf"),
]


@pytest.mark.parametrize("frame", LIMIT_CASES)
def test_stomp_connect_limits_agree(frame: bytes) -> None:
    """Scenario: the header and body caps and content-length rules of keys/stomp.py at their edges
    (the whole frame and every prefix near its end, where the limits bite)."""
    for cut in (*range(min(len(frame), 40)), *range(max(0, len(frame) - 40), len(frame) + 1)):
        check_native_agrees(frame[:cut], stomp_frame=True)


def test_stomp_connect_long_content_lengths_agree() -> None:
    """Scenario: thousands of digits are refused by both as too large (Python no longer lets
    int()'s own ValueError through); thousands of leading zeros before 1 are a length of 1."""
    assert native.EXTENSION is not None
    _agree_at_every_prefix(_frame(b"content-length:" + b"9" * 5000), stomp_frame=True)
    padded = _frame(b"content-length:" + b"0" * 5000 + b"1", body=b"a")
    assert native.EXTENSION.stomp_connect(padded) is not None
    _agree_at_every_prefix(padded, stomp_frame=True)


@pytest.mark.parametrize("raw", UTF8_CASES, ids=[raw.hex() or "empty" for raw in UTF8_CASES])
def test_stomp_connect_utf8_rules_match_the_python_codec(raw: bytes) -> None:
    for frame in (_frame(b"client-id:" + raw), _frame(raw + b":v"), _frame(b"x:" + raw, b"login:" + raw)):
        _agree_at_every_prefix(frame, stomp_frame=True)


HEADER_NAMES = [
    b"client-id",
    b"login",
    b"passcode",
    b"host",
    b"accept-version",
    b"content-length",
    b"heart-beat",
]


@st.composite
def stomp_frames(draw: st.DrawFn) -> bytes:
    """A CONNECT or STOMP frame with heart-beats before it, LF or CRLF lines, any headers (repeated,
    empty, with colons, backslashes or bytes that are not UTF-8), a body with or without a
    content-length, often valid."""
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    beats = draw(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\r\r"]), max_size=3))
    command = draw(st.sampled_from([b"CONNECT", b"STOMP", b"CONNECT", b"SEND", b"CONNECTX", b"STOMP\r", b""]))
    value = st.text(max_size=10).map(str.encode) | st.binary(max_size=6) | st.sampled_from(UTF8_CASES)
    header = st.builds(
        lambda name, sep, v: name + sep + v,
        st.sampled_from(HEADER_NAMES) | st.binary(max_size=5),
        st.sampled_from([b":", b":", b":", b"", b"::"]),
        value,
    )
    headers = draw(st.lists(header, max_size=5))
    body = draw(st.binary(max_size=8))
    length = draw(
        st.none()
        | st.just(str(len(body)).encode())
        | st.integers(0, 20).map(lambda n: str(n).encode())
        | st.sampled_from([b"", b"-1", b"0x1", b"00", b" 1", b"8192", b"8193"])
    )
    if length is not None:
        headers.insert(draw(st.integers(0, len(headers))), b"content-length:" + length)
    end = draw(st.sampled_from([b"\x00", b"\x00", b"", b"\n"]))
    return b"".join(beats) + command + eol + b"".join(h + eol for h in headers) + eol + body + end


@given(stomp_frames())
@example(b"\r\nSTOMP\r\naccept-version:1.2\r\nhost:h\r\n\r\n\x00")
def test_stomp_connect_generated_frames_agree_at_every_prefix(frame: bytes) -> None:
    _agree_at_every_prefix(frame, stomp_frame=True)


@given(mutated(stomp_frames() | st.sampled_from([capture[0] for capture in CAPTURES])))
def test_stomp_connect_mutated_frames_agree_at_every_prefix(frame: bytes) -> None:
    _agree_at_every_prefix(frame, stomp_frame=True)


@given(st.binary(max_size=64))
def test_stomp_connect_any_bytes_agree(data: bytes) -> None:
    check_native_agrees(b"CONNECT\n" + data, stomp_frame=True)
    check_native_agrees(data, stomp_frame=True)


# -- the fallback ----------------------------------------------------------------------------------


def _result_or_error(sniffer: Sniffer, data: bytes) -> object:
    try:
        return sniffer.sniff(data)
    except SniffError as exc:
        return (str(exc), exc.answer)


def test_native_sniffers_without_the_extension_are_the_python_sniffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario: keys._native is not built (an install without a C compiler): the wrappers answer
    with the Python sniffers, results and errors alike."""
    monkeypatch.setattr(native, "_native", None)
    frames = [*CAPTURED_FRAMES, *(capture[0] for capture in CAPTURES), b"", b"\x10\x05", b"\x12", b"SEND\n"]
    for frame in frames:
        for sniffer, reference in ((MQTT, mqtt.MqttSniffer()), (STOMP, stomp.StompSniffer())):
            assert _result_or_error(sniffer, frame) == _result_or_error(reference, frame)
