"""TLS on acceptors: server contexts from PEM key stores, and termination of a sniffed hello.

SNI is read by our own ClientHello parser (`tls_sni`) before OpenSSL sees the bytes, the same
way for passthrough and termination; the bytes already read are then handed to trio's
`SSLStream` through `PrefixedStream`. A client certificate's subject CN is the authenticated
user (SPEC A2 USER_NAME).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, TypeVar

import trio

if TYPE_CHECKING:
    from router.config.settings import TlsConfig

__all__ = ["PrefixedStream", "certificate_user", "server_context"]

_T = TypeVar("_T", bound=trio.abc.Stream)


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """The SSL context of a terminating acceptor.

    Raises:
        ValueError: a key store or trust store that cannot be loaded (the message names the file).
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.key_store_path)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot load keyStorePath {tls.key_store_path!r} (PEM key and certificate): {exc}"
        ) from exc
    if tls.trust_store_path is not None:
        try:
            context.load_verify_locations(tls.trust_store_path)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load trustStorePath {tls.trust_store_path!r} (PEM CA bundle): {exc}"
            ) from exc
    if tls.need_client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
    elif tls.want_client_auth:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def certificate_user(stream: trio.SSLStream[_T]) -> str | None:
    """The subject CN of the client's verified certificate, or None without one."""
    certificate = stream.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


class PrefixedStream(trio.abc.Stream):
    """A stream that first yields bytes already read from it, then reads on (for SSLStream)."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
