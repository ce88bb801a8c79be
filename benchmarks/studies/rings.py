"""CONSISTENT_HASH's rings compared: balance, keys moved when a target leaves or joins, select cost.

    .venv/bin/python -m benchmarks.studies.rings [--keys 100000] [--targets 3,5,10] [--node-ids names|uuids]

Quoted by benchmarks/README.md ("CONSISTENT_HASH's rings"), which docs/configuration.md
("`RING=KETAMA`: a balanced ring") and README.md cite.

For each ring (Artemis's, ketama, ketama with LOAD_FACTOR 1.25 and 1.05) and each pool size n, the keys
(MQTT-style client ids `client-0`, `client-1`, …) are assigned in order by the policy itself
(`make_policy`, as routerd builds it), each assignment adding one connection to its target, which
bounded load reads through the policy's connection counts:

- balance: the most keys on one target over the mean (1.0 is perfect);
- leave: the fraction of keys whose target changes when one target leaves, the keys assigned
  again from scratch over the other n-1; the mean over each of the n targets leaving (ideal 1/n:
  only the leaving target's keys);
- join: the same when one new target joins the n; the mean over n different new node ids (ideal
  1/(n+1)).

Node ids are `broker-0`, `broker-1`, … (`--node-ids names`, as operators name connectors) or
random-looking UUIDs from a fixed seed (`uuids`, as Artemis generates node ids). Then the cost of
one `select` (µs per call over distinct keys, the ring already built) at 3 and 10 targets, and
of building a ketama ring.

Pure Python, in process, no network: about a minute for the defaults on one core.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING, Final

from policies import KetamaRing, PolicyConfig, make_policy
from pools import Connector, Target

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "RINGS",
    "RingFigures",
    "assign",
    "build_ms",
    "main",
    "measure",
    "node_ids",
    "select_us",
    "targets_of",
]

RINGS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "artemis": (),
    "ketama": (("RING", "KETAMA"),),
    "ketama+load1.25": (("RING", "KETAMA"), ("LOAD_FACTOR", "1.25")),
    "ketama+load1.05": (("RING", "KETAMA"), ("LOAD_FACTOR", "1.05")),
}
"""The CONSISTENT_HASH properties of each ring compared (1.25: a common default, e.g. brpc's
bounded-load balancer's; 1.05: a tight bound, which binds more often and so moves more keys)."""

_UUID_SEED: Final = 20261124


class _Loads:
    """The connections assigned so far, as the policy's connection count source."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def connection_count(self, node_id: str) -> int | None:
        return self.counts[node_id]


@dataclass(frozen=True, slots=True, kw_only=True)
class RingFigures:
    """One ring over one pool size."""

    ring: str
    """A key of RINGS."""
    targets: int
    balance: float
    """Most keys on one target / mean keys per target."""
    leave_mean: float
    """Mean fraction of keys that change target when one target leaves (over each target)."""
    leave_max: float
    """The most that one target leaving moves."""
    join_mean: float
    """Mean fraction of keys that change target when one new target joins (over n new ones)."""
    join_max: float
    """The most that one new target joining moves."""


def node_ids(count: int, style: str, *, start: int = 0) -> list[str]:
    """Node ids number `start` to `start + count - 1` in a style ("names" or "uuids")."""
    if style == "names":
        return [f"broker-{i}" for i in range(start, start + count)]
    rng = random.Random(_UUID_SEED)
    every = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(start + count)]
    return every[start:]


def targets_of(ids: Sequence[str]) -> list[Target]:
    """Pool targets with these node ids (weight 1), as a static pool would hold them."""
    return [Target(node_id=n, connector=Connector(name=n, host="127.0.0.1", port=61616)) for n in ids]


def assign(ring: str, targets: Sequence[Target], keys: Sequence[str]) -> list[str]:
    """Each key's node id, the keys assigned in order, each adding one connection to its target."""
    loads = _Loads()
    policy = make_policy(PolicyConfig(name="CONSISTENT_HASH", properties=RINGS[ring]), counts=loads)
    picks: list[str] = []
    for key in keys:
        target = policy.select(targets, key)
        assert target is not None
        loads.counts[target.node_id] += 1
        picks.append(target.node_id)
    return picks


def _moved(before: Sequence[str], after: Sequence[str]) -> float:
    return sum(1 for b, a in zip(before, after, strict=True) if b != a) / len(before)


def measure(ring: str, count: int, keys: Sequence[str], style: str = "names") -> RingFigures:
    """Balance and the mean moved fractions of one ring over `count` targets."""
    ids = node_ids(count, style)
    base = assign(ring, targets_of(ids), keys)
    per_target = Counter(base)
    balance = max(per_target.values()) / (len(keys) / count)
    leave = [_moved(base, assign(ring, targets_of([n for n in ids if n != gone]), keys)) for gone in ids]
    joiners = node_ids(count, style, start=count)
    join = [_moved(base, assign(ring, targets_of([*ids, new]), keys)) for new in joiners]
    return RingFigures(
        ring=ring,
        targets=count,
        balance=balance,
        leave_mean=fmean(leave),
        leave_max=max(leave),
        join_mean=fmean(join),
        join_max=max(join),
    )


def select_us(ring: str, count: int, keys: Sequence[str]) -> float:
    """µs per `select` over distinct keys at `count` targets (the ring built before the clock starts;
    bounded load reads fixed counts, all 0)."""
    targets = targets_of(node_ids(count, "names"))
    policy = make_policy(PolicyConfig(name="CONSISTENT_HASH", properties=RINGS[ring]), counts=_Loads())
    policy.select(targets, "warm-up")
    started = time.perf_counter()
    for key in keys:
        policy.select(targets, key)
    return (time.perf_counter() - started) / len(keys) * 1e6


def build_ms(count: int, repeat: int = 3) -> float:
    """ms to build one ketama ring of `count` targets of weight 1 (the best of `repeat`)."""
    nodes = [(n, 1) for n in node_ids(count, "names")]
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        KetamaRing(nodes)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keys", type=int, default=100_000, help="keys assigned (default 100000)")
    parser.add_argument("--targets", default="3,5,10", help="pool sizes, comma-separated (default 3,5,10)")
    parser.add_argument(
        "--node-ids", choices=("names", "uuids"), default="names", help="node id style (default names)"
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.targets.split(",")]
    keys = [f"client-{i}" for i in range(args.keys)]
    print(f"{args.keys} keys, node ids {args.node_ids}; keys moved when one target leaves (each of")
    print("the n in turn) or one joins (n different ones): mean and max; ideal 1/n and 1/(n+1)")
    header = ("ring", "n", "max/mean", "leave", "max", "ideal", "join", "max", "ideal")
    print("{:<16} {:>3} {:>9} {:>7} {:>7} {:>6} {:>7} {:>7} {:>6}".format(*header))
    for count in sizes:
        for ring in RINGS:
            f = measure(ring, count, keys, args.node_ids)
            print(
                f"{f.ring:<16} {f.targets:>3} {f.balance:>9.3f} {f.leave_mean:>7.1%} {f.leave_max:>7.1%} "
                f"{1 / count:>6.1%} {f.join_mean:>7.1%} {f.join_max:>7.1%} {1 / (count + 1):>6.1%}",
                flush=True,
            )
    calls = keys[:20_000]
    print(f"\nselect, µs per call over {len(calls)} distinct keys (ring already built)")
    print(f"{'ring':<16} {'3 targets':>10} {'10 targets':>11}")
    for ring in RINGS:
        print(f"{ring:<16} {select_us(ring, 3, calls):>10.2f} {select_us(ring, 10, calls):>11.2f}")
    builds = ", ".join(f"{n} targets {build_ms(n):.1f} ms" for n in (3, 10, 100))
    print(f"\nbuilding a ketama ring (once per change of the ready targets): {builds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
