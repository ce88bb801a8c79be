"""The fast path: an epoll thread that opens, routes, redirects and relays plain-TCP connections.

For a short connection, trio's per-connection tasks, cancel scopes and checkpoints cost far more
than the work itself (about 400 µs of CPU per connection, against 45 µs in HAProxy). Acceptors
without TLS termination, PROXY protocol, the router's own authentication, ROLE_NAME keys or a
connection TTL (see `eligible`) are served from one thread with a level-triggered epoll loop:

    accept -> [read the opening until its sans-IO sniffer has the key (router/sniffing.py's
    `SniffBuffer`, as on the trio side: detection, byte cap, server-first replies; plus the
    handshake deadline), when the key or the mode needs it] -> decide (RoutingEngine.route, no
    wait) -> redirect natively and close, or non-blocking connect, replay the opening, relay both
    ways (half-close aware, reads into one shared buffer, backpressure by not reading a side
    whose peer has unsent bytes) -> close, count and log as the trio side does (`RouterRuntime`'s
    `report_*` methods).

Whatever needs waiting or more than that goes to the trio side (`handoff`), with what the opening
read so far: a decision that is not OK at once (quorum not reached yet, refused: the refusal is
answered there, in the client's protocol), the local target without connector, proxying a
server-first opening (AMQP SASL, OpenWire), whose replayed handshake the target answers again, and
connecting to a connector given by host name (the name lookup would block this thread). An OK
decision is handed over with the connection and not taken again.

Threads: the engine and pool are shared with the trio thread (health checks, admin lookups,
discovery). Every decision here and every change there holds `RouterRuntime.lock`; connection
counts are updated under the same lock. Pool changes caused here (a refused connect makes the
member un-ready at once) are sent to the trio thread with its token. The trio side asks this
thread to close the connections of a target (`close_target`) through a queue and a wake-up pipe.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import heapq
import ipaddress
import logging
import os
import select
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeAlias

from keys import ConnectionFacts, KeyType, SniffError
from router.config.settings import AcceptorMode
from router.core import answers
from router.core.engine import RouteDecision, RouteStatus
from router.core.opening import SniffBuffer
from router.datapath.net import ACCEPT_CAPACITY_ERRNOS, describe_oserror

if TYPE_CHECKING:
    from collections.abc import Callable

    from keys import Sniffed
    from keys.detect import Detector
    from pools import Connector, Target
    from router.config.settings import AcceptorConfig
    from router.runtime import RouterRuntime

    Handoff: TypeAlias = Callable[["HandedOver"], None]
    """(client socket, peer "ip:port", bytes read, what they revealed, what we answered): continue
    a connection on the trio side (`router.proxy.resume_connection`); called in the fast-path thread."""

__all__ = ["FastPath", "eligible"]

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
_GONE: Final = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH)


@functools.lru_cache(maxsize=1024)
def _ip_literal(host: str) -> bool:
    """Whether a connector's host is an IP address (connectable without a name lookup)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def eligible(acceptor: AcceptorConfig, runtime: RouterRuntime, connection_ttl_ms: int) -> bool:
    """Whether an acceptor's connections can take the fast path (see the module docstring).

    `fastPath=false` on the acceptor URL turns it off.
    """
    params = dict(acceptor.params)
    return (
        params.get("fastPath", "true").lower() != "false"
        and runtime.config.key_type is not KeyType.ROLE_NAME
        and acceptor.tls is None
        and not acceptor.proxy_protocol
        and acceptor.send_proxy_protocol is None
        and not acceptor.require_authentication
        and acceptor.users_file is None
        and connection_ttl_ms <= 0
    )


@dataclass(frozen=True, slots=True, eq=False)
class HandedOver:
    """A connection the fast path passes to the trio side, with what its opening and decision gave."""

    sock: socket.socket
    peer: str
    """ "ip:port" of the client."""
    raw: bytes
    """Bytes read from the client, replayed to the target unchanged."""
    sniffed: Sniffed | None
    """What they revealed (None when nothing was read)."""
    replied: bytes
    """What the fast path already answered (server-first openings)."""
    decision: RouteDecision | None
    """The OK decision already taken (not taken again: it moved the round-robin position and the
    cache), or None when the trio side decides (with the quorum wait)."""


@dataclass(slots=True, eq=False)
class _Listener:
    sock: socket.socket
    acceptor: AcceptorConfig
    runtime: RouterRuntime
    handoff: Handoff
    detect: Detector
    sniffing: bool
    """Whether the key or the mode needs the opening read (everything but SOURCE_IP proxying)."""
    handshake_timeout_s: float
    """0: no deadline."""


