"""The values a coding request quotes, and whether an answer's tests use them."""

from __future__ import annotations

from pipeline.quoted import LIMIT, Quoted, quoted_values, untested

IPV4 = (
    "Write a Python function is_valid_ipv4(s: str) -> bool that checks whether a string is "
    "a dotted-decimal IPv4 address: exactly four parts separated by dots, each made of "
    'digits only, between 0 and 255, and without leading zeros ("0" itself is fine, "01" '
    "is not)."
)


def test_quoted_values_keep_the_words_of_their_sentence_around_them() -> None:
    found = quoted_values(IPV4)
    assert [q.value for q in found] == ["0", "01"]
    assert found[1].said == (
        '...between 0 and 255, and without leading zeros ("0" itself is fine, "01" is not)'
    )
    two = quoted_values('Split on commas. Then "a,b" gives two parts. Nothing else.')
    assert two == (Quoted("a,b", 'Then "a,b" gives two parts'),)


def test_quoted_values_read_typographic_quotes_once_each_and_at_most_the_limit() -> None:
    assert [q.value for q in quoted_values("\u201cabc\u201d or \u201cabc\u201d")] == ["abc"]
    many = " ".join(f'"v{i}"' for i in range(LIMIT + 3))
    assert [q.value for q in quoted_values(many)] == [f"v{i}" for i in range(LIMIT)]
    assert quoted_values("it's 'single' quotes and \"   \" blanks") == ()
    # an empty string quoted is no value, and the words between two of them are none
    assert [q.value for q in quoted_values('"ab" gives "Ab", and "" gives "".')] == ["ab", "Ab"]


def test_a_value_is_used_only_inside_a_test_string_literal() -> None:
    quoted = quoted_values(IPV4)
    tests = ["assert is_valid_ipv4('0.0.0.0') is True", "assert not is_valid_ipv4('1.2.3')"]
    assert [q.value for q in untested(quoted, tests)] == ["01"]
    assert untested(quoted, [*tests, "assert is_valid_ipv4('01.2.3.4') is False"]) == []
    assert untested(quoted, [*tests, "assert not is_valid_ipv4(f'{1}.01.3.4')"]) == []
    # A comment, a name or a test that does not parse uses nothing.
    assert [q.value for q in untested(quoted, ["assert f(1)  # '01' is invalid"])] == ["0", "01"]
    assert [q.value for q in untested(quoted, ["assert f('01'"])] == ["0", "01"]
    assert untested((), ["assert f(1)"]) == []


def test_a_test_nested_too_deep_to_parse_uses_nothing() -> None:
    quoted = quoted_values('Reject "01".')
    deep = "assert f('01', " + "a." * 200_000 + "b)"  # RecursionError building its tree
    assert [q.value for q in untested(quoted, [deep])] == ["01"]
