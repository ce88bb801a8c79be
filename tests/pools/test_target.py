"""Tests for pools/target.py: connector URLs, node ids and targets (SPEC A4)."""

from __future__ import annotations

import re

import pytest

from pools.target import LOCAL_NODE_ID, Connector, CountSource, Target, parse_url_params


class TestParseUrlParams:
    def test_parse_url_params_semicolon_and_ampersand(self):
        assert parse_url_params("nodeId=x;a=b&c=d") == {"nodeId": "x", "a": "b", "c": "d"}

    def test_parse_url_params_empty(self):
        assert parse_url_params("") == {}

    def test_parse_url_params_skips_empty_parts(self):
        assert parse_url_params(";a=1;;b=2&") == {"a": "1", "b": "2"}

    def test_parse_url_params_later_duplicate_wins(self):
        assert parse_url_params("a=1;a=2") == {"a": "2"}

    def test_parse_url_params_empty_value_allowed(self):
        assert parse_url_params("a=") == {"a": ""}

    def test_parse_url_params_value_keeps_further_equals(self):
        assert parse_url_params("filter=a=b") == {"filter": "a=b"}

    def test_parse_url_params_percent_decoding(self):
        assert parse_url_params("nodeId=node%201;x%3By=1") == {"nodeId": "node 1", "x;y": "1"}

    def test_parse_url_params_without_equals_raises(self):
        with pytest.raises(ValueError, match="'sslEnabled' has no '=value'"):
            parse_url_params("port=1;sslEnabled")


class TestConnectorFromUrl:
    def test_connector_from_url_with_params(self):
        c = Connector.from_url("artemis-1", "tcp://broker1.example.com:61616?nodeId=x;a=b&c=d")
        assert c.name == "artemis-1"
        assert c.host == "broker1.example.com"
        assert c.port == 61616
        assert c.params == (("nodeId", "x"), ("a", "b"), ("c", "d"))
        assert c.param_map == {"nodeId": "x", "a": "b", "c": "d"}
        assert c.node_id == "x"
        assert c.url == "tcp://broker1.example.com:61616"

    def test_connector_from_url_ipv6(self):
        c = Connector.from_url("v6", "tcp://[::1]:61616")
        assert c.host == "::1"
        assert c.port == 61616
        assert c.url == "tcp://[::1]:61616"

    def test_connector_from_url_ipv6_full_address_with_params(self):
        c = Connector.from_url("v6", "tcp://[2001:db8::7]:5672?nodeId=n7")
        assert c.host == "2001:db8::7"
        assert c.port == 5672
        assert c.node_id == "n7"
        assert c.url == "tcp://[2001:db8::7]:5672"

    def test_connector_from_url_node_id_defaults_to_name(self):
        c = Connector.from_url("artemis-2", "tcp://10.0.0.2:61617?sslEnabled=false")
        assert c.node_id == "artemis-2"

    def test_connector_from_url_strips_whitespace(self):
        """Scenario: broker.xml text content often carries surrounding whitespace and newlines."""
        c = Connector.from_url("c", "\n   tcp://10.0.0.2:61617\n  ")
        assert (c.host, c.port) == ("10.0.0.2", 61617)

    @pytest.mark.parametrize(
        "url",
        [
            "",
            "10.0.0.1:61616",  # no scheme
            "tcp://10.0.0.1",  # no port
            "tcp://:61616",  # no host
            "tcp://10.0.0.1:notaport",
            "tcp://10.0.0.1:70000",
            "tcp://10.0.0.1:0",
            "tcp:///path",
            "tcp://10.0.0.1:61616?sslEnabled",  # parameter without a value
        ],
    )
    def test_connector_from_url_bad_url_raises(self, url):
        with pytest.raises(ValueError, match=r"connector|url parameter"):
            Connector.from_url("bad", url)


class TestConnector:
    @pytest.mark.parametrize("port", [0, -1, 65536])
    def test_connector_rejects_bad_port(self, port):
        with pytest.raises(ValueError, match="port must be 1-65535"):
            Connector(name="c", host="h", port=port)

    def test_connector_accepts_port_bounds(self):
        assert Connector(name="c", host="h", port=1).port == 1
        assert Connector(name="c", host="h", port=65535).port == 65535

    def test_connector_rejects_empty_name(self):
        with pytest.raises(ValueError, match="connector name must not be empty"):
            Connector(name="", host="h", port=1)

    def test_connector_rejects_empty_host(self):
        with pytest.raises(ValueError, match="host must not be empty"):
            Connector(name="c", host="", port=1)

    def test_connector_is_frozen_and_hashable(self):
        a = Connector(name="c", host="h", port=1, params=(("nodeId", "n"),))
        b = Connector(name="c", host="h", port=1, params=(("nodeId", "n"),))
        assert a == b
        assert hash(a) == hash(b)
        with pytest.raises(AttributeError):
            a.port = 2  # type: ignore[misc]  # the assignment itself is what is tested


