"""The health-check loop: probes every target of a pool and feeds the outcomes into `pools`.

Each target is probed at once when the router starts, then every `check-period` (scheduled on
absolute times, so a slow probe does not shift later ones). A probe that fails, times out or is
refused makes the target un-ready at once (`Pool.record_check`); the next success makes it ready.
A probe that cannot run because this host ran short (`LocalShortage`: out of descriptors, memory
or ephemeral ports) changes nothing: it is no evidence about the broker. Each recorded probe is
timed (a probe without an answer takes its deadline): the status shows each target's last probe,
and `router_target_check_duration_seconds` its duration.
Each probe has its own deadline. The probe of a target is its connector's `probe=` kind
(`make_check`): a TCP connect (`check_target`), or a session with the pool's credentials that
the broker must accept: MQTT 3.1.1 CONNECT (`check_mqtt`, which can also read mosquitto's
connected-client count for LEAST_CONNECTIONS), STOMP CONNECT (`check_stomp`), AMQP 1.0 SASL +
Open (`check_amqp`) or OpenWire ConnectionInfo (`check_openwire`).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Final

import trio

from router.feature import Service
from router.features.probes.checks import (
    Check,
    LocalShortage,
    check_amqp,
    check_mqtt,
    check_openwire,
    check_stomp,
    check_target,
    probe_client_id,
)

if TYPE_CHECKING:
    from pools import Connector, Target
    from router.feature import Kernel
    from router.runtime import RouterRuntime

__all__ = ["PROBE_TIMEOUT_CAP_S", "Probes", "make_check", "serve_health_checks", "start"]

log = logging.getLogger("router.health")

PROBE_TIMEOUT_CAP_S: Final = 3.0
"""A probe's deadline is the check period, capped at this (Artemis waits 3000 ms for attributes)."""


def _report_broker_count(runtime: RouterRuntime, node_id: str, broker_count: int | None) -> None:
    """Record the connection count a broker reported to its probe (None: it could not be read):
    LEAST_CONNECTIONS counts it."""
    with runtime.held() as state:
        state.connections.report_broker_count(node_id, broker_count)


def make_check(runtime: RouterRuntime) -> Check:
    """The probe of a router's pool: each connector's `probe=` kind, with the pool's credentials."""
    pool_config = runtime.config.pool
    user = None if pool_config is None else pool_config.username
    password = None if pool_config is None else pool_config.password

    async def check(connector: Connector) -> tuple[bool, str]:
        kind = connector.probe  # one of pools.PROBE_KINDS, checked when the connector was made
        client_id = probe_client_id(runtime.name, connector.node_id)
        if kind == "mqtt":
            on_count = None
            if connector.probe_connection_count:
                on_count = functools.partial(_report_broker_count, runtime, connector.node_id)
            return await check_mqtt(connector, client_id, user, password, on_connection_count=on_count)
        if kind == "stomp":
            return await check_stomp(connector, user, password)
        if kind == "amqp":
            return await check_amqp(connector, client_id, user, password)
        if kind == "openwire":
            return await check_openwire(connector, client_id, user, password)
        return await check_target(connector)

    return check


async def _probe_forever(runtime: RouterRuntime, target: Target, period_s: float, check: Check) -> None:
    """Probe a target every period; each member of an HA pair on its own schedule."""
    assert target.connector is not None
    members = target.connector.members
    if len(members) == 1:
        await _probe_member_forever(runtime, target, 0, period_s, check)
        return
    async with trio.open_nursery() as nursery:
        for index in range(len(members)):
            nursery.start_soon(_probe_member_forever, runtime, target, index, period_s, check)


async def _probe_member_forever(
    runtime: RouterRuntime, target: Target, member: int, period_s: float, check: Check
) -> None:
    assert target.connector is not None
    connector = target.connector.members[member]
    timeout_s = min(period_s, PROBE_TIMEOUT_CAP_S)
    next_time = trio.current_time()
    while True:
        ok, detail = False, f"no answer from {connector.url} within {timeout_s:g} s"
        started = trio.current_time()
        try:
            with trio.move_on_after(timeout_s):
                ok, detail = await check(connector)
        except LocalShortage as exc:
            # Out of descriptors here says nothing about the broker: marking every target down
            # would close every proxied connection of every router (hardening finding 1).
            log.warning(
                "router=%s target=%s probe skipped, its state stays as it was: %s",
                runtime.name,
                target.node_id,
                exc,
            )
        else:
            duration_s = trio.current_time() - started
            runtime.pool.record_check(target.node_id, ok, detail, member=member, duration_s=duration_s)
        next_time += period_s
        now = trio.current_time()
        if next_time < now:  # the probe overran: skip the missed slots instead of bursting
            next_time = now
        await trio.sleep_until(next_time)


