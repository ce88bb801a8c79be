"""The driver that tests/event_format/test_native_sanitized.py runs in a process with AddressSanitizer
and UndefinedBehaviorSanitizer: it calls every entry point of the C extension `event_format._native`
the way the project does (the recorder as routerd's `NativeRecorder` drives it, the decoder as the
writer's `events_of` and `columns` do) and checks every answer against a Python reference:

* the recorder (`Recorder`: `record`, `take`, `resize`, `len`, `size`, `puts`, `dropped`,
  `held_bytes`) against what the Python recorder takes (`reference_values`: what the generated
  `decided_values` and `closed_values` of routerd's Python recorder return), the record format
  written out in Python (`reference_record`) and the Python ring's rules (`RingModel`);
* the decoder (`rows`, `columns`) against a Python decoder of the same records
  (`reference_decode`): the same values, the same Arrow buffers, or a ValueError from both, on
  valid records, boundary inputs, the fuzz corpus (fuzz/corpus/event_frames/) cut at every length,
  the edges of valid records (`edges`) and random mutations with a fixed seed.

Every buffer the decoder reads is a copy of exactly its size (`exact`), so reading one byte past
its end is a heap-buffer-overflow ASan reports (a `bytes` object keeps a NUL after its data).

Usage: `python native_driver.py CORPUS_DIR MUTATIONS SEED`. It prints the extension's path first
(the test checks it is the sanitized build) and a summary last; any disagreement raises (a
traceback, exit status 1). It needs the `event_format` package alone, nothing of `router`: the
event types are made here, with the names and slots the generated program reads
(event_format/_native_program.h).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import ctypes
import dataclasses
import enum
import itertools
import random
import struct
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from event_format import _native as native  # type: ignore[attr-defined]
from event_format import frames
from event_format.frames import FRAME_HEAD, NATIVE_RECORDS_MAX, NativeBatch, decode_frame, native_frame
from event_format.schema import COLUMN_CODES, RAW_KEY_CAP, VALUE_HEAD, VALUE_NAMES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

RECORD_MAX = 16 << 20
"""A record's largest size (`_native.c`'s RECORD_MAX)."""
HEAD = struct.Struct("<IBdq")
"""A record's head: length, kind, epoch time, connection number."""
TAG_NULL, TAG_STR, TAG_INT, TAG_FLOAT, TAG_FALSE, TAG_TRUE = range(6)
MIN_CAPACITY = 64 * 1024
"""The ring buffer's first size; it gives memory back above 16 times this (`_native.c`)."""


class Mismatch(AssertionError):
    """The C extension and the Python reference disagree."""


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Mismatch(what)


# -- routerd's event types, as the program reads them (names and slots) --------------------------


class DecisionReason(enum.Enum):  # the identity's type name is checked by the recorder
    CACHE = "cache"
    POLICY = "policy"
    NO_READY_TARGET = "no ready target"


class RouteStatus(enum.Enum):
    OK = "OK"
    REFUSED_USE_ANOTHER = "REFUSED_USE_ANOTHER"
    REFUSED_UNAVAILABLE = "REFUSED_UNAVAILABLE"


class Mode(enum.Enum):
    PROXY = "proxy"
    REDIRECT = "redirect"
    REFUSE = "refuse"


class CloseReason(enum.Enum):
    CLOSED = "closed"
    RESET = "reset"
    CONNECTION_TTL = "connection_ttl"


class WireProtocol(enum.Enum):
    MQTT = "mqtt"
    AMQP = "amqp"
    STOMP = "stomp"


class KeyType(enum.Enum):
    CLIENT_ID = "CLIENT_ID"
    SNI_HOST = "SNI_HOST"
    SOURCE_IP = "SOURCE_IP"
    USER_NAME = "USER_NAME"
    ROLE_NAME = "ROLE_NAME"


class Address(NamedTuple):
    host: str
    port: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    client_id: str | None = None
    user_name: str | None = None
    sni_host: str | None = None
    source_ip: str | None = None
    roles: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionRef:
    id: int
    router: str
    acceptor: str
    peer: Address


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decided:
    conn: ConnectionRef
    key: str
    status: RouteStatus
    reason: DecisionReason
    mode: Mode
    node_id: str | None
    local: bool
    protocol: WireProtocol | None
    facts: Facts | None
    source: Address | None
    latency_s: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Closed:
    conn: ConnectionRef
    node_id: str
    bytes_in: int
    bytes_out: int
    duration_s: float
    reason: CloseReason


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:  # an event the log does not record
    conn: ConnectionRef


Event = Decided | Closed

RAW_OF: dict[KeyType, Callable[[Facts], str | None]] = {
    KeyType.CLIENT_ID: lambda facts: facts.client_id,
    KeyType.SNI_HOST: lambda facts: facts.sni_host,
    KeyType.SOURCE_IP: lambda facts: facts.source_ip,
    KeyType.USER_NAME: lambda facts: facts.user_name,
    KeyType.ROLE_NAME: lambda facts: ",".join(facts.roles) or None,
}
DEFAULT_KEY_TYPE = KeyType.SOURCE_IP


def changed(event: object, **values: object) -> object:
    """A copy of a frozen event with slots set to values of any type (a bug's event)."""
    other = copy.copy(event)
    for name, value in values.items():
        object.__setattr__(other, name, value)
    return other


class Clock:
    """routerd's clock: a new epoch time at each call, the last one kept for the reference."""

    def __init__(self, start: float = 1795435200.25) -> None:
        self.last = start

    def __call__(self) -> float:
        self.last += 0.001
        return self.last


