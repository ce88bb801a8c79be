"""The sticky key -> node id cache of a connection router (SPEC A5), in memory.

Pure state: the caller passes `now` (seconds, any monotonic origin) to every call, so expiry is a
comparison and tests need no clock. Entries expire `timeout_ms` after their last access (get or
put); timeout 0 means never. Entries are not removed when their target goes down: routing bypasses
them and overwrites them with the new choice.

The cache holds at most `max_entries` (our `<max-entries>`): a new key beyond it evicts the least
recently used entry (counted in `evictions`), so clients that invent keys cannot grow the router's
memory without bound, whatever the timeout. The access order is the insertion order of a dict
(an access moves the key to the end), which also lets `purge_expired` stop at the first entry
that is still fresh.

Pins are an operator's overrides (`pin`): a pinned key goes to its node id whatever the policy
says, until the pin ends (`until`) or is evicted; a pin is neither refreshed nor expired by the
timeout, nor evicted to make room, and a policy's choice never overwrites it. While the pinned
target is not ready, routing bypasses the pin as it bypasses any entry.

A persisted cache (`<persisted>true</persisted>`) keeps a **journal** of what changed since the
last `take_changes`: key -> (node id, last access, pinned until) or None (gone). The store
(router/services/cache_store.py) writes it off the data path; a decision only adds to a dict. The
journal is bounded: beyond `journal_max` keys it is dropped and the next `take_changes` is the
whole cache instead (`Changes.full`), so a store that falls behind costs no more memory than the
cache itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "NO_PIN",
    "CacheConfig",
    "CacheEntry",
    "Changes",
    "Row",
    "TargetCache",
]

DEFAULT_MAX_ENTRIES: Final = 100_000
"""Entries a cache keeps at most. About 25 MB with 36-character keys, and at most about 120 MB
with keys at the default key length cap (1,024 characters); a fleet with more distinct clients
than this sets `<max-entries>` higher (the evictions metric says when)."""

JOURNAL_FACTOR: Final = 2
"""A persisted cache's journal holds changes to at most this many times `max_entries` keys
(a new key that evicts another changes two); beyond, the next write is the whole cache."""

NO_PIN: Final = math.nan
"""`pinned_until` of an entry that is not pinned (a pin without end is `math.inf`)."""

Row: TypeAlias = tuple[str, float, float]
"""What the store keeps of a key: (node id, last access, pinned until: NO_PIN, a time or inf)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """The `<cache>` element; its presence enables the cache."""

    persisted: bool = False
    """Keep entries across restarts (in `file`)."""
    timeout_ms: int = 0
    """Expire an entry this long after its last access; 0 = never."""
    max_entries: int = DEFAULT_MAX_ENTRIES
    """Our `<max-entries>`: beyond it, the least recently used entry goes."""
    file: str | None = None
    """Our `<file>`: the SQLite file of a persisted cache (the loader gives it a default)."""

    def __post_init__(self) -> None:
        if self.timeout_ms < 0:
            raise ValueError(f"timeout must be >= 0, got {self.timeout_ms!r}")
        if self.max_entries < 1:
            raise ValueError(f"max-entries must be > 0, got {self.max_entries!r}")
        if self.file is not None and not self.persisted:
            raise ValueError(
                f"file {self.file!r} is only for a persisted cache (<persisted>true</persisted>)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheEntry:
    """One entry as operators see it."""

    key: str
    node_id: str
    idle_s: float
    """Seconds since its last access."""
    expires_in_s: float | None
    """Seconds until it expires (the timeout, or its pin's end); None: never."""
    pinned: bool = False

    def to_json(self) -> dict[str, object]:
        """The JSON object of the admin API and `routerctl cache`."""
        return {
            "key": self.key,
            "node_id": self.node_id,
            "idle_s": round(self.idle_s, 3),
            "expires_in_s": None if self.expires_in_s is None else round(self.expires_in_s, 3),
            "pinned": self.pinned,
        }


@dataclass(frozen=True, slots=True)
class Changes:
    """What a persisted cache's store must write: each changed key's row, or None when it went.
    `full`: `rows` is the whole cache (the journal overflowed); anything else in the store goes."""

    rows: dict[str, Row | None] = field(default_factory=dict)
    full: bool = False


class TargetCache:
    """key -> node id with expire-after-access and a bound on entries (mutable state, clock passed in)."""

    __slots__ = (
        "_dropped",
        "_evicted",
        "_journal",
        "_last_access",
        "_node_ids",
        "_pins",
        "_used",
        "config",
        "evictions",
        "hits",
        "journal_max",
        "misses",
    )

    OTHER_WRITERS: ClassVar[bool] = False
    """Whether other processes write this cache too (a `ZoneCache`): then a policy's choice is
    written with `claim`, which may answer another process's choice; here `put` does."""

    def __init__(self, config: CacheConfig, *, track_use: bool = False) -> None:
        """An empty cache.

        Args:
            config: the `<cache>` element.
            track_use: note the keys read or written (`take_used`), for a cache shared with other
                routers, which extends their entries' expiry there.
        """
        self.config = config
        self._node_ids: dict[str, str] = {}
        """key -> the node id chosen for it."""
        self._last_access: dict[str, float] = {}
        """key -> when its entry was last read or written, in the caller's clock, least recently
        accessed first (apart from the node ids: a read that refreshes an entry moves one float).
        Pinned keys are not in it."""
        self._pins: dict[str, tuple[str, float]] = {}
        """key -> (node id, until) of the operator's pins; until is `math.inf` for no end."""
        self._journal: dict[str, Row | None] | None = {} if config.persisted else None
        """A persisted cache's changes since `take_changes`; None when not persisted, or when it
        overflowed (then the next take is the whole cache)."""
        self._used: set[str] | None = set() if track_use else None
        """Keys read or written since `take_used` (a shared cache's); None when not tracked."""
        self._dropped: set[str] = set()
        """Keys evicted to make room since `take_dropped`, when use is tracked (at most
        `max_entries`): a shared cache deletes their entries unless another router uses them."""
        self._evicted: set[str] = set()
        """Keys operators evicted since `take_evicted`, when use is tracked (`note_evicted`): a
        shared cache deletes their entries in ZooKeeper too."""
        self.journal_max = JOURNAL_FACTOR * config.max_entries
        self.evictions = 0
        """Entries evicted to stay within `max_entries` so far."""
        self.hits = 0
        """`get` calls that found an entry."""
        self.misses = 0
        """`get` calls that found none (or an expired one)."""

    def _expired(self, key: str, now: float) -> bool:
        timeout = self.config.timeout_ms
        return timeout > 0 and now - self._last_access[key] >= timeout / 1000

    def _note(self, key: str, row: Row | None) -> None:
        journal = self._journal
        if journal is not None:
            journal[key] = row
            if len(journal) > self.journal_max:
                self._journal = None  # the next take writes the whole cache

    def get(self, key: str, now: float) -> str | None:
        """The node id cached (or pinned) for a key, refreshing its expiry; None when absent or
        expired."""
        if self._pins and (pin := self._pin(key, now)) is not None:
            self.hits += 1
            return pin
        node_id = self._node_ids.get(key)
        if node_id is None:
            self.misses += 1
            return None
        if self._expired(key, now):
            self.evict(key)
            self.misses += 1
            return None
        self.touch(key, node_id, now)
        return node_id

    def touch(self, key: str, node_id: str, now: float) -> None:
        """`get`'s hit of an entry (one `fresh` has just returned, or `get` found): its expiry
        refreshed, the change and the use noted, the hit counted."""
        last_access = self._last_access
        del last_access[key]  # to the end: the most recently used
        last_access[key] = now
        if self._journal is not None:
            self._note(key, (node_id, now, NO_PIN))
        if self._used is not None:
            self._used.add(key)
        self.hits += 1

    def put(self, key: str, node_id: str, now: float) -> None:
        """Cache (or overwrite) the node id for a key; a new key beyond `max_entries` evicts the
        least recently used entry. A pinned key keeps its pin."""
        if key in self._pins:
            return
        last_access = self._last_access
        if key in last_access:
            del last_access[key]
        elif len(last_access) >= self.config.max_entries:
            oldest = next(iter(last_access))
            self.evict(oldest)
            self.evictions += 1
            if self._used is not None and len(self._dropped) < self.config.max_entries:
                self._dropped.add(oldest)
        self._node_ids[key] = node_id
        last_access[key] = now
        if self._journal is not None:
            self._note(key, (node_id, now, NO_PIN))
        if self._used is not None:
            self._used.add(key)

    def claim(self, key: str, node_id: str, now: float, usable: Callable[[str], bool]) -> str:
        """Cache a policy's choice for a key whose entry did not serve (none, expired, or its
        target not usable), and say where the key goes: `node_id`, or, in a cache other processes
        write too (a `ZoneCache` of routerd's workers), the node id another one wrote meanwhile,
        when `usable` says its target takes the key. This cache has no other writer: `put`."""
        del usable
        self.put(key, node_id, now)
        return node_id

    def evict(self, key: str) -> bool:
        """Remove one entry (or pin); whether it was there."""
        self._last_access.pop(key, None)
        gone = self._node_ids.pop(key, None) is not None or self._pins.pop(key, None) is not None
        if gone:
            self._note(key, None)
        return gone

    def evict_target(self, node_id: str) -> list[str]:
        """Remove every entry and pin of one node id; their keys."""
        keys = [k for k, n in self._node_ids.items() if n == node_id]
        keys += [k for k, (n, _) in self._pins.items() if n == node_id]
        for key in keys:
            self.evict(key)
        return keys

    def clear(self) -> list[str]:
        """Remove every entry and pin; their keys."""
        keys = [*self._node_ids, *self._pins]
        for key in keys:
            self.evict(key)
        return keys

    def pin(self, key: str, node_id: str, now: float, until: float = math.inf) -> None:
        """Send `key` to `node_id` whatever the policy says until `until` (the caller's clock;
        inf: until evicted). Replaces the key's entry or pin."""
        if until <= now:
            raise ValueError(f"a pin must end after now, got {until - now:g} s from now")
        self._last_access.pop(key, None)
        self._node_ids.pop(key, None)
        self._pins[key] = (node_id, until)
        self._note(key, (node_id, now, until))

    def _pin(self, key: str, now: float) -> str | None:
        pin = self._pins.get(key)
        if pin is None:
            return None
        if pin[1] <= now:
            self.evict(key)
            return None
        return pin[0]

    def purge_expired(self, now: float) -> int:
        """Drop every expired entry and ended pin (memory hygiene); how many were dropped. The
        least recently accessed come first, so this stops at the first fresh one."""
        expired = [key for key, (_, until) in self._pins.items() if until <= now]
        if self.config.timeout_ms > 0:
            for key in self._last_access:
                if not self._expired(key, now):
                    break
                expired.append(key)
        for key in expired:
            self.evict(key)
        return len(expired)

    def entries(self, now: float) -> dict[str, str]:
        """A snapshot of the live entries and pins (no refresh), key -> node id."""
        live = {key: node_id for key, node_id in self._node_ids.items() if not self._expired(key, now)}
        live.update((key, node_id) for key, (node_id, until) in self._pins.items() if until > now)
        return live

    def entry(self, key: str, now: float) -> CacheEntry | None:
        """One live entry or pin as operators see it (no refresh); None when absent or expired."""
        pin = self._pins.get(key)
        if pin is not None:
            pinned_to, until = pin
            if until <= now:
                return None
            left = None if until == math.inf else until - now
            return CacheEntry(key=key, node_id=pinned_to, idle_s=0.0, expires_in_s=left, pinned=True)
        node_id = self._node_ids.get(key)
        if node_id is None or self._expired(key, now):
            return None
        idle = now - self._last_access[key]
        timeout = self.config.timeout_ms
        left = None if timeout == 0 else timeout / 1000 - idle
        return CacheEntry(key=key, node_id=node_id, idle_s=idle, expires_in_s=left)

    def listing(
        self, now: float, *, prefix: str = "", node_id: str | None = None, after: str = "", limit: int = 100
    ) -> list[CacheEntry]:
        """Live entries and pins in key order, from the first key after `after`, at most `limit`;
        only keys starting with `prefix`, only entries of `node_id` when given."""
        keys = sorted(
            key
            for key, target in (*self._node_ids.items(), *((k, n) for k, (n, _) in self._pins.items()))
            if key > after and key.startswith(prefix) and (node_id is None or target == node_id)
        )
        page: list[CacheEntry] = []
        for key in keys:
            if len(page) == limit:
                break
            if (entry := self.entry(key, now)) is not None:
                page.append(entry)
        return page

    # -- persistence (the store's side) --

    def take_changes(self, now: float) -> Changes:
        """What changed since the last call, for the store (its rows in the caller's clock); the
        whole cache when the journal overflowed. Empty when the cache is not persisted."""
        if not self.config.persisted:
            return Changes()
        journal = self._journal
        self._journal = {}
        if journal is not None:
            return Changes(journal)
        rows: dict[str, Row | None] = {
            k: (n, self._last_access[k], NO_PIN) for k, n in self._node_ids.items()
        }
        rows.update((k, (n, now, until)) for k, (n, until) in self._pins.items())
        return Changes(rows, full=True)

    def take_used(self) -> set[str]:
        """The keys read or written since the last call (empty unless tracked)."""
        used = self._used
        if not used:
            return set()
        self._used = set()
        return used

    def take_dropped(self) -> set[str]:
        """The keys evicted to make room since the last call (empty unless use is tracked)."""
        dropped, self._dropped = self._dropped, set()
        return dropped

    def note_evicted(self, keys: Iterable[str]) -> None:
        """Note keys an operator evicted (a shared cache's: nothing is noted unless use is
        tracked), whether or not this cache held them: other routers may."""
        if self._used is not None:
            self._evicted.update(keys)

    def take_evicted(self) -> set[str]:
        """The keys `note_evicted` noted since the last call."""
        evicted, self._evicted = self._evicted, set()
        return evicted

    def fresh(self, key: str, now: float) -> str | None:
        """The node id `get` would return for a key that has an entry, not expired and not
        pinned; None otherwise (no pin looked at, nothing refreshed, counted or evicted)."""
        node_id = self._node_ids.get(key)
        if node_id is None or (self._pins and key in self._pins) or self._expired(key, now):
            return None
        return node_id

    def node_of(self, key: str) -> str | None:
        """The node id of a key's entry, as it is (no refresh, expired or not); None for a key
        without one, and for a pinned key."""
        return self._node_ids.get(key)

    def entry_keys(self) -> list[str]:
        """The keys of the entries (not the pins), expired or not."""
        return list(self._node_ids)

    def is_pinned(self, key: str) -> bool:
        """Whether an operator pinned the key (ended or not)."""
        return key in self._pins

    def copy(self) -> TargetCache:
        """A copy of the entries and pins (no journal, no counts), to read outside a lock."""
        twin = TargetCache(self.config)
        twin._journal = None
        twin._node_ids = self._node_ids.copy()
        twin._last_access = self._last_access.copy()
        twin._pins = self._pins.copy()
        return twin

    def resync(self) -> None:
        """Make the next `take_changes` the whole cache (the store lost a write)."""
        if self.config.persisted:
            self._journal = None

    def restore(self, rows: Iterable[tuple[str, Row]], now: float) -> int:
        """Load stored entries (least recently accessed first, times in the caller's clock) into an
        empty cache, leaving out the expired ones and ended pins and, beyond `max_entries`, the
        oldest; only the keys left out are journaled (gone). How many were loaded."""
        timeout_s = self.config.timeout_ms / 1000
        for key, (node_id, last_access, until) in rows:
            if not math.isnan(until):
                if until > now:
                    self._pins[key] = (node_id, until)
                    continue
            elif timeout_s == 0 or now - last_access < timeout_s:
                self._last_access.pop(key, None)
                self._node_ids[key] = node_id
                self._last_access[key] = last_access
                continue
            self._note(key, None)
        while len(self._last_access) > self.config.max_entries:
            oldest = next(iter(self._last_access))
            del self._last_access[oldest]
            del self._node_ids[oldest]
            self._note(oldest, None)
        return len(self)

    def __len__(self) -> int:
        return len(self._node_ids) + len(self._pins)
