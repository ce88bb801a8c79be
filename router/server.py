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

Each router's services run in two cancel scopes of their own (`_RouterTasks`), and each acceptor's
accept loops in one (`_Acceptor`), so that a reload can stop and start them one by one.

Shutdown (SIGTERM in `routerd`, or the `shutdown` event in tests): the admin API's /readyz answers
503 from this moment (it reads the same event, `Lifecycle`), stop accepting and close the
listening sockets, tell the features (`Service.stopping`: the moves feature moves the open
connections paced over `grace_s`), then close what is left on both paths through the
live-connection registry (reason `shutdown`), and stop the services.

Reload (SIGHUP in `routerd`, `POST /api/v1/reload`, `ServerInfo.reload`): read the file again, diff
it against the configuration in force (router/core/reload.py), read the files and bind the sockets
the change needs (any failure: close them, change nothing, say why in one line), then apply it in
one synchronous step: routers removed, added and changed in place (`RouterRuntime.reconfigure`),
the connections whose target left the configuration given to the features (`Service.targets_left`:
the moves feature moves them as an evacuation does) or closed at once (`close_removed`), acceptors
stopped, started, and a changed acceptor on the same address served on its same listening socket.
"""

from __future__ import annotations

import contextlib
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
from router.config import ConfigError, load_config
from router.core.address import Address
from router.core.admin_access import AdminAccess
from router.core.admission import DESCRIPTOR_RESERVE, AcceptorLimits, Admission, descriptor_budget
from router.core.events import CloseReason
from router.core.plan import fast_path_serves
from router.core.reload import Departed, ReloadError, diff_configs
from router.datapath.acceptor import ConnectionLimits, ServedAcceptor
from router.datapath.fast_path import Departing, FastPath
from router.datapath.net import ACCEPT_BACKOFF_S, ACCEPT_CAPACITY_ERRNOS, describe_oserror, open_listeners
from router.datapath.tls import server_context
from router.datapath.trio_path import depart, handle_connection, resume_connection
from router.feature import Kernel, Service
from router.features import FEATURES, register_metrics
from router.features import routes as feature_routes
from router.metrics import Metrics
from router.runtime import RouterRuntime, close_removed
from router.services.admin import KERNEL_ROUTES, AdminContext, Lifecycle, serve_admin
from router.services.cache_store import (
    CacheStore,
    CacheStoreError,
    close_cache_store,
    serve_cache_store,
    set_aside,
)
from router.services.discovery import serve_discovery
from router.services.event_log import EventLog, EventLogError, default_router_id
from router.services.process import ProcessView, descriptors_open
from router.services.shared_cache import SharedCache
from router.services.state_file import KeptStates, StateFile, StateFileError

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping

    from cache.cache import Row
    from router.config.settings import AcceptorConfig, Config, RouterConfig
    from router.core.reload import ConfigDiff
    from router.datapath.fast_path import HandedOver, Handoff

__all__ = ["ROUTES", "ReloadError", "ServerInfo", "StartupError", "serve_router"]

log = logging.getLogger("router.server")

ROUTES: Final = tuple((route.method, route.template) for route in (*KERNEL_ROUTES, *feature_routes()))
"""Every (method, path template) the admin API serves: the kernel's and the features'.
docs/admin-api.yaml describes each; tests/router/services/test_admin_api.py checks that the two
list the same operations, and a real routerd against both."""

_UNLIMITED_DESCRIPTORS: Final = 1 << 20
"""What an unlimited RLIMIT_NOFILE counts as (Linux's default fs.nr_open)."""
_DESCRIPTORS_PER_ACCEPTOR: Final = 4
"""At most two listeners per acceptor (dual stack) and the fast path's copy of each."""
_SERVER_DESCRIPTORS: Final = 4
"""The fast path's epoll set and wake-up pipe, the admin listener."""
_DISCOVERED_PROBES: Final = 16
"""Probes counted for a discovery pool, whose members are not known at start."""

_FAST_PATH_JOIN_S: Final = 5.0
"""How long shutdown waits for the fast-path thread once told to close everything."""
EXIT_FILES_S: Final = 5.0
"""At exit, after the grace period, how long the files may take: the persisted caches' last writes
and the event log's writer writing what its ring holds and finishing its file (a full ring of
65,536 events takes well under a second; compressing 64 MB, about one); beyond it each is
abandoned with an ERROR naming the file (a hung or frozen filesystem)."""


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


class StartupError(Exception):
    """The router cannot start with this configuration on this machine (a file, a port)."""


def _warn_unsupported(config: Config, routers: Collection[str] | None = None) -> None:
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


def _admission(
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
        a.name: limits for a in config.acceptors if (limits := _acceptor_limits(a)) is not None
    }
    admission = Admission(budget, acceptor_limits)
    metrics.sample_when_scraped(lambda: metrics.client_connections.set((), admission.open))
    return admission


def _acceptor_stores(acceptor: AcceptorConfig) -> tuple[ssl.SSLContext | None, UserStore | None]:
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


def _serve_acceptor(
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
    tls, users = _acceptor_stores(acceptor) if stores is None else stores
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


def _acceptor_limits(acceptor: AcceptorConfig) -> AcceptorLimits | None:
    if acceptor.connections_allowed >= 0 or acceptor.connections_allowed_per_source >= 0:
        return AcceptorLimits(acceptor.connections_allowed, acceptor.connections_allowed_per_source)
    return None


async def _accept_loop(
    listener: trio.SocketListener, acceptor: ServedAcceptor, handlers: trio.Nursery
) -> None:
    while True:
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
            acceptor.runtime.unregister(handed.conn)
        else:
            handed.sock.close()
        acceptor.release(handed.conn.conn.peer if isinstance(handed, Departing) else handed.conn.peer)

    def handoff(handed: HandedOver | Departing) -> None:  # in the fast-path thread
        try:
            token.run_sync_soon(start, handed)
        except trio.RunFinishedError:
            drop(handed)

    return handoff


async def _bind(acceptor: AcceptorConfig) -> list[trio.SocketListener]:
    """An acceptor's listeners (two for a dual-stack host).

    Raises:
        OSError: a listener could not be opened (the message names the acceptor).
    """
    where = f"acceptor {acceptor.name!r} on {acceptor.host}:{acceptor.port}"
    return await open_listeners(acceptor.host, acceptor.port, where)


def _close_listeners(listeners: Iterable[trio.SocketListener]) -> None:
    """Close listening sockets at once (their accept loops were cancelled first)."""
    for listener in listeners:
        listener.socket.close()


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
    load: Callable[[], Config] | None = None,
    reloads: trio.MemoryReceiveChannel[None] | None = None,
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
        load: how a reload reads the configuration again (raises `ConfigError` for a bad file);
            by default `load_config(config.source)`.
        reloads: each item received is a reload request (routerd's SIGHUP), logged, never raised.
        task_status: receives a `ServerInfo` once every listener is open.

    Raises:
        OSError: a listener could not be opened (address in use, permission).
        StartupError: an acceptor's key, trust or user store cannot be loaded, or a persisted
            cache's file cannot be opened.
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    limits = limits if limits is not None else ConnectionLimits()
    _warn_unsupported(config)
    metrics = register_metrics(Metrics())
    runtimes = {
        r.name: RouterRuntime(config, r, metrics, round_robin_start=round_robin_start) for r in config.routers
    }
    ttl = config.connection_ttl
    admission = _admission(config, runtimes.values(), metrics, max_connections)
    # Before any listener: fail early.
    served = [
        _serve_acceptor(a, runtimes[a.router], ttl.ttl_ms(a), limits, admission) for a in config.acceptors
    ]
    states = None
    if state_file is not None:
        kept = _restore_admin_states(StateFile(state_file), runtimes)
        states = KeptStates(kept, lambda: {r.name: r.admin_states() for r in runtimes.values()})
    stores = _open_cache_stores(runtimes.values(), discard_unreadable_cache)
    try:
        event_log = _start_event_log(config, runtimes.values(), metrics)
    except StartupError:
        _close_cache_stores(stores)
        raise
    source = config.source
    options = _Options(
        shutdown=shutdown,
        load=load if load is not None else functools.partial(load_config, source),
        reloads=reloads,
        states=states,
        access=admin_access or AdminAccess(),
        discard_unreadable_cache=discard_unreadable_cache,
        round_robin_start=round_robin_start,
    )
    try:
        server = _Server(config, runtimes, metrics, admission, limits, event_log, stores, options)
        await server.serve(served, admin, grace_s, task_status)
    finally:
        # Cleanup, shielded: the last decisions' changes reach the files, within EXIT_FILES_S.
        with trio.CancelScope(shield=True):
            await _close_files(stores, event_log, states)
    log.info("stopped")


async def _close_files(
    stores: Iterable[tuple[RouterRuntime, CacheStore]], event_log: EventLog | None, states: KeptStates | None
) -> None:
    """At exit: the persisted caches' last writes, the event log's rest and the state file's last
    try, side by side, each within `EXIT_FILES_S` (a hung or frozen filesystem holds up the exit
    no longer: see router/services/files.py)."""
    async with trio.open_nursery() as nursery:
        if states is not None:
            nursery.start_soon(states.close, EXIT_FILES_S)
        for runtime, store in stores:
            nursery.start_soon(close_cache_store, runtime, store, EXIT_FILES_S)
        if event_log is not None:
            nursery.start_soon(_stop_event_log, event_log)


async def _stop_event_log(event_log: EventLog) -> None:
    """What the ring holds is sent to the writer process, which finishes its file."""
    if not await trio.to_thread.run_sync(event_log.stop, EXIT_FILES_S, abandon_on_cancel=True):
        log.error(
            "event log %s: the writer did not finish within %g s (a hung or frozen filesystem?): "
            "events not yet written may be lost",
            event_log.config.directory,
            EXIT_FILES_S,
        )


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
            loaded = _load_cache_store(runtime.config, discard_unreadable, time.time() - trio.current_time())
            if loaded is not None:
                store, rows = loaded
                stores.append((runtime, store))
                _restore_cache(runtime, rows)
    except StartupError:
        _close_cache_stores(stores)
        raise
    return stores


def _load_cache_store(
    config: RouterConfig, discard_unreadable: bool, offset: float
) -> tuple[CacheStore, list[tuple[str, Row]]] | None:
    """A router's persisted cache: its file opened and its entries read (`offset`: wall clock
    minus trio clock); None when its cache is not persisted.

    Raises:
        StartupError: the file cannot be opened or read (unless `discard_unreadable`: then it is
            renamed aside, logged, and the cache starts empty), or another routerd holds it.
    """
    cache = config.cache
    if cache is None or not cache.persisted:
        return None
    assert cache.file is not None, "the loader gives a persisted cache its file"
    store = _open_cache_store(config.name, cache.file, discard_unreadable)
    try:
        rows = store.load(time.time(), cache.timeout_ms, offset)
        store.start_writer()  # the writes go through a process of their own (cache_store.py)
        return store, rows
    except CacheStoreError as exc:
        store.close()
        raise StartupError(f"router {config.name!r}: {exc}") from exc


def _restore_cache(runtime: RouterRuntime, rows: list[tuple[str, Row]]) -> None:
    loaded = runtime.restore_cache(rows, trio.current_time())
    cache = runtime.config.cache
    assert cache is not None
    log.info("router=%s persisted cache %s: %d entries loaded", runtime.name, cache.file, loaded)


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


@dataclass(eq=False, slots=True)
class _Acceptor:
    """One acceptor being served: how, and on which listening sockets."""

    served: ServedAcceptor
    listeners: list[trio.SocketListener]
    fast: bool
    """Served by the fast path's thread (which holds copies of the sockets), else by accept loops."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """The accept loops of the trio path."""


@dataclass(eq=False, slots=True)
class _RouterTasks:
    """The service tasks of one router, in two groups that a reload cancels on their own."""

    core: trio.CancelScope
    """Health checks, cache sweeps, the TTL checker: restarted when the router changes."""
    data: trio.CancelScope
    """Discovery, the shared cache, the persisted cache's writes: stopped only when it goes."""


@dataclass(eq=False, slots=True)
class _Prepared:
    """What a reload needs before it changes anything: files read, sockets bound."""

    stores: dict[str, tuple[ssl.SSLContext | None, UserStore | None]] = field(default_factory=dict)
    """Acceptor name -> its TLS context and user store (acceptors added or changed)."""
    listeners: dict[str, tuple[list[trio.SocketListener], bool]] = field(default_factory=dict)
    """Acceptor name -> its listeners and whether they are new (else taken over from the acceptor
    of the same address)."""
    caches: dict[str, tuple[CacheStore, list[tuple[str, Row]]]] = field(default_factory=dict)
    """Router name -> its persisted cache's file and rows (routers added)."""

    def discard(self) -> None:
        """The reload failed: close what was opened for it."""
        for listeners, new in self.listeners.values():
            if new:
                _close_listeners(listeners)
        for store, _ in self.caches.values():
            store.close()


class _Server:
    """The running process: its listeners and routers, and what a reload changes in them."""

    def __init__(
        self,
        config: Config,
        runtimes: dict[str, RouterRuntime],
        metrics: Metrics,
        admission: Admission,
        limits: ConnectionLimits,
        event_log: EventLog | None,
        stores: list[tuple[RouterRuntime, CacheStore]],
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
        self.event_log = event_log
        self.stores = stores
        """Persisted caches' files, written a last time at exit (shared with `serve_router`)."""
        self.options = options
        self.bound: dict[str, tuple[str, int]] = {}
        """Acceptor name -> where it listens (`ServerInfo.acceptors`)."""
        self.acceptors: dict[str, _Acceptor] = {}
        self.tasks: dict[str, _RouterTasks] = {}
        self.stopping = False
        self._reloading = trio.Lock()
        clock, token = trio.lowlevel.current_clock(), trio.lowlevel.current_trio_token()
        self.fast = FastPath(clock.current_time, token.run_sync_soon, limits.connect_timeout_s)
        self._services: trio.Nursery | None = None
        self._handlers: trio.Nursery | None = None
        self._accepting: trio.Nursery | None = None
        kernel = Kernel(
            runtimes=runtimes, metrics=metrics, stop=options.shutdown.set, config=lambda: self.config
        )
        self.features: dict[type, Service] = {}
        """The features' services by type (router/features/), in `FEATURES` order."""
        for feature in FEATURES:
            if feature.start is not None:
                service = feature.start(kernel)
                self.features[type(service)] = service
        self.lifecycle = Lifecycle(shutdown=options.shutdown)
        """/readyz: 503 from the moment shutdown is set."""
        self.process = ProcessView(admission)
        """GET /api/v1/status: told which acceptors listen whenever they change."""
        self.process.zookeeper = lambda: [z for r in self.runtimes.values() for z in r.zookeeper.values()]

    # -- the services of each router --

    async def _serve_core(
        self,
        runtime: RouterRuntime,
        scope: trio.CancelScope,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for service in self.features.values():  # the probes first: they run at once
                    await nursery.start(service.serve_router, runtime)
                nursery.start_soon(runtime.serve_cache_purge)
                nursery.start_soon(runtime.serve_outlier_returns)
                task_status.started()

    async def _serve_data(
        self,
        runtime: RouterRuntime,
        scope: trio.CancelScope,
        store: CacheStore | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                group = self.config.pool_discovery_group(runtime.config)
                if group is not None and group.zookeeper is not None:
                    await nursery.start(serve_discovery, runtime, group.zookeeper)
                if runtime.config.cache_zookeeper is not None:
                    shared = SharedCache(runtime, runtime.config.cache_zookeeper)
                    runtime.attach_shared(shared)
                    await nursery.start(shared.serve)
                if store is not None:
                    nursery.start_soon(serve_cache_store, runtime, store)
                task_status.started()

    def _store_of(self, runtime: RouterRuntime) -> CacheStore | None:
        return next((store for r, store in self.stores if r is runtime), None)

    async def _start_router_tasks(self, runtime: RouterRuntime) -> None:
        """At start: a router's services, each ready before the next (the first probes run at once)."""
        assert self._services is not None
        tasks = self.tasks[runtime.name] = _RouterTasks(core=trio.CancelScope(), data=trio.CancelScope())
        await self._services.start(self._serve_core, runtime, tasks.core)
        await self._services.start(self._serve_data, runtime, tasks.data, self._store_of(runtime))

    def _restart_core(self, runtime: RouterRuntime) -> None:
        assert self._services is not None
        tasks = self.tasks[runtime.name]
        tasks.core.cancel(reason="the router's configuration changed")
        tasks.core = trio.CancelScope()
        self._services.start_soon(self._serve_core, runtime, tasks.core)

    # -- serving acceptors --

    def _start_serving(self, acceptor: _Acceptor) -> None:
        """Serve an acceptor's listeners: the fast path's thread, or accept loops."""
        assert self._handlers is not None
        assert self._accepting is not None
        served = acceptor.served
        if acceptor.fast:
            for listener in acceptor.listeners:
                self.fast.add_listener(_duplicate(listener), served, _handoff(self._handlers, served))
            return
        for listener in acceptor.listeners:
            self._accepting.start_soon(self._accept_in, acceptor.scope, listener, served, self._handlers)

    @staticmethod
    async def _accept_in(
        scope: trio.CancelScope, listener: trio.SocketListener, served: ServedAcceptor, handlers: trio.Nursery
    ) -> None:
        with scope:
            await _accept_loop(listener, served, handlers)

    def _stop_serving(self, acceptor: _Acceptor) -> None:
        """Stop accepting on an acceptor's listeners (they stay open)."""
        acceptor.scope.cancel(reason="acceptor removed or changed by a reload")
        if acceptor.fast:
            self.fast.remove_listeners(acceptor.served.name)

    def _new_acceptor(self, served: ServedAcceptor, listeners: list[trio.SocketListener]) -> _Acceptor:
        fast = fast_path_serves(served.config, served.runtime.config.key_type, served.connection_ttl_ms)
        acceptor = _Acceptor(served=served, listeners=listeners, fast=fast)
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

    def _fast_path_started(self) -> None:
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
            self._services = services
            for runtime in self.runtimes.values():
                await self._start_router_tasks(runtime)
            for service in self.features.values():
                await services.start(service.serve)
            if self.options.states is not None:
                await services.start(self.options.states.serve)
                self.process.states = self.options.states
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
                    event_log=self.event_log,
                    states=options.states,
                    routes=feature_routes(),
                    features=self.features,
                )
                admin_bound = await services.start(serve_admin, admin[0], admin[1], context)
            if self.options.reloads is not None:
                services.start_soon(self._serve_reload_signals, self.options.reloads)
            fast = self.fast
            fast_serves = False
            listeners: list[tuple[ServedAcceptor, list[trio.SocketListener]]] = []
            try:
                for one in served:
                    listeners.append((one, await _bind(one.config)))
                async with trio.open_nursery() as handlers:
                    self._handlers = handlers
                    async with trio.open_nursery() as accepting:
                        self._accepting = accepting
                        for one, sockets in listeners:
                            self._start_serving(self._new_acceptor(one, sockets))
                        self._fast_path_started()
                        fast_serves = fast.started
                        self.lifecycle.accepting.set()
                        log.info("ready: %d acceptor(s) listening", len(self.bound))
                        info = ServerInfo(
                            acceptors=self.bound,
                            admin=admin_bound,
                            runtimes=self.runtimes,
                            fast_path=fast if fast_serves else None,
                            reload=self.reload,
                        )
                        task_status.started(info)
                        await self.options.shutdown.wait()
                        log.info(
                            "shutting down: no new connections; open ones are moved over %g s, then closed",
                            grace_s,
                        )
                        async with self._reloading:  # a reload under way finishes first
                            self.stopping = True
                        accepting.cancel_scope.cancel(reason="shutdown")
                        fast.stop_accepting()
                    for serving in self.acceptors.values():
                        _close_listeners(serving.listeners)
                    for service in self.features.values():
                        service.stopping(grace_s)
                    deadline = trio.current_time() + grace_s
                    services.start_soon(
                        _end_of_grace, deadline, list(self.runtimes.values()), fast, handlers.cancel_scope
                    )
                    if fast.started:
                        handlers.start_soon(_wait_for_fast_path, fast)
            finally:
                self.stopping = True
                fast.close_all()
                for _, sockets in listeners:
                    _close_listeners(sockets)
                for serving in self.acceptors.values():
                    _close_listeners(serving.listeners)
                with trio.CancelScope(shield=True):  # release the ports even when cancelled
                    await trio.lowlevel.checkpoint()
                    await trio.to_thread.run_sync(fast.join, _FAST_PATH_JOIN_S)
            services.cancel_scope.cancel(reason="shutdown complete")

    # -- reload --

    async def _serve_reload_signals(self, reloads: trio.MemoryReceiveChannel[None]) -> None:
        """Reload on each request of routerd's SIGHUP handler; the outcome is logged."""
        async for _ in reloads:
            with contextlib.suppress(ReloadError):
                await self.reload()

    async def reload(self) -> ConfigDiff:
        """Read the configuration file again and apply it in place (docs/operations.md). One log
        line says what changed, or why nothing did.

        Raises:
            ReloadError: nothing changed (the one-line reason; also when shutting down).
        """
        async with self._reloading:
            try:
                if self.stopping:
                    raise ReloadError("routerd is shutting down")
                diff = await self._reload()
            except ReloadError as exc:
                log.error("reload of %s failed, nothing changed: %s", self.config.source, exc)
                raise
        log.info("configuration %s reloaded: %s", self.config.source, diff.summary())
        return diff

    async def _reload(self) -> ConfigDiff:
        try:
            new = await trio.to_thread.run_sync(self.options.load)
        except (ConfigError, OSError) as exc:
            raise ReloadError(str(exc)) from exc
        diff = diff_configs(self.config, new, held=self.held)
        prepared = _Prepared()
        try:
            await self._prepare(diff, prepared)
        except BaseException:
            prepared.discard()
            raise
        self._commit(diff, prepared)  # no checkpoint: applied whole, or (cancelled above) not at all
        return diff

    async def _prepare(self, diff: ConfigDiff, prepared: _Prepared) -> None:
        """Read the files and bind the sockets the reload needs, changing nothing yet.

        Raises:
            ReloadError: a store cannot be read or a port cannot be bound.
        """
        config = diff.config
        names = {*diff.acceptors_added, *diff.acceptors_changed}
        offset = time.time() - trio.current_time()

        def read_files() -> None:  # in a worker thread: key stores and a cache file take a while
            for acceptor in config.acceptors:
                if acceptor.name in names:
                    prepared.stores[acceptor.name] = _acceptor_stores(acceptor)
            for name in diff.routers_added:
                loaded = _load_cache_store(config.router(name), self.options.discard_unreadable_cache, offset)
                if loaded is not None:
                    prepared.caches[name] = loaded

        try:
            await trio.to_thread.run_sync(read_files)
        except StartupError as exc:
            raise ReloadError(str(exc)) from exc
        # Sockets: an acceptor whose address did not change keeps its listening sockets (no moment
        # without a listener); one added on the address of one removed takes that one's over.
        freed = {
            (self.acceptors[n].served.config.host, self.acceptors[n].served.config.port): n
            for n in diff.acceptors_removed
            if self.acceptors[n].served.config.port != 0
        }
        for acceptor in config.acceptors:
            if acceptor.name not in names:
                continue
            current = self.acceptors.get(acceptor.name)
            address = (acceptor.host, acceptor.port)
            if (
                current is not None
                and acceptor.host == current.served.config.host
                and acceptor.port
                in (
                    current.served.config.port,  # 0 too: the port the system chose stays
                    self.bound[acceptor.name][1],
                )
            ):
                prepared.listeners[acceptor.name] = (current.listeners, False)
            elif acceptor.name in diff.acceptors_added and address in freed:
                prepared.listeners[acceptor.name] = (self.acceptors[freed.pop(address)].listeners, False)
            else:
                try:
                    prepared.listeners[acceptor.name] = (await _bind(acceptor), True)
                except OSError as exc:
                    raise ReloadError(exc.strerror or describe_oserror(exc)) from exc

    def _commit(self, diff: ConfigDiff, prepared: _Prepared) -> None:
        """Apply a prepared reload (synchronous: nothing else runs meanwhile)."""
        assert self._services is not None
        config = diff.config
        self.config, self.held = config, diff.held
        for name in diff.routers_removed:
            self._remove_router(name)
        for name in diff.routers_added:
            self._add_router(config, name, prepared)
        for change in diff.routers_changed:
            runtime = self.runtimes[change.name]
            runtime.reconfigure(config, config.router(change.name))
            if self.event_log is not None:
                self.event_log.set_key_type(change.name, runtime.config.key_type)
            self._targets_left(runtime, change.departed)
            self._restart_core(runtime)
        _warn_unsupported(config, {*diff.routers_added, *(c.name for c in diff.routers_changed)})
        # Acceptors: stop the removed and changed ones, then serve the changed and added ones, then
        # close the sockets nobody took over.
        released: list[trio.SocketListener] = []
        taken = {
            id(listener)
            for listeners, new in prepared.listeners.values()
            if not new
            for listener in listeners
        }
        for name in (*diff.acceptors_removed, *diff.acceptors_changed):
            acceptor = self.acceptors.pop(name)
            self._stop_serving(acceptor)
            self.bound.pop(name, None)
            released.extend(listener for listener in acceptor.listeners if id(listener) not in taken)
        for name in diff.acceptors_removed:
            self.admission.set_limits(name, None)
            log.info("acceptor=%s removed: no longer listening (its open connections go on)", name)
        for entry in config.acceptors:
            if entry.name not in prepared.listeners:
                continue
            listeners, _ = prepared.listeners[entry.name]
            served = _serve_acceptor(
                entry,
                self.runtimes[entry.router],
                config.connection_ttl.ttl_ms(entry),
                self.limits,
                self.admission,
                prepared.stores[entry.name],
            )
            self.admission.set_limits(entry.name, _acceptor_limits(entry))
            self._start_serving(self._new_acceptor(served, listeners))
        _close_listeners(released)
        self._fast_path_started()

    def _targets_left(self, runtime: RouterRuntime, departed: Iterable[Departed]) -> None:
        """A reload removed targets of a router that goes on: each feature takes care of their
        connections it can (the moves feature moves them, paced); the rest are closed at once."""
        left = list(departed)
        for service in self.features.values():
            left = service.targets_left(runtime, left)
        close_removed(runtime, left)

    def _remove_router(self, name: str) -> None:
        assert self._services is not None
        runtime = self.runtimes.pop(name)
        tasks = self.tasks.pop(name)
        tasks.core.cancel(reason="router removed")
        tasks.data.cancel(reason="router removed")
        # Every connection it holds, whatever the file said: a discovered target, or one that left
        # its pool before, is in no list of the configuration.
        close_removed(runtime, [Departed(node_id=n) for n in {c.node_id for c in runtime.movable()}])
        runtime.retire()
        store = self._store_of(runtime)
        if store is not None:
            self.stores[:] = [(r, s) for r, s in self.stores if r is not runtime]
            self._services.start_soon(_close_store, runtime, store)

    def _add_router(self, config: Config, name: str, prepared: _Prepared) -> None:
        assert self._services is not None
        runtime = RouterRuntime(
            config, config.router(name), self.metrics, round_robin_start=self.options.round_robin_start
        )
        self.runtimes[name] = runtime
        if self.event_log is not None:
            runtime.subscribe(self.event_log.report)
            self.event_log.set_key_type(name, runtime.config.key_type)
        store = None
        if name in prepared.caches:
            store, rows = prepared.caches.pop(name)
            _restore_cache(runtime, rows)
            self.stores.append((runtime, store))
        tasks = self.tasks[name] = _RouterTasks(core=trio.CancelScope(), data=trio.CancelScope())
        self._services.start_soon(self._serve_core, runtime, tasks.core)
        self._services.start_soon(self._serve_data, runtime, tasks.data, store)


async def _close_store(runtime: RouterRuntime, store: CacheStore) -> None:
    """A removed router's persisted cache: its last changes written, its file closed."""
    with trio.CancelScope(shield=True):  # cleanup: the last decisions' changes reach the file
        await close_cache_store(runtime, store, EXIT_FILES_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Options:
    """`serve_router`'s options that the server keeps."""

    shutdown: trio.Event
    load: Callable[[], Config]
    reloads: trio.MemoryReceiveChannel[None] | None
    states: KeptStates | None
    access: AdminAccess
    discard_unreadable_cache: bool
    round_robin_start: int | None
