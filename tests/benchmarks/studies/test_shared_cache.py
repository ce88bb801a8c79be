"""The shared-cache benchmark, tiny: its own ZooKeeper, 300 keys, every figure printed."""

from __future__ import annotations

import re

import pytest

from benchmarks.studies.shared_cache import main


@pytest.mark.integration
def test_shared_cache_benchmark_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--keys", "300", "--concurrency", "8"])
    out = capsys.readouterr().out
    for name in ("first decisions", "adoptions by another router", "expiry extensions"):
        match = re.search(rf"^{name}.*?\s([\d,]+)/s", out, re.M)
        assert match is not None, out
        assert int(match.group(1).replace(",", "")) > 0
    assert re.search(r"^hits \(own cache\) .* p99 +[\d.]+ µs", out, re.M), out
    znodes = re.search(r"ZooKeeper holds ([\d,]+) znodes", out)
    assert znodes is not None
    assert int(znodes.group(1).replace(",", "")) >= 300 + 2000  # the keys and the latency sample
