"""event_format/json_text.py: each type's JSON text, as a line holds it."""

from __future__ import annotations

import json

import pytest

from event_format.json_text import BOOLEANS, number, string, string_or_null


@pytest.mark.parametrize("value", ["", "dev-1", 'a"\\\n\r\t\x00', "ключ 😀", "\u2028", "lone \udc80"])
def test_string_is_ascii_json_that_reads_back(value):
    text = string(value)
    assert text.isascii()
    assert "\n" not in text
    assert json.loads(text) == value


def test_string_or_null():
    assert string_or_null(None) == "null"
    assert string_or_null("x") == '"x"'


@pytest.mark.parametrize("value", [0.0, -0.0, 1 / 3, 12.3, 1e300, 5e-324])
def test_number_reads_back_as_the_same_float(value):
    assert json.loads(number(value)) == value
    assert number(value) == repr(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_number_refuses_what_json_cannot_say(value):
    with pytest.raises(ValueError, match="a record field must be a finite number"):
        number(value)


def test_booleans_by_value():
    assert (BOOLEANS[False], BOOLEANS[True]) == ("false", "true")
