"""Health probes, one per broker protocol: does this broker accept a real session now?

A probe connects, runs one exchange with the pool's credentials, closes, and returns (ready, why
not). The caller's cancel scope is its deadline. `check_target` is a TCP connect; `check_mqtt`
(MQTT 3.1.1 CONNECT, which can also read mosquitto's connected-client count for
LEAST_CONNECTIONS), `check_stomp` (STOMP CONNECT), `check_amqp` (AMQP 1.0 SASL + Open) and
`check_openwire` (OpenWire ConnectionInfo) and `check_core` (an Artemis CORE session, whose bytes
are core_session.py's) need the broker to accept the session. The loop that runs them is
service.py.

Besides the probes, `read_count` reads a broker's own connection count over HTTP (Jolokia for
Artemis and ActiveMQ Classic, the rabbitmq_prometheus page): one GET, bounded in size here (the
head by h11, the body by `counts.BODY_MAX_BYTES`) and in time by the caller's cancel scope; what
to ask and how to read the answer is counts.py's (pure). A count is load, not health: it never
decides readiness.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeVar

import h11
import trio

from keys import INTERNAL_CLIENT_ID_PREFIX, SniffError, amqp, mqtt, openwire, stomp
from router.datapath.net import describe_oserror, is_local_shortage, open_connection
from router.datapath.reading import read_parsed
from router.features.probes import core_session
from router.features.probes.counts import BODY_MAX_BYTES, CountError, count_request, parse_count

if TYPE_CHECKING:
    from keys import NeedMore
    from keys.core import CoreException
    from pools import Connector, CountSource

__all__ = [
    "HEAD_MAX_BYTES",
    "Check",
    "CountRead",
    "LocalShortage",
    "check_amqp",
    "check_core",
    "check_mqtt",
    "check_openwire",
    "check_stomp",
    "check_target",
    "probe_client_id",
    "read_count",
]

log = logging.getLogger("router.health")

_A = TypeVar("_A")

COUNT_WAIT_CAP_S: Final = 1.0
"""How long the MQTT probe waits for the retained `$SYS` count after subscribing (at most half of
what is left of its deadline, so a broker without `$SYS` still gets a ready verdict). Measured
against mosquitto 2.0.11: the value arrives 0.1 ms after the SUBSCRIBE with `set_tcp_nodelay
true`, 43 ms without (Nagle's algorithm holding the PUBLISH behind the SUBACK until our delayed
ACK), so this is 20 times the slow case."""

_ANSWER_MAX_BYTES: Final = 16 * 1024
"""Cap of a broker's answers to one probe: a CONNACK is 4 bytes, a CONNECTED frame or an AMQP
Open a few hundred, an OpenWire WireFormatInfo and BrokerInfo under 1 KiB, Artemis's answers to
the CORE probe under 300 bytes."""

_CORE_MESSAGE_CHARS: Final = 256
"""At most this much of an Artemis EXCEPTION's message goes into a reason (AMQ229031, bad
credentials, is about 120 characters with its address and user name)."""


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

    Raises:
        LocalShortage: the connect failed for a reason of this host's, not the broker's.
    """
    try:
        stream = await open_connection(connector.host, connector.port)
    except OSError as exc:
        if is_local_shortage(exc):
            raise LocalShortage(f"connect to {connector.url} failed here: {describe_oserror(exc)}") from exc
        return False, f"connect to {connector.url} failed: {describe_oserror(exc)}"
    async with stream:
        if session is None:
            return True, ""
        try:
            reason = await session(stream)
        except errors as exc:
            return False, f"{protocol} probe of {connector.url} failed: {exc}"
    return not reason, reason


class LocalShortage(Exception):
    """A probe could not run because this host ran short (descriptors, memory, ephemeral ports):
    no evidence either way about the broker, so its state must not change."""


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
        answer, seen = await _read_more(stream, seen, parse)
        if not answer.ok:
            return f"openwire {answer.exception_class} from {connector.url}: {answer.exception_message or ''}"
        # Closed as the Java client closes: the broker answers the RemoveInfo once the client id
        # is released, so a probe right after this one (same client id) is accepted.
        await stream.send_all(
            openwire.encode_connection_close(
                command_id=command_id + 1, connection_id=connection_id, version=fmt.version
            )
        )
        parse = functools.partial(openwire.parse_probe_response, command_id=command_id + 1)
        closed, _ = await _read_more(stream, seen, parse)
        if not closed.ok:
            reason = closed.exception_message or ""
            return f"openwire {closed.exception_class} on close from {connector.url}: {reason}"
        await stream.send_all(openwire.encode_shutdown(command_id=command_id + 2))
        return ""

    # The encoders' ValueError (a too long field) too; SniffError is a ValueError.
    return await _probe(connector, "openwire", session, (OSError, trio.BrokenResourceError, ValueError))


