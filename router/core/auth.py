"""The router's own authentication: who the client is, and its roles (SPEC A2 USER_NAME, ROLE_NAME).

Pure decision code around `keys.users.UserStore`: no I/O. The rules:

- A verified TLS client certificate authenticates its subject CN; its roles come from the store.
- Otherwise, when the acceptor requires authentication or the router keys on ROLE_NAME, the
  credentials on the wire are checked: wrong ones are refused with the protocol's own "not
  authorized" answer; none at all are refused only when authentication is required (a ROLE_NAME
  router then sees an unauthenticated client, whose key is NULL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from keys import KeyType

if TYPE_CHECKING:
    from keys.users import UserStore

__all__ = ["AuthOutcome", "authenticate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthOutcome:
    """Who the router says the client is."""

    user: str | None = None
    """The authenticated user, or None when the router authenticated no one."""
    roles: tuple[str, ...] = ()
    """Roles of that user in store order."""
    refused: bool = False
    """The client must get the protocol's "not authorized" answer."""
    reason: str = ""
    """Why it was refused, for the log line (never a password)."""


def authenticate(
    store: UserStore | None,
    *,
    key_type: KeyType,
    required: bool,
    certificate_user: str | None,
    wire_user: str | None,
    password: str | None,
) -> AuthOutcome:
    """Decide who the client is.

    Args:
        store: the acceptor's user/role store, or None.
        key_type: the router's key type.
        required: the acceptor requires authentication.
        certificate_user: subject CN of a verified client certificate.
        wire_user: the user name the client sent.
        password: the password the client sent.

    Returns:
        The outcome; `refused` means answer "not authorized" and close.
    """
    if certificate_user is not None:
        roles = () if store is None else store.roles.get(certificate_user, ())
        return AuthOutcome(user=certificate_user, roles=roles)
    if store is None or not (required or key_type is KeyType.ROLE_NAME):
        return AuthOutcome()
    if wire_user is None and password is None:
        if required:
            return AuthOutcome(refused=True, reason="no credentials and authentication is required")
        return AuthOutcome()
    authenticated = store.authenticate(wire_user, password)
    if authenticated is None:
        return AuthOutcome(refused=True, reason=f"user {wire_user!r} not authenticated by the store")
    return AuthOutcome(user=authenticated.user, roles=authenticated.roles)