@dataclass(slots=True, eq=False)
class _Opening:
    """A client whose opening is being read (sniffed)."""

    sock: socket.socket
    fd: int
    listener: _Listener
    peer: str
    source_ip: str
    sniffing: SniffBuffer
    done: bool = False


@dataclass(slots=True, eq=False)
class _Conn:
    """One proxied connection. Side 0 is the client, side 1 the target."""

    socks: tuple[socket.socket, socket.socket]
    fds: tuple[int, int]
    runtime: RouterRuntime
    target: Target
    connector: Connector
    peer: str
    key: str
    connected: bool = False
    pending: list[bytes] = field(default_factory=lambda: [b"", b""])
    """Bytes read from side i not yet written to the other side."""
    eof: list[bool] = field(default_factory=lambda: [False, False])
    """Side i sent EOF (and we passed it on once its pending bytes were written)."""
    counts: list[int] = field(default_factory=lambda: [0, 0])
    """Bytes client->target, target->client."""
    masks: list[int] = field(default_factory=lambda: [0, 0])
    started: float = 0.0
    closed: bool = False


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
        self._epoll = select.epoll()
        self._listeners: dict[int, _Listener] = {}
        self._conns: dict[int, _Conn] = {}
        self._openings: dict[int, _Opening] = {}
        self._deadlines: list[tuple[float, int, _Conn | _Opening]] = []
        self._sequence = 0  # ties of the deadline heap
        self._buffer = bytearray(BUFFER_SIZE)
        self._view = memoryview(self._buffer)
        self._requests: collections.deque[tuple[str, object]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._done = threading.Event()
        self._accepting_stopped = threading.Event()
        self._pipe_lock = threading.Lock()

    # -- called from the trio thread --

    def add_listener(
        self,
        sock: socket.socket,
        acceptor: AcceptorConfig,
        runtime: RouterRuntime,
        handoff: Handoff,
        detect: Detector,
    ) -> None:
        """Serve a listening socket (before `start`); `handoff` continues connections on the trio side."""
        sock.setblocking(False)
        sniffing = acceptor.mode is not AcceptorMode.PROXY or runtime.config.key_type is not KeyType.SOURCE_IP
        timeout_s = acceptor.handshake_timeout_ms / 1000
        self._listeners[sock.fileno()] = _Listener(
            sock, acceptor, runtime, handoff, detect, sniffing, timeout_s
        )
        self._epoll.register(sock.fileno(), select.EPOLLIN)

    def start(self) -> None:
        """Start the relay thread."""
        self._thread = threading.Thread(target=self._run, name="fastpath", daemon=True)
        self._thread.start()

    def stop_accepting(self, timeout_s: float = STOP_ACCEPTING_WAIT_S) -> None:
        """Stop accepting: the thread closes the listening sockets, and this returns once it has
        (so a connect after shutdown started is refused), or after `timeout_s`; relays go on."""
        self._request("stop-accepting", None)
        if self._thread is not None:
            self._accepting_stopped.wait(timeout_s)

    def close_all(self) -> None:
        """Close every relayed connection and end the thread (the end of a graceful shutdown)."""
        self._request("close-all", None)

    def close_target(
        self, runtime: RouterRuntime, node_id: str, address: tuple[str, int] | None, reason: str
    ) -> None:
        """Close the connections of one router to a target (or to its HA-pair member at `address`);
        counted and logged once through `RouterRuntime.report_router_closes` in the trio thread."""
        self._request("close-target", (runtime, node_id, address, reason))

    def open_count(self) -> int:
        """Connections relayed now (approximate when read from another thread)."""
        return len(self._conns) // 2

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (at once when it never started); whether it did."""
        return self._thread is None or self._done.wait(timeout)

    def _request(self, what: str, arg: object) -> None:
        with self._pipe_lock:
            if self._thread is None:  # never started: nothing relayed, just release the sockets
                if what == "close-all" and not self._done.is_set():
                    self._close_everything()
                    self._release()
                return
            if self._done.is_set():
                return
            self._requests.append((what, arg))
            with contextlib.suppress(BlockingIOError):  # a full pipe: the thread is awake anyway
                os.write(self._wake_w, b"x")

    def _release(self) -> None:
        self._accepting_stopped.set()
        self._epoll.close()
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
                        self._read_opening(openings[fd])
                    elif fd in listeners:
                        self._accept(listeners[fd])
                    elif fd == self._wake_r:
                        self._serve_requests()
                except Exception:  # a bug must cost one connection, not all of them
                    log.exception("fast path: unexpected error on descriptor %d; closing its connection", fd)
                    self._discard(fd)
            if self._deadlines:
                self._expire_connects()

    def _discard(self, fd: int) -> None:
        """Close whatever connection uses `fd` after an unexpected error (never raises)."""
        with contextlib.suppress(Exception):
            conn = self._conns.get(fd)
            if conn is not None:
                self._close(conn, "internal error")
            elif (opening := self._openings.get(fd)) is not None:
                self._drop_opening(opening)

    def _serve_requests(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        while self._requests:
            what, arg = self._requests.popleft()
            if what == "stop-accepting":
                for fd, listener in list(self._listeners.items()):
                    self._epoll.unregister(fd)
                    listener.sock.close()
                self._listeners.clear()
                self._stopping = True
                self._accepting_stopped.set()
            elif what == "close-all":
                self._close_everything()
                self._stopping = True
            elif what == "close-target":
                assert isinstance(arg, tuple)
                runtime, node_id, address, reason = arg
                doomed = {
                    c
                    for c in self._conns.values()
                    if c.runtime is runtime
                    and c.target.node_id == node_id
                    and (address is None or (c.connector.host, c.connector.port) == address)
                }
                for conn in doomed:
                    self._close(conn, reason)
                if doomed:
                    self._call_trio(runtime.report_router_closes, node_id, address, reason, len(doomed))

    def _close_everything(self) -> None:
        for fd, listener in list(self._listeners.items()):
            self._epoll.unregister(fd)
            listener.sock.close()
        self._listeners.clear()
        for conn in set(self._conns.values()):
            self._close(conn, "shutdown")
        for opening in list(self._openings.values()):
            self._drop_opening(opening)

    def _accept(self, listener: _Listener) -> None:
        runtime = listener.runtime
        for _ in range(ACCEPT_BATCH):
            try:
                client, address = listener.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                    log.error("acceptor=%s accept failed (%s)", listener.acceptor.name, exc.strerror)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                raise
            source_ip = str(address[0])
            peer = f"[{source_ip}]:{address[1]}" if ":" in source_ip else f"{source_ip}:{address[1]}"
            runtime.count_accepted(listener.acceptor.name)
            if not listener.sniffing:
                self._route(listener, client, peer, ConnectionFacts(source_ip=source_ip), b"", None, b"")
                continue
            client.setblocking(False)
            sniffing = SniffBuffer(listener.detect, listener.acceptor.sniff_max_bytes)
            opening = _Opening(client, client.fileno(), listener, peer, source_ip, sniffing)
            self._openings[opening.fd] = opening
            self._epoll.register(opening.fd, _IN)
            if listener.handshake_timeout_s > 0:
                self._sequence += 1
                deadline = self._clock() + listener.handshake_timeout_s
                heapq.heappush(self._deadlines, (deadline, self._sequence, opening))

    def _read_opening(self, opening: _Opening) -> None:
        """Read more of a client's opening; route once its sniffer has the key (router/sniffing.py)."""
        listener, sniffing = opening.listener, opening.sniffing
        try:
            chunk = opening.sock.recv(sniffing.read_size)
        except BlockingIOError:
            return
        except OSError:
            self._drop_opening(opening)
            return
        try:
            sniffing.feed(chunk)
            result = sniffing.step()
            if isinstance(result, bytes):
                if result:
                    self._reply(opening, result)
                sniffing.check_cap()
                return
        except SniffError as exc:
            listener.runtime.report_opening_rejected(listener.acceptor.name, opening.peer, exc)
            self._drop_opening(opening)
            return
        self._forget_opening(opening)
        facts = ConnectionFacts(
            source_ip=opening.source_ip,
            client_id=result.client_id,
            user_name=result.user_name,
            sni_host=result.sni_host,
        )
        self._route(listener, opening.sock, opening.peer, facts, sniffing.raw, result, sniffing.replied)

    def _reply(self, opening: _Opening, said: bytes) -> None:
        """Send the part of a server-first reply the client has not had yet (a few bytes into an
        empty send buffer: a partial send means a client that does not read, which is an error)."""
        try:
            sent = opening.sock.send(said)
        except OSError:
            sent = -1
        if sent != len(said):
            raise SniffError(opening.sniffing.protocol, "the client does not read the server-first reply")

    def _forget_opening(self, opening: _Opening) -> None:
        opening.done = True
        del self._openings[opening.fd]
        self._epoll.unregister(opening.fd)

    def _drop_opening(self, opening: _Opening) -> None:
        self._forget_opening(opening)
        opening.sock.close()

    def _route(
        self,
        listener: _Listener,
        client: socket.socket,
        peer: str,
        facts: ConnectionFacts,
        raw: bytes,
        sniffed: Sniffed | None,
        replied: bytes,
    ) -> None:
        """Decide; redirect or proxy when the decision is OK at once, else continue on the trio side.

        The client is handed on (to the trio side, or registered as a relayed connection) or
        closed; when this raises before either, it is closed too (the loop logs the error).
        """
        runtime, acceptor = listener.runtime, listener.acceptor
        try:
            with runtime.lock:
                decision = runtime.engine.route(facts, self._clock())
            connector, target = decision.connector, decision.target
            if decision.status is not RouteStatus.OK or connector is None or target is None:
                # Quorum wait and refusal on the trio side; a local decision without connector is
                # refused there too, without deciding again.
                ok = decision if decision.status is RouteStatus.OK else None
                listener.handoff(HandedOver(client, peer, raw, sniffed, replied, ok))
                return
            if answers.redirects(acceptor.mode, sniffed) and sniffed is not None:
                runtime.report_redirect(peer, decision.key, target.node_id, sniffed.protocol)
                said = answers.redirect(sniffed, raw, connector, runtime.name)
                if said:
                    with contextlib.suppress(OSError):  # a client gone already is not an error
                        client.send(answers.owed_opening(sniffed, raw, replied) + said)
                client.close()
                return
            # A server-first opening (the target's answer to the replay must be filtered), or a
            # connector by host name (resolving it would block this thread): the trio side proxies.
            if replied or not _ip_literal(connector.host):
                listener.handoff(HandedOver(client, peer, raw, sniffed, replied, decision))
                return
            runtime.counts.opened(target.node_id)
            runtime.count_decision(RouteStatus.OK)
            self._connect(client, peer, runtime, decision.key, target, connector, raw)
        except Exception:
            if client.fileno() != -1 and client.fileno() not in self._conns:
                client.close()
            raise

    def _connect(
        self,
        client: socket.socket,
        peer: str,
        runtime: RouterRuntime,
        key: str,
        target: Target,
        connector: Connector,
        replay: bytes,
    ) -> None:
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        family = socket.AF_INET6 if ":" in connector.host else socket.AF_INET
        upstream: socket.socket | None = None
        try:
            upstream = socket.socket(family, socket.SOCK_STREAM)
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = upstream.connect_ex((connector.host, connector.port))
            if code not in (0, errno.EINPROGRESS):
                raise OSError(code, os.strerror(code))
        except OSError as exc:
            client.close()
            if upstream is not None:
                upstream.close()
            self._connect_failed(runtime, peer, key, target, connector, exc)
            return
        conn = _Conn(
            socks=(client, upstream),
            fds=(client.fileno(), upstream.fileno()),
            runtime=runtime,
            target=target,
            connector=connector,
            peer=peer,
            key=key,
            started=self._clock(),
        )
        conn.pending[0] = replay  # the opening read from the client goes first, unchanged
        conn.counts[0] = len(replay)
        self._conns[conn.fds[0]] = conn
        self._conns[conn.fds[1]] = conn
        runtime.relay_metrics(target.node_id).active.inc()
        if code == 0:
            self._connected(conn)
        else:
            conn.masks[1] = _OUT
            self._epoll.register(conn.fds[1], _OUT)
            self._sequence += 1
            heapq.heappush(self._deadlines, (self._clock() + self._connect_timeout_s, self._sequence, conn))

    def _connected(self, conn: _Conn) -> None:
        conn.connected = True
        conn.runtime.report_connected(conn.peer, conn.key, conn.target.node_id)
        self._update_masks(conn)

    def _connect_failed(
        self,
        runtime: RouterRuntime,
        peer: str,
        key: str,
        target: Target,
        connector: Connector,
        exc: OSError,
    ) -> None:
        runtime.counts.closed(target.node_id)
        reason = describe_oserror(exc)
        runtime.report_connect_failure(peer, key, target.node_id, reason)
        if exc.errno == errno.ECONNREFUSED:
            self._call_trio(runtime.connect_refused, target, connector, reason)

    def _expire_connects(self) -> None:
        now = self._clock()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, item = heapq.heappop(deadlines)
            if isinstance(item, _Opening):
                if not item.done:
                    self._opening_timed_out(item)
            elif not item.connected and not item.closed:
                self._abort_connect(item, OSError(errno.ETIMEDOUT, "timed out"))

    def _opening_timed_out(self, opening: _Opening) -> None:
        listener, sniffing = opening.listener, opening.sniffing
        listener.runtime.report_opening_timeout(
            listener.acceptor.name,
            opening.peer,
            sniffing.protocol,
            listener.handshake_timeout_s,
            len(sniffing.raw),
        )
        self._drop_opening(opening)

    def _abort_connect(self, conn: _Conn, exc: OSError) -> None:
        self._forget(conn)
        self._connect_failed(conn.runtime, conn.peer, conn.key, conn.target, conn.connector, exc)

    def _set_mask(self, conn: _Conn, side: int, mask: int) -> None:
        old = conn.masks[side]
        if old == mask:
            return
        fd = conn.fds[side]
        if old == 0:
            self._epoll.register(fd, mask)
        elif mask == 0:
            self._epoll.unregister(fd)
        else:
            self._epoll.modify(fd, mask)
        conn.masks[side] = mask

    def _update_masks(self, conn: _Conn) -> None:
        """Read a side while it has not sent EOF and its bytes are written; write a side while the
        other side's bytes are pending."""
        pending, eof = conn.pending, conn.eof
        for side in (0, 1):
            want = (0 if eof[side] or pending[side] else _IN) | (_OUT if pending[1 - side] else 0)
            if want != conn.masks[side]:
                self._set_mask(conn, side, want)

    def _on_event(self, conn: _Conn, fd: int, events: int) -> None:
        side = 0 if fd == conn.fds[0] else 1
        if not conn.connected:
            code = conn.socks[1].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code != 0:
                self._abort_connect(conn, OSError(code, os.strerror(code)))
                return
            self._connected(conn)
            return
        if events & _OUT and conn.pending[1 - side]:
            self._flush(conn, 1 - side)
            if conn.closed:
                return
        if not conn.eof[side]:
            if events & (select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                self._read(conn, side)
        elif events & (select.EPOLLHUP | select.EPOLLERR):  # gone for good while we still write to it
            self._close(conn, "reset")

    def _read(self, conn: _Conn, side: int) -> None:
        """Read what side `side` sent and pass it to the other side."""
        try:
            n = conn.socks[side].recv_into(self._buffer)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(conn, "reset" if exc.errno in _GONE else f"error {exc.strerror}")
            return
        other = 1 - side
        if n == 0:
            conn.eof[side] = True
            self._update_masks(conn)
            self._pass_eof(conn, side)  # nothing of this side is pending: we were reading it
            return
        conn.counts[side] += n
        try:
            sent = conn.socks[other].send(self._view[:n])
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._close(conn, "reset" if exc.errno in _GONE else f"error {exc.strerror}")
            return
        if sent < n:  # the other side is slow: keep the rest, stop reading this side until written
            conn.pending[side] = bytes(self._view[sent:n])
            self._update_masks(conn)

    def _flush(self, conn: _Conn, side: int) -> None:
        """Write the pending bytes read from `side` to the other side."""
        other, data = 1 - side, conn.pending[side]
        try:
            sent = conn.socks[other].send(data)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(conn, "reset" if exc.errno in _GONE else f"error {exc.strerror}")
            return
        if sent < len(data):
            conn.pending[side] = data[sent:]
            return
        conn.pending[side] = b""
        self._update_masks(conn)

    def _pass_eof(self, conn: _Conn, side: int) -> None:
        """Side `side` finished sending: half-close towards the other side; close when both did."""
        if conn.eof[1 - side]:  # the other way is done too: closing sends the FIN
            self._close(conn, "closed")
            return
        try:
            conn.socks[1 - side].shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn, "reset")

    def _forget(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        for side in (0, 1):
            if conn.masks[side]:
                self._epoll.unregister(conn.fds[side])
                conn.masks[side] = 0
            self._conns.pop(conn.fds[side], None)
            conn.socks[side].close()
        conn.runtime.relay_metrics(conn.target.node_id).active.dec()

    def _close(self, conn: _Conn, why: str) -> None:
        if conn.closed:
            return
        self._forget(conn)
        runtime, node_id = conn.runtime, conn.target.node_id
        runtime.counts.closed(node_id)
        duration_s = self._clock() - conn.started
        runtime.report_closed(conn.peer, node_id, conn.counts, duration_s, None if why == "closed" else why)
