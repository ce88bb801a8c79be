"""router/services/notify.py: systemd's readiness protocol, against a real datagram socket."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import pytest

from router.services.notify import Notifier

if TYPE_CHECKING:
    from pathlib import Path


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    notifier.ready("1 acceptor(s) listening")  # no socket, no error


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_each_message_is_one_datagram(tmp_path: Path, abstract: bool) -> None:
    """Scenario: a path socket, and one in Linux's abstract namespace (`@name`, as systemd may
    give): READY, RELOADING and STOPPING arrive in order, each with its STATUS line."""
    name = f"@connection-router-test-{id(tmp_path)}" if abstract else str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name[1:] if abstract else name)
        server.settimeout(5)
        notifier = Notifier({"NOTIFY_SOCKET": name})
        assert notifier.enabled
        notifier.ready("2 acceptor(s) listening")
        notifier.reloading()
        notifier.stopping("shutting down")
        received = [server.recv(4096).decode() for _ in range(3)]
    assert received == [
        "READY=1\nSTATUS=2 acceptor(s) listening",
        "RELOADING=1\nSTATUS=reloading the configuration",
        "STOPPING=1\nSTATUS=shutting down",
    ]


def test_a_socket_that_is_gone_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    with caplog.at_level(logging.WARNING, logger="router"):
        notifier.ready("up")
        notifier.stopping("down")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot notify systemd through NOTIFY_SOCKET=" in warnings[0]
