"""Generated configurations: HAProxy accepts its file, routerd loads its file, the plan is sane; for
the artemis group, Artemis's files made from what `artemis create` writes."""

from __future__ import annotations

import dataclasses
import subprocess
from typing import TYPE_CHECKING

import pytest

from benchmarks.clients import find_tool
from benchmarks.configs import (
    ARTEMIS_ROUTER,
    HAPROXY_MAXCONN,
    PROBE_LOCAL_CLIENT_ID,
    ArtemisPorts,
    HaproxyLimits,
    Ports,
    artemis_log4j2,
    artemis_router_xml,
    artemis_target_xml,
    haproxy_config,
    haproxy_maxconn,
    haproxy_mqtt_pool_config,
    mosquitto_config,
    mqtt_redirect_lua,
    routerd_artemis_config,
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


def test_ports_with_proxy_ports_keeps_the_backends() -> None:
    """Scenario: the instructions group's second HAProxy and routerd in front of the fleet's
    backends, on ports of their own."""
    ports = _ports()
    own = ports.with_proxy_ports(range(22000, 22000 + Ports.PROXY_COUNT))
    assert (own.echo, own.iperf, own.mosquitto) == (ports.echo, ports.iperf, ports.mosquitto)
    assert own.all()[-Ports.PROXY_COUNT :] == list(range(22000, 22010))
    assert (own.haproxy_echo, own.routerd_admin) == (22000, 22009)
    assert "127.0.0.1:22004?router=echo" in routerd_config(own)
    assert f"127.0.0.1:{ports.echo[0]}?nodeId=echo-1" in routerd_config(own)


def test_ports_with_proxy_ports_rejects_a_wrong_count_or_a_backend_port() -> None:
    with pytest.raises(ValueError, match="take 10 ports, got 9"):
        _ports().with_proxy_ports(range(22000, 22009))
    with pytest.raises(ValueError, match="distinct"):
        _ports().with_proxy_ports([21000, *range(22001, 22010)])


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


# --- the artemis group ----------------------------------------------------------------------------

CREATED_BROKER_XML = """<configuration xmlns="urn:activemq">
   <core xmlns="urn:activemq:core">
      <name>template</name>
      <persistence-enabled>true</persistence-enabled>
      <acceptors>
         <acceptor name="artemis">tcp://127.0.0.1:61616?tcpSendBufferSize=1048576;protocols=CORE,AMQP,STOMP,HORNETQ,MQTT,OPENWIRE;useEpoll=true</acceptor>
      </acceptors>
   </core>
</configuration>
"""
"""The lines of Artemis 2.40's `artemis create ... --default-port=61616` broker.xml that the
benchmark changes (the rest is left as written)."""
CREATED_LOG4J2 = (
    "rootLogger.level = INFO\nlogger.activemq.name=org.apache.activemq\nlogger.activemq.level=INFO\n"
)


def _artemis_ports() -> ArtemisPorts:
    return ArtemisPorts.from_numbers(range(22000, 22000 + ArtemisPorts.COUNT))


def test_artemis_ports_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="distinct"):
        dataclasses.replace(_artemis_ports(), routerd_admin=22000)


def test_artemis_ports_rejects_ephemeral_range() -> None:
    with pytest.raises(ValueError, match="below the ephemeral range"):
        dataclasses.replace(_artemis_ports(), routerd_admin=40000)


@pytest.mark.parametrize("plan", [Ports, ArtemisPorts])
def test_port_plans_take_as_many_numbers_as_they_list(plan: type[Ports | ArtemisPorts]) -> None:
    assert sorted(plan.from_numbers(range(23000, 23000 + plan.COUNT)).all()) == list(
        range(23000, 23000 + plan.COUNT)
    )
    with pytest.raises(
        ValueError, match=f"a {plan.__name__} plan takes {plan.COUNT} ports, got {plan.COUNT - 1}"
    ):
        plan.from_numbers(range(23000, 23000 + plan.COUNT - 1))


def test_artemis_router_xml_is_a_pure_router_over_both_targets() -> None:
    xml = artemis_router_xml(CREATED_BROKER_XML, name="router", port=22002, targets=(22000, 22001))
    assert "<name>router</name>" in xml
    assert (
        "tcp://127.0.0.1:22002?tcpSendBufferSize=1048576;router=bench;protocols=CORE,AMQP,MQTT;useEpoll"
        in xml
    )
    assert "<persistence-enabled>false</persistence-enabled>" in xml
    assert "<security-enabled>false</security-enabled>" in xml
    for line in [
        '<connector name="target-1">tcp://127.0.0.1:22000</connector>',
        '<connector name="target-2">tcp://127.0.0.1:22001</connector>',
        f'<connection-router name="{ARTEMIS_ROUTER}">',
        "<key-type>CLIENT_ID</key-type>",
        '<policy name="CONSISTENT_HASH"/>',
        "<username>admin</username>",
    ]:
        assert line in xml
    assert "local-target" not in xml
    assert "<cache>" not in xml


