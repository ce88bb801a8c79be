"""Tests for pools/pool.py: pool configuration, readiness transitions, events and quorum (SPEC A4)."""

from __future__ import annotations

import dataclasses

import pytest

from pools.pool import (
    AdminState,
    Pool,
    PoolConfig,
    PoolEvent,
    PoolEventKind,
    PoolKind,
    TargetState,
    ready_node_ids,
)
from pools.target import Connector, Target


def target(node_id: str) -> Target:
    return Target(node_id=node_id, connector=Connector(name=f"c-{node_id}", host="10.0.0.1", port=61616))


A, B, C = target("a"), target("b"), target("c")


def is_active(pool: Pool) -> bool:
    # A function call, so that mypy does not keep `pool.active` narrowed across state changes.
    return pool.active


def ready(pool: str, node_id: str) -> PoolEvent:
    return PoolEvent(kind=PoolEventKind.TARGET_READY, pool=pool, node_id=node_id)


def not_ready(pool: str, node_id: str, detail: str = "") -> PoolEvent:
    return PoolEvent(kind=PoolEventKind.TARGET_NOT_READY, pool=pool, node_id=node_id, detail=detail)


def active(pool: str, detail: str) -> PoolEvent:
    return PoolEvent(kind=PoolEventKind.POOL_ACTIVE, pool=pool, detail=detail)


def inactive(pool: str, detail: str) -> PoolEvent:
    return PoolEvent(kind=PoolEventKind.POOL_INACTIVE, pool=pool, detail=detail)


# -- PoolConfig --


class TestPoolConfig:
    def test_pool_config_defaults(self):
        config = PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",))
        assert config.check_period_ms == 5000
        assert config.quorum_size == 1
        assert config.quorum_timeout_ms == 3000
        assert config.local_target_enabled is False
        assert config.username is None
        assert config.password is None

    def test_pool_kind_values_are_element_names(self):
        assert PoolKind.STATIC.value == "static-connectors"
        assert PoolKind.DISCOVERY.value == "discovery-group-ref"
        assert PoolKind.CLUSTER.value == "cluster-connection"

    @pytest.mark.parametrize(
        "config",
        [
            {"kind": PoolKind.STATIC, "static_connectors": ("a", "b")},
            {"kind": PoolKind.DISCOVERY, "discovery_group": "dg"},
            {"kind": PoolKind.CLUSTER, "cluster_connection": "cc"},
        ],
    )
    def test_pool_config_accepts_one_pool_kind(self, config):
        assert PoolConfig(**config).kind is config["kind"]

    @pytest.mark.parametrize(
        "config",
        [
            {"kind": PoolKind.STATIC},  # none
            {"kind": PoolKind.STATIC, "static_connectors": ()},  # empty list is none
            {"kind": PoolKind.DISCOVERY},
            {"kind": PoolKind.CLUSTER},
            {"kind": PoolKind.STATIC, "static_connectors": ("a",), "discovery_group": "dg"},
            {"kind": PoolKind.DISCOVERY, "discovery_group": "dg", "cluster_connection": "cc"},
            {"kind": PoolKind.CLUSTER, "static_connectors": ("a",), "cluster_connection": "cc"},
            {"kind": PoolKind.STATIC, "discovery_group": "dg"},  # kind disagrees with the source
        ],
    )
    def test_pool_config_rejects_other_than_exactly_one_kind(self, config):
        with pytest.raises(ValueError, match="exactly one of static-connectors, discovery-group-ref"):
            PoolConfig(**config)

    @pytest.mark.parametrize("period", [0, -1])
    def test_pool_config_check_period_must_be_positive(self, period):
        with pytest.raises(ValueError, match=f"check-period must be > 0, got {period}"):
            PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",), check_period_ms=period)

    @pytest.mark.parametrize("size", [0, -5])
    def test_pool_config_quorum_size_must_be_positive(self, size):
        with pytest.raises(ValueError, match=f"quorum-size must be > 0, got {size}"):
            PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",), quorum_size=size)

    def test_pool_config_quorum_timeout_must_not_be_negative(self):
        with pytest.raises(ValueError, match="quorum-timeout must be >= 0, got -1"):
            PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",), quorum_timeout_ms=-1)

    def test_pool_config_accepts_boundary_values(self):
        config = PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("a",),
            check_period_ms=1,
            quorum_size=1,
            quorum_timeout_ms=0,
        )
        assert (config.check_period_ms, config.quorum_size, config.quorum_timeout_ms) == (1, 1, 0)

    def test_pool_config_repr_hides_password(self):
        config = PoolConfig(
            kind=PoolKind.STATIC, static_connectors=("a",), username="probe", password="s3cr3t-Pa55"
        )
        assert "s3cr3t-Pa55" not in repr(config)
        assert "s3cr3t-Pa55" not in str(config)
        assert "probe" in repr(config)
        assert config.password == "s3cr3t-Pa55"

    def test_pool_config_repr_of_replaced_config_hides_password(self):
        config = PoolConfig(kind=PoolKind.STATIC, static_connectors=("a",), password="s3cr3t-Pa55")
        assert "s3cr3t-Pa55" not in repr(dataclasses.replace(config, quorum_size=2))


