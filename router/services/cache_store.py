"""A persisted sticky cache's file (SPEC A5, `<persisted>true</persisted>`): SQLite, written off the
data path.

Why SQLite with a rollback journal: it is in Python's standard library; a transaction is all or
nothing, so a crash (`kill -9`, a panic) at any moment leaves the file as of its last commit, never
half written (a journal left by a crash is rolled back at the next open); readers (`routerctl
route --cache`) read between routerd's writes. One table, keyed by the key (WITHOUT ROWID):

    cache_entries(key TEXT PRIMARY KEY, node_id TEXT, last_access REAL, pinned_until REAL)

Nothing of the file is mapped into memory (`mmap_size = 0`, and no WAL: WAL's `-shm` index is a
shared memory map, and a page of a map whose file turns unwritable (`chattr +i`, a security
agent) kills the process with SIGBUS at its next write, with no log line). With plain reads and
writes every disk fault is an error SQLite returns: it is logged and counted, and routing goes on
from memory. A file left in WAL mode by an older release is converted at open, with the WAL
index in heap memory (`locking_mode = EXCLUSIVE` before the first read), never mapped.

Times in the file are wall-clock seconds (Unix time), so an entry's expiry runs on while routerd is
stopped; the cache itself keeps the trio clock's time, and the writes convert
(router/features/cache_store/service.py, which runs them). A pin's
`pinned_until` is NULL for an entry that is not pinned, `inf` for a pin without end.

Decisions never wait for the disk: the cache journals what changed (cache/cache.py) and
the cache store feature writes the journal every `WRITE_INTERVAL_S` in a worker thread. A `kill -9`
loses at most the changes of the last interval. A write that fails (disk full, an I/O error, an
unwritable file) is logged and counted, and the next write is the whole cache, so nothing is lost
that the cache still holds.

routerd's writes go through a writer process of their own (`start_writer`; `main` below), one
per persisted cache: a write that hangs on a frozen filesystem (`fsfreeze`, a snapshot tool)
waits in the kernel where no signal reaches it, and a process ends only when all its threads
have, so in routerd such a write would keep routerd (its sockets, its ports) alive until the
filesystem thaws. The writer process may wait; routerd waits for it only up to a deadline
(`close_cache_store` there), and exits. The writer shares routerd's `flock`, ends when its input
does (routerd exits, or is killed), and ignores SIGINT and SIGTERM.

A routerd holds an `flock` on the file while it runs: a second one configured with the same file
is refused at start, not left to interleave its entries with the first one's.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import math
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cache.cache import NO_PIN, Changes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cache.cache import Row

__all__ = [
    "WRITE_INTERVAL_S",
    "CacheStore",
    "CacheStoreError",
    "set_aside",
]

log = logging.getLogger("router.cache")

WRITE_INTERVAL_S: Final = 0.2
"""How often a persisted cache's changes are written: what a `kill -9` of routerd may lose."""
APPLICATION_ID: Final = 0x43525443
"""SQLite's `application_id` of our files ("CRTC"): a file of anything else is not ours."""
SCHEMA_VERSION: Final = 1
"""`user_version` of the layout above."""
JOURNAL_MODE: Final = "DELETE"
"""A rollback journal: no WAL, so no `-shm` shared memory map (see the module docstring)."""
WRITER_CLOSE_S: Final = 5.0
"""How long closing waits for the writer process to write its last changes and end."""
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[2])
"""Where the `router` package is, for the writer process's `python -m`."""
_LEFT_WRITING: Final[list[subprocess.Popen[bytes]]] = []
"""Writer processes closed (kept, so that nothing warns that one still runs on a hung disk)."""
BUSY_TIMEOUT_MS: Final = 5000
"""How long a statement waits for a reader's or writer's lock before it fails."""

