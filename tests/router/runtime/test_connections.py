"""RouterConnections: the live-connection registry behind the router's lock, closing, and the
bytes counted at a scrape."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from router.core.events import CloseReason
from tests.router.core.test_live import Closer, live_connection
from tests.router.runtime.test_kernel import make_runtime

if TYPE_CHECKING:
    import pytest


class TestConnections:
    def test_close_all_closes_every_connection_and_says_so_once(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="router.pool")
        runtime = make_runtime()
        closers = [Closer(), Closer()]
        for port, (node_id, closer) in enumerate(zip(("b1", "b2"), closers, strict=True)):
            runtime.connections.register(
                live_connection(f"127.0.0.2:{port + 1}", node_id=node_id, closer=closer)
            )
        assert runtime.connections.close_all(CloseReason.SHUTDOWN) == 2
        assert runtime.connections.close_all(CloseReason.SHUTDOWN) == 0
        assert [c.calls for c in closers] == [[CloseReason.SHUTDOWN]] * 2
        messages = [r.getMessage() for r in caplog.records if "proxied connection" in r.getMessage()]
        assert messages == ["router=r grace period over: closing its 2 proxied connection(s)"]

    def test_unregister_forgets_a_connection(self) -> None:
        runtime = make_runtime()
        conn = live_connection()
        runtime.connections.register(conn)
        assert runtime.connections.open_connections("b1") == 1
        runtime.connections.unregister(conn)
        runtime.connections.unregister(conn)  # twice is harmless
        assert runtime.connections.open_connections() == 0
        runtime.pool.record_check("b1", True)
        runtime.pool.record_check("b1", False, "down")
        assert conn.closed_by is None  # not registered: not closed by the pool

    def test_a_scrape_counts_the_bytes_of_open_connections(self) -> None:
        """Scenario: a long-lived connection relays bytes between scrapes, then ends, then its
        router retires: the counter follows the bytes while they flow, never counts one twice and
        keeps what a retired router relayed."""
        runtime = make_runtime()
        registry = runtime.metrics.registry

        def scraped() -> tuple[float | None, ...]:
            runtime.metrics.exposition()
            return tuple(
                registry.get_sample_value(
                    "router_proxied_bytes_total", {"router": "r", "node_id": "b1", "direction": d}
                )
                for d in ("client_to_target", "target_to_client")
            )

        conn = live_connection()
        runtime.connections.register(conn)
        conn.counts[0] += 100
        assert scraped() == (100.0, None)  # no traffic that way yet: no series
        conn.counts[1] += 7000
        assert scraped() == (100.0, 7000.0)
        conn.counts[0] += 1
        runtime.connections.unregister(conn)
        runtime.connections.unregister(conn)
        assert scraped() == (101.0, 7000.0)
        other = live_connection("127.0.0.2:5001")
        runtime.connections.register(other)
        other.counts[1] += 9
        runtime.retire()
        assert scraped() == (101.0, 7009.0)
