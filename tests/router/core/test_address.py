"""router/core/address.py: (host, port) pairs, formatted only for log lines."""

from __future__ import annotations

import pytest

from router.core.address import Address


def test_address_formats_ipv6_in_brackets_and_ipv4_plain() -> None:
    assert str(Address("127.0.0.1", 5000)) == "127.0.0.1:5000"
    assert str(Address("::1", 5000)) == "[::1]:5000"
    assert str(Address("broker.example", 61616)) == "broker.example:61616"


def test_address_is_the_pair_a_socket_gives() -> None:
    assert Address("10.0.0.1", 1883) == ("10.0.0.1", 1883)
    assert Address.of(("::1", 5000, 0, 0)) == Address("::1", 5000)  # flow info and scope id dropped
    assert Address.of(("127.0.0.2", 40000)) == ("127.0.0.2", 40000)


def test_address_of_a_non_internet_socket_name_is_an_error() -> None:
    with pytest.raises(TypeError, match="not an internet socket name"):
        Address.of(("/run/x.sock",))  # what an AF_UNIX name looks like
    with pytest.raises(TypeError, match="not an internet socket name"):
        Address.of((b"\x00", "80"))
