"""The router process: listeners, the nursery tree, and graceful shutdown.

Nursery tree of `serve_router`:

    services   each feature's service (`Service.serve`) and its task for each router
               (`Service.serve_router`: health checks, the connection-TTL checker), the admin
               listener, one ZooKeeper discovery task per router whose pool's members are in
               ZooKeeper, and at shutdown the end of the grace period
    handlers   one task per client connection of the trio path (router/datapath/trio_path.py),
               and those the fast path hands over
    accepting  one accept loop per trio-path acceptor; cancelled first at shutdown

Acceptors that `plan.fast_path_serves` allows are served by the fast path's epoll thread
(router/datapath/fast_path.py) instead of an accept loop.

Before any listener the files routerd keeps are opened (router/kept_files.py: each feature's,
`Service.open_files` and `Service.prepare_router`: the state file, the persisted caches, the event
log), and each router is given to the features (`Service.router_added`); after shutdown their last
writes run (`Service.close_files`).

Each router's services run in two cancel scopes of their own (router/router_tasks.py), and each acceptor's
accept loops in one (router/acceptors.py), so that a reload can stop and start them one by one.

Shutdown (SIGTERM in `routerd`, or the `shutdown` event in tests): the admin API's /readyz answers
503 from this moment (it reads the same event, `Lifecycle`), stop accepting and close the
listening sockets, tell the features (`Service.stopping`: the moves feature moves the open
connections paced over `grace_s`), then close what is left on both paths through the
live-connection registry (reason `shutdown`), and stop the services.

Reload (SIGHUP in `routerd`, `POST /api/v1/reload`, `ServerInfo.reload`) is router/reload.py's,
carried out on this process (`ReloadHost`: the routers' tasks started, restarted and stopped
here); what start and reload share is router/acceptors.py (acceptors) and router/kept_files.py
(the features' files).
"""

from __future__ import annotations

import functools
import logging
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio

from router.acceptors import (
    Serving,
    StartupError,
    close_listeners,
    make_admission,
    serve_acceptor,
    warn_unsupported,
)
from router.config import load_config
from router.core.admin_access import AdminAccess
from router.core.reload import ReloadError
from router.datapath.acceptor import ConnectionLimits, ServedAcceptor
from router.datapath.native_path import open_fast_path
from router.feature import Kernel
from router.features import FEATURES, register_metrics, start_services
from router.features import routes as feature_routes
from router.kept_files import close_files, open_files
from router.metrics import Metrics
from router.processes import Processes
from router.reload import Reloads
from router.router_tasks import RouterTasks
from router.runtime import RouterRuntime
from router.services.admin import serve_admin
from router.services.admin_routes import KERNEL_ROUTES, AdminContext, Lifecycle
from router.services.files import EXIT_FILES_S
from router.services.notify import Notifier
from router.services.process import ProcessView, package_version

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

    from router.config.settings import Config
    from router.core.admission import Admission
    from router.core.reload import ConfigDiff
    from router.datapath.fast_path import FastPath

__all__ = ["EXIT_FILES_S", "ROUTES", "ReloadError", "ServerInfo", "StartupError", "serve_router"]

log = logging.getLogger("router.server")

ROUTES: Final = tuple((route.method, route.template) for route in (*KERNEL_ROUTES, *feature_routes()))
"""Every (method, path template) the admin API serves: the kernel's and the features'.
docs/admin-api.yaml describes each; tests/router/services/test_admin_api.py checks that the two
list the same operations, and a real routerd against both."""


_FAST_PATH_JOIN_S: Final = 5.0
"""How long shutdown waits for the fast-path thread once told to close everything."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerInfo:
    """What a started server listens on (for tests and the log)."""

    acceptors: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Acceptor name -> bound (host, port)."""
    admin: tuple[str, int] | None = None
    """The admin listener's bound (host, port), if any."""
    runtimes: dict[str, RouterRuntime] = field(default_factory=dict)
    """Router name -> its run-time state."""
    fast_path: FastPath | None = None
    """The fast path's epoll thread, when it serves any acceptor at start (`FastPath.acceptors`)."""
    reload: Callable[[], Awaitable[ConfigDiff]] | None = None
    """Read the configuration file again and apply it (`ReloadError`: nothing changed)."""


