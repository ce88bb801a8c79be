"""Key resolution: from what is known about a connection to the raw routing key (SPEC A1 steps 1-2).

Pure code: no I/O, no clock. The router's data paths fill a `ConnectionFacts` from the socket, a
PROXY protocol header, the protocol sniffers and the router's own authentication; this module turns
the facts into the key string that the rest of the workflow uses, applying the router's key filter
and the `NULL` rule exactly as Artemis's `KeyResolver` does.
"""

from __future__ import annotations

import enum
import ipaddress
import operator
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys.filter import KeyFilter

__all__ = [
    "CANONICAL_KEPT",
    "DEFAULT_KEY_MAX_LENGTH",
    "INTERNAL_CLIENT_ID_PREFIX",
    "NULL_KEY",
    "RAW_VALUE_OF",
    "ConnectionFacts",
    "KeyType",
    "canonical_ip",
    "is_internal_client_id",
    "known_canonical_ip",
    "raw_value",
    "resolve_key",
    "resolve_value",
]

NULL_KEY: Final = "NULL"
"""The literal key of a connection with no value for the key type, or whose value misses the filter."""

DEFAULT_KEY_MAX_LENGTH: Final = 1024
"""Longest raw key, in characters, a connection may bring (our `<key-max-length>`); a longer one
counts as missing. Clients choose their client ids and user names: without a bound, 20,000
connections with 15 KB client ids grew a router with a never-expiring cache by 372 MB for good.
MQTT guarantees client ids of 23 bytes, UUIDs are 36, DNS names at most 253."""

INTERNAL_CLIENT_ID_PREFIX: Final = "$.artemis.internal.router.client."
"""Client ids with this prefix are router-to-router probes and always go to the local target."""


class KeyType(enum.Enum):
    """Which property of a connection is the routing key (Artemis `key-type`)."""

    CLIENT_ID = "CLIENT_ID"
    SNI_HOST = "SNI_HOST"
    SOURCE_IP = "SOURCE_IP"
    USER_NAME = "USER_NAME"
    ROLE_NAME = "ROLE_NAME"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionFacts:
    """Everything the router knows about one client connection when it routes it.

    A field is `None` when the connection does not carry that value (a protocol without a client id,
    a plain-TCP connection without SNI, an unauthenticated user).
    """

    source_ip: str | None = None
    """The client's address without port; IPv6 without brackets."""
    client_id: str | None = None
    """MQTT client identifier, AMQP container-id, OpenWire/STOMP/CORE client id."""
    user_name: str | None = None
    """The authenticated user, else the user name sent on the wire."""
    sni_host: str | None = None
    """server_name from the TLS ClientHello."""
    roles: tuple[str, ...] = field(default=())
    """Roles of the user authenticated by the router, in user/role store order."""

    def __post_init__(self) -> None:
        if self.source_ip is not None:
            canonical = canonical_ip(self.source_ip)
            if canonical is not self.source_ip:
                object.__setattr__(self, "source_ip", canonical)


CANONICAL_KEPT: Final = 4096
"""Addresses `canonical_ip` remembers at most (then it forgets them all and starts again)."""

_CANONICAL: Final[dict[str, str]] = {}
"""Addresses `canonical_ip` was given lately -> their canonical text."""

known_canonical_ip: Final = _CANONICAL.get
"""The canonical text of an address `canonical_ip` was given lately, else None: a dictionary's
`get`, a fraction of a call (the native path asks it first for every connection)."""


def canonical_ip(text: str) -> str:
    """An IP address as `ipaddress` prints it, so equal peers give equal keys: "[::1]" is "::1",
    "::ffff:127.0.0.1" is "127.0.0.1". Remembers up to `CANONICAL_KEPT` addresses (a connection's
    source address is looked at on every connection; most come back).

    Raises:
        ValueError: `text` is not an IP address.
    """
    known = _CANONICAL.get(text)
    if known is not None:
        return known
    if _CANONICAL_IPV4.fullmatch(text) is not None:
        canonical = text  # already what str(ip_address(text)) gives (the common case: skip the parse)
    else:
        address = ipaddress.ip_address(text.strip("[]"))
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        canonical = str(address)
        if canonical == text:
            canonical = text
    if len(_CANONICAL) >= CANONICAL_KEPT:
        _CANONICAL.clear()
    _CANONICAL[text] = canonical
    return canonical


_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_IPV4: Final = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
"""Dotted-quad IPv4 without leading zeros: exactly the strings `ipaddress` prints for IPv4."""


def is_internal_client_id(client_id: str | None) -> bool:
    """Whether a client id marks a router-to-router probe (SPEC A1 step 0)."""
    return client_id is not None and client_id.startswith(INTERNAL_CLIENT_ID_PREFIX)


RAW_VALUE_OF: Final[dict[KeyType, Callable[[ConnectionFacts], str | tuple[str, ...] | None]]] = {
    KeyType.CLIENT_ID: operator.attrgetter("client_id"),
    KeyType.SNI_HOST: operator.attrgetter("sni_host"),
    KeyType.SOURCE_IP: operator.attrgetter("source_ip"),
    KeyType.USER_NAME: operator.attrgetter("user_name"),
    KeyType.ROLE_NAME: operator.attrgetter("roles"),
}
"""Which fact each key type reads (`raw_value`): one C call each, where a `match` over the key
types compared them one by one on every connection."""


def raw_value(key_type: KeyType, facts: ConnectionFacts) -> str | tuple[str, ...] | None:
    """What a connection has for a key type, before any filter: the value, or for ROLE_NAME all
    the user's roles in store order (the key filter chooses among them: `resolve_key`); None or
    () when it has nothing."""
    return RAW_VALUE_OF[key_type](facts)


def _raw_value(key_type: KeyType, facts: ConnectionFacts, key_filter: KeyFilter | None) -> str | None:
    value = raw_value(key_type, facts)
    if not isinstance(value, tuple):
        return value
    # SPEC A2: with a filter, the first role (store order) the filter finds; else the first.
    if not value:
        return None
    if key_filter is None:
        return value[0]
    for role in value:
        if key_filter.find(role) is not None:
            return role
    return None


def resolve_key(
    key_type: KeyType,
    key_filter: KeyFilter | None,
    facts: ConnectionFacts,
    max_length: int = DEFAULT_KEY_MAX_LENGTH,
) -> str:
    """Resolve the routing key of a connection (SPEC A1 steps 1 and 2).

    Args:
        key_type: the router's key type.
        key_filter: the router's compiled key filter, or None when it has none.
        facts: what is known about the connection.
        max_length: a raw value longer than this counts as missing (our `<key-max-length>`).

    Returns:
        The whole text the filter finds in the raw value (group 0, capture groups ignored), the raw
        value when there is no filter, or `NULL_KEY` when the value is missing, longer than
        `max_length`, or the filter finds nothing. An empty value counts as missing (our
        decision: an MQTT client that sends an empty client id has none, and an empty key would
        put all such clients on one broker without saying so).
    """
    return resolve_value(_raw_value(key_type, facts, key_filter), key_filter, max_length)


def resolve_value(value: str | None, key_filter: KeyFilter | None, max_length: int) -> str:
    """Step 2 of `resolve_key` for a raw value already read: the filter and the length cap."""
    if not value or len(value) > max_length:
        return NULL_KEY
    if key_filter is None:
        return value
    found = key_filter.find(value)
    return NULL_KEY if found is None else found
