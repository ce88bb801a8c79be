"""routerd's processes (`routerd --workers N`): which one this is, its command-line options, and
the orders the supervisor gives its workers. The workers themselves (zones, board, counts, orders'
transport) are router/features/workers/'s; this is what the kernel needs of them: the process's
place (`Processes`, from `--workers` and a worker's `--worker-of`), given to every feature through
`Kernel.processes`, and the order channel (`Peers`, `Kernel.peers`) features talk through without
importing each other.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from router.ctl_output import integer

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["MAX_WORKERS", "Peers", "Processes", "add_arguments", "processes_of"]

MAX_WORKERS: Final = 64
"""Largest `routerd --workers`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Processes:
    """The processes of one routerd (`routerd --workers N`): a supervisor, which serves too, and
    N - 1 workers it starts (router/features/workers/)."""

    count: int = 1
    """Processes serving the data path (`--workers`)."""
    index: int = 0
    """This process: 0 the supervisor (or the only one), 1 to count - 1 a worker."""
    zones: Mapping[str, int] = field(default_factory=dict)
    """A worker's: router name -> the descriptor of the router's shared zone, from the supervisor."""
    channel: int | None = None
    """A worker's: the descriptor of its socket to the supervisor (its metrics go there)."""
    command: tuple[str, ...] = ()
    """The supervisor's: the command line that starts a worker (its own, which the workers
    feature completes with the worker's number and zones)."""

    @property
    def worker(self) -> bool:
        """Whether this process is a worker (it runs only the features that serve connections)."""
        return self.index > 0

    @property
    def who(self) -> str:
        """How this process's own lines name it: "worker 1 ", or nothing for the supervisor."""
        return f"worker {self.index} " if self.worker else ""


class Peers:
    """Orders between routerd's processes (`Processes`): the supervisor's service broadcasts one
    (an evacuation started through its admin API) and each worker's service of the same feature
    hears it. The transport is the workers feature's (`send`, `deliver`); with one process an
    order goes nowhere."""

    def __init__(self) -> None:
        self._handlers: dict[str, Callable[[Mapping[str, object]], None]] = {}
        self.send: Callable[[str, Mapping[str, object]], None] | None = None
        """The transport to the workers (the supervisor's, set by the workers feature)."""

    def broadcast(self, topic: str, order: Mapping[str, object]) -> None:
        """Tell every worker (nothing without workers). `order` is a JSON object."""
        if self.send is not None:
            self.send(topic, order)

    def listen(self, topic: str, handler: Callable[[Mapping[str, object]], None]) -> None:
        """Have `handler` carry out this process's part of each order of `topic`."""
        self._handlers[topic] = handler

    def deliver(self, topic: str, order: Mapping[str, object]) -> None:
        """An order from the supervisor came (the transport calls this): its handler runs."""
        handler = self._handlers.get(topic)
        if handler is not None:
            handler(order)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """routerd's `--workers`, and the hidden `--worker-of` a supervisor starts a worker with."""
    parser.add_argument(
        "--workers",
        type=integer(1, MAX_WORKERS),
        default=1,
        metavar="N",
        help="processes serving connections, each on its own listeners (SO_REUSEPORT) and core: "
        "this one, which also probes and serves the admin API, and N - 1 workers it starts; the "
        "routers' caches and round-robin positions are shared (docs/operations.md, \"Worker "
        'processes"); default 1',
    )
    parser.add_argument("--worker-of", help=argparse.SUPPRESS)  # a worker's, from its supervisor


def processes_of(args: argparse.Namespace, argv: Sequence[str]) -> Processes:
    """This process's place among routerd's, from `add_arguments`' options; `argv` is routerd's
    command line (a worker's is the same, with `--no-admin` and its `--worker-of`).

    Raises:
        ValueError: `--worker-of` is not what a supervisor gives (one line saying so).
    """
    if args.worker_of is None:
        return Processes(count=args.workers, command=(sys.executable, "-m", "router", *argv, "--no-admin"))
    try:
        spec = json.loads(args.worker_of)
        return Processes(
            count=args.workers,
            index=int(spec["index"]),
            zones=dict(spec["zones"]),
            channel=int(spec["channel"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--worker-of is routerd's own (a worker's), got {args.worker_of!r}: {exc}") from exc
