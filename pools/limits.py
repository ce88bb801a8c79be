"""A target's storm-protection limits, read from its connector's URL parameters.

Pure data: `TargetLimits` says how many proxied connections a target takes at once, how many may
wait for it and how long, how many connects a second it takes, and how long its slow start lasts.
The rules that apply them (gates, queues, token buckets) are pools/gates.py.

    maxConnections  proxied connections open at once (1 or more; none: no limit)
    maxQueue        connections that may wait for a slot or a connect (0 or more; default:
                    maxConnections, or 10 x connectRate; needs one of the two)
    queueTimeout    how long one may wait, in ms (default 5000)
    connectRate     connects (proxied) and redirects into the target a second (a positive number)
    slowStart       ms over which a target that becomes ready ramps up (default 0: none)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["LIMIT_PARAMS", "TargetLimits", "limits_from_params"]

LIMIT_PARAMS: Final = ("maxConnections", "maxQueue", "queueTimeout", "connectRate", "slowStart")
"""The connector URL parameters read here."""

DEFAULT_QUEUE_TIMEOUT_MS: Final = 5000
"""How long a client waits for a full target by default (HAProxy's `timeout queue` defaults to its
connect timeout; ours is 5 s too)."""

_QUEUE_PER_RATE: Final = 10
"""The default queue of a target with only a connect rate: ten seconds' worth of it."""

_BURST_SECONDS: Final = 0.1
"""A target's connect bucket holds this many seconds of its rate (at least one token), so that no
second sees more than 1.1 times the rate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetLimits:
    """A target's limits; the defaults are none."""

    max_connections: int | None = None
    """Proxied connections open at once; None = no limit."""
    max_queue: int = 0
    """Connections that may wait for a slot or a connect token; 0 = none wait (refused at once)."""
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_MS / 1000
    """How long one may wait before it is refused (or sent elsewhere)."""
    connect_rate: float | None = None
    """Connects (proxied) and redirects into the target a second; None = no limit."""
    slow_start_s: float = 0.0
    """The slow-start window; 0 = none."""

    def __post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"maxConnections must be at least 1, got {self.max_connections!r}")
        if self.max_queue < 0:
            raise ValueError(f"maxQueue must be 0 or more, got {self.max_queue!r}")
        if self.max_queue and not self.limited:
            raise ValueError("maxQueue needs maxConnections or connectRate: nothing would make clients wait")
        if self.queue_timeout_s < 0 or not math.isfinite(self.queue_timeout_s):
            raise ValueError(f"queueTimeout must be 0 or more, got {self.queue_timeout_s!r}")
        if self.connect_rate is not None and not (self.connect_rate > 0 and math.isfinite(self.connect_rate)):
            raise ValueError(f"connectRate must be a positive number, got {self.connect_rate!r}")
        if self.slow_start_s < 0 or not math.isfinite(self.slow_start_s):
            raise ValueError(f"slowStart must be 0 or more, got {self.slow_start_s!r}")

    @property
    def limited(self) -> bool:
        """Whether anything here can make a client wait or be refused."""
        return self.max_connections is not None or self.connect_rate is not None

    @property
    def connect_burst(self) -> float:
        """The connect bucket's size: a tenth of a second of the rate, at least 1."""
        if self.connect_rate is None:
            raise ValueError("no connectRate")
        return max(1.0, self.connect_rate * _BURST_SECONDS)


def _whole(name: str, text: str, least: int) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or int(value) < least:
        raise ValueError(f"{name} must be an integer {least} or more, got {text!r}")
    return int(value)


def _rate(name: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number (per second), got {text!r}")
    return value


def limits_from_params(params: Mapping[str, str]) -> TargetLimits:
    """The limits a connector's URL parameters give (see the module docstring).

    Raises:
        ValueError: a value that is not a number in range, or `maxQueue`/`queueTimeout`/`slowStart`
            without anything that limits (the message names the parameter and the value).
    """
    given = {name: params[name] for name in LIMIT_PARAMS if name in params}
    if not given:
        return TargetLimits()
    max_connections = (
        None if "maxConnections" not in given else _whole("maxConnections", given["maxConnections"], 1)
    )
    connect_rate = None if "connectRate" not in given else _rate("connectRate", given["connectRate"])
    limited = max_connections is not None or connect_rate is not None
    for name in ("maxQueue", "queueTimeout"):
        if name in given and not limited:
            raise ValueError(f"{name} needs maxConnections or connectRate: nothing would make clients wait")
    if "maxQueue" in given:
        max_queue = _whole("maxQueue", given["maxQueue"], 0)
    elif max_connections is not None:
        max_queue = max_connections
    elif connect_rate is not None:
        max_queue = max(1, math.ceil(connect_rate * _QUEUE_PER_RATE))
    else:
        max_queue = 0
    timeout_ms = _whole("queueTimeout", given.get("queueTimeout", str(DEFAULT_QUEUE_TIMEOUT_MS)), 0)
    slow_start_ms = _whole("slowStart", given.get("slowStart", "0"), 0)
    return TargetLimits(
        max_connections=max_connections,
        max_queue=max_queue,
        queue_timeout_s=timeout_ms / 1000,
        connect_rate=connect_rate,
        slow_start_s=slow_start_ms / 1000,
    )
