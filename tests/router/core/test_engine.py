"""Tests for router/core/engine.py: the SPEC A1 workflow, the A7 lookup, RouteDecision and build_pool.

Expected CONSISTENT_HASH / CONSISTENT_HASH_MODULO results are worked out by hand from hashes
computed with Java 17 (see tests/policies/test_hashing.py):
    broker1 774970719 < broker2 791748338 < broker3 808525957   (ring points)
    "key-320" 779799954 -> broker1    "key-319" 796430478 -> broker2    "key-0" 1491088857 -> broker3
    "client-42" 696160687 -> broker1 (wraps)    "FOO-1" -1838136627 -> broker1 (wraps)
    MODULO 3: "client-42" -> "1", "FOO-1" -> "2", "a" -> "2", "NULL" (963632676) -> "0"
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.cache import CacheConfig
from keys.resolve import NULL_KEY, ConnectionFacts, KeyType
from policies.policy import FirstElementPolicy, Policy, PolicyConfig
from pools.pool import AdminState, Pool, PoolConfig, PoolKind
from pools.target import Connector, Target
from router.config.settings import (
    ClusterConnectionConfig,
    Config,
    DiscoveryGroupConfig,
    RouterConfig,
    ZooKeeperConfig,
)
from router.core.engine import (
    DecisionReason,
    QuorumWait,
    RouteDecision,
    RouteStatus,
    RoutingEngine,
    SharedCacheWait,
    build_pool,
)
from tests.policies.test_policy import FakeCounts

if TYPE_CHECKING:
    from collections.abc import Sequence

INTERNAL = "$.artemis.internal.router.client."


def connector(name: str, node_id: str | None = None, host: str = "10.0.0.1", port: int = 61616) -> Connector:
    params = (("nodeId", node_id),) if node_id is not None else ()
    return Connector(name=name, host=host, port=port, params=params)


B1 = Target.remote(connector("artemis-1", "broker1", "10.0.0.1"))
B2 = Target.remote(connector("artemis-2", "broker2", "10.0.0.2"))
B3 = Target.remote(connector("artemis-3", "broker3", "10.0.0.3"))
LOCAL = Target.local_target(connector("here", "broker-local", "127.0.0.1"))


class RecordingPolicy(Policy):
    """FIRST_ELEMENT that records every `select` call (a fake, not a mock).

    It wraps rather than subclasses FirstElementPolicy: a subclass would inherit NAME and replace
    FIRST_ELEMENT in the policy registry.
    """

    def __init__(self) -> None:
        super().__init__({})
        self.inner = FirstElementPolicy({})
        self.calls: list[tuple[list[str], str]] = []

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        self.calls.append(([t.node_id for t in targets], key))
        return self.inner.select(targets, key)


def make_engine(
    *,
    policy: str | None = "FIRST_ELEMENT",
    properties: tuple[tuple[str, str], ...] = (),
    key_type: KeyType = KeyType.CLIENT_ID,
    key_filter: str | None = None,
    local_filter: str | None = None,
    cache_timeout_ms: int | None = None,
    targets: Sequence[Target] | None = (B1, B2, B3),
    ready: Sequence[str] | None = None,
    quorum: int = 1,
    round_robin_start: int = 0,
    counts: FakeCounts | None = None,
    quorum_timeout_ms: int = 0,
) -> RoutingEngine:
    """An engine over a pool of `targets` (None: no pool) with `ready` node ids ready (None: all)."""
    config = RouterConfig(
        name="r1",
        key_type=key_type,
        key_filter=key_filter,
        local_target_filter=local_filter,
        cache=CacheConfig(timeout_ms=cache_timeout_ms) if cache_timeout_ms is not None else None,
        policy=PolicyConfig(name=policy, properties=properties) if policy is not None else None,
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("unused",),
            quorum_size=quorum,
            quorum_timeout_ms=quorum_timeout_ms,
        ),
    )
    pool = None
    if targets is not None:
        pool = Pool("r1", quorum, targets)
        for t in targets:
            if ready is None or t.node_id in ready:
                pool.record_check(t.node_id, True)
    return RoutingEngine(config, pool, LOCAL, round_robin_start=round_robin_start, counts=counts)


def node(decision: RouteDecision) -> str | None:
    return None if decision.target is None else decision.target.node_id


def local_filter_of(engine: RoutingEngine) -> str | None:
    # A function call, so that mypy does not narrow the property to the value just assigned.
    return engine.local_target_filter


def client(client_id: str | None) -> ConnectionFacts:
    return ConnectionFacts(client_id=client_id, source_ip="10.9.0.1")


# -- step 0: internal client id --


class TestStep0InternalClientId:
    def test_route_internal_client_id_goes_local(self):
        engine = make_engine(cache_timeout_ms=0)
        decision = engine.route(client(INTERNAL + "router-2"), 0.0)
        assert decision.status is RouteStatus.OK
        assert decision.target is LOCAL
        assert decision.reason == DecisionReason.INTERNAL_CLIENT_ID
        assert engine.cache is not None
        assert engine.cache.entries(0.0) == {}

    def test_route_internal_client_id_goes_local_without_pool_or_policy(self):
        engine = make_engine(policy=None, targets=None)
        decision = engine.route(client(INTERNAL + "x"), 0.0)
        assert (decision.status, decision.target) == (RouteStatus.OK, LOCAL)

    def test_route_internal_client_id_wins_over_key_type_and_filter(self):
        """Scenario: key type SOURCE_IP and a key filter; the raw client id still decides step 0."""
        engine = make_engine(key_type=KeyType.SOURCE_IP, key_filter="^10[.]", ready=[])
        decision = engine.route(client(INTERNAL + "probe"), 0.0)
        assert (decision.status, decision.target) == (RouteStatus.OK, LOCAL)

    def test_route_internal_client_id_does_not_move_round_robin(self):
        engine = make_engine(policy="ROUND_ROBIN", round_robin_start=0)
        engine.route(client(INTERNAL + "probe"), 0.0)
        assert node(engine.route(client("c1"), 0.0)) == "broker1"

    def test_route_client_id_resembling_prefix_is_routed_normally(self):
        engine = make_engine()
        decision = engine.route(client("$.artemis.internal.router.clientX"), 0.0)
        assert node(decision) == "broker1"
        assert decision.target is not None
        assert decision.target.local is False


# -- steps 1-2: key and key filter --


class TestSteps1And2Key:
    def test_route_missing_key_is_null(self):
        engine = make_engine()
        decision = engine.route(client(None), 0.0)
        assert decision.key == NULL_KEY
        assert node(decision) == "broker1"

    def test_route_key_filter_whole_match(self):
        engine = make_engine(key_filter=r"FOO-(\d)")
        assert engine.route(client("xFOO-1-bar"), 0.0).key == "FOO-1"

    def test_route_key_filter_no_match_is_null(self):
        engine = make_engine(key_filter="FOO-[0-9]")
        assert engine.route(client("BAR-1"), 0.0).key == NULL_KEY

    def test_route_key_filter_not_applied_to_missing(self):
        """Scenario: filter "U" would find "U" in the literal "NULL"; a missing value stays NULL."""
        engine = make_engine(key_filter="U")
        assert engine.route(client(None), 0.0).key == NULL_KEY

    def test_route_default_key_type_is_source_ip(self):
        engine = RoutingEngine(
            RouterConfig(name="r1", policy=PolicyConfig(name="FIRST_ELEMENT")), None, LOCAL
        )
        decision = engine.route(ConnectionFacts(source_ip="[::ffff:10.1.2.3]", client_id="c"), 0.0)
        assert decision.key == "10.1.2.3"

    def test_connection_key_applies_filter_then_transform(self):
        engine = make_engine(
            policy="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),), key_filter="FOO-[0-9]"
        )
        assert engine.connection_key(client("zzFOO-1zz")) == "2"


# -- step 3: transform --


class TestStep3Transform:
    def test_route_modulo_transforms_key(self):
        engine = make_engine(policy="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),))
        assert engine.route(client("client-42"), 0.0).key == "1"
        assert engine.route(client("FOO-1"), 0.0).key == "2"
        assert engine.route(client("a"), 0.0).key == "2"

    def test_route_modulo_does_not_transform_null(self):
        """Scenario: transform("NULL") would be "0" and hit the local filter "0"; NULL is not
        transformed, so it misses the filter and the modulo policy refuses it."""
        engine = make_engine(policy="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),), local_filter="0")
        decision = engine.route(client(None), 0.0)
        assert decision.key == NULL_KEY
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    def test_route_other_policies_do_not_transform(self):
        for policy in ["FIRST_ELEMENT", "ROUND_ROBIN", "CONSISTENT_HASH", "LEAST_CONNECTIONS"]:
            assert make_engine(policy=policy).route(client("client-42"), 0.0).key == "client-42"

    def test_transform_without_policy_is_identity(self):
        assert make_engine(policy=None).transform("client-42") == "client-42"


# -- step 4: local-target filter --


class TestStep4LocalFilter:
    def test_route_local_filter_fullmatch_goes_local(self):
        engine = make_engine(local_filter="FOO-[0-9]")
        decision = engine.route(client("FOO-1"), 0.0)
        assert decision.status is RouteStatus.OK
        assert decision.target is LOCAL
        assert decision.reason == DecisionReason.LOCAL_TARGET_FILTER

    def test_route_local_filter_needs_full_match(self):
        """Scenario: "FOO" is found inside "FOO-1" but does not match all of it."""
        engine = make_engine(local_filter="FOO")
        assert node(engine.route(client("FOO-1"), 0.0)) == "broker1"
        assert node(engine.route(client("xFOO"), 0.0)) == "broker1"
        assert engine.route(client("FOO"), 0.0).target is LOCAL

    def test_route_local_filter_applies_to_null(self):
        engine = make_engine(local_filter="NULL|0")
        assert engine.route(client(None), 0.0).target is LOCAL

    def test_route_local_filter_after_modulo_transform(self):
        engine = make_engine(
            policy="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),), local_filter="NULL|1"
        )
        assert engine.route(client("client-42"), 0.0).target is LOCAL  # -> "1"
        assert engine.route(client(None), 0.0).target is LOCAL  # NULL
        refused = engine.route(client("FOO-1"), 0.0)  # -> "2": misses the filter, never selected
        assert (refused.key, refused.status) == ("2", RouteStatus.REFUSED_UNAVAILABLE)
        assert refused.target is None

    def test_route_local_filter_before_pool_and_policy_check(self):
        engine = make_engine(policy=None, targets=None, local_filter="local-.*")
        assert engine.route(client("local-7"), 0.0).target is LOCAL
        assert engine.route(client("remote-7"), 0.0).status is RouteStatus.REFUSED_USE_ANOTHER

    def test_route_local_filter_before_cache(self):
        engine = make_engine(cache_timeout_ms=0)
        assert node(engine.route(client("k"), 0.0)) == "broker1"
        engine.local_target_filter = "k"
        assert engine.route(client("k"), 0.0).target is LOCAL

    def test_route_local_filter_even_when_pool_not_ready(self):
        engine = make_engine(local_filter="NULL", ready=[])
        assert engine.route(client(None), 0.0).target is LOCAL


# -- step 5: no pool or no policy --


class TestStep5Refusal:
    def test_route_no_pool_refused_use_another(self):
        decision = make_engine(targets=None).route(client("c"), 0.0)
        assert decision.status is RouteStatus.REFUSED_USE_ANOTHER
        assert decision.target is None
        assert decision.key == "c"

    def test_route_no_policy_refused_use_another(self):
        decision = make_engine(policy=None).route(client("c"), 0.0)
        assert decision.status is RouteStatus.REFUSED_USE_ANOTHER

    def test_route_no_policy_even_with_cache_refused_use_another(self):
        engine = make_engine(policy=None, cache_timeout_ms=0)
        assert engine.cache is not None
        engine.cache.put("c", "broker1", 0.0)
        assert engine.route(client("c"), 0.0).status is RouteStatus.REFUSED_USE_ANOTHER


# -- step 6: cache --


class TestStep6Cache:
    def test_route_cache_hit_does_not_call_policy(self):
        engine = make_engine(cache_timeout_ms=0)
        recorder = RecordingPolicy()
        engine.policy = recorder
        first = engine.route(client("k"), 0.0)
        second = engine.route(client("k"), 1.0)
        assert node(first) == node(second) == "broker1"
        assert (first.reason, second.reason) == (DecisionReason.POLICY, DecisionReason.CACHE)
        assert recorder.calls == [(["broker1", "broker2", "broker3"], "k")]

    def test_route_cache_hit_keeps_round_robin_position(self):
        """Scenario: a cache hit does not consult ROUND_ROBIN, so the next new key gets the next target."""
        engine = make_engine(policy="ROUND_ROBIN", cache_timeout_ms=0, round_robin_start=0)
        assert node(engine.route(client("k1"), 0.0)) == "broker1"
        assert node(engine.route(client("k1"), 0.0)) == "broker1"
        assert node(engine.route(client("k1"), 0.0)) == "broker1"
        assert node(engine.route(client("k2"), 0.0)) == "broker2"

    def test_route_cache_hit_without_quorum_check(self):
        """Scenario: quorum 2; after two of three targets fail the pool hands out nothing, but a
        cached key still reaches its ready target."""
        engine = make_engine(cache_timeout_ms=0, quorum=2)
        assert node(engine.route(client("k"), 0.0)) == "broker1"
        assert engine.pool is not None
        engine.pool.record_check("broker2", False)
        engine.pool.record_check("broker3", False)
        assert engine.pool.routing_targets() == []
        hit = engine.route(client("k"), 1.0)
        assert (hit.status, node(hit), hit.reason) == (RouteStatus.OK, "broker1", DecisionReason.CACHE)
        miss = engine.route(client("other"), 1.0)
        assert miss.status is RouteStatus.REFUSED_UNAVAILABLE

    def test_route_cache_hit_refreshes_expiry(self):
        engine = make_engine(cache_timeout_ms=1000)
        assert engine.cache is not None
        engine.route(client("k"), 0.0)
        assert engine.route(client("k"), 0.75).reason == DecisionReason.CACHE
        assert engine.cache.entries(1.5) == {"k": "broker1"}  # would be gone at 1.0 without the hit
        assert engine.route(client("k"), 1.5).reason == DecisionReason.CACHE

    def test_route_cache_expired_entry_asks_policy(self):
        engine = make_engine(policy="ROUND_ROBIN", cache_timeout_ms=1000, round_robin_start=0)
        assert node(engine.route(client("k"), 0.0)) == "broker1"
        again = engine.route(client("k"), 1.0)
        assert (node(again), again.reason) == ("broker2", DecisionReason.POLICY)

    def test_route_cache_entry_for_unready_target_is_bypassed_and_overwritten(self):
        engine = make_engine(policy="ROUND_ROBIN", cache_timeout_ms=0, round_robin_start=0)
        assert engine.pool is not None
        assert engine.cache is not None
        assert node(engine.route(client("k"), 0.0)) == "broker1"
        engine.pool.record_check("broker1", False)
        # ROUND_ROBIN position is 1; ready targets [broker2, broker3] -> 1 % 2 = 1 -> broker3
        moved = engine.route(client("k"), 1.0)
        assert (node(moved), moved.reason) == ("broker3", DecisionReason.POLICY)
        assert engine.cache.entries(1.0) == {"k": "broker3"}
        engine.pool.record_check("broker1", True)
        back = engine.route(client("k"), 2.0)
        assert (node(back), back.reason) == ("broker3", DecisionReason.CACHE)

    def test_route_cache_entry_not_removed_while_target_down(self):
        engine = make_engine(cache_timeout_ms=0, ready=["broker1"])
        assert engine.pool is not None
        assert engine.cache is not None
        engine.route(client("k"), 0.0)
        engine.pool.record_check("broker1", False)
        refused = engine.route(client("k"), 1.0)
        assert refused.status is RouteStatus.REFUSED_UNAVAILABLE
        assert engine.cache.entries(1.0) == {"k": "broker1"}

    def test_route_cache_entry_for_node_outside_pool_is_bypassed(self):
        engine = make_engine(cache_timeout_ms=0)
        assert engine.cache is not None
        engine.cache.put("k", "gone-broker", 0.0)
        decision = engine.route(client("k"), 0.0)
        assert (node(decision), decision.reason) == ("broker1", DecisionReason.POLICY)
        assert engine.cache.entries(0.0) == {"k": "broker1"}

    def test_route_cache_uses_transformed_key(self):
        engine = make_engine(
            policy="CONSISTENT_HASH_MODULO",
            properties=(("MODULO", "3"),),
            cache_timeout_ms=0,
            local_filter="1",
        )
        assert engine.cache is not None
        engine.cache.put("2", "broker2", 0.0)
        hit = engine.route(client("FOO-1"), 0.0)  # -> "2": the cache answers before the policy
        assert (hit.key, node(hit), hit.reason) == ("2", "broker2", DecisionReason.CACHE)


# -- steps 7-9: quorum, pick, refusal --


class TestSteps7To9:
    def test_route_below_quorum_refused_unavailable(self):
        engine = make_engine(quorum=2, ready=["broker3"])
        decision = engine.route(client("k"), 0.0)
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE
        assert decision.reason == DecisionReason.NO_READY_TARGET
        assert decision.target is None

    def test_route_quorum_reached_picks_among_ready(self):
        engine = make_engine(quorum=2, ready=["broker2", "broker3"])
        assert node(engine.route(client("k"), 0.0)) == "broker2"

    def test_route_no_ready_target_refused_unavailable(self):
        decision = make_engine(ready=[]).route(client("k"), 0.0)
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    def test_route_empty_pool_refused_unavailable(self):
        decision = make_engine(targets=()).route(client("k"), 0.0)
        assert decision.status is RouteStatus.REFUSED_UNAVAILABLE

    def test_route_pick_is_cached(self):
        engine = make_engine(policy="CONSISTENT_HASH", cache_timeout_ms=0)
        assert engine.cache is not None
        assert node(engine.route(client("key-319"), 5.0)) == "broker2"
        assert engine.cache.entries(5.0) == {"key-319": "broker2"}

    def test_route_refusal_is_not_cached(self):
        engine = make_engine(ready=[], cache_timeout_ms=0)
        assert engine.cache is not None
        engine.route(client("k"), 0.0)
        assert len(engine.cache) == 0

    def test_route_modulo_with_pool_refused_unavailable(self):
        engine = make_engine(policy="CONSISTENT_HASH_MODULO", properties=(("modulo", "3"),))
        decision = engine.route(client("client-42"), 0.0)
        assert (decision.key, decision.status) == ("1", RouteStatus.REFUSED_UNAVAILABLE)
        assert decision.reason == DecisionReason.POLICY_SELECTS_NONE

    @pytest.mark.parametrize(
        ("client_id", "expected"),
        [("key-320", "broker1"), ("key-319", "broker2"), ("key-0", "broker3"), ("client-42", "broker1")],
    )
    def test_route_consistent_hash_exact(self, client_id, expected):
        engine = make_engine(policy="CONSISTENT_HASH")
        assert node(engine.route(client(client_id), 0.0)) == expected

    def test_route_consistent_hash_over_ready_targets_only(self):
        """Scenario: broker2 is not ready; "key-319" falls to its floor neighbour broker1."""
        engine = make_engine(policy="CONSISTENT_HASH", ready=["broker1", "broker3"])
        assert node(engine.route(client("key-319"), 0.0)) == "broker1"

    def test_route_round_robin_sequence(self):
        engine = make_engine(policy="ROUND_ROBIN", round_robin_start=2)
        picks = [node(engine.route(client("same"), 0.0)) for _ in range(4)]
        assert picks == ["broker3", "broker1", "broker2", "broker3"]

    def test_route_least_connections_uses_counts(self):
        engine = make_engine(
            policy="LEAST_CONNECTIONS", counts=FakeCounts({"broker1": 7, "broker2": 2, "broker3": 2})
        )
        picks = [node(engine.route(client("same"), 0.0)) for _ in range(3)]
        assert picks == ["broker2", "broker3", "broker2"]

    def test_early_then_select_with_waited_targets(self):
        """Scenario: the I/O layer calls `early`, waits for quorum, then `select` with the targets."""
        engine = make_engine(cache_timeout_ms=0, quorum=2, ready=[])
        assert engine.early("k", 0.0) is None
        decision = engine.select("k", [B2, B3], 3.0)
        assert (node(decision), decision.reason) == ("broker2", DecisionReason.POLICY)
        assert engine.cache is not None
        assert engine.cache.entries(3.0) == {"k": "broker2"}

    def test_select_empty_targets_refused_unavailable(self):
        decision = make_engine().select("k", [], 0.0)
        assert (decision.status, decision.reason) == (
            RouteStatus.REFUSED_UNAVAILABLE,
            DecisionReason.NO_READY_TARGET,
        )


# -- A7: management lookup --


class TestRedispatch:
    """After a failed connect: the policy's pick among the other ready targets (HAProxy's redispatch)."""

    def test_redispatch_picks_another_ready_target_and_caches_it(self):
        engine = make_engine(cache_timeout_ms=0)
        first = engine.route(client("k"), 0.0)
        assert node(first) == "broker1"
        again = engine.redispatch("k", first.reason, "broker1", 1.0)
        assert (again.status, node(again), again.reason) == (
            RouteStatus.OK,
            "broker2",
            DecisionReason.REDISPATCH,
        )
        assert engine.cache is not None
        assert engine.cache.get("k", 2.0) == "broker2"  # the failed target's entry is replaced

    def test_redispatch_after_a_cache_hit(self):
        engine = make_engine(cache_timeout_ms=0)
        engine.route(client("k"), 0.0)
        hit = engine.route(client("k"), 1.0)
        assert hit.reason is DecisionReason.CACHE
        assert node(engine.redispatch("k", hit.reason, "broker1", 2.0)) == "broker2"

    def test_redispatch_without_another_ready_target_is_unavailable(self):
        engine = make_engine(ready=["broker1"])
        refused = engine.redispatch("k", DecisionReason.POLICY, "broker1", 0.0)
        assert (refused.status, refused.reason) == (
            RouteStatus.REFUSED_UNAVAILABLE,
            DecisionReason.CONNECT_FAILED,
        )

    @pytest.mark.parametrize(
        "reason", [DecisionReason.LOCAL_TARGET_FILTER, DecisionReason.INTERNAL_CLIENT_ID]
    )
    def test_the_local_target_is_not_redispatched(self, reason):
        """Scenario: the local target was chosen by rule, not by the pool: no other target stands in."""
        refused = make_engine().redispatch("k", reason, "local", 0.0)
        assert refused.status is RouteStatus.REFUSED_UNAVAILABLE


class TestElsewhere:
    """A connection its target's gate held back (router/runtime/gates.py): where it may go instead."""

    @pytest.mark.parametrize("policy", ["FIRST_ELEMENT", "ROUND_ROBIN", "LEAST_CONNECTIONS"])
    def test_a_policy_pick_of_a_non_sticky_policy_moves_and_is_cached(self, policy):
        engine = make_engine(policy=policy, cache_timeout_ms=0)
        first = engine.route(client("k"), 0.0)
        held = node(first)
        assert held is not None
        moved = engine.elsewhere("k", first.reason, held, 1.0)
        assert moved is not None
        assert (moved.status, moved.reason) == (RouteStatus.OK, DecisionReason.REDISPATCH)
        assert node(moved) != held
        assert engine.cache is not None
        assert engine.cache.get("k", 2.0) == node(moved)

    @pytest.mark.parametrize(
        ("policy", "properties"), [("CONSISTENT_HASH", ()), ("CONSISTENT_HASH_MODULO", (("MODULO", "3"),))]
    )
    def test_a_key_of_a_hash_policy_waits_for_its_own_target(self, policy, properties):
        engine = make_engine(policy=policy, properties=properties)
        assert engine.elsewhere("k", DecisionReason.POLICY, "broker1", 0.0) is None

    def test_a_cache_hit_waits_for_its_own_target(self):
        engine = make_engine(cache_timeout_ms=0)
        engine.route(client("k"), 0.0)
        hit = engine.route(client("k"), 1.0)
        assert hit.target is not None
        assert engine.elsewhere("k", hit.reason, hit.target.node_id, 2.0) is None

    def test_nothing_else_ready_waits(self):
        engine = make_engine(ready=["broker1"])
        assert engine.elsewhere("k", DecisionReason.POLICY, "broker1", 0.0) is None