def make_recorder(size: int, key_types: dict[str, KeyType], clock: Callable[[], object]) -> Any:
    """A recorder made as routerd's `NativeRecorder` makes it."""
    return native.Recorder(
        size=size,
        event_types=(Decided, Closed),
        identities=(DecisionReason.CACHE,),
        ref_type=ConnectionRef,
        key_types=key_types,
        default_key_type=DEFAULT_KEY_TYPE,
        raw_of=RAW_OF,
        clock=clock,
    )


# -- the Python reference ------------------------------------------------------------------------


def reference_values(event: Event, key_types: dict[str, KeyType], when: float) -> tuple[object, ...]:
    """What the Python recorder takes of an event (`event_values`)."""
    ref = event.conn
    if isinstance(event, Closed):
        return (
            *(1, when, ref.id, ref.router, ref.acceptor),
            *(event.node_id, event.duration_s, event.bytes_in, event.bytes_out, event.reason.value),
        )
    key_type = key_types.get(ref.router, DEFAULT_KEY_TYPE)
    raw = None if event.facts is None else RAW_OF[key_type](event.facts)
    return (
        *(0, when, ref.id, ref.router, ref.acceptor),
        (ref.peer if event.source is None else event.source).host,
        None if event.protocol is None else event.protocol.value,
        key_type.value,
        None if raw is None else raw[:RAW_KEY_CAP],
        0 if raw is None else len(raw),
        *(event.key, event.status.value, event.reason.value, event.mode.value, event.node_id),
        event.local,
        event.reason is DecisionReason.CACHE,
        event.latency_s,
    )


def reference_record(values: tuple[object, ...]) -> bytes:
    """An event's values as one native record (the format in `_native.c`'s header comment): each
    field tagged by its column's type (an int in a double column is written as a double)."""
    kind, when, conn = values[:VALUE_HEAD]
    assert isinstance(kind, int)
    assert isinstance(when, float)
    assert isinstance(conn, int)
    parts = []
    for code, value in zip(COLUMN_CODES[kind].decode(), values[VALUE_HEAD:], strict=True):
        if value is None:
            parts.append(bytes([TAG_NULL]))
        elif code == "s":
            assert isinstance(value, str)
            text = value.encode("utf-8", "surrogatepass")
            parts.append(struct.pack("<BI", TAG_STR, len(text)) + text)
        elif code == "q":
            assert isinstance(value, int)
            parts.append(struct.pack("<Bq", TAG_INT, value))
        elif code == "d":
            assert isinstance(value, int | float)
            parts.append(struct.pack("<Bd", TAG_FLOAT, value))
        else:
            parts.append(bytes([TAG_TRUE if value else TAG_FALSE]))
    body = b"".join(parts)
    return HEAD.pack(HEAD.size + len(body), kind, when, conn) + body


class RingModel:
    """The Python ring's rules, holding the records the reference writes: a put over the size
    drops the oldest, numbers count every put, a take gives at least one record."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held: collections.deque[bytes] = collections.deque()
        self.puts = 0
        self.dropped = 0

    def put(self, record: bytes) -> int:
        self.held.append(record)
        self.puts += 1
        if len(self.held) - 1 >= self.size:
            self.held.popleft()
            self.dropped += 1
        return len(self.held)

    def take(self, most: int, max_bytes: int) -> tuple[int, int, bytes]:
        first = self.puts - len(self.held)
        taken: list[bytes] = []
        span = 0
        limit = min(max(most, 0), len(self.held))
        while len(taken) < limit:
            length = len(self.held[0])
            if taken and span + length > max_bytes:
                break
            taken.append(self.held.popleft())
            span += length
        return first, len(taken), b"".join(taken)


class Raw(NamedTuple):
    """One record as the reference decoder reads it: the field values still as bytes."""

    number: int
    kind: int
    when: bytes
    conn: int
    fields: tuple[tuple[int, bytes], ...]


_TAGS = {"s": {TAG_STR}, "q": {TAG_INT}, "d": {TAG_FLOAT}, "b": {TAG_TRUE, TAG_FALSE}}
"""The tags each column type takes, besides null."""


def _fits(tag: int, code: str) -> bool:
    return tag == TAG_NULL or tag in _TAGS[code]


def reference_decode(first: int, count: int, records: bytes, codes: tuple[bytes, ...]) -> list[Raw]:
    """A frame's records, checked as the C decoder checks them.

    Raises:
        ValueError: a broken record, or numbers out of range.
    """
    if first < 0 or count < 0 or first > 2**63 - 1 - count:
        raise ValueError("numbers out of range")
    out: list[Raw] = []
    pos = 0
    while pos < len(records):
        if len(records) - pos < HEAD.size:
            raise ValueError("cut short")
        length, kind, _, conn = HEAD.unpack_from(records, pos)
        if length < HEAD.size or length > len(records) - pos:
            raise ValueError("a record length out of range")
        if kind >= len(codes):
            raise ValueError("no such kind")
        end, pos = pos + length, pos + HEAD.size
        fields = []
        for code in codes[kind].decode():
            if pos >= end:
                raise ValueError("fewer fields than the kind has")
            tag = records[pos]
            pos += 1
            if tag in (TAG_NULL, TAG_FALSE, TAG_TRUE):
                size = 0
            elif tag in (TAG_INT, TAG_FLOAT):
                size = 8
            elif tag == TAG_STR:
                if end - pos < 4:
                    raise ValueError("a string's length cut short")
                (size,) = struct.unpack_from("<I", records, pos)
                pos += 4
            else:
                raise ValueError("no such field tag")
            if end - pos < size:
                raise ValueError("a field runs past its record")
            if not _fits(tag, code):
                raise ValueError("a field of another type")
            fields.append((tag, records[pos : pos + size]))
            pos += size
        if pos != end:
            raise ValueError("more fields than the kind has")
        when = records[end - length + 5 : end - length + 13]
        out.append(Raw(first + len(out), kind, when, conn, tuple(fields)))
    if len(out) != count:
        raise ValueError("a count that does not match the records")
    return out


def _value(tag: int, data: bytes) -> object:
    if tag == TAG_STR:
        return data.decode("utf-8", "surrogatepass")  # UnicodeDecodeError is a ValueError
    if tag == TAG_INT:
        return struct.unpack("<q", data)[0]
    if tag == TAG_FLOAT:
        return struct.unpack("<d", data)[0]
    return {TAG_NULL: None, TAG_FALSE: False, TAG_TRUE: True}[tag]


def reference_rows(raws: list[Raw]) -> list[tuple[int, tuple[object, ...]]]:
    """`rows`: each record's number and `event_values`."""
    return [
        (
            r.number,
            (r.kind, struct.unpack("<d", r.when)[0], r.conn, *(_value(tag, data) for tag, data in r.fields)),
        )
        for r in raws
    ]


