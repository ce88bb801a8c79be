"""event_format/files.py: what the writer asks of a file format, as both formats answer it."""

from __future__ import annotations

import os

import pytest

from event_format.files import Encoded, FileFormat, Finished
from event_format.lines import JsonLines
from event_format.parquet import ParquetFormat

FORMATS: list[FileFormat] = [JsonLines("edge-1", 1000), ParquetFormat("edge-1", 1000)]


def test_file_formats_tell_their_files_apart_by_suffix():
    """The writer finishes a file left in progress by the format its suffix names
    (`EventFiles.recover`), and counts every finished file of any format against `max-size`."""
    parts = [f.part_suffix for f in FORMATS]
    finals = [f.final_suffix(compress=c) for f in FORMATS for c in (True, False)]
    assert all(part.endswith(".part") for part in parts)
    assert len(set(parts)) == len(parts)
    assert not any(final.endswith(".part") for final in finals)
    assert {final for final in finals if final.startswith(".jsonl")} == {".jsonl", ".jsonl.zst"}


@pytest.mark.parametrize("file_format", FORMATS, ids=lambda f: type(f).__name__)
def test_a_file_in_progress_without_events_finishes_empty(tmp_path, file_format):
    part = tmp_path / f".events-edge-1-1000-000001{file_format.part_suffix}"
    part.write_bytes(file_format.header())
    fd = os.open(part, os.O_RDWR)
    try:
        finished = file_format.finish(fd, tmp_path / "target", compress=True, recovering=True)
    finally:
        os.close(fd)
    assert finished is Finished.EMPTY
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("file_format", FORMATS, ids=lambda f: type(f).__name__)
def test_no_events_encode_to_nothing_and_no_failure(file_format):
    assert file_format.encode([]) == Encoded(b"", 0)
    assert Encoded(b"", 0).failure is None
