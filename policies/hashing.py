"""The hash Artemis's CONSISTENT_HASH and CONSISTENT_HASH_MODULO use, bit for bit.

Artemis (`ConsistentHashPolicy.getHash`) runs a 32-bit FNV-1a variant over the UTF-16 code units of
a Java String, in Java `int` arithmetic, so the result is a signed 32-bit integer. We reproduce it
over the UTF-16 code units of a Python `str` (a character outside the BMP is two code units, a
surrogate pair, exactly as in Java).
"""

from __future__ import annotations

from typing import Final

__all__ = ["artemis_hash"]

_FNV_OFFSET: Final = 0x811C9DC5  # FNV-1 32-bit offset basis, as in Artemis
_FNV_PRIME: Final = 0x01000193  # FNV-1 32-bit prime, as in Artemis
_MASK32: Final = 0xFFFFFFFF


def artemis_hash(text: str) -> int:
    """Artemis's string hash: `h = (h ^ unit) * prime` over UTF-16 code units, as a signed int32.

    Args:
        text: any string.

    Returns:
        The hash in [-2**31, 2**31).
    """
    h = _FNV_OFFSET
    data = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        h = ((h ^ (data[i] | (data[i + 1] << 8))) * _FNV_PRIME) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h
