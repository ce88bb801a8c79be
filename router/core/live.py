"""The proxied connections open now, on both data paths: the registry that counts and closes them.

Every proxied connection is registered from its routing decision until it ends, with the target's
node id, the member address it goes to, its connection TTL, and how the data path that carries it
ends it: a *closer* (the trio path's cancels the connection's scope), or the data path's own
connection type extends `LiveConnection` and overrides `end` (the fast path's asks its thread to
close the sockets). The registry does not know which path that is. What closes connections through
it: the connection-TTL checker (`close_idle`), and the runtime, which closes what `open_to` and
`open_all` return when a target becomes not ready or an HA pair fails over, and at the end of a
shutdown's grace period.

It is also the count LEAST_CONNECTIONS reads (`connection_count`, a `policies.ConnectionCountSource`):
the connections this process has routed to a target and not closed, plus, when the target's probe
reads one, the broker's own count.

Pure bookkeeping: no I/O, no clock (times are arguments), no lock. `RouterRuntime` holds its lock
around every call, since both data paths' threads use it. Closers must be quick, must not block and
must not call back into the runtime (`close_idle` calls them under the lock).

A registered connection also builds the events of its connect and its end (`connected_in`,
`connect_failed`, `ended`), once for both data paths.

The relay's only cost per read is a float store into `LiveConnection.last_read_at`, on the client's
direction of connections under a TTL; no timer is armed per read or per connection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from keys.refusal import ANSWER_BYTES, parse_refusal
from pools import BrokerFailure, PoolEventKind
from router.config.settings import AcceptorMode
from router.core.address import Address
from router.core.events import Closed, CloseReason, Connected, ConnectFailed, ConnectFailure
from router.core.framing import frame_cursor, openwire_format
from router.core.plan import Proxy
from router.core.ttl import connection_ttl_s, sniff_mqtt_connect

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import Sniffed
    from pools import PoolEvent
    from router.core.events import ConnectionRef
    from router.core.framing import Farewell
    from router.core.plan import Refuse

__all__ = [
    "BROKER_EARLY_CLOSE_S",
    "LiveConnection",
    "LiveConnections",
    "broker_failure",
    "closed_by_pool_change",
]

BROKER_EARLY_CLOSE_S: Final = 2.0
"""A broker that closes a connection without a byte this soon after the connect dropped its client
(passive health counts it). Brokers answer an opening in milliseconds (a mosquitto CONNACK on
loopback: under 1 ms); a broker's own handshake timeout is 10 s or more (mosquitto, Artemis), so a
close for a client that said nothing in time is not mistaken for one."""


def broker_failure(reason: CloseReason) -> BrokerFailure | None:
    """The passive-health failure a close reason is, if any."""
    if reason is CloseReason.BROKER_CLOSED_EARLY:
        return BrokerFailure.CLOSED_EARLY
    if reason is CloseReason.BROKER_REFUSED:
        return BrokerFailure.REFUSED
    return None


def closed_by_pool_change(event: PoolEvent) -> tuple[str, CloseReason, Address | None] | None:
    """Which proxied connections a pool change closes, so their clients reconnect through the
    router (SPEC B, HA awareness): (node id, reason, member address or None for all of the
    target's), or None when it closes none.

    A target that becomes not ready loses all its connections; an HA pair that fails over loses
    those to its former member.
    """
    if event.node_id is None:
        return None
    if event.kind is PoolEventKind.TARGET_NOT_READY:
        return event.node_id, CloseReason.TARGET_NOT_READY, None
    if event.kind is PoolEventKind.TARGET_FAILOVER and event.former is not None:
        return event.node_id, CloseReason.FAILOVER, Address(*event.former)
    return None


class LiveConnection:
    """One proxied connection, from its routing decision until it ends.

    Mutable on purpose: the relay stamps `last_read_at`; `close` records why the router closed it.
    """

    __slots__ = (
        "_closer",
        "address",
        "closed_by",
        "conn",
        "counts",
        "cursor",
        "farewell",
        "key",
        "last_read_at",
        "mode",
        "node_id",
        "on_depart",
        "opened_at",
        "peek_first_bytes",
        "protocol",
        "protocol_version",
        "refusal",
        "silent_close",
        "ttl_ms",
        "ttl_s",
        "wire_format",
    )

    def __init__(
        self,
        *,
        conn: ConnectionRef,
        node_id: str,
        address: Address,
        closer: Callable[[CloseReason], None] | None = None,
        now: float,
        ttl_ms: int = -1,
        sniffed: Sniffed | None = None,
        opening: bytes = b"",
        key: str = "",
        mode: AcceptorMode = AcceptorMode.PROXY,
    ) -> None:
        """Describe a connection about to be proxied; register it with `LiveConnections.add`.

        Args:
            conn: which connection it is.
            node_id: the target's node id.
            address: the member connected to: the target's, or one member's of its HA pair.
            closer: ends the connection on its data path (called at most once, with the reason);
                None when a subclass overrides `end` instead.
            now: the current time; the TTL counts from here until the client's first bytes.
            ttl_ms: the TTL in force on the acceptor; -1 = none.
            sniffed: the client's opening, when the router read it.
            opening: the client bytes the router read: its sniffed opening, or what came behind a
                PROXY header when nothing was sniffed.
            key: the key it was routed by (an evacuation routes it again).
            mode: the mode of the acceptor it came in on (what a farewell may tell it).
        """
        self.conn = conn
        self.key = key
        self.opened_at = now
        """When it was registered (an evacuation moves the oldest first)."""
        self.protocol = None if sniffed is None else sniffed.protocol
        """The client's protocol, when the router read its opening: what an evacuation speaks (the
        opening itself is not kept: it may hold a password)."""
        self.protocol_version = None if sniffed is None else sniffed.protocol_version
        self.mode = mode
        self.wire_format = openwire_format(sniffed, opening)
        """An OpenWire client's options, read once from its opening (its cursor and farewell need
        them; the opening is not kept); None for other protocols."""
        self.cursor = frame_cursor(sniffed, self.wire_format)
        """Where the broker's frames end, for saying something to the client mid-stream (the
        relay feeds it what goes to the client); None: the router can only close it."""
        self.farewell: Farewell | None = None
        """What the client is told before its connection ends, once `move` was called."""
        self.on_depart: Callable[[], None] | None = None
        """Set by a relay that can stop at a frame boundary (`depart` calls it); None: not yet."""
        self.node_id = node_id
        self.address = address
        self._closer = closer
        self.ttl_ms = ttl_ms
        """The TTL in force on the acceptor, before the MQTT keep-alive exemption."""
        self.ttl_s = connection_ttl_s(ttl_ms, sniffed) if ttl_ms > 0 else math.inf
        """This connection's TTL; `math.inf` when it has none."""
        self.last_read_at = now
        """Time of the latest bytes from the client (the relay stamps it on each read)."""
        self.closed_by: CloseReason | None = None
        """Why the router closed it, once it did."""
        self.counts = [0, 0]
        """Bytes relayed client -> target and target -> client so far. The data path adds each read
        as it passes it on (one int store), so a scrape sees the bytes of connections still open
        (`LiveConnections.relayed`); the client's replayed opening counts once connected."""
        self.refusal: str | None = None
        """The broker's first answer, when it was its protocol's refusal (`broker_answered`)."""
        self.silent_close = False
        """The broker ended its side before sending a byte, after the client sent some."""
        self.peek_first_bytes = False
        """Whether the relay should pass the client's first bytes to `first_bytes`: a connection
        under a TTL whose opening was not read may be an MQTT client that is exempt."""
        if sniffed is None and self.ttl_s != math.inf:
            if opening:
                self.first_bytes(opening)
            else:
                self.peek_first_bytes = True

    def __repr__(self) -> str:
        return f"<LiveConnection #{self.conn.id} peer={self.conn.peer} target={self.node_id}>"

    def first_bytes(self, data: bytes | bytearray) -> None:
        """Decide the TTL from the client's first bytes, when its opening was not sniffed: an MQTT
        CONNECT with a keep-alive below the TTL exempts the connection (`connection_ttl_s`).

        Only the first read is looked at: a CONNECT split over two reads is not recognised, and
        the TTL stays (the safe side: a quiet client is closed, not kept forever)."""
        self.peek_first_bytes = False
        self.ttl_s = connection_ttl_s(self.ttl_ms, sniff_mqtt_connect(bytes(data)))

    def broker_answered(self, data: bytes | bytearray | memoryview) -> bool:
        """The data path's report of the broker's first bytes (its first read): whether they are
        an answer, not its protocol's refusal (keys/refusal.py)."""
        if self.protocol is None:  # not read: no refusal is recognised (keys/refusal.py)
            return True
        self.refusal = parse_refusal(self.protocol, bytes(data[:ANSWER_BYTES]))
        return self.refusal is None

    def broker_ended_silently(self) -> None:
        """The data path's report that the broker ended its side (EOF or reset) before sending a
        byte; it counts only when the client had sent something to answer."""
        if self.counts[0] > 0:
            self.silent_close = True

    def close(self, reason: CloseReason) -> bool:
        """Have the data path end the connection.

        Returns:
            False when the router had closed it already (the first reason is kept).
        """
        if self.closed_by is not None:
            return False
        self.closed_by = reason
        self.end(reason)
        return True

    def move(self, farewell: Farewell, reason: CloseReason) -> bool:
        """Have the data path tell the client `farewell` at the next frame boundary from the broker,
        then end the connection; a plain close when the farewell has no words or the router cannot
        find the boundaries (`cursor` is None or lost).

        Returns:
            False when the router had closed or moved it already.
        """
        if self.closed_by is not None:
            return False
        cursor = self.cursor
        if cursor is None or cursor.lost or not farewell.after_first_frame:
            return self.close(reason)
        self.closed_by = reason
        self.farewell = farewell
        self.depart(reason)
        return True

    def depart(self, reason: CloseReason) -> None:
        """Carry out `move` on the data path: the relay's hook when it has one, else a close."""
        hook = self.on_depart
        if hook is None:
            self.end(reason)
        else:
            hook()

    def connected_in(self, connect_s: float) -> Connected:
        """The `Connected` a data path reports once the connect to the target completed.

        Args:
            connect_s: how long the connect took, from its start on the data path.
        """
        return Connected(
            conn=self.conn, key=self.key, node_id=self.node_id, address=self.address, connect_s=connect_s
        )

    def connect_failed(
        self, failure: tuple[str, ConnectFailure] | CloseReason, then: Proxy | Refuse | None = None
    ) -> ConnectFailed:
        """The `ConnectFailed` a data path reports when the connect to the target did not complete.

        Args:
            failure: the system's reason and its cause (`router.datapath.net.connect_failed`), or,
                when the router closed the connection while it was connecting, how it ended (the
                router's own reason first, `closed_by`, as in `ended`).
            then: what the client gets next (`RouterRuntime.after_connect_failed`): another
                target (`redispatched_to`), or its refusal; None when it is closed.
        """
        if isinstance(failure, CloseReason):
            reason, cause = (self.closed_by or failure).while_connecting, ConnectFailure.CLOSED_BY_ROUTER
        else:
            reason, cause = failure
        return ConnectFailed(
            conn=self.conn,
            key=self.key,
            node_id=self.node_id,
            address=self.address,
            reason=reason,
            cause=cause,
            redispatched_to=then.target.node_id if isinstance(then, Proxy) else None,
        )

    def ended(self, duration_s: float, reason: CloseReason, detail: str = "") -> Closed:
        """The `Closed` a data path reports once the connection ended: its bytes, and why it ended,
        the router's own reason first (`closed_by`) else `reason`; a connection that ended by
        itself is BROKER_REFUSED when the broker's first answer refused the client, and
        BROKER_CLOSED_EARLY when the broker ended it without a byte within
        `BROKER_EARLY_CLOSE_S` (passive health counts both).

        Args:
            duration_s: how long it was connected to its target.
            reason: how it ended, unless the router closed it.
            detail: more about REPLAY_FAILED or INTERNAL_ERROR.
        """
        if self.closed_by is not None:
            reason = self.closed_by
        elif reason is CloseReason.CLOSED or reason is CloseReason.RESET:
            if self.refusal is not None:
                reason, detail = CloseReason.BROKER_REFUSED, self.refusal
            elif self.silent_close and duration_s <= BROKER_EARLY_CLOSE_S:
                reason = CloseReason.BROKER_CLOSED_EARLY
        return Closed(
            conn=self.conn,
            node_id=self.node_id,
            bytes_in=self.counts[0],
            bytes_out=self.counts[1],
            duration_s=duration_s,
            reason=reason,
            detail=detail,
        )

    def end(self, reason: CloseReason) -> None:
        """End the connection on its data path (`close` calls it at most once): calls the closer."""
        assert self._closer is not None, "a LiveConnection without a closer overrides end()"
        self._closer(reason)


