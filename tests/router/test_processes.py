"""routerd's processes (router/processes.py): the place of this one, from the command line, and the
supervisor's orders to its workers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import pytest

from router.processes import Peers, Processes, add_arguments, processes_of

if TYPE_CHECKING:
    from collections.abc import Mapping


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_supervisor_starts_workers_with_its_own_command_line() -> None:
    argv = ["--config", "r.xml", "--workers", "3"]
    processes = processes_of(_parsed("--workers", "3"), argv)
    assert (processes.count, processes.index, processes.worker, processes.who) == (3, 0, False, "")
    assert processes.command == (sys.executable, "-m", "router", *argv, "--no-admin")


def test_a_worker_reads_its_place_from_worker_of() -> None:
    spec = '{"index": 2, "zones": {"r": 7}, "channel": 9}'
    processes = processes_of(_parsed("--workers", "3", "--worker-of", spec), [])
    assert processes == Processes(count=3, index=2, zones={"r": 7}, channel=9)
    assert (processes.worker, processes.who) == (True, "worker 2 ")


def test_a_worker_of_that_is_not_a_supervisors_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"--worker-of is routerd's own \(a worker's\), got '\{\}'"):
        processes_of(_parsed("--worker-of", "{}"), [])


def test_an_order_reaches_the_listener_of_its_topic_and_goes_nowhere_without_workers() -> None:
    peers = Peers()
    heard: list[Mapping[str, object]] = []
    sent: list[tuple[str, Mapping[str, object]]] = []
    peers.broadcast("moves", {"start": 1})  # no transport: nothing happens
    peers.listen("moves", heard.append)
    peers.deliver("moves", {"start": 2})
    peers.deliver("other", {"start": 3})
    peers.send = lambda topic, order: sent.append((topic, order))
    peers.broadcast("moves", {"abort": 4})
    assert heard == [{"start": 2}]
    assert sent == [("moves", {"abort": 4})]
