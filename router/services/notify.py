"""systemd's readiness protocol (`sd_notify(3)`), for a unit of `Type=notify`: routerd says READY=1
once its acceptors listen, RELOADING=1 then READY=1 around a configuration reload, STOPPING=1
when a graceful shutdown starts, and a STATUS= line with each. Without systemd (no
`NOTIFY_SOCKET` in the environment) nothing is sent and nothing changes.

The protocol is one datagram per message to the Unix socket `NOTIFY_SOCKET` names (a leading `@`
is Linux's abstract namespace). A message that cannot be sent is logged once as a WARNING: under
systemd the unit's start would then time out, and the log says why.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Notifier"]

log = logging.getLogger("router")

NOTIFY_SOCKET: Final = "NOTIFY_SOCKET"
"""The environment variable systemd sets for a unit of `Type=notify`."""


class Notifier:
    """Sends routerd's state changes to systemd (see the module docstring)."""

    __slots__ = ("_address", "_name", "_warned")

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        """Args:
        environ: where NOTIFY_SOCKET is read (default: the process's environment).
        """
        value = (os.environ if environ is None else environ).get(NOTIFY_SOCKET, "")
        self._name = value
        self._address: str | bytes | None = None
        if value.startswith("@"):
            self._address = b"\0" + value[1:].encode()
        elif value.startswith("/"):
            self._address = value
        self._warned = False

    @property
    def enabled(self) -> bool:
        """Whether systemd asked for notifications."""
        return self._address is not None

    def ready(self, status: str) -> None:
        """Started, or a reload is over (applied or refused): the service is up."""
        self._send(f"READY=1\nSTATUS={status}")

    def reloading(self) -> None:
        self._send("RELOADING=1\nSTATUS=reloading the configuration")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")

    def _send(self, message: str) -> None:
        address = self._address
        if address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot notify systemd through NOTIFY_SOCKET=%s (%s): a Type=notify unit will "
                    "not see routerd ready",
                    self._name,
                    exc.strerror or exc,
                )
