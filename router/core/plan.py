"""The plan step: what a connection's opening and its routing decision become on the wire.

Pure: no I/O, no clock, no logging. Both data paths ask `plan` and carry out the action it returns;
neither decides anything itself:

    decision          opening and acceptor mode                 action
    not OK            any                                       Refuse: the protocol's refusal
    OK, no connector  any (a local target without one)          Refuse: REFUSED_USE_ANOTHER
    OK                redirect, or auto and the client can      Redirect: the protocol's redirect
                      follow a redirect
    OK                otherwise                                 Proxy: connect, replay, relay

The fast path serves only what needs no waiting (`for_fast_path`): a quorum wait, reading the
target's answer to a replayed server-first opening, and resolving a connector's host name become
`HandOver` to the trio side, which carries out the same plan.

The rules about acceptors live here too: `must_sniff` (does the key or the mode need the client's
opening?) and `fast_path_serves` (may the epoll fast path take an acceptor at all?).
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias, assert_never

from keys import ConnectionFacts, KeyType
from keys.proxy_protocol import encode_v1, encode_v2
from router.config.settings import AcceptorMode
from router.core import answers
from router.core.engine import DecisionReason, QuorumWait, RouteStatus, SharedCacheWait, Wait
from router.core.events import Decided, GateOutcome, Mode
from router.core.records import quick_init

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import NeedMore, Sniffed
    from pools import Connector, Target
    from router.config.settings import AcceptorConfig
    from router.core.address import Address
    from router.core.engine import RouteDecision
    from router.core.events import ConnectionRef
    from router.core.stream_filter import StreamFilter

__all__ = [
    "Action",
    "HandOver",
    "HandOverReason",
    "Opening",
    "Proxy",
    "Redirect",
    "Refuse",
    "decided",
    "fast_path_serves",
    "for_fast_path",
    "held_back",
    "is_ip_literal",
    "must_sniff",
    "not_authorized_answer",
    "plan",
    "routing_facts",
]


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Opening:
    """What the opening phase learnt about a connection (either data path)."""

    source: Address
    """The client: the TCP peer, or the address in a PROXY protocol header."""
    local: Address | None = None
    """The address the client connected to: ours, or the original one in the PROXY header (the
    PROXY header the router sends names it); None on the fast path, which sends none."""
    raw: bytes = b""
    """Client bytes read so far (inside TLS when the router terminates it), replayed unchanged."""
    sniffed: Sniffed | None = None
    """What the client's opening revealed; None when it was not read (`must_sniff`)."""
    replied: bytes = b""
    """What the router already answered itself (server-first openings: AMQP SASL, OpenWire)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Refuse:
    """Tell the client no, in its protocol where SPEC A6 says how, and close."""

    key: str
    """The key after filter and transform."""
    status: RouteStatus
    """REFUSED_USE_ANOTHER or REFUSED_UNAVAILABLE: what the client is told."""
    reason: DecisionReason
    answer: bytes
    """Everything to send before closing (the opening it is still owed, then the refusal); b"":
    just close."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Redirect:
    """Tell the client where to go, natively, and close."""

    key: str
    reason: DecisionReason
    """Which workflow step chose the target."""
    target: Target
    connector: Connector
    """The member the client is sent to (the active one of an HA pair)."""
    answer: bytes
    """Everything to send before closing; b"" when the protocol cannot say it (TLS)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Proxy:
    """Connect to the target, replay, then relay both ways."""

    key: str
    reason: DecisionReason
    """Which workflow step chose the target."""
    target: Target
    connector: Connector
    """The member to connect to (the active one of an HA pair)."""
    replay: bytes
    """Sent to the target first: the PROXY protocol header we send (when the acceptor sends one),
    then the client's bytes read so far (unchanged, except where the router's own answer changed
    what the client negotiated: `answers.replayed_opening`)."""
    preamble: Callable[[bytes], int | NeedMore] | None = None
    """When the router answered the client's server-first opening itself: measures the target's own
    version of those bytes in its answer to the replay, which is dropped (the client had ours)."""
    owed: bytes = b""
    """Sent to the client once the target's preamble is read: the rest of the router's version of
    the opening that the client has not had yet."""
    if_rejected: bytes = b""
    """Sent to the client when the target rejects the replayed opening (the client heard "ok" from
    the router already); b"": just close."""
    target_filter: Callable[[], StreamFilter] | None = None
    """What the target's bytes to the client pass through for the connection's life, made once per
    connection (CORE: its cluster topology dropped, router/core/stream_filter.py); None: nothing."""


class HandOverReason(enum.Enum):
    """Why the fast path passes a connection to the trio side."""

    QUORUM_WAIT = "quorum wait"
    """The pool is below its quorum: the decision waits (up to quorum-timeout)."""
    SHARED_CACHE = "shared cache"
    """The key's entry must be read from the cache shared through ZooKeeper."""
    TARGET_OPENING = "the target's opening must be read"
    """Proxying a server-first opening the router answered: the target's answer must be read first."""
    NAME_LOOKUP = "the connector is a host name"
    """Resolving it would block the fast path's thread."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class HandOver:
    """The fast path cannot carry this out without waiting: the trio side continues."""

    reason: HandOverReason
    then: Proxy | Wait
    """What the trio side does: carry out this Proxy, or wait (for the shared cache, the quorum) and
    decide."""


Action: TypeAlias = Refuse | Redirect | Proxy | HandOver


def must_sniff(
    acceptor: AcceptorConfig, key_type: KeyType, *, terminated: bool = False, certificate_user: bool = False
) -> bool:
    """Whether a connection's opening must be read before it is routed.

    SOURCE_IP in proxy mode needs no protocol knowledge: any protocol passes untouched and the
    connection goes to the target at once. With TLS terminated by the router SNI is already
    known, and a verified client certificate names the user (it comes before the name on the wire,
    SPEC A2), so those keys need nothing more either. Redirects, refusals in the client's protocol
    and the router's own authentication always need the opening.

    Args:
        acceptor: the acceptor the client came in on.
        key_type: its router's key type.
        terminated: the router terminated TLS (so it knows SNI).
        certificate_user: the client presented a verified certificate.
    """
    if acceptor.mode is not AcceptorMode.PROXY or acceptor.require_authentication:
        return True
    match key_type:
        case KeyType.SOURCE_IP:
            return False
        case KeyType.ROLE_NAME | KeyType.USER_NAME:
            return not certificate_user
        case KeyType.SNI_HOST:
            return not terminated
        case KeyType.CLIENT_ID:
            return True
        case _:
            assert_never(key_type)


def fast_path_serves(acceptor: AcceptorConfig, key_type: KeyType, connection_ttl_ms: int) -> bool:
    """Whether the epoll fast path may serve an acceptor: not when it terminates TLS, reads or sends
    the PROXY protocol, has a user store or requires authentication, routes by ROLE_NAME, or has a
    connection TTL (the trio path does those); never with `fastPath=false`."""
    return (
        acceptor.fast_path
        and key_type is not KeyType.ROLE_NAME
        and acceptor.tls is None
        and not acceptor.proxy_protocol
        and acceptor.send_proxy_protocol is None
        and not acceptor.require_authentication
        and acceptor.users_file is None
        and connection_ttl_ms <= 0
    )


def routing_facts(
    opening: Opening,
    *,
    user: str | None = None,
    roles: tuple[str, ...] = (),
    sni_host: str | None = None,
) -> ConnectionFacts:
    """What the routing workflow knows about a connection (its key comes from these), on either path.

    SPEC A2: the user the router authenticated (client certificate or user store) comes before
    the name sent on the wire, and the SNI of TLS the router terminated before what was sniffed.

    Args:
        opening: what the opening phase read.
        user: the user the router authenticated, if any.
        roles: that user's roles (user store order).
        sni_host: server_name of a TLS hello the router terminated.
    """
    sniffed = opening.sniffed
    if sniffed is None:
        return ConnectionFacts(source_ip=opening.source.host, user_name=user, sni_host=sni_host, roles=roles)
    return ConnectionFacts(
        source_ip=opening.source.host,
        client_id=sniffed.client_id,
        user_name=user or sniffed.user_name,
        sni_host=sni_host or sniffed.sni_host,
        roles=roles,
    )


def after_connect_failed(
    acceptor: AcceptorConfig, router: str, opening: Opening, decision: RouteDecision
) -> Proxy | Refuse:
    """What a proxied connection whose connect failed does next, given the engine's redispatch
    decision (`RoutingEngine.redispatch`): connect to the other target, or refuse in its
    protocol's words (an MQTT CONNACK "server unavailable", ...) instead of a bare close."""
    action = plan(acceptor, router, opening, decision)
    # The mode and the opening chose proxying the first time; they choose it again.
    assert not isinstance(action, Redirect), "a proxied connection is proxied again"
    return action


