"""Connectors and targets: the brokers a pool can hand out.

Pure data: a `Connector` is a parsed Artemis connector URL (`tcp://host:port?nodeId=…`, or an HA
pair `(tcp://primary:port,tcp://backup:port)?nodeId=…`), a `Target`
is one broker of a pool identified by its node id. Nothing here resolves names or opens sockets.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from dataclasses import dataclass, field
from typing import Final

from pools.limits import TargetLimits, limits_from_params

__all__ = [
    "COUNT_SOURCES",
    "LOCAL_NODE_ID",
    "MAX_WEIGHT",
    "PROBE_KINDS",
    "Connector",
    "CountSource",
    "Target",
    "parse_url_params",
]

PROBE_KINDS: Final = ("tcp", "mqtt", "stomp", "amqp", "openwire", "core")
"""Values of a connector's `probe=` URL parameter: how its broker is health-checked (default tcp)."""

COUNT_SOURCES: Final = ("mqtt-sys", "artemis-jolokia", "activemq-jolokia", "rabbitmq-prometheus")
"""Values of a connector's `connectionCount=` URL parameter: where LEAST_CONNECTIONS reads the
broker's own connection count. `mqtt-sys` is read by the MQTT probe (mosquitto's `$SYS`, what
`probeConnectionCount=true` says); the others over HTTP, beside the probe."""

_HTTP_COUNT_DEFAULTS: Final = {
    "artemis-jolokia": (8161, "/console/jolokia"),
    "activemq-jolokia": (8161, "/api/jolokia"),
    "rabbitmq-prometheus": (15692, "/metrics"),
}
"""Each HTTP source's port and path when `connectionCountUrl` is not given, on the broker's host:
Artemis's web console (`bootstrap.xml`, Jolokia at /console/jolokia), ActiveMQ Classic's
(`jetty.xml`, Jolokia at /api/jolokia) and the rabbitmq_prometheus plugin's listener."""

_JOLOKIA_SOURCES: Final = ("artemis-jolokia", "activemq-jolokia")

_COUNT_PARAMS: Final = (
    "connectionCount",
    "connectionCountUrl",
    "connectionCountBroker",
    "connectionCountUser",
    "connectionCountPassword",
    "connectionCountOrigin",
)
"""The connector parameters of the broker-reported count; any other name starting with
`connectionCount` is a typo, an error rather than a parameter silently kept."""

_BOOLEANS: Final = {"true": True, "false": False}
"""URL parameter booleans, any letter case (as Artemis reads them with `Boolean.parseBoolean`,
but strict: anything else is an error instead of false)."""

_NO_LIMITS: Final = TargetLimits()

LOCAL_NODE_ID: Final = "local"
"""Node id of the local target when the router has no local connector configured."""

MAX_WEIGHT: Final = 1_000_000
"""Largest target weight (a connector's `weight=`, a discovery member's `weight`); a bound so that a
typo (an extra few zeros) is an error, not a silent skew."""


def _check_weight(weight: object) -> None:
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight must be an integer 1-{MAX_WEIGHT}, got {weight!r}")


def parse_url_params(query: str) -> dict[str, str]:
    """Parse the parameters of an Artemis URL, which separates them with `;` or `&`.

    Args:
        query: the part after `?`.

    Returns:
        Parameter name to value, later duplicates winning (as Artemis's URISupport does).

    Raises:
        ValueError: a parameter without `=`.
    """
    params: dict[str, str] = {}
    for part in query.replace(";", "&").split("&"):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"url parameter {part!r} has no '=value'")
        params[urllib.parse.unquote(name)] = urllib.parse.unquote(value)
    return params


def _split(text: str, url: str) -> urllib.parse.SplitResult:
    parsed = urllib.parse.urlsplit(text.strip())
    if not parsed.scheme or not parsed.netloc:
        raise ValueError(f"connector URL must look like tcp://host:port, got {url!r}")
    return parsed


def _endpoint(text: str, url: str) -> tuple[str, int]:
    """(host, port) of one `tcp://host:port` (parameters are the caller's business)."""
    parsed = _split(text.strip(), url)
    try:
        port = parsed.port
    except ValueError as exc:
        raise ValueError(f"connector URL has an invalid port: {url!r}") from exc
    if parsed.hostname is None or port is None:
        raise ValueError(f"connector URL must name host and port, got {url!r}")
    return parsed.hostname, port


def _with_param(params: tuple[tuple[str, str], ...], name: str, value: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, value if n == name else v) for n, v in params)


