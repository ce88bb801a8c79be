"""open_connection: raw connect for IP literals, name resolution otherwise, errors as OSError."""

from __future__ import annotations

import pytest
import trio

from router.datapath.net import describe_oserror, open_connection


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
    ],
)
def test_describe_oserror_keeps_only_the_reason(exc: OSError, text: str) -> None:
    assert describe_oserror(exc) == text
