"""The router process: listeners, the nursery tree, and graceful shutdown.

Nursery tree of `serve_router`:

    services   health-check loops (one task per target), the admin listener, one connection-TTL
               checker per router whose acceptors have a TTL (router/services/ttl_checks.py), one
               ZooKeeper discovery task per router whose pool's members are in ZooKeeper
    handlers   one task per client connection; at shutdown its deadline becomes now + grace
    accepting  one accept loop per acceptor; cancelled first at shutdown

Shutdown (SIGTERM in `routerd`, or the `shutdown` event in tests): stop accepting and close the
listening sockets, give open connections `grace_s` to finish, cancel what is left, stop services.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from keys import KeyType
from keys.detect import make_detector
from keys.users import UserStore
from router.datapath.fast_path import FastPath, eligible
from router.datapath.net import ACCEPT_CAPACITY_ERRNOS, open_listeners
from router.datapath.tls import server_context
from router.datapath.trio_path import AcceptorIO, ConnectionLimits, handle_connection, resume_connection
from router.metrics import Metrics
from router.runtime import RouterRuntime
from router.services.admin import serve_admin
from router.services.discovery import serve_discovery
from router.services.health import serve_health_checks
from router.services.ttl_checks import serve_connection_ttl_checks

if TYPE_CHECKING:
    from router.config.settings import AcceptorConfig, Config
    from router.datapath.fast_path import HandedOver, Handoff

__all__ = ["ServerInfo", "StartupError", "serve_router"]

log = logging.getLogger("router.server")

_ACCEPT_BACKOFF_S = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerInfo:
    """What a started server listens on (for tests and the log)."""

    acceptors: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Acceptor name -> bound (host, port)."""
    admin: tuple[str, int] | None = None
    """The admin listener's bound (host, port), if any."""
    runtimes: dict[str, RouterRuntime] = field(default_factory=dict)
    """Router name -> its run-time state."""


async def _accept_loop(
    listener: trio.SocketListener,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
    handlers: trio.Nursery,
    io: AcceptorIO,
) -> None:
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                raise
            log.error(
                "acceptor=%s accept failed (%s); retrying in %g s",
                acceptor.name,
                exc.strerror,
                _ACCEPT_BACKOFF_S,
            )
            await trio.sleep(_ACCEPT_BACKOFF_S)
            continue
        handlers.start_soon(handle_connection, stream, acceptor, runtime, limits, io)


_FAST_PATH_JOIN_S = 5.0
"""How long shutdown waits for the fast-path thread once told to close everything."""


def _duplicate(listener: trio.SocketListener) -> socket.socket:
    """A blocking-mode-agnostic stdlib twin of a trio listening socket, for the fast-path thread
    (closing the trio one at shutdown then leaves the twin to the thread, which closes it)."""
    return socket.socket(fileno=os.dup(listener.socket.fileno()))


def _handoff(
    handlers: trio.Nursery,
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    limits: ConnectionLimits,
    io: AcceptorIO,
) -> Handoff:
    """How the fast-path thread passes a connection it cannot finish at once to the trio side."""
    token = trio.lowlevel.current_trio_token()

    def start(handed: HandedOver) -> None:  # in the trio thread
        try:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(handed.sock))
            handlers.start_soon(resume_connection, stream, acceptor, runtime, limits, io, handed)
        except RuntimeError:  # shutting down: the handlers nursery is closed
            handed.sock.close()

    def handoff(handed: HandedOver) -> None:  # in the fast-path thread
        try:
            token.run_sync_soon(start, handed)
        except trio.RunFinishedError:
            handed.sock.close()

    return handoff


async def _drain_fast_path(fast: FastPath) -> None:
    """Wait until the fast path's connections end by themselves; at the grace deadline (this task
    is cancelled) close the rest."""
    try:
        await trio.to_thread.run_sync(fast.join, abandon_on_cancel=True)
    finally:
        fast.close_all()


def _acceptor_io(acceptor: AcceptorConfig, connection_ttl_ms: int) -> AcceptorIO:
    """Detection, TLS and the connection TTL in force on one acceptor.

    Raises:
        StartupError: its key or trust store cannot be loaded.
    """
    try:
        tls = None if acceptor.tls is None else server_context(acceptor.tls)
        users = None
        if acceptor.users_file is not None and acceptor.roles_file is not None:
            users = UserStore.load(acceptor.users_file, acceptor.roles_file)
    except ValueError as exc:  # UserStoreError is a ValueError too
        raise StartupError(f"acceptor {acceptor.name!r}: {exc}") from exc
    return AcceptorIO(
        detect=make_detector(acceptor.protocols),
        detect_inner=make_detector(acceptor.protocols, tls=False),
        tls=tls,
        users=users,
        connection_ttl_ms=connection_ttl_ms,
    )


class StartupError(Exception):
    """The router cannot start with this configuration on this machine (a file, a port)."""