def _http_endpoint(url: str) -> tuple[str, int, str]:
    """(host, port, path with query) of an `http://host[:port]/path` URL.

    Raises:
        ValueError: not such a URL (https, no host, a bad port, user info in it).
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or "@" in parsed.netloc:
        raise ValueError(f"connectionCountUrl must look like http://host:port/path, got {url!r}")
    try:
        port = parsed.port or 80
    except ValueError as exc:
        raise ValueError(f"connectionCountUrl has an invalid port: {url!r}") from exc
    path = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    return parsed.hostname, port, path


@dataclass(frozen=True, slots=True, kw_only=True)
class CountSource:
    """Where and how one broker's own connection count is read (a connector's `connectionCount*`
    parameters): LEAST_CONNECTIONS adds the router's change since the read to it."""

    kind: str
    """One of COUNT_SOURCES."""
    url: str | None = None
    """The HTTP sources' endpoint, `http://host:port/path` (Jolokia's base URL, or the metrics
    page); None for `mqtt-sys`."""
    broker: str | None = None
    """Jolokia: the broker's name in its MBean's object name; None: the only broker of the JVM."""
    user: str | None = None
    """The HTTP user (basic authentication); None: the pool's user for Jolokia, none for Prometheus."""
    password: str | None = field(default=None, repr=False)
    origin: str | None = None
    """Jolokia: the `Origin` header sent (Jolokia's CORS check); None: the URL's own origin."""

    def __post_init__(self) -> None:
        if self.kind not in COUNT_SOURCES:
            raise ValueError(f"connectionCount must be one of {', '.join(COUNT_SOURCES)}, got {self.kind!r}")
        if (self.url is None) != (self.kind not in _HTTP_COUNT_DEFAULTS):
            raise ValueError(f"connectionCount={self.kind} {'takes no' if self.url else 'needs a'} URL")
        if self.url is not None:
            _http_endpoint(self.url)
        if self.broker is not None and (not self.broker or any(c in self.broker for c in ',=:*?"\\')):
            raise ValueError(
                f'connectionCountBroker must be a broker name without ,=:*?"\\, got {self.broker!r}'
            )
        if self.origin is not None:
            parsed = urllib.parse.urlsplit(self.origin)
            if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/"):
                raise ValueError(
                    f"connectionCountOrigin must look like http://host[:port], got {self.origin!r}"
                )

    @property
    def endpoint(self) -> tuple[str, int, str]:
        """(host, port, path) of `url`.

        Raises:
            ValueError: a source without a URL (`mqtt-sys`).
        """
        if self.url is None:
            raise ValueError(f"connectionCount={self.kind} is not read over HTTP")
        return _http_endpoint(self.url)


