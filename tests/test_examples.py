"""The examples a coding request states, read as tests (pipeline.examples)."""

from __future__ import annotations

import pytest

from pipeline.answers import asked_tests, terms
from pipeline.examples import LIMIT, contradicted, listed_raising, restated, stated_examples
from pipeline.signatures import signatures


def read(text: str) -> list[str]:
    return [example.test for example in stated_examples(text, signatures(text))]


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        (
            'Write camel_to_snake(name: str) -> str: "userId" -> "user_id", '
            '"HTMLParser" → "html_parser" and "x" => "x".',
            [
                "assert camel_to_snake('userId') == 'user_id'",
                "assert camel_to_snake('HTMLParser') == 'html_parser'",
                "assert camel_to_snake('x') == 'x'",
            ],
        ),
        (
            "Write rle(s: str) -> list[tuple[str, int]]. For example \u201caab\u201d gives "
            '[("a", 2), ("b", 1)] and the empty string gives [].',
            ["assert rle('aab') == [('a', 2), ('b', 1)]", "assert rle('') == []"],
        ),
        (
            "Write rotate(m: list[list[int]]) -> list[list[int]]; [[1, 2]] becomes [[1], [2]].",
            ["assert rotate([[1, 2]]) == [[1], [2]]"],
        ),
        (
            'Write roman(s: str) -> int that reads a numeral such as "MCMXCIV" (1994).',
            ["assert roman('MCMXCIV') == 1994"],
        ),
        (
            "Write a function fib(n). fib(10) should return 55, and fib(0) == 0.",
            ["assert fib(10) == 55", "assert fib(0) == 0"],
        ),
        (
            "Write add(a: int, b: int) -> int; add(2, 3) returns 5 and add(-1, 1) gives 0.",
            ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"],
        ),
        (
            "Write half(x: float) -> float: 3 -> 1.5, and an empty list is an error.",
            ["assert half(3) == 1.5"],
        ),
        (
            'Write hex_to_rgb(color: str) -> tuple[int, int, int] for "#RGB" too ("#fa0" is '
            "(255, 170, 0)). Row 4 is `(1, 4, 6)`; an empty string is `(0, 0, 0)`.",
            ["assert hex_to_rgb('#fa0') == (255, 170, 0)", "assert hex_to_rgb('') == (0, 0, 0)"],
        ),
        (
            "Write pascal_row(n: int) -> list[int], from row 0 = [1], so row 4 is "
            "[1, 4, 6, 4, 1]. Row 5 is 6 numbers long",
            ["assert pascal_row(4) == [1, 4, 6, 4, 1]"],
        ),
        (
            "Write a function fib(n). `fib(10)` returns `55`; fib(1) = 1, fib(2) is 1, "
            "fib(3) should be 2 and fib(4) >= 3.",
            [
                "assert fib(10) == 55",
                "assert fib(1) == 1",
                "assert fib(2) == 1",
                "assert fib(3) == 2",
            ],
        ),
        (
            "Write a function fib(n).\n\n    >>> fib(10)\n    55\n    >>> fib(0)\n    0\n",
            ["assert fib(10) == 55", "assert fib(0) == 0"],
        ),
        (
            'Write camel_to_snake(name: str) -> str: `"userId"` -> `"user_id"`.',
            ["assert camel_to_snake('userId') == 'user_id'"],
        ),
    ],
)
def test_the_examples_a_request_states_are_read_as_tests(
    request_text: str, expected: list[str]
) -> None:
    assert read(request_text) == expected


@pytest.mark.parametrize(
    "request_text",
    [
        # the input or the result of another kind than the signature declares
        "Write count(s: str) -> int: [1, 2] -> 2.",
        'Write count(s: str) -> int: "ab" -> "2".',
        'Write pairs(s: str) -> list[tuple[str, int]]: "a" gives [["a", 1]].',
        # a bare input in parentheses needs both annotations
        'Write a function parse(s) -> int: "1h" (3600).',
        # a bare input needs exactly one declared function of one parameter
        'Write f(s: str) -> str and g(s: str) -> str: "a" -> "b".',
        'Write pad(s: str, n: int) -> str: "a" -> "a ".',
        # a call of a function the request does not name as one
        'Write f(s: str) -> int. Note that len("abc") == 3.',
        # a number inside a word is no number, prose in parentheses no result
        'Write secs(s: str) -> int: "1h30m" (5400 seconds), 2h gives 7200.',
        # arguments that are not literals
        "Write a function fib(n). fib(n - 1) + fib(n - 2) gives fib(n).",
        # "=" only after a call, "is" after a bare input only where the result ends a
        # clause and both sides are annotated; a doctest shows no literal, or another call
        'Write f(s: str) -> int: "abc" is 3 characters long, "abc" = 3.',
        'Write a function f(s): "ab" is 2.',
        "Write a function fib(n).\n>>> fib(10)\nfifty-five\n>>> fib(2) + 1\n2",
        # a term of a sum or a step of a chain is neither input nor result
        "Write root(n: int) -> int that sums digits until one is left (38 -> 3 + 8 = 11 -> 2).",
        "Write root(n: int) -> int: 38 \u2192 11 \u2192 2.",
        "Write a function fib(n). fib(3) == 1 + 1.",
        "Write double(n: int) -> int: 2 * 19 -> 76.",
    ],
)
def test_what_is_not_plainly_an_example_is_not_read(request_text: str) -> None:
    assert read(request_text) == []


