"""Tests for router/config/values.py: the value kinds and the one wording of each rule."""

from __future__ import annotations

import re

import pytest

from keys import KeyType
from router.config.values import (
    ARTEMIS_PROTOCOLS,
    LONG_MAX,
    ValueKind,
    check,
    is_valid,
    one_of,
    parse_flag,
    parse_integer,
    parse_names,
    reason,
)


class TestOneOf:
    def test_one_of_two_choices_reads_a_or_b(self):
        assert one_of(("v1", "v2")) == "must be v1 or v2"

    def test_one_of_more_choices_lists_them(self):
        assert one_of(["proxy", "redirect", "auto"]) == "must be one of proxy, redirect, auto"


class TestReason:
    @pytest.mark.parametrize(
        ("kind", "value", "expected"),
        [
            (ValueKind.POSITIVE, "0", "must be > 0, got '0'"),
            (ValueKind.POSITIVE, "abc", "must be an integer > 0, got 'abc'"),
            (ValueKind.POSITIVE, "1.5", "must be an integer > 0, got '1.5'"),
            (ValueKind.POSITIVE, 0, "must be > 0, got 0"),
            (ValueKind.NON_NEGATIVE, "-1", "must be >= 0, got '-1'"),
            (ValueKind.NON_NEGATIVE, "3s", "must be an integer >= 0, got '3s'"),
            (ValueKind.TTL, "0", "must be -1 (off) or > 0, got '0'"),
            (ValueKind.TTL, -2, "must be -1 (off) or > 0, got -2"),
            (ValueKind.TTL, "1 min", "must be -1 (off) or an integer > 0, got '1 min'"),
            (ValueKind.PORT, 65536, "must be 0-65535, got 65536"),
            (ValueKind.SNIFF_CAP, "10", "must be 64-1048576, got '10'"),
            (ValueKind.SNIFF_CAP, "big", "must be an integer 64-1048576, got 'big'"),
            (ValueKind.BOOLEAN, "yes", "must be true or false, got 'yes'"),
            (ValueKind.FLAG, "1", "must be true or false, got '1'"),
            (ValueKind.NAME, "", "must not be empty, got ''"),
            (
                ValueKind.PROTOCOL,
                "FOO",
                "must be one of AMQP, CORE, HORNETQ, MQTT, OPENWIRE, STOMP, got 'FOO'",
            ),
        ],
    )
    def test_reason_words_the_rule_for_the_value(self, kind, value, expected):
        assert reason(kind, value) == expected

    @pytest.mark.parametrize("kind", [ValueKind.POSITIVE, ValueKind.NON_NEGATIVE, ValueKind.TTL])
    def test_reason_above_long_max_gives_the_bound(self, kind):
        assert reason(kind, str(LONG_MAX + 1)) == f"must be at most {LONG_MAX}, got '{LONG_MAX + 1}'"

    def test_reason_key_type_lists_every_key_type(self):
        expected = f"must be one of {', '.join(k.value for k in KeyType)}, got 'IP'"
        assert reason(ValueKind.KEY_TYPE, "IP") == expected


class TestIsValid:
    @pytest.mark.parametrize(
        ("kind", "good", "bad"),
        [
            (ValueKind.POSITIVE, ["1", "+5", str(LONG_MAX)], ["0", "-1", "", "1_000", str(LONG_MAX + 1)]),
            (ValueKind.NON_NEGATIVE, ["0", "7"], ["-1", "x"]),
            (ValueKind.TTL, ["-1", "1", str(LONG_MAX)], ["0", "-2", "1m"]),
            (ValueKind.PORT, ["0", "65535"], ["-1", "65536"]),
            (ValueKind.SNIFF_CAP, ["64", "16384", "1048576"], ["63", "1048577"]),
            (ValueKind.BOOLEAN, ["true", "FALSE", "1", "0"], ["yes", ""]),
            (ValueKind.FLAG, ["true", "False"], ["1", "0", "yes"]),
            (ValueKind.KEY_TYPE, ["SOURCE_IP", "ROLE_NAME"], ["source_ip", "IP"]),
            (ValueKind.NAME, ["a"], ["", "  "]),
            (ValueKind.PROTOCOL, [*ARTEMIS_PROTOCOLS, "mqtt", "OpenWire"], ["FOO", "", "MQTT5", "TLS"]),
        ],
    )
    def test_is_valid(self, kind, good, bad):
        assert [is_valid(kind, text) for text in good] == [True] * len(good)
        assert [is_valid(kind, text) for text in bad] == [False] * len(bad)


class TestCheck:
    def test_check_accepts_a_valid_value(self):
        check(ValueKind.TTL, "connectionTtl", -1)
        check(ValueKind.NAME, "connection-router name", "r")

    def test_check_names_the_field_and_quotes_nothing_for_ints(self):
        with pytest.raises(ValueError, match=re.escape("connectionTtl must be -1 (off) or > 0, got 0")):
            check(ValueKind.TTL, "connectionTtl", 0)


class TestParse:
    def test_parse_integer_returns_the_number(self):
        assert parse_integer(ValueKind.TTL, "connectionTtl", "-1") == -1
        assert parse_integer(ValueKind.NON_NEGATIVE, "handshake-timeout", "+3") == 3

    @pytest.mark.parametrize(
        ("kind", "text", "message"),
        [
            (ValueKind.NON_NEGATIVE, "-1", "t must be >= 0, got '-1'"),
            (ValueKind.TTL, "1m", "t must be -1 (off) or an integer > 0, got '1m'"),
        ],
    )
    def test_parse_integer_rejects_with_the_kinds_wording(self, kind, text, message):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse_integer(kind, "t", text)

    @pytest.mark.parametrize(("text", "value"), [("true", True), ("TRUE", True), ("false", False)])
    def test_parse_flag(self, text, value):
        assert parse_flag("fastPath", text) is value

    def test_parse_flag_rejects_anything_else(self):
        with pytest.raises(ValueError, match=r"^fastPath must be true or false, got 'yes'$"):
            parse_flag("fastPath", "yes")


class TestParseNames:
    def test_parse_names_upper_cases_and_drops_empty_items(self):
        assert parse_names(ValueKind.PROTOCOL, "protocols", " mqtt, ,Amqp,") == ("MQTT", "AMQP")
        assert parse_names(ValueKind.PROTOCOL, "protocols", "") == ()

    def test_parse_names_names_the_bad_item_and_the_whole_text(self):
        message = (
            "protocols: each name must be one of AMQP, CORE, HORNETQ, MQTT, OPENWIRE, STOMP, "
            "got 'FOO' in 'MQTT, FOO'"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse_names(ValueKind.PROTOCOL, "protocols", "MQTT, FOO")
