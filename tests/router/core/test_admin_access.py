"""Tests for router/core/admin_access.py: the admin API's Host rule, tokens and levels."""

from __future__ import annotations

import pytest

from router.core.admin_access import (
    AdminAccess,
    Allowed,
    Level,
    Refused,
    Token,
    hosts_of,
    is_loopback,
    parse_tokens,
)

READER = "r" * 32
OPERATOR = "o" * 32
TOKENS = (
    Token(name="dashboards", level=Level.USER, secret=READER),
    Token(name="oncall", level=Level.OPERATOR, secret=OPERATOR),
)


def test_parse_tokens_reads_names_levels_and_secrets():
    text = f"# who level token\n\ndashboards user {READER}\noncall OPERATOR {OPERATOR}\n"
    assert parse_tokens(text, "t") == TOKENS
    assert "r" * 32 not in repr(parse_tokens(text, "t"))  # secrets stay out of reprs (and logs)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a user", "t:1: expected NAME LEVEL TOKEN, got 2 word(s)"),
        (f"a root {READER}", "t:1: level must be one of user, operator, admin, got 'root'"),
        ("a user short", "t:1: token of 'a' is shorter than 16 characters"),
        (f"a user {READER}\na admin {OPERATOR}", "t:2: name 'a' is given twice"),
        ("# nothing\n", "t: no token (lines NAME LEVEL TOKEN)"),
    ],
)
def test_parse_tokens_rejects_what_breaks_a_rule(text, message):
    with pytest.raises(ValueError, match=r"^t:") as info:
        parse_tokens(text, "t")
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:9180", True),
        ("[::1]:9180", True),
        ("10.1.2.3", True),
        ("localhost:9180", True),
        ("LocalHost", True),
        ("router.internal:9180", True),  # given with --admin-host
        ("evil.example:9180", False),
        ("evil.example", False),
    ],
)
def test_the_host_must_name_this_router(host, allowed):
    access = AdminAccess(hosts=hosts_of(["Router.Internal"]))
    verdict = access.check("GET", "/api/v1/routers", host, None)
    assert isinstance(verdict, Allowed) is allowed
    if not allowed:
        assert verdict == Refused(
            421,
            f"Host {host.split(':')[0]!r} does not name this router (a DNS rebinding attack would look "
            "like this); use its address, or start routerd with --admin-host NAME",
        )


def test_a_request_without_host_is_refused():
    assert AdminAccess().check("GET", "/metrics", None, None) == Refused(400, "a Host header is required")


def test_without_tokens_every_local_caller_may_do_everything():
    assert AdminAccess().check("PUT", "/api/v1/routers/r/targets/b", "127.0.0.1", None) == Allowed(
        "anyone on this host (no admin tokens)"
    )


@pytest.mark.parametrize(
    ("method", "path", "authorization", "verdict"),
    [
        ("GET", "/healthz", None, Allowed("anyone (health check)")),
        ("GET", "/readyz", None, Allowed("anyone (health check)")),
        ("HEAD", "/readyz", None, Allowed("anyone (health check)")),
        ("GET", "/metrics", None, Refused(401, "a valid token is needed: Authorization: Bearer TOKEN")),
        (
            "GET",
            "/metrics",
            "Bearer wrong-token-wrong-token",
            Refused(401, "a valid token is needed: Authorization: Bearer TOKEN"),
        ),
        (
            "GET",
            "/metrics",
            f"Basic {READER}",
            Refused(401, "a valid token is needed: Authorization: Bearer TOKEN"),
        ),
        ("GET", "/metrics", f"Bearer {READER}", Allowed("dashboards (user)")),
        ("HEAD", "/api/v1/routers", f"bearer {READER}", Allowed("dashboards (user)")),
        (
            "PUT",
            "/api/v1/routers/r/targets/b",
            f"Bearer {READER}",
            Refused(403, "token 'dashboards' has level user; PUT needs operator"),
        ),
        ("PUT", "/api/v1/routers/r/targets/b", f"Bearer {OPERATOR}", Allowed("oncall (operator)")),
        ("DELETE", "/api/v1/routers/r/cache", f"Bearer {OPERATOR}", Allowed("oncall (operator)")),
        ("POST", "/healthz", None, Refused(401, "a valid token is needed: Authorization: Bearer TOKEN")),
        ("PUT", "/readyz", None, Refused(401, "a valid token is needed: Authorization: Bearer TOKEN")),
    ],
)
def test_tokens_and_levels(method, path, authorization, verdict):
    assert AdminAccess(tokens=TOKENS).check(method, path, "127.0.0.1:9180", authorization) == verdict


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("router.example", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
