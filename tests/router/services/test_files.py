"""Tests for router/services/files.py: the probe that a filesystem takes writes.

A frozen filesystem needs root and a loop device: tests/router/test_routerd_file_faults.py runs
that case against a real routerd."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from router.services.files import takes_writes

if TYPE_CHECKING:
    from pathlib import Path


async def test_takes_writes_on_a_writable_file_touches_its_modification_time(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    os.utime(path, (1.0, 1.0))
    assert await takes_writes(str(path))
    assert path.stat().st_mtime > 1.0


async def test_takes_writes_counts_a_failing_touch_as_taking_writes(tmp_path: Path) -> None:
    """Scenario: no such file (`touch -c` creates nothing): the real write is left to say why."""
    assert await takes_writes(str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
