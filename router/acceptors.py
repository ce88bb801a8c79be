"""Serving acceptors: what the process and a reload both do to start, stop and replace them.

An acceptor's set-up (`serve_acceptor`: its detection, TLS context and user store, read from their
files, `StartupError` when one cannot be), its listening sockets (`bind`, `close_listeners`), the
process's admission (`admission`: the descriptor budget and each acceptor's limits), and
`Serving`: the acceptors being served, each by the fast path's epoll thread or by accept loops in
the trio path (`plan.fast_path_serves` says which), with the bound addresses the status and
`ServerInfo` show. router/server.py starts them; router/reload.py replaces them in place.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio

from keys import KeyType
from keys.detect import make_detector
from keys.users import UserStore
from pools.gates import AcceptRate
from router.core.address import Address
from router.core.admission import DESCRIPTOR_RESERVE, AcceptorLimits, Admission, Refusal, descriptor_budget
from router.core.events import CloseReason
from router.core.plan import fast_path_serves
from router.datapath.acceptor import ServedAcceptor
from router.datapath.fast_path import Departing
from router.datapath.net import ACCEPT_BACKOFF_S, ACCEPT_CAPACITY_ERRNOS, open_listeners
from router.datapath.tls import server_context
from router.datapath.trio_path import depart, handle_connection, resume_connection
from router.services.process import descriptors_open

if TYPE_CHECKING:
    import ssl
    from collections.abc import Collection, Iterable

    from router.config.settings import AcceptorConfig, Config
    from router.datapath.acceptor import ConnectionLimits
    from router.datapath.fast_path import FastPath, HandedOver, Handoff
    from router.metrics import Metrics
    from router.runtime import RouterRuntime
    from router.services.process import ProcessView

__all__ = [
    "Acceptor",
    "Serving",
    "StartupError",
    "acceptor_limits",
    "acceptor_stores",
    "bind",
    "close_listeners",
    "make_admission",
    "serve_acceptor",
    "warn_unsupported",
]

log = logging.getLogger("router.server")

_UNLIMITED_DESCRIPTORS: Final = 1 << 20
"""What an unlimited RLIMIT_NOFILE counts as (Linux's default fs.nr_open)."""

_DESCRIPTORS_PER_ACCEPTOR: Final = 4
"""At most two listeners per acceptor (dual stack) and the fast path's copy of each."""

_SERVER_DESCRIPTORS: Final = 4
"""The fast path's epoll set and wake-up pipe, the admin listener."""

_DISCOVERED_PROBES: Final = 16
"""Probes counted for a discovery pool, whose members are not known at start."""


class StartupError(Exception):
    """The router cannot start with this configuration on this machine (a file, a port)."""


def warn_unsupported(config: Config, routers: Collection[str] | None = None) -> None:
    """Say once, at start (or for the routers a reload added or changed), what a configuration asks
    for that cannot work as written."""
    with_store = {a.router for a in config.acceptors if a.users_file is not None}
    for router in config.routers:
        if routers is not None and router.name not in routers:
            continue
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


def make_admission(
    config: Config, runtimes: Iterable[RouterRuntime], metrics: Metrics, max_connections: int | None
) -> Admission:
    """The process's admission: its descriptor budget for clients, at most `max_connections`
    (logged, and a metric, as is its use), and each acceptor's limits."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        limit = _UNLIMITED_DESCRIPTORS
    in_use = descriptors_open() or 0  # no /proc: count nothing, the reserve is there for it
    # Opened after this count: each acceptor's listeners (two for a dual-stack host) and the fast
    # path's copies of them, the fast path's epoll set and wake-up pipe, the admin listener.
    in_use += _DESCRIPTORS_PER_ACCEPTOR * len(config.acceptors) + _SERVER_DESCRIPTORS
    probes = 0
    for runtime in runtimes:
        if config.pool_discovery_group(runtime.config) is not None:
            probes += _DISCOVERED_PROBES
        probes += sum(len(t.connector.members) for t in runtime.pool.targets() if t.connector is not None)
    budget = descriptor_budget(limit, in_use, probes)
    if max_connections is not None and max_connections < budget:
        log.info("--max-connections %d: fewer than the descriptors allow (%d)", max_connections, budget)
        budget = max_connections
    log.info(
        "descriptor limit %d, %d in use: up to %d client connections at once (two descriptors each; "
        "%d kept for %d probe(s), the admin API and the process)",
        limit,
        in_use,
        budget,
        DESCRIPTOR_RESERVE + probes,
        probes,
    )
    metrics.connection_budget.set((), budget)
    for acceptor in config.acceptors:  # at 0 from the start: panels show 0, not "no data"
        for refusal in Refusal:
            metrics.connections_refused.inc((acceptor.name, refusal.value), 0)
        metrics.auth_failures.inc((acceptor.name,), 0)
    limits_by_name = {a.name: limits for a in config.acceptors if (limits := acceptor_limits(a)) is not None}
    admission = Admission(budget, limits_by_name)
    metrics.sample_when_scraped(lambda: metrics.client_connections.set((), admission.open))
    return admission


def acceptor_stores(acceptor: AcceptorConfig) -> tuple[ssl.SSLContext | None, UserStore | None]:
    """An acceptor's TLS server context and user store, read from their files.

    Raises:
        StartupError: its key store, trust store or user store cannot be loaded.
    """
    try:
        tls = None if acceptor.tls is None else server_context(acceptor.tls)
        users = None
        if acceptor.users_file is not None and acceptor.roles_file is not None:
            users = UserStore.load(acceptor.users_file, acceptor.roles_file)
    except ValueError as exc:  # UserStoreError is a ValueError too
        raise StartupError(f"acceptor {acceptor.name!r}: {exc}") from exc
    return tls, users


def serve_acceptor(
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    connection_ttl_ms: int,
    limits: ConnectionLimits,
    admission: Admission,
    stores: tuple[ssl.SSLContext | None, UserStore | None] | None = None,
) -> ServedAcceptor:
    """What one acceptor's connections share: detection, TLS, the user store, the TTL in force.

    Raises:
        StartupError: its key store, trust store or user store cannot be loaded (when `stores`,
            read before, is not given).
    """
    tls, users = acceptor_stores(acceptor) if stores is None else stores
    return ServedAcceptor(
        config=acceptor,
        runtime=runtime,
        detect=make_detector(acceptor.protocols),
        detect_inner=make_detector(acceptor.protocols, tls=False),
        tls=tls,
        users=users,
        connection_ttl_ms=connection_ttl_ms,
        limits=limits,
        admission=admission,
        accept_rate=None
        if acceptor.connection_rate < 0
        else AcceptRate(acceptor.connection_rate, acceptor.accept_burst),
    )


def acceptor_limits(acceptor: AcceptorConfig) -> AcceptorLimits | None:
    if acceptor.connections_allowed >= 0 or acceptor.connections_allowed_per_source >= 0:
        return AcceptorLimits(acceptor.connections_allowed, acceptor.connections_allowed_per_source)
    return None


async def _accept_loop(
    listener: trio.SocketListener, acceptor: ServedAcceptor, handlers: trio.Nursery
) -> None:
    rate = acceptor.accept_rate
    paused = acceptor.runtime.metrics.storm.acceptor_paused
    while True:
        if rate is not None and not rate.take(now := trio.current_time()):
            await trio.sleep_until(rate.ready_at(now))  # the kernel's backlog holds the rest meanwhile
            paused.inc((acceptor.name,), trio.current_time() - now)
            continue
        try:
            stream = await listener.accept()
        except trio.ClosedResourceError:  # a reload closed it (its scope was cancelled first)
            return
        except OSError as exc:
            if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                raise
            log.error(
                "acceptor=%s accept failed (%s); retrying in %g s",
                acceptor.name,
                exc.strerror,
                ACCEPT_BACKOFF_S,
            )
            await trio.sleep(ACCEPT_BACKOFF_S)
            continue
        try:
            peer = Address.of(stream.socket.getpeername())
        except OSError:  # the client reset before we looked
            stream.socket.close()
            continue
        if not acceptor.admit(peer):
            stream.socket.close()
            continue
        handlers.start_soon(handle_connection, stream, acceptor, peer)


def _duplicate(listener: trio.SocketListener) -> socket.socket:
    """A blocking-mode-agnostic stdlib twin of a trio listening socket, for the fast-path thread
    (closing the trio one at shutdown then leaves the twin to the thread, which closes it)."""
    return socket.socket(fileno=os.dup(listener.socket.fileno()))


def _handoff(handlers: trio.Nursery, acceptor: ServedAcceptor) -> Handoff:
    """How the fast-path thread passes a connection it cannot finish at once to the trio side."""
    token = trio.lowlevel.current_trio_token()

    def start(handed: HandedOver | Departing) -> None:  # in the trio thread
        try:
            if isinstance(handed, Departing):
                handlers.start_soon(depart, acceptor, handed)
            else:
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(handed.sock))
                handlers.start_soon(resume_connection, stream, acceptor, handed)
        except RuntimeError:  # shutting down: the handlers nursery is closed
            drop(handed)

    def drop(handed: HandedOver | Departing) -> None:
        if isinstance(handed, Departing):
            handed.client.close()
            handed.upstream.close()
            acceptor.runtime.connections.unregister(handed.conn)
        else:
            handed.sock.close()
        acceptor.release(handed.conn.conn.peer if isinstance(handed, Departing) else handed.conn.peer)

    def handoff(handed: HandedOver | Departing) -> None:  # in the fast-path thread
        try:
            token.run_sync_soon(start, handed)
        except trio.RunFinishedError:
            drop(handed)

    return handoff


async def bind(acceptor: AcceptorConfig, *, reuse_port: bool = False) -> list[trio.SocketListener]:
    """An acceptor's listeners (two for a dual-stack host); with `reuse_port`, ones other processes
    can open on the same port too (`SO_REUSEPORT`: routerd's worker processes).

    Raises:
        OSError: a listener could not be opened (the message names the acceptor).
    """
    where = f"acceptor {acceptor.name!r} on {acceptor.host}:{acceptor.port}"
    return await open_listeners(acceptor.host, acceptor.port, where, reuse_port=reuse_port)


def close_listeners(listeners: Iterable[trio.SocketListener]) -> None:
    """Close listening sockets at once (their accept loops were cancelled first)."""
    for listener in listeners:
        listener.socket.close()


@dataclass(eq=False, slots=True)
class Acceptor:
    """One acceptor being served: how, and on which listening sockets."""

    served: ServedAcceptor
    listeners: list[trio.SocketListener]
    fast: bool
    """Served by the fast path's thread (which holds copies of the sockets), else by accept loops."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """The accept loops of the trio path."""


class Serving:
    """The acceptors being served, and where each listens."""

    def __init__(self, fast: FastPath, process: ProcessView, *, reuse_port: bool = False) -> None:
        self.fast = fast
        self.process = process
        """Told which acceptors listen whenever they change (`GET /api/v1/status`)."""
        self.acceptors: dict[str, Acceptor] = {}
        self.bound: dict[str, tuple[str, int]] = {}
        """Acceptor name -> where it listens (`ServerInfo.acceptors`)."""
        self.handlers: trio.Nursery | None = None
        """The connections' tasks (the server sets it once its nursery is open)."""
        self.accepting: trio.Nursery | None = None
        """The accept loops."""
        self.reuse_port = reuse_port
        """Open listeners with `SO_REUSEPORT` (routerd with worker processes: each opens its own)."""

    async def listen(self, acceptor: AcceptorConfig) -> list[trio.SocketListener]:
        """An acceptor's listeners, opened as this process opens them (`bind`)."""
        return await bind(acceptor, reuse_port=self.reuse_port)

    async def end_of_grace(self, deadline: float, runtimes: Iterable[RouterRuntime]) -> None:
        """At the end of the grace period close every proxied connection left, on both data paths
        (reported as closed at shutdown), then cancel what is still opening or deciding."""
        await trio.sleep_until(deadline)
        for runtime in runtimes:
            runtime.connections.close_all(CloseReason.SHUTDOWN)
        self.fast.close_all()
        assert self.handlers is not None, "serving"
        self.handlers.cancel_scope.cancel(reason="grace period over")

    async def wait_for_fast_path(self) -> None:
        """Keep the handlers nursery open until the fast path's connections have ended."""
        await trio.to_thread.run_sync(self.fast.join, abandon_on_cancel=True)

    def start(self, acceptor: Acceptor) -> None:
        """Serve an acceptor's listeners: the fast path's thread, or accept loops."""
        assert self.handlers is not None
        assert self.accepting is not None
        served = acceptor.served
        if acceptor.fast:
            for listener in acceptor.listeners:
                self.fast.add_listener(_duplicate(listener), served, _handoff(self.handlers, served))
            return
        for listener in acceptor.listeners:
            self.accepting.start_soon(self._accept_in, acceptor.scope, listener, served, self.handlers)

    @staticmethod
    async def _accept_in(
        scope: trio.CancelScope, listener: trio.SocketListener, served: ServedAcceptor, handlers: trio.Nursery
    ) -> None:
        with scope:
            await _accept_loop(listener, served, handlers)

    def stop(self, acceptor: Acceptor) -> None:
        """Stop accepting on an acceptor's listeners (they stay open)."""
        acceptor.scope.cancel(reason="acceptor removed or changed by a reload")
        if acceptor.fast:
            self.fast.remove_listeners(acceptor.served.name)

    def add(self, served: ServedAcceptor, listeners: list[trio.SocketListener]) -> Acceptor:
        fast = fast_path_serves(served.config, served.runtime.config.key_type, served.connection_ttl_ms)
        acceptor = Acceptor(served=served, listeners=listeners, fast=fast)
        self.acceptors[served.name] = acceptor
        name = listeners[0].socket.getsockname()
        self.bound[served.name] = (str(name[0]), int(name[1]))
        for listener in listeners:
            name = listener.socket.getsockname()
            log.info(
                "acceptor=%s router=%s mode=%s listening on %s:%d",
                served.name,
                served.config.router,
                served.config.mode.value,
                name[0],
                name[1],
            )
        return acceptor

    def fast_path_started(self) -> None:
        """Start the fast path's thread once it serves an acceptor."""
        names = sorted(a.served.name for a in self.acceptors.values() if a.fast)
        if names and not self.fast.started:
            log.info("fast path (epoll relay thread) serves acceptor(s) %s", ", ".join(names))
            self.fast.start()
        self.process.serving(
            (
                (a.served, self.bound[name], a.fast)
                for name, a in self.acceptors.items()
                if name in self.bound
            ),
            self.fast if self.fast.started else None,
        )
