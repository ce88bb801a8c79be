"""routerd in front of a real ActiveMQ Classic shared-store HA pair (SPEC Part B "HA awareness", seed 004).

Two ActiveMQ 5.17 brokers share one KahaDB directory (ENVIRONMENT.md §4, lock retry lowered to
200 ms): the one holding the file lock is active, the other waits with its ports closed. routerd
knows them as one cluster member, the HA-pair connector `(tcp://primary,tcp://backup)`, probed over
STOMP every CHECK_PERIOD_MS. The test kills the active broker with SIGKILL, measures the time until
a new STOMP client succeeds through the router, checks that the proxied connection to the dead
broker was closed, that a persistent message sent before the failover is consumed after it, and
that restarting the killed broker (now passive) changes nothing for clients.

`HA_FAILOVER_ROUNDS=5 .venv/bin/pytest tests/router/test_routerd_ha.py -s` repeats the failover
that many times, alternating the roles, and prints each time and the median (the closing note's
figures). Every wait is bounded.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import stomp  # type: ignore[import-untyped]  # stomp.py ships no type hints

from tests.conftest import ActiveMQ, accepts, closed_within, free_port, require_java

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.router.conftest import Routerd

CHECK_PERIOD_MS = 500
"""The pool's check-period: how often each member of the pair is probed."""
QUORUM_TIMEOUT_MS = 10_000
"""A client arriving while no member is active waits this long for the backup to take over."""
TIMEOUT_S = 30.0
"""Bound of every wait on a broker, a client or routerd."""
CLOSE_SLACK_S = 1.0
"""Scheduling slack on top of one check-period for the router to close a dead broker's clients."""
ROUNDS = int(os.environ.get("HA_FAILOVER_ROUNDS", "1"))
QUEUE = "/queue/ha.survivor"


def _config(pair: tuple[ActiveMQ, ActiveMQ], acceptor_port: int) -> str:
    primary, backup = pair
    return f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors>
    <connector name="pair-a">(tcp://127.0.0.1:{primary.stomp},tcp://127.0.0.1:{backup.stomp})?nodeId=ha-a;probe=stomp</connector>
  </connectors>
  <acceptors>
    <acceptor name="stomp">tcp://127.0.0.1:{acceptor_port}?router=ha;protocols=STOMP</acceptor>
  </acceptors>
  <cluster-connections>
    <cluster-connection name="fleet">
      <connector-ref>pair-a</connector-ref>
      <static-connectors><connector-ref>pair-a</connector-ref></static-connectors>
    </cluster-connection>
  </cluster-connections>
  <connection-routers>
    <connection-router name="ha">
      <key-type>CLIENT_ID</key-type>
      <policy name="FIRST_ELEMENT"/>
      <pool>
        <check-period>{CHECK_PERIOD_MS}</check-period>
        <quorum-timeout>{QUORUM_TIMEOUT_MS}</quorum-timeout>
        <cluster-connection>fleet</cluster-connection>
      </pool>
    </connection-router>
  </connection-routers>
</core></configuration>"""


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ActiveMQ, ActiveMQ]]:
    """The shared-store pair, first one active, second one passive; both stopped at the end."""
    require_java()
    store = tmp_path / "shared-kahadb"
    brokers = (
        ActiveMQ("ha-1", tmp_path / "ha-1", shared_store=store),
        ActiveMQ("ha-2", tmp_path / "ha-2", shared_store=store),
    )
    try:
        brokers[0].start()
        brokers[0].wait_ready()
        brokers[1].start()
        brokers[1].wait_passive()
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


def _stomp_connect(port: int, client_id: str, timeout: float = TIMEOUT_S) -> socket.socket:
    """A raw STOMP 1.2 CONNECT through the router; returns the socket once CONNECTED arrives.

    Raises:
        ConnectionError: the router or broker answered anything else, or closed.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(
            f"CONNECT\naccept-version:1.2\nhost:localhost\nclient-id:{client_id}\nheart-beat:0,0\n\n\x00".encode()
        )
        answer = b""
        while b"\x00" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"closed after {answer!r}")
            answer += chunk
        if not answer.startswith(b"CONNECTED"):
            raise ConnectionError(answer.decode(errors="replace"))
    except BaseException:
        sock.close()
        raise
    return sock


