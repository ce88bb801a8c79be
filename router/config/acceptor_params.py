"""The acceptor URL parameters the router reads: one table, and an `AcceptorConfig` built by it. No I/O.

A routed acceptor is `<acceptor name="…">tcp://host:port?router=NAME;…</acceptor>`. Its parameters
are Artemis's where Artemis has one (`handshake-timeout`, `sslEnabled`, `keyStorePath`,
`connectionTtl`, …) and ours otherwise (`sniffMaxBytes`, `proxyProtocolEnabled`, `fastPath`, …).
`ACCEPTOR_PARAMS` lists each once: its spellings, how its text is read (`ParamKind`, whose rules
are the value kinds of router/config/values.py), the field it sets and a one-line meaning. A
parameter's default is its field's default on `AcceptorConfig` (or `TlsConfig`), so it is stated
once, on the dataclass. docs/configuration.md ("Acceptor parameters") has the same table, and
tests/router/config/test_acceptor_params.py keeps the two equal.

Parameters not in the table are kept in `AcceptorConfig.params` and otherwise ignored: Artemis
acceptors have many that a router has no use for.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, assert_never

from router.config.settings import AcceptorConfig, AcceptorMode, TlsConfig
from router.config.values import ValueKind, one_of, parse_flag, parse_integer, parse_names

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["ACCEPTOR_PARAMS", "AcceptorParam", "ParamKind", "acceptor_config", "acceptor_files"]

_PEM: Final = "PEM"
"""The one key store type supported: Python's `ssl` loads PEM files only."""


class ParamKind(enum.Enum):
    """How a parameter's text is read; the text is trimmed first."""

    NAME = "name"
    """Text as given (`router`: an empty or unknown name is the loader's cross-reference error)."""
    PATH = "path"
    """A file path; empty = not given."""
    PROTOCOLS = "protocols"
    """Comma-separated `ValueKind.PROTOCOL` names, any letter case, upper-cased; empty ones are
    dropped (none = all protocols)."""
    MODE = "mode"
    """An `AcceptorMode` value, any letter case."""
    PROXY_VERSION = "proxy-version"
    """A PROXY protocol version, lower-cased; empty = none (`settings.PROXY_PROTOCOL_VERSIONS`)."""
    STORE_TYPE = "store-type"
    """A key store type, upper-cased; only PEM is supported (checked when TLS is on)."""
    FLAG = "flag"
    """`ValueKind.FLAG`: true or false, any letter case."""
    SECONDS = "seconds"
    """`ValueKind.NON_NEGATIVE`, in seconds; the field holds milliseconds."""
    SNIFF_CAP = "sniff-cap"
    """`ValueKind.SNIFF_CAP`, in bytes."""
    TTL = "ttl"
    """`ValueKind.TTL`, in milliseconds."""
    LIMIT = "limit"
    """A count with -1 for no limit: the range of `ValueKind.TTL` (-1, or 1 and up)."""


_MS_PER_SECOND: Final = 1000


