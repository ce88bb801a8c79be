"""LEAST_CONNECTIONS end to end: a burst of clients spreads evenly over three real brokers.

Artemis reads broker-side counts every check period, so a burst between two checks would all
land on one broker; routerd also counts the connections it routes itself (SPEC A3).
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING

import pytest

from keys.mqtt import encode_connect
from tests.router.conftest import static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd

CLIENTS = 30


@pytest.mark.integration
def test_least_connections_spreads_a_burst_within_one(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> None:
    port = free_port()
    connectors, refs = static_connectors((f"b{i}", b.port) for i, b in enumerate(mosquitto_fleet))
    xml = f"""<core><connectors>{connectors}</connectors>
      <acceptors><acceptor name="a">tcp://127.0.0.1:{port}?router=lc</acceptor></acceptors>
      <connection-routers><connection-router name="lc"><policy name="LEAST_CONNECTIONS"/>
        <pool><check-period>60000</check-period><static-connectors>{refs}</static-connectors></pool>
      </connection-router></connection-routers></core>"""
    router = start_routerd(lambda _admin: xml)
    for _ in range(3):
        router.wait_for_log(r"router=lc target=b\d is ready")
    with contextlib.ExitStack() as stack:
        clients = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
            for _ in range(CLIENTS)
        ]
        for n, client in enumerate(clients):  # the burst: all connected before any CONNECT is answered
            client.sendall(encode_connect(f"lc-{n:02d}"))  # MQTT 3.1.1, clean session, keepalive 60
        for client in clients:
            assert client.recv(4) == b"\x20\x02\x00\x00"  # a real session on some broker
        status = router.get("/api/v1/routers/lc")
        assert isinstance(status, dict)
        counts = sorted(t["connections"] for t in status["pool"]["targets"])
    assert sum(counts) == CLIENTS
    assert counts[-1] - counts[0] <= 1, counts
