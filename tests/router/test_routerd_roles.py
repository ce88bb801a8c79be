"""ROLE_NAME end to end: routerd authenticates MQTT clients against its own user store.

Two users with different roles land on different real mosquitto brokers (roles admins -> node4,
operators -> node20 on Artemis's ring, checked with `routerctl route`); a wrong password gets
MQTT's own "not authorized" (CONNACK 0x87 for v5, return code 5 for 3.1.1).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest

from tests.conftest import recv_exactly
from tests.router.conftest import static_connectors

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.router.conftest import Mosquitto, Routerd

NODE_IDS = ["node4", "node9", "node20"]


def _connect_packet(client_id: str, user: str, password: str, *, level: int) -> bytes:
    """An MQTT CONNECT with user name and password (MQTT 3.1.1 §3.1 / MQTT 5 §3.1)."""

    def utf8(text: str) -> bytes:
        return len(text.encode()).to_bytes(2, "big") + text.encode()

    properties = b"\x00" if level == 5 else b""
    variable = utf8("MQTT") + bytes([level, 0xC2]) + (60).to_bytes(2, "big") + properties
    payload = utf8(client_id) + utf8(user) + utf8(password)
    body = variable + payload
    assert len(body) < 128
    return b"\x10" + bytes([len(body)]) + body


def _first_bytes(port: int, data: bytes, count: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return recv_exactly(s, count)


@pytest.fixture
def routed(
    tmp_path: Path,
    mosquitto_fleet: list[Mosquitto],
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> tuple[Routerd, int]:
    (tmp_path / "users.properties").write_text("alice = wonderland\nbob = builder\n")
    (tmp_path / "roles.properties").write_text("admins = alice\noperators = bob\n")
    port = free_port()
    connectors, refs = static_connectors(zip(NODE_IDS, (b.port for b in mosquitto_fleet), strict=True))
    params = f"router=roles;usersFile={tmp_path}/users.properties;rolesFile={tmp_path}/roles.properties"
    xml = f"""<core><connectors>{connectors}</connectors>
      <acceptors><acceptor name="mqtt">tcp://127.0.0.1:{port}?{params}</acceptor></acceptors>
      <connection-routers><connection-router name="roles"><key-type>ROLE_NAME</key-type>
        <policy name="CONSISTENT_HASH"/>
        <pool><check-period>200</check-period><static-connectors>{refs}</static-connectors></pool>
      </connection-router></connection-routers></core>"""
    router = start_routerd(lambda _admin: xml)
    for _ in NODE_IDS:
        router.wait_for_log(r"router=roles target=node\d+ is ready")
    return router, port


@pytest.mark.integration
def test_role_name_routes_users_with_different_roles_to_different_brokers(
    routed: tuple[Routerd, int],
) -> None:
    router, port = routed
    assert (
        _first_bytes(port, _connect_packet("c-alice", "alice", "wonderland", level=4), 4)
        == b"\x20\x02\x00\x00"
    )
    router.wait_for_log(r"key=admins target=node4 outcome=OK")
    assert _first_bytes(port, _connect_packet("c-bob", "bob", "builder", level=4), 4) == b"\x20\x02\x00\x00"
    router.wait_for_log(r"key=operators target=node20 outcome=OK")


@pytest.mark.integration
@pytest.mark.parametrize(("level", "connack"), [(5, b"\x20\x03\x00\x87\x00"), (4, b"\x20\x02\x00\x05")])
def test_role_name_wrong_password_gets_not_authorized(
    routed: tuple[Routerd, int], level: int, connack: bytes
) -> None:
    router, port = routed
    assert _first_bytes(port, _connect_packet("c-x", "alice", "wrong", level=level), 8) == connack
    router.wait_for_log(r"outcome=NOT_AUTHORIZED reason=\"user 'alice' not authenticated by the store\"")