def _field_default(path: str) -> object:
    """The default of the field a parameter sets (`name` on AcceptorConfig, `tls.name` on
    TlsConfig); `dataclasses.MISSING` for a required field.

    Raises:
        ValueError: there is no such field.
    """
    owner, _, name = path.rpartition(".")
    if owner not in ("", "tls"):
        raise ValueError(f"field {path!r} must be an AcceptorConfig field or tls.<TlsConfig field>")
    cls = TlsConfig if owner else AcceptorConfig
    for candidate in dataclasses.fields(cls):
        if candidate.name == name:
            default: object = candidate.default
            return default
    raise ValueError(f"{cls.__name__} has no field {name!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptorParam:
    """One acceptor URL parameter."""

    names: tuple[str, ...]
    """Its spellings, the usual one first; giving two that disagree is an error."""
    kind: ParamKind
    """How its text is read."""
    meaning: str
    """One line for people (the docs say more)."""
    field: str | None = None
    """The `AcceptorConfig` field it sets, or `tls.<field>` for a `TlsConfig` field; the field's
    default is the parameter's default. None for a parameter that only switches or checks."""
    unset: str | None = None
    """For a parameter without a field: the text an absent parameter stands for."""

    def __post_init__(self) -> None:
        if not self.names or not all(self.names):
            raise ValueError(f"an acceptor parameter needs names, got {self.names!r}")
        if not self.meaning or "\n" in self.meaning:
            raise ValueError(f"{self.name}: the meaning must be one line, got {self.meaning!r}")
        if (self.field is None) == (self.unset is None):
            raise ValueError(f"{self.name}: give either field (its default is the parameter's) or unset")
        if self.field is not None:
            _field_default(self.field)

    @property
    def name(self) -> str:
        """The usual spelling."""
        return self.names[0]

    @property
    def default(self) -> str | None:
        """The default as it would be written in a URL; None: no default (not set, or required)."""
        if self.field is None:
            return self.unset
        value = _field_default(self.field)
        if value is None or value is dataclasses.MISSING or value == ():
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, enum.Enum):
            return str(value.value)
        if self.kind is ParamKind.SECONDS and isinstance(value, int):
            return str(value // _MS_PER_SECOND)
        return str(value)

    def read(self, spelling: str, text: str) -> object:
        """The value of one spelling's trimmed text, of the field's type.

        Raises:
            ValueError: the text breaks the kind's rule, e.g. "handshake-timeout must be >= 0, got '-1'".
        """
        match self.kind:
            case ParamKind.NAME:
                return text
            case ParamKind.PATH:
                return text or None
            case ParamKind.PROTOCOLS:
                return parse_names(ValueKind.PROTOCOL, spelling, text)
            case ParamKind.MODE:
                try:
                    return AcceptorMode(text.lower())
                except ValueError:
                    raise ValueError(
                        f"{spelling} {one_of(m.value for m in AcceptorMode)}, got {text!r}"
                    ) from None
            case ParamKind.PROXY_VERSION:
                return text.lower() or None
            case ParamKind.STORE_TYPE:
                return text.upper()
            case ParamKind.FLAG:
                return parse_flag(spelling, text)
            case ParamKind.SECONDS:
                return parse_integer(ValueKind.NON_NEGATIVE, spelling, text) * _MS_PER_SECOND
            case ParamKind.SNIFF_CAP:
                return parse_integer(ValueKind.SNIFF_CAP, spelling, text)
            case ParamKind.TTL | ParamKind.LIMIT:
                return parse_integer(ValueKind.TTL, spelling, text)
            case _:
                assert_never(self.kind)

    def given(self, params: Mapping[str, str]) -> tuple[str, str] | None:
        """The spelling a URL uses and its trimmed text; None when the URL does not give it.

        Raises:
            ValueError: two spellings with different values, "connectionTtl '1500' and
                connectionTTL '2000' disagree: give one".
        """
        found = [(name, params[name].strip()) for name in self.names if name in params]
        if not found:
            return None
        first, text = found[0]
        for other, other_text in found[1:]:
            if other_text != text:
                raise ValueError(f"{first} {text!r} and {other} {other_text!r} disagree: give one")
        return first, text


ACCEPTOR_PARAMS: Final[tuple[AcceptorParam, ...]] = (
    AcceptorParam(
        names=("router",),
        kind=ParamKind.NAME,
        field="router",
        meaning="the connection router of the acceptor's connections (required: without it, not ours)",
    ),
    AcceptorParam(
        names=("protocols",),
        kind=ParamKind.PROTOCOLS,
        field="protocols",
        meaning="Artemis protocol names recognised when handshakes are read; none given = all",
    ),
    AcceptorParam(
        names=("mode",),
        kind=ParamKind.MODE,
        field="mode",
        meaning="proxy, redirect or auto: relay the connection, or tell the client where to go",
    ),
    AcceptorParam(
        names=("handshake-timeout", "handshakeTimeout"),
        kind=ParamKind.SECONDS,
        field="handshake_timeout_ms",
        meaning="seconds for the whole opening (PROXY header, TLS and protocol handshakes); 0 = none",
    ),
    AcceptorParam(
        names=("sniffMaxBytes",),
        kind=ParamKind.SNIFF_CAP,
        field="sniff_max_bytes",
        meaning="byte cap of the opening read to find the key",
    ),
    AcceptorParam(
        names=("proxyProtocolEnabled",),
        kind=ParamKind.FLAG,
        field="proxy_protocol",
        meaning="every connection starts with a PROXY protocol v1 or v2 header, whose address is SOURCE_IP",
    ),
    AcceptorParam(
        names=("sendProxyProtocol",),
        kind=ParamKind.PROXY_VERSION,
        field="send_proxy_protocol",
        meaning="v1 or v2: send the client's address to the target in a PROXY protocol header",
    ),
    AcceptorParam(
        names=("sslEnabled",),
        kind=ParamKind.FLAG,
        unset="false",
        meaning="terminate TLS with keyStorePath; otherwise TLS is passed through (SNI peeked)",
    ),
    AcceptorParam(
        names=("keyStorePath",),
        kind=ParamKind.PATH,
        field="tls.key_store_path",
        meaning="PEM file with the private key and the certificate chain (required with sslEnabled)",
    ),
    AcceptorParam(
        names=("keyStoreType",),
        kind=ParamKind.STORE_TYPE,
        unset=_PEM,
        meaning="must be PEM",
    ),
    AcceptorParam(
        names=("trustStorePath",),
        kind=ParamKind.PATH,
        field="tls.trust_store_path",
        meaning="PEM CA bundle that client certificates must chain to",
    ),
    AcceptorParam(
        names=("trustStoreType",),
        kind=ParamKind.STORE_TYPE,
        unset=_PEM,
        meaning="must be PEM",
    ),
    AcceptorParam(
        names=("needClientAuth",),
        kind=ParamKind.FLAG,
        field="tls.need_client_auth",
        meaning="require a client certificate; its subject CN is the user",
    ),
    AcceptorParam(
        names=("wantClientAuth",),
        kind=ParamKind.FLAG,
        field="tls.want_client_auth",
        meaning="ask for a client certificate, accept a client without one",
    ),
    AcceptorParam(
        names=("usersFile",),
        kind=ParamKind.PATH,
        field="users_file",
        meaning="artemis-users.properties of the router's own authentication (with rolesFile)",
    ),
    AcceptorParam(
        names=("rolesFile",),
        kind=ParamKind.PATH,
        field="roles_file",
        meaning="artemis-roles.properties: the users' roles, in order (with usersFile)",
    ),
    AcceptorParam(
        names=("requireAuthentication",),
        kind=ParamKind.FLAG,
        field="require_authentication",
        meaning="refuse clients whose credentials the user store does not accept",
    ),
    AcceptorParam(
        names=("connectionTtl", "connectionTTL"),
        kind=ParamKind.TTL,
        field="connection_ttl_ms",
        meaning="ms without bytes from the client after which a proxied connection is closed; -1 = none",
    ),
    AcceptorParam(
        names=("connectionsAllowed",),
        kind=ParamKind.LIMIT,
        field="connections_allowed",
        meaning="client connections the acceptor serves at once; more are closed at accept; -1 = no limit",
    ),
    AcceptorParam(
        names=("connectionsAllowedPerSource",),
        kind=ParamKind.LIMIT,
        field="connections_allowed_per_source",
        meaning="client connections one source address may have open on the acceptor at once; -1 = no limit",
    ),
    AcceptorParam(
        names=("connectionRate",),
        kind=ParamKind.LIMIT,
        field="connection_rate",
        meaning="new connections a second the acceptor takes (then it pauses accepting); -1 = no limit",
    ),
    AcceptorParam(
        names=("connectionBurst",),
        kind=ParamKind.LIMIT,
        field="connection_burst",
        meaning="new connections taken at once within connectionRate; -1 = a tenth of the rate",
    ),
    AcceptorParam(
        names=("fastPath",),
        kind=ParamKind.FLAG,
        field="fast_path",
        meaning="the fast path may serve the acceptor when it qualifies; false keeps the trio path",
    ),
)
"""Every acceptor URL parameter the router reads, in the order the docs list them."""


def acceptor_config(*, name: str, host: str, port: int, params: Mapping[str, str]) -> AcceptorConfig:
    """An acceptor from its name, address and URL parameters, read by `ACCEPTOR_PARAMS`.

    Only the parameters the URL gives are passed on, so the others take their field's default.

    Args:
        name: the `<acceptor>`'s name.
        host: the URL's host (IPv6 without brackets).
        port: the URL's port.
        params: the URL's parameters (`pools.parse_url_params`), all kept in `AcceptorConfig.params`.

    Returns:
        The acceptor; whether its `router` exists is the caller's cross-reference check.

    Raises:
        ValueError: a parameter breaks its rule, two spellings disagree, `router` is missing, or
            the TLS parameters do not make a TLS configuration; the message starts with
            "acceptor 'NAME': ".
    """
    try:
        return _acceptor_config(name=name, host=host, port=port, params=params)
    except ValueError as exc:
        raise ValueError(f"acceptor {name!r}: {exc}") from exc


def _acceptor_config(*, name: str, host: str, port: int, params: Mapping[str, str]) -> AcceptorConfig:
    # Any: each value has its own field's type, which the dataclasses check on construction.
    acceptor_fields: dict[str, Any] = {}
    tls_fields: dict[str, Any] = {}
    switches: dict[str, object] = {}
    for param in ACCEPTOR_PARAMS:
        given = param.given(params)
        if param.field is None:
            assert param.unset is not None  # __post_init__: a parameter without a field has `unset`
            switches[param.name] = param.read(*given) if given else param.read(param.name, param.unset)
            continue
        owner, _, field = param.field.rpartition(".")
        if given is not None:
            (tls_fields if owner else acceptor_fields)[field] = param.read(*given)
        elif not owner and _field_default(param.field) is dataclasses.MISSING:
            raise ValueError(f"{param.name} is required")
    tls = None
    if switches["sslEnabled"]:
        for store in ("keyStoreType", "trustStoreType"):
            if switches[store] != _PEM:
                raise ValueError(
                    f"{store} {switches[store]!r} is not supported: use PEM files "
                    "(convert with: openssl pkcs12 -in store.p12 -nodes -out store.pem)"
                )
        if "key_store_path" not in tls_fields:
            raise ValueError("sslEnabled=true needs keyStorePath (a PEM file with key and certificate)")
        tls = TlsConfig(**tls_fields)
    return AcceptorConfig(
        name=name, host=host, port=port, tls=tls, params=tuple(params.items()), **acceptor_fields
    )


def acceptor_files(acceptor: AcceptorConfig) -> Iterator[tuple[str, str]]:
    """(parameter, path) of each file the acceptor reads when routerd starts: the key store and
    trust store when it terminates TLS, the user store's two files. Paths are as given (relative
    ones are taken from the working directory)."""
    if acceptor.tls is not None:
        yield "keyStorePath", acceptor.tls.key_store_path
        if acceptor.tls.trust_store_path is not None:
            yield "trustStorePath", acceptor.tls.trust_store_path
    if acceptor.users_file is not None:
        yield "usersFile", acceptor.users_file
    if acceptor.roles_file is not None:
        yield "rolesFile", acceptor.roles_file
