"""router/services/event_files.py: the files of the event log's writer, in process, on real files."""

from __future__ import annotations

import errno
import fcntl
import os
from typing import TYPE_CHECKING

from router.config.settings import EventLogConfig
from router.services.event_files import EventFiles, Tally

if TYPE_CHECKING:
    from pathlib import Path


def _files(directory: Path, **settings: object) -> EventFiles:
    config = EventLogConfig(directory=str(directory), compress=False, **settings)  # type: ignore[arg-type]
    return EventFiles(config, "edge-1", 1000)


def _finished(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("events-"))


def test_a_file_that_cannot_be_finished_is_tried_again_at_the_next_rotation(tmp_path, monkeypatch):
    files = _files(tmp_path)
    failing = [True]
    finish = EventFiles._finish_locked

    def flaky(self: EventFiles, part: Path, fd: int, *, recovering: bool) -> bool:
        if failing[0]:
            failing[0] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as when compressing fills the disk
        return finish(self, part, fd, recovering=recovering)

    monkeypatch.setattr(EventFiles, "_finish_locked", flaky)
    files.add(b'{"n":1}\n', 1)
    files.finish_part()
    assert _finished(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == [".events-edge-1-1000-000001.jsonl.part"]
    files.add(b'{"n":2}\n', 1)
    files.finish_part()
    assert _finished(tmp_path) == ["events-edge-1-1000-000001.jsonl", "events-edge-1-1000-000002.jsonl"]
    assert files.tally.take() == {"written": 2, "finished": 2}


def test_recovery_leaves_a_file_another_writer_holds_and_finishes_it_once_released(tmp_path):
    part = tmp_path / ".events-edge-1-900-000001.jsonl.part"
    part.write_bytes(b'{"n":1}\n{"n":')
    holder = os.open(part, os.O_RDONLY)  # another writer (a killed routerd's, finishing it)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert _files(tmp_path).recover() == 0
        assert part.exists()
    finally:
        os.close(holder)
    files = _files(tmp_path)
    assert files.recover() == 1
    assert (tmp_path / "events-edge-1-900-000001.jsonl").read_bytes() == b'{"n":1}\n'  # cut after the line
    assert files.tally.take() == {"finished": 1}


def test_size_rotation_and_flush_by_time(tmp_path):
    files = _files(tmp_path, rotate_size=20, rotate_interval_ms=60_000)
    files.add(b'{"n":1}\n', 1)
    assert files.current_file == ".events-edge-1-1000-000001.jsonl.part"
    files.tick(0.0, flush=True)  # long before its rotation: written, not finished
    assert (tmp_path / ".events-edge-1-1000-000001.jsonl.part").read_bytes() == b'{"n":1}\n'
    files.add(b'{"n":2}\n{"n":3}\n', 2)  # 24 bytes >= rotate-size
    assert _finished(tmp_path) == ["events-edge-1-1000-000001.jsonl"]
    assert [files.current_file] == [None]  # (a list: mypy keeps the narrowing above)
    assert files.rotation_due() is None
    files.add(b'{"n":4}\n', 1)
    due = files.rotation_due()
    assert due is not None
    files.tick(due, flush=False)  # due: finished
    assert len(_finished(tmp_path)) == 2
    assert files.tally.take() == {"written": 4, "finished": 2}


def test_a_tally_gives_what_is_not_zero_once():
    tally = Tally(written=3, deleted=1)
    assert tally.take() == {"written": 3, "deleted": 1}
    assert tally.take() == {}
