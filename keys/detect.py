"""Which protocol a connection speaks, from its first bytes (detection order in one place).

Pure: no I/O. The six openings differ in their first byte or two, so two bytes are enough:

    1. TLS        0x16 0x03 …   a handshake record (ClientHello): SNI, then whatever is inside
    2. AMQP 1.0   "AMQP" …      protocol header (SASL or plain)
    3. MQTT       0x10 …        CONNECT packet, flags 0
    4. OpenWire   0x00 …        4-byte frame size, then WireFormatInfo with magic "ActiveMQ"
    5. STOMP      "CONNECT", "STOMP", or EOL heart-beats before them
    6. CORE       "ARTEMIS" or "HORNETQ", then length-prefixed packets (Artemis's own protocol)

An acceptor's `protocols=` parameter (Artemis names: AMQP, MQTT, OPENWIRE, STOMP, CORE) narrows
the candidates; TLS is decided by the acceptor, not by `protocols`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

from keys.amqp import AmqpSniffer
from keys.core import CoreSniffer
from keys.native import NativeMqttSniffer, NativeStompSniffer
from keys.openwire import OpenWireSniffer
from keys.sniff import NEED_MORE, NeedMore, Sniffer
from keys.tls import TlsSniffer

__all__ = ["ARTEMIS_PROTOCOLS", "SNIFFERS", "Detector", "detect_tls", "make_detector"]

SNIFFERS: Final[dict[str, Sniffer]] = {
    "AMQP": AmqpSniffer(),
    "MQTT": NativeMqttSniffer(),
    "OPENWIRE": OpenWireSniffer(),
    "STOMP": NativeStompSniffer(),
    "CORE": CoreSniffer(),
}
"""The broker-protocol sniffers by their Artemis protocol name (HORNETQ's is CORE's: the same
packets after their own magic). MQTT's and STOMP's CONNECT are parsed in C when `keys._native` is
built (keys/native.py: the same results as the Python sniffers, which they fall back to), on both
data paths: about 73k instructions less per MQTT CONNECT."""

TLS: Final = TlsSniffer()

ARTEMIS_PROTOCOLS: Final = frozenset({*SNIFFERS, "HORNETQ"})
"""Protocol names an Artemis acceptor may list."""

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
    wanted = {*protocols, "CORE"} if "HORNETQ" in protocols else set(protocols)
    names = [n for n in ("AMQP", "MQTT", "OPENWIRE", "STOMP", "CORE") if not wanted or n in wanted]
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
