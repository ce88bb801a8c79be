"""The load clients: the C load generator and echo server (built at run time), iperf3, probes.

`build_c_tools` compiles benchmarks/c/*.c with gcc -O2 -Wall into the run's work directory.
`Loadgen` runs `loadgen` in its three modes and parses its one-line JSON results. `run_iperf`
runs one iperf3 client. The MQTT helpers build CONNECT packets (MQTT 3.1.1 §3.1, MQTT 5 §3.1)
and read one CONNACK (§3.2), to check what a proxy does before measuring it. The CORE and AMQP
helpers (the artemis group) make loadgen's CORE opening from a captured Java client's
(`core_template`) and send one opening to see whether it is redirected (`probe_core_redirect`,
`probe_amqp_redirect`), with the project's own codecs (keys/core.py, keys/amqp.py).
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from keys import amqp, core
from keys.sniff import NEED_MORE, SniffError

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.fleet import Fleet

__all__ = [
    "CORE_CAPTURE",
    "C_SOURCES",
    "REDIRECTED",
    "REQUIRED_TOOLS",
    "ClientError",
    "CoreTemplate",
    "IdleResult",
    "Loadgen",
    "PingResult",
    "RateKind",
    "RateResult",
    "amqp_opening",
    "build_c_tools",
    "core_template",
    "find_tool",
    "load_capture",
    "mqtt_connect_packet",
    "parse_connack",
    "probe_amqp_redirect",
    "probe_connack",
    "probe_core_redirect",
    "run_iperf",
    "split_packet",
]

C_SOURCES: Final = Path(__file__).resolve().parent / "c"
REQUIRED_TOOLS: Final = ("haproxy", "iperf3", "mosquitto", "gcc")
"""Debian packages of the same names (plus libc6-dev for gcc's headers)."""

SOURCE_ADDRESSES: Final = 8
"""Connections are spread over 127.0.0.2 ... 127.0.0.9 (loopback aliases need no setup)."""

CONNACK: Final = 0x20
CONNECT: Final = 0x10
USE_ANOTHER_SERVER: Final = 0x9C
"""MQTT 5 reason code "Use another server" (§2.4, table 2-6): the redirect answer."""

MqttVersion = Literal["3.1.1", "5"]
RateKind = Literal["echo", "mqtt3", "mqtt5", "core", "amqp"]
"""What each connection of `loadgen rate` sends and expects (see benchmarks/c/loadgen.c)."""

CORE_CAPTURE: Final = (
    Path(__file__).resolve().parent.parent / "tests" / "keys" / "captures" / "v2-client-id.hex"
)
"""The Artemis 2.40 Java client's opening, captured (tests/keys/captures/README.md): `ARTEMIS`, two
PINGs, SUBSCRIBE_TOPOLOGY_V2, then CREATESESSION_V2 with user alice, password s3cret and client ID
client-42. loadgen sends it whole, each connection with its own client ID."""
AMQP_CREDENTIALS: Final = ("admin", "admin")
"""SASL PLAIN's user and password in loadgen's AMQP opening (benchmarks/c/loadgen.c)."""
REDIRECTED: Final = "redirect"
"""How the CORE and AMQP probes' answers start when the opening was redirected."""


class ClientError(RuntimeError):
    """A load client could not run (not: some connections failed; those are counted)."""


def find_tool(name: str) -> str | None:
    """The path of a program, also looking in the sbin directories a non-root PATH may lack."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def build_c_tools(workdir: Path) -> dict[str, Path]:
    """Compile loadgen.c and echo_srv.c into `workdir`.

    Returns:
        Program name -> path of the binary.

    Raises:
        ClientError: gcc is missing or failed (its output is in the message).
    """
    gcc = find_tool("gcc")
    if gcc is None:
        raise ClientError("gcc is not installed")
    built: dict[str, Path] = {}
    for name in ("loadgen", "echo_srv"):
        binary = workdir / name
        result = subprocess.run(
            [gcc, "-O2", "-Wall", "-o", str(binary), str(C_SOURCES / f"{name}.c")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise ClientError(f"gcc failed on {name}.c: {result.stderr.strip()}")
        built[name] = binary
    return built


def _number(doc: dict[str, object], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClientError(f"result field {key!r} is not a number: {value!r}")
    return float(value)


def _parse_line(line: str, what: str) -> dict[str, object]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ClientError(f"{what}: unreadable result {line[:200]!r}") from exc
    if not isinstance(doc, dict):
        raise ClientError(f"{what}: result is not an object: {line[:200]!r}")
    return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class RateResult:
    """One `loadgen rate` run."""

    ok: int
    """Connections that got the expected reply."""
    errors: int
    unfinished: int
    """Still in flight when the time bound ended the run."""
    seconds: float
    rate: float
    """ok / seconds."""
    conn_p50_us: float
    """Connect to reply, per connection."""
    conn_p99_us: float
    last_error: str

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> RateResult:
        """Read the result line of `loadgen rate`."""
        return cls(
            ok=int(_number(doc, "ok")),
            errors=int(_number(doc, "errors")),
            unfinished=int(_number(doc, "unfinished")),
            seconds=_number(doc, "seconds"),
            rate=_number(doc, "rate"),
            conn_p50_us=_number(doc, "conn_p50_us"),
            conn_p99_us=_number(doc, "conn_p99_us"),
            last_error=str(doc.get("last_error", "")),
        )

    def details(self) -> dict[str, object]:
        """For the JSON file."""
        return {
            "ok": self.ok,
            "errors": self.errors,
            "unfinished": self.unfinished,
            "seconds": round(self.seconds, 3),
            "conn_p50_us": self.conn_p50_us,
            "conn_p99_us": self.conn_p99_us,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PingResult:
    """One `loadgen ping` run: round-trip times over one connection, in microseconds."""

    count: int
    errors: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float
    last_error: str

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> PingResult:
        """Read the result line of `loadgen ping`."""
        count = int(_number(doc, "count"))
        if count == 0:
            return cls(
                count=0, errors=1, p50_us=0, p90_us=0, p99_us=0, max_us=0, mean_us=0,
                last_error=str(doc.get("last_error", "")),
            )  # fmt: skip
        return cls(
            count=count,
            errors=int(_number(doc, "errors")),
            p50_us=_number(doc, "p50_us"),
            p90_us=_number(doc, "p90_us"),
            p99_us=_number(doc, "p99_us"),
            max_us=_number(doc, "max_us"),
            mean_us=_number(doc, "mean_us"),
            last_error=str(doc.get("last_error", "")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleResult:
    """`loadgen idle`: how many connections are open end to end, and how long opening took."""

    open: int
    errors: int
    seconds: float
    last_error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreTemplate:
    """loadgen's CORE opening (`-o HEX -O OFFSET`): a captured opening without its client ID."""

    head: bytes
    """The opening up to its CREATESESSION_V2's last field, the nullable client ID."""
    length_at: int
    """Offset of the CREATESESSION_V2's int32 length field, which loadgen fixes per connection."""

    def opening(self, client_id: str) -> bytes:
        """The whole opening with `client_id`, as loadgen sends it."""
        field = b"\x01" + core.encode_string(client_id)
        packet_length = len(self.head) + len(field) - self.length_at - 4
        head = bytearray(self.head)
        head[self.length_at : self.length_at + 4] = packet_length.to_bytes(4, "big")
        return bytes(head) + field


def load_capture(path: Path = CORE_CAPTURE) -> bytes:
    """A capture file: its hex lines that are not comments, joined (tests/keys/captures/README.md)."""
    lines = path.read_text().splitlines()
    return bytes.fromhex("".join(line for line in lines if line and not line.startswith("#")))


def core_template(opening: bytes) -> CoreTemplate:
    """Cut a whole CORE opening (magic, packets, CREATESESSION_V2 last) before its client ID.

    Raises:
        ValueError: not an opening that ends with a CREATESESSION_V2 with a client ID.
    """
    try:
        parsed = core.parse_opening(opening)
    except SniffError as exc:
        raise ValueError(f"not a CORE opening: {exc}") from exc
    if parsed is NEED_MORE or parsed.session is None or parsed.end != len(opening):
        raise ValueError("the opening must end with its whole CREATESESSION(_V2)")
    client_id = parsed.session.client_id
    if client_id is None:
        raise ValueError("the opening's CREATESESSION has no client ID")
    field = b"\x01" + core.encode_string(client_id)
    if not opening.endswith(field):
        raise ValueError("the client ID is not the opening's last field (a CREATESESSION_V2 ends with it)")
    pos = len(core.ARTEMIS_MAGIC)
    while True:
        packet = core.parse_packet(opening, pos)
        if packet is NEED_MORE:
            raise ValueError("the opening ends inside a packet")
        if packet.end == len(opening):
            return CoreTemplate(head=opening[: -len(field)], length_at=packet.start)
        pos = packet.end


def amqp_opening(container_id: str) -> bytes:
    """SASL header, sasl-init PLAIN, AMQP header, Open with `container_id`: what loadgen's amqp
    kind sends (with a container-id-only Open)."""
    user, password = AMQP_CREDENTIALS
    return (
        amqp.SASL_HEADER
        + amqp.encode_sasl_init("PLAIN", amqp.sasl_plain_response(user, password))
        + amqp.AMQP_HEADER
        + amqp.encode_open(container_id)
    )


def _exchange(port: int, data: bytes, verdict: Callable[[bytes], str | None], timeout: float) -> str:
    """Send `data` to 127.0.0.1:port and read until `verdict` of what came back is not None.

    Returns:
        The verdict, "closed" or "closed after N bytes" when the peer closed first, "timeout".
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(data)
            got = b""
            deadline = time.monotonic() + timeout
            while True:
                answer = verdict(got)
                if answer is not None:
                    return answer
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                sock.settimeout(remaining)
                chunk = sock.recv(4096)
                if not chunk:
                    return f"closed after {len(got)} bytes" if got else "closed"
                got += chunk
    except TimeoutError:
        return "timeout"
    except ConnectionError:
        return "closed"


def _core_verdict(data: bytes) -> str | None:
    """What the server's packets so far say about a CORE opening: None until they say something."""
    redirect: core.CoreDisconnect | None = None
    pos = 0
    try:
        while True:
            packet = core.parse_packet(data, pos, max_size=1 << 20)
            if packet is NEED_MORE:
                return None
            if packet.type == core.PacketType.DISCONNECT_V3:
                redirect = core.decode_disconnect(packet)
            elif packet.type == core.PacketType.EXCEPTION:
                exception = core.decode_exception(packet)
                if redirect is not None and exception.code == core.ROUTING_EXCEPTION and redirect.connector:
                    return f"{REDIRECTED} to {redirect.connector.describe()}"
                return exception.describe()
            elif packet.type == core.PacketType.CREATESESSION_RESP:
                return "CREATESESSION_RESP: the session was created"
            pos = packet.end
    except SniffError as exc:
        return f"bad reply: {exc}"


def probe_core_redirect(port: int, opening: bytes, *, timeout: float = 5.0) -> str:
    """Send a whole CORE opening and say what came back.

    Returns:
        "redirect to TransportConfiguration(...)" for DISCONNECT_V3 with a connector and then
        EXCEPTION 222; else the EXCEPTION (e.g. "EXCEPTION 222 (ROUTING_EXCEPTION): AMQ229238 ... not
        ready"), "CREATESESSION_RESP: ...", "closed", "timeout" or "bad reply: ...".
    """
    return _exchange(port, opening, _core_verdict, timeout)


def _amqp_verdict(data: bytes) -> str | None:
    try:
        close = amqp.parse_broker_close(data)
    except SniffError as exc:
        return f"bad reply: {exc}"
    if close is NEED_MORE:
        return None
    if close.condition == "amqp:connection:redirect":
        return f"{REDIRECTED}: {close.description}"
    return f"Close {close.condition}: {close.description}"


def probe_amqp_redirect(port: int, container_id: str, *, timeout: float = 5.0) -> str:
    """Send `amqp_opening(container_id)` and say what came back.

    Returns:
        "redirect: DESCRIPTION" for a Close amqp:connection:redirect; else "Close CONDITION: ...",
        "closed", "timeout" or "bad reply: ..." (a sasl-outcome other than ok is one).
    """
    return _exchange(port, amqp_opening(container_id), _amqp_verdict, timeout)


class Loadgen:
    """Runs the compiled `loadgen` against 127.0.0.1 ports."""

    def __init__(self, binary: Path, fleet: Fleet) -> None:
        self.binary = binary
        self.fleet = fleet

    def _run(self, args: list[str], timeout: float, what: str) -> dict[str, object]:
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise ClientError(f"{what}: loadgen exited {result.returncode}: {result.stderr.strip()[:300]}")
        return _parse_line(result.stdout.strip(), what)

    def rate(
        self,
        port: int,
        *,
        kind: RateKind,
        concurrency: int,
        total: int,
        seconds: float,
        reason: int = 0,
        id_prefix: str = "bench",
        sources: int = SOURCE_ADDRESSES,
        core_opening: CoreTemplate | None = None,
    ) -> RateResult:
        """Short connections: connect, one request, one reply, close; bounded by count and time.

        Raises:
            ClientError: loadgen failed, or the kind is "core" without `core_opening`.
        """
        args = ["rate", "-a", "127.0.0.1", "-p", str(port), "-c", str(concurrency), "-n", str(total)]
        args += ["-t", f"{seconds:g}", "-k", kind, "-r", str(reason), "-s", str(sources), "-i", id_prefix]
        if kind == "core":
            if core_opening is None:
                raise ClientError("loadgen's core kind needs the opening to send (core_template)")
            args += ["-o", core_opening.head.hex(), "-O", str(core_opening.length_at)]
        return RateResult.from_json(self._run(args, seconds + 30, f"rate {kind} on port {port}"))

    def ping(self, port: int, *, count: int, seconds: float, size: int = 16, warmup: int = 200) -> PingResult:
        """Request/response round trips over one connection."""
        args = ["ping", "-a", "127.0.0.1", "-p", str(port), "-n", str(count), "-t", f"{seconds:g}"]
        args += ["-z", str(size), "-w", str(warmup)]
        return PingResult.from_json(self._run(args, seconds + 30, f"ping on port {port}"))

    def open_idle(
        self, port: int, *, count: int, seconds: float
    ) -> tuple[subprocess.Popen[bytes], IdleResult]:
        """Open `count` connections end to end and keep them; stop the process to close them.

        Returns:
            The running helper (pass it to `Fleet.stop`) and what it opened.

        Raises:
            ClientError: no result line within `seconds` plus a margin.
        """
        args = ["idle", "-a", "127.0.0.1", "-p", str(port), "-n", str(count), "-c", "200"]
        args += ["-t", f"{seconds:g}", "-s", str(SOURCE_ADDRESSES)]
        proc = self.fleet.start_helper(f"loadgen-idle-{port}", [str(self.binary), *args])
        assert proc.stdout is not None, "started with stdout=PIPE"
        ready, _, _ = select.select([proc.stdout], [], [], seconds + 30)
        line = proc.stdout.readline().decode(errors="replace") if ready else ""
        if not line:
            self.fleet.stop(proc)
            raise ClientError(
                f"idle on port {port}: no result from loadgen ({self.fleet.tail(f'loadgen-idle-{port}')})"
            )
        doc = _parse_line(line.strip(), f"idle on port {port}")
        return proc, IdleResult(
            open=int(_number(doc, "ok")),
            errors=int(_number(doc, "errors")),
            seconds=_number(doc, "seconds"),
            last_error=str(doc.get("last_error", "")),
        )


def run_iperf(
    port: int, *, streams: int, seconds: float, retries: int = 5
) -> tuple[float, dict[str, object]]:
    """One iperf3 client run to 127.0.0.1:port; the receiver's throughput.

    iperf3's server runs one test at a time and answers "busy" to a client that comes too soon
    after the previous test; such runs are retried after a pause.

    Returns:
        (Gbit/s received, details for the JSON file).

    Raises:
        ClientError: iperf3 is missing or failed.
    """
    iperf3 = find_tool("iperf3")
    if iperf3 is None:
        raise ClientError("iperf3 is not installed")
    argv = [iperf3, "-c", "127.0.0.1", "-p", str(port), "-t", f"{seconds:g}", "-P", str(streams), "-J"]
    argv += ["--connect-timeout", "5000"]
    error = ""
    for attempt in range(retries):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
        try:
            doc = json.loads(result.stdout)
        except json.JSONDecodeError:
            doc = {
                "error": (result.stderr or result.stdout).strip()[:300] or f"exit status {result.returncode}"
            }
        error = str(doc.get("error", "")) if isinstance(doc, dict) else "not a JSON object"
        if not error and isinstance(doc, dict):
            end = doc.get("end")
            received = end.get("sum_received") if isinstance(end, dict) else None
            bps = received.get("bits_per_second") if isinstance(received, dict) else None
            if isinstance(bps, int | float) and bps > 0:
                sent = end.get("sum_sent") if isinstance(end, dict) else None
                retransmits = sent.get("retransmits") if isinstance(sent, dict) else None
                return bps / 1e9, {
                    "streams": streams,
                    "seconds": seconds,
                    "retransmits": retransmits,
                    "attempts": attempt + 1,
                }
            error = "no sum_received in iperf3's JSON"
        time.sleep(0.5 + attempt)
    raise ClientError(f"iperf3 to port {port} failed {retries} times; last error: {error}")


def _varint(value: int) -> bytes:
    """MQTT variable byte integer (MQTT 5 §1.5.5; 3.1.1 §2.2.3 "remaining length")."""
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def mqtt_connect_packet(client_id: str, version: MqttVersion) -> bytes:
    """A clean-session CONNECT with keep-alive 60 s and no will, user or password.

    The same bytes as loadgen's (benchmarks/c/loadgen.c, `build_request`).
    """
    cid = client_id.encode()
    body = b"\x00\x04MQTT" + bytes([5 if version == "5" else 4, 0x02]) + (60).to_bytes(2, "big")
    if version == "5":
        body += b"\x00"  # property length (MQTT 5 §3.1.2.11)
    body += len(cid).to_bytes(2, "big") + cid
    return bytes([CONNECT]) + _varint(len(body)) + body


def split_packet(data: bytes | bytearray) -> tuple[int, bytes, int] | None:
    """The first complete packet of `data`: (first byte, body, length used), or None if incomplete.

    Raises:
        ValueError: the remaining length is malformed.
    """
    remaining, multiplier, index = 0, 1, 1
    while True:
        if index >= len(data):
            return None
        if index > 4:
            raise ValueError("remaining length exceeds 4 bytes")
        byte = data[index]
        remaining += (byte & 0x7F) * multiplier
        multiplier *= 128
        index += 1
        if not byte & 0x80:
            break
    end = index + remaining
    if len(data) < end:
        return None
    return data[0], bytes(data[index:end]), end


def parse_connack(data: bytes) -> int | None:
    """The return code (3.1.1) or reason code (5) of a complete CONNACK at the start of `data`.

    Returns:
        The code, or None when `data` does not hold a complete CONNACK yet.

    Raises:
        ValueError: `data` starts with another packet, or a malformed one.
    """
    if not data:
        return None
    if data[0] != CONNACK:
        raise ValueError(f"expected a CONNACK, got packet byte 0x{data[0]:02x}")
    packet = split_packet(data)
    if packet is None:
        return None
    body = packet[1]
    if len(body) < 2:
        raise ValueError(f"CONNACK remaining length {len(body)} < 2")
    return body[1]


def probe_connack(port: int, client_id: str, version: MqttVersion, *, timeout: float = 5.0) -> str:
    """Send one CONNECT to 127.0.0.1:port and say what came back.

    Returns:
        "connack 0x.." for a CONNACK, "closed" when the connection was closed or reset without
        one, "timeout" when nothing complete arrived in time, or "bad reply: ...".
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(mqtt_connect_packet(client_id, version))
            data = b""
            deadline = time.monotonic() + timeout
            while True:
                try:
                    code = parse_connack(data)
                except ValueError as exc:
                    return f"bad reply: {exc}"
                if code is not None:
                    if code == 0:
                        sock.sendall(b"\xe0\x00")  # DISCONNECT
                    return f"connack 0x{code:02x}"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                sock.settimeout(remaining)
                chunk = sock.recv(512)
                if not chunk:
                    return "closed"
                data += chunk
    except TimeoutError:
        return "timeout"
    except ConnectionError:
        return "closed"