def _bits(flags: list[bool]) -> bytes:
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def reference_columns(raws: list[Raw], codes: tuple[bytes, ...]) -> tuple[object, ...]:
    """`columns`: per kind None, or its rows in Arrow's buffers (validity, offsets, values)."""
    result: list[object] = []
    for kind, kind_codes in enumerate(codes):
        mine = [r for r in raws if r.kind == kind]
        if not mine:
            result.append(None)
            continue
        fields = []
        for f, code in enumerate(kind_codes.decode()):
            column = [r.fields[f] for r in mine]
            valid = [tag != TAG_NULL for tag, _ in column]
            validity = None if all(valid) else _bits(valid)
            if code == "s":
                ends = list(itertools.accumulate((len(data) for _, data in column), initial=0))
                offsets: bytes | None = struct.pack(f"<{len(ends)}i", *ends)
                values = b"".join(data for _, data in column)
            elif code == "b":
                offsets, values = None, _bits([tag == TAG_TRUE for tag, _ in column])
            else:
                offsets, values = (
                    None,
                    b"".join(data if tag != TAG_NULL else bytes(8) for tag, data in column),
                )
            fields.append((validity, offsets, values))
        result.append(
            (
                len(mine),
                b"".join(struct.pack("<q", r.number) for r in mine),
                b"".join(r.when for r in mine),
                b"".join(struct.pack("<q", r.conn) for r in mine),
                fields,
            )
        )
    return tuple(result)


def canonical(rows: list[tuple[int, tuple[object, ...]]]) -> list[object]:
    """Rows compared exactly: a float by its bits (NaN, -0.0), True apart from 1."""
    return [
        (
            number,
            tuple((type(v).__name__, struct.pack("<d", v) if isinstance(v, float) else v) for v in values),
        )
        for number, values in rows
    ]


def expected_rows(first: int, values: list[tuple[object, ...]]) -> list[object]:
    """The rows of the Python recorder's values: a double column's int is a float in a record."""
    rows = []
    for number, v in enumerate(values, start=first):
        kind = v[0]
        assert isinstance(kind, int)
        codes = COLUMN_CODES[kind].decode()
        fields = (
            float(x) if c == "d" and isinstance(x, int) else x
            for c, x in zip(codes, v[VALUE_HEAD:], strict=True)
        )
        rows.append((number, (*v[:VALUE_HEAD], *fields)))
    return canonical(rows)


def exact(data: bytes) -> memoryview:
    """`data` in a heap buffer of exactly its size (with PYTHONMALLOC=malloc; ctypes keeps up to 16
    bytes inside its object), so ASan sees a read past its end."""
    return memoryview((ctypes.c_char * len(data)).from_buffer_copy(data))


class Counts:
    """What the driver checked, for its summary."""

    def __init__(self) -> None:
        self.records = 0
        self.decoded = 0
        self.refused = 0
        self.errors = 0


COUNTS = Counts()


def check_decoder(frames_: list[tuple[int, int, bytes]], what: str) -> None:
    """`rows` on each frame and `columns` on all of them agree with the reference: the same answer
    or a ValueError from both (`rows` may also refuse a string that is not UTF-8: it decodes them,
    `columns` does not)."""
    raws: list[Raw] = []
    broken = False
    for first, count, records in frames_:
        expected: object = ValueError
        try:
            mine = reference_decode(first, count, records, COLUMN_CODES)
        except ValueError:
            broken = True
        else:
            raws += mine
            with contextlib.suppress(ValueError):  # a string not UTF-8: rows refuses, columns takes it
                expected = canonical(reference_rows(mine))
        try:
            got: object = canonical(native.rows(first, count, exact(records), COLUMN_CODES))
        except ValueError:
            got = ValueError
        check(got == expected, f"{what}: rows {str(got)[:300]} != reference {str(expected)[:300]}")
        COUNTS.decoded += got is not ValueError
        COUNTS.refused += got is ValueError
    held = [(first, count, exact(records)) for first, count, records in frames_]
    try:
        got_columns: object = native.columns(held, COLUMN_CODES)
    except ValueError:
        got_columns = ValueError
    expected_columns = ValueError if broken else reference_columns(raws, COLUMN_CODES)
    check(
        got_columns == expected_columns, f"{what}: columns {got_columns!r:.300} != {expected_columns!r:.300}"
    )


# -- events ----------------------------------------------------------------------------------------

TEXTS = ["", "a", "node4", "ключ 😀\n", "\udc80", "lone \udc80 surrogate", "x" * 300, "é" * (RAW_KEY_CAP + 1)]
TEXTS += ["😀" * RAW_KEY_CAP, "a" * RAW_KEY_CAP, "\x00\x01\x7f", "\u2028"]
ROUTERS = {"r": KeyType.CLIENT_ID, "roles": KeyType.ROLE_NAME, "u": KeyType.USER_NAME, "s": KeyType.SNI_HOST}


