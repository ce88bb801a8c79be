"""TLS on acceptors, in process over real loopback sockets with a trustme CA.

Passthrough: SNI peeked from the ClientHello, the encrypted bytes relayed to a TLS backend.
Termination: the router's certificate, SNI from the hello, the client certificate's CN as the
user (SPEC A2), plain TCP to the backend; a client without the required certificate is closed.
Node ids broker-a/broker-d split the names on Artemis's ring: a.example and alice go to broker-a,
b.example and carol to broker-d (checked with `routerctl route`).
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

import pytest
import trio
import trustme

from keys import KeyType
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import AcceptorConfig, Config, RouterConfig, TlsConfig
from router.datapath.tls import open_terminated, server_context
from router.server import ServerInfo, serve_router

if TYPE_CHECKING:
    from pathlib import Path

NODES = ("broker-a", "broker-d")


async def _serve_backend(
    name: bytes,
    context: ssl.SSLContext | None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A backend that names itself once the client has said something (TLS or plain)."""

    async def handler(stream: trio.SocketStream) -> None:
        conn: trio.abc.Stream = (
            stream if context is None else trio.SSLStream(stream, context, server_side=True)
        )
        try:
            async with conn:
                await conn.receive_some(100)
                await conn.send_all(b"backend " + name)
        except trio.BrokenResourceError:
            pass  # health probes connect and close at once

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


def _config(ports: list[int], key_type: KeyType, tls: TlsConfig | None) -> Config:
    connectors = tuple(
        Connector.from_url(f"c{i}", f"tcp://127.0.0.1:{port}?nodeId={NODES[i]}")
        for i, port in enumerate(ports)
    )
    router = RouterConfig(
        name="r",
        key_type=key_type,
        policy=PolicyConfig(name="CONSISTENT_HASH"),
        pool=PoolConfig(
            kind=PoolKind.STATIC, static_connectors=("c0", "c1"), check_period_ms=200, quorum_timeout_ms=0
        ),
    )
    acceptor = AcceptorConfig(
        name="tls", host="127.0.0.1", port=0, router="r", tls=tls, handshake_timeout_ms=3000
    )
    return Config(source="t.xml", connectors=connectors, acceptors=(acceptor,), routers=(router,))


async def _start(nursery: trio.Nursery, config: Config) -> tuple[str, int]:
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(config, admin=None, shutdown=shutdown, task_status=task_status)
    )
    runtime = info.runtimes["r"]
    await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 2)
    return info.acceptors["tls"]


async def _ask(address: tuple[str, int], context: ssl.SSLContext, server_hostname: str) -> bytes:
    stream = trio.SSLStream(await trio.open_tcp_stream(*address), context, server_hostname=server_hostname)
    async with stream:
        await stream.send_all(b"hi")
        return bytes(await stream.receive_some(100))


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def test_tls_passthrough_routes_by_sni(
    nursery: trio.Nursery, ca: trustme.CA, client_context: ssl.SSLContext
) -> None:
    """Scenario: the router never decrypts; each backend has the certificate for both names."""
    backend = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("a.example", "b.example").configure_cert(backend)
    ports = [await nursery.start(_serve_backend, n.encode(), backend) for n in NODES]
    address = await _start(nursery, _config(ports, KeyType.SNI_HOST, None))
    assert await _ask(address, client_context, "a.example") == b"backend broker-a"
    assert await _ask(address, client_context, "b.example") == b"backend broker-d"


async def test_tls_termination_routes_by_sni(
    nursery: trio.Nursery, ca: trustme.CA, client_context: ssl.SSLContext, tmp_path: Path
) -> None:
    key_store = tmp_path / "router.pem"
    ca.issue_cert("a.example", "b.example").private_key_and_cert_chain_pem.write_to_path(str(key_store))
    ports = [await nursery.start(_serve_backend, n.encode(), None) for n in NODES]
    address = await _start(
        nursery, _config(ports, KeyType.SNI_HOST, TlsConfig(key_store_path=str(key_store)))
    )
    assert await _ask(address, client_context, "a.example") == b"backend broker-a"
    assert await _ask(address, client_context, "b.example") == b"backend broker-d"


