"""The fast path: an epoll thread that carries plain-TCP connections through the same phases as the
trio path (router/datapath/trio_path.py), without trio's per-connection tasks.

For a short connection, trio's per-connection tasks, cancel scopes and checkpoints cost far more
than the work itself. The acceptors `plan.fast_path_serves` allows are served from one thread with a
level-triggered epoll loop:

    accept -> open -> decide -> plan -> answer                       (Refuse, Redirect)
                                     -> connect -> replay -> relay   (Proxy) -> closed
                                     -> hand over                    (HandOver)

`open` reads the opening with `router.core.opening.SniffBuffer` (detection, byte cap, server-first
replies) under the handshake deadline, when `plan.must_sniff` says so; `decide` is
`RouterRuntime.decide_now` (no wait); `plan.plan` and `plan.for_fast_path` say what to do. Relaying
is non-blocking, half-close aware, reads into one shared buffer, and applies backpressure by not
reading a side whose peer has unsent bytes. What needs waiting goes to the trio side as a
`HandOver` (a quorum wait; reading the target's answer to a replayed server-first opening;
resolving a connector's host name), with the connection's reference, its opening and how far its
plan got, so nothing is read, decided or reported twice.

Threads: the runtime's methods take the router's lock (decisions, registration); pool changes this
thread causes (a refused connect makes the member un-ready at once) run in the trio thread through
its token. The trio side closes connections through the live-connection registry: a relayed
connection is its own entry, whose `end` reaches this thread as a request (`_CloseConnection`)
through a queue and a wake-up pipe.
"""

from __future__ import annotations

import _socket  # the C type under socket.socket: see _Socket
import collections
import contextlib
import errno
import heapq
import logging
import os
import select
import socket
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypedDict, Unpack, assert_never, cast

from keys import SniffError
from pools.gates import Verdict
from router.core.address import Address, endpoint
from router.core.engine import QuorumWait, SharedCacheWait
from router.core.events import CloseReason, ConnectFailure, OpeningFailure
from router.core.live import LiveConnection, broker_failure
from router.core.opening import SniffBuffer, opening_failed
from router.core.plan import (
    HandOver,
    Opening,
    Proxy,
    Redirect,
    Refuse,
    decided,
    for_fast_path,
    must_sniff,
    plan,
    routing_facts,
)
from router.datapath.net import ACCEPT_BACKOFF_S, ACCEPT_CAPACITY_ERRNOS, connect_failed

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import ConnectionFacts
    from router.core.engine import RouteDecision
    from router.core.events import ConnectFailed, ConnectionRef
    from router.core.plan import Action as PlannedAction
    from router.datapath.acceptor import ServedAcceptor
    from router.metric_values import Tally
    from router.runtime import RouterRuntime

__all__ = ["Departing", "FastPath", "HandedOver", "Handoff"]

log = logging.getLogger("router.conn")

BUFFER_SIZE: Final = 256 * 1024
"""One read's size (shared by all connections: an idle connection holds no buffer)."""
ACCEPT_BATCH: Final = 64
"""Connections accepted per readiness event of a listener before other sockets get a turn."""
STOP_ACCEPTING_WAIT_S: Final = 1.0
"""How long the trio side waits at shutdown for the thread to close its listening sockets."""
TICK_S: Final = 0.25
"""Longest epoll wait: connect deadlines and the stop request are looked at this often."""

_IN: Final = select.EPOLLIN | select.EPOLLRDHUP
_OUT: Final = select.EPOLLOUT

_Socket: TypeAlias = _socket.socket
"""The sockets of accepted and relayed connections: the C type `socket.socket` extends, with the
same methods (the same system calls) but without the Python-level wrapper around creating,
accepting and closing, which cost about 4,000 instructions per socket (measured with callgrind;
two sockets per connection). A connection handed over to the trio side becomes a `socket.socket`
(`_stdlib`)."""


@dataclass(frozen=True, slots=True, eq=False)
class HandedOver:
    """A connection the fast path passes to the trio side."""

    sock: socket.socket
    conn: ConnectionRef
    """Its reference (reported Accepted already)."""
    opening: Opening
    """What its opening phase read."""
    then: Proxy | Redirect | QuorumWait | SharedCacheWait
    """A Proxy or Redirect to carry out (decided, planned and reported here; its target's gate
    makes it wait), or the quorum to wait for."""
    retry: bool = True
    """Whether a failed connect of the Proxy may still go to another target (False for a
    redispatch, which has had its one retry)."""


@dataclass(frozen=True, slots=True, eq=False)
class Departing:
    """A relayed connection the router moves (`LiveConnection.move`): the trio side finishes it
    with `relay.leave`, reports its end and releases its acceptor slot."""

    client: socket.socket
    upstream: socket.socket
    conn: LiveConnection
    """The connection (its cursor and farewell; registered until the trio side is done)."""
    pending: bytes
    """The broker's bytes read but not yet written to the client."""
    connected_at: float
    """When the connect to the target completed (the Closed's duration counts from it)."""


Handoff: TypeAlias = "Callable[[HandedOver | Departing], None]"
"""Continues a connection on the trio side (`trio_path.resume_connection`, `trio_path.depart`);
called in this thread."""


