"""router/core/discovery_session.py: every row of the session and reading tables, written out here
again (not read from the module) so that a changed row fails a test."""

from __future__ import annotations

import itertools

import pytest

from router.core.discovery_session import (
    CannotRead,
    DiscoveryInput,
    DiscoveryState,
    GroupPath,
    Note,
    Read,
    ReadFailed,
    Session,
    SessionState,
    Signal,
    Step,
)

S = SessionState

SESSION_ROWS = [
    # (state, input, next state, note, whether a reading is due afterwards)
    (S.STARTING, Session.CONNECTED, S.CONNECTED, Note.CONNECTED, True),
    (S.STARTING, Session.SUSPENDED, S.STARTING, None, False),
    (S.STARTING, Session.LOST, S.STARTING, None, False),
    (S.STARTING, Signal.WATCH_FIRED, S.STARTING, None, False),
    (S.STARTING, Signal.NO_ANSWER, S.UNANSWERED, Note.NO_ANSWER, False),
    (S.UNANSWERED, Session.CONNECTED, S.CONNECTED, Note.CONNECTED, True),
    (S.UNANSWERED, Session.SUSPENDED, S.UNANSWERED, None, False),
    (S.UNANSWERED, Session.LOST, S.UNANSWERED, None, False),
    (S.UNANSWERED, Signal.WATCH_FIRED, S.UNANSWERED, None, False),
    (S.UNANSWERED, Signal.NO_ANSWER, S.UNANSWERED, None, False),
    (S.CONNECTED, Session.CONNECTED, S.CONNECTED, Note.CONNECTED_AGAIN, True),
    (S.CONNECTED, Session.SUSPENDED, S.SUSPENDED, Note.CONNECTION_LOST, False),
    (S.CONNECTED, Session.LOST, S.LOST, Note.SESSION_LOST, False),
    (S.CONNECTED, Signal.WATCH_FIRED, S.CONNECTED, None, True),
    (S.CONNECTED, Signal.NO_ANSWER, S.CONNECTED, None, False),
    (S.SUSPENDED, Session.CONNECTED, S.CONNECTED, Note.CONNECTED_AGAIN, True),
    (S.SUSPENDED, Session.SUSPENDED, S.SUSPENDED, None, False),
    (S.SUSPENDED, Session.LOST, S.LOST, Note.SESSION_LOST, False),
    (S.SUSPENDED, Signal.WATCH_FIRED, S.SUSPENDED, None, False),
    (S.SUSPENDED, Signal.NO_ANSWER, S.SUSPENDED, None, False),
    (S.LOST, Session.CONNECTED, S.CONNECTED, Note.CONNECTED_AGAIN, True),
    (S.LOST, Session.SUSPENDED, S.LOST, None, False),
    (S.LOST, Session.LOST, S.LOST, None, False),
    (S.LOST, Signal.WATCH_FIRED, S.LOST, None, False),
    (S.LOST, Signal.NO_ANSWER, S.LOST, None, False),
]

READING_ROWS = [
    # (path before, outcome, path after, note)
    (GroupPath.UNREAD, Read.MEMBERS, GroupPath.PRESENT, None),
    (GroupPath.UNREAD, Read.PATH_MISSING, GroupPath.MISSING, Note.PATH_MISSING),
    (GroupPath.PRESENT, Read.MEMBERS, GroupPath.PRESENT, None),
    (GroupPath.PRESENT, Read.PATH_MISSING, GroupPath.MISSING, Note.PATH_MISSING),
    (GroupPath.MISSING, Read.MEMBERS, GroupPath.PRESENT, None),
    (GroupPath.MISSING, Read.PATH_MISSING, GroupPath.MISSING, None),
]


def _id(row: tuple[object, ...]) -> str:
    return "-".join(str(getattr(cell, "name", cell)) for cell in row[:2])


