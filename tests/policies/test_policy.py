"""Tests for policies/policy.py: PolicyConfig, make_policy, the five Artemis policies (SPEC A3), and
CONSISTENT_HASH's ketama ring and bounded load (RING, LOAD_FACTOR)."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.hashing import artemis_hash
from policies.ketama import KetamaRing
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


TARGET_LISTS = ((B1, B2, B3), (B3, B1), (A, B1, C, B2), (B2,), (D, A), (B1, B2, B3), (C, B, A, D))


class TestConsistentHashKeptRings:
    """One policy instance keeps the rings of the target lists it met last (either ring type)."""

    @pytest.mark.parametrize("properties", [(), (("RING", "KETAMA"),)])
    @given(order=st.lists(st.integers(0, 6), max_size=30), key=st.text(max_size=12))
    def test_select_consistent_hash_kept_rings_pick_as_a_fresh_policy(self, properties, order, key):
        kept = policy("CONSISTENT_HASH", *properties)
        for i in order:
            targets = TARGET_LISTS[i]
            assert kept.select(targets, key) is policy("CONSISTENT_HASH", *properties).select(targets, key)

    def test_select_consistent_hash_keeps_at_most_four_artemis_rings(self):
        ch = policy("CONSISTENT_HASH")
        assert isinstance(ch, ConsistentHashPolicy)
        for targets in TARGET_LISTS:
            ch.select(targets, "key-0")
        assert len(ch._artemis_rings) == 4
        assert ch._rings == {}


# -- CONSISTENT_HASH with RING=KETAMA and LOAD_FACTOR --

KETAMA = ("RING", "KETAMA")
KEYS = [f"client-{i}" for i in range(3000)]


def weighted(node_id: str, weight: int) -> Target:
    connector = Connector(name=f"c-{node_id}", host="10.0.0.1", port=61616)
    return Target(node_id=node_id, connector=connector, weight=weight)


class LiveCounts:
    """A ConnectionCountSource that counts the picks made so far (every count known)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def connection_count(self, node_id: str) -> int | None:
        return self.counts[node_id]


def capacity(factor: Fraction, targets: list[Target], counts: Counter[str], target: Target) -> int:
    """ceil(c * (L + 1) * w / W), written out apart from the policy's integer form."""
    total_load = sum(counts[t.node_id] for t in targets)
    total_weight = sum(t.weight for t in targets)
    return math.ceil(factor * (total_load + 1) * target.weight / total_weight)


class TestConsistentHashRingProperties:
    @pytest.mark.parametrize(
        ("properties", "message"),
        [
            ((("RING", "ketama"),), "RING must be one of ARTEMIS, KETAMA, got 'ketama'"),
            ((("RING", ""),), "RING must be one of ARTEMIS, KETAMA, got ''"),
            ((KETAMA, ("LOAD_FACTOR", "1")), "LOAD_FACTOR must be a decimal number > 1 and <= 10"),
            ((KETAMA, ("LOAD_FACTOR", "0.5")), "got '0.5'"),
            ((KETAMA, ("LOAD_FACTOR", "125")), "got '125'"),  # HAProxy's percentage
            ((KETAMA, ("LOAD_FACTOR", "10.01")), "got '10.01'"),
            ((KETAMA, ("LOAD_FACTOR", "1e1")), "got '1e1'"),
            ((KETAMA, ("LOAD_FACTOR", "nan")), "got 'nan'"),
            ((KETAMA, ("LOAD_FACTOR", "3/2")), "got '3/2'"),
            ((KETAMA, ("LOAD_FACTOR", " 1.5")), "got ' 1.5'"),
            ((("LOAD_FACTOR", "1.25"),), "LOAD_FACTOR needs RING=KETAMA \\(got RING='ARTEMIS'\\)"),
            ((("RING", "ARTEMIS"), ("LOAD_FACTOR", "1.25")), "LOAD_FACTOR needs RING=KETAMA"),
        ],
    )
    def test_policy_config_consistent_hash_bad_ring_properties_raise(self, properties, message):
        with pytest.raises(ValueError, match=message):
            PolicyConfig(name="CONSISTENT_HASH", properties=properties)

    @pytest.mark.parametrize("value", ["1.25", "2", "10", "1.000001", "01.5"])
    def test_policy_config_consistent_hash_accepts_load_factors(self, value):
        config = PolicyConfig(name="CONSISTENT_HASH", properties=(KETAMA, ("LOAD_FACTOR", value)))
        assert config.keyed is False

    @pytest.mark.parametrize(
        ("properties", "keyed"),
        [
            ((), True),
            ((("RING", "ARTEMIS"),), True),
            ((KETAMA,), True),
            ((KETAMA, ("LOAD_FACTOR", "1.25")), False),
        ],
    )
    def test_policy_config_keyed_consistent_hash_stateful_only_with_a_load_factor(self, properties, keyed):
        config = PolicyConfig(name="CONSISTENT_HASH", properties=properties)
        assert config.keyed is keyed
        assert ConsistentHashPolicy.is_keyed(dict(properties)) is keyed

    @pytest.mark.parametrize(("name", "keyed"), [("FIRST_ELEMENT", True), ("ROUND_ROBIN", False)])
    def test_policy_config_keyed_is_the_class_flag_for_other_policies(self, name, keyed):
        assert PolicyConfig(name=name).keyed is keyed

    def test_select_consistent_hash_default_ring_is_artemis_and_ignores_weights(self):
        """Scenario: weights, and RING=ARTEMIS given explicitly, change no Artemis pick."""
        plain = [B1, B2, B3]
        heavy = [weighted("broker1", 1), weighted("broker2", 1000), weighted("broker3", 7)]
        default = policy("CONSISTENT_HASH")
        explicit = policy("CONSISTENT_HASH", ("RING", "ARTEMIS"))
        for key in KEYS[:500]:
            chosen = default.select(plain, key)
            assert chosen is not None
            assert explicit.select(plain, key) is chosen
            other = default.select(heavy, key)
            assert other is not None
            assert other.node_id == chosen.node_id