def random_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(TEXTS)
    alphabet = 'ab\x00é😀\udc80\ud800\n"\\'
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))


def random_float(rng: random.Random) -> float:
    return rng.choice(
        [0.0, -0.0, 1 / 3, 1e308, -1e-308, 5e-324, float("inf"), float("-inf"), float("nan"), 0]
    )


def random_event(rng: random.Random) -> Event:
    conn = ConnectionRef(
        id=rng.choice([0, 7, 2**63 - 1, -(2**63), rng.randrange(2**62)]),
        router=rng.choice([*ROUTERS, "other"]),
        acceptor=random_text(rng),
        peer=Address(random_text(rng), rng.randrange(65536)),
    )
    if rng.random() < 0.4:
        return Closed(
            conn=conn,
            node_id=random_text(rng),
            bytes_in=rng.choice([0, 2**63 - 1, -(2**63), rng.randrange(2**40)]),
            bytes_out=rng.randrange(2**62),
            duration_s=random_float(rng),
            reason=rng.choice(list(CloseReason)),
        )
    texts = [None, random_text(rng)]
    facts = Facts(
        client_id=rng.choice(texts),
        user_name=rng.choice(texts),
        sni_host=rng.choice(texts),
        source_ip=rng.choice(texts),
        roles=tuple(random_text(rng) for _ in range(rng.randrange(3))),
    )
    return Decided(
        conn=conn,
        key=random_text(rng),
        status=rng.choice(list(RouteStatus)),
        reason=rng.choice(list(DecisionReason)),
        mode=rng.choice(list(Mode)),
        node_id=rng.choice(texts),
        local=rng.random() < 0.5,
        protocol=rng.choice([None, *WireProtocol]),
        facts=rng.choice([None, facts]),
        source=rng.choice([None, Address(random_text(rng), 1)]),
        latency_s=random_float(rng),
    )


# -- the recorder ----------------------------------------------------------------------------------


class Checked:
    """A recorder and its Python model, driven together: every answer compared."""

    def __init__(self, size: int, key_types: dict[str, KeyType] | None = None) -> None:
        self.key_types = dict(ROUTERS) if key_types is None else key_types
        self.clock = Clock()
        self.native = make_recorder(size, self.key_types, self.clock)
        self.model = RingModel(size)
        self.values: dict[bytes, tuple[object, ...]] = {}

    def record(self, event: Event) -> None:
        held = self.native.record(event)
        values = reference_values(event, self.key_types, self.clock.last)
        record = reference_record(values)
        self.values[record] = values
        check(held == self.model.put(record), f"record: holds {held}, the model {len(self.model.held)}")
        self.compare_state()
        COUNTS.records += 1

    def refuse(self, event: object, error: type[Exception], message: str) -> None:
        """A bug's event: the recorder raises and puts nothing."""
        try:
            self.native.record(event)
        except error as exc:
            check(message in str(exc), f"record: {exc!r} does not say {message!r}")
        else:
            raise Mismatch(f"record took a bad event, expected {error.__name__}: {message}")
        self.compare_state()
        COUNTS.errors += 1

    def take(self, most: int, max_bytes: int = NATIVE_RECORDS_MAX) -> None:
        first, count, records = self.native.take(most, max_bytes)
        expected = self.model.take(most, max_bytes)
        check((first, count) == expected[:2], f"take: {(first, count)} != model {expected[:2]}")
        check(records == expected[2], f"take({most}, {max_bytes}): records differ from the reference's")
        self.compare_state()
        if count:  # as the writer gets them: a frame, its batch, its values and columns
            batch = decode_frame(native_frame(first, count, records)[FRAME_HEAD.size :])
            assert isinstance(batch, NativeBatch)
            values = [self.values.pop(r) for r in split(records)]
            got = canonical(frames.events_of(NativeBatch(batch.first, batch.count, exact(records))))
            check(got == expected_rows(first, values), "events_of: not the Python recorder's values")
            check_decoder([(first, count, records)], "a frame the recorder made")
            check(
                frames.columns([batch]) == native.columns([(first, count, records)], COLUMN_CODES), "columns"
            )

    def resize(self, size: int) -> None:
        self.native.resize(size)
        self.model.size = size
        self.compare_state()

    def compare_state(self) -> None:
        ring, model = self.native, self.model
        got = (len(ring), ring.size, ring.puts, ring.dropped)
        expected = (len(model.held), model.size, model.puts, model.dropped)
        check(got == expected, f"(len, size, puts, dropped) {got} != model {expected}")
        check(ring.held_bytes >= sum(map(len, model.held)), "the ring holds fewer bytes than its records")


def split(records: bytes) -> Iterator[bytes]:
    pos = 0
    while pos < len(records):
        (length,) = struct.unpack_from("<I", records, pos)
        yield records[pos : pos + length]
        pos += length


def run_recorder(rng: random.Random, operations: int) -> None:
    """Random records, takes (by count and by bytes) and resizes against the model: the ring grows,
    compacts, drops and gives memory back as the Python ring's rules say."""
    ring = Checked(rng.choice([1, 3, 50, 1000]))
    for _ in range(operations):
        roll = rng.random()
        if roll < 0.7:
            ring.record(random_event(rng))
        elif roll < 0.95:
            ring.take(rng.choice([0, 1, 5, 100, -1]), rng.choice([1, 200, 5000, NATIVE_RECORDS_MAX]))
        else:
            ring.resize(rng.choice([1, 2, 10, 500]))
    ring.take(10**9)


