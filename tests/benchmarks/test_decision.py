"""Routing decision time in process: percentiles and a tiny run of the real engine."""

from __future__ import annotations

import pytest

from benchmarks.configs import Ports, routerd_config
from benchmarks.decision import percentile, time_decisions


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [(0.5, 50.0), (0.99, 99.0), (1.0, 100.0), (0.001, 1.0)],
)
def test_percentile_nearest_rank(fraction: float, expected: float) -> None:
    samples = [float(x) for x in range(100, 0, -1)]
    assert percentile(samples, fraction) == expected


def test_percentile_rejects_no_samples_and_bad_fractions() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], 0)


def test_time_decisions_gives_positive_percentiles() -> None:
    ports = Ports.from_numbers(range(21000, 21000 + Ports.COUNT))
    times = time_decisions(routerd_config(ports), "echo", keys=300)
    assert times.keys == 300
    assert 0 < times.miss_p50_us <= times.miss_p99_us
    assert 0 < times.hit_p50_us <= times.hit_p99_us


@pytest.mark.parametrize("variant", ["persisted", "shared"])
def test_time_decisions_of_a_persisted_or_shared_cache(variant: str) -> None:
    ports = Ports.from_numbers(range(21000, 21000 + Ports.COUNT))
    times = time_decisions(
        routerd_config(ports), "echo", keys=300, persisted=variant == "persisted", shared=variant == "shared"
    )
    assert 0 < times.miss_p50_us <= times.miss_p99_us
    assert 0 < times.hit_p50_us <= times.hit_p99_us
