"""The configuration model: one frozen dataclass per element the router uses (no parsing here).

`router/config/loader.py` reads a `broker.xml`-shaped document and builds these; the pool, policy and
cache sections are the types their own packages define (`PoolConfig`, `PolicyConfig`,
`CacheConfig`). Constructors validate, so an instance that exists is a valid one; cross-references
(an acceptor naming a router, a pool naming a connector) are checked by `Config`. Each field's
default is stated here once: the loader passes only what the document gives, and the acceptor
parameter table (router/config/acceptor_params.py) shows these defaults. Value rules are worded by
their kind (router/config/values.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from keys import KeyType
from keys.filter import compile_filter
from keys.resolve import DEFAULT_KEY_MAX_LENGTH
from pools.members import MAX_SESSION_TIMEOUT_MS, check_znode_path, parse_ensemble
from router.config.values import ValueKind, check, one_of

if TYPE_CHECKING:
    from collections.abc import Iterable

    from cache import CacheConfig
    from policies import PolicyConfig
    from pools import Connector, PoolConfig

__all__ = [
    "DEFAULT_MAX_SNIFF_BYTES",
    "PROXY_PROTOCOL_VERSIONS",
    "AcceptorConfig",
    "AcceptorMode",
    "ClusterConnectionConfig",
    "Config",
    "ConnectionTtlConfig",
    "DiscoveryGroupConfig",
    "EventFileFormat",
    "EventLogConfig",
    "RouterConfig",
    "TlsConfig",
    "ZooKeeperConfig",
    "compile_filter",
]

DEFAULT_MAX_SNIFF_BYTES: Final = 16 * 1024
"""Byte cap of an opening handshake (`AcceptorConfig.sniff_max_bytes`, our `sniffMaxBytes`). h11
caps incomplete HTTP heads at 16 KiB too; a CONNECT, Open or ConnectionInfo with credentials is a
few hundred bytes, a TLS ClientHello under 2 KiB (post-quantum key shares push it towards 2-4 KiB)."""

PROXY_PROTOCOL_VERSIONS: Final = ("v1", "v2")
"""The PROXY protocol versions an acceptor can send to targets (`sendProxyProtocol`)."""


class AcceptorMode(enum.Enum):
    """What an acceptor does with a routed connection."""

    PROXY = "proxy"
    """Connect to the target and relay the bytes both ways."""
    REDIRECT = "redirect"
    """Tell the client where to go, natively, and close (SPEC A6; closing is the answer for TLS)."""
    AUTO = "auto"
    """Redirect clients that can follow a redirect, proxy the others."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """TLS termination on an acceptor (Artemis `sslEnabled=true` with a PEM key store)."""

    key_store_path: str
    """PEM file with the private key and the certificate chain (Artemis `keyStorePath`,
    `keyStoreType=PEM`)."""
    trust_store_path: str | None = None
    """PEM CA bundle that client certificates must chain to (Artemis `trustStorePath`)."""
    need_client_auth: bool = False
    """Require a client certificate (Artemis `needClientAuth`); its subject CN is the user."""
    want_client_auth: bool = False
    """Ask for a client certificate but accept none (Artemis `wantClientAuth`)."""

    def __post_init__(self) -> None:
        if (self.need_client_auth or self.want_client_auth) and self.trust_store_path is None:
            raise ValueError(
                "needClientAuth/wantClientAuth need trustStorePath (the CA of client certificates)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptorConfig:
    """`<acceptor name="…">tcp://host:port?router=NAME;protocols=…;mode=…</acceptor>`."""

    name: str
    host: str
    """Address to listen on (IPv6 without brackets)."""
    port: int
    """Port to listen on; 0 lets the system choose (tests)."""
    router: str
    """The connection router that routes this acceptor's connections."""
    protocols: tuple[str, ...] = ()
    """Protocols the acceptor accepts (upper case); empty means all."""
    mode: AcceptorMode = AcceptorMode.PROXY
    handshake_timeout_ms: int = 10_000
    """Deadline for a client's opening handshake (Artemis `handshake-timeout`, given in seconds
    there; default 10 s as in Artemis); 0 disables it."""
    sniff_max_bytes: int = DEFAULT_MAX_SNIFF_BYTES
    """Byte cap of a client's opening handshake (our `sniffMaxBytes`)."""
    proxy_protocol: bool = False
    """Clients arrive behind a load balancer that sends a PROXY protocol header first (our
    `proxyProtocolEnabled`); SOURCE_IP is then the address in the header."""
    send_proxy_protocol: str | None = None
    """Send a PROXY protocol header to targets: one of `PROXY_PROTOCOL_VERSIONS`, or None (our
    `sendProxyProtocol`)."""
    tls: TlsConfig | None = None
    """TLS termination; None relays TLS untouched (passthrough, SNI peeked from the ClientHello)."""
    users_file: str | None = None
    """artemis-users.properties of the router's own authentication (our `usersFile`)."""
    roles_file: str | None = None
    """artemis-roles.properties, the roles of those users in store order (our `rolesFile`)."""
    require_authentication: bool = False
    """Refuse clients whose credentials the store does not accept (our `requireAuthentication`);
    a ROLE_NAME router authenticates whenever a store is configured."""
    connection_ttl_ms: int = -1
    """Close a proxied connection after this long without bytes from its client (Artemis
    `connectionTtl`, also spelt `connectionTTL`); -1 = no TTL. `<connection-ttl-override>`
    replaces it (`ConnectionTtlConfig.ttl_ms`)."""
    connections_allowed: int = -1
    """Client connections the acceptor serves at once (Artemis `connectionsAllowed`); one more is
    closed at accept and counted. -1 = no limit of its own (the process's descriptor budget still
    applies)."""
    connections_allowed_per_source: int = -1
    """Client connections one source address (the TCP peer's IP) may have open on the acceptor at
    once (our `connectionsAllowedPerSource`, as nginx's `limit_conn`); -1 = no limit."""
    connection_rate: int = -1
    """New connections a second the acceptor takes (our `connectionRate`, as EMQX's
    `max_conn_rate`); over it the acceptor stops accepting for a moment and the kernel's backlog
    holds the rest (pools/gates.py `AcceptRate`). -1 = no limit."""
    connection_burst: int = -1
    """New connections the acceptor may take at once within `connection_rate` (our
    `connectionBurst`); -1 = a tenth of the rate, at least 1."""
    fast_path: bool = True
    """Whether the acceptor may be served by the fast path when it qualifies (our `fastPath`);
    False keeps every connection on the trio path."""
    params: tuple[tuple[str, str], ...] = field(default=())
    """All URL parameters in order, including the ones above."""

    def __post_init__(self) -> None:
        check(ValueKind.PORT, "acceptor port", self.port)
        check(ValueKind.NON_NEGATIVE, "handshake-timeout", self.handshake_timeout_ms)
        check(ValueKind.SNIFF_CAP, "sniffMaxBytes", self.sniff_max_bytes)
        if self.send_proxy_protocol not in (None, *PROXY_PROTOCOL_VERSIONS):
            raise ValueError(
                f"sendProxyProtocol {one_of(PROXY_PROTOCOL_VERSIONS)}, got {self.send_proxy_protocol!r}"
            )
        if (self.users_file is None) != (self.roles_file is None):
            raise ValueError("usersFile and rolesFile go together (artemis-users/roles.properties)")
        if self.require_authentication and self.users_file is None:
            raise ValueError("requireAuthentication=true needs usersFile and rolesFile")
        check(ValueKind.TTL, "connectionTtl", self.connection_ttl_ms)
        check(ValueKind.TTL, "connectionsAllowed", self.connections_allowed)
        check(ValueKind.TTL, "connectionsAllowedPerSource", self.connections_allowed_per_source)
        check(ValueKind.TTL, "connectionRate", self.connection_rate)
        check(ValueKind.TTL, "connectionBurst", self.connection_burst)
        if self.connection_burst != -1 and self.connection_rate == -1:
            raise ValueError(
                f"connectionBurst needs connectionRate, got connectionBurst={self.connection_burst}"
            )

    @property
    def accept_burst(self) -> int:
        """`connection_burst`, or its default for `connection_rate`; 0 without a rate."""
        if self.connection_rate == -1:
            return 0
        if self.connection_burst != -1:
            return self.connection_burst
        return max(1, self.connection_rate // 10)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionTtlConfig:
    """The server-wide connection-TTL settings, direct children of `<core>` as in Artemis:
    `<connection-ttl-override>` and `<connection-ttl-check-interval>` (seed 002)."""

    override_ms: int = -1
    """A TTL for the proxied connections of every acceptor, replacing their own `connectionTtl`;
    -1 (Artemis's default) = no override."""
    check_interval_ms: int = 2000
    """How often proxied connections are checked against their TTL (Artemis's default)."""

    def __post_init__(self) -> None:
        check(ValueKind.TTL, "connection-ttl-override", self.override_ms)
        check(ValueKind.POSITIVE, "connection-ttl-check-interval", self.check_interval_ms)

    def ttl_ms(self, acceptor: AcceptorConfig) -> int:
        """The TTL in force on an acceptor's connections: the override, else the acceptor's own
        `connectionTtl`; -1 = none."""
        return acceptor.connection_ttl_ms if self.override_ms == -1 else self.override_ms


class EventFileFormat(enum.Enum):
    """What the event log's finished files are (`<event-log><format>`)."""

    PARQUET = "parquet"
    """`events-….parquet`: columns typed by the records' field list, written by the writer process
    with pyarrow."""
    JSONL = "jsonl"
    """`events-….jsonl[.zst]`: one JSON object per line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogConfig:
    """Our extension `<event-log>`, a direct child of `<core>` (or `routerd --event-log DIR`): the
    routing event log, one record per decision and per closed connection, written by
    `router/features/event_log/service.py` (docs/event-log.md). Off unless configured."""

    directory: str
    """Where the files go (created if missing)."""
    router_id: str | None = None
    """This process in the lines and file names; None: the host name and the acceptor names. Two
    routerd processes writing to the same place need different ids."""
    ring_size: int = 65_536
    """Events waiting for the writer at most; when full the oldest is dropped and counted (about
    4 s of 8,000 connections/s; changeable at run time through the admin API)."""
    rotate_size: int = 64 * 1024 * 1024
    """A file is finished when this many bytes (JSON lines, or Arrow batches for Parquet; before
    compression) are written to it."""
    rotate_interval_ms: int = 300_000
    """... or when it has been open this long (ms), so the pipeline sees recent events."""
    flush_interval_ms: int = 1_000
    """Events are encoded and handed to the operating system at least this often (ms): what a crash
    of the writer process loses (a kill -9 of routerd alone does not: its writer finishes the file)."""
    max_size: int = 4 * 1024 * 1024 * 1024
    """Finished files of this router id kept at most (bytes, compressed); the oldest are deleted
    beyond it (counted, logged)."""
    format: EventFileFormat = EventFileFormat.PARQUET
    """The finished files' format (docs/event-log.md says why Parquet is the default)."""
    compress: bool = True
    """zstd-compress finished files: Parquet's pages, or JSON lines whole (`.jsonl.zst`, about 9x
    smaller; Spark reads them as they are); false: uncompressed Parquet, plain `.jsonl`."""

    def __post_init__(self) -> None:
        check(ValueKind.NAME, "directory", self.directory)
        if self.router_id is not None:
            check(ValueKind.NAME, "router-id", self.router_id)
        check(ValueKind.POSITIVE, "ring-size", self.ring_size)
        check(ValueKind.POSITIVE, "rotate-size", self.rotate_size)
        check(ValueKind.POSITIVE, "rotate-interval", self.rotate_interval_ms)
        check(ValueKind.POSITIVE, "flush-interval", self.flush_interval_ms)
        check(ValueKind.POSITIVE, "max-size", self.max_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooKeeperConfig:
    """Our extension `<zookeeper connect="host:port,…" path="/…" session-timeout="ms"/>` inside a
    `<discovery-group>`: the group's members are the ephemeral znodes under `path`."""

    connect: str
    """The ensemble, `host:port[,host:port…]` (no chroot suffix)."""
    path: str
    """The znode whose children are the members (`pools.members` describes their data)."""
    session_timeout_ms: int = 10_000
    """The session timeout the router asks for; the server clamps it to 2-20 times its tickTime."""
    answer_timeout_ms: int = 2000
    """How long ZooKeeper may leave a heartbeat unanswered before the session counts as suspended
    (router/core/zookeeper_link.py). ZooKeeper answers a read from memory in milliseconds (2.6 ms
    a synchronous call here, ENVIRONMENT.md §3.2) and a JVM's GC pause rarely lasts a second;
    kazoo's own limit, two thirds of the session timeout (6.7 s at the default), holds only while
    the client is idle."""

    def __post_init__(self) -> None:
        parse_ensemble(self.connect)
        check_znode_path(self.path)
        check(ValueKind.POSITIVE, "session-timeout", self.session_timeout_ms)
        check(ValueKind.POSITIVE, "answer-timeout", self.answer_timeout_ms)
        if self.session_timeout_ms > MAX_SESSION_TIMEOUT_MS:
            raise ValueError(
                f"session-timeout must be at most {MAX_SESSION_TIMEOUT_MS} (ZooKeeper's int), "
                f"got {self.session_timeout_ms!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryGroupConfig:
    """`<discovery-group name="…">`: kept by name so pools can refer to it.

    With a `<zookeeper>` child its members come from ZooKeeper (`router/features/discovery/`); a group
    with only Artemis's broadcast or JGroups settings finds nothing, so its pools stay empty.
    """

    name: str
    refresh_timeout_ms: int = 10000
    """Artemis `refresh-timeout`, kept for compatibility."""
    zookeeper: ZooKeeperConfig | None = None
    """Where the members are registered, when they are registered in ZooKeeper."""

    def __post_init__(self) -> None:
        check(ValueKind.NON_NEGATIVE, "refresh-timeout", self.refresh_timeout_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConnectionConfig:
    """`<cluster-connection name="…">`: a cluster pool's targets are its static connectors."""

    name: str
    connector_ref: str | None = None
    """The cluster's own connector (Artemis `connector-ref`)."""
    static_connectors: tuple[str, ...] = ()
    """Member connectors in order."""
    discovery_group: str | None = None
    """Discovery group of the members, when not static."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    """`<connection-router name="…">` (SPEC A8)."""

    name: str
    key_type: KeyType = KeyType.SOURCE_IP
    key_filter: str | None = None
    """Regular expression searched in the raw key (whole match kept)."""
    local_target_filter: str | None = None
    """Regular expression fully matched against the key to pick the local target."""
    local_connector: str | None = None
    """Our extension `<local-target-connector-ref>`: the connector of the local target."""
    key_max_length: int = DEFAULT_KEY_MAX_LENGTH
    """Our extension `<key-max-length>`: a longer raw key (characters) counts as missing (NULL)."""
    cache: CacheConfig | None = None
    cache_zookeeper: ZooKeeperConfig | None = None
    """Our `<zookeeper>` inside `<cache>`: the cache is shared with the other routers whose cache
    names the same ensemble and path (router/features/shared_cache/service.py)."""
    policy: PolicyConfig | None = None
    pool: PoolConfig | None = None

    def __post_init__(self) -> None:
        check(ValueKind.NAME, "connection-router name", self.name)
        if self.cache_zookeeper is not None and (self.cache is None or self.cache.timeout_ms == 0):
            raise ValueError(
                "a shared cache (<zookeeper> in <cache>) needs a <timeout> > 0: its entries in "
                "ZooKeeper must expire, or every key a client invents stays there for good"
            )
        check(ValueKind.POSITIVE, "key-max-length", self.key_max_length)
        compile_filter(self.key_filter, "key-filter")
        compile_filter(self.local_target_filter, "local-target-filter")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_NamedT = TypeVar("_NamedT", bound=_Named)


def _named(items: Iterable[_NamedT], name: str) -> _NamedT:
    """The first of `items` with this name (a configuration has few of each).

    Raises:
        KeyError: none has it.
    """
    for item in items:
        if item.name == name:
            return item
    raise KeyError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A whole loaded configuration, cross-references checked."""

    source: str
    """The file it came from (for messages)."""
    connectors: tuple[Connector, ...] = ()
    acceptors: tuple[AcceptorConfig, ...] = ()
    routers: tuple[RouterConfig, ...] = ()
    discovery_groups: tuple[DiscoveryGroupConfig, ...] = ()
    cluster_connections: tuple[ClusterConnectionConfig, ...] = ()
    connection_ttl: ConnectionTtlConfig = field(default_factory=ConnectionTtlConfig)
    """`<connection-ttl-override>` and `<connection-ttl-check-interval>`."""
    event_log: EventLogConfig | None = None
    """`<event-log>`; None: no event log."""

    def connector(self, name: str) -> Connector:
        """The connector with this name.

        Raises:
            KeyError: no such connector.
        """
        return _named(self.connectors, name)

    def router(self, name: str) -> RouterConfig:
        """The connection router with this name.

        Raises:
            KeyError: no such router.
        """
        return _named(self.routers, name)

    def cluster_connection(self, name: str) -> ClusterConnectionConfig:
        """The cluster connection with this name.

        Raises:
            KeyError: no such cluster connection.
        """
        return _named(self.cluster_connections, name)

    def discovery_group(self, name: str) -> DiscoveryGroupConfig:
        """The discovery group with this name.

        Raises:
            KeyError: no such discovery group.
        """
        return _named(self.discovery_groups, name)

    def ttl_acceptors(self, router: str) -> tuple[tuple[str, int], ...]:
        """The acceptors of a router with a connection TTL, each with its TTL in force (ms), by name:
        the connections the router's TTL checker looks at."""
        ttl = self.connection_ttl
        return tuple(
            sorted(
                (a.name, ttl.ttl_ms(a)) for a in self.acceptors if a.router == router and ttl.ttl_ms(a) > 0
            )
        )

    def pool_discovery_group(self, router: RouterConfig) -> DiscoveryGroupConfig | None:
        """The discovery group a router's pool takes its members from: its `discovery-group-ref`,
        or the one of its cluster connection; None for static pools and routers without a pool."""
        pool = router.pool
        if pool is None:
            return None
        name = pool.discovery_group
        if pool.cluster_connection is not None:
            name = self.cluster_connection(pool.cluster_connection).discovery_group
        return None if name is None else self.discovery_group(name)
