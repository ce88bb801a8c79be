"""A cache shared through ZooKeeper: where a key's entry lives and what it holds. Pure: no I/O, no
clock (times are arguments, wall-clock seconds).

Layout under the configured path: one persistent znode per key,

    PATH/BB/kNAME      BB: the key's bucket, two hex digits (CRC-32 of the key, mod 256)
                       NAME: the key's UTF-8 bytes in unpadded URL-safe base64

so no parent holds more than about 1/256 of the keys (ZooKeeper answers a listing in one packet,
bounded by `jute.maxbuffer`, 1 MB by default: 100,000 keys in one parent would not fit), and any
key, whatever its characters, is a valid znode name (`k` first: never `.` or `..`).

A znode's data is a small JSON object, `{"node_id": "b1", "until": 1764000000.5}`: the node id
routers send the key to, and when the entry expires (wall clock; `null`: never). Routers extend
`until` as they use the key (`touch_due`), so expiry stays expire-after-access across routers.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
import zlib
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

__all__ = [
    "BUCKETS",
    "DATA_MAX",
    "UNANSWERED",
    "Answer",
    "SharedEntry",
    "Unanswered",
    "bucket_path",
    "key_of",
    "touch_due",
    "znode_of",
]

BUCKETS: Final = 256
"""Buckets (parent znodes) the keys are spread over."""
DATA_MAX: Final = 4096
"""Longest znode data read as an entry; longer is not ours (ignored, overwritten)."""


def bucket_path(path: str, bucket: int) -> str:
    """The parent znode of one bucket."""
    return f"{path}/{bucket:02x}"


def znode_of(path: str, key: str) -> str:
    """The znode of a key's entry."""
    data = key.encode("utf-8", "surrogatepass")
    name = base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
    return f"{bucket_path(path, zlib.crc32(data) % BUCKETS)}/k{name}"


def key_of(name: str) -> str | None:
    """The key a znode name stands for; None when the name is not one of ours."""
    if not name.startswith("k"):
        return None
    text = name[1:]
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
        return data.decode("utf-8", "surrogatepass")
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedEntry:
    """One key's entry in ZooKeeper, as read (or written) at `version`."""

    node_id: str
    until: float | None
    """When it expires, wall clock; None: never (a cache without timeout)."""
    version: int = -1
    """The znode's data version when read; -1: not known."""
    ours: bool = False
    """This router wrote this version (a claim or an extension), as far as it knows: no other
    router has changed it since."""

    def to_data(self) -> bytes:
        """The znode's data."""
        return json.dumps({"node_id": self.node_id, "until": self.until}, separators=(",", ":")).encode()

    @classmethod
    def from_data(cls, data: bytes, version: int) -> SharedEntry | None:
        """Read a znode's data; None when it is not an entry (another program's, damaged)."""
        if len(data) > DATA_MAX:
            return None
        try:
            document = json.loads(data)
        except ValueError:
            return None
        if not isinstance(document, dict):
            return None
        node_id, until = document.get("node_id"), document.get("until")
        if not isinstance(node_id, str) or not node_id:
            return None
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))):
            return None
        if until is not None and not math.isfinite(until):
            return None
        return cls(node_id=node_id, until=None if until is None else float(until), version=version)

    def expired(self, now: float) -> bool:
        """Whether it has expired at wall-clock time `now`."""
        return self.until is not None and self.until <= now


class Unanswered(enum.Enum):
    """ZooKeeper did not answer a decision's question (not connected, an error, too slow)."""

    UNANSWERED = "unanswered"


UNANSWERED: Final = Unanswered.UNANSWERED

Answer: TypeAlias = "SharedEntry | Literal[Unanswered.UNANSWERED] | None"
"""What the shared cache says of a key: its entry, UNANSWERED, or None (there is none)."""


def touch_due(entry: SharedEntry, now: float, timeout_s: float) -> bool:
    """Whether a router that used the key should extend the entry's `until` now: when less than
    half the timeout is left. So each key costs at most about two writes per timeout, however many
    routers use it and however often."""
    return entry.until is not None and entry.until - now < timeout_s / 2
