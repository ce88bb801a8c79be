"""Pool configuration and pool state: which targets are ready, and whether the pool is active.

Rule 1 (as in h11's `_state.py`): everything that changes a pool's readiness state lives in this
file. The I/O layer (`router/features/probes/service.py`) runs the probes and feeds each outcome into
`Pool.record_check`; routing reads `routing_targets()` and `ready_target()`. No clock and no
network here: the quorum *wait* is the caller's, this module only says whether quorum holds.

Transitions, per target (initial state UNKNOWN, which counts as not ready):

    state      on check ok    on check failed
    UNKNOWN    READY          NOT_READY
    READY      READY          NOT_READY
    NOT_READY  READY          NOT_READY

Each member of an HA-pair target (primary, backups) has its own state by this table; the target is
READY while any member is, with one of them *active* (kept while ready, else the first ready one;
at start the listed primary is preferred: a member answering its first probe takes over from a
later one that answered first),
NOT_READY once all probed members failed, UNKNOWN before any probe.

And per pool: ACTIVE while at least `quorum_size` targets are READY, else INACTIVE (initial).
Every change of either state is reported once as a `PoolEvent`, so logs show each change once.

Administrative state, per target, set by operators (HAProxy's `set server state`): READY (the
default), DRAIN (no new connections, cached keys included; probed; counts for the quorum while
ready) or MAINT (as DRAIN, and not probed: it does not count for the quorum; leaving MAINT it is
UNKNOWN until its next probe). Connections already open stay in every state. A state set for a
node id not in the pool (a discovered member that left, or has not arrived) is kept and applies
when it joins. Each change is reported as TARGET_ADMIN_STATE.

Passive health (`pools/outlier.py`, its own table): a target whose broker keeps refusing or
dropping clients is ejected for a back-off (TARGET_EJECTED, then TARGET_RETURNED): closed to new
connections, cached keys included, like DRAIN; its readiness is unchanged (probes go on, and a
probe's success does not end the ejection), it counts for the quorum, and its open connections
stay.

Membership: static pools keep their targets; discovery pools gain targets (`add_target`, state
UNKNOWN, TARGET_ADDED) and lose them (`remove_target`, TARGET_REMOVED, then POOL_INACTIVE when a
ready target leaves and the quorum no longer holds) while the router runs. A configuration reload
(`reconfigure`) sets the targets and the quorum anew: unchanged targets keep their state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pools.outlier import OutlierConfig, Outliers

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from pools.outlier import BrokerFailure, Ejection
    from pools.target import Connector, Target

__all__ = [
    "AdminState",
    "Pool",
    "PoolConfig",
    "PoolEvent",
    "PoolEventKind",
    "PoolKind",
    "TargetState",
    "ready_node_ids",
]


class PoolKind(enum.Enum):
    """Where a pool's targets come from (exactly one per pool)."""

    STATIC = "static-connectors"
    DISCOVERY = "discovery-group-ref"
    CLUSTER = "cluster-connection"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolConfig:
    """The `<pool>` element of a connection router (SPEC A4)."""

    kind: PoolKind
    """Which of static-connectors, discovery-group-ref or cluster-connection the pool uses."""
    static_connectors: tuple[str, ...] = ()
    """Connector names in configured order (kind STATIC)."""
    discovery_group: str | None = None
    """Discovery group name (kind DISCOVERY)."""
    cluster_connection: str | None = None
    """Cluster connection name (kind CLUSTER)."""
    username: str | None = None
    """User name for our health probes only."""
    password: str | None = field(default=None, repr=False)
    """Password for our health probes only; never logged, never in repr."""
    check_period_ms: int = 5000
    """How often each target is probed."""
    quorum_size: int = 1
    """Ready targets needed before the pool hands out any."""
    quorum_timeout_ms: int = 3000
    """How long a routing decision waits for the quorum."""
    local_target_enabled: bool = False
    """Whether the local target is the first member of the pool."""
    outlier_detection: OutlierConfig = field(default_factory=OutlierConfig)
    """Passive health: when a target whose broker drops clients is ejected (`<outlier-detection>`)."""

    def __post_init__(self) -> None:
        if self.check_period_ms <= 0:
            raise ValueError(f"check-period must be > 0, got {self.check_period_ms!r}")
        if self.quorum_size <= 0:
            raise ValueError(f"quorum-size must be > 0, got {self.quorum_size!r}")
        if self.quorum_timeout_ms < 0:
            raise ValueError(f"quorum-timeout must be >= 0, got {self.quorum_timeout_ms!r}")
        sources = {
            PoolKind.STATIC: bool(self.static_connectors),
            PoolKind.DISCOVERY: self.discovery_group is not None,
            PoolKind.CLUSTER: self.cluster_connection is not None,
        }
        if not sources[self.kind] or sum(sources.values()) != 1:
            raise ValueError(
                "a pool needs exactly one of static-connectors, discovery-group-ref, "
                f"cluster-connection, got {[k.value for k, v in sources.items() if v]!r}"
            )


