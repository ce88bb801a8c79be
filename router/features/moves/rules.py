"""Paced moves of proxied connections: evacuating a target, rebalancing a pool, a paced shutdown.

Nobody moves an established TCP connection between processes, so the router moves *clients*: it
tells each one, in its protocol (router/core/framing.py), to go elsewhere, and its key is routed
again when it comes back. Doing that to thousands of clients at once is a reconnect storm on the
brokers that remain, so moves are paced (EMQX's node evacuation): `rate` connections per second,
the oldest first or in random order, in steps of `STEP_S`, with a status (moved, left, rate, ETA)
and an abort. Three things use the same pacing:

- **evacuation** of one target (operator: `routerctl evacuate`): the target is drained first, so
  no new connection goes there, and its connections are moved until none is left;
- **rebalance** of a pool (operator: `routerctl rebalance`): from each target with more than
  `band` above the mean of the ready targets, just enough connections to bring it within the band
  are moved, each to the ready target with the fewest connections at that moment;
- **shutdown** (SIGTERM, `routerctl shutdown`): every connection, at the rate that moves the last
  one before the grace period ends (`shutdown_rate`).

This module holds the pure parts: the request, its status, how many moves are due, which
connections go first, what a rebalance moves. service.py carries them out.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import random
    from collections.abc import Mapping, Sequence

    from router.config.settings import RouterConfig
    from router.core.live import LiveConnection

__all__ = [
    "DEFAULT_BAND",
    "DEFAULT_RATE",
    "STEP_S",
    "MoveKind",
    "MoveOrder",
    "MoveRequest",
    "MoveState",
    "MoveStatus",
    "due",
    "first_to_move",
    "rebalance_destination",
    "rebalance_excess",
    "rebalance_refusal",
    "request_of",
    "shutdown_rate",
]

DEFAULT_RATE: Final = 50.0
"""Connections moved per second when the operator gives no rate: a fleet's brokers take 50
reconnects a second in their stride (a client's CONNECT costs a broker well under a millisecond)."""
DEFAULT_BAND: Final = 0.1
"""A rebalance leaves a target alone within 10 % above the mean of the ready targets."""
STEP_S: Final = 0.1
"""How often due moves are made: 10 steps a second keep a high rate smooth."""
SHUTDOWN_SHARE: Final = 0.8
"""A paced shutdown plans to move the last connection by this share of the grace period, leaving
the rest of it for the farewells to be read and the clients to close."""


class MoveKind(enum.Enum):
    EVACUATE = "evacuate"
    REBALANCE = "rebalance"
    SHUTDOWN = "shutdown"


class MoveOrder(enum.Enum):
    OLDEST = "oldest"
    """Longest-open connections first."""
    RANDOM = "random"
    """In random order (clients of one application, connected together, leave spread out)."""


class MoveState(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"
    """Running, but nothing can be moved now (no other ready target to send clients to)."""
    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveRequest:
    """What an operator (or a shutdown) asked for."""

    kind: MoveKind
    router: str
    node_id: str | None = None
    """The target evacuated; None for a rebalance or a shutdown."""
    rate: float = DEFAULT_RATE
    """Connections per second."""
    order: MoveOrder = MoveOrder.OLDEST
    band: float = DEFAULT_BAND
    """A rebalance's tolerance above the mean (0.1 = 10 %)."""
    refer: bool | None = None
    """Whether clients are told the address of the target their key routes to now (MQTT 5 Server
    Reference, AMQP redirect, OpenWire reconnectTo): None = as their acceptor's mode says
    (`framing.farewell`); True when the brokers are reachable by the clients of a proxy acceptor."""

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of connections per second, got {self.rate!r}")
        if not (0 <= self.band < math.inf):
            raise ValueError(f"band must be 0 or more (0.1 = 10 % above the mean), got {self.band!r}")
        if (self.kind is MoveKind.EVACUATE) != (self.node_id is not None):
            raise ValueError("an evacuation names one target; a rebalance or a shutdown none")

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "router": self.router,
            "node_id": self.node_id,
            "rate": self.rate,
            "order": self.order.value,
            "band": self.band,
            "refer": self.refer,
        }


def request_of(document: Mapping[str, object]) -> MoveRequest:
    """`MoveRequest.to_json`'s object back (a worker's order from its supervisor).

    Raises:
        ValueError: not such an object (a value out of its range included).
        KeyError: a member missing.
    """
    node, refer = document["node_id"], document["refer"]
    return MoveRequest(
        kind=MoveKind(document["kind"]),
        router=str(document["router"]),
        node_id=None if node is None else str(node),
        rate=float(str(document["rate"])),
        order=MoveOrder(document["order"]),
        band=float(str(document["band"])),
        refer=None if refer is None else bool(refer),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveStatus:
    """Where a paced move stands (the admin API's and `routerctl`'s answer)."""

    request: MoveRequest
    state: MoveState
    started_at: float
    """Seconds since the epoch."""
    moved: int
    """Clients told to go (or closed) so far."""
    left: int
    """Connections still to move now."""
    rate: float
    """Moves per second achieved so far."""
    eta_s: float | None
    """Seconds until done at the requested rate; None once finished."""
    finished_at: float | None = None
    note: str = ""
    """Why it waits or ended early, e.g. "no other ready target"."""

    def to_json(self) -> dict[str, object]:
        return {
            **self.request.to_json(),
            "state": self.state.value,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "moved": self.moved,
            "left": self.left,
            "achieved_rate": round(self.rate, 3),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 3),
            "note": self.note,
        }


def due(rate: float, elapsed_s: float, moved: int, *, at_once: bool = True) -> int:
    """How many moves are due after `elapsed_s` of a paced move that made `moved`: `rate` a
    second, the first one at once (`at_once`) or after one interval (a shutdown: connections that
    end by themselves meanwhile need not be moved). Never negative."""
    return max(0, math.floor(elapsed_s * rate) + (1 if at_once else 0) - moved)


def first_to_move(
    connections: Sequence[LiveConnection], count: int, order: MoveOrder, rng: random.Random
) -> list[LiveConnection]:
    """The `count` connections to move next, among those given (in the order they were opened)."""
    if count <= 0:
        return []
    if order is MoveOrder.OLDEST:
        return sorted(connections, key=lambda c: c.opened_at)[:count]
    return rng.sample(list(connections), min(count, len(connections)))


def rebalance_excess(counts: Mapping[str, int], band: float) -> dict[str, int]:
    """How many connections to move off each target so that none is more than `band` above the
    mean of the targets given (the ready ones); targets within the band are left out.

    Args:
        counts: open connections per ready target.
        band: the tolerance above the mean, e.g. 0.1.
    """
    if len(counts) < 2:
        return {}
    mean = sum(counts.values()) / len(counts)
    ceiling = math.floor(mean * (1 + band))
    ceiling = max(ceiling, math.ceil(mean))  # a band too narrow for whole connections: the mean
    return {node_id: count - ceiling for node_id, count in counts.items() if count > ceiling}


def rebalance_destination(planned: Mapping[str, int], leaving: str) -> str | None:
    """Where a rebalance sends a connection moved off `leaving`: the emptiest other target of its
    plan (`planned`: connections per ready target, those sent there since included), the first
    node id on a tie; None when there is no other."""
    others = {node_id: count for node_id, count in planned.items() if node_id != leaving}
    return min(others, key=lambda node_id: (others[node_id], node_id)) if others else None


def rebalance_refusal(router: RouterConfig) -> str | None:
    """Why a router cannot rebalance, or None: a rebalance sends moved keys to the emptiest target
    through the cache; without one, only LEAST_CONNECTIONS sends a returning client to the
    emptiest target by itself (any other policy would send it back where it was)."""
    policy = router.policy.name if router.policy is not None else None
    if router.cache is None and policy != "LEAST_CONNECTIONS":
        return (
            f"router {router.name!r} cannot rebalance: without a <cache> its {policy} policy would send "
            "moved clients back where they were (add a cache, or use LEAST_CONNECTIONS)"
        )
    return None


def shutdown_rate(open_connections: int, grace_s: float) -> float:
    """The rate that moves `open_connections`, evenly spread, the last one at `SHUTDOWN_SHARE` of
    the grace period (a shutdown's moves start one interval in: `due(at_once=False)`).

    Raises:
        ValueError: no connection or no grace period (nothing to pace).
    """
    if open_connections <= 0 or grace_s <= 0:
        raise ValueError(f"nothing to pace: {open_connections} connection(s) over {grace_s} s")
    return open_connections / (grace_s * SHUTDOWN_SHARE)