_Upsert = tuple[str, str, float, float | None]
"""An upsert's parameters: key, node id, last access, pinned until (wall-clock times)."""

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS cache_entries (key TEXT PRIMARY KEY, node_id TEXT NOT NULL, "
    "last_access REAL NOT NULL, pinned_until REAL) WITHOUT ROWID"
)
_UPSERT: Final = (
    "INSERT INTO cache_entries (key, node_id, last_access, pinned_until) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET node_id = excluded.node_id, last_access = excluded.last_access, "
    "pinned_until = excluded.pinned_until"
)


class CacheStoreError(Exception):
    """A persisted cache's file cannot be opened, read or written; the message names the file."""

    def __init__(self, message: str, *, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged
        """The file is there but its content cannot be read (not a database, damaged): starting
        with an empty cache instead is an option (`routerd --discard-unreadable-cache`)."""


class CacheStore:
    """One persisted cache's SQLite file (see the module docstring). Not thread-safe: one thread
    at a time (the writer's worker thread, or the caller at start and stop)."""

    def __init__(self, path: str, connection: sqlite3.Connection, lock: int | None) -> None:
        self.path = path
        self._db = connection
        self._lock = lock
        """The descriptor holding the `flock` (None: opened read-only)."""
        self._busy = threading.Lock()
        """Held by the thread in `write`: a write abandoned on a hung disk still holds it."""
        self._writer: subprocess.Popen[bytes] | None = None
        """The writer process, once `start_writer` has handed it the writes."""

    @classmethod
    def open(cls, path: str, *, read_only: bool = False, locked: int | None = None) -> CacheStore:
        """Open (or create, unless read-only) the file and check that it is ours and readable.

        Args:
            path: the file.
            read_only: open it only to read (`routerctl route --cache`).
            locked: a descriptor that holds the file's `flock` already (the writer process's,
                inherited from routerd); None: take the lock.

        Raises:
            CacheStoreError: it cannot be opened, is not a cache file, is damaged, or another
                routerd holds it.
        """
        where = f"persisted cache {path!r}"
        lock = None
        try:
            if read_only:
                if not os.path.exists(path):
                    raise CacheStoreError(f"{where}: no such file")
                db = sqlite3.connect(
                    f"{Path(path).absolute().as_uri()}?mode=ro", uri=True, isolation_level=None
                )
            else:
                lock = _lock(path, where) if locked is None else locked
                db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            if lock is not None:
                os.close(lock)
            raise CacheStoreError(f"{where} cannot be opened: {_why(exc)}") from exc
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA mmap_size = 0")  # reads and writes only: see the module docstring
            if not read_only:
                # Before the first read: a file in WAL mode gets its WAL index in heap memory.
                db.execute("PRAGMA locking_mode = EXCLUSIVE")
            _check(db, where, read_only=read_only)
            if not read_only:
                mode = db.execute(f"PRAGMA journal_mode = {JOURNAL_MODE}").fetchone()[0]
                if mode != JOURNAL_MODE.lower():
                    raise sqlite3.OperationalError(f"journal_mode is {mode!r}, not {JOURNAL_MODE}")
                db.execute("PRAGMA locking_mode = NORMAL")  # readers read between writes
                db.execute("PRAGMA synchronous = NORMAL")
                db.execute(_SCHEMA)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (sqlite3.Error, CacheStoreError) as exc:
            db.close()
            if lock is not None:
                os.close(lock)
            if isinstance(exc, CacheStoreError):
                raise
            damaged = isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)
            raise CacheStoreError(f"{where} cannot be read: {_why(exc)}", damaged=damaged) from exc
        return cls(path, db, lock)

    def load(self, now: float, timeout_ms: int, offset: float = 0.0) -> list[tuple[str, Row]]:
        """The stored entries, least recently accessed first, times in the cache's clock (wall
        clock - `offset`); the expired entries and ended pins are deleted first (unless read-only).

        Args:
            now: the wall clock now.
            timeout_ms: the cache's timeout (0: entries never expire).
            offset: wall clock - the cache's clock (0: the cache keeps wall-clock times).

        Raises:
            CacheStoreError: the file cannot be read.
        """
        try:
            if self._lock is not None:
                with self._db:
                    self._db.execute("BEGIN")
                    self._db.execute("DELETE FROM cache_entries WHERE pinned_until <= ?", (now,))
                    if timeout_ms > 0:
                        self._db.execute(
                            "DELETE FROM cache_entries WHERE pinned_until IS NULL AND last_access <= ?",
                            (now - timeout_ms / 1000,),
                        )
            rows = self._db.execute(
                "SELECT key, node_id, last_access, pinned_until FROM cache_entries ORDER BY last_access"
            ).fetchall()
        except sqlite3.Error as exc:
            raise CacheStoreError(f"persisted cache {self.path!r} cannot be read: {_why(exc)}") from exc
        return [
            (key, (node_id, access - offset, NO_PIN if until is None else until - offset))
            for key, node_id, access, until in rows
        ]

    def write(self, changes: Changes, offset: float) -> int:
        """Write a journal (times in the cache's clock; wall = cache time + `offset`) in one
        transaction; how many rows it changed.

        Raises:
            CacheStoreError: the write failed (nothing of it is in the file).
        """
        # Refused before the rows are built: after a failure each write is the whole cache.
        if not self._busy.acquire(blocking=False):
            raise CacheStoreError(
                f"persisted cache {self.path!r} cannot be written: a former write has not returned "
                "(a hung or frozen filesystem?)"
            )
        try:
            if self._writer is not None and (status := self._writer.poll()) is not None:
                raise CacheStoreError(
                    f"persisted cache {self.path!r} cannot be written: its writer process has ended "
                    f"(exit status {status})"
                )
            upserts = []
            deletes = []
            for key, row in changes.rows.items():
                if row is None:
                    deletes.append((key,))
                else:
                    node_id, access, until = row
                    pinned_until = None if math.isnan(until) else until + offset
                    upserts.append((key, node_id, access + offset, pinned_until))
            if self._writer is not None:
                return self._send(changes.full, deletes, upserts)
            return self._apply(changes.full, deletes, upserts)
        finally:
            self._busy.release()

    def _apply(self, full: bool, deletes: Sequence[tuple[str]], upserts: Sequence[_Upsert]) -> int:
        db = self._db
        try:
            with db:
                db.execute("BEGIN")
                if full:
                    db.execute("DELETE FROM cache_entries")
                db.executemany("DELETE FROM cache_entries WHERE key = ?", deletes)
                db.executemany(_UPSERT, upserts)
        except sqlite3.Error as exc:
            raise CacheStoreError(f"persisted cache {self.path!r} cannot be written: {_why(exc)}") from exc
        return len(upserts) + len(deletes)

    def start_writer(self) -> None:
        """Hand the writes to a writer process of its own (see the module docstring); this
        process's connection closes, its `flock` stays (the writer shares it).

        Raises:
            CacheStoreError: the writer cannot start, or cannot open the file.
        """
        assert self._lock is not None, "a read-only store writes nothing"
        self._db.close()
        python_path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        where = f"persisted cache {self.path!r}"
        try:
            writer = subprocess.Popen(
                [sys.executable, "-m", "router.services.cache_store", self.path, str(self._lock)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(self._lock,),
                env={**os.environ, "PYTHONPATH": python_path},
                start_new_session=True,  # a Ctrl-C reaches routerd, which ends the writer
            )
        except OSError as exc:
            raise CacheStoreError(f"{where}: cannot start its writer process: {_why(exc)}") from exc
        assert writer.stdout is not None
        answer = writer.stdout.readline().decode(errors="replace").rstrip("\n")
        if answer != "ready":
            writer.kill()
            writer.wait()
            raise CacheStoreError(answer.removeprefix("E ") or f"{where}: its writer process did not start")
        self._writer = writer

    def _send(self, full: bool, deletes: Sequence[tuple[str]], upserts: Sequence[_Upsert]) -> int:
        """One write through the writer process: the rows it changed."""
        writer = self._writer
        assert writer is not None
        assert writer.stdin is not None
        assert writer.stdout is not None
        frame = pickle.dumps((full, deletes, upserts), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            writer.stdin.write(len(frame).to_bytes(4, "big") + frame)
            writer.stdin.flush()
            answer = writer.stdout.readline().decode(errors="replace").rstrip("\n")
        except OSError as exc:
            answer = f"E persisted cache {self.path!r} cannot be written: its writer process: {_why(exc)}"
        if not answer:
            answer = f"E persisted cache {self.path!r} cannot be written: its writer process has ended"
        if answer.startswith("E "):
            raise CacheStoreError(answer[2:])
        return int(answer)

    def close(self) -> None:
        """Close the file and release the lock; a writer process gets `WRITER_CLOSE_S` to end (a
        writer still waiting on a hung disk is left to finish, and holds the lock until then)."""
        if self._writer is not None:
            with contextlib.suppress(OSError):
                if self._writer.stdin is not None:
                    self._writer.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._writer.wait(WRITER_CLOSE_S)
            if self._writer.stdout is not None:
                self._writer.stdout.close()  # a writer left on a hung disk: its answer is not read
            _LEFT_WRITING[:] = [w for w in _LEFT_WRITING if w.poll() is None]
            _LEFT_WRITING.append(self._writer)
            self._writer = None
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _lock(path: str, where: str) -> int:
    """Create the file if needed and `flock` it; the descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CacheStoreError(f"{where} is in use by another routerd (it holds the file's lock)") from None
    return fd


def _check(db: sqlite3.Connection, where: str, *, read_only: bool) -> None:
    """Raise CacheStoreError unless the file is empty or one of ours, readable throughout."""
    application_id = db.execute("PRAGMA application_id").fetchone()[0]
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    if application_id != APPLICATION_ID and (tables or application_id != 0):
        raise CacheStoreError(f"{where} is not a connection-router cache file (it holds {sorted(tables)})")
    if read_only and "cache_entries" not in tables:
        raise CacheStoreError(f"{where} holds no cache yet")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if tables and version != SCHEMA_VERSION:
        raise CacheStoreError(f"{where} has layout version {version}; this release reads {SCHEMA_VERSION}")
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise CacheStoreError(f"{where} is damaged: {'; '.join(problems[:3])}", damaged=True)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def set_aside(path: str) -> str:
    """Rename an unreadable cache file (and its journal, or an older release's WAL) out of the way;
    the new name."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = f"{path}.unreadable-{stamp}"
    for suffix in ("", "-journal", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    return aside


def main(argv: list[str] | None = None) -> int:
    """The writer process (`python -m router.services.cache_store FILE LOCK_FD`): open the file
    with routerd's lock, say `ready` (or `E reason`), then apply each write routerd sends (a
    4-byte length, then the pickled rows) and answer the rows changed (or `E reason`), until its
    input ends. SIGINT and SIGTERM are routerd's to act on: ignored here."""
    path, lock = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = sys.stdout.buffer
    try:
        store = CacheStore.open(path, locked=int(lock))
    except CacheStoreError as exc:
        out.write(f"E {exc}\n".encode())
        out.flush()
        return 1
    out.write(b"ready\n")
    out.flush()
    source = sys.stdin.buffer
    while len(header := source.read(4)) == 4:
        full, deletes, upserts = pickle.loads(source.read(int.from_bytes(header, "big")))  # routerd's
        try:
            answer = str(store._apply(full, deletes, upserts))
        except CacheStoreError as exc:
            answer = f"E {exc}"
        out.write(f"{answer}\n".encode())
        out.flush()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
