"""The event log end to end: routerd in front of real mosquitto brokers with `--event-log` (its
default format, Parquet), real
paho clients, a kill -9 and a restart, one file shipped twice; `routerctl analyze` then reports
each client's decision once, on the broker the client actually reached (seen by subscribers on
every broker)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from event_format.parquet import read_part
from router.ctl import main_routerctl
from tests.conftest import eventually
from tests.router.conftest import (
    MqttObserver,
    free_port_fixture,
    mosquitto_fleet,
    mqtt_round_trip,
    run_routerd,
    start_routerd,
)
from tests.router.test_routerd_event_log import NODE_IDS, event_log_config

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.router.conftest import Mosquitto, Routerd

__all__ = ["free_port_fixture", "mosquitto_fleet", "run_routerd", "start_routerd"]  # fixtures used here

TIMEOUT_S = 10.0


def _config(brokers: list[Mosquitto], port: int, events: Path) -> str:
    return event_log_config(
        brokers,
        port,
        f"<directory>{events}</directory><router-id>edge-1</router-id><flush-interval>100</flush-interval>",
    )


def _drive(brokers: list[Mosquitto], port: int, client_ids: list[str]) -> dict[str, str]:
    """A round trip through the router for each client id: where each landed."""
    with MqttObserver(
        "log/#", {n: b.port for n, b in zip(NODE_IDS, brokers, strict=True)}, TIMEOUT_S
    ) as seen:
        for client_id in client_ids:
            assert mqtt_round_trip(port, client_id=client_id, topic=f"log/{client_id}", timeout=TIMEOUT_S)
        landed = seen.wait_for([f"log/{c}" for c in client_ids])
    return {topic.removeprefix("log/"): node for topic, node in landed.items()}


def _rows_in_progress(events: Path) -> int:
    """Events the writer has handed to the files in progress (whole Arrow batches)."""
    rows = 0
    for path in events.glob(".events-*.arrows.part"):
        fd = os.open(path, os.O_RDONLY)
        try:
            rows += read_part(fd).num_rows
        finally:
            os.close(fd)
    return rows


@pytest.mark.integration
def test_analyze_reports_each_clients_decision_once_where_it_landed_across_a_kill_and_a_shipped_copy(
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
    tmp_path: Path,
    spark: object,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events, port = tmp_path / "events", free_port()
    first = [f"dev-{n}" for n in range(12)]
    second = [f"dev-{n}" for n in range(12, 20)]
    router = start_routerd(lambda _admin: _config(mosquitto_fleet, port, events))
    for _ in NODE_IDS:
        router.wait_for_log(r"target=node\d+ is ready")
    landed = _drive(mosquitto_fleet, port, first)
    assert eventually(
        lambda: _rows_in_progress(events) == 2 * len(first)
    )  # flushed: a decision and a close each
    assert router.proc is not None
    router.proc.send_signal(signal.SIGKILL)  # no chance to finish its file
    router.stop()

    router.start()  # the killed routerd's writer finished its file, or this start does
    for _ in NODE_IDS:
        router.wait_for_log(r"target=node\d+ is ready")
    landed |= _drive(mosquitto_fleet, port, second)
    assert router.stop() == 0
    files = sorted(events.glob("events-*.parquet"))  # the default format
    assert len(files) == 2
    assert not list(events.glob(".events-*"))

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    shutil.copy(files[0], shipped / "copy-of-the-first.parquet")  # shipped twice
    copied = pq.read_metadata(files[0]).num_rows

    out = tmp_path / "report"
    assert main_routerctl(["analyze", str(events), str(shipped), "--out", str(out)]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["duplicates_removed"] == copied
    assert summary["malformed"] == 0
    assert summary["events"] == 2 * len(landed)  # one decision and one close per client
    assert summary["decisions_by_status"] == {"OK": len(landed)}
    expected_by_target: dict[str, int] = {}
    for node in landed.values():
        expected_by_target[node] = expected_by_target.get(node, 0) + 1
    assert summary["decisions_by_target"] == expected_by_target
    assert summary["keys"] == len(landed)
    assert summary["moved_keys"] == 0
    per_key = {
        row["key"]: row
        for row in spark.read.parquet(str(out / "per_key")).collect()  # type: ignore[attr-defined]
    }
    assert {key: row["last_target"] for key, row in per_key.items()} == landed
    assert all(row["decisions"] == 1 for row in per_key.values())
    assert (out / "report.html").stat().st_size > 10_000
