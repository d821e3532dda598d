"""The artifact in an answer: code apart from tests and prose, text without preamble, notes."""

from __future__ import annotations

import pytest

from pipeline.answers import (
    TESTS_MARKER,
    Raised,
    Terms,
    asked_tests,
    carry_tests,
    code_with_tests,
    comment_commentary,
    extract,
    extract_code,
    extract_text,
    foreign_calls,
    join,
    meta_commentary,
    must_raise,
    normalized,
    probe_calls,
    raise_compared_as_value,
    raised_error,
    split,
    split_tests,
    stray_effect,
    terms,
    unasked_message,
    unasked_raise,
    without_unfinished_test,
)
from pipeline.sandbox import run_tests

FIB = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"
FIB_TESTS = "assert fib(0) == 0\nassert fib(10) == 55"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("Here:\n```python\nprint(1)\n```\nDone.", "print(1)", id="python-fence"),
        pytest.param("```\nx = 1\n```", "x = 1", id="bare-fence"),
        pytest.param("```py title\nx = 1\n```", "x = 1", id="fence-with-info"),
        pytest.param("```python\na = 1\n```\nthen\n```python\nb = 2\n```", "a = 1", id="first"),
        pytest.param(
            "Output:\n```\n[1, 2]\n```\n```python\nx = 1\n```", "x = 1", id="tagged-beats-bare"
        ),
        pytest.param("```python\nx = 1\ny = 2", "x = 1\ny = 2", id="unclosed-fence-cut-off"),
        pytest.param("```python\n\n    x = 1\n\n```", "    x = 1", id="keeps-indentation"),
        pytest.param("  just code, no fence  \n", "just code, no fence", id="no-fence"),
    ],
)
def test_extract_code(text: str, expected: str) -> None:
    """The first Python block is the code, also when the answer was cut off inside it."""
    assert extract_code(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("A dog runs.", "A dog runs.", id="plain"),
        pytest.param(
            "Here is the improved sentence:\nA dog runs.", "A dog runs.", id="announcement"
        ),
        pytest.param("Sure!\nHere's the rewritten review:\nGreat food.", "Great food.", id="two"),
        pytest.param("Improved sentence: A dog runs.", "A dog runs.", id="label"),
        pytest.param("**Revised review:** Great food.", "Great food.", id="bold-label"),
        pytest.param('"A dog runs."', "A dog runs.", id="quotes"),
        pytest.param("```\nA dog runs.\n```", "A dog runs.", id="fenced"),
        pytest.param('He said "hi" and "bye"', 'He said "hi" and "bye"', id="inner-quotes-kept"),
        pytest.param(
            "Here's what happened: the soup was cold.",
            "Here's what happened: the soup was cold.",
            id="prose-kept",
        ),
        pytest.param(
            "Certainly the best pizza.\nGo.", "Certainly the best pizza.\nGo.", id="not-sure"
        ),
        pytest.param("NASA\nN-ational A-eronautics", "NASA\nN-ational A-eronautics", id="acronym"),
    ],
)
def test_extract_text(text: str, expected: str) -> None:
    """Prose loses its preamble, label, fence and wrapping quotes, and nothing else."""
    assert extract_text(text) == expected


