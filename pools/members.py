"""Members of a discovery pool: the znode document format, ZooKeeper names, and the membership diff.

A discovery pool fed by ZooKeeper has one ephemeral znode per member under the group's path, whose
data is a JSON object (UTF-8):

    {"node_id": "broker-1", "connector": "tcp://10.0.0.1:61616?probe=mqtt",
     "backup": "tcp://10.0.0.2:61616", "weight": 1}

`node_id` and `connector` (the primary) are required; `backup` (the passive member of an HA pair,
no parameters of its own) and `weight` (1-1000000, default 1) are optional; any other key is an
error. `routerctl register` names the znode after the node id (`znode_name`), so a second
registration of one node id finds the znode taken.

Pure code: bytes and names in, members and diffs out. Reading ZooKeeper and feeding the diff into
the pool is `router/features/discovery/service.py`'s job. `Membership` is the one place that decides which
documents are members: a malformed document, or a node id that is already taken, is rejected and
reported once (until its data or the reason changes), and never reaches the pool.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pools.target import MAX_WEIGHT, Connector, Target

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAX_MEMBER_BYTES",
    "MAX_SESSION_TIMEOUT_MS",
    "MAX_WEIGHT",
    "Member",
    "Membership",
    "MembershipDiff",
    "Rejected",
    "check_znode_path",
    "parse_ensemble",
    "parse_member",
    "znode_name",
]

MAX_MEMBER_BYTES: Final = 16 * 1024
"""Largest member document read; a real one is about 150 bytes (ZooKeeper itself allows 1 MiB,
its `jute.maxbuffer` default, which is far more than a pool member should ever hold)."""

MAX_SESSION_TIMEOUT_MS: Final = 2**31 - 1
"""A ZooKeeper session timeout is a Java int of milliseconds; kazoo fails with a traceback above."""

MAX_NODE_ID_LENGTH: Final = 255
"""Longest node id: a znode name is a path segment, and node ids label log lines and metrics."""

_FIELDS: Final = frozenset({"node_id", "connector", "backup", "weight"})


def _has_control(text: str) -> bool:
    # C0, DEL and C1: they would break a log line or a znode name (ZooKeeper rejects most of them).
    return any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in text)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _tcp_connector(name: str, url: str, what: str) -> Connector:
    if not url.strip().lower().startswith("tcp://"):
        raise ValueError(f"{what} must be a tcp://host:port URL, got {url!r}")
    try:
        return Connector.from_url(name, url)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One member of a discovery pool, as its znode describes it."""

    node_id: str
    """The broker's node id: its identity in the pool, the cache and the metrics."""
    connector: Connector
    """How to reach the primary (named after the node id; `probe=` and other parameters kept)."""
    backup: Connector | None = None
    """The backup of the broker's HA pair (a single address, no parameters), if any."""
    weight: int = 1
    """Relative weight, 1-MAX_WEIGHT: the target's weight (CONSISTENT_HASH with RING=KETAMA gives it
    a share of the keys in proportion; the other policies ignore it)."""

    def __post_init__(self) -> None:
        if not self.node_id or len(self.node_id) > MAX_NODE_ID_LENGTH:
            raise ValueError(f"node_id must be 1-{MAX_NODE_ID_LENGTH} characters, got {self.node_id!r}")
        if _has_control(self.node_id) or self.node_id in (".", ".."):
            raise ValueError(
                f"node_id must not be '.', '..' or hold control characters, got {self.node_id!r}"
            )
        if not self.node_id.isascii() and _has_lone_surrogate(self.node_id):
            # JSON's "\ud800" escape decodes to one; a znode name, a metric label and the ketama
            # ring's md5 all need the node id as UTF-8, which cannot hold it.
            raise ValueError(f"node_id must not hold a lone surrogate, got {self.node_id!r}")
        if self.connector.node_id != self.node_id:
            raise ValueError(
                f"connector names node id {self.connector.node_id!r} (nodeId=…), "
                f"the member is {self.node_id!r}"
            )
        if self.connector.backups:
            raise ValueError("connector must be a single tcp://host:port; give the backup as backup")
        if "weight" in self.connector.param_map:
            raise ValueError(
                f"connector has a weight= parameter, give the weight as weight: {self.connector.url!r}"
            )
        if self.backup is not None and (self.backup.params or self.backup.backups):
            raise ValueError(
                f"backup takes no parameters (put them on the connector), got {self.backup.url!r}"
            )
        if isinstance(self.weight, bool) or not 1 <= self.weight <= MAX_WEIGHT:
            raise ValueError(f"weight must be an integer 1-{MAX_WEIGHT}, got {self.weight!r}")

    @classmethod
    def from_fields(
        cls, *, node_id: str, connector: str, backup: str | None = None, weight: int = 1
    ) -> Member:
        """A member from its document's fields (the parser and `routerctl register` share this).

        Raises:
            ValueError: a field breaks its rule; the message names the field and quotes the value.
        """
        if not node_id:
            raise ValueError(f"node_id must be 1-{MAX_NODE_ID_LENGTH} characters, got {node_id!r}")
        primary = _tcp_connector(node_id, connector, "connector")
        second = None if backup is None else _tcp_connector(node_id, backup, "backup")
        return cls(node_id=node_id, connector=primary, backup=second, weight=weight)

    def target(self) -> Target:
        """The pool target of this member: an HA pair when it has a backup."""
        connector = self.connector
        if self.backup is not None:
            connector = dataclasses.replace(connector, backups=((self.backup.host, self.backup.port),))
        return Target(node_id=self.node_id, connector=connector, weight=self.weight)

    def to_document(self) -> bytes:
        """The znode data of this member (what `parse_member` reads back)."""
        document: dict[str, str | int] = {
            "node_id": self.node_id,
            "connector": _url_with_params(self.connector),
        }
        if self.backup is not None:
            document["backup"] = self.backup.url
        if self.weight != 1:
            document["weight"] = self.weight
        return json.dumps(document, sort_keys=True).encode()

    def describe(self) -> str:
        """`tcp://primary` or `(tcp://primary,tcp://backup)`, for log lines."""
        if self.backup is None:
            return self.connector.url
        return f"({self.connector.url},{self.backup.url})"


