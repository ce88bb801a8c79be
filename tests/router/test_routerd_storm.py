"""Storm protection with a real routerd and real mosquitto brokers (issue 33): an acceptor's
`connectionRate` turns a burst of new connections into a ramp, on both data paths, without
closing any of them (the kernel's backlog holds them while routerd pauses accepting).

Every wait is bounded; routerd is stopped by its PID (tests/router/conftest.py)."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from keys import mqtt
from tests.conftest import free_port
from tests.router.conftest import acceptors_xml, broker_xml, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd

pytestmark = pytest.mark.integration

TIMEOUT_S = 20.0
RATE = 20
"""The acceptors' connectionRate: new connections a second."""
BURST = 2
CLIENTS = 50
"""One burst of clients, all connecting at once: at RATE a second they take about 2.4 s to get in."""


def _config(broker: Mosquitto, ports: dict[str, int]) -> str:
    connectors, refs = static_connectors([("m0", broker.port)])
    acceptors = acceptors_xml(
        {
            "fast": f"router=r;connectionRate={RATE};connectionBurst={BURST}",
            "trio": f"router=r;connectionRate={RATE};connectionBurst={BURST};fastPath=false",
        },
        ports,
    )
    routers = f"""
      <connection-router name="r">
        <key-type>SOURCE_IP</key-type>
        <policy name="FIRST_ELEMENT"/>
        <pool><check-period>1000</check-period><static-connectors>{refs}</static-connectors></pool>
      </connection-router>"""
    return broker_xml(connectors, acceptors, routers)


def _connect_at_once(port: int, count: int) -> list[float]:
    """Open `count` MQTT sessions through `port` at once (one thread each): the time each one's
    CONNACK came, from the start; every session must be accepted (none refused or closed)."""
    answered: list[float] = []
    errors: list[str] = []
    start = time.monotonic()
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
                sock.sendall(mqtt.encode_connect(f"storm-{i}"))
                reply = sock.recv(4)
                if reply[:1] != b"\x20" or reply[3:4] != b"\x00":
                    raise RuntimeError(f"no CONNACK 0: {reply!r}")
                with lock:
                    answered.append(time.monotonic() - start)
        except (OSError, RuntimeError) as exc:
            with lock:
                errors.append(f"client {i}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 2)
    assert errors == []
    return sorted(answered)


@pytest.mark.parametrize("acceptor", ["fast", "trio"])
def test_connection_rate_turns_a_burst_into_a_ramp_and_closes_nothing(
    acceptor: str, mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    ports = {"fast": free_port(), "trio": free_port()}
    router = start_routerd(lambda admin: _config(mosquitto_fleet[0], ports))
    router.wait_for_log(r"router=r target=m0 is ready", TIMEOUT_S)
    times = _connect_at_once(ports[acceptor], CLIENTS)
    assert len(times) == CLIENTS
    # BURST at once, then RATE a second: the last one is let in after (CLIENTS - BURST) / RATE s.
    assert times[-1] >= (CLIENTS - BURST) / RATE * 0.9
    for i, first in enumerate(times):
        in_a_second = sum(1 for t in times[i:] if t < first + 1.0)
        assert in_a_second <= RATE + BURST + 1, (first, times)