def check_recorder_boundaries() -> None:
    """Empty rings, size one, a resize below what is held, the byte bound, the raw key's cap, the
    largest record and one byte more, every field type and every key type, and memory given back
    after a burst."""
    ring = Checked(1)
    ring.take(10)  # empty
    ring.take(0)
    first = random_event(random.Random(1))
    for _ in range(3):
        ring.record(first)
    ring.take(1, 1)
    ring = Checked(5)
    for n in range(5):
        ring.record(closed(n))
    ring.resize(2)  # shrinking deletes nothing
    ring.record(closed(5))
    ring.take(2)
    ring.resize(4)
    ring.take(1, 1)  # over the byte bound: one record all the same
    ring.take(10)
    ring.native.resize(1)
    for bad in (0, -5):
        try:
            ring.native.resize(bad)
        except ValueError as exc:
            check(f"got {bad}" in str(exc), str(exc))
        else:
            raise Mismatch(f"resize({bad}) was taken")
    check(ring.native.size == 1, "a refused resize changed the size")
    ring.model.size = 1

    ring = Checked(100)
    for router in [*ROUTERS, "other"]:
        for facts in (
            None,
            Facts(),
            Facts(client_id="c", user_name="u", sni_host="s", source_ip="i", roles=("a", "b")),
        ):
            ring.record(decided(conn=ref(router=router), facts=facts))
    for raw in ("", "x" * RAW_KEY_CAP, "x" * (RAW_KEY_CAP + 1), "😀" * (RAW_KEY_CAP + 1), "\udfff" * 300):
        ring.record(decided(facts=Facts(client_id=raw)))
    for value in (0, 1, -(2**63), 2**63 - 1):
        ring.record(closed(1, bytes_in=value, bytes_out=value, conn=ref(id=value)))
    for latency in (0, 7, float("nan"), float("-inf"), -0.0, 1e-300):
        ring.record(decided(latency_s=latency))
    for source, protocol in ((None, None), (Address("h", 1), WireProtocol.AMQP)):
        for local, reason in ((True, DecisionReason.CACHE), (False, DecisionReason.POLICY)):
            ring.record(decided(source=source, protocol=protocol, local=local, reason=reason, node_id=None))
    ring.take(10**9)

    # The largest record, then one byte more (an event the event log counts lost).
    ring = Checked(2)
    small = len(reference_record(reference_values(decided(key=""), ring.key_types, 0.0)))
    ring.record(decided(key="k" * (RECORD_MAX - small)))
    ring.refuse(
        decided(key="k" * (RECORD_MAX - small + 1)), ValueError, f"an event of {RECORD_MAX + 1} bytes"
    )
    ring.take(10**9)
    check(ring.native.held_bytes == 0, "an emptied ring over 1 MiB keeps its buffer")

    ring = Checked(2_000)  # a burst over 1 MiB: the buffer grows by doubling, then is given back
    for n in range(1_000):
        event = closed(n, node_id="n" * 2000)
        ring.native.record(event)
        ring.model.put(reference_record(reference_values(event, ring.key_types, ring.clock.last)))
    check(ring.native.held_bytes > 16 * MIN_CAPACITY, f"a burst held {ring.native.held_bytes} bytes")
    while ring.model.held:
        most = 300
        first, count, records = ring.native.take(most, NATIVE_RECORDS_MAX)
        check((first, count, records) == ring.model.take(most, NATIVE_RECORDS_MAX), "a burst's take")
    check(ring.native.held_bytes == 0, "the ring kept a burst's memory")
    ring.compare_state()


def ref(**values: object) -> ConnectionRef:
    fields: dict[str, object] = {"id": 7, "router": "r", "acceptor": "a", "peer": Address("10.0.0.9", 1883)}
    return ConnectionRef(**(fields | values))  # type: ignore[arg-type]


def decided(**values: object) -> Decided:
    fields: dict[str, object] = {
        "conn": ref(),
        "key": "CLIENT_ID",
        "status": RouteStatus.OK,
        "reason": DecisionReason.POLICY,
        "mode": Mode.PROXY,
        "node_id": "node4",
        "local": False,
        "protocol": WireProtocol.MQTT,
        "facts": Facts(client_id="dev-1-abc", source_ip="10.0.0.9"),
        "source": None,
        "latency_s": 0.25,
    }
    return Decided(**(fields | values))  # type: ignore[arg-type]


def closed(n: int, **values: object) -> Closed:
    fields: dict[str, object] = {
        "conn": ref(id=n),
        "node_id": f"n{n}",
        "bytes_in": n,
        "bytes_out": 2 * n,
        "duration_s": n / 3,
        "reason": CloseReason.CLOSED,
    }
    return Closed(**(fields | values))  # type: ignore[arg-type]


Member = enum.Enum("Member", [(f"M{n}", f"m{n}") for n in range(70)])  # type: ignore[misc]
"""More members than the recorder caches (64)."""


class Odd(enum.Enum):
    NOT_TEXT = 5