class TestBeginAndFinish:
    """`begin` runs the workflow as far as it goes without waiting; `finish` selects after a wait."""

    def test_begin_below_quorum_with_a_timeout_says_wait(self):
        recorder = RecordingPolicy()
        engine = make_engine(quorum=2, ready=["broker3"], quorum_timeout_ms=3000, cache_timeout_ms=0)
        engine.policy = recorder
        assert engine.begin(client("k"), 0.0) == QuorumWait(key="k", timeout_s=3.0)
        assert recorder.calls == []  # no policy call (and no round-robin move) before the wait
        assert engine.cache is not None
        assert engine.cache.entries(0.0) == {}

    def test_begin_below_quorum_without_a_timeout_refuses_at_once(self):
        engine = make_engine(quorum=2, ready=["broker3"], quorum_timeout_ms=0)
        decision = engine.begin(client("k"), 0.0)
        assert isinstance(decision, RouteDecision)
        assert (decision.status, decision.reason) == (
            RouteStatus.REFUSED_UNAVAILABLE,
            DecisionReason.NO_READY_TARGET,
        )

    def test_begin_with_the_quorum_decides(self):
        engine = make_engine(quorum=2, ready=["broker2", "broker3"], quorum_timeout_ms=3000)
        decision = engine.begin(client("k"), 0.0)
        assert isinstance(decision, RouteDecision)
        assert node(decision) == "broker2"

    def test_begin_steps_before_the_pool_do_not_wait(self):
        """Scenario: the internal client id, the local filter and a cache hit answer below quorum."""
        engine = make_engine(quorum=3, ready=["broker1"], quorum_timeout_ms=3000, local_filter="local-.*")
        internal = engine.begin(client(INTERNAL + "x"), 0.0)
        assert isinstance(internal, RouteDecision)
        assert internal.reason is DecisionReason.INTERNAL_CLIENT_ID
        local = engine.begin(client("local-1"), 0.0)
        assert isinstance(local, RouteDecision)
        assert local.reason is DecisionReason.LOCAL_TARGET_FILTER

    def test_finish_selects_after_the_wait(self):
        engine = make_engine(quorum=2, ready=["broker3"], quorum_timeout_ms=3000, cache_timeout_ms=0)
        wait = engine.begin(client("k"), 0.0)
        assert isinstance(wait, QuorumWait)
        assert engine.pool is not None
        engine.pool.record_check("broker2", True)
        decision = engine.finish(wait, 1.0)
        assert (node(decision), decision.reason) == ("broker2", DecisionReason.POLICY)
        assert engine.cache is not None
        assert engine.cache.entries(1.0) == {"k": "broker2"}

    def test_finish_when_the_quorum_never_came_refuses(self):
        engine = make_engine(quorum=2, ready=["broker3"], quorum_timeout_ms=3000)
        wait = engine.begin(client("k"), 0.0)
        assert isinstance(wait, QuorumWait)
        assert engine.finish(wait, 3.0).status is RouteStatus.REFUSED_UNAVAILABLE


