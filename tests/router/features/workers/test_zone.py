"""The workers' shared zone (router/features/workers/zone.py and _zone.c).

`ZoneCache` is checked against `TargetCache`, its reference, by running both through the same
random operations; the zone's sharing by real processes: a zone attached in another process,
two processes taking ROUND_ROBIN turns and writing the cache at once, a process killed while it
hammers the zone (the robust lock), and two routing engines in two processes that send 1,000
client ids to the same brokers (ROUND_ROBIN and CONSISTENT_HASH).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.cache import CacheConfig, TargetCache
from router.core.engine import DecisionReason
from router.features.workers import zone as zone_module
from router.features.workers.zone import ZONE_CACHE_RULE, ZoneCache, join_zone, make_zone

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pools.target import Target

ROOT = Path(__file__).resolve().parents[4]
_zone = zone_module.EXTENSION


def test_the_zone_is_built() -> None:
    """./run-tests builds the extension: the zone's tests never skip for want of it."""
    assert _zone is not None


def _pair(timeout_ms: int, max_entries: int) -> tuple[TargetCache, ZoneCache]:
    config = CacheConfig(timeout_ms=timeout_ms, max_entries=max_entries)
    return TargetCache(config), ZoneCache(config, make_zone(config, 1), offset=1000.0)


_KEYS = st.sampled_from(["a", "b", "c", "d", "e", "é-ünïcode", "x" * 300, "y" * 300])
_NODES = st.sampled_from(["n1", "n2", "n3"])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("get"), _KEYS),
        st.tuples(st.just("put"), _KEYS, _NODES),
        st.tuples(st.just("fresh_touch"), _KEYS),
        st.tuples(st.just("evict"), _KEYS),
        st.tuples(st.just("evict_target"), _NODES),
        st.tuples(st.just("pin"), _KEYS, _NODES, st.sampled_from([0.5, 3.0, math.inf])),
        st.tuples(
            st.just("purge"),
        ),
        st.tuples(
            st.just("clear"),
        ),
        st.tuples(st.just("wait"), st.sampled_from([0.25, 1.0, 2.5])),
    ),
    max_size=60,
)


