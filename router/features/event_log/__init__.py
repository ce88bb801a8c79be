"""The routing event log as operators see it.

    commands.py  `routerctl event-log`

The log itself (its records, ring, writer process and files) is still in router/core/ and
router/services/ (`event_*`), and moves here next.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.event_log.commands import COMMANDS
from router.features.event_log.routes import ROUTES

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="event_log", routes=ROUTES, commands=COMMANDS)