@pytest.mark.parametrize(
    ("answer", "code", "tests"),
    [
        pytest.param(
            f"Here you go.\n```python\n{FIB}\n```\nTests:\n```python\n{FIB_TESTS}\n```\nBye.",
            FIB,
            FIB_TESTS,
            id="two-blocks",
        ),
        pytest.param(f"```python\n{FIB}\n\n{FIB_TESTS}\n```", FIB, FIB_TESTS, id="one-block"),
        pytest.param(
            f"```python\n{FIB_TESTS}\n```\n```python\n{FIB}\n```", FIB, FIB_TESTS, id="tests-first"
        ),
        pytest.param(
            f"```python\n{FIB}\n```\n```python\nfrom solution import fib\nimport math\n\n"
            f"{FIB_TESTS}\n```",
            FIB,
            f"import math\n\n{FIB_TESTS}",
            id="import-of-the-code-dropped",
        ),
        pytest.param(
            f"```python\n{FIB}\n```\n```python\n{FIB}\n\n{FIB_TESTS}\n```",
            FIB,
            FIB_TESTS,
            id="copy-of-the-function-dropped",
        ),
        pytest.param(
            f"```python\n{FIB}\n\nif __name__ == '__main__':\n    print(fib(5))\n```",
            f"{FIB}\n\nif __name__ == '__main__':\n    print(fib(5))",
            "",
            id="demo-is-code",
        ),
        pytest.param(
            f"```python\n{FIB}\n```\nOutput:\n```\n5\n```", FIB, "", id="example-output-ignored"
        ),
        pytest.param(
            f"```python\n{FIB}\n\ndef test_fib():\n    assert fib(3) == 2\n```",
            FIB,
            "def test_fib():\n    assert fib(3) == 2",
            id="test-function",
        ),
        pytest.param(
            f"```python\n{join(FIB, FIB_TESTS)}\n```", FIB, FIB_TESTS, id="marker-kept-by-model"
        ),
        pytest.param("```python\ndef f(:\n```", "def f(:", "", id="syntax-error-is-code"),
        pytest.param(
            f"```python\n{FIB}\n\ntry:\n    fib(-1)\nexcept ValueError as e:\n    print(e)\n"
            f"```\n```python\n{FIB_TESTS}\n```",
            FIB,
            f"try:\n    fib(-1)\nexcept ValueError as e:\n    print(e)\n\n{FIB_TESTS}",
            id="raise-check-in-the-code-block-is-a-test",
        ),
        pytest.param(
            f"```python\ntry:\n    import numpy\nexcept ImportError:\n    pass\n\n{FIB}\n\n"
            "try:\n    print(fib(int(input())))\nexcept ValueError:\n    pass\n\n"
            "try:\n    fib(3)\nexcept Exception:\n    pass\n```",
            "try:\n    import numpy\nexcept ImportError:\n    pass\n\n"
            f"{FIB}\n\ntry:\n    print(fib(int(input())))\nexcept ValueError:\n    pass\n\n"
            "try:\n    fib(3)\nexcept Exception:\n    pass",
            "",
            id="a-programs-own-try-is-code",
        ),
        pytest.param(
            f'```python\n{FIB}\n\n# Tests\nassert fib(1) == 1\nassert fib("]) == 0\n```',
            FIB,
            '# Tests\nassert fib(1) == 1\nassert fib("]) == 0',
            id="syntax-error-in-the-tests",
        ),
    ],
)
def test_code_with_tests_keeps_code_and_tests_apart(answer: str, code: str, tests: str) -> None:
    """An answer's code and its tests come apart, whichever way the model laid them out."""
    program = code_with_tests(answer)
    assert split(program) == (code, tests)
    assert extract(answer, "code-with-tests") == program


def test_join_and_split_round_trip() -> None:
    """join puts the marker between code and tests; split takes them apart; no tests, no marker."""
    program = join(FIB, FIB_TESTS)
    assert TESTS_MARKER in program and split(program) == (FIB, FIB_TESTS)
    assert join(FIB, "") == FIB and split(FIB) == (FIB, "")


