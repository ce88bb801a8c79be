"""The router process: listeners, the nursery tree, and graceful shutdown.

Nursery tree of `serve_router`:

    services   health-check loops (one task per target), the admin listener, one connection-TTL
               checker per router whose acceptors have a TTL (router/services/ttl_checks.py), one
               ZooKeeper discovery task per router whose pool's members are in ZooKeeper, and at
               shutdown the end of the grace period
    handlers   one task per client connection of the trio path (router/datapath/trio_path.py),
               and those the fast path hands over
    accepting  one accept loop per trio-path acceptor; cancelled first at shutdown

Acceptors that `plan.fast_path_serves` allows are served by the fast path's epoll thread
(router/datapath/fast_path.py) instead of an accept loop.

Shutdown (SIGTERM in `routerd`, or the `shutdown` event in tests): stop accepting and close the
listening sockets, give open connections `grace_s` to finish, then close what is left on both paths
through the live-connection registry (reason `shutdown`), and stop the services.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio

from keys import KeyType
from keys.detect import make_detector
from keys.users import UserStore
from router.core.address import Address
from router.core.admin_access import AdminAccess
from router.core.admission import DESCRIPTOR_RESERVE, AcceptorLimits, Admission, descriptor_budget
from router.core.events import CloseReason
from router.core.plan import fast_path_serves
from router.datapath.acceptor import ConnectionLimits, ServedAcceptor
from router.datapath.fast_path import FastPath
from router.datapath.net import ACCEPT_BACKOFF_S, ACCEPT_CAPACITY_ERRNOS, open_listeners
from router.datapath.tls import server_context
from router.datapath.trio_path import handle_connection, resume_connection
from router.metrics import Metrics
from router.runtime import RouterRuntime
from router.services.admin import serve_admin
from router.services.cache_store import (
    CacheStore,
    CacheStoreError,
    serve_cache_store,
    set_aside,
    write_cache_changes,
)
from router.services.discovery import serve_discovery
from router.services.event_log import EventLog, EventLogError, default_router_id
from router.services.health import serve_health_checks
from router.services.shared_cache import SharedCache
from router.services.state_file import StateFile, StateFileError
from router.services.ttl_checks import serve_connection_ttl_checks

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from router.config.settings import AcceptorConfig, Config
    from router.datapath.fast_path import HandedOver, Handoff

__all__ = ["ServerInfo", "StartupError", "serve_router"]

log = logging.getLogger("router.server")

_UNLIMITED_DESCRIPTORS: Final = 1 << 20
"""What an unlimited RLIMIT_NOFILE counts as (Linux's default fs.nr_open)."""
_DESCRIPTORS_PER_ACCEPTOR: Final = 4
"""At most two listeners per acceptor (dual stack) and the fast path's copy of each."""
_SERVER_DESCRIPTORS: Final = 4
"""The fast path's epoll set and wake-up pipe, the admin listener."""
_DISCOVERED_PROBES: Final = 16
"""Probes counted for a discovery pool, whose members are not known at start."""

_FAST_PATH_JOIN_S: Final = 5.0
EVENT_LOG_STOP_S: Final = 30.0
"""At shutdown, how long the event log's writer may take to write what its ring holds and finish
its file (a full ring of 65,536 events takes well under a second; compressing 64 MB, about one)."""
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
    """The fast path's epoll thread, when it serves any acceptor (`FastPath.acceptors`)."""


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


def _admission(
    config: Config, runtimes: Iterable[RouterRuntime], metrics: Metrics, max_connections: int | None
) -> Admission:
    """The process's admission: its descriptor budget for clients, at most `max_connections`
    (logged, and a metric, as is its use), and each acceptor's limits."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        limit = _UNLIMITED_DESCRIPTORS
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: count nothing, the reserve is there for it
        in_use = 0
    # Opened after this count: each acceptor's listeners (two for a dual-stack host) and the fast
    # path's copies of them, the fast path's epoll set and wake-up pipe, the admin listener.
    in_use += _DESCRIPTORS_PER_ACCEPTOR * len(config.acceptors) + _SERVER_DESCRIPTORS
    probes = 0
    for runtime in runtimes:
        if config.pool_discovery_group(runtime.config) is not None:
            probes += _DISCOVERED_PROBES
        probes += sum(len(t.connector.members) for t in runtime.targets() if t.connector is not None)
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
    acceptor_limits = {
        a.name: AcceptorLimits(a.connections_allowed, a.connections_allowed_per_source)
        for a in config.acceptors
        if a.connections_allowed >= 0 or a.connections_allowed_per_source >= 0
    }
    admission = Admission(budget, acceptor_limits)
    metrics.sample_when_scraped(lambda: metrics.client_connections.set((), admission.open))
    return admission


def _serve_acceptor(
    acceptor: AcceptorConfig,
    runtime: RouterRuntime,
    connection_ttl_ms: int,
    limits: ConnectionLimits,
    admission: Admission,
) -> ServedAcceptor:
    """What one acceptor's connections share: detection, TLS, the user store, the TTL in force.

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
    )


