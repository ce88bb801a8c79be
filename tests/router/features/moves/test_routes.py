"""router/features/moves/routes.py: the moves' admin API resources against a real `Moves` and
`RouterRuntime` on trio's virtual clock (the same resources through a real routerd and routerctl
are in tests/router/test_routerd_evacuation.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
import trio

from router.feature import Call, HttpError, Route
from router.features.moves.routes import ROUTES
from router.features.moves.service import Moves
from tests.router.features.moves.test_service import _connect, make_runtime

if TYPE_CHECKING:
    from router.core.events import CloseReason
    from router.runtime import RouterRuntime


def _handler(method: str, template: str) -> Route:
    return next(r for r in ROUTES if (r.method, r.template) == (method, template))


def _call(
    moves: Moves, runtime: RouterRuntime, method: str, template: str, body: object = None, **params: str
):
    route = _handler(method, template)
    call = Call(
        method=method,
        params=params,
        query={},
        body=b"" if body is None else json.dumps(body).encode(),
        runtimes={"r": runtime},
        services={Moves: moves},
    )
    response = route.handler(call)
    assert isinstance(response, tuple), "the moves' handlers answer at once"
    return response


EVACUATION = "/api/v1/routers/{name}/targets/{node_id}/evacuation"
REBALANCE = "/api/v1/routers/{name}/rebalance"


def test_routes_are_every_method_of_each_resource() -> None:
    assert {(r.method, r.template) for r in ROUTES} == {
        ("POST", "/api/v1/shutdown"),
        ("GET", "/api/v1/moves"),
        *((m, EVACUATION) for m in ("POST", "GET", "DELETE")),
        *((m, REBALANCE) for m in ("POST", "GET", "DELETE")),
    }


async def test_evacuation_starts_shows_and_aborts(autojump_clock: object) -> None:
    runtime = make_runtime()
    closes: list[tuple[float, str, CloseReason]] = []
    _connect(runtime, "b1", 3, closes)
    moves = Moves({"r": runtime})
    async with trio.open_nursery() as nursery:
        await nursery.start(moves.serve)
        status, ctype, body = _call(moves, runtime, "POST", EVACUATION, {"rate": 1}, name="r", node_id="b1")
        assert (status, ctype) == (202, "application/json")
        assert json.loads(body)["state"] == "running"
        status, _, body = _call(moves, runtime, "GET", EVACUATION, name="r", node_id="b1")
        assert (status, json.loads(body)["node_id"]) == (200, "b1")
        status, _, body = _call(moves, runtime, "DELETE", EVACUATION, name="r", node_id="b1")
        assert (status, json.loads(body)["state"]) == (200, "aborted")
        status, _, body = _call(moves, runtime, "GET", "/api/v1/moves")
        assert [m["state"] for m in json.loads(body)] == ["aborted"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"speed": 1}, "unknown field(s) ['speed']; expected rate, order, band, refer"),
        ({"refer": "yes"}, "refer must be true, false or null, got 'yes'"),
        ({"rate": "fast"}, "rate must be a number of connections per second, got 'fast'"),
        ({"rate": True}, "rate must be a number of connections per second, got True"),
        ({"band": "wide"}, "band must be a number (0.1 = 10 % above the mean), got 'wide'"),
        ({"order": "newest"}, "order must be oldest or random, got 'newest'"),
    ],
)
def test_a_bad_body_is_400_naming_the_field_and_value(body: dict[str, object], message: str) -> None:
    runtime = make_runtime()
    with pytest.raises(HttpError) as raised:
        _call(Moves({"r": runtime}), runtime, "POST", REBALANCE, body, name="r")
    assert (raised.value.status, raised.value.message) == (400, message)


def test_an_unknown_router_or_no_move_yet_is_404() -> None:
    runtime = make_runtime()
    moves = Moves({"r": runtime})
    with pytest.raises(HttpError, match="no connection router named 'x'") as raised:
        _call(moves, runtime, "GET", REBALANCE, name="x")
    assert raised.value.status == 404
    with pytest.raises(HttpError, match="no rebalance of r so far") as raised:
        _call(moves, runtime, "GET", REBALANCE, name="r")
    assert raised.value.status == 404


def test_a_move_while_not_serving_is_409() -> None:
    runtime = make_runtime()
    with pytest.raises(HttpError, match="not serving moves") as raised:
        _call(Moves({"r": runtime}), runtime, "POST", EVACUATION, {}, name="r", node_id="b1")
    assert raised.value.status == 409


def test_shutdown_is_202_and_stops_or_409_when_not_offered() -> None:
    runtime = make_runtime()
    stopped: list[bool] = []
    status, _, body = _call(Moves({}, stop=lambda: stopped.append(True)), runtime, "POST", "/api/v1/shutdown")
    assert (status, json.loads(body), stopped) == (202, {"shutdown": "started"}, [True])
    with pytest.raises(HttpError) as raised:
        _call(Moves({}), runtime, "POST", "/api/v1/shutdown")
    assert raised.value.status == 409
