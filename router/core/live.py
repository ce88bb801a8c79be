"""Proxied connections open now: the registry that can close them.

Every proxied connection is registered here from the moment it is routed until it ends, with the
target's node id, the address actually connected to (one member of an HA pair) and a trio
`CancelScope` of its own around connect, replay and relay. Cancelling that scope ends the
connection: the relay's cleanup closes both sides. Two things close connections that way: the
connection-TTL checker (router/services/ttl_checks.py) and the pool, when a target becomes not
ready (`RouterRuntime.apply_events` calls `LiveConnections.close_target`) or an HA pair fails over.

The relay's only cost per read is a float store into `ProxiedConnection.last_read_at`, on the
client's direction of connections under a TTL; no timer is armed per read or per connection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

import trio

from router.core.ttl import connection_ttl_s, sniff_mqtt_connect

if TYPE_CHECKING:
    from keys import Sniffed

__all__ = [
    "CLOSED_BY_FAILOVER",
    "CLOSED_BY_TARGET_NOT_READY",
    "CLOSED_BY_TTL",
    "LiveConnections",
    "ProxiedConnection",
]

CLOSED_BY_TTL: Final = "connection_ttl"
"""`ProxiedConnection.closed_by` (and the metric's `reason`) of a TTL close."""
CLOSED_BY_TARGET_NOT_READY: Final = "target_not_ready"
"""`ProxiedConnection.closed_by` (and the metric's `reason`) when the target became not ready."""
CLOSED_BY_FAILOVER: Final = "failover"
"""`ProxiedConnection.closed_by` (and the metric's `reason`) when the member of an HA pair it was
connected to stopped being the active one."""


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
        self.ttl_s = connection_ttl_s(self.ttl_ms, sniff_mqtt_connect(bytes(data)))

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
