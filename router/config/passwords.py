"""Pool passwords: plain text, masked with Artemis's default codec, or read from the environment
or a file.

A `<password>` is one of:

- plain text: `<password>s3cret</password>`;
- masked: `<password>ENC(…)</password>`, the hex string Artemis's `DefaultSensitiveStringCodec`
  (two-way, Blowfish) produces, e.g. with `artemis mask s3cret`;
- from an environment variable: `<password env="ROUTER_POOL_PASSWORD"/>`;
- from a file: `<password file="secrets/pool-password"/>` (relative to the configuration file;
  one trailing line ending is dropped).

A value read from the environment or a file may itself be `ENC(…)`. The codec decrypts with the
key "clusterpassword", or with the environment variable `ARTEMIS_DEFAULT_SENSITIVE_STRING_CODEC_KEY`
when it is set, as Artemis does. `decode_masked` and `mask` are pure; `resolve_password` reads
the environment and the file it is given. Errors never contain a password or a masked value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cryptography.hazmat.decrepit.ciphers.algorithms import Blowfish
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, modes

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CODEC_KEY_ENV",
    "DEFAULT_CODEC_KEY",
    "MAX_PASSWORD_FILE_BYTES",
    "codec_key",
    "decode_masked",
    "is_masked",
    "mask",
    "resolve_password",
]

DEFAULT_CODEC_KEY: Final = b"clusterpassword"
"""The Blowfish key of `DefaultSensitiveStringCodec` when none is configured
(`"clusterpassword".getBytes()`)."""

CODEC_KEY_ENV: Final = "ARTEMIS_DEFAULT_SENSITIVE_STRING_CODEC_KEY"
"""The environment variable Artemis reads the codec key from (the upper-cased, `_`-separated
name of the system property `artemis.default.sensitive.string.codec.key`)."""

_BLOCK_BYTES: Final = 8
"""Blowfish's block size: Java's `Cipher.getInstance("Blowfish")` is Blowfish/ECB/PKCS5Padding."""

MAX_PASSWORD_FILE_BYTES: Final = 64 * 1024
"""Most bytes read from a `<password file=…>`: a password (or an `ENC(...)` value) is far shorter,
and reading `/dev/zero` without a bound would grow memory until the process dies."""

_HEX: Final = re.compile(r"[+-]?[0-9a-fA-F]+")
"""What `new BigInteger(text, 16)` accepts (ASCII digits only: Java would take other Unicode
digits too, which no encoder ever writes)."""


def is_masked(value: str) -> bool:
    """Whether a value is masked: wrapped in `ENC(` … `)` (Artemis's `PasswordMaskingUtil`)."""
    return value.startswith("ENC(") and value.endswith(")")


def _ciphertext(hex_text: str) -> bytes:
    """Undo `new BigInteger(ciphertext).toString(16)`.

    Java prints the ciphertext as a signed number: a leading byte >= 0x80 gives a negative
    number ("-…"), and leading 0x00 bytes (or 0xFF bytes of a negative one) vanish. Artemis's
    decoder takes `BigInteger.toByteArray()` and pads it with zero bytes to a multiple of 8;
    that restores positive values, but a negative one whose leading 0xFF byte vanished (about 1
    in 512 encodings) gets zeros where 0xFF belongs, and Artemis cannot decode it. Here the
    number is sign-extended instead, which restores every value Artemis's encoder produces.
    """
    number = int(hex_text, 16)
    java_length = (number if number >= 0 else ~number).bit_length() // 8 + 1  # toByteArray()
    length = -(-java_length // _BLOCK_BYTES) * _BLOCK_BYTES
    return number.to_bytes(length, "big", signed=True)


def _cipher(key: bytes) -> Cipher[modes.ECB]:
    try:
        return Cipher(Blowfish(key), modes.ECB())
    except ValueError:
        raise ValueError(f"the codec key must be 4 to 56 bytes, got {len(key)}") from None


def decode_masked(masked: str, *, key: bytes = DEFAULT_CODEC_KEY) -> str:
    """Decrypt a value masked by Artemis's `DefaultSensitiveStringCodec` (two-way algorithm).

    Args:
        masked: the value inside `ENC(…)`: the ciphertext as Java's `BigInteger.toString(16)`.
        key: the Blowfish key.

    Returns:
        The password.

    Raises:
        ValueError: not a hex number, a ciphertext that does not decrypt with the key (wrong key
            or not a masked value), or a password that is not UTF-8. The message never holds the
            value.
    """
    if not _HEX.fullmatch(masked):
        raise ValueError("the masked password is not a hexadecimal number")
    decryptor = _cipher(key).decryptor()
    plain = decryptor.update(_ciphertext(masked)) + decryptor.finalize()
    unpadder = padding.PKCS7(_BLOCK_BYTES * 8).unpadder()
    try:
        unpadded = unpadder.update(plain) + unpadder.finalize()
    except ValueError:
        raise ValueError(
            "the masked password does not decrypt with the codec key (a different key, or not "
            "produced by Artemis's default codec)"
        ) from None
    try:
        return unpadded.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            "the masked password decrypts to bytes that are not UTF-8 (a different key?)"
        ) from None


def mask(password: str, *, key: bytes = DEFAULT_CODEC_KEY) -> str:
    """Mask a password as Artemis's `DefaultSensitiveStringCodec.encode` does (without `ENC()`).

    Args:
        password: the password (encoded as UTF-8).
        key: the Blowfish key.

    Returns:
        The ciphertext as `new BigInteger(ciphertext).toString(16)`.
    """
    padder = padding.PKCS7(_BLOCK_BYTES * 8).padder()
    encryptor = _cipher(key).encryptor()
    data = padder.update(password.encode("utf-8")) + padder.finalize()
    number = int.from_bytes(encryptor.update(data) + encryptor.finalize(), "big", signed=True)
    return format(number, "x") if number >= 0 else "-" + format(-number, "x")


def codec_key(environ: Mapping[str, str]) -> bytes:
    """The codec key: `ARTEMIS_DEFAULT_SENSITIVE_STRING_CODEC_KEY` when set and not blank (its
    UTF-8 bytes, as Java's `getBytes()`), else "clusterpassword"."""
    key = environ.get(CODEC_KEY_ENV, "")
    return key.encode("utf-8") if key.strip() else DEFAULT_CODEC_KEY


def resolve_password(
    text: str,
    *,
    env: str | None = None,
    file: str | None = None,
    base_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The password a `<password>` element stands for.

    Args:
        text: the element's text, stripped ("" when it has none).
        env: its `env` attribute: the name of an environment variable holding the password.
        file: its `file` attribute: a file holding the password (one trailing line ending is
            dropped); relative paths are relative to `base_dir`.
        base_dir: the configuration file's directory (the working directory when None).
        environ: the environment (`os.environ` when None).

    Returns:
        The plain password; an `ENC(…)` value, wherever it came from, is decoded.

    Raises:
        ValueError: more than one source, an unset variable, an unreadable or non-UTF-8 file, or
            a masked value that does not decode. The message names the variable or file, never
            the password.
    """
    environ = os.environ if environ is None else environ
    given = [what for what, value in (("text", text), ("env=", env), ("file=", file)) if value]
    if len(given) > 1:
        raise ValueError(f"give the password one way only, got {' and '.join(given)}")
    where = ""
    value = text
    if env:
        if env not in environ:
            raise ValueError(f"environment variable {env!r} is not set")
        value, where = environ[env], f"environment variable {env!r}: "
    elif file:
        path = Path(file)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            with path.open("rb") as stream:  # a password is short: a file that is not (/dev/zero) is an error
                raw = stream.read(MAX_PASSWORD_FILE_BYTES + 1)
            if len(raw) > MAX_PASSWORD_FILE_BYTES:
                raise ValueError(f"password file {str(path)!r} is over {MAX_PASSWORD_FILE_BYTES} bytes")
            value = raw.decode("utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read password file {str(path)!r}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValueError(f"password file {str(path)!r} is not UTF-8") from None
        value = value.removesuffix("\n").removesuffix("\r")
        where = f"password file {str(path)!r}: "
    if not is_masked(value):
        return value
    try:
        return decode_masked(value[4:-1], key=codec_key(environ))
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from None
