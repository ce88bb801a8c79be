"""Which protocol a connection speaks, from its first bytes (detection order in one place).

Pure: no I/O. The five openings differ in their first byte, so one byte is usually enough:

    1. TLS        0x16 0x03 …   a handshake record (ClientHello): SNI, then whatever is inside
    2. AMQP 1.0   "AMQP" …      protocol header (SASL or plain)
    3. MQTT       0x10 …        CONNECT packet, flags 0
    4. OpenWire   0x00 …        4-byte frame size, then WireFormatInfo with magic "ActiveMQ"
    5. STOMP      "CONNECT", "STOMP", or EOL heart-beats before them

An acceptor's `protocols=` parameter (Artemis names: AMQP, MQTT, OPENWIRE, STOMP, CORE) narrows
the candidates; TLS is decided by the acceptor, not by `protocols`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

from keys.amqp import AmqpSniffer
from keys.mqtt import MqttSniffer
from keys.openwire import OpenWireSniffer
from keys.sniff import NEED_MORE, NeedMore, Sniffer
from keys.stomp import StompSniffer
from keys.tls import TlsSniffer

__all__ = ["ARTEMIS_PROTOCOLS", "SNIFFERS", "Detector", "detect_tls", "make_detector"]

SNIFFERS: Final[dict[str, Sniffer]] = {
    "AMQP": AmqpSniffer(),
    "MQTT": MqttSniffer(),
    "OPENWIRE": OpenWireSniffer(),
    "STOMP": StompSniffer(),
}
"""The broker-protocol sniffers by their Artemis protocol name."""

TLS: Final = TlsSniffer()

ARTEMIS_PROTOCOLS: Final = frozenset({*SNIFFERS, "CORE", "HORNETQ"})
"""Protocol names an Artemis acceptor may list. CORE and HORNETQ have a sniffer (keys/core.py) that
detection does not offer yet: the data path does not speak CORE (issue 32 point 3)."""

Detector = Callable[[bytes], Sniffer | NeedMore | None]
"""First bytes -> the sniffer to use, NEED_MORE while ambiguous, None when nothing matches."""


def make_detector(protocols: Collection[str] = (), *, tls: bool = True) -> Detector:
    """Build the detection function of an acceptor.

    Args:
        protocols: Artemis protocol names the acceptor accepts (upper case); empty = all.
        tls: whether a TLS ClientHello is recognised (SNI peeking on passthrough acceptors).

    Returns:
        The detector, trying candidates in the documented order.
    """
    names = [n for n in ("AMQP", "MQTT", "OPENWIRE", "STOMP") if not protocols or n in protocols]
    candidates: list[Sniffer] = ([TLS] if tls else []) + [SNIFFERS[n] for n in names]

    def detect(prefix: bytes) -> Sniffer | NeedMore | None:
        matching = [s for s in candidates if s.looks_like(prefix)]
        if len(matching) == 1:
            return matching[0]
        return NEED_MORE if matching and prefix else None

    return detect


def detect_tls(prefix: bytes) -> Sniffer | None:
    """Detection on acceptors that terminate TLS: a ClientHello, or nothing."""
    return TLS if TLS.looks_like(prefix) else None
