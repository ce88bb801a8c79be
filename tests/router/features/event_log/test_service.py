"""router/features/event_log/service.py: the event log opened at start only when configured, each
router's events logged with its key type, its rest written at exit (the log itself:
tests/router/services/test_event_log.py; through a real routerd: test_routerd_event_log.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from event_format.schema import BOOT_SPAN
from keys import KeyType
from router.config.settings import Config, EventLogConfig, RouterConfig
from router.feature import OpenError
from router.features.event_log.service import EventLogService
from router.metrics import Metrics
from router.runtime import RouterRuntime
from tests.router.services.conftest import all_records
from tests.router.services.test_event_log import decided

if TYPE_CHECKING:
    from pathlib import Path


def _config(*routers: RouterConfig, event_log: EventLogConfig | None = None) -> Config:
    return Config(source="t.xml", routers=routers, event_log=event_log)


def _runtime(key_type: KeyType) -> RouterRuntime:
    """Router `r1`, the router of `decided`'s events."""
    router = RouterConfig(name="r1", key_type=key_type)
    return RouterRuntime(_config(router), router, Metrics())


async def test_no_event_log_without_its_configuration() -> None:
    service = EventLogService(_config, Metrics())
    service.open_files()
    assert service.event_log is None
    runtime = _runtime(KeyType.SOURCE_IP)
    service.router_added(runtime)
    service.router_changed(runtime)
    await service.close_files(5.0)
    assert service.event_log is None


def test_an_unusable_directory_is_an_open_error_of_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings = EventLogConfig(directory=str(blocker / "e"))
    service = EventLogService(lambda: _config(event_log=settings), Metrics())
    with pytest.raises(OpenError, match=r"^event log directory '.*/file/e': Not a directory$"):
        service.open_files()
    assert service.event_log is None


async def test_each_router_s_events_are_logged_with_its_key_type_until_the_exit(tmp_path: Path) -> None:
    """Scenario: the router is added with key type SOURCE_IP, then a reload makes it CLIENT_ID;
    at exit the file holds both decisions, each with the raw key of its time (the events' facts
    have a client id and no source IP)."""
    settings = EventLogConfig(directory=str(tmp_path), router_id="edge-1")
    service = EventLogService(lambda: _config(event_log=settings), Metrics())
    service.open_files()
    assert service.event_log is not None
    assert service.event_log.router_id == "edge-1"
    runtime = _runtime(KeyType.SOURCE_IP)
    service.router_added(runtime)
    runtime.report(decided(1))
    client_id = RouterConfig(name="r1", key_type=KeyType.CLIENT_ID)
    runtime.reconfigure(_config(client_id, event_log=settings), client_id)
    service.router_changed(runtime)
    runtime.report(decided(2))
    await service.close_files(5.0)
    logged = [(int(str(r["conn"])) % BOOT_SPAN, r["raw_key"]) for r in all_records(tmp_path)]
    assert logged == [(1, None), (2, "dev-2")]


async def test_a_writer_that_does_not_finish_in_time_is_an_error_naming_the_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = EventLogService(lambda: _config(event_log=EventLogConfig(directory=str(tmp_path))), Metrics())
    service.open_files()
    assert service.event_log is not None
    await service.close_files(0.0)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.name == "router.server"
    assert record.getMessage().startswith(f"event log {tmp_path}: the writer did not finish within 0 s")
    assert service.event_log.stop(5.0)
