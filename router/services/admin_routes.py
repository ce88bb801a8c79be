"""The admin API's own routes, the kernel's: health, readiness, metrics, the process's status, the
routers, the management lookup (SPEC A7), the filters and a reload; and `AdminContext`, what every
route reads (the features' routes are in their folders, router/features/*/routes.py).

    GET  /healthz                               200 "ok" while the process serves
    GET  /readyz                                200 "ready", or 503 and one line saying why
    GET  /metrics                               Prometheus text exposition
    GET  /api/v1/status                         the process and its acceptors
    GET  /api/v1/routers[/{name}]               every router (or one) with its pool
    GET  /api/v1/routers/{name}/target?key=K    the management lookup (&dry-run=true: changes
                                                nothing)
    PUT  /api/v1/routers/{name}/filters         JSON {"key_filter": …, "local_target_filter": …}
    POST /api/v1/reload                         read the configuration file again and apply it

docs/admin-api.yaml describes each; router/services/admin.py serves them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from router.core.reload import ReloadError
from router.feature import Call, HttpError, Response, Route, json_object, json_response

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from router.core.admin_access import AdminAccess
    from router.core.reload import ConfigDiff
    from router.metrics import Metrics
    from router.runtime import RouterRuntime
    from router.services.process import ProcessView

__all__ = ["KERNEL_ROUTES", "AdminContext", "Lifecycle", "not_ready"]

log = logging.getLogger("router.admin")

_TEXT: Final = "text/plain; charset=utf-8"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Lifecycle:
    """Where the process is in its life, as `GET /readyz` reports it (router/server.py sets both)."""

    accepting: trio.Event = dataclasses.field(default_factory=trio.Event)
    """Set once every acceptor listens."""
    shutdown: trio.Event = dataclasses.field(default_factory=trio.Event)
    """Set when a graceful shutdown starts: from then on /readyz answers 503, so that a load
    balancer or Kubernetes sends no new clients while the open ones drain."""


def not_ready(runtimes: Mapping[str, RouterRuntime], lifecycle: Lifecycle) -> str | None:
    """Why the process is not ready for new clients (one line), or None when it is."""
    if lifecycle.shutdown.is_set():
        return "shutting down"
    if not lifecycle.accepting.is_set():
        return "starting: the acceptors are not listening yet"
    reasons = []
    for runtime in runtimes.values():
        pool = runtime.status().pool
        why = None if pool is None else pool.not_accepting
        if why is not None:
            reasons.append(f"router {runtime.name!r}: {why}")
    return "; ".join(reasons) or None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminContext:
    """What the admin API reads and sets in motion (router/server.py builds it)."""

    runtimes: Mapping[str, RouterRuntime]
    """The routers, shared with the server (a reload changes them in place)."""
    metrics: Metrics
    access: AdminAccess
    lifecycle: Lifecycle
    """Whether the process accepts clients, for /readyz."""
    reload: Callable[[], Awaitable[ConfigDiff]]
    """Reads the configuration file again and applies it (`ReloadError`: nothing changed)."""
    process: ProcessView
    """The process's status (`GET /api/v1/status`)."""
    routes: Sequence[Route] = ()
    """The features' routes (router/features/), served after the kernel's."""
    features: Mapping[type, object] = dataclasses.field(default_factory=dict)
    """The features' services by type, for their routes (`Call.service`)."""
    templates: tuple[tuple[str, list[str], Route], ...] = dataclasses.field(init=False)
    services: Mapping[type, object] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", _templates((*KERNEL_ROUTES, *self.routes)))
        object.__setattr__(self, "services", {AdminContext: self, **self.features})


def _templates(routes: Sequence[Route]) -> tuple[tuple[str, list[str], Route], ...]:
    return tuple((route.method, route.template.strip("/").split("/"), route) for route in routes)


def _readyz(call: Call) -> Response:
    why = not_ready(call.runtimes, _admin(call).lifecycle)
    if why is None:
        return 200, _TEXT, b"ready\n"
    return 503, _TEXT, f"not ready: {why}\n".encode()


def _lookup(call: Call) -> Response:
    runtime = call.runtime
    keys = call.query.get("key")
    if not keys:
        raise HttpError(400, "query parameter 'key' is required")
    dry_run = call.one("dry-run")
    if dry_run not in (None, "true", "false"):
        raise HttpError(400, f"dry-run must be true or false, got {dry_run!r}")
    return json_response(200, runtime.lookup(keys[0], dry_run=dry_run == "true").to_json())


def _admin(call: Call) -> AdminContext:
    return call.service(AdminContext)


KERNEL_ROUTES: Final = (
    Route(method="GET", template="/healthz", handler=lambda call: (200, _TEXT, b"ok\n")),
    Route(method="GET", template="/readyz", handler=_readyz),
    Route(
        method="GET",
        template="/metrics",
        handler=lambda call: (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            _admin(call).metrics.exposition(),
        ),
    ),
    Route(method="POST", template="/api/v1/reload", handler=lambda call: _reload(_admin(call).reload)),
    Route(
        method="GET",
        template="/api/v1/status",
        handler=lambda call: json_response(200, _admin(call).process.status().to_json()),
    ),
    Route(
        method="GET",
        template="/api/v1/routers",
        handler=lambda call: json_response(200, [r.status().to_json() for r in call.runtimes.values()]),
    ),
    Route(
        method="GET",
        template="/api/v1/routers/{name}",
        handler=lambda call: json_response(200, call.runtime.status().to_json()),
    ),
    Route(method="GET", template="/api/v1/routers/{name}/target", handler=_lookup),
    Route(
        method="PUT",
        template="/api/v1/routers/{name}/filters",
        handler=lambda call: json_response(200, _set_filters(call.runtime, call.body)),
    ),
)
"""The kernel's own routes (HEAD too wherever GET is: the GET's headers); the features bring theirs
(router/feature.py `Route`). A path that matches a template but not its method is a 405, any other
a 404. docs/admin-api.yaml describes every route of both (router/server.py `ROUTES`)."""


def _set_filters(runtime: RouterRuntime, body: bytes) -> dict[str, object]:
    document = json_object(body)
    changes: dict[str, str | None] = {}
    for field in ("key_filter", "local_target_filter"):
        if field in document:
            value = document[field]
            if value is not None and not isinstance(value, str):
                raise HttpError(400, f"{field} must be a string or null, got {value!r}")
            changes[field] = value
    try:
        with runtime.held() as state:
            state.engine.set_filters(**changes)
    except ValueError as exc:  # nothing changed
        raise HttpError(400, str(exc)) from None
    status = runtime.status()
    for field in changes:
        in_force = status.key_filter if field == "key_filter" else status.local_target_filter
        log.info("router=%s %s set to %r", runtime.name, field, in_force)
    return status.to_json()


async def _reload(reload: Callable[[], Awaitable[ConfigDiff]]) -> Response:
    """`POST /api/v1/reload`: what changed, or 400 with why nothing did."""
    try:
        diff = await reload()
    except ReloadError as exc:
        raise HttpError(400, str(exc)) from None
    return json_response(200, diff.to_json())
