"""The bracket and string scanning that reads calls, literals and signatures out of a
request's text."""

from __future__ import annotations

from pipeline.brackets import closing, string_end
from pipeline.examples import stated_examples
from pipeline.signatures import Signature, signatures


def test_closing_skips_brackets_inside_string_literals() -> None:
    text = 'f("(", [")]"]) and more'
    assert closing(text, 1) == text.index(") and")
    assert closing(text, text.index("[")) == text.index("]) and")


def test_closing_gives_none_past_its_span_or_an_unended_string() -> None:
    text = "f(" + "x, " * 50 + "y)"
    assert closing(text, 1) == len(text) - 1
    assert closing(text, 1, span=20) is None
    assert closing("f('it)\n')", 1) is None


def test_string_end_honours_escapes_and_ends_on_its_line() -> None:
    assert string_end(r"'a\'b' rest", 0) == 6
    assert string_end("'abc\n'", 0) is None
    assert string_end("'abcdef'", 0, span=4) is None


def test_a_signature_with_a_bracket_in_a_default_string_is_read_whole() -> None:
    request = 'Write strip_brackets(s: str, chars: str = ")]") -> str that removes them.'
    assert signatures(request) == (
        Signature("strip_brackets", (("s", "str"), ("chars", "str")), "str"),
    )


def test_an_example_whose_string_holds_a_bracket_is_read() -> None:
    request = 'Write is_balanced(s: str) -> bool: is_balanced("(]") returns False.'
    found = stated_examples(request, signatures(request))
    assert [e.test for e in found] == ["assert is_balanced('(]') == False"]