@dataclass(frozen=True, slots=True, kw_only=True)
class Connector:
    """A named way to reach a broker, as in `<connector name="…">tcp://host:port?…</connector>`."""

    name: str
    """The connector's name in the configuration."""
    host: str
    """Host name or IP literal (IPv6 without brackets)."""
    port: int
    """TCP port, 1-65535."""
    params: tuple[tuple[str, str], ...] = field(default=())
    """URL parameters in order of appearance."""
    backups: tuple[tuple[str, int], ...] = field(default=())
    """(host, port) of each backup of an HA pair, in order; `host`/`port` are the primary's."""
    _pair: tuple[Connector, ...] = field(default=(), init=False, repr=False, compare=False)
    """An HA pair's `members`, built once here (routing reads them per decision); empty otherwise."""
    _limits: TargetLimits = field(default=_NO_LIMITS, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("connector name must not be empty")
        if not self.host:
            raise ValueError(f"connector {self.name!r}: host must not be empty")
        for port in (self.port, *(p for _, p in self.backups)):
            if not 0 < port < 65536:
                raise ValueError(f"connector {self.name!r}: port must be 1-65535, got {port!r}")
        if any(not h for h, _ in self.backups):
            raise ValueError(f"connector {self.name!r}: a backup host must not be empty")
        probe = self.probe
        if probe not in PROBE_KINDS:
            raise ValueError(f"probe must be one of {', '.join(PROBE_KINDS)}, got {probe!r}")
        count = self.param_map.get("probeConnectionCount", "false")
        if count.lower() not in _BOOLEANS:
            raise ValueError(f"probeConnectionCount must be true or false, got {count!r}")
        if count.lower() == "true" and probe != "mqtt":
            raise ValueError(f"probeConnectionCount=true needs probe=mqtt, got probe={probe!r}")
        self._check_count_params(probe)
        try:
            limits = limits_from_params(self.param_map)
        except ValueError as exc:
            raise ValueError(f"connector {self.name!r}: {exc}") from None
        object.__setattr__(self, "_limits", limits)  # frozen: set once, at construction
        weight = self.param_map.get("weight", "1")
        digits = weight.isascii() and weight.isdigit() and len(weight) <= len(str(MAX_WEIGHT))
        if not (digits and 1 <= int(weight) <= MAX_WEIGHT):
            raise ValueError(f"weight must be an integer 1-{MAX_WEIGHT}, got {weight!r}")
        if self.backups:
            endpoints = ((self.host, self.port), *self.backups)
            urls = self.param_map.get("connectionCountUrl")
            # Each member reads its own broker's count: the i-th URL of connectionCountUrl's list.
            member_params = [
                self.params if urls is None else _with_param(self.params, "connectionCountUrl", url.strip())
                for url in (urls or "").split(",")
            ]
            pair = tuple(
                dataclasses.replace(
                    self, host=h, port=p, backups=(), params=member_params[min(i, len(member_params) - 1)]
                )
                for i, (h, p) in enumerate(endpoints)
            )
            object.__setattr__(self, "_pair", pair)  # frozen: set once, at construction

    def _check_count_params(self, probe: str) -> None:
        """Validate the `connectionCount*` parameters (the source's own checks are `connection_count`'s).

        Raises:
            ValueError: an unknown `connectionCount*` name, an unknown source, a source that
                contradicts `probeConnectionCount` or needs another probe, an option the source
                does not take, or not one URL per member of an HA pair.
        """
        params = self.param_map
        for name in params:
            if name.startswith("connectionCount") and name not in _COUNT_PARAMS:
                raise ValueError(f"unknown connector parameter {name!r} (known: {', '.join(_COUNT_PARAMS)})")
        kind = params.get("connectionCount")
        if kind is not None and kind not in COUNT_SOURCES:
            raise ValueError(f"connectionCount must be one of {', '.join(COUNT_SOURCES)}, got {kind!r}")
        flag = params.get("probeConnectionCount", "").lower()
        if kind is not None and flag == "true" and kind != "mqtt-sys":
            raise ValueError(
                f"probeConnectionCount=true means connectionCount=mqtt-sys, got connectionCount={kind!r} too"
            )
        if kind == "mqtt-sys" and flag == "false":
            raise ValueError("probeConnectionCount=false contradicts connectionCount='mqtt-sys'")
        if kind == "mqtt-sys" and probe != "mqtt":
            raise ValueError(f"connectionCount=mqtt-sys needs probe=mqtt, got probe={probe!r}")
        given = "no connectionCount" if kind is None else f"connectionCount={kind!r}"
        for name in ("connectionCountUrl", "connectionCountUser", "connectionCountPassword"):
            if name in params and kind not in _HTTP_COUNT_DEFAULTS:
                raise ValueError(
                    f"{name} needs connectionCount={' or '.join(_HTTP_COUNT_DEFAULTS)}, got {given}"
                )
        for name in ("connectionCountBroker", "connectionCountOrigin"):
            if name in params and kind not in _JOLOKIA_SOURCES:
                raise ValueError(f"{name} needs connectionCount={' or '.join(_JOLOKIA_SOURCES)}, got {given}")
        if "connectionCountPassword" in params and "connectionCountUser" not in params:
            raise ValueError("connectionCountPassword needs connectionCountUser")
        urls = params.get("connectionCountUrl")
        if urls is not None:
            listed = urls.split(",")
            members = 1 + len(self.backups)
            if len(listed) != members:
                what = "an HA pair names one per member" if self.backups else "a single broker has one"
                raise ValueError(f"connectionCountUrl: {what} ({members}), got {len(listed)}: {urls!r}")
            for url in listed:
                _http_endpoint(url.strip())
        if kind is not None:
            _ = self.connection_count  # builds the CountSource, which checks its values

    @classmethod
    def from_url(cls, name: str, url: str) -> Connector:
        """Parse `tcp://host:port?a=b;c=d` (also `[v6]:port`), or an HA pair
        `(tcp://primary:port,tcp://backup:port)?a=b` whose parameters apply to every member.

        Raises:
            ValueError: the URL has no host or no valid port, or a pair member has parameters.
        """
        text = url.strip()
        if text.startswith("("):
            members_text, closing, query = text[1:].partition(")")
            if not closing:
                raise ValueError(f"HA pair URL {url!r} has no closing ')'")
            if query and not query.startswith("?"):
                raise ValueError(f"HA pair URL {url!r}: expected '?parameters' after ')'")
            if "?" in members_text:
                raise ValueError(f"HA pair URL {url!r}: put parameters after the ')', not on one member")
            if any(not m.strip().lower().startswith("tcp://") for m in members_text.split(",")):
                raise ValueError(f"HA pair URL {url!r}: every member must be tcp://host:port")
            members = [_endpoint(m, url) for m in members_text.split(",")]
            params = tuple(parse_url_params(query[1:]).items())
            (host, port), backups = members[0], tuple(members[1:])
            return cls(name=name, host=host, port=port, params=params, backups=backups)
        parsed = _split(text, url)
        params = tuple(parse_url_params(parsed.query).items())
        host, port = _endpoint(text, url)
        return cls(name=name, host=host, port=port, params=params)

    @property
    def members(self) -> tuple[Connector, ...]:
        """The primary and then each backup as a single-address connector with the same name and
        parameters; just `(self,)` when the connector is not an HA pair."""
        return self._pair or (self,)

    @property
    def display_url(self) -> str:
        """`url`, or `(tcp://primary,tcp://backup)` for an HA pair (logs and the admin API)."""
        if not self.backups:
            return self.url
        return "(" + ",".join(m.url for m in self.members) + ")"

    @property
    def param_map(self) -> dict[str, str]:
        """The URL parameters as a dict."""
        return dict(self.params)

    @property
    def probe(self) -> str:
        """How the broker is health-checked: URL parameter `probe`, default "tcp"."""
        return self.param_map.get("probe", "tcp")

    @property
    def probe_connection_count(self) -> bool:
        """URL parameter `probeConnectionCount` (default false), or `connectionCount=mqtt-sys`:
        whether the MQTT probe also reads the broker's connected-client count (mosquitto's
        `$SYS/broker/clients/connected`)."""
        params = self.param_map
        if params.get("connectionCount") == "mqtt-sys":
            return True
        return _BOOLEANS.get(params.get("probeConnectionCount", "false").lower(), False)

    @property
    def connection_count(self) -> CountSource | None:
        """Where LEAST_CONNECTIONS reads the broker's own connection count: URL parameter
        `connectionCount` (or `probeConnectionCount=true`, which is `mqtt-sys`); None: nowhere, the
        count is this router's own. Each member of an HA pair reads at its own host (or its own
        URL of `connectionCountUrl`'s list)."""
        params = self.param_map
        kind = params.get("connectionCount")
        if kind is None:
            return CountSource(kind="mqtt-sys") if self.probe_connection_count else None
        if kind not in _HTTP_COUNT_DEFAULTS:
            return CountSource(kind=kind)
        url = params.get("connectionCountUrl")
        if url is None:
            port, path = _HTTP_COUNT_DEFAULTS[kind]
            host = f"[{self.host}]" if ":" in self.host else self.host
            url = f"http://{host}:{port}{path}"
        return CountSource(
            kind=kind,
            url=url.split(",")[0].strip(),  # a pair's own list: the primary's (each member has its own)
            broker=params.get("connectionCountBroker"),
            user=params.get("connectionCountUser"),
            password=params.get("connectionCountPassword"),
            origin=params.get("connectionCountOrigin"),
        )

    @property
    def limits(self) -> TargetLimits:
        """The target's storm-protection limits (`maxConnections`, `maxQueue`, `queueTimeout`,
        `connectRate`, `slowStart`: pools/limits.py); none by default."""
        return self._limits

    @property
    def weight(self) -> int:
        """URL parameter `weight` (default 1): the target's relative weight on a weighted ring
        (CONSISTENT_HASH with RING=KETAMA); 1-MAX_WEIGHT."""
        return int(self.param_map.get("weight", "1"))

    @property
    def node_id(self) -> str:
        """The target's node id: URL parameter `nodeId`, else the connector's name."""
        return self.param_map.get("nodeId", self.name)

    @property
    def url(self) -> str:
        """`tcp://host:port`, with brackets around an IPv6 host."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One broker a pool can hand out, identified by node id (policies hash node ids, not addresses)."""

    node_id: str
    """Stable identity of the broker; the cache stores it and CONSISTENT_HASH hashes it."""
    connector: Connector | None
    """How to reach the broker; None only for a local target without a local connector."""
    local: bool = False
    """Whether this is the router's local target."""
    weight: int = 1
    """Relative weight, 1-MAX_WEIGHT: a weighted ring (CONSISTENT_HASH with RING=KETAMA) gives the
    target a share of the keys in proportion; the other policies, and Artemis's ring, ignore it."""

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("target node id must not be empty")
        if self.connector is None and not self.local:
            raise ValueError(f"remote target {self.node_id!r} needs a connector")
        _check_weight(self.weight)

    @classmethod
    def remote(cls, connector: Connector) -> Target:
        """The target behind a configured connector (its weight is the connector's `weight=`)."""
        return cls(node_id=connector.node_id, connector=connector, weight=connector.weight)

    @classmethod
    def local_target(cls, connector: Connector | None) -> Target:
        """The router's local target, reached through `connector` when one is configured."""
        node_id = connector.node_id if connector is not None else LOCAL_NODE_ID
        weight = connector.weight if connector is not None else 1
        return cls(node_id=node_id, connector=connector, local=True, weight=weight)