# -- Pool --


class TestPoolReadiness:
    def test_pool_targets_not_ready_until_first_ok_check(self):
        pool = Pool("r1", 1, [A, B])
        assert pool.state("a") is TargetState.UNKNOWN
        assert pool.ready_targets() == []
        assert pool.routing_targets() == []
        assert pool.ready_target("a") is None
        assert pool.ready_count() == 0
        assert is_active(pool) is False

    def test_pool_first_ok_check_makes_target_ready_and_pool_active(self):
        pool = Pool("r1", 1, [A, B])
        events = pool.record_check("b", True)
        assert events == [ready("r1", "b"), active("r1", "1/1 ready")]
        assert pool.state("b") is TargetState.READY
        assert pool.ready_targets() == [B]
        assert pool.routing_targets() == [B]
        assert pool.ready_target("b") is B
        assert is_active(pool) is True

    def test_pool_events_once_per_change(self):
        """Scenario: repeated equal outcomes report nothing; each flip reports once."""
        pool = Pool("r1", 1, [A])
        assert pool.record_check("a", True) == [ready("r1", "a"), active("r1", "1/1 ready")]
        assert pool.record_check("a", True) == []
        assert pool.record_check("a", True) == []
        assert pool.record_check("a", False, "connection refused") == [
            not_ready("r1", "a", "connection refused"),
            inactive("r1", "0/1 ready"),
        ]
        assert pool.record_check("a", False, "connection refused") == []
        assert pool.record_check("a", True) == [ready("r1", "a"), active("r1", "1/1 ready")]

    def test_pool_first_failed_check_reports_not_ready(self):
        """Scenario: UNKNOWN -> NOT_READY is a change (one event); the pool stays inactive (no event)."""
        pool = Pool("r1", 1, [A])
        assert pool.record_check("a", False, "timeout") == [not_ready("r1", "a", "timeout")]
        assert pool.state("a") is TargetState.NOT_READY
        assert pool.record_check("a", False, "timeout") == []

    def test_pool_failure_makes_target_unready_at_once(self):
        pool = Pool("r1", 1, [A, B])
        pool.record_check("a", True)
        pool.record_check("b", True)
        assert pool.record_check("a", False, "closed") == [not_ready("r1", "a", "closed")]
        assert pool.ready_targets() == [B]
        assert pool.ready_target("a") is None
        assert is_active(pool) is True

    def test_pool_record_check_unknown_node_raises(self):
        pool = Pool("r1", 1, [A])
        with pytest.raises(KeyError):
            pool.record_check("zz", True)
        with pytest.raises(KeyError):
            pool.state("zz")

    def test_pool_ready_targets_keep_pool_order(self):
        """Scenario: readiness arrives in order c, a; the list is still in pool order a, c."""
        pool = Pool("r1", 1, [A, B, C])
        pool.record_check("c", True)
        pool.record_check("a", True)
        assert pool.ready_targets() == [A, C]
        assert pool.targets == (A, B, C)

    def test_pool_duplicate_node_id_rejected(self):
        twin = Target(node_id="a", connector=Connector(name="other", host="10.0.0.9", port=1))
        with pytest.raises(ValueError, match="duplicate node id 'a'"):
            Pool("r1", 1, [A, twin])
        pool = Pool("r1", 1, [A])
        with pytest.raises(ValueError, match="duplicate node id 'a'"):
            pool.add_target(twin)
        assert pool.targets == (A,)

    def test_pool_add_target_appends_unready(self):
        pool = Pool("r1", 1, [A])
        pool.record_check("a", True)
        pool.add_target(B)
        assert pool.targets == (A, B)
        assert pool.state("b") is TargetState.UNKNOWN
        assert pool.ready_targets() == [A]

    def test_pool_targets_is_a_snapshot(self):
        pool = Pool("r1", 1, [A])
        snapshot = pool.targets
        pool.add_target(B)
        assert snapshot == (A,)

    def test_pool_empty(self):
        pool = Pool("r1", 1)
        assert pool.targets == ()
        assert pool.routing_targets() == []
        assert is_active(pool) is False


