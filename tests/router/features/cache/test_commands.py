"""router/features/cache/commands.py: `routerctl cache` (against a running routerd in
tests/router/test_routerd_cache.py)."""

from __future__ import annotations


def test__evicted_line() -> None:
    from router.features.cache.commands import _evicted_line

    assert [_evicted_line(n) for n in (0, 1, 7)] == [
        "evicted 0 entries",
        "evicted 1 entry",
        "evicted 7 entries",
    ]
