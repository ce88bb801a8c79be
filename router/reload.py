"""A configuration reload carried out in a running routerd (SIGHUP, `POST /api/v1/reload`).

Read the file again, diff it against the configuration in force (router/core/reload.py), read the
files and bind the sockets the change needs (any failure: close them, change nothing, say why in one
line: `ReloadError`; the features read what they keep for a router added:
`Service.prepare_router`), then apply it in one synchronous step: routers removed, added and
changed in place (`RouterRuntime.reconfigure`; the features told: `Service.router_added`,
`router_changed`, `router_removed`),
the connections whose target left given to the features (`Service.targets_left`: the moves feature
moves them as an evacuation does) or closed at once (`RouterConnections.close_departed`), acceptors
stopped, started, and a changed acceptor on the same address served on its same listening socket
(router/acceptors.py).

`Reloads` carries it out on the process it is given (`ReloadHost`: router/server.py's `_Server`),
one reload at a time, none once shutdown began.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from router.acceptors import (
    StartupError,
    acceptor_limits,
    acceptor_stores,
    close_listeners,
    serve_acceptor,
    warn_unsupported,
)
from router.config import ConfigError
from router.core.reload import Departed, ReloadError, diff_configs
from router.datapath.net import describe_oserror
from router.feature import OpenError
from router.runtime import RouterRuntime

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Iterable, Mapping

    from keys.users import UserStore
    from router.acceptors import Serving
    from router.config.settings import Config
    from router.core.admission import Admission
    from router.core.reload import ConfigDiff
    from router.datapath.acceptor import ConnectionLimits
    from router.feature import Service
    from router.metrics import Metrics
    from router.router_tasks import RouterTasks
    from router.services.notify import Notifier

__all__ = ["ReloadHost", "Reloads"]

log = logging.getLogger("router.server")


class ReloadHost(Protocol):
    """What a reload reads and changes in the running process."""

    config: Config
    """The configuration in force."""
    held: Mapping[str, Config]
    """Routers a reload could not change in place (router/core/reload.py)."""
    runtimes: dict[str, RouterRuntime]
    serving: Serving
    admission: Admission
    limits: ConnectionLimits
    metrics: Metrics
    features: dict[type, Service]
    stopping: bool
    notify: Notifier
    """systemd's readiness protocol: RELOADING=1, then READY=1, around each reload."""

    routers: RouterTasks
    """Each router's service tasks: started, restarted and stopped here."""


@dataclass(eq=False, slots=True)
class _Prepared:
    """What a reload needs before it changes anything: files read, sockets bound."""

    stores: dict[str, tuple[ssl.SSLContext | None, UserStore | None]] = field(default_factory=dict)
    """Acceptor name -> its TLS context and user store (acceptors added or changed)."""
    listeners: dict[str, tuple[list[trio.SocketListener], bool]] = field(default_factory=dict)
    """Acceptor name -> its listeners and whether they are new (else taken over from the acceptor
    of the same address)."""

    def discard(self, features: Iterable[Service]) -> None:
        """The reload failed: close what was opened for it."""
        for listeners, new in self.listeners.values():
            if new:
                close_listeners(listeners)
        for service in features:
            service.discard_prepared()


