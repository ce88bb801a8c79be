"""routerd on a real faulty filesystem: no file fault kills it or hangs its exit.

Each test puts routerd's files (the persisted cache, the state file, the event log) on a
loop-mounted ext4 of its own and breaks it as operators' tools do: `chattr +i` (an immutable file,
as a security agent sets), `fsfreeze` (a snapshot tool). Real mosquitto brokers, a real routerd.
Needs root and a loop device (skipped, saying which, where the kernel refuses); every fault is
undone in the test's teardown, even when it fails, and the filesystem unmounted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from jsonschema import Draft202012Validator

from router.server import EXIT_FILES_S
from tests.conftest import eventually
from tests.router.conftest import ROUND_ROBIN_NODE_IDS, ROUTERCTL, Routerd, round_robin_config

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from tests.router.conftest import Mosquitto

pytestmark = pytest.mark.integration

GRACE_S = 2.0
"""The fixture's routerd runs with `--grace-period 2`."""
EXIT_MARGIN_S = 5.0
"""What the exit may take beyond the grace period and the files' bound: Python's own exit, the
fast path's join, and a loaded 2-core machine."""
ADMIN_API = Path(__file__).parents[2] / "docs" / "admin-api.yaml"


class LoopFs:
    """An ext4 filesystem of 64 MB in a file, loop-mounted at `path`, and the faults set on it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._immutable: list[Path] = []
        self._frozen = False

    @contextlib.contextmanager
    def immutable(self, paths: Sequence[Path]) -> Iterator[None]:
        """`chattr +i` on `paths` for the block's duration."""
        try:
            for path in paths:
                subprocess.run(["chattr", "+i", str(path)], check=True, timeout=10)
                self._immutable.append(path)
            yield
        finally:
            self.undo()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """`fsfreeze -f` for the block's duration."""
        try:
            subprocess.run(["fsfreeze", "-f", str(self.path)], check=True, timeout=10)
            self._frozen = True
            yield
        finally:
            self.undo()

    def undo(self) -> None:
        """Thaw and make every file mutable again (idempotent)."""
        if self._frozen:
            subprocess.run(["fsfreeze", "-u", str(self.path)], check=False, timeout=10)
            self._frozen = False
        while self._immutable:
            subprocess.run(["chattr", "-i", str(self._immutable.pop())], check=False, timeout=10)


