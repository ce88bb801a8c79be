"""Tests for router/services/cache_store.py: a persisted cache's SQLite file.

Real files in `tmp_path`; the crash test kills a real process that holds the file open mid-write.
"""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cache.cache import NO_PIN, Changes, Row
from router.services.cache_store import APPLICATION_ID, CacheStore, CacheStoreError, set_aside


def test_store_round_trips_entries_and_pins_in_wall_clock_time(tmp_path):
    path = str(tmp_path / "c.sqlite")
    store = CacheStore.open(path)
    offset = 1000.0  # wall = the cache's clock + offset
    store.write(
        Changes({"a": ("b1", 5.0, NO_PIN), "p": ("b2", 6.0, math.inf), "q": ("b2", 6.0, 9.0)}), offset
    )
    store.write(Changes({"a": ("b3", 7.0, NO_PIN)}), offset)  # replaced: still there, new target
    store.close()
    store = CacheStore.open(path)
    rows = store.load(now=1006.5, timeout_ms=0)
    store.close()
    assert [(k, r[0], r[1]) for k, r in rows] == [
        ("p", "b2", 1006.0),
        ("q", "b2", 1006.0),
        ("a", "b3", 1007.0),
    ]
    assert math.isinf(rows[0][1][2])
    assert rows[1][1][2] == 1009.0
    assert math.isnan(rows[2][1][2])


def test_store_load_deletes_expired_entries_and_ended_pins(tmp_path):
    path = str(tmp_path / "c.sqlite")
    store = CacheStore.open(path)
    rows: dict[str, Row | None] = {
        "old": ("b", 0.0, NO_PIN),
        "fresh": ("b", 9.0, NO_PIN),
        "ended": ("b", 9.0, 9.5),
    }
    store.write(Changes(rows), 0.0)
    assert [k for k, _ in store.load(now=10.0, timeout_ms=5000)] == ["fresh"]
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT key FROM cache_entries").fetchall() == [("fresh",)]


def test_store_deletes_and_full_writes(tmp_path):
    store = CacheStore.open(str(tmp_path / "c.sqlite"))
    store.write(Changes({"a": ("b", 1.0, NO_PIN), "b": ("b", 1.0, NO_PIN)}), 0.0)
    assert store.write(Changes({"a": None}), 0.0) == 1
    assert [k for k, _ in store.load(2.0, 0)] == ["b"]
    store.write(Changes({"c": ("b", 1.5, NO_PIN)}, full=True), 0.0)
    assert [k for k, _ in store.load(2.0, 0)] == ["c"]
    store.close()


def test_a_second_writer_is_refused_while_the_first_holds_the_file(tmp_path):
    path = str(tmp_path / "c.sqlite")
    first = CacheStore.open(path)
    with pytest.raises(CacheStoreError, match="is in use by another routerd") as info:
        CacheStore.open(path)
    assert info.value.damaged is False
    reader = CacheStore.open(path, read_only=True)  # routerctl route --cache reads meanwhile
    assert reader.load(0.0, 0) == []
    reader.close()
    first.close()
    CacheStore.open(path).close()


@pytest.mark.parametrize(
    ("content", "message", "damaged"),
    [
        (b"this is not a database, just text" * 100, "cannot be read: file is not a database", True),
        (None, "is not a connection-router cache file (it holds ['other'])", False),
    ],
)
def test_a_file_that_is_not_our_cache_is_a_clear_error(tmp_path, content, message, damaged):
    path = tmp_path / "c.sqlite"
    if content is None:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE other (x)")
    else:
        path.write_bytes(content)
    with pytest.raises(CacheStoreError) as info:
        CacheStore.open(str(path))
    assert str(info.value) == f"persisted cache {str(path)!r} {message}"
    assert info.value.damaged is damaged


def test_a_damaged_file_is_found_at_open(tmp_path):
    path = tmp_path / "c.sqlite"
    store = CacheStore.open(str(path))
    store.write(Changes({f"key-{i}": ("b", 1.0, NO_PIN) for i in range(5000)}), 0.0)
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    data[3 * page : 3 * page + 512] = os.urandom(512)  # a B-tree page of the table
    path.write_bytes(bytes(data))
    with pytest.raises(CacheStoreError) as info:
        CacheStore.open(str(path)).load(2.0, 0)
    assert info.value.damaged is True


def test_set_aside_renames_the_file_its_journal_and_its_wal(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"x")
    (tmp_path / "c.sqlite-wal").write_bytes(b"y")
    (tmp_path / "c.sqlite-journal").write_bytes(b"z")
    aside = set_aside(str(path))
    assert not path.exists()
    assert not (tmp_path / "c.sqlite-wal").exists()
    assert not (tmp_path / "c.sqlite-journal").exists()
    assert Path(aside).read_bytes() == b"x"
    assert Path(aside + "-wal").read_bytes() == b"y"
    assert Path(aside + "-journal").read_bytes() == b"z"
    assert aside.startswith(f"{path}.unreadable-")


