"""Proxied connections open now: the registry that can close them, and the connection-TTL checker.

Every proxied connection is registered here from the moment it is routed until it ends, with the
target's node id, the address actually connected to (one member of an HA pair) and a trio
`CancelScope` of its own around connect, replay and relay. Cancelling that scope ends the
connection: the relay's cleanup closes both sides. Two things close connections that way:

- the connection-TTL checker, `serve_connection_ttl_checks`: one task per router walks the
  connections under a TTL every `connection-ttl-check-interval` and closes those whose client
  has sent nothing for `connection-ttl` (Artemis's connection TTL, seed 002);
- the pool: when a target becomes not ready, `RouterRuntime.apply_events` calls
  `LiveConnections.close_target`, so the clients reconnect through the router (SPEC B, HA
  awareness). `close_target(node_id, address=…)` closes only the connections to one member
  address, for HA failover.

The relay's only cost per read is a float store into `ProxiedConnection.last_read_at`, on the
client's direction of connections under a TTL; no timer is armed per read or per connection.
Which TTL a connection gets is decided here, by `connection_ttl_s`, a pure function.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Final

import trio

from keys import Sniffed, SniffError
from keys.mqtt import MqttSniffer

if TYPE_CHECKING:
    from router.routing import RouterRuntime

__all__ = [
    "CLOSED_BY_FAILOVER",
    "CLOSED_BY_TARGET_NOT_READY",
    "CLOSED_BY_TTL",
    "LiveConnections",
    "ProxiedConnection",
    "connection_ttl_s",
    "serve_connection_ttl_checks",
]

log = logging.getLogger("router.conn")

CLOSED_BY_TTL: Final = "connection_ttl"
"""`ProxiedConnection.closed_by` (and the metric's `reason`) of a TTL close."""
CLOSED_BY_TARGET_NOT_READY: Final = "target_not_ready"
"""`ProxiedConnection.closed_by` (and the metric's `reason`) when the target became not ready."""
CLOSED_BY_FAILOVER: Final = "failover"
"""`ProxiedConnection.closed_by` (and the metric's `reason`) when the member of an HA pair it was
connected to stopped being the active one."""

_MQTT: Final = MqttSniffer()


def connection_ttl_s(ttl_ms: int, sniffed: Sniffed | None) -> float:
    """The TTL of one connection, in seconds; `math.inf` when it has none.

    An MQTT client whose CONNECT keep-alive is below the TTL has none: it sends at least a
    PINGREQ within every keep-alive period (MQTT 3.1.1 §3.1.2.10, MQTT 5 §3.1.2.10), and the
    broker closes it after 1.5 keep-alives of silence anyway, so the TTL could only cut it off
    over scheduling jitter. Keep-alive 0 (no pings) or at or above the TTL leaves it under the TTL.

    Args:
        ttl_ms: the TTL in force on the acceptor (`ConnectionTtlConfig.ttl_ms`); -1 = none.
        sniffed: what the client's opening revealed, if it was read.
    """
    if ttl_ms <= 0:
        return math.inf
    if sniffed is not None and sniffed.protocol == _MQTT.name:
        keepalive_s = sniffed.keepalive_s or 0
        if 0 < keepalive_s * 1000 < ttl_ms:
            return math.inf
    return ttl_ms / 1000


def _sniff_mqtt_connect(data: bytes) -> Sniffed | None:
    """The MQTT CONNECT at the start of `data`, if there is a complete one."""
    if not _MQTT.looks_like(data):
        return None
    try:
        result = _MQTT.sniff(data)
    except SniffError:
        return None
    return result if isinstance(result, Sniffed) else None


class ProxiedConnection:
    """One proxied connection, from its routing decision until it ends.

    Mutable on purpose: the relay stamps `last_read_at`, the checker and the pool cancel it.
    """

    __slots__ = (
        "acceptor",
        "address",
        "cancel_scope",
        "closed_by",
        "last_read_at",
        "node_id",
        "peek_first_bytes",
        "peer",
        "ttl_ms",
        "ttl_s",
    )

    def __init__(
        self,
        *,
        peer: str,
        acceptor: str,
        node_id: str,
        address: tuple[str, int],
        ttl_ms: int,
        sniffed: Sniffed | None,
        now: float,
        opening: bytes = b"",
    ) -> None:
        """Describe a connection about to be proxied; register it with `LiveConnections.add`.

        Args:
            peer: `ip:port` of the client, for logs.
            acceptor: the acceptor's name, for logs.
            node_id: the target's node id.
            address: (host, port) connected to: the target's, or one member's of its HA pair.
            ttl_ms: the TTL in force on the acceptor; -1 = none.
            sniffed: the client's opening, when the router read it.
            now: the current trio time; the TTL counts from here until the client's first bytes.
            opening: client bytes already read when nothing was sniffed (behind a PROXY header).
        """
        self.peer = peer
        self.acceptor = acceptor
        self.node_id = node_id
        self.address = address
        self.ttl_ms = ttl_ms
        """The TTL in force on the acceptor, before the MQTT keep-alive exemption."""
        self.ttl_s = connection_ttl_s(ttl_ms, sniffed)
        """This connection's TTL; `math.inf` when it has none."""
        self.last_read_at = now
        """trio time of the latest bytes from the client (the relay stamps it on each read)."""
        self.cancel_scope = trio.CancelScope()
        """Around the connection's connect, replay and relay; cancelling it closes both sides."""
        self.closed_by: str | None = None
        """Why the router closed it (`CLOSED_BY_TTL`, `CLOSED_BY_TARGET_NOT_READY`), else None."""
        self.peek_first_bytes = False
        """Whether the relay should pass the client's first bytes to `first_bytes`: a connection
        under a TTL whose opening was not read may be an MQTT client that is exempt."""
        if sniffed is None and self.ttl_s != math.inf:
            if opening:
                self.first_bytes(opening)
            else:
                self.peek_first_bytes = True

    def __repr__(self) -> str:
        return f"<ProxiedConnection peer={self.peer} target={self.node_id} address={self.address}>"

    def first_bytes(self, data: bytes | bytearray) -> None:
        """Decide the TTL from the client's first bytes, when its opening was not sniffed: an MQTT
        CONNECT with a keep-alive below the TTL exempts the connection (`connection_ttl_s`).

        Only the first read is looked at: a CONNECT split over two reads is not recognised, and
        the TTL stays (the safe side: a quiet client is closed, not kept forever)."""
        self.peek_first_bytes = False
        self.ttl_s = connection_ttl_s(self.ttl_ms, _sniff_mqtt_connect(bytes(data)))

    def close(self, reason: str) -> bool:
        """Cancel the connection's scope; its relay then closes both sides.

        Returns:
            False when the router had closed it already (the first reason is kept).
        """
        if self.closed_by is not None:
            return False
        self.closed_by = reason
        self.cancel_scope.cancel(reason=reason)
        return True


class LiveConnections:
    """The proxied connections open now, by target node id, in the order they were opened."""

    __slots__ = ("_by_node", "_with_ttl")

    def __init__(self) -> None:
        self._by_node: dict[str, dict[ProxiedConnection, None]] = {}
        self._with_ttl: dict[ProxiedConnection, None] = {}
        """The connections the TTL checker walks (an exempted one is dropped at its next check)."""

    def __len__(self) -> int:
        return sum(len(conns) for conns in self._by_node.values())

    def add(self, conn: ProxiedConnection) -> None:
        """Register a connection for its lifetime (`discard` it when it ends)."""
        self._by_node.setdefault(conn.node_id, {})[conn] = None
        if conn.ttl_s != math.inf:
            self._with_ttl[conn] = None

    def discard(self, conn: ProxiedConnection) -> None:
        """Forget a connection that ended; unknown ones are ignored."""
        conns = self._by_node.get(conn.node_id)
        if conns is not None:
            conns.pop(conn, None)
            if not conns:
                del self._by_node[conn.node_id]
        self._with_ttl.pop(conn, None)

    def to(self, node_id: str, address: tuple[str, int] | None = None) -> list[ProxiedConnection]:
        """The open connections to a target; with `address`, only those to that member address."""
        conns = self._by_node.get(node_id, {})
        return [c for c in conns if address is None or c.address == address]

    def close_target(
        self,
        node_id: str,
        *,
        address: tuple[str, int] | None = None,
        reason: str = CLOSED_BY_TARGET_NOT_READY,
    ) -> int:
        """Close every open connection to a target (with `address`, to that member address only).

        Returns:
            How many were closed now (connections the router had closed already not counted).
        """
        return sum(conn.close(reason) for conn in self.to(node_id, address))

    def close_idle(self, now: float) -> list[tuple[ProxiedConnection, float]]:
        """Close every connection whose client sent nothing for its TTL or longer.

        Args:
            now: the current trio time.

        Returns:
            The connections closed now, each with its idle time in seconds.
        """
        closed: list[tuple[ProxiedConnection, float]] = []
        for conn in list(self._with_ttl):
            if conn.ttl_s == math.inf:  # exempted by its first bytes
                del self._with_ttl[conn]
                continue
            idle_s = now - conn.last_read_at
            if idle_s >= conn.ttl_s and conn.close(CLOSED_BY_TTL):
                closed.append((conn, idle_s))
        return closed


async def serve_connection_ttl_checks(runtime: RouterRuntime, interval_s: float) -> None:
    """Close a router's idle proxied connections every `interval_s`, until cancelled.

    Checks run at absolute times (start + k * interval), so a connection is closed between its
    TTL and its TTL plus one interval after its client's last bytes; each close is logged once
    and counted in `router_proxied_connections_closed_total{reason="connection_ttl"}`.

    Args:
        runtime: the router whose connections are checked.
        interval_s: `connection-ttl-check-interval` in seconds.
    """
    counter = runtime.metrics.router_closes.labels(runtime.name, CLOSED_BY_TTL)
    next_time = trio.current_time()
    while True:
        next_time += interval_s
        await trio.sleep_until(next_time)
        now = trio.current_time()
        next_time = max(next_time, now)  # a late check skips the missed slots
        for conn, idle_s in runtime.connections.close_idle(now):
            counter.inc()
            log.warning(
                "peer=%s router=%s acceptor=%s target=%s address=%s:%d outcome=CONNECTION_TTL "
                "idle_s=%.3f ttl_ms=%d: no bytes from the client within the connection TTL, closing",
                conn.peer,
                runtime.name,
                conn.acceptor,
                conn.node_id,
                conn.address[0],
                conn.address[1],
                idle_s,
                conn.ttl_ms,
            )
