"""Tests for cache/cache.py: the key -> node id cache with expire-after-access (SPEC A5).

The pure tests pass `now` by hand; `TestCacheOnVirtualClock` drives the same cache from trio's
virtual clock (`autojump_clock`), as the router's I/O layer does. The virtual times are chosen as
binary fractions (0.875, 0.5, …) so that sums of them are exact and the asserted times need no
tolerance.
"""

from __future__ import annotations

import pytest
import trio

from cache.cache import CacheConfig, TargetCache


def make_cache(timeout_ms: int = 0) -> TargetCache:
    return TargetCache(CacheConfig(timeout_ms=timeout_ms))


class TestCacheConfig:
    def test_cache_config_defaults(self):
        config = CacheConfig()
        assert config.persisted is False
        assert config.timeout_ms == 0

    def test_cache_config_negative_timeout_raises(self):
        with pytest.raises(ValueError, match="timeout must be >= 0, got -1"):
            CacheConfig(timeout_ms=-1)


class TestTargetCache:
    def test_cache_get_missing_is_none(self):
        assert make_cache().get("k", 0.0) is None

    def test_cache_put_then_get(self):
        cache = make_cache()
        cache.put("k", "broker1", 0.0)
        assert cache.get("k", 0.0) == "broker1"
        assert len(cache) == 1

    def test_cache_put_overwrites(self):
        cache = make_cache()
        cache.put("k", "broker1", 0.0)
        cache.put("k", "broker2", 1.0)
        assert cache.get("k", 1.0) == "broker2"
        assert len(cache) == 1

    def test_cache_timeout_zero_never_expires(self):
        cache = make_cache(timeout_ms=0)
        cache.put("k", "broker1", 0.0)
        assert cache.get("k", 1e9) == "broker1"
        assert cache.purge_expired(1e12) == 0
        assert cache.entries(1e12) == {"k": "broker1"}

    def test_cache_expires_timeout_after_put(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("k", "broker1", 10.0)
        assert cache.entries(10.5) == {"k": "broker1"}
        assert cache.get("k", 11.0) is None
        assert len(cache) == 0

    def test_cache_alive_just_before_timeout(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("k", "broker1", 10.0)
        assert cache.get("k", 10.999) == "broker1"

    def test_cache_get_refreshes_expiry(self):
        """Scenario: timeout 1 s; reads at 0.75 s and 1.5 s keep the entry, which would have expired
        at 1.0 s after the put."""
        cache = make_cache(timeout_ms=1000)
        cache.put("k", "broker1", 0.0)
        assert cache.get("k", 0.75) == "broker1"
        assert cache.get("k", 1.5) == "broker1"
        assert cache.get("k", 2.25) == "broker1"
        assert cache.get("k", 3.25) is None

    def test_cache_put_refreshes_expiry(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("k", "broker1", 0.0)
        cache.put("k", "broker2", 0.75)
        assert cache.get("k", 1.5) == "broker2"

    def test_cache_entries_snapshot_does_not_refresh(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("k", "broker1", 0.0)
        assert cache.entries(0.75) == {"k": "broker1"}
        assert cache.get("k", 1.0) is None  # the snapshot at 0.75 did not count as an access

    def test_cache_entries_snapshot_excludes_expired_and_is_a_copy(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("old", "broker1", 0.0)
        cache.put("new", "broker2", 0.5)
        snapshot = cache.entries(1.25)
        assert snapshot == {"new": "broker2"}
        snapshot["x"] = "broker3"
        assert cache.get("x", 1.25) is None

    def test_cache_evict(self):
        cache = make_cache()
        cache.put("k", "broker1", 0.0)
        assert cache.evict("k") is True
        assert cache.get("k", 0.0) is None
        assert cache.evict("k") is False
        assert len(cache) == 0

    def test_cache_purge_expired_drops_only_expired(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("a", "broker1", 0.0)
        cache.put("b", "broker2", 0.5)
        cache.put("c", "broker3", 1.0)
        assert cache.purge_expired(1.5) == 2  # a (1.5 s old) and b (exactly 1.0 s old)
        assert len(cache) == 1
        assert cache.entries(1.5) == {"c": "broker3"}
        assert cache.purge_expired(1.5) == 0

    def test_cache_keys_are_independent(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("a", "broker1", 0.0)
        cache.put("b", "broker2", 0.0)
        assert cache.get("a", 0.5) == "broker1"
        assert cache.get("b", 1.25) is None
        assert cache.get("a", 1.25) == "broker1"


class TestCacheBound:
    """Our `<max-entries>`: the least recently used entry goes first (hardening finding 4)."""

    def test_cache_config_max_entries_must_be_positive(self):
        with pytest.raises(ValueError, match="max-entries must be > 0, got 0"):
            CacheConfig(max_entries=0)

    def test_cache_evicts_the_least_recently_used_beyond_max_entries(self):
        cache = TargetCache(CacheConfig(max_entries=3))
        for i, key in enumerate("abc"):
            cache.put(key, f"n{i}", now=i)
        assert cache.get("a", now=3) == "n0"  # a is now the most recently used; b the least
        cache.put("d", "n3", now=4)
        assert (len(cache), cache.evictions) == (3, 1)
        assert cache.entries(now=5) == {"a": "n0", "c": "n2", "d": "n3"}

    def test_cache_overwrite_does_not_evict(self):
        cache = TargetCache(CacheConfig(max_entries=2))
        cache.put("a", "n0", now=0)
        cache.put("b", "n1", now=1)
        cache.put("a", "n2", now=2)  # replacing an entry is not a new one
        assert (len(cache), cache.evictions) == (2, 0)
        cache.put("c", "n3", now=3)  # b is the least recently used now
        assert cache.entries(now=4) == {"a": "n2", "c": "n3"}

    def test_cache_size_stays_bounded_whatever_the_keys(self):
        cache = TargetCache(CacheConfig(max_entries=100))
        for i in range(10_000):
            cache.put(f"client-{i}", "n", now=i)
        assert (len(cache), cache.evictions) == (100, 9_900)
        assert set(cache.entries(now=10_000)) == {f"client-{i}" for i in range(9_900, 10_000)}

    def test_cache_purge_stops_at_the_first_fresh_entry(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("old", "n0", now=0.0)
        cache.put("fresh", "n1", now=0.75)
        cache.put("refreshed", "n2", now=0.0)
        assert cache.get("refreshed", now=0.875) == "n2"  # moved behind "fresh"
        assert cache.purge_expired(now=1.5) == 1
        assert cache.entries(now=1.5) == {"fresh": "n1", "refreshed": "n2"}


class TestCacheOnVirtualClock:
    """Expiry driven by trio's virtual clock: the caller passes `trio.current_time()` as `now`."""

    async def test_cache_expiry_on_virtual_clock(self, autojump_clock):
        """Scenario: timeout 1000 ms; a read 0.875 s after the put survives and refreshes the entry;
        it is gone exactly 1.0 s after the last access."""
        cache = make_cache(timeout_ms=1000)
        t0 = trio.current_time()
        cache.put("client-42", "broker1", trio.current_time())

        await trio.sleep(0.875)
        assert trio.current_time() == t0 + 0.875
        assert cache.get("client-42", trio.current_time()) == "broker1"  # refreshed at t0 + 0.875

        await trio.sleep(0.875)
        assert trio.current_time() == t0 + 1.75  # 1.75 s after the put, 0.875 s after the read
        assert cache.get("client-42", trio.current_time()) == "broker1"  # refreshed at t0 + 1.75

        await trio.sleep(0.5)
        assert trio.current_time() == t0 + 2.25
        assert cache.entries(trio.current_time()) == {"client-42": "broker1"}  # no refresh

        await trio.sleep(0.5)
        assert trio.current_time() == t0 + 2.75  # exactly 1.0 s after the last access
        assert cache.entries(trio.current_time()) == {}
        assert cache.get("client-42", trio.current_time()) is None
        assert len(cache) == 0

    async def test_cache_without_timeout_survives_virtual_hours(self, autojump_clock):
        cache = make_cache(timeout_ms=0)
        t0 = trio.current_time()
        cache.put("k", "broker2", trio.current_time())
        await trio.sleep(10 * 3600)
        assert trio.current_time() == t0 + 36000
        assert cache.get("k", trio.current_time()) == "broker2"

    async def test_cache_purge_on_virtual_clock(self, autojump_clock):
        """Scenario: a purge task every 0.5 s removes an entry that is not read once it is 1 s old."""
        cache = make_cache(timeout_ms=1000)
        t0 = trio.current_time()
        cache.put("idle", "broker1", trio.current_time())
        purged_at: list[float] = []
        for _ in range(4):
            await trio.sleep(0.5)
            if cache.purge_expired(trio.current_time()):
                purged_at.append(trio.current_time() - t0)
        assert purged_at == [1.0]
        assert len(cache) == 0
