"""event_format/schema.py: the records' one field list, timestamps and the numbers of a process."""

from __future__ import annotations

import dataclasses

import pytest

from event_format.schema import BOOT_SPAN, FIELDS, KINDS, FieldType, Sequence, timestamp


def test_fields_are_kind_then_every_field_of_every_kind_once():
    names = [f.name for f in FIELDS]
    assert names[0] == "kind"
    assert len(names) == len(set(names))
    for kind in KINDS:
        assert {f.name for f in dataclasses.fields(kind)} <= set(names)
    by_name = {f.name: f for f in FIELDS}
    assert by_name["ts"].type is FieldType.TIMESTAMP
    assert by_name["seq"].type is FieldType.LONG
    assert not by_name["seq"].nullable
    assert by_name["node_id"].nullable
    assert by_name["node_id"].kinds == ("decision", "close")
    assert by_name["reason"].kinds == ("decision", "close")
    assert by_name["bytes_in"].kinds == ("close",)


def test_timestamp_is_utc_with_microseconds():
    assert timestamp(0) == "1970-01-01T00:00:00.000000Z"
    assert timestamp(1795435200.25) == "2026-11-23T12:00:00.250000Z"
    assert timestamp(59.9999996) == "1970-01-01T00:01:00.000000Z"  # rounding carries into the second


def test_sequence_is_unique_across_boots():
    first, second = Sequence(1000), Sequence(1001)
    assert [first.take(), first.take()] == [1000 * BOOT_SPAN, 1000 * BOOT_SPAN + 1]
    assert second.take() == 1001 * BOOT_SPAN
    assert first.of(42) == 1000 * BOOT_SPAN + 42
    with pytest.raises(ValueError, match="epoch milliseconds"):
        Sequence(-1)
