"""Following a connection router's AMQP 1.0 redirect with python-qpid-proton (proton does not follow it).

The router answers the client's Open with an Open of its own (properties
`{amqp:connection-establishment-failed: true}`) and a Close with the error
`amqp:connection:redirect`, info `{network-host, port}`; the client connects there instead.
proton's `BlockingConnection` raises `ConnectionClosed` and frees the connection before the caller
sees it, which loses the info map, so `KeepingConnection` raises `ClosedByPeer`, which keeps the
peer's condition. Run (it sends one message to QUEUE and receives it where it lands):
    python follow_redirect_proton.py amqp://USER:PASSWORD@ROUTER_HOST:ROUTER_PORT CONTAINER_ID QUEUE
"""

from __future__ import annotations

import sys
import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from proton import Message, symbol
from proton.utils import BlockingConnection, ConnectionClosed

if TYPE_CHECKING:
    from proton import Condition, Connection, Event

REDIRECT = "amqp:connection:redirect"


class ClosedByPeer(ConnectionClosed):
    """`ConnectionClosed` that keeps the peer's condition (name, description and info map)."""

    def __init__(self, connection: Connection) -> None:
        super().__init__(connection)
        self.remote_condition: Condition | None = connection.remote_condition


class KeepingConnection(BlockingConnection):
    """A `BlockingConnection` whose "closed by the peer" error is a `ClosedByPeer`."""

    def on_connection_remote_close(self, event: Event) -> None:
        try:
            super().on_connection_remote_close(event)
        except ConnectionClosed:
            if event.connection is None:
                raise
            raise ClosedByPeer(event.connection) from None


def redirect_target(condition: Condition | None) -> tuple[str, int] | None:
    """`(network-host, port)` of a redirect condition, or None when it is not a redirect."""
    if condition is None or condition.name != REDIRECT or not isinstance(condition.info, dict):
        return None
    host, port = condition.info.get(symbol("network-host")), condition.info.get(symbol("port"))
    if not isinstance(host, str) or not isinstance(port, int):
        return None
    return str(host), int(port)  # proton decodes them as its own str and int subclasses (int32)


def _moved(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced, keeping scheme, user and password."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    userinfo, at, _ = parts.netloc.rpartition("@")
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{where}"))


def connect_following_redirects(
    url: str,
    *,
    container_id: str,
    allowed_mechs: str | None = "PLAIN",
    timeout: float = 10.0,
    max_hops: int = 3,
) -> BlockingConnection:
    """Connect, following up to `max_hops` redirects, with the same container id and credentials.

    Raises:
        ClosedByPeer: the peer closed the connection for another reason (a refusal, say).
    """
    for _ in range(max_hops + 1):
        try:
            return KeepingConnection(url, timeout, container_id=container_id, allowed_mechs=allowed_mechs)
        except ClosedByPeer as closed:
            target = redirect_target(closed.remote_condition)
            if target is None:
                raise
            url = _moved(url, *target)
    raise RuntimeError(f"more than {max_hops} redirects")


if __name__ == "__main__":
    router_url, container_id, queue = sys.argv[1:4]
    connection = connect_following_redirects(router_url, container_id=container_id)
    try:
        where = urlsplit(connection.url)  # the URL it connected to, password included: not printed
        print(f"connected to {where.hostname}:{where.port}")
        body = f"hello {uuid.uuid4()}"
        connection.create_sender(queue).send(Message(body=body))
        receiver = connection.create_receiver(queue)
        received = receiver.receive(timeout=10)
        receiver.accept()
        print("sent and received", body if received.body == body else f"a stranger: {received.body!r}")
    finally:
        connection.close()