class TestLookup:
    def test_lookup_starts_at_step_3_without_key_filter(self):
        """Scenario: the key filter would turn "xx" into NULL; lookup takes the key as given."""
        engine = make_engine(key_filter="FOO-[0-9]")
        decision = engine.lookup("xx", 0.0)
        assert (decision.key, node(decision)) == ("xx", "broker1")

    def test_lookup_skips_internal_client_id_check(self):
        engine = make_engine()
        decision = engine.lookup(INTERNAL + "x", 0.0)
        assert node(decision) == "broker1"
        assert decision.target is not None
        assert decision.target.local is False

    def test_lookup_transforms_key(self):
        engine = make_engine(policy="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),), local_filter="1")
        decision = engine.lookup("client-42", 0.0)
        assert (decision.key, decision.target) == ("1", LOCAL)

    def test_lookup_does_not_transform_null(self):
        engine = make_engine(policy="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),), local_filter="0")
        decision = engine.lookup(NULL_KEY, 0.0)
        assert (decision.key, decision.status) == (NULL_KEY, RouteStatus.REFUSED_UNAVAILABLE)

    def test_lookup_applies_local_filter(self):
        engine = make_engine(local_filter="NULL|0")
        assert engine.lookup("NULL", 0.0).target is LOCAL
        assert engine.lookup("0", 0.0).target is LOCAL
        assert node(engine.lookup("00", 0.0)) == "broker1"

    def test_lookup_updates_cache(self):
        engine = make_engine(policy="CONSISTENT_HASH", cache_timeout_ms=0)
        assert engine.cache is not None
        engine.lookup("key-0", 2.0)
        assert engine.cache.entries(2.0) == {"key-0": "broker3"}

    def test_lookup_moves_round_robin_position(self):
        engine = make_engine(policy="ROUND_ROBIN", round_robin_start=0)
        assert node(engine.lookup("a", 0.0)) == "broker1"
        assert node(engine.route(client("b"), 0.0)) == "broker2"
        assert node(engine.lookup("c", 0.0)) == "broker3"

    def test_lookup_uses_cache(self):
        engine = make_engine(policy="ROUND_ROBIN", cache_timeout_ms=0, round_robin_start=0)
        assert node(engine.route(client("k"), 0.0)) == "broker1"
        hit = engine.lookup("k", 0.0)
        assert (node(hit), hit.reason) == ("broker1", DecisionReason.CACHE)

    def test_lookup_without_pool_refused_use_another(self):
        assert make_engine(targets=None).lookup("k", 0.0).status is RouteStatus.REFUSED_USE_ANOTHER


# -- A7: filters changed at run time --


class TestRuntimeFilters:
    def test_key_filter_read_and_changed(self):
        engine = make_engine(key_filter="FOO-[0-9]")
        assert engine.key_filter == "FOO-[0-9]"
        assert engine.route(client("xBAR-2"), 0.0).key == NULL_KEY
        engine.key_filter = "BAR-[0-9]"
        assert engine.key_filter == "BAR-[0-9]"
        assert engine.compiled_key_filter is not None
        assert engine.route(client("xBAR-2"), 0.0).key == "BAR-2"

    @pytest.mark.parametrize("blank", ["", "   ", None])
    def test_key_filter_blank_disables(self, blank):
        engine = make_engine(key_filter="FOO-[0-9]")
        engine.key_filter = blank
        assert engine.key_filter is None
        assert engine.compiled_key_filter is None
        assert engine.route(client("xBAR-2"), 0.0).key == "xBAR-2"

    def test_key_filter_invalid_regex_raises_and_keeps_old(self):
        engine = make_engine(key_filter="FOO-[0-9]")
        with pytest.raises(ValueError, match=r"key-filter '\(' is not a valid regular expression"):
            engine.key_filter = "("
        assert engine.key_filter == "FOO-[0-9]"
        assert engine.route(client("xFOO-3"), 0.0).key == "FOO-3"

    def test_local_target_filter_read_and_changed(self):
        engine = make_engine()
        assert local_filter_of(engine) is None
        assert node(engine.route(client("k"), 0.0)) == "broker1"
        engine.local_target_filter = "k|NULL"
        assert local_filter_of(engine) == "k|NULL"
        assert engine.route(client("k"), 0.0).target is LOCAL
        engine.local_target_filter = "  "
        assert local_filter_of(engine) is None
        assert node(engine.route(client("k"), 0.0)) == "broker1"

    def test_local_target_filter_invalid_regex_raises_and_keeps_old(self):
        engine = make_engine(local_filter="k")
        with pytest.raises(ValueError, match=r"local-target-filter '\[a-' is not a valid regular expression"):
            engine.local_target_filter = "[a-"
        assert engine.local_target_filter == "k"
        assert engine.route(client("k"), 0.0).target is LOCAL

    def test_engine_with_invalid_filter_in_config_is_impossible(self):
        with pytest.raises(ValueError, match="key-filter"):
            RouterConfig(name="r1", key_filter="(")


# -- RouteDecision --


class TestRouteDecision:
    def test_route_decision_to_json_remote(self):
        decision = RouteDecision(
            key="key-319", status=RouteStatus.OK, target=B2, reason=DecisionReason.POLICY
        )
        assert decision.to_json() == {
            "key": "key-319",
            "status": "OK",
            "node_id": "broker2",
            "local": False,
            "connector": "tcp://10.0.0.2:61616",
        }

    def test_route_decision_to_json_local_with_connector(self):
        decision = RouteDecision(
            key="NULL", status=RouteStatus.OK, reason=DecisionReason.POLICY, target=LOCAL
        )
        assert decision.to_json() == {
            "key": "NULL",
            "status": "OK",
            "node_id": "broker-local",
            "local": True,
            "connector": "tcp://127.0.0.1:61616",
        }

    def test_route_decision_to_json_local_without_connector(self):
        decision = RouteDecision(
            key="k", status=RouteStatus.OK, reason=DecisionReason.POLICY, target=Target.local_target(None)
        )
        assert decision.to_json() == {
            "key": "k",
            "status": "OK",
            "node_id": "local",
            "local": True,
            "connector": None,
        }

    def test_route_decision_to_json_ipv6_connector(self):
        v6 = Target.remote(Connector.from_url("v6", "tcp://[::1]:5672?nodeId=n6"))
        assert RouteDecision(
            key="k", status=RouteStatus.OK, reason=DecisionReason.POLICY, target=v6
        ).to_json()["connector"] == ("tcp://[::1]:5672")

    @pytest.mark.parametrize("status", [RouteStatus.REFUSED_UNAVAILABLE, RouteStatus.REFUSED_USE_ANOTHER])
    def test_route_decision_to_json_refused(self, status):
        decision = RouteDecision(key="NULL", status=status, reason=DecisionReason.NO_READY_TARGET)
        assert decision.to_json() == {
            "key": "NULL",
            "status": status.value,
            "node_id": None,
            "local": False,
            "connector": None,
        }

    def test_route_decision_rejects_ok_without_target(self):
        with pytest.raises(ValueError, match="a decision has a target exactly when OK, got OK"):
            RouteDecision(key="k", status=RouteStatus.OK, reason=DecisionReason.POLICY)

    def test_route_decision_rejects_refusal_with_target(self):
        with pytest.raises(ValueError, match="got REFUSED_UNAVAILABLE"):
            RouteDecision(
                key="k",
                status=RouteStatus.REFUSED_UNAVAILABLE,
                reason=DecisionReason.NO_READY_TARGET,
                target=B1,
            )

    def test_route_status_values_are_artemis_names(self):
        assert [s.value for s in RouteStatus] == ["OK", "REFUSED_USE_ANOTHER", "REFUSED_UNAVAILABLE"]


# -- build_pool --


class TestBuildPool:
    CONNECTORS = (
        Connector.from_url("here", "tcp://127.0.0.1:61616?nodeId=broker-local"),
        Connector.from_url("artemis-1", "tcp://10.0.0.1:61616?nodeId=broker1"),
        Connector.from_url("artemis-2", "tcp://10.0.0.2:61616?nodeId=broker2"),
        Connector.from_url("artemis-3", "tcp://10.0.0.3:61616"),
    )

    def config(self, router: RouterConfig) -> Config:
        return Config(
            source="router.xml",
            connectors=self.CONNECTORS,
            routers=(router,),
            discovery_groups=(DiscoveryGroupConfig(name="dg"),),
            cluster_connections=(
                ClusterConnectionConfig(
                    name="cluster", connector_ref="here", static_connectors=("artemis-3", "artemis-1")
                ),
            ),
        )

    def test_build_pool_static_order_local_first(self):
        router = RouterConfig(
            name="r1",
            local_connector="here",
            pool=PoolConfig(
                kind=PoolKind.STATIC,
                static_connectors=("artemis-2", "artemis-1", "artemis-3"),
                local_target_enabled=True,
                quorum_size=2,
            ),
        )
        pool, local = build_pool(self.config(router), router)
        assert pool is not None
        assert [t.node_id for t in pool.targets] == ["broker-local", "broker2", "broker1", "artemis-3"]
        assert pool.targets[0] is local
        assert local.local is True
        assert local.connector is not None
        assert local.connector.name == "here"
        assert [t.local for t in pool.targets] == [True, False, False, False]
        assert pool.name == "r1"
        assert pool.quorum_size == 2

    def test_build_pool_static_without_local_target(self):
        router = RouterConfig(
            name="r1",
            local_connector="here",
            pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("artemis-1", "artemis-2")),
        )
        pool, local = build_pool(self.config(router), router)
        assert pool is not None
        assert [t.node_id for t in pool.targets] == ["broker1", "broker2"]
        assert local.node_id == "broker-local"

    def test_build_pool_targets_not_ready(self):
        router = RouterConfig(
            name="r1", pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("artemis-1",))
        )
        pool, _ = build_pool(self.config(router), router)
        assert pool is not None
        assert pool.ready_targets() == []
        assert pool.active is False

    def test_build_pool_cluster_connection_static_connectors(self):
        router = RouterConfig(name="r1", pool=PoolConfig(kind=PoolKind.CLUSTER, cluster_connection="cluster"))
        pool, _ = build_pool(self.config(router), router)
        assert pool is not None
        assert [t.node_id for t in pool.targets] == ["artemis-3", "broker1"]
        assert [t.connector.host for t in pool.targets if t.connector is not None] == ["10.0.0.3", "10.0.0.1"]

    def test_build_pool_cluster_with_local_target_first(self):
        router = RouterConfig(
            name="r1",
            pool=PoolConfig(kind=PoolKind.CLUSTER, cluster_connection="cluster", local_target_enabled=True),
        )
        pool, local = build_pool(self.config(router), router)
        assert pool is not None
        assert [t.node_id for t in pool.targets] == ["local", "artemis-3", "broker1"]
        assert pool.targets[0] is local

    def test_build_pool_discovery_starts_empty(self):
        router = RouterConfig(name="r1", pool=PoolConfig(kind=PoolKind.DISCOVERY, discovery_group="dg"))
        pool, _ = build_pool(self.config(router), router)
        assert pool is not None
        assert pool.targets == ()

    def test_build_pool_without_pool(self):
        router = RouterConfig(name="r1", local_connector="here")
        pool, local = build_pool(self.config(router), router)
        assert pool is None
        assert local.node_id == "broker-local"

    def test_build_pool_local_target_without_connector(self):
        router = RouterConfig(name="r1")
        pool, local = build_pool(self.config(router), router)
        assert pool is None
        assert (local.node_id, local.connector, local.local) == ("local", None, True)
        decision = RouteDecision(
            key="NULL", status=RouteStatus.OK, reason=DecisionReason.POLICY, target=local
        )
        assert decision.to_json() == {
            "key": "NULL",
            "status": "OK",
            "node_id": "local",
            "local": True,
            "connector": None,
        }

    def test_build_pool_then_engine_first_element_prefers_local(self):
        """Scenario: FIRST_ELEMENT with local-target-enabled routes to the local target while it is
        ready, and to the first static connector once it is not."""
        router = RouterConfig(
            name="r1",
            key_type=KeyType.CLIENT_ID,
            local_connector="here",
            policy=PolicyConfig(name="FIRST_ELEMENT"),
            pool=PoolConfig(
                kind=PoolKind.STATIC, static_connectors=("artemis-1", "artemis-2"), local_target_enabled=True
            ),
        )
        pool, local = build_pool(self.config(router), router)
        assert pool is not None
        for t in pool.targets:
            pool.record_check(t.node_id, True)
        engine = RoutingEngine(router, pool, local)
        first = engine.route(client("c"), 0.0)
        assert first.target is local
        pool.record_check("broker-local", False)
        assert node(engine.route(client("c"), 0.0)) == "broker1"

    def test_build_pool_unknown_connector_raises(self):
        router = RouterConfig(name="r1", pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("nope",)))
        with pytest.raises(KeyError, match="nope"):
            build_pool(self.config(router), router)


