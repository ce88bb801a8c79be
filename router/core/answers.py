"""What the router says to a client itself (SPEC A6): redirects, refusals, and owed openings.

Pure: bytes out, no I/O. `redirects` and the plan step (router/core/plan.py) decide *when*; both
data paths send what the plan's action holds.

    protocol   redirect (OK in redirect mode)         USE_ANOTHER         UNAVAILABLE
    AMQP 1.0   Open(hint) + Close connection:redirect  Open + Close forced Open + Close forced
    MQTT 5     CONNACK 0x9C + Server Reference         CONNACK 0x9C        CONNACK 0x88
    MQTT 3.1.1 CONNACK 0x9C (Artemis; no redirect)     CONNACK 0x9C        CONNACK 0x88
    OpenWire   ConnectionControl reconnectTo, close    close               close
    STOMP      ERROR naming the target                 ERROR               ERROR
    TLS        (encrypted: nothing can be said)        close               close
    CORE       DISCONNECT_V3 + EXCEPTION 222           EXCEPTION 119       EXCEPTION 222, close

Server-first protocols (AMQP, OpenWire) also owe the client the server's side of the opening
before anything else, whether the router answers itself or relays a broker: `owed_opening`. So
does CORE: the router answers the packets a Java client sends before its session (PING, the
topology subscription) itself, to read the user and client ID from CREATESESSION (keys/core.py).

A CORE client that is refused as unavailable re-sends CREATESESSION at once, in a loop without
delay (measured: 585 times a second); the data path closes after any refusal, so the client's own
reconnect policy (`retryInterval`) sets the pace instead.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, assert_never

from keys import Reply, WireProtocol, amqp, core, mqtt, openwire, stomp
from router.config.settings import AcceptorMode
from router.core.engine import RouteStatus
from router.core.stream_filter import TopologyFilter, core_target_preamble

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import NeedMore, Sniffed
    from pools import Connector

__all__ = [
    "can_follow_redirect",
    "not_authorized",
    "owed_opening",
    "redirect",
    "redirects",
    "refusal",
    "replay_rejected",
    "replayed_opening",
    "target_filter",
    "target_preamble_measure",
]


def redirects(mode: AcceptorMode, sniffed: Sniffed | None) -> bool:
    """Whether an OK decision is answered with a native redirect rather than proxied: always in
    `mode=redirect`, for clients that can follow one in `mode=auto`; never without a sniffed opening."""
    if sniffed is None:
        return False
    return mode is AcceptorMode.REDIRECT or (mode is AcceptorMode.AUTO and can_follow_redirect(sniffed))


def can_follow_redirect(sniffed: Sniffed) -> bool:
    """Whether the client's protocol has a native redirect (`mode=auto` redirects only these)."""
    match sniffed.protocol:
        case WireProtocol.MQTT:
            return sniffed.protocol_version == "5"
        case WireProtocol.AMQP | WireProtocol.OPENWIRE:
            return True
        case WireProtocol.STOMP | WireProtocol.TLS | WireProtocol.CORE:
            # CORE: a Java client follows a redirect only with reconnectAttempts != 0 (default 0),
            # which its opening does not say; mode=redirect redirects every CORE client.
            return False
        case _:
            assert_never(sniffed.protocol)


def _wire_format(raw: bytes) -> openwire.WireFormat:
    fmt = openwire.sniff_wire_format(raw)
    if not isinstance(fmt, openwire.WireFormat):  # the sniffer returned Sniffed: it is complete
        raise ValueError("openwire: the client's WireFormatInfo is incomplete")
    return fmt


def owed_opening(sniffed: Sniffed, raw: bytes, replied: bytes) -> bytes:
    """The server's side of the opening the client has not received yet (after `replied`).

    A client that pipelined its whole handshake got `Sniffed` before any `Reply`, so nothing
    was sent; what it is owed is the full opening.
    """
    match sniffed.protocol:
        case WireProtocol.AMQP:
            return amqp.server_preamble(sniffed)[len(replied) :]
        case WireProtocol.OPENWIRE:
            if replied:
                return b""
            # The echo is the sniffer's answer to the client's WireFormatInfo frame on its own.
            frame_end = 4 + int.from_bytes(raw[:4], "big")
            answer = openwire.OpenWireSniffer().sniff(raw[:frame_end])
            return answer.to_client if isinstance(answer, Reply) else b""
        case WireProtocol.CORE:
            return core.server_preamble(raw)[len(replied) :]
        case WireProtocol.MQTT | WireProtocol.STOMP | WireProtocol.TLS:
            return b""
        case _:
            assert_never(sniffed.protocol)


def replayed_opening(sniffed: Sniffed, raw: bytes) -> bytes:
    """What the target of a proxied client whose opening the router answered is sent: the
    client's bytes, adjusted where the router's answer changed what the client negotiated
    (OpenWire: `CacheEnabled` false, as in the router's echo)."""
    if sniffed.protocol is WireProtocol.OPENWIRE:
        return openwire.replayed_opening(raw)
    return raw