class TestZoneCacheIsATargetCache:
    @settings(max_examples=300, deadline=None)
    @given(ops=_OPS, timeout_ms=st.sampled_from([0, 1000, 2000]), max_entries=st.integers(1, 4))
    def test_same_answers_entries_and_counts_as_the_reference(
        self, ops: list[tuple[object, ...]], timeout_ms: int, max_entries: int
    ) -> None:
        """Every operation answers the same on both, and after each the live entries, the size,
        the hits, misses and evictions, a listing and an entry's view are the same (the zone keeps
        its times in another clock: `offset`)."""
        reference, zoned = _pair(timeout_ms, max_entries)
        now = 0.0
        for op in ops:
            name = op[0]
            if name == "wait":
                now += float(op[1])  # type: ignore[arg-type]
                continue
            answers: list[object] = []
            for cache in (reference, zoned):
                if name == "get":
                    answers.append(cache.get(str(op[1]), now))
                elif name == "put":
                    cache.put(str(op[1]), str(op[2]), now)
                elif name == "fresh_touch":  # what the engine's plain decisions do
                    found = cache.fresh(str(op[1]), now)
                    if found is not None:
                        cache.touch(str(op[1]), found, now)
                    answers.append(found)
                elif name == "evict":
                    answers.append(cache.evict(str(op[1])))
                elif name == "evict_target":
                    answers.append(_listed(cache.evict_target(str(op[1]))))
                elif name == "pin":
                    cache.pin(str(op[1]), str(op[2]), now, now + float(op[3]))  # type: ignore[arg-type]
                elif name == "purge":
                    answers.append(cache.purge_expired(now))
                else:
                    answers.append(_listed(cache.clear()))
            assert answers[: len(answers) // 2] == answers[len(answers) // 2 :], (op, answers)
            _assert_same(reference, zoned, now)

    def test_a_persisted_cache_is_refused(self) -> None:
        config = CacheConfig(persisted=True, file="/tmp/x.db")
        with pytest.raises(ValueError, match=ZONE_CACHE_RULE):
            make_zone(config, 1)


def _listed(keys: list[str]) -> list[str]:
    """Keys as the zone lists them (a long key by its prefix), sorted."""
    assert _zone is not None
    return sorted(key[: _zone.KEY_INLINE] for key in keys)


def _short(entries: dict[str, str]) -> dict[str, str]:
    assert _zone is not None
    return {key[: _zone.KEY_INLINE]: node for key, node in entries.items()}


def _assert_same(reference: TargetCache, zoned: ZoneCache, now: float) -> None:
    assert _short(reference.entries(now)) == zoned.entries(now)
    assert len(reference) == len(zoned)
    counts = (reference.hits, reference.misses, reference.evictions)
    assert counts == (zoned.hits, zoned.misses, zoned.evictions)
    for key in ("a", "b", "x" * 300):
        assert reference.node_of(key) == zoned.node_of(key)
        assert reference.is_pinned(key) == zoned.is_pinned(key)
        assert reference.fresh(key, now) == zoned.fresh(key, now)
    assert reference.entry("a", now) == zoned.entry("a", now)
    page = [{**e.to_json(), "key": e.key[: _zone.KEY_INLINE]} for e in reference.listing(now, limit=3)]
    assert page == [e.to_json() for e in zoned.listing(now, limit=3)]


class TestZoneLimits:
    def test_pins_beyond_the_bound_are_refused_and_nothing_else_changes(self) -> None:
        assert _zone is not None
        zone = _zone.Zone(2, max_pins=1)
        zone.pin("p", "n1", 0.0, math.inf)
        with pytest.raises(_zone.ZoneError, match="1 pins at most"):
            zone.pin("q", "n1", 0.0, math.inf)
        zone.pin("p", "n2", 0.0, 5.0)  # re-pinning a pinned key is no new pin
        assert zone.peek("p") == ("n2", 0.0, 5.0)
        assert zone.counts()[:2] == (0, 1)

    def test_bad_arguments_are_refused_with_the_rule(self) -> None:
        assert _zone is not None
        with pytest.raises(ValueError, match="max_entries must be 1"):
            _zone.Zone(0)
        with pytest.raises(ValueError, match="timeout_s must be a finite number >= 0"):
            _zone.Zone(1, -1.0)
        with pytest.raises(ValueError, match=r"routers must be 1\.\.256"):
            _zone.Zone(1, routers=0)
        zone = _zone.Zone(1)
        with pytest.raises(ValueError, match="a node id is at most 255 bytes"):
            zone.put("k", "n" * 256, 0.0)
        with pytest.raises(ValueError, match="a time is a number, got nan"):
            zone.get("k", math.nan)
        with pytest.raises(IndexError, match=r"router index 1 is not in 0\.\.0"):
            zone.round_robin(1, 3)
        with pytest.raises(ValueError, match="n must be > 0"):
            zone.round_robin(0, 0)

    def test_node_ids_are_bounded(self) -> None:
        assert _zone is not None
        zone = _zone.Zone(10)
        for i in range(_zone.NODES_MAX):
            zone.put("k", f"n{i}", 0.0)
        with pytest.raises(_zone.ZoneError, match=f"{_zone.NODES_MAX} node ids at most"):
            zone.put("k", "one-more", 0.0)
        assert zone.get("k", 0.0) == f"n{_zone.NODES_MAX - 1}"

    def test_a_descriptor_that_is_not_a_zone_is_refused(self, tmp_path: Path) -> None:
        assert _zone is not None
        path = tmp_path / "not-a-zone"
        path.write_bytes(b"\0" * 4096)
        with path.open("rb+") as file, pytest.raises(_zone.ZoneError, match="is not a zone"):
            _zone.Zone.attach(file.fileno())

    def test_many_keys_stay_within_the_bound_and_the_rest_is_found(self) -> None:
        assert _zone is not None
        zone = _zone.Zone(1000)
        for i in range(5000):
            zone.put(f"client-{i}", f"n{i % 3}", float(i))
        assert zone.counts()[0] == 1000
        assert zone.counts()[4] == 4000
        assert all(zone.get(f"client-{i}", 5000.0) == f"n{i % 3}" for i in range(4000, 5000))
        assert zone.get("client-3999", 5000.0) is None


def _run(script: str, zone_fd: int, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """A Python process running `script` with the zone's descriptor (argv[1]) and `args`. It runs
    in this process's directory and environment (so the sanitized run's processes load the
    sanitized zone), with the tree on its path."""
    path = os.environ.get("PYTHONPATH")
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), str(zone_fd), *args],
        pass_fds=(zone_fd,),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (path, str(ROOT)) if p)},
    )