class TestHaPairTargets:
    PAIR = Target.remote(Connector.from_url("p", "(tcp://10.0.0.1:1,tcp://10.0.0.2:2)?nodeId=pair"))

    def test_decision_reaches_the_active_member_and_follows_failover(self):
        engine = make_engine(targets=[self.PAIR], ready=[])
        assert engine.pool is not None
        engine.pool.record_check("pair", True, member=0)
        first = engine.lookup("k", 0.0)
        assert first.connector is not None
        assert first.connector.url == "tcp://10.0.0.1:1"
        engine.pool.record_check("pair", True, member=1)
        engine.pool.record_check("pair", False, "killed", member=0)
        after = engine.lookup("k", 0.0)
        assert after.target == self.PAIR
        assert after.connector is not None
        assert (after.connector.host, after.connector.port, after.connector.backups) == ("10.0.0.2", 2, ())
        assert after.to_json()["connector"] == "tcp://10.0.0.2:2"

    def test_cached_decision_also_reaches_the_active_member(self):
        engine = make_engine(targets=[self.PAIR], ready=[], cache_timeout_ms=0)
        assert engine.pool is not None
        engine.pool.record_check("pair", True, member=0)
        engine.lookup("k", 0.0)
        engine.pool.record_check("pair", True, member=1)
        engine.pool.record_check("pair", False, "killed", member=0)
        decision = engine.lookup("k", 1.0)
        assert decision.reason == DecisionReason.CACHE
        assert decision.to_json()["connector"] == "tcp://10.0.0.2:2"

    def test_plain_decision_connector_defaults_to_the_target_connector(self):
        decision = RouteDecision(key="k", status=RouteStatus.OK, reason=DecisionReason.POLICY, target=B1)
        assert decision.connector == B1.connector