class TestPoolQuorum:
    def test_pool_quorum_two_of_three(self):
        pool = Pool("r1", 2, [A, B, C])
        assert pool.record_check("a", True) == [ready("r1", "a")]
        assert is_active(pool) is False
        assert pool.ready_targets() == [A]
        assert pool.routing_targets() == []
        assert pool.record_check("c", True) == [ready("r1", "c"), active("r1", "2/2 ready")]
        assert is_active(pool) is True
        assert pool.routing_targets() == [A, C]
        assert pool.record_check("b", True) == [ready("r1", "b")]
        assert pool.routing_targets() == [A, B, C]
        assert pool.record_check("a", False, "refused") == [not_ready("r1", "a", "refused")]
        assert pool.routing_targets() == [B, C]
        assert pool.record_check("b", False, "refused") == [
            not_ready("r1", "b", "refused"),
            inactive("r1", "1/2 ready"),
        ]
        assert is_active(pool) is False
        assert pool.routing_targets() == []
        assert pool.ready_targets() == [C]

    def test_pool_ready_target_ignores_quorum(self):
        """Scenario: below quorum the pool hands out no targets, but a cached node id still resolves
        to its ready target (SPEC A1 step 6)."""
        pool = Pool("r1", 2, [A, B, C])
        pool.record_check("b", True)
        assert is_active(pool) is False
        assert pool.routing_targets() == []
        assert pool.ready_target("b") is B
        assert pool.ready_target("a") is None
        assert pool.ready_target("not-in-pool") is None

    def test_pool_quorum_larger_than_pool_never_active(self):
        pool = Pool("r1", 3, [A, B])
        assert pool.record_check("a", True) == [ready("r1", "a")]
        assert pool.record_check("b", True) == [ready("r1", "b")]
        assert is_active(pool) is False
        assert pool.routing_targets() == []

    def test_pool_active_event_counts_ready_targets(self):
        """Scenario: with quorum 1, the pool becomes inactive only when the last ready target fails."""
        pool = Pool("r1", 1, [A, B])
        pool.record_check("a", True)
        pool.record_check("b", True)
        assert pool.record_check("a", False) == [not_ready("r1", "a")]
        assert pool.record_check("b", False) == [not_ready("r1", "b"), inactive("r1", "0/1 ready")]


