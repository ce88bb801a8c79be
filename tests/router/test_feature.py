"""router/feature.py: the contract's request, errors and a service's default hooks."""

from __future__ import annotations

import json

import pytest
import trio

from router.config.settings import Config
from router.core.reload import Departed
from router.feature import JSON, Call, HttpError, Option, Service, json_object, json_response
from tests.router.runtime.test_kernel import make_runtime


def _call(**params: str) -> Call:
    return Call(
        method="GET",
        params=params,
        query={},
        body=b"",
        runtimes={"r": make_runtime()},
        services={Service: Service()},
    )


def test_json_response_is_one_line_of_json() -> None:
    status, ctype, body = json_response(202, {"a": [1]})
    assert (status, ctype, json.loads(body)) == (202, JSON, {"a": [1]})
    assert body.count(b"\n") == 1
    assert body.endswith(b"\n")


@pytest.mark.parametrize(
    ("body", "message"), [(b"{", "body is not JSON"), (b"[1]", "body must be a JSON object")]
)
def test_json_object_refuses_what_is_not_an_object(body: bytes, message: str) -> None:
    with pytest.raises(HttpError, match=message) as raised:
        json_object(body)
    assert raised.value.status == 400


def test_json_object_of_an_empty_body_is_empty() -> None:
    assert json_object(b"") == {}


def test_call_runtime_is_the_named_router_or_404() -> None:
    assert _call(name="r").runtime.name == "r"
    with pytest.raises(HttpError, match="no connection router named 'x'") as raised:
        _ = _call(name="x").runtime
    assert raised.value.status == 404


def test_call_service_by_type_or_503() -> None:
    call = _call()
    assert isinstance(call.service(Service), Service)

    class Other(Service):
        pass

    with pytest.raises(HttpError, match="Other does not run in this process") as raised:
        call.service(Other)
    assert raised.value.status == 503


async def test_service_default_hooks_do_nothing() -> None:
    service = Service()
    departed = [Departed(node_id="b1")]
    runtime = make_runtime()
    async with trio.open_nursery() as nursery:
        await nursery.start(service.serve)  # started at once, and returns
        await nursery.start(service.serve_router, runtime)
        await nursery.start(service.serve_router_data, runtime)
    assert service.targets_left(runtime, departed) == departed
    service.open_files()
    await service.prepare_router(runtime.config)
    service.discard_prepared()
    service.router_added(runtime)
    service.router_changed(runtime)
    service.router_removed(runtime)
    assert service.process_status() == {}
    service.stopping(1.0)
    with trio.fail_after(0):  # at once: nothing to write
        await service.close_files(5.0)


def test_an_option_is_a_flag_or_takes_a_value_with_its_default_from_the_configuration() -> None:
    config = Config(source="/etc/cr/broker.xml")
    flag = Option(name="discard_unreadable_cache", help="h")
    assert flag.flag == "--discard-unreadable-cache"
    assert (flag.value(None, config), flag.value(True, config)) == (False, True)
    valued = Option(name="state_file", help="h", metavar="FILE", default=lambda c: c.source + ".json")
    assert valued.value(None, config) == "/etc/cr/broker.xml.json"
    assert valued.value("/s.json", config) == "/s.json"
    assert Option(name="x", help="h", metavar="X").value(None, config) is None
