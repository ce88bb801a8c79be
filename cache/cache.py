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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_MAX_ENTRIES", "CacheConfig", "TargetCache"]

DEFAULT_MAX_ENTRIES: Final = 100_000
"""Entries a cache keeps at most. About 25 MB with 36-character keys, and at most about 120 MB
with keys at the default key length cap (1,024 characters); a fleet with more distinct clients
than this sets `<max-entries>` higher (the evictions metric says when)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """The `<cache>` element; its presence enables the cache."""

    persisted: bool = False
    """Keep entries across restarts."""
    timeout_ms: int = 0
    """Expire an entry this long after its last access; 0 = never."""
    max_entries: int = DEFAULT_MAX_ENTRIES
    """Our `<max-entries>`: beyond it, the least recently used entry goes."""

    def __post_init__(self) -> None:
        if self.timeout_ms < 0:
            raise ValueError(f"timeout must be >= 0, got {self.timeout_ms!r}")
        if self.max_entries < 1:
            raise ValueError(f"max-entries must be > 0, got {self.max_entries!r}")


class TargetCache:
    """key -> node id with expire-after-access and a bound on entries (mutable state, clock passed in)."""

    __slots__ = ("_last_access", "_node_ids", "config", "evictions")

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self._node_ids: dict[str, str] = {}
        """key -> the node id chosen for it."""
        self._last_access: dict[str, float] = {}
        """key -> when its entry was last read or written, in the caller's clock, least recently
        accessed first (apart from the node ids: a read that refreshes an entry moves one float)."""
        self.evictions = 0
        """Entries evicted to stay within `max_entries` so far."""

    def _expired(self, key: str, now: float) -> bool:
        timeout = self.config.timeout_ms
        return timeout > 0 and now - self._last_access[key] >= timeout / 1000

    def get(self, key: str, now: float) -> str | None:
        """The node id cached for a key, refreshing its expiry; None when absent or expired."""
        node_id = self._node_ids.get(key)
        if node_id is None:
            return None
        if self._expired(key, now):
            self.evict(key)
            return None
        last_access = self._last_access
        del last_access[key]  # to the end: the most recently used
        last_access[key] = now
        return node_id

    def put(self, key: str, node_id: str, now: float) -> None:
        """Cache (or overwrite) the node id for a key; a new key beyond `max_entries` evicts the
        least recently used entry."""
        last_access = self._last_access
        if key in last_access:
            del last_access[key]
        elif len(last_access) >= self.config.max_entries:
            self.evict(next(iter(last_access)))
            self.evictions += 1
        self._node_ids[key] = node_id
        last_access[key] = now

    def evict(self, key: str) -> bool:
        """Remove one entry; whether it was there."""
        self._last_access.pop(key, None)
        return self._node_ids.pop(key, None) is not None

    def purge_expired(self, now: float) -> int:
        """Drop every expired entry (memory hygiene); how many were dropped. The least recently
        accessed come first, so this stops at the first fresh one."""
        if self.config.timeout_ms == 0:
            return 0
        expired = []
        for key in self._last_access:
            if not self._expired(key, now):
                break
            expired.append(key)
        for key in expired:
            self.evict(key)
        return len(expired)

    def entries(self, now: float) -> dict[str, str]:
        """A snapshot of the live entries (no refresh), key -> node id."""
        return {key: node_id for key, node_id in self._node_ids.items() if not self._expired(key, now)}

    def __len__(self) -> int:
        return len(self._node_ids)
