"""The event log's cost to routerd, side by side: routerds with and without the log in one fleet,
measured in turn many times, each run with the log set against the run without it next to it.

    .venv/bin/python -m benchmarks.studies.event_log_side [--rounds N] [--connections N] [--instances K]
                                                          [--baseline DIR]... [--json PATH]

Quoted by docs/event-log.md ("What it costs routerd") and benchmarks/README.md ("The event log
sent by the reporting thread").

Why not pairs of fresh fleets (`benchmarks.run --event-log-pairs`): on this 2-core machine the
speed of the same routerd drifts by ±20 % within seconds (other tenants of the host), and one
routerd's rate differs between two starts. Here every routerd runs for the whole measurement, the
runs are short (`--connections`, about a second each), and each round measures every routerd
once, the order reversed every other round; the figure is the median over the rounds of each
run's change against the run without the log in the same round. `--instances` starts each
configuration that many times (K processes, so that one process's luck does not decide).

It starts a C echo server (two backends), then for each configuration `--instances` routerds on
the benchmark's configuration (`benchmarks.configs.routerd_config`, ports chosen at run time):
`off` (no event log), `on` (`--event-log` into the work directory), and one configuration per
`--baseline DIR`, named after DIR (the routerd of another checkout, with the log on: a change
against the code before it, or a part of the log's work left out, to see what each part costs).
Each run is `loadgen rate` (connect, 16 B echo, close; 50 in parallel, from 127.0.0.2-.9)
through one routerd's echo acceptor. Per run it reads the connection rate, the CPU time per
connection of routerd's routing thread (the busiest one), of its other threads, and of its writer
process (`/proc/PID/task/TID/schedstat`), and the routing thread's split between user space and the
kernel (`/proc/PID/task/TID/stat`, in ticks of 10 ms): the log's cost is in user space. It prints
each configuration's medians and its change against `off` (the rate's with a 95 % bootstrap
interval of its median: a single run's median moves by a few points), the goal's verdict (the event log
costs at most 5 % of the short-connection rate), and writes the runs as JSON. Every process is
stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks.clients import Loadgen, build_c_tools
from benchmarks.configs import Ports, routerd_config
from benchmarks.fleet import (
    CLOCK_TICK_S,
    Fleet,
    cpu_ns_by_thread,
    cpu_ticks_by_thread,
    pick_ports,
    raise_fd_limit,
)
from benchmarks.run import EVENT_LOG_GOAL, ROOT

if TYPE_CHECKING:
    from collections.abc import Sequence

CONCURRENCY: Final = 50
WARMUP_CONNECTIONS: Final = 3_000
RUN_SECONDS: Final = 30.0
"""Upper bound of one run (it ends at `--connections` long before)."""
BOOTSTRAP_RESAMPLES: Final = 2000
"""Resamples of the rounds' changes for the interval of their median (`median_interval`)."""


@dataclass(frozen=True, slots=True)
class Run:
    """One run through one routerd."""

    configuration: str
    instance: int
    rate: float
    """Connections per second."""
    routing_us: float
    """CPU time of routerd's busiest thread per connection (µs)."""
    routing_user_us: float
    """Of which in user space (µs, from clock ticks of 10 ms: about ±1.3 µs on a run of 8,000
    connections)."""
    routing_system_us: float
    """Of which in the kernel (the same ticks)."""
    other_threads_us: float
    writer_us: float
    """CPU time of routerd's child processes (the event log's writer) per connection (µs)."""


@dataclass(frozen=True, slots=True)
class _Routerd:
    configuration: str
    instance: int
    pid: int
    port: int


