"""event_format/lines.py: an event file's JSON lines, from a record and from an event's values."""

from __future__ import annotations

import dataclasses
import json

import pytest

from event_format.lines import json_line, values_line
from event_format.schema import Sequence
from keys import KeyType
from router.core.events import Closed, CloseReason
from router.features.event_log.records import event_values, record_of
from tests.router.features.event_log.test_records import CONN, TS, decision


def test_a_hostile_key_stays_one_ascii_line():
    key = 'a"\n\r\u2028\ud800😀\x00'
    record = record_of(decision(key=key), router_id="x", seq=1, conn=1, ts=TS, key_type=KeyType.CLIENT_ID)
    line = json_line(record)
    assert line.isascii()
    assert line.count("\n") == 1
    assert json.loads(line)["key"] == key


def test_lines_are_what_the_json_module_writes_for_the_same_values():
    for event in (decision(), decision(key="ключ 😀", facts=None, node_id=None, protocol=None)):
        record = record_of(event, router_id="h/é", seq=3, conn=4, ts=TS, key_type=KeyType.CLIENT_ID)
        values = {"kind": record.KIND} | {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        assert json_line(record) == json.dumps(values, separators=(",", ":")) + "\n"


def test_a_number_that_is_not_finite_is_refused():
    closed = Closed(
        conn=CONN, node_id="n", bytes_in=0, bytes_out=0, duration_s=float("nan"), reason=CloseReason.CLOSED
    )
    record = record_of(closed, router_id="h", seq=1, conn=1, ts=TS, key_type=KeyType.CLIENT_ID)
    with pytest.raises(ValueError, match="finite number, got nan"):
        json_line(record)


def test_the_writers_line_refuses_a_number_that_is_not_finite():
    closed = Closed(
        conn=CONN, node_id="n", bytes_in=0, bytes_out=0, duration_s=float("inf"), reason=CloseReason.CLOSED
    )
    values = event_values(closed, KeyType.CLIENT_ID, 0.0)
    with pytest.raises(ValueError, match="finite number, got inf"):
        values_line(values, router_id="h", sequence=Sequence(1), number=1)
