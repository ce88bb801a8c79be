"""The health-check loop: probes every target of a pool and feeds the outcomes into `pools`.

Each target is probed at once when the router starts, then every `check-period` (scheduled on
absolute times, so a slow probe does not shift later ones). A probe that fails, times out or is
refused makes the target un-ready at once (`Pool.record_check`); the next success makes it ready.
Each probe has its own deadline. The probe of a target is its connector's `probe=` kind
(`make_check`): a TCP connect (`check_target`), or a session with the pool's credentials that
the broker must accept: MQTT 3.1.1 CONNECT (`check_mqtt`, which can also read mosquitto's
connected-client count for LEAST_CONNECTIONS), STOMP CONNECT (`check_stomp`), AMQP 1.0 SASL +
Open (`check_amqp`) or OpenWire ConnectionInfo (`check_openwire`).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeVar

import trio

from keys import INTERNAL_CLIENT_ID_PREFIX, SniffError, amqp, mqtt, openwire, stomp
from router.net import describe_oserror, open_connection
from router.sniffing import read_parsed

if TYPE_CHECKING:
    from keys import NeedMore
    from pools import Connector, Target
    from router.routing import RouterRuntime

__all__ = [
    "PROBE_TIMEOUT_CAP_S",
    "Check",
    "check_amqp",
    "check_mqtt",
    "check_openwire",
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

COUNT_WAIT_CAP_S: Final = 1.0
"""How long the MQTT probe waits for the retained `$SYS` count after subscribing (at most half of
what is left of its deadline, so a broker without `$SYS` still gets a ready verdict). Measured
against mosquitto 2.0.11: the value arrives 0.1 ms after the SUBSCRIBE with `set_tcp_nodelay
true`, 43 ms without (Nagle's algorithm holding the PUBLISH behind the SUBACK until our delayed
ACK), so this is 20 times the slow case."""

_ANSWER_MAX_BYTES: Final = 16 * 1024
"""Cap of a broker's answers to one probe: a CONNACK is 4 bytes, a CONNECTED frame or an AMQP
Open a few hundred, an OpenWire WireFormatInfo and BrokerInfo under 1 KiB."""


_SESSION_ERRORS: Final = (OSError, trio.BrokenResourceError, SniffError)
"""What ends a probe's session as not ready: the connection broke, or the broker's answer is malformed."""


async def _probe(
    connector: Connector,
    protocol: str,
    session: Callable[[trio.SocketStream], Awaitable[str]] | None = None,
    errors: tuple[type[Exception], ...] = _SESSION_ERRORS,
) -> tuple[bool, str]:
    """Connect to the broker, run one probe `session` on the connection, and close it.

    Args:
        connector: the broker.
        protocol: names the probe in the reason of a failed session.
        session: the probe's exchange; it returns why the target is not ready, "" when it is.
            None: the connect is the whole probe.
        errors: the exceptions of `session` that make the target not ready.

    Returns:
        (whether the target is ready, the reason when it is not).
    """
    try:
        stream = await open_connection(connector.host, connector.port)
    except OSError as exc:
        return False, f"connect to {connector.url} failed: {describe_oserror(exc)}"
    async with stream:
        if session is None:
            return True, ""
        try:
            reason = await session(stream)
        except errors as exc:
            return False, f"{protocol} probe of {connector.url} failed: {exc}"
    return not reason, reason


async def check_target(connector: Connector) -> tuple[bool, str]:
    """Probe one target once. The caller's cancel scope is the probe's deadline.

    Returns:
        (whether the target is ready, the reason when it is not).
    """
    return await _probe(connector, "tcp")


Check = Callable[["Connector"], Awaitable[tuple[bool, str]]]
"""A probe: connector in, (ready, reason when not) out; the caller's cancel scope is its deadline."""


async def _read_answer(stream: trio.SocketStream, parse: Callable[[bytes], _A | NeedMore]) -> _A:
    answer, _ = await _read_more(stream, b"", parse)
    return answer


async def _read_more(
    stream: trio.SocketStream, seen: bytes, parse: Callable[[bytes], _A | NeedMore]
) -> tuple[_A, bytes]:
    """Read until `parse(everything the broker sent so far)` answers; the parsers of multi-step
    handshakes re-parse the broker's bytes from the start, so `seen` holds those already read.

    Returns:
        The answer, and every byte the broker sent so far.
    """
    answer, more = await read_parsed(
        stream,
        lambda data: parse(seen + data),
        protocol="probe",
        max_bytes=_ANSWER_MAX_BYTES - len(seen),
        too_long=f"the broker sent no complete answer in {_ANSWER_MAX_BYTES} bytes",
        closed=f"the broker closed the connection before answering ({len(seen)} + {{size}} bytes read)",
    )
    return answer, seen + more


