"""TLS on acceptors: server contexts from PEM key stores, and termination of a sniffed hello.

SNI is read by our own ClientHello parser (`tls_sni`) before OpenSSL sees the bytes, the same
way for passthrough and termination; the bytes already read are then fed to the TLS engine of
`TerminatedTls` (`open_terminated`), a lean stand-in for trio's `SSLStream` (it cut routerd's CPU
per TLS connection by about a tenth). A client certificate's subject CN is the authenticated user
(SPEC A2 USER_NAME).

After the handshake, our ACK of the client's last flight is sent at once (`TCP_QUICKACK`). A TLS
1.3 server's session tickets are held back until the first application write (as trio does), so
nothing carries that ACK; the kernel delays it (about 40 ms), and a client with Nagle's algorithm on (as
paho-mqtt's socket is) holds its first request until then: 40 ms on every first exchange.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
from typing import TYPE_CHECKING, Final, NoReturn

import trio

if TYPE_CHECKING:
    from router.config.settings import TlsConfig

__all__ = ["TerminatedTls", "certificate_user", "open_terminated", "server_context"]


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


async def open_terminated(client: trio.SocketStream, hello: bytes, context: ssl.SSLContext) -> TerminatedTls:
    """TLS terminated on `client`, whose first bytes `hello` (the ClientHello) were read already:
    the handshake done, and its last flight acknowledged at once. The caller's cancel scope is the
    deadline; the caller closes the stream.

    Raises:
        trio.BrokenResourceError: the handshake failed (an `ssl.SSLError` as its cause).
    """
    stream = TerminatedTls(client, hello, context)
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


def certificate_user(stream: TerminatedTls) -> str | None:
    """The subject CN of the client's verified certificate, or None without one."""
    certificate = stream.ssl_object.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for name, value in rdn:  # type: ignore[str-unpack]  # typeshed's union; a subject is RDN tuples
            if name == "commonName":
                return str(value)
    return None


_RECEIVE_BYTES: Final = 64 * 1024
"""Decrypted bytes returned at most per `TerminatedTls.receive_some()` without a size; a TLS
record holds at most 16 KiB, and one read returns one record."""


class TerminatedTls(trio.abc.Stream):
    """TLS terminated by us over a client's socket: an `ssl.SSLObject` on memory BIOs.

    It behaves as `trio.SSLStream` (server side, not https-compatible) does for one receiving and
    one sending task: a failed handshake or a TLS error breaks it (`trio.BrokenResourceError`,
    the `ssl.SSLError` as its cause), as does a client's EOF without close_notify; a close_notify
    reads as EOF; a TLS 1.3 server's session tickets wait for the first write (module docstring);
    `aclose()` sends close_notify without waiting for the client's. It is leaner: one receive or
    send on the socket per read or write that needs one, no retry loop, and a lock only around
    sends (bytes the receiving task must send, a key update's answer, are kept in order with the
    sending task's).
    """

    def __init__(self, client: trio.SocketStream, hello: bytes, context: ssl.SSLContext) -> None:
        self._client = client
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        if hello:
            self._incoming.write(hello)
        self._held = b""
        """TLS 1.3 session tickets, sent with the first write."""
        self._sending = trio.StrictFIFOLock()
        self._broken = False
        self._closed = False

    async def do_handshake(self) -> None:
        """The server's side of the handshake (once).

        Raises:
            trio.BrokenResourceError: it failed (an `ssl.SSLError` as its cause) or the client
                broke the connection.
        """
        tls = self._ssl
        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    flight = self._outgoing.read()
                    if flight:
                        await self._send(flight)
                    await self._receive_raw()
                except (ssl.SSLError, ssl.CertificateError) as exc:
                    raise trio.BrokenResourceError from exc
        except BaseException:
            self._broken = True
            raise
        rest = self._outgoing.read()
        if tls.version() == "TLSv1.3":
            self._held = rest
        elif rest:
            await self._send(rest)

    @property
    def ssl_object(self) -> ssl.SSLObject:
        """The TLS engine (the client's certificate: `getpeercert()`)."""
        return self._ssl

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        self._check()
        tls = self._ssl
        size = _RECEIVE_BYTES if max_bytes is None else max_bytes
        waited = False
        while True:
            try:
                data = tls.read(size)
                break
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLError, ssl.CertificateError) as exc:
                self._broken = True
                raise trio.BrokenResourceError from exc
            answer = self._outgoing.read()
            if answer:
                waited |= await self._send(answer)
            waited |= await self._receive_raw()
        answer = self._outgoing.read()
        if answer:
            waited |= await self._send(answer)
        if not waited:  # every receive yields (a busy client cannot starve the others), and
            await trio.lowlevel.cancel_shielded_checkpoint()  # what it read is not lost to a cancel
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt and send. A send the socket takes at once does not pass through trio's
        scheduler (the relay's receive, which always does, keeps each pump fair)."""
        self._check()
        if not data:
            await trio.lowlevel.checkpoint()
            return
        try:
            self._ssl.write(data)
        except (ssl.SSLError, ssl.CertificateError) as exc:
            self._broken = True
            raise trio.BrokenResourceError from exc
        await self._send(self._outgoing.read())

    async def wait_send_all_might_not_block(self) -> None:
        self._check()
        async with self._sending:
            await self._client.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send close_notify (unless broken) and close the socket."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            if not self._broken:
                with contextlib.suppress(ssl.SSLError):
                    self._ssl.unwrap()  # close_notify out; the client's is not waited for
                farewell = self._outgoing.read()
                if farewell:
                    with contextlib.suppress(trio.BrokenResourceError):
                        await self._send(farewell)
        except BaseException:
            self._closed = True
            await trio.aclose_forcefully(self._client)
            raise
        self._closed = True
        await self._client.aclose()

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError
        if self._broken:
            raise trio.BrokenResourceError

    async def _receive_raw(self) -> bool:
        """One receive from the socket into the TLS engine (EOF included); whether it waited (a
        checkpoint). A receive cut short loses nothing, so it breaks nothing (as in
        `trio.SSLStream`). The socket is read directly, and waited for only when it has nothing:
        each call through trio's socket layer costs one or two passes through its scheduler."""
        sock = self._client.socket
        waited = False
        while True:
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the client's socket was closed")
            try:
                data = os.read(fd, _RECEIVE_BYTES)
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                waited = True
            except OSError as exc:
                raise trio.BrokenResourceError from exc
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()
        return waited

    async def _send(self, data: bytes) -> bool:
        """Send TLS bytes in the order they left the engine; whether it waited (a checkpoint). A
        send cut short breaks the stream. What the socket takes at once is written directly."""
        if self._held:
            data, self._held = self._held + data, b""
        sending = self._sending
        try:
            if sending.locked():
                await sending.acquire()
                waited = True
            else:
                sending.acquire_nowait()  # no checkpoint: the order the bytes left the engine holds
                waited = False
            try:
                fd = self._client.socket.fileno()
                if fd < 0:
                    raise trio.ClosedResourceError("the client's socket was closed")
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    raise trio.BrokenResourceError from exc
                if sent < len(data):
                    await self._client.send_all(memoryview(data)[sent:])
                    waited = True
            finally:
                sending.release()
        except BaseException:
            self._broken = True
            raise
        return waited
