"""The router's authentication rules, with a real user store."""

from __future__ import annotations

import pytest

from keys import KeyType
from keys.users import UserStore, hash_password
from router.core.auth import AuthOutcome, authenticate

STORE = UserStore.parse(
    f"alice = wonderland\nbob = {hash_password('builder', salt=bytes(32))}\n",
    "admins = alice\noperators = bob, alice\n",
    users_source="users.properties",
    roles_source="roles.properties",
)


def _auth(
    *,
    key_type: KeyType = KeyType.ROLE_NAME,
    required: bool = False,
    cert: str | None = None,
    user: str | None = None,
    password: str | None = None,
    store: UserStore | None = STORE,
) -> AuthOutcome:
    return authenticate(
        store, key_type=key_type, required=required, certificate_user=cert, wire_user=user, password=password
    )


def test_authenticate_plain_and_hashed_passwords_give_roles_in_store_order() -> None:
    assert _auth(user="alice", password="wonderland") == AuthOutcome(
        user="alice", roles=("admins", "operators")
    )
    assert _auth(user="bob", password="builder") == AuthOutcome(user="bob", roles=("operators",))


@pytest.mark.parametrize(("user", "password"), [("alice", "nope"), ("mallory", "x"), ("bob", None)])
def test_authenticate_wrong_credentials_are_refused_without_the_password(
    user: str, password: str | None
) -> None:
    outcome = _auth(user=user, password=password)
    assert outcome.refused
    assert outcome.reason == f"user {user!r} not authenticated by the store"


def test_authenticate_no_credentials_refused_only_when_required() -> None:
    assert _auth() == AuthOutcome()
    assert _auth(required=True, key_type=KeyType.CLIENT_ID).refused


def test_authenticate_certificate_user_needs_no_password() -> None:
    assert _auth(cert="bob") == AuthOutcome(user="bob", roles=("operators",))
    assert _auth(cert="carol", store=None) == AuthOutcome(user="carol")


def test_authenticate_is_skipped_when_neither_required_nor_role_keyed() -> None:
    assert _auth(key_type=KeyType.CLIENT_ID, user="alice", password="nope") == AuthOutcome()
    assert _auth(store=None, user="alice", password="nope") == AuthOutcome()
