"""The CORE health probe's exchange (`probe=core`): what it sends and how it reads the broker's
answers. Pure: bytes out, bytes in, no I/O and no clock (checks.py's `check_core` runs it over a
connection, within the caller's deadline).

The probe opens a session as the Java client does (docs/protocols.md, keys/core.py), with what
Artemis's own pools open to their targets (`ActiveMQTarget.connect`: the pool's credentials, a
client ID with `ConnectionRouter.CLIENT_ID_PREFIX`), without waiting for the topology. Artemis
keeps that session and reads the broker's `Active` attribute over it; the probe takes the session
accepted as ready and closes it:

    1. `ARTEMIS`, PING (the Java client's connection TTL, 60 s) and CREATESESSION_V2 (a new UUID
       as the session's name, session channel 10, version `PROBE_VERSION`, the pool's user name
       and password, the probe's client ID), in one write. The broker handles CREATESESSION
       without a topology subscription (`ActiveMQPacketHandler.handleCreateSession`), so the
       probe sends none and gets no cluster topology to skip.
    2. The broker's packets on channel 0 (its PING echo, a DISCONNECT) are skipped until
       CREATESESSION_RESP (31, ready) or EXCEPTION (20, not ready: bad credentials are 105,
       SECURITY_EXCEPTION "AMQ229031: Unable to validate user ...") on channel 1.
    3. Ready: SESS_CLOSE (69) on the session's channel and its NULL_RESPONSE (21); the TCP close
       follows. Measured against Artemis 2.40: a connection closed with its session still open
       makes the broker log two warnings per probe (AMQ222061 "Client connection failed,
       clearing up resources for session", AMQ222107), a closed session none.

Every other packet before an answer is an error, as is a packet longer than
`keys.core.MAX_PACKET_BYTES` (as soon as its length has arrived).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from keys import NEED_MORE, SniffError, WireProtocol
from keys.core import (
    ARTEMIS_MAGIC,
    CoreException,
    PacketType,
    decode_exception,
    encode_create_session,
    encode_packet,
    parse_packet,
)

if TYPE_CHECKING:
    from keys import NeedMore

__all__ = [
    "CONNECTION_TTL_MS",
    "PROBE_VERSION",
    "SESSION_CHANNEL",
    "SESSION_CLOSE",
    "ProbeAnswer",
    "encode_opening",
    "parse_close_answer",
    "parse_session_answer",
]

PROBE_VERSION: Final = 131
"""The version of the probe's CREATESESSION_V2: `PacketImpl.ARTEMIS_2_18_0_VERSION`, the first
with CREATESESSION_V2 (the client ID) and the first of the connection routers. A broker refuses a
version outside its `compatibleVersionList` (EXCEPTION 108, "AMQ229033: Server and client
versions incompatible"); every list since 2.18 runs from 121 to the broker's own (136 in
2.37-2.44), so 131 is taken by every Artemis with routers, where the 2.40 client's 136 would be
refused by those before 2.37."""
CONNECTION_TTL_MS: Final = 60_000
"""The PING's connection TTL: the Java client's (`ActiveMQClient.DEFAULT_CONNECTION_TTL`)."""
SESSION_CHANNEL: Final = 10
"""The session's channel: the Java client's channel IDs start at 10 (0-9 are the protocol's)."""

_PING_CHANNEL: Final = 0
_CREATE_CHANNEL: Final = 1
"""Channel 0 carries ping, topology and disconnect; channel 1 the session's creation."""

SESSION_CLOSE: Final = encode_packet(PacketType.SESS_CLOSE, SESSION_CHANNEL, b"")
"""SESS_CLOSE (`SessionCloseMessage`: no body) on the session's channel."""

_NAME: Final = WireProtocol.CORE.value


def encode_opening(
    *, session_name: str, user_name: str | None, password: str | None, client_id: str
) -> bytes:
    """What the probe sends first: `ARTEMIS`, PING and CREATESESSION_V2.

    Args:
        session_name: the session's name, new for each probe (the Java client takes a UUID).
        user_name: the pool's user name, or None (Artemis then validates a null user).
        password: the pool's password, or None.
        client_id: the probe's client ID (`probe_client_id`).

    Returns:
        The bytes, for one write.
    """
    ping = encode_packet(PacketType.PING, _PING_CHANNEL, struct.pack(">q", CONNECTION_TTL_MS))
    session = encode_create_session(
        name=session_name,
        session_channel=SESSION_CHANNEL,
        version=PROBE_VERSION,
        user_name=user_name,
        password=password,
        client_id=client_id,
    )
    return ARTEMIS_MAGIC + ping + session


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeAnswer:
    """The broker's answer to one of the probe's requests."""

    exception: CoreException | None
    """The EXCEPTION it answered with; None for a yes (CREATESESSION_RESP, NULL_RESPONSE)."""
    end: int
    """Offset just past the answer in the broker's bytes: where the next answer's search starts."""


def _type_name(packet_type: int) -> str:
    try:
        return f"{PacketType(packet_type).name} ({packet_type})"
    except ValueError:
        return f"type {packet_type}"


def _read_answer(data: bytes, start: int, channel: int, yes: PacketType) -> ProbeAnswer | NeedMore:
    """The first packet after `start` that is not on channel 0: `yes` or EXCEPTION on `channel`."""
    pos = start
    while True:
        packet = parse_packet(data, pos)  # raises on a length above MAX_PACKET_BYTES
        if packet is NEED_MORE:
            return NEED_MORE
        if packet.channel == _PING_CHANNEL:
            pos = packet.end
            continue
        if packet.channel == channel and packet.type == yes:
            return ProbeAnswer(exception=None, end=packet.end)
        if packet.channel == channel and packet.type == PacketType.EXCEPTION:
            return ProbeAnswer(exception=decode_exception(packet), end=packet.end)
        raise SniffError(
            _NAME,
            f"unexpected {_type_name(packet.type)} on channel {packet.channel} at offset {packet.start} "
            f"while waiting for {yes.name}",
        )


def parse_session_answer(data: bytes) -> ProbeAnswer | NeedMore:
    """Read the broker's answer to the opening.

    Args:
        data: every byte the broker has sent so far (a broker sends no magic).

    Returns:
        CREATESESSION_RESP (`exception` None) or the EXCEPTION on channel 1, after any packets on
        channel 0; NEED_MORE while neither is whole.

    Raises:
        SniffError: a packet length below 9 or above `MAX_PACKET_BYTES`, another packet on a
            channel other than 0, or a malformed EXCEPTION.
    """
    return _read_answer(data, 0, _CREATE_CHANNEL, PacketType.CREATESESSION_RESP)


def parse_close_answer(data: bytes, start: int) -> ProbeAnswer | NeedMore:
    """Read the broker's answer to `SESSION_CLOSE`.

    Args:
        data: every byte the broker has sent so far.
        start: the end of its answer to the opening (`ProbeAnswer.end`).

    Returns:
        NULL_RESPONSE (`exception` None) or an EXCEPTION on the session's channel, after any
        packets on channel 0; NEED_MORE while neither is whole.

    Raises:
        SniffError: as `parse_session_answer`.
    """
    return _read_answer(data, start, SESSION_CHANNEL, PacketType.NULL_RESPONSE)
