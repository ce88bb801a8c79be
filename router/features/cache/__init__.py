"""The sticky cache as operators see it: list, show, evict and pin a running router's entries;
and the sweep of expired ones.

    service.py   the cache's slice of a router at run time (list, show, evict, pin) and the
                 sweep of expired entries (`CachePurge`)
    routes.py    `/api/v1/routers/{name}/cache`
    commands.py  `routerctl cache list | get | evict | pin`

The cache itself (cache/) and its use in routing (router/core/engine.py) are the kernel's.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.cache.commands import COMMANDS
from router.features.cache.routes import ROUTES
from router.features.cache.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="cache", routes=ROUTES, commands=COMMANDS, start=start)
