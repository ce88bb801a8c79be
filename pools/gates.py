"""The rules that protect brokers from a reconnect storm: per-target connection limits with a
bounded FIFO queue, connect-rate limits (per target and per acceptor) and slow start.

Pure and clock-free (STYLE R4): every method takes `now` (seconds on the caller's monotonic clock)
and returns a verdict; the data paths carry verdicts out. Everything that changes a gate's state
is in this file; the limits themselves are read from connector parameters in pools/limits.py.

The models are HAProxy's (server `maxconn` + `maxqueue` + `timeout queue`, `slowstart`,
`rate-limit sessions`) and EMQX's (`max_conn_rate`, `max_conn_burst`):

- a **token bucket** (`TokenBucket`) admits `rate` events a second with at most `burst` at once;
  the per-target bucket's burst is a tenth of a second of its rate, so that no second sees more
  than 1.1 times the rate (a storm becomes a ramp);
- a **target gate** (`TargetGate`) admits a proxied connection while the target has fewer than its
  effective limit open and its connect bucket has a token; otherwise the connection waits in a
  FIFO queue of at most `max_queue`, or is refused at once when the queue is full. Nobody
  overtakes the queue: a new connection queues behind waiting ones even when a slot is free at
  that instant (the slot is theirs). A redirect holds no slot (the router does not hold the
  client's connection), but takes a connect token: it sends one client to the target;
- **slow start**: for `slow_start_s` after a target becomes ready (not at router start), its
  effective limit and connect rate grow linearly from `SLOW_START_FLOOR` of full to full; the
  same share weighs it in the policies that weigh targets (policies/policy.py,
  `SlowStartSource`).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pools.limits import TargetLimits

__all__ = [
    "SLOW_START_FLOOR",
    "AcceptRate",
    "Admit",
    "GateState",
    "TargetGate",
    "TokenBucket",
    "Verdict",
    "slow_start_share",
]

_MIN_WAIT_S: Final = 1e-6
"""The shortest wait `TokenBucket.ready_at` names: a token a float rounding away is not there yet."""

SLOW_START_FLOOR: Final = 0.05
"""The share of its limit and connect rate a target starts slow start with (HAProxy starts above 0 too:
a target at 0 would take nothing, and its ramp would never be measured)."""


def slow_start_share(ready_since: float | None, slow_start_s: float, now: float) -> float:
    """The share (`SLOW_START_FLOOR`..1) of its limit and connect rate a target has at `now`.

    Args:
        ready_since: when the target last became ready; None when it was ready at router start
            or slow start does not apply.
        slow_start_s: the window; 0 = no slow start.
        now: the time.
    """
    if ready_since is None or slow_start_s <= 0:
        return 1.0
    elapsed = now - ready_since
    if elapsed >= slow_start_s:
        return 1.0
    return max(SLOW_START_FLOOR, elapsed / slow_start_s)


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; starts full."""

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not rate > 0 or not math.isfinite(rate):
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        if not burst >= 1:
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._last = now

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now

    def take(self, now: float) -> bool:
        """Take a token if there is one."""
        self._refill(now)
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def available(self, now: float) -> bool:
        """Whether `take` would succeed now."""
        self._refill(now)
        return self._tokens >= 1

    def ready_at(self, now: float) -> float:
        """When the next token will be there (`now` if it is; else at least `_MIN_WAIT_S` later,
        so that a caller's clock, whatever its offset, moves on before it asks again)."""
        self._refill(now)
        if self._tokens >= 1:
            return now
        return now + max(_MIN_WAIT_S, (1 - self._tokens) / self.rate)

    def retune(self, rate: float, burst: float, now: float) -> None:
        """A reload changed the rate: keep what was saved up, within the new burst."""
        self._refill(now)
        if not rate > 0 or not math.isfinite(rate):
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        self.rate, self.burst = rate, burst
        self._tokens = min(self._tokens, burst)


