"""The router's user/role store: Artemis's `artemis-users.properties` and `artemis-roles.properties`.

When a router's key type is `ROLE_NAME` (or its acceptor requires authentication) the router checks
the credentials a client sent against this store (SPEC A2). This module reads the two files, keeps
them as a frozen `UserStore` and answers `authenticate(user, password)`. It is pure apart from
`UserStore.load` reading the two files: no trio, no sockets, no clock, no logging, and it never
puts a password, a salt or a hash into a message or a `repr`.

File formats, as Artemis's `PropertiesLoginModule` reads them (it calls
`java.util.Properties.load(InputStream)` on each file):

- Java properties syntax (`parse_properties`): `#` and `!` comment lines, `=`, `:` or whitespace
  between key and value, backslash line continuations, `\\t \\n \\r \\f \\uXXXX` escapes, leading
  whitespace ignored, trailing whitespace kept as part of the value. `Properties.load` on a byte
  stream decodes ISO-8859-1, so that is our default too (checked in Artemis's
  `ReloadableProperties.load` as of December 2025); characters outside Latin-1 must be written as
  `\\uXXXX`. `parse_properties` was checked against `java.util.Properties.load` (OpenJDK 17 and
  25) on 55,000 random texts of separators, escapes, comments and line breaks; the one difference
  is documented in `_logical_lines`.
- `artemis-users.properties`: `user = password`. A password wrapped in `ENC(...)` is hashed with
  Artemis's default one-way codec (`DefaultSensitiveStringCodec`, algorithm `one-way`, used by
  `artemis user add` unless `--plaintext`): `ENC(<iterations>:<hex salt>:<hex hash>)`, PBKDF2 with
  HMAC-SHA1 over the UTF-8 bytes of the password (what the JDK's `PBEKeySpec` does with its
  `char[]`), a 32-byte salt, 1024 iterations and a 64-byte (512-bit) key, hex in upper case.
  Verification derives as many bytes as the stored hash has, as Artemis's `verify` does. Anything
  not wrapped in `ENC(` ... `)` is a plain-text password.
- `artemis-roles.properties`: `role = user1,user2`. A user's roles, in store order, are the roles of
  the lines that name the user, in file order (Artemis keeps them in a hash set, so it has no
  order; SPEC A2 needs one for `ROLE_NAME`).

Where we are stricter or kinder than Artemis (our decisions):

- A user or role defined twice, or an empty user or role name, is an error with its line; Java
  keeps the last definition without a word, which for a password file hides a mistake.
- A malformed `ENC(...)` value is an error at load time; Artemis fails only when that user logs in.
- Names in a role's user list are stripped of surrounding whitespace and empty names are skipped
  (`admins = alice, bob,` names `alice` and `bob`); Artemis's login module splits on `,` only, so
  there ` bob` would be a different user. The `artemis user` command's own reader trims too.
- A client that sends no password is not authenticated, even for a user whose stored password is
  empty (Artemis treats a missing password as an empty one).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    import os
    from collections.abc import Iterator, Mapping

__all__ = [
    "DEFAULT_ITERATIONS",
    "FILE_ENCODING",
    "HASH_BYTES",
    "SALT_BYTES",
    "Authenticated",
    "HashedPassword",
    "PlainPassword",
    "StoredPassword",
    "UserStore",
    "UserStoreError",
    "hash_password",
    "parse_properties",
    "parse_stored_password",
    "verify_password",
]

FILE_ENCODING: Final = "iso-8859-1"
"""How the two files are decoded by default: `java.util.Properties.load(InputStream)` uses ISO-8859-1."""

# The next three values are the fields of Artemis's `DefaultSensitiveStringCodec.PBKDF2Algorithm`
# (artemis-commons, unchanged from 2.x to the December 2025 main branch): `iterations = 1024`,
# `saltLength = 32`, `keyLength = 64 * 8` bits. Artemis's own test vectors
# (`HashProcessorTest`, `users.properties` in artemis-server's test resources) verify with them.
DEFAULT_ITERATIONS: Final = 1024
"""PBKDF2 iterations Artemis's one-way codec uses when it hashes a password."""
SALT_BYTES: Final = 32
"""Length of the random salt Artemis's one-way codec draws."""
HASH_BYTES: Final = 64
"""Length of the derived key Artemis's one-way codec stores."""