class TestConsistentHashKetama:
    def test_select_ketama_picks_the_rings_node(self):
        """Scenario: the policy's pick is the ketama ring's (tests/policies/test_ketama.py checks
        the ring against a libketama reference)."""
        targets = [A, B, C, D]
        ch = policy("CONSISTENT_HASH", KETAMA)
        ring = KetamaRing([(t.node_id, 1) for t in targets])
        for key in KEYS:
            chosen = ch.select(targets, key)
            assert chosen is not None
            assert chosen.node_id == ring.node(key)

    def test_select_ketama_differs_from_artemis(self):
        targets = [B1, B2, B3]
        ketama, artemis = policy("CONSISTENT_HASH", KETAMA), policy("CONSISTENT_HASH")
        assert any(ketama.select(targets, k) is not artemis.select(targets, k) for k in KEYS[:100])

    def test_select_ketama_ignores_pool_order(self):
        ch = policy("CONSISTENT_HASH", KETAMA)
        for key in KEYS[:500]:
            assert ch.select([C, A, D, B], key) is ch.select([A, B, C, D], key)

    def test_select_ketama_removing_a_target_moves_only_its_keys(self):
        ch = policy("CONSISTENT_HASH", KETAMA)
        before = {k: ch.select([A, B, C, D], k) for k in KEYS}
        after = {k: ch.select([A, B, D], k) for k in KEYS}
        moved = {k for k in KEYS if after[k] is not before[k]}
        assert moved == {k for k in KEYS if before[k] is C}

    def test_select_ketama_weights_skew_shares_proportionally(self):
        targets = [weighted("a", 1), weighted("b", 2), weighted("c", 5)]
        ch = policy("CONSISTENT_HASH", KETAMA)
        keys = [f"key-{i}" for i in range(20000)]
        shares = Counter(t.node_id for t in (ch.select(targets, k) for k in keys) if t is not None)
        for target in targets:
            assert shares[target.node_id] / len(keys) == pytest.approx(target.weight / 8, rel=0.2)

    def test_select_ketama_uses_node_id_not_address(self):
        ch = policy("CONSISTENT_HASH", KETAMA)
        moved = [target("a", "10.9.9.9", 1), target("b", "10.9.9.8", 2), C]
        for key in KEYS[:200]:
            chosen, other = ch.select([A, B, C], key), ch.select(moved, key)
            assert chosen is not None
            assert other is not None
            assert other.node_id == chosen.node_id

    def test_select_ketama_keeps_the_ring_while_the_targets_stay(self):
        ch = policy("CONSISTENT_HASH", KETAMA)
        assert isinstance(ch, ConsistentHashPolicy)
        ring = ch.ring([A, B, C])
        for key in KEYS[:50]:
            ch.select([A, B, C], key)
        assert ch.ring([A, B, C]) is ring
        assert ch.ring([target("a", "10.9.9.9"), B, C]) is ring  # same node ids and weights

    @pytest.mark.parametrize(
        "changed",
        [
            [A, B],  # a target left
            [A, B, C, D],  # a target joined
            [A, B, weighted("c", 2)],  # a weight changed
        ],
    )
    def test_select_ketama_rebuilds_the_ring_when_targets_change(self, changed):
        ch = policy("CONSISTENT_HASH", KETAMA)
        assert isinstance(ch, ConsistentHashPolicy)
        ring = ch.ring([A, B, C])
        other = ch.ring(changed)
        assert other is not ring
        assert other.node_ids == {t.node_id for t in changed}
        assert other.total_weight == sum(t.weight for t in changed)
        assert ch.ring([A, B, C]) is ring  # the previous list's ring is still kept

    def test_select_ketama_keeps_only_the_last_rings(self):
        """Scenario: after four other target lists, the first list's ring is built anew."""
        ch = policy("CONSISTENT_HASH", KETAMA)
        assert isinstance(ch, ConsistentHashPolicy)
        first = ch.ring([A, B])
        for others in ([A, C], [A, D], [B, C], [B, D]):
            ch.ring(others)
        assert ch.ring([A, B]) is not first
        assert len(ch._rings) == 4  # the bound itself is the scenario

    def test_select_ketama_one_target_needs_no_ring(self):
        ch = policy("CONSISTENT_HASH", KETAMA, ("LOAD_FACTOR", "1.25"), counts=FakeCounts({}))
        only = weighted("a", 3)
        assert ch.select([only], "k") is only


