"""The moves' admin API resources (docs/admin-api.yaml): evacuations, rebalances, the shutdown.

    POST | GET | DELETE  /api/v1/routers/{name}/targets/{node_id}/evacuation
    POST | GET | DELETE  /api/v1/routers/{name}/rebalance
    POST                 /api/v1/shutdown      (admin level, router/core/admin_access.py)
    GET                  /api/v1/moves

POST starts a move (202 and its status), GET shows the last one, DELETE aborts it; a body's
fields are checked here, with the rule and the value in the 400's message.
"""

from __future__ import annotations

from typing import Final

from router.feature import Call, HttpError, Response, Route, json_object, json_response
from router.features.moves.rules import DEFAULT_BAND, DEFAULT_RATE, MoveKind, MoveOrder, MoveRequest
from router.features.moves.service import MoveConflict, Moves

__all__ = ["ROUTES"]


def _move_request(kind: MoveKind, router: str, node_id: str | None, body: bytes) -> MoveRequest:
    fields = json_object(body) if body.strip() else {}
    unknown = set(fields) - {"rate", "order", "band", "refer"}
    if unknown:
        raise HttpError(400, f"unknown field(s) {sorted(unknown)}; expected rate, order, band, refer")
    refer = fields.get("refer")
    if refer is not None and not isinstance(refer, bool):
        raise HttpError(400, f"refer must be true, false or null, got {refer!r}")
    rate, band, order = (
        fields.get("rate", DEFAULT_RATE),
        fields.get("band", DEFAULT_BAND),
        fields.get("order", "oldest"),
    )
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        raise HttpError(400, f"rate must be a number of connections per second, got {rate!r}")
    if isinstance(band, bool) or not isinstance(band, int | float):
        raise HttpError(400, f"band must be a number (0.1 = 10 % above the mean), got {band!r}")
    try:
        move_order = MoveOrder(order)
    except ValueError:
        raise HttpError(400, f"order must be oldest or random, got {order!r}") from None
    try:
        return MoveRequest(
            kind=kind,
            router=router,
            node_id=node_id,
            rate=float(rate),
            band=float(band),
            order=move_order,
            refer=refer,
        )
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None


def _moves(call: Call, kind: MoveKind, node_id: str | None) -> Response:
    """An evacuation's or a rebalance's resource: POST starts, GET shows, DELETE aborts."""
    router, moves = call.params["name"], call.service(Moves)
    try:
        if call.method == "POST":
            return json_response(202, moves.start(_move_request(kind, router, node_id, call.body)).to_json())
        if call.method == "GET":
            return json_response(200, moves.status(kind, router, node_id).to_json())
        return json_response(200, moves.abort(kind, router, node_id).to_json())
    except LookupError as exc:
        raise HttpError(404, str(exc.args[0]) if exc.args else str(exc)) from None
    except MoveConflict as exc:
        raise HttpError(409, str(exc)) from None


def _evacuation(call: Call) -> Response:
    return _moves(call, MoveKind.EVACUATE, call.params["node_id"])


def _rebalance(call: Call) -> Response:
    return _moves(call, MoveKind.REBALANCE, None)


def _shutdown(call: Call) -> Response:
    try:
        call.service(Moves).shutdown()
    except MoveConflict as exc:
        raise HttpError(409, str(exc)) from None
    return json_response(202, {"shutdown": "started"})


def _all(call: Call) -> Response:
    return json_response(200, [m.to_json() for m in call.service(Moves).all_statuses()])


_EVACUATION: Final = "/api/v1/routers/{name}/targets/{node_id}/evacuation"
_REBALANCE: Final = "/api/v1/routers/{name}/rebalance"

ROUTES: Final = (
    Route(method="POST", template="/api/v1/shutdown", handler=_shutdown),
    Route(method="GET", template="/api/v1/moves", handler=_all),
    *(Route(method=m, template=_EVACUATION, handler=_evacuation) for m in ("POST", "GET", "DELETE")),
    *(Route(method=m, template=_REBALANCE, handler=_rebalance) for m in ("POST", "GET", "DELETE")),
)
"""The feature's admin API routes."""
