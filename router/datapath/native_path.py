"""The native data path: the fast path's phases with its sockets carried by a C core.

`router.datapath._core` (an optional C extension, router/datapath/_core.c) owns what the fast path
(router/datapath/fast_path.py) does with sockets in Python: listeners, `accept4`, the opening
reads, non-blocking connects, the edge-triggered relay with backpressure and half-close, the
handshake and connect deadlines, the close. It decides nothing: at each step that needs a
decision it calls this module's `NativePath` with plain values (a listener, a descriptor, the
bytes read) and carries out the action returned, a plain tuple:

    accepted / read / timed_out  -> keep reading (ACT_WAIT), answer and close (ACT_CLOSE),
    connect_failed                  connect to a target (ACT_PROXY), or hand over (ACT_HANDOVER)

Everything between, the decision, the plan, the reports, the registry of live connections, the
gates, passive health and the frame cursors of moves, is the fast path's own code and objects:
the same rules, now called once per step by the core. `NativePath` extends `FastPath` for its
requests (closes and moves from the trio side, listeners added and removed by reloads, shutdown),
served in the core's thread when the wake pipe is readable. The Python fast path stays as the
fallback when the extension is not built, and as the reference both are tested against.

**Lean connections.** routerd's own (`lean=` the process's metrics) hands the core the connections
that need nothing of Python once decided: an opening not read, a TLS hello passed through or an
MQTT CONNECT (its broker's packets followed in C), no gate slot, the first attempt, a policy that
does not read connection counts at each pick, and no subscriber to its router's events besides the
log lines and the metrics. The core then connects, relays and closes them with
no call back: it counts them per target (`lean_counts`, folded into the metrics when they are
scraped: open connections, connect times, bytes), writes their two INFO lines through the C line
buffer (router/_conn_lines.c), tells a broker's silent early close itself (passive health hears of
it), and gives their admission back once per turn of its loop. Nothing of them is in the
registry of live connections until it is read: its reads (`LiveConnections.sync`) first make the
router's lean connections ordinary `_Relayed` ones (`materialized`), and so does a close the
router asks for, so every feature that finds, counts, closes or moves connections sees them as
before. A redispatch after a failed connect, a first answer of a target with failures in a row,
and the close of a lean connection the broker ended early come back to Python as before.

**Decisions in plain values.** A connection that may be lean (one known by its source address, or
an MQTT CONNECT) is decided by `RoutingEngine.plain` (`begin`'s decision when it is a target from
the cache or the policy, with the same changes to cache and policy; tested against `begin`) and
counted into the loop's tally cells (folded into the metrics at scrape): no `ConnectionRef`,
`Opening`, `RouteDecision` or `Proxy` is made for it until it is materialized, when `_planned`
makes them as the whole workflow would have. An acceptor whose first byte 0x10 can only be MQTT's
is an MQTT lane: a CONNECT that arrives whole in the first read is parsed in C (keys/_native.c,
the sniffer's own parser) and decided so too, without a `SniffBuffer`, `Sniffed` or `Opening`.
Everything else (another key type, a refusal, a wait, a redirect, a connection that cannot be
lean after all) goes the whole workflow's way, from the decision taken when there is one.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, Unpack, assert_never, cast

from keys import SniffError
from keys.detect import SNIFFERS
from keys.native import EXTENSION as _KEYS_NATIVE
from keys.native import MqttConnect, mqtt_sniffed
from keys.sniff import WireProtocol
from router import conn_lines
from router.config.settings import AcceptorMode
from router.core import answers
from router.core.address import Address
from router.core.engine import DecisionReason, RouteDecision, RouteStatus
from router.core.events import (
    CONNECTION_IDS,
    Closed,
    CloseReason,
    ConnectFailure,
    ConnectionRef,
    OpeningFailure,
)
from router.core.framing import MqttFrames
from router.core.live import BROKER_EARLY_CLOSE_S, LiveConnection, LiveConnections, broker_failure
from router.core.opening import READ_BYTES, SniffBuffer, opening_failed
from router.core.plan import (
    HandOver,
    Opening,
    Proxy,
    Redirect,
    Refuse,
    for_fast_path,
    is_ip_literal,
    plan,
)
from router.datapath.fast_path import (
    BUFFER_SIZE,
    Departing,
    FastPath,
    HandedOver,
    Planned,
    PlannedConnection,
    _give_slot_back,
    _Listener,
    _must_wait,
    planned_action,
    planned_decision,
)
from router.metric_values import Tally

try:
    from router.datapath import _core  # type: ignore[attr-defined]  # the C extension has no stubs
except ImportError:  # built without a C compiler: the Python fast path serves
    _core = None

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from pools import Connector, Target
    from router.datapath.acceptor import ServedAcceptor
    from router.datapath.fast_path import Handoff
    from router.metrics import Metrics
    from router.runtime import RouterRuntime
    from router.runtime.connections import RouterConnections
    from router.runtime.gates import RouterGates

__all__ = ["EXTENSION", "NATIVE", "NativePath"]

log = logging.getLogger("router.conn")

NATIVE: Final = _core is not None
"""Whether the C core is built (without it the Python fast path serves the same acceptors)."""
EXTENSION: Final[ModuleType | None] = _core
"""`router.datapath._core`, or None when it is not built (its tests reach its helpers here)."""

_MQTT_CONNECT: Final[Callable[[bytes], object] | None] = (
    None if _KEYS_NATIVE is None else _KEYS_NATIVE.mqtt_connect
)
"""keys/_native.c's CONNECT parser, for the MQTT lanes (`NativePath.read`); None without it."""
_MQTT: Final = SNIFFERS["MQTT"]

Action: TypeAlias = "tuple[Any, ...] | None"
"""What the core carries out next for one connection (router/datapath/_core.c's actions)."""


