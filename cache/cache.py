"""The sticky key -> node id cache of a connection router (SPEC A5), in memory.

Pure state: the caller passes `now` (seconds, any monotonic origin) to every call, so expiry is a
comparison and tests need no clock. Entries expire `timeout_ms` after their last access (get or
put); timeout 0 means never. Entries are not removed when their target goes down: routing bypasses
them and overwrites them with the new choice.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheConfig", "CacheEntry", "TargetCache"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """The `<cache>` element; its presence enables the cache."""

    persisted: bool = False
    """Keep entries across restarts."""
    timeout_ms: int = 0
    """Expire an entry this long after its last access; 0 = never."""

    def __post_init__(self) -> None:
        if self.timeout_ms < 0:
            raise ValueError(f"timeout must be >= 0, got {self.timeout_ms!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheEntry:
    """One cached decision."""

    node_id: str
    """The target chosen for the key."""
    last_access: float
    """When the entry was last read or written, in the caller's clock."""


class TargetCache:
    """key -> node id with expire-after-access (mutable state, clock passed in)."""

    __slots__ = ("_entries", "config")

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self._entries: dict[str, CacheEntry] = {}

    def _expired(self, entry: CacheEntry, now: float) -> bool:
        timeout = self.config.timeout_ms
        return timeout > 0 and now - entry.last_access >= timeout / 1000

    def get(self, key: str, now: float) -> str | None:
        """The node id cached for a key, refreshing its expiry; None when absent or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._expired(entry, now):
            del self._entries[key]
            return None
        self._entries[key] = CacheEntry(node_id=entry.node_id, last_access=now)
        return entry.node_id

    def put(self, key: str, node_id: str, now: float) -> None:
        """Cache (or overwrite) the node id for a key."""
        self._entries[key] = CacheEntry(node_id=node_id, last_access=now)

    def evict(self, key: str) -> bool:
        """Remove one entry; whether it was there."""
        return self._entries.pop(key, None) is not None

    def purge_expired(self, now: float) -> int:
        """Drop every expired entry (memory hygiene); how many were dropped."""
        expired = [k for k, e in self._entries.items() if self._expired(e, now)]
        for key in expired:
            del self._entries[key]
        return len(expired)

    def entries(self, now: float) -> dict[str, str]:
        """A snapshot of the live entries (no refresh), key -> node id."""
        return {k: e.node_id for k, e in self._entries.items() if not self._expired(e, now)}

    def __len__(self) -> int:
        return len(self._entries)