def test_artemis_router_and_routerd_share_connectors_and_router() -> None:
    """Scenario: the same connectors and connection router text in Artemis's file and routerd's."""
    ports = _artemis_ports()
    artemis = artemis_router_xml(
        CREATED_BROKER_XML, name="r", port=ports.artemis_router, targets=ports.targets
    )
    routerd = routerd_artemis_config(ports)
    shared = routerd[routerd.index("<connectors>") : routerd.index("</connection-routers>")]
    assert shared in artemis


def test_artemis_target_xml_keeps_every_protocol_and_the_login() -> None:
    xml = artemis_target_xml(CREATED_BROKER_XML, name="target-1", port=22000)
    assert "tcp://127.0.0.1:22000?" in xml
    assert "protocols=CORE,AMQP,STOMP,HORNETQ,MQTT,OPENWIRE" in xml
    assert "router=" not in xml
    assert "<persistence-enabled>true</persistence-enabled>" in xml


def test_artemis_router_xml_rejects_an_unexpected_file() -> None:
    with pytest.raises(ValueError, match="expected '<name>template</name>' once"):
        artemis_router_xml("<configuration/>", name="r", port=22002, targets=(22000, 22001))


def test_artemis_log4j2_follows_routerd_level_and_quiets_client_failures() -> None:
    text = artemis_log4j2(CREATED_LOG4J2, level="WARNING")
    assert "rootLogger.level = WARN\n" in text
    assert "logger.activemq.level=WARN\n" in text
    assert text.endswith(
        "logger.bench_client.name=org.apache.activemq.artemis.core.client\nlogger.bench_client.level=ERROR\n"
    )
    assert "level = INFO" not in artemis_log4j2(CREATED_LOG4J2, level="DEBUG")
    with pytest.raises(ValueError, match="level"):
        artemis_log4j2(CREATED_LOG4J2, level="TRACE")


def test_routerd_artemis_config_redirects_three_protocols_by_client_id() -> None:
    config = load_config_text(routerd_artemis_config(_artemis_ports()), "artemis.xml")
    (router,) = config.routers
    assert (router.name, router.key_type) == (ARTEMIS_ROUTER, KeyType.CLIENT_ID)
    assert router.policy is not None
    assert router.policy.name == "CONSISTENT_HASH"
    assert router.pool is not None
    assert router.pool.static_connectors == ("target-1", "target-2")
    assert (router.cache, router.local_connector) == (None, None)
    (acceptor,) = config.acceptors
    assert (acceptor.port, acceptor.mode, acceptor.protocols) == (
        22003,
        AcceptorMode.REDIRECT,
        ("CORE", "AMQP", "MQTT"),
    )


class TestHaproxyMqttPoolConfig:
    """`haproxy_mqtt_pool_config`: the storm benchmark's HAProxy in front of several brokers."""

    SERVERS = (("broker-1", 21010), ("broker-2", 21011), ("broker-3", 21012))

    def test_haproxy_mqtt_pool_config_sets_each_lever_given(self) -> None:
        limits = HaproxyLimits(
            server_maxconn=3000, server_maxqueue=5000, queue_timeout_ms=5000, rate_limit_sessions=1000
        )
        text = haproxy_mqtt_pool_config(21020, self.SERVERS, maxconn=9000, limits=limits)
        for line in [
            "    bind 127.0.0.1:21020",
            "    rate-limit sessions 1000",
            "    timeout queue 5000ms",
            "    balance hash req.payload(0,0),mqtt_field_value(connect,client_identifier)",
            "    hash-type consistent",
            "    option redispatch",
        ]:
            assert line in text
        assert text.count("maxconn 3000 maxqueue 5000") == 3
        assert "server broker-3 127.0.0.1:21012 check inter 1000 observe layer4" in text

    def test_haproxy_mqtt_pool_config_leaves_out_the_levers_not_given(self) -> None:
        text = haproxy_mqtt_pool_config(21020, self.SERVERS, maxconn=9000, limits=HaproxyLimits())
        for absent in ("rate-limit", "timeout queue", "maxqueue", "mark-down maxconn"):
            assert absent not in text

    @pytest.mark.integration
    def test_haproxy_mqtt_pool_config_passes_haproxy_check(self, tmp_path: Path) -> None:
        haproxy = find_tool("haproxy")
        if haproxy is None:
            pytest.fail("haproxy is not installed: run ./run-tests, which installs it")
        limits = HaproxyLimits(
            server_maxconn=3000, server_maxqueue=5000, queue_timeout_ms=5000, rate_limit_sessions=1000
        )
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(haproxy_mqtt_pool_config(21020, self.SERVERS, maxconn=9000, limits=limits))
        result = subprocess.run(
            [haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