def _measure(routerd: _Routerd, loadgen: Loadgen, connections: int) -> Run:
    threads_before, children_before = cpu_ns_by_thread(routerd.pid)
    ticks_before = cpu_ticks_by_thread(routerd.pid)
    result = loadgen.rate(
        routerd.port, kind="echo", concurrency=CONCURRENCY, total=connections, seconds=RUN_SECONDS
    )
    threads_after, children_after = cpu_ns_by_thread(routerd.pid)
    ticks_after = cpu_ticks_by_thread(routerd.pid)
    if result.ok == 0:
        raise RuntimeError(f"no connection through {routerd.configuration} succeeded: {result.last_error}")
    used = {tid: (ns - threads_before.get(tid, 0)) / 1000 / result.ok for tid, ns in threads_after.items()}
    busiest = max(used, key=used.__getitem__)
    routing = used[busiest]
    (user_before, system_before), (user_after, system_after) = (
        ticks.get(busiest, (0, 0)) for ticks in (ticks_before, ticks_after)
    )
    per_connection_us = CLOCK_TICK_S * 1e6 / result.ok
    return Run(
        configuration=routerd.configuration,
        instance=routerd.instance,
        rate=result.rate,
        routing_us=routing,
        routing_user_us=(user_after - user_before) * per_connection_us,
        routing_system_us=(system_after - system_before) * per_connection_us,
        other_threads_us=sum(used.values()) - routing,
        writer_us=(children_after - children_before) / 1000 / result.ok,
    )


def _start(
    fleet: Fleet, work: Path, configurations: list[tuple[str, Path, bool]], instances: int
) -> tuple[list[_Routerd], Loadgen]:
    """The echo backends, then every routerd: the routerds in measuring order, and the load client."""
    binaries = build_c_tools(work)
    echo = pick_ports(2)
    fleet.start("echo backends", [str(binaries["echo_srv"]), "127.0.0.1", *map(str, echo)], ports=echo)
    used = set(echo)
    routerds = []
    for instance in range(instances):
        for name, root, event_log in configurations:
            numbers = [p for p in pick_ports(Ports.COUNT + len(used)) if p not in used][: Ports.COUNT - 2]
            ports = Ports.from_numbers([*echo, *numbers])  # iperf and mosquitto: not started, not used
            used.update(ports.all())
            label = f"{name}-{instance}"
            config = work / f"routerd-{label}.xml"
            config.write_text(routerd_config(ports))
            argv = [sys.executable, "-m", "router", "--config", str(config), "--log-level", "WARNING"]
            argv += ["--admin", f"127.0.0.1:{ports.routerd_admin}"]
            if event_log:
                argv += ["--event-log", str(work / f"events-{label}")]
            proc = fleet.start(f"routerd-{label}", argv, ports=[ports.routerd_echo], cwd=root)
            routerds.append(_Routerd(name, instance, proc.pid, ports.routerd_echo))
    return routerds, Loadgen(binaries["loadgen"], fleet)


def _changes(runs: list[Run], configuration: str, attribute: str, relative: bool) -> list[float]:
    """(configuration's run - off's run), per instance and round."""
    off = [r for r in runs if r.configuration == "off"]
    mine = [r for r in runs if r.configuration == configuration]
    changes = []
    for base, run in zip(off, mine, strict=True):
        a, b = getattr(base, attribute), getattr(run, attribute)
        changes.append(b / a - 1 if relative else b - a)
    return changes


def _median_change(runs: list[Run], configuration: str, attribute: str, relative: bool) -> float:
    """Median over rounds of (configuration's run - off's run), per instance and round."""
    return float(statistics.median(_changes(runs, configuration, attribute, relative)))


