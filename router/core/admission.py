"""Admission: whether a newly accepted client connection may be served, by the process's
descriptor budget and its acceptor's limits. Bookkeeping only: no I/O, no clock.

Every client connection costs descriptors (its own, and its target's while proxied); when the
process runs out, nothing works any more: health probes fail locally, the admin API cannot answer,
accept() spins. So the router refuses new connections *before* the budget is spent, and never
closes an established connection because of a new one (HAProxy's `maxconn`, nginx's `limit_conn`
are the models):

- `budget`: client connections of the whole process at once (`descriptor_budget`);
- an acceptor's `connectionsAllowed`;
- an acceptor's `connectionsAllowedPerSource`, per TCP peer address.

A connection counts from `admit` until its `release`, whatever it became (refused, redirected,
proxied, or closed during its opening). Both data paths admit and release from their own threads,
so `Admission` takes its own lock (a few dict operations under it).
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DESCRIPTOR_RESERVE",
    "START_SLACK",
    "AcceptorLimits",
    "Admission",
    "Refusal",
    "descriptor_budget",
    "descriptors_for",
]

DESCRIPTOR_RESERVE: Final = 64
"""Descriptors kept back from clients besides the measured ones (`descriptor_budget`): log files,
ZooKeeper sessions, DNS lookups, the admin API's connections, a refused connection's own
descriptor between accept and close."""

_PER_CONNECTION: Final = 2
"""Descriptors of one proxied connection: the client's and the target's."""


class Refusal(enum.Enum):
    """Why a new connection was closed at accept; the value is the metric label."""

    DESCRIPTOR_BUDGET = "descriptor_budget"
    ACCEPTOR_LIMIT = "acceptor_limit"
    SOURCE_LIMIT = "source_limit"

    @property
    def parameter(self) -> str:
        """The limit as an operator configures it, for the log line."""
        match self:
            case Refusal.DESCRIPTOR_BUDGET:
                return "the descriptor budget"
            case Refusal.ACCEPTOR_LIMIT:
                return "connectionsAllowed"
            case Refusal.SOURCE_LIMIT:
                return "connectionsAllowedPerSource"


_BUDGET: Final = Refusal.DESCRIPTOR_BUDGET
_ACCEPTOR_LIMIT: Final = Refusal.ACCEPTOR_LIMIT
_SOURCE_LIMIT: Final = Refusal.SOURCE_LIMIT
"""`admit`'s answers, looked up once (an enum class's attribute costs a hook in Python 3.11)."""


START_SLACK: Final = 256
"""Descriptors `descriptors_for` allows for what is open when the router starts serving and its
probes (measured when it starts: about 20 plus one per probed member)."""


def descriptors_for(connections: int) -> int:
    """The descriptor limit a process needs to serve `connections` clients at once (the inverse of
    `descriptor_budget`, with `START_SLACK` for what it measures at start)."""
    return connections * _PER_CONNECTION + DESCRIPTOR_RESERVE + START_SLACK


def descriptor_budget(limit: int, in_use: int, probes: int) -> int:
    """Client connections a process may hold at once.

    Args:
        limit: its descriptor limit (soft RLIMIT_NOFILE, after raising it to the hard one).
        in_use: descriptors open when it starts serving (listeners, the epoll set, logs, ...).
        probes: health probes that may run at once (one descriptor each).

    Returns:
        What is left after `in_use`, `probes` and `DESCRIPTOR_RESERVE`, over two descriptors a
        connection; at least 1.
    """
    return max(1, (limit - in_use - probes - DESCRIPTOR_RESERVE) // _PER_CONNECTION)


@dataclass(frozen=True, slots=True)
class AcceptorLimits:
    """An acceptor's own limits; -1 = none."""

    connections: int = -1
    per_source: int = -1