@pytest.fixture
def loop_fs(tmp_path: Path) -> Iterator[LoopFs]:
    """A loop-mounted ext4 of the test's own; skipped (with the reason) where it cannot be had.
    Request it before `start_routerd`, so that routerd stops before it is unmounted."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mount -o loop, chattr +i and fsfreeze are root's")
    missing = [tool for tool in ("mkfs.ext4", "chattr", "fsfreeze", "mount") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    image, mount_point = tmp_path / "fs.img", tmp_path / "fs"
    mount_point.mkdir()
    with image.open("wb") as file:
        file.truncate(64 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True, timeout=60)
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mount_point)], capture_output=True, text=True, timeout=60
    )
    if mounted.returncode != 0:
        pytest.skip(f"the kernel refuses a loop mount here: {mounted.stderr.strip()}")
    fs = LoopFs(mount_point)
    try:
        yield fs
    finally:
        fs.undo()
        for _ in range(50):
            if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode == 0:
                break
            time.sleep(0.2)  # a child left waiting on the frozen filesystem is still ending
        else:
            subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=30)


def _config(brokers: Sequence[Mosquitto], port: int, cache_file: Path) -> Callable[[int], str]:
    cache = f"<cache><persisted>true</persisted><timeout>600000</timeout><file>{cache_file}</file></cache>"
    return round_robin_config(brokers, port, cache)


def _ready(router: Routerd) -> None:
    for node_id in ROUND_ROBIN_NODE_IDS:
        router.wait_for_log(rf"router=rr target={node_id} is ready", consume=False)


def _look_up(router: Routerd, keys: Sequence[str]) -> None:
    """A management lookup of each key (a routing decision: a new key is a new cache entry)."""
    for key in keys:
        document = router.get(f"/api/v1/routers/rr/target?key={key}")
        assert isinstance(document, dict), document
        assert document["status"] == "OK", document


def _stored(cache_file: Path) -> set[str] | None:
    """The keys in the file; None while it cannot be read (a read-only reader cannot roll back
    the journal a failed write left: routerd's next write does)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{cache_file}?mode=ro", uri=True, timeout=5)) as db:
            return {row[0] for row in db.execute("SELECT key FROM cache_entries")}
    except sqlite3.Error:
        return None


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return [pid, *(p for child in children for p in _process_tree(child))]


def _metric(router: Routerd, name: str) -> float:
    match = re.search(rf'^{name}\{{router="rr"\}} (\S+)$', router.metrics(), re.MULTILINE)
    return 0.0 if match is None else float(match.group(1))


def _put_state(router: Routerd, node_id: str, state: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{router.admin}/api/v1/routers/rr/targets/{node_id}",
        data=json.dumps({"admin_state": state}).encode(),
        method="PUT",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _check_status_document(document: object) -> None:
    """The status document against docs/admin-api.yaml's `ServerStatus`."""
    spec = yaml.safe_load(ADMIN_API.read_text())
    schema = {"$ref": "#/components/schemas/ServerStatus", "components": spec["components"]}
    assert [e.message for e in Draft202012Validator(schema).iter_errors(document)] == []


def test_routerd_survives_its_persisted_cache_files_turned_immutable(
    loop_fs: LoopFs,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
) -> None:
    """Scenario: `chattr +i` on the persisted cache's file (and, before the fix, its WAL index
    `-shm`) while routerd writes it. Before the fix the `-shm` map turned a write into SIGBUS
    (exit 135 in a shell, no log line); now
    nothing of the file is mapped, each failed write is an ERROR and counted, routing goes on
    from memory, and the first write after the fault is the whole cache."""
    cache_file = loop_fs.path / "cache.sqlite"
    router = start_routerd(_config(mosquitto_fleet, free_port(), cache_file))
    _ready(router)
    before = [f"before-{i}" for i in range(40)]
    _look_up(router, before)
    assert eventually(lambda: _stored(cache_file) == set(before))
    assert router.proc is not None
    # The file and its WAL index (`-shm`, before the fix); not the WAL, whose write would fail
    # first and hide the index's fault.
    files = sorted(p for p in loop_fs.path.glob("cache.sqlite*") if not p.name.endswith(("-wal", "-journal")))
    with loop_fs.immutable(files):
        during = []
        for round_ in range(20):
            keys = [f"during-{round_}-{i}" for i in range(10)]
            _look_up(router, keys)
            during += keys
            os.sync()  # writeback write-protects the pages of a shared map: the next write faults
            time.sleep(0.1)
            assert router.proc.poll() is None, f"routerd died: exit status {router.proc.returncode}"
        router.wait_for_log(r" ERROR router\.cache: router=rr persisted cache .* cannot be written: ")
        assert _metric(router, "router_cache_store_errors_total") >= 1
        for pid in _process_tree(router.proc.pid):  # routerd and its cache's writer process
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert str(loop_fs.path) not in maps, f"process {pid} maps a file of the persisted cache"
    assert eventually(lambda: _stored(cache_file) == {*before, *during})  # the next write: all
    assert router.stop() == 0


def test_routerd_exits_within_its_grace_period_on_a_frozen_filesystem(
    tmp_path: Path,
    loop_fs: LoopFs,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
) -> None:
    """Scenario: the filesystem of routerd's persisted cache, state file and event log is frozen
    (`fsfreeze -f`), keys are routed (the cache's writes wait), a target is drained, then SIGTERM.
    Before the fix the drain's state-file write blocked the whole event loop, and the exit waited
    for the filesystem to thaw; now the drain is in force at once (the PUT says it is not kept
    yet, the status too), and routerd exits within the grace period and the files' bound, an
    ERROR naming each file it gave up (the cache's writer process finishes after the thaw)."""
    cache_file = loop_fs.path / "cache.sqlite"
    state_file = loop_fs.path / "state.json"
    events = loop_fs.path / "events"
    router = start_routerd(
        _config(mosquitto_fleet, free_port(), cache_file),
        "--state-file",
        str(state_file),
        "--event-log",
        str(events),
    )
    _ready(router)
    keys = [f"key-{i}" for i in range(20)]
    _look_up(router, keys)
    assert eventually(lambda: _stored(cache_file) == set(keys))
    assert router.proc is not None
    with loop_fs.frozen():
        _look_up(router, [f"frozen-{i}" for i in range(5)])  # routing goes on: writes wait
        started = time.monotonic()
        code, answer = _put_state(router, "b1", "drain")
        assert time.monotonic() - started < 8.0, "the PUT waited on the frozen filesystem"
        assert code == 500, answer
        assert "is in force, but not kept across a restart yet" in str(answer["error"])
        status = router.get("/api/v1/status")
        _check_status_document(status)
        assert isinstance(status, dict)
        assert status["state_file"]["persisted"] is False, status
        assert "frozen" in status["state_file"]["error"], status
        target = router.get("/api/v1/routers/rr/targets/b1")
        assert isinstance(target, dict)
        assert target["admin_state"] == "drain"
        ctl = subprocess.run(
            [*ROUTERCTL, "status", "--admin", router.admin], capture_output=True, text=True, timeout=60
        )
        assert "NOT PERSISTED" in ctl.stdout, ctl
        stopping = time.monotonic()
        router.proc.send_signal(signal.SIGTERM)
        bound = GRACE_S + EXIT_FILES_S + EXIT_MARGIN_S
        try:
            status_code = router.proc.wait(bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"routerd did not exit within {bound:g} s of SIGTERM on a frozen filesystem")
        took = time.monotonic() - stopping
        assert status_code == 0
        cache_line = f"ERROR router.cache: router=rr persisted cache {str(cache_file)!r}: its last write"
        router.wait_for_log(re.escape(cache_line), timeout=1, consume=False)
        state_line = f"ERROR router.server: state file {str(state_file)!r}: the administrative states in"
        router.wait_for_log(re.escape(state_line), timeout=1, consume=False)
        router.wait_for_log(r"INFO router.server: stopped$", timeout=1, consume=False)
    print(f"routerd exited {took:.2f} s after SIGTERM on a frozen filesystem (grace period {GRACE_S:g} s)")


def test_routerd_writes_a_drain_once_its_state_file_can_be_written_again(
    loop_fs: LoopFs,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
) -> None:
    """Scenario: the state file's directory is immutable when a target is drained; the write fails
    (a 500, the status says not persisted). Before the fix the drain was never written, so a
    restart lost it; now routerd retries, and writes it once the directory is writable again: a
    restarted routerd has the drain."""
    directory = loop_fs.path / "state"
    directory.mkdir()
    state_file = directory / "state.json"
    cache_file = loop_fs.path / "cache.sqlite"
    router = start_routerd(_config(mosquitto_fleet, free_port(), cache_file), "--state-file", str(state_file))
    _ready(router)
    with loop_fs.immutable([directory]):
        code, answer = _put_state(router, "b1", "drain")
        assert code == 500, answer
        time.sleep(2.5)  # two tries fail: 1 s apart, then 2 s
    deadline = 35.0  # the longest wait between two tries is 30 s; the next one here, 4 s
    assert eventually(lambda: state_file.exists(), timeout=deadline), "the drain was never written"
    router.wait_for_log(rf"ERROR router.server: state file {re.escape(repr(str(state_file)))} cannot be")
    assert json.loads(state_file.read_text())["routers"] == {"rr": {"b1": "drain"}}
    status = router.get("/api/v1/status")
    assert isinstance(status, dict)
    assert status["state_file"] == {"path": str(state_file), "persisted": True, "error": None}
    assert router.stop() == 0
    router.start()
    target = router.get("/api/v1/routers/rr/targets/b1")
    assert isinstance(target, dict)
    assert target["admin_state"] == "drain"
