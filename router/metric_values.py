"""Metric families as values: `Family` (a counter or gauge, one value per label set) and `Histogram`,
updated from any thread under their own lock and read by a collector when scraped.

An update is a dict store under a lock, about a fifth of what the client library's `inc()`
costs, and a proxied connection makes six of them (the fast path counts every one); a histogram's
observation is a bisect and two stores. The exposition is the client library's own (its names,
HELP and TYPE lines), without `_created` samples: a series per label set that only says when it
was first counted doubles the series count and shows as noise in dashboards (as
`prometheus_client.disable_created_metrics()` does for the library's own). router/metrics.py
holds the process's families (`Metrics`) and each feature's (`FeatureMetrics`).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import threading
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from collections.abc import Sequence

    from prometheus_client.metrics_core import Metric

__all__ = ["Family", "Histogram", "MetricKind", "Tally"]


_V = TypeVar("_V")


class MetricKind(enum.Enum):
    COUNTER = "counter"
    """Only goes up."""
    GAUGE = "gauge"


class _Labelled(Generic[_V]):
    """What `Family` and `Histogram` share: a name, a help text, label names, a value per label
    set (`_V`), and the lock every thread takes to change them."""

    __slots__ = ("_lock", "_values", "documentation", "labels", "name", "others")

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        """The exposed name (counters: with `_total`)."""
        self.documentation = documentation
        self.labels = labels
        self._values: dict[tuple[str, ...], _V] = {}
        self._lock = threading.Lock()
        self.others: dict[tuple[str, ...], _V] = {}
        """Other processes' values (routerd's workers'), added to this process's when collected;
        replaced as a whole by whoever gathers them."""

    def values(self) -> dict[tuple[str, ...], _V]:
        """A copy of this process's own values (without `others`)."""
        with self._lock:
            return dict(self._values)

    def _check(self, labels: tuple[str, ...]) -> None:
        """A new label set: one string per label name.

        Raises:
            ValueError: it is not.
        """
        if len(labels) != len(self.labels) or not all(isinstance(label, str) for label in labels):
            raise ValueError(f"{self.name}: wants one string per label {list(self.labels)}, got {labels!r}")

    def remove_matching(self, prefix: tuple[str, ...]) -> None:
        """Drop every label set whose first values are `prefix` (a target's series of every reason)."""
        width = len(prefix)
        with self._lock:
            for labels in [labels for labels in self._values if labels[:width] == prefix]:
                del self._values[labels]


