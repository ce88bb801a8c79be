"""The state file: what operators set at run time that outlives a restart (HAProxy's
`server-state-file`). Today: each target's administrative state (`ready | drain | maint`).

A small JSON document, rewritten whole on every change (written to a temporary file, synced, then
renamed into place: it is always the old document or the new one), read once at start:

    {"version": 1, "routers": {"r1": {"broker-2": "drain", "broker-3": "maint"}}}

Only states other than `ready` are kept. Its place: routerd's `--state-file`, by default beside
the configuration file (`broker.xml` -> `broker-state.json`).

`KeptStates` writes it off the admin API's request: a change wakes its task, which writes the
states in force in a worker thread, after a probe that the filesystem takes writes (a thread
waiting on a frozen filesystem would keep routerd from exiting: router/services/files.py). A
write that fails is logged and retried after `retry_delay_s` (1 s, doubling, at most 30 s) until
it succeeds; meanwhile the status document says the states are not persisted, and why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from pools import AdminState
from router.services.files import PROBE_TIMEOUT_S, takes_writes

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "STATE_FILE_VERSION",
    "KeptStates",
    "StateFile",
    "StateFileError",
    "StateFileStatus",
    "default_state_file",
    "retry_delay_s",
]

log = logging.getLogger("router.server")

RETRY_FIRST_S: Final = 1.0
"""The wait before the first retry of a failed write; it doubles with each failure."""
RETRY_MAX_S: Final = 30.0
"""The longest wait between two tries: a state set during a disk fault is kept at most this long
after the fault ends."""

STATE_FILE_VERSION: Final = 1
MAX_STATE_FILE_BYTES: Final = 16 * 1024 * 1024
"""A state file larger than this is not ours (one line per target is a few dozen bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StateFileStatus:
    """The state file (routerd's `--state-file`): whether the administrative states in force are
    in it, so that they outlive a restart."""

    path: str
    persisted: bool
    """Every drain/maint state in force is in the file; False while a change is not written yet (a
    write is under way, or failed and is retried)."""
    error: str | None
    """Why the last write failed (None: it did not fail)."""

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "persisted": self.persisted, "error": self.error}


class StateFileError(Exception):
    """The state file cannot be read or written; the message names the file and the rule."""


def default_state_file(config_source: str) -> str:
    """Where the state file goes by default: beside the configuration file."""
    path = Path(config_source)
    return str(path.with_name(f"{path.stem}-state.json"))


class StateFile:
    """One state file (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.where = f"state file {path!r}"
        self.directory = os.path.dirname(os.path.abspath(path))

    def load(self) -> dict[str, dict[str, AdminState]]:
        """Router -> node id -> administrative state; empty when the file does not exist.

        Raises:
            StateFileError: it cannot be read, or is not a state file of this version.
        """
        where = self.where
        try:
            with open(self.path, "rb") as file:
                data = file.read(MAX_STATE_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateFileError(f"{where} cannot be read: {exc.strerror}") from exc
        if len(data) > MAX_STATE_FILE_BYTES:
            raise StateFileError(f"{where} is over {MAX_STATE_FILE_BYTES} bytes: not a state file")
        try:
            document = json.loads(data)
        except ValueError as exc:
            raise StateFileError(f"{where} is not JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("version") != STATE_FILE_VERSION:
            raise StateFileError(
                f'{where} is not a state file of version {STATE_FILE_VERSION} ({{"version": 1, …}})'
            )
        routers = document.get("routers", {})
        states: dict[str, dict[str, AdminState]] = {}
        if not isinstance(routers, dict):
            raise StateFileError(f'{where}: "routers" must be an object, got {routers!r}')
        values = ", ".join(s.value for s in AdminState)
        for router, targets in routers.items():
            if not isinstance(targets, dict):
                raise StateFileError(
                    f"{where}: router {router!r} must map node ids to states, got {targets!r}"
                )
            states[router] = {}
            for node_id, state in targets.items():
                try:
                    states[router][node_id] = AdminState(state)
                except ValueError:
                    raise StateFileError(
                        f"{where}: router {router!r} node id {node_id!r}: state must be one of {values}, "
                        f"got {state!r}"
                    ) from None
        return states

    def save(self, states: Mapping[str, Mapping[str, AdminState]]) -> None:
        """Write the states (those other than READY) atomically.

        Raises:
            StateFileError: it cannot be written (the file keeps its former content).
        """
        routers = {
            router: {
                node_id: state.value
                for node_id, state in sorted(targets.items())
                if state is not AdminState.READY
            }
            for router, targets in sorted(states.items())
        }
        document = {"version": STATE_FILE_VERSION, "routers": {r: t for r, t in routers.items() if t}}
        data = json.dumps(document, indent=1).encode() + b"\n"
        directory = os.path.dirname(os.path.abspath(self.path))
        where = f"{self.where} cannot be written"
        try:
            fd, temporary = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise StateFileError(f"{where}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise StateFileError(f"{where}: {exc.strerror}") from exc


def retry_delay_s(failures: int) -> float:
    """The wait before the next try after `failures` (>= 1) failed writes in a row."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** min(failures - 1, 16))


