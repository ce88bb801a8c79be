"""What several workers accept, and the board a worker follows (router/features/workers/rules.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from pools.pool import AdminState, Pool, TargetState
from pools.target import Connector, Target
from router.config.loader import load_config_text
from router.config.settings import EventLogConfig
from router.features.workers.rules import Board, Change, board_of, changes, refusal
from tests.router.core.test_engine import B1, B2, B3

if TYPE_CHECKING:
    from collections.abc import Callable

    from router.config.settings import Config


def _pool() -> Pool:
    return Pool("r1", 1, [B1, B2, B3])


class TestBoard:
    def test_a_board_goes_through_its_bytes_unchanged(self) -> None:
        pool = _pool()
        pool.record_check("broker1", True)
        pool.record_check("broker2", False, "refused")
        pool.set_admin_state("broker3", AdminState.DRAIN)
        board = board_of(pool, 7)
        assert Board.decode(board.encode()) == board
        assert board.members["broker1"] == (TargetState.READY,)
        assert board.admin == {"broker3": AdminState.DRAIN}
        assert board_of(None, 3) == Board(3, {}, {})

    def test_a_worker_takes_the_supervisors_states_admin_states_first(self) -> None:
        supervisor, worker = _pool(), _pool()
        supervisor.record_check("broker1", True)
        supervisor.record_check("broker2", False, "refused")
        supervisor.set_admin_state("broker3", AdminState.MAINT)
        worker.record_check("broker2", True)
        assert changes(board_of(supervisor, 0), worker) == [
            Change("broker3", None, admin=AdminState.MAINT),
            Change("broker1", 0, ready=True),
            Change("broker2", 0, ready=False),
        ]

    def test_nothing_changes_when_alike_and_unknowns_and_unshared_targets_are_left_alone(self) -> None:
        supervisor, worker = _pool(), _pool()
        assert changes(board_of(supervisor, 0), worker) == []  # all unknown
        worker.record_check("broker1", True)
        assert changes(board_of(supervisor, 0), worker) == []  # not probed by the supervisor yet
        extra = Target.remote(Connector(name="b4", host="10.0.0.4", port=1, params=(("nodeId", "broker4"),)))
        worker.add_target(extra)
        supervisor.record_check("broker1", True)
        assert changes(board_of(supervisor, 0), worker) == []  # broker4: a reload not made there yet


def _config(cache: str = "<cache/>", port: int = 61616, pool: str = "") -> Config:
    pool = pool or "<static-connectors><connector-ref>b1</connector-ref></static-connectors>"
    return load_config_text(
        f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
  <connectors><connector name="b1">tcp://127.0.0.1:1?nodeId=b1</connector></connectors>
  <acceptors><acceptor name="a">tcp://127.0.0.1:{port}?router=r;protocols=MQTT</acceptor></acceptors>
  <connection-routers><connection-router name="r"><key-type>CLIENT_ID</key-type>{cache}
    <policy name="ROUND_ROBIN"/><pool>{pool}</pool>
  </connection-router></connection-routers>
</core></configuration>""",
        source="/tmp/router.xml",
    )


class TestRefusal:
    def test_a_plain_configuration_is_served_by_any_number(self) -> None:
        assert refusal(_config(), 2) is None
        assert refusal(_config(), 64) is None

    @pytest.mark.parametrize(
        ("config", "expected"),
        [
            (
                lambda: _config(cache="<cache><persisted>true</persisted></cache>"),
                "is not persisted and not shared",
            ),
            (lambda: _config(port=0), "acceptor 'a' has port 0"),
            (
                lambda: dataclasses.replace(_config(), event_log=EventLogConfig(directory="/tmp/events")),
                "the event log is written by one process",
            ),
        ],
    )
    def test_what_one_process_must_do_is_refused_with_several(
        self, config: Callable[[], Config], expected: str
    ) -> None:
        problem = refusal(config(), 2)
        assert problem is not None
        assert problem.startswith("--workers 2: ")
        assert expected in problem
        assert refusal(config(), 1) is None