class TestHaPairMembers:
    PAIR = Target.remote(Connector.from_url("p", "(tcp://10.0.0.1:1,tcp://10.0.0.2:2)?nodeId=pair"))

    def pool(self) -> Pool:
        return Pool("r", 1, [self.PAIR])

    def test_pair_is_ready_with_either_member_and_primary_active(self):
        pool = self.pool()
        events = pool.record_check("pair", True, member=0)
        assert events == [
            PoolEvent(
                kind=PoolEventKind.TARGET_READY,
                pool="r",
                node_id="pair",
                detail="active member tcp://10.0.0.1:1",
            ),
            active("r", "1/1 ready"),
        ]
        assert pool.active_member("pair") == 0
        assert pool.record_check("pair", False, "closed", member=1) == []
        assert pool.member_states("pair") == (TargetState.READY, TargetState.NOT_READY)
        assert pool.state("pair") is TargetState.READY

    def test_failover_to_backup_keeps_target_ready_and_reports_once(self):
        pool = self.pool()
        pool.record_check("pair", True, member=0)
        pool.record_check("pair", False, "passive", member=1)
        pool.record_check("pair", True, member=1)  # backup took over while the primary still answered
        assert pool.active_member("pair") == 0, "the active member stays while it is ready"
        events = pool.record_check("pair", False, "refused", member=0)
        assert events == [
            PoolEvent(
                kind=PoolEventKind.TARGET_FAILOVER,
                pool="r",
                node_id="pair",
                former=("10.0.0.1", 1),
                detail="tcp://10.0.0.2:2 is active, tcp://10.0.0.1:1 is not: refused",
            )
        ]
        assert pool.active_member("pair") == 1
        assert pool.state("pair") is TargetState.READY
        assert pool.record_check("pair", False, "refused", member=0) == []

    def test_at_start_the_listed_primary_is_preferred_whichever_probe_answers_first(self):
        """Scenario (hardening review): both members ready at start; the backup's probe happened to
        answer first (3 of 4 starts before the fix). The primary's first answer makes it the active
        member, reported as a failover (which closes what went to the backup meanwhile)."""
        pool = self.pool()
        pool.record_check("pair", True, member=1)
        assert pool.active_member("pair") == 1
        events = pool.record_check("pair", True, member=0)
        assert [(e.kind, e.former) for e in events] == [(PoolEventKind.TARGET_FAILOVER, ("10.0.0.2", 2))]
        assert pool.active_member("pair") == 0
        assert pool.record_check("pair", True, member=0) == []  # later answers change nothing

    def test_restarted_primary_does_not_take_back_from_the_active_backup(self):
        pool = self.pool()
        pool.record_check("pair", False, "down", member=0)
        pool.record_check("pair", True, member=1)
        assert pool.active_member("pair") == 1
        assert pool.record_check("pair", True, member=0) == []
        assert pool.active_member("pair") == 1

    def test_fail_back_when_the_backup_dies(self):
        pool = self.pool()
        pool.record_check("pair", False, "down", member=0)
        pool.record_check("pair", True, member=1)
        pool.record_check("pair", True, member=0)
        events = pool.record_check("pair", False, "killed", member=1)
        assert [e.kind for e in events] == [PoolEventKind.TARGET_FAILOVER]
        assert pool.active_member("pair") == 0

    def test_pair_not_ready_when_all_members_fail(self):
        pool = self.pool()
        pool.record_check("pair", True, member=1)
        pool.record_check("pair", False, "down", member=0)
        events = pool.record_check("pair", False, "killed", member=1)
        assert events == [not_ready("r", "pair", "killed"), inactive("r", "0/1 ready")]
        assert pool.active_member("pair") is None
        assert pool.ready_target("pair") is None

    def test_unknown_until_a_member_is_probed_then_not_ready(self):
        pool = self.pool()
        assert pool.state("pair") is TargetState.UNKNOWN
        assert pool.record_check("pair", False, "down", member=0) == [not_ready("r", "pair", "down")]

    def test_member_index_out_of_range_is_an_index_error(self):
        with pytest.raises(IndexError):
            self.pool().record_check("pair", True, member=2)


