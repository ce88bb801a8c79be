"""What happens to client connections and to pools, as typed events: the one report of both data
paths, consumed by subscribers (log lines and metrics in `router/reports.py`; the routing event log
will be one more subscriber).

Pure data: no I/O, no clock (times are fields), no logging. A connection's events, in order:

    AcceptRefused                                               (a limit: closed at accept)
    Accepted -> OpeningFailed                                   (bad bytes, deadline, TLS)
             -> NotAuthorized                                   (the router's own authentication)
             -> Decided(mode=REFUSE | REDIRECT)                 (answered by the router itself)
             -> Decided(mode=PROXY) -> ConnectFailed
                                    -> ConnectFailed(redispatched_to) -> Connected | ConnectFailed
                                    -> Connected -> Closed(reason)

A connection keeps its `ConnectionRef` (with a process-unique id) across both data paths, also
when the fast path hands it over to the trio side, so its events can be joined. Each is built in
one place for both paths: `Accepted` by `RouterRuntime.accept`, `OpeningFailed` by
`opening.opening_failed`, `Decided` by `plan.decided`, and `Connected`, `ConnectFailed` and
`Closed` by the connection's `LiveConnection` (`connected_in`, `connect_failed`, `ended`);
`NotAuthorized` by the trio path, the only one that authenticates, and `AcceptRefused` by
`ServedAcceptor.admit`. Subscribers run in
the thread that reports (the trio thread or the fast-path thread): they must be quick, must not
block and must be thread-safe.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias

from router.core.records import quick_init

if TYPE_CHECKING:
    from keys import ConnectionFacts, WireProtocol
    from pools import PoolEvent
    from router.core.address import Address
    from router.core.admission import Refusal
    from router.core.engine import DecisionReason, RouteStatus

__all__ = [
    "CONNECTION_IDS",
    "AcceptRefused",
    "Accepted",
    "CloseReason",
    "Closed",
    "ConnectFailed",
    "ConnectFailure",
    "Connected",
    "ConnectionEvent",
    "ConnectionRef",
    "ConnectionsClosed",
    "Decided",
    "Event",
    "GateOutcome",
    "Held",
    "LookedUp",
    "Mode",
    "NotAuthorized",
    "OpeningFailed",
    "OpeningFailure",
    "Subscriber",
]


class CloseReason(enum.Enum):
    """Why a proxied connection ended: one closed set for both data paths (the `reason=` of the
    closed line and of `router_proxied_connections_closed_total`)."""

    CLOSED = "closed"
    """Both ends finished (each direction's EOF passed on), or one end of a connection that cannot
    half-close (TLS terminated by the router) finished."""
    RESET = "reset"
    """One side reset or broke the connection; both sides were closed at once."""
    REPLAY_FAILED = "replay_failed"
    """The target's answer to the replayed opening was unusable, or did not come in time."""
    CONNECTION_TTL = "connection_ttl"
    """The router closed it: no bytes from the client within the connection TTL."""
    TARGET_NOT_READY = "target_not_ready"
    """The router closed it: its target's probe failed."""
    FAILOVER = "failover"
    """The router closed it: the HA-pair member it went to is no longer the active one."""
    SHUTDOWN = "shutdown"
    """The router closed it: a shutdown (paced over the grace period, or at its end)."""
    EVACUATED = "evacuated"
    """The router moved its client elsewhere (an evacuation or a rebalance), in the client's
    protocol where it has the words (router/core/framing.py)."""
    TARGET_REMOVED = "target_removed"
    """The router closed it: a configuration reload removed its target (or the member address it
    went to, or its router) from the configuration."""
    BROKER_CLOSED_EARLY = "broker_closed_early"
    """The broker closed (or reset) it without a byte, within `BROKER_EARLY_CLOSE_S` of the
    connect, after the client had sent its opening (a broker at its connection limit does this);
    counted by passive health (pools/outlier.py)."""
    BROKER_REFUSED = "broker_refused"
    """The broker's first answer was its protocol's refusal (keys/refusal.py; the closed line's
    detail gives its code), then it ended; counted by passive health."""
    INTERNAL_ERROR = "internal_error"
    """A bug in the router; logged with its traceback."""

    @property
    def by_router(self) -> bool:
        """Whether the router ended the connection by its own decision (counted in
        `router_proxied_connections_closed_total`)."""
        return self._value_ in _BY_ROUTER  # by value: an Enum's hash is a Python function

    @property
    def while_connecting(self) -> str:
        """The `reason=` of the CONNECT_FAILED line of a connection the router closed before its
        connect to the target completed."""
        return f"closed by the router: {self.value}"


_BY_ROUTER = frozenset(
    {"connection_ttl", "target_not_ready", "failover", "shutdown", "evacuated", "target_removed"}
)


class OpeningFailure(enum.Enum):
    """Why a client was closed before its opening was complete."""

    REJECTED = "rejected"
    """Its bytes are not an opening the acceptor accepts (unknown protocol, malformed, over the cap)."""
    TIMEOUT = "timeout"
    """The acceptor's handshake deadline passed."""
    TLS = "tls"
    """The TLS handshake with the router failed."""


class ConnectFailure(enum.Enum):
    """Why the connection to a target could not be opened: the `reason` label of
    `router_target_connect_failures_total` (a closed set; the event's `reason` is the system's
    text)."""

    REFUSED = "refused"
    TIMEOUT = "timeout"
    """The connect deadline passed, or the system's connect timed out."""
    UNREACHABLE = "unreachable"
    RESET = "reset"
    LOCAL_SHORTAGE = "local_shortage"
    """This host ran short (descriptors, memory, buffers, ephemeral ports): says nothing about the
    target."""
    CLOSED_BY_ROUTER = "closed_by_router"
    """The router closed the connection while it was connecting (shutdown, drain, ...)."""
    OTHER = "other"


class Mode(enum.Enum):
    """What the router does with a decided connection."""

    PROXY = "proxy"
    REDIRECT = "redirect"
    REFUSE = "refuse"


CONNECTION_IDS: Final = itertools.count(1)
"""`ConnectionRef.id`s: `next(CONNECTION_IDS)`, unique in the process (both data paths draw from
this one counter; `next` on a count is atomic under the GIL)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionRef:
    """Which connection an event is about."""

    id: int
    """Unique in the process (both data paths draw from one counter)."""
    router: str
    acceptor: str
    peer: Address
    """The TCP peer (the load balancer, behind a PROXY protocol header)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptRefused:
    """A new client connection was closed at accept, before anything was read: a limit of the
    process or of its acceptor (router/core/admission.py) was reached. It never got a reference."""

    router: str
    acceptor: str
    peer: Address
    refusal: Refusal
    limit: int
    """The limit that was reached (connections)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    """A client connection was accepted."""

    conn: ConnectionRef


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class OpeningFailed:
    """The client was closed during its opening."""

    conn: ConnectionRef
    failure: OpeningFailure
    protocol: str
    """The sniffer as far as known ("detect" before the first bytes decided, "proxy" for a PROXY
    protocol header, "tls" for TLS termination)."""
    detail: str = ""
    """What was wrong (REJECTED, TLS); never client bytes beyond a short quote."""
    bytes_read: int = 0
    timeout_s: float = 0.0
    """The deadline that passed (TIMEOUT)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NotAuthorized:
    """The router's own authentication refused the client (answered in its protocol, closed)."""

    conn: ConnectionRef
    reason: str
    """Why; never a password."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Decided:
    """The routing decision of a connection and what the router does with it."""

    conn: ConnectionRef
    key: str
    """The key after filter and transform."""
    status: RouteStatus
    """What the client gets (a decision for an unreachable local target is REFUSED_USE_ANOTHER)."""
    reason: DecisionReason
    mode: Mode
    node_id: str | None = None
    """The target (PROXY, REDIRECT)."""
    local: bool = False
    """Whether the target is the local target."""
    protocol: WireProtocol | None = None
    """The client's protocol, when its opening was read."""
    facts: ConnectionFacts | None = None
    """What the key came from (the event log's raw key)."""
    source: Address | None = None
    """The client (the address a PROXY protocol header names); None: the TCP peer."""
    latency_s: float = 0.0
    """From the complete opening to the decision, a quorum wait included."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Connected:
    """The connection to the target is open; relaying starts."""

    conn: ConnectionRef
    key: str
    node_id: str
    address: Address
    """The member connected to (one member of an HA pair)."""
    connect_s: float
    """How long the connect took, from its start on the data path to its completion."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectFailed:
    """The connection to the chosen target could not be opened: the client goes on to another
    target (`redispatched_to`), or is refused in its protocol's words (an MQTT CONNACK "server
    unavailable"), or, when the router closed it meanwhile, closed."""

    conn: ConnectionRef
    key: str
    node_id: str
    address: Address
    reason: str
    """The system's reason (`Connection refused`, `timed out`)."""
    cause: ConnectFailure
    redispatched_to: str | None = None
    """The node id of the ready target tried next (once per connection), if any."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Closed:
    """A proxied connection (one that was `Connected`) ended."""

    conn: ConnectionRef
    node_id: str
    bytes_in: int
    """Client -> target."""
    bytes_out: int
    """Target -> client."""
    duration_s: float
    """From Connected to the end."""
    reason: CloseReason
    detail: str = ""
    """More about REPLAY_FAILED or INTERNAL_ERROR."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionsClosed:
    """The router closed the proxied connections of one target (or of one member of its HA pair)
    at once; each also ends with its own `Closed`."""

    router: str
    node_id: str | None
    """The target; None for all of the router's connections (shutdown)."""
    address: Address | None
    """The member whose connections were closed (failover), or None for all of the target's."""
    reason: CloseReason
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LookedUp:
    """A management lookup (SPEC A7) through the admin API."""

    router: str
    key: str
    status: RouteStatus


class GateOutcome(enum.Enum):
    """How a connection's wait at its target's gate ended (router/runtime/gates.py); the value is
    what the log line prints."""

    ADMITTED = "admitted"
    QUEUE_FULL = "queue full"
    """The target's queue was full (or it has none): refused at once."""
    QUEUE_TIMEOUT = "queue timeout"
    """It waited the target's `queueTimeout` without a slot or a connect token: refused."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """A connection its target's gate (`maxConnections`, `connectRate`, pools/gates.py) did not let
    through at once: let in after waiting, or refused in its protocol's words."""

    conn: ConnectionRef
    key: str
    node_id: str
    outcome: GateOutcome
    waited_s: float
    """From the gate's first answer to the outcome (0 for a full queue)."""
    moved_to: str | None = None
    """Held back, the ready target it went to instead (its router's policy lets the key move);
    None: refused (or let in)."""


ConnectionEvent: TypeAlias = (
    Accepted | OpeningFailed | NotAuthorized | Decided | Held | Connected | ConnectFailed | Closed
)
"""What happened to one client connection."""

Event: TypeAlias = "ConnectionEvent | AcceptRefused | ConnectionsClosed | LookedUp | PoolEvent"
"""Everything a router reports."""

Subscriber: TypeAlias = Callable[["Event"], None]
"""A consumer of events; called in the reporting thread, must be quick and thread-safe."""
