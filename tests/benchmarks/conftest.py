"""The benchmark harness is not an installed package: make `import benchmarks` find it here.

`python -m benchmarks.run` runs from the repository root, which puts the root on `sys.path`;
pytest in importlib mode does not, so these tests do. Also: `fake_broker`, a server that answers
an MQTT client's CONNECT (or any opening) with fixed bytes, and `recording_broker`, the same that
also keeps what each connection sent first.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.fleet import pick_ports  # noqa: E402 - needs ROOT on sys.path


class _FakeBroker:
    """Answers every connection's first bytes with one fixed reply (None: closes), on a port of the
    benchmark range."""

    def __init__(self, reply: bytes | None) -> None:
        (self.port,) = pick_ports(1)
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._reply = reply
        self.received: list[bytes] = []
        """What each connection sent in its first read (an opening sent whole arrives whole)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                self.received.append(conn.recv(4096))
                if self._reply is None:
                    continue
                conn.sendall(self._reply)
                with contextlib.suppress(OSError):
                    while conn.recv(1024):
                        pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._server.close()


@pytest.fixture
def fake_broker() -> Iterator[Callable[[bytes | None], int]]:
    """Start a fake broker with a reply (None: close after the CONNECT); gives its port."""
    brokers: list[_FakeBroker] = []

    def start(reply: bytes | None) -> int:
        brokers.append(_FakeBroker(reply))
        return brokers[-1].port

    yield start
    for broker in brokers:
        broker.close()


@pytest.fixture
def recording_broker() -> Iterator[Callable[[bytes | None], _FakeBroker]]:
    """Like `fake_broker`, but gives the broker: its `port`, and `received`, each connection's first
    bytes."""
    brokers: list[_FakeBroker] = []

    def start(reply: bytes | None) -> _FakeBroker:
        brokers.append(_FakeBroker(reply))
        return brokers[-1]

    yield start
    for broker in brokers:
        broker.close()
