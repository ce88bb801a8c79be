"""router/features/event_log/recorder.py and the recorder of event_format/_native.c: both recorders
take what `event_values` takes and keep the ring's semantics (their records decoding:
tests/event_format/test_frames.py)."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from event_format.frames import FRAME_HEAD, decode_frame, encode_frame, events_of
from event_format.schema import RAW_KEY_CAP, VALUE_NAMES
from keys import ConnectionFacts, KeyType, WireProtocol
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import Accepted, Closed, CloseReason, ConnectionRef, Decided, Mode
from router.features.event_log import recorder as event_recorder
from router.features.event_log.recorder import (
    NATIVE,
    FrameError,
    Recorder,
    ValuesRecorder,
    make_recorder,
)
from router.features.event_log.records import RECORDER_EVENT_TYPES, RECORDER_IDENTITIES, event_values
from tests.router.features.event_log.test_records import CONN, decision

if TYPE_CHECKING:
    from event_format.schema import EventValues

WHEN = 1795435200.25
KEY_TYPES = {"r": KeyType.CLIENT_ID, "roles": KeyType.ROLE_NAME}


def test_the_native_recorder_is_built():
    """`pip install` builds it (setup.py); without it routerd logs through the slower Python one."""
    assert NATIVE


@pytest.fixture(params=[True, False], ids=["native", "python"])
def native(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def recorder(size: int, native: bool, *, clock: float = WHEN) -> Recorder:
    made = make_recorder(size, dict(KEY_TYPES), lambda: clock, native=native)
    assert made.name == ("native" if native else "python")
    return made


def taken(ring: Recorder, most: int) -> list[tuple[int, EventValues]]:
    """What the writer gets of up to `most` events: the frame decoded."""
    frame, count = ring.take_frame(most)
    if not count:
        assert frame == b""
        return []
    (size,) = FRAME_HEAD.unpack_from(frame)
    assert size == len(frame) - FRAME_HEAD.size
    events = events_of(decode_frame(frame[FRAME_HEAD.size :]))
    assert len(events) == count
    return events


def closed(n: int) -> Closed:
    return Closed(
        conn=ConnectionRef(id=n, router="r", acceptor="a", peer=Address("::1", 1)),
        node_id=f"n{n}",
        bytes_in=n,
        bytes_out=2 * n,
        duration_s=n / 3,
        reason=CloseReason.CLOSED,
    )


# -- the values: what `event_values` takes --------------------------------------------------------

EVENTS = [
    decision(),
    decision(key="ключ 😀\n", facts=None, node_id=None, protocol=None, source=None, local=True),
    decision(reason=DecisionReason.POLICY, status=RouteStatus.REFUSED_UNAVAILABLE, mode=Mode.REFUSE),
    decision(facts=ConnectionFacts(client_id="x" * 300)),
    decision(facts=ConnectionFacts(client_id="é" * (RAW_KEY_CAP + 1))),
    decision(facts=ConnectionFacts(client_id="lone \udc80 surrogate"), key="k\udfff"),
    decision(conn=ConnectionRef(id=8, router="roles", acceptor="a", peer=Address("::1", 1))),
    decision(conn=ConnectionRef(id=9, router="unknown", acceptor="a", peer=Address("::1", 1))),
    decision(latency_s=0),
    Closed(conn=CONN, node_id="n", bytes_in=0, bytes_out=2**62, duration_s=1 / 3, reason=CloseReason.RESET),
]


@pytest.mark.parametrize("event", EVENTS)
def test_both_recorders_take_what_event_values_takes(native, event):
    ring = recorder(10, native)
    assert ring.record(event) == 1
    key_type = KEY_TYPES.get(event.conn.router, KeyType.SOURCE_IP)
    expected = event_values(event, key_type, WHEN)
    [(number, values)] = taken(ring, 10)
    assert number == 0
    assert values == expected
    if event is not EVENTS[8]:  # an int latency: the native recorder takes it as a float
        assert [type(v) for v in values] == [type(v) for v in expected]


_TEXT = st.text(max_size=40) | st.sampled_from(["", "a" * 300, "\udc80", "😀" * 260])


@st.composite
def _events(draw: st.DrawFn) -> Decided | Closed:
    conn = ConnectionRef(
        id=draw(st.integers(0, 2**62)),
        router=draw(st.sampled_from(["r", "roles", "other"])),
        acceptor=draw(_TEXT),
        peer=Address(draw(_TEXT), draw(st.integers(0, 65535))),
    )
    if draw(st.booleans()):
        return Closed(
            conn=conn,
            node_id=draw(_TEXT),
            bytes_in=draw(st.integers(0, 2**63 - 1)),
            bytes_out=draw(st.integers(0, 2**63 - 1)),
            duration_s=draw(st.floats(allow_nan=False)),
            reason=draw(st.sampled_from(CloseReason)),
        )
    facts = draw(
        st.none()
        | st.builds(
            ConnectionFacts,
            client_id=st.none() | _TEXT,
            user_name=st.none() | _TEXT,
            sni_host=st.none() | _TEXT,
            roles=st.lists(_TEXT, max_size=3).map(tuple),
        )
    )
    return Decided(
        conn=conn,
        key=draw(_TEXT),
        status=draw(st.sampled_from(RouteStatus)),
        reason=draw(st.sampled_from(DecisionReason)),
        mode=draw(st.sampled_from(Mode)),
        node_id=draw(st.none() | _TEXT),
        local=draw(st.booleans()),
        protocol=draw(st.none() | st.sampled_from(WireProtocol)),
        facts=facts,
        source=draw(st.none() | st.builds(Address, _TEXT, st.integers(0, 65535))),
        latency_s=draw(st.floats(allow_nan=False)),
    )


@given(st.lists(_events(), min_size=1, max_size=8))
def test_the_native_recorder_takes_event_values_on_any_event(events):
    ring = recorder(100, native=True)
    for event in events:
        ring.record(event)
    got = taken(ring, 100)
    key_types = [KEY_TYPES.get(e.conn.router, KeyType.SOURCE_IP) for e in events]
    expected = [(n, event_values(e, key_types[n], WHEN)) for n, e in enumerate(events)]
    assert got == expected


def test_other_events_are_not_recorded(native):
    ring = recorder(10, native)
    assert ring.record(Accepted(conn=CONN)) == -1
    assert (len(ring), ring.puts) == (0, 0)
    assert ring.take_frame(10) == (b"", 0)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (decision(key=5), "a string field: a string, got int"),
        (decision(node_id=b"n"), "a string field: a string or None, got bytes"),
        (decision(local=1), "a bool field: a bool, got int"),
        (decision(latency_s="1"), "a float field: a float, got str"),
        (decision(source=("10.0.0.1",)[0]), "an address: a .host, port. tuple, got str"),
        (decision(status="OK"), "_value_"),
        (decision(conn=ConnectionRef(id=1.5, router="r", acceptor="a", peer=CONN.peer)), "an int, got float"),  # type: ignore[arg-type]
        (decision(conn=ConnectionRef(id=2**64, router="r", acceptor="a", peer=CONN.peer)), "too big"),
        (decision(conn="c"), "a ConnectionRef, got str"),
    ],
)
def test_the_native_recorder_refuses_a_value_of_the_wrong_type_and_puts_nothing(event, message):
    """A bug's value: the event log counts the event lost (EventLog.report), routing goes on."""
    ring = recorder(10, native=True)
    with pytest.raises((TypeError, AttributeError, OverflowError), match=message):
        ring.record(event)
    assert (len(ring), ring.puts) == (0, 0)
    assert ring.record(decision()) == 1  # and it records the next one


