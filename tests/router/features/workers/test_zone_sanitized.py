"""router/features/workers/_zone.c under AddressSanitizer and UndefinedBehaviorSanitizer (STYLE R14):
the zone is built with gcc's sanitizers beside a copy of the `router` package, and test_zone.py
runs there in a process with the sanitizers' runtime preloaded; the processes its tests start
inherit that environment, so they map the zone through the sanitized build too.

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
from router.features.workers import _zone
print("zone:", _zone.__file__, flush=True)
sys.exit(pytest.main(sys.argv[1:]))
"""
"""Loads the zone before pytest does (so the tests use the module this prints), then runs them."""


@pytest.mark.integration
def test_sanitized_zone_passes_the_zone_tests(tmp_path: Path) -> None:
    """Scenario: test_zone.py (the differential test against TargetCache, the bounds, several
    processes writing at once, a process killed holding the lock) on the sanitized zone: all pass,
    no sanitizer report."""
    build_sanitized_package(tmp_path, "router", "features/workers/_zone")
    result = run_sanitized(
        tmp_path, "-c", _RUN, "-q", "-p", "no:cacheprovider", str(Path(__file__).parent / "test_zone.py")
    )
    assert_sanitizers_quiet(result)
    loaded = re.match(r"zone: (.+)\n", result.stdout)
    assert loaded is not None, result.stdout[-3000:]
    assert Path(loaded[1]).is_relative_to(tmp_path / "router")  # not the normal build
    passed = re.search(r"^(\d+) passed", result.stdout, re.M)
    assert passed is not None, result.stdout[-3000:]
    assert int(passed[1]) >= 14, result.stdout[-3000:]
