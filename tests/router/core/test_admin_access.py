"""Tests for router/core/admin_access.py: the admin API's Host rule, tokens and levels, its
connection places, the wrong-token delays and the Content-Length rule."""

from __future__ import annotations

import pytest

from router.core.admin_access import (
    AUTH_MAX_DELAY_S,
    MAX_REQUEST_BYTES,
    AdminAccess,
    AdminConnections,
    Admission,
    Allowed,
    AuthFailures,
    Level,
    Refused,
    Token,
    check_content_length,
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


class TestAdminConnections:
    def test_admin_connections_take_places_until_the_limit(self) -> None:
        table = AdminConnections(max_connections=3, max_per_source=2)
        assert table.open("a") == Admission(conn=0, displaced=None)
        assert table.open("b") == Admission(conn=1, displaced=None)
        assert len(table) == 2

    def test_admin_connections_over_the_source_limit_displace_their_own_oldest_waiting(self) -> None:
        table = AdminConnections(max_connections=8, max_per_source=2)
        other = table.open("b")
        assert other is not None
        first, second = table.open("a"), table.open("a")
        assert first is not None
        assert second is not None
        assert table.open("a") == Admission(conn=3, displaced=first.conn)  # never b's
        table.serving(second.conn)
        assert table.open("a") == Admission(conn=4, displaced=3)

    def test_admin_connections_over_the_limit_displace_the_oldest_waiting_of_any_source(self) -> None:
        table = AdminConnections(max_connections=2, max_per_source=2)
        assert table.open("a") is not None
        assert table.open("b") is not None
        table.serving(0)
        assert table.open("c") == Admission(conn=2, displaced=1)

    def test_admin_connections_refuse_when_every_place_is_being_served(self) -> None:
        table = AdminConnections(max_connections=2, max_per_source=1)
        for source in ("a", "b"):
            admitted = table.open(source)
            assert admitted is not None
            table.serving(admitted.conn)
        assert table.open("c") is None
        assert table.open("a") is None
        table.close(0)
        assert table.open("a") == Admission(conn=2, displaced=None)
        table.close(1)
        table.close(99)  # unknown: ignored
        assert table.open("c") == Admission(conn=3, displaced=None)

    def test_admin_connections_reject_bad_limits(self) -> None:
        with pytest.raises(ValueError, match="max_per_source <= max_connections"):
            AdminConnections(max_connections=2, max_per_source=3)


class TestAuthFailures:
    def test_auth_failures_first_few_are_free_then_the_delay_doubles_up_to_the_cap(self) -> None:
        failures = AuthFailures(window_s=60, free=2, base_delay_s=0.1, max_delay_s=0.5)
        delays = []
        for _ in range(7):
            delays.append(failures.delay_s("a", 1.0))
            failures.failed("a", 1.0)
        assert delays == [0.0, 0.0, 0.0, 0.1, 0.2, 0.4, 0.5]
        assert failures.delay_s("b", 1.0) == 0.0  # another source is not slowed

    def test_auth_failures_window_ends(self) -> None:
        failures = AuthFailures(window_s=60, free=0, base_delay_s=0.1, max_delay_s=1.0)
        assert failures.failed("a", 0.0) == 1
        assert failures.delay_s("a", 59.9) == 0.1
        assert failures.delay_s("a", 60.0) == 0.0
        assert failures.failed("a", 60.0) == 1

    def test_auth_failures_table_is_bounded(self) -> None:
        failures = AuthFailures(max_sources=3)
        for i in range(10):
            failures.failed(f"10.0.0.{i}", float(i))
        assert len(failures) == 3
        assert failures.failures("10.0.0.9", 9.0) == 1
        assert failures.failures("10.0.0.0", 9.0) == 0

    def test_auth_failures_delay_of_many_failures_stays_bounded(self) -> None:
        failures = AuthFailures()
        for _ in range(10_000):
            failures.failed("a", 0.0)
        assert failures.delay_s("a", 0.0) == AUTH_MAX_DELAY_S

    def test_auth_failures_reject_bad_settings(self) -> None:
        with pytest.raises(ValueError, match="base_delay_s <= max_delay_s"):
            AuthFailures(base_delay_s=3.0, max_delay_s=1.0)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        (["0"], None),
        ([str(MAX_REQUEST_BYTES)], None),
        ([" 12 ", "12"], None),
        ([str(MAX_REQUEST_BYTES + 1)], Refused(413, "request body over 65536 bytes (Content-Length 65537)")),
        (["9" * 400], Refused(413, f"request body over 65536 bytes (Content-Length {'9' * 32})")),
        (["1e20"], Refused(400, "Content-Length must be one decimal length, got '1e20'")),
        (["-1"], Refused(400, "Content-Length must be one decimal length, got '-1'")),
        (["١٢"], Refused(400, "Content-Length must be one decimal length, got '١٢'")),  # Arabic-Indic digits
        (["1", "2"], Refused(400, "Content-Length must be one decimal length, got '1', '2'")),
    ],
)
def test_check_content_length(values: list[str], expected: Refused | None) -> None:
    assert check_content_length(values) == expected