_ENC_PREFIX: Final = "ENC("
_ENC_SUFFIX: Final = ")"
_PBKDF2_DIGEST: Final = "sha1"  # Artemis: SecretKeyFactory "PBKDF2WithHmacSHA1"

# java.util.Properties: whitespace is space, tab and form feed; lines end with \r\n, \r or \n.
_WHITESPACE: Final = " \t\f"
_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")
_SIMPLE_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")
_HEX: Final = re.compile(r"(?:[0-9A-Fa-f]{2})+")
_ITERATIONS: Final = re.compile(r"[0-9]{1,10}")
_MAX_JAVA_INT: Final = 2**31 - 1  # Artemis reads the iteration count with Integer.parseInt


class UserStoreError(ValueError):
    """A user or role file that cannot be used, with where and why.

    `str(error)` is one line, `{path}:{line}: {reason}`, or `{path}: {reason}` when the whole file
    is at fault (it cannot be read). It never contains a password, a salt or a hash.
    """

    path: str
    """The file, or the `source` name given to `parse_properties` / `UserStore.parse`."""
    line: int | None
    """Line where the offending entry starts (1-based), when there is one."""
    reason: str
    """What is wrong: lower-case start, no final full stop, names quoted with `!r`."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        reason = re.sub(r"\s*[\r\n]+\s*", " ", reason)
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


# --- java.util.Properties syntax ---------------------------------------------------------------


def _ends_with_odd_backslashes(line: str) -> bool:
    stripped = line.rstrip("\\")
    return (len(line) - len(stripped)) % 2 == 1


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join natural lines into logical lines as Properties.load's LineReader does.

    Blank and comment lines are skipped; so is a logical line that is still empty when it ends.
    Returns `(line number where the entry starts, logical line)` pairs.

    One deliberate difference: when the text ends with a line that holds only a backslash (and
    at most one line break after it), Java's LineReader yields an entry with an empty key and
    value, an artefact of how it detects the end of its input buffer; we yield nothing.
    """
    natural = _LINE_BREAK.split(text)
    logical: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 1
    for number, raw in enumerate(natural, start=1):
        line = raw.lstrip(_WHITESPACE)
        if not any(parts):
            # Nothing read yet on this logical line (Java: `len == 0`), so this may be a blank or a
            # comment line, even right after a continuation. A comment ending in '\' continues nothing.
            if not line or line[0] in "#!":
                parts = []
                continue
            start = number
        if _ends_with_odd_backslashes(line):
            parts.append(line[:-1])
            if number == len(natural) and any(parts):
                logical.append((start, "".join(parts)))  # the text ends right after the backslash
            continue
        parts.append(line)
        logical.append((start, "".join(parts)))
        parts = []
    return logical


