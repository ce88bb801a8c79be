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

__all__ = ["LOCAL_NODE_ID", "MAX_WEIGHT", "PROBE_KINDS", "Connector", "Target", "parse_url_params"]

PROBE_KINDS: Final = ("tcp", "mqtt", "stomp", "amqp", "openwire")
"""Values of a connector's `probe=` URL parameter: how its broker is health-checked (default tcp)."""

_BOOLEANS: Final = {"true": True, "false": False}
"""URL parameter booleans, any letter case (as Artemis reads them with `Boolean.parseBoolean`,
but strict: anything else is an error instead of false)."""

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
        if self.probe_connection_count and probe != "mqtt":
            raise ValueError(f"probeConnectionCount=true needs probe=mqtt, got probe={probe!r}")
        weight = self.param_map.get("weight", "1")
        digits = weight.isascii() and weight.isdigit() and len(weight) <= len(str(MAX_WEIGHT))
        if not (digits and 1 <= int(weight) <= MAX_WEIGHT):
            raise ValueError(f"weight must be an integer 1-{MAX_WEIGHT}, got {weight!r}")
        if self.backups:
            primary = dataclasses.replace(self, backups=())
            pair = (primary, *(dataclasses.replace(primary, host=h, port=p) for h, p in self.backups))
            object.__setattr__(self, "_pair", pair)  # frozen: set once, at construction

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
        """URL parameter `probeConnectionCount` (default false): whether the MQTT probe also reads
        the broker's connected-client count (mosquitto's `$SYS/broker/clients/connected`)."""
        return _BOOLEANS.get(self.param_map.get("probeConnectionCount", "false").lower(), False)

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
