"""A router's proxied connections at run time: the data paths register and unregister them, and
the router closes them (a target's, a departed member address's, all at the end of a shutdown).

The registry itself is router/core/live.py (pure bookkeeping); this slice takes the router's lock
around it (router/runtime/state.py), reports a closing once with its count, then has each
connection's data path end it, outside the lock (a closer may take other locks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.events import CloseReason, ConnectionsClosed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from router.core.address import Address
    from router.core.live import LiveConnection, LiveConnections
    from router.core.reload import Departed
    from router.runtime.reports import Reports
    from router.runtime.state import RouterState

__all__ = ["RouterConnections"]


class RouterConnections:
    """One router's proxied connections (see the module docstring)."""

    __slots__ = ("_name", "_report", "_state")

    def __init__(self, name: str, state: RouterState, report: Reports) -> None:
        self._name, self._state, self._report = name, state, report

    # -- the data paths (either thread) --

    def register(self, conn: LiveConnection) -> None:
        """Count a proxied connection from its decision on (LEAST_CONNECTIONS sees it at once) and
        make it closable by the router; `unregister` it when it ends."""
        lock = self._state.lock
        lock.acquire()  # not `with`, here and in unregister: every connection pays this
        try:
            self._state.connections.add(conn)
        finally:
            lock.release()

    def unregister(self, conn: LiveConnection) -> None:
        """Forget a proxied connection that ended (or never connected)."""
        lock = self._state.lock
        lock.acquire()
        try:
            self._state.connections.discard(conn)
        finally:
            lock.release()

    @property
    def counted(self) -> bool:
        """Whether the router's policy reads these connections' counts on every decision
        (`Policy.reads_counts`): a data path then registers each one at once (read without the
        lock: a hint, as the policy may change with a reload)."""
        policy = self._state.engine.policy
        return policy is not None and policy.reads_counts

    def carried_by(self, sync: Callable[[LiveConnections], None]) -> None:
        """A data path carries connections of this router unregistered until the registry is read
        (the native core's lean ones): `sync` registers them, first thing in every read."""
        with self._state as state:
            state.connections.sync = sync

    # -- what the router reads and closes (trio thread) --

    def open_connections(self, node_id: str | None = None) -> int:
        """How many proxied connections are open now (to one target, or in all)."""
        with self._state as state:
            return len(state.connections) if node_id is None else len(state.connections.to(node_id))

    def movable(self, node_id: str | None = None) -> list[LiveConnection]:
        """The proxied connections the router has not closed or moved yet (to one target, or all)."""
        with self._state as state:
            connections = state.connections
            return connections.open_all() if node_id is None else connections.open_to(node_id)

    def close_to(self, node_id: str, reason: CloseReason, address: Address | None = None) -> int:
        """Close the proxied connections to a target (or to one member address of it), so their
        clients reconnect through the router (SPEC B, HA awareness); reported once with the count.
        How many."""
        with self._state as state:
            doomed = state.connections.open_to(node_id, address)
        self._close(doomed, node_id, address, reason)
        return len(doomed)

    def close_departed(self, departed: Iterable[Departed]) -> int:
        """Close, at once, the connections whose target (or some of whose member addresses) left
        the configuration in a reload where they cannot be moved paced (router/reload.py moves
        those of a router that goes on, as an evacuation does): the connections of a router the
        reload removed, and those to a member address an HA pair no longer has. Reason
        `target_removed`, reported once per address with the count; their clients reconnect
        through the router and get a target of the configuration in force. How many."""
        return sum(
            self.close_to(gone.node_id, CloseReason.TARGET_REMOVED, address)
            for gone in departed
            for address in gone.addresses or (None,)
        )

    def close_all(self, reason: CloseReason) -> int:
        """Close every proxied connection (the end of a shutdown's grace period); how many."""
        with self._state as state:
            doomed = state.connections.open_all()
        self._close(doomed, None, None, reason)
        return len(doomed)

    def _close(
        self, doomed: list[LiveConnection], node_id: str | None, address: Address | None, reason: CloseReason
    ) -> None:
        """Report, then have each data path close its connections: after the report, so the lines
        come in that order on both paths, and outside the lock."""
        if doomed:
            self._report(
                ConnectionsClosed(
                    router=self._name, node_id=node_id, address=address, reason=reason, count=len(doomed)
                )
            )
        for conn in doomed:
            conn.close(reason)