def probe_client_id(router: str, node_id: str) -> str:
    """The client id of our probes: brokers fronted by routers never redirect it (SPEC A1 step 0)."""
    return f"{INTERNAL_CLIENT_ID_PREFIX}{router}.{node_id}"


async def check_mqtt(
    connector: Connector,
    client_id: str,
    user: str | None,
    password: str | None,
    *,
    on_connection_count: Callable[[int | None], None] | None = None,
) -> tuple[bool, str]:
    """MQTT 3.1.1 CONNECT with the pool's credentials; ready on CONNACK return code 0.

    Args:
        connector: the broker.
        client_id: the probe's client id (`probe_client_id`).
        user: the pool's user name, or None.
        password: the pool's password, or None.
        on_connection_count: if given, once connected the probe subscribes to mosquitto's
            retained `$SYS/broker/clients/connected` and passes the number to it, or None when
            it does not come within `COUNT_WAIT_CAP_S` (or half the time left) or is no number;
            that never makes the target un-ready.

    Returns:
        (whether the target is ready, the reason when it is not).
    """

    async def session(stream: trio.SocketStream) -> str:
        await stream.send_all(mqtt.encode_connect(client_id, user_name=user, password=password))
        code, seen = await _read_more(stream, b"", mqtt.parse_connack)
        if code != 0:
            return f"mqtt CONNACK return code {code} from {connector.url}"
        if on_connection_count is not None:
            on_connection_count(await _read_mqtt_connection_count(stream, seen, connector))
        await stream.send_all(mqtt.MQTT_DISCONNECT)
        return ""

    return await _probe(connector, "mqtt", session)


