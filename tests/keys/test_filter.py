"""keys/filter.py: key filters and local-target filters, matched by RE2 in linear time (SPEC A7)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys.filter import KeyFilter, compile_filter


class TestCompileFilter:
    def test_compile_filter_compiles(self) -> None:
        compiled = compile_filter("FOO-[0-9]", "key-filter")
        assert isinstance(compiled, KeyFilter)
        assert compiled.pattern == "FOO-[0-9]"

    @pytest.mark.parametrize("blank", [None, "", " ", "\t\n "])
    def test_compile_filter_blank_is_disabled(self, blank: str | None) -> None:
        assert compile_filter(blank, "key-filter") is None

    def test_compile_filter_keeps_surrounding_spaces_of_a_real_pattern(self) -> None:
        """Scenario: only an all-blank pattern disables; a pattern is not stripped."""
        compiled = compile_filter(" a", "key-filter")
        assert compiled is not None
        assert compiled.pattern == " a"
        assert compiled.find("x a") == " a"

    @pytest.mark.parametrize(
        ("pattern", "what"),
        [("(", "key-filter"), ("[a-", "local-target-filter"), ("*x", "key-filter"), ("a{2,1}", "key-filter")],
    )
    def test_compile_filter_invalid_raises_value_error_naming_element(self, pattern: str, what: str) -> None:
        with pytest.raises(
            ValueError, match=f"^{what} {re.escape(repr(pattern))} is not a valid regular"
        ) as info:
            compile_filter(pattern, what)
        assert info.value.__cause__ is None  # `from None`: the message carries RE2's text

    @pytest.mark.parametrize(
        ("pattern", "construct"),
        [
            (r"(a)\1", r"invalid escape sequence: \1"),
            ("(?=a)", "invalid perl operator: (?="),
            ("(?<!a)b", "invalid perl operator: (?<"),
            ("a++", "bad repetition operator: ++"),
            ("(?>a)", "invalid perl operator: (?>"),
            (r"\p{Alpha}+", r"invalid character class range: \p{Alpha}"),
            (r"a\Z", r"invalid escape sequence: \Z"),
        ],
    )
    def test_compile_filter_refuses_what_needs_backtracking_naming_the_construct(
        self, pattern: str, construct: str
    ) -> None:
        """Scenario: Java constructs RE2 cannot run in linear time are an error that names them (and
        says which family is unsupported), not a filter that silently differs from Java's."""
        with pytest.raises(ValueError, match="is not a valid regular expression") as info:
            compile_filter(pattern, "key-filter")
        assert construct in str(info.value)
        assert "no backreferences, look-around, possessive quantifiers or atomic groups" in str(info.value)

    @pytest.mark.parametrize("pattern", ["(?U)[a-z]+", "(?iU:x)", "a(?U)b"])
    def test_compile_filter_refuses_the_u_flag_whose_meaning_differs(self, pattern: str) -> None:
        """Scenario (review): Java reads (?U) as Unicode classes, RE2 as ungreedy: `(?U)[a-z]+`
        would find 'h' in 'hello-1', silently collapsing every key to one character."""
        with pytest.raises(ValueError, match="the inline flag U means ungreedy in RE2"):
            compile_filter(pattern, "key-filter")

    def test_compile_filter_errors_are_not_printed(self, capfd: pytest.CaptureFixture[str]) -> None:
        """Scenario: RE2 logs parse errors to stderr by default; the router's error is the one line."""
        with pytest.raises(ValueError, match="missing"):
            compile_filter("(", "key-filter")
        assert capfd.readouterr().err == ""


class TestMatching:
    def test_find_is_the_leftmost_match_without_groups(self) -> None:
        compiled = compile_filter(r"FOO-(\d+)", "key-filter")
        assert compiled is not None
        assert compiled.find("x FOO-12 FOO-3") == "FOO-12"
        assert compiled.find("nothing") is None

    def test_find_counts_characters_not_bytes(self) -> None:
        compiled = compile_filter("^.{3}", "key-filter")
        assert compiled is not None
        assert compiled.find("héllo wörld") == "hél"

    def test_matches_whole(self) -> None:
        compiled = compile_filter("node[0-9]+", "local-target-filter")
        assert compiled is not None
        assert compiled.matches_whole("node12")
        assert not compiled.matches_whole("node12x")
        assert not compiled.matches_whole("xnode12")

    def test_text_re2_cannot_take_does_not_match(self) -> None:
        """Scenario (review): a lone surrogate (a user store keeps `\\uD800` escapes as they are)
        made RE2's UTF-8 encoding raise inside the decision; it is no match instead."""
        compiled = compile_filter("admins", "key-filter")
        assert compiled is not None
        assert compiled.find("admins\ud800") is None
        assert not compiled.matches_whole("\ud800")

    def test_catastrophic_pattern_is_linear(self) -> None:
        """Scenario (hardening finding 5): `(a+)+$` with a crafted value froze a backtracking engine
        for seconds; RE2 answers 100 such 64 KiB values in a fraction of that (a bound with a wide
        margin, not a timing: Python's `re` needs hours for the same input)."""
        compiled = compile_filter("(a+)+$", "key-filter")
        assert compiled is not None
        value = "a" * 65536 + "!"
        start = time.process_time()
        for _ in range(100):
            assert compiled.find(value) is None
        assert time.process_time() - start < 2.0

    @given(st.text(max_size=40), st.text(alphabet="ab.-_0", min_size=1, max_size=4))
    def test_literal_filters_agree_with_python(self, value: str, needle: str) -> None:
        """Scenario: for the syntax both engines share, RE2 finds what Python's `re` finds."""
        compiled = compile_filter(re.escape(needle), "key-filter")
        assert compiled is not None
        found = re.search(re.escape(needle), value)
        assert compiled.find(value) == (None if found is None else found.group(0))
