"""open_connection: raw connect for IP literals, name resolution otherwise, errors as OSError;
what a failed connect's exception says about its cause."""

from __future__ import annotations

import errno
import socket

import pytest
import trio

from router.core.events import ConnectFailure
from router.datapath.net import (
    connect_failed,
    connect_failure,
    describe_oserror,
    is_local_shortage,
    open_connection,
)


async def _listener() -> tuple[trio.SocketListener, int]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    return listener, listener.socket.getsockname()[1]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_open_connection_reaches_listener(host: str) -> None:
    listener, port = await _listener()
    stream = await open_connection(host, port)
    server = await listener.accept()
    await stream.send_all(b"hi")
    assert await server.receive_some(10) == b"hi"
    for s in (stream, server, listener):
        await s.aclose()


async def test_open_connection_refused_is_oserror() -> None:
    listener, port = await _listener()
    await listener.aclose()
    with pytest.raises(ConnectionRefusedError):
        await open_connection("127.0.0.1", port)


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (OSError(111, "Error connecting to ('127.0.0.1', 1): Connection refused"), "Connection refused"),
        (OSError("no errno here"), "no errno here"),
        (OSError(), "OSError"),
        (
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
            "name lookup failed: Temporary failure in name resolution",
        ),
        (
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            "name lookup failed: Name or service not known",
        ),
    ],
)
def test_describe_oserror_keeps_only_the_reason(exc: OSError, text: str) -> None:
    assert describe_oserror(exc) == text


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_refused_connect_is_refused_by_ip_and_by_name(host: str) -> None:
    """Scenario: by name trio tries each address and raises one OSError without an errno whose
    cause groups the attempts' errors; the cause is still `refused`, not `other`."""
    listener, port = await _listener()
    await listener.aclose()
    with pytest.raises(OSError, match=r"refused|all attempts") as caught:
        await open_connection(host, port)
    assert connect_failure(caught.value) is ConnectFailure.REFUSED
    assert not is_local_shortage(caught.value)


def _wrapped(*errnos: int) -> OSError:
    """An error as trio's connect by name raises it: no errno, its attempts' errors as the cause."""
    wrapper = OSError("all attempts to connect to broker:61616 failed")
    wrapper.__cause__ = ExceptionGroup("attempts", [OSError(code, "attempt") for code in errnos])
    return wrapper


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), ConnectFailure.REFUSED),
        (trio.TooSlowError(), ConnectFailure.TIMEOUT),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), ConnectFailure.TIMEOUT),
        (OSError(errno.EHOSTUNREACH, "No route to host"), ConnectFailure.UNREACHABLE),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), ConnectFailure.UNREACHABLE),
        (OSError(errno.ECONNRESET, "Connection reset by peer"), ConnectFailure.RESET),
        (OSError(errno.EMFILE, "Too many open files"), ConnectFailure.LOCAL_SHORTAGE),
        (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), ConnectFailure.LOCAL_SHORTAGE),
        (_wrapped(errno.ENETUNREACH, errno.ECONNREFUSED), ConnectFailure.REFUSED),
        (_wrapped(errno.ECONNREFUSED, errno.EMFILE), ConnectFailure.LOCAL_SHORTAGE),
        (_wrapped(errno.ETIMEDOUT), ConnectFailure.TIMEOUT),
        (OSError(-2, "Name or service not known"), ConnectFailure.OTHER),
        (OSError("no errno here"), ConnectFailure.OTHER),
    ],
)
def test_connect_failure_names_the_cause_of_a_failed_connect(
    exc: BaseException, cause: ConnectFailure
) -> None:
    assert connect_failure(exc) is cause
    assert is_local_shortage(exc) is (cause is ConnectFailure.LOCAL_SHORTAGE)


def test_connect_failure_survives_a_cycle_of_causes() -> None:
    first, second = OSError("first"), OSError(errno.ECONNRESET, "second")
    first.__cause__, second.__cause__ = second, first
    assert connect_failure(first) is ConnectFailure.RESET


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (trio.TooSlowError(), ("timed out", ConnectFailure.TIMEOUT)),
        (OSError(errno.ETIMEDOUT, "timed out"), ("timed out", ConnectFailure.TIMEOUT)),
        (ConnectionRefusedError(errno.ECONNREFUSED, "x"), ("Connection refused", ConnectFailure.REFUSED)),
        (OSError(errno.EMFILE, "x"), ("Too many open files", ConnectFailure.LOCAL_SHORTAGE)),
    ],
)
def test_connect_failed_is_the_log_lines_words_and_the_cause(
    exc: OSError | trio.TooSlowError, said: tuple[str, ConnectFailure]
) -> None:
    """What both data paths report of a failed connect (the fast path's deadline is an ETIMEDOUT,
    the trio path's a TooSlowError)."""
    assert connect_failed(exc) == said