@pytest.mark.parametrize(
    ("tests", "units"),
    [
        (FIB_TESTS, ["assert fib(0) == 0", "assert fib(10) == 55"]),
        (
            "data = [3, 1]\nassert sorted(data) == [1, 3]",
            ["data = [3, 1]\nassert sorted(data) == [1, 3]"],
        ),
        ("def test_a(x):\n    assert f(x)\n", ["def test_a(x):\n    assert f(x)\ntest_a()"]),
        ("def test_a():\n    return f()\n", ["def test_a():\n    return f()\ntest_a()"]),
        (
            "def test_a():\n    assert f()\n\ntest_a()",  # a test function of asserts: unrolled
            ["assert f()"],
        ),
        (
            'def test_a():\n    """Doc."""\n    assert f(1) == 1, "one"\n    x = 2\n'
            "    assert f(x) == 2\n    try:\n        f(-1)\n        assert False\n"
            '    except ValueError:\n        pass\n    print("done")\n\n'
            'if __name__ == "__main__":\n    test_a()\n    print("all passed")\n',
            [
                'assert f(1) == 1, "one"',
                "x = 2\nassert f(x) == 2",
                'try:\n    f(-1)\n    assert False\nexcept ValueError:\n    pass\nprint("done")',
            ],
        ),
        ("assert f(1)\nassert f(1)  # again\nassert f(2)", ["assert f(1)", "assert f(2)"]),
        (  # a raise check without an assert is a test of its own, not setup for the next
            "try:\n    r = f(-1)\nexcept (ValueError, TypeError):\n    pass\nassert f(2)",
            ["try:\n    r = f(-1)\nexcept (ValueError, TypeError):\n    pass", "assert f(2)"],
        ),
        ("assert f(1)\nassert f([1, 2", ["assert f(1)"]),  # cut off: the lines that parse
        ("for x in [1, 2]:\n    assert x", ["for x in [1, 2]:\n    assert x"]),
        ("assert f(\n", ["assert f(\n"]),
        ("", []),
    ],
)
def test_split_tests(tests: str, units: list[str]) -> None:
    """Each test runs on its own, with the setup lines before it; test functions get called,
    or unrolled into their asserts; repeats count once; a cut-off end is dropped."""
    assert split_tests(tests) == units


FLAT_RIGHT = (
    "def flatten(xs):\n    out = []\n    for x in xs:\n"
    "        out += flatten(x) if isinstance(x, list) else [x]\n    return out"
)
FLAT_WRONG = (  # one level only
    "def flatten(xs):\n    out = []\n    for x in xs:\n"
    "        out += x if isinstance(x, list) else [x]\n    return out"
)
UNITTEST_CUT_OFF = (  # unittest, no runner, cut off at max_tokens
    "import unittest\n\nclass TestFlatten(unittest.TestCase):\n"
    "    def test_flat(self):\n        self.assertEqual(flatten([1, [2]]), [1, 2])\n"
    "    def test_deep(self):\n        self.assertEqual(flatten([[[1]]]), [1])\n"
    "        self.assertEqual(flatten([1, [2, [3"
)


def test_a_test_class_nothing_runs_has_its_methods_run() -> None:
    """A unittest class without unittest.main() (as a cut-off answer leaves it) defined its
    tests and ran none, so every code passed it; now each test method is a test."""
    units = split_tests(UNITTEST_CUT_OFF)
    assert len(units) == 2 and units[1].endswith("__case__.test_deep()")
    assert run_tests(FLAT_RIGHT, units).results == (None, None)
    flat, deep = run_tests(FLAT_WRONG, units).results
    assert flat is None
    assert deep is not None and deep.startswith("`self.assertEqual(flatten([[[1]]]), [1])`")
    plain = "class TestFlatten:\n    def test_deep(self):\n        assert flatten([[[1]]]) == [1]\n"
    assert run_tests(FLAT_WRONG, split_tests(plain)).passed == 0
    assert run_tests(FLAT_RIGHT, split_tests(plain)).passed == 1


def test_unittest_main_is_no_test_and_the_class_still_runs() -> None:
    """unittest.main() finds no tests where the tests run (they are not the __main__ module),
    so it passed whatever the code did; the class's methods are run instead."""
    tests = UNITTEST_CUT_OFF.rsplit("\n", 1)[0] + "\n\nunittest.main()\n"
    units = split_tests(tests)
    assert len(units) == 2 and units[1].endswith("unittest.main()")
    assert run_tests(FLAT_WRONG, units).passed == 1
    assert run_tests(FLAT_RIGHT, units).passed == 2


def test_carry_tests_appends_only_the_dropped_ones() -> None:
    """Tests that passed before and that a refinement dropped come back; respaced ones count."""
    refined = join(FIB, "assert fib(10)==55")
    carried = carry_tests(refined, ["assert fib(0) == 0", "assert fib(10) == 55"])
    assert split(carried) == (FIB, "assert fib(0) == 0\nassert fib(10)==55")
    assert carry_tests(refined, ["assert fib(10) == 55"]) == refined
    assert split(carry_tests(FIB, ["assert fib(1) == 1"])) == (FIB, "assert fib(1) == 1")
    assert normalized("assert fib(1)==1  # one") == normalized("assert fib(1) == 1")


