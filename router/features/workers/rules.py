"""What `routerd --workers N` accepts, and what the supervisor tells its workers (pure).

The board (`_zone.c`) carries one router's targets as the supervisor sees them: each member's
readiness from its probes and each target's administrative state. A worker, which does not
probe, brings its pool to that (`changes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pools.pool import AdminState, TargetState
from router.features.workers.zone import ZONE_CACHE_RULE

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pools.pool import Pool
    from router.config.settings import Config

__all__ = ["Board", "Change", "board_of", "changes", "refusal"]


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
