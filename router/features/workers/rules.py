"""What `routerd --workers N` accepts, and what the supervisor tells its workers (pure).

The board (`_zone.c`) carries one router's targets as the supervisor sees them: each member's
readiness from its probes and each target's administrative state. A worker, which does not
probe, brings its pool to that (`changes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias

from pools.pool import AdminState, TargetState
from router.features.workers.zone import ZONE_CACHE_RULE

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from pools.pool import Pool
    from router.config.settings import Config

__all__ = [
    "SUMMED",
    "Board",
    "Change",
    "Snapshot",
    "add_snapshots",
    "board_of",
    "changes",
    "counts_of",
    "decode_snapshot",
    "encode_snapshot",
    "refusal",
]

SUMMED: Final = frozenset(
    {
        "router_connections_accepted_total",
        "router_routing_decisions_total",
        "router_routing_refusals_total",
        "router_connections_refused_total",
        "router_client_errors_total",
        "router_authentication_failures_total",
        "router_client_connections",
        "router_client_connection_budget",
        "router_proxied_connections",
        "router_proxied_connections_closed_total",
        "router_proxied_bytes_total",
        "router_target_connect_failures_total",
        "router_target_connect_duration_seconds",
        "router_connect_redispatches_total",
        "router_target_outlier_failures_total",
        "router_target_ejections_total",
        "router_target_queue_wait_seconds",
        "router_target_queue_length",
        "router_target_gate_connections",
        "router_acceptor_paused_seconds_total",
        "router_evacuation_moved_total",
        "router_log_lines_suppressed_total",
    }
)
"""The metric families a worker's connections count: the supervisor's `/metrics` shows each as its
own value plus every worker's. The others are the supervisor's alone: what it does for all
(probes, targets' and pools' states, reloads, the admin API), and the cache's, which is the zone's
and so counts every process already."""

Snapshot: TypeAlias = dict[str, tuple[str, dict[tuple[str, ...], float | list[float]]]]
"""A process's summed families: name -> (kind: "counter", "gauge" or "histogram", label set ->
value; a histogram's value is its buckets' counts, each on its own, then the sum)."""


def refusal(config: Config, workers: int) -> str | None:
    """Why `config` cannot be served by `workers` processes (one line for the operator); None when
    it can (one process serves anything)."""
    if workers == 1:
        return None
    for router in config.routers:
        if router.cache is not None and (router.cache.persisted or router.cache_zookeeper is not None):
            return f"--workers {workers}: connection router {router.name!r}: {ZONE_CACHE_RULE}"
        if config.pool_discovery_group(router) is not None:
            return (
                f"--workers {workers}: connection router {router.name!r} discovers its pool's members; "
                "with several workers a pool is static (or a cluster's static connectors)"
            )
    if config.event_log is not None:
        return f"--workers {workers}: the event log is written by one process; run one worker with it"
    for acceptor in config.acceptors:
        if acceptor.port == 0:
            return (
                f"--workers {workers}: acceptor {acceptor.name!r} has port 0 (each process would "
                "listen on a port of its own); give it a port"
            )
    return None


@dataclass(frozen=True, slots=True)
class Board:
    """One router's targets as the supervisor sees them, and its configuration's generation."""

    generation: int
    """One more at each reload the supervisor made: a worker seeing it change reloads too."""
    members: Mapping[str, tuple[TargetState, ...]]
    """Node id -> the readiness of each member (one for a plain target, two for an HA pair)."""
    admin: Mapping[str, AdminState]
    """Node id -> its administrative state, for those not `ready`."""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "generation": self.generation,
                "members": {node: [s.value for s in states] for node, states in self.members.items()},
                "admin": {node: state.value for node, state in self.admin.items()},
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Board:
        document = json.loads(data)
        return cls(
            generation=int(document["generation"]),
            members={
                node: tuple(TargetState(s) for s in states) for node, states in document["members"].items()
            },
            admin={node: AdminState(state) for node, state in document["admin"].items()},
        )


def board_of(pool: Pool | None, generation: int) -> Board:
    """The board of a router with this pool (the supervisor's)."""
    if pool is None:
        return Board(generation, {}, {})
    return Board(
        generation,
        members={t.node_id: pool.member_states(t.node_id) for t in pool.targets},
        admin=pool.admin_states(),
    )


@dataclass(frozen=True, slots=True)
class Change:
    """One thing a worker changes in its pool: a member's probe outcome, or an administrative state."""

    node_id: str
    member: int | None
    """The member whose readiness changes (`ready`); None: the administrative state changes."""
    ready: bool = False
    admin: AdminState = AdminState.READY


def changes(board: Board, pool: Pool) -> list[Change]:
    """What a worker's `pool` must change to be as `board` says, administrative states first (a
    target in maintenance takes no probe outcome). Targets only one side has are left alone (a
    reload the other side has not made yet); a member the supervisor has not probed yet too."""
    out: list[Change] = []
    mine = pool.admin_states()
    for target in pool.targets:
        node = target.node_id
        if node not in board.members:
            continue
        wanted = board.admin.get(node, AdminState.READY)
        if mine.get(node, AdminState.READY) is not wanted:
            out.append(Change(node, None, admin=wanted))
    for target in pool.targets:
        node = target.node_id
        published = board.members.get(node)
        if published is None:
            continue
        for member, (theirs, ours) in enumerate(zip(published, pool.member_states(node), strict=False)):
            if theirs is not TargetState.UNKNOWN and theirs is not ours:
                out.append(Change(node, member, ready=theirs is TargetState.READY))
    return out


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """One line of JSON (a worker sends one every period)."""
    return (
        json.dumps(
            {
                name: [kind, [[*labels, value] for labels, value in values.items()]]
                for name, (kind, values) in snapshot.items()
            },
            separators=(",", ":"),
        ).encode()
        + b"\n"
    )


def decode_snapshot(line: bytes) -> Snapshot:
    """`encode_snapshot`'s line back.

    Raises:
        ValueError: not such a line.
    """
    document = json.loads(line)
    if not isinstance(document, dict):
        raise ValueError(f"a snapshot is a JSON object, got {type(document).__name__}")
    return {
        str(name): (str(kind), {tuple(str(label) for label in row[:-1]): row[-1] for row in rows})
        for name, (kind, rows) in document.items()
    }


def counts_of(snapshot: Snapshot) -> Snapshot:
    """What of a snapshot only goes up (counters and histograms): what stays counted once the
    worker that sent it is gone (its gauges went with its connections)."""
    return {name: (kind, values) for name, (kind, values) in snapshot.items() if kind != "gauge"}


def add_snapshots(snapshots: Iterable[Snapshot]) -> Snapshot:
    """The sum of several processes' snapshots, label set by label set."""
    total: Snapshot = {}
    for snapshot in snapshots:
        for name, (kind, values) in snapshot.items():
            _, into = total.setdefault(name, (kind, {}))
            for labels, value in values.items():
                have = into.get(labels)
                if isinstance(value, list):
                    base = have if isinstance(have, list) else [0.0] * len(value)
                    into[labels] = [a + b for a, b in zip(base, value, strict=False)]
                else:
                    into[labels] = (have if isinstance(have, float | int) else 0.0) + value
    return total
