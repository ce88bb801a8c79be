"""Tests for router/features/shared_cache/service.py against a real ZooKeeper (one per test session, a path
per test): claims that race, another router's change followed through a watch, expiry extended by
use and swept, an operator's eviction deleted, and a reconcile after decisions made alone.

Two `SharedCache`s over two `RouterRuntime`s stand for two routers (each with its own kazoo
session); their targets are marked ready by hand, as the first probe would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

import trio

from cache import CacheConfig
from keys import ConnectionFacts, KeyType
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import Config, RouterConfig, ZooKeeperConfig
from router.features.cache.service import cache_entries, cache_evict
from router.features.shared_cache.service import SharedCache
from router.features.shared_cache.znodes import UNANSWERED, SharedEntry, znode_of
from router.metrics import Metrics
from router.runtime import RouterRuntime, decide

NODES = ("b1", "b2", "b3")


def _runtime(timeout_ms: int, zookeeper: ZooKeeperConfig, max_entries: int = 100_000) -> RouterRuntime:
    connectors = tuple(
        Connector.from_url(n, f"tcp://127.0.0.1:{21100 + i}?nodeId={n}") for i, n in enumerate(NODES)
    )
    router = RouterConfig(
        name="r",
        key_type=KeyType.CLIENT_ID,
        cache=CacheConfig(timeout_ms=timeout_ms, max_entries=max_entries),
        cache_zookeeper=zookeeper,
        policy=PolicyConfig(name="ROUND_ROBIN"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=NODES),
    )
    runtime = RouterRuntime(
        Config(source="t.xml", connectors=connectors, routers=(router,)), router, Metrics()
    )
    for node in NODES:
        runtime.pool.record_check(node, True)
    return runtime


async def _routers(
    nursery: trio.Nursery, connect: str, timeout_ms: int = 600_000
) -> tuple[SharedCache, SharedCache]:
    zookeeper = ZooKeeperConfig(
        connect=connect, path=f"/test-{uuid.uuid4().hex[:8]}", session_timeout_ms=4000
    )
    shared = []
    for _ in range(2):
        runtime = _runtime(timeout_ms, zookeeper)
        cache = SharedCache(runtime, zookeeper)
        runtime.held().resolver = cache.resolve
        await nursery.start(cache.serve)
        shared.append(cache)
    await _eventually(lambda: all(s.connected for s in shared))
    return shared[0], shared[1]


async def _eventually(done: Callable[[], object]) -> None:
    """Poll `done` (state that kazoo's threads and other tasks change) until true, or fail after
    10 s."""
    with trio.fail_after(10):
        while True:
            result = done()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return
            await trio.sleep(0.02)


async def test_the_first_claim_wins_and_the_second_router_adopts_it(nursery, zookeeper):
    a, b = await _routers(nursery, zookeeper.connect)
    assert await a.lookup("k") is None
    won = await a.claim("k", "b2")
    assert won is not None
    assert won.node_id == "b2"
    assert await b.lookup("k") == SharedEntry(node_id="b2", until=won.until, version=0)
    assert b.known["k"].node_id == "b2"
    # b, deciding "k" without having read it (a race), claims b3: it finds a's entry and adopts it.
    del b.known["k"]
    lost = await b.claim("k", "b3")
    assert lost is not None
    assert lost.node_id == "b2"


async def test_a_decision_through_the_runtime_adopts_the_winner_and_counts_it(nursery, zookeeper):
    a, b = await _routers(nursery, zookeeper.connect)
    await a.claim("k", "b3")
    # b's own cache holds nothing for "k": its decision reads the shared entry and follows it.
    decision = await decide(b.runtime, ConnectionFacts(client_id="k"))
    assert decision.target is not None
    assert decision.target.node_id == "b3"
    assert cache_entries(b.runtime) == {"k": "b3"}


async def test_another_routers_overwrite_reaches_the_holder_through_its_watch(nursery, zookeeper):
    a, b = await _routers(nursery, zookeeper.connect)
    await a.claim("k", "b1")
    await decide(b.runtime, ConnectionFacts(client_id="k"))
    assert cache_entries(b.runtime) == {"k": "b1"}
    # A live entry on a ready target is never overwritten...
    kept = await a.claim("k", "b2")
    assert kept is not None
    assert kept.node_id == "b1"
    # ...but once b1 is not ready for a, a overwrites it with b2 (version-checked).
    a.runtime.pool.record_check("b1", False)
    taken = await a.claim("k", "b2")
    assert taken is not None
    assert taken.node_id == "b2"
    await _eventually(lambda: cache_entries(b.runtime) == {"k": "b2"})


async def test_use_extends_the_entry_and_the_sweep_deletes_it_once_expired(nursery, zookeeper):
    a, _b = await _routers(nursery, zookeeper.connect, timeout_ms=2000)
    await decide(a.runtime, ConnectionFacts(client_id="k"))  # a miss: the policy's pick, claimed
    first = a.known["k"]
    assert first.until is not None
    await trio.sleep(1.2)  # less than half of the 2 s left
    hit_at = time.time()
    await decide(a.runtime, ConnectionFacts(client_id="k"))  # a hit: the key is used
    # Extended for this use (the first decision's use may have been extended before the hit, which
    # then waits for a later touch that finds it due): no use is left to extend it again.
    await _eventually(lambda: (a.known["k"].until or 0) >= hit_at + 2.0)
    extended = a.known["k"]
    assert extended.until is not None
    assert extended.until > first.until
    path = znode_of(a.path, "k")
    bucket = int(path.split("/")[-2], 16)
    await a.sweep(bucket)  # not expired: stays
    assert await trio.to_thread.run_sync(a.client.read, path) is not None
    await trio.sleep(extended.until - time.time() + 0.1)  # not used any more: expired
    await a.sweep(bucket)
    assert await trio.to_thread.run_sync(a.client.read, path) is None


async def test_an_operators_eviction_is_deleted_in_zookeeper(nursery, zookeeper):
    a, b = await _routers(nursery, zookeeper.connect)
    await a.claim("k", "b1")
    await decide(a.runtime, ConnectionFacts(client_id="k"))
    assert cache_evict(a.runtime, key="k") == 1

    async def gone() -> bool:
        return await b.lookup("k") is None

    await _eventually(gone)


async def test_keys_decided_alone_are_claimed_when_zookeeper_answers(nursery, zookeeper):
    a, b = await _routers(nursery, zookeeper.connect)
    b.connected = False  # as while the session is suspended
    assert await b.lookup("k") is UNANSWERED
    decision = await decide(b.runtime, ConnectionFacts(client_id="k"))  # b decides alone
    assert decision.target is not None
    assert b.unsynced == {"k"}
    elsewhere = next(n for n in NODES if n != decision.target.node_id)
    assert await a.claim("k", elsewhere) is not None  # a decided differently meanwhile
    b.connected = True  # ZooKeeper answers again; the session never changed
    await _eventually(lambda: cache_entries(b.runtime) == {"k": elsewhere})  # the touch loop reconciled
    assert b.unsynced == set()
    assert 'router_cache_shared_conflicts_total{router="r"} 1.0' in b.runtime.metrics.exposition().decode()


def test_wall_clock_is_what_entries_expire_by():
    entry = SharedEntry(node_id="b", until=time.time() - 1)
    assert entry.expired(time.time())


async def test_entries_evicted_here_to_make_room_leave_zookeeper_unless_used_elsewhere(nursery, zookeeper):
    """Keys a client invents stay bounded in ZooKeeper too: an entry that this router's cache (of
    one entry here) dropped for a new key is deleted, unless another router changed it since."""
    a, _b = await _routers(nursery, zookeeper.connect)
    config = ZooKeeperConfig(connect=zookeeper.connect, path=a.path, session_timeout_ms=4000)
    small = _runtime(600_000, config, max_entries=1)
    shared = SharedCache(small, config)
    small.held().resolver = shared.resolve
    await nursery.start(shared.serve)
    await _eventually(lambda: shared.connected)

    def read(key: str) -> tuple[bytes, int] | None:
        return a.client.read(znode_of(a.path, key))

    await decide(small, ConnectionFacts(client_id="first"))
    await decide(small, ConnectionFacts(client_id="kept"))  # drops "first"

    async def first_gone() -> bool:
        return await trio.to_thread.run_sync(read, "first") is None

    await _eventually(first_gone)
    found = await trio.to_thread.run_sync(read, "kept")
    assert found is not None
    path = znode_of(a.path, "kept")
    await trio.to_thread.run_sync(a.client.update, path, found[0], -1)  # another router extends it
    await decide(small, ConnectionFacts(client_id="second"))  # drops "kept"
    await _eventually(lambda: "kept" not in shared.known)  # the touch loop took the drop
    await decide(small, ConnectionFacts(client_id="third"))  # drops "second", which nobody changed

    async def second_gone() -> bool:
        return await trio.to_thread.run_sync(read, "second") is None

    await _eventually(second_gone)  # a later touch than the one that handled "kept"
    assert await trio.to_thread.run_sync(read, "kept") is not None


async def test_evictions_waiting_for_zookeeper_are_bounded_by_max_entries(nursery, zookeeper):
    """While ZooKeeper does not answer, the operators' evictions still to be deleted there are kept
    up to `max-entries`; beyond, an eviction's znode is left to expire (the sweep deletes it)."""
    a, _b = await _routers(nursery, zookeeper.connect)
    config = ZooKeeperConfig(connect=zookeeper.connect, path=a.path, session_timeout_ms=4000)
    small = _runtime(2000, config, max_entries=2)  # touched every 0.5 s
    shared = SharedCache(small, config)
    small.held().resolver = shared.resolve
    await nursery.start(shared.serve)
    await _eventually(lambda: shared.connected)
    shared.connected = False  # as while the session is suspended
    for i in range(6):
        await decide(small, ConnectionFacts(client_id=f"k{i}"))
        assert cache_evict(small, key=f"k{i}") == 1
    await _eventually(lambda: len(shared.evicted) == 2)
    await trio.sleep(1.2)  # two more touches: still at the bound
    assert len(shared.evicted) == 2
