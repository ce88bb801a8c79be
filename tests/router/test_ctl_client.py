"""router/ctl_client.py: the admin address forms, and `Ctl`'s requests against a real admin API."""

from __future__ import annotations

import argparse
import re

import pytest

from router.ctl_client import Ctl, parse_admin_address
from router.ctl_output import CtlError, ExitCode, Output
from tests.conftest import free_port


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.2:9180", ("127.0.0.2", 9180)),
        ("localhost:1", ("localhost", 1)),
        (":9180", ("127.0.0.1", 9180)),
        ("9180", ("127.0.0.1", 9180)),
        ("[::1]:9180", ("::1", 9180)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("http://127.0.0.1:21890", ("127.0.0.1", 21890)),
        ("http://[::1]:21890/", ("::1", 21890)),
        (" http://router.example:80 ", ("router.example", 80)),
    ],
)
def test_parse_admin_address_takes_every_documented_form(text: str, address: tuple[str, int]) -> None:
    assert parse_admin_address(text) == address


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("host", "expected HOST:PORT, [IPV6]:PORT, :PORT, PORT or http://HOST:PORT, got 'host'"),
        ("host:65536", "got 'host:65536'"),
        ("host:-1", "got 'host:-1'"),
        ("::1:9180", "an IPv6 address goes in brackets, [::1]:9180; got '::1:9180'"),
        ("[::1]9180", "got '[::1]9180'"),
        ("https://host:9180", "the admin API speaks plain http://, got 'https://host:9180'"),
        ("http://host:9180/api", "expected http://HOST:PORT with nothing after it"),
        ("http://user@host:9180", "expected http://HOST:PORT with nothing after it"),
        ("", "got ''"),
    ],
)
def test_parse_admin_address_rejects_anything_else(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse_admin_address(text)


def test_ctl_request_against_nothing_listening_is_unreachable() -> None:
    """Scenario: a Ctl whose --admin names a port nothing listens on: exit status 3, and the
    message names the admin API's address."""
    port = free_port()
    ctl = Ctl(argparse.Namespace(admin=("127.0.0.1", port)), Output(json_output=True))
    assert ctl.admin_url == f"http://127.0.0.1:{port}"
    with pytest.raises(CtlError) as raised:
        ctl.request("/api/v1/status", timeout_s=2)
    assert raised.value.code == ExitCode.UNREACHABLE
    assert f"127.0.0.1:{port}" in raised.value.message
