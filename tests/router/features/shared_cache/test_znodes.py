"""Tests for router/features/shared_cache/znodes.py: znode names of keys, entry data, when to extend."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.members import check_znode_path
from router.features.shared_cache.znodes import BUCKETS, SharedEntry, key_of, touch_due, znode_of


@given(st.text(min_size=1, max_size=300))
def test_every_key_has_a_valid_znode_that_names_it_back(key):
    path = znode_of("/cache", key)
    parent, _, name = path.rpartition("/")
    assert check_znode_path(path) == path
    assert parent.startswith("/cache/")
    assert int(parent[-2:], 16) < BUCKETS
    assert key_of(name) == key


def test_keys_spread_over_the_buckets():
    buckets = {znode_of("/c", f"client-{i}").split("/")[2] for i in range(5000)}
    assert len(buckets) == BUCKETS


@pytest.mark.parametrize("name", ["x", "k!!", "k\u00e9"])
def test_names_that_are_not_ours_are_no_key(name):
    assert key_of(name) is None


def test_entry_round_trips_through_its_data():
    entry = SharedEntry(node_id="b1", until=1764000000.5)
    assert entry.to_data() == b'{"node_id":"b1","until":1764000000.5}'
    assert SharedEntry.from_data(entry.to_data(), 7) == SharedEntry(
        node_id="b1", until=1764000000.5, version=7
    )
    assert SharedEntry.from_data(b'{"node_id":"b1","until":null}', 0) == SharedEntry(
        node_id="b1", until=None, version=0
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"until": 1}',
        b'{"node_id": "", "until": 1}',
        b'{"node_id": 3, "until": 1}',
        b'{"node_id": "b", "until": "soon"}',
        b'{"node_id": "b", "until": true}',
        b'{"node_id": "b", "until": 1e999}',
        b'{"node_id": "' + b"b" * 5000 + b'", "until": 1}',
    ],
)
def test_data_that_is_not_an_entry_is_none(data):
    assert SharedEntry.from_data(data, 0) is None


def test_expiry_and_when_to_extend():
    entry = SharedEntry(node_id="b", until=100.0)
    assert not entry.expired(99.9)
    assert entry.expired(100.0)
    assert not touch_due(entry, 49.0, 100.0)  # 51 s of 100 left
    assert touch_due(entry, 51.0, 100.0)
    assert not touch_due(SharedEntry(node_id="b", until=None), 1e12, 100.0)
