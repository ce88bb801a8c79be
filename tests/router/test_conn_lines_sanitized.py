"""router/_conn_lines.c under AddressSanitizer and UndefinedBehaviorSanitizer (STYLE R14): the C line
buffer is built with gcc's sanitizers into a temporary directory, beside a copy of the `router`
package, and test_conn_lines.py (the C buffer against the Python one, `shown` against
`logs.shown` on generated text) and the `shown_native` fuzz target's seed corpus run there in a
process with the sanitizers' runtime preloaded. A memory error or undefined behaviour aborts that
process with the sanitizer's report.

The build and the environment are tests/event_format/test_native_sanitized.py's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.event_format.test_native_sanitized import assert_sanitizers_quiet, build_sanitized_package
from tests.keys.test_native_sanitized import run_sanitized

_RUN = """
import sys
import pytest
from router import _conn_lines
from fuzz.targets import TARGETS
print("lines:", _conn_lines.__file__, flush=True)
target = TARGETS["shown_native"]
seeds = sorted(target.corpus.iterdir())
for seed in seeds:
    data = seed.read_bytes()
    for cut in range(0, len(data) + 1, max(1, len(data) // 16)):
        target.fuzz(data[:cut])
print("seeds:", len(seeds), flush=True)
sys.exit(pytest.main(sys.argv[1:]))
"""
"""Loads the C buffer before pytest does (so the tests use the module this prints), runs the fuzz
target on its seeds and their prefixes, then the tests."""


@pytest.fixture(scope="module")
def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the `router` package whose line buffer is built with ASan and UBSan."""
    build = tmp_path_factory.mktemp("router-lines-sanitized")
    build_sanitized_package(build, "router", "_conn_lines")
    return build


@pytest.mark.integration
def test_native_sanitized_lines_agree_with_python(sanitized_build: Path) -> None:
    """Scenario: the seed corpus of `shown_native` and test_conn_lines.py (generated text with lone
    surrogates and astral characters, long values cut at the cap, wrong field types) on the
    sanitized buffer: all pass, no sanitizer report."""
    result = run_sanitized(
        sanitized_build,
        "-c",
        _RUN,
        "-q",
        "-p",
        "no:cacheprovider",
        str(Path(__file__).with_name("test_conn_lines.py")),
    )
    assert_sanitizers_quiet(result)
    loaded = re.match(r"lines: (.+)\n", result.stdout)
    assert loaded is not None, result.stdout[-3000:]
    assert Path(loaded[1]).is_relative_to(sanitized_build / "router")  # not the normal build
    seeds = re.search(r"^seeds: (\d+)$", result.stdout, re.M)
    assert seeds is not None, result.stdout[-3000:]
    assert int(seeds[1]) > 0
    passed = re.search(r"^(\d+) passed", result.stdout, re.M)
    assert passed is not None, result.stdout[-3000:]
    assert int(passed[1]) >= 25, result.stdout[-3000:]