def check_recorder_errors() -> None:
    """A bug's events and a hostile recorder's callbacks: an error, nothing put, and the next
    event recorded (ASan sees any reference dropped once too often on these paths)."""
    ring = Checked(10)
    unset = Decided.__new__(Decided)
    for event, error, message in [
        (changed(decided(), key=5), TypeError, "a string field: a string, got int"),
        (changed(decided(), node_id=b"n"), TypeError, "a string or None, got bytes"),
        (changed(decided(), local=1), TypeError, "a bool field: a bool, got int"),
        (changed(decided(), latency_s="1"), TypeError, "a float field: a float, got str"),
        (changed(decided(), latency_s=2**1100), OverflowError, "too large"),
        (changed(decided(), source="10.0.0.1"), TypeError, "a (host, port) tuple, got str"),
        (changed(decided(), source=()), TypeError, "a (host, port) tuple, got tuple"),
        (changed(decided(), source=(5, 1)), TypeError, "an address: a string, got int"),
        (changed(decided(), status="OK"), AttributeError, "_value_"),
        (changed(decided(), status=Odd.NOT_TEXT), TypeError, "an enum field: a string, got int"),
        (changed(decided(), facts=Facts(client_id=b"x")), TypeError, "the raw key: a string or None"),  # type: ignore[arg-type]
        (changed(decided(), conn=changed(ref(), id=1.5)), TypeError, "an int, got float"),
        (changed(decided(), conn=changed(ref(), id=True)), TypeError, "an int, got bool"),
        (changed(decided(), conn=changed(ref(), id=2**64)), OverflowError, "too big"),
        (changed(decided(), conn=changed(ref(), router=b"r")), TypeError, "router name is not a string"),
        (changed(decided(), conn="c"), TypeError, "a ConnectionRef, got str"),
        (changed(closed(1), bytes_in=2**63), OverflowError, "too big"),
        (changed(closed(1), node_id=None), TypeError, "a string field: a string, got NoneType"),
        (unset, AttributeError, "slot is not set"),
    ]:
        ring.refuse(event, error, message)
        ring.record(decided())
    check(ring.native.record(Accepted(conn=ref())) == -1, "an event the log does not record was taken")
    ring.compare_state()
    ring.take(100)

    enums = Checked(100)  # the enum cache's bound
    cached = 0
    for member in Member:
        try:
            enums.native.record(closed(1, reason=member))
        except ValueError as exc:
            check("more enum members than the recorder caches" in str(exc), str(exc))
            break
        enums.model.put(reference_record(reference_values(closed(1, reason=member), {}, enums.clock.last)))
        cached += 1
    else:
        raise Mismatch("the recorder cached 70 enum members")
    check(cached == 64, f"{cached} enum members recorded")
    enums.compare_state()
    enums.native.take(10**9, NATIVE_RECORDS_MAX)

    # Python code the recorder calls, misbehaving: a clock that fails or returns no float, a raw
    # key getter that fails, records into the same ring, or replaces the key type it was called for.
    def failing() -> float:
        raise RuntimeError("no clock")

    for clock, error in (
        (failing, RuntimeError),
        (lambda: "now", TypeError),
        (lambda: 2**2000, OverflowError),
    ):
        odd = make_recorder(10, {}, clock)
        for event in (decided(), closed(1)):
            try:
                odd.record(event)
            except error:
                pass
            else:
                raise Mismatch(f"a clock that raises {error.__name__} was taken")
        check(len(odd) == 0 and odd.puts == 0, "a failed clock put an event")

    key_types = {"r": KeyType.CLIENT_ID}
    nested: list[int] = []

    def reentrant(facts: Facts) -> str:
        nested.append(hostile.record(closed(len(nested))))
        key_types["r"] = KeyType.ROLE_NAME  # a reload, while the recorder reads the old key type
        return "raw-" * 100

    def failing_getter(facts: Facts) -> str:
        raise KeyError("no raw key")

    raw_of = dict(RAW_OF) | {KeyType.CLIENT_ID: reentrant, KeyType.USER_NAME: failing_getter}
    hostile: Any = native.Recorder(
        size=10,
        event_types=(Decided, Closed),
        identities=(DecisionReason.CACHE,),
        ref_type=ConnectionRef,
        key_types=key_types,
        default_key_type=KeyType.USER_NAME,
        raw_of=raw_of,
        clock=lambda: 1.5,
    )
    check(hostile.record(decided()) == 2 and nested == [1], "a record inside a record")
    key_types["r"] = KeyType.CLIENT_ID
    try:
        hostile.record(decided(conn=ref(router="other")))
    except KeyError:
        pass
    else:
        raise Mismatch("a failing raw key getter was taken")
    first, count, records = hostile.take(10, NATIVE_RECORDS_MAX)
    got = canonical(native.rows(first, count, exact(records), COLUMN_CODES))
    expected = [
        reference_values(closed(0), {}, 1.5),
        (
            *reference_values(decided(), {"r": KeyType.CLIENT_ID}, 1.5)[:8],
            "raw-" * 64,
            400,
            *reference_values(decided(), {}, 1.5)[10:],
        ),
    ]
    check(got == expected_rows(0, expected), f"re-entrant records: {got}")


def check_recorder_setup() -> None:
    """Types the compiled program cannot run on are refused when a recorder is made; a recorder
    is set up once; one never set up records nothing."""
    decided_unslotted = type("Decided", (), {"__slots__": ("conn",)})
    good: dict[str, object] = {
        "event_types": (Decided, Closed),
        "identities": (DecisionReason.CACHE,),
        "ref_type": ConnectionRef,
    }
    cases: list[tuple[dict[str, object], str]] = [
        ({"event_types": (Decided,)}, "is for 2 event types, got 1"),
        ({"event_types": (Closed, Decided)}, "program 0 is for Decided events, got Closed"),
        ({"event_types": (decided_unslotted, Closed)}, "is not a slot"),
        ({"event_types": (Decided, 5)}, "event_types: types, got int"),
        ({"identities": ()}, "compares with 1 identities, got 0"),
        ({"identities": (Mode.PROXY,)}, "identity 0: a DecisionReason, got Mode"),
        ({"ref_type": Address}, "is not a slot"),
        ({"size": 0}, "a ring size is at least 1, got 0"),
    ]
    for given, message in cases:
        arguments: dict[str, object] = {"size": 1} | good | given
        try:
            native.Recorder(
                **arguments, key_types={}, default_key_type=DEFAULT_KEY_TYPE, raw_of={}, clock=lambda: 0.0
            )
        except (TypeError, ValueError) as exc:
            check(message in str(exc), f"{exc!r} does not say {message!r}")
        else:
            raise Mismatch(f"a recorder was made with {given}")
        COUNTS.errors += 1
    ring = make_recorder(1, {}, lambda: 0.0)
    try:
        ring.__init__(
            size=1, **good, key_types={}, default_key_type=DEFAULT_KEY_TYPE, raw_of={}, clock=lambda: 0.0
        )
    except TypeError as exc:
        check("set up once" in str(exc), str(exc))
    else:
        raise Mismatch("a recorder was set up twice")
    blank = native.Recorder.__new__(native.Recorder)
    check(blank.record(decided()) == -1 and len(blank) == 0, "a recorder never set up recorded")
    check(blank.take(5, 100) == (0, 0, b""), "a recorder never set up gave records")


