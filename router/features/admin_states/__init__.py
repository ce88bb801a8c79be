"""Targets' administrative states as operators set them: ready, drain, maint.

    commands.py  `routerctl state`

What a state does to routing is the kernel's (pools/pool.py, `RouterPool.set_admin_state`);
the state file that keeps them (router/services/state_file.py) and their admin API resource
(router/services/admin.py) move here next.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.admin_states.commands import COMMANDS
from router.features.admin_states.routes import ROUTES

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="admin_states", routes=ROUTES, commands=COMMANDS)