def test_a_clock_that_fails_puts_nothing(native):
    def broken() -> float:
        raise RuntimeError("no clock")

    ring = make_recorder(10, {}, broken, native=native)
    with pytest.raises(RuntimeError, match="no clock"):
        ring.record(decision())
    assert (len(ring), ring.puts) == (0, 0)


def test_key_types_are_read_at_each_event(native):
    """The event log's `set_key_type` (a reload) changes the dict the recorder reads."""
    key_types = {"r": KeyType.CLIENT_ID}
    ring = make_recorder(10, key_types, lambda: WHEN, native=native)
    ring.record(decision())
    key_types["r"] = KeyType.SOURCE_IP
    ring.record(decision())
    [(_, first), (_, second)] = taken(ring, 10)
    position = 3 + VALUE_NAMES[0].index("raw_key")
    assert (first[position], second[position]) == ("dev-1-abc", "10.0.0.9")


# -- the ring: seed 001's ring queue, on both -----------------------------------------------------


def numbers(ring: Recorder, most: int) -> list[int]:
    return [number for number, _ in taken(ring, most)]


def conns(ring: Recorder, most: int) -> list[int]:
    return [values[2] for _, values in taken(ring, most)]


def test_a_ring_of_three_drops_the_head_when_the_fourth_arrives(native):
    ring = recorder(3, native)
    assert [ring.record(closed(n)) for n in range(3)] == [1, 2, 3]
    assert ring.record(closed(3)) == 3
    assert (ring.dropped, ring.puts, len(ring)) == (1, 4, 3)
    assert [(n, values[2]) for n, values in taken(ring, 10)] == [(1, 1), (2, 2), (3, 3)]


def test_size_one_keeps_only_the_newest(native):
    ring = recorder(1, native)
    for n in range(4):
        ring.record(closed(n))
    assert numbers(ring, 5) == [3]
    assert (ring.dropped, ring.puts, len(ring)) == (3, 4, 0)


def test_take_is_fifo_and_bounded_by_most(native):
    ring = recorder(10, native)
    for n in range(5):
        ring.record(closed(n))
    assert numbers(ring, 2) == [0, 1]
    assert numbers(ring, 0) == []
    assert numbers(ring, 10) == [2, 3, 4]
    assert numbers(ring, 1) == []


