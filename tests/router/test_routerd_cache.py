"""routerd with a persisted sticky cache, end to end: real mosquitto brokers, real paho clients.

ROUND_ROBIN ignores the key and starts at a random position, so without the cache a restarted
routerd sends a client id to any broker; with `<persisted>true</persisted>` every client id goes
back to the broker it went to before a clean restart and before a `kill -9`. The cache's admin
API and `routerctl cache` see, evict and pin entries; `routerctl route --cache` reads the file.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from typing import TYPE_CHECKING

from tests.router.conftest import (
    ROUND_ROBIN_NODE_IDS,
    ROUTERCTL,
    Routerd,
    landings_by_key,
    round_robin_config,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from tests.router.conftest import Mosquitto

NODE_IDS = ROUND_ROBIN_NODE_IDS
TIMEOUT_S = 10.0


def _config(brokers: Sequence[Mosquitto], port: int, cache_file: Path) -> Callable[[int], str]:
    cache = f"<cache><persisted>true</persisted><timeout>600000</timeout><file>{cache_file}</file></cache>"
    return round_robin_config(brokers, port, cache)


_landings = landings_by_key


def _stored(cache_file: Path) -> dict[str, str]:
    """The file's entries, read as another process reads it while routerd writes."""
    with sqlite3.connect(f"file:{cache_file}?mode=ro", uri=True) as db:
        return dict(db.execute("SELECT key, node_id FROM cache_entries").fetchall())


def _wait_stored(cache_file: Path, expected: dict[str, str]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while (stored := _stored(cache_file)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stored == expected


def _routerctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ROUTERCTL, *args], capture_output=True, text=True, timeout=60, check=False)


def test_round_robin_keys_keep_their_brokers_across_a_restart_and_a_kill_9(
    tmp_path, mosquitto_fleet, start_routerd, free_port
):
    port, cache_file = free_port(), tmp_path / "cache.sqlite"
    router: Routerd = start_routerd(_config(mosquitto_fleet, port, cache_file))
    first = [f"client-{i}" for i in range(24)]
    before = _landings(mosquitto_fleet, port, first)
    assert set(before.values()) == set(NODE_IDS)  # round robin spread them

    assert router.stop() == 0  # a clean stop writes the last changes
    assert _stored(cache_file) == before
    router.start()
    router.wait_for_log(r"router=rr persisted cache .*: 24 entries loaded")
    assert _landings(mosquitto_fleet, port, first) == before

    later = [f"later-{i}" for i in range(12)]
    both = {**before, **_landings(mosquitto_fleet, port, later)}
    _wait_stored(cache_file, both)  # written within WRITE_INTERVAL_S, not at a stop
    assert router.proc is not None
    router.proc.kill()
    router.stop()  # reaps it and closes its log
    router.start()
    router.wait_for_log(r"router=rr persisted cache .*: 36 entries loaded")
    assert _landings(mosquitto_fleet, port, [*first, *later]) == both

    # routerctl route --cache reads the file routerd is using and predicts every key.
    result = _routerctl(
        "route", "--json", "--config", str(router.config), "--router", "rr", "--cache", str(cache_file), *both
    )
    assert result.returncode == 0, result.stderr
    assert {d["key"]: d["node_id"] for d in map(json.loads, result.stdout.splitlines())} == both


def test_cache_operations_through_routerctl(tmp_path, mosquitto_fleet, start_routerd, free_port):
    port, cache_file = free_port(), tmp_path / "cache.sqlite"
    router: Routerd = start_routerd(_config(mosquitto_fleet, port, cache_file))
    keys = [f"op-{i:02d}" for i in range(9)]
    landed = _landings(mosquitto_fleet, port, keys)
    admin = ("cache", "--json", "--admin", router.admin)

    result = _routerctl(*admin, "list", "rr", "--limit", "4")
    page = json.loads(result.stdout)
    assert [e["key"] for e in page["entries"]] == keys[:4]
    assert page["next"] == keys[3]
    result = _routerctl(*admin, "list", "rr", "--all", "--limit", "4")
    assert {e["key"]: e["node_id"] for e in map(json.loads, result.stdout.splitlines())} == landed

    entry = json.loads(_routerctl(*admin, "get", "rr", "op-00").stdout)
    assert (entry["node_id"], entry["pinned"]) == (landed["op-00"], False)
    assert 570 < entry["expires_in_s"] <= 600

    # Pin op-00 somewhere else: its next connection goes there, and the pin is persisted.
    elsewhere = next(n for n in NODE_IDS if n != landed["op-00"])
    pinned = json.loads(_routerctl(*admin, "pin", "rr", "op-00", elsewhere, "--for", "300").stdout)
    assert (pinned["node_id"], pinned["pinned"]) == (elsewhere, True)
    assert _landings(mosquitto_fleet, port, ["op-00"]) == {"op-00": elsewhere}

    # Evict one key, then a target's entries; the file follows.
    assert json.loads(_routerctl(*admin, "evict", "rr", "--key", "op-01").stdout) == {"evicted": 1}
    target = landed["op-02"]
    gone = [k for k, n in landed.items() if n == target and k not in ("op-00", "op-01")]
    pinned_there = int(elsewhere == target)  # the pin goes with its target's entries
    evicted = json.loads(_routerctl(*admin, "evict", "rr", "--node-id", target).stdout)
    assert evicted == {"evicted": len(gone) + pinned_there}
    left = {k: n for k, n in landed.items() if k not in ("op-01", *gone)} | {"op-00": elsewhere}
    if elsewhere == target:
        del left["op-00"]
    _wait_stored(cache_file, left)

    missing = _routerctl(*admin, "get", "rr", "op-01")
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith("404 no cache entry for key 'op-01'")
    bad = _routerctl(*admin, "pin", "rr", "k", "nobody")
    assert bad.returncode == 1
    assert "no target with node id 'nobody' in the pool" in bad.stderr

    assert json.loads(_routerctl(*admin, "evict", "rr", "--all").stdout) == {"evicted": len(left)}
    _wait_stored(cache_file, {})
    assert 'router_cache_lookups_total{result="hit",router="rr"}' in router.metrics()


def test_a_damaged_cache_file_stops_routerd_unless_told_to_start_empty(tmp_path, mosquitto_fleet, free_port):
    port, cache_file = free_port(), tmp_path / "cache.sqlite"
    cache_file.write_bytes(b"not a database " * 1000)
    router = Routerd(tmp_path, _config(mosquitto_fleet, port, cache_file))
    command = [*router.program(), "--config", str(router.config), "--no-admin"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"routerd: error: router 'rr': persisted cache {str(cache_file)!r} cannot be read: file is not a "
        "database; move it away, or start routerd with --discard-unreadable-cache"
    )
    assert cache_file.read_bytes().startswith(b"not a database")  # untouched

    router.args = ("--discard-unreadable-cache",)
    router.start()
    try:
        router.wait_for_log(r"renamed to .*\.unreadable-\d{8}T\d{6}Z; the cache starts empty", consume=False)
        [aside] = tmp_path.glob("cache.sqlite.unreadable-*")
        assert aside.read_bytes().startswith(b"not a database")
        assert _landings(mosquitto_fleet, port, ["after"]) != {}
    finally:
        router.stop()
