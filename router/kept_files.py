"""The files routerd keeps beside its routing, at start and at exit: the features' (the event log's:
`Service.open_files`, `Service.close_files`) and the state file of targets' administrative states
(persisted caches: router/caches.py).

At start each is opened before any listener (`StartupError` when it cannot be); at exit, after
the grace period, their last writes run side by side, each within `EXIT_FILES_S` (a hung or frozen
filesystem holds up the exit no longer: router/services/files.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from router.acceptors import StartupError
from router.feature import OpenError
from router.services.cache_store import close_cache_store
from router.services.files import EXIT_FILES_S
from router.services.state_file import StateFileError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from router.feature import Service
    from router.runtime import RouterRuntime
    from router.services.cache_store import CacheStore
    from router.services.state_file import KeptStates, StateFile

__all__ = ["close_files", "open_files", "restore_admin_states"]

log = logging.getLogger("router.server")


async def close_files(
    stores: Iterable[tuple[RouterRuntime, CacheStore]], services: Iterable[Service], states: KeptStates | None
) -> None:
    """At exit: the persisted caches' last writes, the features' files' (the event log's rest) and
    the state file's last try, side by side, each within `EXIT_FILES_S` (a hung or frozen filesystem
    holds up the exit no longer: see router/services/files.py)."""
    async with trio.open_nursery() as nursery:
        if states is not None:
            nursery.start_soon(states.close, EXIT_FILES_S)
        for runtime, store in stores:
            nursery.start_soon(close_cache_store, runtime, store, EXIT_FILES_S)
        for service in services:
            nursery.start_soon(service.close_files, EXIT_FILES_S)


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


def open_files(services: Sequence[Service], runtimes: Iterable[RouterRuntime]) -> None:
    """At start, before any listener: each feature's service opens its files (`Service.open_files`),
    then is given every router (`Service.router_added`).

    Raises:
        StartupError: a service cannot open its files (its one line); `close_files` closes what the
            others opened.
    """
    for service in services:
        try:
            service.open_files()
        except OpenError as exc:
            raise StartupError(str(exc)) from exc
    for runtime in runtimes:
        for service in services:
            service.router_added(runtime)
