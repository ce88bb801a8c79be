"""router/datapath/trio_path.py in process: connections the fast path hands over (its plan carried
out, not decided again; the quorum wait and its deadline), over real socket pairs."""

from __future__ import annotations

import dataclasses
import socket
from typing import TYPE_CHECKING

import trio
import trio.testing

from keys import ConnectionFacts
from keys.detect import make_detector
from router.core.address import Address
from router.core.engine import DecisionReason, QuorumWait, RouteDecision, RouteStatus
from router.core.events import ConnectionRef, Decided, Mode
from router.core.plan import Opening, Proxy, plan
from router.datapath.acceptor import ConnectionLimits, ServedAcceptor
from router.datapath.fast_path import HandedOver
from router.datapath.trio_path import resume_connection
from router.metrics import Metrics
from router.runtime import RouterRuntime
from tests.conftest import read_until_closed
from tests.router.test_server import _config, _serve_named_echo

if TYPE_CHECKING:
    from router.config.settings import AcceptorConfig


def _served(runtime: RouterRuntime, acceptor: AcceptorConfig, limits: ConnectionLimits) -> ServedAcceptor:
    return ServedAcceptor(
        config=acceptor,
        runtime=runtime,
        detect=make_detector(()),
        detect_inner=make_detector(()),
        limits=limits,
    )


def _handed(then: Proxy | QuorumWait) -> tuple[HandedOver, socket.socket, socket.socket]:
    """A connected pair: the router's side handed over, and the client's side."""
    router_side, client = socket.socketpair()
    peer = Address("127.0.0.2", 5000)
    conn = ConnectionRef(id=1, router="r", acceptor="a", peer=peer)
    return HandedOver(router_side, conn, Opening(source=peer), then), router_side, client


async def test_resume_connection_carries_out_the_fast_paths_plan(nursery: trio.Nursery) -> None:
    """Scenario: the fast path decided (ROUND_ROBIN: b0), planned a Proxy and handed it over; the
    trio side proxies to b0 without deciding again, so the round-robin position moved once."""
    ports = [await nursery.start(_serve_named_echo, name) for name in (b"b0", b"b1")]
    config = _config(ports, policy="ROUND_ROBIN")
    router, acceptor = config.routers[0], config.acceptors[0]
    runtime = RouterRuntime(config, router, Metrics(), round_robin_start=0)
    for target in runtime.pool.targets():
        runtime.pool.record_check(target.node_id, True)
    facts = ConnectionFacts(source_ip="127.0.0.2")
    decision = runtime.decide_now(facts, trio.current_time())
    assert isinstance(decision, RouteDecision)
    action = plan(acceptor, "r", Opening(source=Address("127.0.0.2", 5000)), decision)
    assert isinstance(action, Proxy)
    assert action.target.node_id == "b0"
    events: list[object] = []
    runtime.report.subscribe(events.append)

    handed, router_side, client = _handed(action)
    with client:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(router_side))
        nursery.start_soon(resume_connection, stream, _served(runtime, acceptor, ConnectionLimits()), handed)
        client.shutdown(socket.SHUT_WR)
        assert await trio.to_thread.run_sync(lambda: read_until_closed(client)) == b"hello from b0\nbye"
    following = runtime.decide_now(facts, trio.current_time())
    assert isinstance(following, RouteDecision)
    assert following.target is not None
    assert following.target.node_id == "b1"
    assert not any(isinstance(e, Decided) for e in events)  # reported by the fast path, not again


async def test_resume_connection_waits_for_the_quorum_within_the_routing_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """Scenario: handed over to wait for the quorum (3 s), which never comes; the routing deadline
    (1 s here) ends the wait first: REFUSED_UNAVAILABLE, reason 'routing timed out', closed."""
    config = _config([1], quorum_size=1)
    pool = config.routers[0].pool
    assert pool is not None
    router = dataclasses.replace(config.routers[0], pool=dataclasses.replace(pool, quorum_timeout_ms=3000))
    config = dataclasses.replace(config, routers=(router,))
    runtime = RouterRuntime(config, router, Metrics())
    events: list[object] = []
    runtime.report.subscribe(events.append)
    served = _served(runtime, config.acceptors[0], ConnectionLimits(route_timeout_s=1.0))
    handed, router_side, client = _handed(QuorumWait(key="127.0.0.2", timeout_s=3.0))
    start = trio.current_time()
    with client:
        async with trio.open_nursery() as inner:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(router_side))
            inner.start_soon(resume_connection, stream, served, handed)
        assert trio.current_time() - start == 1.0
        client.setblocking(False)
        assert client.recv(10) == b""  # closed, nothing said: its opening was not read
    decided = [e for e in events if isinstance(e, Decided)]
    assert decided == [
        Decided(
            conn=handed.conn,
            key="127.0.0.2",
            status=RouteStatus.REFUSED_UNAVAILABLE,
            reason=DecisionReason.ROUTING_TIMED_OUT,
            mode=Mode.REFUSE,
            facts=ConnectionFacts(source_ip="127.0.0.2"),
            source=handed.conn.peer,
            latency_s=1.0,  # the quorum wait, cut by the routing deadline
        )
    ]