def test_the_first_of_each_call_is_kept_and_at_most_limit_are_read() -> None:
    text = "Write a function sq(n). sq(2) gives 4, sq(2) gives 5, " + ", ".join(
        f"sq({n}) gives {n * n}" for n in range(3, 20)
    )
    found = stated_examples(text)
    assert len(found) == LIMIT
    assert found[0].test == "assert sq(2) == 4"
    assert found[0].stated == "sq(2) gives 4"
    assert stated_examples("A function f(n): `f(1)` gives `2`.")[0].stated == "f(1) gives 2"
    assert stated_examples("A function f(n):\n>>> f(1)\n2")[0].stated == ">>> f(1) shows 2"


SNAKE = 'Write camel_to_snake(name: str) -> str: "parseHTTPResponse" -> "parse_http_response".'
EXAMPLES = stated_examples(SNAKE, signatures(SNAKE))


@pytest.mark.parametrize(
    ("unit", "contradicts"),
    [
        ("assert camel_to_snake('parseHTTPResponse') == 'parse_h_t_t_p_response'", True),
        ("assert 'parse_h_t_t_p_response' == camel_to_snake('parseHTTPResponse')", True),
        (
            "self.assertEqual(camel_to_snake('parseHTTPResponse'), 'parseHTTPResponse')",
            True,
        ),
        ("assert camel_to_snake('parseHTTPResponse') == 'parse_http_response'", False),
        ("assert camel_to_snake('userId') == 'userid'", False),  # another call
        ("assert camel_to_snake(name) == 'x'", False),  # not a literal argument
        ("assert camel_to_snake('parseHTTPResponse') != 'x'", False),
        ("assert camel_to_snake('parseHTTPResponse'", False),  # does not parse
        ("assert camel_to_snake('parseHTTPResponse') == " + "a." * 200_000 + "b", False),
    ],
)
def test_a_test_expecting_another_result_for_an_example_contradicts_it(
    unit: str, contradicts: bool
) -> None:
    assert (contradicted(unit, EXAMPLES) is not None) == contradicts


def test_results_compare_as_literals_numbers_by_value_sequences_by_kind() -> None:
    text = "Write a function avg(xs). avg([1, 2]) gives 1.5 and avg([2]) gives 2."
    found = stated_examples(text)
    assert contradicted("assert avg([2]) == 2.0", found) is None  # 2 == 2.0
    assert contradicted("assert avg([1, 2]) == 1", found) == found[0]
    pairs = stated_examples('Write a function p(s). p("a") gives [("a", 1)].')
    assert contradicted("assert p('a') == [('a', 1)]", pairs) is None
    assert contradicted("assert p('a') == [['a', 1]]", pairs) == pairs[0]  # lists for tuples


GROUPED = (
    "Write parse_grouped(text: str) -> int that reads 1,000-style numbers. It must raise "
    'ValueError for any other text, such as "1,00", "1000,000", ",100" or "". It '
    'raises TypeError for input like "x".'
)


def test_inputs_listed_as_raising_the_error_a_request_asks_for_are_read_as_raises() -> None:
    """The literals listed right after "such as" (or "like", "e.g.", "for example") in
    the sentence asking for an error are examples of the raise, as tests that fail unless
    the call raises it; a test expecting any value of such a call contradicts it."""
    found = stated_examples(GROUPED, signatures(GROUPED))
    assert [(e.stated, e.raises) for e in found] == [
        ('ValueError for "1,00"', "ValueError"),
        ('ValueError for "1000,000"', "ValueError"),
        ('ValueError for ",100"', "ValueError"),
        ('ValueError for ""', "ValueError"),
        ('TypeError for "x"', "TypeError"),
    ]
    assert found[2].test == (
        "try:\n    parse_grouped(',100')\nexcept ValueError:\n    pass\nelse:\n"
        "    raise AssertionError(\"parse_grouped(',100') did not raise ValueError\")"
    )
    assert contradicted("assert parse_grouped(',100') == 100", found) == found[2]
    assert contradicted("assert parse_grouped('1,000') == 1000", found) is None
    assert restated("assert parse_grouped(',100') == 100", found) is None