class Core(Protocol):
    """`_core.Core` as this module uses it (router/datapath/_core.c documents each method)."""

    @property
    def proxied(self) -> int: ...
    @property
    def spliced(self) -> int: ...
    def watch_listener(
        self, fd: int, token: _Listener, sniffs: bool, rated: bool, handshake_s: float
    ) -> int: ...
    def unwatch_listener(self, lid: int) -> bool: ...
    def watch_wake(self, fd: int) -> None: ...
    def close(self, cid: int, reason: CloseReason) -> bool: ...
    def detach(self, cid: int) -> tuple[int, int, bytes] | None: ...
    def counts(self, cid: int) -> tuple[int, int]: ...
    def stop_accepting(self) -> None: ...
    def close_all(self, reason: CloseReason) -> None: ...
    def openings(self) -> list[_Reading]: ...
    def materialize(self, router: int) -> list[_Relayed]: ...
    def lean_counts(self) -> list[tuple[int, tuple[int, ...], float, int, int]]: ...
    def set_lines(
        self,
        connected: Callable[..., bool] | None,
        closed: Callable[..., bool] | None,
        flush: Callable[[], None] | None,
    ) -> None: ...
    def set_buckets(self, bounds: tuple[float, ...]) -> None: ...
    def run(self) -> None: ...
    def dispose(self) -> None: ...


_PROXY_MODE: Final = AcceptorMode.PROXY
_MQTT_PROTOCOL: Final = WireProtocol.MQTT
"""Enum members `_plain` compares with, looked up once (router/core/engine.py `_BY_CACHE` says why)."""

if _core is not None:
    _WAIT: Final = _core.ACT_WAIT
    _CLOSE: Final = _core.ACT_CLOSE
    _PROXY: Final = _core.ACT_PROXY
    _HANDED: Final = (_core.ACT_HANDOVER,)
    _SILENT: Final = (_core.ACT_CLOSE, b"")
    _F_FIRST: Final = _core.F_FIRST
    _F_FEED: Final = _core.F_FEED
    _F_LEAN: Final[int] = _core.F_LEAN
    _F_MQTT: Final[int] = _core.F_MQTT
    _M_READ: Final = _core.M_READ
    _M_CLOSING: Final = _core.M_CLOSING
    _M_ANSWER: Final = _core.M_ANSWER

_LeanMemo: TypeAlias = "tuple[RouterConnections, list[int], list[int], int, int, ServedAcceptor, RouterGates]"
"""`NativePath._remember`'s: (registry, accepted cell, proxied cell, router index, target index,
the acceptor it is for, the router's gates)."""
_LEAN_MEMO_MAX: Final = 4096
"""(acceptor, target) pairs `NativePath._remember` keeps at most (then it starts again)."""

Lean: TypeAlias = (
    "tuple[str, int, str, str, str, int, int, ServedAcceptor, ConnectionRef | None, "
    "Opening | tuple[bytes, MqttConnect] | None, "
    "Proxy | tuple[Target, Connector, DecisionReason], float, Handoff, int, int]"
)
"""A lean connection's token: what the core reads (host, port, router, key, node id: its lines;
the target's and the router's indexes: its counters), then what `materialized` makes a
`_Relayed` of (acceptor, connection, opening, plan, decision time, hand-off, cid, descriptor).
One decided in plain values (`NativePath._plain`) has its decision's target, connector and reason
for a plan, and may have no connection and no opening yet (an MQTT lane's: its CONNECT's bytes and
their parse): `_planned` makes them when needed."""
_HOST: Final = 0
_NODE: Final = 4
_ACCEPTOR: Final = 7
_CONN: Final = 8
"""Positions in a `Lean` this module reads (and 13, 14: its cid and descriptor)."""


class _Reading:
    """A client whose opening the core is reading (sniffed); the token of its connection. On an
    MQTT lane (`NativePath.read`) it has no connection reference and no buffer until it leaves the
    lane (`NativePath._off_lane`)."""

    __slots__ = ("buffer", "cid", "conn", "fd", "host", "listener", "port")

    def __init__(
        self,
        listener: _Listener,
        cid: int,
        fd: int,
        conn: ConnectionRef | None,
        buffer: SniffBuffer | None,
        host: str = "",
        port: int = 0,
    ) -> None:
        self.listener = listener
        self.cid = cid
        self.fd = fd
        self.conn = conn
        self.buffer = buffer
        self.host = host
        self.port = port


class _Relayed(PlannedConnection):
    """One connection the core connects and relays: its token, and its entry in the registry of
    live connections. Its byte counts are the core's while it relays, its own once it left the
    core."""

    __slots__ = ("_core", "_counts", "cid", "fd")

    def __init__(self, *, core: Core, cid: int, fd: int, **planned: Unpack[Planned]) -> None:
        self._core = core
        self._counts: list[int] | None = None
        super().__init__(**planned)
        self.cid = cid
        self.fd = fd
        """The client's descriptor (a redispatch that needs waiting hands it to the trio side)."""

    @property  # LiveConnection's slot, read through the core
    def counts(self) -> list[int]:
        if self._counts is not None:
            return self._counts
        return list(self._core.counts(self.cid))

    @counts.setter
    def counts(self, value: list[int]) -> None:  # LiveConnection.__init__'s [0, 0]: the core counts
        pass

    def left_core(self, counts: list[int]) -> None:
        """The core no longer carries it (moved to the trio side): its counts are its own now."""
        self._counts = counts


def _stdlib(fd: int) -> socket.socket:
    """A descriptor the core hands over, as the `socket.socket` the trio side takes."""
    return socket.socket(fileno=fd)


class _LeanTarget:
    """What the metrics have of one target's lean connections (`NativePath._fold`)."""

    __slots__ = ("bytes", "hist", "labels", "metrics", "open", "router", "sum")

    def __init__(self, router: int, labels: tuple[str, str], metrics: Metrics) -> None:
        self.router = router
        """Its router's index (`NativePath._routers`)."""
        self.labels = labels
        self.metrics = metrics
        self.open = 0
        self.hist: tuple[int, ...] = ()
        self.sum = 0.0
        self.bytes = (0, 0)
        """The bytes of its ended lean connections its registry counts (`NativePath._sync`)."""


