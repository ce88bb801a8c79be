"""The requests and answers of broker-reported connection counts (router/features/probes/counts.py).

The answers are real: captured on 2026-11-29 with curl from Apache ActiveMQ Artemis 2.40.0 (its
web console's Jolokia 2, `artemis create … --http-host 127.0.0.1`), Debian's ActiveMQ 5.17.2 with
Debian's Jolokia 1.7.1 servlet (the test fixture's setup, tests/conftest.py) and Debian's RabbitMQ
3.10.8 with rabbitmq_prometheus (an excerpt of its 83 KB /metrics page).
"""

from __future__ import annotations

import base64
import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools import Connector, CountSource
from router.features.probes.counts import (
    CountError,
    count_request,
    jolokia_read_target,
    parse_count,
    parse_jolokia_count,
    parse_prometheus_gauge,
)

ARTEMIS_EXACT = (
    b'{"request":{"mbean":"org.apache.activemq.artemis:broker=\\"b1\\"","attribute":"ConnectionCount",'
    b'"type":"read"},"value":3,"status":200}'
)
ARTEMIS_PATTERN = (
    b'{"request":{"mbean":"org.apache.activemq.artemis:broker=*","attribute":"ConnectionCount",'
    b'"type":"read"},"value":{"org.apache.activemq.artemis:broker=\\"b1\\"":{"ConnectionCount":3}},'
    b'"status":200}'
)
ARTEMIS_ORIGIN_REFUSED = (
    b'{"error_type":"java.lang.Exception","error":"java.lang.Exception : Origin http://localhost is not '
    b'allowed to call this agent","status":403}'
)  # an HTTP 200 answer: Jolokia puts its own status in the body
ARTEMIS_NO_SUCH_BROKER = (
    b'{"request":{"mbean":"org.apache.activemq.artemis:broker=\\"nope\\"","attribute":"ConnectionCount",'
    b'"type":"read"},"error_type":"javax.management.InstanceNotFoundException","error":'
    b'"javax.management.InstanceNotFoundException : org.apache.activemq.artemis:broker=\\"nope\\"",'
    b'"status":404}'
)
ACTIVEMQ_PATTERN = (
    b'{"request":{"mbean":"org.apache.activemq:brokerName=*,type=Broker","attribute":"CurrentConnectionsCount",'
    b'"type":"read"},"value":{"org.apache.activemq:brokerName=c1,type=Broker":{"CurrentConnectionsCount":4}},'
    b'"timestamp":1795925298,"status":200}'
)
RABBITMQ_METRICS = b"""# TYPE erlang_mnesia_tablewise_memory_usage_bytes gauge
erlang_mnesia_tablewise_memory_usage_bytes{table="schema"} 29608
# TYPE rabbitmq_connections_opened_total counter
# HELP rabbitmq_connections_opened_total Total number of connections opened
rabbitmq_connections_opened_total 5
# TYPE rabbitmq_connections_closed_total counter
# HELP rabbitmq_connections_closed_total Total number of connections closed or terminated
rabbitmq_connections_closed_total 2
# TYPE rabbitmq_connections gauge
# HELP rabbitmq_connections Connections currently open
rabbitmq_connections 3
# TYPE rabbitmq_channels gauge
# HELP rabbitmq_channels Channels currently open
rabbitmq_channels 0
"""


def _source(url: str) -> CountSource:
    source = Connector.from_url("c", url).connection_count
    assert source is not None
    return source


ARTEMIS = _source(
    "tcp://127.0.0.1:61616?connectionCount=artemis-jolokia;connectionCountUrl=http://127.0.0.1:8161/console/jolokia"
)
ACTIVEMQ = _source("tcp://10.0.0.1:61616?connectionCount=activemq-jolokia")
RABBITMQ = _source("tcp://[::1]:5672?connectionCount=rabbitmq-prometheus")