def _finish(process: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return out


_HAMMER = """
    import sys
    from router.features.workers._zone import Zone
    zone = Zone.attach(int(sys.argv[1]))
    me, turns = sys.argv[2], int(sys.argv[3])
    picks = []
    for i in range(turns):
        picks.append(zone.round_robin(0, 3))
        zone.put(f"{me}-{i % 500}", f"n{i % 7}", float(i))
        zone.get(f"{'ab'[me == 'a']}-{i % 500}", float(i))
        if i % 97 == 0:
            zone.evict(f"{me}-{(i * 7) % 500}")
    print(" ".join(map(str, picks)))
"""


class TestZoneAcrossProcesses:
    def test_another_process_sees_the_same_entries(self) -> None:
        assert _zone is not None
        zone = _zone.Zone(100, 10.0)
        zone.put("client-1", "n1", 5.0)
        reader = _run(
            """
            import sys
            from router.features.workers._zone import Zone
            zone = Zone.attach(int(sys.argv[1]))
            print(zone.get("client-1", 6.0))
            zone.put("client-2", "n2", 6.0)
            """,
            zone.fileno(),
        )
        assert _finish(reader).strip() == "n1"
        assert zone.get("client-2", 7.0) == "n2"
        assert zone.peek("client-1") == ("n1", 6.0, None)  # the other process's read refreshed it

    def test_two_processes_take_round_robin_turns_and_write_the_cache_at_once(self) -> None:
        """20,000 turns by two processes at once: every index comes up equally often (Artemis's
        sequence, taken in turns) and the cache's links and counts hold (each key put is found or
        was evicted; the entries listed are the entries counted)."""
        assert _zone is not None
        zone = _zone.Zone(600)
        turns = 10_000
        processes = [_run(_HAMMER, zone.fileno(), me, str(turns)) for me in ("a", "b")]
        picks = Counter(int(p) for process in processes for p in _finish(process).split())
        assert sum(picks.values()) == 2 * turns
        assert max(picks.values()) - min(picks.values()) <= 1, picks
        entries, _, hits, misses, _ = zone.counts()
        assert entries == len(zone.items()) <= 600
        assert hits + misses == 2 * turns
        for key, node, _, _, _ in zone.items():
            assert zone.get(key, 1e9) == node

    def test_a_process_that_dies_holding_the_lock_leaves_the_zone_usable(self) -> None:
        """A process takes the cache's lock and is killed: the next taker gets the lock (a robust
        mutex) and the zone answers, in another process and in this one."""
        assert _zone is not None
        zone = _zone.Zone(200)
        zone.put("before", "n2", 0.0)
        holder = _run(
            """
            import sys, time
            from router.features.workers._zone import Zone
            zone = Zone.attach(int(sys.argv[1]))
            zone.hold()
            print("held", flush=True)
            time.sleep(60)
            """,
            zone.fileno(),
        )
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate(timeout=10)
        checker = _run(
            """
            import sys
            from router.features.workers._zone import Zone
            zone = Zone.attach(int(sys.argv[1]))
            zone.put("after", "n1", 1.0)
            print(zone.get("after", 1.0), zone.get("before", 1.0))
            """,
            zone.fileno(),
        )
        assert _finish(checker, timeout=20).split() == ["n1", "n2"]
        assert zone.get("after", 2.0) == "n1"

    def test_a_process_killed_while_it_hammers_the_zone_leaves_it_usable(self) -> None:
        """SIGKILL at moments of a process that takes the zone's lock some 100,000 times a second:
        every later taker gets it, and the entries stay within the bound."""
        assert _zone is not None
        zone = _zone.Zone(200)
        for attempt in range(3):
            victim = _run(_HAMMER, zone.fileno(), "a", "100000000")
            time.sleep(0.2 + attempt * 0.05)
            os.kill(victim.pid, signal.SIGKILL)
            victim.communicate(timeout=10)
            zone.put("after", "n1", 1.0)
            assert zone.get("after", 1.0) == "n1"
            assert len(zone.items()) <= 200


_ENGINE = """
    import json, sys
    from router.features.workers._zone import Zone
    from router.features.workers.zone import join_zone
    from tests.router.core.test_engine import make_engine

    zone = Zone.attach(int(sys.argv[1]))
    engine = make_engine(policy=sys.argv[2], cache_timeout_ms=0)
    join_zone(engine, zone, 0)
    for line in sys.stdin:
        keys = json.loads(line)
        print(json.dumps([engine.decide(key, 0.0).target.node_id for key in keys]), flush=True)
"""


class TestEnginesSharingAZone:
    @pytest.mark.parametrize("policy", ["ROUND_ROBIN", "CONSISTENT_HASH"])
    def test_1000_client_ids_land_on_the_same_broker_whichever_process_decides(self, policy: str) -> None:
        """Two processes, each a router's engine joined to one zone, deciding at the same time:
        each of 1,000 client ids first by one process, then by the other, then by both. Every id
        lands on one broker all four times; ROUND_ROBIN spread the first choices evenly (its turns
        are taken from one position)."""
        assert _zone is not None
        zone = make_zone(CacheConfig(), 1)
        keys = [f"client-{i}" for i in range(1000)]
        even, odd = keys[0::2], keys[1::2]
        seen = _decide_in_two_processes(zone.fileno(), policy, keys, [(even, odd), (odd, even), (keys, keys)])
        for key, nodes in seen.items():
            assert len(set(nodes)) == 1, (key, nodes)
        assert all(len(nodes) == 4 for nodes in seen.values())
        spread = Counter(nodes[0] for nodes in seen.values())
        if policy == "ROUND_ROBIN":
            assert sorted(spread.values()) == [333, 333, 334], spread
        else:
            assert len(spread) == 3, spread

    def test_two_processes_deciding_the_same_new_keys_at_once_agree(self) -> None:
        """Both processes decide all 1,000 new client ids at the same time (in opposite orders, so
        that they meet around the middle), then all again: every key has one broker in all four
        decisions. (How the two decisions of one key at the same instant agree is
        `TestClaim.test_an_engine_takes_the_choice_another_wrote_while_it_decided`.)"""
        zone = make_zone(CacheConfig(), 1)
        keys = [f"client-{i}" for i in range(1000)]
        seen = _decide_in_two_processes(
            zone.fileno(), "ROUND_ROBIN", keys, [(keys, keys[::-1]), (keys, keys)]
        )
        split = {key: nodes for key, nodes in seen.items() if len(set(nodes)) != 1}
        assert split == {}
        assert all(len(nodes) == 4 for nodes in seen.values())


class TestClaim:
    def test_a_write_over_what_was_read_only(self) -> None:
        assert _zone is not None
        zone = _zone.Zone(10)
        assert zone.put("k", "n1", 0.0, None) is True
        assert zone.put("k", "n2", 0.0, None) is False  # another wrote n1 since "none" was read
        assert zone.put("k", "n2", 0.0, "n3") is False
        assert zone.put("k", "n2", 0.0, "n1") is True
        assert zone.peek("k") == ("n2", 0.0, None)
        zone.pin("p", "n1", 0.0, math.inf)
        assert zone.put("p", "n2", 0.0, "n1") is False  # a pin is no entry to write over
        assert zone.put("p", "n2", 0.0, None) is True  # and keeps its node, as put
        assert zone.peek("p") == ("n1", 0.0, math.inf)

    def test_claim_takes_another_writers_usable_choice(self) -> None:
        config = CacheConfig(timeout_ms=1000)
        cache = ZoneCache(config, make_zone(config, 1))
        assert cache.claim("k", "n1", 0.0, lambda _: True) == "n1"
        assert cache.claim("k", "n2", 0.5, lambda node: node == "n1") == "n1"  # n1 takes keys: kept
        assert cache.claim("k", "n2", 0.5, lambda _: False) == "n2"  # n1 does not: overwritten
        assert cache.fresh("k", 0.5) == "n2"
        assert cache.claim("k", "n3", 2.0, lambda _: True) == "n3"  # n2's entry expired
        reference = TargetCache(config)
        assert reference.claim("k", "n1", 0.0, lambda _: False) == "n1"
        assert reference.claim("k", "n2", 0.0, lambda _: True) == "n2"  # no other writer: put

    @pytest.mark.parametrize("plain", [False, True])
    def test_an_engine_takes_the_choice_another_wrote_while_it_decided(self, plain: bool) -> None:
        """Two engines on one zone (two workers); engine B decides each new key while engine A's
        policy is choosing for it (as B's process would at the same instant): A's write finds B's
        entry and A sends the key where B did, by `begin`'s path and by the plain one; ROUND_ROBIN
        gave A the next turn, another target, so without the check A would have split the key."""
        from tests.router.core.test_engine import make_engine

        zone = make_zone(CacheConfig(), 1)
        first, second = (make_engine(policy="ROUND_ROBIN", cache_timeout_ms=0) for _ in range(2))
        for engine in (first, second):
            join_zone(engine, zone, 0)
        assert first.policy is not None
        choose = first.policy.select
        others: dict[str, str] = {}

        def meanwhile(targets: Sequence[Target], key: str) -> Target | None:
            decision = second.decide(key, 0.0)
            assert decision.target is not None
            others[key] = decision.target.node_id
            return choose(targets, key)

        first.policy.select = meanwhile  # type: ignore[method-assign]
        for i in range(30):
            key = f"k{i}"
            if plain:
                decided = first.plain(key, 0.0)
                assert decided is not None
                node, reason = decided[0].node_id, decided[2]
            else:
                decision = first.decide(key, 0.0)
                assert decision.target is not None
                node, reason = decision.target.node_id, decision.reason
            assert node == others[key]
            assert reason is DecisionReason.CACHE
            assert zone.peek(key) == (node, 0.0, None)


class TestJoinZone:
    def test_a_joined_engine_takes_turns_from_the_zone_and_a_dry_run_moves_nothing(self) -> None:
        from tests.router.core.test_engine import make_engine

        zone = make_zone(CacheConfig(), 1)
        zone.set_position(0, 7)
        engine = make_engine(policy="ROUND_ROBIN", cache_timeout_ms=0)
        join_zone(engine, zone, 0)
        assert isinstance(engine.cache, ZoneCache)
        before = zone.position(0)
        assert engine.decide("k1", 0.0, dry_run=True).target is not None
        assert zone.position(0) == before
        assert engine.cache.get("k1", 0.0) is None  # a dry run caches nothing
        decision = engine.decide("k1", 0.0)
        assert zone.position(0) == before % 3 + 1
        assert zone.peek("k1") == (decision.target.node_id, 0.0, None)  # type: ignore[union-attr]


def _decide_in_two_processes(
    zone_fd: int, policy: str, keys: list[str], passes: Sequence[tuple[list[str], list[str]]]
) -> dict[str, list[str]]:
    """The keys decided by two processes, both at once in each pass (each its list of keys);
    key -> the node ids of its decisions."""
    processes = [_run(_ENGINE, zone_fd, policy, stdin=subprocess.PIPE) for _ in range(2)]
    seen: dict[str, list[str]] = {key: [] for key in keys}
    try:
        for orders in passes:
            for process, order in zip(processes, orders, strict=True):
                assert process.stdin is not None
                process.stdin.write(json.dumps(order) + "\n")
                process.stdin.flush()
            for process, order in zip(processes, orders, strict=True):
                assert process.stdout is not None
                line = process.stdout.readline()
                assert line, process.communicate()[1][-3000:]
                for key, node in zip(order, json.loads(line), strict=True):
                    seen[key].append(node)
        for process in processes:
            assert process.stdin is not None
            process.stdin.close()
            assert process.wait(timeout=60) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
    return seen