def test_a_test_class_carried_to_a_later_answer_brings_each_method_once() -> None:
    """Each test method of a class is a test in the class without its other test methods,
    and the lines that run it are no test of their own: carried to a refinement, five
    passed methods were the whole class five times over (a feedback prompt past the local
    model's context), and split again they were tests once more."""
    tests = (
        "import unittest\n\nclass TestFlatten(unittest.TestCase):\n"
        "    def setUp(self):\n        self.xs = [1, [2]]\n\n"
        "    def test_flat(self):\n        self.assertEqual(flatten(self.xs), [1, 2])\n\n"
        "    # nested twice\n"
        "    def test_deep(self):\n        self.assertEqual(flatten([[[1]]]), [1])\n\n"
        "    def test_empty(self):\n        self.assertEqual(flatten([]), [])\n\n"
        "TestFlatten().test_flat()\n"
    )
    units = split_tests(tests)
    assert [u.count("def test_") for u in units] == [1, 1, 1]
    assert all("def setUp" in u for u in units) and "# nested twice" in units[1]
    # the setUp still runs: one level is all test_flat needs
    assert [r is None for r in run_tests(FLAT_WRONG, units).results] == [True, False, True]
    later = carry_tests(join(FLAT_RIGHT, "assert flatten([[]]) == []"), units)
    again = split_tests(split(later)[1])
    assert [normalized(u) for u in again] == [
        normalized(u) for u in [*units, "assert flatten([[]]) == []"]
    ]
    assert carry_tests(later, units) == later
    assert split(later)[1].count("def test_") == 3


def test_carried_tests_run_when_the_refinements_own_tests_do_not_parse() -> None:
    """A refinement whose tests end in a statement that does not parse still runs the tests
    carried from earlier answers (tests are cut after their last line that parses)."""
    refined = join(FIB, 'assert fib(10) == 55\nassert fib(2) == "1')
    carried = carry_tests(refined, ["assert fib(0) == 0"])
    assert split_tests(split(carried)[1]) == ["assert fib(0) == 0", "assert fib(10) == 55"]


def test_a_cut_off_answer_loses_the_test_it_was_writing() -> None:
    """The line max_tokens stopped is not a test; code without tests stays as it is."""
    cut = join(FIB, "assert fib(10) == 55\nassert fi")
    assert split(without_unfinished_test(cut)) == (FIB, "assert fib(10) == 55")
    assert without_unfinished_test(join(FIB, "assert fi")) == FIB
    assert without_unfinished_test(FIB) == FIB


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("To address the add… I put in the words.", "To address the add… I put in the words."),
        ("A dog runs. To address the feedback, I added a cat.", "To address the feedback"),
        ("A dog and a cat play. I added the missing words dog and cat.", "I added the missing"),
        ("A dog runs in the park.\nNote: the sentence now uses every concept.", "Note:"),
        ("This revised sentence includes all the words.", "This revised sentence"),
        ("The food was great, as suggested by the feedback.", "as suggested"),
        ("All the missing words are now used.", "missing words"),
        ("The previous version lacked a verb.", "The previous version"),
        ("A dog runs in the park.", None),
        ("I added extra salt to my fries and they were perfect.", None),
        ("The staff took our feedback cards with a smile.", None),
        ("The new version of the menu is great.", None),
        ("We were told to address the manager directly.", None),
    ],
)
def test_meta_commentary(text: str, flagged: str | None) -> None:
    """Notes about the feedback or the edit are one finding quoting them; plain prose is not."""
    found = meta_commentary(text, "sentence")
    if flagged is None:
        assert found == []
    else:
        assert len(found) == 1 and flagged in found[0]
        assert found[0].endswith("Reply with the sentence only.")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = sum(v)  # as suggested by the feedback, use sum\n", ["line 1 about the changes"]),
        ("# Improved: iterative instead of recursive\ndef f(): pass\n", ["line 1 about the"]),
        ("# the original code was slow\nx = 1\n", ["line 1 about the"]),
        ("print(dedupe([1, 1]))  # [1]\n", ["line 1 claims an output"]),
        ("x = f()\n# Output: [1, 2, 3]\n", ["line 2 claims an output"]),
        ("# -> 55\n", ["line 1 claims an output"]),
        ("# use a dict instead of a list: O(1) lookups\nx = {}\n", []),
        ("x = 1  # the count of items\nprint(x)  # show it\n", []),
        ("s = '# feedback in a string'\n", []),
        ("def f(:\n  # feedback\n", []),
    ],
)
def test_comment_commentary(code: str, expected: list[str]) -> None:
    """Comments about the review, and comments claiming an output, are findings."""
    found = comment_commentary(code, tests=True)
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert want in got
    if any("claims" in f for f in found):
        assert "assert in the tests" in found[0]
        assert "remove it" in comment_commentary(code)[0]