class TestCountRequest:
    def test_count_request_artemis_pattern_with_origin_and_pool_credentials(self) -> None:
        request = count_request(ARTEMIS, user="admin", password="admin")
        assert (request.host, request.port) == ("127.0.0.1", 8161)
        assert request.target == "/console/jolokia/read/org.apache.activemq.artemis:broker=*/ConnectionCount"
        headers = dict(request.headers)
        assert headers["Origin"] == "http://127.0.0.1:8161"  # Artemis allows *://<http-host>* only
        assert headers["Authorization"] == "Basic " + base64.b64encode(b"admin:admin").decode()
        assert headers["Host"] == "127.0.0.1:8161"
        assert headers["Connection"] == "close"

    def test_count_request_artemis_named_broker_is_quoted(self) -> None:
        source = _source(
            "tcp://h:1?connectionCount=artemis-jolokia;connectionCountBroker=b 1;connectionCountOrigin=http://localhost"
        )
        request = count_request(source, user=None, password=None)
        assert (
            request.target
            == "/console/jolokia/read/org.apache.activemq.artemis:broker=%22b%201%22/ConnectionCount"
        )
        assert dict(request.headers)["Origin"] == "http://localhost"
        assert "Authorization" not in dict(request.headers)

    def test_count_request_activemq_default_url_and_names(self) -> None:
        request = count_request(ACTIVEMQ, user="u", password=None)
        assert (request.host, request.port) == ("10.0.0.1", 8161)
        assert (
            request.target
            == "/api/jolokia/read/org.apache.activemq:type=Broker,brokerName=*/CurrentConnectionsCount"
        )
        assert dict(request.headers)["Authorization"] == "Basic " + base64.b64encode(b"u:").decode()
        named = _source("tcp://h:1?connectionCount=activemq-jolokia;connectionCountBroker=localhost")
        target = count_request(named, user=None, password=None).target
        assert target.endswith(
            "/read/org.apache.activemq:type=Broker,brokerName=localhost/CurrentConnectionsCount"
        )

    def test_count_request_prometheus_ipv6_host_and_query(self) -> None:
        request = count_request(RABBITMQ, user=None, password=None)
        assert (request.host, request.port, request.target) == ("::1", 15692, "/metrics")
        assert dict(request.headers)["Host"] == "[::1]:15692"
        assert "Origin" not in dict(request.headers)
        assert request.url == "http://[::1]:15692/metrics"
        query = _source("tcp://h:1?connectionCount=rabbitmq-prometheus;connectionCountUrl=http://h:9/m?x=1")
        assert count_request(query, user=None, password=None).target == "/m?x=1"

    def test_count_request_jolokia_keeps_the_url_query_after_the_read_path(self) -> None:
        source = _source(
            "tcp://h:1?connectionCount=artemis-jolokia;connectionCountUrl=http://h:2/j/?includeStackTrace=false"
        )
        target = count_request(source, user=None, password=None).target
        assert (
            target == "/j/read/org.apache.activemq.artemis:broker=*/ConnectionCount?includeStackTrace=false"
        )

    def test_count_request_mqtt_sys_is_not_http(self) -> None:
        with pytest.raises(ValueError, match="not read over HTTP"):
            count_request(CountSource(kind="mqtt-sys"), user=None, password=None)


def test_jolokia_read_target_escapes_slash_and_bang() -> None:
    """Scenario: Jolokia's GET URLs split on `/`: `!/` and `!!` escape them inside a name."""
    target = jolokia_read_target("/api/jolokia/", 'd:name="a/b!c"', "Attr")
    assert target == "/api/jolokia/read/d:name=%22a!/b!!c%22/Attr"


