"""One router's target gates at run time: the storm protection both data paths consult before a
connection goes to its target (the rules: pools/gates.py; the limits: pools/limits.py).

Only targets whose connector sets a limit have a gate; a target without one costs a dict lookup.
Both data paths offer connections and release slots (a lock around each gate call, a few
operations under it); waiting happens on the trio side only (`enter`): the fast path hands a
connection that must wait over to it. A released slot wakes the trio side through `notify` (the
trio token's `run_sync_soon`, from either thread); the connection at the head of a queue also
looks again at the time its gate names (a connect token due, slow start growing the limit), and
every waiting connection at its deadline. Only the head is woken for a token: in a reconnect storm
thousands wait, and waking them all at each token costs O(waiters) per token (a test counts it).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import types
from typing import TYPE_CHECKING, Final

import trio

from pools.gates import GateState, TargetGate, Verdict
from router.core.events import GateOutcome

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Mapping

    from pools import Target

__all__ = ["RouterGates"]

_NONE_RAMPING: Final[Mapping[str, float]] = types.MappingProxyType({})

_waiter_ids = itertools.count(1)
"""Waiter ids, unique in the process (`next` on a count is atomic under the GIL)."""


class RouterGates:
    """The gates of one router's limited targets (see the module docstring)."""

    __slots__ = (
        "_clock",
        "_events",
        "_first_ready",
        "_gates",
        "_lock",
        "_ramping",
        "_wakers",
        "limited_ids",
        "notify",
    )

    def __init__(self, targets: Iterable[Target], clock: Callable[[], float]) -> None:
        """Args:
        targets: the router's targets; those whose connector sets limits get a gate.
        clock: the trio clock's `current_time` (the time base of both data paths).
        """
        targets = tuple(targets)
        self._clock: Final = clock
        self._lock = threading.Lock()
        self._gates: dict[str, TargetGate] = {}
        self.limited_ids: Container[str] = self._gates
        """The node ids of the targets with a gate (`limited`, without a call: the native path
        asks it for every connection); replaced when the configuration changes."""
        self._events: dict[int, trio.Event] = {}
        """Waiter id -> the event its `enter` waits on (trio thread only)."""
        self._ramping: set[str] = set()
        """Targets in slow start (their gates' `ready_since` set), for `ramping`."""
        self._wakers: dict[int, trio.CancelScope] = {}
        """Waiter id -> the scope its `enter` waits in: `pump` moves the head's deadline to the time
        its gate names (trio thread only)."""
        self._first_ready: set[str] = {target.node_id for target in targets}
        """Targets present at router start that have not been ready yet: their first ready is
        the start, not a return (no slow start)."""
        self.notify: Callable[[str], None] | None = None
        """Wakes the trio side's waiters of a target whose slot was released, from either thread
        (None: built outside trio, in tests of the decision code; waiters still look again at
        their deadlines)."""
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            self.notify = lambda node_id: token.run_sync_soon(self.pump, node_id)
        self.reconfigure(targets)

    # -- both threads --

    def limited(self, node_id: str) -> bool:
        """Whether the target has a gate (a dict lookup: what an unlimited target costs)."""
        return node_id in self._gates

    def offer(self, node_id: str, *, slot: bool) -> Verdict:
        """Admit a connection at once if its target's gate lets it (ADMIT; a proxied one holds a
        slot until `release`), else say so without queueing it (QUEUED: `enter` would wait; FULL:
        refuse). For the fast path, which cannot wait."""
        gate = self._gates.get(node_id)
        if gate is None:
            return Verdict.ADMIT
        with self._lock:
            return gate.admit_now(self._clock(), slot=slot)

    def release(self, node_id: str) -> None:
        """A proxied connection that held a slot of the target ended (or its connect failed)."""
        gate = self._gates.get(node_id)
        if gate is None:
            return
        with self._lock:
            gate.release()
            waiting = gate.queued > 0
        if waiting and self.notify is not None:
            with contextlib.suppress(trio.RunFinishedError):  # shutting down: nobody waits
                self.notify(node_id)

    def full(self, node_id: str) -> bool:
        """Whether the target's gate refuses a new proxied connection now (status: the target is
        not open); False for a target without a gate."""
        gate = self._gates.get(node_id)
        if gate is None:
            return False
        with self._lock:
            return gate.full(self._clock())

    # -- trio thread --

    def pump(self, node_id: str) -> float | None:
        """Let waiting connections of the target in while its gate allows; when to look again
        (the head of the queue is woken then)."""
        gate = self._gates.get(node_id)
        if gate is None:
            return None
        with self._lock:
            admit = gate.admit_waiting(self._clock())
            head = gate.head
        for waiter in admit.admitted:
            event = self._events.get(waiter)
            if event is not None:
                event.set()
        if admit.retry_at is not None and head is not None:
            waker = self._wakers.get(head)
            if waker is not None:
                waker.deadline = min(waker.deadline, admit.retry_at)
        return admit.retry_at

    async def enter(self, node_id: str, *, slot: bool) -> GateOutcome | None:
        """Pass the target's gate: at once (None), or after waiting in its queue (FIFO) up to its
        `queueTimeout` (ADMITTED or QUEUE_TIMEOUT), or not at all (QUEUE_FULL). Let in, it holds
        a slot when `slot` (release it when the connection ends). A waiter cancelled from outside
        (shutdown) leaves the queue, or gives its slot back."""
        gate = self._gates.get(node_id)
        if gate is None:
            return None
        waiter = next(_waiter_ids)
        now = self._clock()
        with self._lock:
            verdict = gate.offer(waiter, now, slot=slot)
        if verdict is Verdict.ADMIT:
            return None
        if verdict is Verdict.FULL:
            return GateOutcome.QUEUE_FULL
        event = self._events[waiter] = trio.Event()
        deadline = now + gate.limits.queue_timeout_s
        try:
            while not event.is_set():
                with trio.move_on_at(deadline) as waker:
                    self._wakers[waiter] = waker
                    self.pump(node_id)  # the head: its deadline moves to the time its gate names
                    if not event.is_set():
                        await event.wait()
                if self._clock() >= deadline:
                    break
        except BaseException:  # cancelled from outside: nothing may stay counted
            self._leave(gate, waiter, event, slot=slot, node_id=node_id)
            raise
        self._leave(gate, waiter, event, slot=False, node_id=node_id)
        return GateOutcome.ADMITTED if event.is_set() else GateOutcome.QUEUE_TIMEOUT

    def _leave(self, gate: TargetGate, waiter: int, event: trio.Event, *, slot: bool, node_id: str) -> None:
        """A waiter stops waiting: out of the queue if it is still in it (else it was let in
        meanwhile: `event` is set); `slot`: give back the slot it was let in with."""
        del self._events[waiter]
        self._wakers.pop(waiter, None)
        if not event.is_set():
            with self._lock:
                left = gate.cancel(waiter)
            if not left:
                event.set()
            elif gate.queued:
                self.pump(node_id)  # a head that left: the next one is woken at its gate's time
        if slot and event.is_set():
            self.release(node_id)

    def became_ready(self, node_id: str) -> None:
        """The target became ready: its slow start begins, unless this is its first ready of the
        router's start."""
        if node_id in self._first_ready:
            self._first_ready.discard(node_id)
            return
        gate = self._gates.get(node_id)
        if gate is not None:
            with self._lock:
                gate.became_ready(self._clock())
                if gate.ready_since is not None:
                    self._ramping.add(node_id)

    def ramping(self) -> Mapping[str, float]:
        """The slow-start share of each target in slow start now, for the policies' weights
        (`policies.SlowStartSource`); empty, without taking the lock, when none is."""
        if not self._ramping:
            return _NONE_RAMPING
        now = self._clock()
        shares: dict[str, float] = {}
        with self._lock:
            for node_id in tuple(self._ramping):
                gate = self._gates.get(node_id)
                share = 1.0 if gate is None else gate.share(now)
                if share < 1.0:
                    shares[node_id] = share
                else:
                    self._ramping.discard(node_id)
        return shares

    def reconfigure(self, targets: Iterable[Target]) -> None:
        """The router's targets or their limits changed (start, reload, discovery): gates of
        targets that keep limits keep their open and waiting connections."""
        now = self._clock()
        with self._lock:
            gates: dict[str, TargetGate] = {}
            for target in targets:
                limits = None if target.connector is None else target.connector.limits
                if limits is None or not (limits.limited or limits.slow_start_s > 0):
                    continue
                gate = self._gates.get(target.node_id)
                if gate is None:
                    gate = TargetGate(limits, now)
                elif gate.limits != limits:
                    gate.retune(limits, now)
                gates[target.node_id] = gate
            self._gates = self.limited_ids = gates
        for node_id in gates:
            self.pump(node_id)

    def section(self, node_id: str) -> dict[str, object] | None:
        """The `gate` member of the target's status document: slots held, the effective limit,
        clients waiting, the slow-start share; None for a target without a gate."""
        gate = self._gates.get(node_id)
        if gate is None:
            return None
        with self._lock:
            state = gate.state(self._clock())
        limits = gate.limits
        return {
            "open": state.open,
            "limit": state.limit,
            "max_connections": limits.max_connections,
            "queued": state.queued,
            "max_queue": limits.max_queue,
            "queue_timeout_ms": round(limits.queue_timeout_s * 1000),
            "connect_rate": limits.connect_rate,
            "slow_start_share": round(state.share, 3),
        }

    def states(self) -> dict[str, GateState]:
        """Each gate at one moment (status, metrics)."""
        now = self._clock()
        with self._lock:
            return {node_id: gate.state(now) for node_id, gate in self._gates.items()}
