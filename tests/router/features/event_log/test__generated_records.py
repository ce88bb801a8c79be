"""router/features/event_log/_generated_records.py: a values maker and a record maker per logged
event type, and what the native recorder is given, in its program's order. That the file is what
`python -m tools.generate` writes now is checked in tests/tools/test_generate.py; that the values
and the records agree, and both recorders, in tests/router/features/event_log/test_records.py and
tests/router/features/event_log/test_recorder.py."""

from __future__ import annotations

from event_format.schema import KINDS
from keys import KeyType
from router.core.engine import DecisionReason
from router.features.event_log._generated_records import (
    RECORD_MAKERS,
    RECORDER_EVENT_TYPES,
    RECORDER_IDENTITIES,
    VALUE_MAKERS,
)
from router.features.event_log.sources import EVENT_KINDS
from tests.router.features.event_log.test_records import CONN, TS, decision


def test_a_maker_per_logged_event_type_in_the_kinds_order():
    assert list(VALUE_MAKERS) == list(RECORD_MAKERS) == list(RECORDER_EVENT_TYPES) == list(EVENT_KINDS)
    assert [KINDS.index(kind) for kind in EVENT_KINDS.values()] == list(range(len(KINDS)))


def test_the_identity_the_native_recorder_compares_with_is_the_cache_reason():
    assert RECORDER_IDENTITIES == (DecisionReason.CACHE,)


def test_values_start_with_kind_time_and_connection_and_the_record_has_the_writer_s_fields():
    event = decision()
    values = VALUE_MAKERS[type(event)](event, KeyType.CLIENT_ID, 12.5)
    assert values[:3] == (0, 12.5, CONN.id)
    record = RECORD_MAKERS[type(event)](event, "h", 5, 9, TS, KeyType.CLIENT_ID)
    assert (record.router_id, record.seq, record.conn, record.ts) == ("h", 5, 9, TS)
