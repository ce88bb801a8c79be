"""router/features/cache/routes.py: the cache resource against a real `RouterRuntime` (through a
real admin API: tests/router/services/test_admin.py)."""

from __future__ import annotations

import json

import pytest

from router.feature import Call, HttpError, Response
from router.features.cache.routes import CACHE_PAGE_MAX, ROUTES
from tests.router.runtime.test_kernel import make_runtime


def _call(method: str, query: dict[str, list[str]] | None = None, body: object = None) -> Response:
    runtime = make_runtime(cache_ms=60_000)
    for node in ("b1", "b2", "b3"):
        runtime.pool.record_check(node, True)
    return _send(runtime, method, query, body)


def _send(
    runtime: object, method: str, query: dict[str, list[str]] | None = None, body: object = None
) -> Response:
    route = next(r for r in ROUTES if r.method == method)
    call = Call(
        method=method,
        params={"name": "r"},
        query=query or {},
        body=b"" if body is None else json.dumps(body).encode(),
        runtimes={"r": runtime},  # type: ignore[dict-item]
        services={},
    )
    response = route.handler(call)
    assert isinstance(response, tuple)
    return response


async def test_pin_then_get_then_page_then_evict() -> None:
    runtime = make_runtime(cache_ms=60_000)
    for node in ("b1", "b2", "b3"):
        runtime.pool.record_check(node, True)
    status, _, body = _send(runtime, "PUT", body={"key": "k1", "node_id": "b2", "duration_s": None})
    assert (status, json.loads(body)["node_id"]) == (200, "b2")
    assert json.loads(_send(runtime, "GET", {"key": ["k1"]})[2])["pinned"] is True
    page = json.loads(_send(runtime, "GET", {"limit": ["10"]})[2])
    assert ([e["key"] for e in page["entries"]], page["next"]) == (["k1"], None)
    assert json.loads(_send(runtime, "DELETE", {"all": ["true"]})[2]) == {"evicted": 1}
    with pytest.raises(HttpError, match="no cache entry for key 'k1'") as raised:
        _send(runtime, "GET", {"key": ["k1"]})
    assert raised.value.status == 404


@pytest.mark.parametrize(
    ("method", "query", "body", "message"),
    [
        ("DELETE", {}, None, "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true"),
        ("DELETE", {"key": ["a"], "all": ["true"]}, None, "DELETE needs exactly one of"),
        ("GET", {"limit": [str(CACHE_PAGE_MAX + 1)]}, None, f"limit must be an integer 1-{CACHE_PAGE_MAX}"),
        ("GET", {"key": ["a", "b"]}, None, "query parameter 'key' given 2 times"),
        ("PUT", {}, {"key": "k"}, 'body must be {"key": K, "node_id": N, "duration_s": seconds or null}'),
    ],
)
async def test_bad_requests_are_400_naming_the_rule(
    method: str, query: dict[str, list[str]], body: object, message: str
) -> None:
    with pytest.raises(HttpError) as raised:
        _call(method, query, body)
    assert raised.value.status == 400
    assert raised.value.message.startswith(message)
