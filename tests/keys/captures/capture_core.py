"""Capture what the real Artemis Java client sends to a CORE router (tests/keys/captures/README.md).

A loopback server plays the router's part with keys/core.py's own answers (`CoreSniffer`, then
`encode_refusal` / `encode_redirect`), and `CoreCapture.java`, compiled here with javac, connects
the Artemis JMS client to it once per scenario. The client's bytes up to its first
CREATESESSION(_V2) are written to `<scenario>.hex` (one packet a line), and what happened to
`<scenario>.txt`. Run from the repository root:

    mvn -q dependency:copy -Dartifact=org.apache.activemq:artemis-jms-client-all:2.40.0 \
        -DoutputDirectory=/tmp/core-jars
    PYTHONPATH=. .venv/bin/python tests/keys/captures/capture_core.py \
        /tmp/core-jars/artemis-jms-client-all-2.40.0.jar

Only 127.0.0.1 is used. Not run by the test suite (it needs the jar and a JDK).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from keys import NEED_MORE, Reply, Sniffed
from keys.core import (
    CoreSniffer,
    encode_redirect,
    encode_refusal,
    parse_opening,
    parse_packet,
    server_preamble,
)

HERE = Path(__file__).resolve().parent
SNIFFER = CoreSniffer()
READ_AFTER_ANSWER_S = 1.0
"""How long the server keeps reading after its answer (the client's reaction)."""


@dataclass
class Seen:
    """What one server connection saw."""

    raw: bytes = b""
    """Every byte the client sent, in order."""
    sniffed: Sniffed | None = None
    opening_end: int = 0
    """Offset after the first CREATESESSION(_V2)."""
    after: list[str] = field(default_factory=list)
    """The packets the client sent after the server's answer, by type and channel."""
    error: str | None = None


def serve_one(listener: socket.socket, answer: str, seen: Seen, redirect_port: int = 0) -> None:
    """Accept one connection, answer the opening as the router would, then `answer` it:
    "use-another" (EXCEPTION 119), "unavailable" (EXCEPTION 222, connection left open) or
    "redirect" (DISCONNECT_V3 + EXCEPTION 222 to `redirect_port`)."""
    try:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            sent = b""
            while True:
                result = SNIFFER.sniff(seen.raw)
                if isinstance(result, Sniffed):
                    break
                if isinstance(result, Reply) and len(result.to_client) > len(sent):
                    conn.sendall(result.to_client[len(sent) :])
                    sent = result.to_client
                chunk = conn.recv(65536)
                if not chunk:
                    raise EOFError(f"client closed after {len(seen.raw)} bytes")
                seen.raw += chunk
            seen.sniffed = result
            opening = parse_opening(seen.raw)
            assert opening is not NEED_MORE
            assert opening.session is not None
            seen.opening_end = opening.end
            words = server_preamble(seen.raw)[len(sent) :]
            if answer == "redirect":
                words += encode_redirect(
                    router="r1", connector_name="b2", host="127.0.0.1", port=redirect_port
                )
            else:
                words += encode_refusal("r1", unavailable=answer == "unavailable")
            conn.sendall(words)
            conn.settimeout(0.05)
            answered_again = 0
            deadline = time.monotonic() + READ_AFTER_ANSWER_S
            while time.monotonic() < deadline:
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                seen.raw += chunk
                if answer == "unavailable":
                    # Each re-sent CREATESESSION_V2 is answered the same way, as Artemis does.
                    again = _packets_after(seen.raw, seen.opening_end).count(_CREATESESSION_V2)
                    for _ in range(again - answered_again):
                        conn.sendall(encode_refusal("r1", unavailable=True))
                    answered_again = again
            seen.after = _summary(_packets_after(seen.raw, seen.opening_end))
    except Exception as exc:  # reported in the .txt file
        seen.error = f"{type(exc).__name__}: {exc}"


_CREATESESSION_V2 = "type -18 channel 1"


def _packets_after(raw: bytes, pos: int) -> list[str]:
    names: list[str] = []
    while True:
        packet = parse_packet(raw, pos, max_size=1 << 20)
        if packet is NEED_MORE:
            return names
        names.append(f"type {packet.type} channel {packet.channel}")
        pos = packet.end


def _summary(names: list[str]) -> list[str]:
    """Runs of the same packet as "N x type T channel C"."""
    runs: list[tuple[str, int]] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    return [f"{count} x {name}" for name, count in runs]


def packet_lines(raw: bytes) -> list[str]:
    """The opening as hex, the magic on the first line and one packet a line."""
    lines = [raw[:7].hex()]
    pos = 7
    while pos < len(raw):
        packet = parse_packet(raw, pos, max_size=1 << 20)
        assert packet is not NEED_MORE
        lines.append(raw[pos : packet.end].hex())
        pos = packet.end
    return lines


def compile_client(jar: str, out: Path) -> None:
    subprocess.run(
        ["javac", "-cp", jar, "-d", str(out), str(HERE / "CoreCapture.java")], check=True, capture_output=True
    )


def run_client(
    jar: str, classes: Path, port: int, user: str, password: str, client_id: str, query: str
) -> str:
    url = f"tcp://127.0.0.1:{port}?{query}"
    if not client_id.isascii() or not client_id.isprintable():
        client_id = "utf16:" + client_id.encode("utf-16-be").hex()
    proc = subprocess.run(
        ["java", "-cp", f"{jar}:{classes}", "CoreCapture", url, user, password, client_id],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    shown = client_id if len(client_id) < 60 else f"{client_id[:20]}... ({len(client_id)} characters)"
    return f"$ CoreCapture {url} {user} {password} {shown}\n{proc.stdout}{proc.stderr[-2000:]}"


@dataclass(frozen=True)
class Scenario:
    name: str
    user: str
    password: str
    client_id: str
    answer: str
    query: str = "reconnectAttempts=0"


SCENARIOS = (
    Scenario("v2-client-id", "alice", "s3cret", "client-42", "use-another"),
    Scenario("v2-no-client-id", "alice", "s3cret", "-", "use-another"),
    Scenario("v2-no-credentials", "-", "-", "client-42", "use-another"),
    Scenario("v2-unicode-client-id", "alice", "s3cret", "kl\u00fcnt-\u20ac-\U0001f600-\x00", "use-another"),
    Scenario("v2-long-client-id", "alice", "s3cret", "c" * 4095, "use-another"),
    Scenario("unavailable", "alice", "s3cret", "client-42", "unavailable"),
    Scenario("redirect", "alice", "s3cret", "client-42", "redirect", "reconnectAttempts=1"),
)


def listen() -> socket.socket:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    return listener


def write(name: str, seen: Seen, notes: str) -> None:
    sniffed = seen.sniffed
    head = [
        f"# {name}: the Artemis 2.40.0 Java client's opening, up to its first CREATESESSION(_V2)",
        "# made by tests/keys/captures/capture_core.py (see README.md); one packet a line",
    ]
    if sniffed is not None:
        head.append(
            f"# sniffed: client_id={sniffed.client_id!r} user_name={sniffed.user_name!r} "
            f"password={sniffed.password!r} protocol_version={sniffed.protocol_version!r}"
        )
    (HERE / f"{name}.hex").write_text("\n".join([*head, *packet_lines(seen.raw[: seen.opening_end])]) + "\n")
    (HERE / f"{name}.txt").write_text(notes)


def main(jar: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp)
        compile_client(jar, classes)
        for scenario in SCENARIOS:
            first, second = listen(), listen()
            seen, seen_after_redirect = Seen(), Seen()
            threads = [
                threading.Thread(
                    target=serve_one,
                    args=(first, scenario.answer, seen, second.getsockname()[1]),
                    daemon=True,
                )
            ]
            if scenario.answer == "redirect":
                threads.append(
                    threading.Thread(
                        target=serve_one, args=(second, "use-another", seen_after_redirect), daemon=True
                    )
                )
            for thread in threads:
                thread.start()
            output = run_client(
                jar,
                classes,
                first.getsockname()[1],
                scenario.user,
                scenario.password,
                scenario.client_id,
                scenario.query,
            )
            for thread in threads:
                thread.join(10)
            first.close()
            second.close()
            notes = [output, f"server: error={seen.error} packets after the answer: {seen.after}"]
            if scenario.answer == "redirect":
                target = seen_after_redirect
                notes.append(
                    f"redirect target: error={target.error} sniffed={target.sniffed} "
                    f"packets after the answer: {target.after}"
                )
                if seen_after_redirect.sniffed is not None:
                    write("after-redirect", seen_after_redirect, "\n".join(notes) + "\n")
            write(scenario.name, seen, "\n".join(notes) + "\n")
            print(f"{scenario.name}: {seen.sniffed}\n" + "\n".join(notes), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
