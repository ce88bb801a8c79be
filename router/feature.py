"""The contract of a feature folder (router/features/, STYLE R13), and what the kernel gives it.

A feature brings its own pure rules, its service, its admin routes, its `routerctl` commands, its
metric families and its part in a reload and a shutdown, in one folder, and declares them once,
in its folder's `__init__.py`, as a `Feature`:

    name       the folder's name
    routes     its admin API resources (`Route`: a method, a path template, a handler)
    commands   its `routerctl` commands (`Command`)
    metrics    its metric families (a `FeatureMetrics` of router/metrics.py)
    options    its routerd command-line options (`Option`), given to its service through `Kernel`
    start      builds its `Service` for one routerd (tests run several in one process)
    in_workers whether that service runs in routerd's worker processes too, or in the supervisor
               only (`Processes`)
    router_blocks  its part of a router's `routerctl status` (tables of its members of the
               router's document)

`router/features/__init__.py` composes them in one list, `FEATURES`. The process (router/server.py),
the admin API (router/services/admin.py, given the routes), the metrics registry and `routerctl`
(router/cli.py) loop over that list and hold no feature's code. Features never import each other:
what two of them share belongs in the kernel.

A `Service` is a feature's part of one running routerd; the kernel calls its hooks, each a no-op
unless the feature has something to do then:

    open_files      at start, before any listener: open what it keeps beside routing (files, a
                    writer process); `OpenError` when it cannot, and routerd does not start
    prepare_router  before a router joins (at start, or a reload adds it): read what it keeps for
                    that router (a persisted cache's file); `OpenError` when it cannot: routerd
                    does not start, or the reload changes nothing (`discard_prepared`)
    router_added    a router joins the process: each one at start, each one a reload adds (where
                    it may add its members of each target's status document to the router's
                    `RouterState.target_sections`)
    router_changed  a reload changed a router's configuration in place
    router_removed  a reload removed a router (its tasks are cancelled already)
    serve           its task in the services nursery, started before the admin API answers
    serve_router    its task for one router, started with the router's own and restarted when a
                    reload changes the router
    serve_router_data  its task for one router that outlives a change of the router (what it
                    holds, such as the members discovery found, stays): cancelled when it goes
    targets_left    a reload removed targets of a router that goes on
    stopping        a graceful shutdown begins, before its grace period
    process_status  its members of the process's status document (`GET /api/v1/status`)
    close_files     at exit, after the grace period: the last writes of what `open_files` opened,
                    beside the other files', within the time the kernel gives

A route's handler gets a `Call`: the request, the routers, and the services by type, so that a
feature reaches its own service (`call.service(Moves)`) and nothing else's. A `Command` runs in
`routerctl` with a `Ctl`: the parsed arguments' admin API client and the output.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeAlias, TypeVar

import trio

from router.processes import Peers, Processes

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from router.config.settings import Config, RouterConfig
    from router.core.reload import Departed
    from router.ctl_client import Ctl
    from router.ctl_output import Blocks
    from router.metrics import FeatureMetrics, Metrics
    from router.runtime import RouterRuntime

__all__ = [
    "JSON",
    "Call",
    "Command",
    "Feature",
    "HttpError",
    "Kernel",
    "OpenError",
    "Option",
    "Response",
    "Route",
    "Service",
    "json_object",
    "json_response",
]

Response: TypeAlias = tuple[int, str, bytes]
"""An admin API answer: its status, its content type and its body."""
JSON: Final = "application/json"

_S = TypeVar("_S")


class HttpError(Exception):
    """An admin API request that fails with `status`; `message` is the JSON answer's "error"."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(status: int, body: Mapping[str, object] | Sequence[object]) -> Response:
    """A JSON answer (one line)."""
    return status, JSON, json.dumps(body).encode() + b"\n"