class TestClientCertificates:
    @pytest.fixture
    async def address(self, nursery: trio.Nursery, ca: trustme.CA, tmp_path: Path) -> tuple[str, int]:
        key_store, trust_store = tmp_path / "router.pem", tmp_path / "ca.pem"
        ca.issue_cert("router.example").private_key_and_cert_chain_pem.write_to_path(str(key_store))
        ca.cert_pem.write_to_path(str(trust_store))
        tls = TlsConfig(
            key_store_path=str(key_store), trust_store_path=str(trust_store), need_client_auth=True
        )
        ports = [await nursery.start(_serve_backend, n.encode(), None) for n in NODES]
        return await _start(nursery, _config(ports, KeyType.USER_NAME, tls))

    @pytest.mark.parametrize(("user", "node"), [("alice", "broker-a"), ("carol", "broker-d")])
    async def test_tls_client_certificate_cn_is_the_user(
        self, address: tuple[str, int], ca: trustme.CA, client_context: ssl.SSLContext, user: str, node: str
    ) -> None:
        ca.issue_cert(f"{user}@example", common_name=user).configure_cert(client_context)
        assert await _ask(address, client_context, "router.example") == f"backend {node}".encode()

    async def test_tls_missing_required_certificate_is_closed(
        self, address: tuple[str, int], client_context: ssl.SSLContext, caplog: pytest.LogCaptureFixture
    ) -> None:
        with pytest.raises(trio.BrokenResourceError):
            await _ask(address, client_context, "router.example")
        assert any("protocol=tls handshake failed" in r.getMessage() for r in caplog.records)


def test_server_context_names_the_unloadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(
        ValueError, match=r"cannot load keyStorePath '.*nope.pem' \(PEM key and certificate\)"
    ):
        server_context(TlsConfig(key_store_path=str(missing)))