def _warn_unsupported(config: Config) -> None:
    """Say once, at start, what a configuration asks for that cannot work as written."""
    with_store = {a.router for a in config.acceptors if a.users_file is not None}
    for router in config.routers:
        if router.key_type is KeyType.ROLE_NAME and router.name not in with_store:
            log.warning(
                "router=%s key-type=ROLE_NAME: no acceptor of it has usersFile/rolesFile, so only "
                "client-certificate users have roles; every other connection's key is NULL",
                router.name,
            )
        group = config.pool_discovery_group(router)
        if group is not None and group.zookeeper is None:
            log.warning(
                "router=%s discovery group %r has no <zookeeper>: the router finds no members "
                "through broadcast or JGroups, so its pool stays empty",
                router.name,
                group.name,
            )


async def serve_router(
    config: Config,
    *,
    admin: tuple[str, int] | None = ("127.0.0.1", 9180),
    grace_s: float = 10.0,
    shutdown: trio.Event | None = None,
    limits: ConnectionLimits | None = None,
    round_robin_start: int | None = None,
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
        task_status: receives a `ServerInfo` once every listener is open.

    Raises:
        OSError: a listener could not be opened (address in use, permission).
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    limits = limits if limits is not None else ConnectionLimits()
    _warn_unsupported(config)
    ttl = config.connection_ttl
    # Before any listener: fail early.
    ios = {a.name: _acceptor_io(a, ttl.ttl_ms(a)) for a in config.acceptors}
    with_ttl = {a.router for a in config.acceptors if ttl.ttl_ms(a) > 0}
    metrics = Metrics()
    runtimes = {
        r.name: RouterRuntime(config, r, metrics, round_robin_start=round_robin_start) for r in config.routers
    }
    async with trio.open_nursery() as services:
        for runtime in runtimes.values():
            await services.start(serve_health_checks, runtime)
            services.start_soon(runtime.serve_cache_purge)
            group = config.pool_discovery_group(runtime.config)
            if group is not None and group.zookeeper is not None:
                await services.start(serve_discovery, runtime, group.zookeeper)
            if runtime.name in with_ttl:
                services.start_soon(serve_connection_ttl_checks, runtime, ttl.check_interval_ms / 1000)
        admin_bound = None
        if admin is not None:
            admin_bound = await services.start(serve_admin, admin[0], admin[1], runtimes, metrics)
        bound: dict[str, tuple[str, int]] = {}
        fast = FastPath(
            trio.lowlevel.current_clock().current_time,
            trio.lowlevel.current_trio_token().run_sync_soon,
            limits.connect_timeout_s,
        )
        listeners: list[tuple[AcceptorConfig, trio.SocketListener]] = []
        try:
            for acceptor in config.acceptors:
                where = f"acceptor {acceptor.name!r} on {acceptor.host}:{acceptor.port}"
                for listener in await open_listeners(acceptor.host, acceptor.port, where):
                    listeners.append((acceptor, listener))
                    name = listener.socket.getsockname()
                    bound.setdefault(acceptor.name, (str(name[0]), int(name[1])))
                    log.info(
                        "acceptor=%s router=%s mode=%s listening on %s:%d",
                        acceptor.name,
                        acceptor.router,
                        acceptor.mode.value,
                        name[0],
                        name[1],
                    )
            async with trio.open_nursery() as handlers:
                async with trio.open_nursery() as accepting:
                    fast_acceptors = set()
                    for acceptor, listener in listeners:
                        runtime, io = runtimes[acceptor.router], ios[acceptor.name]
                        if eligible(acceptor, runtime, io.connection_ttl_ms):
                            fast_acceptors.add(acceptor.name)
                            handoff = _handoff(handlers, acceptor, runtime, limits, io)
                            fast.add_listener(_duplicate(listener), acceptor, runtime, handoff, io.detect)
                            runtime.fast_path = fast
                        else:
                            accepting.start_soon(
                                _accept_loop, listener, acceptor, runtime, limits, handlers, io
                            )
                    if fast_acceptors:
                        log.info(
                            "fast path (epoll relay thread) serves acceptor(s) %s",
                            ", ".join(sorted(fast_acceptors)),
                        )
                        fast.start()
                    log.info("ready: %d acceptor(s) listening", len(bound))
                    task_status.started(ServerInfo(acceptors=bound, admin=admin_bound, runtimes=runtimes))
                    await shutdown.wait()
                    log.info("shutting down: no new connections; open ones get %g s", grace_s)
                    accepting.cancel_scope.cancel(reason="shutdown")
                    fast.stop_accepting()
                for _, listener in listeners:
                    await listener.aclose()
                if fast_acceptors:
                    handlers.start_soon(_drain_fast_path, fast)
                handlers.cancel_scope.deadline = trio.current_time() + grace_s
        finally:
            fast.close_all()
            for _, listener in listeners:
                with trio.CancelScope(shield=True):  # release the ports even when cancelled
                    await listener.aclose()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(fast.join, _FAST_PATH_JOIN_S)
        services.cancel_scope.cancel(reason="shutdown complete")
    log.info("stopped")
