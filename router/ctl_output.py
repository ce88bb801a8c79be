"""routerctl's output and exit codes, for every command alike.

A command builds its answer as JSON-able data, then hands it to `Output`: `--json` prints the
data as JSON (one document, or one compact line per item for a sequence), otherwise it prints
aligned tables (`Table`) or `key: value` lines (`Fields`) for people, coloured only when stdout
is a terminal and `NO_COLOR` is not set (no-color.org). Errors are `CtlError`s carrying one of the
documented `ExitCode`s; the entry point prints their one line on stderr and exits with the code.

A new command: add `--json` with `add_json_option`, raise `CtlError` for what goes wrong, and
print through `Output.emit` with a render function for people.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TextIO, TypeAlias, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "EXIT_CODES_HELP",
    "Blocks",
    "CtlError",
    "ExitCode",
    "Fields",
    "Output",
    "Renderable",
    "Style",
    "Table",
    "add_json_option",
    "exit_code_for_http",
    "finite_number",
    "integer",
    "only_error",
    "poll",
    "seconds",
    "use_color",
]


class ExitCode(enum.IntEnum):
    """routerctl's exit statuses (docs/operations.md, `routerctl --help`)."""

    OK = 0
    """Done; for `wait`, the condition holds."""
    FAILED = 1
    """Not found (an unknown router, target or cache key), a condition that does not hold, or a
    request the router refused (HTTP 400, 404, 405, 409) or could not carry out (5xx)."""
    USAGE = 2
    """A bad command line: an unknown option, a bad option value, a configuration file that does
    not load (routerctl's own checks, before anything is asked)."""
    UNREACHABLE = 3
    """The router's admin API cannot be reached (nothing listens, a timeout, not its answer)."""
    DENIED = 4
    """The admin API refused access: no or a wrong token (401), a token whose level is too low
    (403), or a Host name it does not accept (421)."""
    TIMED_OUT = 5
    """`wait`: the condition did not hold within `--timeout`; `evacuate`/`rebalance`/`shutdown
    --wait`: not done within it."""
    UNREADABLE = 6
    """`analyze`/`simulate`: every event file named is unreadable (cut short, not what its name
    says; each one is named on stderr). Some unreadable files among readable ones are set aside
    and named in summary.json: the command goes on and exits 0."""


EXIT_CODES_HELP: Final = """exit status:
  0  done (for wait: the condition holds)
  1  not found, a condition that does not hold, or a request the router refused or could not
     carry out
  2  usage: a bad option, option value or configuration file
  3  the router's admin API cannot be reached
  4  the admin API refused access (token missing or wrong: 401; level too low: 403; Host: 421)
  5  wait, or a move's --wait: timed out before the condition held or the move was done
  6  analyze, simulate: every event file is unreadable (some among readable ones are set aside,
     named in summary.json, and the command exits 0)"""
"""The epilog of `routerctl --help`; the same list as `ExitCode`."""


class CtlError(Exception):
    """What routerctl prints as one line on stderr before exiting with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def exit_code_for_http(status: int) -> ExitCode:
    """The exit status for an admin API error answer: DENIED for a refused access, else FAILED."""
    return ExitCode.DENIED if status in (401, 403, 421) else ExitCode.FAILED


def add_json_option(parser: argparse.ArgumentParser, *, again: bool = False) -> None:
    """`--json` on a command that prints data. `again`: on a subcommand of a command that has it
    already, so that it may come after the subcommand too (not given there, the command's stays)."""
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if again else False,
        help="print JSON for scripts (the admin API's documents) instead of tables",
    )


