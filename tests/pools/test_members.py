"""Tests for pools/members.py: the member document, ZooKeeper names, and the membership diff."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.members import (
    MAX_MEMBER_BYTES,
    Member,
    Membership,
    MembershipDiff,
    Rejected,
    check_znode_path,
    parse_ensemble,
    parse_member,
    znode_name,
)
from pools.target import Connector


def doc(**fields: object) -> bytes:
    return json.dumps(fields).encode()


B1 = doc(node_id="b1", connector="tcp://10.0.0.1:61616")
B2 = doc(node_id="b2", connector="tcp://10.0.0.2:61616")
B3 = doc(node_id="b3", connector="tcp://10.0.0.3:61616")


def member(data: bytes) -> Member:
    return parse_member(data)


# -- parse_member --


class TestParseMember:
    def test_parse_member_minimal(self):
        parsed = parse_member(B1)
        assert parsed.node_id == "b1"
        assert parsed.connector == Connector(name="b1", host="10.0.0.1", port=61616)
        assert parsed.backup is None
        assert parsed.weight == 1

    def test_parse_member_all_fields(self):
        parsed = parse_member(
            doc(
                node_id="b1",
                connector="tcp://[::1]:1883?probe=mqtt;nodeId=b1",
                backup="tcp://10.0.0.9:1883",
                weight=5,
            )
        )
        assert (parsed.connector.host, parsed.connector.port, parsed.connector.probe) == ("::1", 1883, "mqtt")
        assert parsed.backup is not None
        assert parsed.backup.url == "tcp://10.0.0.9:1883"
        assert parsed.weight == 5
        assert parsed.describe() == "(tcp://[::1]:1883,tcp://10.0.0.9:1883)"

    def test_parse_member_target_is_an_ha_pair_with_the_backup(self):
        target = parse_member(
            doc(node_id="b1", connector="tcp://10.0.0.1:1883?probe=mqtt", backup="tcp://10.0.0.2:1883")
        ).target()
        assert target.node_id == "b1"
        assert target.connector is not None
        assert [m.url for m in target.connector.members] == ["tcp://10.0.0.1:1883", "tcp://10.0.0.2:1883"]
        assert all(m.probe == "mqtt" for m in target.connector.members)

    def test_parse_member_target_without_backup_is_plain(self):
        target = parse_member(B1).target()
        assert target.connector is not None
        assert target.connector.backups == ()
        assert target.local is False
        assert target.weight == 1

    def test_parse_member_target_carries_the_weight(self):
        """Scenario: the member's weight reaches the pool target (CONSISTENT_HASH RING=KETAMA)."""
        target = parse_member(doc(node_id="b1", connector="tcp://10.0.0.1:1883", weight=7)).target()
        assert target.weight == 7
        paired = parse_member(
            doc(node_id="b1", connector="tcp://10.0.0.1:1883", backup="tcp://10.0.0.2:1883", weight=3)
        ).target()
        assert paired.weight == 3

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"", "not a JSON object"),
            (b"\xff\xfe", "not UTF-8"),
            (b"[1, 2]", "must be a JSON object, got list"),
            (b'"tcp://a:1"', "must be a JSON object, got str"),
            (b'{"node_id": "b1", "node_id": "b2", "connector": "tcp://a:1"}', "key 'node_id' given twice"),
            (doc(connector="tcp://a:1"), "node_id must be a string, got None"),
            (doc(node_id=7, connector="tcp://a:1"), "node_id must be a string, got 7"),
            (doc(node_id="", connector="tcp://a:1"), "node_id must be 1-255 characters"),
            (doc(node_id="x" * 256, connector="tcp://a:1"), "node_id must be 1-255 characters"),
            (doc(node_id="a\nb", connector="tcp://a:1"), "control characters"),
            (doc(node_id="..", connector="tcp://a:1"), "must not be '.', '..'"),
            (doc(node_id="b1"), "connector must be a string, got None"),
            (doc(node_id="b1", connector="amqp://a:1"), "connector must be a tcp://host:port URL"),
            (doc(node_id="b1", connector="a:1"), "connector must be a tcp://host:port URL"),
            (doc(node_id="b1", connector="tcp://a"), "connector: connector URL must name host and port"),
            (doc(node_id="b1", connector="tcp://a:99999"), "connector: connector URL has an invalid port"),
            (doc(node_id="b1", connector="tcp://a:1?probe=ftp"), "connector: probe must be one of"),
            (doc(node_id="b1", connector="tcp://a:1?nodeId=b2"), "connector names node id 'b2'"),
            (doc(node_id="b1", connector="(tcp://a:1,tcp://b:1)"), "connector must be a tcp://host:port URL"),
            (doc(node_id="b1", connector="tcp://a:1", backup=3), "backup must be a string or absent, got 3"),
            (doc(node_id="b1", connector="tcp://a:1", backup="tcp://b:1?x=1"), "backup takes no parameters"),
            (
                doc(node_id="b1", connector="tcp://a:1", weight=0),
                "weight must be an integer 1-1000000, got 0",
            ),
            (doc(node_id="b1", connector="tcp://a:1", weight=10**7), "weight must be an integer 1-1000000"),
            (
                doc(node_id="b1", connector="tcp://a:1", weight=1.5),
                "weight must be an integer 1-1000000, got 1.5",
            ),
            (
                doc(node_id="b1", connector="tcp://a:1", weight=True),
                "weight must be an integer 1-1000000, got True",
            ),
            (
                doc(node_id="b1", connector="tcp://a:1?weight=5"),
                "connector has a weight= parameter, give the weight as weight: 'tcp://a:1'",
            ),
            (doc(node_id="b\ud800", connector="tcp://a:1"), "node_id must not hold a lone surrogate"),
            (doc(node_id="b1", connector="tcp://a:1", host="x"), "unknown key(s) 'host'"),
            (b"[" * 8000 + b"]" * 8000, "nests too deeply"),
            (b" " * (MAX_MEMBER_BYTES + 1), f"more than {MAX_MEMBER_BYTES}"),
        ],
    )
    def test_parse_member_rejects(self, data: bytes, message: str):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_member(data)

    def test_parse_member_quotes_at_most_64_bytes(self):
        with pytest.raises(ValueError, match="not a JSON object") as info:
            parse_member(b"x" * 1000)
        assert "x" * 65 not in str(info.value)

    @pytest.mark.parametrize(
        "original",
        [
            Member.from_fields(node_id="b1", connector="tcp://10.0.0.1:1883"),
            Member.from_fields(node_id="b/1 é", connector="tcp://h:1?probe=stomp;a=b%3Bc", weight=7),
            Member.from_fields(node_id="b1", connector="tcp://[::1]:1", backup="tcp://[::2]:2"),
        ],
    )
    def test_member_to_document_round_trips(self, original: Member):
        assert parse_member(original.to_document()) == original


