"""Carry out paced moves (router/core/evacuation.py): evacuations, rebalances, a paced shutdown.

`Moves` holds one paced move per router and target (an evacuation), per router (a rebalance) and
per process (a shutdown), each a task in the services nursery. Every `STEP_S` a task takes the
moves that are due, routes each connection's key again (`RouterRuntime.relocate`, which caches the
new target so the client that comes back through the router lands there), and has the data path
tell the client (`RouterRuntime.move`, with the farewell of router/core/framing.py). A log line
sums up each second's moves; the last status of each move stays readable until the next one of
the same kind starts.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Final

import trio

from pools import AdminState
from router.config.settings import AcceptorMode
from router.core.engine import RouteStatus
from router.core.evacuation import (
    STEP_S,
    MoveKind,
    MoveRequest,
    MoveState,
    MoveStatus,
    due,
    first_to_move,
    rebalance_excess,
)
from router.core.events import CloseReason
from router.core.framing import farewell

if TYPE_CHECKING:
    from collections.abc import Mapping

    from router.config.settings import Config
    from router.core.live import LiveConnection
    from router.metrics import Metrics
    from router.runtime import RouterRuntime

__all__ = ["MoveConflict", "Moves"]

log = logging.getLogger("router.moves")

LOG_EVERY_S: Final = 1.0
"""A running move logs what it did at most this often (one line per batch of a second)."""

_Key = tuple[MoveKind, str, str | None]

_NOUNS: Final = {
    MoveKind.EVACUATE: "an evacuation",
    MoveKind.REBALANCE: "a rebalance",
    MoveKind.SHUTDOWN: "a shutdown",
}


class MoveConflict(Exception):
    """A move cannot start: one of the same kind runs, or the router cannot do what it asks."""


class _Move:
    """One paced move under way (mutable; `status` gives a frozen view)."""

    def __init__(self, request: MoveRequest, left: int) -> None:
        self.request = request
        self.state = MoveState.RUNNING
        self.started_at = time.time()
        self.started = trio.current_time()
        self.finished_at: float | None = None
        self.moved = 0
        self.left = left
        self.note = ""
        self.scope = trio.CancelScope()
        self.paced_from = self.started
        """Pacing counts from here: reset after a wait, so a wait is not followed by a burst."""
        self.moved_since = 0
        self.quota: dict[str, int] = {}
        """A rebalance's plan, made at its start: connections still to move off each target."""
        self.planned: dict[str, int] = {}
        """A rebalance's view of each ready target's connections: at its start, plus those sent
        there since (a moved client takes a while to come back and be counted)."""

    def status(self) -> MoveStatus:
        elapsed = trio.current_time() - self.started
        finished = self.state in (MoveState.DONE, MoveState.ABORTED)
        return MoveStatus(
            request=self.request,
            state=self.state,
            started_at=self.started_at,
            moved=self.moved,
            left=self.left,
            rate=self.moved / elapsed if elapsed > 0 else 0.0,
            eta_s=None if finished else self.left / self.request.rate,
            finished_at=self.finished_at,
            note=self.note,
        )


