"""The process as the status resource shows it (`GET /api/v1/status`): pid, version, uptime, the
descriptor limit and use, the client budget, and each acceptor with its open and pending counts.

Everything is read when asked, from counts the data paths keep anyway: the admission's (open
connections, by acceptor), the trio path's `Pending` per acceptor and the fast path's openings
(pending), so serving connections costs nothing more. Reading /proc/self/fd costs one directory
listing per request (about 1 ms for 10,000 descriptors).
"""

from __future__ import annotations

import importlib.metadata
import os
import resource
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from router.core.status import AcceptorStatus, ProcessStatus, ServerStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from router.core.admission import Admission
    from router.core.status import ZooKeeperStatus
    from router.datapath.acceptor import ServedAcceptor
    from router.datapath.fast_path import FastPath

__all__ = ["DISTRIBUTION", "ProcessView", "descriptors_open", "package_version"]

DISTRIBUTION: Final = "connection-router"
"""The distribution whose version `routerd` reports and `routerctl --version` prints."""


def package_version() -> str:
    """The installed distribution's version ("unknown" when it is not installed, e.g. run from a
    source tree without `pip install`)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def descriptors_open() -> int | None:
    """Descriptors the process has open now; None where there is no /proc."""
    try:
        # The listing's own descriptor is in it: not one of the process's.
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class _Served:
    acceptor: ServedAcceptor
    host: str
    port: int
    fast: bool


class ProcessView:
    """Builds the status document of a running routerd (see the module docstring)."""

    def __init__(self, admission: Admission) -> None:
        """Args:
        admission: the process's admission (its budget and open counts).
        """
        self._admission = admission
        self._started_at = time.time()
        self._started = time.monotonic()
        self._version = package_version()
        self._served: tuple[_Served, ...] = ()
        self._fast: FastPath | None = None
        self.features: Callable[[], Mapping[str, object]] = dict
        """The features' members of the document now (`Service.process_status`; the server sets it)."""
        self.zookeeper: Callable[[], Iterable[ZooKeeperStatus]] = tuple
        """The ZooKeeper sessions of every router now (the server sets it)."""

    def serving(
        self, acceptors: Iterable[tuple[ServedAcceptor, tuple[str, int], bool]], fast: FastPath | None
    ) -> None:
        """The acceptors listening now, each with its bound address and whether the fast path
        serves it, and the fast path when it serves any; called again when they change. (Which
        acceptors are fast is the server's to say: the fast path's thread takes a reload's new
        listeners in at its next wake-up.)"""
        self._served = tuple(
            _Served(acceptor, host, port, fast_path) for acceptor, (host, port), fast_path in acceptors
        )
        self._fast = fast

    def status(self) -> ServerStatus:
        """The document as it is now."""
        admission = self._admission
        open_by_acceptor = admission.open_by_acceptor()
        fast_pending = {} if self._fast is None else self._fast.pending_by_acceptor()
        acceptors = tuple(
            AcceptorStatus(
                name=s.acceptor.name,
                router=s.acceptor.runtime.name,
                host=s.host,
                port=s.port,
                mode=s.acceptor.config.mode.value,
                data_path="fast" if s.fast else "trio",
                open=open_by_acceptor.get(s.acceptor.name, 0),
                pending=s.acceptor.pending.count + fast_pending.get(s.acceptor.name, 0),
                connections_allowed=_limit(s.acceptor.config.connections_allowed),
                connections_allowed_per_source=_limit(s.acceptor.config.connections_allowed_per_source),
            )
            for s in self._served
        )
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        process = ProcessStatus(
            pid=os.getpid(),
            version=self._version,
            started_at=self._started_at,
            uptime_s=time.monotonic() - self._started,
            descriptor_limit=None if limit == resource.RLIM_INFINITY else limit,
            descriptors_open=descriptors_open(),
            client_budget=admission.budget,
            client_connections=admission.open,
        )
        zookeeper = tuple(sorted(self.zookeeper(), key=lambda z: (z.router, z.use)))
        return ServerStatus(
            process=process, acceptors=acceptors, features=self.features(), zookeeper=zookeeper
        )


def _limit(value: int) -> int | None:
    """A configured limit, None for none (-1)."""
    return None if value < 0 else value
