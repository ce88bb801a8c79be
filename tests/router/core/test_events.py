"""router/core/events.py: the closed set of close reasons and the event types."""

from __future__ import annotations

import dataclasses

import pytest

from router.core.address import Address
from router.core.events import Accepted, Closed, CloseReason, ConnectionRef


def test_close_reasons_by_the_router_are_the_ones_it_decides() -> None:
    assert {r for r in CloseReason if r.by_router} == {
        CloseReason.CONNECTION_TTL,
        CloseReason.TARGET_NOT_READY,
        CloseReason.FAILOVER,
        CloseReason.SHUTDOWN,
        CloseReason.EVACUATED,
        CloseReason.TARGET_REMOVED,
    }
    assert [r.value for r in CloseReason] == [
        "closed",
        "reset",
        "replay_failed",
        "connection_ttl",
        "target_not_ready",
        "failover",
        "shutdown",
        "evacuated",
        "target_removed",
        "broker_closed_early",
        "broker_refused",
        "internal_error",
    ]


def test_events_are_frozen_values() -> None:
    conn = ConnectionRef(id=1, router="r", acceptor="a", peer=Address("::1", 5000))
    assert Accepted(conn=conn) == Accepted(conn=dataclasses.replace(conn))
    closed = Closed(conn=conn, node_id="b", bytes_in=1, bytes_out=2, duration_s=0.5, reason=CloseReason.RESET)
    with pytest.raises(dataclasses.FrozenInstanceError):
        closed.bytes_in = 3  # type: ignore[misc]
    assert closed.detail == ""
