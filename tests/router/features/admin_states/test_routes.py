"""router/features/admin_states/routes.py: a target's resource against a real `RouterRuntime`,
without a state file (with one, through a real routerd: tests/router/test_routerd_admin_state.py)."""

from __future__ import annotations

import json

import pytest
import trio

from router.feature import Call, HttpError
from router.features.admin_states.routes import ROUTES
from tests.router.runtime.test_kernel import make_runtime

TEMPLATE = "/api/v1/routers/{name}/targets/{node_id}"


async def _send(runtime: object, method: str, node_id: str, body: object = None) -> dict[str, object]:
    route = next(r for r in ROUTES if r.method == method)
    call = Call(
        method=method,
        params={"name": "r", "node_id": node_id},
        query={},
        body=b"" if body is None else json.dumps(body).encode(),
        runtimes={"r": runtime},  # type: ignore[dict-item]
        services={},
    )
    response = route.handler(call)
    status, _, payload = await response if not isinstance(response, tuple) else response
    assert status == 200
    document = json.loads(payload)
    assert isinstance(document, dict)
    return document


async def test_put_drain_then_get_shows_it() -> None:
    runtime = make_runtime()
    assert (await _send(runtime, "PUT", "b2", {"admin_state": "drain"}))["admin_state"] == "drain"
    assert (await _send(runtime, "GET", "b2"))["admin_state"] == "drain"


@pytest.mark.parametrize(
    ("node_id", "body", "status"),
    [
        ("b2", {"admin_state": "paused"}, 400),
        ("b2", {"state": "drain"}, 400),
        ("nope", {"admin_state": "drain"}, 404),
    ],
)
async def test_bad_puts_are_refused(node_id: str, body: object, status: int) -> None:
    with pytest.raises(HttpError) as raised:
        await _send(make_runtime(), "PUT", node_id, body)
    assert raised.value.status == status
    await trio.lowlevel.checkpoint()
