"""Carry out paced moves (rules.py): evacuations, rebalances, a paced shutdown.

`Moves` holds one paced move per router and target (an evacuation), per router (a rebalance) and
per process (a shutdown), each a task in the services nursery. Every `STEP_S` a task takes the
moves that are due, routes each connection's key again (`RoutingEngine.relocate`, which caches the
new target so the client that comes back through the router lands there), and has the data path
tell the client (`LiveConnection.move`, with the farewell of router/core/framing.py). A log line
sums up each second's moves; the last status of each move stays readable until the next one of
the same kind starts.

`Moves` is the feature's service (router/feature.py): at a graceful shutdown it moves every
router's connections over the grace period (`stopping`), and the clients of targets a reload
removed are moved as an evacuation moves them (`targets_left`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import time
from typing import TYPE_CHECKING, Final

import trio

from pools import AdminState
from router.core.engine import RouteStatus
from router.core.events import CloseReason
from router.core.framing import farewell
from router.feature import Service
from router.features.moves.metrics import MoveMetrics
from router.features.moves.rules import (
    STEP_S,
    MoveKind,
    MoveOrder,
    MoveRequest,
    MoveState,
    MoveStatus,
    due,
    first_to_move,
    rebalance_destination,
    rebalance_excess,
    rebalance_refusal,
    request_of,
    shutdown_rate,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from router.core.engine import RouteDecision
    from router.core.framing import Farewell
    from router.core.live import LiveConnection
    from router.core.reload import Departed
    from router.feature import Kernel
    from router.metrics import Metrics
    from router.processes import Peers
    from router.runtime import RouterRuntime

__all__ = ["MOVES_TOPIC", "MoveConflict", "Moves", "start"]

log = logging.getLogger("router.moves")

MOVES_TOPIC: Final = "moves"
"""The `Peers` topic of the supervisor's orders to its workers: {"start": request} or {"abort":
{kind, router, node_id}}."""

LOG_EVERY_S: Final = 1.0
"""A running move logs what it did at most this often (one line per batch of a second)."""

_Key = tuple[MoveKind, str, str | None]

_NOUNS: Final = {
    MoveKind.EVACUATE: "an evacuation",
    MoveKind.REBALANCE: "a rebalance",
    MoveKind.SHUTDOWN: "a shutdown",
}


_NOTHING_TO_DO: Final = {
    MoveKind.EVACUATE: "nothing to do: the target had no connection to move",
    MoveKind.REBALANCE: "nothing to do: every target was within the band of the mean",
    MoveKind.SHUTDOWN: "nothing to do: no connection to move",
}
"""The note of a move that ended done without moving anything."""


class MoveConflict(Exception):
    """A move cannot start: one of the same kind runs, or the router cannot do what it asks."""


class _Move:
    """One paced move under way (mutable; `Moves.status` gives a frozen view)."""

    def __init__(self, request: MoveRequest) -> None:
        self.request = request
        self.state = MoveState.RUNNING
        self.started_at = time.time()
        self.started = trio.current_time()
        self.finished_at: float | None = None
        self.finished: float | None = None
        """When it finished on trio's clock: its achieved rate stops there."""
        self.moved = 0
        self.left = 0
        """Once finished: what was left (while it runs, `Moves._left` counts it)."""
        self.note = ""
        self.scope = trio.CancelScope()
        self.paced_from = self.started
        """Pacing counts from here: reset after a wait, so a wait is not followed by a burst."""
        self.moved_since = 0
        self.queue: collections.deque[LiveConnection] = collections.deque()
        """The connections to move, in the order asked; taken once at the start, and again when
        it runs dry (connections registered meanwhile), so a step costs what it moves, not what
        the target holds."""
        self.quota: dict[str, int] = {}
        """A rebalance's plan, made at its start: connections still to move off each target."""
        self.planned: dict[str, int] = {}
        """A rebalance's view of each ready target's connections: at its start, plus those sent
        there since (a moved client takes a while to come back and be counted)."""

    @property
    def running(self) -> bool:
        return self.state in (MoveState.RUNNING, MoveState.WAITING)


