"""Key filters and local-target filters: regular expressions matched in linear time (RE2).

Both filters are matched against values a client chooses (a client id, a user name, an SNI host),
so a backtracking engine would let one crafted value freeze the router: `(a+)+$` against
thirty `a`s and a `b` takes Python's `re` (and Java's) seconds, during which no other connection
is served. RE2 (PyPI `google-re2`) guarantees time linear in the value's length for every pattern
it accepts. It accepts Java's and Python's everyday syntax (classes, anchors, groups, `{n,m}`,
`(?i)`, non-greedy quantifiers) and refuses the constructs that need backtracking:
backreferences (`\\1`), look-ahead and look-behind (`(?=`, `(?!`, `(?<=`, `(?<!`), possessive
quantifiers (`a++`) and atomic groups (`(?>`); also Java's `\\p{Lower}`-style POSIX names (use
`[[:lower:]]`) and `\\Z` (use `\\z` or `$`). A refused pattern is a configuration error at load and
a 400 from the admin API, naming the construct (docs/configuration.md#key-filters).

Pure: no I/O, no state beyond the compiled program.
"""

from __future__ import annotations

import re
from typing import Final, Protocol

import re2

__all__ = ["KeyFilter", "compile_filter"]

_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False  # the error comes back in our message; RE2 would also print it to stderr


_UNGREEDY_FLAG: Final = re.compile(r"\(\?[a-zA-Z-]*U[a-zA-Z-]*[:)]")
"""An inline flag group with U: `(?U)`, `(?iU:...)`. Java reads U as UNICODE_CHARACTER_CLASS, RE2
as ungreedy: the same filter would silently find other keys, so it is refused."""


class _Match(Protocol):
    def group(self, index: int) -> str: ...


class _Program(Protocol):
    """What we use of a compiled `re2` expression (the package has no type hints)."""

    def search(self, text: str) -> _Match | None: ...
    def fullmatch(self, text: str) -> _Match | None: ...


class KeyFilter:
    """A compiled filter. `find` is Java's `Matcher.find()` + `group()` (the leftmost match, as
    Artemis takes the key), `matches_whole` is `Matcher.matches()` (the local-target filter)."""

    __slots__ = ("_regexp", "pattern")

    def __init__(self, pattern: str, regexp: _Program) -> None:
        self.pattern = pattern
        self._regexp = regexp

    def find(self, text: str) -> str | None:
        """The text of the leftmost match in `text` (capture groups ignored), None if none (also
        for text RE2 cannot take: lone surrogates, which only UTF-8 it reads cannot hold)."""
        try:
            found = self._regexp.search(text)
        except UnicodeEncodeError:
            return None
        return None if found is None else found.group(0)

    def matches_whole(self, text: str) -> bool:
        """Whether the whole of `text` matches (False for text with lone surrogates)."""
        try:
            return self._regexp.fullmatch(text) is not None
        except UnicodeEncodeError:
            return False

    def __repr__(self) -> str:
        return f"KeyFilter({self.pattern!r})"


def compile_filter(pattern: str | None, what: str) -> KeyFilter | None:
    """Compile a key filter or local-target filter; blank means disabled (SPEC A7).

    Args:
        pattern: the expression as configured.
        what: names the filter in the error (`key-filter`).

    Raises:
        ValueError: RE2 cannot compile the expression (a syntax error, or a construct that needs
            backtracking); the message names the filter, the pattern and RE2's reason.
    """
    if pattern is None or not pattern.strip():
        return None
    if _UNGREEDY_FLAG.search(pattern):
        raise ValueError(
            f"{what} {pattern!r} is not a valid regular expression: the inline flag U means "
            "ungreedy in RE2 (filters are matched by RE2) but Unicode classes in Java; remove it "
            "(RE2's \\w, \\d and \\s are ASCII, as Java's are without it)"
        )
    try:
        regexp = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"{what} {pattern!r} is not a valid regular expression: {reason} (filters are matched "
            "by RE2, in linear time: no backreferences, look-around, possessive quantifiers or "
            "atomic groups)"
        ) from None
    return KeyFilter(pattern, regexp)
