"""Tests for cache/cache.py: the key -> node id cache with expire-after-access (SPEC A5).

The pure tests pass `now` by hand; `TestCacheOnVirtualClock` drives the same cache from trio's
virtual clock (`autojump_clock`), as the router's I/O layer does. The virtual times are chosen as
binary fractions (0.875, 0.5, …) so that sums of them are exact and the asserted times need no
tolerance.
"""

from __future__ import annotations

import math

import pytest
import trio

from cache.cache import NO_PIN, CacheConfig, CacheEntry, Changes, TargetCache


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
    def test_cache_notes_operator_evictions_only_when_use_is_tracked(self):
        shared = TargetCache(CacheConfig(), track_use=True)
        shared.note_evicted(["a", "b"])
        shared.note_evicted(["b", "absent"])
        assert shared.take_evicted() == {"a", "b", "absent"}
        assert shared.take_evicted() == set()
        alone = make_cache()
        alone.note_evicted(["a"])
        assert alone.take_evicted() == set()

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


def persisted(timeout_ms: int = 0, max_entries: int = 100) -> TargetCache:
    return TargetCache(CacheConfig(persisted=True, timeout_ms=timeout_ms, max_entries=max_entries))


class TestPins:
    def test_a_pin_wins_over_the_entry_and_is_not_overwritten_by_a_policy_choice(self):
        cache = make_cache()
        cache.put("k", "b1", 0.0)
        cache.pin("k", "b2", 0.0)
        cache.put("k", "b3", 1.0)  # the policy's choice while the pin's target was bypassed
        assert cache.get("k", 2.0) == "b2"
        assert cache.entry("k", 2.0) == CacheEntry(
            key="k", node_id="b2", idle_s=0.0, expires_in_s=None, pinned=True
        )

    def test_a_pin_ends_at_its_time_and_ignores_the_timeout(self):
        cache = make_cache(timeout_ms=1000)
        cache.pin("k", "b2", 0.0, until=5.0)
        assert cache.get("k", 4.5) == "b2"  # past the timeout, before the pin's end
        entry = cache.entry("k", 4.5)
        assert entry is not None
        assert entry.expires_in_s == 0.5
        assert cache.get("k", 5.0) is None
        assert len(cache) == 0

    def test_a_pin_is_not_evicted_to_make_room(self):
        cache = TargetCache(CacheConfig(max_entries=1))
        cache.pin("p", "b1", 0.0)
        cache.put("a", "b2", 1.0)
        cache.put("b", "b2", 2.0)
        assert cache.entries(3.0) == {"p": "b1", "b": "b2"}

    def test_a_pin_must_end_after_now(self):
        with pytest.raises(ValueError, match="a pin must end after now, got 0 s from now"):
            make_cache().pin("k", "b", 1.0, until=1.0)

    def test_purge_drops_ended_pins(self):
        cache = make_cache()
        cache.pin("k", "b", 0.0, until=1.0)
        assert cache.purge_expired(1.0) == 1
        assert len(cache) == 0


class TestOperations:
    def test_evict_target_and_clear(self):
        cache = make_cache()
        for i, node in enumerate(["b1", "b2", "b1"]):
            cache.put(f"k{i}", node, 0.0)
        cache.pin("p", "b1", 0.0)
        assert cache.evict_target("b1") == ["k0", "k2", "p"]
        assert cache.entries(0.0) == {"k1": "b2"}
        assert cache.clear() == ["k1"]
        assert len(cache) == 0

    def test_listing_pages_in_key_order_with_filters(self):
        cache = make_cache(timeout_ms=1000)
        for key, node in [("c", "b1"), ("a", "b1"), ("ab", "b2"), ("b", "b1"), ("old", "b1")]:
            cache.put(key, node, 0.0 if key == "old" else 0.5)
        cache.pin("ap", "b2", 0.5)
        page = [e.key for e in cache.listing(1.25, limit=2)]
        assert page == ["a", "ab"]
        assert [e.key for e in cache.listing(1.25, after="ab", limit=10)] == ["ap", "b", "c"]  # "old" expired
        assert [e.key for e in cache.listing(1.25, prefix="a")] == ["a", "ab", "ap"]
        assert [e.key for e in cache.listing(1.25, node_id="b2")] == ["ab", "ap"]
        [entry] = cache.listing(1.25, prefix="c")
        assert entry == CacheEntry(key="c", node_id="b1", idle_s=0.75, expires_in_s=0.25)

    def test_hits_and_misses_are_counted(self):
        cache = make_cache(timeout_ms=1000)
        cache.put("k", "b", 0.0)
        cache.get("k", 0.5)
        cache.get("k", 2.0)  # expired
        cache.get("x", 2.0)
        assert (cache.hits, cache.misses) == (1, 2)