async def check_core(
    connector: Connector, client_id: str, user: str | None, password: str | None
) -> tuple[bool, str]:
    """Artemis CORE: the session Artemis's own pools open to their targets, with the pool's
    credentials (`ARTEMIS`, PING, CREATESESSION_V2; core_session.py); ready on CREATESESSION_RESP,
    after which the probe closes the session (SESS_CLOSE, NULL_RESPONSE) so that the broker logs
    nothing. Not ready on an EXCEPTION (e.g. 105 SECURITY_EXCEPTION for bad credentials), another
    packet, one longer than `keys.core.MAX_PACKET_BYTES`, a disconnect or the caller's deadline.

    Args:
        connector: the broker.
        client_id: the probe's client ID (`probe_client_id`), which Artemis routers never redirect.
        user: the pool's user name, or None.
        password: the pool's password, or None.

    Returns:
        (whether the target is ready, the reason when it is not).
    """

    async def session(stream: trio.SocketStream) -> str:
        opening = core_session.encode_opening(
            session_name=str(uuid.uuid4()), user_name=user, password=password, client_id=client_id
        )
        await stream.send_all(opening)
        answer, seen = await _read_more(stream, b"", core_session.parse_session_answer)
        if answer.exception is not None:
            return _core_refused(answer.exception, connector, "")
        await stream.send_all(core_session.SESSION_CLOSE)
        parse = functools.partial(core_session.parse_close_answer, start=answer.end)
        closed, _ = await _read_more(stream, seen, parse)
        if closed.exception is not None:
            return _core_refused(closed.exception, connector, " on session close")
        return ""

    # SniffError (a malformed answer) is a ValueError.
    return await _probe(connector, "core", session, (OSError, trio.BrokenResourceError, ValueError))


def _core_refused(exception: CoreException, connector: Connector, when: str) -> str:
    """e.g. "core EXCEPTION 105 (SECURITY_EXCEPTION) from tcp://...: AMQ229031: Unable to ..."."""
    head = dataclasses.replace(exception, message=None).describe()
    message = exception.message or ""
    if len(message) > _CORE_MESSAGE_CHARS:
        message = message[:_CORE_MESSAGE_CHARS] + "..."
    return f"core {head}{when} from {connector.url}: {message}"


# --- broker-reported connection counts over HTTP ---------------------------------------------------

HEAD_MAX_BYTES: Final = 16 * 1024
"""Cap of an answer's status line and headers while they are incomplete (h11's own default;
Artemis's console sends about 1.5 KB of security headers): a head that arrives whole in one read
may be up to a read (`_HTTP_READ_BYTES`) longer."""

_HTTP_READ_BYTES: Final = 64 * 1024

CountRead = Callable[["CountSource", str | None, str | None], Awaitable[int]]
"""A count reader: (source, user, password) in, the count out, `CountError` when it cannot be
read; the caller's cancel scope is its deadline."""


async def read_count(source: CountSource, user: str | None, password: str | None) -> int:
    """Read a broker's connection count: GET its Jolokia attribute or metrics page.

    Args:
        source: an HTTP source (`artemis-jolokia`, `activemq-jolokia`, `rabbitmq-prometheus`).
        user: the basic-authentication user; None: none.
        password: its password.

    Returns:
        The broker's count of its open connections.

    Raises:
        CountError: the connect failed, the answer broke off, was malformed or too long, or held
            no count.
    """
    request = count_request(source, user=user, password=password)
    try:
        stream = await open_connection(request.host, request.port)
    except OSError as exc:
        raise CountError(f"connect to {source.url} failed: {describe_oserror(exc)}") from exc
    async with stream:
        try:
            status, body = await _get(stream, request.target, request.headers)
        except (OSError, trio.BrokenResourceError) as exc:
            raise CountError(f"{source.url}: the connection broke: {exc}") from exc
        except h11.ProtocolError as exc:
            raise CountError(f"{source.url}: not an HTTP/1.1 answer: {exc}") from exc
        except CountError as exc:
            raise CountError(f"{source.url}: {exc}") from None
    try:
        return parse_count(source, status, body)
    except CountError as exc:
        raise CountError(f"{source.url}: {exc}") from None


async def _get(
    stream: trio.SocketStream, target: str, headers: tuple[tuple[str, str], ...]
) -> tuple[int, bytes]:
    """Send one GET and read its answer: (status, body).

    Raises:
        CountError: the head or the body is over its cap, or the peer closed before the end.
        h11.ProtocolError: not HTTP/1.1.
    """
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_MAX_BYTES)
    await stream.send_all(conn.send(h11.Request(method="GET", target=target, headers=list(headers))))
    await stream.send_all(conn.send(h11.EndOfMessage()))
    status, body = 0, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(_HTTP_READ_BYTES))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > BODY_MAX_BYTES:
                raise CountError(f"the answer's body is over {BODY_MAX_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return status, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise CountError(
                f"the server closed the connection before the end of its answer ({len(body)} bytes)"
            )
        # h11.InformationalResponse (1xx): the final answer follows