async def _accept_loop(
    listener: trio.SocketListener, acceptor: ServedAcceptor, handlers: trio.Nursery
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

    def start(handed: HandedOver) -> None:  # in the trio thread
        try:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(handed.sock))
            handlers.start_soon(resume_connection, stream, acceptor, handed)
        except RuntimeError:  # shutting down: the handlers nursery is closed
            handed.sock.close()
            acceptor.release(handed.conn.peer)

    def handoff(handed: HandedOver) -> None:  # in the fast-path thread
        try:
            token.run_sync_soon(start, handed)
        except trio.RunFinishedError:
            handed.sock.close()
            acceptor.release(handed.conn.peer)

    return handoff


async def _open_listeners(
    acceptors: Iterable[ServedAcceptor],
) -> tuple[list[tuple[ServedAcceptor, trio.SocketListener]], dict[str, tuple[str, int]]]:
    """A listener per acceptor (two for a dual-stack host), and where each acceptor is bound.

    Raises:
        OSError: a listener could not be opened (the message names the acceptor).
    """
    listeners: list[tuple[ServedAcceptor, trio.SocketListener]] = []
    bound: dict[str, tuple[str, int]] = {}
    for served in acceptors:
        acceptor = served.config
        where = f"acceptor {acceptor.name!r} on {acceptor.host}:{acceptor.port}"
        for listener in await open_listeners(acceptor.host, acceptor.port, where):
            listeners.append((served, listener))
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
    return listeners, bound


def _start_accepting(
    listeners: Iterable[tuple[ServedAcceptor, trio.SocketListener]],
    fast: FastPath,
    accepting: trio.Nursery,
    handlers: trio.Nursery,
) -> bool:
    """An accept loop per trio-path acceptor, the fast path for the others; whether it serves any."""
    fast_acceptors = set()
    for served, listener in listeners:
        if fast_path_serves(served.config, served.runtime.config.key_type, served.connection_ttl_ms):
            fast_acceptors.add(served.name)
            fast.add_listener(_duplicate(listener), served, _handoff(handlers, served))
        else:
            accepting.start_soon(_accept_loop, listener, served, handlers)
    if fast_acceptors:
        log.info("fast path (epoll relay thread) serves acceptor(s) %s", ", ".join(sorted(fast_acceptors)))
        fast.start()
    return bool(fast_acceptors)


async def _start_services(
    config: Config,
    runtimes: Mapping[str, RouterRuntime],
    metrics: Metrics,
    services: trio.Nursery,
    admin: tuple[str, int] | None,
    event_log: EventLog | None,
    states: StateFile | None,
    access: AdminAccess,
) -> tuple[str, int] | None:
    """Probes, cache sweeps, discovery, TTL checks and the admin API; the admin's bound address."""
    ttl = config.connection_ttl
    with_ttl = {a.router for a in config.acceptors if ttl.ttl_ms(a) > 0}
    for runtime in runtimes.values():
        await services.start(serve_health_checks, runtime)
        services.start_soon(runtime.serve_cache_purge)
        group = config.pool_discovery_group(runtime.config)
        if group is not None and group.zookeeper is not None:
            await services.start(serve_discovery, runtime, group.zookeeper)
        if runtime.config.cache_zookeeper is not None:
            shared = SharedCache(runtime, runtime.config.cache_zookeeper)
            runtime.attach_shared(shared)
            await services.start(shared.serve)
        if runtime.name in with_ttl:
            services.start_soon(serve_connection_ttl_checks, runtime, ttl.check_interval_ms / 1000)
    if admin is None:
        return None
    bound: tuple[str, int] = await services.start(
        functools.partial(serve_admin, event_log=event_log, states=states, access=access),
        admin[0],
        admin[1],
        runtimes,
        metrics,
    )
    return bound


async def _end_of_grace(
    deadline: float, runtimes: Iterable[RouterRuntime], fast: FastPath, handlers: trio.CancelScope
) -> None:
    """At the end of the grace period close every proxied connection left, on both data paths
    (reported as closed at shutdown), then cancel what is still opening or deciding."""
    await trio.sleep_until(deadline)
    for runtime in runtimes:
        runtime.close_all(CloseReason.SHUTDOWN)
    fast.close_all()
    handlers.cancel(reason="grace period over")