class Admission:
    """Counts the open client connections of a process, by acceptor and source address."""

    __slots__ = ("_by_acceptor", "_by_source", "_limits", "_lock", "budget", "open")

    def __init__(self, budget: int, limits: dict[str, AcceptorLimits] | None = None) -> None:
        """Args:
        budget: client connections of the whole process at once (`descriptor_budget`).
        limits: each acceptor's limits by name (none given: no limits of their own).
        """
        self.budget = budget
        self.open = 0
        """Client connections admitted and not yet released."""
        self._limits = dict(limits or {})
        self._by_acceptor: dict[str, int] = {}
        """Acceptor -> open connections (every acceptor: the status resource shows them)."""
        self._by_source: dict[tuple[str, str], int] = {}
        """(acceptor, source host) -> open connections, for acceptors with a per-source limit."""
        self._lock = threading.Lock()

    def admit(self, acceptor: str, source: str) -> Refusal | None:
        """Count a new connection of `acceptor` from `source` (a host), or say which limit it meets.

        Returns:
            None when admitted (release it when it ends); the refusal otherwise (nothing counted).
        """
        limits = self._limits.get(acceptor)
        lock = self._lock
        lock.acquire()  # not `with`: every connection's (its __enter__ and __exit__ looked up)
        try:
            if self.open >= self.budget:
                return _BUDGET
            on_acceptor = self._by_acceptor.get(acceptor, 0)
            if limits is not None:
                if 0 <= limits.connections <= on_acceptor:
                    return _ACCEPTOR_LIMIT
                if limits.per_source >= 0:
                    key = (acceptor, source)
                    from_source = self._by_source.get(key, 0)
                    if from_source >= limits.per_source:
                        return _SOURCE_LIMIT
                    self._by_source[key] = from_source + 1
            self._by_acceptor[acceptor] = on_acceptor + 1
            self.open += 1
        finally:
            lock.release()
        return None

    def limit(self, acceptor: str, refusal: Refusal) -> int:
        """The number of connections the limit behind `refusal` allows (for its report)."""
        limits = self._limits.get(acceptor, AcceptorLimits())
        match refusal:
            case Refusal.DESCRIPTOR_BUDGET:
                return self.budget
            case Refusal.ACCEPTOR_LIMIT:
                return limits.connections
            case Refusal.SOURCE_LIMIT:
                return limits.per_source

    def release(self, acceptor: str, source: str) -> None:
        """A connection `admit` counted has ended."""
        with self._lock:
            self._release(acceptor, source)

    def release_many(self, acceptor: str, sources: Sequence[str]) -> None:
        """Connections of one acceptor `admit` counted have ended (their source hosts), under one
        lock."""
        limits = self._limits.get(acceptor)
        with self._lock:
            if limits is not None and limits.per_source >= 0:
                for source in sources:
                    self._release(acceptor, source)
                return
            self.open -= len(sources)
            self._by_acceptor[acceptor] = max(0, self._by_acceptor.get(acceptor, 0) - len(sources))

    def _release(self, acceptor: str, source: str) -> None:
        self.open -= 1
        # .get and not below 0: a reload may have changed the acceptor meanwhile.
        self._by_acceptor[acceptor] = max(0, self._by_acceptor.get(acceptor, 0) - 1)
        limits = self._limits.get(acceptor)
        if limits is not None and limits.per_source >= 0:
            key = (acceptor, source)
            left = self._by_source.get(key, 0) - 1
            if left > 0:
                self._by_source[key] = left
            else:  # sources come and go: keep only those with connections
                self._by_source.pop(key, None)

    def set_limits(self, acceptor: str, limits: AcceptorLimits | None) -> None:
        """A configuration reload changed an acceptor's limits (None: it has none now). Connections
        open now stay and are still counted on the acceptor; an acceptor that had no limits did
        not count its connections by source: that count starts from here."""
        with self._lock:
            if limits is None:
                self._limits.pop(acceptor, None)
            else:
                self._limits[acceptor] = limits
            if limits is None or limits.per_source < 0:  # not counted by source from here on
                for key in [k for k in self._by_source if k[0] == acceptor]:
                    del self._by_source[key]

    def open_on(self, acceptor: str) -> int:
        """Open connections of an acceptor: admitted and not released yet."""
        with self._lock:
            return self._by_acceptor.get(acceptor, 0)

    def open_by_acceptor(self) -> dict[str, int]:
        """Open connections of each acceptor that has had any, at one moment."""
        with self._lock:
            return dict(self._by_acceptor)
