"""The files routerd keeps beside its routing, at start and at exit: the event log and the state
file of targets' administrative states (persisted caches: router/caches.py).

At start each is opened before any listener (`StartupError` when it cannot be); at exit, after
the grace period, their last writes run side by side, each within `EXIT_FILES_S` (a hung or frozen
filesystem holds up the exit no longer: router/services/files.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from router.acceptors import StartupError
from router.services.cache_store import close_cache_store
from router.services.event_log import EventLog, EventLogError, default_router_id
from router.services.files import EXIT_FILES_S
from router.services.state_file import StateFileError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from router.config.settings import Config
    from router.metrics import Metrics
    from router.runtime import RouterRuntime
    from router.services.cache_store import CacheStore
    from router.services.state_file import KeptStates, StateFile

__all__ = ["close_files", "restore_admin_states", "start_event_log"]

log = logging.getLogger("router.server")


async def close_files(
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


def restore_admin_states(states: StateFile, runtimes: Mapping[str, RouterRuntime]) -> StateFile:
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
                runtime.pool.set_admin_state(node_id, state)
            except (LookupError, ValueError) as exc:
                log.warning("state file %s: %s: dropped", states.path, exc)
                continue
            restored += 1
    if restored:
        log.info("state file %s: %d administrative state(s) restored", states.path, restored)
    return states


def start_event_log(config: Config, runtimes: Iterable[RouterRuntime], metrics: Metrics) -> EventLog | None:
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
        runtime.report.subscribe(event_log.report)
    return event_log