@given(st.binary(max_size=512))
def test_parse_member_fuzz_bytes_only_member_or_value_error(data: bytes) -> None:
    try:
        parsed = parse_member(data)
    except ValueError:
        return
    assert isinstance(parsed, Member)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
_FIELD_VALUES = (
    _JSON
    | st.sampled_from(["tcp://127.0.0.1:1883", "tcp://[::1]:1?probe=mqtt", "tcp://h:0", "tcp://h:1?nodeId=x"])
    | st.text(alphabet="tcp:/[]?=;&%.0123456789abx", max_size=30)
)


@given(st.dictionaries(st.sampled_from(["node_id", "connector", "backup", "weight", "extra"]), _FIELD_VALUES))
def test_parse_member_fuzz_documents_only_member_or_value_error(fields: dict[str, object]) -> None:
    """Scenario: near-valid documents (the right keys, any JSON values) never raise anything but
    ValueError, and what parses round-trips."""
    try:
        parsed = parse_member(json.dumps(fields).encode())
    except ValueError:
        return
    assert parse_member(parsed.to_document()) == parsed


# -- names --


class TestNames:
    @pytest.mark.parametrize(
        ("node_id", "name"),
        [
            ("b1", "b1"),
            ("a/b", "a%2Fb"),
            ("50%", "50%25"),
            ("é", "%C3%A9"),
            ("a b", "a%20b"),
            ("x.y-z_~", "x.y-z_~"),
        ],
    )
    def test_znode_name(self, node_id: str, name: str):
        assert znode_name(node_id) == name

    @pytest.mark.parametrize("path", ["/fleet", "/connection-router/fleet", "/a/b.c/d-e"])
    def test_check_znode_path_accepts(self, path: str):
        assert check_znode_path(path) == path

    @pytest.mark.parametrize(
        ("path", "message"),
        [
            ("", "absolute znode path"),
            ("/", "absolute znode path"),
            ("fleet", "absolute znode path"),
            ("/fleet/", "empty, '.' or '..' segments"),
            ("//fleet", "empty, '.' or '..' segments"),
            ("/a/../b", "empty, '.' or '..' segments"),
            ("/a/./b", "empty, '.' or '..' segments"),
            ("/a\tb", "control characters"),
            ("/zookeeper/x", "inside /zookeeper"),
        ],
    )
    def test_check_znode_path_rejects(self, path: str, message: str):
        with pytest.raises(ValueError, match="path must") as info:
            check_znode_path(path)
        assert message in str(info.value)

    def test_parse_ensemble(self):
        assert parse_ensemble("127.0.0.1:2181") == (("127.0.0.1", 2181),)
        assert parse_ensemble("a:1, b:2,[::1]:3") == (("a", 1), ("b", 2), ("::1", 3))

    @pytest.mark.parametrize("text", ["", "a", "a:", ":1", "a:0", "a:65536", "a:x", "a:1,", "a:1/chroot"])
    def test_parse_ensemble_rejects(self, text: str):
        with pytest.raises(ValueError, match="connect string"):
            parse_ensemble(text)