class TestServerContextErrors:
    """Scenario: a key store or trust store OpenSSL refuses with a bare "PEM lib"; the error says
    what the file lacks."""

    @pytest.fixture
    def leaf(self, ca: trustme.CA) -> trustme.LeafCert:
        return ca.issue_cert("router.example")

    @staticmethod
    def _write(path: Path, *blobs: trustme.Blob) -> str:
        path.write_bytes(b"".join(blob.bytes() for blob in blobs))
        return str(path)

    def _error(self, tls: TlsConfig) -> str:
        with pytest.raises(ValueError, match=r"^(key|trust)StorePath '") as info:
            server_context(tls)
        return str(info.value)

    def test_server_context_certificate_without_private_key(
        self, tmp_path: Path, leaf: trustme.LeafCert
    ) -> None:
        path = self._write(tmp_path / "cert.pem", *leaf.cert_chain_pems)
        assert self._error(TlsConfig(key_store_path=path)) == (
            f"keyStorePath {path!r} has a certificate but no private key"
        )

    def test_server_context_private_key_without_certificate(
        self, tmp_path: Path, leaf: trustme.LeafCert
    ) -> None:
        path = self._write(tmp_path / "key.pem", leaf.private_key_pem)
        assert self._error(TlsConfig(key_store_path=path)) == (
            f"keyStorePath {path!r} has a private key but no certificate"
        )

    def test_server_context_key_of_another_certificate(
        self, tmp_path: Path, ca: trustme.CA, leaf: trustme.LeafCert
    ) -> None:
        other = ca.issue_cert("other.example")
        path = self._write(tmp_path / "mixed.pem", other.private_key_pem, *leaf.cert_chain_pems)
        assert self._error(TlsConfig(key_store_path=path)) == (
            f"keyStorePath {path!r} has a private key that does not match the certificate "
            "(the first certificate in the file must be the key's own)"
        )

    def test_server_context_no_pem_at_all(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.pem"
        path.write_bytes(b"not PEM\n")
        assert self._error(TlsConfig(key_store_path=str(path))) == (
            f"keyStorePath {str(path)!r} holds no PEM private key and no PEM certificate"
        )

    def test_server_context_encrypted_private_key(self, tmp_path: Path, leaf: trustme.LeafCert) -> None:
        """Scenario: OpenSSL would prompt for the password on the terminal; routerd has none."""
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
        encrypted = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
        path = tmp_path / "encrypted.pem"
        path.write_bytes(encrypted + b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        assert self._error(TlsConfig(key_store_path=str(path))) == (
            f"keyStorePath {str(path)!r} has an encrypted private key, which routerd cannot use "
            f"(write it unencrypted with: openssl pkey -in {path} -out key.pem)"
        )

    def test_server_context_trust_store_without_certificate(
        self, tmp_path: Path, leaf: trustme.LeafCert
    ) -> None:
        key_store = self._write(tmp_path / "router.pem", leaf.private_key_and_cert_chain_pem)
        trust_store = self._write(tmp_path / "ca.pem", leaf.private_key_pem)
        assert self._error(TlsConfig(key_store_path=key_store, trust_store_path=trust_store)) == (
            f"trustStorePath {trust_store!r} holds no PEM certificate "
            "(expected a CA bundle of -----BEGIN CERTIFICATE----- blocks)"
        )

    def test_server_context_loads_a_good_key_store(self, tmp_path: Path, leaf: trustme.LeafCert) -> None:
        path = self._write(tmp_path / "router.pem", leaf.private_key_and_cert_chain_pem)
        assert isinstance(server_context(TlsConfig(key_store_path=path)), ssl.SSLContext)


def _client_then(port: int, context: ssl.SSLContext, end: str) -> bytes:
    """A blocking TLS client: handshake, "ping", the answer; then `end`: "close_notify" (a TLS
    close, then the socket's) or "ragged" (the socket closed without close_notify)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = context.wrap_socket(raw, server_hostname="a.example")
    try:
        tls.sendall(b"ping")
        answer = tls.recv(100)
        if end == "close_notify":
            tls.unwrap()  # sends close_notify (and waits for the server's)
        return answer
    finally:
        tls.close()


async def _terminated(
    ca: trustme.CA, client_context: ssl.SSLContext, tmp_path: Path, end: str
) -> type[BaseException] | bytes:
    """One connection through `open_terminated`: what the read after the client's end gave (its
    bytes, or the error's type)."""
    key_store = tmp_path / "router.pem"
    ca.issue_cert("a.example").private_key_and_cert_chain_pem.write_to_path(str(key_store))
    context = server_context(TlsConfig(key_store_path=str(key_store)))
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with listener, trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, _client_then, port, client_context, end)
        async with await listener.accept() as client:
            with trio.fail_after(10):
                stream = await open_terminated(client, b"", context)
                async with stream:
                    assert await stream.receive_some(100) == b"ping"
                    await stream.send_all(b"pong")
                    try:
                        return await stream.receive_some(100)
                    except trio.BrokenResourceError as exc:
                        return type(exc)
    raise AssertionError("unreachable")


async def test_terminated_tls_reads_close_notify_as_eof(
    ca: trustme.CA, client_context: ssl.SSLContext, tmp_path: Path
) -> None:
    assert await _terminated(ca, client_context, tmp_path, "close_notify") == b""


async def test_terminated_tls_breaks_on_eof_without_close_notify(
    ca: trustme.CA, client_context: ssl.SSLContext, tmp_path: Path
) -> None:
    """As trio.SSLStream: a truncation is no clean end (the relay reports the connection RESET)."""
    assert await _terminated(ca, client_context, tmp_path, "ragged") is trio.BrokenResourceError


async def test_terminated_tls_failed_handshake_is_broken_with_the_ssl_error(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """A client that does not trust the certificate: BrokenResourceError, its cause the SSLError."""
    key_store = tmp_path / "router.pem"
    ca.issue_cert("a.example").private_key_and_cert_chain_pem.write_to_path(str(key_store))
    context = server_context(TlsConfig(key_store_path=str(key_store)))
    untrusting = ssl.create_default_context()  # the system's CAs, not trustme's

    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, pytest.raises(ssl.SSLError):
            untrusting.wrap_socket(raw, server_hostname="a.example")

    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with listener, trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, client, port)
        async with await listener.accept() as accepted:
            with trio.fail_after(10), pytest.raises(trio.BrokenResourceError) as raised:
                await open_terminated(accepted, b"", context)
    assert isinstance(raised.value.__cause__, ssl.SSLError)


def _nagle_client(port: int, context: ssl.SSLContext) -> bytes:
    """A blocking TLS 1.3 client whose socket keeps Nagle's algorithm (as paho's does): handshake,
    one small request at once, its answer."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="a.example") as tls,
    ):
        tls.sendall(b"ping")
        return tls.recv(100)


async def test_open_terminated_acknowledges_the_handshake_at_once(
    ca: trustme.CA, client_context: ssl.SSLContext, tmp_path: Path
) -> None:
    """Scenario: the first request of a Nagle client arrives within a few ms of the handshake.
    trio sends a TLS 1.3 server's session tickets only with its first write, so before the fix
    nothing carried the ACK of the client's Finished; the kernel delayed it, and the client held
    its request back until then (40 ms)."""
    key_store = tmp_path / "router.pem"
    ca.issue_cert("a.example").private_key_and_cert_chain_pem.write_to_path(str(key_store))
    context = server_context(TlsConfig(key_store_path=str(key_store)))
    waits: list[float] = []
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    async with listener, trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(trio.to_thread.run_sync, _nagle_client, port, client_context)
            async with await listener.accept() as client:
                with trio.fail_after(10):
                    stream = await open_terminated(client, b"", context)
                    handshaken = trio.current_time()
                    assert await stream.receive_some(100) == b"ping"
                waits.append(trio.current_time() - handshaken)
                await stream.send_all(b"pong")
    assert sorted(waits)[2] < 0.020, f"request after the handshake in s: {sorted(waits)}"