def check_threads() -> None:
    """Reporting threads recording while the sender takes, as routerd runs the recorder: every
    event is taken once, in order, or counted dropped."""
    ring = make_recorder(1000, dict(ROUTERS), Clock())
    got: list[int] = []

    def record_many(base: int) -> None:
        for n in range(base, base + 1500):
            ring.record(closed(n) if n % 2 else decided())

    threads = [threading.Thread(target=record_many, args=(i * 100_000,)) for i in range(3)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads) or len(ring):
        first, count, records = ring.take(300, NATIVE_RECORDS_MAX)
        got += [number for number, _ in native.rows(first, count, exact(records), COLUMN_CODES)]
    for thread in threads:
        thread.join()
    check(got == sorted(set(got)), "numbers taken twice or out of order")
    check(len(got) + ring.dropped == ring.puts == 4500, "events lost uncounted")


# -- the decoder -----------------------------------------------------------------------------------


def check_decoder_boundaries(rng: random.Random) -> list[bytes]:
    """Empty input, the numbers' limits, every field tag in every column type, the argument
    checks; returns valid record streams for the mutations."""
    check(native.rows(0, 0, exact(b""), COLUMN_CODES) == [], "rows of nothing")
    check(native.columns([], COLUMN_CODES) == (None, None), "columns of no frame")
    check(native.columns([(0, 0, exact(b""))], COLUMN_CODES) == (None, None), "columns of an empty frame")
    ring = Checked(1000)
    for _ in range(40):
        ring.record(random_event(rng))
    _, count, records = ring.native.take(1000, NATIVE_RECORDS_MAX)
    ring.model.take(1000, NATIVE_RECORDS_MAX)
    streams = [records, *split(records)]
    for number in (0, 2**63 - 1 - count, 2**63 - 1, 2**63 - count, -1):
        check_decoder([(number, count, records)], f"first number {number}")
    for wrong in (-1, count - 1, count + 1, 2**62):
        check_decoder([(0, wrong, records)], f"count {wrong}")
    check_decoder([(0, 1, r) for r in streams[1:6]], "five frames of one record")
    check_decoder([(0, count, records), (5, 1, streams[1] + b"\x00")], "a broken frame after a good one")

    # Every tag in every column type: the decoder takes only a tag that fits (or null).
    for tag, payload in (
        (0, b""),
        (1, b"\x02\x00\x00\x00ok"),
        (2, bytes(8)),
        (3, bytes(8)),
        (4, b""),
        (5, b""),
    ):
        for codes in (b"s", b"q", b"d", b"b"):
            body = bytes([tag]) + payload
            record = HEAD.pack(HEAD.size + len(body), 0, 0.5, 1) + body
            check(decodes(record, (codes,)) == (_fits(tag, codes.decode()),) * 2, f"tag {tag} in {codes!r}")
            COUNTS.decoded += 1
    wide = (b"sqdb" * 8,) * 8  # the most kinds and columns
    body = b"".join(
        bytes([t]) + p for t, p in ((1, b"\x00\x00\x00\x00"), (2, bytes(8)), (3, bytes(8)), (5, b"")) * 8
    )
    record = HEAD.pack(HEAD.size + len(body), 7, 0.5, 1) + body
    check(decodes(record, wide) == (True, True), "eight kinds of 32 columns")
    check(native.columns([(0, 1, exact(record))], wide)[7][0] == 1, "eight kinds of 32 columns")
    for types, error in (
        ((), TypeError),
        ((b"s",) * 9, TypeError),
        ((b"s" * 33,), TypeError),
        (("s",), TypeError),
        ([b"s"], TypeError),
        ((b"x",), ValueError),
        ((b"\x00",), ValueError),
    ):
        for entry_point, args in ((native.rows, (0, 0, b"", types)), (native.columns, ([], types))):
            try:
                entry_point(*args)
            except error:
                COUNTS.errors += 1
            else:
                raise Mismatch(f"types {types!r} were taken")
    for bad_rows in ((0, 0, "text", COLUMN_CODES), (0, -1, b"", COLUMN_CODES), (-1, 0, b"", COLUMN_CODES)):
        try:
            native.rows(*bad_rows)
        except (TypeError, ValueError):
            COUNTS.errors += 1
        else:
            raise Mismatch(f"rows{bad_rows!r} was taken")
    for frames_arg in (((0, 0, b""),), [(0, 0)], [(0, 0, b"", 1)], [(-1, 0, b"")], [(0, 0, "text")]):
        try:
            native.columns(frames_arg, COLUMN_CODES)
        except (TypeError, ValueError):
            COUNTS.errors += 1
        else:
            raise Mismatch(f"columns({frames_arg!r}) was taken")
    return streams


