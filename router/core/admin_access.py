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

And two rules that keep the admin API answering whoever else calls it (docs/operations.md,
"Security of the admin API"):

3. **Connections** (`AdminConnections`): at most `ADMIN_MAX_CONNECTIONS` open at once and
   `ADMIN_MAX_PER_SOURCE` from one address. A connection that has not sent its request head yet
   (or waits out a delay of rule 4) holds no place: a new one takes the place of the oldest such
   connection of its own address, when that address is at its limit, else of any address. A few
   slow or silent connections therefore never keep /healthz and /readyz from being answered; only
   requests being served (an allowed request, read and answered) hold their place.
4. **Wrong tokens** (`AuthFailures`): each address's 401s are counted over `AUTH_WINDOW_S`; past
   `AUTH_FREE_FAILURES` of them, every request from that address that needs a token waits
   `AUTH_BASE_DELAY_S`, doubled with each further failure up to `AUTH_MAX_DELAY_S`, before it is
   checked (right token or wrong: otherwise a guesser would stop waiting and take the wait for a
   no). Other addresses are not slowed. At most `AUTH_MAX_SOURCES` addresses are remembered.
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
    "ADMIN_MAX_CONNECTIONS",
    "ADMIN_MAX_PER_SOURCE",
    "ADMIN_PATHS",
    "AUTH_BASE_DELAY_S",
    "AUTH_FREE_FAILURES",
    "AUTH_MAX_DELAY_S",
    "AUTH_MAX_SOURCES",
    "AUTH_WINDOW_S",
    "HEAD_TIMEOUT_S",
    "MAX_REQUEST_BYTES",
    "MIN_TOKEN_LENGTH",
    "OPEN_PATHS",
    "READ_METHODS",
    "REQUEST_TIMEOUT_S",
    "AdminAccess",
    "AdminConnections",
    "Admission",
    "Allowed",
    "AuthFailures",
    "Level",
    "Refused",
    "Token",
    "Verdict",
    "check_content_length",
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

MAX_REQUEST_BYTES: Final = 64 * 1024
"""Largest request (head and body) the admin API reads; h11's own default cap for heads is 16 KiB.
A `Content-Length` over it is answered 413 at once, before any of the body is read."""
HEAD_TIMEOUT_S: Final = 5.0
"""A client must send its request head (request line and headers) within this time of connecting;
a health checker sends it at once (HAProxy's `timeout http-request` is commonly 5-10 s)."""
REQUEST_TIMEOUT_S: Final = 10.0
"""A client must send its whole request (head and body) within this time of connecting."""
ADMIN_MAX_CONNECTIONS: Final = 16
"""Admin connections open at once (rule 3). Part of the descriptors the process keeps back from
clients (`router.core.admission.DESCRIPTOR_RESERVE`), so the admin API still answers when client
connections have used their whole budget."""
ADMIN_MAX_PER_SOURCE: Final = 4
"""Admin connections open at once from one address (rule 3): a dashboard, routerctl and a probe
or two; a quarter of `ADMIN_MAX_CONNECTIONS`, so one address cannot hold them all."""
AUTH_WINDOW_S: Final = 60.0
"""Rule 4 counts an address's wrong tokens over this many seconds (a fixed window from its first
failure; HAProxy's `http_err_rate(60s)` is the like)."""
AUTH_FREE_FAILURES: Final = 5
"""Wrong tokens an address may send in a window before its requests are slowed (typos)."""
AUTH_BASE_DELAY_S: Final = 0.1
"""The wait after `AUTH_FREE_FAILURES` failures; each further failure doubles it."""
AUTH_MAX_DELAY_S: Final = 2.0
"""The longest wait. With `ADMIN_MAX_PER_SOURCE` requests at once, one address then tries at most
2 tokens a second (it was about 900 without the wait)."""
AUTH_MAX_SOURCES: Final = 4096
"""Addresses rule 4 remembers; when full, the one whose window started first is forgotten."""


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


def check_content_length(values: Iterable[str]) -> Refused | None:
    """Whether a request's `Content-Length` header(s) may be read on (None), or the answer at once:
    400 for a value that is not a length, 413 for one over `MAX_REQUEST_BYTES`.

    Args:
        values: every `Content-Length` header's value (none: no body, or a chunked one).
    """
    lengths = {value.strip() for value in values}
    if not lengths:
        return None
    if len(lengths) > 1 or not all(v.isascii() and v.isdigit() for v in lengths):
        shown_values = ", ".join(repr(v[:32]) for v in sorted(lengths))
        return Refused(400, f"Content-Length must be one decimal length, got {shown_values}")
    (length,) = lengths
    if len(length) > 20 or int(length) > MAX_REQUEST_BYTES:  # 20 digits: no int() of a long string
        return Refused(413, f"request body over {MAX_REQUEST_BYTES} bytes (Content-Length {length[:32]})")
    return None


