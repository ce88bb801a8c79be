"""event_format/frames.py and the decoder of event_format/_native.c: frames decode, and native
records decode only whole, as values and as Arrow columns, whatever bytes the pipe brings."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from event_format.frames import FRAME_HEAD, NativeBatch, columns, decode_frame, events_of
from event_format.schema import COLUMN_CODES, VALUE_NAMES
from tests.router.features.event_log.test_recorder import _events, closed, recorder
from tests.router.features.event_log.test_records import decision

if TYPE_CHECKING:
    from collections.abc import Sequence

    from router.core.events import Closed, Decided


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "format b''"),
        (b"X123", "format b'X'"),
        (b"N\x00\x01", "a native frame of 3 bytes"),
        (b"M\x00", "marshal cannot read"),
        (b"M" + __import__("marshal").dumps({"a": 1}), "a frame of dict"),
    ],
)
def test_a_broken_frame_is_a_clear_error(payload, message):
    with pytest.raises(ValueError, match=message):
        decode_frame(payload)


def _native_batch(events: Sequence[Decided | Closed]) -> NativeBatch:
    ring = recorder(len(events) + 1, native=True)
    for event in events:
        ring.record(event)
    frame, _ = ring.take_frame(len(events))
    batch = decode_frame(frame[FRAME_HEAD.size :])
    assert isinstance(batch, NativeBatch)
    return batch


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b[:-1], "length out of range"),
        (lambda b: b + b"\x00", "cut short"),
        (lambda b: b"\xff\xff\xff\x7f" + b[4:], "length out of range"),
        (lambda b: b[:4] + b"\x09" + b[5:], "no such kind"),
        (lambda b: b[:21] + b"\x07" + b[22:], "no such field tag"),
        (lambda b: b[:21] + b"\x02" + b[22:], "a field of another type|runs past|fewer fields|more fields"),
    ],
)
def test_broken_records_decode_to_a_clear_error(change, message):
    batch = _native_batch([decision(), closed(1)])
    broken = NativeBatch(batch.first, batch.count, change(batch.records))
    with pytest.raises(ValueError, match=message):
        events_of(broken)
    with pytest.raises(ValueError, match=message):
        columns([broken])


def test_a_count_that_does_not_match_the_records_is_an_error():
    batch = _native_batch([decision(), closed(1)])
    with pytest.raises(ValueError, match="a frame of 2 event records says it has 3"):
        events_of(NativeBatch(batch.first, 3, batch.records))


@given(st.binary(max_size=300), st.integers(0, 5))
def test_any_bytes_decode_to_events_or_a_value_error(data, count):
    """Fuzz: the writer never crashes on what the pipe brings."""
    for decode in (lambda b: events_of(b), lambda b: columns([b])):
        with contextlib.suppress(ValueError):
            decode(NativeBatch(0, count, data))


@given(st.lists(_events(), min_size=1, max_size=4), st.integers(0, 10_000), st.integers(0, 255))
def test_a_record_with_one_byte_changed_decodes_or_is_refused(events, where, byte):
    batch = _native_batch(events)
    records = bytearray(batch.records)
    records[where % len(records)] = byte
    for decode in (events_of, lambda b: columns([b])):
        with contextlib.suppress(ValueError):
            decode(NativeBatch(batch.first, batch.count, bytes(records)))


def test_columns_are_the_values_in_arrow_s_layout():
    events: list[Decided | Closed] = [
        decision(),
        closed(1),
        decision(node_id=None, local=True, facts=None),
        closed(2),
    ]
    batch = _native_batch(events)
    decision_columns, close_columns = columns([batch, batch])
    assert decision_columns is not None
    assert close_columns is not None
    rows, numbers, whens, conns_, fields = decision_columns
    assert rows == 4  # two batches of two decisions
    assert numbers == b"".join(n.to_bytes(8, "little") for n in (0, 2, 0, 2))
    assert len(whens) == 32
    assert conns_ == (7).to_bytes(8, "little") * 4
    assert len(fields) == len(VALUE_NAMES[0]) == len(COLUMN_CODES[0])
    validity, offsets, values = fields[VALUE_NAMES[0].index("node_id")]
    assert validity == bytes([0b0101])  # null on the second and fourth rows
    assert offsets == b"".join(n.to_bytes(4, "little") for n in (0, 5, 5, 10, 10))
    assert values == b"node4node4"
    validity, offsets, values = fields[VALUE_NAMES[0].index("local")]
    assert (validity, offsets, values) == (None, None, bytes([0b1010]))


def test_numbers_out_of_range_are_refused():
    batch = _native_batch([closed(1), closed(2)])
    for first, count in ((2**63 - 1, 2), (-1, 2), (0, -1)):
        with pytest.raises(ValueError, match="a frame of"):
            events_of(NativeBatch(first, count, batch.records))
        with pytest.raises(ValueError, match="a frame of"):
            columns([NativeBatch(first, count, batch.records)])


def test_frames_changed_by_python_code_while_parsed_are_read_safely():
    """`columns` holds every frame, and reads each one's numbers once, before it reads records."""
    from event_format import _native as native  # type: ignore[attr-defined]

    good = _native_batch([closed(1)])
    frames: list[tuple[object, int, bytes]] = []

    class Shrinking:
        def __index__(self) -> int:
            frames.clear()  # drops the frame being parsed, and the one after it
            return 0

    frames += [(Shrinking(), 1, bytes(good.records)), (0, 1, bytes(good.records))]
    close_columns = native.columns(frames, COLUMN_CODES)[1]
    assert close_columns[0] == 2  # both frames, as they were when the call began


def test_a_frame_that_is_not_a_tuple_is_a_type_error():
    from event_format import _native as native  # type: ignore[attr-defined]

    good = _native_batch([closed(1)])
    with pytest.raises(
        TypeError, match=r"columns: frame 1 must be a \(first, count, records\) tuple, got NoneType"
    ):
        native.columns([(0, 1, bytes(good.records)), None], COLUMN_CODES)