async def serve_health_checks(
    runtime: RouterRuntime,
    *,
    check: Check | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe every target of a router's pool until cancelled.

    Args:
        runtime: the router whose pool is probed.
        check: the probe; by default each connector's `probe=` kind (TCP connect unless set).
        task_status: started once every probe loop is running.
    """
    pool_config = runtime.config.pool
    if pool_config is None:
        task_status.started()
        return
    targets = runtime.pool.targets()
    if not targets:
        log.warning(
            "router=%s pool has no targets yet (%s): every decision that needs the pool is "
            "refused until a discovered target is ready",
            runtime.name,
            pool_config.kind.value,
        )
    if any(t.connector is None for t in targets):
        log.warning(
            "router=%s local target has no connector (set <local-target-connector-ref>): "
            "it is never ready and local decisions are refused",
            runtime.name,
        )
    period_s = pool_config.check_period_ms / 1000
    check = make_check(runtime) if check is None else check
    loops: dict[str, tuple[Target, trio.CancelScope]] = {}
    async with trio.open_nursery() as nursery:
        _follow_membership(runtime, nursery, loops, period_s, check)
        task_status.started()
        while True:  # discovery pools gain and lose targets at run time
            await runtime.pool.wait_until(lambda: _membership_changed(runtime, loops))
            _follow_membership(runtime, nursery, loops, period_s, check)


def _probed_targets(runtime: RouterRuntime) -> dict[str, Target]:
    """The targets to probe: those with a connector, not in maintenance."""
    return {
        t.node_id: t
        for t in runtime.pool.targets()
        if t.connector is not None and runtime.pool.is_probed(t.node_id)
    }


def _membership_changed(runtime: RouterRuntime, loops: dict[str, tuple[Target, trio.CancelScope]]) -> bool:
    current = _probed_targets(runtime)
    return current.keys() != loops.keys() or any(current[n] is not t for n, (t, _) in loops.items())


def _follow_membership(
    runtime: RouterRuntime,
    nursery: trio.Nursery,
    loops: dict[str, tuple[Target, trio.CancelScope]],
    period_s: float,
    check: Check,
) -> None:
    """Start a probe loop (probing at once) for each target new in the pool, and cancel the loop of
    each target that left it or was replaced (same node id, new connector)."""
    current = _probed_targets(runtime)
    for node_id, (target, scope) in list(loops.items()):
        if current.get(node_id) is not target:
            scope.cancel(reason=f"target {node_id} left the pool")
            del loops[node_id]
    for node_id, target in current.items():
        if node_id not in loops:
            scope = trio.CancelScope()
            loops[node_id] = (target, scope)
            nursery.start_soon(_probe_while_member, runtime, target, scope, period_s, check)


async def _probe_while_member(
    runtime: RouterRuntime, target: Target, scope: trio.CancelScope, period_s: float, check: Check
) -> None:
    # The target may leave the pool while a probe runs, and this task may run before the one that
    # cancels it: never record a result for a target that is gone (the pool no longer knows it).
    def left() -> bool:
        if runtime.pool.target(target.node_id) is target:
            return False
        scope.cancel(reason=f"target {target.node_id} left the pool")
        return True

    async def guarded(connector: Connector) -> tuple[bool, str]:
        try:
            result = await check(connector)
        except trio.Cancelled:
            # A probe timeout: with `scope` cancelled first, the probe's own move_on_after lets
            # this Cancelled through to `scope` instead of recording "no answer".
            left()
            raise
        if left():
            await trio.lowlevel.checkpoint()  # raises Cancelled, caught by `scope`
        return result

    with scope:
        await _probe_forever(runtime, target, period_s, guarded)


class Probes(Service):
    """The feature's service: each router's health-check loop, started first of its tasks (its
    first probes run at once) and restarted with a new configuration."""

    async def serve_router(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await serve_health_checks(runtime, task_status=task_status)


def start(_kernel: Kernel) -> Probes:
    """The feature's service for one routerd."""
    return Probes()
