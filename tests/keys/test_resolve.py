"""Tests for keys/resolve.py: key types, connection facts and SPEC A1 steps 0-2 (A2 key types)."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from keys.filter import KeyFilter, compile_filter
from keys.resolve import (
    DEFAULT_KEY_MAX_LENGTH,
    INTERNAL_CLIENT_ID_PREFIX,
    NULL_KEY,
    ConnectionFacts,
    KeyType,
    is_internal_client_id,
    raw_value,
    resolve_key,
)

ALL_FACTS = ConnectionFacts(
    source_ip="10.0.0.7",
    client_id="client-42",
    user_name="alice",
    sni_host="broker.example.com",
    roles=("guest", "admin"),
)


def _filter(pattern: str) -> KeyFilter:
    compiled = compile_filter(pattern, "key-filter")
    assert compiled is not None
    return compiled


def test_null_key_is_literal_null():
    assert NULL_KEY == "NULL"


def test_internal_client_id_prefix_is_artemis_prefix():
    # Artemis: DEFAULT_INTERNAL_NAMING_PREFIX ("$.artemis.internal.") + "router.client."
    assert INTERNAL_CLIENT_ID_PREFIX == "$.artemis.internal.router.client."


def test_key_type_names_are_artemis_names():
    assert {k.value for k in KeyType} == {"CLIENT_ID", "SNI_HOST", "SOURCE_IP", "USER_NAME", "ROLE_NAME"}
    assert KeyType("CLIENT_ID") is KeyType.CLIENT_ID


class TestIsInternalClientId:
    @pytest.mark.parametrize(
        "client_id",
        ["$.artemis.internal.router.client.", "$.artemis.internal.router.client.router-2.probe"],
    )
    def test_is_internal_client_id_with_prefix(self, client_id):
        assert is_internal_client_id(client_id) is True

    @pytest.mark.parametrize(
        "client_id",
        [
            None,
            "",
            "client-42",
            "$.artemis.internal.router.client",  # prefix without its final dot
            "$.artemis.internal.",
            "x$.artemis.internal.router.client.a",  # prefix not at the start
            "$.ARTEMIS.internal.router.client.a",  # case matters, as Java's startsWith
        ],
    )
    def test_is_internal_client_id_without_prefix(self, client_id):
        assert is_internal_client_id(client_id) is False


class TestResolveKeyRawValue:
    """SPEC A2: which fact each key type reads, without a filter."""

    @pytest.mark.parametrize(
        ("key_type", "expected"),
        [
            (KeyType.CLIENT_ID, "client-42"),
            (KeyType.SNI_HOST, "broker.example.com"),
            (KeyType.SOURCE_IP, "10.0.0.7"),
            (KeyType.USER_NAME, "alice"),
            (KeyType.ROLE_NAME, "guest"),
        ],
    )
    def test_resolve_key_reads_fact_of_key_type(self, key_type, expected):
        assert resolve_key(key_type, None, ALL_FACTS) == expected

    @pytest.mark.parametrize("key_type", list(KeyType))
    def test_resolve_key_missing_value_is_null(self, key_type):
        assert resolve_key(key_type, None, ConnectionFacts()) == NULL_KEY

    @pytest.mark.parametrize("key_type", list(KeyType))
    def test_resolve_key_missing_value_with_filter_is_null(self, key_type):
        """Scenario: the filter is not applied to a missing value (it would find "U" in "NULL")."""
        assert resolve_key(key_type, _filter("U"), ConnectionFacts()) == NULL_KEY

    def test_resolve_key_empty_client_id_is_null(self):
        """Scenario: an empty value counts as missing (the implementation's documented decision)."""
        assert resolve_key(KeyType.CLIENT_ID, None, ConnectionFacts(client_id="")) == NULL_KEY

    def test_resolve_key_other_facts_do_not_leak(self):
        facts = ConnectionFacts(source_ip="10.0.0.7", user_name="alice")
        assert resolve_key(KeyType.CLIENT_ID, None, facts) == NULL_KEY
        assert resolve_key(KeyType.SNI_HOST, None, facts) == NULL_KEY
        assert resolve_key(KeyType.ROLE_NAME, None, facts) == NULL_KEY


class TestResolveKeyFilter:
    """SPEC A1 step 2: `re.search`, whole match kept, no match -> NULL."""

    def test_resolve_key_filter_keeps_whole_match(self):
        facts = ConnectionFacts(client_id="FOO-1-bar")
        assert resolve_key(KeyType.CLIENT_ID, _filter("FOO-[0-9]"), facts) == "FOO-1"

    def test_resolve_key_filter_ignores_capture_groups(self):
        """Scenario: group 0 is the key even when the filter has capture groups."""
        facts = ConnectionFacts(client_id="xx-FOO-123-yy")
        assert resolve_key(KeyType.CLIENT_ID, _filter(r"FOO-(\d+)"), facts) == "FOO-123"

    def test_resolve_key_filter_searches_not_only_at_start(self):
        facts = ConnectionFacts(user_name="team-blue-user")
        assert resolve_key(KeyType.USER_NAME, _filter("blue|red"), facts) == "blue"

    def test_resolve_key_filter_without_match_is_null(self):
        facts = ConnectionFacts(client_id="BAR-1")
        assert resolve_key(KeyType.CLIENT_ID, _filter("FOO-[0-9]"), facts) == NULL_KEY

    def test_resolve_key_filter_first_match_wins(self):
        facts = ConnectionFacts(client_id="a1b22c333")
        assert resolve_key(KeyType.CLIENT_ID, _filter(r"\d+"), facts) == "1"

    def test_resolve_key_filter_on_source_ip(self):
        facts = ConnectionFacts(source_ip="192.168.10.20")
        assert resolve_key(KeyType.SOURCE_IP, _filter(r"^\d+\.\d+"), facts) == "192.168"

    @given(st.text(min_size=1))
    def test_resolve_key_without_filter_returns_value_unchanged(self, value):
        assert resolve_key(KeyType.CLIENT_ID, None, ConnectionFacts(client_id=value)) == value

    @given(st.text(min_size=1), st.text(min_size=1, max_size=3))
    def test_resolve_key_literal_filter_gives_needle_or_null(self, value, needle):
        """Scenario: a literal filter yields the needle when it occurs in the value, else NULL
        (matched by RE2, as every filter is)."""
        assume(needle.strip())  # a blank filter is no filter (SPEC A7)
        key = resolve_key(KeyType.CLIENT_ID, _filter(re.escape(needle)), ConnectionFacts(client_id=value))
        assert key == (needle if needle in value else NULL_KEY)


class TestResolveKeyMaxLength:
    """Our <key-max-length>: a longer raw value counts as missing (hardening finding 4)."""

    def test_resolve_key_at_the_cap_is_kept_over_it_is_null(self):
        facts = ConnectionFacts(client_id="x" * 8)
        assert resolve_key(KeyType.CLIENT_ID, None, facts, max_length=8) == "x" * 8
        assert resolve_key(KeyType.CLIENT_ID, None, facts, max_length=7) == NULL_KEY

    def test_resolve_key_caps_the_raw_value_before_the_filter(self):
        """Scenario: the filter never runs over an overlong value, even one it would cut short."""
        facts = ConnectionFacts(client_id="abc" + "x" * 2000)
        assert resolve_key(KeyType.CLIENT_ID, _filter("^..."), facts, max_length=1024) == NULL_KEY

    def test_resolve_key_default_cap(self):
        facts = ConnectionFacts(client_id="y" * (DEFAULT_KEY_MAX_LENGTH + 1))
        assert resolve_key(KeyType.CLIENT_ID, None, facts) == NULL_KEY


class TestResolveKeyRoleName:
    """SPEC A2 ROLE_NAME: first role in store order the filter finds; key = matched text."""

    def test_resolve_key_role_name_without_filter_is_first_role(self):
        facts = ConnectionFacts(roles=("viewer", "admin", "amq"))
        assert resolve_key(KeyType.ROLE_NAME, None, facts) == "viewer"

    def test_resolve_key_role_name_filter_takes_first_role_in_store_order(self):
        """Scenario: two roles match; the earlier one in store order wins, not the alphabetical one."""
        facts = ConnectionFacts(roles=("viewer", "team-zeta", "team-alpha"))
        assert resolve_key(KeyType.ROLE_NAME, _filter("team-[a-z]+"), facts) == "team-zeta"

    def test_resolve_key_role_name_filter_gives_matched_text(self):
        facts = ConnectionFacts(roles=("guest", "broker-admins"))
        assert resolve_key(KeyType.ROLE_NAME, _filter("admin"), facts) == "admin"

    def test_resolve_key_role_name_filter_without_matching_role_is_null(self):
        facts = ConnectionFacts(roles=("guest", "viewer"))
        assert resolve_key(KeyType.ROLE_NAME, _filter("admin"), facts) == NULL_KEY

    def test_resolve_key_role_name_no_roles_is_null(self):
        assert resolve_key(KeyType.ROLE_NAME, None, ConnectionFacts(user_name="alice")) == NULL_KEY
        assert resolve_key(KeyType.ROLE_NAME, _filter("a"), ConnectionFacts(roles=())) == NULL_KEY


class TestConnectionFactsSourceIp:
    """ConnectionFacts normalises the source address so equal peers give equal SOURCE_IP keys."""

    @pytest.mark.parametrize(
        ("given_ip", "expected"),
        [
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]", "::1"),
            ("::1", "::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("[::ffff:10.1.2.3]", "10.1.2.3"),
            ("::ffff:7f00:2", "127.0.0.2"),
        ],
    )
    def test_connection_facts_normalises_source_ip(self, given_ip, expected):
        facts = ConnectionFacts(source_ip=given_ip)
        assert facts.source_ip == expected
        assert resolve_key(KeyType.SOURCE_IP, None, facts) == expected

    def test_connection_facts_source_ip_none_stays_none(self):
        assert ConnectionFacts().source_ip is None

    @pytest.mark.parametrize("bad", ["not-an-ip", "10.0.0.256", "10.0.0.1:5672"])
    def test_connection_facts_rejects_non_ip_source(self, bad):
        with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
            ConnectionFacts(source_ip=bad)

    @given(st.ip_addresses(v=4))
    def test_connection_facts_canonical_ipv4_shortcut_matches_ipaddress(self, address):
        assert ConnectionFacts(source_ip=str(address)).source_ip == str(address)

    @pytest.mark.parametrize("spelling", ["010.0.0.1", "10.0.0.01", "1.2.3.4 ", "256.1.1.1", "1.2.3"])
    def test_connection_facts_non_canonical_ipv4_takes_the_full_parse(self, spelling):
        with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
            ConnectionFacts(source_ip=spelling)

    @given(st.ip_addresses(v=4))
    def test_connection_facts_ipv4_mapped_equals_ipv4(self, address):
        assert ConnectionFacts(source_ip=f"::ffff:{address}").source_ip == str(address)
        assert ConnectionFacts(source_ip=f"[::ffff:{address}]").source_ip == str(address)

    def test_connection_facts_is_frozen(self):
        facts = ConnectionFacts(client_id="c")
        with pytest.raises(AttributeError):
            facts.client_id = "d"  # type: ignore[misc]  # the assignment itself is what is tested


def test_raw_value_is_the_fact_before_any_filter():
    facts = ConnectionFacts(source_ip="10.0.0.1", client_id="c", roles=("a", "b"))
    assert raw_value(KeyType.CLIENT_ID, facts) == "c"
    assert raw_value(KeyType.SOURCE_IP, facts) == "10.0.0.1"
    assert raw_value(KeyType.USER_NAME, facts) is None
    assert raw_value(KeyType.ROLE_NAME, facts) == ("a", "b")
