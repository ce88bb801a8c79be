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
from typing import TYPE_CHECKING, Final, TypeVar

import trio

from keys import INTERNAL_CLIENT_ID_PREFIX, SniffError, mqtt, stomp
from router.net import describe_oserror, open_connection
from router.sniffing import read_parsed

if TYPE_CHECKING:
    from keys import NeedMore
    from pools import Connector, Target
    from router.routing import RouterRuntime

__all__ = [
    "PROBE_TIMEOUT_CAP_S",
    "Check",
    "check_mqtt",
    "check_stomp",
    "check_target",
    "make_check",
    "probe_client_id",
    "serve_health_checks",
]

_A = TypeVar("_A")

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


async def _read_answer(stream: trio.SocketStream, parse: Callable[[bytes], _A | NeedMore]) -> _A:
    answer, _ = await read_parsed(
        stream,
        parse,
        protocol="probe",
        max_bytes=16 * 1024,  # a CONNACK is 4 bytes, a CONNECTED frame a few hundred
        too_long="the broker sent no complete answer in {max_bytes} bytes",
        closed="the broker closed after {size} bytes",
    )
    return answer


def probe_client_id(router: str, node_id: str) -> str:
    """The client id of our probes: brokers fronted by routers never redirect it (SPEC A1 step 0)."""
    return f"{INTERNAL_CLIENT_ID_PREFIX}{router}.{node_id}"


async def check_mqtt(
    connector: Connector, client_id: str, user: str | None, password: str | None
) -> tuple[bool, str]:
    """MQTT 3.1.1 CONNECT with the pool's credentials; ready on CONNACK return code 0."""
    try:
        stream = await open_connection(connector.host, connector.port)
    except OSError as exc:
        return False, f"connect to {connector.url} failed: {describe_oserror(exc)}"
    async with stream:
        try:
            await stream.send_all(mqtt.encode_connect(client_id, user_name=user, password=password))
            code = await _read_answer(stream, mqtt.parse_connack)
            if code != 0:
                return False, f"mqtt CONNACK return code {code} from {connector.url}"
            await stream.send_all(mqtt.MQTT_DISCONNECT)
        except (OSError, trio.BrokenResourceError, SniffError) as exc:
            return False, f"mqtt probe of {connector.url} failed: {exc}"
    return True, ""


async def check_stomp(connector: Connector, user: str | None, password: str | None) -> tuple[bool, str]:
    """STOMP CONNECT with the pool's credentials; ready on CONNECTED, not ready on ERROR."""
    try:
        stream = await open_connection(connector.host, connector.port)
    except OSError as exc:
        return False, f"connect to {connector.url} failed: {describe_oserror(exc)}"
    async with stream:
        try:
            await stream.send_all(stomp.encode_connect(connector.host, login=user, passcode=password))
            command, headers = await _read_answer(stream, stomp.parse_server_frame)
            if command != "CONNECTED":
                return False, f"stomp {command} from {connector.url}: {headers.get('message', '')}"
            await stream.send_all(b"DISCONNECT\n\n\x00")
        except (OSError, trio.BrokenResourceError, SniffError) as exc:
            return False, f"stomp probe of {connector.url} failed: {exc}"
    return True, ""


def make_check(runtime: RouterRuntime) -> Check:
    """The probe of a router's pool: each connector's `probe=` kind, with the pool's credentials."""
    pool_config = runtime.config.pool
    user = None if pool_config is None else pool_config.username
    password = None if pool_config is None else pool_config.password

    async def check(connector: Connector) -> tuple[bool, str]:
        kind = connector.probe  # one of pools.PROBE_KINDS, checked when the connector was made
        if kind == "mqtt":
            return await check_mqtt(
                connector, probe_client_id(runtime.name, connector.node_id), user, password
            )
        if kind == "stomp":
            return await check_stomp(connector, user, password)
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
    pool = runtime.pool
    assert pool is not None
    timeout_s = min(period_s, PROBE_TIMEOUT_CAP_S)
    next_time = trio.current_time()
    while True:
        ok, detail = False, f"no answer from {connector.url} within {timeout_s:g} s"
        with trio.move_on_after(timeout_s):
            ok, detail = await check(connector)
        runtime.apply_events(pool.record_check(target.node_id, ok, detail, member=member))
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
    check = make_check(runtime) if check is None else check
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
