"""The router process: listeners, the nursery tree, and graceful shutdown.

Nursery tree of `serve_router`:

    services   health-check loops (one task per target), the admin listener
    handlers   one task per client connection; at shutdown its deadline becomes now + grace
    accepting  one accept loop per acceptor; cancelled first at shutdown

Shutdown (SIGTERM in `routerd`, or the `shutdown` event in tests): stop accepting and close the
listening sockets, give open connections `grace_s` to finish, cancel what is left, stop services.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from keys import KeyType
from keys.detect import make_detector
from keys.users import UserStore
from router.admin import serve_admin
from router.health import serve_health_checks
from router.metrics import Metrics
from router.net import open_listeners
from router.proxy import AcceptorIO, ConnectionLimits, handle_connection
from router.routing import RouterRuntime
from router.tls import server_context

if TYPE_CHECKING:
    from router.settings import AcceptorConfig, Config

__all__ = ["ServerInfo", "StartupError", "serve_router"]

log = logging.getLogger("router.server")

# Errors of accept() that mean "out of a resource, try again shortly", as trio.serve_listeners
# treats them; anything else is a bug and propagates.
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
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
            if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
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


def _acceptor_io(acceptor: AcceptorConfig) -> AcceptorIO:
    """Detection and TLS of one acceptor.

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
    ios = {a.name: _acceptor_io(a) for a in config.acceptors}  # before any listener: fail early
    metrics = Metrics()
    runtimes = {
        r.name: RouterRuntime(config, r, metrics, round_robin_start=round_robin_start) for r in config.routers
    }
    async with trio.open_nursery() as services:
        for runtime in runtimes.values():
            await services.start(serve_health_checks, runtime)
            services.start_soon(runtime.serve_cache_purge)
        admin_bound = None
        if admin is not None:
            admin_bound = await services.start(serve_admin, admin[0], admin[1], runtimes, metrics)
        bound: dict[str, tuple[str, int]] = {}
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
                    for acceptor, listener in listeners:
                        accepting.start_soon(
                            _accept_loop,
                            listener,
                            acceptor,
                            runtimes[acceptor.router],
                            limits,
                            handlers,
                            ios[acceptor.name],
                        )
                    log.info("ready: %d acceptor(s) listening", len(bound))
                    task_status.started(ServerInfo(acceptors=bound, admin=admin_bound, runtimes=runtimes))
                    await shutdown.wait()
                    log.info("shutting down: no new connections; open ones get %g s", grace_s)
                    accepting.cancel_scope.cancel(reason="shutdown")
                for _, listener in listeners:
                    await listener.aclose()
                handlers.cancel_scope.deadline = trio.current_time() + grace_s
        finally:
            for _, listener in listeners:
                with trio.CancelScope(shield=True):  # release the ports even when cancelled
                    await listener.aclose()
        services.cancel_scope.cancel(reason="shutdown complete")
    log.info("stopped")
