"""Which connection TTL a proxied connection gets (Artemis's connection TTL, seed 002): a pure rule.

No I/O, no clock here: the TTL checker (router/features/ttl/service.py) compares the times.
"""

from __future__ import annotations

import math
from typing import Final

from keys import Sniffed, SniffError, WireProtocol
from keys.mqtt import MqttSniffer

__all__ = ["connection_ttl_s", "sniff_mqtt_connect"]

_MQTT: Final = MqttSniffer()


def connection_ttl_s(ttl_ms: int, sniffed: Sniffed | None) -> float:
    """The TTL of one connection, in seconds; `math.inf` when it has none.

    An MQTT client whose CONNECT keep-alive is below the TTL has none: it sends at least a
    PINGREQ within every keep-alive period (MQTT 3.1.1 §3.1.2.10, MQTT 5 §3.1.2.10), and the
    broker closes it after 1.5 keep-alives of silence anyway, so the TTL could only cut it off
    over scheduling jitter. Keep-alive 0 (no pings) or at or above the TTL leaves it under the TTL.

    Args:
        ttl_ms: the TTL in force on the acceptor (`ConnectionTtlConfig.ttl_ms`); -1 = none.
        sniffed: what the client's opening revealed, if it was read.
    """
    if ttl_ms <= 0:
        return math.inf
    if sniffed is not None and sniffed.protocol is WireProtocol.MQTT:
        keepalive_s = sniffed.keepalive_s or 0
        if 0 < keepalive_s * 1000 < ttl_ms:
            return math.inf
    return ttl_ms / 1000


def sniff_mqtt_connect(data: bytes) -> Sniffed | None:
    """The MQTT CONNECT at the start of `data`, if there is a complete one."""
    if not _MQTT.looks_like(data):
        return None
    try:
        result = _MQTT.sniff(data)
    except SniffError:
        return None
    return result if isinstance(result, Sniffed) else None