def test_shrink_while_full_deletes_nothing_and_reaches_the_new_size_as_it_drains(native):
    ring = recorder(5, native)
    for n in range(5):
        ring.record(closed(n))
    ring.resize(2)
    assert (len(ring), ring.size) == (5, 2)
    ring.record(closed(5))  # at or over size: the oldest goes first, the ring does not grow
    assert (len(ring), ring.dropped) == (5, 1)
    assert conns(ring, 2) == [1, 2]
    ring.record(closed(6))
    assert (len(ring), ring.dropped) == (3, 2)
    assert conns(ring, 10) == [4, 5, 6]
    for n in (7, 8, 9):
        ring.record(closed(n))
    assert conns(ring, 10) == [8, 9]


def test_grow_takes_effect_at_once(native):
    ring = recorder(2, native)
    ring.record(closed(0))
    ring.record(closed(1))
    ring.resize(4)
    ring.record(closed(2))
    ring.record(closed(3))
    assert ring.dropped == 0
    assert conns(ring, 10) == [0, 1, 2, 3]


def test_bad_sizes_are_refused(native):
    with pytest.raises(ValueError, match="got 0"):
        recorder(0, native)
    ring = recorder(1, native)
    with pytest.raises(ValueError, match="got -5"):
        ring.resize(-5)
    assert ring.size == 1


def test_discard_removes_the_oldest(native):
    ring = recorder(10, native)
    for n in range(5):
        ring.record(closed(n))
    assert ring.discard(3) == 3
    assert conns(ring, 10) == [3, 4]


def test_concurrent_records_lose_nothing_but_the_counted_drops(native):
    ring = recorder(1000, native)
    got: list[tuple[int, EventValues]] = []

    def record_many(base: int) -> None:
        for n in range(base, base + 5_000):
            ring.record(closed(n) if n % 2 else decision())

    threads = [threading.Thread(target=record_many, args=(i * 100_000,)) for i in range(3)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        got.extend(taken(ring, 500))
    for thread in threads:
        thread.join()
    got.extend(taken(ring, 10_000))
    seen = [number for number, _ in got]
    assert seen == sorted(set(seen))
    assert len(got) + ring.dropped == ring.puts == 15_000


def test_the_native_ring_gives_a_burst_s_memory_back():
    ring = recorder(200_000, native=True)
    for n in range(100_000):
        ring.record(closed(n))
    assert ring._ring.held_bytes > 1024 * 1024  # type: ignore[attr-defined]
    while ring.discard(10_000):
        pass
    assert ring._ring.held_bytes == 0  # type: ignore[attr-defined]


# -- frames and decoding ------------------------------------------------------------------------


def test_a_python_frame_that_marshal_cannot_write_is_counted():
    ring = ValuesRecorder(10, {}, lambda: WHEN)
    ring._ring.put((1, WHEN, 0, {1, object()}))  # a bug's value
    with pytest.raises(FrameError, match="they cannot be sent"):
        ring.take_frame(10)


def test_the_module_says_which_recorder_is_used():
    assert event_recorder.make_recorder(1, {}, lambda: WHEN, native=False).name == "python"
    assert encode_frame([(0, (1,))])[FRAME_HEAD.size : FRAME_HEAD.size + 1] == b"M"


# -- the C module's own arguments (found by a review with ASan and UBSan) ---------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decided_:
    conn: ConnectionRef


Decided_.__name__ = "Decided"

_GOOD = {
    "event_types": RECORDER_EVENT_TYPES,
    "identities": RECORDER_IDENTITIES,
    "ref_type": ConnectionRef,
}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"event_types": (Decided,)}, "the recorder's program is for 2 event types, got 1"),
        ({"event_types": (Closed, Decided)}, "program 0 is for Decided events, got Closed"),
        ({"event_types": (Decided_, Closed)}, "Decided.source is not a slot"),
        ({"identities": ()}, "compares with 1 identities, got 0"),
        ({"identities": (Mode.PROXY,)}, "identity 0: a DecisionReason, got Mode"),
        ({"ref_type": Address}, "is not a slot"),
    ],
)
def test_types_the_compiled_program_cannot_run_on_are_refused_when_the_recorder_is_made(given, message):
    """The program is compiled in (event_format/_native_program.h); routerd gives the types it
    reads and the identities it compares with, which must be the ones it was generated for."""
    from event_format import _native as native  # type: ignore[attr-defined]

    with pytest.raises((ValueError, TypeError), match=message):
        native.Recorder(
            size=1,
            **(_GOOD | given),
            key_types={},
            default_key_type=KeyType.SOURCE_IP,
            raw_of={},
            clock=lambda: WHEN,
        )


def test_a_frame_holds_at_least_one_record_and_stays_under_its_byte_bound():
    ring = recorder(10, native=True)
    for n in range(3):
        ring.record(closed(n))
    assert ring._ring.take(10, 1)[1] == 1  # type: ignore[attr-defined]  # one record, over the bound
    first, count, _ = ring._ring.take(10, 10**6)  # type: ignore[attr-defined]
    assert (first, count) == (1, 2)


def test_an_event_too_big_for_a_frame_is_refused():
    ring = recorder(10, native=True)
    with pytest.raises(ValueError, match=r"an event of \d+ bytes"):
        ring.record(decision(key="k" * (17 << 20)))
    assert len(ring) == 0
