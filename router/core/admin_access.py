"""Who may call the admin API, and what (pure: the listener in router/services/admin.py asks).

Two rules, in this order:

1. **Host** (every request, tokens or not): the `Host` header must name this router, not a
   name an attacker's DNS points at it (DNS rebinding: a web page on another site makes the
   operator's browser send requests to `http://evil.example:9180/`, which resolves to
   127.0.0.1). Accepted: an IP literal, `localhost`, and the names routerd was given
   (`--admin-host NAME`). Anything else is 421.
2. **Tokens** (when routerd has `--admin-tokens FILE`): every request but `GET /healthz` and
   `GET /readyz` (`OPEN_PATHS`) needs `Authorization: Bearer TOKEN`. A token has a level, as
   HAProxy's stats socket: `user` reads (GET, HEAD), `operator` also changes state (PUT, POST,
   DELETE: drain, evacuate, rebalance, cache, filters, ring size, configuration reload), `admin`
   all of it, and alone
   may stop the process (`POST /api/v1/shutdown`). No token or an unknown one: 401; a level too
   low: 403.

Without tokens the admin API must listen on loopback only (routerd refuses anything else), and
every local caller may do everything, as before tokens existed.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "ADMIN_PATHS",
    "MIN_TOKEN_LENGTH",
    "OPEN_PATHS",
    "READ_METHODS",
    "AdminAccess",
    "Allowed",
    "Level",
    "Refused",
    "Token",
    "Verdict",
    "hosts_of",
    "is_loopback",
    "parse_tokens",
]

MIN_TOKEN_LENGTH: Final = 16
"""Shortest token accepted (`openssl rand -hex 16` gives 32 characters)."""
READ_METHODS: Final = frozenset({"GET", "HEAD"})
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})
"""Paths served without a token (load balancers' and orchestrators' health checks)."""
ADMIN_PATHS: Final = frozenset({"/api/v1/shutdown"})
"""Paths whose state-changing calls need the admin level (HAProxy's `shutdown` commands do)."""


class Level(enum.IntEnum):
    """What a token may do; each level may do what the ones below may."""

    USER = 1
    OPERATOR = 2
    ADMIN = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Token:
    """One line of the tokens file: `NAME LEVEL TOKEN`."""

    name: str
    """Who it is, in log lines (never the secret)."""
    level: Level
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Allowed:
    """Serve it; `who` is what log lines say of the caller."""

    who: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Answer `status` with `message` instead."""

    status: int
    message: str


Verdict: TypeAlias = Allowed | Refused


def parse_tokens(text: str, source: str) -> tuple[Token, ...]:
    """The tokens of a tokens file: `NAME LEVEL TOKEN` per line, `#` comments and blank lines.

    Raises:
        ValueError: a line that breaks a rule (the message names the file, the line and the rule).
    """
    tokens: list[Token] = []
    names: set[str] = set()
    levels = ", ".join(level.name.lower() for level in Level)
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"{source}:{number}"
        if len(words) != 3:
            raise ValueError(f"{where}: expected NAME LEVEL TOKEN, got {len(words)} word(s)")
        name, level_text, secret = words
        try:
            level = Level[level_text.upper()]
        except KeyError:
            raise ValueError(f"{where}: level must be one of {levels}, got {level_text!r}") from None
        if len(secret) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{where}: token of {name!r} is shorter than {MIN_TOKEN_LENGTH} characters")
        if name in names:
            raise ValueError(f"{where}: name {name!r} is given twice")
        names.add(name)
        tokens.append(Token(name=name, level=level, secret=secret))
    if not tokens:
        raise ValueError(f"{source}: no token (lines NAME LEVEL TOKEN)")
    return tuple(tokens)


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this host only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host of a Host header, without its port ([v6]:port, v4:port, name:port)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminAccess:
    """The admin API's rules (see the module docstring)."""

    tokens: tuple[Token, ...] = ()
    hosts: frozenset[str] = frozenset()
    """Host names accepted besides IP literals and `localhost` (`--admin-host`)."""

    def check(self, method: str, path: str, host: str | None, authorization: str | None) -> Verdict:
        """Whether to serve a request.

        Args:
            method: the request's method.
            path: its path, without the query.
            host: its Host header (None: none).
            authorization: its Authorization header (None: none).
        """
        if host is None:
            return Refused(400, "a Host header is required")
        name = _host_name(host.strip()).lower()
        if not self._host_ok(name):
            return Refused(
                421,
                f"Host {name!r} does not name this router (a DNS rebinding attack would look like this); "
                "use its address, or start routerd with --admin-host NAME",
            )
        if not self.tokens:
            return Allowed("anyone on this host (no admin tokens)")
        if path in OPEN_PATHS and method in READ_METHODS:
            return Allowed("anyone (health check)")
        token = self._token(authorization)
        if token is None:
            return Refused(401, "a valid token is needed: Authorization: Bearer TOKEN")
        if method in READ_METHODS:
            needed = Level.USER
        else:
            needed = Level.ADMIN if path.rstrip("/") in ADMIN_PATHS else Level.OPERATOR
        if token.level < needed:
            return Refused(
                403,
                f"token {token.name!r} has level {token.level.name.lower()}; {method} needs "
                f"{needed.name.lower()}",
            )
        return Allowed(f"{token.name} ({token.level.name.lower()})")

    def _host_ok(self, name: str) -> bool:
        if name == "localhost" or name in self.hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def _token(self, authorization: str | None) -> Token | None:
        if authorization is None:
            return None
        scheme, _, secret = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not secret:
            return None
        found = None
        for token in self.tokens:  # every one compared, in constant time each
            if hmac.compare_digest(token.secret.encode(), secret.strip().encode()):
                found = token
        return found


def hosts_of(names: Iterable[str]) -> frozenset[str]:
    """`--admin-host` names as `AdminAccess.hosts` compares them."""
    return frozenset(name.strip().lower() for name in names if name.strip())
