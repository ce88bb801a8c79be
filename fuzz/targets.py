"""The fuzz targets: one `fuzz_<name>(data: bytes) -> None` per parser, and the `TARGETS` registry.

Every target feeds arbitrary bytes to one parser and holds it to its contract: for ANY input it
returns normally or raises its documented "bad input" error (`SniffError` for the sniffers, the
PROXY header and the broker-answer parsers, plain `ValueError` for `tls_sni`, `UserStoreError`
for the user store, `ConfigError` for the configuration loader). Any other exception escapes the
target, and so does `InvariantBroken` when a cheap invariant fails; atheris reports both as a
crash (a hang is a timeout). The invariants, all stated by the parsers' own contracts:

- the answer on a prefix stays the answer when more bytes come (STYLE R10: bytes after the frame
  do not change the result), a rejected prefix is never accepted once it grows (a prefix of a
  valid opening gives NEED_MORE), and a server-first `Reply` only ever grows (keys/sniff.py);
- an accepted opening is also one the detector would pick (`looks_like` of its first bytes);
- `SniffBuffer` gives the same outcome however the bytes are split into reads, replays exactly
  the bytes read, and never wants more bytes once it holds its cap (STYLE R2);
- a parsed PROXY header re-encodes to the same header, and every proper prefix needs more.

Plain Python, no atheris: fuzz/runner.py instruments and drives these functions, and
tests/fuzz/test_fuzz.py runs them over the seed corpus without the fuzzer. No I/O.
"""

from __future__ import annotations

import functools
import io
import itertools
import random
import re
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from event_format.frames import NativeBatch, decode_frame, events_of
from event_format.frames import columns as event_columns
from keys import (
    NEED_MORE,
    KeyType,
    NeedMore,
    Reply,
    Sniffed,
    SniffError,
    amqp,
    core,
    mqtt,
    native,
    openwire,
    proxy_protocol,
    stomp,
)
from keys.detect import SNIFFERS, TLS, detect_tls, make_detector
from keys.refusal import parse_refusal
from keys.sniff import WireProtocol
from keys.users import HashedPassword, PlainPassword, UserStore, UserStoreError
from policies import policy_names
from router import conn_lines
from router.config import ConfigError, load_config_text
from router.config.acceptor_params import ACCEPTOR_PARAMS
from router.core.address import Address
from router.core.framing import MqttFrames
from router.core.opening import SniffBuffer
from router.datapath import native_path
from router.logs import MAX_SHOWN_CHARS, shown
from tls_sni import ClientHello, parse_client_hello

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

    from keys import Sniffer

__all__ = ["TARGETS", "InvariantBroken", "Target"]

T = TypeVar("T")
E = TypeVar("E", bound=Exception)

CORPUS: Final = Path(__file__).resolve().parent / "corpus"
"""The seed corpora, one directory per target, named after it."""

_ALL_CUTS_BELOW: Final = 24
"""Inputs shorter than this are checked at every prefix; longer ones at four cut points (the
start, the middle, the last byte off, and one the input's last byte picks), which keeps a run
several thousand inputs a second while libFuzzer varies lengths on its own."""

_DETECT_WITHIN: Final = 16
"""Bytes within which detection must have decided: every opening differs from the others in its
first byte (keys/detect.py), and a `SniffBuffer` names the first 16 bytes of an unknown protocol."""


class InvariantBroken(Exception):
    """A parser kept its error contract but broke an invariant of its result (module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One fuzz target."""

    fuzz: Callable[[bytes], None]
    """The function atheris calls with each input."""
    corpus: Path
    """Its seed corpus directory (`fuzz/corpus/<name>`)."""
    max_len: int = 4096
    """Largest input libFuzzer generates: openings are a few hundred bytes, the sniff cap 16 KiB."""
    dictionary: Callable[[], list[bytes]] | None = None
    """Tokens libFuzzer splices into inputs (`-dict`), for formats that byte flips rarely hit."""
    checks: str
    """What the target checks, one line for `fuzz/run --list`."""


# --- shared checks -----------------------------------------------------------------------------


def _outcome(parse: Callable[[bytes], T], data: bytes, allowed: type[E], *, exact: bool = False) -> T | E:
    """What `parse(data)` returns, or the `allowed` error it raises (with `exact`, that class and
    not a subclass); anything else propagates and is a finding."""
    try:
        return parse(data)
    except allowed as exc:
        if exact and type(exc) is not allowed:
            raise
        return exc


