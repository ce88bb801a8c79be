"""The files routerd keeps beside its routing, at start and at exit: each feature's
(`Service.open_files`, `Service.prepare_router`, `Service.close_files`: the state file of targets'
administrative states, the persisted caches, the event log).

At start each is opened before any listener (`StartupError` when it cannot be); at exit, after
the grace period, their last writes run side by side, each within `EXIT_FILES_S` (a hung or frozen
filesystem holds up the exit no longer: router/services/files.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from router.acceptors import StartupError
from router.feature import OpenError
from router.services.files import EXIT_FILES_S

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from router.feature import Service
    from router.runtime import RouterRuntime

__all__ = ["close_files", "open_files"]


async def open_files(services: Sequence[Service], runtimes: Iterable[RouterRuntime]) -> None:
    """At start, before any listener: each feature's service opens its files (`Service.open_files`),
    reads what it keeps for each router (`Service.prepare_router`), then is given every router
    (`Service.router_added`).

    Raises:
        StartupError: a service cannot open or read its files (its one line); `close_files` closes
            what the services opened.
    """
    runtimes = list(runtimes)
    try:
        for service in services:
            service.open_files()
        for runtime in runtimes:
            for service in services:
                await service.prepare_router(runtime.config)
    except OpenError as exc:
        raise StartupError(str(exc)) from exc
    for runtime in runtimes:
        for service in services:
            service.router_added(runtime)


async def close_files(services: Iterable[Service]) -> None:
    """At exit: the features' files' last writes (the state file's last try, the persisted caches'
    last changes, the event log's rest), side by side, each within `EXIT_FILES_S`."""
    async with trio.open_nursery() as nursery:
        for service in services:
            nursery.start_soon(service.close_files, EXIT_FILES_S)
