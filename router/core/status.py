"""A router's state as an operator sees it: a frozen snapshot of engine, pool and connections;
and the process's (`ServerStatus`: pid, version, descriptor budget, acceptors with their counts).

Pure: `snapshot` reads the live objects and copies what the admin API and `routerctl status`
show; `RouterRuntime.status` calls it under the router's lock, so a snapshot is consistent even
while the fast path's thread routes. The process's facts (clock, /proc) are read by
router/services/process.py, which builds a `ServerStatus` from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pools import AdminState, TargetState

if TYPE_CHECKING:
    from pools import Pool, Target
    from router.config.settings import RouterConfig
    from router.core.engine import RoutingEngine
    from router.core.live import LiveConnections

__all__ = [
    "AcceptorStatus",
    "MemberStatus",
    "PoolStatus",
    "ProcessStatus",
    "RouterStatus",
    "ServerStatus",
    "TargetStatus",
    "snapshot",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberStatus:
    """One member of an HA-pair target."""

    connector: str
    state: TargetState
    active: bool


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
    connections: int | None
    """What LEAST_CONNECTIONS counts for it (our live connections, or the broker's report plus
    our change since)."""
    members: tuple[MemberStatus, ...] = ()
    """Each member of an HA pair; empty for a single broker."""

    def to_json(self) -> dict[str, object]:
        document: dict[str, object] = {
            "node_id": self.node_id,
            "local": self.local,
            "connector": self.connector,
            "state": self.state.value,
            "admin_state": self.admin_state.value,
        }
        if self.members:
            document["members"] = [
                {"connector": m.connector, "state": m.state.value, "active": m.active} for m in self.members
            ]
        document["connections"] = self.connections
        return document


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStatus:
    """A router's pool."""

    kind: str
    active: bool
    """Whether the quorum holds."""
    quorum_size: int
    targets: tuple[TargetStatus, ...]

    @property
    def ready(self) -> tuple[str, ...]:
        """Node ids of the ready targets, in pool order."""
        return tuple(t.node_id for t in self.targets if t.state is TargetState.READY)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "active": self.active,
            "quorum_size": self.quorum_size,
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
    config: RouterConfig, engine: RoutingEngine, pool: Pool | None, connections: LiveConnections
) -> RouterStatus:
    """Copy a router's state (call it under the router's lock)."""
    pool_status = None
    if pool is not None and config.pool is not None:
        pool_status = PoolStatus(
            kind=config.pool.kind.value,
            active=pool.active,
            quorum_size=pool.quorum_size,
            targets=tuple(_target(pool, t, connections) for t in pool.targets),
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


def _target(pool: Pool, target: Target, connections: LiveConnections) -> TargetStatus:
    connector = target.connector
    members: tuple[MemberStatus, ...] = ()
    if connector is not None and connector.backups:
        active = pool.active_member(target.node_id)
        states = pool.member_states(target.node_id)
        members = tuple(
            MemberStatus(connector=m.url, state=state, active=i == active)
            for i, (m, state) in enumerate(zip(connector.members, states, strict=True))
        )
    return TargetStatus(
        node_id=target.node_id,
        local=target.local,
        connector=None if connector is None else connector.display_url,
        state=pool.state(target.node_id),
        admin_state=pool.admin_state(target.node_id),
        connections=connections.connection_count(target.node_id),
        members=members,
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
class ServerStatus:
    """The document of `GET /api/v1/status`: the process and its acceptors (the routers have a
    resource of their own, `GET /api/v1/routers`)."""

    process: ProcessStatus
    acceptors: tuple[AcceptorStatus, ...]

    def to_json(self) -> dict[str, object]:
        return {"process": self.process.to_json(), "acceptors": [a.to_json() for a in self.acceptors]}