class Moves:
    """The paced moves of one routerd."""

    def __init__(
        self,
        config: Config,
        runtimes: Mapping[str, RouterRuntime],
        metrics: Metrics | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._runtimes = runtimes
        self._modes = {a.name: a.mode for a in config.acceptors}
        self._moves: dict[_Key, _Move] = {}
        self._nursery: trio.Nursery | None = None
        self._rng = rng or random.Random()
        self._metrics = metrics
        if metrics is not None:
            metrics.sample_when_scraped(self._sample)

    def _sample(self) -> None:
        """The remaining count of each running evacuation; 0 once it finished (so a graph drops)."""
        assert self._metrics is not None
        family = self._metrics.evacuation_remaining
        for (kind, router, node_id), move in self._moves.items():
            if kind is MoveKind.EVACUATE and node_id is not None:
                running = move.state in (MoveState.RUNNING, MoveState.WAITING)
                family.set((router, node_id), float(move.left if running else 0))

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the moves started from now on until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- what operators call --

    def start(self, request: MoveRequest) -> MoveStatus:
        """Start a paced move.

        Raises:
            LookupError: no such router or target.
            MoveConflict: one of the same kind runs already, or a rebalance the router's policy
                and cache cannot carry out.
        """
        runtime = self._runtime(request.router)
        key = (request.kind, request.router, request.node_id)
        running = self._moves.get(key)
        if running is not None and running.state in (MoveState.RUNNING, MoveState.WAITING):
            raise MoveConflict(f"{_NOUNS[request.kind]} of {self._what(request)} is running already")
        if request.kind is MoveKind.EVACUATE:
            assert request.node_id is not None
            if runtime.target(request.node_id) is None and not runtime.movable(request.node_id):
                # (a target a reload removed has no pool entry, but its connections are still here)
                raise LookupError(f"no target with node id {request.node_id!r} in router {request.router!r}")
            left = len(runtime.movable(request.node_id))
        elif request.kind is MoveKind.REBALANCE:
            _check_rebalance(runtime)
            counts = runtime.open_counts()
            quota = rebalance_excess(counts, request.band)
            left = sum(quota.values())
        else:
            left = len(runtime.movable())
        if self._nursery is None:
            raise MoveConflict("the router is not serving moves (it is starting or stopping)")
        move = self._moves[key] = _Move(request, left)
        if request.kind is MoveKind.REBALANCE:
            move.quota, move.planned = quota, counts
        self._nursery.start_soon(self._run, move, runtime)
        log.info(
            "router=%s %s of %s started: %d connection(s) at %g/s, %s first",
            request.router,
            request.kind.value,
            self._what(request),
            left,
            request.rate,
            request.order.value,
        )
        return move.status()

    def status(self, kind: MoveKind, router: str, node_id: str | None = None) -> MoveStatus:
        """The last move of this kind (running or finished).

        Raises:
            LookupError: there was none.
        """
        self._runtime(router)
        move = self._moves.get((kind, router, node_id))
        if move is None:
            raise LookupError(f"no {kind.value} of {router}{'' if node_id is None else '/' + node_id} so far")
        return move.status()

    def abort(self, kind: MoveKind, router: str, node_id: str | None = None) -> MoveStatus:
        """Stop a running move (connections moved so far stay moved; an evacuated target stays
        drained).

        Raises:
            LookupError: there was none.
        """
        move = self._moves.get((kind, router, node_id))
        if move is None:
            raise LookupError(f"no {kind.value} of {router}{'' if node_id is None else '/' + node_id} so far")
        if move.state in (MoveState.RUNNING, MoveState.WAITING):
            move.scope.cancel(reason="aborted")
            candidates, excess = self._candidates(move, self._runtime(router))
            move.left = len(candidates) if excess is None else sum(excess.values())
            self._finish(move, MoveState.ABORTED)
        return move.status()

    def all_statuses(self) -> list[MoveStatus]:
        return [m.status() for m in self._moves.values()]

    # -- carrying a move out --

    def _runtime(self, router: str) -> RouterRuntime:
        runtime = self._runtimes.get(router)
        if runtime is None:
            raise LookupError(f"no connection router named {router!r}")
        return runtime

    @staticmethod
    def _what(request: MoveRequest) -> str:
        if request.node_id is not None:
            return f"target={request.node_id}"
        return "the pool" if request.kind is MoveKind.REBALANCE else "every connection"

    def _finish(self, move: _Move, state: MoveState) -> None:
        if move.state in (MoveState.DONE, MoveState.ABORTED):
            return
        move.state = state
        move.finished_at = time.time()
        request = move.request
        log.info(
            "router=%s %s of %s %s: moved=%d left=%d in %.1f s",
            request.router,
            request.kind.value,
            self._what(request),
            "done" if state is MoveState.DONE else "aborted",
            move.moved,
            move.left,
            trio.current_time() - move.started,
        )

    async def _run(self, move: _Move, runtime: RouterRuntime) -> None:
        request = move.request
        if request.kind is MoveKind.EVACUATE:
            assert request.node_id is not None
            in_pool = runtime.target(request.node_id) is not None
            if in_pool and request.node_id not in runtime.admin_states():
                runtime.set_admin_state(request.node_id, AdminState.DRAIN)  # no new connections there
        logged_at, logged_moved = trio.current_time(), 0
        with move.scope:
            while True:
                candidates, excess = self._candidates(move, runtime)
                move.left = len(candidates) if excess is None else sum(excess.values())
                if not move.left:
                    self._finish(move, MoveState.DONE)
                    return
                now = trio.current_time()
                at_once = request.kind is not MoveKind.SHUTDOWN
                count = due(request.rate, now - move.paced_from, move.moved_since, at_once=at_once)
                if count:
                    self._step(move, runtime, candidates, excess, count)
                if now - logged_at >= LOG_EVERY_S and move.moved > logged_moved:
                    log.info(
                        "router=%s %s of %s: moved=%d (+%d) left=%d eta=%.0fs%s",
                        request.router,
                        request.kind.value,
                        self._what(request),
                        move.moved,
                        move.moved - logged_moved,
                        move.left,
                        move.left / request.rate,
                        f" ({move.note})" if move.note else "",
                    )
                    logged_at, logged_moved = now, move.moved
                await trio.sleep(STEP_S)

    def _candidates(
        self, move: _Move, runtime: RouterRuntime
    ) -> tuple[list[LiveConnection], dict[str, int] | None]:
        request = move.request
        if request.kind is MoveKind.EVACUATE:
            return runtime.movable(request.node_id), None
        if request.kind is MoveKind.SHUTDOWN:
            return runtime.movable(), None
        excess = {node_id: n for node_id, n in move.quota.items() if n > 0}
        candidates = [c for node_id in excess for c in runtime.movable(node_id)]
        if not candidates:  # the connections to move ended by themselves meanwhile
            return [], {}
        return candidates, excess

    def _step(
        self,
        move: _Move,
        runtime: RouterRuntime,
        candidates: list[LiveConnection],
        excess: dict[str, int] | None,
        count: int,
    ) -> None:
        request = move.request
        if excess is not None:  # a rebalance: only the excess of each target, each to the emptiest
            counts = move.planned
            chosen: list[LiveConnection] = []
            for node_id, n in excess.items():
                own = [c for c in candidates if c.node_id == node_id]
                chosen += first_to_move(own, n, request.order, self._rng)
            batch = first_to_move(chosen, count, request.order, self._rng)
        else:
            counts = {}
            batch = first_to_move(candidates, count, request.order, self._rng)
        for conn in batch:
            to = None
            if excess is not None:
                others = {n: c for n, c in counts.items() if n != conn.node_id}
                if not others:
                    break
                to = min(others, key=lambda n: (others[n], n))
            if request.kind is MoveKind.SHUTDOWN:
                words = farewell(
                    conn.sniffed,
                    conn.wire_opening,
                    self._mode(conn),
                    None,
                    request.router,
                    shutting_down=True,
                )
                reason = CloseReason.SHUTDOWN
            else:
                decision = runtime.relocate(conn.key, conn.node_id, to=to)
                if decision.status is not RouteStatus.OK or decision.target is None:
                    move.state = MoveState.WAITING
                    move.note = f"no other target open to new connections ({decision.reason.value})"
                    move.paced_from, move.moved_since = trio.current_time(), 0
                    return
                if excess is not None:
                    counts[decision.target.node_id] = counts.get(decision.target.node_id, 0) + 1
                    counts[conn.node_id] = counts.get(conn.node_id, 1) - 1
                    move.quota[conn.node_id] -= 1
                words = farewell(
                    conn.sniffed,
                    conn.wire_opening,
                    self._mode(conn),
                    decision.connector,
                    request.router,
                    refer=request.refer,
                )
                reason = CloseReason.EVACUATED
            if runtime.move(conn, words, reason):
                move.moved += 1
                move.moved_since += 1
                if self._metrics is not None and request.kind is MoveKind.EVACUATE:
                    self._metrics.evacuation_moved.inc((request.router, conn.node_id))
        if move.state is MoveState.WAITING:
            move.state, move.note = MoveState.RUNNING, ""

    def _mode(self, conn: LiveConnection) -> AcceptorMode:
        return self._modes.get(conn.conn.acceptor, AcceptorMode.PROXY)


def _check_rebalance(runtime: RouterRuntime) -> None:
    """A rebalance sends moved keys to the emptiest target through the cache; without one, only
    LEAST_CONNECTIONS sends a returning client to the emptiest target by itself."""
    config = runtime.config
    policy = config.policy.name if config.policy is not None else None
    if config.cache is None and policy != "LEAST_CONNECTIONS":
        raise MoveConflict(
            f"router {runtime.name!r} cannot rebalance: without a <cache> its {policy} policy would send "
            "moved clients back where they were (add a cache, or use LEAST_CONNECTIONS)"
        )