@dataclass(slots=True, eq=False, weakref_slot=True)
class _Listener:
    sock: socket.socket
    acceptor: ServedAcceptor
    handoff: Handoff
    sniffs: bool
    """Whether the key or the mode needs the opening read (`plan.must_sniff`)."""
    handshake_timeout_s: float
    """0: no deadline."""
    paused: bool = False
    """Not watched for a while after accept() ran out of descriptors (`_pause_accepting`) or its
    `connectionRate` was used up."""
    rate_paused_at: float | None = None
    """When its `connectionRate` paused it (the pause is counted when it is watched again)."""
    lid: int = -1
    """Its number in the native path's C core (router/datapath/native_path.py)."""
    mqtt_lane: bool = False
    """The native path reads its MQTT CONNECTs in plain values (`NativePath.read`)."""
    accept_fd: Callable[[], tuple[int, Any]] = field(init=False)
    """`sock._accept`: (descriptor, address) of a new connection; `socket.socket.accept` is this plus
    the Python-level socket object we do without (`_Socket`)."""
    family: int = field(init=False)
    """The listening socket's address family (the property converts it to an enum on every read)."""

    def __post_init__(self) -> None:
        self.family = int(self.sock.family)
        self.accept_fd = cast("Callable[[], tuple[int, Any]]", self.sock._accept)  # type: ignore[attr-defined]  # not in typeshed

    def backs_off(self, why: str) -> float:
        """accept() ran out of descriptors or memory (`why`): logged; how long to stop watching it,
        as the trio path sleeps (a level-triggered listener would be reported ready again at once)."""
        log.error(
            "acceptor=%s accept failed (%s); retrying in %g s", self.acceptor.name, why, ACCEPT_BACKOFF_S
        )
        return ACCEPT_BACKOFF_S

    def watched_again(self, now: float) -> None:
        """It is watched again: a pause its `connectionRate` caused is counted."""
        if self.rate_paused_at is not None:
            acceptor = self.acceptor
            paused_s = max(0.0, now - self.rate_paused_at)
            acceptor.runtime.metrics.storm.acceptor_paused.inc((acceptor.name,), paused_s)
            self.rate_paused_at = None


@dataclass(slots=True, eq=False, weakref_slot=True)
class _Opening:
    """A client whose opening is being read (sniffed)."""

    sock: _Socket
    fd: int
    listener: _Listener
    conn: ConnectionRef
    buffer: SniffBuffer
    done: bool = False


class Planned(TypedDict):
    """`PlannedConnection`'s arguments, as its subclasses pass them on."""

    acceptor: ServedAcceptor
    conn: ConnectionRef
    opening: Opening
    action: Proxy
    retry: bool
    handoff: Handoff
    request: Callable[[_Request], None]
    started: float


class PlannedConnection(LiveConnection):
    """A proxied connection of either loop (this one's `_Conn`, the native path's `_Relayed`): what
    its plan said, where it goes, and its way back to its loop's thread.

    It is its own entry in the live-connection registry: `end` and `depart` ask the loop's thread
    to close or move it (no closer object per connection, and no reference cycle for the collector
    to find).
    """

    __slots__ = (
        "__weakref__",
        "acceptor",
        "action",
        "connected",
        "connected_at",
        "connector",
        "gated",
        "handoff",
        "opening",
        "request",
        "retry",
        "target",
    )

    def __init__(
        self,
        *,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        opening: Opening,
        action: Proxy,
        retry: bool,
        handoff: Handoff,
        request: Callable[[_Request], None],
        started: float,
    ) -> None:
        target, connector = action.target, action.connector
        super().__init__(
            conn=conn,
            node_id=target.node_id,
            address=endpoint(connector.host, connector.port),
            now=started,
            sniffed=opening.sniffed,
            opening=opening.raw,
            key=action.key,
            mode=acceptor.config.mode,
        )
        self.acceptor = acceptor
        self.opening: Opening | None = opening
        self.action: Proxy | None = action
        """What was planned: a failed connect plans again from it. Both are dropped once connected:
        the connection may wait for its connect deadline a while, and an opening can be as big as
        the acceptor's byte cap."""
        self.retry = retry
        """Whether a failed connect may go to another target (once per connection)."""
        self.handoff = handoff
        """Its listener's way to the trio side (a redispatch to a host-named connector goes there)."""
        self.target = target
        self.connector = connector
        self.request = request
        """Its loop's `_request`, shared by every connection."""
        self.gated = False
        """Whether it holds a slot of its target's gate (given back by `_give_slot_back`)."""
        self.connected = False
        self.connected_at = started
        """When the connect to the target completed; a Closed's duration counts from it."""

    def failed_connect(
        self, why: OSError | CloseReason, now: float, *, retry: bool
    ) -> tuple[ConnectFailed, Proxy | Refuse | None]:
        """Its connect failed (an OSError) or the router closed it meanwhile (a CloseReason): it
        leaves the registry (before a refused connect makes the target un-ready) and its plan is
        dropped (its loop may hold the attempt a while); what it reports, and what follows: another
        target once (`retry`), the client's refusal, or None when it is just closed."""
        runtime = self.acceptor.runtime
        runtime.connections.unregister(self)
        opening, action = self.opening, self.action
        self.opening = self.action = None
        if isinstance(why, CloseReason):
            return self.connect_failed(why), None
        assert opening is not None, "kept until connected"
        assert action is not None, "kept until connected"
        then = runtime.after_connect_failed(self.acceptor.config, opening, action, now, retry=retry)
        return self.connect_failed(connect_failed(why), then), then

    def end(self, reason: CloseReason) -> None:
        """Have the loop's thread close this connection (called from any thread)."""
        self.request(_CloseConnection(self, reason))

    def depart(self, reason: CloseReason) -> None:
        """Have the loop's thread hand this connection to the trio side's `leave` (any thread)."""
        self.request(_MoveConnection(self))


