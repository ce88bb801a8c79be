"""Worker processes at run time (`routerd --workers N`): the supervisor's side and a worker's.

The supervisor is routerd as always (configuration, probes, admin API, its own listeners), with
its listeners opened with `SO_REUSEPORT`. At start it makes one zone per router (zone.py: the
router's sticky cache and ROUND_ROBIN position) and joins its own engines to them; then it starts
N - 1 workers: its own command line with `--worker-of {"index": i, "zones": {router: fd}}`, the
zones' descriptors passed on. Each worker is a routerd without admin API, probes or files
(`Feature.in_workers`), which opens its own listeners on the same ports, joins its engines to the
zones it was given, and follows the supervisor's board: every `FOLLOW_PERIOD_S` its pools take the
readiness and administrative states the supervisor published (rules.py), and a new configuration
generation (a reload the supervisor made) makes it reload its own file. A worker whose supervisor
is gone stops.

The supervisor starts a worker that exits again (after `RESTART_FIRST_S`, doubling to
`RESTART_MAX_S` while it keeps failing), and at shutdown sends each SIGTERM (they drain over their
own grace period, as the supervisor does) and, at exit, kills those still running after the time
the kernel gives.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Final

import trio

from router.feature import Kernel, OpenError, Service
from router.features.workers.rules import Board, board_of, changes, refusal
from router.features.workers.zone import EXTENSION, join_zone, make_zone

if TYPE_CHECKING:
    from collections.abc import Mapping

    import router.features.workers._zone as _zone
    from router.runtime import RouterRuntime

__all__ = ["FOLLOW_PERIOD_S", "RESTART_FIRST_S", "RESTART_MAX_S", "Workers", "start", "worker_spec"]

log = logging.getLogger("router.workers")

FOLLOW_PERIOD_S: Final = 0.05
"""How often the supervisor publishes its targets' states and a worker takes them."""
RESTART_FIRST_S: Final = 1.0
"""A worker that exited is started again after this long, doubled while it keeps exiting."""
RESTART_MAX_S: Final = 30.0
"""At most this long between two starts of a worker."""
RESTART_RESET_S: Final = 60.0
"""A worker that ran this long before exiting is started again after `RESTART_FIRST_S`."""


def worker_spec(index: int, zones: Mapping[str, int]) -> str:
    """The value of a worker's `--worker-of`."""
    return json.dumps({"index": index, "zones": dict(zones)}, separators=(",", ":"))


