"""The routing event log as operators see it.

    service.py   `EventLogService`: the log opened at start, each router subscribed, its rest
                 written at exit
    routes.py    `/api/v1/event-log`
    commands.py  `routerctl event-log`

The log itself (its records, ring, writer process and files) is still in router/core/ and
router/services/ (`event_*`), and moves here next.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.event_log.commands import COMMANDS
from router.features.event_log.routes import ROUTES
from router.features.event_log.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="event_log", routes=ROUTES, commands=COMMANDS, start=start)