def plan(
    acceptor: AcceptorConfig, router: str, opening: Opening, decision: RouteDecision
) -> Refuse | Redirect | Proxy:
    """What to do with a decided connection (see the module docstring's table).

    Args:
        acceptor: the acceptor the client came in on (its mode, the PROXY header it sends).
        router: the router's name, which refusals and redirects name.
        opening: what the opening phase read.
        decision: the routing decision.
    """
    key, reason = decision.key, decision.reason
    target, connector, sniffed = decision.target, decision.connector, opening.sniffed
    if decision.status is not RouteStatus.OK or target is None:
        return _refuse(router, opening, key, decision.status, reason)
    if connector is None:
        return _refuse(
            router, opening, key, RouteStatus.REFUSED_USE_ANOTHER, DecisionReason.NO_LOCAL_CONNECTOR
        )
    if sniffed is not None and answers.redirects(acceptor.mode, sniffed):
        said = answers.redirect(sniffed, opening.raw, connector, router, tls=acceptor.tls is not None)
        answer = _with_owed(opening, said)
        return Redirect(key=key, reason=reason, target=target, connector=connector, answer=answer)
    header = b""
    if acceptor.send_proxy_protocol is not None:
        header = _proxy_header(opening, acceptor.send_proxy_protocol)
    target_filter = None if sniffed is None else answers.target_filter(sniffed)
    if sniffed is None or (not opening.replied and target_filter is None):
        # Nothing answered by the router, nothing to take out of the target's stream: the target's
        # own opening reaches the client unchanged. (A protocol whose target stream is filtered,
        # CORE, gets the router's answers and its broker's preamble dropped all the same.)
        return Proxy(key=key, reason=reason, target=target, connector=connector, replay=header + opening.raw)
    return Proxy(
        key=key,
        reason=reason,
        target=target,
        connector=connector,
        replay=header + answers.replayed_opening(sniffed, opening.raw),
        preamble=answers.target_preamble_measure(sniffed, opening.raw),
        owed=answers.owed_opening(sniffed, opening.raw, opening.replied),
        if_rejected=_with_owed(opening, answers.replay_rejected(sniffed, router)),
        target_filter=target_filter,
    )


