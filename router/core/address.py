"""A TCP endpoint as (host, port): peers of client connections and the members connected to.

Pure. It stays a pair until a log line formats it (`str`): IPv6 hosts in brackets, so
`[::1]:5000` and `127.0.0.1:5000` read the same way on both data paths.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = ["Address", "endpoint"]


class Address(NamedTuple):
    """(host, port); equal to the plain tuple a socket gives, so it compares with one."""

    host: str
    """An IP literal without brackets, or a host name."""
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    @classmethod
    def of(cls, sockname: tuple[object, ...]) -> Address:
        """The address of an AF_INET/AF_INET6 socket name as `getpeername()`, `getsockname()` and
        `accept()` give it (IPv6 names have two more fields, flow info and scope id: dropped).

        Raises:
            TypeError: not an internet socket name.
        """
        if len(sockname) < 2 or not isinstance(sockname[0], str) or not isinstance(sockname[1], int):
            raise TypeError(f"not an internet socket name: {sockname!r}")
        return cls(sockname[0], sockname[1])


@functools.lru_cache(maxsize=4096)
def endpoint(host: str, port: int) -> Address:
    """The one `Address` of a member (host, port), shared by every connection to it (the cache is
    bounded: a fleet has far fewer members)."""
    return Address(host, port)