class TestConsistentHashBoundedLoad:
    FACTOR = Fraction("1.25")

    def bounded(self, counts: object, factor: str = "1.25") -> Policy:
        return policy("CONSISTENT_HASH", KETAMA, ("LOAD_FACTOR", factor), counts=counts)

    @pytest.mark.parametrize(
        "targets",
        [
            [A, B, C],
            [A, B, C, D],
            [weighted("a", 1), weighted("b", 2), weighted("c", 3)],
            [weighted("a", 10), weighted("b", 1)],
        ],
    )
    def test_select_bounded_load_never_exceeds_capacity(self, targets):
        """Scenario: each key adds one connection to its pick; no target ever holds more than
        ceil(1.25 * (L + 1) * w / W) at the moment it is picked."""
        live = LiveCounts()
        ch = self.bounded(live)
        for key in KEYS:
            chosen = ch.select(targets, key)
            assert chosen is not None
            assert live.counts[chosen.node_id] < capacity(self.FACTOR, targets, live.counts, chosen)
            live.counts[chosen.node_id] += 1
        total_weight = sum(t.weight for t in targets)
        for t in targets:
            assert live.counts[t.node_id] <= math.ceil(self.FACTOR * len(KEYS) * t.weight / total_weight)

    def test_select_bounded_load_balances_better_than_plain_ketama(self):
        targets = [A, B, C]
        live = LiveCounts()
        ch, plain = self.bounded(live), policy("CONSISTENT_HASH", KETAMA)
        for key in KEYS:
            chosen = ch.select(targets, key)
            assert chosen is not None
            live.counts[chosen.node_id] += 1
        plain_counts = Counter(t.node_id for t in (plain.select(targets, k) for k in KEYS) if t)
        assert max(live.counts.values()) <= max(plain_counts.values())
        assert max(live.counts.values()) <= math.ceil(1.25 * len(KEYS) / 3)

    def test_select_bounded_load_idle_targets_pick_as_plain_ketama(self):
        ch = self.bounded(FakeCounts({"a": 0, "b": 0, "c": 0}))
        plain = policy("CONSISTENT_HASH", KETAMA)
        for key in KEYS[:500]:
            assert ch.select([A, B, C], key) is plain.select([A, B, C], key)

    @pytest.mark.parametrize("counts", [None, FakeCounts({})])
    def test_select_bounded_load_without_counts_picks_as_plain_ketama(self, counts):
        """Scenario: no count is known (no source, as in `routerctl route`, or all unknown)."""
        ch = self.bounded(counts)
        plain = policy("CONSISTENT_HASH", KETAMA)
        for key in KEYS[:500]:
            assert ch.select([A, B, C], key) is plain.select([A, B, C], key)

    def test_select_bounded_load_full_owner_passes_the_key_clockwise(self):
        """Scenario: the key's own target holds 10 of 10 connections, so capacity is
        ceil(1.25 * 11 / 3) = 5: the key goes to the next target clockwise."""
        targets = [A, B, C]
        plain = policy("CONSISTENT_HASH", KETAMA)
        assert isinstance(plain, ConsistentHashPolicy)
        ring = plain.ring(targets)
        for key in KEYS[:200]:
            owner, following = list(ring.walk(key))[:2]
            loads: dict[str, int | None] = {"a": 0, "b": 0, "c": 0, owner: 10}
            ch = self.bounded(FakeCounts(loads))
            chosen = ch.select(targets, key)
            assert chosen is not None
            assert chosen.node_id == following

    def test_select_bounded_load_passes_over_unknown_counts(self):
        targets = [A, B, C]
        plain = policy("CONSISTENT_HASH", KETAMA)
        assert isinstance(plain, ConsistentHashPolicy)
        ring = plain.ring(targets)
        for key in KEYS[:200]:
            owner, following, last = ring.walk(key)
            ch = self.bounded(FakeCounts({owner: None, following: 0, last: 0}))
            chosen = ch.select(targets, key)
            assert chosen is not None
            assert chosen.node_id == following

    def test_select_bounded_load_every_target_full_takes_the_owner(self):
        """Scenario: only an unknown-count target has room (no known count below capacity)."""
        targets = [A, B, C]
        plain = policy("CONSISTENT_HASH", KETAMA)
        for key in KEYS[:200]:
            owner = plain.select(targets, key)
            assert owner is not None
            counts = FakeCounts({t.node_id: None for t in targets})
            assert self.bounded(counts).select(targets, key) is owner

    def test_select_bounded_load_reads_counts_at_each_call(self):
        counts = FakeCounts({"a": 0, "b": 0, "c": 0})
        ch = self.bounded(counts)
        key = KEYS[0]
        first = ch.select([A, B, C], key)
        assert first is not None
        counts.counts[first.node_id] = 100
        second = ch.select([A, B, C], key)
        assert second is not None
        assert second is not first
        counts.counts[first.node_id] = 0
        assert ch.select([A, B, C], key) is first

    def test_select_bounded_load_exact_capacity_boundary(self):
        """Scenario: factor 1.5 and 2 connections, L + 1 = 3: a weight-1 target of 3 may hold
        ceil(1.5 * 3 / 3) = 2, so an owner holding both is full, one holding one of them is not."""
        targets = [A, B, C]
        plain = policy("CONSISTENT_HASH", KETAMA)
        for key in KEYS[:100]:
            owner = plain.select(targets, key)
            assert owner is not None
            second, third = (t.node_id for t in targets if t is not owner)
            full = self.bounded(FakeCounts({owner.node_id: 2, second: 0, third: 0}), "1.5")
            assert full.select(targets, key) is not owner
            room = self.bounded(FakeCounts({owner.node_id: 1, second: 1, third: 0}), "1.5")
            assert room.select(targets, key) is owner


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


