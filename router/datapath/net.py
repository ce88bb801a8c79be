"""Opening TCP connections to targets: a raw connect for IP literals, `open_tcp_stream` otherwise.

`trio.open_tcp_stream` resolves names and runs happy eyeballs, which costs about 30 % of a
short proxied connection (ENVIRONMENT.md §6b); connectors are usually IP literals, so those get a
plain non-blocking connect.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from typing import TYPE_CHECKING, Final

import trio

from router.core.events import ConnectFailure

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "ACCEPT_BACKOFF_S",
    "ACCEPT_CAPACITY_ERRNOS",
    "LOCAL_SHORTAGE_ERRNOS",
    "connect_failed",
    "connect_failure",
    "describe_oserror",
    "is_local_shortage",
    "open_connection",
    "open_listeners",
]

ACCEPT_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""Errors of accept() that mean "out of a resource, try again shortly", as trio.serve_listeners
treats them; anything else is a bug and propagates. The same errors of connect() or socket() say
nothing about the peer: a probe that meets one is no evidence that a broker is down."""
LOCAL_SHORTAGE_ERRNOS: Final = ACCEPT_CAPACITY_ERRNOS | {errno.EADDRNOTAVAIL}
"""Errors of socket() or connect() that come from this host running short (descriptors, memory,
buffers, ephemeral ports), not from the peer."""


def is_local_shortage(exc: BaseException) -> bool:
    """Whether a connect failed because this host ran short (`LOCAL_SHORTAGE_ERRNOS`), looking
    through the causes and groups trio's connect wraps its attempts' errors in."""
    return any(code in LOCAL_SHORTAGE_ERRNOS for code in _errnos(exc))


_FAILURES_BY_ERRNO: Final = (
    (LOCAL_SHORTAGE_ERRNOS, ConnectFailure.LOCAL_SHORTAGE),
    (frozenset({errno.ECONNREFUSED}), ConnectFailure.REFUSED),
    (frozenset({errno.ECONNRESET, errno.ECONNABORTED}), ConnectFailure.RESET),
    (frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH}), ConnectFailure.UNREACHABLE),
    (frozenset({errno.ETIMEDOUT}), ConnectFailure.TIMEOUT),
)
"""A failed connect's cause by the errors found in it, the first that matches: trio's connect to
a host name tries each address and raises one error whose cause is a group of the attempts'
errors, so one attempt refused and another unreachable is `refused` (the host is up)."""


def connect_failure(exc: BaseException) -> ConnectFailure:
    """Why a connect failed, from its exception (`trio.TooSlowError`: the deadline), looking
    through the causes and groups trio wraps its attempts' errors in (`_FAILURES_BY_ERRNO`)."""
    if isinstance(exc, trio.TooSlowError):
        return ConnectFailure.TIMEOUT
    found = set(_errnos(exc))
    for errnos, failure in _FAILURES_BY_ERRNO:
        if found & errnos:
            return failure
    return ConnectFailure.OTHER


def connect_failed(exc: OSError | trio.TooSlowError) -> tuple[str, ConnectFailure]:
    """A failed connect's reason, in a few words for the log line (`timed out` for the connect
    deadline, else `describe_oserror`), and its cause (`connect_failure`): what both data paths
    report in `ConnectFailed`."""
    if isinstance(exc, trio.TooSlowError) or exc.errno == errno.ETIMEDOUT:
        return "timed out", connect_failure(exc)
    return describe_oserror(exc), connect_failure(exc)


def _errnos(exc: BaseException, seen: set[int] | None = None) -> Iterator[int]:
    """The errnos of `exc`, of the groups' members and of the causes (each exception once)."""
    seen = set() if seen is None else seen
    if id(exc) in seen:
        return
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno:
        yield exc.errno
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _errnos(inner, seen)
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        yield from _errnos(cause, seen)


ACCEPT_BACKOFF_S: Final = 0.1
"""How long both data paths stop accepting on a listener after one of those errors (trio's
serve_listeners sleeps 0.1 s too)."""


def describe_oserror(exc: OSError) -> str:
    """The reason of a socket error in a few words (`Connection refused`), for log lines.

    trio's connect errors carry a whole sentence with the address in `strerror`; the address is
    already in our log line, so we keep the system's text for the errno. A failed name lookup's
    errno is getaddrinfo's (negative: `os.strerror` says "Unknown error -3"), so its own text is
    kept, said to be a lookup.
    """
    if isinstance(exc, socket.gaierror):
        return f"name lookup failed: {exc.strerror or exc}"
    return os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__


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


async def open_listeners(
    host: str, port: int, what: str, *, reuse_port: bool = False
) -> list[trio.SocketListener]:
    """`trio.open_tcp_listeners`, with an error that says which listener could not be opened.

    With `reuse_port` each socket is opened with `SO_REUSEPORT` as well, as
    `trio.open_tcp_listeners` opens them otherwise: the worker processes of one routerd each open
    their own on the same port, and the kernel spreads the connections over them.

    Raises:
        OSError: same errno, message `"{what} cannot listen: {reason}"`.
    """
    try:
        if not reuse_port:
            return await trio.open_tcp_listeners(port, host=host)
        return await _shared_listeners(host, port)
    except OSError as exc:
        raise OSError(exc.errno, f"{what} cannot listen: {describe_oserror(exc)}") from exc


async def _shared_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """The listeners of `trio.open_tcp_listeners(port, host=host)`, with `SO_REUSEPORT`."""
    addresses = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[trio.SocketListener] = []
    try:
        for family, kind, proto, _, address in addresses:
            sock = trio.socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                await sock.bind(address)
                sock.listen(0xFFFF)  # as trio: the kernel caps it at somaxconn
            except BaseException:
                sock.close()
                raise
            listeners.append(trio.SocketListener(sock))
    except BaseException:
        for listener in listeners:
            listener.socket.close()
        raise
    return listeners