def test_store_maps_nothing_of_its_file(tmp_path):
    """Scenario: a rollback journal, no WAL: no `-shm` memory map for a fault to turn into SIGBUS."""
    path = tmp_path / "c.sqlite"
    store = CacheStore.open(str(path))
    store.write(Changes({"a": ("b1", 5.0, NO_PIN)}), 0.0)
    try:
        maps = Path("/proc/self/maps").read_text()
        assert str(tmp_path) not in maps
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sqlite"]
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert [k for k, _ in CacheStore.open(str(path), read_only=True).load(6.0, 0)] == ["a"]
    finally:
        store.close()


def test_store_converts_a_file_left_in_wal_mode_without_mapping_its_index(tmp_path):
    """Scenario: an older release's file, with a WAL a `kill -9` left and no `-shm`: its entries are
    read, and the file is in rollback-journal mode after."""
    path = tmp_path / "c.sqlite"
    older = sqlite3.connect(path, isolation_level=None)
    older.execute("PRAGMA journal_mode = WAL")
    older.execute("PRAGMA wal_autocheckpoint = 0")
    store = CacheStore(str(path), older, None)
    older.execute(
        "CREATE TABLE cache_entries (key TEXT PRIMARY KEY, node_id TEXT NOT NULL, "
        "last_access REAL NOT NULL, pinned_until REAL) WITHOUT ROWID"
    )
    older.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    older.execute("PRAGMA user_version = 1")
    store.write(Changes({"a": ("b1", 5.0, NO_PIN)}), 0.0)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("c.sqlite", "c.sqlite-wal"):  # as a crash leaves them, the -shm aside
        (copy / name).write_bytes((tmp_path / name).read_bytes())
    older.close()
    converted = CacheStore.open(str(copy / "c.sqlite"))
    try:
        assert str(copy) not in Path("/proc/self/maps").read_text()
        assert not (copy / "c.sqlite-shm").exists()
        assert [k for k, _ in converted.load(6.0, 0)] == ["a"]
        assert sorted(p.name for p in copy.iterdir()) == ["c.sqlite"]
    finally:
        converted.close()


def test_read_only_open_of_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(CacheStoreError, match="no such file"):
        CacheStore.open(str(tmp_path / "absent.sqlite"), read_only=True)


def test_kill_9_mid_writes_leaves_the_last_committed_write(tmp_path):
    """A process writing batch after batch is killed at a random moment: the file opens, passes its
    check, and holds whole batches only (each batch writes the same number to every key)."""
    path = tmp_path / "c.sqlite"
    script = textwrap.dedent(
        f"""
        import sys
        from cache.cache import Changes, NO_PIN
        from router.services.cache_store import CacheStore
        store = CacheStore.open({str(path)!r})
        batch = 0
        while True:
            batch += 1
            rows = {{f"k{{i}}": (f"b{{batch}}", float(batch), NO_PIN) for i in range(2000)}}
            store.write(Changes(rows), 0.0)
            if batch == 3:
                print("writing", flush=True)
        """
    )
    root = Path(__file__).parents[3]
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=root) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == b"writing\n"
        os.kill(child.pid, signal.SIGKILL)
    store = CacheStore.open(str(path))
    rows = store.load(0.0, 0)
    store.close()
    assert len(rows) == 2000
    assert len({node for _, (node, _, _) in rows}) == 1  # one whole batch, never a mix


def test_store_writes_through_its_writer_process_and_shares_its_lock(tmp_path):
    """Scenario: routerd's store hands its writes to a writer process; a second opener is refused
    while the writer holds the lock; closing ends the writer, and the file holds the writes."""
    path = str(tmp_path / "c.sqlite")
    store = CacheStore.open(path)
    store.start_writer()
    try:
        assert store.write(Changes({"a": ("b1", 5.0, NO_PIN), "b": ("b2", 5.0, NO_PIN)}), 0.0) == 2
        assert store.write(Changes({"a": None}), 0.0) == 1
        with pytest.raises(CacheStoreError, match="in use by another routerd"):
            CacheStore.open(path)
        reader = CacheStore.open(path, read_only=True)
        assert [k for k, _ in reader.load(6.0, 0)] == ["b"]
        reader.close()
    finally:
        store.close()
    reopened = CacheStore.open(path)
    assert [k for k, _ in reopened.load(6.0, 0)] == ["b"]
    reopened.close()


def test_store_write_fails_with_a_clear_error_when_its_writer_process_is_gone(tmp_path):
    path = str(tmp_path / "c.sqlite")
    store = CacheStore.open(path)
    store.start_writer()
    try:
        writer = store._writer
        assert writer is not None
        writer.kill()
        writer.wait()
        with pytest.raises(CacheStoreError, match=r"cannot be written: its writer process"):
            store.write(Changes({"a": ("b1", 5.0, NO_PIN)}), 0.0)
    finally:
        store.close()