def test_a_tests_block_cut_off_keeps_the_tests_before_the_cut() -> None:
    """A later block that does not parse (cut off at max_tokens) keeps its tests, less a copy
    of the code, with the unparsable rest (which the check reports); prose blocks stay out."""
    cut = f"```python\n{FIB}\n```\n```python\n{FIB}\nassert fib(10) == 55\nassert fib(2"
    assert split(code_with_tests(cut)) == (FIB, "assert fib(10) == 55\nassert fib(2")
    assert split_tests(split(code_with_tests(cut))[1]) == ["assert fib(10) == 55"]
    prose = f"```python\n{FIB}\n```\n```python\nprint(fib(10)  # 55\n```"
    assert split(code_with_tests(prose)) == (FIB, "")


@pytest.mark.parametrize(
    ("unit", "meant"),
    [
        ('assert f("") == ValueError("empty")', ("f('')", "ValueError", True)),
        ("data = [1]\nassert pop(data, 5) == IndexError()", ("pop(data, 5)", "IndexError", True)),
        ("assert parse('x') == ParseError('bad')", ("parse('x')", "ParseError", True)),
        ("assert f(1) == ValueError", ("f(1)", "ValueError", False)),  # the class itself
        ("assert f(1) == value", None),
        ("assert f(1) == errors.ValueError", None),
        ("assert f(1) != ValueError('x')", None),
        ("assert f(1) == Point(1, 2)", None),
        ("assert f(1) == 2", None),
        ("try:\n    f(1)\nexcept ValueError:\n    pass", None),
        ("assert f(", None),
    ],
)
def test_a_raise_compared_as_a_value_is_recognised(
    unit: str, meant: tuple[str, str, bool] | None
) -> None:
    """``assert f(x) == SomeError(...)`` cannot pass (a new exception equals only itself), and
    ``assert f(x) == SomeError`` fails code that raises."""
    assert raise_compared_as_value(unit) == meant


def test_probe_calls_are_the_tests_calls_and_small_changes_of_their_arguments() -> None:
    """Every call of the code's own functions in the tests, then each with one literal
    argument changed a little; calls of other functions are left out, each call once."""
    program = join(
        "def valid(s, n=1):\n    return bool(s)\ndef pair(xs, k):\n    return xs[:k]",
        "assert valid('0.1')\nassert len(pair([3, 4], -2)) == 0\nassert valid('0.1')",
    )
    code, tests = split(program)
    calls = probe_calls([code], split_tests(tests))
    assert calls[:2] == ["valid('0.1')", "pair([3, 4], -2)"]
    assert {"valid('')", "valid('00.1')", "valid('0.11')", "valid('1.0')"} <= set(calls)
    assert {"pair([], -2)", "pair([4, 3], -2)", "pair([3, 3, 4], -2)", "pair([3, 4], 2)"} <= set(
        calls
    )
    assert not any(c.startswith("len(") for c in calls)
    assert len(calls) == len(set(calls))
    assert len(probe_calls([code], split_tests(tests), limit=3)) == 3


