"""Tests for policies/ketama.py: the ketama ring against an independent libketama reference."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.ketama import KETAMA_VNODES, KetamaRing, ketama_hash

# md5 test vectors of RFC 1321 §A.5; ketama_hashi is the first 4 digest bytes, little-endian.
#   md5("")    = d41d8cd98f00b204e9800998ecf8427e -> d4 1d 8c d9 -> 0xd98c1dd4
#   md5("a")   = 0cc175b9c0f1b6a831c399e269772661 -> 0c c1 75 b9 -> 0xb975c10c
#   md5("abc") = 900150983cd24fb0d6963f7d28e17f72 -> 90 01 50 98 -> 0x98500190
RFC1321_KETAMA_HASHES = [("", 0xD98C1DD4), ("a", 0xB975C10C), ("abc", 0x98500190)]


def reference_continuum(servers: dict[str, int]) -> list[tuple[int, str]]:
    """libketama's `ketama_create_continuum`, written from its C source without uhashring.

    Each server gets floor(40 * n * weight / total) md5 digests of "<name>-<k>", 4 points each
    (bytes 4h..4h+3, little-endian). libketama computes the floor in float; exact integers here.
    """
    total = sum(servers.values())
    points: list[tuple[int, str]] = []
    for name, weight in servers.items():
        for k in range(40 * len(servers) * weight // total):
            digest = hashlib.md5(f"{name}-{k}".encode()).digest()
            points.extend((int.from_bytes(digest[4 * h : 4 * h + 4], "little"), name) for h in range(4))
    return sorted(points)


def reference_get(points: list[tuple[int, str]], key: str) -> str:
    """libketama's `ketama_get_server`: the first point >= the key's hash, wrapping to the first."""
    h = int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "little")
    return next((name for point, name in points if point >= h), points[0][1])


KEYS = [f"client-{i}" for i in range(2000)] + [f"10.0.{i // 256}.{i % 256}" for i in range(500)]


@pytest.mark.parametrize(("text", "expected"), RFC1321_KETAMA_HASHES)
def test_ketama_hash_rfc1321_vectors(text, expected):
    assert ketama_hash(text) == expected


def test_ketama_hash_takes_a_lone_surrogate():
    assert ketama_hash("a\ud800") == int.from_bytes(hashlib.md5(b"a\xed\xa0\x80").digest()[:4], "little")


@given(st.text())
def test_ketama_hash_is_32_bit(text):
    assert 0 <= ketama_hash(text) < 2**32


@pytest.mark.parametrize(
    "servers",
    [
        {"broker1": 1, "broker2": 1, "broker3": 1},
        {"a": 1, "b": 2, "c": 3},
        {f"node-{i}": 1 for i in range(10)},
        {"10.0.0.1:11211": 600, "10.0.0.2:11211": 400},  # libketama's own example weights
    ],
)
def test_ketama_ring_picks_what_libketama_picks(servers):
    ring = KetamaRing(list(servers.items()))
    points = reference_continuum(servers)
    assert len(ring) == len(points)
    assert [ring.node(key) for key in KEYS] == [reference_get(points, key) for key in KEYS]


def test_ketama_ring_has_160_points_per_target_at_equal_weights():
    assert KETAMA_VNODES == 40
    assert len(KetamaRing([("a", 1), ("b", 1), ("c", 1)])) == 3 * 160
    assert len(KetamaRing([("a", 5), ("b", 5)])) == 2 * 160


def test_ketama_ring_key_on_a_point_belongs_to_that_point():
    """Scenario: "b-7" hashes exactly to the first point of b's 8th digest (libketama: >=)."""
    ring = KetamaRing([("a", 1), ("b", 1), ("c", 1)])
    for node in "abc":
        for k in range(KETAMA_VNODES):
            assert ring.node(f"{node}-{k}") == node


def test_ketama_ring_ignores_node_order():
    forward = KetamaRing([("a", 1), ("b", 2), ("c", 1)])
    backward = KetamaRing([("c", 1), ("b", 2), ("a", 1)])
    assert [forward.node(k) for k in KEYS] == [backward.node(k) for k in KEYS]


def test_ketama_ring_wraps_past_the_top():
    ring = KetamaRing([("a", 1), ("b", 1)])
    points = reference_continuum({"a": 1, "b": 1})
    above = next(f"k{i}" for i in range(10**6) if ketama_hash(f"k{i}") > points[-1][0])
    assert ring.index(above) == 0
    assert ring.node(above) == points[0][1]


def test_ketama_ring_removing_a_node_moves_only_its_keys():
    full = KetamaRing([(f"n{i}", 1) for i in range(5)])
    less = KetamaRing([(f"n{i}", 1) for i in range(5) if i != 2])
    moved = [k for k in KEYS if full.node(k) != less.node(k)]
    assert moved
    assert all(full.node(k) == "n2" for k in moved)
    assert all(less.node(k) == full.node(k) for k in KEYS if full.node(k) != "n2")


def test_ketama_ring_adding_a_node_moves_keys_only_to_it():
    less = KetamaRing([(f"n{i}", 1) for i in range(4)])
    full = KetamaRing([(f"n{i}", 1) for i in range(5)])
    moved = [k for k in KEYS if full.node(k) != less.node(k)]
    assert moved
    assert {full.node(k) for k in moved} == {"n4"}


def test_ketama_ring_weights_give_proportional_shares():
    ring = KetamaRing([("light", 1), ("middle", 2), ("heavy", 3)])
    keys = [f"key-{i}" for i in range(30000)]
    shares = Counter(ring.node(k) for k in keys)
    for node, weight in [("light", 1), ("middle", 2), ("heavy", 3)]:
        assert shares[node] / len(keys) == pytest.approx(weight / 6, rel=0.2), shares


def test_ketama_ring_a_tiny_weight_may_own_no_point():
    """Scenario: floor(40 * 2 * 1 / 1000001) = 0 digests: the light node owns no point."""
    ring = KetamaRing([("light", 1), ("heavy", 1_000_000)])
    assert ring.node_ids == {"light", "heavy"}
    assert ring.total_weight == 1_000_001
    assert {ring.node(k) for k in KEYS[:200]} == {"heavy"}
    assert list(ring.walk("k")) == ["heavy"]


def test_ketama_ring_walk_starts_at_the_owner_and_gives_each_node_once():
    nodes = [(f"n{i}", 1) for i in range(6)]
    ring = KetamaRing(nodes)
    for key in KEYS[:300]:
        order = list(ring.walk(key))
        assert order[0] == ring.node(key)
        assert sorted(order) == sorted(n for n, _ in nodes)


def test_ketama_ring_walk_follows_the_ring():
    """Scenario: the walk's second node owns the first point after the key's run of owner points."""
    servers = {"a": 1, "b": 1, "c": 1}
    ring = KetamaRing(list(servers.items()))
    points = reference_continuum(servers)
    for key in KEYS[:300]:
        i = ring.index(key)
        owner = points[i][1]
        following = [name for _, name in points[i:] + points[:i] if name != owner]
        assert list(ring.walk(key))[:2] == [owner, following[0]]


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        ([], "at least one node"),
        ([("a", 1), ("a", 2)], "distinct"),
        ([("a", 0)], "weights must be >= 1"),
    ],
)
def test_ketama_ring_rejects_bad_nodes(nodes, reason):
    with pytest.raises(ValueError, match=reason):
        KetamaRing(nodes)
