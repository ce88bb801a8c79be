"""The workers' shared zone seen from Python: the sticky cache and the ROUND_ROBIN positions that
every worker process reads and writes (`_zone.c` holds them in one shared memory region).

`ZoneCache` is a `TargetCache` whose entries live in the zone: the engine of every worker uses it
as its own cache, so a key goes to the same broker whichever worker accepted the connection. It
keeps `TargetCache`'s rules (tests/cache/test_cache.py's cases and a differential test run on
both). What it does not do (yet): persistence and ZooKeeper sharing, which stay with one process
(a configuration asking for them with several workers is refused, `ZONE_CACHE_RULE`); and a key
longer than `KEY_INLINE` bytes is told apart by its length, prefix and keyed 128-bit hash, and is
listed by its prefix. Two processes deciding the same new key at once agree: a policy's choice is
written only if the entry is still what the decision read, else the other's choice is taken
(`claim`).

`share_round_robin` points a ROUND_ROBIN (or LEAST_CONNECTIONS, for its ties) policy at the zone's
position of its router: Artemis's sequence, taken in turns by all the workers.

Times: the zone keeps one clock for every process, the system's monotonic clock; a `ZoneCache` adds
`offset` to the caller's `now` (a worker's trio clock starts at a random origin) and takes it off
what it reads back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Final

from cache.cache import NO_PIN, CacheConfig, CacheEntry, Changes, Row, TargetCache
from policies.policy import RoundRobinPolicy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from policies.policy import Policy
    from router.core.engine import RoutingEngine

try:
    import router.features.workers._zone as _zone
except ImportError:  # built at install; an install without a C compiler has one worker
    _zone = None  # type: ignore[assignment]  # routerd then runs one worker

__all__ = ["EXTENSION", "ZONE_CACHE_RULE", "ZoneCache", "join_zone", "make_zone", "share_round_robin"]

EXTENSION: Final = _zone
"""The C extension, or None when it was not built (then routerd runs one worker)."""

_CLAIM_TRIES: Final = 8
"""`ZoneCache.claim`'s reads and conditional writes at most before it writes regardless (each retry
means another process wrote the same key in between)."""

ZONE_CACHE_RULE: Final = "a cache shared by several workers is not persisted and not shared through ZooKeeper"


def make_zone(config: CacheConfig | None, routers: int) -> _zone.Zone:
    """A new zone for `routers` routers whose cache (if any) follows `config`.

    Raises:
        RuntimeError: the extension was not built.
        ValueError: the cache is persisted (`ZONE_CACHE_RULE`).
    """
    if _zone is None:
        raise RuntimeError("the workers' zone (router/features/workers/_zone.c) was not built")
    if config is not None and config.persisted:
        raise ValueError(f"{ZONE_CACHE_RULE}: <persisted>true</persisted>")
    max_entries = 1 if config is None else config.max_entries
    timeout_s = 0.0 if config is None else config.timeout_ms / 1000
    return _zone.Zone(max_entries, timeout_s, routers=routers)


class ZoneCache(TargetCache):
    """A `TargetCache` kept in a shared zone (see the module docstring)."""

    __slots__ = ("offset", "zone")

    OTHER_WRITERS: ClassVar[bool] = True

    def __init__(self, config: CacheConfig, zone: _zone.Zone, *, offset: float = 0.0) -> None:
        """The zone's cache, with the rules of `config` (which made the zone).

        Args:
            config: the `<cache>` element.
            zone: the shared zone.
            offset: added to the caller's clock to make the zone's.
        """
        if config.persisted:
            raise ValueError(f"{ZONE_CACHE_RULE}: <persisted>true</persisted>")
        super().__init__(config)
        self.zone = zone
        self.offset = offset

    # The counts are the zone's, for all workers; TargetCache.__init__ sets them to 0.
    @property
    def hits(self) -> int:
        return self.zone.counts()[2]

    @hits.setter
    def hits(self, value: int) -> None:
        del value

    @property
    def misses(self) -> int:
        return self.zone.counts()[3]

    @misses.setter
    def misses(self, value: int) -> None:
        del value

    @property
    def evictions(self) -> int:
        return self.zone.counts()[4]

    @evictions.setter
    def evictions(self, value: int) -> None:
        del value

    def get(self, key: str, now: float) -> str | None:
        return self.zone.get(key, now + self.offset)

    def touch(self, key: str, node_id: str, now: float) -> None:
        self.zone.touch(key, now + self.offset)

    def put(self, key: str, node_id: str, now: float) -> None:
        self.zone.put(key, node_id, now + self.offset)

    def claim(self, key: str, node_id: str, now: float, usable: Callable[[str], bool]) -> str:
        """`TargetCache.claim` where other processes write too: the choice is written only while
        the entry is still what was read (`Zone.put` with `expected`); when another process
        wrote a usable choice meanwhile, the key goes there (not counted again: the caller's read
        counted it)."""
        at = now + self.offset
        for _ in range(_CLAIM_TRIES):  # each failed try is another process's write in between
            current = self.zone.fresh(key, at)
            if current is not None and current != node_id and usable(current):
                return current
            if self.zone.put(key, node_id, at, current):
                return node_id
        self.zone.put(key, node_id, at)
        return node_id

    def evict(self, key: str) -> bool:
        return self.zone.evict(key)

    def evict_target(self, node_id: str) -> list[str]:
        return self.zone.evict_node(node_id)

    def clear(self) -> list[str]:
        return self.zone.clear()

    def pin(self, key: str, node_id: str, now: float, until: float = math.inf) -> None:
        if until <= now:
            raise ValueError(f"a pin must end after now, got {until - now:g} s from now")
        self.zone.pin(key, node_id, now + self.offset, until + self.offset)

    def purge_expired(self, now: float) -> int:
        return self.zone.purge_expired(now + self.offset)

    def fresh(self, key: str, now: float) -> str | None:
        return self.zone.fresh(key, now + self.offset)

    def node_of(self, key: str) -> str | None:
        seen = self.zone.peek(key)
        return None if seen is None or seen[2] is not None else seen[0]

    def is_pinned(self, key: str) -> bool:
        seen = self.zone.peek(key)
        return seen is not None and seen[2] is not None

    def entry(self, key: str, now: float) -> CacheEntry | None:
        seen = self.zone.peek(key)
        if seen is None:
            return None
        return self._snapshot([(key, seen[0], seen[1], seen[2], True)]).entry(key, now)

    def entries(self, now: float) -> dict[str, str]:
        return self.copy().entries(now)

    def listing(
        self, now: float, *, prefix: str = "", node_id: str | None = None, after: str = "", limit: int = 100
    ) -> list[CacheEntry]:
        return self.copy().listing(now, prefix=prefix, node_id=node_id, after=after, limit=limit)

    def entry_keys(self) -> list[str]:
        return [key for key, _, _, until, _ in self.zone.items() if until is None]

    def copy(self) -> TargetCache:
        return self._snapshot(self.zone.items())

    def _snapshot(self, items: Iterable[tuple[str, str, float, float | None, bool]]) -> TargetCache:
        """A plain `TargetCache` holding these zone rows (least recently used first), in the
        caller's clock."""
        twin = TargetCache(self.config)
        rows: list[tuple[str, Row]] = [
            (key, (node_id, access - self.offset, NO_PIN if until is None else until - self.offset))
            for key, node_id, access, until, _ in items
        ]
        twin.restore(rows, -math.inf)
        return twin

    def take_changes(self, now: float) -> Changes:
        return Changes()

    def restore(self, rows: Iterable[tuple[str, Row]], now: float) -> int:
        raise ValueError(f"{ZONE_CACHE_RULE}: nothing to restore")

    def __len__(self) -> int:
        entries, pins = self.zone.counts()[:2]
        return entries + pins


def share_round_robin(policy: Policy, zone: _zone.Zone, router: int) -> None:
    """Take `policy`'s ROUND_ROBIN turns (its own, or LEAST_CONNECTIONS' ties) from the zone's
    position of router number `router`; other policies keep no position."""
    if isinstance(policy, RoundRobinPolicy):
        policy.shared = (lambda n: zone.round_robin(router, n), lambda: zone.position(router))


def join_zone(engine: RoutingEngine, zone: _zone.Zone, router: int, *, offset: float = 0.0) -> None:
    """Make `engine` (router number `router` of the configuration) decide with the zone's state:
    its cache the zone's (`ZoneCache`), its ROUND_ROBIN position the zone's."""
    if engine.config.cache is not None:
        engine.cache = ZoneCache(engine.config.cache, zone, offset=offset)
    if engine.policy is not None:
        share_round_robin(engine.policy, zone, router)