def test_foreign_calls_add_a_character_no_string_argument_holds() -> None:
    """Each call of the code's own functions with one non-empty string argument given a
    `#` and a letter it lacks at its end, upper case where its letters are; a string
    holding `#` gets only the letter; numbers, lists and empty strings are left as they are."""
    code = "def f(s, t=''):\n    return s"
    tests = "assert f('MCM') == 'MCM'\nassert f('ab#z', 3)\nassert f('', [1])\nassert len('x') == 1"
    assert foreign_calls([code], split_tests(tests)) == [
        "f('MCM#')",
        "f('MCMZ')",
        "f('ab#zq', 3)",
    ]
    assert foreign_calls([code], split_tests(tests), limit=1) == ["f('MCM#')"]
    assert foreign_calls([code], split_tests("assert g('a')")) == []


def test_terms_are_the_exceptions_a_request_names_and_whether_it_works_in_place() -> None:
    """Names ending in Error or Exception in the record's text fields; other fields and
    words are not errors. "In place" or "in-place", in any case, asks for work in place."""
    fields = {
        "id": "r1",
        "task": "Parse a date. It must raise ValueError for a bad date and DateRangeError "
        "(or a TimeoutException) when out of range; the Error log is not an error.",
        "n": 3,
        "tags": ["KeyError", "in place"],
    }
    assert terms(fields) == Terms(
        frozenset({"ValueError", "DateRangeError", "TimeoutException"}),
        in_place=False,
        texts=("r1", fields["task"]),
    )
    assert terms({"task": "Sum a list of numbers."}) == Terms(texts=("Sum a list of numbers.",))
    assert terms({"task": "Reverse the list In-place."}).in_place
    assert terms({"task": "Sort it in place."}).in_place
    assert not terms({"task": "Replace each word."}).in_place


MEDIAN_TASK = "Write median(values). It must raise ValueError for an empty list."
CAUGHT = "try:\n    median([])\nexcept ValueError as e:\n    assert {}\nelse:\n    assert False"


@pytest.mark.parametrize(
    ("check", "texts", "unasked"),
    [
        ('str(e) == "List cannot be empty"', (MEDIAN_TASK,), True),
        ('"empty" in str(e).lower()', (MEDIAN_TASK,), False),  # the request's word
        (
            'str(e) == "List cannot be empty"',
            (MEDIAN_TASK + ' Say "List cannot be empty".',),
            False,
        ),
        ('e.args[0] == "no values"', (MEDIAN_TASK,), True),
        ("isinstance(e, ValueError)", (MEDIAN_TASK,), False),  # no words asserted
        ('"List cannot be empty" != ""', (MEDIAN_TASK,), False),  # not the caught error's
    ],
)
def test_a_test_asserting_words_of_the_error_the_request_does_not_state_is_unasked(
    check: str, texts: tuple[str, ...], unasked: bool
) -> None:
    """A request naming the error to raise leaves its message open: a test asserting the
    caught error's words asks what it does not, unless the request states those words."""
    unit = CAUGHT.format(check)
    assert unasked_message(unit, texts) is unasked
    assert (asked_tests([unit], terms({"task": texts[0]})) == []) is unasked
    assert not unasked_message("assert median([1]) == 1", texts)


VALUE_ERROR = Terms(frozenset({"ValueError"}))


@pytest.mark.parametrize(
    ("result", "asked", "stray"),
    [
        ("raises KeyError", VALUE_ERROR, "raises KeyError"),
        ("raises ValueError", VALUE_ERROR, None),
        ("raises RomanError(ValueError)", VALUE_ERROR, None),  # derives from the named one
        ("raises RomanError(Exception)", Terms(frozenset({"RomanError"})), None),
        ("raises RomanError(Exception)", VALUE_ERROR, "raises RomanError(Exception)"),
        ("raises KeyError", Terms(), None),  # the request names no error: any may be raised
        ("raises NameError", Terms(), "raises NameError"),  # a name never bound: no answer
        ("raises UnboundLocalError", VALUE_ERROR, "raises UnboundLocalError"),
        ("raises NameError", Terms(frozenset({"NameError"})), None),  # unless it asks for it
        ("'raises KeyError'", VALUE_ERROR, None),  # a returned string, not a raise
        ("timeout", VALUE_ERROR, None),
        ("2 [argument 1 changed]", Terms(), "changes argument 1"),
        ("[1, 2] [argument 1, 2 changed]", VALUE_ERROR, "changes argument 1, 2"),
        ("2 [argument 1 changed]", Terms(in_place=True), None),  # asked for
        ("None [argument 1 changed]", Terms(), None),  # returns nothing: the change is its result
        ("'x [argument 1 changed] y'", Terms(), None),  # only at the end
    ],
)
def test_stray_effect_is_what_the_request_does_not_ask_for(
    result: str, asked: Terms, stray: str | None
) -> None:
    assert stray_effect("f(1)", result, asked) == stray


