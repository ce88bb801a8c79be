"""What several workers accept, and the board a worker follows (router/features/workers/rules.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from pools.pool import AdminState, Pool, TargetState
from pools.target import Connector, Target
from router.config.loader import load_config_text
from router.config.settings import EventLogConfig
from router.features import register_metrics
from router.features.workers.rules import (
    SUMMED,
    Board,
    Change,
    Snapshot,
    add_snapshots,
    board_of,
    changes,
    counts_of,
    decode_snapshot,
    encode_snapshot,
    refusal,
)
from router.metrics import Metrics
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


class TestSnapshots:
    def test_a_snapshot_goes_through_its_line_and_sums_label_by_label(self) -> None:
        one: Snapshot = {
            "router_connections_accepted_total": ("counter", {("a", "r"): 3.0}),
            "router_proxied_connections": ("gauge", {("r", "n1"): 2.0}),
            "router_target_connect_duration_seconds": ("histogram", {("r", "n1"): [1.0, 2.0, 0.5]}),
        }
        line = encode_snapshot(one)
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1
        assert decode_snapshot(line) == one
        two: Snapshot = {
            "router_connections_accepted_total": ("counter", {("a", "r"): 4.0, ("b", "r"): 1.0}),
            "router_target_connect_duration_seconds": ("histogram", {("r", "n1"): [0.0, 1.0, 0.25]}),
        }
        assert add_snapshots([one, two]) == {
            "router_connections_accepted_total": ("counter", {("a", "r"): 7.0, ("b", "r"): 1.0}),
            "router_proxied_connections": ("gauge", {("r", "n1"): 2.0}),
            "router_target_connect_duration_seconds": ("histogram", {("r", "n1"): [1.0, 3.0, 0.75]}),
        }

    def test_a_gone_workers_counters_stay_and_its_gauges_go(self) -> None:
        snapshot: Snapshot = {
            "router_connections_accepted_total": ("counter", {("a", "r"): 3.0}),
            "router_proxied_connections": ("gauge", {("r", "n1"): 2.0}),
        }
        assert counts_of(snapshot) == {"router_connections_accepted_total": ("counter", {("a", "r"): 3.0})}

    def test_a_line_that_is_not_a_snapshot_is_refused(self) -> None:
        with pytest.raises(ValueError, match="a snapshot is a JSON object"):
            decode_snapshot(b"[1, 2]")
        with pytest.raises(ValueError, match="Expecting property name"):
            decode_snapshot(b"{not json")

    def test_the_summed_families_exist_and_the_caches_are_not_summed(self) -> None:
        metrics = register_metrics(Metrics())
        assert all(metrics.family(name) is not None for name in SUMMED)
        assert not any(name.startswith("router_cache_") for name in SUMMED)  # the zone's: counted once
