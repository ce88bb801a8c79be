"""Paced moves of clients: evacuating a target, rebalancing a pool, a paced shutdown.

    rules.py     the pure parts: requests, statuses, pacing, order, rebalance arithmetic
    service.py   `Moves`, carrying them out in routerd; the paced shutdown; a reload's removed targets
    routes.py    the admin API's evacuation, rebalance, shutdown and moves resources
    commands.py  `routerctl evacuate`, `rebalance` and `shutdown`
    metrics.py   router_evacuation_moved_total, router_evacuation_remaining

docs/operations.md ("Evacuating a target", "Rebalancing") is the operator's guide.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.moves.commands import COMMANDS
from router.features.moves.metrics import MoveMetrics
from router.features.moves.routes import ROUTES
from router.features.moves.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="moves", routes=ROUTES, commands=COMMANDS, metrics=MoveMetrics, start=start)
