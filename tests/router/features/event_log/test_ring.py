"""router/features/event_log/ring.py: the event log's ring, at its edges (seed 001's ring queue)."""

from __future__ import annotations

import threading

import pytest

from router.features.event_log.ring import Ring


def test_seed_example_ring_of_three_drops_the_head_when_d_arrives():
    ring: Ring[str] = Ring(3)
    assert [ring.put(value) for value in "ABC"] == [1, 2, 3]  # a put says how many the ring holds
    assert (len(ring), ring.dropped) == (3, 0)
    assert ring.put("D") == 3
    assert ring.dropped == 1
    assert ring.take(10) == [(1, "B"), (2, "C"), (3, "D")]  # numbers count puts: A was 0


def test_size_one_keeps_only_the_newest():
    ring: Ring[str] = Ring(1)
    for value in "abcd":
        ring.put(value)
    assert ring.take(5) == [(3, "d")]
    assert (ring.dropped, ring.puts, len(ring)) == (3, 4, 0)


def test_take_is_fifo_and_bounded_by_most():
    ring: Ring[int] = Ring(10)
    for value in range(5):
        ring.put(value)
    assert ring.take(2) == [(0, 0), (1, 1)]
    assert ring.take(0) == []
    assert ring.take(10) == [(2, 2), (3, 3), (4, 4)]
    assert ring.take(1) == []


def test_shrink_while_full_deletes_nothing_and_reaches_the_new_size_as_it_drains():
    ring: Ring[int] = Ring(5)
    for value in range(5):
        ring.put(value)
    ring.resize(2)
    assert len(ring) == 5  # nothing deleted by the resize itself
    ring.put(5)  # at or over size: the oldest goes first, the ring does not grow
    assert len(ring) == 5
    assert ring.dropped == 1
    assert values_of(ring.take(2)) == [1, 2]
    ring.put(6)
    assert len(ring) == 3
    assert ring.dropped == 2  # 3 is over 2: 3 dropped (the oldest)
    assert values_of(ring.take(10)) == [4, 5, 6]
    ring.put(7)
    ring.put(8)
    ring.put(9)
    assert values_of(ring.take(10)) == [8, 9]  # size 2 now in force


def test_grow_takes_effect_at_once():
    ring: Ring[int] = Ring(2)
    ring.put(0)
    ring.put(1)
    ring.resize(4)
    ring.put(2)
    ring.put(3)
    assert ring.dropped == 0
    assert values_of(ring.take(10)) == [0, 1, 2, 3]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least 1, got 0"):
        Ring(0)
    ring: Ring[int] = Ring(1)
    with pytest.raises(ValueError, match="got -5"):
        ring.resize(-5)
    assert ring.size == 1


def test_concurrent_puts_lose_nothing_but_the_counted_drops():
    ring: Ring[int] = Ring(1000)
    taken: list[tuple[int, int]] = []

    def put_many(base: int) -> None:
        for value in range(base, base + 20_000):
            ring.put(value)

    threads = [threading.Thread(target=put_many, args=(i * 100_000,)) for i in range(3)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        taken.extend(ring.take(500))
    for thread in threads:
        thread.join()
    taken.extend(ring.take(10_000))
    numbers = [number for number, _ in taken]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) == len(numbers)
    assert len(taken) + ring.dropped == ring.puts == 60_000


def values_of(items: list[tuple[int, int]]) -> list[int]:
    return [value for _, value in items]
