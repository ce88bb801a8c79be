"""The features of routerd and routerctl, one folder each (router/feature.py is the contract).

`FEATURES` is the one list that composes them: the process starts their services, the admin API
serves their routes, the metrics registry holds their families and routerctl offers their
commands, in this order. A new feature is a folder here and a line in `FEATURES`; features never
import each other (tests/test_layout.py), and nothing outside this package imports a feature's
module but through this list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from router.features import (
    admin_states,
    cache,
    cache_store,
    discovery,
    event_log,
    moves,
    probes,
    shared_cache,
    ttl,
)

if TYPE_CHECKING:
    from router.feature import Command, Feature, Route
    from router.metrics import Metrics

__all__ = ["FEATURES", "commands", "register_metrics", "routes"]

FEATURES: Final[tuple[Feature, ...]] = (
    probes.FEATURE,
    ttl.FEATURE,
    admin_states.FEATURE,
    cache.FEATURE,
    cache_store.FEATURE,
    moves.FEATURE,
    event_log.FEATURE,
    discovery.FEATURE,
    shared_cache.FEATURE,
)
"""In the order their services start (a router's probes first: its first probes run at once)."""


def routes() -> tuple[Route, ...]:
    """Every feature's admin API routes."""
    return tuple(route for feature in FEATURES for route in feature.routes)


def commands() -> tuple[Command, ...]:
    """Every feature's routerctl commands."""
    return tuple(command for feature in FEATURES for command in feature.commands)


def register_metrics(metrics: Metrics) -> Metrics:
    """Register every feature's metric families in `metrics` (also those of a feature whose service
    has not started yet: /metrics lists every family from the start)."""
    for feature in FEATURES:
        if feature.metrics is not None:
            metrics.feature(feature.metrics)
    return metrics
