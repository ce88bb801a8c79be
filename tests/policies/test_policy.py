"""Tests for policies/policy.py: PolicyConfig, make_policy and the five Artemis policies (SPEC A3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.hashing import artemis_hash
from policies.policy import (
    ConsistentHashModuloPolicy,
    ConsistentHashPolicy,
    FirstElementPolicy,
    LeastConnectionsPolicy,
    Policy,
    PolicyConfig,
    RoundRobinPolicy,
    make_policy,
    policy_names,
)
from pools.target import Connector, Target

POLICY_NAMES = [
    "CONSISTENT_HASH",
    "CONSISTENT_HASH_MODULO",
    "FIRST_ELEMENT",
    "LEAST_CONNECTIONS",
    "ROUND_ROBIN",
]
SELECTING_POLICIES = ["CONSISTENT_HASH", "FIRST_ELEMENT", "LEAST_CONNECTIONS", "ROUND_ROBIN"]

# Ring points of the CONSISTENT_HASH tests, Java-computed (see tests/policies/test_hashing.py):
#   broker1 774970719 < broker2 791748338 < broker3 808525957
# Keys (Java-computed hashes):
#   "key-100"   14814198  below every point -> wraps to the smallest point
#   "FOO-1"  -1838136627  below every point (negative) -> wraps to the smallest point
#   "key-320"  779799954  in [broker1, broker2)
#   "key-319"  796430478  in [broker2, broker3)
#   "key-0"   1491088857  above broker3
#   "admin"    885536276  above broker3
#   "NULL"     963632676  above broker3


def target(node_id: str, host: str = "10.0.0.1", port: int = 61616) -> Target:
    return Target(node_id=node_id, connector=Connector(name=f"c-{node_id}", host=host, port=port))


A, B, C, D = target("a"), target("b"), target("c"), target("d")
B1, B2, B3 = target("broker1"), target("broker2"), target("broker3")


def policy(name: str, *properties: tuple[str, str], **kwargs) -> Policy:
    return make_policy(PolicyConfig(name=name, properties=tuple(properties)), **kwargs)


class FakeCounts:
    """A ConnectionCountSource with fixed counts; node ids not listed are unknown."""

    def __init__(self, counts: dict[str, int | None]) -> None:
        self.counts = counts

    def connection_count(self, node_id: str) -> int | None:
        return self.counts.get(node_id)


# -- registry, PolicyConfig, make_policy --


def test_policy_names_are_the_five_artemis_names():
    assert policy_names() == POLICY_NAMES


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("FIRST_ELEMENT", FirstElementPolicy),
        ("ROUND_ROBIN", RoundRobinPolicy),
        ("CONSISTENT_HASH", ConsistentHashPolicy),
        ("LEAST_CONNECTIONS", LeastConnectionsPolicy),
        ("CONSISTENT_HASH_MODULO", ConsistentHashModuloPolicy),
    ],
)
def test_make_policy_builds_registered_class(name, cls):
    props = [("MODULO", "3")] if name == "CONSISTENT_HASH_MODULO" else []
    assert type(policy(name, *props)) is cls


def test_make_policy_gives_fresh_state_each_time():
    config = PolicyConfig(name="ROUND_ROBIN")
    first = make_policy(config, round_robin_start=0)
    second = make_policy(config, round_robin_start=0)
    assert first.select([A, B, C], "k") is A
    assert second.select([A, B, C], "k") is A


@pytest.mark.parametrize("name", ["round_robin", "RANDOM", "", "CONSISTENT-HASH"])
def test_policy_config_unknown_name_lists_valid_names(name):
    with pytest.raises(ValueError, match="unknown policy") as info:
        PolicyConfig(name=name)
    for valid in POLICY_NAMES:
        assert valid in str(info.value)


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("FIRST_ELEMENT", "MODULO"),
        ("ROUND_ROBIN", "CONNECTION_COUNT_THRESHOLD"),
        ("CONSISTENT_HASH", "MODULO"),
        ("LEAST_CONNECTIONS", "THRESHOLD"),
    ],
)
def test_policy_config_unknown_property_raises(name, prop):
    with pytest.raises(ValueError, match=f"no property '{prop}'"):
        PolicyConfig(name=name, properties=((prop, "1"),))


def test_policy_config_unknown_property_of_modulo_policy_raises():
    with pytest.raises(ValueError, match="no property 'DIVISOR'"):
        PolicyConfig(name="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"), ("DIVISOR", "3")))


def test_policy_config_keeps_properties_in_order():
    config = PolicyConfig(name="LEAST_CONNECTIONS", properties=(("CONNECTION_COUNT_THRESHOLD", "5"),))
    assert config.properties == (("CONNECTION_COUNT_THRESHOLD", "5"),)


# -- every policy: empty -> None, one target -> that target --


@pytest.mark.parametrize("name", SELECTING_POLICIES)
def test_select_empty_targets_gives_none(name):
    assert policy(name, round_robin_start=0).select([], "key-0") is None


@pytest.mark.parametrize("name", SELECTING_POLICIES)
@pytest.mark.parametrize("key", ["key-0", "NULL", "FOO-1", ""])
def test_select_single_target_gives_it(name, key):
    assert policy(name, round_robin_start=7).select([B2], key) is B2


def test_select_modulo_policy_never_selects():
    modulo = policy("CONSISTENT_HASH_MODULO", ("MODULO", "3"))
    assert modulo.select([], "1") is None
    assert modulo.select([A], "1") is None
    assert modulo.select([A, B, C], "2") is None


@pytest.mark.parametrize("name", ["FIRST_ELEMENT", "ROUND_ROBIN", "CONSISTENT_HASH", "LEAST_CONNECTIONS"])
@pytest.mark.parametrize("key", ["client-42", "FOO-1", "a", "NULL"])
def test_transform_key_is_identity_except_modulo(name, key):
    assert policy(name).transform_key(key) == key


# -- FIRST_ELEMENT --


def test_select_first_element_takes_pool_order():
    first = policy("FIRST_ELEMENT")
    assert first.select([C, A, B], "k") is C
    assert first.select([C, A, B], "other") is C
    assert first.select([A, B, C], "k") is A


@given(st.lists(st.sampled_from([A, B, C, D]), min_size=1, unique=True), st.text())
def test_select_first_element_is_head_of_list(targets, key):
    assert policy("FIRST_ELEMENT").select(targets, key) is targets[0]


# -- ROUND_ROBIN --


class TestRoundRobin:
    def test_select_round_robin_sequence_from_zero(self):
        rr = policy("ROUND_ROBIN", round_robin_start=0)
        assert [rr.select([A, B, C], "k") for _ in range(7)] == [A, B, C, A, B, C, A]

    def test_select_round_robin_start_is_reduced_modulo_n(self):
        """Scenario: start 5 with 3 targets begins at index 5 % 3 = 2."""
        rr = policy("ROUND_ROBIN", round_robin_start=5)
        assert [rr.select([A, B, C], "k") for _ in range(4)] == [C, A, B, C]

    def test_select_round_robin_large_start(self):
        """Scenario: Artemis starts anywhere in [0, 2**31 - 1); 2**31 - 2 = 3 * 715827882 -> index 0."""
        rr = policy("ROUND_ROBIN", round_robin_start=2**31 - 2)
        assert [rr.select([A, B, C], "k") for _ in range(3)] == [A, B, C]

    def test_select_round_robin_ignores_key(self):
        rr = policy("ROUND_ROBIN", round_robin_start=1)
        assert [rr.select([A, B, C], key) for key in ["x", "x", "x", "y"]] == [B, C, A, B]

    def test_select_round_robin_position_wraps_when_list_shrinks(self):
        """Scenario: after a, b from [a, b, c] pos is 2; with [a, b] `pos %= 2` gives a, then b."""
        rr = policy("ROUND_ROBIN", round_robin_start=0)
        assert rr.select([A, B, C], "k") is A
        assert rr.select([A, B, C], "k") is B
        assert rr.select([A, B], "k") is A
        assert rr.select([A, B], "k") is B
        assert rr.select([A, B, C], "k") is C

    def test_select_round_robin_position_continues_when_list_grows(self):
        rr = policy("ROUND_ROBIN", round_robin_start=0)
        assert [rr.select([A, B], "k") for _ in range(3)] == [A, B, A]
        assert [rr.select([A, B, C, D], "k") for _ in range(4)] == [B, C, D, A]

    def test_select_round_robin_single_target_advances_position(self):
        """Scenario: SPEC A3 `pos %= n; pick; pos += 1` holds for n = 1 too (pos becomes 1), as Artemis's
        `selectTarget` does for any non-empty list; the next pick from [a, b, c] is b."""
        rr = policy("ROUND_ROBIN", round_robin_start=0)
        assert rr.select([A, B, C], "k") is A
        assert rr.select([A, B, C], "k") is B
        assert rr.select([D], "k") is D
        assert rr.select([A, B, C], "k") is B

    def test_select_round_robin_empty_keeps_position(self):
        rr = policy("ROUND_ROBIN", round_robin_start=1)
        assert rr.select([], "k") is None
        assert rr.select([A, B, C], "k") is B

    def test_select_round_robin_random_start_visits_every_target(self):
        rr = policy("ROUND_ROBIN")
        picks = [rr.select([A, B, C], "k") for _ in range(3)]
        assert sorted(t.node_id for t in picks if t is not None) == ["a", "b", "c"]

    @given(st.integers(min_value=0, max_value=2**31 - 2), st.integers(min_value=1, max_value=6))
    def test_select_round_robin_cycles_through_all(self, start, n):
        targets = [target(f"n{i}") for i in range(n)]
        rr = policy("ROUND_ROBIN", round_robin_start=start)
        picks = [rr.select(targets, "k") for _ in range(2 * n)]
        expected = [targets[(start + i) % n] for i in range(2 * n)]
        assert picks == expected


# -- CONSISTENT_HASH --


class TestConsistentHash:
    def test_select_consistent_hash_ring_points_are_node_id_hashes(self):
        assert artemis_hash("broker1") < artemis_hash("broker2") < artemis_hash("broker3")

    @pytest.mark.parametrize(
        ("key", "expected"),
        [
            ("key-320", "broker1"),  # 779799954: floor is broker1
            ("key-319", "broker2"),  # 796430478: floor is broker2
            ("key-0", "broker3"),  # 1491088857: floor is broker3
            ("admin", "broker3"),  # 885536276: floor is broker3
            ("NULL", "broker3"),  # 963632676: floor is broker3
            ("broker2", "broker2"),  # equal to a point: floor includes equality
            ("key-100", "broker1"),  # 14814198: below every point, wraps to the smallest
            ("FOO-1", "broker1"),  # negative (signed comparison): wraps to the smallest
            ("client-42", "broker1"),  # 696160687: below every point
        ],
    )
    def test_select_consistent_hash_floor_then_wrap(self, key, expected):
        ch = policy("CONSISTENT_HASH")
        chosen = ch.select([B1, B2, B3], key)
        assert chosen is not None
        assert chosen.node_id == expected

    def test_select_consistent_hash_same_key_same_target(self):
        ch = policy("CONSISTENT_HASH")
        assert {ch.select([B1, B2, B3], "key-319") for _ in range(5)} == {B2}

    def test_select_consistent_hash_ignores_pool_order(self):
        ch = policy("CONSISTENT_HASH")
        for key in ["key-320", "key-319", "key-0", "key-100"]:
            assert ch.select([B3, B1, B2], key) is ch.select([B1, B2, B3], key)

    def test_select_consistent_hash_uses_node_id_not_address(self):
        """Scenario: same node ids at other addresses pick the same node; same addresses with other
        node ids pick differently."""
        ch = policy("CONSISTENT_HASH")
        moved = [target("broker1", "10.9.9.9", 1), target("broker2", "10.9.9.8", 2), B3]
        chosen = ch.select(moved, "key-319")
        assert chosen is not None
        assert chosen.node_id == "broker2"
        assert chosen.connector is not None
        assert chosen.connector.host == "10.9.9.8"
        renamed = [target("broker1"), target("broker3"), target("broker2")]  # all at 10.0.0.1:61616
        picked = ch.select(renamed, "key-0")
        assert picked is not None
        assert picked.node_id == "broker3"

    def test_select_consistent_hash_removing_chosen_moves_key_to_floor_neighbour(self):
        """Scenario: broker2 goes away; its key moves to broker1 (next point below), others stay."""
        ch = policy("CONSISTENT_HASH")
        keys = ["key-320", "key-319", "key-0", "key-100", "FOO-1", "admin"]
        before = {k: ch.select([B1, B2, B3], k) for k in keys}
        after = {k: ch.select([B1, B3], k) for k in keys}
        assert before["key-319"] is B2
        assert after["key-319"] is B1
        for key in keys:
            if before[key] is not B2:
                assert after[key] is before[key], key

    def test_select_consistent_hash_removing_smallest_point_wraps_to_new_smallest(self):
        """Scenario: broker1 goes away; "key-320" (above no remaining point) takes the smallest point,
        broker2, as Artemis's `floorEntry ?? firstEntry` does."""
        ch = policy("CONSISTENT_HASH")
        assert ch.select([B1, B2, B3], "key-320") is B1
        assert ch.select([B2, B3], "key-320") is B2
        assert ch.select([B2, B3], "key-319") is B2
        assert ch.select([B2, B3], "key-0") is B3

    def test_select_consistent_hash_equal_hashes_later_target_wins(self):
        """Scenario: "xcdcgeux" and "rghhdprx" both hash to 999355624; the later one owns the point."""
        x, r = target("xcdcgeux"), target("rghhdprx")
        ch = policy("CONSISTENT_HASH")
        assert ch.select([x, r], "key-0") is r
        assert ch.select([r, x], "key-0") is x
        assert ch.select([x, r], "key-100") is r  # wraps to the only point
        assert ch.select([B1, x, B3, r], "admin") is B3  # 885536276 < 999355624
        assert ch.select([B1, x, B3, r], "NULL") is B3  # 963632676 < 999355624
        assert ch.select([B1, x, B3, r], "key-0") is r

    @given(st.text(), st.permutations([B1, B2, B3]))
    def test_select_consistent_hash_is_floor_or_smallest(self, key, targets):
        chosen = policy("CONSISTENT_HASH").select(targets, key)
        h = artemis_hash(key)
        points = {artemis_hash(t.node_id): t for t in [B1, B2, B3]}
        below = [p for p in points if p <= h]
        assert chosen is points[max(below) if below else min(points)]


