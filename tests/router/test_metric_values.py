"""router/metric_values.py: a family's and a histogram's rules, and exact counts from several
threads (their exposition against the client library's: test_metrics.py)."""

from __future__ import annotations

import threading

import pytest

from router.metric_values import Histogram, Tally
from router.metrics import CONNECT_BUCKETS_S, Metrics


def test_family_rules() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match=r"router_routing_decisions_total: a counter only goes up, got -1"):
        metrics.decisions.inc(("r", "OK"), -1)
    with pytest.raises(ValueError, match=r"only a gauge is set, this is a counter"):
        metrics.decisions.set(("r", "OK"), 3)
    with pytest.raises(ValueError, match=r"wants one string per label \['router', 'status'\], got \('r',\)"):
        metrics.decisions.inc(("r",))
    assert metrics.decisions.value(("r", "OK")) is None  # nothing was counted by the failed calls
    metrics.target_ready.set(("r", "b1"), 1)
    metrics.target_ready.remove(("r", "b1"))
    metrics.target_ready.remove(("r", "b1"))  # gone already: nothing
    assert metrics.target_ready.value(("r", "b1")) is None
    assert "router_target_ready{" not in metrics.exposition().decode()


def test_families_count_exactly_from_several_threads() -> None:
    metrics = Metrics()

    def count() -> None:
        for _ in range(20_000):
            metrics.active_connections.inc(("r", "b1"))
            metrics.decisions.inc(("r", "OK"))
            metrics.active_connections.inc(("r", "b1"), -1)

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    exposed = [metrics.exposition() for _ in range(20)]  # scraping meanwhile never fails
    for thread in threads:
        thread.join()
    assert all(b"router_routing_decisions_total" in text for text in exposed)
    assert metrics.decisions.value(("r", "OK")) == 80_000
    assert metrics.active_connections.value(("r", "b1")) == 0


def test_histogram_rules() -> None:
    with pytest.raises(ValueError, match=r"h: bucket bounds must increase, got \(1.0, 1.0\)"):
        Histogram("h", "", (), (1.0, 1.0))
    with pytest.raises(ValueError, match=r"h: wants finite bucket bounds, got \(\)"):
        Histogram("h", "", (), ())
    with pytest.raises(ValueError, match=r"h: wants finite bucket bounds"):
        Histogram("h", "", (), (1.0, float("inf")))
    with pytest.raises(ValueError, match=r"'le' is the histogram's own label"):
        Histogram("h", "", ("le",), (1.0,))
    histogram = Histogram("h", "", ("router",), CONNECT_BUCKETS_S)
    with pytest.raises(ValueError, match=r"h: wants one string per label \['router'\], got \('r', 'x'\)"):
        histogram.observe(("r", "x"), 1.0)
    assert histogram.count(("r", "x")) is None
    histogram.observe(("r",), 1.0)
    histogram.observe(("s",), 1.0)
    histogram.remove_matching(("r",))
    assert (histogram.count(("r",)), histogram.count(("s",))) == (None, 1)


def test_family_remove_matching_drops_every_label_set_with_the_prefix() -> None:
    metrics = Metrics()
    failures = metrics.connect_failures
    for labels in (
        ("r", "b1", "refused"),
        ("r", "b1", "timeout"),
        ("r", "b10", "refused"),
        ("s", "b1", "refused"),
    ):
        failures.inc(labels)
    failures.remove_matching(("r", "b1"))
    assert sorted(failures.label_sets()) == [("r", "b10", "refused"), ("s", "b1", "refused")]
    assert (
        metrics.registry.get_sample_value(
            "router_target_connect_failures_created", {"router": "r", "node_id": "b1", "reason": "refused"}
        )
        is None
    )


def test_a_tally_adds_what_one_thread_counted_when_folded() -> None:
    """One thread counts into cells while another folds them into the family, as scrapes do:
    every count arrives exactly once, and two cells asked for one label set are one."""
    metrics, tally = Metrics(), Tally()
    family = metrics.decisions
    assert tally.cell(family, ("r", "OK")) is tally.cell(family, ("r", "OK"))
    done = threading.Event()

    def count() -> None:
        cells = [tally.cell(family, ("r", "OK")), *(tally.cell(family, (f"r{n}", "OK")) for n in range(3))]
        for n in range(60_000):
            cells[n % 4][0] += 1
        done.set()

    thread = threading.Thread(target=count)
    thread.start()
    while not done.is_set():
        tally.fold()
    thread.join()
    tally.fold()
    tally.fold()  # nothing new: nothing added
    assert family.value(("r", "OK")) == 15_000
    assert [family.value((f"r{n}", "OK")) for n in range(3)] == [15_000] * 3


def test_other_processes_values_are_added_when_collected_and_kept_apart() -> None:
    """`others` (routerd's workers' counts) add to a family's own values in the exposition, label
    set by label set, and never into the own values (`values`)."""
    metrics = Metrics()
    accepted = metrics.connections_accepted
    accepted.inc(("a", "r"), 3)
    accepted.others = {("a", "r"): 4.0, ("b", "r"): 1.0}
    samples = {s.labels["acceptor"]: s.value for s in accepted.collect().samples if s.name.endswith("_total")}
    assert samples == {"a": 7.0, "b": 1.0}
    assert accepted.values() == {("a", "r"): 3.0}
    histogram = Histogram("h_seconds", "help", ("t",), (0.1, 1.0))
    histogram.observe(("x",), 0.05)
    histogram.others = {("x",): [0.0, 2.0, 1.0, 3.5], ("y",): [1.0, 0.0, 0.0, 0.01]}
    buckets = {
        (s.labels["t"], s.labels.get("le")): s.value
        for s in histogram.collect().samples
        if s.name.endswith("_bucket")
    }
    assert buckets[("x", "0.1")] == 1.0
    assert buckets[("x", "1.0")] == 3.0
    assert buckets[("x", "+Inf")] == 4.0
    assert buckets[("y", "+Inf")] == 1.0
    assert histogram.values() == {("x",): [1.0, 0.0, 0.0, 0.05]}
