"""router/ctl_output.py: routerctl's tables, JSON output, colours and exit codes."""

from __future__ import annotations

import argparse
import io
import json
import re

import pytest

from router.ctl_output import (
    EXIT_CODES_HELP,
    CtlError,
    ExitCode,
    Fields,
    Output,
    Table,
    add_json_option,
    exit_code_for_http,
    poll,
    use_color,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestTable:
    def test_table_aligns_columns_to_the_widest_cell_under_upper_case_headers(self) -> None:
        table = Table(["node_id", "state", "connections"])
        table.add("node4", "ready", 12)
        table.add("node20", "not-ready", None)
        assert table.render() == (
            "NODE_ID  STATE      CONNECTIONS\nnode4    ready      12\nnode20   not-ready  -"
        )

    def test_table_shows_booleans_and_floats_for_people(self) -> None:
        table = Table(["key", "pinned", "idle_s"])
        table.add("k", True, 3.14159)
        table.add("j", False, 0.0)
        assert table.render().splitlines()[1:] == ["k    yes     3.1", "j    no      0.0"]

    def test_table_rejects_a_row_of_the_wrong_width(self) -> None:
        with pytest.raises(ValueError, match="a row of 2 cells expected, got 1"):
            Table(["a", "b"]).add("x")

    def test_table_colours_states_and_keeps_the_alignment(self) -> None:
        table = Table(["node_id", "state", "connections"])
        table.add("node4", "ready", 1)
        table.add("node20", "not-ready", 0)
        coloured = table.render(color=True)
        assert "\x1b[32mready    \x1b[0m" in coloured  # green, padded inside the colour
        assert "\x1b[31mnot-ready\x1b[0m" in coloured  # red
        assert ANSI.sub("", coloured) == table.render()


def test_fields_align_values() -> None:
    fields = Fields()
    fields.add("pid", 42)
    fields.add("client connections", "3 of 9000")
    fields.add("policy", None)
    assert (
        fields.render() == "pid:                 42\nclient connections:  3 of 9000\npolicy:              -"
    )


class TestUseColor:
    def test_use_color_only_on_a_terminal(self) -> None:
        assert use_color(_Terminal(), {}) is True
        assert use_color(io.StringIO(), {}) is False

    @pytest.mark.parametrize("environ", [{"NO_COLOR": "1"}, {"NO_COLOR": "yes"}, {"TERM": "dumb"}])
    def test_use_color_never_with_no_color_or_a_dumb_terminal(self, environ: dict[str, str]) -> None:
        assert use_color(_Terminal(), environ) is False

    def test_use_color_ignores_an_empty_no_color(self) -> None:
        """Scenario: no-color.org: NO_COLOR counts when it is set to something non-empty."""
        assert use_color(_Terminal(), {"NO_COLOR": ""}) is True


class TestOutput:
    @staticmethod
    def _render(document: object) -> list[Table | Fields | str]:
        table = Table(["name"])
        assert isinstance(document, dict)
        table.add(document["name"])
        return [table, "done"]

    def test_output_prints_blocks_for_people_with_an_empty_line_between(self) -> None:
        stream = io.StringIO()
        Output(json_output=False, stream=stream).emit({"name": "demo"}, self._render)
        assert stream.getvalue() == "NAME\ndemo\n\ndone\n"

    def test_output_prints_the_document_as_json_for_scripts(self) -> None:
        stream = io.StringIO()
        Output(json_output=True, stream=stream).emit({"name": "demo", "n": [1]}, self._render)
        assert json.loads(stream.getvalue()) == {"name": "demo", "n": [1]}

    def test_output_prints_a_sequence_as_json_lines(self) -> None:
        stream = io.StringIO()
        Output(json_output=True, stream=stream).emit_lines([{"k": 1}, {"k": 2}], lambda items: [str(items)])
        assert [json.loads(line) for line in stream.getvalue().splitlines()] == [{"k": 1}, {"k": 2}]

    def test_output_colours_on_a_terminal_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.setenv("TERM", "xterm")
        terminal, pipe = _Terminal(), io.StringIO()
        for stream in (terminal, pipe):
            Output(json_output=False, stream=stream).emit({"name": "ready"}, self._render)
        assert ANSI.search(terminal.getvalue()) is not None
        assert ANSI.search(pipe.getvalue()) is None
        monkeypatch.setenv("NO_COLOR", "1")
        assert Output(json_output=False, stream=_Terminal()).color is False


class TestExitCodes:
    def test_exit_codes_are_the_documented_ones(self) -> None:
        assert {code.name: int(code) for code in ExitCode} == {
            "OK": 0,
            "FAILED": 1,
            "USAGE": 2,
            "UNREACHABLE": 3,
            "DENIED": 4,
            "TIMED_OUT": 5,
            "UNREADABLE": 6,
        }
        documented = re.findall(r"^  (\d)  ", EXIT_CODES_HELP, flags=re.MULTILINE)
        assert documented == [str(int(code)) for code in ExitCode]

    @pytest.mark.parametrize(
        ("status", "code"),
        [
            (401, ExitCode.DENIED),
            (403, ExitCode.DENIED),
            (421, ExitCode.DENIED),
            (400, ExitCode.FAILED),
            (404, ExitCode.FAILED),
            (405, ExitCode.FAILED),
            (500, ExitCode.FAILED),
        ],
    )
    def test_exit_code_for_http(self, status: int, code: ExitCode) -> None:
        assert exit_code_for_http(status) is code

    def test_ctl_error_carries_its_code(self) -> None:
        error = CtlError("wait: timed out", ExitCode.TIMED_OUT)
        assert (error.message, error.code, str(error)) == ("wait: timed out", 5, "wait: timed out")
        assert CtlError("x").code is ExitCode.FAILED


def test_add_json_option_after_a_subcommand_keeps_the_commands_value() -> None:
    """Scenario: `cache --json list R` and `cache list R --json` both mean JSON; neither given, no JSON."""
    parser = argparse.ArgumentParser()
    add_json_option(parser)
    sub = parser.add_subparsers(dest="action")
    listing = sub.add_parser("list")
    add_json_option(listing, again=True)
    assert parser.parse_args(["--json", "list"]).json is True
    assert parser.parse_args(["list", "--json"]).json is True
    assert parser.parse_args(["list"]).json is False


def test_poll_asks_until_an_answer_or_the_timeout() -> None:
    asked: list[float] = []

    def third_time(left: float) -> str | None:
        asked.append(left)
        return "done" if len(asked) == 3 else None

    assert poll(third_time, timeout_s=5.0, interval_s=0.001) == "done"
    assert len(asked) == 3
    assert asked[0] <= 5.0
    asked.clear()
    assert poll(lambda left: asked.append(left), timeout_s=0.05, interval_s=0.01) is None
    assert len(asked) >= 2
    assert asked[-1] == 0.0  # asked once more when no time was left
