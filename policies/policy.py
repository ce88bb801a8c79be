"""Policies: how a router picks one target from the ready targets of its pool (SPEC A3).

Pure decision code: no clock, no I/O. A policy may hold state that Artemis's policies hold too
(the round-robin position), and what it derives from its targets (CONSISTENT_HASH's ketama rings,
`policies/ketama.py`). Policies register themselves by their Artemis name through
`__init_subclass__`, so the configuration loader and `make_policy` find them by name.
"""

from __future__ import annotations

import bisect
import math
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, Final, Protocol, TypeVar

from policies.hashing import artemis_hash
from policies.ketama import KetamaRing

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pools.target import Target

__all__ = [
    "MAX_LOAD_FACTOR",
    "RING_TYPES",
    "ConnectionCountSource",
    "ConsistentHashModuloPolicy",
    "ConsistentHashPolicy",
    "FirstElementPolicy",
    "LeastConnectionsPolicy",
    "Policy",
    "PolicyConfig",
    "RoundRobinPolicy",
    "SlowStartSource",
    "make_policy",
    "policy_names",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """The `<policy name="…"><property key="…" value="…"/></policy>` element."""

    name: str
    """One of the registered policy names (FIRST_ELEMENT, ROUND_ROBIN, …)."""
    properties: tuple[tuple[str, str], ...] = field(default=())
    """Properties in document order."""

    def __post_init__(self) -> None:
        if self.name not in Policy.registry:
            raise ValueError(f"unknown policy {self.name!r}, expected one of {policy_names()}")
        cls = Policy.registry[self.name]
        for key, _ in self.properties:
            if key not in cls.PROPERTIES:
                allowed = ", ".join(sorted(cls.PROPERTIES)) or "none"
                raise ValueError(f"policy {self.name} has no property {key!r} (accepted: {allowed})")
        cls.validate_properties(dict(self.properties))

    @property
    def keyed(self) -> bool:
        """Whether this policy, with these properties, picks by the key and the ready targets alone
        (`Policy.is_keyed`)."""
        return Policy.registry[self.name].is_keyed(dict(self.properties))


class ConnectionCountSource(Protocol):
    """Where LEAST_CONNECTIONS and bounded-load CONSISTENT_HASH read connection counts (router-counted
    plus broker-reported)."""

    def connection_count(self, node_id: str) -> int | None:
        """The current count for a target, or None when it is unknown."""
        ...


class SlowStartSource(Protocol):
    """Where ROUND_ROBIN, LEAST_CONNECTIONS and bounded-load CONSISTENT_HASH read the slow-start
    shares of targets that became ready again (connector `slowStart`, pools/gates.py)."""

    def ramping(self) -> Mapping[str, float]:
        """The share (0 < share < 1) of each target in slow start now; empty when none is."""
        ...


class Policy:
    """Base of all policies. Subclasses set `NAME` and are registered under it."""

    NAME: ClassVar[str] = ""
    PROPERTIES: ClassVar[frozenset[str]] = frozenset()
    KEYED: ClassVar[bool] = False
    """Whether the pick is a function of the key and the ready targets alone (no state such as a
    round-robin position or connection counts): `routerctl simulate` can predict it. This is the
    policy with its default properties; `is_keyed` (and `PolicyConfig.keyed`) says it for the
    properties given (CONSISTENT_HASH with LOAD_FACTOR is not)."""
    STICKY: ClassVar[bool] = False
    """Whether a key belongs to one target (a hash of the key): a client its target's gate holds
    back (maxConnections, connectRate) waits for that target instead of going to another one."""
    registry: ClassVar[dict[str, type[Policy]]] = {}

    TRANSFORMS: ClassVar[bool] = False
    """Whether `transform_key` changes keys (set for each subclass from whether it overrides it):
    a decision skips the call for a policy that does not."""

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.TRANSFORMS = cls.transform_key is not Policy.transform_key
        # Only a class that names itself registers: a subclass (LEAST_CONNECTIONS extends
        # ROUND_ROBIN, a test fake extends a policy) must not replace its parent's entry.
        if cls.__dict__.get("NAME"):
            Policy.registry[cls.NAME] = cls

    def __init__(
        self,
        properties: Mapping[str, str],
        *,
        round_robin_start: int | None = None,
        counts: ConnectionCountSource | None = None,
        slow_start: SlowStartSource | None = None,
    ) -> None:
        del properties, round_robin_start, counts
        self.slow_start = slow_start
        """The slow-start shares of targets that became ready again (None: every share is full)."""
        self.reads_counts = False
        """Whether each pick reads the targets' connection counts (LEAST_CONNECTIONS, CONSISTENT_HASH
        with LOAD_FACTOR): a data path then has every connection counted from its decision on."""

    @classmethod
    def validate_properties(cls, properties: Mapping[str, str]) -> None:
        """Reject bad property values (raise ValueError naming the property and value)."""
        del properties

    @classmethod
    def is_keyed(cls, properties: Mapping[str, str]) -> bool:
        """`KEYED` for these (valid) properties: a property may make a keyed policy stateful
        (CONSISTENT_HASH with LOAD_FACTOR reads connection counts)."""
        del properties
        return cls.KEYED

    def transform_key(self, key: str) -> str:
        """Transform a non-NULL key before the local filter and cache (SPEC A1 step 3)."""
        return key

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        """Pick one of the ready targets (in pool order) for a key, or None when there are none."""
        raise NotImplementedError


def policy_names() -> list[str]:
    """The registered policy names, sorted."""
    return sorted(Policy.registry)


def make_policy(
    config: PolicyConfig,
    *,
    round_robin_start: int | None = None,
    counts: ConnectionCountSource | None = None,
    slow_start: SlowStartSource | None = None,
) -> Policy:
    """Build the policy a configuration names.

    Args:
        config: the validated policy element.
        round_robin_start: first round-robin position (tests); random when None, as in Artemis.
        counts: connection counts for LEAST_CONNECTIONS and CONSISTENT_HASH with LOAD_FACTOR;
            every count unknown when None.
        slow_start: the slow-start shares of targets that became ready again; every share full
            when None.

    Returns:
        A fresh policy instance with its own state.
    """
    cls = Policy.registry[config.name]
    return cls(
        dict(config.properties), round_robin_start=round_robin_start, counts=counts, slow_start=slow_start
    )


class FirstElementPolicy(Policy):
    """The first ready target in pool order: a priority list."""

    NAME = "FIRST_ELEMENT"
    KEYED = True

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        return targets[0] if targets else None


class RoundRobinPolicy(Policy):
    """Each call takes the next target; the key is ignored.

    Like Artemis: `pos %= n; pick targets[pos]; pos += 1`, starting at a random position.

    Slow start (a target that became ready again, `slow_start.ramping()`): a target at share s
    takes only s of its turns, deterministically. Each turn that lands on it adds s to its credit;
    it takes the turn when its credit reaches 1 (then less 1), else the turn passes to the next
    target. With no target in slow start this is Artemis's sequence exactly.
    """

    NAME = "ROUND_ROBIN"

    def __init__(
        self,
        properties: Mapping[str, str],
        *,
        round_robin_start: int | None = None,
        counts: ConnectionCountSource | None = None,
        slow_start: SlowStartSource | None = None,
    ) -> None:
        super().__init__(
            properties, round_robin_start=round_robin_start, counts=counts, slow_start=slow_start
        )
        # Artemis starts at RandomUtil.randomInterval(0, Integer.MAX_VALUE).
        self.position = random.randrange(2**31 - 1) if round_robin_start is None else round_robin_start
        self.shared: tuple[Callable[[int], int], Callable[[], int]] | None = None
        """A position shared with other processes (router/features/workers/zone.py) instead of
        `position`: (the index of the next turn among n targets, the position now)."""
        self._credit: dict[str, float] = {}
        """Slow start: the credit of each ramping target (see the class docstring)."""

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        if not targets:
            return None
        ramping = None if self.slow_start is None else self.slow_start.ramping()
        if not ramping:
            if self._credit:
                self._credit.clear()
            return self._next(targets)
        # Every share is > 0, so each ramping target's credit reaches 1 within 1/share turns: the
        # loop ends (the bound is a guard against a share of 0 from a faulty source).
        for _ in range(len(targets) * _MAX_TURNS_PASSED):
            target = self._next(targets)
            share = ramping.get(target.node_id)
            if share is None:
                return target
            credit = self._credit.get(target.node_id, 0.0) + share
            if credit >= 1.0:
                self._credit[target.node_id] = credit - 1.0
                return target
            self._credit[target.node_id] = credit
        return self._next(targets)

    def _next(self, targets: Sequence[Target]) -> Target:
        if self.shared is not None:
            return targets[self.shared[0](len(targets))]
        # No shortcut for one target: Artemis's RoundRobinPolicy.selectTarget runs `pos %= n;
        # targets.get(pos++)` for every non-empty list, so a single pick moves the position too.
        self.position %= len(targets)
        target = targets[self.position]
        self.position += 1
        return target

    def __copy__(self) -> RoundRobinPolicy:
        """A copy that moves its own position (a dry run's), from the shared one's when shared."""
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._credit = dict(self._credit)
        if self.shared is not None:
            twin.position, twin.shared = self.shared[1](), None
        return twin


_MAX_TURNS_PASSED: Final = 21
"""Slow start: turns ROUND_ROBIN passes on per target at most before it takes one (a share is at
least pools.gates.SLOW_START_FLOOR, 1/20)."""

RING_TYPES: Final = ("ARTEMIS", "KETAMA")
"""Values of CONSISTENT_HASH's `RING` property (default ARTEMIS)."""

MAX_LOAD_FACTOR: Final = 10
"""Largest `LOAD_FACTOR`. HAProxy's `hash-balance-factor` is a percentage (125 means 1.25 here),
so a value copied from it is an error, not a bound that never binds; with a factor c a target may
take c times its share, so above 10 nothing is bounded below 10 targets anyway."""

_K = TypeVar("_K")
_R = TypeVar("_R")

_DECIMAL: Final = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?")

_RINGS_KEPT: Final = 4
"""Rings a CONSISTENT_HASH policy keeps, one per list of targets it met last (node ids, and
weights for ketama): a target that flaps alternates two lists. A ketama ring is some 160 points
per target (one of 100 targets takes about 50 ms to build and 1 MB to keep); Artemis's ring is
one point per target, kept so that a pick hashes the key alone, not every node id."""


def _ring_settings(properties: Mapping[str, str]) -> tuple[str, Fraction | None]:
    """CONSISTENT_HASH's (RING, LOAD_FACTOR), validated; LOAD_FACTOR None when not given."""
    ring = properties.get("RING", "ARTEMIS")
    if ring not in RING_TYPES:
        raise ValueError(f"RING must be one of {', '.join(RING_TYPES)}, got {ring!r}")
    value = properties.get("LOAD_FACTOR")
    if value is None:
        return ring, None
    factor = Fraction(value) if _DECIMAL.fullmatch(value) else Fraction(0)
    if not 1 < factor <= MAX_LOAD_FACTOR:
        raise ValueError(
            f"LOAD_FACTOR must be a decimal number > 1 and <= {MAX_LOAD_FACTOR} (1.25: a target "
            f"takes at most 25 % more than its share), got {value!r}"
        )
    if ring != "KETAMA":
        raise ValueError(f"LOAD_FACTOR needs RING=KETAMA (got RING={ring!r}): LOAD_FACTOR={value!r}")
    return ring, factor


class _ArtemisRing:
    """Artemis's ring for one list of targets: one point per target at `artemis_hash(node_id)`,
    with the index in that list of the target that owns each point."""

    __slots__ = ("owners", "points")

    def __init__(self, node_ids: Sequence[str]) -> None:
        ring: dict[int, int] = {}
        for i, node_id in enumerate(node_ids):
            ring[artemis_hash(node_id)] = i  # later target wins, as Java's TreeMap.put
        self.points = sorted(ring)
        self.owners = [ring[p] for p in self.points]

    def owner(self, key: str) -> int:
        """The index of the target with the greatest point <= hash(key), else the smallest point
        (Artemis: `floorEntry(hash) ?? firstEntry()`)."""
        index = bisect.bisect_right(self.points, artemis_hash(key)) - 1
        return self.owners[index] if index >= 0 else self.owners[0]


class _PlacedRing:
    """A ketama ring for one list of targets, with each node id's index in that list."""

    __slots__ = ("index", "ring")

    def __init__(self, nodes: Sequence[tuple[str, int]]) -> None:
        self.ring = KetamaRing(nodes)
        self.index = {node_id: i for i, (node_id, _) in enumerate(nodes)}


class ConsistentHashPolicy(Policy):
    """The same key always picks the same target while the ready set is unchanged.

    `RING=ARTEMIS` (the default, Artemis-exact): each target is one point on a ring at
    `artemis_hash(node_id)`; on equal hashes the later target wins. The pick is the greatest
    point <= hash(key) (signed), else the smallest point. Weights are ignored, as in Artemis.

    `RING=KETAMA`: libketama's weighted continuum (`policies/ketama.py`). With `LOAD_FACTOR` c,
    bounded-load consistent hashing (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with
    Bounded Loads", 2018; HAProxy's `hash-balance-factor`): a target of weight w may hold at most
    `ceil(c * (L + 1) * w / W)` connections, L being the connections of all ready targets and W
    their total weight; the pick is the first target clockwise from the key's point that holds
    fewer. Counts come from `counts`; a target whose count is unknown is passed over, and when
    no target has room (or no count is known) the key's own target is taken. Slow start scales a
    target's weight in its capacity (w * share), not on the ring: keys keep their targets, and a
    ramping target passes the keys over its ramped capacity on to the next one clockwise.
    Without LOAD_FACTOR slow start ramps the admission only (pools/gates.py).
    """

    NAME = "CONSISTENT_HASH"
    STICKY = True
    KEYED = True
    PROPERTIES = frozenset({"RING", "LOAD_FACTOR"})

    def __init__(
        self,
        properties: Mapping[str, str],
        *,
        round_robin_start: int | None = None,
        counts: ConnectionCountSource | None = None,
        slow_start: SlowStartSource | None = None,
    ) -> None:
        super().__init__(
            properties, round_robin_start=round_robin_start, counts=counts, slow_start=slow_start
        )
        self.ring_type, self.load_factor = _ring_settings(properties)
        self.counts = counts
        self.reads_counts = self.load_factor is not None
        self._rings: dict[tuple[tuple[str, int], ...], _PlacedRing] = {}
        self._artemis_rings: dict[tuple[str, ...], _ArtemisRing] = {}

    @classmethod
    def validate_properties(cls, properties: Mapping[str, str]) -> None:
        _ring_settings(properties)

    @classmethod
    def is_keyed(cls, properties: Mapping[str, str]) -> bool:
        return "LOAD_FACTOR" not in properties

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        if not targets:
            return None
        if len(targets) == 1:
            return targets[0]
        if self.ring_type == "ARTEMIS":
            node_ids = tuple([t.node_id for t in targets])
            artemis = self._artemis_rings.get(node_ids)
            if artemis is None:
                artemis = _keep(self._artemis_rings, node_ids, _ArtemisRing(node_ids))
            return targets[artemis.owner(key)]
        placed = self._placed(targets)
        if self.load_factor is None:
            return targets[placed.index[placed.ring.node(key)]]
        return self._select_bounded(targets, key, placed, self.load_factor)

    def ring(self, targets: Sequence[Target]) -> KetamaRing:
        """The ketama ring of these targets: built once per list of (node id, weight) and kept
        while it is among the last few lists met.

        Raises:
            ValueError: no targets, or a node id twice.
        """
        return self._placed(targets).ring

    def _placed(self, targets: Sequence[Target]) -> _PlacedRing:
        nodes = tuple([(t.node_id, t.weight) for t in targets])
        placed = self._rings.get(nodes)
        return _keep(self._rings, nodes, _PlacedRing(nodes)) if placed is None else placed

    def _select_bounded(
        self, targets: Sequence[Target], key: str, placed: _PlacedRing, factor: Fraction
    ) -> Target:
        counts = self.counts
        loads = [None if counts is None else counts.connection_count(t.node_id) for t in targets]
        total = sum(load for load in loads if load is not None)
        ramping = None if self.slow_start is None else self.slow_start.ramping()
        if ramping:
            return self._select_bounded_ramping(targets, key, placed, factor, loads, total, ramping)
        # capacity = ceil(c * (L + 1) * w / W), in integers: c = num / den exactly.
        num = factor.numerator * (total + 1)
        den = factor.denominator * placed.ring.total_weight
        for node_id in placed.ring.walk(key):
            i = placed.index[node_id]
            load = loads[i]
            if load is not None and load < -(-num * targets[i].weight // den):
                return targets[i]
        return targets[placed.index[placed.ring.node(key)]]

    @staticmethod
    def _select_bounded_ramping(
        targets: Sequence[Target],
        key: str,
        placed: _PlacedRing,
        factor: Fraction,
        loads: Sequence[int | None],
        total: int,
        ramping: Mapping[str, float],
    ) -> Target:
        """Bounded load while targets are in slow start: each capacity from the weight times the
        share, w * s (the ring, the key -> target mapping, keeps the full weights)."""
        weights = [t.weight * ramping.get(t.node_id, 1.0) for t in targets]
        scale = float(factor) * (total + 1) / sum(weights)
        for node_id in placed.ring.walk(key):
            i = placed.index[node_id]
            load = loads[i]
            if load is not None and load < math.ceil(scale * weights[i]):
                return targets[i]
        return targets[placed.index[placed.ring.node(key)]]


def _keep(rings: dict[_K, _R], key: _K, ring: _R) -> _R:
    """Keep a new ring, dropping the oldest kept one when `_RINGS_KEPT` are kept already."""
    if len(rings) >= _RINGS_KEPT:
        del rings[next(iter(rings))]
    rings[key] = ring
    return ring


class LeastConnectionsPolicy(RoundRobinPolicy):
    """The target with the fewest connections; ties are broken round-robin; unknown counts last.

    Slow start: a target at share s counts as (count + 1) / s, the others as count + 1 (the same
    order as the counts alone when no target is in slow start)."""

    NAME = "LEAST_CONNECTIONS"
    PROPERTIES = frozenset({"CONNECTION_COUNT_THRESHOLD"})

    def __init__(
        self,
        properties: Mapping[str, str],
        *,
        round_robin_start: int | None = None,
        counts: ConnectionCountSource | None = None,
        slow_start: SlowStartSource | None = None,
    ) -> None:
        super().__init__(
            properties, round_robin_start=round_robin_start, counts=counts, slow_start=slow_start
        )
        self.threshold = int(properties.get("CONNECTION_COUNT_THRESHOLD", "0"))
        self.counts = counts
        self.reads_counts = True

    @classmethod
    def validate_properties(cls, properties: Mapping[str, str]) -> None:
        value = properties.get("CONNECTION_COUNT_THRESHOLD", "0")
        try:
            threshold = int(value)
        except ValueError:
            threshold = -1
        if threshold < 0:
            raise ValueError(f"CONNECTION_COUNT_THRESHOLD must be an integer >= 0, got {value!r}")

    def _count(self, node_id: str) -> float:
        count = None if self.counts is None else self.counts.connection_count(node_id)
        if count is None:
            return float("inf")  # Artemis: Integer.MAX_VALUE, so unknown counts sort last
        return 0 if count < self.threshold else count

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        if len(targets) <= 1:
            return targets[0] if targets else None
        counts = [self._count(t.node_id) for t in targets]
        ramping = None if self.slow_start is None else self.slow_start.ramping()
        if ramping:
            # Slow start, HAProxy's leastconn with a ramping weight: (count + 1) / share, so a
            # target at share s is picked while it holds less than about s times the others' count.
            counts = [(c + 1) / ramping.get(t.node_id, 1.0) for t, c in zip(targets, counts, strict=True)]
        least = min(counts)
        tied = [t for t, c in zip(targets, counts, strict=True) if c == least]
        return tied[0] if len(tied) == 1 else self._next(tied)


class ConsistentHashModuloPolicy(Policy):
    """A key transformer: key -> str((hash(key) & 0x7fffffff) % MODULO). Never selects a target."""

    NAME = "CONSISTENT_HASH_MODULO"
    STICKY = True
    KEYED = True
    PROPERTIES = frozenset({"MODULO", "modulo"})

    def __init__(
        self,
        properties: Mapping[str, str],
        *,
        round_robin_start: int | None = None,
        counts: ConnectionCountSource | None = None,
        slow_start: SlowStartSource | None = None,
    ) -> None:
        super().__init__(
            properties, round_robin_start=round_robin_start, counts=counts, slow_start=slow_start
        )
        self.modulo = _modulo(properties)

    @classmethod
    def validate_properties(cls, properties: Mapping[str, str]) -> None:
        _modulo(properties)

    def transform_key(self, key: str) -> str:
        return str((artemis_hash(key) & 0x7FFFFFFF) % self.modulo)

    def select(self, targets: Sequence[Target], key: str) -> Target | None:
        return None


def _modulo(properties: Mapping[str, str]) -> int:
    # SPEC A3: MODULO is required; the Artemis manual spells it `modulo`, so both are accepted.
    value = properties.get("MODULO", properties.get("modulo"))
    if value is None:
        raise ValueError("CONSISTENT_HASH_MODULO needs property MODULO (a positive integer)")
    try:
        modulo = int(value)
    except ValueError:
        modulo = 0
    if modulo <= 0:
        raise ValueError(f"MODULO must be a positive integer, got {value!r}")
    return modulo