# -- LEAST_CONNECTIONS --


class TestLeastConnections:
    def test_select_least_connections_lowest_count_wins(self):
        lc = policy("LEAST_CONNECTIONS", counts=FakeCounts({"a": 5, "b": 2, "c": 9}), round_robin_start=0)
        assert lc.select([A, B, C], "k") is B
        assert lc.select([A, B, C], "k") is B

    def test_select_least_connections_ties_round_robin(self):
        """Scenario: a and c tie at 1; picks alternate between them, b (3) is never picked."""
        lc = policy("LEAST_CONNECTIONS", counts=FakeCounts({"a": 1, "b": 3, "c": 1}), round_robin_start=0)
        assert [lc.select([A, B, C], "k") for _ in range(4)] == [A, C, A, C]

    def test_select_least_connections_ties_start_position(self):
        lc = policy("LEAST_CONNECTIONS", counts=FakeCounts({"a": 0, "b": 0, "c": 0}), round_robin_start=2)
        assert [lc.select([A, B, C], "k") for _ in range(4)] == [C, A, B, C]

    def test_select_least_connections_unknown_counts_sort_last(self):
        """Scenario: an unknown count (None) loses to any known count, however large."""
        lc = policy("LEAST_CONNECTIONS", counts=FakeCounts({"a": None, "b": 1_000_000}), round_robin_start=0)
        assert lc.select([A, B], "k") is B
        assert lc.select([A, B, C], "k") is B  # c is not listed: unknown too

    def test_select_least_connections_all_unknown_round_robin(self):
        lc = policy("LEAST_CONNECTIONS", round_robin_start=0)
        assert [lc.select([A, B, C], "k") for _ in range(4)] == [A, B, C, A]

    def test_select_least_connections_threshold_counts_as_zero(self):
        """Scenario: threshold 10: a (9) and c (3) count as 0 and tie; b (10) is not below it."""
        counts = FakeCounts({"a": 9, "b": 10, "c": 3})
        lc = policy(
            "LEAST_CONNECTIONS", ("CONNECTION_COUNT_THRESHOLD", "10"), counts=counts, round_robin_start=0
        )
        assert [lc.select([A, B, C], "k") for _ in range(4)] == [A, C, A, C]

    def test_select_least_connections_threshold_default_zero(self):
        lc = policy("LEAST_CONNECTIONS", counts=FakeCounts({"a": 1, "b": 0}), round_robin_start=0)
        assert lc.select([A, B], "k") is B

    def test_select_least_connections_reads_counts_at_each_call(self):
        counts = FakeCounts({"a": 1, "b": 2})
        lc = policy("LEAST_CONNECTIONS", counts=counts, round_robin_start=0)
        assert lc.select([A, B], "k") is A
        counts.counts["a"] = 3
        assert lc.select([A, B], "k") is B

    @pytest.mark.parametrize("value", ["-1", "x", "1.5", ""])
    def test_policy_config_least_connections_bad_threshold_raises(self, value):
        with pytest.raises(ValueError, match="CONNECTION_COUNT_THRESHOLD"):
            PolicyConfig(name="LEAST_CONNECTIONS", properties=(("CONNECTION_COUNT_THRESHOLD", value),))

    @given(st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=50)), min_size=2, max_size=6))
    def test_select_least_connections_picks_a_minimum(self, raw_counts):
        targets = [target(f"n{i}") for i in range(len(raw_counts))]
        counts = FakeCounts({f"n{i}": c for i, c in enumerate(raw_counts)})
        chosen = policy("LEAST_CONNECTIONS", counts=counts, round_robin_start=0).select(targets, "k")
        assert chosen is not None
        known = [c for c in raw_counts if c is not None]
        chosen_count = counts.connection_count(chosen.node_id)
        if known:
            assert chosen_count == min(known)
        else:
            assert chosen is targets[0]