class TestTarget:
    def test_target_remote_uses_connector_node_id(self):
        connector = Connector.from_url("artemis-1", "tcp://10.0.0.1:61616?nodeId=broker1")
        t = Target.remote(connector)
        assert t.node_id == "broker1"
        assert t.connector is connector
        assert t.local is False

    def test_target_remote_node_id_defaults_to_connector_name(self):
        t = Target.remote(Connector.from_url("artemis-1", "tcp://10.0.0.1:61616"))
        assert t.node_id == "artemis-1"

    def test_target_local_without_connector(self):
        t = Target.local_target(None)
        assert t.node_id == LOCAL_NODE_ID == "local"
        assert t.connector is None
        assert t.local is True

    def test_target_local_with_connector(self):
        connector = Connector.from_url("here", "tcp://127.0.0.1:61616?nodeId=broker-local")
        t = Target.local_target(connector)
        assert t.node_id == "broker-local"
        assert t.connector is connector
        assert t.local is True

    def test_target_rejects_empty_node_id(self):
        with pytest.raises(ValueError, match="node id must not be empty"):
            Target(node_id="", connector=Connector(name="c", host="h", port=1))

    def test_target_remote_needs_connector(self):
        with pytest.raises(ValueError, match="needs a connector"):
            Target(node_id="n", connector=None)

    def test_target_weight_defaults_to_one(self):
        assert Target(node_id="n", connector=Connector(name="c", host="h", port=1)).weight == 1
        assert Target.remote(Connector.from_url("c", "tcp://h:1")).weight == 1
        assert Target.local_target(None).weight == 1

    def test_target_remote_and_local_take_the_connector_weight(self):
        connector = Connector.from_url("c", "tcp://h:1?nodeId=n;weight=25")
        assert connector.weight == 25
        assert Target.remote(connector).weight == 25
        assert Target.local_target(connector).weight == 25

    def test_target_ha_pair_members_share_the_weight(self):
        connector = Connector.from_url("c", "(tcp://a:1,tcp://b:1)?weight=3")
        assert [m.weight for m in connector.members] == [3, 3]
        assert Target.remote(connector).weight == 3

    @pytest.mark.parametrize("weight", [0, -1, 1_000_001, True, 1.5])
    def test_target_rejects_bad_weight(self, weight):
        with pytest.raises(ValueError, match=f"weight must be an integer 1-1000000, got {weight!r}"):
            Target(node_id="n", connector=Connector(name="c", host="h", port=1), weight=weight)

    @pytest.mark.parametrize("weight", ["1", "1000000", "0001000"])
    def test_connector_weight_parameter_accepted(self, weight):
        assert Connector.from_url("c", f"tcp://h:1?weight={weight}").weight == int(weight)

    @pytest.mark.parametrize("weight", ["0", "", "x", "-1", "1.5", "1000001", "00000001", "\u0661", " 1"])
    def test_connector_weight_parameter_rejected(self, weight):
        message = f"weight must be an integer 1-1000000, got {weight!r}"
        with pytest.raises(ValueError, match=re.escape(message)):
            Connector.from_url("c", f"tcp://h:1?weight={weight}")

    def test_target_empty_node_id_param_rejected(self):
        """Scenario: `nodeId=` gives an empty node id, which no target may have."""
        with pytest.raises(ValueError, match="node id must not be empty"):
            Target.remote(Connector.from_url("c", "tcp://h:1?nodeId="))