def start(kernel: Kernel) -> Moves:
    """The feature's service for one routerd (one of its processes)."""
    moves = Moves(kernel.runtimes, kernel.metrics, stop=kernel.stop, processes=kernel.processes.count)
    if kernel.processes.worker:
        kernel.peers.listen(MOVES_TOPIC, moves.ordered)
    else:
        moves.peers = kernel.peers
    return moves


class Moves(Service):
    """The paced moves of one routerd."""

    def __init__(
        self,
        runtimes: Mapping[str, RouterRuntime],
        metrics: Metrics | None = None,
        *,
        rng: random.Random | None = None,
        stop: Callable[[], None] | None = None,
        processes: int = 1,
    ) -> None:
        self._runtimes = runtimes
        self._processes = processes
        """routerd's processes serving connections: an operator's move is shared out among them."""
        self.peers: Peers | None = None
        """The supervisor's: where an operator's move is told to the workers (`MOVES_TOPIC`)."""
        """Shared with the server: a reload's changes are seen here."""
        self._moves: dict[_Key, _Move] = {}
        self._nursery: trio.Nursery | None = None
        self._rng = rng or random.Random()
        self._metrics = None if metrics is None else metrics.feature(MoveMetrics)
        self._stop = stop
        """Starts the process's graceful shutdown (`POST /api/v1/shutdown`); None: not offered."""
        if metrics is not None:
            metrics.sample_when_scraped(self._sample)

    def _sample(self) -> None:
        """The remaining count of each evacuation; 0 once it finished (so a graph drops)."""
        assert self._metrics is not None
        family = self._metrics.evacuation_remaining
        for (kind, router, node_id), move in self._moves.items():
            if kind is MoveKind.EVACUATE and node_id is not None:
                family.set((router, node_id), float(self._left(move) if move.running else 0))

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the moves started from now on until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def stopping(self, grace_s: float) -> None:
        """Move every router's connections over the grace period, instead of closing them all at
        its end: a client told "shutting down" in its protocol reconnects (elsewhere, through
        another router) while the others go on."""
        for runtime in self._runtimes.values():
            open_now = len(runtime.connections.movable())
            if not open_now or grace_s <= 0:
                continue
            rate = shutdown_rate(open_now, grace_s)
            self.start(
                MoveRequest(kind=MoveKind.SHUTDOWN, router=runtime.name, rate=rate, order=MoveOrder.RANDOM)
            )

    def targets_left(self, runtime: RouterRuntime, departed: Sequence[Departed]) -> list[Departed]:
        """Move the clients of targets a reload removed, paced, as an evacuation does (the router
        goes on, so its moves can run). Connections to a member address an HA pair no longer has
        are left to the kernel, which closes them at once, so their clients reconnect to the
        pair's members."""
        closed_at_once = []
        for gone in departed:
            if gone.addresses is not None:
                closed_at_once.append(gone)
                continue
            request = MoveRequest(kind=MoveKind.EVACUATE, router=runtime.name, node_id=gone.node_id)
            try:
                self._begin(request)  # each process reloads: each moves its own
            except LookupError:  # no connection to it: nothing to move
                pass
            except MoveConflict:
                log.info(
                    "router=%s target=%s left the configuration: its evacuation runs already",
                    runtime.name,
                    gone.node_id,
                )
        return closed_at_once

    # -- what operators call --

    def shutdown(self) -> None:
        """Start the process's graceful shutdown, as SIGTERM does (its moves follow: `stopping`).

        Raises:
            MoveConflict: this routerd does not offer it.
        """
        if self._stop is None:
            raise MoveConflict("this process cannot be shut down through its admin API")
        self._stop()

    def start(self, request: MoveRequest) -> MoveStatus:
        """Start a paced move. With several processes (`routerd --workers N`) an evacuation or a
        rebalance is shared out: each process moves its own connections at 1/N of the rate, the
        workers told through `peers`; the status is this process's part.

        Raises:
            LookupError: no such router or target.
            MoveConflict: one of the same kind runs already, or a rebalance the router's policy
                and cache cannot carry out.
        """
        shared = self._processes > 1 and request.kind is not MoveKind.SHUTDOWN
        own = dataclasses.replace(request, rate=request.rate / self._processes) if shared else request
        status = self._begin(own)
        if shared and self.peers is not None:
            self.peers.broadcast(MOVES_TOPIC, {"start": own.to_json()})
        return status

    def ordered(self, order: Mapping[str, object]) -> None:
        """A worker's part of a move the supervisor started or aborted (`MOVES_TOPIC`)."""
        try:
            if isinstance(started := order.get("start"), dict):
                self._begin(request_of(started))
            elif isinstance(aborted := order.get("abort"), dict):
                node = aborted.get("node_id")
                self.abort(
                    MoveKind(aborted["kind"]), str(aborted["router"]), None if node is None else str(node)
                )
        except (LookupError, MoveConflict, ValueError) as exc:
            log.info("the supervisor's move order %s: not here: %s", order, exc)

    def _begin(self, request: MoveRequest) -> MoveStatus:
        """Start a paced move in this process (`start`)."""
        runtime = self._runtime(request.router)
        key = (request.kind, request.router, request.node_id)
        running = self._moves.get(key)
        if running is not None and running.running:
            raise MoveConflict(f"{_NOUNS[request.kind]} of {self._what(request)} is running already")
        if request.kind is MoveKind.EVACUATE:
            assert request.node_id is not None
            if runtime.pool.target(request.node_id) is None and not runtime.connections.movable(
                request.node_id
            ):
                # (a target a reload removed has no pool entry, but its connections are still here)
                raise LookupError(f"no target with node id {request.node_id!r} in router {request.router!r}")
        elif request.kind is MoveKind.REBALANCE:
            _check_rebalance(runtime)
        if self._nursery is None:
            raise MoveConflict("the router is not serving moves (it is starting or stopping)")
        move = _Move(request)
        if request.kind is MoveKind.REBALANCE:
            move.planned = _open_counts(runtime)
            move.quota = rebalance_excess(move.planned, request.band)
        self._refill(move, runtime)
        self._moves[key] = move
        self._nursery.start_soon(self._run, move, runtime)
        log.info(
            "router=%s %s of %s started: %d connection(s) at %g/s, %s first",
            request.router,
            request.kind.value,
            self._what(request),
            self._left(move),
            request.rate,
            request.order.value,
        )
        return self._status(move)

    def status(self, kind: MoveKind, router: str, node_id: str | None = None) -> MoveStatus:
        """The last move of this kind (running or finished).

        Raises:
            LookupError: there was none.
        """
        self._runtime(router)
        return self._status(self._last(kind, router, node_id))

    def abort(self, kind: MoveKind, router: str, node_id: str | None = None) -> MoveStatus:
        """Stop a running move (connections moved so far stay moved; an evacuated target stays
        drained).

        Raises:
            LookupError: there was none.
        """
        move = self._last(kind, router, node_id)
        if move.running:
            move.scope.cancel(reason="aborted")
            self._finish(move, MoveState.ABORTED)
        if self.peers is not None and self._processes > 1:
            self.peers.broadcast(
                MOVES_TOPIC, {"abort": {"kind": kind.value, "router": router, "node_id": node_id}}
            )
        return self._status(move)

    def all_statuses(self) -> list[MoveStatus]:
        return [self._status(m) for m in self._moves.values()]

    # -- carrying a move out --

    def _runtime(self, router: str) -> RouterRuntime:
        runtime = self._runtimes.get(router)
        if runtime is None:
            raise LookupError(f"no connection router named {router!r}")
        return runtime

    def _last(self, kind: MoveKind, router: str, node_id: str | None) -> _Move:
        move = self._moves.get((kind, router, node_id))
        if move is None:
            raise LookupError(f"no {kind.value} of {router}{'' if node_id is None else '/' + node_id} so far")
        return move

    @staticmethod
    def _what(request: MoveRequest) -> str:
        if request.node_id is not None:
            return f"target={request.node_id}"
        return "the pool" if request.kind is MoveKind.REBALANCE else "every connection"

    def _left(self, move: _Move) -> int:
        """Connections the move still has to move: counted while it runs, kept once it ended."""
        if not move.running:
            return move.left
        if move.request.kind is MoveKind.REBALANCE:
            return sum(n for n in move.quota.values() if n > 0)
        runtime = self._runtimes.get(move.request.router)
        return 0 if runtime is None else _count_movable(runtime, move.queue)

    def _status(self, move: _Move) -> MoveStatus:
        elapsed = (trio.current_time() if move.finished is None else move.finished) - move.started
        left = self._left(move)
        return MoveStatus(
            request=move.request,
            state=move.state,
            started_at=move.started_at,
            moved=move.moved,
            left=left,
            rate=move.moved / elapsed if elapsed > 0 else 0.0,
            eta_s=left / move.request.rate if move.running else None,
            finished_at=move.finished_at,
            note=move.note,
        )

    def _finish(self, move: _Move, state: MoveState) -> None:
        if not move.running:
            return
        move.left = 0 if state is MoveState.DONE else self._left(move)
        move.state = state
        move.finished_at, move.finished = time.time(), trio.current_time()
        if state is MoveState.DONE and move.moved == 0 and not move.note:
            move.note = _NOTHING_TO_DO[move.request.kind]
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

    def _refill(self, move: _Move, runtime: RouterRuntime) -> None:
        """Queue the connections to move, in the order asked (`first_to_move`)."""
        request = move.request
        if request.kind is MoveKind.EVACUATE:
            connections = runtime.connections.movable(request.node_id)
        elif request.kind is MoveKind.SHUTDOWN:
            connections = runtime.connections.movable()
        else:
            connections = [
                c for node_id, n in move.quota.items() if n > 0 for c in runtime.connections.movable(node_id)
            ]
        move.queue = collections.deque(first_to_move(connections, len(connections), request.order, self._rng))

    def _next(self, move: _Move, runtime: RouterRuntime) -> LiveConnection | None:
        """The next connection to move (queued again once the queue ran dry); None: none is left."""
        for _ in range(2):
            queue = move.queue
            while queue:
                conn = queue.popleft()
                if _is_movable(runtime, conn) and (not move.quota or move.quota.get(conn.node_id, 0) > 0):
                    return conn
            self._refill(move, runtime)
        return None

    async def _run(self, move: _Move, runtime: RouterRuntime) -> None:
        request = move.request
        if request.kind is MoveKind.EVACUATE:
            assert request.node_id is not None
            in_pool = runtime.pool.target(request.node_id) is not None
            if in_pool and request.node_id not in runtime.pool.admin_states():
                runtime.pool.set_admin_state(request.node_id, AdminState.DRAIN)  # no new connections there
        at_once = request.kind is not MoveKind.SHUTDOWN
        logged_at, logged_moved = trio.current_time(), 0
        with move.scope:
            while True:
                now = trio.current_time()
                count = due(request.rate, now - move.paced_from, move.moved_since, at_once=at_once)
                if count and not self._step(move, runtime, count):
                    self._finish(move, MoveState.DONE)
                    return
                if now - logged_at >= LOG_EVERY_S and move.moved > logged_moved:
                    left = self._left(move)
                    log.info(
                        "router=%s %s of %s: moved=%d (+%d) left=%d eta=%.0fs%s",
                        request.router,
                        request.kind.value,
                        self._what(request),
                        move.moved,
                        move.moved - logged_moved,
                        left,
                        left / request.rate,
                        f" ({move.note})" if move.note else "",
                    )
                    logged_at, logged_moved = now, move.moved
                await trio.sleep(STEP_S)

    def _step(self, move: _Move, runtime: RouterRuntime, count: int) -> bool:
        """Make up to `count` moves; False when nothing is left to move."""
        request = move.request
        rebalance = request.kind is MoveKind.REBALANCE
        shutting_down = request.kind is MoveKind.SHUTDOWN
        for _ in range(count):
            conn = self._next(move, runtime)
            if conn is None:
                return False
            destination = None
            if not shutting_down:
                to = rebalance_destination(move.planned, conn.node_id) if rebalance else None
                decision = _relocate(runtime, conn.key, conn.node_id, to)
                if decision.status is not RouteStatus.OK or decision.target is None:
                    move.queue.appendleft(conn)  # it goes first once a target is open again
                    move.state = MoveState.WAITING
                    move.note = f"no other target open to new connections ({decision.reason.value})"
                    move.paced_from, move.moved_since = trio.current_time(), 0
                    return True
                if rebalance:
                    move.planned[decision.target.node_id] = move.planned.get(decision.target.node_id, 0) + 1
                    move.planned[conn.node_id] = move.planned.get(conn.node_id, 1) - 1
                    move.quota[conn.node_id] -= 1
                destination = decision.connector
            words = farewell(
                conn.protocol,
                conn.protocol_version,
                conn.wire_format,
                conn.mode,
                destination,
                request.router,
                shutting_down=shutting_down,
                refer=request.refer,
            )
            reason = CloseReason.SHUTDOWN if shutting_down else CloseReason.EVACUATED
            if _move(runtime, conn, words, reason):
                move.moved += 1
                move.moved_since += 1
                if self._metrics is not None and request.kind is MoveKind.EVACUATE:
                    self._metrics.evacuation_moved.inc((request.router, conn.node_id))
        if move.state is MoveState.WAITING:
            move.state, move.note = MoveState.RUNNING, ""
        return True


