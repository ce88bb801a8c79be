"""Whether a broker's first answer to a client is its protocol's refusal (sans-IO: bytes in).

Passive health (pools/outlier.py) counts a broker that refuses clients against it. This module
reads the first bytes a broker sent on a proxied connection and says whether they refuse the
client, and in what words. Only what the first read holds is looked at: an answer cut short is
not a refusal (the safe side: it does not count against the broker).

    MQTT   CONNACK with a return code other than 0 (MQTT 3.1.1 §3.2.2.3: 1-5) or a reason code of
           0x80 or more (MQTT 5 §3.2.2.2).
    STOMP  an ERROR frame (STOMP 1.2 "ERROR"), with its `message` header.
    CORE   an EXCEPTION packet (20) before any CREATESESSION_RESP (31): Artemis's answer to a
           CREATESESSION it refuses (AMQ229031 bad credentials, its own router's AMQ229238/9240,
           ...). The broker's answers to the replayed PINGs and topology subscription come
           first and are skipped.
    AMQP, OpenWire: not read (a refusal comes after the SASL exchange or the WireFormatInfo,
           several frames in); their brokers' early closes still count.

No trio, socket, clock or logging here.
"""

from __future__ import annotations

from typing import Final

from keys import core, mqtt, stomp
from keys.sniff import NEED_MORE, SniffError, WireProtocol

__all__ = ["ANSWER_BYTES", "parse_refusal"]

ANSWER_BYTES: Final = 1024
"""How much of the broker's first read is looked at (a CONNACK is a few bytes; a STOMP ERROR frame's
head a few hundred)."""
_MQTT_CODES: Final = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
    0x80: "unspecified error",
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x88: "server unavailable",
    0x89: "server busy",
    0x8A: "banned",
    0x9F: "connection rate exceeded",
    0x97: "quota exceeded",
}
"""Names of the common refusals (MQTT 3.1.1 Table 3.1, MQTT 5 Table 3-1)."""
_STOMP_SHOWN: Final = 80
"""Characters of a STOMP ERROR's message header kept in the reason."""
_CORE_SHOWN: Final = 80
"""Characters of a CORE EXCEPTION's message kept in the reason."""
_CORE_ANY_SIZE: Final = 2**31 - 1
"""A broker packet of any length is skipped (a long one is cut short in the first read: no
refusal, the safe side)."""


def parse_refusal(protocol: WireProtocol | None, data: bytes) -> str | None:
    """The refusal a broker's first bytes hold, in words, or None. The protocols' own parsers of a
    server's first answer read them (`mqtt.parse_connack`, `stomp.parse_server_frame`, which the
    health probes use too).

    Args:
        protocol: the client's protocol (None: not read, so nothing is recognised).
        data: the start of the first bytes the broker sent (one read; callers pass at most
            `ANSWER_BYTES`).

    Returns:
        e.g. "mqtt CONNACK 0x03 server unavailable", "stomp ERROR: ...", "core EXCEPTION 105
        (SECURITY_EXCEPTION): AMQ229031: ..."; None when the bytes are no refusal, or too short
        to say.
    """
    try:
        if protocol is WireProtocol.MQTT:
            code = mqtt.parse_connack(data)
            if code is NEED_MORE or code == 0:
                return None
            return f"mqtt CONNACK 0x{code:02x} {_MQTT_CODES.get(code, 'refused')}"
        if protocol is WireProtocol.STOMP:
            frame = stomp.parse_server_frame(data)
            if frame is NEED_MORE or frame[0] != "ERROR":
                return None
            message = frame[1].get("message", "")[:_STOMP_SHOWN]
            return f"stomp ERROR: {message}" if message else "stomp ERROR"
        if protocol is WireProtocol.CORE:
            return _core_refusal(data)
    except SniffError:  # not the answer the protocol expects: no refusal this module can read
        return None
    return None


def _core_refusal(data: bytes) -> str | None:
    """The broker's packets from the start (a server sends no magic): the first EXCEPTION before a
    CREATESESSION_RESP, in words; None at a CREATESESSION_RESP or where the bytes end."""
    pos = 0
    while True:
        packet = core.parse_packet(data, pos, max_size=_CORE_ANY_SIZE)
        if packet is NEED_MORE or packet.type == core.PacketType.CREATESESSION_RESP:
            return None
        if packet.type == core.PacketType.EXCEPTION:
            error = core.decode_exception(packet)
            if error.message is not None:
                error = core.CoreException(code=error.code, message=error.message[:_CORE_SHOWN])
            return f"core {error.describe()}"
        pos = packet.end