def json_object(body: bytes) -> dict[str, object]:
    """A request's body as a JSON object (an empty body is `{}`).

    Raises:
        HttpError: 400, not JSON or not an object.
    """
    try:
        document = json.loads(body or b"{}")
    except ValueError as exc:
        raise HttpError(400, f"body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise HttpError(400, "body must be a JSON object")
    return document


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """An admin API request as its handler sees it: its access is checked already."""

    method: str
    """HEAD is GET here (the server sends the GET's headers without the body)."""
    params: Mapping[str, str]
    """The values of the route's `{name}` and `{node_id}`."""
    query: Mapping[str, list[str]]
    body: bytes
    runtimes: Mapping[str, RouterRuntime]
    """The routers (a reload changes them in place)."""
    services: Mapping[type, object]
    """Each running feature's service, and the kernel's own context, by type."""

    @property
    def runtime(self) -> RouterRuntime:
        """The connection router the path's `{name}` names.

        Raises:
            HttpError: 404, there is none of that name.
        """
        name = self.params["name"]
        runtime = self.runtimes.get(name)
        if runtime is None:
            raise HttpError(404, f"no connection router named {name!r}")
        return runtime

    def one(self, name: str) -> str | None:
        """The query parameter `name`, or None without it.

        Raises:
            HttpError: 400, it is given more than once.
        """
        values = self.query.get(name)
        if values is not None and len(values) != 1:
            raise HttpError(400, f"query parameter {name!r} given {len(values)} times")
        return None if values is None else values[0]

    def optional(self, kind: type[_S]) -> _S | None:
        """The running service (or kernel object) of this type, or None when there is none."""
        found = self.services.get(kind)
        return found if isinstance(found, kind) else None

    def service(self, kind: type[_S]) -> _S:
        """The running service of this type.

        Raises:
            HttpError: 503, it does not run in this process.
        """
        found = self.services.get(kind)
        if not isinstance(found, kind):
            raise HttpError(503, f"{kind.__name__} does not run in this process")
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One admin API resource and method. Every route is described in docs/admin-api.yaml (a test
    checks that the two list the same operations)."""

    method: str
    template: str
    """The path, with `{name}` (a router) and `{node_id}` (a target) where the path holds them."""
    handler: Callable[[Call], Response | Awaitable[Response]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One `routerctl` command."""

    name: str
    help: str
    """One line, in `routerctl --help`."""
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]
    """Adds its own arguments (the admin API's `--admin` and `--json` are added when `admin`)."""
    run: Callable[[argparse.Namespace, Ctl], int]
    """Runs it; its exit status (router/ctl_output.py `ExitCode`), or raises `CtlError`."""
    admin: bool = True
    """Whether it asks a running routerd (`--admin`, `--json`)."""
    epilog: str | None = None
    log_level: int = logging.WARNING
    """What of routerctl's own log it prints on stderr (a long-running command says more)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One routerd command-line option of a feature: `--NAME` (`name` with dashes), its value in
    `Kernel.options[name]`."""

    name: str
    """A Python name: `state_file` is `--state-file`."""
    help: str
    metavar: str | None = None
    """None: a flag (True when given, else False); else the option takes a value (a string)."""
    default: Callable[[Config], str] | None = None
    """routerd's value when the option is not given, from the configuration (None: None)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def value(self, given: str | bool | None, config: Config) -> str | bool | None:
        """What routerd gives the service: `given` (the parsed option), else the default."""
        if self.metavar is None:
            return bool(given)
        if given is None and self.default is not None:
            return self.default(config)
        return given


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    """What a routerd gives each feature's service."""

    runtimes: Mapping[str, RouterRuntime]
    """The routers by name, shared with the server: a reload adds, removes and changes them in place."""
    metrics: Metrics
    stop: Callable[[], None]
    """Starts the graceful shutdown, as SIGTERM does."""
    config: Callable[[], Config]
    """The configuration in force (a reload replaces it)."""
    options: Mapping[str, object] = field(default_factory=dict)
    """The features' routerd options by `Option.name` (routerd gives each; a routerd started in a
    test, only those it sets: `options.get(name)`)."""
    processes: Processes = field(default_factory=Processes)
    """This routerd's processes, and which one this is."""
    peers: Peers = field(default_factory=Peers)
    """Orders from the supervisor to the workers."""


