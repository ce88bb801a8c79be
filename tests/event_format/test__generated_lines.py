"""event_format/_generated_lines.py: a writer per kind, from a record and from values, in the
kinds' order. That the file is what `python -m tools.generate` writes now is checked in
tests/tools/test_generate.py; that the two writers give the same line, in
tests/router/features/event_log/test_records.py."""

from __future__ import annotations

import dataclasses
import json

from event_format._generated_lines import RECORD_LINES, VALUE_LINES
from event_format.schema import KINDS, CloseRecord

CLOSE = CloseRecord(
    router_id="h",
    seq=3,
    ts="2026-11-23T10:00:00.000001Z",
    conn=4,
    router="r",
    acceptor="a",
    node_id="n",
    duration_s=0.5,
    bytes_in=1,
    bytes_out=2,
    reason="closed",
)


def test_a_writer_per_kind_in_the_kinds_order():
    assert list(RECORD_LINES) == list(KINDS)
    assert [write.__name__ for write in VALUE_LINES] == [f"{kind.KIND}_values_line" for kind in KINDS]


def test_a_record_line_is_kind_then_its_fields_in_order():
    line = RECORD_LINES[CloseRecord](CLOSE)
    assert list(json.loads(line)) == ["kind", *(f.name for f in dataclasses.fields(CloseRecord))]
    assert line.endswith("}\n")