async def _wait_for_fast_path(fast: FastPath) -> None:
    """Keep the handlers nursery open until the fast path's connections have ended."""
    await trio.to_thread.run_sync(fast.join, abandon_on_cancel=True)


async def serve_router(
    config: Config,
    *,
    admin: tuple[str, int] | None = ("127.0.0.1", 9180),
    grace_s: float = 10.0,
    shutdown: trio.Event | None = None,
    limits: ConnectionLimits | None = None,
    round_robin_start: int | None = None,
    max_connections: int | None = None,
    discard_unreadable_cache: bool = False,
    state_file: str | None = None,
    admin_access: AdminAccess | None = None,
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
        discard_unreadable_cache: a persisted cache file that cannot be read is renamed aside and
            the router starts with an empty cache (`--discard-unreadable-cache`); else that is a
            `StartupError`.
        state_file: where targets' administrative states are kept across restarts (read at
            start, written on each change); None: in memory only.
        admin_access: the admin API's tokens and accepted Host names; None: no tokens, Host an
            IP literal or localhost.
        task_status: receives a `ServerInfo` once every listener is open.

    Raises:
        OSError: a listener could not be opened (address in use, permission).
        StartupError: an acceptor's key, trust or user store cannot be loaded, or a persisted
            cache's file cannot be opened.
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    limits = limits if limits is not None else ConnectionLimits()
    _warn_unsupported(config)
    metrics = Metrics()
    runtimes = {
        r.name: RouterRuntime(config, r, metrics, round_robin_start=round_robin_start) for r in config.routers
    }
    ttl = config.connection_ttl
    admission = _admission(config, runtimes.values(), metrics, max_connections)
    # Before any listener: fail early.
    served = [
        _serve_acceptor(a, runtimes[a.router], ttl.ttl_ms(a), limits, admission) for a in config.acceptors
    ]
    states = None if state_file is None else _restore_admin_states(StateFile(state_file), runtimes)
    stores = _open_cache_stores(runtimes.values(), discard_unreadable_cache)
    try:
        event_log = _start_event_log(config, runtimes.values(), metrics)
    except StartupError:
        _close_cache_stores(stores)
        raise
    try:
        await _serve(
            config,
            runtimes,
            served,
            metrics,
            admin,
            grace_s,
            shutdown,
            limits,
            event_log,
            stores,
            states,
            admin_access or AdminAccess(),
            task_status,
        )
    finally:
        with trio.CancelScope(shield=True):  # the last decisions' changes reach the file
            for runtime, store in stores:
                await write_cache_changes(runtime, store)
        _close_cache_stores(stores)
        if event_log is not None:
            with trio.CancelScope(shield=True):  # what the ring holds is written, the file finished
                if not await trio.to_thread.run_sync(event_log.stop, EVENT_LOG_STOP_S):
                    log.warning("event log: the writer did not finish within %g s", EVENT_LOG_STOP_S)
    log.info("stopped")


def _restore_admin_states(states: StateFile, runtimes: Mapping[str, RouterRuntime]) -> StateFile:
    """Apply the administrative states a state file keeps (each change is logged).

    Raises:
        StartupError: the file cannot be read.
    """
    try:
        kept = states.load()
    except StateFileError as exc:
        raise StartupError(f"{exc}; fix or delete it (it holds only targets' drain/maint states)") from exc
    restored = 0
    for router, targets in kept.items():
        runtime = runtimes.get(router)
        if runtime is None:
            log.warning("state file %s: no connection router %r: its states are dropped", states.path, router)
            continue
        for node_id, state in targets.items():
            try:
                runtime.set_admin_state(node_id, state)
            except (LookupError, ValueError) as exc:
                log.warning("state file %s: %s: dropped", states.path, exc)
                continue
            restored += 1
    if restored:
        log.info("state file %s: %d administrative state(s) restored", states.path, restored)
    return states


