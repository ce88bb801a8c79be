"""ZooKeeper for routerd's services: a kazoo client behind async methods (`ZooKeeper`), the
channel its threads post into (`Inbox`), and a session's state as status and metrics show it
(`SessionWatch`). Discovery (router/features/discovery/) and the shared cache
(router/features/shared_cache/service.py) each run one client per router.

kazoo runs its connection and its callbacks in its own threads (its default threading handler).
Those threads never touch trio state: session changes and watch events are posted into a trio
memory channel through `TrioToken.run_sync_soon`, and the blocking kazoo calls run in worker
threads (`trio.to_thread.run_sync`, behind the async methods of `ZooKeeper`). Watches fire once, so
every reading sets them again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar, assert_never

import trio
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError as _KazooBadVersion
from kazoo.exceptions import KazooException
from kazoo.exceptions import NodeExistsError as _KazooNodeExists
from kazoo.exceptions import NoNodeError as _KazooNoNode
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from router.core.discovery_session import (
    Session,
    Signal,
)
from router.core.status import ZooKeeperStatus
from router.core.zookeeper_link import LinkCause, LinkState, LinkStep, ZooKeeperLink

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from router.config.settings import ZooKeeperConfig
    from router.runtime import RouterRuntime

__all__ = [
    "DiscoveryClient",
    "Inbox",
    "NoNodeError",
    "NodeExistsError",
    "Session",
    "SessionWatch",
    "VersionMismatchError",
    "ZooKeeper",
    "ZooKeeperError",
]

log = logging.getLogger("router.discovery")

RECONNECT_MAX_DELAY_S: Final = 1.0
"""Longest pause between two connection attempts (kazoo's default backs off to an hour, which
would leave a router on a stale membership long after ZooKeeper is back)."""

CLOSE_TIMEOUT_S: Final = 5.0
"""Bound of closing a session (and of deleting a registration) at shutdown: ZooKeeper answers in
milliseconds, and an unreachable one must not hold the process."""


class _KazooLogFilter(logging.Filter):
    """kazoo logs every reconnection attempt as a WARNING; we log each session transition once
    ourselves, so its lines below ERROR become DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return _KAZOO_LOG.isEnabledFor(logging.DEBUG)


_KAZOO_LOG: Final = logging.getLogger("router.discovery.kazoo")
_KAZOO_LOG.addFilter(_KazooLogFilter())


class ZooKeeperError(Exception):
    """A ZooKeeper operation failed (connection lost, session expired, timeout, …)."""


class NodeExistsError(ZooKeeperError):
    """The znode to create exists already."""


class NoNodeError(ZooKeeperError):
    """The znode is not there."""


class VersionMismatchError(ZooKeeperError):
    """The znode's version is not the one given (another client changed it meanwhile)."""


_T = TypeVar("_T")


_SESSION_STATES: Final = {
    KazooState.CONNECTED: Session.CONNECTED,
    KazooState.SUSPENDED: Session.SUSPENDED,
    KazooState.LOST: Session.LOST,
}


@contextlib.contextmanager
def _translate(what: str) -> Iterator[None]:
    """kazoo's exceptions -> ours (the one place that knows kazoo's exception classes)."""
    try:
        yield
    except _KazooNodeExists as exc:
        raise NodeExistsError(f"{what}: znode exists") from exc
    except _KazooNoNode as exc:
        raise NoNodeError(f"{what}: no such znode") from exc
    except _KazooBadVersion as exc:
        raise VersionMismatchError(f"{what}: version changed") from exc
    except (KazooException, KazooTimeoutError) as exc:
        raise ZooKeeperError(f"{what}: {type(exc).__name__} {exc}".rstrip()) from exc