def target_preamble_measure(sniffed: Sniffed, raw: bytes) -> Callable[[bytes], int | NeedMore] | None:
    """How to measure the target's opening that the client gets from us instead; None: nothing."""
    match sniffed.protocol:
        case WireProtocol.AMQP:
            if sniffed.sasl_mechanism:
                return amqp.sniff_server_sasl_preamble
            return amqp.sniff_server_plain_preamble
        case WireProtocol.OPENWIRE:
            # Also checks the broker negotiates what the client negotiated with our echo.
            return functools.partial(openwire.sniff_server_preamble, client=_wire_format(raw))
        case WireProtocol.CORE:
            return core_target_preamble
        case WireProtocol.MQTT | WireProtocol.STOMP | WireProtocol.TLS:
            return None
        case _:
            assert_never(sniffed.protocol)


def _mqtt_connack(sniffed: Sniffed, code: int, reference: str | None = None) -> bytes:
    if sniffed.protocol_version == "5":
        return mqtt.encode_connack(code, protocol_level=5, server_reference=reference)
    return mqtt.encode_connack_v3_as_artemis(code)


def redirect(sniffed: Sniffed, raw: bytes, connector: Connector, router: str, *, tls: bool = False) -> bytes:
    """The native redirect to the target reached through `connector` (the active member of an HA
    pair); b"" when the protocol cannot say it (TLS: closing is the answer). `tls`: the client came
    over TLS the router terminated (CORE: the connector it is sent says `sslEnabled=true`, so it
    is never moved to cleartext)."""
    host, port = connector.host, connector.port
    match sniffed.protocol:
        case WireProtocol.AMQP:
            return amqp.redirect_frames(router, host, port)
        case WireProtocol.MQTT:
            return _mqtt_connack(sniffed, mqtt.MQTT_V5_USE_ANOTHER_SERVER, f"{host}:{port}")
        case WireProtocol.STOMP:
            return stomp.encode_error(f"Connection router {router} redirects to {connector.url}")
        case WireProtocol.OPENWIRE:
            url = connector.url
            return openwire.encode_connection_control(
                reconnect_to=url, connected_brokers=url, rebalance=True, encoding=_wire_format(raw)
            )
        case WireProtocol.CORE:
            return core.encode_redirect(
                router=router, connector_name=connector.name, host=host, port=port, ssl_enabled=tls
            )
        case WireProtocol.TLS:
            return b""
        case _:
            assert_never(sniffed.protocol)


def refusal(sniffed: Sniffed, status: RouteStatus, router: str) -> bytes:
    """The protocol's own refusal; b"" when closing is the answer (OpenWire, TLS). The data path
    closes after it (a CORE client refused as unavailable would otherwise ask again at once)."""
    unavailable = status is RouteStatus.REFUSED_UNAVAILABLE
    match sniffed.protocol:
        case WireProtocol.AMQP:
            return amqp.refusal_frames(router, unavailable=unavailable)
        case WireProtocol.MQTT:
            code = mqtt.MQTT_V5_SERVER_UNAVAILABLE if unavailable else mqtt.MQTT_V5_USE_ANOTHER_SERVER
            return _mqtt_connack(sniffed, code)
        case WireProtocol.STOMP:
            what = "is not ready" if unavailable else "rejected this connection"
            return stomp.encode_error(f"Connection router {router} {what}")
        case WireProtocol.CORE:
            return core.encode_refusal(router, unavailable=unavailable)
        case WireProtocol.OPENWIRE | WireProtocol.TLS:
            return b""
        case _:
            assert_never(sniffed.protocol)


def target_filter(sniffed: Sniffed | None) -> type[TopologyFilter] | None:
    """What a proxied connection's broker-to-client bytes pass through for its life: a CORE
    broker's cluster topology is dropped (it names the brokers' own addresses, which clients would
    then connect to, bypassing the router); None: nothing."""
    return TopologyFilter if sniffed is not None and sniffed.protocol is WireProtocol.CORE else None


def replay_rejected(sniffed: Sniffed, router: str) -> bytes:
    """What a client is told when the target rejects its replayed server-first opening.

    AMQP: the client already heard "SASL ok" from the router and waits for the AMQP header, so it
    gets the protocol's "not authorized" instead of a bare close it would read as a framing
    error. Others: b"" (close).
    """
    if sniffed.protocol is WireProtocol.AMQP:
        return not_authorized(sniffed, router)
    return b""


def not_authorized(sniffed: Sniffed, router: str, peer: str = "") -> bytes:
    """The protocol's own "not authorized" answer; b"" when closing is the answer.

    MQTT: CONNACK 0x87 (v5) or return code 5 (3.1/3.1.1, MQTT 3.1.1 §3.2.2.3); AMQP: Open then
    Close `amqp:unauthorized-access` (the SASL outcome was already ok: the router answers SASL
    before it knows the target); STOMP: an ERROR frame; CORE: EXCEPTION 105 as Artemis words it,
    naming the client's address `peer` (host:port); OpenWire and TLS: close.
    """
    match sniffed.protocol:
        case WireProtocol.MQTT:
            level = 5 if sniffed.protocol_version == "5" else 4
            return mqtt.encode_connack(mqtt.MQTT_V5_NOT_AUTHORIZED, protocol_level=level)
        case WireProtocol.AMQP:
            description = f"Connection router {router}: authentication failed"
            return amqp.encode_open(router) + amqp.encode_close("amqp:unauthorized-access", description, None)
        case WireProtocol.STOMP:
            return stomp.encode_error(f"Connection router {router}: authentication failed")
        case WireProtocol.CORE:
            return core.encode_not_authorized(f"/{peer}", sniffed.user_name)
        case WireProtocol.OPENWIRE | WireProtocol.TLS:
            return b""
        case _:
            assert_never(sniffed.protocol)