def decodes(record: bytes, codes: tuple[bytes, ...]) -> tuple[bool, bool]:
    """Whether `rows` and `columns` take one record."""
    outcomes = []
    for entry_point, args in (
        (native.rows, (0, 1, exact(record), codes)),
        (native.columns, ([(0, 1, exact(record))], codes)),
    ):
        try:
            entry_point(*args)
        except ValueError:
            outcomes.append(False)
        else:
            outcomes.append(True)
    return outcomes[0], outcomes[1]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One random change of the kinds that break records: bytes overwritten, a cut, bytes added or
    removed, a length field set to a value at a limit."""
    out = bytearray(data)
    roll = rng.randrange(6)
    if roll == 0 and out:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] = rng.randrange(256)
    elif roll == 1:
        del out[rng.randrange(len(out) + 1) :]
    elif roll == 2:
        out[rng.randrange(len(out) + 1) : 0] = rng.randbytes(rng.randint(1, 30))
    elif roll == 3 and out:
        start = rng.randrange(len(out))
        del out[start : start + rng.randint(1, 8)]
    elif len(out) >= 4:
        at = rng.choice([0, rng.randrange(len(out) - 3)])
        left = len(out) - at
        value = rng.choice([0, 1, 3, 4, 20, 21, 22, left - 1, left, left + 1, 2**31 - 1, 2**32 - 1])
        out[at : at + 4] = struct.pack("<I", value % 2**32)
    return bytes(out)


def string_lengths(record: bytes) -> list[int]:
    """Where the lengths of a valid record's strings are."""
    pos, found = HEAD.size, []
    for _ in COLUMN_CODES[record[4]]:
        tag = record[pos]
        pos += 1
        if tag == TAG_STR:
            found.append(pos)
            pos += 4 + struct.unpack_from("<I", record, pos)[0]
        elif tag in (TAG_INT, TAG_FLOAT):
            pos += 8
    return found


def edges(records: bytes) -> Iterator[bytes]:
    """Valid records with their last one, the one that ends where the buffer ends, changed at its
    edges: cut short by 1-9 bytes (its length changed to match: its last field runs past it), its
    length one more or one less than its bytes, each of its strings' lengths one more or one less,
    or as long as what is left of the record and one more. A read one byte too far is past the
    buffer."""
    *before, last = split(records)
    head = b"".join(before)
    variants = []
    for cut in range(1, 10):
        variants.append((last[:-cut], 0, len(last) - cut))
    for delta in (1, -1):
        variants.append((last, 0, len(last) + delta))
    for at in string_lengths(last):
        (size,) = struct.unpack_from("<I", last, at)
        left = len(last) - at - 4
        for value in {size + 1, (size - 1) % 2**32, left, left + 1}:
            variants.append((last, at, value))
    for record, at, value in variants:
        changed_record = bytearray(record)
        struct.pack_into("<I", changed_record, at, value)
        yield head + changed_record


def run_decoder(rng: random.Random, corpus: Path, mutations: int, streams: list[bytes]) -> int:
    """The fuzz corpus as the writer reads it, each of its native frames cut at every length, the
    edges of the corpus's and the recorder's records, and random mutations of them."""
    payloads = [path.read_bytes() for path in sorted(corpus.iterdir())]
    check(len(payloads) >= 5, f"the corpus {corpus} has {len(payloads)} files")
    native_frames: list[tuple[int, int, bytes]] = []
    for payload in payloads:
        for cut in range(len(payload) + 1):
            try:
                batch = decode_frame(payload[:cut])
            except ValueError:
                continue
            if isinstance(batch, NativeBatch):
                check_decoder(
                    [(batch.first, batch.count, bytes(batch.records))], f"a cut corpus frame ({cut})"
                )
                if cut == len(payload):
                    native_frames.append((batch.first, batch.count, bytes(batch.records)))
            else:
                check(cut == len(payload), "a cut marshal frame was read")
    check(len(native_frames) >= 4, "the corpus has native frames")
    check_decoder(native_frames, "every frame of the corpus")
    bases = [(first, count, records) for first, count, records in native_frames]
    bases += [(0, sum(1 for _ in split(s)), s) for s in streams]
    for first, count, records in bases:
        for n, edge in enumerate(edges(records)):
            check_decoder([(first, count, edge)], f"edge {n} of {records[:64].hex()}")
    for n in range(mutations):
        first, count, records = rng.choice(bases)
        mutated = mutate(rng, records)
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            mutated = mutate(rng, mutated)
        count = rng.choice([count, count, count, max(count - 1, 0), count + 1])
        if rng.random() < 0.5:  # the writer's way: from a frame's payload
            payload = native_frame(first, count, mutated)[FRAME_HEAD.size :]
            batch = decode_frame(payload)
            assert isinstance(batch, NativeBatch)
            first, count, mutated = batch.first, batch.count, bytes(batch.records)
        check_decoder([(first, count, mutated)], f"mutation {n}")
    return len(payloads)


def main(argv: list[str]) -> int:
    corpus, mutations, seed = Path(argv[1]), int(argv[2]), int(argv[3])
    print(f"native: {native.__file__}", flush=True)
    check(vars(frames)["_native"] is native and frames.NATIVE, "frames did not select this extension")
    check(
        [len(reference_values(e, {}, 0.0)) - VALUE_HEAD for e in (decided(), closed(1))]
        == list(map(len, VALUE_NAMES)),
        "the reference's values are not VALUE_NAMES",
    )
    rng = random.Random(seed)
    check_recorder_setup()
    check_recorder_boundaries()
    check_recorder_errors()
    run_recorder(rng, 1500)
    check_threads()
    streams = check_decoder_boundaries(rng)
    files = run_decoder(rng, corpus, mutations, streams)
    print(
        f"ok: {COUNTS.records} records checked, {COUNTS.errors} errors, decoded {COUNTS.decoded}, "
        f"refused {COUNTS.refused}, {files} corpus files, {mutations} mutations (seed {seed})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
