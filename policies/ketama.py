"""The ketama ring CONSISTENT_HASH uses with `RING=KETAMA` (SPEC A3, beyond Artemis).

libketama's continuum, built by uhashring (`hash_fn="ketama"`): a target of weight w among n
targets of total weight W gets `floor(40 * n * w / W)` md5 digests of `"<node id>-<i>"`, each
giving 4 points on a 32-bit ring (bytes 4r..4r+3 of the digest, little-endian), so 160 points
per target at equal weights. A key hashes to the first 4 bytes of its own md5, little-endian, and
belongs to the first point at or after that hash, clockwise, wrapping past the top (libketama's
`ketama_get_server`; twemproxy and spymemcached's ketama do the same).

Pure: no clock, no I/O. The ring is immutable once built; `ConsistentHashPolicy` keeps the rings
of the target sets it met last (`policies/policy.py`).
"""

from __future__ import annotations

import bisect
import hashlib
from typing import TYPE_CHECKING, Final

from uhashring import HashRing

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = ["KETAMA_VNODES", "KetamaRing", "ketama_hash"]

KETAMA_VNODES: Final = 40
"""md5 digests per target at equal weights: libketama's fixed 40 (uhashring's ketama default), 4
points each. Not a property: a ring of other sizes would no longer be the continuum other ketama
clients compute, and uhashring builds it in time quadratic in its points."""


def ketama_hash(text: str) -> int:
    """libketama's `ketama_hashi`: the first 4 bytes of md5(text as UTF-8), little-endian.

    A lone surrogate (possible in a key typed into `routerctl route`) is encoded as its 3 bytes
    (`surrogatepass`) instead of failing.

    Args:
        text: a key or a point's name.

    Returns:
        The hash in [0, 2**32).
    """
    digest = hashlib.md5(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "little")


class KetamaRing:
    """An immutable ketama continuum over (node id, weight) pairs."""

    __slots__ = ("_distinct", "_owners", "_points", "node_ids", "total_weight")

    def __init__(self, nodes: Sequence[tuple[str, int]]) -> None:
        """Build the continuum.

        Args:
            nodes: (node id, weight) of each target, node ids distinct, weights >= 1. Their order
                does not matter.

        Raises:
            ValueError: no nodes, a node id given twice, or a weight below 1.
        """
        if not nodes:
            raise ValueError("a ketama ring needs at least one node")
        weights = dict(sorted(nodes))
        if len(weights) != len(nodes):
            raise ValueError(f"node ids must be distinct, got {[n for n, _ in nodes]!r}")
        if min(weights.values()) < 1:
            raise ValueError(f"weights must be >= 1, got {weights!r}")
        # Sorted by node id, so that the owner of a point two node ids share (uhashring: the later
        # one) does not depend on pool order.
        ring = HashRing(
            nodes={n: {"weight": w, "vnodes": KETAMA_VNODES} for n, w in weights.items()},
            hash_fn="ketama",
        )
        points: list[tuple[int, str]] = ring.get_points()
        self._points = [p for p, _ in points]
        self._owners = [n for _, n in points]
        self._distinct = len(set(self._owners))
        self.node_ids: frozenset[str] = frozenset(weights)
        """The node ids the ring was built for (a node of tiny relative weight may own no point)."""
        self.total_weight: int = sum(weights.values())
        """The sum of the nodes' weights."""

    def __len__(self) -> int:
        """The number of points."""
        return len(self._points)

    def index(self, key: str) -> int:
        """The position of the key's point: the first point >= ketama_hash(key), else the first."""
        i = bisect.bisect_left(self._points, ketama_hash(key))
        return 0 if i == len(self._points) else i

    def node(self, key: str) -> str:
        """The node id that owns the key."""
        return self._owners[self.index(key)]

    def walk(self, key: str) -> Iterator[str]:
        """The node ids in ring order from the key's point on, each once (its owner first)."""
        owners = self._owners
        start = self.index(key)
        seen: set[str] = set()
        for i in range(start, start + len(owners)):
            owner = owners[i % len(owners)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self._distinct:
                    return
