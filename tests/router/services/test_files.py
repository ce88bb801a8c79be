"""Tests for router/services/files.py: the probe that a filesystem takes writes.

A frozen filesystem needs root and a loop device: tests/router/test_routerd_file_faults.py runs
that case against a real routerd."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from router.services.files import takes_writes, why_unwritable

ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534


def _as_nobody(path: str) -> str | None:
    """`why_unwritable(path)` in a forked child that has become uid and gid `NOBODY`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        status = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            os.write(write, repr(why_unwritable(path)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        text = answer.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return None if text == "None" else text.strip("'\"")


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


class TestWhyUnwritable:
    """`why_unwritable`: the start-up check of a file routerd will write. Each case but a mode's
    fails as root too (root passes a directory's mode)."""

    def test_a_file_in_a_writable_directory_can_be_written(self, tmp_path: Path) -> None:
        assert why_unwritable(str(tmp_path / "state.json")) is None
        (tmp_path / "state.json").write_text("{}")
        assert why_unwritable(str(tmp_path / "state.json")) is None

    def test_a_missing_directory_is_named(self, tmp_path: Path) -> None:
        reason = why_unwritable(str(tmp_path / "gone" / "state.json"))
        assert reason == f"its directory {tmp_path / 'gone'} does not exist"

    def test_a_directory_under_a_file_is_not_a_directory(self, tmp_path: Path) -> None:
        """Scenario: ENOTDIR, which root gets too."""
        (tmp_path / "broker.xml").write_text("<configuration/>")
        file = tmp_path / "broker.xml"
        reason = why_unwritable(str(file / "state.json"))
        assert reason == f"its directory {file} is not a directory"
        reason = why_unwritable(str(file / "states" / "state.json"))
        assert reason == f"its directory {file / 'states'} is not a directory (a part of its path is a file)"

    def test_a_directory_in_the_files_place_is_named(self, tmp_path: Path) -> None:
        assert why_unwritable(str(tmp_path)) == f"{tmp_path} is a directory"

    def test_a_directory_without_write_permission_is_named(self, tmp_path: Path) -> None:
        """Scenario: a configuration directory of root's, routerd a user (as in the image). As root
        the check runs in a child process that has become `nobody`."""
        if os.geteuid() != 0:
            directory = tmp_path / "etc"
            directory.mkdir(mode=0o555)
            path = str(directory / "state.json")
            reason = why_unwritable(path)
            assert reason == f"its directory {directory} is not writable by this process (uid {os.geteuid()})"
            return
        # pytest's tmp_path is root's alone (0700): nobody could not even look; /tmp lets it.
        with tempfile.TemporaryDirectory(prefix="why-unwritable-") as top:
            directory = Path(top) / "etc"
            directory.mkdir()
            os.chmod(top, 0o755)
            directory.chmod(0o755)
            path = str(directory / "state.json")
            assert why_unwritable(path) is None  # root may
            reason = _as_nobody(path)
            assert reason == f"its directory {directory} is not writable by this process (uid {NOBODY})"

    def test_a_read_only_filesystem_is_named(self, tmp_path: Path) -> None:
        """Scenario: the directory is a read-only bind mount (as a Kubernetes or compose read-only
        volume), in a mount namespace of its own; root gets EROFS too."""
        directory = tmp_path / "config"
        directory.mkdir()
        path = str(directory / "state.json")
        probe = f"from router.services.files import why_unwritable; print(why_unwritable({path!r}))"
        script = (
            f"{{ mount --bind {directory} {directory} && mount -o remount,bind,ro {directory}; }} "
            "|| exit 77; "
            f"exec {sys.executable} -c {shlex.quote(probe)}"
        )
        result = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        if result.returncode == 77 or (result.returncode != 0 and result.stderr.startswith("unshare:")):
            pytest.skip(f"no read-only bind mount here (needs CAP_SYS_ADMIN): {result.stderr.strip()}")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"its directory {directory} is on a read-only filesystem"
