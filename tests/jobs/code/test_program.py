"""Code and its tests as one program: read out of a reply, split, its tests as units."""

from __future__ import annotations

import pytest

from jobs.code.program import (
    TESTS_MARKER,
    code_with_tests,
    join,
    split,
    split_tests,
    without_unfinished_test,
)
from pipeline.sandbox import run_tests

FIB = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"
FIB_TESTS = "assert fib(0) == 0\nassert fib(10) == 55"


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


def test_a_cut_off_answer_loses_the_test_it_was_writing() -> None:
    """The line max_tokens stopped is not a test; code without tests stays as it is."""
    cut = join(FIB, "assert fib(10) == 55\nassert fi")
    assert split(without_unfinished_test(cut)) == (FIB, "assert fib(10) == 55")
    assert without_unfinished_test(join(FIB, "assert fi")) == FIB
    assert without_unfinished_test(FIB) == FIB


def test_a_tests_block_cut_off_keeps_the_tests_before_the_cut() -> None:
    """A later block that does not parse (cut off at max_tokens) keeps its tests, less a copy
    of the code, with the unparsable rest (which the check reports); prose blocks stay out."""
    cut = f"```python\n{FIB}\n```\n```python\n{FIB}\nassert fib(10) == 55\nassert fib(2"
    assert split(code_with_tests(cut)) == (FIB, "assert fib(10) == 55\nassert fib(2")
    assert split_tests(split(code_with_tests(cut))[1]) == ["assert fib(10) == 55"]
    prose = f"```python\n{FIB}\n```\n```python\nprint(fib(10)  # 55\n```"
    assert split(code_with_tests(prose)) == (FIB, "")
