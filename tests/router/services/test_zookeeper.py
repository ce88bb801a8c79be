"""The kernel's ZooKeeper client against a real ZooKeeper (no mocks), and kazoo's log lines."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio

from router.services.zookeeper import NodeExistsError, Session, ZooKeeper, ZooKeeperError

if TYPE_CHECKING:
    from tests.router.conftest import ZooKeeperServer

DEADLINE_S = 15.0
SESSION_TIMEOUT_MS = 2000


def test__kazoo_log_filter_turns_kazoo_warnings_into_debug(caplog: pytest.LogCaptureFixture) -> None:
    """kazoo warns at every reconnection attempt; we log each session transition once ourselves."""
    kazoo_log = logging.getLogger("router.discovery.kazoo")
    caplog.set_level(logging.INFO, logger=kazoo_log.name)
    kazoo_log.warning("Connection dropped: %s", "first")
    kazoo_log.error("Unhandled exception in connection loop")
    caplog.set_level(logging.DEBUG, logger=kazoo_log.name)
    kazoo_log.warning("Connection dropped: %s", "second")
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == kazoo_log.name] == [
        ("ERROR", "Unhandled exception in connection loop"),
        ("DEBUG", "Connection dropped: second"),
    ]


class TestZooKeeper:
    async def test_zookeeper_create_read_delete(self, zookeeper: ZooKeeperServer) -> None:
        path = "/test-zookeeper/create-read-delete"  # this test's own, under the session's ZooKeeper
        client = ZooKeeper(zookeeper.connect, SESSION_TIMEOUT_MS)
        states: list[Session] = []
        connected = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def on_session(state: Session) -> None:  # in kazoo's thread
            states.append(state)
            if state is Session.CONNECTED:
                token.run_sync_soon(connected.set)

        client.on_session(on_session)
        client.start()
        try:
            with trio.fail_after(DEADLINE_S):
                await connected.wait()
            assert await client.read_members(path) is None
            await trio.to_thread.run_sync(client.create_ephemeral, f"{path}/a", b"1")
            with pytest.raises(NodeExistsError):
                await trio.to_thread.run_sync(client.create_ephemeral, f"{path}/a", b"2")
            assert await client.read_members(path) == {"a": b"1"}
            with pytest.raises(ZooKeeperError, match=f"create {path}/a/b: NoChildrenForEphemeralsError"):
                await trio.to_thread.run_sync(client.create_ephemeral, f"{path}/a/b", b"")
            assert await trio.to_thread.run_sync(client.delete_own, f"{path}/a") is True
            assert await trio.to_thread.run_sync(client.delete_own, f"{path}/a") is False
        finally:
            await client.aclose()
        assert states[-1] is Session.LOST
