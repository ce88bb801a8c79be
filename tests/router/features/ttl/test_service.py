"""router/features/ttl/service.py: the TTL checker on trio's virtual clock (exact close times), with
the log line it leaves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import Config, RouterConfig
from router.core.events import CloseReason
from router.core.live import LiveConnections
from router.features.ttl.service import serve_connection_ttl_checks
from router.metrics import Metrics
from router.runtime import RouterRuntime
from tests.router.core.test_live import Closer, live_connection
from tests.router.core.test_ttl import _mqtt

if TYPE_CHECKING:
    import pytest

    from keys import Sniffed
    from router.core.live import LiveConnection


def _runtime() -> RouterRuntime:
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{20000 + i}") for i in (1, 2))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("b1", "b2")),
    )
    return RouterRuntime(Config(source="t.xml", connectors=connectors, routers=(router,)), router, Metrics())


class _Held:
    """Stand-ins for proxied connections on the trio path: each runs until its scope is cancelled
    by its closer, as the trio path's do."""

    def __init__(self) -> None:
        self.closed_at: dict[str, float] = {}

    def connection(
        self, peer: str, now: float, *, ttl_ms: int = 1500, sniffed: Sniffed | None = None
    ) -> tuple[LiveConnection, trio.CancelScope]:
        scope = trio.CancelScope()
        closer = Closer()
        conn = live_connection(peer, now=now, ttl_ms=ttl_ms, sniffed=sniffed, closer=closer)
        closer.then = scope.cancel
        return conn, scope

    async def hold(self, conn: LiveConnection, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep_forever()
        self.closed_at[str(conn.conn.peer)] = trio.current_time()


class TestServeConnectionTtlChecks:
    async def test_closes_at_ttl_after_the_last_client_bytes(
        self, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Scenario: TTL 1.5 s checked every 0.25 s; one client silent, one sends at 1 s, one with
        TTL 1.6 s (closed at the first check after it), one exempt MQTT client."""
        caplog.set_level(logging.INFO, logger="router.conn")
        runtime, held = _runtime(), _Held()
        start = trio.current_time()
        silent = held.connection("10.1.0.1:1", start)
        talking = held.connection("10.1.0.1:2", start)
        odd = held.connection("10.1.0.1:3", start, ttl_ms=1600)
        exempt = held.connection("10.1.0.1:4", start, sniffed=_mqtt(1))
        async with trio.open_nursery() as nursery:
            for conn, scope in (silent, talking, odd, exempt):
                runtime.connections.register(conn)
                nursery.start_soon(held.hold, conn, scope)
            nursery.start_soon(serve_connection_ttl_checks, runtime, 0.25)
            await trio.sleep(1.0)
            talking[0].last_read_at = trio.current_time()  # what the relay does on a read
            await trio.sleep(99)
            nursery.cancel_scope.cancel()
        assert {peer: t - start for peer, t in held.closed_at.items()} == {
            "10.1.0.1:1": 1.5,
            "10.1.0.1:3": 1.75,
            "10.1.0.1:2": 2.5,
        }
        assert [c.closed_by for c, _ in (silent, talking, odd, exempt)] == [
            CloseReason.CONNECTION_TTL
        ] * 3 + [None]
        lines = [r.getMessage() for r in caplog.records if "outcome=CONNECTION_TTL" in r.getMessage()]
        assert lines[0] == (
            "peer=10.1.0.1:1 router=r acceptor=a target=b1 address=127.0.0.1:20001 outcome=CONNECTION_TTL "
            "idle_s=1.500 ttl_ms=1500: no bytes from the client within the connection TTL, closing"
        )
        assert len(lines) == 3
        assert all(r.levelno == logging.WARNING for r in caplog.records if "CONNECTION_TTL" in r.getMessage())

    async def test_a_late_check_skips_missed_slots(
        self, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Scenario: the loop is blocked for 1 s; the checks that were due then happen once, and the
        schedule goes on from the late check instead of bursting to catch up."""
        checks: list[float] = []

        runtime = _runtime()
        sweep = LiveConnections.close_idle

        def counting(
            connections: LiveConnections, now: float, reason: CloseReason
        ) -> list[tuple[LiveConnection, float]]:
            checks.append(now)
            return sweep(connections, now, reason)

        monkeypatch.setattr(LiveConnections, "close_idle", counting)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_connection_ttl_checks, runtime, 0.25)
            await trio.sleep(0.3)
            autojump_clock.jump(1.0)  # as if a task hogged the loop until 1.3 s
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
        assert [round(t - start, 6) for t in checks] == [0.25, 1.3, 1.55]


async def test_ttl_checks_serve_a_router_only_when_an_acceptor_has_a_ttl(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Scenario: the feature's service for one router: without an acceptor under a TTL it is done at
    once; with one (connection-ttl 1 s on its acceptor) it checks until cancelled."""
    from router.config.settings import AcceptorConfig
    from router.features.ttl.service import TtlChecks

    runtime = _runtime()
    plain = Config(source="t.xml", routers=(runtime.config,))
    with trio.move_on_after(1):
        await TtlChecks(lambda: plain).serve_router(runtime)
        assert trio.current_time() == 0  # returned at once: nothing to check
    acceptor = AcceptorConfig(name="a", host="127.0.0.1", port=1, router="r", connection_ttl_ms=1000)
    under_ttl = Config(source="t.xml", routers=(runtime.config,), acceptors=(acceptor,))
    assert under_ttl.ttl_acceptors("r")
    with trio.move_on_after(5) as scope:
        await TtlChecks(lambda: under_ttl).serve_router(runtime)
    assert scope.cancelled_caught  # it ran until cancelled