# -- Membership --


class TestMembership:
    def test_membership_first_reading_adds_in_name_order(self):
        membership = Membership()
        diff = membership.update({"z": B3, "b": B2, "a": B1})
        assert diff == MembershipDiff(added=(member(B1), member(B2), member(B3)))
        assert list(membership.members) == ["a", "b", "z"]

    def test_membership_same_reading_changes_nothing(self):
        membership = Membership()
        membership.update({"a": B1})
        diff = membership.update({"a": B1})
        assert diff == MembershipDiff()
        assert not diff

    def test_membership_removed_and_added(self):
        membership = Membership()
        membership.update({"a": B1, "b": B2})
        assert membership.update({"b": B2, "c": B3}) == MembershipDiff(
            added=(member(B3),), removed=(member(B1),)
        )
        assert list(membership.members) == ["b", "c"]

    def test_membership_changed_document_is_an_update(self):
        membership = Membership()
        membership.update({"a": B1})
        moved = doc(node_id="b1", connector="tcp://10.9.9.9:61616")
        assert membership.update({"a": moved}) == MembershipDiff(updated=((member(B1), member(moved)),))

    def test_membership_malformed_is_rejected_once(self):
        """Scenario: a malformed znode is reported on the first reading only, again when its data
        changes, and forgotten when it goes."""
        membership = Membership()
        diff = membership.update({"a": B1, "junk": b"{"})
        assert diff.added == (member(B1),)
        assert [r.znode for r in diff.rejected] == ["junk"]
        assert "not a JSON object" in diff.rejected[0].reason
        assert membership.update({"a": B1, "junk": b"{"}) == MembershipDiff()
        assert [r.znode for r in membership.update({"a": B1, "junk": b"[]"}).rejected] == ["junk"]
        assert membership.update({"a": B1}) == MembershipDiff()
        assert [r.znode for r in membership.update({"a": B1, "junk": b"[]"}).rejected] == ["junk"]

    def test_membership_member_turning_malformed_is_removed(self):
        membership = Membership()
        membership.update({"a": B1})
        diff = membership.update({"a": b"oops"})
        assert diff.removed == (member(B1),)
        assert [r.znode for r in diff.rejected] == ["a"]
        assert membership.members == {}

    def test_membership_duplicate_node_id_keeps_the_holder(self):
        """Scenario: a second znode claiming b1 is rejected while the first holds it, and becomes
        the member once the first leaves."""
        twin = doc(node_id="b1", connector="tcp://10.0.0.99:61616")
        membership = Membership()
        membership.update({"z": B1})
        diff = membership.update({"z": B1, "a": twin})
        assert diff.added == ()
        assert diff.rejected == (
            Rejected(znode="a", reason="node id 'b1' is already registered by znode 'z'"),
        )
        assert membership.update({"z": B1, "a": twin}) == MembershipDiff()
        assert membership.update({"a": twin}) == MembershipDiff(added=(member(twin),), removed=(member(B1),))

    def test_membership_duplicates_in_one_reading_go_by_name(self):
        twin = doc(node_id="b1", connector="tcp://10.0.0.99:61616")
        diff = Membership().update({"b": twin, "a": B1})
        assert diff.added == (member(B1),)
        assert [r.znode for r in diff.rejected] == ["b"]

    def test_membership_reserved_node_id_is_rejected(self):
        membership = Membership(reserved={"b1": "the local target"})
        diff = membership.update({"a": B1, "b": B2})
        assert diff.added == (member(B2),)
        assert diff.rejected == (
            Rejected(znode="a", reason="node id 'b1' is already in the pool (the local target)"),
        )

    def test_membership_empty_reading_removes_all(self):
        membership = Membership()
        membership.update({"a": B1, "b": B2})
        assert membership.update({}) == MembershipDiff(removed=(member(B1), member(B2)))

    def test_membership_diff_is_truthy_when_anything_changed(self):
        assert MembershipDiff(rejected=(Rejected(znode="x", reason="r"),))
        assert not MembershipDiff()


@given(
    st.lists(
        st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([B1, B2, B3, b"junk", b"{}"]), max_size=6),
        max_size=6,
    )
)
def test_membership_fuzz_diff_replays_to_the_members(readings: list[dict[str, bytes]]) -> None:
    """Scenario: applying each diff to a model pool (removals, then additions) always gives the
    members the membership holds, with unique node ids."""
    membership = Membership()
    pool: dict[str, Member] = {}
    for reading in readings:
        diff = membership.update(reading)
        for gone in (*diff.removed, *(old for old, _ in diff.updated)):
            assert pool.pop(gone.node_id) == gone
        for new in (*(new for _, new in diff.updated), *diff.added):
            assert new.node_id not in pool
            pool[new.node_id] = new
        assert pool == {m.node_id: m for m in membership.members.values()}
