"""A router's state as an operator sees it: a frozen snapshot of engine, pool and connections;
and the process's (`ServerStatus`: pid, version, descriptor budget, acceptors with their counts).

Pure: `snapshot` reads the live objects and copies what the admin API and `routerctl status`
show; `RouterRuntime.status` calls it under the router's lock, so a snapshot is consistent even
while the fast path's thread routes. The process's facts (clock, /proc) are read by
router/services/process.py, which builds a `ServerStatus` from them. Besides the pool's state,
a target shows what the runtime remembers in its `TargetHistory` (fed with times it reads
itself: none is read here): each member's last probe (when, how long, the outcome), why the
target is not ready, when its `OperationalState` (readiness and administrative state in
one, as `router_target_state`) last changed, and what its broker last reported of its own
connection count (a connector's `connectionCount=`: the count, when it was read, the last error).
The features add their own members to a target's document (`TargetSection`: the probes show that
count), computed under the same lock.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, TypeAlias

from pools import AdminState, TargetState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pools import Ejection, Pool, Target
    from router.config.settings import RouterConfig
    from router.core.engine import RoutingEngine
    from router.core.live import LiveConnections
    from router.core.zookeeper_link import LinkState

__all__ = [
    "AcceptorStatus",
    "CheckRecord",
    "CountReport",
    "MemberStatus",
    "OperationalState",
    "PoolStatus",
    "ProcessStatus",
    "RouterStatus",
    "ServerStatus",
    "TargetHistory",
    "TargetSection",
    "TargetStatus",
    "ZooKeeperStatus",
    "operational_state",
    "rfc3339",
    "snapshot",
]


class OperationalState(enum.Enum):
    """A target's state in one word, as `router_target_state` shows it (HAProxy's UP, DOWN, DRAIN,
    MAINT): its readiness and its administrative state together."""

    UP = "up"
    """Ready and open to new connections."""
    DOWN = "down"
    """Not ready, or not probed yet (also while drained: its open connections are in trouble)."""
    DRAIN = "drain"
    """Ready, and drained by an operator: no new connections."""
    MAINT = "maint"
    """In maintenance: not probed, no new connections."""
    EJECTED = "ejected"
    """Ready, and ejected by passive health (pools/outlier.py) for a while: no new connections."""


_CLOSED_WORDS: Final = {
    OperationalState.DOWN: "not ready",
    OperationalState.DRAIN: "drained",
    OperationalState.MAINT: "in maintenance",
    OperationalState.EJECTED: "ejected",
}
"""Why a target in each closed operational state takes no new client (`TargetStatus.closed_because`)."""
_CLOSED_ORDER: Final = ("drained", "in maintenance", "not ready", "ejected", "full")


def operational_state(state: TargetState, admin: AdminState, *, ejected: bool = False) -> OperationalState:
    """The operational state of a target with this readiness, administrative state and ejection."""
    if admin is AdminState.MAINT:
        return OperationalState.MAINT
    if state is not TargetState.READY:
        return OperationalState.DOWN
    if admin is AdminState.DRAIN:
        return OperationalState.DRAIN
    if ejected:
        return OperationalState.EJECTED
    return OperationalState.UP


def rfc3339(timestamp: float) -> str:
    """Seconds since the epoch as an RFC 3339 UTC time with milliseconds (`2026-05-01T12:00:00.123Z`)."""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRecord:
    """One health probe of a target (of one member of an HA pair)."""

    at: float
    """When it ended, in seconds since the epoch."""
    duration_s: float
    """How long it took (a probe without an answer: its deadline)."""
    ok: bool
    """Whether the broker answered as a ready one."""
    reason: str = ""
    """Why not, when not ok (the probe's words)."""

    def to_json(self) -> dict[str, object]:
        document: dict[str, object] = {
            "at": rfc3339(self.at),
            "duration_s": round(self.duration_s, 6),
            "ok": self.ok,
        }
        if not self.ok:
            document["reason"] = self.reason
        return document


@dataclass(frozen=True, slots=True, kw_only=True)
class CountReport:
    """What a target's broker last reported of its own connection count (its connector's
    `connectionCount=`), as the reads went."""

    count: int | None = None
    """The count in use (LEAST_CONNECTIONS adds this router's change since the read); None when
    the last read failed or none succeeded yet: the router's own count is used."""
    read_at: float | None = None
    """When a read last succeeded, in seconds since the epoch (kept when later reads fail)."""
    last_error: str | None = None
    """Why the last failed read failed (kept when later reads succeed); None: none failed."""
    last_error_at: float | None = None
    """When that was, in seconds since the epoch."""

    def read(self, count: int, at: float) -> CountReport:
        return dataclasses.replace(self, count=count, read_at=at)

    def failed(self, reason: str, at: float) -> CountReport:
        return dataclasses.replace(self, count=None, last_error=reason, last_error_at=at)


class TargetHistory:
    """What a router remembers about its targets besides the pool's state: each member's last
    probe, the last reason a target was not ready, when its operational state last changed, and
    its broker's last reports of its connection count.

    Mutable; `RouterRuntime` keeps one per router, changes it under the router's lock and passes
    the times in.
    """

    __slots__ = ("_changes", "_checks", "_counts", "_down", "_failures", "_reasons")

    def __init__(self) -> None:
        self._checks: dict[str, dict[int, CheckRecord]] = {}
        """Node id -> member index -> its last probe."""
        self._reasons: dict[str, str] = {}
        """Node id -> why it last failed (a probe, or a refused connect)."""
        self._changes: dict[str, tuple[OperationalState, float]] = {}
        """Node id -> its operational state and since when (seconds since the epoch)."""
        self._counts: dict[str, CountReport] = {}
        """Node id -> what its broker reported of its connection count."""
        self._failures: dict[str, int] = {}
        """Node id -> its failed probes so far (HAProxy's `chkfail`)."""
        self._down: dict[str, float] = {}
        """Node id -> the seconds it was down before its current state (HAProxy's `downtime`)."""

    def checked(self, node_id: str, member: int, record: CheckRecord) -> None:
        """Remember a member's probe (and its reason, when it failed)."""
        self._checks.setdefault(node_id, {})[member] = record
        if not record.ok:
            self._reasons[node_id] = record.reason
            self._failures[node_id] = self._failures.get(node_id, 0) + 1

    def failed(self, node_id: str, reason: str) -> None:
        """Remember why a target became not ready (a refused connect is not a probe)."""
        self._reasons[node_id] = reason

    def observe(self, node_id: str, state: OperationalState, now: float) -> bool:
        """Record a target's operational state at `now` (seconds since the epoch); whether it
        changed (the first observation of a node id counts as a change, at `now`)."""
        known = self._changes.get(node_id)
        if known is not None and known[0] is state:
            return False
        if known is not None and known[0] is OperationalState.DOWN:
            self._down[node_id] = self._down.get(node_id, 0.0) + max(0.0, now - known[1])
        self._changes[node_id] = (state, now)
        return True

    def check_failures(self, node_id: str) -> int:
        """How many of its probes (of any member) failed since it joined."""
        return self._failures.get(node_id, 0)

    def down_s(self, node_id: str, now: float | None) -> float:
        """How long it has been down since it joined: its past spells, and its current one to
        `now` (None: past spells only)."""
        down = self._down.get(node_id, 0.0)
        known = self._changes.get(node_id)
        if now is not None and known is not None and known[0] is OperationalState.DOWN:
            down += max(0.0, now - known[1])
        return down

    def counted(self, node_id: str, count: int | str, at: float) -> CountReport:
        """Remember a read of a broker's connection count at `at` (seconds since the epoch): the
        count, or (a str) why it could not be read. Returns the target's report before it."""
        before = self._counts.get(node_id, CountReport())
        self._counts[node_id] = before.failed(count, at) if isinstance(count, str) else before.read(count, at)
        return before

    def forget_count(self, node_id: str) -> None:
        """The target's connector no longer reads its broker's count: nothing of it is kept."""
        self._counts.pop(node_id, None)

    def count_report(self, node_id: str) -> CountReport:
        """What the target's broker reported of its connection count (all None: nothing yet)."""
        return self._counts.get(node_id, CountReport())

    def forget(self, node_id: str) -> None:
        """A target left the pool: nothing about it is kept."""
        self._checks.pop(node_id, None)
        self._reasons.pop(node_id, None)
        self._changes.pop(node_id, None)
        self._counts.pop(node_id, None)
        self._failures.pop(node_id, None)
        self._down.pop(node_id, None)

    def last_check(self, node_id: str, member: int | None = None) -> CheckRecord | None:
        """The last probe of a member, or (None) of any member of the target; None before any."""
        checks = self._checks.get(node_id, {})
        if member is not None:
            return checks.get(member)
        return max(checks.values(), key=lambda record: record.at, default=None)

    def reason(self, node_id: str) -> str:
        """Why the target last failed; "" when it never did."""
        return self._reasons.get(node_id, "")

    def last_change(self, node_id: str) -> float | None:
        """When the target's operational state last changed (or was first seen); None: never seen."""
        known = self._changes.get(node_id)
        return None if known is None else known[1]


TargetSection: TypeAlias = "Callable[[Target, TargetHistory, float | None], object | None]"
"""A feature's member of each target's status document: its JSON value for a target, from the
router's history, at a time in seconds since the epoch (None: no clock given, no ages); None: the
target has no such member. Called under the router's lock, with the snapshot; pure."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberStatus:
    """One member of an HA-pair target."""

    connector: str
    state: TargetState
    active: bool
    last_check: CheckRecord | None = None
    """Its last probe; None before any."""

    def to_json(self) -> dict[str, object]:
        return {
            "connector": self.connector,
            "state": self.state.value,
            "active": self.active,
            "last_check": None if self.last_check is None else self.last_check.to_json(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetStatus:
    """One target of a pool."""

    node_id: str
    local: bool
    connector: str | None
    """The connector's display URL; None for a local target without one."""
    state: TargetState
    admin_state: AdminState = AdminState.READY
    """What operators allow it: ready, drain or maint."""
    operational_state: OperationalState = OperationalState.DOWN
    """Both in one word: up, down, drain, maint or ejected (`router_target_state`)."""
    not_ready_reason: str | None = None
    """Why it is not ready (its last failed probe's or connect's words, not probed yet, no
    connector, in maintenance), or why passive health ejected it and for how long; None when
    ready and not ejected."""
    last_check: CheckRecord | None = None
    """Its last probe (of any member of an HA pair); None before any."""
    last_change: float | None = None
    """When its operational state last changed, in seconds since the epoch (until then: when
    the router started, or the target joined)."""
    connections: int | None
    """What LEAST_CONNECTIONS counts for it (our live connections, or the broker's report plus
    our change since)."""
    members: tuple[MemberStatus, ...] = ()
    """Each member of an HA pair; empty for a single broker."""
    sections: Mapping[str, object] = field(default_factory=dict)
    """The features' members of its document, each a JSON value (`TargetSection`)."""
    check_failures: int = 0
    """Its failed probes since it joined (`router_target_check_failures_total`)."""
    down_s: float = 0.0
    """How long it has been down since it joined, its current spell included
    (`router_target_down_seconds_total`)."""
    full: bool = False
    """Its gate refuses a new client now: at its `maxConnections` (or out of connect tokens)
    with its queue full (router/runtime/gates.py)."""

    @property
    def open(self) -> bool:
        """Whether it takes a new client now: up (ready, not drained, in maintenance or ejected)
        and its gate not full."""
        return self.operational_state is OperationalState.UP and not self.full

    @property
    def closed_because(self) -> str | None:
        """Why it takes no new client, in a word or two (`PoolStatus.closed`); None when open."""
        if self.open:
            return None
        if self.operational_state is OperationalState.UP:
            return "full"
        return _CLOSED_WORDS[self.operational_state]

    def to_json(self) -> dict[str, object]:
        document: dict[str, object] = {
            "node_id": self.node_id,
            "local": self.local,
            "connector": self.connector,
            "state": self.state.value,
            "admin_state": self.admin_state.value,
            "operational_state": self.operational_state.value,
            "open": self.open,
            "not_ready_reason": self.not_ready_reason,
            "last_check": None if self.last_check is None else self.last_check.to_json(),
            "last_change": None if self.last_change is None else rfc3339(self.last_change),
            "check_failures": self.check_failures,
            "down_s": round(self.down_s, 3),
        }
        if self.members:
            document["members"] = [m.to_json() for m in self.members]
        document["connections"] = self.connections
        document.update(self.sections)
        return document


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStatus:
    """A router's pool."""

    kind: str
    active: bool
    """Whether the quorum holds."""
    quorum_size: int
    targets: tuple[TargetStatus, ...]
    counted: int = 0
    """Targets that count for the quorum now (`Pool.ready_count`: ready, not in maintenance)."""

    @property
    def ready(self) -> tuple[str, ...]:
        """Node ids of the ready targets, in pool order."""
        return tuple(t.node_id for t in self.targets if t.state is TargetState.READY)

    @property
    def open(self) -> int:
        """How many targets take a new client now (`TargetStatus.open`)."""
        return sum(1 for t in self.targets if t.open)

    @property
    def closed(self) -> str:
        """Why the others take none, counted: "2 drained, 1 not ready" ("" when all are open)."""
        counts = collections.Counter(t.closed_because for t in self.targets if not t.open)
        return ", ".join(f"{counts[word]} {word}" for word in _CLOSED_ORDER if counts[word])

    @property
    def not_accepting(self) -> str | None:
        """Why a new client of this pool is refused now (one line), or None when one is taken:
        the quorum does not hold, or no target is open."""
        if not self.active:
            return (
                f"pool below its quorum, {self.counted} of {len(self.targets)} target(s) ready, "
                f"quorum-size {self.quorum_size}"
            )
        if self.open == 0:
            return f"0 of {len(self.targets)} target(s) open: {self.closed or 'none in the pool'}"
        return None

    def to_json(self) -> dict[str, object]:
        why = self.not_accepting
        return {
            "kind": self.kind,
            "active": self.active,
            "quorum_size": self.quorum_size,
            "open": self.open,
            "accepting": why is None,
            "not_accepting_reason": why,
            "targets": [t.to_json() for t in self.targets],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterStatus:
    """A router: its configuration as in force now, and its pool."""

    name: str
    key_type: str
    key_filter: str | None
    local_target_filter: str | None
    policy: str | None
    cache_entries: int | None
    """Stored cache entries; None without a cache."""
    pool: PoolStatus | None

    def to_json(self) -> dict[str, object]:
        """The router status document of the admin API (docs/operations.md)."""
        return {
            "name": self.name,
            "key_type": self.key_type,
            "key_filter": self.key_filter,
            "local_target_filter": self.local_target_filter,
            "policy": self.policy,
            "cache_entries": self.cache_entries,
            "pool": None if self.pool is None else self.pool.to_json(),
        }


def snapshot(
    config: RouterConfig,
    engine: RoutingEngine,
    pool: Pool | None,
    connections: LiveConnections,
    history: TargetHistory | None = None,
    now: float | None = None,
    sections: Mapping[str, TargetSection] | None = None,
    full: Callable[[str], bool] | None = None,
) -> RouterStatus:
    """Copy a router's state (call it under the router's lock).

    Args:
        config: the router's configuration.
        engine: its routing engine (filters, cache).
        pool: its pool; None without one.
        connections: its live connections.
        history: its targets' probes and changes; None: none known.
        now: the time, in seconds since the epoch, given to `sections` (which compute ages
            against it); None: no ages.
        sections: the features' members of each target's document, by name; None: none.
        full: whether a target's gate refuses a new client now (by node id); None: no gates.
    """
    pool_status = None
    if pool is not None and config.pool is not None:
        history = TargetHistory() if history is None else history
        pool_status = PoolStatus(
            kind=config.pool.kind.value,
            active=pool.active,
            quorum_size=pool.quorum_size,
            targets=tuple(
                _target(pool, t, connections, history, now, sections or {}, full) for t in pool.targets
            ),
            counted=pool.ready_count(),
        )
    return RouterStatus(
        name=config.name,
        key_type=config.key_type.value,
        key_filter=engine.key_filter,
        local_target_filter=engine.local_target_filter,
        policy=None if config.policy is None else config.policy.name,
        cache_entries=None if engine.cache is None else len(engine.cache),
        pool=pool_status,
    )


def _target(
    pool: Pool,
    target: Target,
    connections: LiveConnections,
    history: TargetHistory,
    now: float | None,
    sections: Mapping[str, TargetSection],
    full: Callable[[str], bool] | None,
) -> TargetStatus:
    node_id, connector = target.node_id, target.connector
    members: tuple[MemberStatus, ...] = ()
    if connector is not None and connector.backups:
        active = pool.active_member(node_id)
        states = pool.member_states(node_id)
        members = tuple(
            MemberStatus(
                connector=m.url, state=state, active=i == active, last_check=history.last_check(node_id, i)
            )
            for i, (m, state) in enumerate(zip(connector.members, states, strict=True))
        )
    state, admin, ejection = pool.state(node_id), pool.admin_state(node_id), pool.ejection(node_id)
    return TargetStatus(
        node_id=node_id,
        local=target.local,
        connector=None if connector is None else connector.display_url,
        state=state,
        admin_state=admin,
        operational_state=operational_state(state, admin, ejected=ejection is not None),
        not_ready_reason=_why_not_ready(target, state, admin, history, ejection),
        last_check=history.last_check(node_id),
        last_change=history.last_change(node_id),
        connections=connections.connection_count(node_id),
        members=members,
        sections={
            name: value
            for name, section in sections.items()
            if (value := section(target, history, now)) is not None
        },
        full=full is not None and full(node_id),
        check_failures=history.check_failures(node_id),
        down_s=history.down_s(node_id, now),
    )


# -- the process and its acceptors (GET /api/v1/status) ---------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptorStatus:
    """One acceptor as the status resource shows it."""

    name: str
    router: str
    host: str
    """Where it listens (the bound address: port 0 in the configuration shows the port it got)."""
    port: int
    mode: str
    """proxy, redirect or auto."""
    data_path: str
    """`fast` (the epoll thread) or `trio` (a task per connection)."""
    open: int
    """Client connections admitted and not closed yet, whatever they are doing (opening, waiting,
    answered, proxied)."""
    pending: int
    """Of those, the ones without a decision yet: reading the opening (TLS, PROXY header, sniffing),
    authenticating, or waiting for the quorum."""
    connections_allowed: int | None
    """`connectionsAllowed`; None: no limit of its own."""
    connections_allowed_per_source: int | None
    """`connectionsAllowedPerSource`; None: no limit."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "router": self.router,
            "host": self.host,
            "port": self.port,
            "mode": self.mode,
            "data_path": self.data_path,
            "open": self.open,
            "pending": self.pending,
            "connections_allowed": self.connections_allowed,
            "connections_allowed_per_source": self.connections_allowed_per_source,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessStatus:
    """The routerd process: who it is, and its descriptor budget."""

    pid: int
    version: str
    """The package's version (`routerctl --version` prints its own)."""
    started_at: float
    """When it started serving, in seconds since the epoch."""
    uptime_s: float
    descriptor_limit: int | None
    """Its soft RLIMIT_NOFILE (after raising it at start); None: unlimited."""
    descriptors_open: int | None
    """Descriptors open now; None where /proc/self/fd cannot be read."""
    client_budget: int
    """Client connections it serves at once at most (router/core/admission.py)."""
    client_connections: int
    """Client connections it holds now, every acceptor together (counted against the budget)."""

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "version": self.version,
            "started_at": self.started_at,
            "uptime_s": self.uptime_s,
            "descriptors": {"limit": self.descriptor_limit, "open": self.descriptors_open},
            "client_connections": {"budget": self.client_budget, "open": self.client_connections},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooKeeperStatus:
    """One ZooKeeper session of a router: its discovery pool's, or its shared cache's
    (router/core/zookeeper_link.py says what each state means)."""

    router: str
    use: str
    """`discovery` or `shared_cache`."""
    connect: str
    """The ensemble, `host:port[,host:port…]`."""
    path: str
    state: LinkState
    since: float
    """When `state` began, in seconds since the epoch (until the first change: when the client
    started)."""
    session_timeout_ms: int
    answer_timeout_ms: int

    def to_json(self) -> dict[str, object]:
        return {
            "router": self.router,
            "use": self.use,
            "connect": self.connect,
            "path": self.path,
            "state": self.state.value,
            "since": rfc3339(self.since),
            "session_timeout_ms": self.session_timeout_ms,
            "answer_timeout_ms": self.answer_timeout_ms,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerStatus:
    """The document of `GET /api/v1/status`: the process, its acceptors, the features' members
    (the state file's) and its ZooKeeper sessions (the routers have a resource of their own,
    `GET /api/v1/routers`)."""

    process: ProcessStatus
    acceptors: tuple[AcceptorStatus, ...]
    features: Mapping[str, object] = field(default_factory=dict)
    """The features' members, each a JSON value (`Service.process_status`: the admin states'
    `state_file`)."""
    zookeeper: tuple[ZooKeeperStatus, ...] = ()
    """Every router's ZooKeeper sessions (discovery, shared cache), by router and use."""

    def to_json(self) -> dict[str, object]:
        return {
            "process": self.process.to_json(),
            "acceptors": [a.to_json() for a in self.acceptors],
            **self.features,
            "zookeeper": [z.to_json() for z in self.zookeeper],
        }


def _why_not_ready(
    target: Target, state: TargetState, admin: AdminState, history: TargetHistory, ejection: Ejection | None
) -> str | None:
    if state is TargetState.READY:  # a drained target says nothing of an ejection under it
        return ejection.why if ejection is not None and admin is AdminState.READY else None
    if target.connector is None:
        return "no connector: a local target without <local-target-connector-ref> is never ready"
    if admin is AdminState.MAINT:
        return "in maintenance: not probed"
    if state is TargetState.UNKNOWN:
        return "not probed yet"
    return history.reason(target.node_id) or "its probe failed"
