"""Passive health (outlier detection, as Envoy's): a target whose broker keeps refusing or dropping
the clients sent to it is ejected for a back-off, whatever its probes say.

Rule 1 (as in `pools/pool.py`): everything that changes a target's ejection state lives in this
file. The data paths only report what a broker did with one connection (router/core/live.py judges
it: closed before its first byte, or a protocol refusal); `Pool` feeds the reports in with `now`
and asks which targets are ejected. No clock and no network here.

Transitions, per target (initial state IN):

    state     on failure                                   on answer       at ejected_until
    IN        IN, counted (the count starts again when      IN, count 0     -
              the window since its first failure passed)
    IN        EJECTED, when the count reaches
              `consecutive_failures` within `window_ms` and
              the pool may lose one more target (below)
    EJECTED   EJECTED (not counted)                        EJECTED         IN, count 0

An answer is a broker's first bytes that are not a refusal; a successful probe is not an answer:
it does not end an ejection early (the broker that drops clients at its connection limit answers a
probe that finds a free slot). The ejection lasts `base_ejection_ms` times 2**k, k the ejections
in a row (those that began within `max_ejection_ms` of the return from the one before), at most
`max_ejection_ms`.

How many may be ejected at once: at most `max_ejected_percent` of the pool's targets (at least one,
as Envoy), and never the last target not ejected: passive health alone never empties a pool.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["BrokerFailure", "Ejection", "OutlierConfig", "OutlierState", "Outliers"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutlierConfig:
    """The `<outlier-detection>` element of a `<pool>` (our own; docs/configuration.md)."""

    enabled: bool = True
    """Whether passive health ejects targets at all."""
    consecutive_failures: int = 5
    """Failures in a row, with no answer between, that eject a target (Envoy's consecutive_5xx
    default is 5)."""
    window_ms: int = 10_000
    """The failures must fall within this time of the first of them (older ones are forgotten)."""
    base_ejection_ms: int = 30_000
    """The first ejection's length (Envoy's base_ejection_time default is 30 s)."""
    max_ejection_ms: int = 300_000
    """The longest ejection (Envoy's max_ejection_time default is 300 s)."""
    max_ejected_percent: int = 100
    """At most this share of the pool's targets is ejected at once (at least one; never the last
    target not ejected). 100: every target but one."""

    def __post_init__(self) -> None:
        if self.consecutive_failures <= 0:
            raise ValueError(f"consecutive-failures must be > 0, got {self.consecutive_failures!r}")
        if self.window_ms <= 0:
            raise ValueError(f"window must be > 0, got {self.window_ms!r}")
        if self.base_ejection_ms <= 0:
            raise ValueError(f"base-ejection-time must be > 0, got {self.base_ejection_ms!r}")
        if self.max_ejection_ms < self.base_ejection_ms:
            raise ValueError(
                f"max-ejection-time must be >= base-ejection-time ({self.base_ejection_ms!r}), "
                f"got {self.max_ejection_ms!r}"
            )
        if not 0 <= self.max_ejected_percent <= 100:
            raise ValueError(f"max-ejected-percent must be in 0..100, got {self.max_ejected_percent!r}")


class BrokerFailure(enum.Enum):
    """What a broker did that counts against it: the `reason` label of
    `router_target_outlier_failures_total` and the closed line's `reason=`."""

    CLOSED_EARLY = "broker_closed_early"
    """It closed (or reset) the connection before sending a byte, soon after the connect."""
    REFUSED = "broker_refused"
    """Its first answer was its protocol's refusal (an MQTT CONNACK with an error code, a STOMP
    ERROR frame, an AMQP close with an error)."""


class OutlierState(enum.Enum):
    """A target's passive-health state."""

    IN = "in"
    EJECTED = "ejected"


@dataclass(frozen=True, slots=True, kw_only=True)
class Ejection:
    """Why and until when a target is ejected."""

    node_id: str
    until: float
    """When it returns (the caller's clock)."""
    duration_s: float
    failures: int
    reason: BrokerFailure
    """The failure that ejected it."""
    detail: str = ""
    """What the broker said or did, as the data path reported it."""

    @property
    def why(self) -> str:
        """The target's not-ready reason while ejected."""
        said = f" ({self.detail})" if self.detail else ""
        return (
            f"ejected by outlier detection for {self.duration_s:g} s: {self.failures} "
            f"consecutive failures, the last {self.reason.value}{said}"
        )


@dataclass(slots=True)
class _Record:
    """One target's counts (mutable)."""

    failures: int = 0
    first_failure_at: float = 0.0
    ejections: int = 0
    """Ejections in a row (the back-off's exponent)."""
    returned_at: float | None = None
    ejection: Ejection | None = None


class Outliers:
    """The passive-health state of one pool's targets (mutable; see the module docstring)."""

    __slots__ = ("_records", "config", "ejected")

    def __init__(self, config: OutlierConfig) -> None:
        self.config = config
        self._records: dict[str, _Record] = {}
        """Only targets with a failure or an ejection to remember: an answer from any other costs a
        dict lookup."""
        self.ejected: dict[str, Ejection] = {}
        """Node id -> its ejection, for the targets ejected now."""

    def state(self, node_id: str) -> OutlierState:
        return OutlierState.EJECTED if node_id in self.ejected else OutlierState.IN

    def failed(
        self, node_id: str, reason: BrokerFailure, now: float, *, pool_size: int, detail: str = ""
    ) -> Ejection | None:
        """Count one failure of a target's broker.

        Args:
            node_id: the target.
            reason: what its broker did.
            now: the current time (seconds, the caller's clock).
            pool_size: how many targets the pool has (for `max_ejected_percent`).
            detail: what the broker said, for the reason shown while ejected.

        Returns:
            The ejection when this failure ejects the target, else None.
        """
        config = self.config
        if not config.enabled or node_id in self.ejected:
            return None
        record = self._records.get(node_id)
        if record is None:
            record = self._records[node_id] = _Record()
        if record.failures == 0 or now - record.first_failure_at > config.window_ms / 1000:
            record.failures, record.first_failure_at = 0, now
        record.failures += 1
        if record.failures < config.consecutive_failures or not self._may_eject(pool_size):
            return None
        if record.returned_at is not None and now - record.returned_at > config.max_ejection_ms / 1000:
            record.ejections = 0  # a quiet spell since the last return: the back-off starts again
        duration_ms = min(config.base_ejection_ms * 2**record.ejections, config.max_ejection_ms)
        record.ejections += 1
        ejection = Ejection(
            node_id=node_id,
            until=now + duration_ms / 1000,
            duration_s=duration_ms / 1000,
            failures=record.failures,
            reason=reason,
            detail=detail,
        )
        record.failures, record.ejection = 0, ejection
        self.ejected[node_id] = ejection
        return ejection

    def _may_eject(self, pool_size: int) -> bool:
        ejected = len(self.ejected)
        if ejected + 1 >= pool_size:  # never the last target not ejected
            return False
        return ejected == 0 or (ejected + 1) * 100 <= self.config.max_ejected_percent * pool_size

    def failing(self, node_id: str) -> bool:
        """Whether a target has failures counted now."""
        record = self._records.get(node_id)
        return record is not None and record.failures > 0

    def answered(self, node_id: str) -> bool:
        """A target's broker answered a client (not a refusal): its failures in a row end.

        Returns:
            Whether anything changed (False, the usual case, costs one dict lookup).
        """
        record = self._records.get(node_id)
        if record is None or record.failures == 0:
            return False
        record.failures = 0
        return True

    def returns(self, now: float) -> list[Ejection]:
        """End the ejections that are over at `now`.

        Returns:
            The ejections that ended, in the order they began.
        """
        over = [e for e in self.ejected.values() if e.until <= now]
        for ejection in over:
            del self.ejected[ejection.node_id]
            record = self._records[ejection.node_id]
            record.failures, record.returned_at, record.ejection = 0, now, None
        return over

    def next_return(self) -> float | None:
        """When the earliest ejection ends (None: none is ejected)."""
        return min((e.until for e in self.ejected.values()), default=None)

    def keep_only(self, node_ids: Iterable[str]) -> None:
        """Forget the targets that left the pool (a reload or discovery)."""
        kept = set(node_ids)
        for node_id in [n for n in self._records if n not in kept]:
            del self._records[node_id]
            self.ejected.pop(node_id, None)

    def reconfigure(self, config: OutlierConfig) -> list[Ejection]:
        """A reload: the new settings apply from the next failure; ejections under way keep their
        end, unless outlier detection was turned off: then they end now.

        Returns:
            The ejections that ended.
        """
        self.config = config
        if config.enabled:
            return []
        ended = list(self.ejected.values())
        self.ejected.clear()
        for record in self._records.values():
            record.failures, record.ejection = 0, None
        return ended