class TestHaPairConnector:
    def test_pair_url_primary_backup_and_shared_params(self):
        c = Connector.from_url("pair", "(tcp://127.0.0.1:61616,tcp://[::1]:61617)?nodeId=n1;probe=stomp")
        assert (c.host, c.port) == ("127.0.0.1", 61616)
        assert c.backups == (("::1", 61617),)
        assert c.node_id == "n1"
        assert c.probe == "stomp"
        assert c.url == "tcp://127.0.0.1:61616"
        assert c.display_url == "(tcp://127.0.0.1:61616,tcp://[::1]:61617)"

    def test_pair_members_are_single_address_connectors_with_the_same_params(self):
        c = Connector.from_url("pair", "(tcp://a:1,tcp://b:2,tcp://c:3)?nodeId=n1")
        members = c.members
        assert [(m.host, m.port, m.backups) for m in members] == [("a", 1, ()), ("b", 2, ()), ("c", 3, ())]
        assert {m.node_id for m in members} == {"n1"}
        assert {m.name for m in members} == {"pair"}

    def test_plain_connector_is_its_only_member(self):
        c = Connector.from_url("c", "tcp://a:1")
        assert c.members == (c,)
        assert c.display_url == c.url

    def test_pair_of_one_is_a_plain_connector(self):
        assert Connector.from_url("c", "(tcp://a:1)").members == (Connector(name="c", host="a", port=1),)

    @pytest.mark.parametrize(
        ("url", "reason"),
        [
            ("(tcp://a:1,tcp://b:2", "has no closing"),
            ("(tcp://a:1?x=1,tcp://b:2)", "after the '\\)', not on one member"),
            ("(tcp://a:1,udp://b:2)", "every member must be tcp"),
            ("(tcp://a:1,tcp://b)", "must name host and port"),
            ("(tcp://a:1,tcp://b:0)", "port must be 1-65535, got 0"),
            ("(tcp://a:1)nodeId=x", "expected '\\?parameters' after"),
            ("(tcp://a:1,)", "every member must be tcp"),
        ],
    )
    def test_bad_pair_urls_are_value_errors_naming_the_rule(self, url, reason):
        with pytest.raises(ValueError, match=reason):
            Connector.from_url("c", url)


class TestProbeParameters:
    @pytest.mark.parametrize("kind", ["tcp", "mqtt", "stomp", "amqp", "openwire", "core"])
    def test_probe_kinds_accepted(self, kind):
        assert Connector.from_url("c", f"tcp://h:1?probe={kind}").probe == kind

    def test_unknown_probe_kind(self):
        with pytest.raises(
            ValueError, match="probe must be one of tcp, mqtt, stomp, amqp, openwire, core, got 'hornetq'"
        ):
            Connector.from_url("c", "tcp://h:1?probe=hornetq")

    @pytest.mark.parametrize(("value", "expected"), [("true", True), ("TRUE", True), ("false", False)])
    def test_probe_connection_count_flag(self, value, expected):
        c = Connector.from_url("c", f"tcp://h:1?probe=mqtt;probeConnectionCount={value}")
        assert c.probe_connection_count is expected

    def test_probe_connection_count_default_off(self):
        assert Connector.from_url("c", "tcp://h:1?probe=mqtt").probe_connection_count is False

    def test_probe_connection_count_bad_value(self):
        with pytest.raises(ValueError, match="probeConnectionCount must be true or false, got 'yes'"):
            Connector.from_url("c", "tcp://h:1?probe=mqtt;probeConnectionCount=yes")

    def test_probe_connection_count_needs_the_mqtt_probe(self):
        with pytest.raises(ValueError, match="probeConnectionCount=true needs probe=mqtt, got probe='tcp'"):
            Connector.from_url("c", "tcp://h:1?probeConnectionCount=true")


