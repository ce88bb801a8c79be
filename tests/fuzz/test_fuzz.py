"""Tests of the fuzz run (fuzz/README.md): each target runs CI-sized under atheris without a finding
and really executes inputs, and each target accepts every file of its seed corpus."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # fuzz/ is not an installed package (as benchmarks/)
    sys.path.insert(0, str(ROOT))

from fuzz.runner import DEFAULT_TIME_S  # noqa: E402 - needs ROOT on sys.path
from fuzz.targets import CORPUS, TARGETS, config_dictionary  # noqa: E402

RUN = ROOT / "fuzz" / "run"
CI_RUN_TIMEOUT_S = DEFAULT_TIME_S + 60
"""A CI-sized run stops after `DEFAULT_TIME_S` of fuzzing; start-up takes about two seconds."""
CORPUS_LIMIT_BYTES = 1024 * 1024


def run_fuzz(*args: str, timeout: float = CI_RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("name", list(TARGETS))
def test_fuzz_run_ci_sized_target_finds_nothing(name: str) -> None:
    """Scenario: `fuzz/run TARGET` with the CI-sized defaults; libFuzzer's final statistics
    (echoed by --verbose) say how many inputs atheris executed."""
    result = run_fuzz(name, "--verbose")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    executed = re.search(rf"^\[{name}\] stat::number_of_executed_units: (\d+)$", output, re.M)
    assert executed is not None, output[-8000:]
    assert int(executed[1]) > 0
    assert re.search(rf"^fuzz/run: {name}: ok, \d+ runs in ", output, re.M), output[-2000:]


@pytest.mark.parametrize("name", list(TARGETS))
def test_fuzz_target_accepts_its_seed_corpus(name: str) -> None:
    target = TARGETS[name]
    seeds = sorted(target.corpus.iterdir())
    assert seeds, f"{target.corpus} is empty"
    for seed in seeds:
        data = seed.read_bytes()
        assert len(data) <= target.max_len, f"{seed.name}: libFuzzer would cut it to max_len"
        target.fuzz(data)


def test_fuzz_corpus_has_one_directory_per_target_and_stays_small() -> None:
    # mqtt_native and stomp_native read the mqtt and stomp corpora: one directory per corpus
    assert sorted(path.name for path in CORPUS.iterdir()) == sorted({t.corpus.name for t in TARGETS.values()})
    assert all(target.corpus.parent == CORPUS for target in TARGETS.values())
    total = sum(seed.stat().st_size for seed in CORPUS.rglob("*") if seed.is_file())
    assert total < CORPUS_LIMIT_BYTES


def test_fuzz_config_dictionary_names_the_schema_elements() -> None:
    tokens = config_dictionary()
    assert b"<connection-router" in tokens
    assert b' key-type="' not in tokens  # an element, not an attribute
    assert b"<key-type" in tokens


def test_fuzz_run_lists_every_target() -> None:
    result = run_fuzz("--list", timeout=60)
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == list(TARGETS)


def test_fuzz_run_unknown_target_is_a_usage_error() -> None:
    result = run_fuzz("no-such-target", timeout=60)
    assert result.returncode == 2
    assert "unknown target no-such-target" in result.stderr