def _url_with_params(connector: Connector) -> str:
    if not connector.params:
        return connector.url
    query = ";".join(
        f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}" for k, v in connector.params
    )
    return f"{connector.url}?{query}"


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document: dict[str, object] = {}
    for key, value in pairs:
        if key in document:
            raise ValueError(f"key {key!r} given twice")
        document[key] = value
    return document


def parse_member(data: bytes) -> Member:
    """Parse and validate a member's znode data.

    Args:
        data: the znode's data, a UTF-8 JSON object (see the module docstring).

    Returns:
        The member.

    Raises:
        ValueError: the data is not such a document; the message says which rule and quotes at most
            64 bytes of the data.
    """
    if len(data) > MAX_MEMBER_BYTES:
        raise ValueError(f"document is {len(data)} bytes, more than {MAX_MEMBER_BYTES}")
    try:
        document = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError:
        raise ValueError(f"document is not UTF-8: {data[:64]!r}") from None
    except RecursionError:
        raise ValueError("document nests too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, or a duplicate key from the hook
        raise ValueError(f"document is not a JSON object: {exc}: {data[:64]!r}") from None
    if not isinstance(document, dict):
        raise ValueError(f"document must be a JSON object, got {type(document).__name__}: {data[:64]!r}")
    unknown = sorted(set(document) - _FIELDS)
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(_FIELDS))})"
        )
    node_id, connector = document.get("node_id"), document.get("connector")
    backup, weight = document.get("backup"), document.get("weight", 1)
    if not isinstance(node_id, str):
        raise ValueError(f"node_id must be a string, got {node_id!r}")
    if not isinstance(connector, str):
        raise ValueError(f"connector must be a string, got {connector!r}")
    if backup is not None and not isinstance(backup, str):
        raise ValueError(f"backup must be a string or absent, got {backup!r}")
    if not isinstance(weight, int) or isinstance(weight, bool):
        raise ValueError(f"weight must be an integer 1-{MAX_WEIGHT}, got {weight!r}")
    return Member.from_fields(node_id=node_id, connector=connector, backup=backup, weight=weight)


def znode_name(node_id: str) -> str:
    """The znode name `routerctl register` gives a member: the node id, percent-encoded where it
    holds `/`, `%` or characters outside printable ASCII (ZooKeeper path rules)."""
    return urllib.parse.quote(node_id, safe="")


