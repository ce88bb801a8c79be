"""router/core/admission.py: the descriptor budget and the acceptors' connection limits."""

from __future__ import annotations

import threading

import pytest

from router.core.admission import (
    DESCRIPTOR_RESERVE,
    START_SLACK,
    AcceptorLimits,
    Admission,
    Refusal,
    descriptor_budget,
    descriptors_for,
)


def test_descriptor_budget_keeps_a_reserve_and_counts_two_descriptors_a_connection() -> None:
    assert descriptor_budget(limit=1024, in_use=20, probes=6) == (1024 - 20 - 6 - DESCRIPTOR_RESERVE) // 2
    assert descriptor_budget(limit=20_000, in_use=30, probes=0) == (20_000 - 30 - DESCRIPTOR_RESERVE) // 2
    assert descriptor_budget(limit=64, in_use=60, probes=10) == 1  # never zero: one client is served


@pytest.mark.parametrize("connections", [2, 100, 10_000, 250_000])
def test_descriptors_for_is_enough_for_the_budget(connections: int) -> None:
    """Scenario: --max-connections N raises the limit to descriptors_for(N); with what is open at
    start and the probes within START_SLACK, the budget there is at least N."""
    limit = descriptors_for(connections)
    assert descriptor_budget(limit, in_use=START_SLACK // 2, probes=START_SLACK // 2) >= connections
    assert descriptor_budget(limit - 2, in_use=START_SLACK // 2, probes=START_SLACK // 2) < connections


def test_the_process_budget_refuses_new_connections_and_admits_again_after_a_release() -> None:
    admission = Admission(budget=2)
    assert admission.admit("a", "10.0.0.1") is None
    assert admission.admit("b", "10.0.0.2") is None
    assert admission.admit("a", "10.0.0.3") is Refusal.DESCRIPTOR_BUDGET
    assert admission.open == 2  # a refusal counts nothing
    admission.release("b", "10.0.0.2")
    assert admission.admit("a", "10.0.0.3") is None


def test_an_acceptor_limit_is_its_own() -> None:
    admission = Admission(budget=100, limits={"a": AcceptorLimits(connections=2)})
    assert [admission.admit("a", f"10.0.0.{i}") for i in range(3)] == [None, None, Refusal.ACCEPTOR_LIMIT]
    assert admission.admit("b", "10.0.0.9") is None  # another acceptor is not limited by a's limit
    assert admission.open_on("a") == 2
    admission.release("a", "10.0.0.0")
    assert admission.admit("a", "10.0.0.5") is None


def test_a_per_source_limit_counts_each_source_apart_and_forgets_sources_without_connections() -> None:
    admission = Admission(budget=100, limits={"a": AcceptorLimits(per_source=2)})
    assert [admission.admit("a", "10.0.0.1") for _ in range(3)] == [None, None, Refusal.SOURCE_LIMIT]
    assert admission.admit("a", "10.0.0.2") is None  # another source: its own count
    for _ in range(2):
        admission.release("a", "10.0.0.1")
    admission.release("a", "10.0.0.2")
    assert admission._by_source == {}  # bounded by the sources with open connections
    assert admission.open == 0


@pytest.mark.parametrize(
    ("refusal", "parameter"),
    [
        (Refusal.DESCRIPTOR_BUDGET, "the descriptor budget"),
        (Refusal.ACCEPTOR_LIMIT, "connectionsAllowed"),
        (Refusal.SOURCE_LIMIT, "connectionsAllowedPerSource"),
    ],
)
def test_a_refusal_names_what_an_operator_configures(refusal: Refusal, parameter: str) -> None:
    assert refusal.parameter == parameter


def test_admission_is_exact_under_two_threads() -> None:
    """Scenario: both data paths admit and release from their own threads."""
    admission = Admission(budget=10**9, limits={"a": AcceptorLimits(connections=10**9, per_source=10**9)})

    def churn() -> None:
        for _ in range(20_000):
            assert admission.admit("a", "10.0.0.1") is None
            admission.release("a", "10.0.0.1")

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (admission.open, admission.open_on("a"), admission._by_source) == (0, 0, {})


def test_open_by_acceptor_counts_acceptors_with_and_without_limits() -> None:
    """Scenario: the status resource shows each acceptor's open connections, limited or not."""
    admission = Admission(budget=100, limits={"a": AcceptorLimits(connections=5)})
    for acceptor, source in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("b", "10.0.0.3")]:
        assert admission.admit(acceptor, source) is None
    assert admission.open_by_acceptor() == {"a": 1, "b": 2}
    assert admission.open_on("b") == 2
    admission.release("b", "10.0.0.2")
    admission.release("a", "10.0.0.1")
    assert admission.open_by_acceptor() == {"a": 0, "b": 1}
    assert admission.open == 1


def test_a_reload_that_drops_the_per_source_limit_forgets_the_counts_by_source() -> None:
    """Scenario: a source holds its one allowed connection; a reload drops the per-source limit;
    the connection ends (not counted by source any more); a later reload brings the limit back:
    the source starts from zero, not from a count of a connection long gone."""
    admission = Admission(100, {"a": AcceptorLimits(connections=10, per_source=1)})
    assert admission.admit("a", "10.0.0.1") is None
    admission.set_limits("a", AcceptorLimits(connections=10))
    admission.release("a", "10.0.0.1")
    admission.set_limits("a", AcceptorLimits(connections=10, per_source=1))
    assert admission.admit("a", "10.0.0.1") is None


def test_release_many_is_each_release() -> None:
    """Scenario: connections of one acceptor ended together (the native core's batch): the counts
    are those of one release each, with a per-source limit and without."""
    limited = {"a": AcceptorLimits(connections=10, per_source=2)}
    one, many = Admission(100, limited), Admission(100, limited)
    for admission in (one, many):
        for acceptor, source in [("a", "h1"), ("a", "h1"), ("a", "h2"), ("b", "h1"), ("b", "h3")]:
            assert admission.admit(acceptor, source) is None
    for acceptor, source in [("a", "h1"), ("a", "h2"), ("b", "h1"), ("b", "h3")]:
        one.release(acceptor, source)
    many.release_many("a", ["h1", "h2"])
    many.release_many("b", ["h1", "h3"])
    assert many.open == one.open == 1
    assert many.admit("a", "h2") is None  # h2's slot came back
    assert one.admit("a", "h2") is None
    assert many.admit("a", "h1") is None
    assert many.admit("a", "h1") is Refusal.SOURCE_LIMIT  # h1 holds 2 again
