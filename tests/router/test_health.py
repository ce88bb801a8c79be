"""The health-check loop: schedule and outcomes on trio's virtual clock; the TCP probe for real."""

from __future__ import annotations

import trio

from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, TargetState
from router.health import PROBE_TIMEOUT_CAP_S, check_target, serve_health_checks
from router.metrics import Metrics
from router.routing import RouterRuntime
from router.settings import Config, RouterConfig


def _runtime(check_period_ms: int, *, local_target_enabled: bool = False) -> RouterRuntime:
    connectors = (Connector.from_url("b1", "tcp://127.0.0.1:21001"),)
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("b1",),
            check_period_ms=check_period_ms,
            local_target_enabled=local_target_enabled,
        ),
    )
    config = Config(source="t.xml", connectors=connectors, routers=(router,))
    return RouterRuntime(config, router, Metrics())


async def test_serve_health_checks_probes_at_once_then_every_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(check_period_ms=5000)
    start = trio.current_time()
    times: list[float] = []

    async def check(connector: Connector) -> tuple[bool, str]:
        times.append(trio.current_time() - start)
        await trio.sleep(0.25)  # a probe that takes time must not shift the schedule
        return True, ""

    with trio.move_on_after(16):
        await serve_health_checks(runtime, check=check)
    assert times == [0.0, 5.0, 10.0, 15.0]


async def test_serve_health_checks_failure_then_recovery_changes_readiness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(check_period_ms=1000)
    pool = runtime.pool
    assert pool is not None
    outcomes = iter([(True, ""), (False, "refused"), (True, "")])
    states: list[TargetState] = []  # the state each probe finds, i.e. the previous probe's outcome

    async def check(connector: Connector) -> tuple[bool, str]:
        states.append(pool.state("b1"))
        return next(outcomes)

    with trio.move_on_after(2.5):  # probes at 0, 1 and 2 s
        await serve_health_checks(runtime, check=check)
    states.append(pool.state("b1"))
    assert states == [TargetState.UNKNOWN, TargetState.READY, TargetState.NOT_READY, TargetState.READY]


async def test_serve_health_checks_probe_deadline_makes_target_not_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: a probe that never answers is cut at min(check period, cap) and counts as failed."""
    runtime = _runtime(check_period_ms=10_000)

    async def check(connector: Connector) -> tuple[bool, str]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_health_checks(runtime, check=check))
        assert runtime.pool is not None
        pool = runtime.pool
        await runtime.wait_until(lambda: pool.state("b1") is TargetState.NOT_READY)
        assert trio.current_time() - start == PROBE_TIMEOUT_CAP_S
        nursery.cancel_scope.cancel()


async def test_serve_health_checks_skips_local_target_without_connector(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(check_period_ms=1000, local_target_enabled=True)
    probed: list[str] = []

    async def check(connector: Connector) -> tuple[bool, str]:
        probed.append(connector.name)
        return True, ""

    with trio.move_on_after(0.5):
        await serve_health_checks(runtime, check=check)
    assert probed == ["b1"]
    assert runtime.pool is not None
    assert runtime.pool.state("local") is TargetState.UNKNOWN


async def test_check_target_open_port_is_ready() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    connector = Connector.from_url("up", f"tcp://127.0.0.1:{port}")
    assert await check_target(connector) == (True, "")
    await listeners[0].aclose()


async def test_check_target_closed_port_names_url_and_reason() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    connector = Connector.from_url("down", f"tcp://127.0.0.1:{port}")
    ok, detail = await check_target(connector)
    assert not ok
    assert detail == f"connect to tcp://127.0.0.1:{port} failed: Connection refused"
