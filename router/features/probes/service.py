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
Open (`check_amqp`), OpenWire ConnectionInfo (`check_openwire`) or an Artemis CORE session
(`check_core`).

A connector with an HTTP `connectionCount=` source (Artemis's or ActiveMQ Classic's Jolokia,
RabbitMQ's Prometheus page) has its broker's own connection count read beside its probes, on
the same period and deadline, by a loop of its own (`read_count`): each read is recorded in the
router's state (`LiveConnections.report_broker_count`, which LEAST_CONNECTIONS counts, and the
target's history, which the status shows with its age and the last error: status.py, which the
service adds to each target's document). A failed read only
forgets the count, so the router's own is used until a read succeeds, as the MQTT probe's `$SYS`
count does: load is not health, and a target's readiness is its probes' alone. Of an HA pair, only
the active member's count is recorded.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Final

import trio

from router.feature import Service
from router.features.probes.checks import (
    Check,
    CountRead,
    LocalShortage,
    check_amqp,
    check_core,
    check_mqtt,
    check_openwire,
    check_stomp,
    check_target,
    probe_client_id,
    read_count,
)
from router.features.probes.counts import CountError
from router.features.probes.status import BROKER_COUNT, broker_count_status

if TYPE_CHECKING:
    from pools import Connector, CountSource, Target
    from router.feature import Kernel
    from router.runtime import RouterRuntime

__all__ = ["PROBE_TIMEOUT_CAP_S", "Probes", "make_check", "serve_health_checks", "start"]

log = logging.getLogger("router.health")

PROBE_TIMEOUT_CAP_S: Final = 3.0
"""A probe's deadline is the check period, capped at this (Artemis waits 3000 ms for attributes)."""


_NO_SYS_COUNT: Final = (
    "no $SYS/broker/clients/connected value within the probe's wait ($SYS off, or not allowed to "
    "the pool's user?)"
)


def _report_broker_count(runtime: RouterRuntime, node_id: str, source: str, count: int | str | None) -> None:
    """Record what a broker reported of its connection count: the count (LEAST_CONNECTIONS counts
    it), or why it could not be read (a str; None from the MQTT probe), which forgets the last
    count until a read succeeds. Logged when reads start or stop failing."""
    if count is None:
        count = _NO_SYS_COUNT
    with runtime.held() as state:
        state.connections.report_broker_count(node_id, None if isinstance(count, str) else count)
        before = state.history.counted(node_id, count, time.time())
    failed_before = before.last_error_at is not None and (
        before.read_at is None or before.last_error_at > before.read_at
    )
    if isinstance(count, str) and not failed_before:
        log.warning(
            "router=%s target=%s broker connection count (%s) not read, LEAST_CONNECTIONS counts this "
            "router's own connections until it is: %s",
            runtime.name,
            node_id,
            source,
            count,
        )
    elif not isinstance(count, str) and failed_before:
        log.info(
            "router=%s target=%s broker connection count (%s) read again: %d",
            runtime.name,
            node_id,
            source,
            count,
        )


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
                on_count = functools.partial(_report_broker_count, runtime, connector.node_id, "mqtt-sys")
            return await check_mqtt(connector, client_id, user, password, on_connection_count=on_count)
        if kind == "stomp":
            return await check_stomp(connector, user, password)
        if kind == "amqp":
            return await check_amqp(connector, client_id, user, password)
        if kind == "openwire":
            return await check_openwire(connector, client_id, user, password)
        if kind == "core":
            return await check_core(connector, client_id, user, password)
        return await check_target(connector)

    return check


async def _probe_forever(
    runtime: RouterRuntime, target: Target, period_s: float, check: Check, read: CountRead
) -> None:
    """Probe a target every period, each member of an HA pair on its own schedule; and read its
    broker's connection count beside, when its connector reads one over HTTP."""
    assert target.connector is not None
    members = target.connector.members
    source = target.connector.connection_count
    reads_count = source is not None and source.url is not None
    if len(members) == 1 and not reads_count:
        await _probe_member_forever(runtime, target, 0, period_s, check)
        return
    async with trio.open_nursery() as nursery:
        for index in range(len(members)):
            nursery.start_soon(_probe_member_forever, runtime, target, index, period_s, check)
            if reads_count:
                nursery.start_soon(_read_count_forever, runtime, target, index, period_s, read)


def _count_credentials(runtime: RouterRuntime, source: CountSource) -> tuple[str | None, str | None]:
    """The basic-authentication user and password of a count read: the source's own; else, for
    Jolokia (Artemis's console takes the broker's users), the pool's; none for Prometheus."""
    if source.user is not None:
        return source.user, source.password
    pool_config = runtime.config.pool
    if source.kind == "rabbitmq-prometheus" or pool_config is None:
        return None, None
    return pool_config.username, pool_config.password


async def _read_count_forever(
    runtime: RouterRuntime, target: Target, member: int, period_s: float, read: CountRead
) -> None:
    """Read one member's broker connection count every period (at once first), each read within
    the probe's deadline; record it when the member is the target's active one (a single broker
    is its own)."""
    assert target.connector is not None
    connector = target.connector.members[member]
    source = connector.connection_count
    assert source is not None
    assert source.url is not None
    user, password = _count_credentials(runtime, source)
    timeout_s = min(period_s, PROBE_TIMEOUT_CAP_S)
    pair = len(target.connector.members) > 1
    next_time = trio.current_time()
    while True:
        result: int | str = f"no answer from {source.url} within {timeout_s:g} s"
        with trio.move_on_after(timeout_s):
            try:
                result = await read(source, user, password)
            except CountError as exc:
                result = str(exc)
        # Never for a target that left the pool (its loop is being cancelled), nor for a passive member.
        if runtime.pool.target(target.node_id) is target and (
            not pair or runtime.pool.active_member(target.node_id) == member
        ):
            _report_broker_count(runtime, target.node_id, source.kind, result)
        next_time += period_s
        now = trio.current_time()
        if next_time < now:  # the read overran: skip the missed slots instead of bursting
            next_time = now
        await trio.sleep_until(next_time)


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
    read: CountRead = read_count,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe every target of a router's pool until cancelled, and read the connection counts of
    the brokers whose connectors ask for it over HTTP (`connectionCount=`).

    Args:
        runtime: the router whose pool is probed.
        check: the probe; by default each connector's `probe=` kind (TCP connect unless set).
        read: the count reader (`read_count`, an HTTP GET).
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
        _follow_membership(runtime, nursery, loops, period_s, check, read)
        task_status.started()
        while True:  # discovery pools gain and lose targets at run time
            await runtime.pool.wait_until(lambda: _membership_changed(runtime, loops))
            _follow_membership(runtime, nursery, loops, period_s, check, read)


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
    read: CountRead,
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
            nursery.start_soon(_probe_while_member, runtime, target, scope, period_s, check, read)


async def _probe_while_member(
    runtime: RouterRuntime,
    target: Target,
    scope: trio.CancelScope,
    period_s: float,
    check: Check,
    read: CountRead,
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

    if target.connector is not None and target.connector.connection_count is None:
        # A reload may have taken `connectionCount=` off its connector: a count read before
        # must not stay in LEAST_CONNECTIONS's sum, nor in the status.
        with runtime.held() as state:
            state.connections.report_broker_count(target.node_id, None)
            state.history.forget_count(target.node_id)
    with scope:
        await _probe_forever(runtime, target, period_s, guarded, read)


class Probes(Service):
    """The feature's service: each router's health-check loop, started first of its tasks (its
    first probes run at once) and restarted with a new configuration."""

    def router_added(self, runtime: RouterRuntime) -> None:
        with runtime.held() as state:
            state.target_sections[BROKER_COUNT] = broker_count_status

    async def serve_router(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await serve_health_checks(runtime, task_status=task_status)


def start(_kernel: Kernel) -> Probes:
    """The feature's service for one routerd."""
    return Probes()