# -- slow start of the weights --


class FakeRamping:
    """A SlowStartSource with fixed shares (targets not listed are at full share)."""

    def __init__(self, shares: dict[str, float]) -> None:
        self.shares = shares

    def ramping(self) -> dict[str, float]:
        return self.shares


class TestSlowStart:
    def test_round_robin_unchanged_when_nothing_ramps(self):
        rr = policy("ROUND_ROBIN", round_robin_start=0, slow_start=FakeRamping({}))
        assert [rr.select([A, B, C], "k") for _ in range(7)] == [A, B, C, A, B, C, A]

    def test_round_robin_gives_a_ramping_target_its_share_of_the_turns(self):
        """Scenario: b at share 0.25 takes every fourth of its turns; the turns it passes go to the
        next target: over 90 picks b gets 90 * 0.25 / 2.25 = 10, a and c 40 each."""
        rr = policy("ROUND_ROBIN", round_robin_start=0, slow_start=FakeRamping({"b": 0.25}))
        picks = Counter(t.node_id for t in (rr.select([A, B, C], "k") for _ in range(90)) if t)
        assert picks == {"a": 40, "b": 10, "c": 40}

    def test_round_robin_credit_forgotten_when_slow_start_ends(self):
        """Scenario: after slow start, b's saved-up credit does not give it extra turns."""
        ramping = FakeRamping({"b": 0.5})
        rr = policy("ROUND_ROBIN", round_robin_start=0, slow_start=ramping)
        assert [rr.select([A, B], "k") for _ in range(2)] == [A, A]  # b passed: credit 0.5 saved up
        ramping.shares = {}
        assert [rr.select([A, B], "k") for _ in range(4)] == [B, A, B, A]
        ramping.shares = {"b": 0.5}
        # From credit 0 again: b passes its next turn (with the old 0.5 kept it would take it).
        assert [rr.select([A, B], "k") for _ in range(3)] == [A, B, A]

    def test_round_robin_every_target_ramping_still_picks(self):
        rr = policy("ROUND_ROBIN", round_robin_start=0, slow_start=FakeRamping({"a": 0.05, "b": 0.05}))
        picks = [rr.select([A, B], "k") for _ in range(10)]
        assert Counter(t.node_id for t in picks if t) == {"a": 5, "b": 5}

    @given(st.floats(min_value=0.05, max_value=0.99), st.integers(min_value=2, max_value=5))
    def test_round_robin_ramping_share_is_s_over_n_minus_1_plus_s(self, share, n):
        targets = [target(f"n{i}") for i in range(n)]
        rr = policy("ROUND_ROBIN", round_robin_start=0, slow_start=FakeRamping({"n0": share}))
        picks = [rr.select(targets, "k") for _ in range(2000)]
        taken = sum(1 for t in picks if t is targets[0]) / len(picks)
        assert taken == pytest.approx(share / (n - 1 + share), abs=0.01)

    def test_least_connections_ramping_target_fills_to_its_share(self):
        """Scenario: b returned empty at share 0.1 against a and c with 100 each: b is picked while
        (count + 1) / 0.1 < 101, so up to 10 connections, then a and c (tie) again."""
        live = LiveCounts()
        live.counts.update({"a": 100, "c": 100})
        lc = policy("LEAST_CONNECTIONS", counts=live, round_robin_start=0, slow_start=FakeRamping({"b": 0.1}))
        for _ in range(10):
            chosen = lc.select([A, B, C], "k")
            assert chosen is B
            live.counts["b"] += 1
        assert lc.select([A, B, C], "k") is A

    def test_least_connections_unchanged_when_nothing_ramps(self):
        counts = FakeCounts({"a": 1, "b": 3, "c": 1})
        lc = policy("LEAST_CONNECTIONS", counts=counts, round_robin_start=0, slow_start=FakeRamping({}))
        assert [lc.select([A, B, C], "k") for _ in range(4)] == [A, C, A, C]

    def test_ketama_without_load_factor_keeps_every_key_on_its_target(self):
        """Hash policies keep their key -> target mapping during slow start (only the admission
        ramps, in the target's gate)."""
        plain = policy("CONSISTENT_HASH", KETAMA)
        ramping = policy("CONSISTENT_HASH", KETAMA, slow_start=FakeRamping({"b": 0.05}))
        for key in KEYS[:500]:
            assert ramping.select([A, B, C], key) is plain.select([A, B, C], key)

    def test_bounded_ketama_ramping_target_capacity_scales_with_its_share(self):
        """Scenario: LOAD_FACTOR 1.25 over a, b, c (weight 1 each), b at share 0.2. Keys pile up
        one connection per pick: b never holds more than ceil(1.25 * (L + 1) * 0.2 / 2.2) at its
        pick, so it ends with about a tenth of the keys instead of a third; keys b passes over go
        clockwise to another target."""
        live = LiveCounts()
        ch = policy(
            "CONSISTENT_HASH",
            KETAMA,
            ("LOAD_FACTOR", "1.25"),
            counts=live,
            slow_start=FakeRamping({"b": 0.2}),
        )
        for key in KEYS:
            chosen = ch.select([A, B, C], key)
            assert chosen is not None
            if chosen is B:
                total = sum(live.counts.values())
                assert live.counts["b"] < math.ceil(1.25 * (total + 1) * 0.2 / 2.2)
            live.counts[chosen.node_id] += 1
        assert live.counts["b"] <= math.ceil(1.25 * len(KEYS) * 0.2 / 2.2)
        assert live.counts["b"] >= len(KEYS) * 0.2 / 2.2 * 0.8


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


@pytest.mark.parametrize(
    ("name", "properties", "reads"),
    [
        ("FIRST_ELEMENT", (), False),
        ("ROUND_ROBIN", (), False),
        ("CONSISTENT_HASH", (), False),
        ("CONSISTENT_HASH", (("RING", "KETAMA"), ("LOAD_FACTOR", "1.25")), True),
        ("LEAST_CONNECTIONS", (), True),
    ],
)
def test_reads_counts_says_which_picks_read_connection_counts(
    name: str, properties: tuple[tuple[str, str], ...], reads: bool
) -> None:
    assert make_policy(PolicyConfig(name=name, properties=properties)).reads_counts is reads