@pytest.mark.parametrize(
    "request_text",
    [
        # a description listed, not an input
        'Write h(color: str) -> int. It must raise ValueError for input such as a missing "#".',
        # no error asked for in the sentence, or the list in another sentence
        'Write h(color: str) -> int that reads colours such as "red" or "blue".',
        'Write h(color: str) -> int. It must raise ValueError. Colours such as "red" are read.',
        # the parameter not annotated, more than one parameter, a literal not fitting it
        'Write a function h(color). It must raise ValueError for input such as "x".',
        'Write h(color: str, n: int) -> int. It must raise ValueError for input such as "x".',
        "Write h(color: str) -> int. It must raise ValueError for input such as 5.",
    ],
)
def test_what_is_not_plainly_an_input_that_raises_is_not_read(request_text: str) -> None:
    assert stated_examples(request_text, signatures(request_text)) == ()


VERSIONS = (
    "Write a Python function compare_versions(a: str, b: str) -> int that compares two "
    "version strings. Raise ValueError if either string is empty or has a component that "
    "is not made only of digits (for example '1..2', '1.a' or '-1')."
)


def test_a_sentence_starting_with_raise_lists_inputs_that_raise() -> None:
    """ "Raise ValueError ... (such as ...)" at the start of a sentence is read as "It must
    raise ..." is."""
    text = "Write parse(query: str) -> dict. Raise ValueError if a key is empty (such as '=5')."
    found = stated_examples(text, signatures(text))
    assert [(e.call, e.raises) for e in found] == [("parse('=5')", "ValueError")]


def test_inputs_listed_as_raising_for_a_function_of_several_parameters() -> None:
    """Where the function takes several parameters, a listed input is no call but raises
    wherever it is passed: at each parameter it fits where the sentence says "either"
    (or "both", "each", "neither"), at the only one it fits otherwise; a test expecting a
    value of a call passing it there contradicts the request and is left out."""
    found = listed_raising(VERSIONS, signatures(VERSIONS))
    assert [(r.value, r.positions, r.stated) for r in found] == [
        ("1..2", (0, 1), "ValueError for '1..2'"),
        ("1.a", (0, 1), "ValueError for '1.a'"),
        ("-1", (0, 1), "ValueError for '-1'"),
    ]
    assert stated_examples(VERSIONS, signatures(VERSIONS)) == ()  # no call to run
    assert contradicted("assert compare_versions('1..2', '1.2') == 0", (), found) == found[0]
    assert contradicted("assert compare_versions('1.0', '1.a') == -1", (), found) == found[1]
    assert contradicted("assert compare_versions('1.2', '1.10') == -1", (), found) is None
    raise_test = "try:\n    compare_versions('1..2', '1')\nexcept ValueError:\n    pass"
    assert contradicted(raise_test, (), found) is None
    asked = terms({"task": VERSIONS})
    units = ["assert compare_versions('-1', '2') == -1", "assert compare_versions('2', '10') == -1"]
    assert asked_tests(units, asked) == units[1:]

    one = "Write pad(text: str, width: int) -> str. Raise ValueError for a bad width, such as -1."
    (only,) = listed_raising(one, signatures(one))
    assert (only.value, only.positions) == (-1, (1,))
    assert contradicted("assert pad('-1', 3) == '-1 '", (), [only]) is None  # text may be '-1'
    assert contradicted("assert pad('ab', -1) == 'ab'", (), [only]) == only


@pytest.mark.parametrize(
    "request_text",
    [
        # both parameters fit and the sentence does not say the input may be either
        "Write f(a: int, b: int) -> int. Raise ValueError when b is negative, such as -1.",
        # a parameter not annotated
        "Write f(a: str, b) -> int. Raise ValueError if either is empty, such as ''.",
        # one parameter: a call, read by stated_examples
        "Write f(a: str) -> int. Raise ValueError for input such as 'x'.",
    ],
)
def test_what_is_not_plainly_an_input_raising_at_some_parameter_is_not_read(
    request_text: str,
) -> None:
    assert listed_raising(request_text, signatures(request_text)) == ()