def decided(
    conn: ConnectionRef,
    opening: Opening,
    action: Refuse | Redirect | Proxy,
    *,
    facts: ConnectionFacts | None = None,
    latency_s: float = 0.0,
) -> Decided:
    """The report of a planned connection, built here once for both data paths.

    Args:
        conn: the connection.
        opening: what its opening phase read.
        action: what the plan says.
        facts: what its key came from.
        latency_s: from the complete opening to the decision.
    """
    protocol = None if opening.sniffed is None else opening.sniffed.protocol
    if isinstance(action, Refuse):
        return Decided(
            conn=conn,
            key=action.key,
            status=action.status,
            reason=action.reason,
            mode=Mode.REFUSE,
            protocol=protocol,
            facts=facts,
            source=opening.source,
            latency_s=latency_s,
        )
    return Decided(
        conn=conn,
        key=action.key,
        status=RouteStatus.OK,
        reason=action.reason,
        mode=Mode.PROXY if isinstance(action, Proxy) else Mode.REDIRECT,
        node_id=action.target.node_id,
        local=action.target.local,
        protocol=protocol,
        facts=facts,
        source=opening.source,
        latency_s=latency_s,
    )


def not_authorized_answer(router: str, opening: Opening) -> bytes:
    """What a client the router's own authentication refused is sent before the close."""
    if opening.sniffed is None:
        return b""
    return _with_owed(opening, answers.not_authorized(opening.sniffed, router, str(opening.source)))


def for_fast_path(action: Refuse | Redirect | Proxy | Wait) -> Action:
    """The action as the fast path carries it out: what needs waiting becomes `HandOver`."""
    if isinstance(action, QuorumWait):
        return HandOver(reason=HandOverReason.QUORUM_WAIT, then=action)
    if isinstance(action, SharedCacheWait):
        return HandOver(reason=HandOverReason.SHARED_CACHE, then=action)
    if isinstance(action, Proxy):
        if action.preamble is not None:
            return HandOver(reason=HandOverReason.TARGET_OPENING, then=action)
        if not is_ip_literal(action.connector.host):
            return HandOver(reason=HandOverReason.NAME_LOOKUP, then=action)
    return action


_HELD_BACK: Final = {
    GateOutcome.QUEUE_FULL: DecisionReason.QUEUE_FULL,
    GateOutcome.QUEUE_TIMEOUT: DecisionReason.QUEUE_TIMEOUT,
}
"""The refusal reason of each way a target's gate holds a connection back."""


def held_back(router: str, opening: Opening, key: str, outcome: GateOutcome) -> Refuse:
    """The refusal of a connection its target's gate held back (`QUEUE_FULL`, `QUEUE_TIMEOUT`):
    REFUSED_UNAVAILABLE in its protocol's words, as for a target that is not ready."""
    return _refuse(router, opening, key, RouteStatus.REFUSED_UNAVAILABLE, _HELD_BACK[outcome])


def _refuse(router: str, opening: Opening, key: str, status: RouteStatus, reason: DecisionReason) -> Refuse:
    said = b"" if opening.sniffed is None else answers.refusal(opening.sniffed, status, router)
    return Refuse(key=key, status=status, reason=reason, answer=_with_owed(opening, said))


def _with_owed(opening: Opening, said: bytes) -> bytes:
    """`said`, after what the client is still owed of a server-first opening; nothing is owed when
    nothing is said (the client is just closed)."""
    if not said or opening.sniffed is None:
        return said
    return answers.owed_opening(opening.sniffed, opening.raw, opening.replied) + said


def _proxy_header(opening: Opening, version: str) -> bytes:
    """The PROXY protocol header we send, naming the original client and destination, so chains
    of proxies keep them."""
    source, local = opening.source, opening.local
    assert local is not None, "the trio path, which sends PROXY headers, knows the local address"
    if version == "v1":
        return encode_v1(source.host, source.port, local.host, local.port)
    return encode_v2(source.host, source.port, local.host, local.port)


@functools.lru_cache(maxsize=1024)
def is_ip_literal(host: str) -> bool:
    """Whether a connector's host is an IP address (connectable without a name lookup)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
