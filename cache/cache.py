"""The sticky key -> node id cache of a connection router (SPEC A5), in memory.

Pure state: the caller passes `now` (seconds, any monotonic origin) to every call, so expiry is a
comparison and tests need no clock. Entries expire `timeout_ms` after their last access (get or
put); timeout 0 means never. Entries are not removed when their target goes down: routing bypasses
them and overwrites them with the new choice.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheConfig", "TargetCache"]


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


class TargetCache:
    """key -> node id with expire-after-access (mutable state, clock passed in)."""

    __slots__ = ("_last_access", "_node_ids", "config")

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self._node_ids: dict[str, str] = {}
        """key -> the node id chosen for it."""
        self._last_access: dict[str, float] = {}
        """key -> when its entry was last read or written, in the caller's clock (apart from the
        node ids: a read that refreshes an entry is one float store, no new object)."""

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
        self._last_access[key] = now
        return node_id

    def put(self, key: str, node_id: str, now: float) -> None:
        """Cache (or overwrite) the node id for a key."""
        self._node_ids[key] = node_id
        self._last_access[key] = now

    def evict(self, key: str) -> bool:
        """Remove one entry; whether it was there."""
        self._last_access.pop(key, None)
        return self._node_ids.pop(key, None) is not None

    def purge_expired(self, now: float) -> int:
        """Drop every expired entry (memory hygiene); how many were dropped."""
        expired = [key for key in self._node_ids if self._expired(key, now)]
        for key in expired:
            self.evict(key)
        return len(expired)

    def entries(self, now: float) -> dict[str, str]:
        """A snapshot of the live entries (no refresh), key -> node id."""
        return {key: node_id for key, node_id in self._node_ids.items() if not self._expired(key, now)}

    def __len__(self) -> int:
        return len(self._node_ids)