def _run(state: DiscoveryState, *events: DiscoveryInput) -> tuple[DiscoveryState, list[Note | CannotRead]]:
    notes: list[Note | CannotRead] = []
    for event in events:
        step = state.handle(event)
        state = step.state
        if step.note is not None:
            notes.append(step.note)
    return state, notes


def test_session_rows_cover_every_state_and_input() -> None:
    assert sorted((row[0].name, row[1].name) for row in SESSION_ROWS) == sorted(
        (state.name, event.name) for state, event in itertools.product(SessionState, [*Session, *Signal])
    )
    assert sorted((row[0].name, row[1].name) for row in READING_ROWS) == sorted(
        (path.name, outcome.name) for path, outcome in itertools.product(GroupPath, Read)
    )


@pytest.mark.parametrize(
    ("state", "event", "after", "note", "reads"), SESSION_ROWS, ids=map(_id, SESSION_ROWS)
)
def test_discovery_state_session_row(
    state: SessionState, event: Session | Signal, after: SessionState, note: Note | None, reads: bool
) -> None:
    before = DiscoveryState(session=state, path=GroupPath.MISSING, problem="p")
    step = before.handle(event)
    assert step == Step(
        state=DiscoveryState(session=after, reading_due=reads, path=GroupPath.MISSING, problem="p"),
        note=note,
    )


@pytest.mark.parametrize("event", [*Session, *Signal], ids=lambda event: str(event.name))
def test_discovery_state_due_reading_stays_due_while_connected(event: Session | Signal) -> None:
    """Scenario: reports handled before the due reading starts keep it due while connected (one
    reading for all of them) and drop it when the connection or the session goes."""
    step = DiscoveryState(session=SessionState.CONNECTED, reading_due=True).handle(event)
    assert step.state.reading_due is (step.state.session is SessionState.CONNECTED)


@pytest.mark.parametrize(("path", "outcome", "after", "note"), READING_ROWS, ids=map(_id, READING_ROWS))
@pytest.mark.parametrize("problem", [None, "read /p: ConnectionLoss"], ids=["ok-before", "failed-before"])
def test_discovery_state_reading_row(
    path: GroupPath, outcome: Read, after: GroupPath, note: Note | None, problem: str | None
) -> None:
    before = DiscoveryState(session=SessionState.CONNECTED, reading_due=True, path=path, problem=problem)
    assert before.handle(outcome) == Step(
        state=DiscoveryState(session=SessionState.CONNECTED, path=after, problem=None), note=note
    )


@pytest.mark.parametrize("path", list(GroupPath), ids=lambda path: str(path.name))
@pytest.mark.parametrize(
    ("problem", "message", "note"),
    [
        pytest.param(
            None, "read /p: ConnectionLoss", CannotRead(message="read /p: ConnectionLoss"), id="first"
        ),
        pytest.param("read /p: ConnectionLoss", "read /p: ConnectionLoss", None, id="same-again"),
        pytest.param(
            "read /p: ConnectionLoss",
            "read /p: SessionExpiredError",
            CannotRead(message="read /p: SessionExpiredError"),
            id="another",
        ),
    ],
)
def test_discovery_state_read_failed_row(
    path: GroupPath, problem: str | None, message: str, note: CannotRead | None
) -> None:
    before = DiscoveryState(session=SessionState.CONNECTED, reading_due=True, path=path, problem=problem)
    assert before.handle(ReadFailed(message=message)) == Step(
        state=DiscoveryState(session=SessionState.CONNECTED, path=path, problem=message), note=note
    )


def test_discovery_state_starts_awaiting_an_answer() -> None:
    state = DiscoveryState()
    assert (state.session, state.reading_due, state.path, state.problem) == (
        SessionState.STARTING,
        False,
        GroupPath.UNREAD,
        None,
    )
    assert [s for s in SessionState if DiscoveryState(session=s).awaiting_answer] == [SessionState.STARTING]


@pytest.mark.parametrize("outcome", [Read.MEMBERS, Read.PATH_MISSING, ReadFailed(message="x")], ids=str)
def test_discovery_state_outcome_without_a_due_reading_is_an_error(outcome: Read | ReadFailed) -> None:
    with pytest.raises(ValueError, match="no reading is due, yet its outcome came in"):
        DiscoveryState(session=SessionState.CONNECTED).handle(outcome)