def check_znode_path(path: str) -> str:
    """Check the path of a discovery group's members.

    Returns:
        The path.

    Raises:
        ValueError: not absolute, `/` itself, a trailing or doubled `/`, a `.` or `..` segment,
            control characters, or inside ZooKeeper's own `/zookeeper`.
    """
    segments = path.split("/")
    if not path.startswith("/") or path == "/":
        raise ValueError(f"path must be an absolute znode path below /, got {path!r}")
    if any(s in ("", ".", "..") for s in segments[1:]) or _has_control(path):
        raise ValueError(
            f"path must not have empty, '.' or '..' segments or control characters, got {path!r}"
        )
    if segments[1] == "zookeeper":
        raise ValueError(f"path must not be inside /zookeeper (ZooKeeper's own), got {path!r}")
    return path


def parse_ensemble(text: str) -> tuple[tuple[str, int], ...]:
    """Parse a ZooKeeper connect string `host:port[,host:port…]` (IPv6 hosts in brackets).

    Raises:
        ValueError: empty, a member without a port, or a port outside 1-65535. A chroot suffix
            (`/path`) is refused: give the path separately.
    """
    endpoints: list[tuple[str, int]] = []
    for part in text.split(","):
        item = part.strip()
        if "/" in item:
            raise ValueError(f"connect string {text!r}: no chroot suffix here, give the path separately")
        host, sep, port = item.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"connect string must be host:port[,host:port…], got {text!r}")
        endpoints.append((host, int(port)))
    return tuple(endpoints)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A znode that is not a member, reported once (until its data or the reason changes)."""

    znode: str
    """The child's name under the group's path."""
    reason: str
    """Why: the parser's message, or the node id conflict."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipDiff:
    """What changed between two readings of the members; the caller removes before it adds."""

    added: tuple[Member, ...] = ()
    """New members, in znode-name order."""
    removed: tuple[Member, ...] = ()
    """Members that are gone (their znode deleted or expired, now malformed, or now a conflict)."""
    updated: tuple[tuple[Member, Member], ...] = ()
    """(old, new) for a member whose znode's document changed."""
    rejected: tuple[Rejected, ...] = ()
    """Newly rejected znodes (a rejection already reported is not repeated)."""

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.updated or self.rejected)


class Membership:
    """The accepted members of one discovery pool, by znode name (mutable, pure state)."""

    __slots__ = ("_members", "_reported", "reserved")

    def __init__(self, reserved: Mapping[str, str] | None = None) -> None:
        """Start with no members.

        Args:
            reserved: node ids already in the pool from elsewhere (the local target) -> what
                holds them; a member claiming one is rejected.
        """
        self.reserved: Mapping[str, str] = dict(reserved or {})
        self._members: dict[str, Member] = {}
        self._reported: dict[str, tuple[bytes, str]] = {}

    @property
    def members(self) -> Mapping[str, Member]:
        """Accepted members by znode name, oldest first."""
        return dict(self._members)

    def update(self, documents: Mapping[str, bytes]) -> MembershipDiff:
        """Take a complete new reading of the children and say what changed.

        Members that are still present keep their node ids first (in the order they arrived); a new
        znode claiming a node id that is taken is rejected until the holder leaves. New znodes are
        taken in name order.

        Args:
            documents: every child of the group's path: znode name -> data.

        Returns:
            The changes, each member exactly once.
        """
        parsed: dict[str, Member | str] = {}
        for znode, data in documents.items():
            try:
                parsed[znode] = parse_member(data)
            except ValueError as exc:
                parsed[znode] = str(exc)
        order = [z for z in self._members if z in documents] + sorted(
            z for z in documents if z not in self._members
        )
        accepted: dict[str, Member] = {}
        reasons: dict[str, str] = {}
        holders: dict[str, str] = {}  # node id -> znode
        for znode in order:
            result = parsed[znode]
            if isinstance(result, str):
                reasons[znode] = result
            elif result.node_id in self.reserved:
                reasons[znode] = (
                    f"node id {result.node_id!r} is already in the pool ({self.reserved[result.node_id]})"
                )
            elif result.node_id in holders:
                reasons[znode] = (
                    f"node id {result.node_id!r} is already registered by znode {holders[result.node_id]!r}"
                )
            else:
                accepted[znode] = result
                holders[result.node_id] = znode
        old = self._members
        diff = MembershipDiff(
            added=tuple(m for z, m in accepted.items() if z not in old),
            removed=tuple(m for z, m in old.items() if z not in accepted),
            updated=tuple((old[z], m) for z, m in accepted.items() if z in old and old[z] != m),
            rejected=tuple(
                Rejected(znode=z, reason=r)
                for z, r in reasons.items()
                if self._reported.get(z) != (documents[z], r)
            ),
        )
        self._members = accepted
        self._reported = {z: (documents[z], r) for z, r in reasons.items()}
        return diff
