"""CONSISTENT_HASH's rings compared: the benchmark's figures on a few thousand keys are sane."""

from __future__ import annotations

import pytest

from benchmarks.studies.rings import RINGS, assign, build_ms, main, measure, node_ids, select_us, targets_of

KEYS = [f"client-{i}" for i in range(3000)]


@pytest.mark.parametrize("ring", ["artemis", "ketama"])
@pytest.mark.parametrize("count", [3, 5])
def test_measure_plain_ring_leave_moves_exactly_one_nth(ring, count):
    """Scenario: without a load factor only the leaving target's keys move, so over each target
    leaving once every key moves exactly once: the mean is 1/n."""
    figures = measure(ring, count, KEYS)
    assert figures.leave_mean == pytest.approx(1 / count)
    assert figures.leave_mean <= figures.leave_max <= 1
    assert 0 < figures.join_mean <= figures.join_max <= 1
    assert figures.balance >= 1


def test_measure_ketama_balances_better_than_artemis():
    artemis, ketama = measure("artemis", 5, KEYS), measure("ketama", 5, KEYS)
    assert ketama.balance < 1.3 < artemis.balance
    assert ketama.leave_max < artemis.leave_max


@pytest.mark.parametrize("ring", ["ketama+load1.25", "ketama+load1.05"])
def test_measure_bounded_ring_stays_under_its_factor(ring):
    factor = float(dict(RINGS[ring])["LOAD_FACTOR"])
    figures = measure(ring, 3, KEYS, "uuids")
    assert 1 <= figures.balance <= factor + 3 / len(KEYS)  # ceil(): one key over c * mean at most
    assert figures.leave_mean >= 1 / 3 - 1e-9  # the leaving target's keys, and maybe some more


def test_assign_bounded_load_counts_each_key_once():
    targets = targets_of(node_ids(3, "names"))
    picks = assign("ketama+load1.05", targets, KEYS)
    assert len(picks) == len(KEYS)
    assert max(picks.count(t.node_id) for t in targets) <= 1.05 * len(KEYS) / 3 + 1


def test_node_ids_styles_are_fixed_and_extend():
    assert node_ids(3, "names") == ["broker-0", "broker-1", "broker-2"]
    uuids = node_ids(4, "uuids")
    assert uuids == node_ids(4, "uuids")
    assert node_ids(2, "uuids", start=2) == uuids[2:]
    assert len(set(uuids)) == 4


def test_costs_are_positive():
    assert select_us("ketama", 3, KEYS[:200]) > 0
    assert build_ms(3, repeat=1) > 0


def test_main_prints_every_ring(capsys):
    assert main(["--keys", "300", "--targets", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for ring in RINGS:
        # its row in the figures and in the select costs
        assert sum(line.split()[:1] == [ring] for line in lines) == 2
    assert any(line.startswith("building a ketama ring") for line in lines)