class Workers(Service):
    """The supervisor's workers, or a worker's link to its supervisor (see the module docstring)."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._processes = kernel.processes
        self._zones: dict[str, _zone.Zone] = {}
        """Router name -> its zone."""
        self._offset = time.monotonic() - trio.current_time()
        """The zones' clock (the system's monotonic one) less this process's trio clock."""
        self._children: dict[int, trio.Process] = {}
        """A supervisor's running workers by number."""
        self._restarts: dict[int, int] = {}
        self._stopping = False
        self._generation = 0
        """A supervisor's configuration generation (one more at each reload it made)."""
        self._parent = os.getppid()

    # -- start --

    def open_files(self) -> None:
        """The supervisor makes the zones, a worker maps those it was given.

        Raises:
            OpenError: the configuration cannot be served by several processes (rules.py), or the
                zone extension was not built.
        """
        processes = self._processes
        if processes.count == 1:
            return
        if EXTENSION is None:
            raise OpenError(f"--workers {processes.count}: the workers' zone extension was not built")
        if processes.worker:
            for name, fd in processes.zones.items():
                try:
                    self._zones[name] = EXTENSION.Zone.attach(fd)
                except (OSError, EXTENSION.ZoneError) as exc:
                    raise OpenError(f"worker {processes.index}: the zone of {name!r}: {exc}") from exc
            return
        config = self._kernel.config()
        problem = refusal(config, processes.count)
        if problem is not None:
            raise OpenError(problem)
        for router in config.routers:
            try:
                self._zones[router.name] = make_zone(router.cache, 1)
            except OSError as exc:
                raise OpenError(
                    f"--workers {processes.count}: cannot make the zone of {router.name!r}: {exc}"
                ) from exc

    def router_added(self, runtime: RouterRuntime) -> None:
        self._join(runtime)

    def router_changed(self, runtime: RouterRuntime) -> None:
        self._join(runtime)

    def _join(self, runtime: RouterRuntime) -> None:
        """Make the router's engine decide with its zone (again: a reload builds a new engine)."""
        if self._processes.count == 1:
            return
        zone = self._zones.get(runtime.name)
        with runtime.held() as state:
            cache = state.config.cache
            if zone is None or (cache is not None and not _fits(zone, cache.max_entries, cache.timeout_ms)):
                log.warning(
                    "connection router %r: its cache and round-robin position are this process's own "
                    "until routerd restarts (a reload added the router or changed its <cache>): the "
                    "workers may send one key to different brokers",
                    runtime.name,
                )
                return
            join_zone(state.engine, zone, 0, offset=self._offset)

    def process_status(self) -> Mapping[str, object]:
        if self._processes.count == 1 or self._processes.worker:
            return {}
        return {
            "workers": [
                {"index": i, "pid": None if (p := self._children.get(i)) is None else p.pid, "restarts": r}
                for i, r in sorted(self._restarts.items())
            ]
        }

    # -- run --

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        processes = self._processes
        if processes.count == 1:
            task_status.started()
            return
        async with trio.open_nursery() as nursery:
            if processes.worker:
                nursery.start_soon(self._follow)
            else:
                nursery.start_soon(self._publish)
                for index in range(1, processes.count):
                    self._restarts[index] = 0
                    nursery.start_soon(self._supervise, index)
            task_status.started()

    async def _publish(self) -> None:
        """The supervisor's board: each router's targets, and the configuration's generation."""
        published: dict[str, bytes] = {}
        config = self._kernel.config()
        while True:
            if self._kernel.config() is not config:
                config = self._kernel.config()
                self._generation += 1
            for name, runtime in list(self._kernel.runtimes.items()):
                zone = self._zones.get(name)
                if zone is None:
                    continue
                with runtime.held() as state:
                    data = board_of(state.pool, self._generation).encode()
                if published.get(name) != data:
                    try:
                        zone.publish(data)
                        published[name] = data
                    except EXTENSION.ZoneError as exc:
                        log.warning(
                            "connection router %r: its workers keep the states they have: %s", name, exc
                        )
            await trio.sleep(FOLLOW_PERIOD_S)

    async def _follow(self) -> None:
        """A worker's pools follow the supervisor's board; a new generation reloads this worker."""
        seen: dict[str, int] = {}
        boards: dict[str, Board] = {}
        generation: int | None = None
        while True:
            if os.getppid() != self._parent:
                log.warning("worker %d: the supervisor is gone; stopping", self._processes.index)
                self._kernel.stop()
                return
            for name, zone in self._zones.items():
                read = zone.board(seen.get(name, 0))
                if read is not None:
                    seen[name] = read[0]
                    board = boards[name] = Board.decode(read[1])
                    if generation is not None and board.generation != generation:
                        log.info("worker %d: the supervisor reloaded; reloading", self._processes.index)
                        os.kill(os.getpid(), signal.SIGHUP)
                    generation = board.generation
            for name, board in boards.items():
                runtime = self._kernel.runtimes.get(name)
                if runtime is not None:
                    _follow_board(runtime, board)
            await trio.sleep(FOLLOW_PERIOD_S)

    async def _supervise(self, index: int) -> None:
        """Run worker `index`, starting it again when it exits before shutdown."""
        pause = RESTART_FIRST_S
        fds = {name: zone.fileno() for name, zone in self._zones.items()}
        command = [*self._processes.command, "--worker-of", worker_spec(index, fds)]
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}  # systemd hears the supervisor
        while not self._stopping:
            began = trio.current_time()
            try:
                process = await trio.lowlevel.open_process(
                    command, pass_fds=tuple(fds.values()), env=env, stdin=subprocess.DEVNULL
                )
            except OSError as exc:
                log.error("worker %d cannot start: %s", index, exc)
            else:
                self._children[index] = process
                log.info("worker %d started (pid %d)", index, process.pid)
                status = await process.wait()
                self._children.pop(index, None)
                if self.is_stopping():
                    log.info("worker %d (pid %d) stopped, %s", index, process.pid, _status(status))
                    return
                log.warning(
                    "worker %d (pid %d) %s; starting it again in %g s",
                    index,
                    process.pid,
                    _status(status),
                    pause,
                )
            self._restarts[index] += 1
            if trio.current_time() - began >= RESTART_RESET_S:
                pause = RESTART_FIRST_S
            await trio.sleep(pause)
            pause = min(pause * 2, RESTART_MAX_S)

    # -- stop --

    def is_stopping(self) -> bool:
        """Whether shutdown has begun (a worker that exits then is not started again)."""
        return self._stopping

    def stopping(self, grace_s: float) -> None:
        """Each worker drains as the supervisor does (SIGTERM)."""
        self._stopping = True
        for process in self._children.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)

    async def close_files(self, timeout_s: float) -> None:
        """The workers still running are told to stop (a start that failed), waited for within
        `timeout_s`, then killed."""
        self._stopping = True
        running = [p for p in self._children.values() if p.returncode is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout_s):
            for process in running:
                await process.wait()
        for process in running:
            if process.returncode is None:
                log.warning("worker (pid %d) did not stop in %g s: killed", process.pid, timeout_s)
                process.kill()
                with trio.move_on_after(1.0):
                    await process.wait()


def _fits(zone: _zone.Zone, max_entries: int, timeout_ms: int) -> bool:
    settings = zone.settings()
    return settings["max_entries"] == max_entries and settings["timeout_s"] == timeout_ms / 1000


def _status(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _follow_board(runtime: RouterRuntime, board: Board) -> None:
    """Bring a worker's pool to what the supervisor published."""
    with runtime.held() as state:
        todo = [] if state.pool is None else changes(board, state.pool)
    for change in todo:
        try:
            if change.member is None:
                runtime.pool.set_admin_state(change.node_id, change.admin)
            else:
                detail = "" if change.ready else "the supervisor's probe failed"
                runtime.pool.record_check(change.node_id, change.ready, detail, member=change.member)
        except (KeyError, IndexError, LookupError, ValueError):  # a reload changed the pool meanwhile
            continue


def start(kernel: Kernel) -> Workers:
    """The feature's service for one routerd."""
    return Workers(kernel)