class TestParseJolokia:
    def test_parse_count_artemis_exact_and_pattern(self) -> None:
        assert parse_count(ARTEMIS, 200, ARTEMIS_EXACT) == 3
        assert parse_count(ARTEMIS, 200, ARTEMIS_PATTERN) == 3

    def test_parse_count_activemq_pattern(self) -> None:
        assert parse_count(ACTIVEMQ, 200, ACTIVEMQ_PATTERN) == 4

    def test_parse_count_http_status_names_the_credentials(self) -> None:
        with pytest.raises(
            CountError, match=r"^HTTP status 401 \(check connectionCountUser, or the pool's user\)$"
        ):
            parse_count(ACTIVEMQ, 401, b"")
        with pytest.raises(CountError, match=r"^HTTP status 500$"):
            parse_count(ARTEMIS, 500, b"oops")

    def test_parse_jolokia_error_status_in_the_body(self) -> None:
        with pytest.raises(CountError, match=r"jolokia status 403: .*Origin http://localhost is not allowed"):
            parse_jolokia_count(ARTEMIS_ORIGIN_REFUSED, "ConnectionCount")
        with pytest.raises(
            CountError, match=r"jolokia status 404: javax\.management\.InstanceNotFoundException"
        ):
            parse_jolokia_count(ARTEMIS_NO_SUCH_BROKER, "ConnectionCount")

    def test_parse_jolokia_error_message_is_bounded(self) -> None:
        body = b'{"status":500,"error":"' + b"x" * 10_000 + b'"}'
        with pytest.raises(CountError) as raised:
            parse_jolokia_count(body, "A")
        assert len(str(raised.value)) < 300

    @pytest.mark.parametrize(
        ("body", "match"),
        [
            (b"<html>", "not JSON"),
            (b"\xff\xfe", "not JSON"),
            (b"[1]", "not a JSON object"),
            (b'{"status":200}', "no value"),
            (b'{"status":200,"value":-1}', "ConnectionCount is not a count: '-1'"),
            (b'{"status":200,"value":true}', "is not a count"),
            (b'{"status":200,"value":"3"}', "is not a count"),
            (b'{"status":200,"value":2.5}', "is not a count"),
            (b'{"status":200,"value":{}}', r"0 brokers match, not one \(none\)"),
            (
                b'{"status":200,"value":{"d:broker=\\"a\\"":{"ConnectionCount":1},"d:broker=\\"b\\"":{"ConnectionCount":2}}}',
                r'2 brokers match, not one \(d:broker="a", d:broker="b"\): set connectionCountBroker',
            ),
            (
                b'{"status":200,"value":{"d:broker=\\"a\\"":{"Other":1}}}',
                'no ConnectionCount for d:broker="a"',
            ),
        ],
    )
    def test_parse_jolokia_malformed(self, body: bytes, match: str) -> None:
        with pytest.raises(CountError, match=match):
            parse_jolokia_count(body, "ConnectionCount")

    @given(st.binary(max_size=300))
    def test_parse_jolokia_any_bytes_count_or_count_error(self, body: bytes) -> None:
        with contextlib.suppress(CountError):
            assert parse_jolokia_count(body, "ConnectionCount") >= 0


class TestParsePrometheus:
    def test_parse_count_rabbitmq_gauge_not_its_counters(self) -> None:
        """Scenario: rabbitmq_connections_opened_total starts with the gauge's name: not counted."""
        assert parse_count(RABBITMQ, 200, RABBITMQ_METRICS) == 3

    def test_parse_prometheus_gauge_sums_labelled_samples(self) -> None:
        page = b'g{node="a",x="}\\" "} 2 1700000000000\ng{node="b"} 3\ng_other 7\n'
        assert parse_prometheus_gauge(page, "g") == 5

    def test_parse_prometheus_gauge_float_notation_of_a_whole_number(self) -> None:
        assert parse_prometheus_gauge(b"g 3.0\n", "g") == 3
        assert parse_prometheus_gauge(b"g 1e2\n", "g") == 100

    @pytest.mark.parametrize(
        ("page", "match"),
        [
            (b"# TYPE g gauge\n", "no g sample in the 15 bytes of the metrics page"),
            (b"g NaN\n", "g is not a count: 'g NaN'"),
            (b"g +Inf\n", "is not a count"),
            (b"g -1\n", "is not a count"),
            (b"g 1.5\n", "is not a count"),
            (b"g\n", "no g sample"),  # a name alone is no sample
            (b'g{a="b" 1\n', "unterminated labels"),
            (b"g \xff\n", "not UTF-8"),
        ],
    )
    def test_parse_prometheus_gauge_malformed(self, page: bytes, match: str) -> None:
        with pytest.raises(CountError, match=match):
            parse_prometheus_gauge(page, "g")

    def test_parse_prometheus_gauge_page_of_a_megabyte(self) -> None:
        page = (
            b"".join(b'other_metric{queue="q%d"} 1\n' % i for i in range(40_000))
            + b"rabbitmq_connections 9\n"
        )
        assert parse_prometheus_gauge(page, "rabbitmq_connections") == 9

    @given(st.binary(max_size=300))
    def test_parse_prometheus_any_bytes_count_or_count_error(self, page: bytes) -> None:
        with contextlib.suppress(CountError):
            assert parse_prometheus_gauge(b"g" + page, "g") >= 0
