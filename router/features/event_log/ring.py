"""The bounded ring between routing and the event log's writer, with the semantics of an Artemis
ring queue (seed 001): a fixed `ring-size`; a put into a full ring drops the oldest item not yet
taken, and counts it; a put never waits.

Changing the size at run time takes effect as the ring drains, as Artemis's `ring-size` update
does: a smaller size deletes nothing already in the ring; from then on a put into a ring at or
over its size drops the oldest item first (the ring does not grow), and the ring shrinks to the new
size as the writer takes items. A larger size lets the ring grow at once.

Every put gets a number, counting from 0 in put order, dropped items included: the writer makes
its line's `seq` from it, so a gap in a router's sequence is an item the ring dropped.

Pure: no I/O, no clock. Thread-safe (routing reports from the trio thread and the fast path's, and
the event log takes from those or from its sender thread); a put is one uncontended lock and a
deque append.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

__all__ = ["Ring"]

_T = TypeVar("_T")


class Ring(Generic[_T]):
    """A bounded FIFO of numbered items that drops its oldest item when full."""

    __slots__ = ("_dropped", "_items", "_lock", "_puts", "_size")

    def __init__(self, size: int) -> None:
        """A ring of at most `size` items (>= 1).

        Raises:
            ValueError: `size` < 1.
        """
        self._size = _checked(size)
        self._items: deque[tuple[int, _T]] = deque()
        self._lock = threading.Lock()
        self._puts = 0
        self._dropped = 0

    @property
    def size(self) -> int:
        """The ring size now in force."""
        return self._size

    def resize(self, size: int) -> None:
        """Change the ring size; it takes effect as the ring drains (see the module docstring).

        Raises:
            ValueError: `size` < 1.
        """
        size = _checked(size)
        with self._lock:
            self._size = size

    def put(self, item: _T) -> int:
        """Append `item`; when the ring holds `size` items or more, drop the oldest one first. How
        many items the ring holds now."""
        lock = self._lock
        lock.acquire()  # not `with`: every routed connection pays this, twice
        try:
            items = self._items
            number = self._puts
            self._puts = number + 1
            if len(items) >= self._size:
                items.popleft()
                self._dropped += 1
            items.append((number, item))
            return len(items)
        finally:
            lock.release()

    def take(self, most: int) -> list[tuple[int, _T]]:
        """Remove and return up to `most` of the oldest items with their numbers, oldest first."""
        with self._lock:
            items = self._items
            count = min(most, len(items))
            return [items.popleft() for _ in range(count)]

    def __len__(self) -> int:
        """Items in the ring now (more than `size` for a while after a shrink)."""
        return len(self._items)

    @property
    def puts(self) -> int:
        """Items put so far, dropped ones included (the next item's number)."""
        return self._puts

    @property
    def dropped(self) -> int:
        """Items dropped so far because the ring was full."""
        return self._dropped


def _checked(size: int) -> int:
    if size < 1:
        raise ValueError(f"a ring size is at least 1, got {size}")
    return size