class NativePath(FastPath):
    """The C core's loop in one thread, with the fast path's decisions and bookkeeping.

    Its methods named after the core's callbacks (`accepted`, `read`, ...) run in that thread.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        call_trio: Callable[..., None],
        connect_timeout_s: float,
        *,
        lean: Metrics | None = None,
    ) -> None:
        """Args (see `FastPath`):
        lean: the process's metrics, when the core may carry lean connections (see the module
            docstring); their counts are folded into these when they are scraped.
        """
        self._lean_metrics = lean
        self._targets: list[_LeanTarget] = []
        """Lean connections' counters by target index (the core's)."""
        self._lean_ix: dict[tuple[str, str], tuple[RouterConnections, int, int]] = {}
        """(router name, node id) -> (its registry, router index, target index): one lookup per lean
        connection. A router the configuration made again (a new registry) gets new indexes; the
        one before is dropped, with its registry."""
        self._lean_memo: dict[tuple[str, str], _LeanMemo] = {}
        """(acceptor name, node id) -> `_remember`'s answer (for that acceptor object)."""
        self._literals: dict[str, bool] = {}
        """Connector host -> whether it is an IP literal (a lean connection connects without a name
        lookup only to one): the configuration's hosts, looked up once each."""
        self._routers: dict[str, tuple[RouterConnections, int]] = {}
        """Router name -> its registry and index: its lean connections are materialized together."""
        self._router_count = 0
        self._tally = None if lean is None else Tally()
        """Accepted and proxied connections, counted in the loop's thread without a lock (folded
        into the metrics when they are scraped), when lean connections are carried."""
        self._cells: dict[str, tuple[str, list[int], list[int]]] = {}
        """Acceptor name -> its router's name, and the tally's cells of its accepted connections and
        of its router's proxied decisions (`_counted`)."""
        super().__init__(clock, call_trio, connect_timeout_s)

    def _open_loop(self) -> None:
        assert _core is not None, "NativePath needs router.datapath._core (NATIVE)"
        self._core: Core = _core.Core(
            self,
            self._connect_timeout_s,
            CloseReason.CLOSED,
            CloseReason.RESET,
            BUFFER_SIZE,
            CloseReason.BROKER_CLOSED_EARLY,
            BROKER_EARLY_CLOSE_S,
        )
        self._core.watch_wake(self._wake_r)
        writers = None if self._lean_metrics is None else conn_lines.line_writers()
        self._lean = writers is not None
        """Whether lean connections are carried (the INFO lines, when on, go through the C buffer)."""
        if writers is not None and self._lean_metrics is not None:
            self._core.set_lines(*writers)
            self._core.set_buckets(self._lean_metrics.connect_duration.bounds)
            self._lean_metrics.sample_when_scraped(self._fold)
            if self._tally is not None:
                self._lean_metrics.sample_when_scraped(self._tally.fold)

    def _close_loop(self) -> None:
        self._core.dispose()

    # -- FastPath's requests, on the core --

    def _loop(self) -> None:
        self._core.run()

    def _watch(self, listener: _Listener) -> None:
        listener.mqtt_lane = (
            self._lean
            and listener.sniffs
            and _MQTT_CONNECT is not None
            and listener.acceptor.detect(b"\x10") is _MQTT
        )
        rated = listener.acceptor.accept_rate is not None
        listener.lid = self._core.watch_listener(
            listener.sock.fileno(), listener, listener.sniffs, rated, listener.handshake_timeout_s
        )
        self._listeners[listener.lid] = listener

    def _close_listeners(self, acceptor: str | None = None) -> None:
        for lid, listener in list(self._listeners.items()):
            if acceptor is not None and listener.acceptor.name != acceptor:
                continue
            self._core.unwatch_listener(lid)
            listener.sock.close()
            del self._listeners[lid]
        if acceptor is None:
            self._core.stop_accepting()

    def _close_everything(self) -> None:
        self._close_listeners()
        self._core.close_all(CloseReason.SHUTDOWN)

    def _close_requested(self, conn: LiveConnection, reason: CloseReason) -> None:
        self._core.close(cast("_Relayed", conn).cid, reason)

    def _move_requested(self, conn: LiveConnection) -> None:
        """Hand a moved connection to the trio side's `leave` (see `FastPath._depart`)."""
        relayed = cast("_Relayed", conn)
        if not relayed.connected:
            self._core.close(relayed.cid, relayed.closed_by or CloseReason.EVACUATED)
            return
        counts = list(self._core.counts(relayed.cid))
        handed = self._core.detach(relayed.cid)
        if handed is None:  # ended meanwhile
            return
        client, upstream, pending = handed
        relayed.left_core(counts)
        _give_slot_back(relayed)  # it leaves its target
        relayed.handoff(Departing(_stdlib(client), _stdlib(upstream), relayed, pending, relayed.connected_at))

    def open_count(self) -> int:
        """Connections connecting or relayed now."""
        return int(self._core.proxied)

    def spliced_bytes(self) -> int:
        """Bytes relayed through pipes (`splice(2)`, zero copy) so far: each way of a connection
        goes through one once it has carried 64 KiB (`SPLICE_AFTER` in _core.c)."""
        return int(self._core.spliced)

    def pending_by_acceptor(self) -> dict[str, int]:
        """Connections whose opening the core is reading, by acceptor name (see `FastPath`)."""
        counts: dict[str, int] = {}
        for reading in self._core.openings():
            name = reading.listener.acceptor.name
            counts[name] = counts.get(name, 0) + 1
        return counts

    # -- the core's callbacks --

    def wake(self) -> None:
        try:
            self._serve_requests()
        except Exception:
            log.exception("fast path: unexpected error serving a request")

    def accept_wait(self, listener: _Listener, code: int) -> float:
        """Before an accept of a rate-limited listener (code 0), or after accept() failed (an
        errno): how long to stop accepting (0: go on)."""
        if code:
            return listener.backs_off(os.strerror(code))
        rate = listener.acceptor.accept_rate
        now = self._clock()
        if rate is None or rate.take(now):
            return 0.0
        listener.rate_paused_at = now  # the kernel's backlog holds the connections meanwhile
        return max(rate.ready_at(now) - now, 0.001)

    def resumed(self, listener: _Listener) -> None:
        listener.watched_again(self._clock())

    def accepted(self, listener: _Listener, cid: int, fd: int, host: str, port: int) -> Action:
        acceptor = listener.acceptor
        refusal = acceptor.admission.admit(acceptor.config.name, host)  # (`admit_from`, inline)
        if refusal is not None:
            acceptor.refused(host, port, refusal)
            return _SILENT
        try:
            if not listener.sniffs and self._lean:
                action = self._plain(listener, cid, fd, host, port)
                if action is not None:
                    return action
            elif listener.mqtt_lane and not acceptor.runtime.report.subscribed:
                self._counted(acceptor)[0][0] += 1  # no `Accepted` made
                size = min(READ_BYTES, acceptor.config.sniff_max_bytes)
                return (_WAIT, _Reading(listener, cid, fd, None, None, host, port), b"", size)
            peer = Address(host, port)
            conn = acceptor.runtime.accept(acceptor.name, peer, self._tally)
            if not listener.sniffs:
                return self._decision(listener, cid, fd, conn, Opening(source=peer))
            buffer = SniffBuffer(acceptor.detect, acceptor.config.sniff_max_bytes)
            return (_WAIT, _Reading(listener, cid, fd, conn, buffer), b"", buffer.read_size)
        except Exception:
            log.exception("fast path: unexpected error on descriptor %d; closing its connection", fd)
            acceptor.release(Address(host, port))
            return _SILENT

    def read(self, reading: _Reading, chunk: bytes | None) -> Action:
        """More of a client's opening (None: the read failed): read on, or decide.

        On an MQTT lane (a lean listener whose first byte 0x10 can only be MQTT's), a first read
        that is one whole valid CONNECT is decided in plain values (`_plain`): its C parse
        (`keys.native`) is what the sniffer's would be, and no `ConnectionRef`, `SniffBuffer`,
        `Sniffed` or `Opening` is made unless the connection is materialized. Anything else
        leaves the lane (`_off_lane`) and is read as always."""
        acceptor = reading.listener.acceptor
        if reading.buffer is None:
            if chunk is not None and _MQTT_CONNECT is not None:
                try:
                    parsed = _MQTT_CONNECT(chunk)
                    if type(parsed) is tuple and parsed[5] == len(chunk):
                        action = self._plain(
                            reading.listener,
                            reading.cid,
                            reading.fd,
                            reading.host,
                            reading.port,
                            mqtt=(chunk, parsed),
                        )
                        if action is not None:
                            return action
                except Exception:
                    log.exception(
                        "fast path: unexpected error on descriptor %d; closing its connection", reading.fd
                    )
                    acceptor.admission.release(acceptor.name, reading.host)
                    return _SILENT
            self._off_lane(reading)
        assert reading.conn is not None, "off the lane"
        assert reading.buffer is not None, "off the lane"
        if chunk is None:
            acceptor.release(reading.conn.peer)
            return _SILENT
        buffer = reading.buffer
        try:
            buffer.feed(chunk)
            result = buffer.step()
            if isinstance(result, bytes):
                buffer.check_cap()
                return (_WAIT, None, result, buffer.read_size)
        except SniffError as exc:
            try:
                acceptor.runtime.report(opening_failed(reading.conn, exc, bytes_read=len(buffer.raw)))
            finally:
                acceptor.release(reading.conn.peer)
            return (_CLOSE, exc.answer or b"")
        except Exception:
            log.exception("fast path: unexpected error on descriptor %d; closing its connection", reading.fd)
            acceptor.release(reading.conn.peer)
            return _SILENT
        conn = reading.conn
        read = Opening(source=conn.peer, raw=buffer.raw, sniffed=result, replied=buffer.replied)
        if self._lean:
            try:
                peer = conn.peer
                action = self._plain(
                    reading.listener, reading.cid, reading.fd, peer.host, peer.port, conn, read
                )
            except Exception:
                log.exception(
                    "fast path: unexpected error on descriptor %d; closing its connection", reading.fd
                )
                acceptor.release(conn.peer)
                return _SILENT
            if action is not None:
                return action
        return self._decision(reading.listener, reading.cid, reading.fd, conn, read)

    def _off_lane(self, reading: _Reading) -> None:
        """A connection of an MQTT lane read as always from now on: its reference (counted accepted
        already) and its buffer."""
        if reading.buffer is not None:
            return
        acceptor = reading.listener.acceptor
        reading.conn = _reference(acceptor, acceptor.runtime.name, Address(reading.host, reading.port))
        reading.buffer = SniffBuffer(acceptor.detect, acceptor.config.sniff_max_bytes)

    def timed_out(self, reading: _Reading) -> Action:
        self._off_lane(reading)
        assert reading.conn is not None, "off the lane"
        assert reading.buffer is not None, "off the lane"
        listener, buffer = reading.listener, reading.buffer
        failed = opening_failed(
            reading.conn,
            OpeningFailure.TIMEOUT,
            protocol=buffer.protocol,
            bytes_read=len(buffer.raw),
            timeout_s=listener.handshake_timeout_s,
        )
        try:
            listener.acceptor.runtime.report(failed)
        finally:
            listener.acceptor.release(reading.conn.peer)
        return _SILENT

    def _decision(
        self,
        listener: _Listener,
        cid: int,
        fd: int,
        conn: ConnectionRef,
        opening: Opening,
        decision: RouteDecision | None = None,
    ) -> Action:
        """Decide (unless `decision` was taken) and plan, as `FastPath._decide`: the action for the
        core."""
        acceptor = listener.acceptor
        runtime = acceptor.runtime
        now = self._clock()
        try:
            if decision is None:
                action = planned_action(acceptor, conn, opening, now, self._clock, self._tally)
            else:
                action = planned_decision(acceptor, conn, opening, decision, now, self._clock, self._tally)
            match action:
                case Refuse():
                    acceptor.release(conn.peer)
                    return (_CLOSE, action.answer)
                case Redirect():
                    node_id = action.target.node_id
                    if runtime.pool.gates.limited(node_id) and _must_wait(runtime, node_id, slot=False):
                        listener.handoff(HandedOver(_stdlib(fd), conn, opening, action))
                        return _HANDED
                    acceptor.release(conn.peer)
                    return (_CLOSE, action.answer)
                case HandOver(then=then):
                    listener.handoff(HandedOver(_stdlib(fd), conn, opening, then))
                    return _HANDED
                case Proxy():
                    return self._proxy(
                        cid, fd, acceptor, conn, opening, action, now, retry=True, handoff=listener.handoff
                    )
                case _:
                    assert_never(action)
        except Exception:
            log.exception("fast path: unexpected error on descriptor %d; closing its connection", fd)
            acceptor.release(conn.peer)
            return _SILENT

    def _proxy(
        self,
        cid: int,
        fd: int,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        opening: Opening,
        action: Proxy,
        now: float,
        *,
        retry: bool,
        handoff: Handoff,
    ) -> Action:
        runtime = acceptor.runtime
        node_id = action.target.node_id
        gated = runtime.pool.gates.limited(node_id)
        if gated and _must_wait(runtime, node_id, slot=True):  # the trio side waits
            handoff(HandedOver(_stdlib(fd), conn, opening, action, retry=retry))
            return _HANDED
        if self._lean and not gated and retry and not runtime.report.subscribed:
            lean = 0 if runtime.connections.counted else _lean_flags(opening, action)
            if lean:
                return self._lean_proxy(cid, fd, acceptor, conn, opening, action, now, handoff, lean)
        relayed = self._relayed(cid, fd, acceptor, conn, opening, action, now, retry=retry, handoff=handoff)
        relayed.gated = gated
        runtime.connections.register(relayed)  # unregistered by `closed` or `connect_failed`
        flags = _F_FIRST | (_F_FEED if relayed.cursor is not None else 0)
        connector = action.connector
        return (_PROXY, relayed, connector.host, connector.port, opening.raw, flags)

    def _relayed(
        self,
        cid: int,
        fd: int,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        opening: Opening,
        action: Proxy,
        started: float,
        *,
        retry: bool,
        handoff: Handoff,
    ) -> _Relayed:
        """An ordinary connection of the core (not registered yet)."""
        return _Relayed(
            core=self._core,
            cid=cid,
            fd=fd,
            acceptor=acceptor,
            conn=conn,
            opening=opening,
            action=action,
            retry=retry,
            handoff=handoff,
            request=self._request_bound,
            started=started,
        )

    def _lean_proxy(
        self,
        cid: int,
        fd: int,
        acceptor: ServedAcceptor,
        conn: ConnectionRef,
        opening: Opening,
        action: Proxy,
        now: float,
        handoff: Handoff,
        flags: int,
    ) -> Action:
        """Have the core carry a connection on its own (see the module docstring)."""
        runtime = acceptor.runtime
        node_id = action.target.node_id
        router, target = self._lean_indexes(runtime, node_id)
        peer = conn.peer
        token = (
            peer.host,
            peer.port,
            runtime.name,
            action.key,
            node_id,
            target,
            router,
            acceptor,
            conn,
            opening,
            action,
            now,
            handoff,
            cid,
            fd,
        )
        if runtime.pool.failing(node_id):
            flags |= _F_FIRST
        connector = action.connector
        return (_PROXY, token, connector.host, connector.port, opening.raw, flags)

    def _plain(
        self,
        listener: _Listener,
        cid: int,
        fd: int,
        host: str,
        port: int,
        conn: ConnectionRef | None = None,
        opening: Opening | None = None,
        *,
        mqtt: tuple[bytes, MqttConnect] | None = None,
    ) -> Action:
        """A connection that may be a lean one, decided in plain values (`RoutingEngine.plain`):
        one known by its source address (`conn` and `opening` not made yet: accepted just now,
        counted here) or by its MQTT CONNECT. Lean, no `RouteDecision` or `Proxy` is made (nor a
        `ConnectionRef` and `Opening`, when not made yet) until the connection is `materialized`;
        its decision made into one, the workflow goes on as always (`_decision`) when the
        connection cannot be lean after all. None, with nothing changed, when the engine does not
        decide in plain values: the whole workflow then decides."""
        acceptor = listener.acceptor
        runtime = acceptor.runtime
        if runtime.report.subscribed:
            return None
        client_id = user_name = None
        flags = _F_LEAN
        raw = b""
        if mqtt is not None:  # an MQTT lane's CONNECT (`read`)
            if acceptor.config.mode is not _PROXY_MODE:
                return None
            raw, (_, client_id, user_name, _, _, _) = mqtt
            flags = _F_LEAN | _F_MQTT
        elif opening is not None and (sniffed := opening.sniffed) is not None:
            if sniffed.protocol is not _MQTT_PROTOCOL or opening.replied:
                return None
            if answers.redirects(acceptor.config.mode, sniffed):
                return None
            client_id, user_name, flags = sniffed.client_id, sniffed.user_name, _F_LEAN | _F_MQTT
            raw = opening.raw
        now = self._clock()
        state = runtime.held()
        lock = state.lock
        lock.acquire()  # not `with state:` (its __enter__ and __exit__ looked up): every connection's
        try:
            engine = state.engine
            policy, pool = engine.policy, engine.pool
            if policy is None or pool is None or policy.reads_counts:  # (counted: registered at once)
                return None
            key = engine.plain_key(host, client_id, user_name)
            found = None if key is None else engine.plain(key, now)
            if found is None:
                return None
            failing = pool.failing(found[0].node_id)
        finally:
            lock.release()
        assert key is not None
        target, connector, reason = found
        name = runtime.name
        node_id = target.node_id
        memo = self._lean_memo.get((acceptor.config.name, node_id))
        if memo is None or memo[0] is not runtime.connections or memo[5] is not acceptor:
            memo = self._remember(acceptor, runtime, node_id)
        _, accepted, proxied, router, index, _, _ = memo
        if conn is None and mqtt is None:
            accepted[0] += 1  # (an MQTT lane's was at its accept)
        literal: bool | None = False
        if connector is not None:  # (an IP literal's connector: connected without a name lookup)
            literal = self._literals.get(connector.host)  # not a call: every connection's
            if literal is None:
                literal = self._literals[connector.host] = is_ip_literal(connector.host)
        if not literal or node_id in memo[6].limited_ids:  # (a gated target's: `RouterGates.limited`)
            made = _made(acceptor, name, host, port, key, conn, mqtt if opening is None else opening, found)
            return self._decision(listener, cid, fd, *made)
        assert connector is not None, "an IP literal's"
        proxied[0] += 1
        if router < 0:  # the first lean connection of this acceptor and target: the core's indexes
            router, index = self._lean_indexes(runtime, node_id)
            self._lean_memo[acceptor.config.name, node_id] = (*memo[:3], router, index, *memo[5:])
        token = (
            host, port, name, key, node_id, index, router, acceptor, conn, opening if mqtt is None else mqtt,
            (target, connector, reason), now, listener.handoff, cid, fd,
        )  # fmt: skip
        if failing:
            flags |= _F_FIRST
        return (_PROXY, token, connector.host, connector.port, raw, flags)

    def _remember(self, acceptor: ServedAcceptor, runtime: RouterRuntime, node_id: str) -> _LeanMemo:
        """What `_plain` needs of an acceptor and a target, looked up in one place for each
        connection: the router's registry and the acceptor (which say whether the rest is still
        right), the tally's cells (`_counted`) and the core's indexes (`_lean_indexes`, -1 until
        the first lean connection: they make the registry materialize lean connections when read).
        Keyed by names, at most `_LEAN_MEMO_MAX` of them."""
        if len(self._lean_memo) >= _LEAN_MEMO_MAX:  # targets a discovery pool saw come and go
            self._lean_memo.clear()
        accepted, proxied = self._counted(acceptor)
        gates = runtime.pool.gates
        memo = (
            runtime.connections,
            accepted,
            proxied,
            -1,
            -1,
            acceptor,
            gates,
        )  # indexes: at the first lean one
        self._lean_memo[acceptor.config.name, node_id] = memo
        return memo

    def _counted(self, acceptor: ServedAcceptor) -> tuple[list[int], list[int]]:
        """The tally's cells of an acceptor's accepted connections and of its router's proxied
        decisions (counted there when only the metrics read them, as `MetricUpdates` counts)."""
        name, router = acceptor.config.name, acceptor.runtime.name
        known = self._cells.get(name)
        if known is None or known[0] != router:
            tally, updates = self._tally, acceptor.runtime.report.updates
            assert tally is not None, "lean connections have a tally"
            assert updates is not None, "a router's reports update its metrics"
            known = self._cells[name] = (
                router,
                updates.accepted_cell(name, router, tally),
                updates.proxied_cell(router, tally),
            )
        return known[1], known[2]

    def _lean_indexes(self, runtime: RouterRuntime, node_id: str) -> tuple[int, int]:
        """The core's indexes of a router and of its target, for a lean connection's counters."""
        known = self._lean_ix.get((runtime.name, node_id))
        if known is None or known[0] is not runtime.connections:
            known = self._lean_ix[runtime.name, node_id] = self._lean_target(runtime, node_id)
        return known[1], known[2]

    def _lean_target(self, runtime: RouterRuntime, node_id: str) -> tuple[RouterConnections, int, int]:
        """The indexes of a router's target new to lean connections (the router's own too, when it
        is new or made again): its registry reads materialize them (`carried_by`)."""
        assert self._lean_metrics is not None, "lean connections have metrics"
        registry = runtime.connections
        known = self._routers.get(runtime.name)
        if known is None or known[0] is not registry:
            router = self._router_count
            self._router_count += 1
            known = self._routers[runtime.name] = (registry, router)
            registry.carried_by(lambda live: self._sync(router, live))
        router = known[1]
        self._targets.append(_LeanTarget(router, (runtime.name, node_id), self._lean_metrics))
        return registry, router, len(self._targets) - 1

    def materialized(
        self,
        lean: Lean,
        cid: int,
        fd: int,
        connected: bool,
        age_s: float,
        silent: bool,
        why: int,
        frames: tuple[int, int, bytes, bool] | None,
    ) -> _Relayed:
        """A lean connection as an ordinary one (the core's token for it from now on): connected
        `age_s` ago or still connecting; `why`: its registry is read (the caller registers it), the
        router closes it now, or its broker refused it in its first answer (registered here);
        `frames`: where the core's follower of its broker's MQTT packets stopped."""
        acceptor, conn, opening, action, started, handoff = _planned(lean)
        relayed = self._relayed(
            cid, fd, acceptor, conn, opening, action, started, retry=True, handoff=handoff
        )
        relayed.silent_close = silent
        if frames is not None:
            relayed.cursor = MqttFrames.resumed(*frames)
        if connected:
            relayed.connected = True
            relayed.opening = relayed.action = None
            relayed.connected_at = self._clock() - age_s
        if why == _M_ANSWER:
            acceptor.runtime.connections.register(relayed)
        if connected and why != _M_READ:
            _adopted(relayed)
        return relayed

    def _sync(self, router: int, registry: LiveConnections) -> None:
        """A router's registry is read (under its lock): its lean connections are registered first,
        and the bytes of those that ended counted."""
        for relayed in self._core.materialize(router):
            registry.add(relayed)
            if relayed.connected:
                _adopted(relayed)
        counts = self._core.lean_counts()
        # A copy: the loop's thread may add a target meanwhile (this runs in either thread).
        for entry, (_, _, _, bytes_in, bytes_out) in zip(list(self._targets), counts, strict=False):
            before_in, before_out = entry.bytes
            if entry.router == router and (bytes_in != before_in or bytes_out != before_out):
                registry.add_ended(entry.labels[1], bytes_in - before_in, bytes_out - before_out)
                entry.bytes = (bytes_in, bytes_out)

    def _fold(self) -> None:
        """Before a scrape: what lean connections did since the last one, into the metrics (open
        connections, connect times)."""
        counts = self._core.lean_counts()
        for entry, (open_now, hist, total, _, _) in zip(list(self._targets), counts, strict=False):
            metrics = entry.metrics
            if open_now != entry.open or hist != entry.hist:  # (a series from its first connection on)
                metrics.active_connections.inc(entry.labels, open_now - entry.open)
                entry.open = open_now
            if hist != entry.hist:
                before = entry.hist or (0,) * len(hist)
                added = [now - then for now, then in zip(hist, before, strict=True)]
                metrics.connect_duration.add(entry.labels, added, total - entry.sum)
                entry.hist, entry.sum = hist, total

    def released(self, ended: list[Lean]) -> None:
        """Lean connections that ended: their admission goes back (once per turn of the loop)."""
        run: ServedAcceptor | None = None  # runs of one acceptor's (by identity: cheaper than a hash)
        sources: list[str] = []
        for lean in ended:
            acceptor = lean[_ACCEPTOR]
            if acceptor is not run:
                if run is not None:
                    run.admission.release_many(run.name, sources)
                run, sources = acceptor, []
            sources.append(lean[_HOST])
        if run is not None:
            run.admission.release_many(run.name, sources)

    def lean_failed(
        self, lean: Lean, reason: CloseReason, bytes_in: int, bytes_out: int, duration_s: float
    ) -> None:
        """A lean connection the broker ended silently and early: passive health counts it."""
        runtime = lean[_ACCEPTOR].runtime
        closed = Closed(
            conn=_planned(lean)[1],
            node_id=lean[_NODE],
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            duration_s=duration_s,
            reason=reason,
        )
        self._call_trio(runtime.pool.broker_failed, closed)

    def connected(self, relayed: _Relayed) -> None:
        relayed.connected = True
        relayed.opening = relayed.action = None
        began, relayed.connected_at = relayed.connected_at, self._clock()
        relayed.acceptor.runtime.report(relayed.connected_in(relayed.connected_at - began))

    def upstream(self, relayed: _Relayed | Lean, data: bytes, first: bool) -> None:
        """The broker's bytes: its first answer (passive health; b"" when it ended its side
        without one), and every read when the connection has a frame cursor (moves). A lean
        connection's first answer, when its target has failures in a row, ends them."""
        if isinstance(relayed, tuple):
            relayed[_ACCEPTOR].runtime.pool.answered(relayed[_NODE])
            return
        if first:
            relayed.acceptor.runtime.pool.first_answer(relayed, data)
        if data and relayed.cursor is not None:
            relayed.cursor.feed(data)

    def connect_failed(self, relayed: _Relayed | Lean, why: int | CloseReason, no_socket: bool) -> Action:
        """The connect failed (an errno; `no_socket`: this process could not make a socket, which
        another target would need too) or the router closed the connection meanwhile (a reason):
        another target once, else the client's refusal (`PlannedConnection.failed_connect`)."""
        if isinstance(relayed, tuple):  # a lean one: as an ordinary one from here on
            relayed = self.materialized(
                relayed, relayed[13], relayed[14], False, 0.0, False, _M_CLOSING, None
            )
        acceptor = relayed.acceptor
        runtime = acceptor.runtime
        opening = relayed.opening
        then: Proxy | Refuse | None = None
        try:
            error = why if isinstance(why, CloseReason) else OSError(why, os.strerror(why))
            retry = relayed.retry and not no_socket
            failed, then = relayed.failed_connect(error, self._clock(), retry=retry)
            try:
                runtime.report(failed)  # before the close: a client that sees it finds it reported
            finally:
                _give_slot_back(relayed)
            if failed.cause is ConnectFailure.REFUSED:
                self._call_trio(
                    runtime.pool.connect_refused, relayed.target, relayed.connector, failed.reason
                )
            if isinstance(then, Proxy) and not no_socket:
                assert opening is not None
                return self._redispatch(relayed, opening, then)
        except Exception:
            log.exception("fast path: unexpected error on descriptor %d; closing its connection", relayed.fd)
            then = None
        acceptor.release(relayed.conn.peer)
        return (_CLOSE, then.answer) if isinstance(then, Refuse) else _SILENT

    def _redispatch(self, failed: _Relayed, opening: Opening, then: Proxy) -> Action:
        """Connect to the target a failed connect goes on to (on the trio side when that needs
        waiting, such as a host name to resolve)."""
        action = for_fast_path(then)
        if isinstance(action, HandOver):
            failed.handoff(HandedOver(_stdlib(failed.fd), failed.conn, opening, then, retry=False))
            return _HANDED
        return self._proxy(
            failed.cid,
            failed.fd,
            failed.acceptor,
            failed.conn,
            opening,
            then,
            self._clock(),
            retry=False,
            handoff=failed.handoff,
        )

    def closed(self, relayed: _Relayed, reason: CloseReason, bytes_in: int, bytes_out: int) -> None:
        """A relayed connection ended (the core closes its sockets when this returns)."""
        runtime = relayed.acceptor.runtime
        runtime.connections.unregister(relayed)
        relayed.left_core([bytes_in, bytes_out])
        closed = relayed.ended(self._clock() - relayed.connected_at, reason)
        try:
            runtime.report(closed)  # before the close: a client that sees it finds it counted
        finally:
            _give_slot_back(relayed)
            relayed.acceptor.release(relayed.conn.peer)
        if broker_failure(closed.reason) is not None:  # passive health counts it, in the trio thread
            self._call_trio(runtime.pool.broker_failed, closed)


