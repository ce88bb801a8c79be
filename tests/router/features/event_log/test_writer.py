"""router/features/event_log/writer.py: the writer process's frames, lines and reports; in process,
and as the real process routerd starts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from event_format.frames import FRAME_MAX, encode_frame
from event_format.schema import BOOT_SPAN
from keys import KeyType
from router.config.settings import EventFileFormat, EventLogConfig
from router.core.address import Address
from router.core.events import Closed, CloseReason, ConnectionRef
from router.features.event_log import writer as event_writer
from router.features.event_log.files import EventFiles
from router.features.event_log.records import event_values
from router.features.event_log.writer import file_format, settings_argument
from tests.router.features.event_log.conftest import all_records, records_in
from tests.router.features.event_log.test_service import decided as _decided

if TYPE_CHECKING:
    from pathlib import Path

NOW = 1_795_435_200.0


def _values(n: int) -> tuple[object, ...]:
    return event_values(_decided(n), KeyType.CLIENT_ID, NOW)


def _writer(directory: Path, form: EventFileFormat = EventFileFormat.PARQUET) -> event_writer._Writer:
    config = EventLogConfig(directory=str(directory), compress=False, format=form)
    return event_writer._Writer(EventFiles(config, "edge-1", 1000, file_format(config, "edge-1", 1000)))


@pytest.mark.parametrize("form", list(EventFileFormat))
def test_frames_cut_anywhere_become_whole_records(tmp_path, form):
    writer = _writer(tmp_path, form)
    data = encode_frame([(0, _values(0)), (1, _values(1))]) + encode_frame([(2, _values(2))])
    for i in range(len(data)):  # one byte at a time: the worst a pipe can do
        writer.feed(data[i : i + 1])
    writer.files.finish_part()
    lines = all_records(tmp_path)
    assert [line["key"] for line in lines] == ["dev-0", "dev-1", "dev-2"]
    assert [line["seq"] for line in lines] == [1000 * BOOT_SPAN + n for n in range(3)]
    assert writer.files.tally.take() == {"written": 3, "finished": 1}


def test_an_event_without_a_line_is_lost_counted_and_the_rest_written(tmp_path, caplog):
    writer = _writer(tmp_path, EventFileFormat.JSONL)
    closed = Closed(
        conn=ConnectionRef(id=9, router="r1", acceptor="mqtt", peer=Address("10.0.0.1", 1)),
        node_id="node4",
        bytes_in=1,
        bytes_out=1,
        duration_s=float("nan"),
        reason=CloseReason.CLOSED,
    )
    bad = event_values(closed, KeyType.CLIENT_ID, NOW)
    writer.feed(encode_frame([(0, _values(0)), (1, bad), (2, _values(2))]))
    writer.files.finish_part()
    assert [line["key"] for line in all_records(tmp_path)] == ["dev-0", "dev-2"]
    assert writer.files.tally.take() == {"written": 2, "lost": 1, "finished": 1}
    assert "1 event(s) lost: an event has no line: a record field must be a finite number" in caplog.text


def test_a_frame_longer_than_the_bound_is_a_broken_stream(tmp_path):
    writer = _writer(tmp_path)
    with pytest.raises(ValueError, match=f"a frame of {FRAME_MAX + 1} bytes"):
        writer.feed((FRAME_MAX + 1).to_bytes(4, "little"))


def test_the_process_finishes_its_file_when_its_input_ends_and_ignores_sigterm(tmp_path):
    config = EventLogConfig(directory=str(tmp_path))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.features.event_log.writer",
            settings_argument(config, "e/1", "e_1", 7),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        assert json.loads(process.stdout.readline()) == {"ready": 0}
        process.stdin.write(encode_frame([(0, _values(0)), (1, _values(1))]))
        process.stdin.flush()
        assert json.loads(process.stdout.readline()) == {
            "counts": {},
            "file": ".events-e_1-7-000001.arrows.part",
        }
        process.send_signal(signal.SIGTERM)  # a service stop: routerd, not the signal, ends it
        process.stdin.close()  # as when routerd ends, even by kill -9
        reports = [json.loads(line) for line in process.stdout]
        assert process.wait(10) == 0
    finally:
        process.stdout.close()
        if process.poll() is None:
            process.kill()  # ours, by its PID
            process.wait()
    assert reports == [{"counts": {"written": 2, "finished": 1}, "file": None}]
    [path] = tmp_path.glob("events-e_1-7-000001.parquet")
    assert [r["key"] for r in records_in(path)] == ["dev-0", "dev-1"]


def test_a_directory_it_cannot_read_is_one_clear_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = EventLogConfig(directory=str(blocker))
    done = subprocess.run(
        [sys.executable, "-m", "router.features.event_log.writer", settings_argument(config, "e", "e", 1)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout) == {"failed": f"event log directory {str(blocker)!r}: Not a directory"}


def test_the_writer_process_imports_no_other_feature_nor_the_feature_s_routerd_side() -> None:
    """router/features/__init__.py and the event log's own `__init__` import their features on first
    use: the writer process (started for every routerd with an event log) loads only what it runs."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, router.features.event_log.writer; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('router.', 'trio')))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    features = {m for m in loaded if m.startswith("router.features.")}
    assert features == {
        "router.features.event_log",
        "router.features.event_log.writer",
        "router.features.event_log.files",
    }
    assert not [m for m in loaded if m.startswith(("trio", "router.runtime"))], loaded