class DiscoveryClient(Protocol):
    """What `serve_discovery` needs of a ZooKeeper client: `ZooKeeper`, or a fake in tests.

    Callbacks may be called in other threads (kazoo's); they must not block.
    """

    def on_session(self, callback: Callable[[Session], None]) -> None:
        """Call `callback` on every session state change."""

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` when a watch set by `read_members` fires."""

    def start(self) -> None:
        """Start connecting in the background; never blocks."""

    def heartbeat(self, path: str, callback: Callable[[bool], None]) -> None:
        """Ask ZooKeeper a cheap question about `path`; never blocks (see `ZooKeeper.heartbeat`)."""

    async def read_members(self, path: str) -> dict[str, bytes] | None:
        """Every child of `path` with its data, setting watches (see `ZooKeeper.read_children`)."""

    async def aclose(self) -> None:
        """End the session and stop the client."""


class ZooKeeper:
    """A typed layer over one kazoo client: the calls discovery and registration make.

    Synchronous methods other than `start`, `on_session` and `on_change` block: call them from a
    worker thread, or use their async forms. Callbacks run in kazoo's threads and must not block.
    """

    def __init__(self, connect: str, session_timeout_ms: int) -> None:
        """Make a client; it connects once `start` is called.

        Args:
            connect: the ensemble, `host:port[,host:port…]`.
            session_timeout_ms: the session timeout to ask for (the server clamps it).
        """
        self.connect = connect
        retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=RECONNECT_MAX_DELAY_S)
        self._client = KazooClient(
            hosts=connect, timeout=session_timeout_ms / 1000, connection_retry=retry, logger=_KAZOO_LOG
        )
        self._watch: Callable[[object], None] | None = None
        self._znode_watch: Callable[[object], None] | None = None

    def on_session(self, callback: Callable[[Session], None]) -> None:
        """Call `callback` (in a kazoo thread) on every session state change."""

        def listener(state: str) -> None:
            callback(_SESSION_STATES[state])

        self._client.add_listener(listener)

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` (in a kazoo thread) when a watch set by `read_children` fires."""

        def watch(_event: object) -> None:
            callback()

        # One callable for every watch: kazoo keeps watchers in a set, so reading again does not
        # pile up copies.
        self._watch = watch

    def start(self) -> None:
        """Start connecting in the background (kazoo's threads retry until `close`)."""
        self._client.start_async()

    def heartbeat(self, path: str, callback: Callable[[bool], None]) -> None:
        """Ask whether `path` exists, without blocking; `callback` (in a kazoo thread) gets True
        when ZooKeeper answered (whatever the answer), False when kazoo failed the request (not
        connected, the connection dropped). Nothing calls it while a frozen server holds it."""
        try:
            result = self._client.exists_async(path)
        except (KazooException, KazooTimeoutError):  # kazoo is closed
            callback(False)
            return
        result.rawlink(lambda done: callback(bool(done.successful())))

    @property
    def session_id(self) -> int:
        """The current session's id (0 while not connected)."""
        return self.session[0]

    @property
    def session(self) -> tuple[int, bytes]:
        """The current session's id and password ((0, b"") while not connected); another client
        that connects with them takes the session over."""
        client_id = self._client.client_id
        return (0, b"") if client_id is None else (int(client_id[0]), bytes(client_id[1]))

    def read_children(self, path: str) -> dict[str, bytes] | None:
        """Every child of `path` with its data, setting watches on the path and on each child.

        Returns:
            Child name -> data; None when `path` does not exist (then a watch waits for it).

        Raises:
            ZooKeeperError: the connection or the session failed during the reading.
        """
        with _translate(f"read {path}"):
            try:
                names = self._client.get_children(path, watch=self._watch)
            except _KazooNoNode:
                if self._client.exists(path, watch=self._watch) is None:
                    return None
                names = self._client.get_children(path, watch=self._watch)  # created meanwhile
            documents: dict[str, bytes] = {}
            for name in sorted(names):
                try:
                    data, _stat = self._client.get(f"{path}/{name}", watch=self._watch)
                except _KazooNoNode:
                    continue  # gone since the listing: the parent's watch has fired already
                documents[str(name)] = bytes(data or b"")
            return documents

    async def read_members(self, path: str) -> dict[str, bytes] | None:
        """`read_children` in a worker thread, abandoned if cancelled (kazoo's call ends by itself).

        Raises:
            ZooKeeperError: the connection or the session failed during the reading.
        """
        return await trio.to_thread.run_sync(self.read_children, path, abandon_on_cancel=True)

    def create_ephemeral(self, path: str, data: bytes) -> None:
        """Create an ephemeral znode (and its missing parents, as persistent znodes).

        Raises:
            NodeExistsError: the znode exists.
            ZooKeeperError: anything else failed.
        """
        with _translate(f"create {path}"):
            self._client.create(path, data, ephemeral=True, makepath=True)

    def delete_own(self, path: str) -> bool:
        """Delete `path` if this session owns it (it is our ephemeral znode).

        Returns:
            Whether it was deleted (False when it is gone or owned by another session).

        Raises:
            ZooKeeperError: the connection or the session failed.
        """
        with _translate(f"delete {path}"):
            try:
                _data, stat = self._client.get(path)
                if stat.ephemeralOwner != self.session_id:
                    return False
                self._client.delete(path, version=stat.version)
            except _KazooNoNode:
                return False
        return True

    # -- plain znodes (the shared cache) --

    def on_znode_change(self, callback: Callable[[str], None]) -> None:
        """Call `callback` (in a kazoo thread) with the path when a watch set by `read(watch=True)`
        or `watch_for` fires."""

        def watch(event: object) -> None:
            callback(str(getattr(event, "path", "")))

        # One callable for every watch: kazoo keeps watchers in a set, so setting the same watch
        # again does not pile up copies.
        self._znode_watch = watch

    def read(self, path: str, *, watch: bool = False) -> tuple[bytes, int] | None:
        """A znode's data and version, setting a data watch when `watch` (see `on_znode_change`);
        None when it is not there (then no watch is set: `watch_for` does that).

        Raises:
            ZooKeeperError: the connection or the session failed.
        """
        watcher = self._znode_watch if watch else None
        with _translate(f"read {path}"):
            try:
                data, stat = self._client.get(path, watch=watcher)
            except _KazooNoNode:
                return None
        return bytes(data or b""), int(stat.version)

    def watch_for(self, path: str) -> int | None:
        """Set a watch (see `on_znode_change`) on a znode, whether it is there (then it fires when
        it changes or goes) or not (then when it is created); its data version, None when it is not
        there.

        Raises:
            ZooKeeperError: the connection or the session failed.
        """
        with _translate(f"watch {path}"):
            stat = self._client.exists(path, watch=self._znode_watch)
        return None if stat is None else int(stat.version)

    def create(self, path: str, data: bytes) -> None:
        """Create a persistent znode (and its missing parents).

        Raises:
            NodeExistsError: it exists.
            ZooKeeperError: anything else failed.
        """
        with _translate(f"create {path}"):
            self._client.create(path, data, makepath=True)

    def update(self, path: str, data: bytes, version: int) -> int:
        """Set a znode's data if its version is still `version` (-1: whatever it is); the new version.

        Raises:
            VersionMismatchError: another client changed it since.
            NoNodeError: it is not there.
            ZooKeeperError: anything else failed.
        """
        with _translate(f"update {path}"):
            return int(self._client.set(path, data, version=version).version)

    def delete(self, path: str, version: int = -1) -> bool:
        """Delete a znode if its version is still `version` (-1: whatever it is); False when it
        was not there.

        Raises:
            VersionMismatchError: another client changed it since.
            ZooKeeperError: anything else failed.
        """
        with _translate(f"delete {path}"):
            try:
                self._client.delete(path, version=version)
            except _KazooNoNode:
                return False
        return True

    def children(self, path: str) -> list[str]:
        """The names of a znode's children (none when it is not there).

        Raises:
            ZooKeeperError: the connection or the session failed.
        """
        with _translate(f"list {path}"):
            try:
                return [str(name) for name in self._client.get_children(path)]
            except _KazooNoNode:
                return []

    def close(self) -> None:
        """End the session (its ephemeral znodes go at once) and stop kazoo's threads."""
        self._client.stop()
        self._client.close()

    async def aclose(self) -> None:
        """`close` in a worker thread, abandoned if cancelled (bound it: an unreachable ZooKeeper
        can hold it)."""
        await trio.to_thread.run_sync(self.close, abandon_on_cancel=True)


class Inbox(Generic[_T]):
    """What kazoo's threads report (session changes, watch events), handed to trio tasks: `post`
    is called in a kazoo thread and never blocks; the tasks read `receive`. Make it in the trio
    thread."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._send, self.receive = trio.open_memory_channel[_T](math.inf)

    def post(self, item: _T) -> None:
        """Called in a kazoo thread: queue `item` for the trio side; never blocks."""

        def deliver() -> None:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                self._send.send_nowait(item)  # unbounded: never WouldBlock

        with contextlib.suppress(trio.RunFinishedError):  # the router is stopping
            self._token.run_sync_soon(deliver)

    async def next_batch(self) -> list[_T]:
        """Wait for at least one item; return it with every other item already queued."""
        batch = [await self.receive.receive()]
        while True:
            try:
                batch.append(self.receive.receive_nowait())
            except trio.WouldBlock:
                return batch


@dataclass(frozen=True, slots=True)
class _Heartbeat:
    """A heartbeat's outcome, posted from a kazoo thread."""

    number: int
    ok: bool
    """Whether ZooKeeper answered (False: kazoo failed the request)."""


class SessionWatch:
    """One ZooKeeper session's state as status and metrics show it (`router_zookeeper_state`),
    and as the service using it acts on it: kazoo's session reports and heartbeats, combined by
    router/core/zookeeper_link.py. Register `post` as the client's session listener and run
    `serve`; each change of state reaches `deliver` as a `Session` (CONNECTED, SUSPENDED, LOST)
    once, so a frozen server is followed like a dropped connection."""

    def __init__(
        self,
        runtime: RouterRuntime,
        use: str,
        zookeeper: ZooKeeperConfig,
        client: DiscoveryClient,
        deliver: Callable[[Session], None],
        deliver_watch: Callable[[Signal], None] | None = None,
    ) -> None:
        """Make it in the trio thread.

        Args:
            runtime: the router whose status and metrics show the session.
            use: `discovery` or `shared_cache`.
            zookeeper: the ensemble, path and timeouts.
            client: the client whose session it is (its heartbeats ask about `zookeeper.path`).
            deliver: called in the trio thread with each change of state.
            deliver_watch: called with what `post_watch` was given, in order with the changes of
                state (kazoo fires every watch when the connection drops, right after reporting
                SUSPENDED: that report must come first, or a reading would start and wait for a
                connection that is gone).
        """
        self.runtime, self.use, self.zookeeper, self.client = runtime, use, zookeeper, client
        self.deliver, self.deliver_watch = deliver, deliver_watch
        self.where = f"zookeeper {zookeeper.connect}{zookeeper.path}"
        self._inbox = Inbox[Session | Signal | _Heartbeat]()
        self.link = ZooKeeperLink.start(
            answer_timeout_ms=zookeeper.answer_timeout_ms,
            session_timeout_ms=zookeeper.session_timeout_ms,
            now=trio.current_time(),
        )
        self._show(time.time())

    def post(self, session: Session) -> None:
        """kazoo's session listener (any thread)."""
        self._inbox.post(session)

    def post_watch(self, signal: Signal) -> None:
        """A watch fired (any thread): passed on to `deliver_watch` in order with the reports."""
        self._inbox.post(signal)

    def _answered(self, number: int, ok: bool) -> None:
        """A heartbeat's callback (any thread)."""
        self._inbox.post(_Heartbeat(number, ok))

    async def serve(self) -> None:
        """Ask the heartbeats and follow the session until cancelled; then the session's status
        and metrics go (a router a reload removed, or the process stopping)."""
        try:
            while True:
                now = trio.current_time()
                if self.link.heartbeat_due(now):
                    self.link, number = self.link.ask(now)
                    self.client.heartbeat(self.zookeeper.path, functools.partial(self._answered, number))
                batch: list[Session | Signal | _Heartbeat] = []
                with trio.move_on_at(self.link.wake_at()):
                    batch = await self._inbox.next_batch()
                now = trio.current_time()
                for item in batch:
                    if isinstance(item, Session):
                        self._apply(self.link.report(item, now))
                    elif isinstance(item, Signal):
                        if self.deliver_watch is not None:
                            self.deliver_watch(item)
                    else:
                        self._apply(self.link.answered(item.number, ok=item.ok, now=now))
                self._apply(self.link.tick(now))
        finally:
            self.runtime.held().zookeeper.pop(self.use, None)
            self.runtime.metrics.zookeeper_state.remove_matching((self.runtime.name, self.use))
            self.runtime.metrics.zookeeper_last_change.remove((self.runtime.name, self.use))

    def _apply(self, step: LinkStep) -> None:
        self.link = step.link
        if step.changed is None:
            return
        name, link = self.runtime.name, step.link
        match step.cause:  # a change kazoo reported is logged by the service
            case LinkCause.UNANSWERED:
                log.warning(
                    "router=%s %s (%s) does not answer within %.3g s: counting the session as suspended",
                    name,
                    self.where,
                    self.use,
                    link.answer_timeout_s,
                )
            case LinkCause.NOTHING_HEARD:
                log.warning(
                    "router=%s nothing heard from %s (%s) for the session timeout (%g s): counting the "
                    "session as lost",
                    name,
                    self.where,
                    self.use,
                    link.session_timeout_s,
                )
            case LinkCause.ANSWERS_AGAIN:
                log.info("router=%s %s (%s) answers again", name, self.where, self.use)
            case None:
                pass
            case _:
                assert_never(step.cause)
        self._show(time.time())
        match step.changed:
            case LinkState.CONNECTED:
                self.deliver(Session.CONNECTED)
            case LinkState.SUSPENDED:
                self.deliver(Session.SUSPENDED)
            case LinkState.LOST:
                self.deliver(Session.LOST)
            case LinkState.CONNECTING:  # only at the start, which is no change
                pass
            case _:
                assert_never(step.changed)

    def _show(self, now: float) -> None:
        """The session's status and metrics as of now (`now`: seconds since the epoch)."""
        name, state, metrics = self.runtime.name, self.link.state, self.runtime.metrics
        self.runtime.held().zookeeper[self.use] = ZooKeeperStatus(
            router=name,
            use=self.use,
            connect=self.zookeeper.connect,
            path=self.zookeeper.path,
            state=state,
            since=now,
            session_timeout_ms=self.zookeeper.session_timeout_ms,
            answer_timeout_ms=round(self.link.answer_timeout_s * 1000),  # as in force (capped)
        )
        for each in LinkState:
            metrics.zookeeper_state.set((name, self.use, each.value), 1.0 if each is state else 0.0)
        metrics.zookeeper_last_change.set((name, self.use), now)
