"""Opening TCP connections to targets: a raw connect for IP literals, `open_tcp_stream` otherwise.

`trio.open_tcp_stream` resolves names and runs happy eyeballs, which costs about 30 % of a
short proxied connection (ENVIRONMENT.md §6b); connectors are usually IP literals, so those get a
plain non-blocking connect.
"""

from __future__ import annotations

import ipaddress
import socket

import trio

__all__ = ["open_connection"]


async def open_connection(host: str, port: int) -> trio.SocketStream:
    """Connect to host:port. The caller's cancel scope is the deadline.

    Raises:
        OSError: the connection failed.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return await trio.open_tcp_stream(host, port)
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)
