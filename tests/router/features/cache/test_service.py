"""The cache feature's slice of a router at run time (list, show, evict, pin), on trio's virtual
clock, and its sweep of expired entries."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from router.features.cache.service import (
    CachePurge,
    cache_entries,
    cache_entry,
    cache_evict,
    cache_listing,
    cache_pin,
    serve_cache_purge,
)
from tests.router.runtime.test_kernel import make_runtime


async def test_serve_cache_purge_drops_expired_entries(autojump_clock: trio.testing.MockClock) -> None:
    runtime = make_runtime(cache_ms=2000)
    runtime.pool.record_check("b1", True)
    runtime.lookup("k")  # cached at t=0
    with trio.move_on_after(1.9):
        await serve_cache_purge(runtime)
    assert runtime.status().cache_entries == 1
    with trio.move_on_after(2.2):  # the sweep at t=3.9 finds the entry 3.9 s old
        await serve_cache_purge(runtime)
    assert runtime.status().cache_entries == 0


async def test_the_purge_service_returns_at_once_without_a_timeout() -> None:
    """A cache that never expires (and a router without a cache) has nothing to sweep: the
    service starts and ends, holding no task."""
    for runtime in (make_runtime(cache_ms=0), make_runtime()):
        with trio.fail_after(1):
            async with trio.open_nursery() as nursery:
                await nursery.start(CachePurge().serve_router, runtime)


async def test_pin_list_show_and_evict(autojump_clock: trio.testing.MockClock) -> None:
    runtime = make_runtime(cache_ms=10_000)
    runtime.pool.record_check("b1", True)
    runtime.lookup("a")
    pinned = cache_pin(runtime, "b", "b2", 5.0)
    assert (pinned.key, pinned.node_id, pinned.pinned, pinned.expires_in_s) == ("b", "b2", True, 5.0)
    assert cache_pin(runtime, "c", "b3").expires_in_s is None
    assert [e.key for e in cache_listing(runtime, limit=2)] == ["a", "b"]
    assert [e.key for e in cache_listing(runtime, node_id="b3")] == ["c"]
    entry = cache_entry(runtime, "a")
    assert entry is not None
    assert entry.node_id == "b1"
    assert cache_entries(runtime) == {"a": "b1", "b": "b2", "c": "b3"}
    assert cache_evict(runtime, node_id="b2") == 1
    assert cache_evict(runtime, key="a") == 1
    assert cache_evict(runtime, key="a") == 0
    assert cache_evict(runtime) == 1
    assert cache_entries(runtime) == {}


def test_pins_name_a_target_of_the_pool_and_a_positive_duration() -> None:
    runtime = make_runtime(cache_ms=10_000)
    with pytest.raises(
        ValueError, match=r"no target with node id 'b9' in the pool \(has \['b1', 'b2', 'b3'\]\)"
    ):
        cache_pin(runtime, "k", "b9")
    with pytest.raises(ValueError, match="a pin's duration must be > 0 seconds, got 0"):
        cache_pin(runtime, "k", "b1", 0)


def test_a_router_without_a_cache_says_so() -> None:
    runtime = make_runtime()
    with pytest.raises(LookupError, match="connection router 'r' has no <cache>"):
        cache_evict(runtime)
    assert cache_entries(runtime) == {}