async def _read_mqtt_connection_count(
    stream: trio.SocketStream, seen: bytes, connector: Connector
) -> int | None:
    """Subscribe to `$SYS/broker/clients/connected` and read the retained count, within a bound
    that leaves the probe's verdict its own time."""
    packet_id = 1  # the only packet of the session that needs an id
    topic = mqtt.SYS_CLIENTS_CONNECTED
    await stream.send_all(mqtt.encode_subscribe(packet_id, topic))
    left_s = trio.current_effective_deadline() - trio.current_time()  # inf without a deadline
    wait_s = max(0.0, min(COUNT_WAIT_CAP_S, left_s / 2))
    parse = functools.partial(mqtt.parse_subscribed_value, topic=topic, packet_id=packet_id)
    with trio.move_on_after(wait_s):
        try:
            payload, _ = await _read_more(stream, seen, parse)
            count = int(payload.decode("ascii"))
        except (SniffError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            log.debug("no connection count from %s: %s", connector.url, exc)
            return None
        return count if count >= 0 else None
    log.debug("no connection count from %s within %.3g s", connector.url, wait_s)
    return None


async def check_stomp(connector: Connector, user: str | None, password: str | None) -> tuple[bool, str]:
    """STOMP CONNECT with the pool's credentials; ready on CONNECTED, not ready on ERROR."""

    async def session(stream: trio.SocketStream) -> str:
        await stream.send_all(stomp.encode_connect(connector.host, login=user, passcode=password))
        command, headers = await _read_answer(stream, stomp.parse_server_frame)
        if command != "CONNECTED":
            return f"stomp {command} from {connector.url}: {headers.get('message', '')}"
        await stream.send_all(b"DISCONNECT\n\n\x00")
        return ""

    return await _probe(connector, "stomp", session)


async def check_amqp(
    connector: Connector, container_id: str, user: str | None, password: str | None
) -> tuple[bool, str]:
    """AMQP 1.0 with SASL (AMQP 1.0 §5.3): PLAIN with the pool's credentials (ANONYMOUS without a
    user name), then Open; ready when the broker answers with its Open and, once the probe sends
    Close, closes without an error.

    Not ready: the mechanism is not offered, a sasl-outcome other than ok, a Close with an error
    (before or after the broker's Open), a disconnect, or the caller's deadline.

    Args:
        connector: the broker.
        container_id: the probe's container id (`probe_client_id`).
        user: the pool's user name, or None for ANONYMOUS.
        password: the pool's password (empty when None).

    Returns:
        (whether the target is ready, the reason when it is not).
    """
    mechanism = "ANONYMOUS" if user is None else "PLAIN"
    try:
        response = None if user is None else amqp.sasl_plain_response(user, password or "")
    except ValueError as exc:
        return False, f"amqp probe of {connector.url}: {exc}"

    async def session(stream: trio.SocketStream) -> str:
        await stream.send_all(amqp.SASL_HEADER)
        mechanisms, seen = await _read_more(stream, b"", amqp.parse_sasl_mechanisms)
        if mechanism not in mechanisms:
            offered = ", ".join(mechanisms) or "none"
            return f"amqp broker {connector.url} offers no SASL {mechanism} (only {offered})"
        await stream.send_all(amqp.encode_sasl_init(mechanism, response))
        outcome, seen = await _read_more(stream, seen, amqp.parse_sasl_outcome)
        if outcome != 0:
            return f"amqp SASL outcome {outcome} ({amqp.sasl_outcome_name(outcome)}) from {connector.url}"
        await stream.send_all(amqp.AMQP_HEADER + amqp.encode_open(container_id))
        opened, seen = await _read_more(stream, seen, amqp.parse_broker_open)
        if opened.close is None:
            await stream.send_all(amqp.CLOSE_FRAME)
        close, _ = await _read_more(stream, seen, amqp.parse_broker_close)
        if close.condition is not None:
            return f"amqp Close {close.condition} from {connector.url}: {close.description or ''}"
        if opened.close is not None:
            return f"amqp broker {connector.url} closed without an error before its Open"
        return ""

    return await _probe(connector, "amqp", session)


async def check_openwire(
    connector: Connector, client_id: str, user: str | None, password: str | None
) -> tuple[bool, str]:
    """OpenWire: WireFormatInfo, then ConnectionInfo with the pool's credentials; ready on its
    Response, not ready on an ExceptionResponse (e.g. bad credentials with an authentication
    plugin), a ConnectionError, a disconnect or the caller's deadline.

    Args:
        connector: the broker.
        client_id: the probe's JMS client id (`probe_client_id`).
        user: the pool's user name, or None.
        password: the pool's password, or None.

    Returns:
        (whether the target is ready, the reason when it is not).
    """
    connection_id = f"ID:{client_id}:{uuid.uuid4()}"  # unique, as the broker keys connections by it
    command_id = 1

    async def session(stream: trio.SocketStream) -> str:
        await stream.send_all(openwire.encode_wire_format_info())
        fmt, seen = await _read_more(stream, b"", openwire.parse_probe_wire_format)
        await stream.send_all(
            openwire.encode_connection_info(
                command_id=command_id,
                connection_id=connection_id,
                client_id=client_id,
                user_name=user,
                password=password,
                version=fmt.version,
            )
        )
        parse = functools.partial(openwire.parse_probe_response, command_id=command_id)
        answer, _ = await _read_more(stream, seen, parse)
        if not answer.ok:
            return f"openwire {answer.exception_class} from {connector.url}: {answer.exception_message or ''}"
        await stream.send_all(
            openwire.encode_connection_close(
                command_id=command_id + 1, connection_id=connection_id, version=fmt.version
            )
        )
        return ""

    # The encoders' ValueError (a too long field) too; SniffError is a ValueError.
    return await _probe(connector, "openwire", session, (OSError, trio.BrokenResourceError, ValueError))


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
                on_count = functools.partial(runtime.counts.report, connector.node_id)
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
    pool = runtime.pool
    assert pool is not None
    timeout_s = min(period_s, PROBE_TIMEOUT_CAP_S)
    next_time = trio.current_time()
    while True:
        ok, detail = False, f"no answer from {connector.url} within {timeout_s:g} s"
        with trio.move_on_after(timeout_s):
            ok, detail = await check(connector)
        with runtime.lock:
            events = pool.record_check(target.node_id, ok, detail, member=member)
        runtime.apply_events(events)
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
            "router=%s pool has no targets yet (%s): every decision that needs the pool is "
            "refused until a discovered target is ready",
            runtime.name,
            pool_config.kind.value,
        )
    if any(t.connector is None for t in pool.targets):
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
            await runtime.wait_until(lambda: _membership_changed(runtime, loops))
            _follow_membership(runtime, nursery, loops, period_s, check)


def _probed_targets(runtime: RouterRuntime) -> dict[str, Target]:
    assert runtime.pool is not None
    return {t.node_id: t for t in runtime.pool.targets if t.connector is not None}


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
        assert runtime.pool is not None
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
