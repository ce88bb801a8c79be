"""The native data path (router/datapath/native_path.py and its C core, router/datapath/_core.c).

Its behaviour is the fast path's: tests/router/datapath/test_fast_path.py runs every one of its
tests on both data paths. Here: choosing the data path, and what only the core has (its table of
connections growing past one chunk, its deadline lists), over real loopback sockets.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import trio

from keys import KeyType
from router.datapath.acceptor import ConnectionLimits
from router.datapath.fast_path import FastPath
from router.datapath.native_path import (
    DATA_PATH_ENV,
    DATA_PATHS,
    NATIVE,
    NativePath,
    default_data_path,
    open_fast_path,
)
from router.server import ServerInfo, serve_router
from tests.keys.test_mqtt import connect_packet
from tests.router.datapath.test_fast_path import _config, _serve_echo

if TYPE_CHECKING:
    from router.config.settings import Config

CHUNK = 1024
"""Connections per chunk of the core's table (`CHUNK` in _core.c)."""


def _noop(*args: object) -> None:
    pass


class TestChoosing:
    def test_the_c_core_is_built(self) -> None:
        assert NATIVE  # deploy/bootstrap.sh builds it; the fallback is tested, not hidden

    def test_default_is_native_unless_the_environment_says(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv(DATA_PATH_ENV, raising=False)
        assert default_data_path() == "native"
        monkeypatch.setenv(DATA_PATH_ENV, "python")
        assert default_data_path() == "python"

    def test_each_choice_opens_its_loop(self) -> None:
        assert DATA_PATHS == ("native", "python")
        python = open_fast_path("python", lambda: 0.0, _noop, 5.0)
        native = open_fast_path("native", lambda: 0.0, _noop, 5.0)
        try:
            assert type(python) is FastPath
            assert type(native) is NativePath
        finally:
            python.close_all()
            native.close_all()
        assert python.join(0)  # never started: released at once
        assert native.join(0)

    def test_unknown_choice_names_the_choices(self) -> None:
        with pytest.raises(ValueError, match=r"^data path must be one of native, python, not 'rust'$"):
            open_fast_path("rust", lambda: 0.0, _noop, 5.0)

    @pytest.mark.parametrize(
        ("argv", "env", "message"),
        [
            (["--data-path", "rust"], "", "argument --data-path: invalid choice: 'rust'"),
            ([], "rust", "--data-path ($ROUTERD_DATA_PATH) must be one of native, python, not 'rust'"),
        ],
    )
    def test_routerd_refuses_an_unknown_data_path(
        self, argv: list[str], env: str, message: str, tmp_path: object
    ) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "router", "--config", "/nonexistent.xml", *argv],
            env={"PATH": "/usr/bin:/bin", DATA_PATH_ENV: env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr


async def _start(
    nursery: trio.Nursery, config: Config, *, limits: ConnectionLimits | None = None
) -> tuple[ServerInfo, trio.Event]:
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            config,
            admin=None,
            grace_s=1,
            shutdown=shutdown,
            limits=limits,
            data_path="native",
            task_status=task_status,
        )
    )
    assert isinstance(info.fast_path, NativePath)
    return info, shutdown


async def test_table_grows_past_one_chunk_and_every_connection_relays(nursery: trio.Nursery) -> None:
    """Scenario: 1,100 connections open at once (more than one chunk of the core's table), each
    sends its own bytes and gets them back; all of them closed, none is left open and every byte
    is counted."""
    echo_port: int = await nursery.start(_serve_echo)
    info, shutdown = await _start(nursery, _config(echo_port))
    runtime, fast = info.runtimes["r"], info.fast_path
    assert fast is not None
    await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
    host, port = info.acceptors["a"]
    count = CHUNK + 76

    def open_all() -> tuple[list[bytes], int]:
        socks = [socket.create_connection((host, port), timeout=10) for _ in range(count)]
        try:
            for n, sock in enumerate(socks):
                sock.sendall(b"conn-%05d" % n)
            return [sock.recv(64) for sock in socks], fast.open_count()
        finally:
            for sock in socks:
                sock.close()

    got, open_at_once = await trio.to_thread.run_sync(open_all)
    assert got == [b"conn-%05d" % n for n in range(count)]
    assert open_at_once == count
    registry = runtime.metrics.registry
    with trio.fail_after(10):
        while fast.open_count():  # noqa: ASYNC110  # the core's thread closes them: no trio event
            await trio.sleep(0.05)
    for direction in ("client_to_target", "target_to_client"):
        labels = {"router": "r", "node_id": "b0", "direction": direction}
        assert registry.get_sample_value("router_proxied_bytes_total", labels) == 10 * count
    assert registry.get_sample_value("router_proxied_connections", {"router": "r", "node_id": "b0"}) == 0
    shutdown.set()


async def test_connect_that_never_completes_fails_at_the_deadline(nursery: trio.Nursery) -> None:
    """Scenario: once the pool is ready, the target's accept queue is made full (its SYNs are
    dropped): the core's connect deadline fails the connect, the client gets its protocol's
    refusal (CONNACK 0x88, server unavailable, as Artemis answers), and the failure is counted as
    a timeout."""
    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        target.listen(16)
        config = _config(target.getsockname()[1], key_type=KeyType.CLIENT_ID, check_period_ms=60_000)
        info, shutdown = await _start(nursery, config, limits=ConnectionLimits(connect_timeout_s=0.3))
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
        target.listen(0)  # the probe's connection, never accepted, fills the queue now
        host, port = info.acceptors["a"]

        def connect() -> bytes:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(connect_packet(client_id=b"late"))
                data = bytearray()
                while chunk := sock.recv(64):
                    data += chunk
                return bytes(data)

        with trio.fail_after(10):
            answer = await trio.to_thread.run_sync(connect)
        assert answer == b"\x20\x02\x00\x88"
        failed = runtime.metrics.registry.get_sample_value(
            "router_target_connect_failures_total", {"router": "r", "node_id": "b0", "reason": "timeout"}
        )
        assert failed == 1
        shutdown.set()