class TestConnectionCountParameters:
    """`connectionCount=` and its options: where LEAST_CONNECTIONS reads the broker's own count."""

    def test_connection_count_none_by_default(self):
        assert Connector.from_url("c", "tcp://h:1?probe=mqtt").connection_count is None

    def test_probe_connection_count_true_is_mqtt_sys(self):
        c = Connector.from_url("c", "tcp://h:1?probe=mqtt;probeConnectionCount=true")
        assert c.connection_count == CountSource(kind="mqtt-sys")
        same = Connector.from_url("c", "tcp://h:1?probe=mqtt;connectionCount=mqtt-sys")
        assert same.connection_count == CountSource(kind="mqtt-sys")
        assert same.probe_connection_count is True

    @pytest.mark.parametrize(
        ("kind", "url"),
        [
            ("artemis-jolokia", "http://h:8161/console/jolokia"),
            ("activemq-jolokia", "http://h:8161/api/jolokia"),
            ("rabbitmq-prometheus", "http://h:15692/metrics"),
        ],
    )
    def test_http_sources_default_to_the_brokers_host(self, kind, url):
        source = Connector.from_url("c", f"tcp://h:1?connectionCount={kind}").connection_count
        assert source == CountSource(kind=kind, url=url)

    def test_ipv6_host_in_brackets(self):
        source = Connector.from_url("c", "tcp://[::1]:1?connectionCount=rabbitmq-prometheus").connection_count
        assert source is not None
        assert source.url == "http://[::1]:15692/metrics"
        assert source.endpoint == ("::1", 15692, "/metrics")

    def test_options_of_a_jolokia_source(self):
        url = (
            "tcp://h:1?connectionCount=activemq-jolokia;connectionCountUrl=http://jmx:8000/api/jolokia;"
            "connectionCountBroker=localhost;connectionCountUser=ops;connectionCountPassword=s3cret;"
            "connectionCountOrigin=http://console:8000"
        )
        source = Connector.from_url("c", url).connection_count
        assert source == CountSource(
            kind="activemq-jolokia",
            url="http://jmx:8000/api/jolokia",
            broker="localhost",
            user="ops",
            password="s3cret",
            origin="http://console:8000",
        )
        assert "s3cret" not in repr(source)

    def test_ha_pair_members_read_at_their_own_hosts(self):
        pair = Connector.from_url("p", "(tcp://a:1,tcp://b:2)?connectionCount=artemis-jolokia")
        urls = [m.connection_count.url for m in pair.members if m.connection_count is not None]
        assert urls == ["http://a:8161/console/jolokia", "http://b:8161/console/jolokia"]

    def test_ha_pair_one_url_per_member(self):
        pair = Connector.from_url(
            "p",
            "(tcp://a:1,tcp://b:2)?connectionCount=rabbitmq-prometheus;"
            "connectionCountUrl=http://a:9/metrics, http://b:9/metrics",
        )
        urls = [m.connection_count.url for m in pair.members if m.connection_count is not None]
        assert urls == ["http://a:9/metrics", "http://b:9/metrics"]

    @pytest.mark.parametrize(
        ("params", "reason"),
        [
            (
                "connectionCount=jmx",
                "connectionCount must be one of mqtt-sys, artemis-jolokia, activemq-jolokia, "
                "rabbitmq-prometheus, got 'jmx'",
            ),
            ("connectionCount=Artemis-Jolokia", "got 'Artemis-Jolokia'"),
            (
                "connectionCountURL=http://h/",
                "unknown connector parameter 'connectionCountURL' (known: connectionCount, ",
            ),
            ("connectionCount=mqtt-sys", "connectionCount=mqtt-sys needs probe=mqtt, got probe='tcp'"),
            (
                "probe=mqtt;probeConnectionCount=true;connectionCount=rabbitmq-prometheus",
                "probeConnectionCount=true means connectionCount=mqtt-sys, "
                "got connectionCount='rabbitmq-prometheus' too",
            ),
            (
                "probe=mqtt;probeConnectionCount=false;connectionCount=mqtt-sys",
                "contradicts connectionCount='mqtt-sys'",
            ),
            ("connectionCountUrl=http://h/", "connectionCountUrl needs connectionCount=artemis-jolokia or "),
            ("connectionCountUrl=http://h/", "got no connectionCount"),
            (
                "connectionCount=rabbitmq-prometheus;connectionCountBroker=b",
                "connectionCountBroker needs connectionCount=artemis-jolokia or activemq-jolokia, "
                "got connectionCount='rabbitmq-prometheus'",
            ),
            (
                "connectionCount=rabbitmq-prometheus;connectionCountOrigin=http://h",
                "connectionCountOrigin needs",
            ),
            ("probe=mqtt;connectionCount=mqtt-sys;connectionCountUser=u", "connectionCountUser needs"),
            (
                "connectionCount=artemis-jolokia;connectionCountPassword=p",
                "connectionCountPassword needs connectionCountUser",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountUrl=https://h/",
                "must look like http://host:port/path, got 'https://h/'",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountUrl=http://u:p@h/",
                "must look like http://host:port/path",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountUrl=h:8161",
                "must look like http://host:port/path",
            ),
            ("connectionCount=artemis-jolokia;connectionCountUrl=http://h:99999/", "invalid port"),
            (
                "connectionCount=artemis-jolokia;connectionCountUrl=http://a/,http://b/",
                "a single broker has one (1), got 2",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountBroker=b*",
                "connectionCountBroker must be a broker name",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountBroker=",
                "connectionCountBroker must be a broker name",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountOrigin=localhost",
                "must look like http://host[:port]",
            ),
            (
                "connectionCount=artemis-jolokia;connectionCountOrigin=http://h/x",
                "must look like http://host[:port]",
            ),
        ],
    )
    def test_bad_connection_count_options_name_the_option_and_value(self, params, reason):
        with pytest.raises(ValueError, match=re.escape(reason)):
            Connector.from_url("c", f"tcp://h:1?{params}")

    def test_ha_pair_with_one_url_for_two_members(self):
        with pytest.raises(ValueError, match=re.escape("an HA pair names one per member (2), got 1")):
            Connector.from_url(
                "p", "(tcp://a:1,tcp://b:2)?connectionCount=artemis-jolokia;connectionCountUrl=http://a/"
            )

    def test_count_source_checks_itself(self):
        with pytest.raises(ValueError, match="connectionCount=mqtt-sys takes no URL"):
            CountSource(kind="mqtt-sys", url="http://h/")
        with pytest.raises(ValueError, match="connectionCount=artemis-jolokia needs a URL"):
            CountSource(kind="artemis-jolokia")