class TargetState(enum.Enum):
    """Readiness of one target as last probed."""

    UNKNOWN = "unknown"
    READY = "ready"
    NOT_READY = "not-ready"


class AdminState(enum.Enum):
    """What an operator allows a target (see the module docstring)."""

    READY = "ready"
    DRAIN = "drain"
    MAINT = "maint"


class PoolEventKind(enum.Enum):
    """A change worth one log line and one metric update."""

    TARGET_READY = "target-ready"
    TARGET_NOT_READY = "target-not-ready"
    TARGET_ADDED = "target-added"
    """A discovered target joined the pool (not ready until probed)."""
    TARGET_REMOVED = "target-removed"
    """A discovered target left the pool; detail is the state it had."""
    TARGET_FAILOVER = "target-failover"
    """The active member of an HA-pair target changed (failover or fail-back); the target stayed ready."""
    TARGET_ADMIN_STATE = "target-admin-state"
    """An operator changed the target's administrative state; detail is `new (was old)`."""
    TARGET_EJECTED = "target-ejected"
    """Passive health ejected the target (`pools/outlier.py`); detail is why, for how long."""
    TARGET_RETURNED = "target-returned"
    """The target's ejection ended: open to new connections again (when ready)."""
    POOL_ACTIVE = "pool-active"
    POOL_INACTIVE = "pool-inactive"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolEvent:
    """One state change of a pool or of one of its targets."""

    kind: PoolEventKind
    pool: str
    """The owning router's name (a pool belongs to exactly one router)."""
    node_id: str | None = None
    """The target concerned, for target events."""
    former: tuple[str, int] | None = None
    """(host, port) of the member that stopped being the active one (TARGET_FAILOVER)."""
    admin_state: AdminState | None = None
    """The new administrative state (TARGET_ADMIN_STATE)."""
    detail: str = ""
    """Why: the probe's error for TARGET_NOT_READY, the active member of an HA pair for TARGET_READY
    and TARGET_FAILOVER, the ready count for pool events."""


_NEXT_STATE = {
    (TargetState.UNKNOWN, True): TargetState.READY,
    (TargetState.UNKNOWN, False): TargetState.NOT_READY,
    (TargetState.READY, True): TargetState.READY,
    (TargetState.READY, False): TargetState.NOT_READY,
    (TargetState.NOT_READY, True): TargetState.READY,
    (TargetState.NOT_READY, False): TargetState.NOT_READY,
}


@dataclass(slots=True)
class _Slot:
    """One target of a pool and the readiness of each member of its HA pair (mutable)."""

    target: Target
    members: list[TargetState]
    """Each member's state by `_NEXT_STATE`, primary first (one entry for a plain target)."""
    active: int | None = None
    """Index of the active member; not None exactly when the target is READY."""

    @property
    def state(self) -> TargetState:
        """The target's state, derived from its members' (see the module docstring)."""
        if self.active is not None:
            return TargetState.READY
        if all(s is TargetState.UNKNOWN for s in self.members):
            return TargetState.UNKNOWN
        return TargetState.NOT_READY

    def member(self, index: int) -> Connector:
        assert self.target.connector is not None, "only targets with a connector are probed"
        return self.target.connector.members[index]


