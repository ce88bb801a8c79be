"""Helpers shared by the sniffer tests (`from tests.keys.conftest import …`).

A one-connection server on 127.0.0.1 plays the router's side of a handshake with a live client
(`OneConnectionServer`, `read_until_sniffed`); the fuzz tests of STYLE R10 share `sniff_outcome`
(a result or the SniffError, anything else fails the test), `assert_sniff_outcome` and `mutate`.
"""

from __future__ import annotations

import socket
import threading
from typing import TYPE_CHECKING, TypeVar

from keys.sniff import NeedMore, Reply, Sniffed, SniffError
from tests.conftest import free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from keys.sniff import Sniffer

T = TypeVar("T")


class OneConnectionServer:
    """A one-connection server in a thread, for the router's side of a handshake.

    `handle` gets the accepted socket (closed afterwards); what it raises, `join` raises.
    """

    def __init__(self, handle: Callable[[socket.socket], None], *, timeout_s: float) -> None:
        self._listener = socket.create_server(("127.0.0.1", free_port()))
        self._listener.settimeout(timeout_s)
        self.port: int = self._listener.getsockname()[1]
        self._handle = handle
        self._timeout_s = timeout_s
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            conn, _ = self._listener.accept()
            with conn:
                conn.settimeout(self._timeout_s)
                self._handle(conn)
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            self._listener.close()

    def join(self) -> None:
        self._thread.join(self._timeout_s)
        assert not self._thread.is_alive(), "server thread still running"
        if self.error is not None:
            raise self.error


def read_until_sniffed(conn: socket.socket, sniffer: Sniffer) -> tuple[bytes, Sniffed, bytes]:
    """What the router does (router/core/opening.py): send each new part of a Reply, stop at Sniffed.

    Returns:
        The bytes read, the result, and the reply bytes sent to the client so far.
    """
    buf, sent = b"", b""
    while True:
        result = sniffer.sniff(buf)
        if isinstance(result, Sniffed):
            return buf, result, sent
        if isinstance(result, Reply) and len(result.to_client) > len(sent):
            conn.sendall(result.to_client[len(sent) :])
            sent = result.to_client
        chunk = conn.recv(4096)
        assert chunk, f"client closed after {len(buf)} bytes"
        buf += chunk


def sniff_outcome(parse: Callable[[bytes], T], data: bytes) -> T | SniffError:
    """What `parse(data)` returns, or the SniffError it raises; any other exception propagates and
    fails the test."""
    try:
        return parse(data)
    except SniffError as exc:
        return exc


def assert_sniff_outcome(sniffer: Sniffer, data: bytes) -> None:
    """`sniffer.sniff(data)` returns what the contract allows or raises a SniffError naming it."""
    result = sniff_outcome(sniffer.sniff, data)
    assert isinstance(result, (Sniffed, Reply, NeedMore, SniffError))
    assert not isinstance(result, SniffError) or result.protocol == sniffer.name


def mutate(frame: bytes, edits: Iterable[tuple[int, int]]) -> bytes:
    """`frame` with each (index, byte) edit applied, the index taken modulo the frame's length."""
    mutated = bytearray(frame)
    for index, value in edits:
        mutated[index % len(mutated)] = value
    return bytes(mutated)