# -- a cache shared through ZooKeeper --


def shared_engine(ready: Sequence[str] | None = None) -> RoutingEngine:
    engine = make_engine(cache_timeout_ms=60_000, ready=ready)
    config = dataclasses.replace(
        engine.config, cache_zookeeper=ZooKeeperConfig(connect="127.0.0.1:2181", path="/cache")
    )
    return RoutingEngine(config, engine.pool, LOCAL)


class TestSharedCache:
    def test_a_miss_asks_the_shared_cache_and_a_hit_does_not(self):
        engine = shared_engine()
        assert engine.begin(client("k"), 0.0) == SharedCacheWait(key="k")
        decision = engine.after_shared(SharedCacheWait(key="k"), None, 0.0)
        assert isinstance(decision, RouteDecision)
        assert (node(decision), decision.reason) == ("broker1", DecisionReason.POLICY)
        hit = engine.begin(client("k"), 1.0)
        assert isinstance(hit, RouteDecision)
        assert hit.reason is DecisionReason.CACHE

    def test_another_routers_ready_choice_is_adopted_and_cached(self):
        engine = shared_engine()
        decision = engine.after_shared(SharedCacheWait(key="k"), "broker3", 0.0)
        assert isinstance(decision, RouteDecision)
        assert (node(decision), decision.reason) == ("broker3", DecisionReason.CACHE)
        assert engine.cache is not None
        assert engine.cache.entries(0.0) == {"k": "broker3"}

    def test_a_choice_on_a_target_not_ready_here_is_bypassed(self):
        engine = shared_engine(ready=["broker1", "broker2"])
        decision = engine.after_shared(SharedCacheWait(key="k"), "broker3", 0.0)
        assert isinstance(decision, RouteDecision)
        assert (node(decision), decision.reason) == ("broker1", DecisionReason.POLICY)
        assert engine.adopt("k", "broker3", 0.0) is None

    def test_a_local_entry_on_a_target_gone_down_asks_the_shared_cache_again(self):
        engine = shared_engine()
        assert engine.cache is not None
        engine.cache.put("k", "broker2", 0.0)
        assert engine.pool is not None
        engine.pool.record_check("broker2", False)
        assert engine.begin(client("k"), 1.0) == SharedCacheWait(key="k")

    def test_an_entry_a_concurrent_decision_made_meanwhile_wins_over_the_answer(self):
        engine = shared_engine()
        wait = engine.begin(client("k"), 0.0)
        assert isinstance(wait, SharedCacheWait)
        assert engine.cache is not None
        engine.cache.put("k", "broker2", 0.0)  # another connection's decision for "k", meanwhile
        decision = engine.after_shared(wait, "broker3", 0.0)
        assert isinstance(decision, RouteDecision)
        assert (node(decision), decision.reason) == ("broker2", DecisionReason.CACHE)

    def test_used_keys_are_tracked_for_the_shared_cache(self):
        engine = shared_engine()
        assert engine.cache is not None
        engine.cache.put("a", "broker1", 0.0)
        engine.cache.get("a", 1.0)
        engine.cache.put("b", "broker1", 1.0)
        assert engine.cache.take_used() == {"a", "b"}
        assert engine.cache.take_used() == set()


