"""Tests for router/config/settings.py: the configuration dataclasses (SPEC A7, A8)."""

from __future__ import annotations

import re

import pytest

from cache.cache import CacheConfig
from keys.filter import compile_filter
from keys.resolve import KeyType
from policies.policy import PolicyConfig
from pools.pool import PoolConfig, PoolKind
from pools.target import Connector
from router.config.settings import (
    DEFAULT_MAX_SNIFF_BYTES,
    AcceptorConfig,
    AcceptorMode,
    ClusterConnectionConfig,
    Config,
    ConnectionTtlConfig,
    DiscoveryGroupConfig,
    EventLogConfig,
    RouterConfig,
    ZooKeeperConfig,
)


class TestRouterConfig:
    def test_router_config_defaults(self):
        config = RouterConfig(name="r1")
        assert config.key_type is KeyType.SOURCE_IP
        assert config.key_filter is None
        assert config.local_target_filter is None
        assert config.local_connector is None
        assert config.cache is None
        assert config.policy is None
        assert config.pool is None

    def test_router_config_full(self):
        pool = PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",))
        config = RouterConfig(
            name="r1",
            key_type=KeyType.CLIENT_ID,
            key_filter="^.{3}",
            local_target_filter="NULL|0",
            local_connector="here",
            cache=CacheConfig(timeout_ms=60000),
            policy=PolicyConfig(name="CONSISTENT_HASH"),
            pool=pool,
        )
        assert config.pool is pool
        assert config.cache == CacheConfig(timeout_ms=60000)

    def test_router_config_empty_name_raises(self):
        with pytest.raises(ValueError, match="connection-router name must not be empty"):
            RouterConfig(name="")

    def test_router_config_invalid_key_filter_raises(self):
        with pytest.raises(ValueError, match=r"^key-filter '\(' is not a valid"):
            RouterConfig(name="r1", key_filter="(")

    def test_router_config_invalid_local_target_filter_raises(self):
        with pytest.raises(ValueError, match=r"^local-target-filter '\[' is not a valid"):
            RouterConfig(name="r1", local_target_filter="[")

    def test_router_config_blank_filters_allowed(self):
        config = RouterConfig(name="r1", key_filter="", local_target_filter="  ")
        assert compile_filter(config.key_filter, "key-filter") is None
        assert compile_filter(config.local_target_filter, "local-target-filter") is None

    def test_router_config_is_frozen(self):
        config = RouterConfig(name="r1")
        with pytest.raises(AttributeError):
            config.name = "r2"  # type: ignore[misc]  # the assignment itself is what is tested