class Family(_Labelled[float]):
    """One metric family: its name, help and label names, and its value for each label set seen.

    Safe to update from any thread (the trio thread and the fast path's both count). A label set
    appears in the exposition from its first update on, as with the client library's `labels()`.
    """

    __slots__ = ("kind",)

    def __init__(self, kind: MetricKind, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        super().__init__(name, documentation, labels)
        self.kind = kind

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add `amount` (a gauge: also negative) to the value of a label set.

        Raises:
            ValueError: a counter given a negative amount, or not one value per label name.
        """
        if amount < 0 and self.kind is MetricKind.COUNTER:
            raise ValueError(f"{self.name}: a counter only goes up, got {amount!r}")
        lock = self._lock
        lock.acquire()  # not `with`: this is every connection's cost, and `with` costs more
        try:
            value = self._values.get(labels)
            if value is None:
                self._first(labels)
                value = 0.0
            self._values[labels] = value + amount
        finally:
            lock.release()

    def set(self, labels: tuple[str, ...], value: float) -> None:
        """Set a gauge's value for a label set.

        Raises:
            ValueError: a counter, or not one value per label name.
        """
        if self.kind is not MetricKind.GAUGE:
            raise ValueError(f"{self.name}: only a gauge is set, this is a {self.kind.value}")
        with self._lock:
            if labels not in self._values:
                self._first(labels)
            self._values[labels] = value

    def remove(self, labels: tuple[str, ...]) -> None:
        """Drop a label set from the exposition (nothing when it has none)."""
        with self._lock:
            self._values.pop(labels, None)

    def label_sets(self) -> list[tuple[str, ...]]:
        """The label sets exported now."""
        with self._lock:
            return list(self._values)

    def value(self, labels: tuple[str, ...]) -> float | None:
        """The value of a label set; None when it has none."""
        with self._lock:
            return self._values.get(labels)

    def _first(self, labels: tuple[str, ...]) -> None:
        self._check(labels)

    def collect(self) -> Metric:
        """The family as the client library exports it (a consistent copy of its values, with
        `others` added)."""
        with self._lock:
            mine = dict(self._values)
        for labels, value in self.others.items():
            mine[labels] = mine.get(labels, 0.0) + value
        values = list(mine.items())
        if self.kind is MetricKind.COUNTER:
            counter = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
            for labels, value in values:
                counter.add_metric(labels, value)
            return counter
        gauge = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in values:
            gauge.add_metric(labels, value)
        return gauge


class Histogram(_Labelled[list[float]]):
    """A histogram family: for each label set, how many observations fell at or under each bucket's
    upper bound, their count and their sum, as the client library's `Histogram` exports them.

    Safe to update from any thread, like `Family`; a label set appears from its first observation.
    """

    __slots__ = ("_bounds",)

    def __init__(
        self, name: str, documentation: str, labels: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        """Args:
        name: the exposed name (its `_bucket`, `_count` and `_sum` series follow).
        documentation: the HELP text.
        labels: the label names (`le` is the histogram's own).
        buckets: the finite upper bounds, increasing; `+Inf` is added.

        Raises:
            ValueError: no bucket, bounds not increasing or not finite, or a label named `le`.
        """
        if not buckets or any(not math.isfinite(b) for b in buckets):
            raise ValueError(f"{name}: wants finite bucket bounds, got {buckets!r}")
        if any(a >= b for a, b in itertools.pairwise(buckets)):
            raise ValueError(f"{name}: bucket bounds must increase, got {buckets!r}")
        if "le" in labels:
            raise ValueError(f"{name}: 'le' is the histogram's own label")
        super().__init__(name, documentation, labels)
        self._bounds = buckets
        """Each label set's value: the count of each bucket on its own (not cumulative; the last is
        +Inf's), then the sum of the observations."""

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        """Count one observation of `value` for a label set.

        Raises:
            ValueError: not one string per label name.
        """
        index = bisect.bisect_left(self._bounds, value)  # the first bound >= value: `le` is inclusive
        lock = self._lock
        lock.acquire()  # not `with`: once per connection, as Family.inc
        try:
            counts = self._values.get(labels)
            if counts is None:
                self._check(labels)
                counts = self._values[labels] = [0.0] * (len(self._bounds) + 2)
            counts[index] += 1
            counts[-1] += value
        finally:
            lock.release()

    @property
    def bounds(self) -> tuple[float, ...]:
        """The finite upper bounds of the buckets (`+Inf` follows)."""
        return self._bounds

    def add(self, labels: tuple[str, ...], counts: Sequence[int], total: float) -> None:
        """Count observations made elsewhere (a C core's): how many fell in each bucket on its own
        (not cumulative; `+Inf`'s last) and their sum.

        Raises:
            ValueError: not one count per bucket and `+Inf`, or not one string per label name.
        """
        if len(counts) != len(self._bounds) + 1:
            raise ValueError(f"{self.name}: wants {len(self._bounds) + 1} bucket counts, got {len(counts)}")
        with self._lock:
            values = self._values.get(labels)
            if values is None:
                self._check(labels)
                values = self._values[labels] = [0.0] * (len(self._bounds) + 2)
            for index, count in enumerate(counts):
                values[index] += count
            values[-1] += total

    def count(self, labels: tuple[str, ...]) -> int | None:
        """How many observations a label set has; None when it has none."""
        with self._lock:
            counts = self._values.get(labels)
            return None if counts is None else int(sum(counts[:-1]))

    def collect(self) -> Metric:
        """The family as the client library exports it (a consistent copy of its counts)."""
        with self._lock:
            mine = {labels: list(counts) for labels, counts in self._values.items()}
        for labels, counts in self.others.items():
            own = mine.setdefault(labels, [0.0] * len(counts))
            for index, count in enumerate(counts[: len(own)]):
                own[index] += count
        values = list(mine.items())
        histogram = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        # The library's own `le` formatting (Go's), as its Histogram writes it; it is not typed.
        bounds = [*(floatToGoString(b) for b in self._bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for labels, counts in values:
            cumulative, buckets = 0.0, []
            for bound, count in zip(bounds, counts, strict=False):  # counts ends with the sum
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric(labels, buckets, counts[-1])
        return histogram


class Tally:
    """Counter increments made by one thread, added to their families when scraped (`fold`).

    The fast path's thread counts every connection (accepted, decided) into a cell here: a
    one-item list it adds to, with no lock and no call, a fraction of `Family.inc`. `fold` runs in
    the scraping thread and adds what was counted since the last fold; the counting thread only
    ever adds, so nothing is lost between the two.
    """

    __slots__ = ("_cells", "_folded")

    def __init__(self) -> None:
        self._cells: dict[tuple[Family, tuple[str, ...]], list[int]] = {}
        self._folded: dict[tuple[Family, tuple[str, ...]], int] = {}

    def cell(self, family: Family, labels: tuple[str, ...]) -> list[int]:
        """The counter of a label set, as a one-item list the counting thread adds to
        (`cell[0] += 1`); a caller may keep it and count without looking it up again."""
        key = (family, labels)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = [0]
        return cell

    def fold(self) -> None:
        """Add what was counted since the last fold to the families (the metrics' thread)."""
        folded = self._folded
        for key, cell in list(self._cells.items()):  # a copy: the counting thread may add a cell
            count, before = cell[0], folded.get(key, 0)
            if count != before:
                family, labels = key
                family.inc(labels, count - before)
                folded[key] = count