def median_interval(values: list[float], *, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of `values` (percentile method; the resampling
    seeded, so the same runs give the same interval)."""
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(resamples * 0.025)], medians[int(resamples * 0.975) - 1]


def report(runs: list[Run]) -> str:
    """Each configuration's medians and its changes against `off`, and the goal's verdict."""
    lines = []
    names = list(dict.fromkeys(r.configuration for r in runs))
    for name in names:
        mine = [r for r in runs if r.configuration == name]
        line = (
            f"{name:9s} {statistics.median(r.rate for r in mine):8,.0f} conn/s; CPU per connection: routing "
            f"thread {statistics.median(r.routing_us for r in mine):6.1f} µs (user "
            f"{statistics.median(r.routing_user_us for r in mine):.1f}, system "
            f"{statistics.median(r.routing_system_us for r in mine):.1f}), other threads "
            f"{statistics.median(r.other_threads_us for r in mine):4.1f} µs, writer "
            f"{statistics.median(r.writer_us for r in mine):4.1f} µs"
        )
        if name != "off":
            low, high = median_interval(_changes(runs, name, "rate", True))
            line += (
                f" | against off in the same round: rate {_median_change(runs, name, 'rate', True):+.1%} "
                f"[95 %: {low:+.1%}, {high:+.1%}], "
                f"routing thread {_median_change(runs, name, 'routing_us', False):+.1f} µs (user "
                f"{_median_change(runs, name, 'routing_user_us', False):+.1f})"
            )
        lines.append(line)
    change = _median_change(runs, "on", "rate", True)
    verdict = "met" if change >= EVENT_LOG_GOAL else "not met"
    lines.append(
        f"goal: the event log costs <= {-EVENT_LOG_GOAL:.0%} of the short-connection rate: "
        f"{change:+.1%}, {verdict}"
    )
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.event_log_side",
        description="The event log's cost to routerd's short-connection rate, routerds side by side.",
    )
    parser.add_argument("--rounds", type=int, default=12, help="rounds (each measures every routerd once)")
    parser.add_argument("--connections", type=int, default=8_000, help="connections per run")
    parser.add_argument("--instances", type=int, default=2, help="routerd processes per configuration")
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="another checkout's root: its routerd, log on (repeatable: each is a configuration named "
        "after its directory)",
    )
    parser.add_argument("--json", type=Path, help="where the runs go (default: the work directory)")
    args = parser.parse_args(argv)
    for name, low, high in (("rounds", 1, 100), ("connections", 100, 100_000), ("instances", 1, 4)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name} must be {low}-{high}, got {getattr(args, name)}")
    for root in args.baseline:
        if not (root / "router" / "__main__.py").is_file():
            parser.error(f"--baseline {root}: no router package there")
    names = [root.resolve().name for root in args.baseline]
    if len(set(names)) < len(names) or {"off", "on"} & set(names):
        parser.error(
            f"--baseline: each directory's name names its configuration: distinct, not off or on; got {names}"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; 0, or 1 when it failed."""
    args = _parse_args(argv)
    configurations = [("off", ROOT, False), ("on", ROOT, True)]
    configurations += [(root.resolve().name, root.resolve(), True) for root in args.baseline]
    work = Path(tempfile.mkdtemp(prefix="event-log-side-"))
    raise_fd_limit()
    runs: list[Run] = []
    with Fleet(work, say=lambda text: print(f"bench: {text}", file=sys.stderr)) as fleet:
        try:
            routerds, loadgen = _start(fleet, work, configurations, args.instances)
            for routerd in routerds:  # the first connections pay for lazily made state
                loadgen.rate(
                    routerd.port,
                    kind="echo",
                    concurrency=CONCURRENCY,
                    total=WARMUP_CONNECTIONS,
                    seconds=RUN_SECONDS,
                )
            time.sleep(1.0)
            for round_number in range(args.rounds):
                order = routerds if round_number % 2 == 0 else routerds[::-1]
                measured = {
                    (r.configuration, r.instance): _measure(r, loadgen, args.connections) for r in order
                }
                runs.extend(measured[(r.configuration, r.instance)] for r in routerds)
        except (OSError, RuntimeError) as exc:
            print(f"bench: failed: {exc}", file=sys.stderr)
            return 1
    print(report(runs))
    path = args.json or work / "event-log-side.json"
    document = {"format": "router-bench-event-log-side/2", "runs": [asdict(r) for r in runs]}
    path.write_text(json.dumps(document, indent=1))
    print(f"runs in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
