"""Whether a broker's first answer to a client is its protocol's refusal (sans-IO: bytes in).

Passive health (pools/outlier.py) counts a broker that refuses clients against it. This module
reads the first bytes a broker sent on a proxied connection and says whether they refuse the
client, and in what words. Only what the first read holds is looked at: an answer cut short is
not a refusal (the safe side: it does not count against the broker).

    MQTT   CONNACK with a return code other than 0 (MQTT 3.1.1 §3.2.2.3: 1-5) or a reason code of
           0x80 or more (MQTT 5 §3.2.2.2).
    STOMP  an ERROR frame (STOMP 1.2 "ERROR"), with its `message` header.
    AMQP, OpenWire: not read (a refusal comes after the SASL exchange or the WireFormatInfo,
           several frames in); their brokers' early closes still count.

No trio, socket, clock or logging here.
"""

from __future__ import annotations

from typing import Final

from keys.sniff import WireProtocol

__all__ = ["parse_refusal"]

_MQTT_CONNACK: Final = 0x20
"""Fixed header byte of a CONNACK: type 2, flags 0 (MQTT 3.1.1 §3.2.1)."""
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


def parse_refusal(protocol: WireProtocol | None, data: bytes) -> str | None:
    """The refusal a broker's first bytes hold, in words, or None.

    Args:
        protocol: the client's protocol (None: not read, so nothing is recognised).
        data: the first bytes the broker sent (one read).

    Returns:
        e.g. "mqtt CONNACK 0x03 server unavailable", "stomp ERROR: ..."; None when the bytes are
        no refusal, or too short to say.
    """
    if protocol is WireProtocol.MQTT:
        return _mqtt(data)
    if protocol is WireProtocol.STOMP:
        return _stomp(data)
    return None


def _mqtt(data: bytes) -> str | None:
    if len(data) < 4 or data[0] != _MQTT_CONNACK:
        return None
    # Remaining length: up to 4 bytes of 7 bits, the high bit says another follows (§2.2.3).
    pos = 1
    while data[pos] & 0x80:
        pos += 1
        if pos > 4 or pos >= len(data):
            return None
    # Variable header: acknowledge flags, then the return (reason) code.
    if pos + 2 >= len(data):
        return None
    code = data[pos + 2]
    if code == 0:
        return None
    name = _MQTT_CODES.get(code, "refused")
    return f"mqtt CONNACK 0x{code:02x} {name}"


def _stomp(data: bytes) -> str | None:
    # A frame may follow heart-beat EOLs (STOMP 1.2 "Heart-beating").
    text = data.lstrip(b"\r\n")
    if not (text.startswith((b"ERROR\n", b"ERROR\r\n"))):
        return None
    message = ""
    for line in text.split(b"\n")[1:]:
        line = line.rstrip(b"\r")
        if not line:  # the end of the headers
            break
        name, sep, value = line.partition(b":")
        if sep and name == b"message":
            message = value[:_STOMP_SHOWN].decode("utf-8", "replace")
            break
    return f"stomp ERROR: {message}" if message else "stomp ERROR"