class AcceptRate:
    """An acceptor's `connectionRate` / `connectionBurst`: how many new connections it takes a
    second. Over the limit the acceptor stops accepting until `ready_at` (the kernel's backlog
    holds the rest), rather than closing connections. Its bucket starts full at the first `take`
    (whose clock it then keeps: one acceptor is served by one data path)."""

    __slots__ = ("_bucket", "burst", "rate")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._bucket: TokenBucket | None = None

    def take(self, now: float) -> bool:
        """Whether one more connection may be accepted now (taking its token)."""
        if self._bucket is None:
            self._bucket = TokenBucket(self.rate, self.burst, now)
        return self._bucket.take(now)

    def ready_at(self, now: float) -> float:
        """When the next connection may be accepted."""
        return now if self._bucket is None else self._bucket.ready_at(now)


class Verdict(enum.Enum):
    """What a target's gate says to a connection that wants in."""

    ADMIT = "admit"
    """Go: a slot is counted (proxied) and a connect token taken."""
    QUEUED = "queued"
    """Wait in the queue (until `TargetGate.admit_waiting` names it, or the queue timeout)."""
    FULL = "full"
    """The queue is full (or there is none): refuse now, or send elsewhere."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Waiting connections `admit_waiting` let in, and when to ask again."""

    admitted: tuple[int, ...]
    """Their waiter ids, in queue order; each holds a slot now."""
    retry_at: float | None
    """When the head of the queue may be admitted (its connect token), if it is waiting for
    time rather than for a slot; None otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GateState:
    """A gate at one moment, for the status resource and the metrics."""

    open: int
    """Proxied connections holding a slot."""
    queued: int
    limit: int | None
    """The effective limit now (slow start included); None = no limit."""
    share: float
    """The slow-start share now (1.0 outside slow start)."""


class TargetGate:
    """One target's admission state: its open proxied connections, its queue, its connect bucket
    and its slow start."""

    __slots__ = ("_bucket", "_queue", "limits", "open", "ready_since")

    def __init__(self, limits: TargetLimits, now: float) -> None:
        self.limits = limits
        self.open = 0
        """Proxied connections holding a slot (from `offer`/`admit_waiting` to `release`)."""
        self._queue: deque[tuple[int, bool]] = deque()
        """(waiter id, whether it wants a slot), head first."""
        self._bucket = (
            None
            if limits.connect_rate is None
            else TokenBucket(limits.connect_rate, limits.connect_burst, now)
        )
        self.ready_since: float | None = None
        """When the target last became ready, for slow start; None: full share."""

    # -- slow start --

    def became_ready(self, now: float) -> None:
        """The target became ready again (not at router start): its slow start begins."""
        if self.limits.slow_start_s > 0:
            self.ready_since = now

    def share(self, now: float) -> float:
        """The slow-start share now."""
        share = slow_start_share(self.ready_since, self.limits.slow_start_s, now)
        if share >= 1.0:
            self.ready_since = None  # over: no need to compute it again
        return share

    def limit(self, now: float) -> int | None:
        """The effective connection limit now: `max_connections` scaled by the slow-start share,
        at least 1; None = no limit."""
        limit = self.limits.max_connections
        if limit is None:
            return None
        return max(1, math.floor(limit * self.share(now)))

    # -- admission --

    def _can_admit(self, now: float, *, slot: bool) -> bool:
        if slot:
            limit = self.limit(now)
            if limit is not None and self.open >= limit:
                return False
        bucket = self._bucket
        if bucket is None:
            return True
        if self.ready_since is not None:  # slow start: the rate ramps as the limit does
            rate = self.limits.connect_rate
            assert rate is not None
            share = self.share(now)
            bucket.retune(rate * share, max(1.0, self.limits.connect_burst * share), now)
        return bucket.available(now)

    def _admit(self, now: float, *, slot: bool) -> None:
        if self._bucket is not None:
            taken = self._bucket.take(now)
            assert taken, "checked by _can_admit"
        if slot:
            self.open += 1

    def offer(self, waiter: int, now: float, *, slot: bool = True) -> Verdict:
        """A connection (`waiter`, an id unique among those waiting) wants in.

        Args:
            waiter: its id.
            now: the time.
            slot: True for a proxied connection (it holds a slot until `release`); False for a
                redirect (it takes a connect token only).

        Returns:
            ADMIT (counted), QUEUED (remembered; wait for `admit_waiting` or time out and
            `cancel`), or FULL (nothing counted).
        """
        verdict = self.admit_now(now, slot=slot)
        if verdict is Verdict.QUEUED:
            self._queue.append((waiter, slot))
        return verdict

    def admit_now(self, now: float, *, slot: bool = True) -> Verdict:
        """`offer` without queueing: ADMIT (counted), QUEUED (it would have to wait; nothing is
        remembered), or FULL. For a caller that cannot wait (the fast path)."""
        if not self._queue and self._can_admit(now, slot=slot):
            self._admit(now, slot=slot)
            return Verdict.ADMIT
        return Verdict.QUEUED if len(self._queue) < self.limits.max_queue else Verdict.FULL

    def full(self, now: float) -> bool:
        """Whether a new connection wanting a slot would be refused now (`admit_now` would say
        FULL), without counting anything."""
        if not self._queue and self._can_admit(now, slot=True):
            return False
        return len(self._queue) >= self.limits.max_queue

    def admit_waiting(self, now: float) -> Admit:
        """Let waiting connections in, in queue order, while there are slots and tokens (after a
        `release`, when a token is due, when slow start has grown the limit, after a reload)."""
        admitted: list[int] = []
        while self._queue and self._can_admit(now, slot=self._queue[0][1]):
            waiter, slot = self._queue.popleft()
            self._admit(now, slot=slot)
            admitted.append(waiter)
        retry_at = None
        if self._queue and self._bucket is not None:
            limit = self.limit(now)
            if not self._queue[0][1] or limit is None or self.open < limit:  # a token, not a slot
                retry_at = self._bucket.ready_at(now)
        if self._queue and retry_at is None and self.ready_since is not None:
            retry_at = now + self._slow_start_step()
        return Admit(admitted=tuple(admitted), retry_at=retry_at)

    def _slow_start_step(self) -> float:
        """How often a gate in slow start with a full queue looks again (its limit grows)."""
        limit = self.limits.max_connections or 1
        return max(0.01, self.limits.slow_start_s / limit)

    def cancel(self, waiter: int) -> bool:
        """A waiting connection gave up (its queue timeout, the client left); False when it was not
        waiting (admitted meanwhile: it holds a slot, which it must `release`)."""
        for entry in self._queue:
            if entry[0] == waiter:
                self._queue.remove(entry)
                return True
        return False

    def release(self) -> None:
        """A connection that held a slot ended (then call `admit_waiting`)."""
        self.open = max(0, self.open - 1)

    def retune(self, limits: TargetLimits, now: float) -> None:
        """A reload changed the limits: open and waiting connections stay (then call
        `admit_waiting`; a queue now longer than `max_queue` is not cut, it drains)."""
        if limits.connect_rate is None:
            self._bucket = None
        elif self._bucket is None:
            self._bucket = TokenBucket(limits.connect_rate, limits.connect_burst, now)
        else:
            self._bucket.retune(limits.connect_rate, limits.connect_burst, now)
        if limits.slow_start_s <= 0:
            self.ready_since = None
        self.limits = limits

    def state(self, now: float) -> GateState:
        return GateState(open=self.open, queued=self.queued, limit=self.limit(now), share=self.share(now))

    @property
    def queued(self) -> int:
        """How many are waiting."""
        return len(self._queue)

    @property
    def head(self) -> int | None:
        """The waiter id at the head of the queue (the next to be let in); None when none waits."""
        return self._queue[0][0] if self._queue else None

    @property
    def waiting(self) -> tuple[int, ...]:
        """The waiter ids, head first."""
        return tuple(waiter for waiter, _ in self._queue)