def _time_until_client_succeeds(port: int, since: float) -> float:
    """Seconds from `since` until a new client gets CONNECTED through the router (retrying)."""
    deadline = since + TIMEOUT_S
    attempt = 0
    while True:
        attempt += 1
        try:
            _stomp_connect(port, f"after-failover-{attempt}").close()
            return time.monotonic() - since
        except (OSError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # the router refused or closed at once: try again, as a client would


def _port_opened_after(port: int, since: float, result: list[float]) -> None:
    """Poll `port` (every 10 ms) until it accepts; append seconds since `since` (thread target)."""
    deadline = since + TIMEOUT_S
    while time.monotonic() < deadline:
        if accepts(port):
            result.append(time.monotonic() - since)
            return
        time.sleep(0.01)  # another process's listen(): nothing to wait on


class _Inbox(stomp.ConnectionListener):  # type: ignore[misc]  # stomp.py is untyped
    def __init__(self) -> None:
        self.bodies: list[str] = []

    def on_message(self, frame: Any) -> None:
        self.bodies.append(frame.body)


def _send_persistent(port: int, body: str) -> None:
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    conn.connect("admin", "admin", wait=True, headers={"client-id": f"sender-{uuid.uuid4().hex[:8]}"})
    try:
        receipt = uuid.uuid4().hex
        listener = stomp.listener.WaitingListener(receipt)
        conn.set_listener("receipt", listener)
        conn.send(QUEUE, body, headers={"persistent": "true", "receipt": receipt})
        listener.wait_on_receipt()
    finally:
        conn.disconnect()


def _receive_one(port: int) -> str:
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    inbox = _Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect("admin", "admin", wait=True, headers={"client-id": f"receiver-{uuid.uuid4().hex[:8]}"})
    try:
        conn.subscribe(QUEUE, id="1", ack="auto")
        deadline = time.monotonic() + TIMEOUT_S
        while not inbox.bodies:
            assert time.monotonic() < deadline, "the message sent before the failover never arrived"
            time.sleep(0.02)  # stomp.py delivers on its own thread
        return inbox.bodies[0]
    finally:
        conn.disconnect()


def _active_member(router: Routerd) -> str:
    status: Any = router.get("/api/v1/routers/ha")
    (target,) = status["pool"]["targets"]
    (active,) = [m["connector"] for m in target["members"] if m["active"]]
    return str(active)


@pytest.mark.integration
def test_routerd_follows_a_shared_store_failover(
    pair: tuple[ActiveMQ, ActiveMQ], start_routerd: Callable[[Callable[[int], str]], Routerd]
) -> None:
    port = free_port()
    router = start_routerd(lambda _admin: _config(pair, port))
    router.wait_for_log(r"router=ha target=ha-a is ready", TIMEOUT_S)
    assert _active_member(router) == f"tcp://127.0.0.1:{pair[0].stomp}"
    active, passive = pair
    times: list[float] = []
    takeovers: list[float] = []
    for round_ in range(ROUNDS):
        body = f"sent before failover {round_}"
        _send_persistent(port, body)
        held = _stomp_connect(port, f"held-{round_}")
        takeover: list[float] = []
        killed_at = time.monotonic()
        active.kill()
        watcher = threading.Thread(target=_port_opened_after, args=(passive.stomp, killed_at, takeover))
        watcher.start()
        try:
            assert closed_within(held, CHECK_PERIOD_MS / 1000 + CLOSE_SLACK_S), (
                "the proxied connection to the killed broker stayed open"
            )
        finally:
            held.close()
        times.append(_time_until_client_succeeds(port, killed_at))
        watcher.join(TIMEOUT_S)
        takeovers.extend(takeover)
        assert takeover, "the passive broker never opened its port"
        # Goal: the broker's own takeover plus at most one check-period (slack for a busy machine).
        assert times[-1] <= takeover[0] + CHECK_PERIOD_MS / 1000 + 2 * CLOSE_SLACK_S, (times, takeover)
        router.wait_for_log(
            rf"router=ha target=ha-a (is ready \(active member|failed over: ).*:{passive.stomp}\b",
            TIMEOUT_S,
        )
        assert _active_member(router) == f"tcp://127.0.0.1:{passive.stomp}"
        assert _receive_one(port) == body
        # The killed broker comes back as the passive one: nothing changes for clients.
        active.start()
        active.wait_passive()
        _stomp_connect(port, f"after-restart-{round_}").close()
        assert _active_member(router) == f"tcp://127.0.0.1:{passive.stomp}"
        active, passive = passive, active
    print(
        f"\nfailover through routerd (kill -9 of the active broker until a new STOMP client is "
        f"CONNECTED, check-period {CHECK_PERIOD_MS} ms): "
        + ", ".join(f"{t:.2f} s" for t in times)
        + f"; median {statistics.median(times):.2f} s over {len(times)} round(s); the broker's own "
        f"takeover (port open): median {statistics.median(takeovers):.2f} s"
    )
