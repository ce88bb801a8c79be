"""Targets' administrative states kept across restarts (`AdminStates`): the state file read at
start and its states applied before any listener, then written whenever an operator changes a
state, retried until written (state_file.py); its status in the process's status document.

Its place: routerd's `--state-file`, by default beside the configuration file (`broker.xml` ->
`broker-state.json`); a routerd started without the option (a test's) keeps them in memory only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from router.feature import Kernel, OpenError, Service
from router.features.admin_states.state_file import KeptStates, StateFile, StateFileError
from router.services.files import why_unwritable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from router.runtime import RouterRuntime

__all__ = ["AdminStates", "restore_admin_states", "warn_if_unwritable"]

log = logging.getLogger("router.server")


class AdminStates(Service):
    """The state file of one routerd (None: states in memory only)."""

    def __init__(self, kernel: Kernel) -> None:
        path = kernel.options.get("state_file")
        self._runtimes = kernel.runtimes
        self.kept: KeptStates | None = None
        """The state file being kept (None: no state file)."""
        self._file = None if not isinstance(path, str) else StateFile(path)

    def open_files(self) -> None:
        """Read the state file and apply its states (each change is logged); a WARNING when it
        cannot be written (`warn_if_unwritable`).

        Raises:
            OpenError: the file cannot be read.
        """
        if self._file is None:
            return
        runtimes = self._runtimes
        file = restore_admin_states(self._file, runtimes)
        warn_if_unwritable(file)
        self.kept = KeptStates(file, lambda: {r.name: r.pool.admin_states() for r in runtimes.values()})

    def process_status(self) -> Mapping[str, object]:
        return {"state_file": None if self.kept is None else self.kept.status().to_json()}

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.kept is None:
            task_status.started()
            return
        await self.kept.serve(task_status=task_status)

    async def close_files(self, timeout_s: float) -> None:
        if self.kept is not None:
            await self.kept.close(timeout_s)


def restore_admin_states(states: StateFile, runtimes: Mapping[str, RouterRuntime]) -> StateFile:
    """Apply the administrative states a state file keeps (each change is logged).

    Raises:
        OpenError: the file cannot be read.
    """
    try:
        kept = states.load()
    except StateFileError as exc:
        raise OpenError(f"{exc}; fix or delete it (it holds only targets' drain/maint states)") from exc
    restored = 0
    for router, targets in kept.items():
        runtime = runtimes.get(router)
        if runtime is None:
            log.warning("state file %s: no connection router %r: its states are dropped", states.path, router)
            continue
        for node_id, state in targets.items():
            try:
                runtime.pool.set_admin_state(node_id, state)
            except (LookupError, ValueError) as exc:
                log.warning("state file %s: %s: dropped", states.path, exc)
                continue
            restored += 1
    if restored:
        log.info("state file %s: %d administrative state(s) restored", states.path, restored)
    return states


def warn_if_unwritable(states: StateFile) -> bool:
    """Log one WARNING, at start, when the state file cannot be written (its directory is missing,
    read-only or not routerd's: the default place, beside a configuration mounted read-only in a
    container, is such a one), rather than leave it to the first `routerctl state` to answer 500;
    whether it warned. routerd starts all the same: the states work, in memory."""
    reason = why_unwritable(states.path)
    if reason is None:
        return False
    log.warning(
        "%s cannot be written: %s; drain and maint states set from now on are not kept across a "
        "restart, and setting one answers 500: give routerd --state-file FILE in a writable directory",
        states.where,
        reason,
    )
    return True