def _check_rebalance(runtime: RouterRuntime) -> None:
    why = rebalance_refusal(runtime.config)
    if why is not None:
        raise MoveConflict(why)


# -- the moves' slice of a router at run time (under its lock: `RouterRuntime.held`) --


def _open_counts(runtime: RouterRuntime) -> dict[str, int]:
    """Connections not yet closed or moved, per target open to new connections (a rebalance's
    view; targets without connections count 0)."""
    with runtime.held() as state:
        if state.pool is None:
            return {}
        return {t.node_id: len(state.connections.open_to(t.node_id)) for t in state.pool.ready_targets()}


def _is_movable(runtime: RouterRuntime, conn: LiveConnection) -> bool:
    """Whether a connection is still open and neither closed nor moved by the router."""
    return _count_movable(runtime, (conn,)) == 1


def _count_movable(runtime: RouterRuntime, conns: Iterable[LiveConnection]) -> int:
    """How many of these connections are still open and neither closed nor moved by the router."""
    with runtime.held() as state:
        return sum(1 for conn in conns if conn.closed_by is None and state.connections.holds(conn))


def _relocate(runtime: RouterRuntime, key: str, leaving: str, to: str | None) -> RouteDecision:
    """Route a moved connection's key again (`RoutingEngine.relocate`), caching the result."""
    with runtime.held() as state:
        return state.engine.relocate(key, leaving, trio.current_time(), to=to)


def _move(runtime: RouterRuntime, conn: LiveConnection, words: Farewell, reason: CloseReason) -> bool:
    """Have a connection's data path tell its client `words` and end it (`LiveConnection.move`);
    False when the router had closed or moved it already."""
    with runtime.held():
        return conn.move(words, reason)
