"""The state file: what operators set at run time that outlives a restart (HAProxy's
`server-state-file`). Today: each target's administrative state (`ready | drain | maint`).

A small JSON document, rewritten whole on every change (written to a temporary file, synced, then
renamed into place: it is always the old document or the new one), read once at start:

    {"version": 1, "routers": {"r1": {"broker-2": "drain", "broker-3": "maint"}}}

Only states other than `ready` are kept. Its place: routerd's `--state-file`, by default beside
the configuration file (`broker.xml` -> `broker-state.json`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pools import AdminState

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["STATE_FILE_VERSION", "StateFile", "StateFileError", "default_state_file"]

STATE_FILE_VERSION: Final = 1
MAX_STATE_FILE_BYTES: Final = 16 * 1024 * 1024
"""A state file larger than this is not ours (one line per target is a few dozen bytes)."""


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

    def load(self) -> dict[str, dict[str, AdminState]]:
        """Router -> node id -> administrative state; empty when the file does not exist.

        Raises:
            StateFileError: it cannot be read, or is not a state file of this version.
        """
        where = f"state file {self.path!r}"
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
        where = f"state file {self.path!r} cannot be written"
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
