"""The event log's part of a running routerd (router/feature.py's `Service`): it opens the log at
start (`open_files`: its directory and its writer process, before any listener), subscribes it to
each router's reports (`router_added`; `router_changed` when a reload changes a router's key type)
and, at exit, has what its ring holds written and the file finished (`close_files`).

The log itself, its ring, sender thread and writer process: router/services/event_log.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from router.feature import OpenError, Service
from router.services.event_log import EventLog, EventLogError, default_router_id

if TYPE_CHECKING:
    from collections.abc import Callable

    from router.config.settings import Config
    from router.feature import Kernel
    from router.metrics import Metrics
    from router.runtime import RouterRuntime

__all__ = ["EventLogService", "start"]

_exit_log = logging.getLogger("router.server")
"""The exit's lines are the process's (router/kept_files.py runs the files' last writes)."""


def start(kernel: Kernel) -> EventLogService:
    """The feature's service for one routerd."""
    return EventLogService(kernel.config, kernel.metrics)


class EventLogService(Service):
    """One routerd's event log, when `<event-log>` (or `routerd --event-log DIR`) turns it on."""

    def __init__(self, config: Callable[[], Config], metrics: Metrics) -> None:
        self._config = config
        """The configuration in force (the event log's own section does not change on a reload:
        router/core/reload.py)."""
        self._metrics = metrics
        self.event_log: EventLog | None = None
        """The running log (the admin API's `/api/v1/event-log`); None while it is off."""

    def open_files(self) -> None:
        """Start the event log when it is configured, writing (its router id: the configured one,
        else `default_router_id`).

        Raises:
            OpenError: its directory cannot be made or written, or its writer cannot start.
        """
        config = self._config()
        settings = config.event_log
        if settings is None:
            return
        router_id = settings.router_id or default_router_id(a.name for a in config.acceptors)
        key_types = {r.name: r.key_type for r in config.routers}
        event_log = EventLog(settings, router_id, key_types, self._metrics)
        try:
            event_log.start()
        except EventLogError as exc:
            raise OpenError(str(exc)) from exc
        self.event_log = event_log

    def router_added(self, runtime: RouterRuntime) -> None:
        """Log the router's decisions and closes, with its key type."""
        if self.event_log is not None:
            self.event_log.set_key_type(runtime.name, runtime.config.key_type)
            runtime.report.subscribe(self.event_log.report)

    def router_changed(self, runtime: RouterRuntime) -> None:
        """The router's key type may have changed."""
        if self.event_log is not None:
            self.event_log.set_key_type(runtime.name, runtime.config.key_type)

    async def close_files(self, timeout_s: float) -> None:
        """What the ring holds is sent to the writer process, which finishes its file."""
        event_log = self.event_log
        if event_log is None:
            return
        if not await trio.to_thread.run_sync(event_log.stop, timeout_s, abandon_on_cancel=True):
            _exit_log.error(
                "event log %s: the writer did not finish within %g s (a hung or frozen filesystem?): "
                "events not yet written may be lost",
                event_log.config.directory,
                timeout_s,
            )