@dataclass(frozen=True, slots=True)
class Admission:
    """Serve the new connection `conn`; first close `displaced`, if any (rule 3)."""

    conn: int
    displaced: int | None


@dataclass(slots=True)
class _Open:
    source: str
    waiting: bool
    """True: it holds no place (no request head yet, or waiting out a delay)."""


class AdminConnections:
    """The admin API's open connections and rule 3 (see the module docstring).

    Connections are numbered in the order they open, so the oldest has the smallest number. The
    listener asks `open` for each new connection and closes what it says, tells `serving` once a
    request head is in and allowed (a delay of rule 4 comes before: the connection holds no place
    while it waits), and `close` when it is gone.
    """

    def __init__(
        self, *, max_connections: int = ADMIN_MAX_CONNECTIONS, max_per_source: int = ADMIN_MAX_PER_SOURCE
    ) -> None:
        if max_connections < 1 or not 1 <= max_per_source <= max_connections:
            raise ValueError(
                f"need 1 <= max_per_source <= max_connections, got {max_per_source} and {max_connections}"
            )
        self.max_connections = max_connections
        self.max_per_source = max_per_source
        self._open: dict[int, _Open] = {}  # in the order they opened
        self._next = 0

    def __len__(self) -> int:
        return len(self._open)

    def open(self, source: str) -> Admission | None:
        """A new connection from `source`: the place it takes, or None: close it at once (every
        place it could take is held by a request being served).

        Args:
            source: the peer's address (without its port).
        """
        same = [conn for conn, o in self._open.items() if o.source == source]
        displaced: int | None = None
        if len(same) >= self.max_per_source:
            displaced = next((conn for conn in same if self._open[conn].waiting), None)
            if displaced is None:
                return None
        elif len(self._open) >= self.max_connections:
            displaced = next((conn for conn, o in self._open.items() if o.waiting), None)
            if displaced is None:
                return None
        if displaced is not None:
            del self._open[displaced]
        conn, self._next = self._next, self._next + 1
        self._open[conn] = _Open(source=source, waiting=True)
        return Admission(conn=conn, displaced=displaced)

    def serving(self, conn: int) -> None:
        """`conn` has sent a request that is allowed: it holds its place until it is closed."""
        if conn in self._open:
            self._open[conn].waiting = False

    def close(self, conn: int) -> None:
        """`conn` is closed (by either side, or displaced); unknown numbers are ignored."""
        self._open.pop(conn, None)


@dataclass(slots=True)
class _Failures:
    since: float
    count: int


class AuthFailures:
    """Rule 4: the wrong tokens of each address and how long its next request waits (pure: `now`
    is an argument, in seconds of any monotonic clock)."""

    def __init__(
        self,
        *,
        window_s: float = AUTH_WINDOW_S,
        free: int = AUTH_FREE_FAILURES,
        base_delay_s: float = AUTH_BASE_DELAY_S,
        max_delay_s: float = AUTH_MAX_DELAY_S,
        max_sources: int = AUTH_MAX_SOURCES,
    ) -> None:
        if not (window_s > 0 and free >= 0 and 0 < base_delay_s <= max_delay_s and max_sources >= 1):
            raise ValueError(
                "need window_s > 0, free >= 0, 0 < base_delay_s <= max_delay_s and max_sources >= 1, got "
                f"{window_s!r}, {free!r}, {base_delay_s!r}, {max_delay_s!r}, {max_sources!r}"
            )
        self.window_s, self.free, self.max_sources = window_s, free, max_sources
        self.base_delay_s, self.max_delay_s = base_delay_s, max_delay_s
        self._sources: dict[str, _Failures] = {}  # in the order their windows started

    def __len__(self) -> int:
        return len(self._sources)

    def failures(self, source: str, now: float) -> int:
        """Wrong tokens from `source` in its window at `now`."""
        entry = self._sources.get(source)
        if entry is None or now - entry.since >= self.window_s:
            return 0
        return entry.count

    def delay_s(self, source: str, now: float) -> float:
        """How long a request from `source` that needs a token waits before it is checked."""
        over = self.failures(source, now) - self.free
        if over <= 0:
            return 0.0
        return min(self.max_delay_s, self.base_delay_s * 2.0 ** min(over - 1, 64))

    def failed(self, source: str, now: float) -> int:
        """Count a wrong token from `source` at `now`; the failures in its window, this one too."""
        entry = self._sources.get(source)
        if entry is None or now - entry.since >= self.window_s:
            self._sources.pop(source, None)
            while len(self._sources) >= self.max_sources:  # forget the oldest window
                del self._sources[next(iter(self._sources))]
            entry = self._sources[source] = _Failures(since=now, count=0)
        entry.count += 1
        return entry.count