class TestPoolMembership:
    """Discovered targets join and leave a running pool."""

    def test_add_target_reports_target_added(self):
        pool = Pool("r", 1)
        events = pool.add_target(A)
        assert events == [
            PoolEvent(kind=PoolEventKind.TARGET_ADDED, pool="r", node_id="a", detail="tcp://10.0.0.1:61616")
        ]
        assert pool.state("a") is TargetState.UNKNOWN
        assert pool.target("a") is A

    def test_remove_target_of_unready_keeps_pool_state(self):
        pool = Pool("r", 1, [A, B])
        pool.record_check("a", True)
        events = pool.remove_target("b")
        assert events == [
            PoolEvent(kind=PoolEventKind.TARGET_REMOVED, pool="r", node_id="b", detail="unknown")
        ]
        assert pool.targets == (A,)
        assert is_active(pool)

    def test_remove_ready_target_below_quorum_makes_pool_inactive(self):
        pool = Pool("r", 2, [A, B, C])
        pool.record_check("a", True)
        pool.record_check("b", True)
        events = pool.remove_target("a")
        assert events == [
            PoolEvent(kind=PoolEventKind.TARGET_REMOVED, pool="r", node_id="a", detail="ready"),
            inactive("r", "1/2 ready"),
        ]
        assert pool.routing_targets() == []
        assert pool.ready_target("a") is None
        assert pool.target("a") is None

    def test_remove_target_forgets_its_state(self):
        """Scenario: a target that left and joins again starts UNKNOWN, at the end of pool order."""
        pool = Pool("r", 1, [A, B])
        pool.record_check("a", True)
        pool.remove_target("a")
        with pytest.raises(KeyError):
            pool.state("a")
        with pytest.raises(KeyError):
            pool.record_check("a", True)
        pool.add_target(A)
        assert pool.targets == (B, A)
        assert pool.state("a") is TargetState.UNKNOWN
        assert pool.member_states("a") == (TargetState.UNKNOWN,)

    def test_remove_unknown_target_is_a_key_error(self):
        with pytest.raises(KeyError):
            Pool("r", 1, [A]).remove_target("zz")

    def test_remove_last_ready_target_then_new_one_reactivates(self):
        pool = Pool("r", 1, [A])
        pool.record_check("a", True)
        assert pool.remove_target("a")[-1] == inactive("r", "0/1 ready")
        pool.add_target(B)
        assert pool.record_check("b", True) == [ready("r", "b"), active("r", "1/1 ready")]


def test_ready_node_ids_of_a_dry_run():
    remote = [Target.remote(Connector.from_url(f"c{i}", f"tcp://10.0.0.{i}:1?nodeId=n{i}")) for i in (1, 2)]
    pool = Pool("r", 1, [Target.local_target(None), *remote])
    assert ready_node_ids(pool, "all") == {"n1", "n2"}  # a local target without connector never is
    assert ready_node_ids(pool, "none") == frozenset()
    assert ready_node_ids(pool, " n2 , elsewhere,") == {"n2"}


class TestAdminState:
    def pool(self) -> Pool:
        pool = Pool("r", 1, [target("a"), target("b")])
        for node in ("a", "b"):
            pool.record_check(node, True)
        return pool

    def test_drain_takes_no_new_connections_cached_keys_included_and_counts_for_the_quorum(self):
        pool = Pool("r", 2, [target("a"), target("b")])
        pool.record_check("a", True)
        pool.record_check("b", True)
        events = pool.set_admin_state("a", AdminState.DRAIN)
        assert events == [
            PoolEvent(
                kind=PoolEventKind.TARGET_ADMIN_STATE,
                pool="r",
                node_id="a",
                admin_state=AdminState.DRAIN,
                detail="drain (was ready)",
            )
        ]
        assert [t.node_id for t in pool.routing_targets()] == ["b"]
        assert pool.ready_target("a") is None
        assert pool.state("a") is TargetState.READY  # still probed
        assert pool.ready_count() == 2
        assert pool.active

    def test_maint_is_not_probed_nor_counted_and_is_unknown_after(self):
        pool = self.pool()
        pool.set_admin_state("a", AdminState.MAINT)
        assert not pool.probed("a")
        assert pool.ready_count() == 1
        assert pool.record_check("a", False, "late probe") == []  # a probe begun before: ignored
        events = pool.set_admin_state("a", AdminState.READY)
        assert [e.kind for e in events] == [PoolEventKind.TARGET_ADMIN_STATE]
        assert pool.state("a") is TargetState.UNKNOWN  # until its next probe
        assert pool.ready_target("a") is None
        assert [e.kind for e in pool.record_check("a", True)] == [PoolEventKind.TARGET_READY]
        assert pool.ready_target("a") is not None

    def test_maint_of_the_last_ready_target_makes_the_pool_inactive(self):
        pool = Pool("r", 1, [target("a")])
        pool.record_check("a", True)
        events = pool.set_admin_state("a", AdminState.MAINT)
        assert [e.kind for e in events] == [PoolEventKind.TARGET_ADMIN_STATE, PoolEventKind.POOL_INACTIVE]

    def test_setting_the_same_state_changes_nothing(self):
        pool = self.pool()
        assert pool.set_admin_state("a", AdminState.READY) == []
        pool.set_admin_state("a", AdminState.DRAIN)
        assert pool.set_admin_state("a", AdminState.DRAIN) == []

    def test_a_state_for_a_node_id_not_in_the_pool_applies_when_it_joins(self):
        pool = self.pool()
        pool.set_admin_state("c", AdminState.DRAIN)
        assert pool.admin_states() == {"c": AdminState.DRAIN}
        pool.add_target(target("c"))
        pool.record_check("c", True)
        assert pool.ready_target("c") is None
        assert pool.admin_state("c") is AdminState.DRAIN
        pool.remove_target("c")
        assert pool.admin_state("c") is AdminState.DRAIN  # kept for its return


