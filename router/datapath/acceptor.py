"""What the connections of one acceptor share, on either data path: its configuration, its router,
protocol detection, TLS termination, the user store, the connection TTL in force, the phase
deadlines, and the process's admission (limits on open connections). Built once per acceptor by
the server."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.core.address import Address
from router.core.admission import Admission
from router.core.events import AcceptRefused

if TYPE_CHECKING:
    import ssl

    from keys.detect import Detector
    from keys.users import UserStore
    from pools.gates import AcceptRate
    from router.config.settings import AcceptorConfig
    from router.core.admission import Refusal
    from router.runtime import RouterRuntime

__all__ = ["ConnectionLimits", "Pending", "ServedAcceptor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """Deadlines of the phases of one connection (fixed in this release)."""

    route_timeout_s: float = 10.0
    """Upper bound of the routing phase (the quorum wait is bounded by quorum-timeout first)."""
    connect_timeout_s: float = 5.0
    """Deadline of the connect to the chosen target (HAProxy's usual `timeout connect 5s`), and of
    the target's answer to a replayed server-first opening."""


class Pending:
    """Connections of one acceptor the trio path holds that have no decision yet: reading their
    opening, authenticating, waiting for the quorum (those the fast path hands over to wait
    included). Changed and read in the trio thread only, once per connection: no lock, no cost per
    byte. The fast path's own undecided connections are `FastPath.pending_by_acceptor`."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedAcceptor:
    """One acceptor as the data paths serve it."""

    config: AcceptorConfig
    runtime: RouterRuntime
    """The router its connections go through."""
    detect: Detector
    """Detection of the first bytes (TLS included, for SNI peeking on passthrough)."""
    detect_inner: Detector
    """Detection inside TLS terminated by the router."""
    tls: ssl.SSLContext | None = None
    """The server context when the acceptor terminates TLS."""
    users: UserStore | None = None
    """The acceptor's user/role store for the router's own authentication."""
    connection_ttl_ms: int = -1
    """The connection TTL in force on the acceptor (`<connection-ttl-override>` applied); -1 = none."""
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    admission: Admission = field(default_factory=lambda: Admission(sys.maxsize))
    """Shared by every acceptor of the process (the default, for tests: no limits)."""
    pending: Pending = field(default_factory=Pending)
    """Its trio-path connections without a decision yet (the status resource shows them)."""
    accept_rate: AcceptRate | None = None
    """Its `connectionRate`: the data path serving it pauses accepting while it is used up."""

    @property
    def name(self) -> str:
        return self.config.name

    def admit(self, peer: Address) -> bool:
        """Count a new connection from `peer`, or report why it is refused (close it then).
        An admitted connection is `release`d by whoever closes its client socket."""
        return self.admit_from(peer.host, peer.port)

    def admit_from(self, host: str, port: int) -> bool:
        """`admit` for a peer given as its host and port (no `Address` made unless refused)."""
        refusal = self.admission.admit(self.config.name, host)
        if refusal is None:
            return True
        self.refused(host, port, refusal)
        return False

    def refused(self, host: str, port: int, refusal: Refusal) -> None:
        """Report a peer the admission refused (`admit_from`'s, or a caller's own `admit`)."""
        name = self.config.name
        limit = self.admission.limit(name, refusal)
        refused = AcceptRefused(
            router=self.runtime.name, acceptor=name, peer=Address(host, port), refusal=refusal, limit=limit
        )
        self.runtime.report(refused)

    def release(self, peer: Address) -> None:
        """A connection `admit` let in has ended (its client socket is closed)."""
        self.admission.release(self.config.name, peer.host)
