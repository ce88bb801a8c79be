"""A router's pool at run time: the changes services make to it (probes, discovery, operators'
administrative states, refused connects, passive health), what they do, and the waits on it.

Each change takes the router's lock (router/runtime/state.py), then its pool events are reported
(log lines, metrics), the history of target states is kept, the proxied connections they doom are
closed (a target that becomes not ready, the former member of a failed-over HA pair) and the
decisions waiting for the quorum are woken. Changes run in the trio thread; `first_answer` comes
from either data path's thread.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import trio

from pools import PoolEventKind, PoolKind
from router.core.live import broker_failure, closed_by_pool_change
from router.core.status import CheckRecord, operational_state

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from pools import AdminState, Connector, PoolEvent, Target, TargetState
    from router.core.engine import QuorumWait, RouteDecision
    from router.core.events import Closed
    from router.core.live import LiveConnection
    from router.metrics import Metrics
    from router.runtime.connections import RouterConnections
    from router.runtime.gates import RouterGates
    from router.runtime.reports import Reports
    from router.runtime.state import RouterState

__all__ = ["RouterPool"]


class RouterPool:
    """One router's pool at run time (see the module docstring)."""

    def __init__(
        self,
        name: str,
        state: RouterState,
        report: Reports,
        connections: RouterConnections,
        metrics: Metrics,
        gates: RouterGates,
    ) -> None:
        self._name, self._state, self._report = name, state, report
        self._connections, self._metrics, self._gates = connections, metrics, gates
        self._changed = trio.Event()
        """Set (and replaced) on every pool change: `wait_until` re-checks then."""
        self._outliers_changed = trio.Event()
        """Set when an ejection begins, so `serve_outlier_returns` looks at its end."""

    @property
    def gates(self) -> RouterGates:
        """The targets' gates (`maxConnections`, `connectRate`, `slowStart`): both data paths pass
        them before a connection goes to its target."""
        return self._gates

    # -- changes (trio thread) --

    def record_check(
        self, node_id: str, ok: bool, detail: str = "", *, member: int = 0, duration_s: float = 0.0
    ) -> None:
        """Record a probe's outcome for a target (one member of an HA pair) and act on the changes.

        Args:
            node_id: the probed target.
            ok: whether the probe succeeded.
            detail: why not, when it failed.
            member: which member of an HA pair was probed (0: the primary).
            duration_s: how long the probe took (shown in the status and the metrics).

        Raises:
            KeyError: no target with this node id.
        """
        state = self._state
        pool = state.pool
        assert pool is not None, "only a router with a pool probes"
        record = CheckRecord(at=time.time(), duration_s=duration_s, ok=ok, reason="" if ok else detail)
        with state:
            events = pool.record_check(node_id, ok, detail, member=member)
            if pool.probed(node_id):  # a probe that ran when maintenance began is not recorded
                state.history.checked(node_id, member, record)
        self.apply(events)

    def add_target(self, target: Target) -> None:
        """Add a discovered target to the pool; the probes start probing it at once.

        Raises:
            ValueError: the pool already has a target with this node id.
        """
        with self._state as state:
            assert state.pool is not None, "only a router with a pool discovers targets"
            events = state.pool.add_target(target)
        self.apply(events)

    def remove_target(self, node_id: str) -> None:
        """Remove a discovered target from the pool; its probe loop stops and its metrics go.

        Raises:
            KeyError: no target with this node id.
        """
        with self._state as state:
            assert state.pool is not None, "only a router with a pool discovers targets"
            events = state.pool.remove_target(node_id)
        self.apply(events)

    def connect_refused(self, target: Target, connector: Connector, reason: str) -> None:
        """A connection to a member of the pool was refused: that member is un-ready at once, as
        if its probe had failed (the next successful probe makes it ready again), so the clients
        that follow go to the member that took over instead of waiting for the next check.

        Nothing happens when the target has left the pool (or was replaced) since it was chosen.
        """
        if target.connector is None:
            return
        try:
            member = target.connector.members.index(connector)
        except ValueError:
            return
        detail = f"connect to {connector.url} failed: {reason}"
        with self._state as state:
            pool = state.pool
            if pool is None or pool.target(target.node_id) is not target:
                return
            events = pool.record_check(target.node_id, False, detail, member=member)
        self.apply(events)

    def set_admin_state(self, node_id: str, admin: AdminState) -> bool:
        """Set what operators allow a target: `ready`, `drain` (no new connections, cached keys
        included) or `maint` (as drain, and not probed); open connections stay. A discovery pool
        takes node ids that are not (yet) members: the state applies when one joins. Whether it
        changed anything.

        Raises:
            LookupError: the router has no pool.
            ValueError: a static or cluster pool has no target with this node id.
        """
        with self._state as state:
            pool, config = state.pool, state.config.pool
            if pool is None or config is None:
                raise LookupError(f"connection router {self._name!r} has no pool")
            if pool.target(node_id) is None and config.kind is not PoolKind.DISCOVERY:
                known = [t.node_id for t in pool.targets]
                raise ValueError(
                    f"no target with node id {node_id!r} in the pool of {self._name!r} (has {known})"
                )
            events = pool.set_admin_state(node_id, admin)
        self.apply(events)
        return bool(events)

    # -- passive health (pools/outlier.py) --

    def first_answer(self, live: LiveConnection, data: bytes | bytearray | memoryview) -> None:
        """A data path's report of a target's first bytes on a proxied connection (b"": it ended
        its side without a byte), from either thread: an answer ends the target's failures in a
        row (the lock is taken only when it has some)."""
        if not data:
            live.broker_ended_silently()
            return
        if live.broker_answered(data):
            self.answered(live.node_id)

    def failing(self, node_id: str) -> bool:
        """Whether a target has failures in a row (read without the lock: a hint for a data path,
        which then reports the first answers of its connections to it)."""
        pool = self._state.pool
        return pool is not None and pool.failing(node_id)

    def answered(self, node_id: str) -> None:
        """A target answered a proxied connection (not with a refusal): its failures in a row end
        (from either thread; the lock is taken only when it has some)."""
        state = self._state
        pool = state.pool
        if pool is not None and pool.failing(node_id):
            with state:
                pool.broker_answered(node_id)

    def broker_failed(self, closed: Closed) -> None:
        """Count a proxied connection that the broker refused or dropped (trio thread): the
        target may be ejected (TARGET_EJECTED, logged and counted)."""
        failure = broker_failure(closed.reason)
        state = self._state
        pool = state.pool
        if failure is None or pool is None:
            return
        self._metrics.outlier_failures.inc((self._name, failure.value))
        with state:
            events = pool.broker_failed(closed.node_id, failure, trio.current_time(), closed.detail)
        if events:
            self.apply(events)
            self._outliers_changed.set()

    async def serve_outlier_returns(self) -> None:
        """End each ejection when its time is over (TARGET_RETURNED), whatever its probes said."""
        state = self._state
        while True:
            with state:
                until = None if state.pool is None else state.pool.next_return()
            self._outliers_changed = changed = trio.Event()
            with trio.move_on_at(math.inf if until is None else until):
                await changed.wait()
            with state:
                pool = state.pool
                events = [] if pool is None else pool.return_ejected(trio.current_time())
            self.apply(events)

    # -- what services read --

    def target(self, node_id: str) -> Target | None:
        """The pool's target with this node id now, if any."""
        with self._state as state:
            return None if state.pool is None else state.pool.target(node_id)

    def targets(self) -> tuple[Target, ...]:
        """The pool's targets now, in pool order (none without a pool)."""
        with self._state as state:
            return () if state.pool is None else tuple(state.pool.targets)

    def admin_states(self) -> dict[str, AdminState]:
        """Every node id whose administrative state is not `ready`."""
        with self._state as state:
            return {} if state.pool is None else state.pool.admin_states()

    def is_probed(self, node_id: str) -> bool:
        """Whether a target of the pool is probed now (it is not in maintenance)."""
        with self._state as state:
            return state.pool is not None and state.pool.probed(node_id)

    def target_state(self, node_id: str) -> TargetState:
        """The readiness of one target now.

        Raises:
            KeyError: no target with this node id.
        """
        with self._state as state:
            assert state.pool is not None, "only a router with a pool has targets"
            return state.pool.state(node_id)

    def target_ready(self, node_id: str) -> bool:
        """Whether the pool has a ready target with this node id now."""
        with self._state as state:
            return state.pool is not None and state.pool.ready_target(node_id) is not None

    def ready_count(self) -> int:
        """How many of the pool's targets are ready now."""
        with self._state as state:
            return 0 if state.pool is None else state.pool.ready_count()

    def active_member(self, node_id: str) -> int | None:
        """The index of the active member of an HA-pair target (None: none is ready).

        Raises:
            KeyError: no target with this node id.
        """
        with self._state as state:
            assert state.pool is not None, "only a router with a pool has members"
            return state.pool.active_member(node_id)

    # -- waits (trio thread) --

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds, re-checking after every pool change."""
        while not predicate():
            await self._changed.wait()

    async def wait_for_quorum(self, wait: QuorumWait) -> RouteDecision:
        """Wait up to the quorum timeout for the pool to have routing targets, then decide. The
        caller's cancel scope bounds the wait as well."""
        with trio.move_on_after(wait.timeout_s):
            await self.wait_until(self._has_routing_targets)
        with self._state as state:
            return state.engine.finish(wait, trio.current_time())

    def _update_gates(self, events: Sequence[PoolEvent]) -> None:
        """A target that became ready starts its slow start; targets joining or leaving get or
        lose their gates."""
        if any(e.kind in (PoolEventKind.TARGET_ADDED, PoolEventKind.TARGET_REMOVED) for e in events):
            with self._state as state:
                targets = () if state.pool is None else state.pool.targets
            self._gates.reconfigure(targets)
        for event in events:
            if event.kind is PoolEventKind.TARGET_READY and event.node_id is not None:
                self._gates.became_ready(event.node_id)

    def _has_routing_targets(self) -> bool:
        with self._state as state:
            return state.pool is not None and bool(state.pool.routing_targets())

    # -- acting on changes --

    def observe(self, node_ids: Iterable[str], now: float) -> None:
        """Record the operational state of these targets at `now` in the history (under the lock,
        or before the router serves)."""
        state = self._state
        pool = state.pool
        assert pool is not None
        for node_id in node_ids:
            if pool.target(node_id) is not None:  # an administrative state may name an absent one
                ejected = pool.ejection(node_id) is not None
                operational = operational_state(
                    pool.state(node_id), pool.admin_state(node_id), ejected=ejected
                )
                state.history.observe(node_id, operational, now)

    def apply(self, events: Iterable[PoolEvent]) -> None:
        """Report pool changes, then close the connections they doom, and wake decisions waiting
        for the quorum (trio thread)."""
        events = list(events)
        touched = [event for event in events if event.node_id is not None]
        if touched:
            now = time.time()
            with self._state as state:
                for event in touched:
                    assert event.node_id is not None
                    if event.kind is PoolEventKind.TARGET_REMOVED:
                        state.history.forget(event.node_id)
                        continue
                    if event.kind is PoolEventKind.TARGET_NOT_READY:
                        state.history.failed(event.node_id, event.detail)
                    self.observe([event.node_id], now)
        for event in events:
            self._report(event)
        self._update_gates(events)
        for event in events:
            if (closing := closed_by_pool_change(event)) is not None:
                self._connections.close_to(*closing)
        if events:
            woken, self._changed = self._changed, trio.Event()
            woken.set()
