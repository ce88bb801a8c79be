"""The fast path: an epoll thread that opens, routes, redirects and relays plain-TCP connections.

For a short connection, trio's per-connection tasks, cancel scopes and checkpoints cost far more
than the work itself (about 400 µs of CPU per connection, against 45 µs in HAProxy). Acceptors
without TLS termination, PROXY protocol, the router's own authentication, ROLE_NAME keys or a
connection TTL (see `eligible`) are served from one thread with a level-triggered epoll loop:

    accept -> [read the opening until its sans-IO sniffer has the key (same detection, byte cap,
    handshake deadline and server-first replies as router/sniffing.py), when the key or the mode
    needs it] -> decide (RoutingEngine.route, no wait) -> redirect natively and close, or
    non-blocking connect, replay the opening, relay both ways (half-close aware, reads into one
    shared buffer, backpressure by not reading a side whose peer has unsent bytes) -> close,
    count, log.

Whatever needs waiting or more than that goes to the trio side (`handoff`), with what the opening
read so far: a decision that is not OK at once (quorum not reached yet, refused: the refusal is
answered there, in the client's protocol), the local target without connector, and proxying a
server-first opening (AMQP SASL, OpenWire), whose replayed handshake the target answers again.

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
import heapq
import logging
import os
import select
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeAlias

from keys import NEED_MORE, ConnectionFacts, KeyType, Reply, SniffError
from router import answers
from router.engine import RouteStatus
from router.settings import AcceptorMode

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client import Counter, Gauge

    from keys import Sniffed, Sniffer
    from keys.detect import Detector
    from pools import Connector, Target
    from router.routing import RouterRuntime
    from router.settings import AcceptorConfig

    Handoff: TypeAlias = Callable[[socket.socket, str, bytes, Sniffed | None, bytes], None]
    """(client socket, peer "ip:port", bytes read, what they revealed, what we answered): continue
    a connection on the trio side (`router.proxy.resume_connection`); called in the fast-path thread."""

__all__ = ["FastPath", "eligible"]

log = logging.getLogger("router.conn")

BUFFER_SIZE: Final = 256 * 1024
"""One read's size (shared by all connections: an idle connection holds no buffer)."""
_READ_BYTES: Final = 4096
"""Bytes asked per read of an opening (as router/sniffing.py)."""
ACCEPT_BATCH: Final = 64
"""Connections accepted per readiness event of a listener before other sockets get a turn."""
STOP_ACCEPTING_WAIT_S: Final = 1.0
"""How long the trio side waits at shutdown for the thread to close its listening sockets."""
TICK_S: Final = 0.25
"""Longest epoll wait: connect deadlines and the stop request are looked at this often."""

_IN: Final = select.EPOLLIN | select.EPOLLRDHUP
_OUT: Final = select.EPOLLOUT
_GONE: Final = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH)


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
    buf: bytearray = field(default_factory=bytearray)
    replied: bytes = b""
    sniffer: Sniffer | None = None
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