class TestDryRunLookup:
    def test_a_dry_run_changes_no_cache_and_no_round_robin_position(self):
        engine = make_engine(policy="ROUND_ROBIN", cache_timeout_ms=1000)
        assert engine.cache is not None
        first = engine.peek("k", 0.0)
        assert (node(first), first.reason) == ("broker1", DecisionReason.POLICY)
        assert node(engine.peek("k", 0.0)) == "broker1"  # the position did not move
        assert engine.cache.entries(0.0) == {}
        assert node(engine.lookup("k", 0.0)) == "broker1"  # the real lookup moves and caches
        assert node(engine.peek("other", 0.0)) == "broker2"
        engine.cache.put("c", "broker3", 0.0)
        cached = engine.peek("c", 0.75)
        assert (node(cached), cached.reason) == ("broker3", DecisionReason.CACHE)
        assert engine.cache.entry("c", 0.75) is not None
        assert engine.cache.get("c", 1.0) is None  # the peek at 0.75 did not refresh it

    def test_a_dry_run_follows_the_same_rules(self):
        engine = make_engine(local_filter="admin", targets=None)
        assert engine.peek("admin", 0.0).reason is DecisionReason.LOCAL_TARGET_FILTER
        assert engine.peek("x", 0.0).status is RouteStatus.REFUSED_USE_ANOTHER
        assert make_engine(ready=[]).peek("x", 0.0).reason is DecisionReason.NO_READY_TARGET


