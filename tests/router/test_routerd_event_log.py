"""routerd's event log against a full disk: a real routerd whose event directory is a 48 KiB
tmpfs (mounted in a user and mount namespace of its own, so no root is needed; the test reads it
through /proc/PID/root), real mosquitto and paho clients. Every client is routed; the events that
did not fit are counted as lost; the files that were finished are whole."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest
import zstandard

from tests.conftest import eventually
from tests.router.conftest import Routerd, acceptors_xml, mqtt_round_trip, static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto

NODE_IDS = ["node4", "node9", "node20"]

_IN_A_SMALL_TMPFS = (
    'mount -t tmpfs -o size=48k tmpfs "$0" && exec "$@"'  # sh -c: $0 is the directory, "$@" routerd's command
)


class RouterdOnASmallDisk(Routerd):
    """routerd with its event directory on a 48 KiB tmpfs of its own mount namespace."""

    def __init__(self, workdir: Path, make_config: Callable[[int], str], events: Path) -> None:
        super().__init__(workdir, make_config)
        self.events = events

    def program(self) -> list[str]:
        unshare = shutil.which("unshare")
        assert unshare is not None, "util-linux's unshare is part of Debian's base system"
        return [
            unshare,
            "-rm",
            "sh",
            "-c",
            _IN_A_SMALL_TMPFS,
            str(self.events),
            sys.executable,
            "-m",
            "router",
        ]


def event_log_config(brokers: list[Mosquitto], port: int, event_log: str) -> str:
    """routerd in front of `brokers` (NODE_IDS): an MQTT acceptor on `port`, CLIENT_ID keys,
    CONSISTENT_HASH, and the `<event-log>` children `event_log`."""
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in brokers), strict=True))
    return f"""<core>
  <connectors>{connectors}</connectors>
  <acceptors>{acceptors_xml({"mqtt": "router=ids;protocols=MQTT"}, {"mqtt": port})}</acceptors>
  <connection-routers>
   <connection-router name="ids">
    <key-type>CLIENT_ID</key-type>
    <policy name="CONSISTENT_HASH"/>
    <pool><check-period>200</check-period><quorum-timeout>0</quorum-timeout>
     <static-connectors>{refs}</static-connectors></pool>
   </connection-router>
  </connection-routers>
  <event-log>{event_log}</event-log>
 </core>
"""


def _config(brokers: list[Mosquitto], port: int, events: Path, form: str) -> str:
    """A flush every 5 ms: the writer pauses at most that long once caught up, so each batch it
    appends is a few KB, and a file in progress with its finished copy fits the 48 KiB disk, so
    a file is finished before the disk fills (at 50 ms a batch of tens of KB left no room, now and
    then)."""
    return event_log_config(
        brokers,
        port,
        f"<directory>{events}</directory><router-id>small-disk</router-id><format>{form}</format>"
        "<rotate-size>8192</rotate-size><flush-interval>5</flush-interval>",
    )


def _taken(router: Routerd) -> float:
    """Events the writer has taken from the ring: written or lost."""
    metrics = router.metrics()
    return _counter(metrics, "lost") + _counter(metrics, "written")


def _files(router: Routerd, outcome: str) -> float:
    """The event log's files with this outcome so far (finished, deleted)."""
    found = re.search(rf'^router_event_log_files_total{{outcome="{outcome}"}} (\S+)$', router.metrics(), re.M)
    return 0.0 if found is None else float(found[1])


def _counter(metrics: str, outcome: str) -> float:
    found = re.search(rf'^router_event_log_events_total{{outcome="{outcome}"}} (\S+)$', metrics, re.M)
    return 0.0 if found is None else float(found[1])


@pytest.mark.integration
@pytest.mark.parametrize("form", ["parquet", "jsonl"])
def test_a_full_disk_loses_events_counted_and_never_a_client(
    mosquitto_fleet: list[Mosquitto],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_routerd: Callable[[Routerd], Routerd],
    form: str,
) -> None:
    events, port = tmp_path / "events", free_port()
    events.mkdir()
    router = run_routerd(
        RouterdOnASmallDisk(tmp_path, lambda _admin: _config(mosquitto_fleet, port, events, form), events)
    )
    for _ in NODE_IDS:
        router.wait_for_log(r"target=node\d+ is ready")
    # A first file finished before the disk fills (what the writer takes at once is its timing's:
    # events piled up while it waits could fill the disk in one write), then about 240 KB of lines,
    # 150 KB of Arrow batches: three to five times the disk.
    for n in range(400):
        assert mqtt_round_trip(port, client_id=f"dev-{n}", topic=f"full/{n}", timeout=10)
        if n == 40:
            assert eventually(lambda: _files(router, "finished") >= 1)
    router.wait_for_log(r"event log: \d+ event\(s\) lost: No space left on device", consume=False)
    assert eventually(lambda: _taken(router) == 2 * 400)  # every event taken: a decision and a close each
    metrics = router.metrics()
    assert _counter(metrics, "lost") > 0
    assert _counter(metrics, "written") > 0
    assert router.proc is not None  # its mount namespace's view of the directory:
    seen = Path(f"/proc/{router.proc.pid}/root") / events.relative_to("/")
    files = sorted(seen.glob("events-*.parquet" if form == "parquet" else "events-*.jsonl.zst"))
    assert files, "the files finished before the disk filled are there"
    for path in files:  # whole: every one reads back, to complete lines
        if form == "parquet":
            assert pq.read_table(path).num_rows > 0
        else:
            data = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
            assert data.endswith(b"\n")
    assert router.stop() == 0