class Reloads:
    """Reloads of one running routerd (`reload`, and `serve_signals` for routerd's SIGHUP)."""

    def __init__(
        self,
        host: ReloadHost,
        *,
        load: Callable[[], Config],
        round_robin_start: int | None,
    ) -> None:
        self._host = host
        self._load = load
        """How the file is read again (raises `ConfigError` for a bad one)."""
        self._round_robin_start = round_robin_start
        self._lock = trio.Lock()

    @property
    def lock(self) -> trio.Lock:
        """Held while a reload runs (shutdown takes it, so a reload under way finishes first)."""
        return self._lock

    async def serve_signals(self, reloads: trio.MemoryReceiveChannel[None]) -> None:
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
        host = self._host
        metrics, notify = host.metrics, host.notify
        async with self._lock:
            try:
                if host.stopping:
                    raise ReloadError("routerd is shutting down")
                notify.reloading()
                diff = await self._reload()
            except ReloadError as exc:
                metrics.reload_successful.set((), 0)
                log.error("reload of %s failed, nothing changed: %s", host.config.source, exc)
                if not host.stopping:
                    notify.ready(f"reload refused, the configuration in force is unchanged: {exc}")
                raise
            except BaseException:
                notify.ready("reload cancelled, the configuration in force is unchanged")
                raise
        metrics.reload_successful.set((), 1)
        metrics.reload_timestamp.set((), time.time())
        summary = diff.summary()
        notify.ready(f"configuration reloaded: {summary}")
        log.info("configuration %s reloaded: %s", host.config.source, summary)
        return diff

    async def _reload(self) -> ConfigDiff:
        try:
            new = await trio.to_thread.run_sync(self._load)
        except (ConfigError, OSError) as exc:
            raise ReloadError(str(exc)) from exc
        diff = diff_configs(self._host.config, new, held=self._host.held)
        prepared = _Prepared()
        try:
            await self._prepare(diff, prepared)
        except BaseException:
            prepared.discard(self._host.features.values())
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

        def read_stores() -> None:  # in a worker thread: key stores take a while
            for acceptor in config.acceptors:
                if acceptor.name in names:
                    prepared.stores[acceptor.name] = acceptor_stores(acceptor)

        try:
            await trio.to_thread.run_sync(read_stores)
            for name in diff.routers_added:
                for service in self._host.features.values():
                    await service.prepare_router(config.router(name))
        except (StartupError, OpenError) as exc:
            raise ReloadError(str(exc)) from exc
        # Sockets: an acceptor whose address did not change keeps its listening sockets (no moment
        # without a listener); one added on the address of one removed takes that one's over.
        serving = self._host.serving
        freed = {
            (serving.acceptors[n].served.config.host, serving.acceptors[n].served.config.port): n
            for n in diff.acceptors_removed
            if serving.acceptors[n].served.config.port != 0
        }
        for acceptor in config.acceptors:
            if acceptor.name not in names:
                continue
            current = self._host.serving.acceptors.get(acceptor.name)
            address = (acceptor.host, acceptor.port)
            if (
                current is not None
                and acceptor.host == current.served.config.host
                and acceptor.port
                in (
                    current.served.config.port,  # 0 too: the port the system chose stays
                    self._host.serving.bound[acceptor.name][1],
                )
            ):
                prepared.listeners[acceptor.name] = (current.listeners, False)
            elif acceptor.name in diff.acceptors_added and address in freed:
                prepared.listeners[acceptor.name] = (
                    self._host.serving.acceptors[freed.pop(address)].listeners,
                    False,
                )
            else:
                try:
                    prepared.listeners[acceptor.name] = (await self._host.serving.listen(acceptor), True)
                except OSError as exc:
                    raise ReloadError(exc.strerror or describe_oserror(exc)) from exc

    def _commit(self, diff: ConfigDiff, prepared: _Prepared) -> None:
        """Apply a prepared reload (synchronous: nothing else runs meanwhile)."""
        config = diff.config
        self._host.config, self._host.held = config, diff.held
        for name in diff.routers_removed:
            self._remove_router(name)
        for name in diff.routers_added:
            self._add_router(config, name)
        for change in diff.routers_changed:
            runtime = self._host.runtimes[change.name]
            runtime.reconfigure(config, config.router(change.name))
            for service in self._host.features.values():
                service.router_changed(runtime)
            self._targets_left(runtime, change.departed)
            self._host.routers.restart(runtime)
        warn_unsupported(config, {*diff.routers_added, *(c.name for c in diff.routers_changed)})
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
            acceptor = self._host.serving.acceptors.pop(name)
            self._host.serving.stop(acceptor)
            self._host.serving.bound.pop(name, None)
            released.extend(listener for listener in acceptor.listeners if id(listener) not in taken)
        for name in diff.acceptors_removed:
            self._host.admission.set_limits(name, None)
            log.info("acceptor=%s removed: no longer listening (its open connections go on)", name)
        for entry in config.acceptors:
            if entry.name not in prepared.listeners:
                continue
            listeners, _ = prepared.listeners[entry.name]
            served = serve_acceptor(
                entry,
                self._host.runtimes[entry.router],
                config.connection_ttl.ttl_ms(entry),
                self._host.limits,
                self._host.admission,
                prepared.stores[entry.name],
            )
            self._host.admission.set_limits(entry.name, acceptor_limits(entry))
            self._host.serving.start(self._host.serving.add(served, listeners))
        close_listeners(released)
        self._host.serving.fast_path_started()

    def _targets_left(self, runtime: RouterRuntime, departed: Iterable[Departed]) -> None:
        """A reload removed targets of a router that goes on: each feature takes care of their
        connections it can (the moves feature moves them, paced); the rest are closed at once."""
        left = list(departed)
        for service in self._host.features.values():
            left = service.targets_left(runtime, left)
        runtime.connections.close_departed(left)

    def _remove_router(self, name: str) -> None:
        runtime = self._host.runtimes.pop(name)
        self._host.routers.stop(name)
        # Every connection it holds, whatever the file said: a discovered target, or one that left
        # its pool before, is in no list of the configuration.
        runtime.connections.close_departed(
            [Departed(node_id=n) for n in {c.node_id for c in runtime.connections.movable()}]
        )
        runtime.retire()
        for service in self._host.features.values():
            service.router_removed(runtime)

    def _add_router(self, config: Config, name: str) -> None:
        runtime = RouterRuntime(
            config, config.router(name), self._host.metrics, round_robin_start=self._round_robin_start
        )
        self._host.runtimes[name] = runtime
        for service in self._host.features.values():
            service.router_added(runtime)  # before its acceptors serve: the event log sees it all
        self._host.routers.start(runtime)