def use_color(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """Whether to colour output: only on a terminal, never with NO_COLOR set (to anything but the
    empty string, as no-color.org says) or TERM=dumb."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class Style(enum.Enum):
    """How a cell is coloured on a terminal; the value is its SGR code (ECMA-48 §8.3.117)."""

    PLAIN = ""
    GOOD = "32"  # green
    BAD = "31"  # red
    WARN = "33"  # yellow
    BOLD = "1"


_STATE_STYLES: Final = {
    "ready": Style.GOOD,
    "OK": Style.GOOD,
    "active": Style.GOOD,
    "not-ready": Style.BAD,
    "inactive": Style.BAD,
    "REFUSED_UNAVAILABLE": Style.BAD,
    "REFUSED_USE_ANOTHER": Style.WARN,
    "unknown": Style.WARN,
    "drain": Style.WARN,
    "maint": Style.WARN,
    "connected": Style.GOOD,
    "connecting": Style.WARN,
    "suspended": Style.WARN,
    "lost": Style.BAD,
    "ejected": Style.WARN,
}
"""Values that get a colour wherever they appear in a table or a field."""


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _paint(text: str, style: Style, color: bool) -> str:
    return f"\x1b[{style.value}m{text}\x1b[0m" if color and style.value and text else text


@dataclass(slots=True)
class Table:
    """Rows under upper-case headers, each column as wide as its widest cell, two spaces apart.
    None prints as `-`, booleans as yes/no, floats with one decimal."""

    headers: Sequence[str]
    rows: list[Sequence[object]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"a row of {len(self.headers)} cells expected, got {len(cells)}")
        self.rows.append(cells)

    def render(self, *, color: bool = False) -> str:
        texts = [[_text(c) for c in row] for row in self.rows]
        widths = [len(h) for h in self.headers]
        for row in texts:
            widths = [max(w, len(t)) for w, t in zip(widths, row, strict=True)]
        widths[-1] = 0  # the last column is not padded: no trailing blanks
        header = [(h.upper(), Style.BOLD) for h in self.headers]
        rows = [[(t, _STATE_STYLES.get(t, Style.PLAIN)) for t in row] for row in texts]
        return "\n".join(
            "  ".join(
                _paint(text.ljust(w), style, color) for (text, style), w in zip(cells, widths, strict=True)
            )
            for cells in [header, *rows]
        )


@dataclass(slots=True)
class Fields:
    """`name: value` lines with the values aligned (one object for people)."""

    pairs: list[tuple[str, object]] = field(default_factory=list)

    def add(self, name: str, value: object) -> None:
        self.pairs.append((name, value))

    def render(self, *, color: bool = False) -> str:
        width = max((len(name) for name, _ in self.pairs), default=0) + 1
        lines = []
        for name, value in self.pairs:
            text = _text(value)
            lines.append(
                f"{(name + ':').ljust(width)}  {_paint(text, _STATE_STYLES.get(text, Style.PLAIN), color)}"
            )
        return "\n".join(lines)


Renderable: TypeAlias = "Table | Fields | str"
"""A block of output for people."""

Blocks: TypeAlias = "Callable[[object], list[Renderable]]"
"""What a document shows people: its blocks (a feature's part of a router's, `Feature.router_blocks`)."""


class Output:
    """Where a command prints its answer: JSON, or tables for people."""

    def __init__(self, *, json_output: bool, stream: TextIO | None = None, color: bool | None = None) -> None:
        """Args:
        json_output: `--json` was given.
        stream: stdout by default.
        color: whether to colour; by default `use_color(stream)`.
        """
        self.json = json_output
        self.stream = sys.stdout if stream is None else stream
        self.color = use_color(self.stream) if color is None else color

    def emit(self, data: object, render: Callable[[object], Iterable[Renderable]]) -> None:
        """Print `data` as one compact JSON line (`--json`: every command's JSON is one value per
        line, as `emit_lines` prints a sequence), else what `render` makes of it, blocks separated
        by an empty line."""
        if self.json:
            print(json.dumps(data), file=self.stream)
            return
        self.blocks(render(data))

    def emit_lines(
        self, items: Iterable[object], render: Callable[[list[object]], Iterable[Renderable]]
    ) -> None:
        """Print a sequence: one compact JSON line per item (`--json`), else `render` of them all."""
        if self.json:
            for item in items:
                print(json.dumps(item), file=self.stream)
            return
        self.blocks(render(list(items)))

    def blocks(self, blocks: Iterable[Renderable]) -> None:
        """Print tables, fields and lines for people, an empty line between two blocks."""
        first = True
        for block in blocks:
            if not first:
                print(file=self.stream)
            first = False
            print(block if isinstance(block, str) else block.render(color=self.color), file=self.stream)


def finite_number(
    *, zero: bool, unit: str, least: float = 0.0, most: float = math.inf
) -> Callable[[str], float]:
    """An argparse type: a finite number of `unit`, >= 0 (`zero`) or > 0, and from `least` to
    `most` when given; anything else (`nan`, `inf`, `-1`) is a usage error, exit status 2."""
    rule = f"{least:g}-{most:g}" if least > 0 or most < math.inf else ">= 0" if zero else "> 0"

    def parse(text: str) -> float:
        try:
            value: float | None = float(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or not least <= value <= most
            or (value == 0 and not zero)
        ):
            raise argparse.ArgumentTypeError(f"must be a finite number of {unit} {rule}, got {text!r}")
        return value

    return parse


def seconds(*, zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, >= 0 (`zero`) or > 0 (`finite_number`)."""
    return finite_number(zero=zero, unit="seconds")


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a decimal integer from `low` to `high`; anything else is a usage error."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer {low}-{high}, got {text!r}")
        return value

    return parse


_E = TypeVar("_E", bound=BaseException)


def only_error(exc: BaseException, kinds: type[_E] | tuple[type[_E], ...]) -> _E | None:
    """`exc` when it is one of `kinds`, or the first one of a group holding nothing else (an error
    raised inside a nursery, such as a listener failing to bind, arrives as a group); None
    otherwise."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(kinds)
        if matched is not None and rest is None:
            return only_error(matched.exceptions[0], kinds)
    return None


_T = TypeVar("_T")


def poll(ask: Callable[[float], _T | None], *, timeout_s: float, interval_s: float) -> _T | None:
    """Call `ask(seconds left)` until it answers something other than None, every `interval_s`,
    for at most `timeout_s` (it is asked at least once, and once more at the end); None when it
    never did. routerctl's waits: `wait`, a move's `--wait`, `shutdown --wait`."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = ask(max(0.0, deadline - time.monotonic()))
        if answer is not None:
            return answer
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(interval_s, left))
