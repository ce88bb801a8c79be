"""Shared test configuration: hypothesis profiles (STYLE R10), and loopback ports for the tests
that start real components (`from tests.conftest import free_port, wait_port`).

`HYPOTHESIS_PROFILE=deep pytest …` runs every property with 2000 examples; the default `fast`
profile keeps the ordinary run quick.
"""

from __future__ import annotations

import os
import random
import socket
import time

from hypothesis import settings

settings.register_profile("fast", max_examples=100)
settings.register_profile("deep", max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


PORT_RANGE = (20000, 32000)
_used_ports: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, below the ephemeral range, not handed out before in this session."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(*PORT_RANGE)
        if port in _used_ports:
            continue
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _used_ports.add(port)
        return port
    raise RuntimeError("no free port found")


def wait_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    """Wait until something accepts on host:port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing accepts on {host}:{port} after {timeout} s") from None
            time.sleep(0.02)  # polling a port: nothing to await on another process's listen()
