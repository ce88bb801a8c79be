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

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Final

import trio

from router.feature import Kernel, OpenError, Service
from router.features.workers.rules import (
    SUMMED,
    Board,
    Snapshot,
    add_snapshots,
    board_of,
    changes,
    counts_of,
    decode_snapshot,
    encode_snapshot,
    refusal,
)
from router.features.workers.zone import EXTENSION, join_zone, make_zone
from router.metric_values import Family, Histogram, MetricKind

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
METRICS_PERIOD_S: Final = 1.0
"""How often a worker sends the supervisor its counts (the supervisor's `/metrics` is at most this
much behind a worker's connections)."""
ORDERS_MAX: Final = 64
"""Orders to the workers waiting to be sent at most (an operator's moves: a few); beyond, one is
dropped with a WARNING."""
SNAPSHOT_MAX_BYTES: Final = 16 * 1024 * 1024
"""A worker's line of counts longer than this is a broken worker: its channel is closed."""


def worker_spec(index: int, zones: Mapping[str, int], channel: int) -> str:
    """The value of a worker's `--worker-of`."""
    return json.dumps({"index": index, "zones": dict(zones), "channel": channel}, separators=(",", ":"))


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
        self._counts: dict[int, Snapshot] = {}
        """A supervisor's: each running worker's last counts."""
        self._retired: Snapshot = {}
        """A supervisor's: the counters of workers that exited (they stay counted)."""
        self._streams: dict[int, trio.SocketStream] = {}
        """A supervisor's: each running worker's end of its socket pair."""
        self._orders_in, self._orders_out = trio.open_memory_channel[bytes](ORDERS_MAX)
        """A supervisor's orders to its workers (`Peers`), as lines, on their way."""

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
        self._kernel.metrics.sample_when_scraped(self._add_workers_counts)
        self._kernel.peers.send = self._order
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
                if processes.channel is not None:
                    stream = trio.SocketStream(
                        trio.socket.from_stdlib_socket(socket.socket(fileno=processes.channel))
                    )
                    nursery.start_soon(self._send_counts, stream)
                    nursery.start_soon(self._take_orders, stream)
            else:
                nursery.start_soon(self._publish)
                nursery.start_soon(self._tell_workers)
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
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}  # systemd hears the supervisor
        while not self._stopping:
            began = trio.current_time()
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            command = [*self._processes.command, "--worker-of", worker_spec(index, fds, theirs.fileno())]
            try:
                process = await trio.lowlevel.open_process(
                    command,
                    pass_fds=(*fds.values(), theirs.fileno()),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor, which tells it
                )
            except OSError as exc:
                log.error("worker %d cannot start: %s", index, exc)
                mine.close()
                theirs.close()
            else:
                theirs.close()  # the worker has its own copy
                self._children[index] = process
                log.info("worker %d started (pid %d)", index, process.pid)
                stream = self._streams[index] = trio.SocketStream(trio.socket.from_stdlib_socket(mine))
                async with trio.open_nursery() as reading:
                    reading.start_soon(self._receive_counts, index, stream)
                    status = await process.wait()
                    reading.cancel_scope.deadline = trio.current_time() + 1.0  # its last counts
                self._streams.pop(index, None)
                self._retire_counts(index)
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

    # -- counts --

    async def _receive_counts(self, index: int, channel: trio.SocketStream) -> None:
        """A worker's counts as they come (one line each), until it closes its end."""
        buffer = b""
        async with channel:
            while True:
                try:
                    data = await channel.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                if len(buffer) > SNAPSHOT_MAX_BYTES:
                    log.warning(
                        "worker %d sends counts of more than %d bytes: not read", index, SNAPSHOT_MAX_BYTES
                    )
                    return
                for line in lines[-1:]:  # only the latest matters
                    try:
                        self._counts[index] = decode_snapshot(line)
                    except (ValueError, TypeError) as exc:
                        log.warning("worker %d sent counts that cannot be read: %s", index, exc)

    def _retire_counts(self, index: int) -> None:
        """A worker exited: its counters stay counted (its gauges went with its connections)."""
        last = self._counts.pop(index, None)
        if last is not None:
            self._retired = add_snapshots([self._retired, counts_of(last)])

    def _add_workers_counts(self) -> None:
        """Before a scrape: each summed family's `others` are the workers' counts."""
        total = add_snapshots([self._retired, *self._counts.values()])
        for name in SUMMED:
            family = self._kernel.metrics.family(name)
            if family is None:
                continue
            values = total.get(name, ("", {}))[1]
            if isinstance(family, Histogram):
                family.others = {labels: list(v) for labels, v in values.items() if isinstance(v, list)}
            else:
                family.others = {labels: float(v) for labels, v in values.items() if not isinstance(v, list)}

    async def _send_counts(self, stream: trio.SocketStream) -> None:
        """A worker sends its counts every `METRICS_PERIOD_S` (and once more when it stops)."""
        async with stream:
            try:
                while True:
                    await stream.send_all(encode_snapshot(self._snapshot()))
                    await trio.sleep(METRICS_PERIOD_S)
            finally:
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(1.0),
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    await stream.send_all(encode_snapshot(self._snapshot()))

    def _snapshot(self) -> Snapshot:
        """This process's values of the summed families, every sampler run first."""
        metrics = self._kernel.metrics
        metrics.sample()
        snapshot: Snapshot = {}
        for name in SUMMED:
            family = metrics.family(name)
            if isinstance(family, Histogram):
                snapshot[name] = ("histogram", dict(family.values()))
            elif isinstance(family, Family):
                kind = "counter" if family.kind is MetricKind.COUNTER else "gauge"
                snapshot[name] = (kind, dict(family.values()))
        return snapshot

    # -- orders (`Peers`) --

    def _order(self, topic: str, order: Mapping[str, object]) -> None:
        """The supervisor's `Peers.send`: an order on its way to every worker."""
        line = json.dumps({"topic": topic, "order": order}, separators=(",", ":")).encode() + b"\n"
        try:
            self._orders_in.send_nowait(line)
        except trio.WouldBlock:
            log.warning("the workers were not told %s: %d orders wait to be sent already", topic, ORDERS_MAX)

    async def _tell_workers(self) -> None:
        """Send each order to every running worker (one that cannot take it is left out)."""
        async for line in self._orders_out:
            for index, stream in list(self._streams.items()):
                try:
                    with trio.fail_after(1.0):
                        await stream.send_all(line)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
                    log.warning("worker %d was not told an order: %s", index, type(exc).__name__)

    async def _take_orders(self, stream: trio.SocketStream) -> None:
        """A worker carries out its part of each order from its supervisor as it comes."""
        buffer = b""
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                    self._kernel.peers.deliver(str(message["topic"]), dict(message["order"]))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("worker %d: an order it cannot read: %s", self._processes.index, exc)

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
