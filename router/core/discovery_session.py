"""One router's ZooKeeper discovery: its session and its readings of the members, as transition tables.

Rule 1 (as in h11's `_state.py`): everything that changes this state lives in this file.
`router/features/discovery/service.py` waits for kazoo's reports, feeds each one in here with
`DiscoveryState.handle`, reads the members when `reading_due` says so, feeds the reading's outcome
in too, and turns each `Note` into its log line. No I/O, no clock and no logging here: "ZooKeeper
has not answered within the session timeout since the start" is an input (`Signal.NO_ANSWER`),
which the I/O side feeds while `awaiting_answer` holds and the timeout has passed.

The state has three parts, each changed by its own inputs:

- the session (`SessionState`, changed by `Session` reports and `Signal`s; `_SESSION_TRANSITIONS`
  lists every pair). STARTING and UNANSWERED have never been connected; UNANSWERED comes after
  the one warning that ZooKeeper does not answer. Each transition gives at most one note, so each
  is logged once; a report of nothing new gives none (CONNECTED while connected aside, which
  reads again). Connecting reads the members (every connection reads everything again, which also
  covers changes missed while disconnected), and so does a watch firing while connected.
- whether a reading is due (`reading_due`): set by the transitions marked `read`, kept while
  CONNECTED until the reading's outcome comes in (so any number of reports handled before the
  reading starts make one reading), and dropped on leaving CONNECTED (the next connection reads
  again anyway). So a reading that failed is retried on the next session change or watch.
- what the readings found (`GroupPath`, changed by `Read` outcomes; `_READING_TRANSITIONS` lists
  every pair) and the message of the last failed reading (`problem`): becoming MISSING is noted
  (once per transition into it); a failed reading changes no `GroupPath` and is noted unless the
  last reading failed with the same message; a successful one clears `problem`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CannotRead",
    "DiscoveryInput",
    "DiscoveryState",
    "GroupPath",
    "Note",
    "Read",
    "ReadFailed",
    "Session",
    "SessionState",
    "Signal",
    "Step",
]


class Session(enum.Enum):
    """The state of a client's ZooKeeper session, as kazoo reports it."""

    CONNECTED = "connected"
    """Connected, with a valid session (new or resumed)."""
    SUSPENDED = "suspended"
    """The connection dropped; the session may still be alive and resume."""
    LOST = "lost"
    """The session expired or was closed: its ephemeral znodes and watches are gone."""


class Signal(enum.Enum):
    """Inputs other than session reports and readings."""

    WATCH_FIRED = "watch-fired"
    """A watch set by a reading fired: the children or a child's data changed (or the connection
    dropped, which fires every watch)."""
    NO_ANSWER = "no-answer"
    """ZooKeeper has not answered within the session timeout since the start."""


class Read(enum.Enum):
    """The outcome of a reading that worked."""

    MEMBERS = "members"
    """The children of the group's path were read (there may be none)."""
    PATH_MISSING = "path-missing"
    """The group's path does not exist (a watch waits for it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadFailed:
    """The outcome of a reading that failed (connection lost, session expired, timeout, …)."""

    message: str
    """What failed, as the I/O side logs it."""


DiscoveryInput = Session | Signal | Read | ReadFailed
"""Everything `DiscoveryState.handle` takes."""


class SessionState(enum.Enum):
    """The session as this router remembers it (see the module docstring)."""

    STARTING = "starting"
    """Never connected; the warning that ZooKeeper does not answer is still to come."""
    UNANSWERED = "unanswered"
    """Never connected, and that warning was given."""
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class GroupPath(enum.Enum):
    """What the readings found at the discovery group's path."""

    UNREAD = "unread"
    """No reading has worked yet."""
    PRESENT = "present"
    """The last reading that worked found the path (with or without children)."""
    MISSING = "missing"
    """The last reading that worked found no such path."""


class Note(enum.Enum):
    """Something to log (the I/O side owns the words; `router/features/discovery/service.py`)."""

    CONNECTED = "connected"
    """Connected for the first time: reading the members."""
    CONNECTED_AGAIN = "connected-again"
    """Connected after a loss of the connection or of the session: reading the members again."""
    CONNECTION_LOST = "connection-lost"
    """The connection dropped: the last members are kept (and probed) until it is back."""
    SESSION_LOST = "session-lost"
    """The session expired or was closed: the last members are kept until a new session reads."""
    NO_ANSWER = "no-answer"
    """ZooKeeper did not answer within the session timeout since the start (said once)."""
    PATH_MISSING = "path-missing"
    """The group's path does not exist: no members until it is created."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CannotRead:
    """A note: a reading failed, with a message other than the last failure's."""

    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    """One transition of the session table."""

    state: SessionState
    note: Note | None = None
    read: bool = False
    """Whether a reading is due from now on."""