def _lean_flags(opening: Opening, action: Proxy) -> int:
    """The core's flags for a connection it may carry alone (0: it may not): its opening not read,
    a TLS hello passed through, or an MQTT CONNECT whose broker's packets the core follows (no other
    protocol's broker is watched or moved at a frame boundary in C yet)."""
    sniffed = opening.sniffed
    if sniffed is None or sniffed.protocol is WireProtocol.TLS:
        return _F_LEAN
    if sniffed.protocol is WireProtocol.MQTT and action.target_filter is None and not opening.replied:
        return _F_LEAN | _F_MQTT
    return 0


def _planned(lean: Lean) -> tuple[ServedAcceptor, ConnectionRef, Opening, Proxy, float, Handoff]:
    """A lean connection's acceptor, connection, opening, plan, decision time and hand-off; made
    here for one `NativePath._plain` decided in plain values, as the whole workflow makes them
    (the plan of its decision)."""
    acceptor, conn, opening, action, started, handoff = lean[7:13]
    if isinstance(action, tuple):
        host, port, router, key = lean[0:4]
        conn, opening, decision = _made(acceptor, router, host, port, key, conn, opening, action)
        planned = plan(acceptor.config, router, opening, decision)
        assert isinstance(planned, Proxy), "a lean connection is proxied"
        action = planned
    assert conn is not None, "made with its plan"
    assert isinstance(opening, Opening), "made with its plan"
    return acceptor, conn, opening, action, started, handoff


