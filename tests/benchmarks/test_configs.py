"""Generated configurations: HAProxy accepts its file, routerd loads its file, the plan is sane."""

from __future__ import annotations

import dataclasses
import subprocess
from typing import TYPE_CHECKING

import pytest

from benchmarks.clients import find_tool
from benchmarks.configs import (
    HAPROXY_MAXCONN,
    PROBE_LOCAL_CLIENT_ID,
    Ports,
    haproxy_config,
    haproxy_maxconn,
    mosquitto_config,
    mqtt_redirect_lua,
    routerd_config,
)
from keys import KeyType
from router.config import load_config_text
from router.config.settings import AcceptorMode

if TYPE_CHECKING:
    from pathlib import Path


def _ports(base: int = 21000) -> Ports:
    return Ports.from_numbers(range(base, base + Ports.COUNT))


def test_ports_all_lists_every_port() -> None:
    assert sorted(_ports().all()) == list(range(21000, 21014))


def test_ports_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="distinct"):
        dataclasses.replace(_ports(), iperf=21000)


def test_ports_rejects_ephemeral_range() -> None:
    with pytest.raises(ValueError, match="below the ephemeral range"):
        dataclasses.replace(_ports(), iperf=40000)


@pytest.mark.parametrize(
    ("limit", "maxconn"), [(20000, HAPROXY_MAXCONN), (1 << 20, HAPROXY_MAXCONN), (4500, 2000)]
)
def test_haproxy_maxconn_fits_the_fd_limit(limit: int, maxconn: int) -> None:
    assert haproxy_maxconn(limit) == maxconn


def test_haproxy_config_has_the_documented_settings() -> None:
    text = haproxy_config(_ports(), lua_path="/x/redirect.lua")
    for line in [
        "nbthread 1",
        f"maxconn {HAPROXY_MAXCONN}",
        "mode tcp",
        "timeout connect 5s",
        "timeout client 60s",
        "timeout server 60s",
        "balance source",
        "hash-type consistent",
        "lua-load /x/redirect.lua",
        "mqtt_field_value(connect,client_identifier)",
        "use-service lua.mqtt_redirect",
    ]:
        assert line in text
    assert "127.0.0.1:21000 check" in text
    assert "0.0.0.0" not in text


@pytest.mark.integration
def test_haproxy_config_passes_haproxy_check(tmp_path: Path) -> None:
    haproxy = find_tool("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is not installed: run ./run-tests, which installs it")
    lua = tmp_path / "redirect.lua"
    lua.write_text(mqtt_redirect_lua("127.0.0.1:21003"))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(_ports(), lua_path=str(lua)))
    result = subprocess.run(
        [haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mqtt_redirect_lua_rejects_quotes() -> None:
    with pytest.raises(ValueError, match="server reference"):
        mqtt_redirect_lua('a"b')


def test_routerd_config_loads_with_the_routers_of_the_benchmark() -> None:
    config = load_config_text(routerd_config(_ports()), "bench.xml")
    routers = {r.name: r for r in config.routers}
    assert set(routers) == {"echo", "iperf", "mqtt", "mqtt-probe"}
    assert routers["echo"].key_type is KeyType.SOURCE_IP
    assert routers["mqtt"].key_type is KeyType.CLIENT_ID
    assert routers["mqtt-probe"].local_target_filter == PROBE_LOCAL_CLIENT_ID
    assert routers["mqtt-probe"].local_connector is None
    for router in routers.values():
        assert router.policy is not None
        assert router.policy.name == "CONSISTENT_HASH"
    modes = {a.name: a.mode for a in config.acceptors}
    assert modes["mqtt-redirect"] is AcceptorMode.REDIRECT
    assert modes["echo"] is AcceptorMode.PROXY
    assert {a.host for a in config.acceptors} == {"127.0.0.1"}


def test_mosquitto_config_listens_on_loopback_only() -> None:
    assert mosquitto_config(21003).startswith("listener 21003 127.0.0.1\n")
