"""The test tree mirrors the source tree (STYLE R9): every module `X/Y.py` has `tests/X/test_Y.py`.

Modules that may still lack a test file are listed in `NOT_YET_TESTED`. The list only shrinks: a
listed module that gains a test file, or no longer exists, fails the layout test until it is taken
off the list.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "keys", "pools", "policies", "cache", "tls_sni")

NOT_YET_TESTED = frozenset(
    {
        "router/__main__.py",
    }
)


def source_modules() -> list[str]:
    """Every module of the packages (subpackages included) except `__init__.py`, as posix paths."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def expected_test_file(module: str) -> Path:
    """`X/Y.py` -> `tests/X/test_Y.py` (and `X/sub/Y.py` -> `tests/X/sub/test_Y.py`)."""
    path = Path(module)
    return ROOT / "tests" / path.parent / f"test_{path.name}"


def test__expected_test_file():
    assert expected_test_file("keys/resolve.py") == ROOT / "tests/keys/test_resolve.py"
    assert expected_test_file("router/__main__.py") == ROOT / "tests/router/test___main__.py"
    assert expected_test_file("router/schema/load.py") == ROOT / "tests/router/schema/test_load.py"


def test_layout_packages_exist():
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package


def test_layout_finds_known_modules():
    modules = source_modules()
    for known in ["keys/resolve.py", "policies/policy.py", "router/core/engine.py", "cache/cache.py"]:
        assert known in modules


def test_layout_every_module_has_test_file():
    missing = [
        f"{module} -> {expected_test_file(module).relative_to(ROOT).as_posix()}"
        for module in source_modules()
        if module not in NOT_YET_TESTED and not expected_test_file(module).is_file()
    ]
    assert missing == [], "modules without a test file (STYLE R9)"


def test_layout_not_yet_tested_modules_exist():
    gone = sorted(module for module in NOT_YET_TESTED if not (ROOT / module).is_file())
    assert gone == [], "listed in NOT_YET_TESTED but no such module: remove them from the list"


def test_layout_not_yet_tested_modules_still_lack_tests():
    tested = sorted(module for module in NOT_YET_TESTED if expected_test_file(module).is_file())
    assert tested == [], "these modules now have a test file: remove them from NOT_YET_TESTED"