def _made(
    acceptor: ServedAcceptor,
    router: str,
    host: str,
    port: int,
    key: str,
    conn: ConnectionRef | None,
    opening: Opening | tuple[bytes, MqttConnect] | None,
    found: tuple[Target, Connector | None, DecisionReason],
) -> tuple[ConnectionRef, Opening, RouteDecision]:
    """The objects of a connection decided in plain values, as the whole workflow makes them: its
    reference (when it has none yet), its opening (none read, or an MQTT lane's CONNECT: its bytes
    and their C parse, as its sniffer would have read it) and its decision."""
    peer = Address(host, port)
    if conn is None:
        conn = _reference(acceptor, router, peer)
    if not isinstance(opening, Opening):
        if opening is None:
            opening = Opening(source=peer)
        else:
            raw, parsed = opening
            opening = Opening(source=peer, raw=raw, sniffed=mqtt_sniffed(parsed))
    target, connector, reason = found
    decision = RouteDecision(
        key=key, status=RouteStatus.OK, target=target, connector=connector, reason=reason
    )
    return conn, opening, decision


def _reference(acceptor: ServedAcceptor, router: str, peer: Address) -> ConnectionRef:
    """A connection's reference made after its accept (counted then, no `Accepted` made)."""
    return ConnectionRef(id=next(CONNECTION_IDS), router=router, acceptor=acceptor.name, peer=peer)