class TestReconfigure:
    """Pool.reconfigure: a configuration reload of the pool's targets and quorum."""

    def test_reconfigure_keeps_the_state_and_object_of_unchanged_targets(self) -> None:
        pool = Pool("r", 1, [A, B])
        pool.record_check("a", True)
        pool.record_check("b", False)
        a_object = pool.target("a")
        events = pool.reconfigure(1, [A, B, C])
        assert events == [
            PoolEvent(kind=PoolEventKind.TARGET_ADDED, pool="r", node_id="c", detail="tcp://10.0.0.1:61616")
        ]
        assert pool.target("a") is a_object
        assert pool.state("a") is TargetState.READY
        assert pool.state("b") is TargetState.NOT_READY
        assert pool.state("c") is TargetState.UNKNOWN
        assert [t.node_id for t in pool.targets] == ["a", "b", "c"]

    def test_reconfigure_follows_the_new_order_and_removes_the_others(self) -> None:
        pool = Pool("r", 1, [A, B, C])
        pool.record_check("c", True)
        events = pool.reconfigure(1, [C, A])
        assert [t.node_id for t in pool.targets] == ["c", "a"]
        assert events == [
            PoolEvent(kind=PoolEventKind.TARGET_REMOVED, pool="r", node_id="b", detail="unknown")
        ]
        assert pool.state("c") is TargetState.READY

    def test_reconfigure_restarts_a_changed_connector_from_unknown(self) -> None:
        pool = Pool("r", 1, [A])
        pool.record_check("a", True)
        moved = Target(node_id="a", connector=Connector(name="c-a", host="10.0.0.2", port=61616))
        events = pool.reconfigure(1, [moved])
        assert [e.kind for e in events] == [
            PoolEventKind.TARGET_REMOVED,
            PoolEventKind.TARGET_ADDED,
            PoolEventKind.POOL_INACTIVE,
        ]
        assert pool.target("a") is moved
        assert pool.state("a") is TargetState.UNKNOWN
        assert not is_active(pool)

    def test_reconfigure_applies_the_quorum_and_keeps_admin_states(self) -> None:
        pool = Pool("r", 1, [A, B])
        pool.record_check("a", True)
        pool.set_admin_state("b", AdminState.DRAIN)
        assert is_active(pool)
        events = pool.reconfigure(2, [A, B])
        assert events == [PoolEvent(kind=PoolEventKind.POOL_INACTIVE, pool="r", detail="1/2 ready")]
        assert pool.admin_state("b") is AdminState.DRAIN

    def test_reconfigure_refuses_duplicate_node_ids(self) -> None:
        pool = Pool("r", 1, [A])
        with pytest.raises(ValueError, match="duplicate node id"):
            pool.reconfigure(1, [A, A])
        assert pool.targets == (A,)