class TestJournal:
    def test_not_persisted_journals_nothing(self):
        cache = make_cache()
        cache.put("k", "b", 0.0)
        assert cache.take_changes(0.0) == Changes()

    def test_journal_holds_the_last_change_of_each_key(self):
        cache = persisted()
        cache.put("k", "b1", 0.0)
        cache.get("k", 0.5)
        cache.put("gone", "b1", 0.5)
        cache.evict("gone")
        cache.pin("p", "b2", 0.5, until=9.0)
        assert cache.take_changes(1.0) == Changes(
            {"k": ("b1", 0.5, NO_PIN), "gone": None, "p": ("b2", 0.5, 9.0)}
        )
        assert cache.take_changes(1.0) == Changes()

    def test_replacing_an_entry_keeps_it_persisted(self):
        """SPEC A5: Artemis's bug was to drop a replaced entry from its journal."""
        cache = persisted()
        cache.put("k", "b1", 0.0)
        cache.take_changes(0.0)
        cache.put("k", "b2", 1.0)
        assert cache.take_changes(1.0) == Changes({"k": ("b2", 1.0, NO_PIN)})

    def test_expiry_eviction_and_lru_are_journaled_as_gone(self):
        cache = persisted(timeout_ms=1000, max_entries=1)
        cache.put("a", "b1", 0.0)
        cache.put("b", "b1", 0.25)  # evicts a
        cache.take_changes(0.25)
        assert cache.purge_expired(2.0) == 1
        assert cache.take_changes(2.0) == Changes({"b": None})

    def test_an_overflowing_journal_becomes_the_whole_cache(self):
        cache = persisted(max_entries=2)
        for i in range(5):  # 5 keys changed, journal_max = 4
            cache.put(f"k{i}", "b", float(i))
        cache.pin("p", "b2", 4.0)
        assert cache.take_changes(9.0) == Changes(
            {"k3": ("b", 3.0, NO_PIN), "k4": ("b", 4.0, NO_PIN), "p": ("b2", 9.0, math.inf)}, full=True
        )
        cache.put("k5", "b", 10.0)
        assert cache.take_changes(10.0).full is False

    def test_resync_makes_the_next_take_whole(self):
        cache = persisted()
        cache.put("k", "b", 0.0)
        cache.take_changes(0.0)
        cache.resync()
        cache.get("k", 1.0)
        assert cache.take_changes(1.0) == Changes({"k": ("b", 1.0, NO_PIN)}, full=True)

    def test_restore_leaves_out_expired_entries_ended_pins_and_the_oldest_beyond_the_bound(self):
        cache = persisted(timeout_ms=1000, max_entries=2)
        rows = [
            ("stale", ("b1", 0.0, NO_PIN)),
            ("ended", ("b1", 0.5, 1.0)),
            ("a", ("b1", 9.25, NO_PIN)),
            ("b", ("b2", 9.5, NO_PIN)),
            ("pin", ("b2", 9.5, math.inf)),
            ("c", ("b2", 9.75, NO_PIN)),
        ]
        assert cache.restore(rows, 10.0) == 3
        assert cache.entries(10.0) == {"b": "b2", "c": "b2", "pin": "b2"}
        assert cache.take_changes(10.0) == Changes({"stale": None, "ended": None, "a": None})
        cache.put("d", "b1", 10.0)  # the least recently used restored entry goes first
        assert cache.entries(10.0) == {"c": "b2", "d": "b1", "pin": "b2"}