def _cuts(data: bytes) -> Iterator[int]:
    """The prefix lengths `_check_growing` compares with the whole input."""
    n = len(data)
    if n < _ALL_CUTS_BELOW:
        return iter(range(n))
    return iter(sorted({0, n // 2, n - 1, data[-1] * n // 256}))


def _is_answer(result: object) -> bool:
    """A parser's final answer: neither NEED_MORE, nor a `Reply` (more to come), nor an error."""
    return result is not NEED_MORE and not isinstance(result, Reply | Exception)


def _check_growing(
    parse: Callable[[bytes], object], data: bytes, allowed: type[Exception], *, exact: bool = False
) -> tuple[object, list[object]]:
    """Parse `data` and some of its prefixes and compare: an answer on a prefix is the answer on
    the whole, a rejected prefix is never accepted once it grows, and a `Reply` only grows.

    Returns:
        The outcome on the whole input, and those on the prefixes.

    Raises:
        InvariantBroken: one of the three does not hold.
    """
    full = _outcome(parse, data, allowed, exact=exact)
    parts: list[object] = []
    for cut in _cuts(data):
        part = _outcome(parse, data[:cut], allowed, exact=exact)
        parts.append(part)
        if isinstance(part, allowed):
            if _is_answer(full):
                raise InvariantBroken(
                    f"the first {cut} bytes are rejected ({part}) but all {len(data)} are accepted: {full!r}"
                )
        elif isinstance(part, Reply):
            if isinstance(full, Reply) and not full.to_client.startswith(part.to_client):
                raise InvariantBroken(
                    f"the reply to the first {cut} bytes, {part.to_client!r}, is not a prefix of the "
                    f"reply to all {len(data)}: {full.to_client!r}"
                )
        elif part is not NEED_MORE and part != full:
            raise InvariantBroken(f"the answer to the first {cut} bytes, {part!r}, became {full!r}")
    return full, parts


def _check_sniffer(sniffer: Sniffer, data: bytes) -> tuple[object, list[object]]:
    """The sniffer contract (keys/sniff.py) and `_check_growing`; returns what that returns."""
    if sniffer.sniff(b"") is not NEED_MORE:
        raise InvariantBroken(f"{sniffer.name}: no bytes yet is not NEED_MORE")
    full, parts = _check_growing(sniffer.sniff, data, SniffError)
    for result in (full, *parts):
        if isinstance(result, SniffError) and result.protocol != sniffer.name:
            raise InvariantBroken(f"{sniffer.name} raised a SniffError of {result.protocol!r}: {result}")
        if isinstance(result, Sniffed) and result.protocol.value != sniffer.name:
            raise InvariantBroken(f"{sniffer.name} sniffed {result.protocol}")
    if isinstance(full, Sniffed):
        for size in range(1, min(len(data), _DETECT_WITHIN) + 1):
            if not sniffer.looks_like(data[:size]):
                raise InvariantBroken(
                    f"{sniffer.name} accepts the opening, but looks_like() of its first {size} bytes is "
                    "False: detection would never choose this sniffer"
                )
    announced = sniffer.announced_size(data)  # checked against the byte cap (SniffBuffer.check_cap)
    if announced is not None and announced < 0:
        raise InvariantBroken(f"{sniffer.name}: announced_size() gave {announced!r}")
    if isinstance(full, Sniffed) and announced is not None and announced > len(data):
        raise InvariantBroken(
            f"{sniffer.name} accepts {len(data)} bytes whose opening announces {announced}: the router "
            "would refuse this opening on a cap between the two"
        )
    return full, parts


# --- the sniffers (keys/mqtt.py, amqp.py, stomp.py, openwire.py, tls.py; tls_sni) ----------------

_MQTT: Final = SNIFFERS["MQTT"]
_AMQP: Final = SNIFFERS["AMQP"]
_STOMP: Final = SNIFFERS["STOMP"]
_OPENWIRE: Final = SNIFFERS["OPENWIRE"]
_CORE: Final = SNIFFERS["CORE"]


def fuzz_mqtt(data: bytes) -> None:
    """MQTT CONNECT (3.1, 3.1.1, 5)."""
    _check_sniffer(_MQTT, data)


def fuzz_amqp(data: bytes) -> None:
    """AMQP 1.0 protocol header, SASL exchange and Open: every `Reply` the router sends before the
    result is a prefix of `server_preamble` of the result, which the router completes it with."""
    full, parts = _check_sniffer(_AMQP, data)
    if isinstance(full, Sniffed):
        preamble = amqp.server_preamble(full)
        for part in parts:
            if isinstance(part, Reply) and not preamble.startswith(part.to_client):
                raise InvariantBroken(f"amqp reply {part.to_client!r} is not a prefix of {preamble!r}")


def fuzz_stomp(data: bytes) -> None:
    """STOMP CONNECT/STOMP frame (1.0 to 1.2)."""
    _check_sniffer(_STOMP, data)


# --- the C parsers against the Python sniffers (keys/native.py, keys/_native.c) ------------------

_NATIVE_MQTT: Final = native.NativeMqttSniffer()
_NATIVE_STOMP: Final = native.NativeStompSniffer()


def _built(module: ModuleType | None, name: str) -> ModuleType:
    """A C extension (`keys._native`, `router.datapath._core`, `router._conn_lines`), or
    InvariantBroken when it is not built (nothing to compare with its Python reference)."""
    if module is None:
        raise InvariantBroken(f"{name} is not built: python setup.py build_ext --inplace")
    return module


def check_native_agrees(data: bytes, *, stomp_frame: bool) -> object:
    """The C parser (`mqtt_connect` or `stomp_connect`) and the Python sniffer on `data`: None for
    NEED_MORE, the same fields as the `Sniffed` (and `consumed` where the opening ends), a refusal
    code for a `SniffError` whose reason is that code's (`native.MQTT_REFUSALS`); and the wrapping
    `Native*Sniffer` gives exactly the Python sniffer's result or error. Nothing may be deferred
    (`DEFER`): the C decides every input today.

    Returns:
        The Python sniffer's outcome.

    Raises:
        InvariantBroken: any disagreement.
    """
    module = _built(native.EXTENSION, "keys._native")
    reference: Sniffer = _STOMP if stomp_frame else _MQTT
    wrapper: Sniffer = _NATIVE_STOMP if stomp_frame else _NATIVE_MQTT
    raw = module.stomp_connect(data) if stomp_frame else module.mqtt_connect(data)
    expected = _outcome(reference.sniff, data, SniffError)
    got = _outcome(wrapper.sniff, data, SniffError)
    name = reference.name
    if isinstance(raw, int) and raw == module.DEFER:
        raise InvariantBroken(f"{name}: the C parser deferred an input it should decide")
    if raw is None:
        if expected is not NEED_MORE:
            raise InvariantBroken(f"{name}: C needs more, Python says {expected!r}")
    elif isinstance(raw, int):
        refusals = native.STOMP_REFUSALS if stomp_frame else native.MQTT_REFUSALS
        if not isinstance(expected, SniffError) or not re.search(refusals[raw], expected.reason):
            raise InvariantBroken(f"{name}: C refuses with code {raw}, Python says {expected!r}")
    else:
        if not isinstance(expected, Sniffed):
            raise InvariantBroken(f"{name}: C parsed {raw!r}, Python says {expected!r}")
        consumed = raw[-1]
        if not 0 < consumed <= len(data):
            raise InvariantBroken(f"{name}: C consumed {consumed} of {len(data)} bytes")
        if stomp_frame and data[consumed - 1] != 0:
            raise InvariantBroken(f"stomp: C's frame ends at {consumed}, not after a NUL")
        if not stomp_frame and consumed != _MQTT.announced_size(data):
            raise InvariantBroken(f"mqtt: C consumed {consumed}, the CONNECT announces a different size")
    if not _same_outcome(got, expected):
        raise InvariantBroken(f"{name}: the native sniffer gives {got!r}, Python {expected!r}")
    return expected


def _same_outcome(got: object, expected: object) -> bool:
    """Equal results, or errors of the same class with the same message (and MQTT answer)."""
    if isinstance(got, Exception) or isinstance(expected, Exception):
        return (
            type(got) is type(expected)
            and str(got) == str(expected)
            and getattr(got, "answer", None) == getattr(expected, "answer", None)
        )
    return got == expected


def fuzz_mqtt_native(data: bytes) -> None:
    """keys._native.mqtt_connect against MqttSniffer.sniff, on the input and its prefixes."""
    for cut in (*_cuts(data), len(data)):
        check_native_agrees(data[:cut], stomp_frame=False)


def fuzz_stomp_native(data: bytes) -> None:
    """keys._native.stomp_connect against StompSniffer.sniff, on the input and its prefixes."""
    for cut in (*_cuts(data), len(data)):
        check_native_agrees(data[:cut], stomp_frame=True)


def fuzz_openwire(data: bytes) -> None:
    """OpenWire WireFormatInfo and ConnectionInfo: the router's echo is a WireFormatInfo a client
    can read, and `sniff_wire_format` agrees with the sniffer."""
    full, _ = _check_sniffer(_OPENWIRE, data)
    if isinstance(full, Reply):
        echo = full.to_client
        if openwire.sniff_server_preamble(echo) != len(echo):
            raise InvariantBroken(f"openwire echo is not one whole WireFormatInfo: {echo[:64].hex()}")
    if isinstance(full, Reply | Sniffed):
        fmt = openwire.sniff_wire_format(data)
        if not isinstance(fmt, openwire.WireFormat) or not 1 <= fmt.version <= openwire.MAX_VERSION:
            raise InvariantBroken(f"openwire sniffed, but its wire format is {fmt!r}")
        if isinstance(full, Sniffed) and full.protocol_version != str(fmt.version):
            raise InvariantBroken(f"openwire version {full.protocol_version!r} but wire format {fmt!r}")


def fuzz_core(data: bytes) -> None:
    """CORE/HORNETQ opening: every `Reply` is a prefix of `server_preamble` of the whole input, which
    is what `parse_opening` says was answered; then the packet decoders of the redirect and the
    refusals (`decode_disconnect`, `decode_exception`) on the input's packets read as a broker's."""
    full, parts = _check_sniffer(_CORE, data)
    if isinstance(full, Reply | Sniffed):
        preamble = core.server_preamble(data)
        for part in (full, *parts):
            if isinstance(part, Reply) and not preamble.startswith(part.to_client):
                raise InvariantBroken(
                    f"core reply {part.to_client[:64].hex()} is not a prefix of the preamble"
                )
        opening = core.parse_opening(data)
        if opening is NEED_MORE or opening.to_client != preamble:
            raise InvariantBroken(f"parse_opening disagrees with server_preamble: {opening!r}")
        if isinstance(full, Reply) and full.to_client != preamble:
            raise InvariantBroken("the reply to the whole input is not its preamble")
    _check_core_packets(data[7:] if _CORE.looks_like(data) else data)


def _check_core_packets(data: bytes) -> None:
    """Each whole packet at the start of `data` through both decoders: SniffError only, and what
    decodes re-encodes to a packet that decodes to the same (DISCONNECT_V3 with a known reason and
    no int64 parameter, which the encoder writes as int32 only)."""
    pos = 0
    while True:
        packet = _outcome(
            functools.partial(core.parse_packet, offset=pos, max_size=1 << 20), data, SniffError
        )
        if not isinstance(packet, core.Packet):
            return
        try:
            error: core.CoreException | None = core.decode_exception(packet)
        except SniffError:
            error = None
        if error is not None:
            again = core.parse_packet(core.encode_exception(error.code, error.message), max_size=1 << 20)
            if again is NEED_MORE or core.decode_exception(again) != error:
                raise InvariantBroken(f"{error!r} does not re-encode to itself")
        try:
            disconnect: core.CoreDisconnect | None = core.decode_disconnect(packet)
        except SniffError:
            disconnect = None
        if disconnect is not None and _re_encodable(disconnect):
            encoded = core.encode_disconnect_v3(
                reason=core.DisconnectReason(disconnect.reason),
                connector=disconnect.connector,
                node_id=disconnect.node_id,
                target_node_id=disconnect.target_node_id,
            )
            again = core.parse_packet(encoded, max_size=1 << 20)
            if again is NEED_MORE or core.decode_disconnect(again) != disconnect:
                raise InvariantBroken(f"{disconnect!r} does not re-encode to itself")
        pos = packet.end


def _re_encodable(disconnect: core.CoreDisconnect) -> bool:
    params = disconnect.connector.params if disconnect.connector is not None else ()
    ints_fit = all(-(2**31) <= v < 2**31 for _, v in params if isinstance(v, int))
    return ints_fit and disconnect.reason in {int(reason) for reason in core.DisconnectReason}


def fuzz_tls(data: bytes) -> None:
    """TLS ClientHello: `tls_sni.parse_client_hello` raises plain ValueError only (not a
    UnicodeDecodeError or another subclass), and the TLS sniffer reports its SNI host."""
    full, _ = _check_growing(_parse_client_hello, data, ValueError, exact=True)
    sniffed, _ = _check_sniffer(TLS, data)
    if isinstance(full, ClientHello) != isinstance(sniffed, Sniffed):
        raise InvariantBroken(f"tls_sni parsed {full!r} but the tls sniffer gave {sniffed!r}")
    if isinstance(full, ClientHello) and isinstance(sniffed, Sniffed) and sniffed.sni_host != full.sni:
        raise InvariantBroken(f"tls sni {full.sni!r} sniffed as {sniffed.sni_host!r}")


def _parse_client_hello(data: bytes) -> ClientHello | NeedMore:
    hello = parse_client_hello(data)  # None: a valid prefix, read more
    return NEED_MORE if hello is None else hello


# --- what brokers send: probe answers and proxy-mode preambles (router/features/probes/checks.py) -------


# --- the native core's MQTT reading against the Python one (router/datapath/_core.c) -------------


def fuzz_mqtt_broker_native(data: bytes) -> None:
    """The core's follower of a broker's MQTT packets and its reading of a first answer, against
    MqttFrames and parse_refusal: the input whole, and cut at each of `_cuts`."""
    module = _built(native_path.EXTENSION, "router.datapath._core")
    if module.mqtt_refused(data) != (parse_refusal(WireProtocol.MQTT, data) is not None):
        raise InvariantBroken(
            f"mqtt_refused({data!r}) = {module.mqtt_refused(data)}, parse_refusal disagrees"
        )
    points = sorted({0, *_cuts(data), len(data)})
    pieces = [data[a:b] for a, b in itertools.pairwise(points)]
    reference = MqttFrames()
    for piece in pieces:
        reference.feed(piece)
    expected = (reference.frames, reference._left, reference._head, reference.lost)
    if module.mqtt_frames(*pieces) != expected:
        raise InvariantBroken(
            f"the core follows {pieces!r} to {module.mqtt_frames(*pieces)}, MqttFrames to {expected}"
        )


# --- the C line buffer against the Python one (router/_conn_lines.c, router/conn_lines.py) --------

_LINES_AT: Final = 1_795_961_196.534325
"""The wall-clock time both buffers' lines are stamped with."""


def _lines_of(kind: type[conn_lines.ConnLines], write: Callable[[conn_lines.ConnLines], None]) -> str:
    """What one buffer of `kind` writes for the lines `write` puts in it."""
    stream = io.StringIO()
    lines = kind(stream, threading.RLock(), clock=lambda: _LINES_AT)
    write(lines)
    lines.flush()
    return stream.getvalue()


def fuzz_shown_native(data: bytes) -> None:
    """router._conn_lines.shown and the C buffer's lines against logs.shown and `ConnLines`: the
    input as text (UTF-8 with its undecodable bytes as lone surrogates, and as Latin-1), as a key
    and a close's detail, at caps around its length."""
    module = _built(conn_lines.EXTENSION, "router._conn_lines")
    for value in (data.decode("utf-8", "surrogateescape"), data.decode("latin-1")):
        for cap in {0, 1, len(value) - 1, len(value), MAX_SHOWN_CHARS} - {-1}:
            if module.shown(value, cap) != shown(value, cap):
                raise InvariantBroken(f"shown({value!r}, {cap}): C {module.shown(value, cap)!r}")

        def write(lines: conn_lines.ConnLines, value: str = value) -> None:
            lines.connected(Address("::1", 1883), "r", value, "b-0")
            lines.closed(Address("127.0.0.1", 1), "r", "b-0", len(data), 7, 0.0625, "closed", value)

        native, python = _lines_of(conn_lines.NativeConnLines, write), _lines_of(conn_lines.ConnLines, write)
        if native != python:
            raise InvariantBroken(f"lines for {value!r}: C {native!r}, Python {python!r}")


def fuzz_mqtt_broker(data: bytes) -> None:
    """MQTT CONNACK (`parse_connack`) and the retained `$SYS` count (`parse_subscribed_value`)."""
    _check_growing(mqtt.parse_connack, data, SniffError)
    _check_growing(_parse_mqtt_count, data, SniffError)


def _parse_mqtt_count(data: bytes) -> object:
    return mqtt.parse_subscribed_value(data, topic=mqtt.SYS_CLIENTS_CONNECTED, packet_id=1)


_AMQP_BROKER_PARSERS: Final[tuple[Callable[[bytes], object], ...]] = (
    amqp.parse_sasl_mechanisms,
    amqp.parse_sasl_outcome,
    amqp.parse_broker_open,
    amqp.parse_broker_close,
    amqp.sniff_server_sasl_preamble,
    amqp.sniff_server_plain_preamble,
)


def fuzz_amqp_broker(data: bytes) -> None:
    """AMQP 1.0 broker answers: SASL mechanisms and outcome, Open, Close, and the preambles the
    router drops in proxy mode."""
    for parse in _AMQP_BROKER_PARSERS:
        _check_growing(parse, data, SniffError)


def fuzz_amqp_value(data: bytes) -> None:
    """The AMQP 1.0 type decoder (`decode_value`) on its own, and on a frame body."""
    value = _outcome(amqp.decode_value, data, SniffError)
    if isinstance(value, tuple) and not 0 < value[1] <= len(data):
        raise InvariantBroken(f"amqp value of {len(data)} bytes ends at {value[1]}")
    _outcome(_decode_performative, data, SniffError)


def _decode_performative(body: bytes) -> object:
    return amqp.decode_performative(amqp.Frame(type=0, channel=0, body=body, size=8 + len(body)))


def fuzz_stomp_broker(data: bytes) -> None:
    """STOMP CONNECTED/ERROR frame head (`parse_server_frame`)."""
    _check_growing(stomp.parse_server_frame, data, SniffError)


_OPENWIRE_CLIENT: Final = openwire.WireFormat(
    version=openwire.MAX_VERSION, tight_encoding=True, cache_enabled=True, cache_size=1024
)
"""A client's options as `sniff_wire_format` gives them, for `sniff_server_preamble`."""


def fuzz_openwire_broker(data: bytes) -> None:
    """OpenWire broker answers: its WireFormatInfo for the probe, the probe's Response, and the
    preamble the router drops in proxy mode."""
    _check_growing(openwire.parse_probe_wire_format, data, SniffError)
    _check_growing(_parse_openwire_response, data, SniffError)
    _check_growing(openwire.sniff_server_preamble, data, SniffError)
    _check_growing(_parse_openwire_preamble, data, SniffError)


def _parse_openwire_response(data: bytes) -> object:
    return openwire.parse_probe_response(data, command_id=1)


def _parse_openwire_preamble(data: bytes) -> object:
    return openwire.sniff_server_preamble(data, client=_OPENWIRE_CLIENT)


# --- PROXY protocol, detection, the opening buffer ---------------------------------------------


def fuzz_proxy_protocol(data: bytes) -> None:
    """PROXY protocol v1/v2 header: every proper prefix of a header needs more, the header does not
    depend on what follows it, and it re-encodes to the same addresses and TLVs."""
    full, _ = _check_growing(proxy_protocol.parse_proxy_header, data, SniffError)
    if not isinstance(full, proxy_protocol.ProxyHeader):
        return
    if not proxy_protocol.looks_like_proxy_header(data):
        raise InvariantBroken("a proxy header was parsed but looks_like_proxy_header() is False")
    if not 0 < full.length <= len(data):
        raise InvariantBroken(f"proxy header length {full.length} of {len(data)} bytes")
    if proxy_protocol.parse_proxy_header(data[: full.length]) != full:
        raise InvariantBroken("the proxy header depends on the bytes after it")
    for cut in (full.length - 1, full.length // 2):
        if proxy_protocol.parse_proxy_header(data[:cut]) is not NEED_MORE:
            raise InvariantBroken(f"{cut} bytes of a {full.length}-byte proxy header are not NEED_MORE")
    _check_proxy_round_trip(full)


def _check_proxy_round_trip(header: proxy_protocol.ProxyHeader) -> None:
    if header.local or header.source_ip is None or header.dest_ip is None:
        return
    source = (header.source_ip, header.source_port or 0)  # the ports come with the addresses
    dest = (header.dest_ip, header.dest_port or 0)
    if header.version == 1:
        encoded = proxy_protocol.encode_v1(*source, *dest)
    else:
        encoded = proxy_protocol.encode_v2(*source, *dest, tlvs=header.tlvs)
    again = proxy_protocol.parse_proxy_header(encoded)
    if not isinstance(again, proxy_protocol.ProxyHeader):
        raise InvariantBroken(f"re-encoded proxy header {encoded!r} parses as {again!r}")
    crc = proxy_protocol.PP2_TYPE_CRC32C  # encode_v2 computes its own checksum
    fields = (again.source_ip, again.source_port, again.dest_ip, again.dest_port, again.version)
    expected = (header.source_ip, header.source_port, header.dest_ip, header.dest_port, header.version)
    tlvs = ([t for t in again.tlvs if t[0] != crc], [t for t in header.tlvs if t[0] != crc])
    if fields != expected or tlvs[0] != tlvs[1]:
        raise InvariantBroken(f"proxy header {header!r} re-encodes as {again!r}")


def fuzz_refusal(data: bytes) -> None:
    """A broker's first answer read as a refusal (passive health); the first input byte picks the
    client's protocol (or none). It never raises, returns None or words, and a refusal seen in a
    prefix is still one when more bytes come."""
    protocols = [*WireProtocol, None]
    protocol, answer = (protocols[data[0] % len(protocols)], data[1:]) if data else (None, b"")
    full = parse_refusal(protocol, answer)
    if full is not None and not isinstance(full, str):
        raise InvariantBroken(f"parse_refusal gave {full!r}")
    for cut in _cuts(answer):
        if parse_refusal(protocol, answer[:cut]) is not None and full is None:
            raise InvariantBroken(f"a refusal in {cut} bytes is none in {len(answer)}")


_PROTOCOL_BITS: Final = {0: "AMQP", 1: "MQTT", 2: "OPENWIRE", 3: "STOMP", 6: "CORE"}
_PROTOCOL_NAMES: Final = tuple(_PROTOCOL_BITS.values())


def _detector_options(options: int) -> tuple[list[str], bool]:
    """An acceptor's `protocols` (bits 0-3 and 6; none set means all) and TLS (bit 4) from one byte."""
    return [name for bit, name in _PROTOCOL_BITS.items() if options >> bit & 1], bool(options & 0x10)


def fuzz_detect(data: bytes) -> None:
    """Protocol detection over the first bytes (keys/detect.py); the first input byte picks the
    acceptor's protocols and TLS. It never raises, decides within 16 bytes, picks only a listed
    protocol, and once it picked a sniffer more bytes confirm it or rule it out; every
    `looks_like` is true of each prefix of what it is true of."""
    options, prefix = (data[0], data[1:]) if data else (0, b"")
    protocols, tls = _detector_options(options)
    detect = make_detector(protocols, tls=tls)
    chosen = detect(prefix)
    if chosen is NEED_MORE and len(prefix) >= _DETECT_WITHIN:
        raise InvariantBroken(f"detection still undecided after {len(prefix)} bytes")
    allowed = {SNIFFERS[name].name for name in protocols or _PROTOCOL_NAMES} | ({TLS.name} if tls else set())
    if chosen is not None and chosen is not NEED_MORE and chosen.name not in allowed:
        raise InvariantBroken(f"detection chose {chosen.name}, not one of {sorted(allowed)}")
    for cut in _cuts(prefix):
        if cut == 0:
            continue  # never asked: a SniffBuffer detects only once it holds a byte
        earlier = detect(prefix[:cut])
        if earlier is not None and earlier is not NEED_MORE and chosen not in (earlier, None):
            raise InvariantBroken(f"detection chose {earlier.name} on {cut} bytes, then {chosen}")
    for sniffer in (*SNIFFERS.values(), TLS):
        if sniffer.looks_like(prefix):
            for cut in range(1, min(len(prefix), _DETECT_WITHIN)):
                if not sniffer.looks_like(prefix[:cut]):
                    raise InvariantBroken(f"{sniffer.name}.looks_like({prefix!r}) but not of its first {cut}")
    if detect_tls(prefix) not in (TLS, None):
        raise InvariantBroken("detect_tls chose another sniffer than TLS")


_SNIFF_CAPS: Final = (64, 256, 1024, 4096)
"""Byte caps the opening target picks from: small, so inputs reach them."""


def fuzz_opening(data: bytes) -> None:
    """`SniffBuffer` (router/core/opening.py) driven as both data paths drive it, over reads split
    as the input says: byte 0 picks the cap, byte 1 the acceptor's protocols and TLS (as in
    `fuzz_detect`) and whether the first bytes come as `initial` (after a PROXY header), byte 2
    the read sizes; the rest is what the client sends, then its EOF. Only SniffError; the outcome
    equals that of the same bytes in reads as large as the buffer allows."""
    if len(data) < 3:
        return
    cap = _SNIFF_CAPS[data[0] % len(_SNIFF_CAPS)]
    protocols, tls = _detector_options(data[1])
    stream = data[3:]
    sizes = random.Random(data[2])
    initial = stream[: sizes.randrange(9)] if data[1] & 0x20 else b""
    split = _drive(
        SniffBuffer(make_detector(protocols, tls=tls), cap, initial=initial),
        stream,
        iter(lambda: sizes.choice((1, 1, 2, 3, 5, 8, 64, 4096)), None),
    )
    whole = _drive(SniffBuffer(make_detector(protocols, tls=tls), cap), stream, itertools.repeat(cap))
    if (isinstance(split, Sniffed) or isinstance(whole, Sniffed)) and split != whole:
        raise InvariantBroken(f"split reads gave {split!r}, whole reads {whole!r}")


def _drive(buffer: SniffBuffer, stream: bytes, sizes: Iterator[int]) -> Sniffed | SniffError:
    """Drive `buffer` like the data paths: step, send the reply, check the cap, read, feed."""
    read = len(buffer.raw)  # an `initial` is the start of the stream
    sent = b""
    try:
        while True:
            step = buffer.step()
            if isinstance(step, Sniffed):
                return step
            sent += step
            if sent != buffer.replied:
                raise InvariantBroken(f"sent {sent!r} but the buffer remembers {buffer.replied!r}")
            buffer.check_cap()
            if len(buffer.raw) >= buffer.max_bytes or buffer.read_size <= 0:
                raise InvariantBroken(f"{len(buffer.raw)} bytes held, cap {buffer.max_bytes}, still reading")
            chunk = stream[read : read + min(next(sizes), buffer.read_size)]
            read += len(chunk)
            buffer.feed(chunk)
            if buffer.raw != stream[:read]:
                raise InvariantBroken("the buffer does not hold exactly the bytes read, for the replay")
    except SniffError as exc:
        return exc


# --- the user store (keys/users.py) and the configuration loader (router/config/loader.py) ------


def fuzz_users(data: bytes) -> None:
    """`artemis-users.properties` and `artemis-roles.properties`, split at the first NUL and read
    as ISO-8859-1 as `UserStore.load` does: only UserStoreError; a plain password authenticates
    its user with the roles the store has for it, and an `ENC(...)` hash re-encodes to itself."""
    users_raw, _, roles_raw = data.partition(b"\x00")
    try:
        store = UserStore.parse(users_raw.decode("iso-8859-1"), roles_raw.decode("iso-8859-1"))
    except UserStoreError as exc:
        if type(exc) is not UserStoreError:
            raise
        return
    for user, stored in store.users.items():
        if isinstance(stored, PlainPassword):
            # Hashed passwords are not verified: an input may ask for 2**31 PBKDF2 iterations.
            authenticated = store.authenticate(user, stored.text)
            if authenticated is None or authenticated.roles != store.roles.get(user, ()):
                raise InvariantBroken(f"user {user!r} with its own password: {authenticated!r}")
            if store.authenticate(user, stored.text + "x") is not None:
                raise InvariantBroken(f"user {user!r} authenticated with a wrong password")
        elif isinstance(stored, HashedPassword) and HashedPassword.parse(stored.encode()) != stored:
            raise InvariantBroken(f"user {user!r}: the hash does not re-encode to itself")


_CONFIG_SOURCE: Final = "/nonexistent/fuzz/broker.xml"
"""The file name the loader is told: a `<password file=…>` relative to it names no file, so a
fuzzed configuration reads nothing of this machine (absolute names it may still read)."""


def fuzz_config(data: bytes) -> None:
    """The configuration loader (`load_config_text`, what `load_config` calls after reading the
    file): only ConfigError, never a subclass or another ValueError."""
    _outcome(_load_config, data, ConfigError, exact=True)


def _load_config(data: bytes) -> object:
    return load_config_text(data, source=_CONFIG_SOURCE)


_XSD_NAME: Final = re.compile(rb'<xsd:(element|attribute)\s[^>]*?name="([^"]+)"')


def config_dictionary() -> list[bytes]:
    """XML tokens, every element and attribute name of the shipped XSD, and the names the loader
    reads from text (acceptor URL parameters, policies, key types), for the config target."""
    xsd = resources.files("router.config").joinpath("schema", "connection-router.xsd").read_bytes()
    tokens = {b"<", b">", b"</", b"/>", b'="', b"<core>", b"</core>", b"<configuration>", b"&#"}
    for kind, name in _XSD_NAME.findall(xsd):
        tokens |= {b"<" + name, b"</" + name + b">"} if kind == b"element" else {b" " + name + b'="'}
    # Values the schema leaves to the loader: acceptor URL parameters, policy names, key types.
    tokens |= {b"tcp://127.0.0.1:61616?", b";", b"&"}
    tokens |= {f"{name}=".encode() for param in ACCEPTOR_PARAMS for name in param.names}
    tokens |= {name.encode() for name in (*policy_names(), *(key.value for key in KeyType))}
    return sorted(tokens)


# --- the registry ------------------------------------------------------------------------------


# --- the event log's frames (routerd -> its writer process) -------------------------------------


def fuzz_event_frames(data: bytes) -> None:
    """A frame's payload as the event log's writer reads it (event_format/frames.py):
    `decode_frame`, then a native batch decoded as values and as Arrow columns. ValueError only;
    records decoded as values decode as columns too, the same number per kind."""
    batch = _outcome(decode_frame, data, ValueError)
    if not isinstance(batch, NativeBatch):
        return
    try:
        columns = event_columns([batch])
    except ValueError:
        columns = None
    try:
        rows = events_of(batch)
    except ValueError:
        return
    if columns is None:
        raise InvariantBroken("records decoded as values but not as columns")
    per_kind = [sum(1 for _, values in rows if values[0] == kind) for kind in range(len(columns))]
    if per_kind != [0 if kind is None else kind[0] for kind in columns]:
        raise InvariantBroken(f"values per kind {per_kind}, columns {[k and k[0] for k in columns]}")


def _target(name: str, fuzz: Callable[[bytes], None], checks: str) -> tuple[str, Target]:
    return name, Target(fuzz=fuzz, corpus=CORPUS / name, checks=checks)


TARGETS: Final[dict[str, Target]] = dict(
    (
        _target("mqtt", fuzz_mqtt, "MqttSniffer.sniff: SniffError only, prefix-stable"),
        _target("amqp", fuzz_amqp, "AmqpSniffer.sniff: SniffError only, prefix-stable, replies grow"),
        _target("stomp", fuzz_stomp, "StompSniffer.sniff: SniffError only, prefix-stable"),
        (
            "mqtt_native",
            Target(
                fuzz=fuzz_mqtt_native,
                corpus=CORPUS / "mqtt",
                checks="keys._native.mqtt_connect = MqttSniffer.sniff (fields, need-more, refusals)",
            ),
        ),
        (
            "stomp_native",
            Target(
                fuzz=fuzz_stomp_native,
                corpus=CORPUS / "stomp",
                checks="keys._native.stomp_connect = StompSniffer.sniff (fields, need-more, refusals)",
            ),
        ),
        (
            "mqtt_broker_native",
            Target(
                fuzz=fuzz_mqtt_broker_native,
                corpus=CORPUS / "mqtt_broker",
                checks="router.datapath._core: mqtt_refused = parse_refusal, mqtt_frames = MqttFrames",
            ),
        ),
        (
            "shown_native",
            Target(
                fuzz=fuzz_shown_native,
                corpus=CORPUS / "mqtt",
                checks="router._conn_lines: shown and the two lines = logs.shown and ConnLines",
            ),
        ),
        _target("openwire", fuzz_openwire, "OpenWireSniffer.sniff: SniffError only, echo readable"),
        _target("core", fuzz_core, "CoreSniffer.sniff: SniffError only, replies grow; core packet decoders"),
        _target("tls", fuzz_tls, "tls_sni.parse_client_hello: ValueError only; TlsSniffer agrees"),
        _target("mqtt_broker", fuzz_mqtt_broker, "mqtt.parse_connack, parse_subscribed_value"),
        _target("amqp_broker", fuzz_amqp_broker, "amqp probe answer parsers and proxy preambles"),
        _target("amqp_value", fuzz_amqp_value, "amqp.decode_value, decode_performative"),
        _target("stomp_broker", fuzz_stomp_broker, "stomp.parse_server_frame"),
        _target("openwire_broker", fuzz_openwire_broker, "openwire probe answer parsers, proxy preamble"),
        _target("proxy_protocol", fuzz_proxy_protocol, "parse_proxy_header: SniffError only, re-encodes"),
        _target("refusal", fuzz_refusal, "parse_refusal: never raises, a refusal stays one"),
        _target("detect", fuzz_detect, "make_detector, looks_like: never raise, decide in 16 bytes"),
        _target("opening", fuzz_opening, "SniffBuffer over split reads: SniffError only, split-independent"),
        _target("users", fuzz_users, "UserStore.parse: UserStoreError only, passwords verify"),
        _target("event_frames", fuzz_event_frames, "event log frames: ValueError only, values = columns"),
        (
            "config",
            Target(
                fuzz=fuzz_config,
                corpus=CORPUS / "config",
                max_len=16 * 1024,
                dictionary=config_dictionary,
                checks="load_config_text: ConfigError only",
            ),
        ),
    )
)
"""Every target by name, in the order `fuzz/run` runs them."""