async def serve_router(
    config: Config,
    *,
    admin: tuple[str, int] | None = ("127.0.0.1", 9180),
    grace_s: float = 10.0,
    shutdown: trio.Event | None = None,
    limits: ConnectionLimits | None = None,
    round_robin_start: int | None = None,
    max_connections: int | None = None,
    options: Mapping[str, object] | None = None,
    admin_access: AdminAccess | None = None,
    load: Callable[[], Config] | None = None,
    reloads: trio.MemoryReceiveChannel[None] | None = None,
    data_path: str | None = None,
    lean: bool = False,
    processes: Processes | None = None,
    task_status: trio.TaskStatus[ServerInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the router until `shutdown` is set (or forever), then drain and return.

    Args:
        config: the loaded configuration.
        admin: (host, port) of the admin listener, or None for none.
        grace_s: how long open connections may continue after shutdown starts.
        shutdown: set it to start a graceful shutdown.
        limits: per-connection phase deadlines.
        round_robin_start: first round-robin position of every router (tests).
        max_connections: client connections served at once at most (`--max-connections`); None:
            what the descriptor limit allows.
        options: the features' routerd options by name (`Option`, router/feature.py: routerd's
            `--state-file` is `state_file`); one not given is the feature's default for a test's
            routerd (no state file, say).
        admin_access: the admin API's tokens and accepted Host names; None: no tokens, Host an
            IP literal or localhost.
        load: how a reload reads the configuration again (raises `ConfigError` for a bad file);
            by default `load_config(config.source)`.
        reloads: each item received is a reload request (routerd's SIGHUP), logged, never raised.
        data_path: what carries the fast path's acceptors (`--data-path`: native_path.DATA_PATHS);
            None: `native_path.default_data_path()`.
        lean: the native core may carry connections without Python once decided (routerd's;
            router/datapath/native_path.py): the metrics then count them when scraped, not as
            they happen.
        processes: which of routerd's processes this is (router/processes.py); None: the only
            one. Several open `SO_REUSEPORT` listeners; a worker runs only `Feature.in_workers`.
        task_status: receives a `ServerInfo` once every listener is open.

    Raises:
        OSError: a listener could not be opened (address in use, permission).
        StartupError: an acceptor's key, trust or user store cannot be loaded, or a feature's
            files (the state file, a persisted cache's file, the event log's directory and writer
            process: `Service.open_files`, `Service.prepare_router`) cannot be opened.
        ValueError: `options` names an option no feature has, or `data_path` is not one.
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    options = dict(options or {})
    unknown = sorted(set(options) - {o.name for feature in FEATURES for o in feature.options})
    if unknown:
        raise ValueError(f"no feature has the option(s) {unknown}")
    limits = limits if limits is not None else ConnectionLimits()
    warn_unsupported(config)
    metrics = register_metrics(Metrics())
    metrics.build_info.set((package_version(), platform.python_version()), 1)
    metrics.reload_successful.set((), 1)
    metrics.reload_timestamp.set((), time.time())
    runtimes = {
        r.name: RouterRuntime(config, r, metrics, round_robin_start=round_robin_start) for r in config.routers
    }
    ttl = config.connection_ttl
    admission = make_admission(config, runtimes.values(), metrics, max_connections)
    # Before any listener: fail early.
    served = [
        serve_acceptor(a, runtimes[a.router], ttl.ttl_ms(a), limits, admission) for a in config.acceptors
    ]
    source = config.source
    kept = _Options(
        shutdown=shutdown,
        load=load if load is not None else functools.partial(load_config, source),
        reloads=reloads,
        features=options,
        access=admin_access or AdminAccess(),
        round_robin_start=round_robin_start,
        data_path=data_path,
        lean=lean,
        processes=processes or Processes(),
    )
    server = _Server(config, runtimes, metrics, admission, limits, kept)
    services = list(server.features.values())
    try:
        await open_files(services, runtimes.values())  # the features' files
    except StartupError:
        with trio.CancelScope(shield=True):  # what the services opened
            await close_files(services)
        raise
    try:
        await server.serve(served, admin, grace_s, task_status)
    finally:
        # Cleanup, shielded: the last decisions' changes reach the files, within EXIT_FILES_S.
        with trio.CancelScope(shield=True):
            await close_files(services)
    log.info("stopped")


class _Server:
    """The running process: its listeners and routers, and what a reload changes in them."""

    def __init__(
        self,
        config: Config,
        runtimes: dict[str, RouterRuntime],
        metrics: Metrics,
        admission: Admission,
        limits: ConnectionLimits,
        options: _Options,
    ) -> None:
        self.config = config
        """The configuration in force."""
        self.held: Mapping[str, Config] = {}
        """Routers a reload could not change in place (router/core/reload.py)."""
        self.runtimes = runtimes
        """Shared with the admin API and `ServerInfo`: changed in place by reloads."""
        self.metrics = metrics
        self.admission = admission
        self.limits = limits
        self.options = options
        self.stopping = False
        self.notify = Notifier()
        """systemd's readiness protocol (nothing without systemd)."""
        clock, token = trio.lowlevel.current_clock(), trio.lowlevel.current_trio_token()
        self.fast = open_fast_path(
            options.data_path,
            clock.current_time,
            token.run_sync_soon,
            limits.connect_timeout_s,
            lean=metrics if options.lean else None,
        )
        kernel = Kernel(
            runtimes=runtimes,
            metrics=metrics,
            stop=options.shutdown.set,
            config=lambda: self.config,
            options=options.features,
            processes=options.processes,
        )
        self.features = start_services(kernel)
        """The features' services by type (router/features/), in `FEATURES` order."""
        self.routers = RouterTasks(self.features, lambda: self.config)
        """Each router's service tasks (router/router_tasks.py)."""
        self.lifecycle = Lifecycle(shutdown=options.shutdown)
        """/readyz: 503 from the moment shutdown is set."""
        self.process = ProcessView(admission)
        """GET /api/v1/status: told which acceptors listen whenever they change."""
        self.process.features = lambda: {
            name: value
            for service in self.features.values()
            for name, value in service.process_status().items()
        }
        self.process.zookeeper = lambda: [
            z for r in self.runtimes.values() for z in r.held().zookeeper.values()
        ]
        self.serving = Serving(self.fast, self.process, reuse_port=options.processes.count > 1)
        self.reloads = Reloads(
            self,
            load=options.load,
            round_robin_start=options.round_robin_start,
        )
        self.reload = self.reloads.reload
        """Read the configuration file again and apply it (router/reload.py)."""

    # -- the process --

    async def serve(
        self,
        served: Iterable[ServedAcceptor],
        admin: tuple[str, int] | None,
        grace_s: float,
        task_status: trio.TaskStatus[ServerInfo],
    ) -> None:
        """Serve until shutdown, then drain (see the module docstring)."""
        async with trio.open_nursery() as services:
            self.routers.nursery = services
            for runtime in self.runtimes.values():
                await self.routers.start_first(runtime)
            for service in self.features.values():
                await services.start(service.serve)
            admin_bound = None
            if admin is not None:
                options = self.options
                context = AdminContext(
                    runtimes=self.runtimes,
                    metrics=self.metrics,
                    access=options.access,
                    lifecycle=self.lifecycle,
                    reload=self.reload,
                    process=self.process,
                    routes=feature_routes(),
                    features=dict(self.features),
                )
                admin_bound = await services.start(serve_admin, admin[0], admin[1], context)
            if self.options.reloads is not None:
                services.start_soon(self.reloads.serve_signals, self.options.reloads)
            fast = self.fast
            fast_serves = False
            listeners: list[tuple[ServedAcceptor, list[trio.SocketListener]]] = []
            try:
                for one in served:
                    listeners.append((one, await self.serving.listen(one.config)))
                async with trio.open_nursery() as handlers:
                    self.serving.handlers = handlers
                    async with trio.open_nursery() as accepting:
                        self.serving.accepting = accepting
                        for one, sockets in listeners:
                            self.serving.start(self.serving.add(one, sockets))
                        self.serving.fast_path_started()
                        fast_serves = fast.started
                        self.lifecycle.accepting.set()
                        listening = f"{len(self.serving.bound)} acceptor(s) listening"
                        log.info("%sready: %s", self.options.processes.who, listening)
                        self.notify.ready(listening)
                        info = ServerInfo(
                            acceptors=self.serving.bound,
                            admin=admin_bound,
                            runtimes=self.runtimes,
                            fast_path=fast if fast_serves else None,
                            reload=self.reload,
                        )
                        task_status.started(info)
                        await self.options.shutdown.wait()
                        self.notify.stopping(f"shutting down: open connections are moved over {grace_s:g} s")
                        log.info(
                            "shutting down: no new connections; open ones are moved over %g s, then closed",
                            grace_s,
                        )
                        async with self.reloads.lock:  # a reload under way finishes first
                            self.stopping = True
                        accepting.cancel_scope.cancel(reason="shutdown")
                        fast.stop_accepting()
                    for serving in self.serving.acceptors.values():
                        close_listeners(serving.listeners)
                    for service in self.features.values():
                        service.stopping(grace_s)
                    deadline = trio.current_time() + grace_s
                    services.start_soon(self.serving.end_of_grace, deadline, list(self.runtimes.values()))
                    if fast.started:
                        handlers.start_soon(self.serving.wait_for_fast_path)
            finally:
                self.stopping = True
                fast.close_all()
                for _, sockets in listeners:
                    close_listeners(sockets)
                for serving in self.serving.acceptors.values():
                    close_listeners(serving.listeners)
                with trio.CancelScope(shield=True):  # release the ports even when cancelled
                    await trio.lowlevel.checkpoint()
                    await trio.to_thread.run_sync(fast.join, _FAST_PATH_JOIN_S)
            services.cancel_scope.cancel(reason="shutdown complete")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Options:
    """`serve_router`'s options that the server keeps."""

    shutdown: trio.Event
    load: Callable[[], Config]
    reloads: trio.MemoryReceiveChannel[None] | None
    features: Mapping[str, object]
    """The features' routerd options by name (`Kernel.options`)."""
    access: AdminAccess
    round_robin_start: int | None
    data_path: str | None
    lean: bool
    processes: Processes