class LiveConnections:
    """The proxied connections open now, by target node id, in the order they were opened.

    A data path may carry connections it has not registered yet (the native core's lean ones, see
    router/datapath/native_path.py): it sets `sync`, which every reading method calls first, and
    which registers them (`add`) and counts the bytes of those that ended (`add_ended`).
    """

    __slots__ = ("_by_node", "_ended", "_reported", "_with_ttl", "sync")

    def __init__(self) -> None:
        self.sync: Callable[[LiveConnections], None] | None = None
        """Registers what a data path carries unregistered (called under the runtime's lock)."""
        self._by_node: dict[str, dict[LiveConnection, None]] = {}
        self._ended: dict[str, tuple[int, int]] = {}
        """node id -> the bytes each way of its connections discarded so far (`relayed`); one entry
        per target that ever had a connection (targets come from the configuration, not clients)."""
        self._with_ttl: dict[LiveConnection, None] = {}
        """The connections the TTL checker walks (an exempted one is dropped at its next check)."""
        self._reported: dict[str, tuple[int, int]] = {}
        """node id -> (the broker's count, our live count when it was read)."""

    def __len__(self) -> int:
        if self.sync is not None:
            self.sync(self)
        return sum(len(conns) for conns in self._by_node.values())

    def add(self, conn: LiveConnection) -> None:
        """Register a connection for its lifetime (`discard` it when it ends)."""
        conns = self._by_node.get(conn.node_id)
        if conns is None:
            conns = self._by_node[conn.node_id] = {}
        conns[conn] = None
        if conn.ttl_s != math.inf:
            self._with_ttl[conn] = None

    def discard(self, conn: LiveConnection) -> None:
        """Forget a connection that ended; unknown ones are ignored."""
        conns = self._by_node.get(conn.node_id)
        if conns is None or conn not in conns:
            return
        del conns[conn]
        if not conns:
            del self._by_node[conn.node_id]
        self._with_ttl.pop(conn, None)
        ended_in, ended_out = self._ended.get(conn.node_id, (0, 0))
        self._ended[conn.node_id] = (ended_in + conn.counts[0], ended_out + conn.counts[1])

    def add_ended(self, node_id: str, bytes_in: int, bytes_out: int) -> None:
        """Count the bytes of connections to a target that ended without being registered."""
        ended_in, ended_out = self._ended.get(node_id, (0, 0))
        self._ended[node_id] = (ended_in + bytes_in, ended_out + bytes_out)

    def relayed(self) -> dict[str, tuple[int, int]]:
        """The bytes relayed client -> target and target -> client by every connection registered
        so far, ended or open, by target node id. Never decreases, provided a data path counts
        nothing into a connection after discarding it: an open one's bytes move to the ended total
        unchanged."""
        if self.sync is not None:
            self.sync(self)
        totals = dict(self._ended)
        for node_id, conns in self._by_node.items():
            relayed_in, relayed_out = totals.get(node_id, (0, 0))
            for conn in conns:
                relayed_in += conn.counts[0]
                relayed_out += conn.counts[1]
            totals[node_id] = (relayed_in, relayed_out)
        return totals

    def holds(self, conn: LiveConnection) -> bool:
        """Whether a connection is registered (it has not ended)."""
        if self.sync is not None:
            self.sync(self)
        return conn in self._by_node.get(conn.node_id, ())

    def to(self, node_id: str, address: Address | None = None) -> list[LiveConnection]:
        """The open connections to a target; with `address`, only those to that member address."""
        if self.sync is not None:
            self.sync(self)
        conns = self._by_node.get(node_id, {})
        return [c for c in conns if address is None or c.address == address]

    def open_to(self, node_id: str, address: Address | None = None) -> list[LiveConnection]:
        """The connections to a target (with `address`, to that member) the router has not closed."""
        return [conn for conn in self.to(node_id, address) if conn.closed_by is None]

    def open_all(self) -> list[LiveConnection]:
        """Every connection the router has not closed."""
        if self.sync is not None:
            self.sync(self)
        return [conn for conns in self._by_node.values() for conn in conns if conn.closed_by is None]

    def close_idle(self, now: float, reason: CloseReason) -> list[tuple[LiveConnection, float]]:
        """Close every connection whose client sent nothing for its TTL or longer.

        Args:
            now: the current time.
            reason: what to record (the connection-TTL reason).

        Returns:
            The connections closed now, each with its idle time in seconds.
        """
        if self.sync is not None:
            self.sync(self)
        closed: list[tuple[LiveConnection, float]] = []
        for conn in list(self._with_ttl):
            if conn.ttl_s == math.inf:  # exempted by its first bytes
                del self._with_ttl[conn]
                continue
            idle_s = now - conn.last_read_at
            if idle_s >= conn.ttl_s and conn.close(reason):
                closed.append((conn, idle_s))
        return closed

    # -- counts for LEAST_CONNECTIONS (policies.ConnectionCountSource) --

    def connection_count(self, node_id: str) -> int | None:
        """The count of a target (0 when none; never unknown: we count ours all).

        With a broker count, it is the broker's (every client it has, ours included) plus how many
        more connections we hold to it now than when the count was read, so a burst between two
        probes still spreads; without one it is our own live count.
        """
        if self.sync is not None:
            self.sync(self)
        live = len(self._by_node.get(node_id, ()))
        reported = self._reported.get(node_id)
        if reported is None:
            return live
        broker, live_then = reported
        return max(0, broker + live - live_then)

    def report_broker_count(self, node_id: str, broker_count: int | None) -> None:
        """Record the connection count a broker reported to its probe; None forgets the last one
        (the probe could not read it), leaving our own count."""
        if self.sync is not None:
            self.sync(self)
        if broker_count is None:
            self._reported.pop(node_id, None)
        else:
            self._reported[node_id] = (broker_count, len(self._by_node.get(node_id, ())))
