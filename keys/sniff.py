"""The sniffer contract: bytes in -> a result, need-more, a server reply, or an error (STYLE R1).

A sniffer is a pure function of the bytes a client has sent so far. It keeps no state: the
router owns the buffer, the byte cap and the deadline, and calls `sniff` again with the whole
buffer after every read (opening frames are a few KB, so re-parsing is cheap and removes a class
of state bugs). No trio, sockets, clocks, logging or metrics here.

Some protocols speak first from the server side: AMQP 1.0 SASL (the server sends its
mechanisms before the client says who it is), OpenWire (both sides send WireFormatInfo) and
CORE (the client waits for the topology before it creates its session). For
those the sniffer returns `Reply`: what the router must have sent to the client so far for the
client to go on, as one cumulative byte string computed from the buffer alone. The router sends
only the part it has not sent yet, so the sniffer stays stateless.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

__all__ = [
    "NEED_MORE",
    "NeedMore",
    "Reply",
    "SniffError",
    "SniffResult",
    "Sniffed",
    "Sniffer",
    "WireProtocol",
]


class WireProtocol(enum.Enum):
    """A client protocol the router reads, one sniffer each; the value is the sniffer's name."""

    MQTT = "mqtt"
    AMQP = "amqp"
    STOMP = "stomp"
    OPENWIRE = "openwire"
    TLS = "tls"
    CORE = "core"
    """Artemis CORE (and its HORNETQ variant): keys/core.py."""


class NeedMore(enum.Enum):
    """The single value `NEED_MORE`: the bytes so far are a valid but incomplete prefix."""

    NEED_MORE = enum.auto()


NEED_MORE: Final = NeedMore.NEED_MORE
"""`result is NEED_MORE` narrows under mypy --strict."""


class SniffError(ValueError):
    """The client's bytes cannot be the protocol's opening: garbage, a bad field, an unsupported
    version. `protocol` names the sniffer, `reason` the rule and the offending value; `answer` is
    what the protocol requires a server to send before it closes (an MQTT CONNACK 0x01 for an
    unsupported protocol level), b"" for a plain close."""

    def __init__(self, protocol: str, reason: str, *, answer: bytes = b"") -> None:
        super().__init__(f"{protocol}: {reason}")
        self.protocol = protocol
        self.reason = reason
        self.answer = answer


@dataclass(frozen=True, slots=True, kw_only=True)
class Sniffed:
    """What a handshake revealed about a connection. A field is None when the protocol or this
    client did not send it."""

    protocol: WireProtocol
    """The protocol whose opening this was."""
    client_id: str | None = None
    """MQTT client identifier, AMQP container-id, STOMP `client-id`, OpenWire clientId, CORE
    CREATESESSION_V2 clientID."""
    user_name: str | None = None
    """MQTT username, SASL PLAIN authcid, STOMP login, OpenWire userName, CORE username."""
    password: str | None = field(default=None, repr=False)
    """The password on the wire, for the router's own authentication; never logged."""
    sni_host: str | None = None
    """TLS server_name."""
    hostname: str | None = None
    """AMQP Open hostname, STOMP `host` header."""
    protocol_version: str | None = None
    """MQTT "3.1", "3.1.1" or "5"; STOMP accepted versions; OpenWire version; TLS "1.2"/"1.3";
    CORE the CREATESESSION's client version ("136")."""
    keepalive_s: int | None = None
    """MQTT keep-alive in seconds (0 = none), for connection-TTL decisions."""
    sasl_mechanism: str | None = None
    """AMQP SASL mechanism the client chose (PLAIN, ANONYMOUS, EXTERNAL)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """Need more bytes, and the client waits for the server first.

    `to_client` is everything the router must have sent to the client by now, cumulative: the
    router sends `to_client[already_sent:]`.
    """

    to_client: bytes


SniffResult = Sniffed | Literal[NeedMore.NEED_MORE] | Reply
"""What `Sniffer.sniff` returns."""


class Sniffer(Protocol):
    """One instance per wire protocol, tried in detection order (`keys.detect`)."""

    name: str
    """The protocol name put into `Sniffed.protocol` and into `SniffError`."""

    def looks_like(self, prefix: bytes) -> bool:
        """Whether a connection that starts with `prefix` (maybe only 1 byte) may be this
        protocol. Cheap, never raises."""
        ...

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the opening bytes.

        Raises:
            SniffError: the bytes cannot be a valid opening of this protocol.
        """
        ...

    def announced_size(self, data: bytes) -> int | None:
        """How many bytes the opening takes in all, once its first bytes say so (an MQTT CONNECT's
        remaining length); None when they do not (yet). The router rejects an opening announced
        over its byte cap at once instead of reading up to the cap. Never raises."""
        ...
