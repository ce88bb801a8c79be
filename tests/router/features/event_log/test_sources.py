"""router/features/event_log/sources.py: the raw key a decision's line keeps, and the one table of
where each field comes from (that both recorders take the same values from it:
tests/router/features/event_log/test_recorder.py)."""

from __future__ import annotations

import dataclasses

import pytest

from event_format.schema import WRITER_FIELDS
from keys import KeyType
from router.features.event_log.sources import (
    EVENT_KINDS,
    SOURCES,
    IsMember,
    RawKey,
    RawKeyLength,
    Slot,
    raw_key,
)
from tests.router.features.event_log.test_records import decision


@pytest.mark.parametrize(
    ("key_type", "expected"),
    [
        (KeyType.CLIENT_ID, "dev-1-abc"),
        (KeyType.SOURCE_IP, "10.0.0.9"),
        (KeyType.USER_NAME, None),
        (KeyType.SNI_HOST, None),
        (KeyType.ROLE_NAME, "a,b"),
    ],
)
def test_raw_key_per_key_type(key_type, expected):
    assert raw_key(key_type, decision()) == expected


def test_every_field_but_the_writer_s_has_one_source_in_order():
    for event, kind in EVENT_KINDS.items():
        fields = [f.name for f in dataclasses.fields(kind) if f.name not in WRITER_FIELDS]
        assert list(SOURCES[event]) == fields, event.__name__


def test_sources_read_slots_the_events_have():
    for event, sources in SOURCES.items():
        for source in sources.values():
            if isinstance(source, Slot | IsMember) and not getattr(source, "on_ref", False):
                assert source.name in {f.name for f in dataclasses.fields(event)}, (event.__name__, source)
    assert RawKey() in SOURCES[next(iter(EVENT_KINDS))].values()
    assert RawKeyLength() in SOURCES[next(iter(EVENT_KINDS))].values()
