"""A ZooKeeper session's state as the router shows it and acts on it: kazoo's reports, and whether
ZooKeeper answers. Pure: no I/O, no clock (every `now` is an argument, monotonic seconds), no logging.

kazoo notices a frozen server (a process stopped, a hung JVM: the TCP connection stays up, nothing
is answered) late or never: its requests count as its pings, so while a router keeps asking (the
shared cache's decisions, its touch loop) kazoo never sends the ping whose silence would drop the
connection, and its session stays CONNECTED while every request waits. So the I/O side
(`router/services/zookeeper.py`, `SessionWatch`) also asks ZooKeeper a cheap question, a
heartbeat, every `heartbeat_interval_s` while kazoo says CONNECTED, and feeds in when it asked and
what came back. Rule 1 (as in h11's `_state.py`): everything that changes this state lives here.

The state (`LinkState`), decided by `_derive` from the facts, first rule that applies:

1. no report from kazoo yet: CONNECTING;
2. kazoo reported LOST (the server said the session expired): LOST;
3. not connected (kazoo SUSPENDED, or a heartbeat unanswered for `answer_timeout_s`) and nothing
   heard from ZooKeeper (an answer, a connection) for `session_timeout_s`: LOST, as ZooKeeper
   itself would decide: the server expires a session it has not heard from within its timeout
   (ZooKeeper Programmer's Guide, "ZooKeeper Sessions"; Curator's client does the same);
4. kazoo reported SUSPENDED (the connection dropped): SUSPENDED;
5. a heartbeat unanswered for `answer_timeout_s` (frozen; at most two thirds of the session
   timeout, so suspended comes before lost): SUSPENDED;
6. otherwise CONNECTED.

Each change of `state` is reported once (`LinkStep.changed`), with its cause when the link
noticed it rather than kazoo (`LinkStep.cause`), so each is logged once however many requests
wait. Only the latest heartbeat's outcome counts; one at a time is outstanding.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Final

from router.core.discovery_session import Session

__all__ = [
    "ANSWER_TIMEOUT_SHARE",
    "HEARTBEATS_PER_ANSWER_TIMEOUT",
    "LinkCause",
    "LinkState",
    "LinkStep",
    "ZooKeeperLink",
]

HEARTBEATS_PER_ANSWER_TIMEOUT: Final = 4
"""Heartbeats are asked every answer timeout / 4, so a freeze is noticed within 1.25 answer
timeouts (a quarter to ask, then the answer timeout): 2.5 s with the default answer timeout of
2 s (`ZooKeeperConfig.answer_timeout_ms`), two reads a second."""

ANSWER_TIMEOUT_SHARE: Final = 2 / 3
"""The answer timeout is at most this share of the session timeout: the ZooKeeper Java client's
own read timeout (`ClientCnxn`: two thirds of the negotiated session timeout; kazoo's too)."""


class LinkState(enum.Enum):
    """A ZooKeeper session as status and metrics show it (`router_zookeeper_state`)."""

    CONNECTING = "connecting"
    """Not connected yet since the start."""
    CONNECTED = "connected"
    """Connected, and ZooKeeper answers."""
    SUSPENDED = "suspended"
    """The connection dropped, or ZooKeeper does not answer: the session may still live."""
    LOST = "lost"
    """The session expired (ZooKeeper said so, or nothing was heard for the session timeout)."""


class LinkCause(enum.Enum):
    """Why the state changed when kazoo did not say so (a kazoo report is its own cause)."""

    UNANSWERED = "unanswered"
    """Suspended while kazoo says CONNECTED: a heartbeat unanswered for the answer timeout."""
    NOTHING_HEARD = "nothing_heard"
    """Lost before kazoo said so: nothing heard for the session timeout."""
    ANSWERS_AGAIN = "answers_again"
    """Connected again on the same connection: a heartbeat answered after all."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkStep:
    """What one input did: the new link, the state it changed to (None: unchanged), and why when
    kazoo did not report the change itself (None: it did, or nothing changed)."""

    link: ZooKeeperLink
    changed: LinkState | None = None
    cause: LinkCause | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooKeeperLink:
    """One ZooKeeper session's facts and state (immutable: each input returns the next one).

    Make one with `start`.
    """

    answer_timeout_s: float
    """A heartbeat unanswered this long means suspended."""
    session_timeout_s: float
    """Nothing heard this long while not connected means lost."""
    state: LinkState = LinkState.CONNECTING
    since: float
    """When `state` last changed (at the start: the start)."""
    reported: Session | None = None
    """kazoo's last report; None before any."""
    heard_at: float | None = None
    """When ZooKeeper last answered a heartbeat or kazoo last reported CONNECTED; None: never."""
    asked: int = 0
    """The number of the last heartbeat asked (its answer must carry it)."""
    asked_at: float | None = None
    """When the last heartbeat was asked; None: none yet."""
    waiting_since: float | None = None
    """When the heartbeat now outstanding was asked; None: none is."""

    def __post_init__(self) -> None:
        if not (self.answer_timeout_s > 0 and math.isfinite(self.answer_timeout_s)):
            raise ValueError(f"answer timeout must be a finite number > 0, got {self.answer_timeout_s!r}")
        if not (self.session_timeout_s > 0 and math.isfinite(self.session_timeout_s)):
            raise ValueError(f"session timeout must be a finite number > 0, got {self.session_timeout_s!r}")

    @classmethod
    def start(cls, *, answer_timeout_ms: int, session_timeout_ms: int, now: float) -> ZooKeeperLink:
        """The link of a client that starts connecting at `now`.

        The answer timeout is at most `ANSWER_TIMEOUT_SHARE` of the session timeout, so that a
        session is suspended before it is lost.
        """
        session_s = session_timeout_ms / 1000
        answer_s = min(answer_timeout_ms / 1000, session_s * ANSWER_TIMEOUT_SHARE)
        return cls(answer_timeout_s=answer_s, session_timeout_s=session_s, since=now)

    @property
    def heartbeat_interval_s(self) -> float:
        """How often a heartbeat is asked while kazoo says CONNECTED (`HEARTBEATS_PER_ANSWER_TIMEOUT`)."""
        return self.answer_timeout_s / HEARTBEATS_PER_ANSWER_TIMEOUT

    def heartbeat_due(self, now: float) -> bool:
        """Whether to ask a heartbeat now: kazoo says CONNECTED, none is outstanding, and the
        interval since the last one has passed."""
        return (
            self.reported is Session.CONNECTED
            and self.waiting_since is None
            and (self.asked_at is None or now >= self.asked_at + self.heartbeat_interval_s)
        )

    def wake_at(self) -> float:
        """The next time at which `tick` or `heartbeat_due` may say something new (inf: none
        until the next input)."""
        times = [math.inf]
        if self.reported is Session.CONNECTED and self.waiting_since is None:
            times.append(-math.inf if self.asked_at is None else self.asked_at + self.heartbeat_interval_s)
        if self.waiting_since is not None and self.state is LinkState.CONNECTED:
            times.append(self.waiting_since + self.answer_timeout_s)
        if self.heard_at is not None and self.state is LinkState.SUSPENDED:
            times.append(self.heard_at + self.session_timeout_s)
        return min(times)

    def report(self, session: Session, now: float) -> LinkStep:
        """kazoo reported a session change. Any heartbeat outstanding is forgotten (kazoo fails
        the requests of a dropped connection; a new connection answers the next one)."""
        heard = now if session is Session.CONNECTED else self.heard_at
        return self._next(replace(self, reported=session, heard_at=heard, waiting_since=None), now)

    def ask(self, now: float) -> tuple[ZooKeeperLink, int]:
        """A heartbeat is asked now: the link, and the number its answer must carry."""
        number = self.asked + 1
        return replace(self, asked=number, asked_at=now, waiting_since=now), number

    def answered(self, number: int, *, ok: bool, now: float) -> LinkStep:
        """Heartbeat `number` came back: answered by ZooKeeper (`ok`), or failed by kazoo (not
        an answer: the connection dropped; kazoo reports that too). An older heartbeat's outcome
        changes nothing."""
        if number != self.asked or self.waiting_since is None:
            return LinkStep(link=self)
        heard = now if ok else self.heard_at
        return self._next(replace(self, heard_at=heard, waiting_since=None), now)

    def tick(self, now: float) -> LinkStep:
        """Time passed: the state at `now` (a heartbeat's deadline, or the session timeout)."""
        return self._next(self, now)

    def _derive(self, now: float) -> LinkState:
        if self.reported is None:
            return LinkState.CONNECTING
        if self.reported is Session.LOST:
            return LinkState.LOST
        frozen = self.waiting_since is not None and now - self.waiting_since >= self.answer_timeout_s
        not_connected = self.reported is Session.SUSPENDED or frozen
        if not_connected and self.heard_at is not None and now - self.heard_at >= self.session_timeout_s:
            return LinkState.LOST
        return LinkState.SUSPENDED if not_connected else LinkState.CONNECTED

    def _next(self, link: ZooKeeperLink, now: float) -> LinkStep:
        """`link` (this link after an input) at `now`."""
        state = link._derive(now)
        if state is link.state:
            return LinkStep(link=link)
        cause = None
        if state is LinkState.SUSPENDED and link.reported is Session.CONNECTED:
            cause = LinkCause.UNANSWERED
        elif state is LinkState.LOST and link.reported is not Session.LOST:
            cause = LinkCause.NOTHING_HEARD
        elif state is LinkState.CONNECTED and self.reported is Session.CONNECTED:
            cause = LinkCause.ANSWERS_AGAIN
        return LinkStep(link=replace(link, state=state, since=now), changed=state, cause=cause)