def test_probe_calls_leave_out_a_call_of_a_tests_own_variable() -> None:
    """Calls near the tests are run alone in the code's namespace: one reading a name the
    test binds (a parametrized test's argument, a variable) is left out; one reading only
    built-ins, its own comprehension's variable or a class every code defines is kept."""
    box = "class Box:\n    def __init__(self, v):\n        self.v = v\n\n\ndef f(x):\n    return x"
    tests = [
        "def test_f(m):\n    assert f(m) == m",
        "xs = [3, 1]\nassert f(xs) == xs",
        "assert f([i * 2 for i in range(3)]) == [0, 2, 4]",
        "assert f(Box(1)).v == 1",
        "assert f(sorted([2, 1])) == [1, 2]",
    ]
    calls = probe_calls([box], tests)
    assert "f(m)" not in calls and "f(xs)" not in calls
    assert {"f([i * 2 for i in range(3)])", "f(Box(1))", "f(sorted([2, 1]))"} <= set(calls)
    # A class only one of the codes defines would raise NameError in the other.
    assert "f(Box(1))" not in probe_calls([box, "def f(x):\n    return x"], tests)


@pytest.mark.parametrize(
    ("result", "error"),
    [
        ("raises KeyError", Raised("KeyError")),
        ("raises RomanError(ValueError)", Raised("RomanError", "ValueError")),
        ("'raises KeyError'", None),  # a string the call returned
        ("changes argument 1", None),
        ("timeout", None),
    ],
)
def test_raised_error_reads_the_error_a_call_raised_and_its_base(
    result: str, error: Raised | None
) -> None:
    assert raised_error(result) == error


def test_stray_effect_leaves_out_a_call_against_the_declared_signature() -> None:
    """A literal of another kind than the request's signature declares is outside what it
    asks: a TypeError there is no stray raise, nor is anything else the call does."""
    asked = terms({"task": "Write roman_to_int(s: str) -> int; raise ValueError on bad input."})
    assert stray_effect("roman_to_int(1994)", "raises TypeError", asked) is None
    assert stray_effect("roman_to_int([1])", "2 [argument 1 changed]", asked) is None
    assert stray_effect("roman_to_int('IX#')", "raises TypeError", asked) == "raises TypeError"


TRY = "try:\n    f(1)\nexcept ValueError:\n    pass"
ELSE = "\nelse:\n    raise AssertionError('f(1) did not raise ValueError')"


@pytest.mark.parametrize(
    ("unit", "errors", "made"),
    [
        (TRY, {"ValueError"}, TRY + ELSE),
        (
            "# bad input\ntry:\n    x = f(1)\nexcept ValueError as e:\n    print(e)",
            {"ValueError"},
            "# bad input\ntry:\n    x = f(1)\nexcept ValueError as e:\n    print(e)"
            "\nelse:\n    raise AssertionError('f(1) did not raise ValueError')",
        ),
        (TRY, set(), TRY),  # the request names no error
        (TRY.replace("ValueError", "IndexError"), {"ValueError"}, None),  # not the one named
        (TRY.replace("ValueError", "(ValueError, KeyError)"), {"ValueError"}, None),
        (TRY.replace("    f(1)", "    f(1)\n    assert False"), {"ValueError"}, None),  # checks
        (TRY + "\nelse:\n    assert False", {"ValueError"}, None),
        ("assert f(1) == 2", {"ValueError"}, None),
        ("# empty\nassert f(1) == ValueError", {"ValueError"}, "# empty\n" + TRY + ELSE),
        ("assert f(1) == ValueError('no')  # raises", {"ValueError"}, TRY + ELSE),
        ("assert f(1) == ValueError", set(), None),
        ("assert f(1) == KeyError", {"ValueError"}, None),
    ],
)
def test_must_raise_makes_a_try_that_asserts_nothing_a_test_of_the_raise(
    unit: str, errors: set[str], made: str | None
) -> None:
    """A try of a call catching only errors the request names, asserting nothing, passes
    whether or not the call raises: it gets an else that fails when the call returns. An
    assert comparing the call with such an error fails whatever the call does: it becomes
    that try. Any other unit is left as it is (None: unchanged)."""
    got = must_raise(unit, frozenset(errors))
    assert got == (unit if made is None else made)
    if made is not None and made != unit:
        ran = run_tests("def f(x):\n    return x", [got])
        assert ran.results[0] is not None and "f(1) did not raise ValueError" in ran.results[0]
        assert run_tests("def f(x):\n    raise ValueError(x)", [got]).results == (None,)


