"""routerctl's side of the admin API: where it is, the token, one request, and `Ctl`.

Every routerctl command that asks a running routerd goes through here: `admin_options` adds
`--admin` and `--json` to its parser, and its `run` gets a `Ctl` (router/feature.py `Command`),
whose `request` sends one request with the token (ROUTERCTL_TOKEN_FILE or ROUTERCTL_TOKEN) and
returns the JSON answer, raising `CtlError` with the documented exit status when it fails.
routerd takes its own `--admin` in the same forms (`parse_admin_address`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from router.ctl_output import (
    CtlError,
    ExitCode,
    Fields,
    Output,
    Renderable,
    add_json_option,
    exit_code_for_http,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from router.ctl_output import Blocks

__all__ = [
    "ADMIN_ENV",
    "ADMIN_SYNTAX",
    "DEFAULT_ADMIN",
    "MAX_TOKENS_BYTES",
    "REQUEST_TIMEOUT_S",
    "Ctl",
    "admin_options",
    "admin_url",
    "fields_blocks",
    "parse_admin_address",
    "quoted",
    "request",
]


ADMIN_SYNTAX: Final = "HOST:PORT, [IPV6]:PORT, :PORT, PORT or http://HOST:PORT"
"""The admin address forms `routerd --admin` and `routerctl --admin` both take."""
DEFAULT_ADMIN: Final = ("127.0.0.1", 9180)


def parse_admin_address(text: str) -> tuple[str, int]:
    """The admin API's address, for `routerd --admin` (where to listen) and `routerctl --admin`
    (where to ask): one of `ADMIN_SYNTAX`; no host means 127.0.0.1.

    Raises:
        argparse.ArgumentTypeError: anything else (a usage error, exit status 2).
    """
    rest = text.strip()
    if "://" in rest:
        url = urllib.parse.urlsplit(rest)
        if url.scheme != "http":
            raise argparse.ArgumentTypeError(f"the admin API speaks plain http://, got {text!r}")
        if url.path not in ("", "/") or url.query or url.fragment or "@" in url.netloc:
            raise argparse.ArgumentTypeError(f"expected http://HOST:PORT with nothing after it, got {text!r}")
        rest = url.netloc
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]:")
    elif rest.isdigit():
        host, sep, port = "", ":", rest
    else:
        host, sep, port = rest.rpartition(":")
        if ":" in host:
            raise argparse.ArgumentTypeError(
                f"an IPv6 address goes in brackets, [{host}]:{port}; got {text!r}"
            )
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected {ADMIN_SYNTAX}, got {text!r}")
    return host or "127.0.0.1", int(port)


ADMIN_ENV: Final = "ROUTERCTL_ADMIN"
"""Where routerctl finds the admin API when `--admin` is not given."""
REQUEST_TIMEOUT_S: Final = 10.0
"""Longest wait for one admin API answer."""


def admin_options(parser: argparse.ArgumentParser, *, again: bool = False) -> None:
    """`--admin` and `--json`: every command that asks a running router. `again`: on an action of
    such a command too (`cache list … --json`), where not giving them keeps the command's value."""
    parser.add_argument(
        "--admin",
        type=parse_admin_address,
        metavar="ADDRESS",
        default=argparse.SUPPRESS if again else None,
        help=f"the router's admin API: {ADMIN_SYNTAX}, as routerd's --admin "
        f"(default: ${ADMIN_ENV}, else 127.0.0.1:9180)",
    )
    add_json_option(parser, again=again)


MAX_TOKENS_BYTES: Final = 1024 * 1024
"""Largest tokens file read (routerd's `--admin-tokens`, routerctl's ROUTERCTL_TOKEN_FILE)."""


def _token() -> str | None:
    """The admin API token for routerctl: the file ROUTERCTL_TOKEN_FILE names, or ROUTERCTL_TOKEN."""
    path = os.environ.get("ROUTERCTL_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as file:
                return file.read(MAX_TOKENS_BYTES).strip() or None
        except OSError as exc:
            raise CtlError(f"ROUTERCTL_TOKEN_FILE {path!r}: {exc.strerror}", ExitCode.USAGE) from None
    return os.environ.get("ROUTERCTL_TOKEN") or None


def admin_url(args: argparse.Namespace) -> str:
    """The admin API's base URL: `--admin`, else $ROUTERCTL_ADMIN, else the default."""
    address: tuple[str, int] | None = args.admin
    if address is None:
        text = os.environ.get(ADMIN_ENV, "").strip()
        try:
            address = parse_admin_address(text) if text else DEFAULT_ADMIN
        except argparse.ArgumentTypeError as exc:
            raise CtlError(f"{ADMIN_ENV}: {exc}", ExitCode.USAGE) from None
    host, port = address
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def quoted(*parts: str) -> str:
    """URL path segments, each quoted (a router or node id may hold any character)."""
    return "".join("/" + urllib.parse.quote(part, safe="") for part in parts)


def request(
    args: argparse.Namespace,
    path: str,
    *,
    method: str = "GET",
    body: object = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> object:
    """One admin API request (`body` sent as JSON); its JSON answer.

    Raises:
        CtlError: the router answered an error (its code and message: exit 1, or 4 when it
            refused access), or it cannot be reached or did not answer JSON (exit 3).
    """
    base = admin_url(args)
    url = base + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    token = _token()
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            detail = exc.reason
        raise CtlError(f"{url}: {exc.code} {detail}", exit_code_for_http(exc.code)) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CtlError(
            f"cannot reach the router's admin API at {base}: {reason}", ExitCode.UNREACHABLE
        ) from None
    except ValueError:
        raise CtlError(
            f"the admin API at {base} answered {path} with something that is not JSON", ExitCode.UNREACHABLE
        ) from None


def fields_blocks(document: object) -> list[Renderable]:
    fields = Fields()
    if isinstance(document, dict):
        for name, value in document.items():
            fields.add(str(name).replace("_", " "), value)
    return [fields]


@dataclass(frozen=True, slots=True)
class Ctl:
    """What a routerctl command runs with: its arguments' admin API, and the output."""

    args: argparse.Namespace
    out: Output
    router_blocks: Sequence[Blocks] = ()
    """The features' parts of a router's output (`Feature.router_blocks`), after the kernel's."""

    @property
    def admin_url(self) -> str:
        """The admin API's base URL (`admin_url`)."""
        return admin_url(self.args)

    def request(
        self, path: str, *, method: str = "GET", body: object = None, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> object:
        """One admin API request and its JSON answer (`request`)."""
        return request(self.args, path, method=method, body=body, timeout_s=timeout_s)