class _Conn(PlannedConnection):
    """One proxied connection of this loop. Side 0 is the client, side 1 the target."""

    __slots__ = ("closed", "eof", "fds", "masks", "pending", "socks")

    def __init__(self, *, socks: tuple[_Socket, _Socket], **planned: Unpack[Planned]) -> None:
        super().__init__(**planned)
        self.socks = socks
        self.fds = (socks[0].fileno(), socks[1].fileno())
        self.closed = False
        self.pending = [b"", b""]
        """Bytes read from side i not yet written to the other side."""
        self.eof = [False, False]
        """Side i sent EOF (and we passed it on once its pending bytes were written)."""
        self.masks = [0, 0]


@dataclass(frozen=True, slots=True)
class _StopAccepting:
    """Close the listening sockets; relays go on."""


@dataclass(frozen=True, slots=True)
class _CloseAll:
    """Close everything and end the thread (the end of a graceful shutdown)."""


@dataclass(frozen=True, slots=True)
class _CloseConnection:
    """The router closes one relayed connection (a closer of the live-connection registry)."""

    conn: LiveConnection
    """The loop's own connection type (`_Conn`, or the native path's)."""
    reason: CloseReason


@dataclass(frozen=True, slots=True)
class _MoveConnection:
    """The router moves one relayed connection (`LiveConnection.move`): to the trio side's `leave`."""

    conn: LiveConnection
    """The loop's own connection type (`_Conn`, or the native path's)."""


@dataclass(frozen=True, slots=True)
class _AddListener:
    """Serve one more listening socket (a configuration reload added or changed an acceptor)."""

    listener: _Listener


@dataclass(frozen=True, slots=True)
class _RemoveListeners:
    """Stop serving an acceptor's listening sockets and close this thread's copies of them."""

    acceptor: str
    done: threading.Event


_Request: TypeAlias = (
    _StopAccepting | _CloseAll | _CloseConnection | _MoveConnection | _AddListener | _RemoveListeners
)