class KeptStates:
    """The state file of a running routerd, written whenever the states change, retried until
    written (see the module docstring)."""

    def __init__(self, file: StateFile, states: Callable[[], Mapping[str, Mapping[str, AdminState]]]) -> None:
        """Args:
        file: the state file.
        states: the states in force now, router -> node id -> state.
        """
        self.file = file
        self._states = states
        self._asked = 0
        """Changes asked for (`changed`)."""
        self._written = 0
        """The changes the file holds (the value of `_asked` when its last write began)."""
        self._tried_asked = 0
        """The value of `_asked` when the last finished try began."""
        self._error: str | None = None
        self._wake = trio.Event()
        self._tried = trio.Event()
        """Set after each try, for those waiting for one (`changed_and_written`)."""

    def status(self) -> StateFileStatus:
        """What `GET /api/v1/status` shows."""
        return StateFileStatus(path=self.file.path, persisted=self._written == self._asked, error=self._error)

    async def changed_and_written(self, timeout_s: float) -> str | None:
        """Note a change of the states and wait up to `timeout_s` for it to be written; None once
        written, else why not (it is retried)."""
        self._asked += 1
        wanted = self._asked
        self._wake.set()
        with trio.move_on_after(timeout_s):
            while self._written < wanted and self._tried_asked < wanted:  # no try of it ended yet
                await self._tried.wait()
        if self._written >= wanted:
            return None
        return self._error or f"not written within {timeout_s:g} s"

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the states whenever they change, until cancelled; a failed write is retried."""
        task_status.started()
        failures = 0
        while True:
            if self._written == self._asked:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            if await self._try():
                failures = 0
                continue
            failures += 1
            await trio.sleep(retry_delay_s(failures))

    async def close(self, timeout_s: float) -> None:
        """At exit: a last try when the file lags behind, within `timeout_s`; an ERROR when the
        states in force are not in the file."""
        if self._written == self._asked:
            return
        with trio.move_on_after(timeout_s):
            await self._try()
        if self._written != self._asked:
            log.error(
                "%s: the administrative states in force are not in it: a restart will not have them (%s)",
                self.file.where,
                self._error or f"its last write did not end within {timeout_s:g} s",
            )

    async def _try(self) -> bool:
        """One write of the states in force; whether it succeeded (else logged)."""
        asked = self._asked
        states = {router: dict(targets) for router, targets in self._states().items()}
        error = None
        if not await takes_writes(self.file.directory):
            error = (
                f"{self.file.where} cannot be written: its filesystem takes no writes within "
                f"{PROBE_TIMEOUT_S:g} s (frozen?)"
            )
        else:
            try:
                await trio.to_thread.run_sync(self.file.save, states, abandon_on_cancel=True)
            except StateFileError as exc:
                error = str(exc)
        if error is None:
            if self._error is not None:
                log.info("%s: written; the administrative states in force are kept", self.file.where)
            self._written, self._error = asked, None
        else:
            log.error("%s; the administrative states in force are not kept yet: retrying", error)
            self._error = error
        self._tried_asked = asked
        self._tried.set()
        self._tried = trio.Event()
        return error is None
