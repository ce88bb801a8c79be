"""router/services/admin_routes.py: the kernel's routes and readiness, against a real
`RouterRuntime` (every route through a real admin API: test_admin.py, test_admin_api.py)."""

from __future__ import annotations

import pytest

from router.feature import Call, HttpError
from router.services.admin_routes import KERNEL_ROUTES, Lifecycle, not_ready
from tests.router.runtime.test_kernel import make_runtime


def test_not_ready_says_why_shutting_down_first() -> None:
    runtime = make_runtime()
    lifecycle = Lifecycle()
    assert not_ready({"r": runtime}, lifecycle) == "starting: the acceptors are not listening yet"
    lifecycle.accepting.set()
    assert not_ready({"r": runtime}, lifecycle) == (
        "router 'r': pool below its quorum, 0 of 3 target(s) ready, quorum-size 1"
    )
    runtime.pool.record_check("b1", True)
    assert not_ready({"r": runtime}, lifecycle) is None
    lifecycle.shutdown.set()
    assert not_ready({"r": runtime}, lifecycle) == "shutting down"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, "query parameter 'key' is required"),
        ({"key": ["k"], "dry-run": ["yes"]}, "dry-run must be true or false"),
    ],
)
def test_lookup_needs_a_key_and_a_boolean_dry_run(query: dict[str, list[str]], message: str) -> None:
    route = next(r for r in KERNEL_ROUTES if r.template == "/api/v1/routers/{name}/target")
    call = Call(
        method="GET", params={"name": "r"}, query=query, body=b"", runtimes={"r": make_runtime()}, services={}
    )
    with pytest.raises(HttpError) as raised:
        route.handler(call)
    assert raised.value.status == 400
    assert raised.value.message.startswith(message)