# -- the native path's decisions in plain values (`RoutingEngine.plain_key` and `plain`) --

_SOURCES = ("10.0.0.1", "10.0.0.2", "10.1.0.3", "::ffff:10.0.0.1", "fd00::7")
_CLIENTS = (None, "", "c1", "c2", "10.1.0.3", INTERNAL + "x")
_STEP = st.one_of(
    st.tuples(
        st.just("connect"), st.tuples(st.sampled_from(_SOURCES), st.sampled_from(_CLIENTS)), st.floats(0, 2)
    ),
    st.tuples(st.just("check"), st.sampled_from(["broker1", "broker2", "broker3"]), st.booleans()),
    st.tuples(st.just("admin"), st.sampled_from(["broker1", "broker2"]), st.sampled_from(list(AdminState))),
    st.tuples(st.just("pin"), st.sampled_from(("10.0.0.1", "c1")), st.sampled_from(["broker1", "broker3"])),
    st.tuples(st.just("evict"), st.sampled_from(("10.0.0.1", "c1", "10.1.0.3")), st.just(0)),
)


class TestPlain:
    """`plain` is `begin`'s decision when it is a target from the cache or the policy, with the
    same changes to the cache and the policy; None, changing nothing, for every other connection
    (which `begin` then decides as always)."""

    @settings(max_examples=400, deadline=None)
    @given(
        steps=st.lists(_STEP, max_size=30),
        key_type=st.sampled_from([KeyType.SOURCE_IP, KeyType.CLIENT_ID]),
        key_filter=st.sampled_from([None, r"10\.0\.0\.\d+|c\d"]),
        local_filter=st.sampled_from([None, "10.1.0.3"]),
        timeout_ms=st.sampled_from([None, 0, 1000]),
        policy=st.sampled_from(["FIRST_ELEMENT", "ROUND_ROBIN", "CONSISTENT_HASH"]),
        quorum=st.sampled_from([1, 2]),
    )
    def test_same_decisions_cache_and_policy_as_begin(
        self,
        steps: list[tuple[str, object, object]],
        key_type: KeyType,
        key_filter: str | None,
        local_filter: str | None,
        timeout_ms: int | None,
        policy: str,
        quorum: int,
    ) -> None:
        def engine() -> RoutingEngine:
            return make_engine(
                policy=policy,
                key_type=key_type,
                key_filter=key_filter,
                local_filter=local_filter,
                cache_timeout_ms=timeout_ms,
                quorum=quorum,
                round_robin_start=0,
            )

        whole, plain = engine(), engine()  # the same state throughout, each decided its own way
        now = 0.0
        for step, what, value in steps:
            for e in (whole, plain):
                assert e.pool is not None
                if step == "check":
                    e.pool.record_check(str(what), bool(value))
                elif step == "admin":
                    assert isinstance(value, AdminState)
                    e.pool.set_admin_state(str(what), value)
                elif step == "pin" and e.cache is not None:
                    e.cache.pin(str(what), str(value), now)
                elif step == "evict" and e.cache is not None:
                    e.cache.evict(str(what))
            if step != "connect":
                continue
            assert isinstance(what, tuple)
            assert isinstance(value, float)
            now += value
            facts = ConnectionFacts(source_ip=what[0], client_id=what[1])
            expected = whole.begin(facts, now)
            key = plain.plain_key(what[0], what[1])
            found = None if key is None else plain.plain(key, now)
            if found is None:
                assert plain.begin(facts, now) == expected
            else:
                assert isinstance(expected, RouteDecision)
                assert (expected.key, expected.target, expected.connector, expected.reason) == (key, *found)
            if whole.cache is not None:
                assert plain.cache is not None
                assert plain.cache.entries(now) == whole.cache.entries(now)
                assert (plain.cache.hits, plain.cache.misses) == (whole.cache.hits, whole.cache.misses)
                assert plain.cache.take_changes(now) == whole.cache.take_changes(now)
            # The policy's position: the next pick of a fresh key is the same.
            assert whole.peek("fresh-key", now) == plain.peek("fresh-key", now)

    def test_keys_of_the_key_types_it_knows(self) -> None:
        assert make_engine(key_type=KeyType.SNI_HOST).plain_key("10.0.0.1", "c") is None
        assert make_engine(key_type=KeyType.SOURCE_IP).plain_key("::ffff:10.0.0.1") == "10.0.0.1"
        assert make_engine(key_type=KeyType.CLIENT_ID).plain_key("10.0.0.1", "c7") == "c7"
        assert make_engine(key_type=KeyType.CLIENT_ID).plain_key("10.0.0.1", None) == NULL_KEY
        assert make_engine(key_type=KeyType.CLIENT_ID).plain_key("10.0.0.1", INTERNAL + "x") is None
        assert make_engine(key_type=KeyType.USER_NAME).plain_key("10.0.0.1", "c", "u") == "u"

    def test_a_miss_then_a_hit(self) -> None:
        engine = make_engine(policy="ROUND_ROBIN", key_type=KeyType.SOURCE_IP, cache_timeout_ms=1000)
        assert engine.cache is not None
        assert engine.plain("10.0.0.9", 0.0) == (B1, B1.connector, DecisionReason.POLICY)
        assert (engine.cache.hits, engine.cache.misses) == (0, 1)
        assert engine.plain("10.0.0.9", 0.5) == (B1, B1.connector, DecisionReason.CACHE)
        assert engine.plain("10.0.0.8", 0.5) == (B2, B2.connector, DecisionReason.POLICY)
        assert (engine.cache.hits, engine.cache.misses) == (1, 2)
        assert make_engine(ready=[]).plain("k", 0.0) is None  # no target: `begin` refuses
