"""A real routerd's admin API under abuse (issue #30's security findings): slow connections do not
starve /healthz and /readyz, wrong tokens are slowed per address, an absurd Content-Length is
answered at once."""

from __future__ import annotations

import re
import select
import socket
import time
from typing import TYPE_CHECKING

import pytest

from router.core.admin_access import AUTH_FREE_FAILURES, HEAD_TIMEOUT_S, MAX_REQUEST_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.router.conftest import Routerd

RIGHT = "k" * 32
"""The operator token of the routerd these tests start."""


def _config(port: int) -> Callable[[int], str]:
    """A routerd configuration with one acceptor and a router without a pool (ready at once)."""

    def make(_admin_port: int) -> str:
        return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <acceptors><acceptor name="a">tcp://127.0.0.1:{port}?router=r</acceptor></acceptors>
  <connection-routers>
   <connection-router name="r"><key-type>CLIENT_ID</key-type></connection-router>
  </connection-routers>
 </core>
</configuration>
"""

    return make


def _start(tmp_path: Path, start_routerd: Callable[..., Routerd], free_port: Callable[[], int]) -> Routerd:
    tokens = tmp_path / "admin-tokens"
    tokens.write_text(f"oncall operator {RIGHT}\n")
    tokens.chmod(0o600)
    return start_routerd(_config(free_port()), "--admin-tokens", str(tokens))


def _http(port: int, request: bytes, *, source: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, bytes]:
    """Send `request` from `source` and read the answer to its end: (status, body); (0, b"") when
    the connection was closed without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    return (int(match[1]), answer.partition(b"\r\n\r\n")[2]) if match else (0, b"")


def _get(path: str, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode()


@pytest.mark.integration
def test_admin_health_checks_answer_every_second_while_64_slow_connections_are_held(
    tmp_path: Path, start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario (security review): 64 connections from one address send half a request line or
    nothing and hold on, opened again whenever routerd closes one, for 30 s; meanwhile /healthz and
    /readyz, asked once a second from that same address, each answer 200 within 1 s every time
    (before: 16 such connections made both fail for as long as they lasted)."""
    router = _start(tmp_path, start_routerd, free_port)
    port = router.admin_port
    slow: list[socket.socket] = []

    def open_slow(i: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        if i % 2:
            sock.sendall(b"GET /api/v1/sta")
        return sock

    reopened = 0
    late: list[tuple[str, float, int]] = []
    try:
        slow = [open_slow(i) for i in range(64)]
        start = time.monotonic()
        next_probe = start
        while time.monotonic() - start < 30.0:
            closed, _, _ = select.select(slow, [], [], 0.05)
            for sock in closed:  # routerd closed it (its place went to a newer one): open it again
                i = slow.index(sock)
                sock.close()
                slow[i] = open_slow(i)
                reopened += 1
            if time.monotonic() >= next_probe:
                next_probe += 1.0
                for path in ("/healthz", "/readyz"):
                    asked = time.monotonic()
                    try:
                        status, _ = _http(port, _get(path), timeout=1.0)
                    except OSError:
                        status = 0
                    took = time.monotonic() - asked
                    if status != 200 or took > 1.0:
                        late.append((path, round(took, 3), status))
    finally:
        for sock in slow:
            sock.close()
    assert late == [], late
    assert reopened >= 60  # the slow ones were being closed, and came back
    metrics = _http(port, _get("/metrics", RIGHT))[1].decode()
    assert re.search(r"^router_admin_connections_displaced_total \d+", metrics, re.MULTILINE)


@pytest.mark.integration
def test_admin_silent_connection_is_closed_after_the_head_deadline(
    tmp_path: Path, start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    router = _start(tmp_path, start_routerd, free_port)
    with socket.create_connection(("127.0.0.1", router.admin_port), timeout=HEAD_TIMEOUT_S + 5) as sock:
        sock.sendall(b"GET /hea")
        start = time.monotonic()
        assert sock.recv(1024) == b""
        assert HEAD_TIMEOUT_S - 0.5 < time.monotonic() - start < HEAD_TIMEOUT_S + 4


def _rate(port: int, seconds: float, token: str = "w" * 32) -> tuple[int, float]:
    """Wrong-token requests sent one after another for `seconds`: (how many, per second); each
    must be a 401."""
    count, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        status, _ = _http(port, _get("/api/v1/status", token), timeout=10)
        assert status == 401
        count += 1
    return count, count / elapsed


@pytest.mark.integration
def test_admin_wrong_tokens_are_slowed_per_address_and_counted(
    tmp_path: Path, start_routerd: Callable[..., Routerd], free_port: Callable[[], int]
) -> None:
    """Scenario (security review): wrong tokens from one address got about 900 answers a second.
    Now the first few are answered at once, then that address waits longer and longer; the right
    token from another address is answered at once; each failure is counted and logged."""
    router = _start(tmp_path, start_routerd, free_port)
    port = router.admin_port
    start = time.monotonic()
    for _ in range(AUTH_FREE_FAILURES):
        assert _http(port, _get("/api/v1/status", "w" * 32))[0] == 401
    free_rate = AUTH_FREE_FAILURES / (time.monotonic() - start)
    sent, slowed_rate = _rate(port, 5.0)
    print(f"wrong tokens/s: first {AUTH_FREE_FAILURES}: {free_rate:.0f}; then over 5 s: {slowed_rate:.2f}")
    assert free_rate > 20
    assert slowed_rate < 2.0  # 0.1 s, 0.2 s, 0.4 s, ... then 2 s each
    asked = time.monotonic()
    status, body = _http(port, _get("/api/v1/status", RIGHT), source="127.0.0.2")
    assert status == 200, body
    assert time.monotonic() - asked < 0.5  # another address is not slowed
    assert _http(port, _get("/healthz"))[0] == 200  # nor is the health check, from anywhere
    metrics = _http(port, _get("/metrics", RIGHT), source="127.0.0.2")[1].decode()
    failures = AUTH_FREE_FAILURES + sent
    assert re.search(rf"^router_admin_auth_failures_total {failures}\.0$", metrics, re.MULTILINE), metrics
    router.wait_for_log(
        r"WARNING router\.admin: admin request without a valid token from 127\.0\.0\.1:\d+: "
        r"GET /api/v1/status -> 401 \(\d+ from 127\.0\.0\.1 in 60 s; its requests now wait [\d.]+ s\)"
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("length", "status", "error"),
    [
        ("100000000000000000000", 413, f"request body over {MAX_REQUEST_BYTES} bytes"),
        ("10000000000000000000", 413, f"request body over {MAX_REQUEST_BYTES} bytes"),
        (str(MAX_REQUEST_BYTES + 1), 413, f"request body over {MAX_REQUEST_BYTES} bytes"),
        ("1e20", 400, "Content-Length must be one decimal length, got '1e20'"),
        ("-1", 400, "Content-Length must be one decimal length, got '-1'"),
    ],
)
def test_admin_absurd_content_length_is_answered_at_once(
    tmp_path: Path,
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
    length: str,
    status: int,
    error: str,
) -> None:
    """Scenario (security review): a Content-Length of 10^20 waited out the 10 s request deadline
    instead of the documented 413."""
    router = _start(tmp_path, start_routerd, free_port)
    request = (
        f"PUT /api/v1/event-log HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {RIGHT}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    asked = time.monotonic()
    got, body = _http(router.admin_port, request, timeout=5)
    assert time.monotonic() - asked < 1.0
    assert got == status, body
    assert body.decode().startswith(f'{{"error": "{error}')