@pytest.mark.parametrize(
    ("unit", "errors", "unasked"),
    [
        (TRY, set(), True),  # the request names no error: it asks for none
        (TRY, {"ValueError"}, False),
        (TRY.replace("ValueError", "IndexError"), {"ValueError"}, True),
        (TRY.replace("ValueError", "(ValueError, TypeError)"), {"ValueError"}, False),
        (TRY.replace("ValueError", "Exception"), set(), False),  # any error: no particular one
        (TRY.replace("except ValueError", "except"), set(), False),
        (
            "try:\n    assert f([1, 'a']) == ValueError('x')\nexcept ValueError:\n    pass",
            set(),
            True,
        ),
        ("assert f(1) == 2", set(), False),
        ("def test_f():\n    try:\n        f(1)\n    except KeyError:\n        pass", set(), False),
    ],
)
def test_unasked_raise_is_a_test_for_an_error_the_request_does_not_name(
    unit: str, errors: set[str], unasked: bool
) -> None:
    assert unasked_raise(unit, frozenset(errors)) is unasked


def test_probe_calls_give_the_lists_in_a_list_as_tuples() -> None:
    """A list holding lists (or tuples) also goes in with each of them as the other kind,
    so code that flattens tuples too is told apart from code that keeps them as items; a
    list holding neither does not."""
    calls = probe_calls(
        ["def flat(xs):\n    return xs"],
        ["assert flat([1, [2, [3]], (4, 5)]) == [1, 2, 3, (4, 5)]", "assert flat([1]) == [1]"],
    )
    assert "flat([1, (2, [3]), [4, 5]])" in calls
    assert not any(c.startswith("flat((") or "flat([(1" in c for c in calls)


def test_foreign_calls_cut_the_last_of_rows_of_one_length() -> None:
    """Two or more list rows of one length also go in with the last row one item shorter,
    among the calls that find stray raises only (``foreign_calls``), not those that tell
    codes apart; rows already of different lengths, a single row, tuples (records of a
    fixed size, such as intervals) or items that are not all rows do not."""
    code = ["def width(m):\n    return len(m[0])"]
    tests = [
        "assert width([[1, 2], [3, 4]]) == 2",
        "assert width([[1], [2], [3]]) == 1",
        "assert width([[5, 6], [7]]) == 2",
        "assert width([[8, 9]]) == 2",
        "assert width([(1, 3), (2, 6)]) == 2",
        "assert width([[1, 2], 3, [4, 5]]) == 2",
    ]
    assert foreign_calls(code, tests) == ["width([[1, 2], [3]])", "width([[1], [2], []])"]
    assert "width([[1, 2], [3]])" not in probe_calls(code, tests)


def test_probe_calls_turn_the_signs_of_a_list_of_numbers() -> None:
    """A list (or tuple) of number literals also goes in with every sign turned, so code
    that seeds a maximum with -1 is told apart from code that does not; a list holding
    anything else does not."""
    calls = probe_calls(
        ["def top(xs):\n    return max(xs)"],
        ["assert top([1, -2, 3.5]) == 3.5", "assert top(['a', 1]) == 1"],
    )
    assert "top([-1, 2, -3.5])" in calls
    assert not any("'a', -1" in c or "-1, 'a'" in c for c in calls)
