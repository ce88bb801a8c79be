"""The features of routerd and routerctl, one folder each (router/feature.py is the contract).

`FEATURES` is the one list that composes them: the process starts their services, the admin API
serves their routes, the metrics registry holds their families and routerctl offers their
commands, in this order. A new feature is a folder here and a line in `FEATURES`; features never
import each other (tests/test_layout.py), and nothing outside this package imports a feature's
module but through this list.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from router.ctl_output import Blocks
    from router.feature import Command, Feature, Kernel, Route, Service
    from router.metrics import Metrics

    FEATURES: tuple[Feature, ...]

__all__ = ["FEATURES", "commands", "register_metrics", "router_blocks", "routes", "start_services"]

_FOLDERS: Final = (
    "probes",
    "ttl",
    "admin_states",
    "cache",
    "cache_store",
    "moves",
    "event_log",
    "discovery",
    "shared_cache",
    "workers",
)
"""`FEATURES`' folders, in the order their services start (a router's probes first: its first
probes run at once)."""


def __getattr__(name: str) -> object:
    """`FEATURES`, each folder's `FEATURE` in `_FOLDERS` order, imported on first use: a process
    that runs one feature's module alone (the event log's writer process) imports no other
    feature, nor the kernel's services (measured: 0.69 s and 53 MB to 0.27 s and 36 MB
    to import the writer)."""
    if name != "FEATURES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _features()


@functools.cache
def _features() -> tuple[Feature, ...]:
    return tuple(importlib.import_module(f"{__name__}.{folder}").FEATURE for folder in _FOLDERS)


def start_services(kernel: Kernel) -> dict[type, Service]:
    """Each feature's service in this process, by type, in `FEATURES` order: every feature's in the
    supervisor (or the only process), those `in_workers` in a worker (`Processes`)."""
    services: dict[type, Service] = {}
    for feature in _features():
        if feature.start is not None and (feature.in_workers or not kernel.processes.worker):
            service = feature.start(kernel)
            services[type(service)] = service
    return services


def routes() -> tuple[Route, ...]:
    """Every feature's admin API routes."""
    return tuple(route for feature in _features() for route in feature.routes)


def commands() -> tuple[Command, ...]:
    """Every feature's routerctl commands."""
    return tuple(command for feature in _features() for command in feature.commands)


def router_blocks() -> tuple[Blocks, ...]:
    """Every feature's part of a router's routerctl output."""
    return tuple(feature.router_blocks for feature in _features() if feature.router_blocks is not None)


def register_metrics(metrics: Metrics) -> Metrics:
    """Register every feature's metric families in `metrics` (also those of a feature whose service
    has not started yet: /metrics lists every family from the start)."""
    for feature in _features():
        if feature.metrics is not None:
            metrics.feature(feature.metrics)
    return metrics
