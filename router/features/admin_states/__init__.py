"""Targets' administrative states as operators set them: ready, drain, maint, kept across restarts.

    service.py     `AdminStates`: the state file read at start, written on each change, its
                   status in the process's status document
    state_file.py  the state file (`StateFile`) and its writes, retried until written (`KeptStates`)
    routes.py      `/api/v1/routers/{name}/targets/{node_id}`
    commands.py    `routerctl state`

What a state does to routing is the kernel's (pools/pool.py, `RouterPool.set_admin_state`).
routerd's `--state-file` is this feature's option.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature, Option
from router.features.admin_states.commands import COMMANDS
from router.features.admin_states.routes import ROUTES
from router.features.admin_states.service import AdminStates
from router.features.admin_states.state_file import default_state_file

__all__ = ["FEATURE"]

FEATURE: Final = Feature(
    name="admin_states",
    in_workers=False,
    routes=ROUTES,
    commands=COMMANDS,
    options=(
        Option(
            name="state_file",
            metavar="FILE",
            help="where targets' administrative states (drain, maint) are kept across restarts "
            "(default: beside the configuration file, NAME-state.json for NAME.xml)",
            default=lambda config: default_state_file(config.source),
        ),
    ),
    start=AdminStates,
)
