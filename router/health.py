"""The health-check loop: probes every target of a pool and feeds the outcomes into `pools`.

Each target is probed at once when the router starts, then every `check-period` (scheduled on
absolute times, so a slow probe does not shift later ones). A probe that fails, times out or is
refused makes the target un-ready at once (`Pool.record_check`); the next success makes it ready.
The probe here is a TCP connect, each with its own deadline; broker-protocol probes (MQTT CONNECT,
AMQP open, …) plug in at `check_target`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from router.net import describe_oserror, open_connection

if TYPE_CHECKING:
    from pools import Connector, Target
    from router.routing import RouterRuntime

__all__ = ["PROBE_TIMEOUT_CAP_S", "Check", "check_target", "serve_health_checks"]

log = logging.getLogger("router.health")

PROBE_TIMEOUT_CAP_S: Final = 3.0
"""A probe's deadline is the check period, capped at this (Artemis waits 3000 ms for attributes)."""


async def check_target(connector: Connector) -> tuple[bool, str]:
    """Probe one target once. The caller's cancel scope is the probe's deadline.

    Returns:
        (whether the target is ready, the reason when it is not).
    """
    try:
        stream = await open_connection(connector.host, connector.port)
    except OSError as exc:
        return False, f"connect to {connector.url} failed: {describe_oserror(exc)}"
    await stream.aclose()
    return True, ""


Check = Callable[["Connector"], Awaitable[tuple[bool, str]]]
"""A probe: connector in, (ready, reason when not) out; the caller's cancel scope is its deadline."""


async def _probe_forever(runtime: RouterRuntime, target: Target, period_s: float, check: Check) -> None:
    assert target.connector is not None
    pool = runtime.pool
    assert pool is not None
    timeout_s = min(period_s, PROBE_TIMEOUT_CAP_S)
    next_time = trio.current_time()
    while True:
        ok, detail = False, f"no answer from {target.connector.url} within {timeout_s:g} s"
        with trio.move_on_after(timeout_s):
            ok, detail = await check(target.connector)
        runtime.apply_events(pool.record_check(target.node_id, ok, detail))
        next_time += period_s
        now = trio.current_time()
        if next_time < now:  # the probe overran: skip the missed slots instead of bursting
            next_time = now
        await trio.sleep_until(next_time)


async def serve_health_checks(
    runtime: RouterRuntime,
    *,
    check: Check = check_target,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe every target of a router's pool until cancelled.

    Args:
        runtime: the router whose pool is probed.
        check: the probe (a TCP connect by default).
        task_status: started once every probe loop is running.
    """
    pool, pool_config = runtime.pool, runtime.config.pool
    if pool is None or pool_config is None:
        task_status.started()
        return
    if not pool.targets:
        log.warning(
            "router=%s pool has no targets (%s pools are filled by discovery, which this "
            "release does not have yet): every decision that needs the pool is refused",
            runtime.name,
            pool_config.kind.value,
        )
    period_s = pool_config.check_period_ms / 1000
    async with trio.open_nursery() as nursery:
        for target in pool.targets:
            if target.connector is None:
                log.warning(
                    "router=%s local target has no connector (set <local-target-connector-ref>): "
                    "it is never ready and local decisions are refused",
                    runtime.name,
                )
                continue
            nursery.start_soon(_probe_forever, runtime, target, period_s, check)
        task_status.started()