@dataclass(frozen=True, slots=True)
class _Children:
    """The metric children one target's relayed connections update."""

    active: Gauge
    to_target: Counter
    to_client: Counter


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
        self._children: dict[tuple[str, str], _Children] = {}
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
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS):
                    log.error("acceptor=%s accept failed (%s)", listener.acceptor.name, exc.strerror)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                raise
            source_ip = str(address[0])
            peer = f"[{source_ip}]:{address[1]}" if ":" in source_ip else f"{source_ip}:{address[1]}"
            runtime.count_accepted(listener.acceptor.name)
            if not listener.sniffing:
                self._route_guarded(
                    listener, client, peer, ConnectionFacts(source_ip=source_ip), b"", None, b""
                )
                continue
            client.setblocking(False)
            opening = _Opening(client, client.fileno(), listener, peer, source_ip)
            self._openings[opening.fd] = opening
            self._epoll.register(opening.fd, _IN)
            if listener.handshake_timeout_s > 0:
                self._sequence += 1
                deadline = self._clock() + listener.handshake_timeout_s
                heapq.heappush(self._deadlines, (deadline, self._sequence, opening))

    def _read_opening(self, opening: _Opening) -> None:
        """Read more of a client's opening; route once its sniffer has the key (router/sniffing.py)."""
        listener, buf = opening.listener, opening.buf
        name = "detect" if opening.sniffer is None else opening.sniffer.name
        try:
            chunk = opening.sock.recv(min(_READ_BYTES, listener.acceptor.sniff_max_bytes - len(buf)))
        except BlockingIOError:
            return
        except OSError:
            self._drop_opening(opening)
            return
        try:
            if not chunk:
                raise SniffError(
                    name, f"client closed after {len(buf)} bytes, before the handshake was complete"
                )
            buf += chunk
            data = bytes(buf)
            if opening.sniffer is None:
                chosen = listener.detect(data)
                if chosen is None:
                    raise SniffError("detect", f"unknown protocol, connection starts with {data[:16].hex()}")
                if chosen is NEED_MORE:
                    self._check_cap(opening, "detect")
                    return
                opening.sniffer = chosen
            result = opening.sniffer.sniff(data)
            if isinstance(result, Reply):
                self._reply(opening, result)
                self._check_cap(opening, opening.sniffer.name)
                return
            if result is NEED_MORE:
                self._check_cap(opening, opening.sniffer.name)
                return
        except SniffError as exc:
            listener.runtime.metrics.client_errors.labels(listener.acceptor.name, exc.protocol).inc()
            log.warning(
                "peer=%s acceptor=%s protocol=%s handshake rejected: %s",
                opening.peer,
                listener.acceptor.name,
                exc.protocol,
                exc.reason,
            )
            self._drop_opening(opening)
            return
        self._forget_opening(opening)
        facts = ConnectionFacts(
            source_ip=opening.source_ip,
            client_id=result.client_id,
            user_name=result.user_name,
            sni_host=result.sni_host,
        )
        self._route_guarded(listener, opening.sock, opening.peer, facts, data, result, opening.replied)

    def _check_cap(self, opening: _Opening, name: str) -> None:
        cap = opening.listener.acceptor.sniff_max_bytes
        if len(opening.buf) >= cap:
            raise SniffError(name, f"no complete handshake in the first {cap} bytes")

    def _reply(self, opening: _Opening, reply: Reply) -> None:
        """Send the part of a server-first reply the client has not had yet (a few bytes into an
        empty send buffer: a partial send means a client that does not read, which is an error)."""
        assert opening.sniffer is not None
        said = reply.to_client
        if not said.startswith(opening.replied):
            raise SniffError(opening.sniffer.name, "sniffer reply does not extend what was already sent")
        if len(said) > len(opening.replied):
            rest = said[len(opening.replied) :]
            try:
                sent = opening.sock.send(rest)
            except OSError:
                sent = -1
            if sent != len(rest):
                raise SniffError(opening.sniffer.name, "the client does not read the server-first reply")
            opening.replied = said

    def _forget_opening(self, opening: _Opening) -> None:
        opening.done = True
        del self._openings[opening.fd]
        self._epoll.unregister(opening.fd)

    def _drop_opening(self, opening: _Opening) -> None:
        self._forget_opening(opening)
        opening.sock.close()

    def _route_guarded(
        self,
        listener: _Listener,
        client: socket.socket,
        peer: str,
        facts: ConnectionFacts,
        raw: bytes,
        sniffed: Sniffed | None,
        replied: bytes,
    ) -> None:
        """`_route`, closing the client when it raises before the connection was registered."""
        try:
            self._route(listener, client, peer, facts, raw, sniffed, replied)
        except Exception:
            if client.fileno() != -1 and client.fileno() not in self._conns:
                client.close()
            raise

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
        """Decide; redirect or proxy when the decision is OK at once, else continue on the trio side."""
        runtime, acceptor = listener.runtime, listener.acceptor
        with runtime.lock:
            decision = runtime.engine.route(facts, self._clock())
        connector, target = decision.connector, decision.target
        if decision.status is not RouteStatus.OK or connector is None or target is None:
            listener.handoff(client, peer, raw, sniffed, replied)  # quorum wait, refusal, local
            return
        if answers.redirects(acceptor.mode, sniffed) and sniffed is not None:
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "peer=%s router=%s key=%s target=%s outcome=REDIRECT protocol=%s",
                    peer,
                    runtime.name,
                    decision.key,
                    target.node_id,
                    sniffed.protocol,
                )
            runtime.count_decision(RouteStatus.OK)
            said = answers.redirect(sniffed, raw, connector, runtime.name)
            if said is not None:
                with contextlib.suppress(OSError):  # a client gone already is not an error
                    client.send(answers.owed_opening(sniffed, raw, replied) + said)
            client.close()
            return
        if replied:  # a server-first opening: the target's answer to the replay must be filtered
            listener.handoff(client, peer, raw, sniffed, replied)
            return
        runtime.counts.opened(target.node_id)
        runtime.count_decision(RouteStatus.OK)
        self._connect(client, peer, runtime, decision.key, target, connector, raw)

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
        family = socket.AF_INET6 if ":" in connector.host else socket.AF_INET
        try:
            upstream = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            client.close()
            self._connect_failed(runtime, peer, key, target, connector, exc)
            return
        upstream.setblocking(False)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
        code = upstream.connect_ex((connector.host, connector.port))
        if code not in (0, errno.EINPROGRESS):
            client.close()
            upstream.close()
            self._connect_failed(runtime, peer, key, target, connector, OSError(code, os.strerror(code)))
            return
        self._conns[conn.fds[0]] = conn
        self._conns[conn.fds[1]] = conn
        self._metric_children(runtime, target.node_id).active.inc()
        if code == 0:
            self._connected(conn)
        else:
            conn.masks[1] = _OUT
            self._epoll.register(conn.fds[1], _OUT)
            self._sequence += 1
            heapq.heappush(self._deadlines, (self._clock() + self._connect_timeout_s, self._sequence, conn))

    def _connected(self, conn: _Conn) -> None:
        conn.connected = True
        runtime = conn.runtime
        if log.isEnabledFor(logging.INFO):
            log.info(
                "peer=%s router=%s key=%s target=%s outcome=OK",
                conn.peer,
                runtime.name,
                conn.key,
                conn.target.node_id,
            )
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
        runtime.metrics.connect_failures.labels(runtime.name, target.node_id).inc()
        reason = exc.strerror or str(exc)
        log.warning(
            "peer=%s router=%s key=%s target=%s outcome=CONNECT_FAILED reason=%s",
            peer,
            runtime.name,
            key,
            target.node_id,
            reason,
        )
        if exc.errno == errno.ECONNREFUSED:
            self._call_trio(
                runtime.connect_refused, target, connector, f"connect to {connector.url} failed: {reason}"
            )

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
        listener = opening.listener
        listener.runtime.metrics.client_errors.labels(listener.acceptor.name, "timeout").inc()
        log.warning(
            "peer=%s acceptor=%s protocol=%s handshake not complete after %g s (%d bytes)",
            opening.peer,
            listener.acceptor.name,
            "detect" if opening.sniffer is None else opening.sniffer.name,
            listener.handshake_timeout_s,
            len(opening.buf),
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

    def _metric_children(self, runtime: RouterRuntime, node_id: str) -> _Children:
        """The metric children of a target, looked up once (a `labels()` call costs microseconds)."""
        key = (runtime.name, node_id)
        children = self._children.get(key)
        if children is None:
            metrics = runtime.metrics
            children = self._children[key] = _Children(
                active=metrics.active_connections.labels(runtime.name, node_id),
                to_target=metrics.proxied_bytes.labels(runtime.name, "client_to_target"),
                to_client=metrics.proxied_bytes.labels(runtime.name, "target_to_client"),
            )
        return children

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
        runtime = conn.runtime
        self._metric_children(runtime, conn.target.node_id).active.dec()

    def _close(self, conn: _Conn, why: str) -> None:
        if conn.closed:
            return
        self._forget(conn)
        runtime = conn.runtime
        runtime.counts.closed(conn.target.node_id)
        children = self._metric_children(runtime, conn.target.node_id)
        children.to_target.inc(conn.counts[0])
        children.to_client.inc(conn.counts[1])
        if log.isEnabledFor(logging.INFO):
            log.info(
                "peer=%s router=%s target=%s closed bytes_in=%d bytes_out=%d duration_s=%.3f%s",
                conn.peer,
                runtime.name,
                conn.target.node_id,
                conn.counts[0],
                conn.counts[1],
                self._clock() - conn.started,
                "" if why == "closed" else f" reason={why}",
            )