@pytest.mark.parametrize(
    "session", [s for s in SessionState if s is not SessionState.CONNECTED], ids=lambda s: str(s.name)
)
def test_discovery_state_reading_due_only_while_connected(session: SessionState) -> None:
    with pytest.raises(ValueError, match=f"a reading is due only while connected, not '{session.value}'"):
        DiscoveryState(session=session, reading_due=True)


class TestDiscoveryStateScenarios:
    """Whole sequences, as `serve_discovery` feeds them."""

    def test_discovery_state_no_answer_then_connected_reads_once(self) -> None:
        state, notes = _run(DiscoveryState(), Signal.NO_ANSWER, Signal.NO_ANSWER, Session.CONNECTED)
        assert notes == [Note.NO_ANSWER, Note.CONNECTED]
        assert state.reading_due
        state, notes = _run(state, Read.MEMBERS)
        assert (state.reading_due, notes) == (False, [])

    def test_discovery_state_reports_before_the_reading_make_one_reading(self) -> None:
        """Scenario: CONNECTED and two watch events arrive together: one reading; CONNECTED then
        SUSPENDED arrive together: none."""
        state, notes = _run(DiscoveryState(), Session.CONNECTED, Signal.WATCH_FIRED, Signal.WATCH_FIRED)
        assert (state.reading_due, notes) == (True, [Note.CONNECTED])
        state, _ = _run(state, Read.MEMBERS)
        state, notes = _run(state, Session.SUSPENDED, Session.CONNECTED, Session.SUSPENDED)
        assert (state.session, state.reading_due) == (SessionState.SUSPENDED, False)
        assert notes == [Note.CONNECTION_LOST, Note.CONNECTED_AGAIN, Note.CONNECTION_LOST]

    def test_discovery_state_failed_reading_is_retried_on_the_next_watch_and_noted_once(self) -> None:
        state, notes = _run(DiscoveryState(), Session.CONNECTED, ReadFailed(message="m"))
        assert (state.reading_due, notes) == (False, [Note.CONNECTED, CannotRead(message="m")])
        state, notes = _run(state, Signal.WATCH_FIRED)
        assert state.reading_due
        state, notes = _run(state, ReadFailed(message="m"), Signal.WATCH_FIRED, Read.MEMBERS)
        assert (state.problem, notes) == (None, [])
        state, notes = _run(state, Signal.WATCH_FIRED, ReadFailed(message="m"))
        assert notes == [CannotRead(message="m")]

    def test_discovery_state_path_missing_is_noted_once_per_transition(self) -> None:
        """Scenario: missing, missing again (after a failure in between), created, deleted."""
        state, notes = _run(
            DiscoveryState(),
            Session.CONNECTED,
            Read.PATH_MISSING,
            Signal.WATCH_FIRED,
            ReadFailed(message="m"),
            Signal.WATCH_FIRED,
            Read.PATH_MISSING,
            Signal.WATCH_FIRED,
            Read.MEMBERS,
            Signal.WATCH_FIRED,
            Read.PATH_MISSING,
        )
        assert notes == [Note.CONNECTED, Note.PATH_MISSING, CannotRead(message="m"), Note.PATH_MISSING]
        assert state.path is GroupPath.MISSING

    def test_discovery_state_session_lost_then_new_session_reads_again(self) -> None:
        state, notes = _run(
            DiscoveryState(),
            Session.CONNECTED,
            Read.MEMBERS,
            Session.SUSPENDED,
            Signal.WATCH_FIRED,
            Session.LOST,
            Session.CONNECTED,
        )
        assert notes == [Note.CONNECTED, Note.CONNECTION_LOST, Note.SESSION_LOST, Note.CONNECTED_AGAIN]
        assert (state.session, state.reading_due) == (SessionState.CONNECTED, True)
