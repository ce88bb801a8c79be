"""Routing decision time, in process: `RoutingEngine.route` for one key, cache miss and cache hit.

The engine is built as routerd builds it (`load_config_text` of the benchmark's own
configuration, `build_pool`, `RoutingEngine`; without the router's lock, which routerd takes
around each decision in `RouterRuntime.decide_now`), its targets are marked ready as the first health
probe would, and each call is timed with `time.perf_counter_ns` (whose own cost, some 0.1 µs, is
included). A miss is the first decision for a key (cache lookup, CONSISTENT_HASH, cache put); a
hit is the second one for the same key.

`python -m benchmarks.decision` prints the percentiles of the same router with its cache as
configured (in memory), persisted (`<persisted>true</persisted>`: the decision also notes the
change in the cache's journal; the file is written by another task, off the decision, so it is not
in these figures) and shared through ZooKeeper (`<zookeeper>` in `<cache>`: `RoutingEngine.begin`,
as routerd decides; a hit also notes the key as used; a miss is the engine's part of it,
`SharedCacheWait` then `after_shared` with no entry found: ZooKeeper's read and the claim are
measured apart, by `benchmarks/studies/shared_cache.py`), side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from keys import ConnectionFacts
from router.config import load_config_text
from router.config.settings import ZooKeeperConfig
from router.core.engine import (
    DecisionReason,
    RouteDecision,
    RouteStatus,
    RoutingEngine,
    SharedCacheWait,
    build_pool,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DecisionTimes", "percentile", "time_decisions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionTimes:
    """Percentiles of one decision, in microseconds."""

    keys: int
    miss_p50_us: float
    miss_p99_us: float
    hit_p50_us: float
    hit_p99_us: float


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of unsorted samples (the same rule as loadgen.c).

    Raises:
        ValueError: no samples, or a fraction outside (0, 1].
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    ordered = sorted(samples)
    rank = max(1, math.ceil(round(fraction * len(ordered), 9)))
    return ordered[rank - 1]


def _source_ips(count: int) -> list[str]:
    return [f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" for i in range(count)]


def time_decisions(
    config_text: str, router_name: str, *, keys: int, persisted: bool = False, shared: bool = False
) -> DecisionTimes:
    """Time `keys` cache misses, then `keys` cache hits, of one SOURCE_IP router.

    Args:
        config_text: a routerd configuration (the benchmark's).
        router_name: a router with a pool, a policy and a cache, keyed on SOURCE_IP.
        keys: distinct source addresses to route.
        persisted: persist the router's cache (its journal on; the file is not written here).
        shared: share the router's cache (ZooKeeper is not asked: a miss finds no entry there).

    Returns:
        The percentiles.

    Raises:
        RuntimeError: a decision was not OK, or was not the cache hit or miss it should be.
    """
    config = load_config_text(config_text, "benchmark.xml")
    router = next(r for r in config.routers if r.name == router_name)
    if persisted and router.cache is not None:
        router = dataclasses.replace(
            router, cache=dataclasses.replace(router.cache, persisted=True, file="-")
        )
    if shared:
        zookeeper = ZooKeeperConfig(connect="127.0.0.1:2181", path="/b")
        router = dataclasses.replace(router, cache_zookeeper=zookeeper)
    pool, local = build_pool(config, router)
    if pool is None:
        raise RuntimeError(f"router {router_name!r} has no pool")
    for target in pool.targets:
        pool.record_check(target.node_id, True)
    engine = RoutingEngine(router, pool, local)
    facts = [ConnectionFacts(source_ip=ip) for ip in _source_ips(keys)]
    now = time.monotonic()
    clock = time.perf_counter_ns
    route = engine.route
    if shared:

        def route(facts: ConnectionFacts, now: float) -> RouteDecision:
            decision = engine.begin(facts, now)
            if isinstance(decision, SharedCacheWait):
                decision = engine.after_shared(decision, None, now)
            assert isinstance(decision, RouteDecision)
            return decision

    for i in range(200):  # the first calls pay for lazy imports and the caches of re
        route(ConnectionFacts(source_ip=f"192.0.2.{i}"), now)
    results: dict[str, list[float]] = {}
    for phase, expected in (("miss", DecisionReason.POLICY), ("hit", DecisionReason.CACHE)):
        samples: list[float] = []
        for fact in facts:
            start = clock()
            decision = route(fact, now)
            samples.append((clock() - start) / 1000)
            if decision.status is not RouteStatus.OK or decision.reason != expected:
                raise RuntimeError(
                    f"{phase}: expected an OK decision by {expected.value}, "
                    f"got {decision.status.value} by {decision.reason.value}"
                )
        results[phase] = samples
    return DecisionTimes(
        keys=keys,
        miss_p50_us=percentile(results["miss"], 0.50),
        miss_p99_us=percentile(results["miss"], 0.99),
        hit_p50_us=percentile(results["hit"], 0.50),
        hit_p99_us=percentile(results["hit"], 0.99),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Print the decision percentiles with the cache in memory, persisted and shared."""
    from benchmarks.configs import Ports, routerd_config

    parser = argparse.ArgumentParser(prog="python -m benchmarks.decision", description=__doc__)
    parser.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20000)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant, interleaved (default 3)")
    args = parser.parse_args(argv)
    config = routerd_config(Ports.from_numbers(range(20001, 20001 + Ports.COUNT)))
    print(f"{'cache':<10} {'run':>3} {'miss p50':>9} {'miss p99':>9} {'hit p50':>8} {'hit p99':>8}  (µs)")
    for run in range(1, args.runs + 1):
        for name in ("memory", "persisted", "shared"):
            t = time_decisions(
                config, "echo", keys=args.keys, persisted=name == "persisted", shared=name == "shared"
            )
            print(
                f"{name:<10} {run:>3} {t.miss_p50_us:>9.2f} {t.miss_p99_us:>9.2f} {t.hit_p50_us:>8.2f} "
                f"{t.hit_p99_us:>8.2f}"
            )


if __name__ == "__main__":
    main()