def _adopted(relayed: _Relayed) -> None:
    """A lean connection made ordinary while connected: the metrics count it open from now on (its
    Closed takes it off), as the core stopped counting it."""
    runtime = relayed.acceptor.runtime
    runtime.metrics.active_connections.inc((runtime.name, relayed.node_id))


DATA_PATHS: Final = ("native", "python")
"""routerd's `--data-path` choices: the C core, or the Python fast path (its reference)."""
DATA_PATH_ENV: Final = "ROUTERD_DATA_PATH"
"""The environment variable that sets `--data-path`'s default (the test suite runs both)."""


def default_data_path() -> str:
    """`--data-path`'s default: `$ROUTERD_DATA_PATH`, else native when the C core is built."""
    return os.environ.get(DATA_PATH_ENV) or ("native" if NATIVE else "python")


def data_path_problem(chosen: str) -> str | None:
    """Why routerd cannot serve with the data path `chosen`, to follow "data path" or the option's
    name; None when it can."""
    if chosen not in DATA_PATHS:
        return f"must be one of {', '.join(DATA_PATHS)}, not {chosen!r}"
    if chosen == "native" and not NATIVE:
        return (
            "native: the C core router.datapath._core is not built (a C compiler and Python's headers "
            "are needed: deploy/bootstrap.sh); --data-path python serves without it"
        )
    return None


def open_fast_path(
    data_path: str | None,
    clock: Callable[[], float],
    call_trio: Callable[..., None],
    connect_timeout_s: float,
    *,
    lean: Metrics | None = None,
) -> FastPath:
    """The fast path's loop on the data path asked for (None: `default_data_path()`); `lean`: the
    process's metrics, when the native path may carry lean connections (`NativePath`).

    Raises:
        ValueError: not one of `DATA_PATHS`, or native without the C core built.
    """
    chosen = default_data_path() if data_path is None else data_path
    problem = data_path_problem(chosen)
    if problem is not None:
        raise ValueError(f"data path {problem}")
    if chosen == "python":
        return FastPath(clock, call_trio, connect_timeout_s)
    return NativePath(clock, call_trio, connect_timeout_s, lean=lean)
