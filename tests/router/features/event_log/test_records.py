"""router/features/event_log/records.py: a connection's event's record and values, and the line the
writer makes of them (the lines themselves: tests/event_format/test_lines.py)."""

from __future__ import annotations

import json
import marshal
from typing import Any

import pytest

from event_format.lines import json_line, values_line
from event_format.schema import BOOT_SPAN, RAW_KEY_CAP, CloseRecord, DecisionRecord, Sequence, timestamp
from keys import ConnectionFacts, KeyType, WireProtocol
from router.core.address import Address
from router.core.engine import DecisionReason, RouteStatus
from router.core.events import Closed, CloseReason, ConnectionRef, Decided, Mode
from router.features.event_log.records import event_values, record_of

CONN = ConnectionRef(id=7, router="r", acceptor="mqtt", peer=Address("10.0.0.1", 4000))
TS = "2026-11-23T10:00:00.000001Z"


def decision(**changes: Any) -> Decided:
    values: dict[str, Any] = {
        "conn": CONN,
        "key": "dev-1",
        "status": RouteStatus.OK,
        "reason": DecisionReason.CACHE,
        "mode": Mode.PROXY,
        "node_id": "node4",
        "protocol": WireProtocol.MQTT,
        "facts": ConnectionFacts(source_ip="10.0.0.9", client_id="dev-1-abc", roles=("a", "b")),
        "source": Address("10.0.0.9", 5555),
        "latency_s": 12.34e-6,
    }
    return Decided(**(values | changes))


def test_decision_record_of_a_decided_event():
    record = record_of(decision(), router_id="h/mqtt", seq=5, conn=9, ts=TS, key_type=KeyType.CLIENT_ID)
    assert isinstance(record, DecisionRecord)
    assert (record.router, record.acceptor, record.source) == ("r", "mqtt", "10.0.0.9")
    assert (record.raw_key, record.raw_key_length, record.key) == ("dev-1-abc", 9, "dev-1")
    assert (record.status, record.reason, record.mode, record.node_id) == ("OK", "cache", "proxy", "node4")
    assert record.cache_hit
    assert record.protocol == "mqtt"
    assert record.latency_us == 12.3


def test_decision_without_source_is_the_peer_and_policy_is_no_cache_hit():
    event = decision(source=None, reason=DecisionReason.POLICY, facts=None, protocol=None)
    record = record_of(event, router_id="x", seq=1, conn=1, ts=TS, key_type=KeyType.SOURCE_IP)
    assert isinstance(record, DecisionRecord)
    assert record.source == "10.0.0.1"
    assert not record.cache_hit
    assert record.raw_key is None
    assert record.raw_key_length == 0
    assert record.protocol is None


def test_raw_key_is_capped_and_its_length_kept():
    long_id = "x" * 5000
    event = decision(facts=ConnectionFacts(client_id=long_id))
    record = record_of(event, router_id="x", seq=1, conn=1, ts=TS, key_type=KeyType.CLIENT_ID)
    assert isinstance(record, DecisionRecord)
    assert record.raw_key == "x" * RAW_KEY_CAP
    assert record.raw_key_length == 5000


def test_close_record_and_its_line():
    closed = Closed(
        conn=CONN, node_id="node9", bytes_in=10, bytes_out=20, duration_s=1.5, reason=CloseReason.RESET
    )
    record = record_of(
        closed, router_id="h", seq=BOOT_SPAN + 3, conn=BOOT_SPAN + 7, ts=TS, key_type=KeyType.CLIENT_ID
    )
    assert isinstance(record, CloseRecord)
    line = json_line(record)
    assert line.endswith("\n")
    assert line.count("\n") == 1
    assert json.loads(line) == {
        "kind": "close",
        "router_id": "h",
        "seq": BOOT_SPAN + 3,
        "ts": TS,
        "conn": BOOT_SPAN + 7,
        "router": "r",
        "acceptor": "mqtt",
        "node_id": "node9",
        "duration_s": 1.5,
        "bytes_in": 10,
        "bytes_out": 20,
        "reason": "reset",
    }


@pytest.mark.parametrize(
    "event",
    [
        decision(),
        decision(key="ключ 😀\n", facts=None, node_id=None, protocol=None, source=None, local=True),
        decision(reason=DecisionReason.CACHE, status=RouteStatus.OK, mode=Mode.REDIRECT),
        decision(facts=ConnectionFacts(client_id="x" * 300)),
        Closed(
            conn=CONN, node_id="n", bytes_in=0, bytes_out=2**40, duration_s=1 / 3, reason=CloseReason.SHUTDOWN
        ),
    ],
)
@pytest.mark.parametrize("key_type", list(KeyType))
def test_the_writers_line_is_the_records_line(event, key_type):
    """The line the writer process writes from the values routerd took is the record's line."""
    sequence, number, when = Sequence(1000), 3, 1795435200.25
    values = event_values(event, key_type, when)
    assert marshal.loads(marshal.dumps(values)) == values  # what the pipe carries
    record = record_of(
        event,
        router_id="h/é",
        seq=sequence.of(number),
        conn=sequence.of(event.conn.id),
        ts=timestamp(when),
        key_type=key_type,
    )
    assert values_line(values, router_id="h/é", sequence=sequence, number=number) == json_line(record)