def _split_key_value(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped '=', ':' or whitespace (Properties.load0)."""
    key_end = len(line)
    value_start = len(line)
    has_separator = False
    escaped = False
    for position, char in enumerate(line):
        if not escaped and char in "=:":
            key_end, value_start, has_separator = position, position + 1, True
            break
        if not escaped and char in _WHITESPACE:
            key_end, value_start = position, position + 1
            break
        escaped = char == "\\" and not escaped
    # Skip whitespace, then at most one '=' or ':' if the key ended at whitespace, then whitespace.
    while value_start < len(line):
        char = line[value_start]
        if char not in _WHITESPACE:
            if has_separator or char not in "=:":
                break
            has_separator = True
        value_start += 1
    return line[:key_end], line[value_start:]


def _unescape(text: str) -> str | None:
    """Apply Properties.loadConvert's escapes; None when a \\uXXXX escape is malformed."""
    if "\\" not in text:
        return text
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        position += 1
        if char != "\\":
            out.append(char)
            continue
        if position == len(text):
            break  # a lone trailing backslash escapes nothing
        char = text[position]
        position += 1
        if char == "u":
            digits = text[position : position + 4]
            if len(digits) != 4 or not _HEX_DIGITS.issuperset(digits):
                return None
            out.append(chr(int(digits, 16)))
            position += 4
        else:
            out.append(_SIMPLE_ESCAPES.get(char, char))
    result = "".join(out)
    # Java strings are UTF-16: "\ud83d\ude00" is one character there. Join such pairs; a lone
    # surrogate stays as it is (surrogatepass), as it would in Java.
    return result.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def parse_properties(text: str, source: str) -> list[tuple[int, str, str]]:
    """Parse the text of a Java properties file the way `java.util.Properties.load` does.

    Args:
        text: the decoded file contents.
        source: the file name to put into errors.

    Returns:
        One `(line, key, value)` per entry, in file order, duplicates included; `line` is the
        1-based line where the entry starts. A line with a key only gives the value "".

    Raises:
        UserStoreError: a `\\uXXXX` escape without four hex digits (Java's "Malformed \\uxxxx
            encoding"). The message does not quote the entry, which may hold a password.
    """
    entries: list[tuple[int, str, str]] = []
    for number, line in _logical_lines(text):
        raw_key, raw_value = _split_key_value(line)
        key = _unescape(raw_key)
        if key is None:
            raise UserStoreError(source, number, "malformed \\uxxxx escape in key")
        value = _unescape(raw_value)
        if value is None:
            raise UserStoreError(source, number, "malformed \\uxxxx escape in value")
        entries.append((number, key, value))
    return entries


# --- stored passwords ---------------------------------------------------------------------------


def _password_bytes(password: str) -> bytes:
    # The JDK's PBKDF2 (and our plain comparison) works on the UTF-8 encoding of the password;
    # like Java's encoder, "replace" turns a lone surrogate into b"?".
    return password.encode("utf-8", "replace")


def _check_hash_parameters(iterations: int, salt: bytes) -> None:
    """PBKDF2 parameters Artemis can use: an iteration count that fits a Java int, a salt (the
    JDK's PBEKeySpec rejects an empty one)."""
    if not 1 <= iterations <= _MAX_JAVA_INT:
        raise ValueError(f"iterations must be 1 to {_MAX_JAVA_INT}, got {iterations!r}")
    if not salt:
        raise ValueError("salt must not be empty")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlainPassword:
    """A password stored as plain text. Its `repr` hides the text."""

    text: str = field(repr=False)
    """The password itself."""

    def verify(self, password: str) -> bool:
        """Whether `password` is this password, compared in constant time for equal lengths.

        Args:
            password: what the client sent.

        Returns:
            True when the two are equal.
        """
        return hmac.compare_digest(_password_bytes(self.text), _password_bytes(password))


@dataclass(frozen=True, slots=True, kw_only=True)
class HashedPassword:
    """A password stored as Artemis's one-way hash, `ENC(<iterations>:<hex salt>:<hex hash>)`.

    Its `repr` shows the iteration count only.
    """

    iterations: int
    """PBKDF2 iteration count, 1 to 2**31 - 1 (a Java int)."""
    salt: bytes = field(repr=False)
    """The salt, not empty (the JDK's PBEKeySpec rejects an empty salt)."""
    digest: bytes = field(repr=False)
    """The derived key, not empty; verification derives as many bytes."""

    def __post_init__(self) -> None:
        _check_hash_parameters(self.iterations, self.salt)
        if not self.digest:
            raise ValueError("hash must not be empty")

    @classmethod
    def parse(cls, stored: str) -> HashedPassword:
        """Read the `ENC(...)` form that Artemis writes into `artemis-users.properties`.

        Args:
            stored: the whole value, `ENC(` and `)` included.

        Returns:
            The hashed password.

        Raises:
            ValueError: `stored` is not `ENC(<iterations>:<hex salt>:<hex hash>)`; the message
                names the part at fault but does not quote it.
        """
        if not (stored.startswith(_ENC_PREFIX) and stored.endswith(_ENC_SUFFIX)):
            raise ValueError("hashed password must be wrapped in ENC(...)")
        parts = stored[len(_ENC_PREFIX) : -len(_ENC_SUFFIX)].split(":")
        if len(parts) != 3:
            raise ValueError(
                f"hashed password must be ENC(<iterations>:<hex salt>:<hex hash>), got {len(parts)} part(s)"
            )
        iterations, salt, digest = parts
        if _ITERATIONS.fullmatch(iterations) is None or not 1 <= int(iterations) <= _MAX_JAVA_INT:
            raise ValueError("hashed password: iterations must be a whole number from 1 to 2147483647")
        if _HEX.fullmatch(salt) is None:
            raise ValueError("hashed password: salt must be a non-empty even number of hex digits")
        if _HEX.fullmatch(digest) is None:
            raise ValueError("hashed password: hash must be a non-empty even number of hex digits")
        return cls(iterations=int(iterations), salt=bytes.fromhex(salt), digest=bytes.fromhex(digest))

    def encode(self) -> str:
        """The `ENC(...)` form, hex in upper case as Artemis's `ByteUtil.bytesToHex` writes it."""
        body = f"{self.iterations}:{self.salt.hex().upper()}:{self.digest.hex().upper()}"
        return f"{_ENC_PREFIX}{body}{_ENC_SUFFIX}"

    def verify(self, password: str) -> bool:
        """Whether `password` hashes to this hash, compared in constant time.

        Args:
            password: what the client sent.

        Returns:
            True when PBKDF2-HMAC-SHA1 of the password with this salt and iteration count gives
            this hash.
        """
        candidate = hashlib.pbkdf2_hmac(
            _PBKDF2_DIGEST, _password_bytes(password), self.salt, self.iterations, len(self.digest)
        )
        return hmac.compare_digest(candidate, self.digest)


StoredPassword: TypeAlias = PlainPassword | HashedPassword
"""A password as `artemis-users.properties` stores it."""


def parse_stored_password(stored: str) -> StoredPassword:
    """Read one value of `artemis-users.properties`.

    As Artemis's `PasswordMaskingUtil.isEncMasked` decides: a value that starts with `ENC(` and
    ends with `)` is hashed, anything else is plain text.

    Args:
        stored: the value.

    Returns:
        A `HashedPassword` or a `PlainPassword`.

    Raises:
        ValueError: a value wrapped in `ENC(...)` that is not a valid hash (never quoted).
    """
    if stored.startswith(_ENC_PREFIX) and stored.endswith(_ENC_SUFFIX):
        return HashedPassword.parse(stored)
    return PlainPassword(text=stored)


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """Hash a password as `artemis user add` does, for `artemis-users.properties`.

    Args:
        password: the password.
        iterations: PBKDF2 iteration count; Artemis always uses 1024.
        salt: the salt; by default 32 random bytes from `secrets`, as Artemis draws them.

    Returns:
        `ENC(<iterations>:<HEX SALT>:<HEX HASH>)` with a 64-byte PBKDF2-HMAC-SHA1 hash.

    Raises:
        ValueError: `iterations` is not 1 to 2**31 - 1, or `salt` is empty.
    """
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    _check_hash_parameters(iterations, salt)  # before the derivation, which takes any salt
    digest = hashlib.pbkdf2_hmac(_PBKDF2_DIGEST, _password_bytes(password), salt, iterations, HASH_BYTES)
    return HashedPassword(iterations=iterations, salt=salt, digest=digest).encode()


def verify_password(stored: str, password: str) -> bool:
    """Check a password against a value of `artemis-users.properties`, plain or `ENC(...)`.

    Args:
        stored: the stored value.
        password: what the client sent.

    Returns:
        True when the password matches; both forms are compared with `hmac.compare_digest`.

    Raises:
        ValueError: `stored` is wrapped in `ENC(...)` but is not a valid hash (never quoted).
    """
    return parse_stored_password(stored).verify(password)


# Verified against when the user is unknown, so that an unknown user costs about as much time as a
# known user with an Artemis-default hash and does not reveal which user names exist.
_DUMMY_PASSWORD: Final = HashedPassword(
    iterations=DEFAULT_ITERATIONS, salt=bytes(SALT_BYTES), digest=bytes(HASH_BYTES)
)


# --- the store ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Authenticated:
    """A user whose credentials the router checked against its store."""

    user: str
    """The user name as the client sent it (equal to the name in the store)."""
    roles: tuple[str, ...] = ()
    """The user's roles in store order (order of the role lines); empty when it has none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UserStore:
    """Users with their stored passwords and roles, as read from the two Artemis files.

    Both mappings are copied into read-only mappings on construction. The `repr` shows user
    names, roles and which passwords are hashed, never a password or a hash.
    """

    users: Mapping[str, StoredPassword]
    """User name -> stored password; names are not empty."""
    roles: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """User name -> roles in store order, without repeats. May name users that have no password
    here (Artemis gives those roles to users that other login modules authenticate)."""

    def __post_init__(self) -> None:
        users = dict(self.users)
        for user, stored in users.items():
            if not user:
                raise ValueError("user names must not be empty")
            if not isinstance(stored, PlainPassword | HashedPassword):
                raise TypeError(f"user {user!r}: stored password must be PlainPassword or HashedPassword")
        roles = {user: tuple(names) for user, names in self.roles.items()}
        for user, names in roles.items():
            if not user:
                raise ValueError("user names must not be empty")
            if not all(names) or len(set(names)) != len(names):
                raise ValueError(f"user {user!r}: roles must be non-empty and distinct, got {names!r}")
        object.__setattr__(self, "users", MappingProxyType(users))
        object.__setattr__(self, "roles", MappingProxyType(roles))

    @classmethod
    def parse(
        cls,
        users_text: str,
        roles_text: str,
        *,
        users_source: str = "artemis-users.properties",
        roles_source: str = "artemis-roles.properties",
    ) -> UserStore:
        """Build a store from the decoded text of the two files.

        Args:
            users_text: contents of `artemis-users.properties` (`user = password`).
            roles_text: contents of `artemis-roles.properties` (`role = user1,user2`).
            users_source: name of the users file, for errors.
            roles_source: name of the roles file, for errors.

        Returns:
            The store.

        Raises:
            UserStoreError: bad properties syntax, an empty or repeated user or role name, or a
                malformed `ENC(...)` password; with the file and line, never the password.
        """
        users: dict[str, StoredPassword] = {}
        for number, user, value in _defined_once(users_text, users_source, "user"):
            try:
                users[user] = parse_stored_password(value)
            except ValueError as exc:
                raise UserStoreError(users_source, number, f"user {user!r}: {exc}") from None

        roles: dict[str, list[str]] = {}
        for _, role, value in _defined_once(roles_text, roles_source, "role"):
            for user in (name.strip() for name in value.split(",")):
                if user and role not in roles.setdefault(user, []):
                    roles[user].append(role)
        return cls(users=users, roles={user: tuple(names) for user, names in roles.items()})

    @classmethod
    def load(
        cls,
        users_path: str | os.PathLike[str],
        roles_path: str | os.PathLike[str],
        *,
        encoding: str = FILE_ENCODING,
    ) -> UserStore:
        """Read `artemis-users.properties` and `artemis-roles.properties`.

        Args:
            users_path: the users file.
            roles_path: the roles file.
            encoding: how to decode both files; ISO-8859-1 by default, as Artemis reads them. Pass
                "utf-8" for files written by hand in UTF-8 (Artemis itself would not read those
                the same way).

        Returns:
            The store.

        Raises:
            UserStoreError: a file cannot be read or decoded, or its contents are invalid (see
                `parse`).
            LookupError: `encoding` is not a known codec.
        """
        users_source, roles_source = str(users_path), str(roles_path)
        return cls.parse(
            _read_text(users_path, encoding),
            _read_text(roles_path, encoding),
            users_source=users_source,
            roles_source=roles_source,
        )

    def authenticate(self, user: str | None, password: str | None) -> Authenticated | None:
        """Check a client's credentials.

        Args:
            user: the user name the client sent, or None.
            password: the password the client sent, or None.

        Returns:
            The user and its roles when the user is in the store and the password matches; None
            when the user or the password is missing, the user is unknown or the password wrong.
            Both plain and hashed passwords are compared with `hmac.compare_digest`.
        """
        if user is None or password is None:
            return None
        stored = self.users.get(user)
        if stored is None:
            _DUMMY_PASSWORD.verify(password)
            return None
        if not stored.verify(password):
            return None
        return Authenticated(user=user, roles=self.roles.get(user, ()))


def _defined_once(text: str, source: str, kind: str) -> Iterator[tuple[int, str, str]]:
    """The entries of `parse_properties`, each key non-empty and defined once; `kind` ("user",
    "role") names the keys in the errors, which give the line of the second definition."""
    first_line: dict[str, int] = {}
    for number, key, value in parse_properties(text, source):
        if not key:
            raise UserStoreError(source, number, f"empty {kind} name")
        if key in first_line:
            raise UserStoreError(
                source, number, f"{kind} {key!r} defined again (first on line {first_line[key]})"
            )
        first_line[key] = number
        yield number, key, value


def _read_text(path: str | os.PathLike[str], encoding: str) -> str:
    """Read and decode one file, translating OSError and UnicodeDecodeError to UserStoreError."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserStoreError(source, None, f"cannot read file: {reason[:1].lower()}{reason[1:]}") from exc
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = len(_LINE_BREAK.findall(data[: exc.start].decode(encoding, "replace"))) + 1
        raise UserStoreError(source, line, f"not valid {encoding!r} text") from None
