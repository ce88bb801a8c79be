"""router/datapath/_core.c under AddressSanitizer and UndefinedBehaviorSanitizer (STYLE R14): the C
core is built with gcc's sanitizers into a temporary directory, beside a copy of the `router`
package, and the fast path's tests (every one on the native data path) and the core's own run there
in a process with the sanitizers' runtime preloaded (the interpreter itself is not instrumented).
A memory error or undefined behaviour in the core aborts that process with the sanitizer's report.

The build and the environment are tests/event_format/test_native_sanitized.py's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.event_format.test_native_sanitized import assert_sanitizers_quiet, build_sanitized_package
from tests.keys.test_native_sanitized import run_sanitized

ROOT = Path(__file__).resolve().parents[3]
TESTS = ("test_fast_path.py", "test_native_path.py")

_RUN = """
import sys
import pytest
from router.datapath import _core
print("core:", _core.__file__, flush=True)
sys.exit(pytest.main(sys.argv[1:]))
"""
"""Loads the core before pytest does (so the tests use the module this prints), then runs them."""


@pytest.fixture(scope="module")
def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the `router` package whose C core is built with ASan and UBSan."""
    build = tmp_path_factory.mktemp("router-core-sanitized")
    build_sanitized_package(build, "router", "datapath/_core")
    return build


@pytest.mark.integration
def test_native_sanitized_core_passes_the_data_path_tests(sanitized_build: Path) -> None:
    """Scenario: test_fast_path.py (relays of megabytes with backpressure, split and garbage
    openings, deadlines, hand-overs, injected errors) and test_native_path.py (1,100 connections at
    once, a connect deadline) on the sanitized core: all pass, no sanitizer report."""
    here = Path(__file__).parent
    result = run_sanitized(
        sanitized_build,
        "-c",
        _RUN,
        "-q",
        "-p",
        "no:cacheprovider",
        *(str(here / name) for name in TESTS),
        "-k",
        "not test_routerd_refuses and not python",  # routerd's own process; the Python path's runs
    )
    assert_sanitizers_quiet(result)
    loaded = re.match(r"core: (.+)\n", result.stdout)
    assert loaded is not None, result.stdout[-3000:]
    assert Path(loaded[1]).is_relative_to(sanitized_build / "router")  # not the normal build
    passed = re.search(r"^(\d+) passed", result.stdout, re.M)
    assert passed is not None, result.stdout[-3000:]
    assert int(passed[1]) >= 15, result.stdout[-3000:]
