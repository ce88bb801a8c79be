"""A target's resource in the admin API (docs/admin-api.yaml):

GET  /api/v1/routers/{name}/targets/{node_id}   one target's status (state, admin state, ...)
PUT  /api/v1/routers/{name}/targets/{node_id}   JSON {"admin_state": "ready" | "drain" |
                                               "maint"}; kept in the state file; the status
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from pools import AdminState
from router.feature import Call, HttpError, Response, Route, json_object, json_response
from router.features.admin_states.service import AdminStates
from router.logs import shown

if TYPE_CHECKING:
    from router.runtime import RouterRuntime

__all__ = ["ROUTES", "STATE_WRITE_WAIT_S"]

log = logging.getLogger("router.admin")

STATE_WRITE_WAIT_S: Final = 3.0
"""How long a PUT of an administrative state waits for the state file (a write takes a few ms;
within `REQUEST_TIMEOUT_S`, and above the probe's 1 s of a frozen filesystem)."""


async def _target(call: Call) -> Response:
    """A target's status document (GET), after setting its administrative state (PUT
    `{"admin_state": "ready" | "drain" | "maint"}`), kept in the state file: the answer waits up to
    `STATE_WRITE_WAIT_S` for the file, and is a 500 when it is not written (the state is in force,
    and the write is retried)."""
    runtime, node_id = call.runtime, call.params["node_id"]
    service = call.optional(AdminStates)
    states = None if service is None else service.kept
    if call.method == "PUT":
        document = json_object(call.body)
        values = [s.value for s in AdminState]
        state = document.get("admin_state")
        if set(document) != {"admin_state"} or state not in values:
            raise HttpError(400, f'body must be {{"admin_state": one of {values}}}, got {document!r}')
        try:
            changed = runtime.pool.set_admin_state(node_id, AdminState(state))
        except LookupError as exc:
            raise HttpError(404, str(exc)) from None
        except ValueError as exc:
            raise HttpError(404, str(exc)) from None
        if changed and states is not None:
            error = await states.changed_and_written(STATE_WRITE_WAIT_S)
            if error is not None:
                log.error(
                    "router=%s target=%s admin state %s is in force but not kept yet: %s",
                    runtime.name,
                    shown(node_id),
                    state,
                    error,
                )
                raise HttpError(
                    500,
                    f"admin state {state} is in force, but not kept across a restart yet: {error}; "
                    "routerd retries the write (routerctl status shows when it is kept)",
                )
    return json_response(200, _target_document(runtime, node_id))


def _target_document(runtime: RouterRuntime, node_id: str) -> dict[str, object]:
    status = runtime.status().pool
    for target in () if status is None else status.targets:
        if target.node_id == node_id:
            return target.to_json()
    admin_state = runtime.pool.admin_states().get(node_id)
    if admin_state is None:
        raise HttpError(404, f"no target with node id {node_id!r} in the pool of {runtime.name!r}")
    return {"node_id": node_id, "admin_state": admin_state.value, "in_pool": False}


ROUTES: Final = tuple(
    Route(method=method, template="/api/v1/routers/{name}/targets/{node_id}", handler=_target)
    for method in ("GET", "PUT")
)
"""The feature's admin API routes."""