_SESSION_TRANSITIONS: Final[Mapping[SessionState, Mapping[Session | Signal, _Row]]] = {
    # kazoo reports changes only (`KazooClient._make_state_change` skips the state it is in), and
    # neither SUSPENDED nor LOST before the first connection (its state starts at LOST, and it
    # skips CONNECTING from its initial CLOSED). The rows for reports it does not make change
    # nothing, except CONNECTED while connected, which reads again like any connection (the safe
    # side).
    SessionState.STARTING: {
        Session.CONNECTED: _Row(state=SessionState.CONNECTED, note=Note.CONNECTED, read=True),
        Session.SUSPENDED: _Row(state=SessionState.STARTING),
        Session.LOST: _Row(state=SessionState.STARTING),
        Signal.WATCH_FIRED: _Row(state=SessionState.STARTING),  # no reading set a watch yet
        Signal.NO_ANSWER: _Row(state=SessionState.UNANSWERED, note=Note.NO_ANSWER),
    },
    SessionState.UNANSWERED: {
        Session.CONNECTED: _Row(state=SessionState.CONNECTED, note=Note.CONNECTED, read=True),
        Session.SUSPENDED: _Row(state=SessionState.UNANSWERED),
        Session.LOST: _Row(state=SessionState.UNANSWERED),
        Signal.WATCH_FIRED: _Row(state=SessionState.UNANSWERED),
        Signal.NO_ANSWER: _Row(state=SessionState.UNANSWERED),  # said once
    },
    SessionState.CONNECTED: {
        Session.CONNECTED: _Row(state=SessionState.CONNECTED, note=Note.CONNECTED_AGAIN, read=True),
        Session.SUSPENDED: _Row(state=SessionState.SUSPENDED, note=Note.CONNECTION_LOST),
        Session.LOST: _Row(state=SessionState.LOST, note=Note.SESSION_LOST),
        Signal.WATCH_FIRED: _Row(state=SessionState.CONNECTED, read=True),
        Signal.NO_ANSWER: _Row(state=SessionState.CONNECTED),  # it has answered
    },
    SessionState.SUSPENDED: {
        Session.CONNECTED: _Row(state=SessionState.CONNECTED, note=Note.CONNECTED_AGAIN, read=True),
        Session.SUSPENDED: _Row(state=SessionState.SUSPENDED),
        Session.LOST: _Row(state=SessionState.LOST, note=Note.SESSION_LOST),
        Signal.WATCH_FIRED: _Row(state=SessionState.SUSPENDED),  # the next connection reads everything
        Signal.NO_ANSWER: _Row(state=SessionState.SUSPENDED),
    },
    SessionState.LOST: {
        Session.CONNECTED: _Row(state=SessionState.CONNECTED, note=Note.CONNECTED_AGAIN, read=True),
        Session.SUSPENDED: _Row(state=SessionState.LOST),  # no session, no connection to lose
        Session.LOST: _Row(state=SessionState.LOST),
        Signal.WATCH_FIRED: _Row(state=SessionState.LOST),  # a new session reads everything
        Signal.NO_ANSWER: _Row(state=SessionState.LOST),
    },
}

_READING_TRANSITIONS: Final[Mapping[GroupPath, Mapping[Read, tuple[GroupPath, Note | None]]]] = {
    # A failed reading (`ReadFailed`) leaves every GroupPath as it is (see `_handle_reading`).
    GroupPath.UNREAD: {
        Read.MEMBERS: (GroupPath.PRESENT, None),
        Read.PATH_MISSING: (GroupPath.MISSING, Note.PATH_MISSING),
    },
    GroupPath.PRESENT: {
        Read.MEMBERS: (GroupPath.PRESENT, None),
        Read.PATH_MISSING: (GroupPath.MISSING, Note.PATH_MISSING),
    },
    GroupPath.MISSING: {
        Read.MEMBERS: (GroupPath.PRESENT, None),
        Read.PATH_MISSING: (GroupPath.MISSING, None),
    },
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """What one input did: the new state and what to log."""

    state: DiscoveryState
    note: Note | CannotRead | None = None
    """At most one note per input; None when there is nothing to log."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryState:
    """One router's discovery session and readings (immutable: `handle` returns the next one).

    The default is the state at the start: not connected yet, nothing read.
    """

    session: SessionState = SessionState.STARTING
    reading_due: bool = False
    """Whether the members are to be read now (after the reports at hand are handled); then the
    reading's outcome is the next input about readings."""
    path: GroupPath = GroupPath.UNREAD
    problem: str | None = None
    """The message of the last reading, if it failed."""

    def __post_init__(self) -> None:
        if self.reading_due and self.session is not SessionState.CONNECTED:
            raise ValueError(f"a reading is due only while connected, not {self.session.value!r}")

    @property
    def awaiting_answer(self) -> bool:
        """Whether `Signal.NO_ANSWER` still means something: never connected, not warned yet."""
        return self.session is SessionState.STARTING

    def handle(self, event: DiscoveryInput) -> Step:
        """The state after `event`, and what to log about it.

        Args:
            event: a session report, a signal, or the outcome of the reading that was due.

        Returns:
            The next state and at most one note.

        Raises:
            ValueError: a reading's outcome came in while no reading was due.
        """
        if isinstance(event, Session | Signal):
            return self._handle_session(event)
        if not self.reading_due:
            raise ValueError(f"no reading is due, yet its outcome came in: {event!r}")
        return self._handle_reading(event)

    def _handle_session(self, event: Session | Signal) -> Step:
        row = _SESSION_TRANSITIONS[self.session][event]
        due = row.state is SessionState.CONNECTED and (row.read or self.reading_due)
        return Step(state=replace(self, session=row.state, reading_due=due), note=row.note)

    def _handle_reading(self, outcome: Read | ReadFailed) -> Step:
        if isinstance(outcome, ReadFailed):
            note = None if outcome.message == self.problem else CannotRead(message=outcome.message)
            return Step(state=replace(self, reading_due=False, problem=outcome.message), note=note)
        path, path_note = _READING_TRANSITIONS[self.path][outcome]
        return Step(state=replace(self, reading_due=False, path=path, problem=None), note=path_note)
