"""deploy/grafana/connection-router.json: a Grafana dashboard whose every panel query is about
metrics routerd really exports, and returns data from a real Prometheus (the Debian package's
binary, started once for this module on a loopback port chosen at run time, scraping every
second) that scrapes a real routerd over real mosquitto brokers while the test makes happen what
the panels show: traffic, a broker that dies between two probes (a refused connect, redispatched;
the target goes down), a cache hit, a refusal for want of a ready target, a refusal at accept by
`connectionsAllowed`, events the event log's ring (of one) drops, and a full target's queue (a
client waiting, refused at its queue timeout, another at a full queue) behind an acceptor its
`connectionRate` throttles. Prometheus also loads
deploy/prometheus/alerts.yml, whose rules must evaluate without error against those series.

The held session's target is evacuated last, for the evacuation panel.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from router.features import register_metrics
from router.metrics import Metrics
from tests.conftest import eventually, free_port, read_until_closed
from tests.deploy.prometheus.conftest import SCRAPE_INTERVAL_S, Prometheus
from tests.keys.test_mqtt import connect_packet
from tests.router.conftest import Mosquitto, Routerd, mqtt_round_trip, running, static_connectors

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "connection-router.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


VARIABLES: Final = {"$__rate_interval": "1m", "$job": ".*", "$instance": ".*", "$router": ".*"}
"""What Grafana puts for the dashboard's variables with "All" selected (their allValue), and a
rate interval of a few scrapes."""

QUERY_DEADLINE_S: Final = 40.0
"""How long every panel query together may take to return data: the events are made before, so
this is a few scrapes and rule evaluations, with room for a loaded machine."""


# -- the dashboard's queries ---------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text())
    assert isinstance(document, dict)
    return document


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every query of every panel (rows hold none), and of
    every annotation (its name as the title)."""
    document = dashboard()
    return [
        (panel["title"], target["expr"])
        for panel in document["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ] + [(annotation["name"], annotation["expr"]) for annotation in document["annotations"]["list"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression of ours reads: routerd's (router_, process_) and
    Prometheus's own `up`."""
    return set(re.findall(r"\b(?:router|process)_[a-z0-9_]+\b|\bup(?=\{)", expr))


def exported_names() -> set[str]:
    """Every series name a routerd exports (its families, histograms' and counters' series)."""
    names = {"up"}  # Prometheus's own series of each scrape target
    for family in register_metrics(Metrics()).registry.collect():
        match family.type:
            case "counter":
                names.add(f"{family.name}_total")
            case "histogram":
                names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum")}
            case _:
                names.add(family.name)
    return names


def expanded(expr: str) -> str:
    """An expression as Grafana sends it with "All" selected."""
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_dashboard_panels_read_metrics_routerd_exports() -> None:
    queries = panel_queries()
    assert len(queries) >= 12
    exported = exported_names()
    for title, expr in queries:
        names = metric_names(expr)
        assert names, title
        assert names <= exported, (title, names - exported)
    alerts = yaml.safe_load(ALERTS.read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            assert metric_names(rule["expr"]) <= exported, rule["alert"]


def test_dashboard_uses_a_datasource_variable_and_rate_interval() -> None:
    """Scenario: imported into any Grafana, the dashboard asks for its Prometheus (no fixed uid)."""
    document = dashboard()
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance", "router"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[name]["allValue"] == ".*"
    for panel in document["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            if "rate(" in target["expr"] or "increase(" in target["expr"]:
                assert "[$__rate_interval]" in target["expr"], panel["title"]
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))


# -- routerd over three brokers ------------------------------------------------------------------

NODE_IDS: Final = ("b0", "b1", "b2")


class Fleet:
    """routerd (routers `main` and `down`) and its brokers, as the module's tests share them."""

    def __init__(self, workdir: Path, brokers: list[Mosquitto]) -> None:
        self.brokers = brokers
        self.ports = {name: free_port() for name in ("main", "down", "capped", "gated")}
        dead = free_port()  # nothing listens there: router `down` never has a ready target
        connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
        events = workdir / "events"

        def make(_admin_port: int) -> str:
            return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq">
 <core xmlns="urn:activemq:core">
  <connectors>{connectors}
   <connector name="gone">tcp://127.0.0.1:{dead}?nodeId=gone</connector>
   <connector name="g0">tcp://127.0.0.1:{brokers[0].port}?nodeId=g0;maxConnections=1;maxQueue=1;queueTimeout=3000</connector>
  </connectors>
  <acceptors>
   <acceptor name="main">tcp://127.0.0.1:{self.ports["main"]}?router=main;mode=proxy</acceptor>
   <acceptor name="down">tcp://127.0.0.1:{self.ports["down"]}?router=down;mode=proxy</acceptor>
   <acceptor name="capped">tcp://127.0.0.1:{self.ports["capped"]}?router=main;mode=proxy;connectionsAllowed=1</acceptor>
   <acceptor name="gated">tcp://127.0.0.1:{self.ports["gated"]}?router=gated;mode=proxy;connectionRate=1;connectionBurst=1</acceptor>
  </acceptors>
  <event-log><directory>{events}</directory><ring-size>1</ring-size></event-log>
  <connection-routers>
   <connection-router name="main">
    <key-type>CLIENT_ID</key-type>
    <cache><timeout>600000</timeout></cache>
    <policy name="ROUND_ROBIN"/>
    <pool><check-period>60000</check-period><static-connectors>{refs}</static-connectors></pool>
   </connection-router>
   <connection-router name="down">
    <key-type>CLIENT_ID</key-type>
    <policy name="FIRST_ELEMENT"/>
    <pool>
     <check-period>1000</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors><connector-ref>gone</connector-ref></static-connectors>
    </pool>
   </connection-router>
   <connection-router name="gated">
    <key-type>CLIENT_ID</key-type>
    <policy name="FIRST_ELEMENT"/>
    <pool><check-period>60000</check-period><static-connectors><connector-ref>g0</connector-ref></static-connectors></pool>
   </connection-router>
  </connection-routers>
 </core>
</configuration>
"""

        self.routerd = Routerd(workdir, make)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three mosquitto brokers and a routerd over them, for the module; stopped afterwards."""
    workdir = tmp_path_factory.mktemp("dashboard")
    brokers = [Mosquitto(workdir, f"mosquitto-{i}") for i in range(len(NODE_IDS))]
    for started in running(brokers):
        fleet = Fleet(workdir, started)
        try:
            fleet.routerd.start()
            yield fleet
        finally:
            fleet.routerd.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, fleet: Fleet) -> Iterator[Prometheus]:
    """A Prometheus scraping the module's routerd every second, with the alert rules loaded."""
    server = Prometheus(
        tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{fleet.routerd.admin_port}"], [ALERTS]
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _metric(router: Routerd, pattern: str) -> float:
    """The value of the first sample of routerd's /metrics matching `pattern` (a regex of the
    name and labels), 0 when none does."""
    found = re.search(rf"^{pattern} (\S+)$", router.metrics(), re.MULTILINE)
    return 0.0 if found is None else float(found.group(1))


def _gate(router: Routerd, name: str, node_id: str) -> dict[str, Any]:
    """A target's `gate` in its router's status document."""
    status: Any = router.get(f"/api/v1/routers/{name}")
    gate: dict[str, Any] = next(t["gate"] for t in status["pool"]["targets"] if t["node_id"] == node_id)
    return gate


def _refused_mqtt(port: int, client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT sent raw; what came back before the router closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(connect_packet(client_id=client_id.encode()))
        return read_until_closed(sock)


def _burst(port: int, count: int) -> None:
    """`count` refused clients at once (each a decision for the event log)."""
    threads = [
        threading.Thread(target=_refused_mqtt, args=(port, f"burst-{uuid.uuid4().hex[:8]}"))
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def _held_session(port: int) -> mqtt.Client:
    """An MQTT session through `port`, kept open (disconnect it afterwards)."""
    connected = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"held-{uuid.uuid4().hex[:8]}")
    client.on_connect = lambda *_a: connected.set()
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    assert connected.wait(10), "the held session did not connect"
    return client


@pytest.mark.integration
def test_every_dashboard_panel_query_returns_data(fleet: Fleet, prometheus: Prometheus) -> None:
    router, ports = fleet.routerd, fleet.ports
    up = [f'router_target_state{{node_id="{n}",router="main",state="up"}} 1.0' for n in NODE_IDS]
    assert eventually(lambda: all(line in router.metrics() for line in up), 15)

    # b2 dies between two probes (every 60 s): round robin sends a client there, whose connect is
    # refused and redispatched; b2 goes down at once.
    fleet.brokers[2].kill()
    for i in range(len(NODE_IDS) + 1):
        assert mqtt_round_trip(ports["main"], client_id=f"dash-{i}", topic=f"dash/{i}")
    refused = r'router_target_connect_failures_total\{node_id="b2",reason="refused",router="main"\}'
    assert _metric(router, refused) >= 1  # one, or two when the next pick came before b2 went down
    assert mqtt_round_trip(ports["main"], client_id="dash-0", topic="dash/again")  # a cache hit

    held = _held_session(ports["capped"])  # the acceptor's one connection
    try:
        with socket.create_connection(("127.0.0.1", ports["capped"]), timeout=10) as sock:
            assert read_until_closed(sock) == b""  # closed at accept
        assert eventually(
            lambda: (
                _metric(
                    router, r'router_connections_refused_total\{acceptor="capped",reason="acceptor_limit"\}'
                )
                == 1
            )
        )

        assert _refused_mqtt(ports["down"], "refused-1") == b"\x20\x02\x00\x88"  # 0x88 as Artemis answers
        # Bytes no protocol reads: a client error.
        with socket.create_connection(("127.0.0.1", ports["main"]), timeout=10) as sock:
            sock.sendall(b"\x00garbage, no protocol\r\n")
            assert read_until_closed(sock) == b""
        # The event log's ring holds one event, and its sender takes them every 50 ms: a burst of
        # decisions overflows it.
        dropped = r'router_event_log_events_total\{outcome="dropped"\}'
        deadline = time.monotonic() + 20
        while _metric(router, dropped) == 0 and time.monotonic() < deadline:
            _burst(ports["down"], 20)
            eventually(lambda: _metric(router, dropped) > 0, 2)
        assert _metric(router, dropped) > 0

        # Storm protection: one session holds target g0's one slot; a second client waits in its
        # queue and is refused at its queue timeout, a third finds the queue full. The acceptor
        # takes one connection a second (connectionRate=1): it pauses between them.
        slot_holder = _held_session(ports["gated"])
        try:
            waited: list[bytes] = []
            waiter = threading.Thread(target=lambda: waited.append(_refused_mqtt(ports["gated"], "waiter")))
            waiter.start()
            assert eventually(lambda: _gate(router, "gated", "g0")["queued"] == 1, 10)
            assert _refused_mqtt(ports["gated"], "too-many") == b"\x20\x02\x00\x88"
            waiter.join(10)
            assert waited == [b"\x20\x02\x00\x88"]
        finally:
            slot_holder.disconnect()
            slot_holder.loop_stop()

        # The held session's target is evacuated (its one client moved at once).
        status: Any = router.get("/api/v1/routers/main")
        held_on = next(t["node_id"] for t in status["pool"]["targets"] if t["connections"])
        evacuation = urllib.request.Request(
            f"{router.admin}/api/v1/routers/main/targets/{held_on}/evacuation",
            data=json.dumps({"rate": 50}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(evacuation, timeout=10) as answer:
            assert answer.status == 202
        moved = rf'router_evacuation_moved_total\{{node_id="{held_on}",router="main"\}}'
        assert eventually(lambda: _metric(router, moved) == 1, 10)

        # The annotations show changes Prometheus saw happen: once it has scraped routerd, a reload
        # of the same file and a target drained.
        assert eventually(
            lambda: prometheus.query('router_target_state{router="main"}') != [], QUERY_DEADLINE_S
        )
        reload = urllib.request.Request(f"{router.admin}/api/v1/reload", data=b"", method="POST")
        with urllib.request.urlopen(reload, timeout=10) as answer:
            assert answer.status == 200
        # A target that is up: neither b2 (down) nor the evacuated one (drained already).
        up_target = next(n for n in NODE_IDS if n not in (held_on, "b2"))
        drain = urllib.request.Request(
            f"{router.admin}/api/v1/routers/main/targets/{up_target}",
            data=json.dumps({"admin_state": "drain"}).encode(),
            method="PUT",
        )
        with urllib.request.urlopen(drain, timeout=10) as answer:
            assert answer.status == 200

        queries = [(title, expanded(expr)) for title, expr in panel_queries()]
        empty = list(queries)
        deadline = time.monotonic() + QUERY_DEADLINE_S
        while empty and time.monotonic() < deadline:
            empty = [(title, expr) for title, expr in empty if not prometheus.query(expr)]
            if empty:
                time.sleep(SCRAPE_INTERVAL_S)  # the next scrape: nothing to wait on in Prometheus
        assert empty == []
    finally:
        held.disconnect()
        held.loop_stop()

    # What the panels show is what routerd did.
    def one(expr: str) -> float:
        result = prometheus.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    assert one('router_target_state{router="main", node_id="b2", state="down"}') == 1
    assert (
        one('max_over_time(router_connections_refused_total{acceptor="capped", reason="acceptor_limit"}[5m])')
        == 1
    )
    assert (
        one('max_over_time(router_routing_refusals_total{router="down", reason="no_ready_target"}[5m])') >= 1
    )
    assert one('max_over_time(router_cache_lookups_total{router="main", result="hit"}[5m])') >= 1
    assert one('up{job="routerd"}') == 1
    assert one('max_over_time(router_routing_refusals_total{router="gated", reason="queue_full"}[5m])') == 1
    assert (
        one('max_over_time(router_routing_refusals_total{router="gated", reason="queue_timeout"}[5m])') == 1
    )
    assert one('max_over_time(router_acceptor_paused_seconds_total{acceptor="gated"}[5m])') > 0

    # The alert rules evaluate against routerd's series without error.
    def rules_evaluated() -> bool:
        rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
        shipped = sum(len(group["rules"]) for group in yaml.safe_load(ALERTS.read_text())["groups"])
        return len(rules) == shipped and all(rule["health"] == "ok" for rule in rules)

    assert eventually(rules_evaluated, 10)
