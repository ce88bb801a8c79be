"""router/features/event_log/files.py: the files of the event log's writer, in both formats
(event_format.lines.JsonLines, event_format.parquet.ParquetFormat), in process, on real files."""

from __future__ import annotations

import errno
import fcntl
import os
from typing import TYPE_CHECKING

import pytest

from event_format.lines import JsonLines
from keys import KeyType
from router.config.settings import EventFileFormat, EventLogConfig
from router.features.event_log.files import EventFiles, Tally
from router.features.event_log.records import event_values
from router.features.event_log.writer import file_format
from tests.router.features.event_log.conftest import all_records, finished
from tests.router.features.event_log.test_service import decided

if TYPE_CHECKING:
    from pathlib import Path

NOW = 1_795_435_200.25
FORMATS = list(EventFileFormat)


def _files(directory: Path, form: EventFileFormat = EventFileFormat.JSONL, **settings: object) -> EventFiles:
    config = EventLogConfig(directory=str(directory), format=form, **({"compress": False} | settings))  # type: ignore[arg-type]
    return EventFiles(config, "edge-1", 1000, file_format(config, "edge-1", 1000))


def _batch(*numbers: int) -> list[tuple[int, tuple[object, ...]]]:
    return [(n, event_values(decided(n), KeyType.CLIENT_ID, NOW + n)) for n in numbers]


def _keys(directory: Path) -> list[object]:
    return [record["key"] for record in all_records(directory)]


@pytest.mark.parametrize("form", FORMATS)
def test_a_file_that_cannot_be_finished_is_tried_again_at_the_next_rotation(tmp_path, monkeypatch, form):
    files = _files(tmp_path, form)
    failing = [True]
    finish = EventFiles._finish_locked

    def flaky(self: EventFiles, part: Path, fd: int, *, recovering: bool) -> bool:
        if failing[0]:
            failing[0] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as when compressing fills the disk
        return finish(self, part, fd, recovering=recovering)

    monkeypatch.setattr(EventFiles, "_finish_locked", flaky)
    files.add(_batch(1))
    files.finish_part()
    assert finished(tmp_path) == []
    suffix = files.format.part_suffix
    assert [p.name for p in tmp_path.iterdir()] == [f".events-edge-1-1000-000001{suffix}"]
    files.add(_batch(2))
    files.finish_part()
    final = files.format.final_suffix(compress=False)
    assert [p.name for p in finished(tmp_path)] == [
        f"events-edge-1-1000-000001{final}",
        f"events-edge-1-1000-000002{final}",
    ]
    assert _keys(tmp_path) == ["dev-1", "dev-2"]
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


def test_recovery_finishes_a_file_another_format_left_in_progress(tmp_path):
    """Scenario: routerd ran with <format>jsonl</format>, crashed, and starts with Parquet."""
    part = tmp_path / ".events-edge-1-900-000001.jsonl.part"
    part.write_bytes(b'{"n":1}\n{"n":')
    config = EventLogConfig(directory=str(tmp_path), compress=False, format=EventFileFormat.PARQUET)
    files = EventFiles(
        config, "edge-1", 1000, file_format(config, "edge-1", 1000), (JsonLines("edge-1", 1000),)
    )
    assert files.recover() == 1
    assert (tmp_path / "events-edge-1-900-000001.jsonl").read_bytes() == b'{"n":1}\n'
    assert not part.exists()


@pytest.mark.parametrize(
    ("form", "rotate_size"), [(EventFileFormat.JSONL, 1200), (EventFileFormat.PARQUET, 4000)]
)
def test_size_rotation_and_flush_by_time(tmp_path, form, rotate_size):
    """One event is less than `rotate_size` bytes in the file (an Arrow batch carries its
    metadata, ≈1.7 kB, after the schema's 1.2 kB), six are more."""
    files = _files(tmp_path, form, rotate_size=rotate_size, rotate_interval_ms=60_000)
    files.add(_batch(1))
    suffix = files.format.part_suffix
    assert files.current_file == f".events-edge-1-1000-000001{suffix}"
    before = (tmp_path / files.current_file).stat().st_size
    files.tick(0.0, flush=True)  # long before its rotation: written, not finished
    assert (tmp_path / f".events-edge-1-1000-000001{suffix}").stat().st_size > before
    files.add(_batch(2, 3, 4, 5, 6))
    files.tick(0.0, flush=True)  # over rotate-size once written
    assert len(finished(tmp_path)) == 1
    assert [files.current_file] == [None]  # (a list: mypy keeps the narrowing above)
    assert files.rotation_due() is None
    files.add(_batch(7))
    due = files.rotation_due()
    assert due is not None
    files.tick(due, flush=False)  # due: finished
    assert len(finished(tmp_path)) == 2
    assert _keys(tmp_path) == [f"dev-{n}" for n in range(1, 8)]
    assert files.tally.take() == {"written": 7, "finished": 2}


def test_a_tally_gives_what_is_not_zero_once():
    tally = Tally(written=3, deleted=1)
    assert tally.take() == {"written": 3, "deleted": 1}
    assert tally.take() == {}