class TestAcceptorConfig:
    def test_acceptor_config_defaults(self):
        acceptor = AcceptorConfig(name="mqtt", host="0.0.0.0", port=1883, router="r1")
        assert acceptor.mode is AcceptorMode.PROXY
        assert acceptor.protocols == ()
        assert acceptor.params == ()

    @pytest.mark.parametrize("port", [0, 1, 65535])
    def test_acceptor_config_accepts_ports(self, port):
        assert AcceptorConfig(name="a", host="::", port=port, router="r1").port == port

    @pytest.mark.parametrize("port", [-1, 65536])
    def test_acceptor_config_rejects_bad_port(self, port):
        with pytest.raises(ValueError, match=f"acceptor port must be 0-65535, got {port}"):
            AcceptorConfig(name="a", host="::", port=port, router="r1")

    def test_acceptor_config_sniff_cap_default_is_the_one_constant(self):
        acceptor = AcceptorConfig(name="a", host="h", port=1, router="r")
        assert acceptor.sniff_max_bytes == DEFAULT_MAX_SNIFF_BYTES == 16 * 1024
        assert acceptor.fast_path is True

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"handshake_timeout_ms": -1}, "handshake-timeout must be >= 0, got -1"),
            ({"sniff_max_bytes": 63}, "sniffMaxBytes must be 64-1048576, got 63"),
            ({"sniff_max_bytes": 1024 * 1024 + 1}, "sniffMaxBytes must be 64-1048576, got 1048577"),
            ({"send_proxy_protocol": "v3"}, "sendProxyProtocol must be v1 or v2, got 'v3'"),
        ],
    )
    def test_acceptor_config_rejects_bad_values(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            AcceptorConfig(name="a", host="h", port=1, router="r", **kwargs)

    def test_acceptor_mode_values(self):
        assert {m.value for m in AcceptorMode} == {"proxy", "redirect", "auto"}
        assert AcceptorMode("redirect") is AcceptorMode.REDIRECT


class TestConfig:
    A1 = Connector.from_url("artemis-1", "tcp://10.0.0.1:61616?nodeId=broker1")
    A2 = Connector.from_url("artemis-2", "tcp://10.0.0.2:61616")
    R1 = RouterConfig(name="r1")
    R2 = RouterConfig(name="r2", key_type=KeyType.CLIENT_ID)
    CC = ClusterConnectionConfig(name="cluster", static_connectors=("artemis-2", "artemis-1"))

    def config(self) -> Config:
        return Config(
            source="broker.xml",
            connectors=(self.A1, self.A2),
            acceptors=(AcceptorConfig(name="amqp", host="0.0.0.0", port=5672, router="r2"),),
            routers=(self.R1, self.R2),
            discovery_groups=(DiscoveryGroupConfig(name="dg"),),
            cluster_connections=(self.CC,),
        )

    def test_config_connector_by_name(self):
        assert self.config().connector("artemis-2") is self.A2

    def test_config_router_by_name(self):
        assert self.config().router("r2") is self.R2

    def test_config_cluster_connection_by_name(self):
        assert self.config().cluster_connection("cluster") is self.CC
        assert self.CC.static_connectors == ("artemis-2", "artemis-1")

    @pytest.mark.parametrize("lookup", ["connector", "router", "cluster_connection"])
    def test_config_unknown_name_raises_key_error(self, lookup):
        with pytest.raises(KeyError, match="missing"):
            getattr(self.config(), lookup)("missing")

    def test_config_empty(self):
        config = Config(source="empty.xml")
        assert (config.connectors, config.acceptors, config.routers) == ((), (), ())
        with pytest.raises(KeyError):
            config.router("r1")

    def test_discovery_group_config_default_refresh_timeout(self):
        assert DiscoveryGroupConfig(name="dg").refresh_timeout_ms == 10000

    def test_discovery_group_config_rejects_a_negative_refresh_timeout(self):
        with pytest.raises(ValueError, match=re.escape("refresh-timeout must be >= 0, got -1")):
            DiscoveryGroupConfig(name="dg", refresh_timeout_ms=-1)

    def test_cluster_connection_config_defaults(self):
        cc = ClusterConnectionConfig(name="c")
        assert (cc.connector_ref, cc.static_connectors, cc.discovery_group) == (None, (), None)


class TestConnectionTtlConfig:
    def test_defaults_are_artemis_defaults(self):
        assert ConnectionTtlConfig() == ConnectionTtlConfig(override_ms=-1, check_interval_ms=2000)
        assert Config(source="t").connection_ttl == ConnectionTtlConfig()
        assert AcceptorConfig(name="a", host="h", port=1, router="r").connection_ttl_ms == -1

    def test_ttl_ms_is_the_override_else_the_acceptors_own(self):
        with_ttl = AcceptorConfig(name="a", host="h", port=1, router="r", connection_ttl_ms=1500)
        without = AcceptorConfig(name="b", host="h", port=2, router="r")
        assert ConnectionTtlConfig().ttl_ms(with_ttl) == 1500
        assert ConnectionTtlConfig().ttl_ms(without) == -1
        assert ConnectionTtlConfig(override_ms=30000).ttl_ms(with_ttl) == 30000
        assert ConnectionTtlConfig(override_ms=30000).ttl_ms(without) == 30000

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"override_ms": 0}, "connection-ttl-override must be -1 (off) or > 0, got 0"),
            ({"override_ms": -2}, "connection-ttl-override must be -1 (off) or > 0, got -2"),
            ({"check_interval_ms": 0}, "connection-ttl-check-interval must be > 0, got 0"),
        ],
    )
    def test_rejects_bad_values(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            ConnectionTtlConfig(**kwargs)

    @pytest.mark.parametrize("ttl", [0, -2])
    def test_acceptor_rejects_a_bad_connection_ttl(self, ttl):
        with pytest.raises(ValueError, match=re.escape(f"connectionTtl must be -1 (off) or > 0, got {ttl}")):
            AcceptorConfig(name="a", host="h", port=1, router="r", connection_ttl_ms=ttl)


class TestZooKeeperConfig:
    def test_zookeeper_config_defaults(self):
        config = ZooKeeperConfig(connect="127.0.0.1:2181", path="/fleet")
        assert config.session_timeout_ms == 10_000

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"connect": "nohost"}, "connect string must be host:port[,host:port…], got 'nohost'"),
            ({"path": "/a//b"}, "path must not have empty, '.' or '..' segments"),
            ({"path": "/zookeeper/quota"}, "path must not be inside /zookeeper"),
            ({"session_timeout_ms": 0}, "session-timeout must be > 0, got 0"),
            (
                {"session_timeout_ms": 2**31},
                "session-timeout must be at most 2147483647 (ZooKeeper's int), got 2147483648",
            ),
        ],
    )
    def test_zookeeper_config_rejects(self, kwargs, message):
        fields = {"connect": "h:2181", "path": "/fleet", **kwargs}
        with pytest.raises(ValueError, match=re.escape(message)):
            ZooKeeperConfig(**fields)

    def test_config_pool_discovery_group(self):
        zk = DiscoveryGroupConfig(name="zk", zookeeper=ZooKeeperConfig(connect="h:1", path="/p"))
        plain = DiscoveryGroupConfig(name="plain")
        routers = (
            RouterConfig(name="g", pool=PoolConfig(kind=PoolKind.DISCOVERY, discovery_group="zk")),
            RouterConfig(name="c", pool=PoolConfig(kind=PoolKind.CLUSTER, cluster_connection="cc")),
            RouterConfig(name="p", pool=PoolConfig(kind=PoolKind.DISCOVERY, discovery_group="plain")),
            RouterConfig(name="none"),
        )
        config = Config(
            source="t.xml",
            routers=routers,
            discovery_groups=(zk, plain),
            cluster_connections=(ClusterConnectionConfig(name="cc", discovery_group="zk"),),
        )
        assert [config.pool_discovery_group(r) for r in routers] == [zk, zk, plain, None]
        assert config.discovery_group("plain") is plain
        with pytest.raises(KeyError):
            config.discovery_group("nope")


def test_event_log_config_checks_its_values():
    assert EventLogConfig(directory="/x").ring_size == 65_536
    with pytest.raises(ValueError, match="ring-size must be > 0, got 0"):
        EventLogConfig(directory="/x", ring_size=0)
    with pytest.raises(ValueError, match="directory"):
        EventLogConfig(directory=" ")
    with pytest.raises(ValueError, match="router-id"):
        EventLogConfig(directory="/x", router_id="")