# -- CONSISTENT_HASH_MODULO --


class TestConsistentHashModulo:
    @pytest.mark.parametrize(
        ("modulo", "key", "expected"),
        [
            # str((hash & 0x7fffffff) % MODULO) with Java-computed hashes
            ("3", "client-42", "1"),
            ("3", "FOO-1", "2"),
            ("3", "a", "2"),
            ("3", "broker1", "0"),
            ("3", "broker2", "2"),
            ("3", "broker3", "1"),
            ("3", "key-0", "0"),
            ("7", "key-0", "6"),
            ("7", "10.0.0.3", "0"),
            ("7", "client-3", "5"),
            ("1", "anything", "0"),
        ],
    )
    def test_transform_key_modulo_exact(self, modulo, key, expected):
        assert policy("CONSISTENT_HASH_MODULO", ("MODULO", modulo)).transform_key(key) == expected

    def test_transform_key_modulo_accepts_lower_case_property(self):
        assert policy("CONSISTENT_HASH_MODULO", ("modulo", "3")).transform_key("client-42") == "1"

    @pytest.mark.parametrize(
        "properties",
        [
            (),
            (("MODULO", "0"),),
            (("MODULO", "-3"),),
            (("MODULO", "three"),),
            (("MODULO", "2.5"),),
            (("MODULO", ""),),
            (("modulo", "0"),),
        ],
    )
    def test_policy_config_modulo_bad_value_raises(self, properties):
        with pytest.raises(ValueError, match="MODULO"):
            PolicyConfig(name="CONSISTENT_HASH_MODULO", properties=properties)

    @given(st.text(), st.integers(min_value=1, max_value=1000))
    def test_transform_key_modulo_in_range(self, key, modulo):
        out = policy("CONSISTENT_HASH_MODULO", ("MODULO", str(modulo))).transform_key(key)
        assert out == str((artemis_hash(key) & 0x7FFFFFFF) % modulo)
        assert 0 <= int(out) < modulo


def test_keyed_policies_pick_by_the_key_and_the_ready_targets_alone():
    keyed = {name for name, policy in Policy.registry.items() if policy.KEYED}
    assert keyed == {"FIRST_ELEMENT", "CONSISTENT_HASH", "CONSISTENT_HASH_MODULO"}
