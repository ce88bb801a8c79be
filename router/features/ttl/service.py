"""The connection-TTL checker: closes proxied connections whose client has been silent too long.

One task per router that has an acceptor with a TTL (`TtlChecks`, the feature's service) walks
the connections under a TTL every `connection-ttl-check-interval` and closes those whose client
has sent nothing for `connection-ttl` (Artemis's connection TTL, seed 002). Which TTL a
connection has is decided in router/core/ttl.py; the registry it walks is router/core/live.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from router.core.events import CloseReason
from router.feature import Service

if TYPE_CHECKING:
    from collections.abc import Callable

    from router.config.settings import Config
    from router.feature import Kernel
    from router.runtime import RouterRuntime

__all__ = ["TtlChecks", "serve_connection_ttl_checks", "start"]

log = logging.getLogger("router.conn")


async def serve_connection_ttl_checks(runtime: RouterRuntime, interval_s: float) -> None:
    """Close a router's idle proxied connections every `interval_s`, until cancelled.

    Checks run at absolute times (start + k * interval), so a connection is closed between its
    TTL and its TTL plus one interval after its client's last bytes; each close is logged once
    here, and its data path reports it `Closed` with reason `connection_ttl` (which counts it in
    `router_proxied_connections_closed_total`).

    Args:
        runtime: the router whose connections are checked.
        interval_s: `connection-ttl-check-interval` in seconds.
    """
    next_time = trio.current_time()
    while True:
        next_time += interval_s
        await trio.sleep_until(next_time)
        now = trio.current_time()
        next_time = max(next_time, now)  # a late check skips the missed slots
        with runtime.held() as state:  # the closers are quick and never call back
            idle = state.connections.close_idle(now, CloseReason.CONNECTION_TTL)
        for live, idle_s in idle:
            log.warning(
                "peer=%s router=%s acceptor=%s target=%s address=%s outcome=CONNECTION_TTL "
                "idle_s=%.3f ttl_ms=%d: no bytes from the client within the connection TTL, closing",
                live.conn.peer,
                runtime.name,
                live.conn.acceptor,
                live.node_id,
                live.address,
                idle_s,
                live.ttl_ms,
            )


class TtlChecks(Service):
    """The feature's service: a checker for each router with an acceptor under a TTL, restarted
    with a new configuration (its interval and acceptors may have changed)."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self._config = config

    async def serve_router(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        config = self._config()
        task_status.started()
        if config.ttl_acceptors(runtime.name):
            await serve_connection_ttl_checks(runtime, config.connection_ttl.check_interval_ms / 1000)


def start(kernel: Kernel) -> TtlChecks:
    """The feature's service for one routerd."""
    return TtlChecks(kernel.config)
