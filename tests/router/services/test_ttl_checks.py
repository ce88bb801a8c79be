"""router/services/ttl_checks.py: the TTL checker on trio's virtual clock (exact close times), with
the log line and the metric it leaves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
import trio.testing

from router.core.live import LiveConnections, ProxiedConnection
from router.services.ttl_checks import serve_connection_ttl_checks
from tests.router.core.test_live import _conn, _hold, _runtime
from tests.router.core.test_ttl import _mqtt

if TYPE_CHECKING:
    import pytest


class TestServeConnectionTtlChecks:
    async def test_closes_at_ttl_after_the_last_client_bytes(
        self, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: TTL 1.5 s checked every 0.25 s; one client silent, one sends at 1 s, one with
        TTL 1.6 s (closed at the first check after it), one exempt MQTT client."""
        caplog.set_level(logging.INFO, logger="router.conn")
        runtime = _runtime()
        start = trio.current_time()
        silent = _conn("p:silent", now=start)
        talking = _conn("p:talking", now=start)
        odd = _conn("p:odd", ttl_ms=1600, now=start)
        exempt = _conn("p:mqtt", sniffed=_mqtt(1), now=start)
        closed_at: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            for conn in (silent, talking, odd, exempt):
                runtime.connections.add(conn)
                nursery.start_soon(_hold, conn, closed_at)
            nursery.start_soon(serve_connection_ttl_checks, runtime, 0.25)
            await trio.sleep(1.0)
            talking.last_read_at = trio.current_time()  # what the relay does on a read
            await trio.sleep(99)
            nursery.cancel_scope.cancel()
        assert {peer: t - start for peer, t in closed_at.items()} == {
            "p:silent": 1.5,
            "p:odd": 1.75,
            "p:talking": 2.5,
        }
        assert exempt.closed_by is None
        value = runtime.metrics.registry.get_sample_value(
            "router_proxied_connections_closed_total", {"router": "r", "reason": "connection_ttl"}
        )
        assert value == 3.0
        lines = [r.getMessage() for r in caplog.records if "outcome=CONNECTION_TTL" in r.getMessage()]
        assert lines[0] == (
            "peer=p:silent router=r acceptor=a target=b1 address=127.0.0.1:20001 outcome=CONNECTION_TTL "
            "idle_s=1.500 ttl_ms=1500: no bytes from the client within the connection TTL, closing"
        )
        assert len(lines) == 3
        assert all(r.levelno == logging.WARNING for r in caplog.records if "CONNECTION_TTL" in r.getMessage())

    async def test_a_late_check_skips_missed_slots(self, autojump_clock: trio.testing.MockClock) -> None:
        """Scenario: the loop is blocked for 1 s; the checks that were due then happen once, and the
        schedule goes on from the late check instead of bursting to catch up."""
        checks: list[float] = []

        class Counting(LiveConnections):
            def close_idle(self, now: float) -> list[tuple[ProxiedConnection, float]]:
                checks.append(now)
                return super().close_idle(now)

        runtime = _runtime()
        runtime.connections = Counting()
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection_ttl_checks, runtime, 0.25)
            await trio.sleep(0.3)
            autojump_clock.jump(1.0)  # as if a task hogged the loop until 1.3 s
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
        assert [round(t - start, 6) for t in checks] == [0.25, 1.3, 1.55]
