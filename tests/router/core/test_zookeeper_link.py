"""router/core/zookeeper_link.py: the state of a ZooKeeper session from kazoo's reports and the
heartbeats, with plain times (seconds)."""

from __future__ import annotations

import math

import pytest

from router.core.discovery_session import Session
from router.core.zookeeper_link import (
    ANSWER_TIMEOUT_SHARE,
    HEARTBEATS_PER_ANSWER_TIMEOUT,
    LinkCause,
    LinkState,
    ZooKeeperLink,
)

ANSWER_S = 2.0
SESSION_S = 10.0


def _connected(now: float = 0.0) -> ZooKeeperLink:
    link = ZooKeeperLink.start(answer_timeout_ms=2000, session_timeout_ms=10_000, now=now)
    step = link.report(Session.CONNECTED, now)
    assert step.changed is LinkState.CONNECTED
    return step.link


def test_zookeeper_link_heartbeat_interval_is_a_quarter_answer_timeout() -> None:
    assert _connected().heartbeat_interval_s == ANSWER_S / HEARTBEATS_PER_ANSWER_TIMEOUT


def test_zookeeper_link_connecting_until_the_first_report() -> None:
    link = ZooKeeperLink.start(answer_timeout_ms=2000, session_timeout_ms=10_000, now=5.0)
    assert link.state is LinkState.CONNECTING
    assert link.since == 5.0
    assert not link.heartbeat_due(100.0)  # nothing to ask before kazoo connects
    assert link.wake_at() == math.inf
    assert link.tick(1000.0).changed is None


def test_zookeeper_link_heartbeats_every_quarter_answer_timeout() -> None:
    link = _connected()
    assert link.heartbeat_due(0.0)
    link, number = link.ask(0.0)
    assert not link.heartbeat_due(1.0)  # one outstanding at a time
    step = link.answered(number, ok=True, now=0.01)
    assert step.changed is None
    link = step.link
    assert not link.heartbeat_due(0.49)
    assert link.wake_at() == 0.5
    assert link.heartbeat_due(0.5)


def test_zookeeper_link_unanswered_heartbeat_is_suspended_after_the_answer_timeout() -> None:
    """Scenario: kazoo says CONNECTED, but the server is frozen: the heartbeat asked at 1.0 is not
    answered; suspended at 3.0 (said once), lost at 10.0 after the last answer (0.0)."""
    link, number = _connected().ask(1.0)
    assert link.wake_at() == 1.0 + ANSWER_S
    assert link.tick(2.99).changed is None
    step = link.tick(3.0)
    assert step.changed is LinkState.SUSPENDED
    assert step.link.since == 3.0
    assert step.link.tick(5.0).changed is None  # said once
    assert step.link.wake_at() == SESSION_S
    lost = step.link.tick(SESSION_S)
    assert lost.changed is LinkState.LOST
    assert lost.link.wake_at() == math.inf
    # The server wakes up and answers: connected again (the session lived after all).
    back = lost.link.answered(number, ok=True, now=12.0)
    assert back.changed is LinkState.CONNECTED
    assert back.link.since == 12.0


def test_zookeeper_link_cause_names_what_the_link_noticed_and_not_kazoo_s_reports() -> None:
    """The changes the link decides carry their cause (the service logs them); kazoo's do not."""
    link, number = _connected().ask(1.0)
    suspended = link.tick(3.0)
    lost = suspended.link.tick(SESSION_S)
    back = lost.link.answered(number, ok=True, now=12.0)
    assert (suspended.cause, lost.cause, back.cause) == (
        LinkCause.UNANSWERED,
        LinkCause.NOTHING_HEARD,
        LinkCause.ANSWERS_AGAIN,
    )
    dropped = _connected().report(Session.SUSPENDED, 1.0)
    expired = dropped.link.report(Session.LOST, 2.0)
    again = expired.link.report(Session.CONNECTED, 3.0)
    assert [s.changed for s in (dropped, expired, again)] == [
        LinkState.SUSPENDED,
        LinkState.LOST,
        LinkState.CONNECTED,
    ]
    assert [s.cause for s in (dropped, expired, again)] == [None, None, None]


def test_zookeeper_link_answer_before_the_deadline_stays_connected() -> None:
    link, number = _connected().ask(1.0)
    step = link.answered(number, ok=True, now=2.9)
    assert step.changed is None
    assert step.link.tick(100.0).changed is None  # nothing outstanding
    assert step.link.heard_at == 2.9


def test_zookeeper_link_failed_heartbeat_is_not_an_answer() -> None:
    link, number = _connected().ask(1.0)
    step = link.answered(number, ok=False, now=1.5)
    assert step.changed is None
    assert step.link.waiting_since is None
    assert step.link.heard_at == 0.0


def test_zookeeper_link_old_heartbeat_outcome_changes_nothing() -> None:
    link, old = _connected().ask(1.0)
    link = link.report(Session.SUSPENDED, 1.5).link
    link = link.report(Session.CONNECTED, 2.0).link
    link, _new = link.ask(2.0)
    step = link.answered(old, ok=True, now=2.1)
    assert step.link is link
    assert step.changed is None


def test_zookeeper_link_kazoo_suspended_then_lost_after_the_session_timeout() -> None:
    """Scenario: the server is killed: kazoo says SUSPENDED and never LOST (it cannot reach the
    server to hear so); lost once nothing was heard for the session timeout."""
    link = _connected(0.0)
    link, number = link.ask(4.0)
    link = link.answered(number, ok=True, now=4.0).link
    step = link.report(Session.SUSPENDED, 5.0)
    assert step.changed is LinkState.SUSPENDED
    assert step.link.wake_at() == 4.0 + SESSION_S
    assert not step.link.heartbeat_due(6.0)
    assert step.link.tick(13.9).changed is None
    lost = step.link.tick(14.0)
    assert lost.changed is LinkState.LOST
    assert lost.link.report(Session.LOST, 15.0).changed is None  # kazoo agrees later: said once
    again = lost.link.report(Session.CONNECTED, 20.0)
    assert again.changed is LinkState.CONNECTED
    assert again.link.heartbeat_due(20.0)


def test_zookeeper_link_kazoo_lost_is_lost_at_once() -> None:
    step = _connected().report(Session.LOST, 1.0)
    assert step.changed is LinkState.LOST
    assert step.link.since == 1.0


def test_zookeeper_link_answer_timeout_is_at_most_two_thirds_of_the_session_timeout() -> None:
    """Scenario: answer-timeout 5 s, session timeout 1.5 s: a heartbeat unanswered for 1 s is
    suspended, and lost comes after (at 1.5 s since the last answer)."""
    link = ZooKeeperLink.start(answer_timeout_ms=5000, session_timeout_ms=1500, now=0.0)
    assert link.answer_timeout_s == 1.5 * ANSWER_TIMEOUT_SHARE == 1.0
    link = link.report(Session.CONNECTED, 0.0).link
    link, _number = link.ask(0.0)
    assert link.tick(0.99).changed is None
    suspended = link.tick(1.0)
    assert suspended.changed is LinkState.SUSPENDED
    assert suspended.link.tick(1.5).changed is LinkState.LOST


@pytest.mark.parametrize(("answer", "session"), [(0, 1000), (1000, 0), (-1, 1000)])
def test_zookeeper_link_rejects_bad_timeouts(answer: int, session: int) -> None:
    with pytest.raises(ValueError, match="timeout must be a finite number > 0"):
        ZooKeeperLink.start(answer_timeout_ms=answer, session_timeout_ms=session, now=0.0)