class OpenError(Exception):
    """A service cannot open what it keeps (`Service.open_files`): one line for the operator, which
    routerd says as its `StartupError` (router/acceptors.py) and does not start."""


class Service:
    """A feature's part of one running routerd. Every hook does nothing unless overridden."""

    def open_files(self) -> None:
        """At start, before any listener and before `router_added`: open what the service keeps
        beside routing (its directory, its files, a writer process). Nothing routes yet.

        Raises:
            OpenError: it cannot; routerd does not start (`close_files` is still called).
        """

    async def prepare_router(self, config: RouterConfig) -> None:
        """Before a router joins the process (at start, or when a reload adds it), read what the
        service keeps for it (in a worker thread when that takes a while), changing nothing the
        routers see: `router_added` takes it in. At a reload nothing routes meanwhile on the new
        router, and the old ones go on.

        Raises:
            OpenError: it cannot; routerd does not start, or the reload changes nothing and
                `discard_prepared` is called.
        """

    def discard_prepared(self) -> None:
        """A reload failed after `prepare_router`: close what it opened (nothing else changed)."""

    def router_added(self, runtime: RouterRuntime) -> None:
        """A router joins the process: each one at start (after `open_files`, before any listener)
        and each one a reload adds (before its acceptors serve). Synchronous: nothing routes on it
        meanwhile, so a subscriber added here (`runtime.report`) sees its every event."""

    def router_changed(self, runtime: RouterRuntime) -> None:
        """A reload changed `runtime`'s configuration in place (`runtime.config` is the new one),
        before its tasks are restarted. Synchronous, as `router_added`."""

    def router_removed(self, runtime: RouterRuntime) -> None:
        """A reload removed `runtime` (its tasks are cancelled, its connections closed): let go
        of what the service keeps for it (the last writes may run in `serve`'s nursery)."""

    def process_status(self) -> Mapping[str, object]:
        """The service's members of the process's status document (`GET /api/v1/status`), each a
        JSON value (docs/operations.md describes each)."""
        return {}

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled (the services nursery); `task_status.started()` once it serves."""
        task_status.started()

    async def serve_router(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve one router until cancelled (when it changes or goes); `task_status.started()` once
        it serves."""
        task_status.started()

    async def serve_router_data(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve one router until cancelled when it goes (a change of the router keeps it: what it
        holds, such as the members discovery found, outlives a reload); `task_status.started()`
        once it serves."""
        task_status.started()

    def targets_left(self, runtime: RouterRuntime, departed: Sequence[Departed]) -> list[Departed]:
        """A reload removed these targets from `runtime`, which goes on: take care of their open
        connections; those returned are closed at once by the kernel."""
        return list(departed)

    def stopping(self, grace_s: float) -> None:
        """A graceful shutdown begins: no new connections; the open ones are closed after `grace_s`."""

    async def close_files(self, timeout_s: float) -> None:
        """At exit, after the grace period (and when routerd does not start after all): the last
        writes of what `open_files` opened, beside the other services' and the kernel's files,
        within `timeout_s`; beyond it, leave them with an ERROR naming the file (a hung or frozen
        filesystem must not hold up the exit: router/services/files.py). Nothing to do when nothing
        was opened."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Feature:
    """A feature's declaration (its folder's `FEATURE`)."""

    name: str
    routes: tuple[Route, ...] = ()
    commands: tuple[Command, ...] = ()
    metrics: type[FeatureMetrics] | None = None
    """Its metric families, registered when routerd starts (`Metrics.feature`)."""
    options: tuple[Option, ...] = ()
    """Its routerd command-line options (routerd's `--help` lists them)."""
    start: Callable[[Kernel], Service] | None = None
    """Builds its service for one routerd; None: it runs nothing in routerd."""
    router_blocks: Blocks | None = None
    """Its part of a router's routerctl output (`routerctl status ROUTER`, `wait`), after the
    kernel's tables, from the router's document (where its service's `RouterState.target_sections`
    put its members of each target's)."""
    in_workers: bool = True
    """Whether its service runs in routerd's worker processes too (`Processes`); False: in the
    supervisor only (probes, files, discovery: what must happen once per routerd)."""
