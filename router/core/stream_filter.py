"""What the router takes out of a CORE broker's stream to a proxied client (pure: no I/O, no clock).

A CORE (Artemis) client learns the cluster's members from the broker's topology packets on
channel 0 (CLUSTER_TOPOLOGY, _V2, _V3, _V4) and, by default (`useTopologyForLoadBalancing`,
`ha=true`), connects to them directly: through a router in proxy mode it would learn the brokers'
own addresses and bypass the router. The client had the router's own topology answer during its
opening (keys/core.py: this node alone, `last=true`), so the broker's are dropped, for the life
of the connection (`TopologyFilter`).

When the router answered the client's opening itself (PING, SUBSCRIBE_TOPOLOGY,
CHECK_FOR_FAILOVER, REATTACH_SESSION), the broker answers the same packets when they are replayed
to it: those answers, ahead of its first other packet, are the broker's preamble, measured by
`core_target_preamble` and dropped (router/datapath/reading.py `read_past_preamble`).

A CORE packet: int32 length (of what follows it), int8 type, int64 channel id, the body.
Memory is bounded: at most one packet header (13 bytes) is held back; a dropped packet's body is
skipped as it arrives, never buffered.
"""

from __future__ import annotations

from typing import Final, Protocol

from keys import NEED_MORE, NeedMore, SniffError

__all__ = ["PREAMBLE_PACKETS", "TOPOLOGY_PACKETS", "StreamFilter", "TopologyFilter", "core_target_preamble"]

_HEADER: Final = 13
"""int32 length, int8 type, int64 channel."""
_AFTER_LENGTH: Final = _HEADER - 4
"""The least a packet's length field can say: its type and channel."""

_PING: Final = 10
_CHECK_FOR_FAILOVER_REPLY: Final = -5
_REATTACH_SESSION_RESP: Final = 33

TOPOLOGY_PACKETS: Final = frozenset({(110, 0), (114, 0), (122, 0), (-17, 0)})
"""(type, channel) of the broker's cluster-topology packets: CLUSTER_TOPOLOGY, _V2, _V3, _V4."""
PREAMBLE_PACKETS: Final = TOPOLOGY_PACKETS | {
    (_PING, 0),
    (_CHECK_FOR_FAILOVER_REPLY, 1),
    (_REATTACH_SESSION_RESP, 1),
}
"""(type, channel) of the broker's answers to the opening packets the router answered itself."""


class StreamFilter(Protocol):
    """What a broker's bytes to its client pass through (`Proxy.target_filter`)."""

    def feed(self, data: bytes | bytearray) -> bytes | bytearray:
        """What of `data`, the next bytes from the broker, goes to the client."""
        ...


def _header(head: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """A packet header's (length after the length field, type, channel)."""
    length = int.from_bytes(head[:4], "big")
    kind = int.from_bytes(head[4:5], "big", signed=True)
    channel = int.from_bytes(head[5:13], "big", signed=True)
    return length, kind, channel


def core_target_preamble(data: bytes) -> int | NeedMore:
    """How many of a CORE broker's first bytes answer the replayed opening (`PREAMBLE_PACKETS`):
    up to its first other packet (its CREATESESSION_RESP, or an EXCEPTION), whose header must be
    there; NEED_MORE until it is.

    Raises:
        SniffError: a packet length shorter than its own header (not CORE).
    """
    i = 0
    while len(data) - i >= _HEADER:
        length, kind, channel = _header(data[i : i + _HEADER])
        if length < _AFTER_LENGTH:
            raise SniffError("core", f"target sent a packet of length {length}, shorter than its header")
        if (kind, channel) not in PREAMBLE_PACKETS:
            return i
        end = i + 4 + length
        if end > len(data):
            return NEED_MORE
        i = end
    return NEED_MORE


class TopologyFilter:
    """Drops the cluster-topology packets (`TOPOLOGY_PACKETS`) from a CORE broker's stream to its
    client, passing every other byte unchanged and in order. Feed it each read; it returns what to
    send. Bytes that cannot be CORE packets (a length shorter than a header) end the filtering:
    from there on everything passes (`lost`)."""

    __slots__ = ("_dropping", "_head", "_left", "dropped", "lost")

    def __init__(self) -> None:
        self._head = b""
        """A packet header not complete yet (held back)."""
        self._left = 0
        """Bytes of the current packet's body still to come."""
        self._dropping = False
        self.dropped = 0
        """Topology packets dropped so far."""
        self.lost = False

    def feed(self, data: bytes | bytearray) -> bytes | bytearray:
        """What of `data` (the next bytes from the broker) goes to the client."""
        if self.lost:
            return data
        if not self._head and self._left >= len(data):  # inside one packet's body: the common case
            self._left -= len(data)
            return b"" if self._dropping else data
        out = bytearray()
        view = memoryview(data)
        n = len(view)
        i = 0
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                if not self._dropping:
                    out += view[i : i + take]
                self._left -= take
                i += take
                continue
            want = _HEADER - len(self._head)
            head = self._head + bytes(view[i : i + want])
            i += min(want, n - i)
            if len(head) < _HEADER:
                self._head = head
                break
            self._head = b""
            length, kind, channel = _header(head)
            if length < _AFTER_LENGTH:
                self.lost = True
                out += head
                out += view[i:]
                break
            self._dropping = (kind, channel) in TOPOLOGY_PACKETS
            self._left = length - _AFTER_LENGTH
            if self._dropping:
                self.dropped += 1
            else:
                out += head
        return bytes(out)