class FastPath:
    """The epoll relay thread of every fast-path acceptor of one routerd."""

    def __init__(
        self, clock: Callable[[], float], call_trio: Callable[..., None], connect_timeout_s: float
    ) -> None:
        """Build the (not yet started) fast path.

        Args:
            clock: the trio clock's `current_time` (the cache and pool use that time base).
            call_trio: runs a function in the trio thread soon (`TrioToken.run_sync_soon`).
            connect_timeout_s: deadline of a connect to a target.
        """
        self._clock = clock
        self._call_trio = call_trio
        self._connect_timeout_s = connect_timeout_s
        self._listeners: dict[int, _Listener] = {}
        self._conns: dict[int, _Conn] = {}
        self._openings: dict[int, _Opening] = {}
        self._deadlines: list[tuple[float, int, weakref.ref[_Conn | _Opening | _Listener]]] = []
        """(when, tie-breaker, what): weak, so a connection that ended meanwhile (with its opening,
        up to sniffMaxBytes) is freed at once rather than when its deadline comes."""
        self._sequence = 0  # ties of the deadline heap
        self._requests: collections.deque[_Request] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._open_loop()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._done = threading.Event()
        self._accepting_stopped = threading.Event()
        self._pipe_lock = threading.Lock()
        self._request_bound = self._request
        """The closers' way in: one bound method for every connection."""

    def _open_loop(self) -> None:
        """Make the loop's epoll set (watching the wake-up pipe) and its read buffer."""
        self._epoll = select.epoll()
        self._buffer = bytearray(BUFFER_SIZE)
        self._view = memoryview(self._buffer)
        self._epoll.register(self._wake_r, select.EPOLLIN)

    def _close_loop(self) -> None:
        self._epoll.close()

    # -- called from the trio thread --

    def add_listener(self, sock: socket.socket, acceptor: ServedAcceptor, handoff: Handoff) -> None:
        """Serve a listening socket; `handoff` continues connections on the trio side. Before
        `start` it is served from the start; afterwards (a configuration reload) the thread takes
        it in with its next wake-up."""
        sock.setblocking(False)
        # Accepted sockets inherit TCP_NODELAY from the listener (Linux): one system call per
        # listener instead of one per connection.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sniffs = must_sniff(acceptor.config, acceptor.runtime.config.key_type)
        timeout_s = acceptor.config.handshake_timeout_ms / 1000
        listener = _Listener(sock, acceptor, handoff, sniffs, timeout_s)
        if self._thread is None:
            self._watch(listener)
        else:
            self._request(_AddListener(listener))

    def remove_listeners(self, acceptor: str, timeout_s: float = STOP_ACCEPTING_WAIT_S) -> None:
        """Stop serving an acceptor's listening sockets and close the copies this path holds
        (a configuration reload removed or changed it); returns once the thread has (or after
        `timeout_s`). Its connections go on."""
        done = threading.Event()
        self._request(_RemoveListeners(acceptor, done))
        if self._thread is not None:
            done.wait(timeout_s)

    @property
    def started(self) -> bool:
        """Whether the relay thread was started."""
        return self._thread is not None

    def start(self) -> None:
        """Start the relay thread."""
        self._thread = threading.Thread(target=self._run, name="fastpath", daemon=True)
        self._thread.start()

    def stop_accepting(self, timeout_s: float = STOP_ACCEPTING_WAIT_S) -> None:
        """Stop accepting: the thread closes the listening sockets, and this returns once it has
        (so a connect after shutdown started is refused), or after `timeout_s`; relays go on."""
        self._request(_StopAccepting())
        if self._thread is not None:
            self._accepting_stopped.wait(timeout_s)

    def close_all(self) -> None:
        """Close every relayed connection and end the thread (the end of a graceful shutdown)."""
        self._request(_CloseAll())

    @property
    def acceptors(self) -> frozenset[str]:
        """The names of the acceptors served (before shutdown closes their listeners)."""
        return frozenset(listener.acceptor.name for listener in self._listeners.values())

    def open_count(self) -> int:
        """Connections relayed now (approximate when read from another thread)."""
        return len(self._conns) // 2

    def pending_by_acceptor(self) -> dict[str, int]:
        """Connections whose opening this thread is reading (no decision yet), by acceptor name;
        counted when asked (from another thread: a snapshot of the moment), nothing per connection.
        A connection it decides at accept is never pending here, and one handed over to wait for
        the quorum counts on the trio side (`ServedAcceptor.pending`)."""
        counts: dict[str, int] = {}
        for opening in list(self._openings.values()):  # list(): one C-level copy under the GIL
            name = opening.listener.acceptor.name
            counts[name] = counts.get(name, 0) + 1
        return counts

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (at once when it never started); whether it did."""
        return self._thread is None or self._done.wait(timeout)

    def _request(self, request: _Request) -> None:
        with self._pipe_lock:
            if self._thread is None:  # never started: nothing relayed, just release the sockets
                if isinstance(request, _CloseAll) and not self._done.is_set():
                    self._close_everything()
                    self._release()
                elif isinstance(request, _RemoveListeners) and not self._done.is_set():
                    self._close_listeners(request.acceptor)
                return
            if self._done.is_set():
                if isinstance(request, _AddListener):
                    request.listener.sock.close()
                return
            self._requests.append(request)
            with contextlib.suppress(BlockingIOError):  # a full pipe: the thread is awake anyway
                os.write(self._wake_w, b"x")

    def _release(self) -> None:
        self._accepting_stopped.set()
        self._close_loop()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._done.set()

    # -- the thread --

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("fast path failed; its connections are closed")
            self._close_everything()
        finally:
            with self._pipe_lock:
                self._release()

    def _loop(self) -> None:
        poll, conns, listeners, openings = self._epoll.poll, self._conns, self._listeners, self._openings
        while not (self._stopping and not conns and not openings):
            for fd, events in poll(TICK_S):
                conn = conns.get(fd)
                try:
                    if conn is not None:
                        self._on_event(conn, fd, events)
                    elif fd in openings:
                        self._open(openings[fd])
                    elif fd in listeners:
                        self._accept(listeners[fd])
                    elif fd == self._wake_r:
                        self._serve_requests()
                except Exception:  # a bug must cost one connection, not all of them
                    log.exception("fast path: unexpected error on descriptor %d; closing its connection", fd)
                    self._discard(fd)
            if self._deadlines:
                self._expire()

    def _discard(self, fd: int) -> None:
        """Close whatever connection uses `fd` after an unexpected error (never raises)."""
        with contextlib.suppress(Exception):
            conn = self._conns.get(fd)
            if conn is not None:
                self._close(conn, CloseReason.INTERNAL_ERROR)
            elif (opening := self._openings.get(fd)) is not None:
                self._drop_opening(opening)

    def _serve_requests(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        while self._requests:
            match self._requests.popleft():
                case _StopAccepting():
                    self._close_listeners()
                    self._stopping = True
                    self._accepting_stopped.set()
                case _CloseAll():
                    self._close_everything()
                    self._stopping = True
                case _CloseConnection(conn=conn, reason=reason):
                    self._close_requested(conn, reason)
                case _MoveConnection(conn=conn):
                    self._move_requested(conn)
                case _AddListener(listener=listener):
                    if self._stopping:  # shutting down: accept nothing new
                        listener.sock.close()
                    else:
                        self._watch(listener)
                case _RemoveListeners(acceptor=acceptor, done=done):
                    self._close_listeners(acceptor)
                    done.set()
                case request:
                    assert_never(request)

    def _close_requested(self, conn: LiveConnection, reason: CloseReason) -> None:
        self._close(cast("_Conn", conn), reason)  # this loop's requests carry its own connections

    def _move_requested(self, conn: LiveConnection) -> None:
        self._depart(cast("_Conn", conn))

    def _watch(self, listener: _Listener) -> None:
        fd = listener.sock.fileno()
        self._listeners[fd] = listener
        self._epoll.register(fd, select.EPOLLIN)

    def _close_listeners(self, acceptor: str | None = None) -> None:
        """Close the listening sockets (of one acceptor, or all)."""
        for fd, listener in list(self._listeners.items()):
            if acceptor is not None and listener.acceptor.name != acceptor:
                continue
            if not listener.paused:
                self._epoll.unregister(fd)
            listener.sock.close()
            del self._listeners[fd]

    def _close_everything(self) -> None:
        self._close_listeners()
        for conn in set(self._conns.values()):
            self._close(conn, CloseReason.SHUTDOWN)
        for opening in list(self._openings.values()):
            self._drop_opening(opening)

    # -- accept, open --

    def _accept(self, listener: _Listener) -> None:
        rate = listener.acceptor.accept_rate
        for _ in range(ACCEPT_BATCH):
            if rate is not None and not rate.take(now := self._clock()):
                # `connectionRate` used up: stop watching the listener until the next token; the
                # kernel's backlog holds the connections meanwhile.
                listener.rate_paused_at = now
                self._pause_listener(listener, rate.ready_at(now))
                return
            try:
                fd, address = listener.accept_fd()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                    self._pause_accepting(listener, exc)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                raise
            client = _Socket(listener.family, socket.SOCK_STREAM, 0, fd)
            peer = Address(address[0], address[1])
            if not listener.acceptor.admit(peer):
                client.close()
                continue
            conn = listener.acceptor.runtime.accept(listener.acceptor.name, peer)
            if not listener.sniffs:
                self._decide(listener, client, conn, Opening(source=peer))
                continue
            client.setblocking(False)
            buffer = SniffBuffer(listener.acceptor.detect, listener.acceptor.config.sniff_max_bytes)
            opening = _Opening(client, client.fileno(), listener, conn, buffer)
            self._openings[opening.fd] = opening
            self._epoll.register(opening.fd, _IN)
            if listener.handshake_timeout_s > 0:
                self._at(self._clock() + listener.handshake_timeout_s, opening)

    def _pause_accepting(self, listener: _Listener, exc: OSError) -> None:
        """Out of descriptors or memory: stop watching the listener a while (`backs_off`)."""
        self._pause_listener(listener, self._clock() + listener.backs_off(str(exc.strerror)))

    def _pause_listener(self, listener: _Listener, until: float) -> None:
        self._epoll.unregister(listener.sock.fileno())
        listener.paused = True
        self._at(until, listener)

    def _resume_accepting(self, listener: _Listener) -> None:
        fd = listener.sock.fileno()
        if listener.paused and self._listeners.get(fd) is listener:  # not closed meanwhile
            listener.paused = False
            self._epoll.register(fd, select.EPOLLIN)
            listener.watched_again(self._clock())

    def _open(self, opening: _Opening) -> None:
        """Read more of a client's opening; decide once its sniffer has the key."""
        listener, buffer = opening.listener, opening.buffer
        try:
            chunk = opening.sock.recv(buffer.read_size)
        except BlockingIOError:
            return
        except OSError:
            self._drop_opening(opening)
            return
        try:
            buffer.feed(chunk)
            result = buffer.step()
            if isinstance(result, bytes):
                if result:
                    self._reply(opening, result)
                buffer.check_cap()
                return
        except SniffError as exc:
            listener.acceptor.runtime.report(opening_failed(opening.conn, exc, bytes_read=len(buffer.raw)))
            if exc.answer:  # what the protocol says before the close (a few bytes, empty buffer)
                with contextlib.suppress(OSError):
                    opening.sock.send(exc.answer)
            self._drop_opening(opening)
            return
        self._forget_opening(opening)
        read = Opening(source=opening.conn.peer, raw=buffer.raw, sniffed=result, replied=buffer.replied)
        self._decide(listener, opening.sock, opening.conn, read)

    def _reply(self, opening: _Opening, said: bytes) -> None:
        """Send the part of a server-first reply the client has not had yet (a few bytes into an
        empty send buffer: a partial send means a client that does not read, which is an error)."""
        try:
            sent = opening.sock.send(said)
        except OSError:
            sent = -1
        if sent != len(said):
            raise SniffError(opening.buffer.protocol, "the client does not read the server-first reply")

    def _opening_timed_out(self, opening: _Opening) -> None:
        listener, buffer = opening.listener, opening.buffer
        failed = opening_failed(
            opening.conn,
            OpeningFailure.TIMEOUT,
            protocol=buffer.protocol,
            bytes_read=len(buffer.raw),
            timeout_s=listener.handshake_timeout_s,
        )
        listener.acceptor.runtime.report(failed)
        self._drop_opening(opening)

    def _forget_opening(self, opening: _Opening) -> None:
        opening.done = True
        del self._openings[opening.fd]
        self._epoll.unregister(opening.fd)

    def _drop_opening(self, opening: _Opening) -> None:
        self._forget_opening(opening)
        self._close_client(opening.sock, opening.listener.acceptor, opening.conn)

    # -- decide, plan, answer --

    def _decide(self, listener: _Listener, client: _Socket, conn: ConnectionRef, opening: Opening) -> None:
        """Decide and plan; carry the action out, or hand it to the trio side.

        The client is handed on (to the trio side, or registered as a relayed connection) or
        closed; when this raises before either, it is closed too (the loop logs the error).
        """
        acceptor = listener.acceptor
        runtime = acceptor.runtime
        now = self._clock()
        try:
            action = planned_action(acceptor, conn, opening, now, self._clock)
            match action:
                case Refuse():
                    self._answer(client, action.answer, acceptor, conn)
                case Redirect():
                    node_id = action.target.node_id
                    if runtime.pool.gates.limited(node_id) and _must_wait(runtime, node_id, slot=False):
                        listener.handoff(HandedOver(_stdlib(client), conn, opening, action))
                    else:
                        self._answer(client, action.answer, acceptor, conn)
                case HandOver(then=then):
                    listener.handoff(HandedOver(_stdlib(client), conn, opening, then))
                case Proxy():
                    self._connect(
                        client, acceptor, conn, opening, action, now, retry=True, handoff=listener.handoff
                    )
                case _:
                    assert_never(action)
        except Exception:
            self._close_client(client, acceptor, conn)
            raise

    def _answer(self, client: _Socket, answer: bytes, acceptor: ServedAcceptor, conn: ConnectionRef) -> None:
        """Send what the router says itself (a few bytes into an empty send buffer) and close."""
        if answer:
            with contextlib.suppress(OSError):  # a client gone already is not an error
                client.send(answer)
        self._close_client(client, acceptor, conn)

    def _close_client(self, client: _Socket, acceptor: ServedAcceptor, conn: ConnectionRef) -> None:
        """Close a client socket this thread still owns and give its admission back. A socket whose
        descriptor went on to a relayed connection (`_forget` closes it) or to the trio side
        (detached) is its new owner's."""
        fd = client.fileno()
        if fd != -1 and fd not in self._conns:
            client.close()
            acceptor.release(conn.peer)

    # -- connect, replay --

    def _connect(
        self,
        client: _Socket,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        opening: Opening,
        action: Proxy,
        now: float,
        *,
        retry: bool,
        handoff: Handoff,
    ) -> None:
        node_id = action.target.node_id
        gated = acceptor.runtime.pool.gates.limited(node_id)
        if gated and _must_wait(acceptor.runtime, node_id, slot=True):  # the trio side waits
            handoff(HandedOver(_stdlib(client), conn, opening, action, retry=retry))
            return
        client.setblocking(False)  # TCP_NODELAY it has from the listener
        connector = action.connector
        family = socket.AF_INET6 if ":" in connector.host else socket.AF_INET
        try:
            upstream = _Socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)  # no ioctl later
        except OSError as exc:  # out of descriptors or memory here: another target would need one too
            if gated:
                acceptor.runtime.pool.gates.release(node_id)  # the slot it took is free again
            self._no_socket(client, acceptor, conn, opening, action, exc)
            return
        relayed = _Conn(
            socks=(client, upstream),
            acceptor=acceptor,
            conn=conn,
            opening=opening,
            action=action,
            retry=retry,
            handoff=handoff,
            request=self._request_bound,
            started=now,
        )
        relayed.gated = gated
        try:
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = upstream.connect_ex((connector.host, connector.port))
            if code not in (0, errno.EINPROGRESS):
                raise OSError(code, os.strerror(code))
        except OSError as exc:
            self._connect_failed(relayed, exc)
            return
        acceptor.runtime.connections.register(relayed)  # counted from here on: unregistered by _close
        self._replay(relayed, opening.raw)
        self._conns[relayed.fds[0]] = relayed
        self._conns[relayed.fds[1]] = relayed
        if code == 0:
            self._connected(relayed)
        else:
            relayed.masks[1] = _OUT
            self._epoll.register(relayed.fds[1], _OUT)
            self._at(now + self._connect_timeout_s, relayed)

    def _replay(self, relayed: _Conn, raw: bytes) -> None:
        """What the client sent first goes to the target first, unchanged, once connected (the
        plan hands server-first openings, whose target answer must be read, to the trio side)."""
        relayed.pending[0] = raw

    def _connected(self, relayed: _Conn) -> None:
        relayed.connected = True
        relayed.counts[0] = len(relayed.pending[0])  # the opening, all pending: the client is not read yet
        relayed.opening = relayed.action = None
        began, relayed.connected_at = relayed.connected_at, self._clock()  # from `started`
        relayed.acceptor.runtime.report(relayed.connected_in(relayed.connected_at - began))
        self._update_masks(relayed)

    def _connect_failed(self, relayed: _Conn, exc: OSError | CloseReason) -> None:
        """The connect failed or timed out (an OSError): on to another target once, else the
        client's refusal; or the router closed the connection meanwhile (a CloseReason): closed."""
        acceptor = relayed.acceptor
        runtime = acceptor.runtime
        opening = relayed.opening
        failed, then = relayed.failed_connect(exc, self._clock(), retry=relayed.retry)
        client = relayed.socks[0]
        try:
            runtime.report(failed)  # before the close: a client that sees it finds it reported
        except BaseException:
            self._forget(relayed)  # the client too (and released)
            raise
        self._forget(relayed, keep_client=then is not None)
        if failed.cause is ConnectFailure.REFUSED:
            self._call_trio(runtime.pool.connect_refused, relayed.target, relayed.connector, failed.reason)
        if then is None:
            return
        assert opening is not None
        try:
            self._after_failed_connect(client, relayed, opening, then)
        except BaseException:
            self._close_client(client, acceptor, relayed.conn)
            raise

    def _after_failed_connect(
        self, client: _Socket, failed: _Conn, opening: Opening, then: Proxy | Refuse
    ) -> None:
        """Carry out what follows a failed connect: the refusal, or the connect to the redispatched
        target (on the trio side when that needs waiting, such as a host name to resolve)."""
        acceptor, conn = failed.acceptor, failed.conn
        if isinstance(then, Refuse):
            self._answer(client, then.answer, acceptor, conn)
            return
        action = for_fast_path(then)
        if isinstance(action, HandOver):
            failed.handoff(HandedOver(_stdlib(client), conn, opening, then, retry=False))
            return
        self._connect(
            client, acceptor, conn, opening, then, self._clock(), retry=False, handoff=failed.handoff
        )

    def _no_socket(
        self,
        client: _Socket,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        opening: Opening,
        action: Proxy,
        exc: OSError,
    ) -> None:
        """socket() for the target failed (this process ran short): the client's refusal."""
        runtime, connector, now = acceptor.runtime, action.connector, self._clock()
        then = runtime.after_connect_failed(acceptor.config, opening, action, now, retry=False)
        # The connection as it would have been registered, for its report only: it never was.
        attempt = LiveConnection(
            conn=conn,
            node_id=action.target.node_id,
            address=endpoint(connector.host, connector.port),
            now=now,
            key=action.key,
        )
        failed = attempt.connect_failed(connect_failed(exc), then)
        try:
            runtime.report(failed)
        finally:
            self._answer(client, then.answer if isinstance(then, Refuse) else b"", acceptor, conn)

    def _at(self, deadline: float, item: _Conn | _Opening | _Listener) -> None:
        self._sequence += 1
        heapq.heappush(self._deadlines, (deadline, self._sequence, weakref.ref(item)))

    def _expire(self) -> None:
        """Handshake deadlines of openings, connect deadlines of relayed connections, listeners to
        watch again after an accept backoff."""
        now = self._clock()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            item = heapq.heappop(deadlines)[2]()
            if item is None:  # ended meanwhile
                continue
            try:
                if isinstance(item, _Opening):
                    if not item.done:
                        self._opening_timed_out(item)
                elif isinstance(item, _Listener):
                    self._resume_accepting(item)
                elif not item.connected and not item.closed:
                    self._connect_failed(item, OSError(errno.ETIMEDOUT, "timed out"))
            except Exception:  # a bug must cost one connection, not all of them
                log.exception("fast path: unexpected error at a deadline; closing its connection")
                with contextlib.suppress(Exception):
                    if isinstance(item, _Opening) and not item.done:
                        self._drop_opening(item)
                    elif isinstance(item, _Conn):
                        self._close(item, CloseReason.INTERNAL_ERROR)

    # -- relay --

    def _set_mask(self, relayed: _Conn, side: int, mask: int) -> None:
        old = relayed.masks[side]
        if old == mask:
            return
        fd = relayed.fds[side]
        if old == 0:
            self._epoll.register(fd, mask)
        elif mask == 0:
            self._epoll.unregister(fd)
        else:
            self._epoll.modify(fd, mask)
        relayed.masks[side] = mask

    def _update_masks(self, relayed: _Conn) -> None:
        """Read a side while it has not sent EOF and its bytes are written; write a side while the
        other side's bytes are pending."""
        pending, eof = relayed.pending, relayed.eof
        for side in (0, 1):
            want = (0 if eof[side] or pending[side] else _IN) | (_OUT if pending[1 - side] else 0)
            if want != relayed.masks[side]:
                self._set_mask(relayed, side, want)

    def _on_event(self, relayed: _Conn, fd: int, events: int) -> None:
        side = 0 if fd == relayed.fds[0] else 1
        if not relayed.connected:
            # A non-blocking connect that failed reports EPOLLERR (and EPOLLHUP); only then is
            # the error worth a system call.
            if events & (select.EPOLLERR | select.EPOLLHUP):
                code = relayed.socks[1].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code != 0:
                    self._connect_failed(relayed, OSError(code, os.strerror(code)))
                    return
            self._connected(relayed)
            return
        if events & _OUT and relayed.pending[1 - side]:
            self._flush(relayed, 1 - side)
            if relayed.closed:
                return
        if not relayed.eof[side]:
            if events & (select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                self._read(relayed, side)
        elif events & (select.EPOLLHUP | select.EPOLLERR):  # gone for good while we still write to it
            self._close(relayed, CloseReason.RESET)

    def _read(self, relayed: _Conn, side: int) -> None:
        """Read what side `side` sent and pass it to the other side."""
        try:
            n = relayed.socks[side].recv_into(self._buffer)
        except BlockingIOError:
            return
        except OSError:
            _broker_ended(relayed, side)
            self._close(relayed, CloseReason.RESET)
            return
        other = 1 - side
        if n == 0:
            _broker_ended(relayed, side)
            relayed.eof[side] = True
            if relayed.eof[other]:  # both ways done (nothing is pending either way): close, which
                self._close(relayed, CloseReason.CLOSED)  # also takes the sockets out of epoll
                return
            self._update_masks(relayed)
            self._pass_eof(relayed, side)  # nothing of this side is pending: we were reading it
            return
        if side and not relayed.counts[1]:  # the broker's first answer (passive health)
            relayed.acceptor.runtime.pool.first_answer(relayed, self._view[:n])
        relayed.counts[side] += n
        if side and relayed.cursor is not None:  # the broker's frames, for moving the client
            relayed.cursor.feed(self._view[:n])
        try:
            sent = relayed.socks[other].send(self._view[:n])
        except BlockingIOError:
            sent = 0
        except OSError:
            _broker_ended(relayed, other)
            self._close(relayed, CloseReason.RESET)
            return
        if sent < n:  # the other side is slow: keep the rest, stop reading this side until written
            relayed.pending[side] = bytes(self._view[sent:n])
            self._update_masks(relayed)

    def _flush(self, relayed: _Conn, side: int) -> None:
        """Write the pending bytes read from `side` to the other side."""
        other, data = 1 - side, relayed.pending[side]
        try:
            sent = relayed.socks[other].send(data)
        except BlockingIOError:
            return
        except OSError:
            _broker_ended(relayed, other)
            self._close(relayed, CloseReason.RESET)
            return
        if sent < len(data):
            relayed.pending[side] = data[sent:]
            return
        relayed.pending[side] = b""
        self._update_masks(relayed)

    def _pass_eof(self, relayed: _Conn, side: int) -> None:
        """Side `side` finished sending (the other has not): half-close towards the other side."""
        try:
            relayed.socks[1 - side].shutdown(socket.SHUT_WR)
        except OSError:
            self._close(relayed, CloseReason.RESET)

    # -- moved --

    def _depart(self, relayed: _Conn) -> None:
        """Hand a moved connection to the trio side's `leave`: its sockets leave the epoll set and
        this thread's tables open; the trio side reports its end and releases its slot. The
        client's bytes not yet written to the broker are dropped with the broker's side."""
        if relayed.closed:
            return
        reason = relayed.closed_by or CloseReason.EVACUATED
        if not relayed.connected:
            self._close(relayed, reason)
            return
        relayed.closed = True
        _give_slot_back(relayed)  # it leaves its target
        for side in (0, 1):
            if relayed.masks[side]:
                self._epoll.unregister(relayed.fds[side])
                relayed.masks[side] = 0
            self._conns.pop(relayed.fds[side], None)
        client, upstream = relayed.socks
        relayed.handoff(
            Departing(
                _stdlib(client),
                _stdlib(upstream),
                relayed,
                relayed.pending[1],
                relayed.connected_at,
            )
        )

    # -- closed --

    def _forget(self, relayed: _Conn, *, keep_client: bool = False) -> None:
        """Close the sockets (the client's too unless `keep_client`: it goes on elsewhere, and
        is not in the epoll set before a connect completed)."""
        if relayed.closed:
            return
        relayed.closed = True
        _give_slot_back(relayed)
        for side in (1,) if keep_client else (0, 1):
            # Closing removes the descriptor from the epoll set (these sockets are never
            # duplicated), so no EPOLL_CTL_DEL first: two system calls fewer per connection.
            relayed.masks[side] = 0
            self._conns.pop(relayed.fds[side], None)
            relayed.socks[side].close()
        if keep_client:
            self._conns.pop(relayed.fds[0], None)
        else:
            relayed.acceptor.release(relayed.conn.peer)

    def _close(self, relayed: _Conn, reason: CloseReason) -> None:
        """End a relayed connection (or one still connecting, which the router closed) and report it."""
        if relayed.closed:
            return
        if not relayed.connected:
            self._connect_failed(relayed, reason)  # the router's own reason first (`closed_by`)
            return
        runtime = relayed.acceptor.runtime
        runtime.connections.unregister(relayed)
        closed = relayed.ended(self._clock() - relayed.connected_at, reason)
        try:
            runtime.report(closed)  # before the close: a client that sees it finds it counted
        finally:
            self._forget(relayed)
        if broker_failure(closed.reason) is not None:  # passive health counts it, in the trio thread
            self._call_trio(runtime.pool.broker_failed, closed)


def planned_action(
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opening: Opening,
    now: float,
    clock: Callable[[], float],
    tally: Tally | None = None,
) -> PlannedAction:
    """Decide and plan a connection as far as it goes without waiting, the decision reported, as
    the fast path carries it out (`plan.for_fast_path`: what needs waiting is a `HandOver`); both
    loops' step (this one's `_decide`, the native path's `_decision`).

    Args:
        now: when the decision starts (the trio clock); `clock` reads it again for its latency.
        tally: where a proxied decision only the metrics read is counted (the loop's own), if any.
    """
    facts = routing_facts(opening)
    decision = acceptor.runtime.decide_now(facts, now)
    if isinstance(decision, (QuorumWait, SharedCacheWait)):
        return for_fast_path(decision)
    return planned_decision(acceptor, conn, opening, decision, now, clock, tally, facts=facts)


def planned_decision(
    acceptor: ServedAcceptor,
    conn: ConnectionRef,
    opening: Opening,
    decision: RouteDecision,
    now: float,
    clock: Callable[[], float],
    tally: Tally | None = None,
    *,
    facts: ConnectionFacts | None = None,
) -> PlannedAction:
    """`planned_action` from a decision taken (the native path's in plain values, `facts` then
    unknown): planned and reported, as the fast path carries it out."""
    runtime = acceptor.runtime
    planned = plan(acceptor.config, runtime.name, opening, decision)
    report = runtime.report
    if isinstance(planned, Proxy) and report.updates is not None and not report.subscribed:
        report.updates.proxied(runtime.name, tally)  # only the metrics read a proxied Decided
    else:
        report(decided(conn, opening, planned, facts=facts, latency_s=clock() - now))
    return for_fast_path(planned)


def _broker_ended(relayed: _Conn, side: int) -> None:
    """Side `side` of a relayed connection ended or broke: when that is the broker's side and it
    has sent nothing yet, passive health hears of it (`RouterPool.first_answer`)."""
    if side and not relayed.counts[1]:
        relayed.acceptor.runtime.pool.first_answer(relayed, b"")


def _must_wait(runtime: RouterRuntime, node_id: str, *, slot: bool) -> bool:
    """Whether the gate of a target that has one (`maxConnections`, `connectRate`) cannot let a
    connection in at once: the fast path cannot wait, so the trio side queues it (or refuses it).
    False: let in (holding a slot when `slot`: given back by `_give_slot_back`)."""
    return runtime.pool.gates.offer(node_id, slot=slot) is not Verdict.ADMIT


def _give_slot_back(relayed: PlannedConnection) -> None:
    """A relayed connection that held a slot of its target's gate closes or leaves: free it (once)."""
    if relayed.gated:
        relayed.gated = False
        relayed.acceptor.runtime.pool.gates.release(relayed.node_id)


def _stdlib(sock: _Socket) -> socket.socket:
    """The same connection as the `socket.socket` trio wraps (it takes the descriptor over)."""
    return socket.socket(sock.family, sock.type, sock.proto, sock.detach())
