"""Worker processes (`routerd --workers N`): N processes serve the data path, as one router.

    _zone.c     the shared zone of a router: its sticky cache (exact LRU, expire-after-access,
                pins), its ROUND_ROBIN position, and the board the supervisor publishes on
    zone.py     the zone seen from Python: `ZoneCache` (a `TargetCache` in the zone) and
                `join_zone`, which makes a router's engine decide with the zone's cache and position
    rules.py    what several workers accept, and the board: targets' states a worker takes
    service.py  the supervisor's workers (started, started again, stopped) and a worker's link
                to its supervisor

docs/operations.md ("Worker processes") says what is shared, what is not yet, and the figures.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.workers.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="workers", start=start)
