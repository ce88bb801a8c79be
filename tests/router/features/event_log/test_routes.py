"""router/features/event_log/routes.py: the event log's resource (through a real admin API with the
log on: tests/router/services/test_admin.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from router.config.settings import Config, EventLogConfig
from router.feature import Call, HttpError
from router.features.event_log.routes import ROUTES
from router.features.event_log.service import EventLog, EventLogService
from router.metrics import Metrics

if TYPE_CHECKING:
    from pathlib import Path


def _call(method: str, services: dict[type, object], body: object = None) -> Call:
    return Call(
        method=method,
        params={},
        query={},
        body=b"" if body is None else json.dumps(body).encode(),
        runtimes={},
        services=services,
    )


def _handle(call: Call) -> tuple[int, str, bytes]:
    response = next(r for r in ROUTES if r.method == call.method).handler(call)
    assert isinstance(response, tuple)
    return response


def test_without_an_event_log_it_is_404_saying_how_to_turn_it_on() -> None:
    with pytest.raises(HttpError, match="the event log is off") as raised:
        _handle(_call("GET", {}))
    assert raised.value.status == 404


def test_with_the_event_log_off_it_is_404_saying_how_to_turn_it_on() -> None:
    service = EventLogService(lambda: Config(source="t.xml"), Metrics())
    with pytest.raises(HttpError, match="the event log is off") as raised:
        _handle(_call("GET", {EventLogService: service}))
    assert raised.value.status == 404


def test_resize_and_status(tmp_path: Path) -> None:
    service = EventLogService(lambda: Config(source="t.xml"), Metrics())
    service.event_log = EventLog(EventLogConfig(directory=str(tmp_path)), "edge-1", {}, Metrics())
    status, _, body = _handle(_call("PUT", {EventLogService: service}, {"ring_size": 128}))
    assert status == 200
    assert json.loads(body)["ring_size"] == 128
    with pytest.raises(HttpError) as raised:
        _handle(_call("PUT", {EventLogService: service}, {"ring_size": 0}))
    assert raised.value.status == 400
