"""docs/admin-api.yaml against the admin API (router/services/admin.py): the document is valid
OpenAPI 3.1, it lists exactly the operations the server serves, and a real routerd (over real
mosquitto brokers) answers a representative request of each operation, and its errors, as the
document's schemas say."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from router.server import ROUTES
from tests.router.conftest import ROUND_ROBIN_NODE_IDS, mqtt_round_trip, round_robin_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd

DOCUMENT_PATH = Path(__file__).resolve().parents[3] / "docs" / "admin-api.yaml"
DOCUMENT: dict[str, Any] = yaml.safe_load(DOCUMENT_PATH.read_text())
BASE_URI = "urn:connection-router:admin-api"
REGISTRY: Registry[Any] = Registry().with_resource(
    BASE_URI, Resource.from_contents(DOCUMENT, default_specification=DRAFT202012)
)
METHODS = ("get", "put", "post", "delete", "patch")


def _operations() -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, item in DOCUMENT["paths"].items() for m in item if m in METHODS}


def _pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) into the document."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def test_admin_api_document_is_valid_openapi_3_1() -> None:
    assert DOCUMENT["openapi"] == "3.1.0"
    validate_openapi(DOCUMENT)  # raises OpenAPIValidationError


def test_admin_api_document_lists_exactly_the_operations_the_server_serves() -> None:
    assert _operations() == set(ROUTES)


def test_admin_api_document_has_an_error_answer_and_a_success_for_every_operation() -> None:
    for method, path in _operations():
        responses = DOCUMENT["paths"][path][method.lower()]["responses"]
        assert "default" in responses, (method, path)
        assert [code for code in responses if code.startswith("2")], (method, path)


def _call(router: Routerd, method: str, path: str, body: object = None) -> tuple[int, str, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(router.admin + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["content-type"], exc.read()


class _Checker:
    """Checks answers against the document; remembers which operations it saw succeed."""

    def __init__(self, router: Routerd) -> None:
        self.router = router
        self.succeeded: set[tuple[str, str]] = set()

    def __call__(self, method: str, template: str, path: str, status: int, body: object = None) -> Any:
        """Send `method path`, expect `status`, validate the answer against `template`'s
        operation in the document; the parsed answer."""
        got, ctype, payload = _call(self.router, method, path, body)
        assert got == status, (method, path, got, payload)
        responses = DOCUMENT["paths"][template][method.lower()]["responses"]
        key = str(status) if str(status) in responses else "default"
        assert key != "default" or status >= 400, f"{method} {template}: {status} is not documented"
        response = responses[key]
        pointer = _pointer("paths", template, method.lower(), "responses", key)
        if "$ref" in response:  # a shared response (components/responses)
            pointer = response["$ref"].removeprefix("#")
            response = DOCUMENT["components"]["responses"][pointer.rsplit("/", 1)[1]]
        media = ctype.split(";")[0].strip()
        assert media in response["content"], (method, path, ctype)
        instance = json.loads(payload) if media == "application/json" else payload.decode()
        schema = {"$ref": f"{BASE_URI}#{pointer}{_pointer('content', media, 'schema')}"}
        errors = [e.message for e in Draft202012Validator(schema, registry=REGISTRY).iter_errors(instance)]
        assert errors == [], (method, path, instance)
        if status < 300:
            self.succeeded.add((method, template))
        return instance


@pytest.mark.integration
def test_routerd_answers_every_operation_as_the_document_says(
    tmp_path: Path,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
) -> None:
    port = free_port()
    config = round_robin_config(mosquitto_fleet, port, "<cache><timeout>600000</timeout></cache>")
    router = start_routerd(config, "--event-log", str(tmp_path / "events"))
    for node_id in ROUND_ROBIN_NODE_IDS:
        router.wait_for_log(rf"router=rr target={node_id} is ready", consume=False)
    assert mqtt_round_trip(port, client_id=f"c-{uuid.uuid4().hex[:8]}", topic="openapi/check")
    check = _Checker(router)
    r = "/api/v1/routers/rr"

    assert check("GET", "/healthz", "/healthz", 200) == "ok\n"
    assert "router_connections_accepted_total" in check("GET", "/metrics", "/metrics", 200)
    status = check("GET", "/api/v1/status", "/api/v1/status", 200)
    assert [a["port"] for a in status["acceptors"]] == [port]
    assert status["acceptors"][0]["open"] == 0  # the round trip's client has gone
    assert [d["name"] for d in check("GET", "/api/v1/routers", "/api/v1/routers", 200)] == ["rr"]
    check("GET", "/api/v1/routers/{name}", r, 200)
    template = "/api/v1/routers/{name}/target"
    assert check("GET", template, f"{r}/target?key=k1", 200)["status"] == "OK"
    check("GET", template, f"{r}/target?key=k2&dry-run=true", 200)
    template = "/api/v1/routers/{name}/filters"
    assert check("PUT", template, f"{r}/filters", 200, {"key_filter": "^.{1,64}"})["key_filter"] == "^.{1,64}"
    check("PUT", template, f"{r}/filters", 200, {"key_filter": None})
    template = "/api/v1/routers/{name}/targets/{node_id}"
    check("GET", template, f"{r}/targets/b0", 200)
    assert check("PUT", template, f"{r}/targets/b1", 200, {"admin_state": "drain"})["admin_state"] == "drain"
    check("PUT", template, f"{r}/targets/b1", 200, {"admin_state": "ready"})
    kept = check("GET", "/api/v1/status", "/api/v1/status", 200)["state_file"]
    expected = (str(tmp_path / "router-state.json"), True, None)
    assert (kept["path"], kept["persisted"], kept["error"]) == expected
    template = "/api/v1/routers/{name}/cache"
    assert check("GET", template, f"{r}/cache?key=k1", 200)["key"] == "k1"
    assert check("GET", template, f"{r}/cache?limit=1", 200)["entries"]
    pin = {"key": "pinned", "node_id": "b2", "duration_s": 60}
    assert check("PUT", template, f"{r}/cache", 200, pin)["pinned"] is True
    assert check("DELETE", template, f"{r}/cache?key=pinned", 200) == {"evicted": 1}
    check("GET", "/api/v1/event-log", "/api/v1/event-log", 200)
    assert (
        check("PUT", "/api/v1/event-log", "/api/v1/event-log", 200, {"ring_size": 2048})["ring_size"] == 2048
    )
    assert check("GET", "/readyz", "/readyz", 200) == "ready\n"
    assert "summary" in check("POST", "/api/v1/reload", "/api/v1/reload", 200)
    template = "/api/v1/routers/{name}/targets/{node_id}/evacuation"
    slow = {"rate": 0.01, "order": "random"}
    assert check("POST", template, f"{r}/targets/b2/evacuation", 202, slow)["state"] in ("running", "done")
    assert check("GET", template, f"{r}/targets/b2/evacuation", 200)["node_id"] == "b2"
    assert check("DELETE", template, f"{r}/targets/b2/evacuation", 200)["kind"] == "evacuate"
    check("PUT", "/api/v1/routers/{name}/targets/{node_id}", f"{r}/targets/b2", 200, {"admin_state": "ready"})
    template = "/api/v1/routers/{name}/rebalance"
    check("POST", template, f"{r}/rebalance", 202, {"rate": 0.01, "band": 0.5})
    check("GET", template, f"{r}/rebalance", 200)
    check("DELETE", template, f"{r}/rebalance", 200)
    assert [m["kind"] for m in check("GET", "/api/v1/moves", "/api/v1/moves", 200)] == [
        "evacuate",
        "rebalance",
    ]

    # Errors are documented too (the operation's `default` answer).
    check("GET", "/api/v1/routers/{name}", "/api/v1/routers/nope", 404)
    check("GET", "/api/v1/routers/{name}/target", f"{r}/target", 400)
    check("PUT", "/api/v1/routers/{name}/targets/{node_id}", f"{r}/targets/b0", 400, {"admin_state": "x"})
    check("GET", "/api/v1/routers/{name}/targets/{node_id}", f"{r}/targets/nobody", 404)
    check("DELETE", "/api/v1/routers/{name}/cache", f"{r}/cache", 400)
    check("GET", "/api/v1/routers/{name}/cache", f"{r}/cache?key=never", 404)
    check("PUT", "/api/v1/event-log", "/api/v1/event-log", 400, {"ring_size": 0})

    # Nothing else is served: another method on a documented path is a 405, other paths 404/405.
    for path, item in DOCUMENT["paths"].items():
        concrete = path.replace("{name}", "rr").replace("{node_id}", "b0")
        for method in METHODS:
            if method not in item:
                got, _, payload = _call(router, method.upper(), concrete, {} if method != "get" else None)
                assert got == 405, (method, concrete, got, payload)
    for path in (
        "/",
        "/api",
        "/api/v1",
        "/api/v2/status",
        "/api/v1/statuses",
        f"{r}/nope",
        f"{r}/targets/b0/x",
    ):
        for method in METHODS:
            got, _, _ = _call(router, method.upper(), path, {} if method != "get" else None)
            assert got in (404, 405), (method, path, got)
    check(
        "POST", "/api/v1/routers/{name}/targets/{node_id}/evacuation", f"{r}/targets/nobody/evacuation", 404
    )
    check("POST", "/api/v1/routers/{name}/rebalance", f"{r}/rebalance", 400, {"band": -1})
    assert check("POST", "/api/v1/shutdown", "/api/v1/shutdown", 202) == {"shutdown": "started"}
    assert check.succeeded == set(ROUTES)
    assert router.proc is not None
    assert router.proc.wait(30) == 0