def _open_cache_stores(
    runtimes: Iterable[RouterRuntime], discard_unreadable: bool
) -> list[tuple[RouterRuntime, CacheStore]]:
    """Open each persisted cache's file and load its entries into the router's cache.

    Raises:
        StartupError: a file cannot be opened or read (unless `discard_unreadable`: then it is
            renamed aside, logged, and the cache starts empty), or another routerd holds it.
    """
    stores: list[tuple[RouterRuntime, CacheStore]] = []
    try:
        for runtime in runtimes:
            cache = runtime.config.cache
            if cache is None or not cache.persisted:
                continue
            assert cache.file is not None, "the loader gives a persisted cache its file"
            store = _open_cache_store(runtime.name, cache.file, discard_unreadable)
            stores.append((runtime, store))
            now, wall = trio.current_time(), time.time()  # read together: the offset between them
            try:
                rows = store.load(wall, cache.timeout_ms, wall - now)
            except CacheStoreError as exc:
                raise StartupError(f"router {runtime.name!r}: {exc}") from exc
            loaded = runtime.restore_cache(rows, now)
            log.info("router=%s persisted cache %s: %d entries loaded", runtime.name, cache.file, loaded)
    except StartupError:
        _close_cache_stores(stores)
        raise
    return stores


def _open_cache_store(router: str, path: str, discard_unreadable: bool) -> CacheStore:
    try:
        return CacheStore.open(path)
    except CacheStoreError as exc:
        if not (exc.damaged and discard_unreadable):
            hint = "; move it away, or start routerd with --discard-unreadable-cache" if exc.damaged else ""
            raise StartupError(f"router {router!r}: {exc}{hint}") from exc
        aside = set_aside(path)
        log.warning("router=%s %s: renamed to %s; the cache starts empty", router, exc, aside)
    try:
        return CacheStore.open(path)
    except CacheStoreError as exc:
        raise StartupError(f"router {router!r}: {exc}") from exc


def _close_cache_stores(stores: Iterable[tuple[RouterRuntime, CacheStore]]) -> None:
    for _, store in stores:
        store.close()


def _start_event_log(config: Config, runtimes: Iterable[RouterRuntime], metrics: Metrics) -> EventLog | None:
    """The event log, subscribed to every router and writing; None when not configured.

    Raises:
        StartupError: its directory cannot be made or written.
    """
    settings = config.event_log
    if settings is None:
        return None
    router_id = settings.router_id or default_router_id(a.name for a in config.acceptors)
    key_types = {r.name: r.key_type for r in config.routers}
    event_log = EventLog(settings, router_id, key_types, metrics)
    try:
        event_log.start()
    except EventLogError as exc:
        raise StartupError(str(exc)) from exc
    for runtime in runtimes:
        runtime.subscribe(event_log.report)
    return event_log


async def _serve(
    config: Config,
    runtimes: dict[str, RouterRuntime],
    served: list[ServedAcceptor],
    metrics: Metrics,
    admin: tuple[str, int] | None,
    grace_s: float,
    shutdown: trio.Event,
    limits: ConnectionLimits,
    event_log: EventLog | None,
    stores: Iterable[tuple[RouterRuntime, CacheStore]],
    states: StateFile | None,
    admin_access: AdminAccess,
    task_status: trio.TaskStatus[ServerInfo],
) -> None:
    async with trio.open_nursery() as services:
        admin_bound = await _start_services(
            config, runtimes, metrics, services, admin, event_log, states, admin_access
        )
        for runtime, store in stores:
            services.start_soon(serve_cache_store, runtime, store)
        clock, token = trio.lowlevel.current_clock(), trio.lowlevel.current_trio_token()
        fast = FastPath(clock.current_time, token.run_sync_soon, limits.connect_timeout_s)
        listeners: list[tuple[ServedAcceptor, trio.SocketListener]] = []
        try:
            listeners, bound = await _open_listeners(served)
            async with trio.open_nursery() as handlers:
                async with trio.open_nursery() as accepting:
                    fast_serves = _start_accepting(listeners, fast, accepting, handlers)
                    log.info("ready: %d acceptor(s) listening", len(bound))
                    info = ServerInfo(
                        acceptors=bound,
                        admin=admin_bound,
                        runtimes=runtimes,
                        fast_path=fast if fast_serves else None,
                    )
                    task_status.started(info)
                    await shutdown.wait()
                    log.info("shutting down: no new connections; open ones get %g s", grace_s)
                    accepting.cancel_scope.cancel(reason="shutdown")
                    fast.stop_accepting()
                for _, listener in listeners:
                    await listener.aclose()
                deadline = trio.current_time() + grace_s
                services.start_soon(_end_of_grace, deadline, runtimes.values(), fast, handlers.cancel_scope)
                if fast_serves:
                    handlers.start_soon(_wait_for_fast_path, fast)
        finally:
            fast.close_all()
            for _, listener in listeners:
                with trio.CancelScope(shield=True):  # release the ports even when cancelled
                    await listener.aclose()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(fast.join, _FAST_PATH_JOIN_S)
        services.cancel_scope.cancel(reason="shutdown complete")
