"""Whether a file's filesystem takes writes now: the probe routerd runs before it writes the state
file itself (the persisted cache and the event log have writer processes instead); and, at start,
whether a file routerd will write can be written at all (`why_unwritable`, which asks the kernel
and writes nothing).

Why a probe, and why in a child process: a thread that writes to a frozen filesystem (`fsfreeze`,
a snapshot tool) waits in the kernel where no signal reaches it, and a process exits only when
all its threads have: one such thread keeps routerd (its sockets, its ports) alive until the
filesystem thaws, whatever the main thread does. A child process left waiting keeps nothing of
routerd's alive. No decisions here, only the probe.
"""

from __future__ import annotations

import os
import stat
import subprocess
from typing import Final

import trio

__all__ = ["EXIT_FILES_S", "PROBE_TIMEOUT_S", "takes_writes", "why_unwritable"]

EXIT_FILES_S: Final = 5.0
"""At exit, after the grace period, how long the files may take: the persisted caches' last writes
and the event log's writer writing what its ring holds and finishing its file (a full ring of
65,536 events takes well under a second; compressing 64 MB, about one); beyond it each is
abandoned with an ERROR naming the file (a hung or frozen filesystem)."""

PROBE_TIMEOUT_S: Final = 1.0
"""How long the probe may take: a write of one file's time stamps takes microseconds unless the
filesystem is frozen (on a local disk; a slow remote one may take longer, and counts as frozen)."""

_LEFT_WAITING: Final[dict[str, trio.Process]] = {}
"""Path -> its probe left waiting on a frozen filesystem (kept, so that nothing warns that it
still runs; it ends when its filesystem thaws). One per path at most: while it waits, the
filesystem is still frozen, and no other probe starts."""


async def takes_writes(path: str) -> bool:
    """Whether the filesystem of `path` (a file or a directory) takes a write of its modification
    time within `PROBE_TIMEOUT_S` (`touch -c -m` in a child process). A `touch` that fails (no such
    file, an immutable file) counts as taking writes: the real write then fails, and says why.
    """
    waiting = _LEFT_WAITING.get(path)
    if waiting is not None:
        if waiting.poll() is None:
            return False  # the last probe still waits: frozen still
        del _LEFT_WAITING[path]
    process = await trio.lowlevel.open_process(
        ["touch", "-c", "-m", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    with trio.move_on_after(PROBE_TIMEOUT_S):
        await process.wait()
        return True
    process.kill()  # takes effect when the filesystem thaws; never waited for
    _LEFT_WAITING[path] = process
    return False


def why_unwritable(path: str) -> str | None:
    """Why this process could not create or replace the file `path` (a temporary file renamed into
    place, a database and its journal beside it: both need its directory), or None when nothing
    says so. It asks the kernel (`stat`, `statvfs`, `access`) and writes nothing, so it cannot hang
    on a frozen filesystem; a disk that is full or fails is found by the writes themselves.

    Returns:
        None, or one phrase that names the directory and the reason: missing, not a directory, on
        a read-only filesystem, or not writable by this process (its mode, or `chattr +i`).
    """
    if os.path.isdir(path):
        return f"{path} is a directory"
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        return f"its directory {directory} does not exist"
    except NotADirectoryError:
        return f"its directory {directory} is not a directory (a part of its path is a file)"
    except OSError as exc:
        return f"its directory {directory} cannot be looked at: {exc.strerror}"
    if not stat.S_ISDIR(mode):
        return f"its directory {directory} is not a directory"
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        return f"its directory {directory} is on a read-only filesystem"
    # W_OK to create and rename a file in it, X_OK to reach it; root passes unless the directory
    # is immutable (`chattr +i`: access(2) then fails with EPERM for root too).
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"its directory {directory} is not writable by this process (uid {os.geteuid()})"
    return None
