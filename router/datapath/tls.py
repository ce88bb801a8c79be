"""TLS on acceptors: server contexts from PEM key stores, and termination of a sniffed hello.

SNI is read by our own ClientHello parser (`tls_sni`) before OpenSSL sees the bytes, the same
way for passthrough and termination; the bytes already read are then handed to trio's
`SSLStream` through `PrefixedStream` (`open_terminated`). A client certificate's subject CN is
the authenticated user (SPEC A2 USER_NAME).

After the handshake, our ACK of the client's last flight is sent at once (`TCP_QUICKACK`). trio
holds a TLS 1.3 server's session tickets back until the first application write, so nothing
carries that ACK; the kernel delays it (about 40 ms), and a client with Nagle's algorithm on (as
paho-mqtt's socket is) holds its first request until then: 40 ms on every first exchange.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
from typing import TYPE_CHECKING, Final, NoReturn, TypeVar

import trio

if TYPE_CHECKING:
    from router.config.settings import TlsConfig

__all__ = ["PrefixedStream", "certificate_user", "open_terminated", "server_context"]

_T = TypeVar("_T", bound=trio.abc.Stream)

_PEM_SCAN_BYTES: Final = 1024 * 1024
"""How much of a key store is read to say what it lacks (PEM key stores are a few KB)."""
_PEM_CERTIFICATE: Final = re.compile(rb"-----BEGIN (?:TRUSTED )?CERTIFICATE-----")
_PEM_PRIVATE_KEY: Final = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")
_TCP_QUICKACK: Final[int | None] = getattr(socket, "TCP_QUICKACK", None)
"""Linux only; elsewhere the ACK keeps the kernel's timing."""


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """The SSL context of a terminating acceptor.

    Raises:
        ValueError: a key store or trust store that cannot be loaded; the message names the
            parameter and the file, and says what is wrong when it can tell ("keyStorePath
            'router.pem' has a certificate but no private key").
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    path = tls.key_store_path
    try:
        context.load_cert_chain(path, password=lambda: _encrypted_key(path))
    except (OSError, ssl.SSLError) as exc:
        problem = _key_store_problem(path, exc)
        if problem is not None:
            raise ValueError(f"keyStorePath {path!r} {problem}") from exc
        raise ValueError(f"cannot load keyStorePath {path!r} (PEM key and certificate): {exc}") from exc
    if tls.trust_store_path is not None:
        try:
            context.load_verify_locations(tls.trust_store_path)
        except (OSError, ssl.SSLError) as exc:
            if isinstance(exc, ssl.SSLError) and exc.reason == "NO_CERTIFICATE_OR_CRL_FOUND":
                raise ValueError(
                    f"trustStorePath {tls.trust_store_path!r} holds no PEM certificate "
                    "(expected a CA bundle of -----BEGIN CERTIFICATE----- blocks)"
                ) from exc
            raise ValueError(
                f"cannot load trustStorePath {tls.trust_store_path!r} (PEM CA bundle): {exc}"
            ) from exc
    if tls.need_client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
    elif tls.want_client_auth:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def _encrypted_key(path: str) -> NoReturn:
    """OpenSSL asks for a password: the key is encrypted. Without this callback OpenSSL would
    prompt on the terminal, or fail with a bare "PEM lib"."""
    raise ValueError(
        f"keyStorePath {path!r} has an encrypted private key, which routerd cannot use "
        f"(write it unencrypted with: openssl pkey -in {path} -out key.pem)"
    )


def _key_store_problem(path: str, exc: OSError) -> str | None:
    """What a PEM key store that OpenSSL refused lacks, in words; None when we cannot tell.

    OpenSSL says "key values mismatch" for a key of another certificate, and only "PEM lib" for
    a missing key or certificate, so the file's PEM blocks are looked at.
    """
    if isinstance(exc, ssl.SSLError) and exc.reason == "KEY_VALUES_MISMATCH":
        return (
            "has a private key that does not match the certificate "
            "(the first certificate in the file must be the key's own)"
        )
    if not isinstance(exc, ssl.SSLError):
        return None  # the file itself cannot be read: the OSError says why
    try:
        with open(path, "rb") as file:
            data = file.read(_PEM_SCAN_BYTES)
    except OSError:
        return None
    has_certificate = _PEM_CERTIFICATE.search(data) is not None
    has_key = _PEM_PRIVATE_KEY.search(data) is not None
    if has_certificate and not has_key:
        return "has a certificate but no private key"
    if has_key and not has_certificate:
        return "has a private key but no certificate"
    if not has_key and not has_certificate:
        return "holds no PEM private key and no PEM certificate"
    return None


async def open_terminated(
    client: trio.SocketStream, hello: bytes, context: ssl.SSLContext
) -> trio.SSLStream[PrefixedStream]:
    """TLS terminated on `client`, whose first bytes `hello` (the ClientHello) were read already:
    the handshake done, and its last flight acknowledged at once. The caller's cancel scope is the
    deadline; the caller closes the stream.

    Raises:
        trio.BrokenResourceError: the handshake failed (an `ssl.SSLError` as its cause).
    """
    stream = trio.SSLStream(PrefixedStream(client, hello), context, server_side=True)
    await stream.do_handshake()
    _acknowledge_now(client)
    return stream


def _acknowledge_now(client: trio.SocketStream) -> None:
    """Send the ACK the kernel would delay for what `client` has read (module docstring).

    TCP_QUICKACK set to 1 sends a pending ACK at once (tcp(7)); it is not sticky, so later
    acknowledgements keep the kernel's own timing. A socket the client reset already is no error.
    """
    if _TCP_QUICKACK is None:
        return
    with contextlib.suppress(OSError):
        client.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)


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
