"""The sticky cache as operators see it: list, show, evict and pin a running router's entries.

    commands.py  `routerctl cache list | get | evict | pin`

The cache itself (cache/) and its use in routing (router/core/engine.py) are the kernel's; its
admin API resources are still router/services/admin.py's.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.cache.commands import COMMANDS
from router.features.cache.routes import ROUTES

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="cache", routes=ROUTES, commands=COMMANDS)