class Pool:
    """The targets of one router's pool, in pool order, with their readiness (mutable state).

    Pool order is: the local target first when enabled, then static connectors in configured order,
    then discovered members in arrival order (SPEC A3 FIRST_ELEMENT).
    """

    __slots__ = ("_active", "_admin", "_outliers", "_slots", "failing", "name", "quorum_size")

    def __init__(
        self,
        name: str,
        quorum_size: int,
        targets: Iterable[Target] = (),
        outlier_detection: OutlierConfig | None = None,
    ) -> None:
        self.name = name
        self._outliers = Outliers(OutlierConfig() if outlier_detection is None else outlier_detection)
        self.failing: Callable[[str], bool] = self._outliers.failing
        """Whether a target has failures counted (a lookup: an answer then matters); the outliers'
        own method, so that each connection's question is one call."""
        self.quorum_size = quorum_size
        # By node id, in pool order: a dict keeps insertion order, and targets are only appended.
        self._slots: dict[str, _Slot] = {}
        self._admin: dict[str, AdminState] = {}
        """Node id -> the administrative state operators set, other than READY (also for node ids
        not in the pool now): a target is open to new connections when ready and not in it, and
        counts for the quorum when ready and not in MAINT."""
        self._active = False
        for target in targets:
            self.add_target(target)

    @property
    def targets(self) -> Sequence[Target]:
        """All targets in pool order, ready or not."""
        return tuple(slot.target for slot in self._slots.values())

    @property
    def active(self) -> bool:
        """Whether at least `quorum_size` targets are ready."""
        return self._active

    def state(self, node_id: str) -> TargetState:
        """The readiness of one target.

        Raises:
            KeyError: no target with this node id.
        """
        return self._slots[node_id].state

    def add_target(self, target: Target) -> list[PoolEvent]:
        """Append a target (not ready until its first successful check).

        Returns:
            TARGET_ADDED (the pool's activity cannot change: the new target is not ready yet).

        Raises:
            ValueError: a target with the same node id is already in the pool.
        """
        if target.node_id in self._slots:
            raise ValueError(f"pool {self.name!r}: duplicate node id {target.node_id!r}")
        members = 1 if target.connector is None else len(target.connector.members)
        self._slots[target.node_id] = _Slot(target=target, members=[TargetState.UNKNOWN] * members)
        detail = "" if target.connector is None else target.connector.display_url
        return [
            PoolEvent(kind=PoolEventKind.TARGET_ADDED, pool=self.name, node_id=target.node_id, detail=detail)
        ]

    def remove_target(self, node_id: str) -> list[PoolEvent]:
        """Take a target out of the pool (a discovered member that left).

        Returns:
            TARGET_REMOVED, then POOL_INACTIVE when the quorum no longer holds.

        Raises:
            KeyError: no target with this node id.
        """
        state = self._slots.pop(node_id).state
        self._outliers.keep_only(self._slots)
        events = [
            PoolEvent(kind=PoolEventKind.TARGET_REMOVED, pool=self.name, node_id=node_id, detail=state.value)
        ]
        events.extend(self._update_active())
        return events

    def reconfigure(
        self, quorum_size: int, targets: Sequence[Target], outlier_detection: OutlierConfig | None = None
    ) -> list[PoolEvent]:
        """A configuration reload: the pool's targets become `targets`, in this order, and its
        quorum `quorum_size`. A target equal to one the pool has (same node id and connector) keeps
        its state, its ejection and its `Target` object; a new or changed one starts UNKNOWN.
        Administrative states stay. New outlier-detection settings apply from the next failure
        (turned off, ejections end now: TARGET_RETURNED).

        Returns:
            TARGET_REMOVED for each target that left or changed, TARGET_ADDED for each that came or
            changed, then the pool event when the quorum changed.

        Raises:
            ValueError: two targets with the same node id.
        """
        if len({t.node_id for t in targets}) != len(targets):
            raise ValueError(f"pool {self.name!r}: duplicate node id in {[t.node_id for t in targets]}")
        former = self._slots
        events: list[PoolEvent] = []
        kept = {t.node_id for t in targets if (s := former.get(t.node_id)) is not None and s.target == t}
        for node_id, slot in former.items():
            if node_id not in kept:
                events.append(
                    PoolEvent(
                        kind=PoolEventKind.TARGET_REMOVED,
                        pool=self.name,
                        node_id=node_id,
                        detail=slot.state.value,
                    )
                )
        self._slots = {}
        for target in targets:
            if target.node_id in kept:
                self._slots[target.node_id] = former[target.node_id]
            else:
                events.extend(self.add_target(target))
        self.quorum_size = quorum_size
        self._outliers.keep_only(kept)
        if outlier_detection is not None:
            for ejection in self._outliers.reconfigure(outlier_detection):
                events.append(self._returned(ejection))
        events.extend(self._update_active())
        return events

    # -- passive health (pools/outlier.py) --

    def broker_failed(
        self, node_id: str, reason: BrokerFailure, now: float, detail: str = ""
    ) -> list[PoolEvent]:
        """Count a failure of a target's broker (a client refused or dropped right after the
        connect); nothing when the target has left the pool.

        Returns:
            TARGET_EJECTED when this failure ejects it, else nothing.
        """
        if node_id not in self._slots:
            return []
        ejection = self._outliers.failed(node_id, reason, now, pool_size=len(self._slots), detail=detail)
        if ejection is None:
            return []
        return [
            PoolEvent(kind=PoolEventKind.TARGET_EJECTED, pool=self.name, node_id=node_id, detail=ejection.why)
        ]

    def broker_answered(self, node_id: str) -> None:
        """A target's broker answered a client: its failures in a row end (no event)."""
        self._outliers.answered(node_id)

    def return_ejected(self, now: float) -> list[PoolEvent]:
        """End the ejections that are over at `now`.

        Returns:
            TARGET_RETURNED for each.
        """
        return [self._returned(ejection) for ejection in self._outliers.returns(now)]

    def _returned(self, ejection: Ejection) -> PoolEvent:
        return PoolEvent(
            kind=PoolEventKind.TARGET_RETURNED,
            pool=self.name,
            node_id=ejection.node_id,
            detail=f"after {ejection.duration_s:g} s",
        )

    def ejection(self, node_id: str) -> Ejection | None:
        """The target's ejection under way, if any."""
        return self._outliers.ejected.get(node_id)

    def next_return(self) -> float | None:
        """When the earliest ejection ends (None: none is ejected)."""
        return self._outliers.next_return()

    def target(self, node_id: str) -> Target | None:
        """The target with this node id, ready or not, or None when it is not in the pool."""
        slot = self._slots.get(node_id)
        return None if slot is None else slot.target

    def record_check(self, node_id: str, ok: bool, detail: str = "", *, member: int = 0) -> list[PoolEvent]:
        """Apply one probe outcome and report what changed.

        A target is ready while any member of its HA pair is (a plain target has one member); its
        active member stays active while ready, otherwise the first ready member in order takes
        over (failover, and fail-back once the new active one fails). An earlier member that answers
        its first probe takes over too (at start the listed primary is preferred, whichever probe
        answers first).

        Args:
            node_id: the probed target.
            ok: whether the probe succeeded.
            detail: the probe's error message when it failed.
            member: which member of the target's HA pair was probed (0 = primary).

        Returns:
            The state changes, target first and pool second, empty when nothing changed.

        Raises:
            KeyError: no target with this node id.
            IndexError: no such member.
        """
        slot = self._slots[node_id]
        if self._admin.get(node_id) is AdminState.MAINT:
            return []  # a probe that ran when maintenance began: not probed means not recorded
        members = slot.members
        before, was_active = slot.state, slot.active
        first_probe = members[member] is TargetState.UNKNOWN
        members[member] = _NEXT_STATE[(members[member], ok)]
        active = was_active if was_active is not None and members[was_active] is TargetState.READY else None
        if active is None or (first_probe and ok and member < active):
            # The first ready member in order; also when an earlier member answers its very first
            # probe after a later one (at start, whichever probe answers first would otherwise
            # decide: the listed primary is preferred).
            active = next((i for i, s in enumerate(members) if s is TargetState.READY), None)
        slot.active = active
        after = slot.state
        events: list[PoolEvent] = []
        if active is not None and after is not before:  # became ready
            detail = f"active member {slot.member(active).url}" if len(members) > 1 else ""
            events.append(
                PoolEvent(kind=PoolEventKind.TARGET_READY, pool=self.name, node_id=node_id, detail=detail)
            )
        elif after is not before:
            events.append(
                PoolEvent(kind=PoolEventKind.TARGET_NOT_READY, pool=self.name, node_id=node_id, detail=detail)
            )
        elif was_active is not None and active is not None and active != was_active:
            former = slot.member(was_active)
            events.append(
                PoolEvent(
                    kind=PoolEventKind.TARGET_FAILOVER,
                    pool=self.name,
                    node_id=node_id,
                    former=(former.host, former.port),
                    detail=f"{slot.member(active).url} is active, {former.url} is not: {detail}",
                )
            )
        events.extend(self._update_active())
        return events

    def admin_state(self, node_id: str) -> AdminState:
        """What operators allow a node id (READY unless set), in the pool or not."""
        return self._admin.get(node_id, AdminState.READY)

    def admin_states(self) -> dict[str, AdminState]:
        """Every node id whose administrative state is not READY (in the pool or not)."""
        return dict(self._admin)

    def set_admin_state(self, node_id: str, state: AdminState) -> list[PoolEvent]:
        """Set what operators allow a node id (see the module docstring).

        Returns:
            TARGET_ADMIN_STATE (empty when nothing changed), then a pool event when the quorum
            changed (MAINT does not count).
        """
        before = self.admin_state(node_id)
        if state is before:
            return []
        if state is AdminState.READY:
            del self._admin[node_id]
        else:
            self._admin[node_id] = state
        slot = self._slots.get(node_id)
        if slot is not None and before is AdminState.MAINT:  # not probed: unknown until probed
            slot.members = [TargetState.UNKNOWN] * len(slot.members)
            slot.active = None
        events = [
            PoolEvent(
                kind=PoolEventKind.TARGET_ADMIN_STATE,
                pool=self.name,
                node_id=node_id,
                admin_state=state,
                detail=f"{state.value} (was {before.value})",
            )
        ]
        events.extend(self._update_active())
        return events

    def active_member(self, node_id: str) -> int | None:
        """Index of the active member of a target's HA pair (0 for a plain ready target), None when
        the target is not ready.

        Raises:
            KeyError: no target with this node id.
        """
        return self._slots[node_id].active

    def member_states(self, node_id: str) -> tuple[TargetState, ...]:
        """The readiness of each member of a target's HA pair, primary first.

        Raises:
            KeyError: no target with this node id.
        """
        return tuple(self._slots[node_id].members)

    def _update_active(self) -> list[PoolEvent]:
        ready = self.ready_count()
        active = ready >= self.quorum_size
        if active == self._active:
            return []
        self._active = active
        kind = PoolEventKind.POOL_ACTIVE if active else PoolEventKind.POOL_INACTIVE
        return [PoolEvent(kind=kind, pool=self.name, detail=f"{ready}/{self.quorum_size} ready")]

    def ready_count(self) -> int:
        """How many targets count for the quorum now: ready, and not in maintenance."""
        maint = AdminState.MAINT
        admin = self._admin
        return sum(
            1 for n, slot in self._slots.items() if slot.active is not None and admin.get(n) is not maint
        )

    def ready_targets(self) -> list[Target]:
        """The targets open to new connections (ready, administrative state READY, not ejected) in
        pool order,
        whether or not quorum holds."""
        admin, ejected = self._admin, self._outliers.ejected
        if not admin and not ejected:  # the usual case, once per decision that asks the pool
            return [slot.target for slot in self._slots.values() if slot.active is not None]
        return [
            slot.target
            for n, slot in self._slots.items()
            if slot.active is not None and n not in admin and n not in ejected
        ]

    def routing_targets(self) -> list[Target]:
        """What the pool hands to a policy: the targets open to new connections while quorum
        holds, else nothing."""
        ready = self.ready_targets()
        # Without states or ejections, the same: an ejected target counts for the quorum.
        counted = len(ready) if not self._admin and not self._outliers.ejected else self.ready_count()
        return ready if counted >= self.quorum_size else []

    def ready_target(self, node_id: str) -> Target | None:
        """The target with this node id if it is in the pool, ready and open to new connections (no
        quorum check: SPEC A1 6; a drained target's cached keys go elsewhere)."""
        slot = self._slots.get(node_id)
        if slot is None or slot.active is None or node_id in self._admin or node_id in self._outliers.ejected:
            return None
        return slot.target

    def probed(self, node_id: str) -> bool:
        """Whether a target of the pool is probed (it is not in maintenance)."""
        return node_id in self._slots and self._admin.get(node_id) is not AdminState.MAINT


def ready_node_ids(pool: Pool, spec: str) -> frozenset[str]:
    """The node ids a dry run counts as ready (`routerctl route --ready`, `routerctl simulate`).

    Args:
        pool: the router's pool.
        spec: `all` (every target with a connector: a local target without one can never be
            ready, as in routerd), `none`, or `NODE,NODE,...` (names not in this pool are left
            out; `routerctl route` refuses them first).
    """
    if spec == "all":
        return frozenset(t.node_id for t in pool.targets if t.connector is not None)
    if spec == "none":
        return frozenset()
    named = {n.strip() for n in spec.split(",") if n.strip()}
    return frozenset(t.node_id for t in pool.targets if t.node_id in named)
