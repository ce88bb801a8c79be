"""Metrics: Prometheus names, and one registry per server instance."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import Histogram as LibraryHistogram

from router.features import register_metrics
from router.metrics import CONNECT_BUCKETS_S, Metrics

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"


def test_metrics_exposition_names_every_family() -> None:
    metrics = Metrics()
    metrics.connections_accepted.inc(("a", "r"))
    metrics.decisions.inc(("r", "OK"), 2)
    text = metrics.exposition().decode()
    assert 'router_connections_accepted_total{acceptor="a",router="r"} 1.0' in text
    assert 'router_routing_decisions_total{router="r",status="OK"} 2.0' in text
    for family in (
        "router_target_ready",
        "router_pool_active",
        "router_proxied_connections",
        "router_target_connect_failures_total",
        "router_proxied_bytes_total",
        "router_lookups_total",
    ):
        assert f"# HELP {family.removesuffix('_total')}" in text


def test_metrics_instances_do_not_share_state() -> None:
    first, second = Metrics(), Metrics()
    first.decisions.inc(("r", "OK"))
    labels = {"router": "r", "status": "OK"}
    assert first.registry.get_sample_value("router_routing_decisions_total", labels) == 1.0
    assert second.registry.get_sample_value("router_routing_decisions_total", labels) is None


def test_exposition_is_what_the_client_library_writes() -> None:
    """Families export exactly what prometheus_client's own Counter and Gauge would."""
    metrics = Metrics()
    metrics.connections_accepted.inc(("a", "r"))
    metrics.proxied_bytes.inc(("r", "b1", "client_to_target"), 16)
    metrics.active_connections.inc(("r", "b1"))
    metrics.active_connections.inc(("r", "b1"), -1)
    metrics.target_ready.set(("r", "b1"), 1)
    library = CollectorRegistry()
    accepted = Counter(
        "router_connections_accepted_total",
        metrics.connections_accepted.documentation,
        ["acceptor", "router"],
        registry=library,
    )
    accepted.labels("a", "r").inc()
    relayed = Counter(
        "router_proxied_bytes_total",
        metrics.proxied_bytes.documentation,
        ["router", "node_id", "direction"],
        registry=library,
    )
    relayed.labels("r", "b1", "client_to_target").inc(16)
    active = Gauge(
        "router_proxied_connections",
        metrics.active_connections.documentation,
        ["router", "node_id"],
        registry=library,
    )
    active.labels("r", "b1").inc()
    active.labels("r", "b1").dec()
    ready = Gauge(
        "router_target_ready", metrics.target_ready.documentation, ["router", "node_id"], registry=library
    )
    ready.labels("r", "b1").set(1)

    def families(text: str) -> dict[str, list[str]]:
        """Lines by family, without the library's _created samples (we export none)."""
        blocks: dict[str, list[str]] = {}
        name = ""
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
            if not re.match(r"\w+_created\{", line):
                blocks.setdefault(name, []).append(line)
        return blocks

    ours, theirs = families(metrics.exposition().decode()), families(generate_latest(library).decode())
    theirs = {name: lines for name, lines in theirs.items() if not name.endswith("_created")}
    assert theirs  # four families
    for name, lines in theirs.items():
        assert ours[name] == lines


def test_counters_and_histograms_export_no_created_series() -> None:
    """Scenario (issue 34): a `_created` series per label set doubles the series and is noise in
    dashboards; the client library writes them, we do not."""
    metrics = Metrics()
    metrics.decisions.inc(("r", "OK"))
    metrics.connect_duration.observe(("r", "b1"), 0.001)
    text = metrics.exposition().decode()
    assert 'router_routing_decisions_total{router="r",status="OK"} 1.0' in text
    assert 'router_target_connect_duration_seconds_count{node_id="b1",router="r"} 1.0' in text
    assert "_created" not in text


def test_histogram_exposition_is_what_the_client_library_writes() -> None:
    metrics = Metrics()
    library = CollectorRegistry()
    theirs = LibraryHistogram(
        "router_target_connect_duration_seconds",
        metrics.connect_duration.documentation,
        ["router", "node_id"],
        buckets=CONNECT_BUCKETS_S,
        registry=library,
    )
    for value in (0.0001, 0.0005, 0.003, 0.003, 7.0):  # 0.0005: on a bound, counted in it
        metrics.connect_duration.observe(("r", "b1"), value)
        theirs.labels("r", "b1").observe(value)

    def block(text: str) -> list[str]:
        lines = [line for line in text.splitlines() if "router_target_connect_duration_seconds" in line]
        return [line for line in lines if "_created" not in line]

    ours = block(metrics.exposition().decode())
    assert ours == block(generate_latest(library).decode())
    assert 'router_target_connect_duration_seconds_bucket{le="0.0005",node_id="b1",router="r"} 2.0' in ours
    assert 'router_target_connect_duration_seconds_count{node_id="b1",router="r"} 5.0' in ours
    assert metrics.connect_duration.count(("r", "b1")) == 5
    assert metrics.connect_duration.count(("r", "b2")) is None


def test_metrics_include_the_process_collector_and_the_scraped_samplers() -> None:
    """Scenario: each instance's registry has the process's own figures, and samplers run per scrape."""
    metrics = Metrics()
    scrapes: list[int] = []
    metrics.sample_when_scraped(lambda: metrics.client_connections.set((), len(scrapes)))
    metrics.sample_when_scraped(lambda: scrapes.append(1))
    registry = metrics.registry
    open_fds = registry.get_sample_value("process_open_fds")
    max_fds = registry.get_sample_value("process_max_fds")
    assert open_fds is not None
    assert max_fds is not None
    assert 0 < open_fds <= max_fds
    resident = registry.get_sample_value("process_resident_memory_bytes")
    assert resident is not None
    assert resident > 0
    assert registry.get_sample_value("process_cpu_seconds_total") is not None
    text = metrics.exposition().decode()
    assert f"router_client_connections {float(len(scrapes) - 1)}" in text
    assert Metrics().registry.get_sample_value("process_open_fds") is not None  # one per instance


def test_every_metric_family_is_in_the_operations_metric_table_and_no_other() -> None:
    """docs/operations.md's metric tables name every family routerd exports (its features'
    included), with its type, and nothing it does not export."""
    table = r"^\| `(router_[a-z0-9_]+)` \| (counter|gauge|histogram) \|"
    documented = dict(re.findall(table, OPERATIONS.read_text(), re.MULTILINE))
    exported = {
        (f"{family.name}_total" if family.type == "counter" else family.name): family.type
        for family in register_metrics(Metrics()).registry.collect()
        if family.name.startswith("router_")
    }
    assert documented == exported


def test_every_alert_is_in_the_operations_alert_table_and_no_other() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = {
        rule["alert"]: rule["labels"]["severity"] for group in rules["groups"] for rule in group["rules"]
    }
    documented = dict(
        re.findall(r"^\| `(Router[A-Za-z]+)` \| (critical|warning|info) \|", OPERATIONS.read_text(), re.M)
    )
    assert documented == alerts
