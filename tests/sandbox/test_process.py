"""Sandbox: output and values captured, limits enforced, dangerous operations refused."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.sandbox import MAX_OUTPUT_BYTES, SandboxResult, run_calls, run_python, run_tests


def test_stdout_is_captured() -> None:
    """What the program prints comes back as stdout, and the run is ok."""
    result = run_python("print('hello')\nprint(6 * 7)")
    assert result == SandboxResult(True, "hello\n42\n", None, None, False, "", result.cpu_s)
    assert result.cpu_s is not None and 0 <= result.cpu_s < 1


def test_stdin_is_the_programs_input() -> None:
    """The stdin argument is what input() reads."""
    result = run_python("a, b = map(int, input().split())\nprint(a + b)", stdin="2 40\n")
    assert result.ok and result.stdout == "42\n"


@pytest.mark.parametrize(
    ("body", "value"),
    [
        ("return 18", "18"),
        ("return 2.5", "2.5"),
        ("return 'x'", '"x"'),
        ("return [1, 2]", "[1, 2]"),
        ("return {1, 2}", "{1, 2}"),  # not JSON: its repr
        ("return float('nan')", "nan"),
        ("return None", "null"),
    ],
)
def test_call_value_is_returned(body: str, value: str) -> None:
    """With call, the call's return value comes back as JSON (repr when not JSON)."""
    result = run_python(f"def solution():\n    {body}\n", call="solution()")
    assert result.ok and result.value == value


def test_no_call_no_value() -> None:
    """Without call there is no value, even when the program defines functions."""
    assert run_python("def solution():\n    return 1\n").value is None


@pytest.mark.parametrize(
    ("code", "call", "error"),
    [
        ("x = 1\ny = x / 0\n", None, "ZeroDivisionError: division by zero (line 2)"),
        ("x = (\n", None, "SyntaxError: '(' was never closed (line 1)"),
        ("def solution():\n    return missing\n", "solution()", "NameError"),
        ("x = 1\n", "solution()", "NameError: name 'solution' is not defined"),
        ("import sys\nsys.exit(3)\n", None, "SystemExit: 3"),
    ],
)
def test_failures_are_reported_with_their_line(code: str, call: str | None, error: str) -> None:
    """A raising or unparsable program is not ok; the error names the exception and line."""
    result = run_python(code, call=call)
    assert not result.ok and not result.timed_out
    assert result.error is not None and result.error.startswith(error)
    assert result.value is None


@pytest.mark.parametrize(
    "code",
    ["import sys\nprint('a')\nsys.exit(0)\n", "import os\nprint('a', flush=True)\nos._exit(0)\n"],
)
def test_exit_zero_is_success(code: str) -> None:
    """Ending the program with exit status 0 after printing is a successful run."""
    result = run_python(code)
    assert result.ok and result.stdout == "a\n"


def test_exit_before_call_is_a_failure() -> None:
    """A program that ends the process before call can run reports no value, as a failure."""
    result = run_python("import os\nos._exit(0)\n", call="solution()")
    assert not result.ok and result.value is None
    assert result.error == "exit status 0: no result reported"


@pytest.mark.parametrize("code", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"])
def test_timeout_kills_the_program(code: str) -> None:
    """A program running past timeout_s is killed promptly and reported as timed out."""
    start = time.monotonic()
    result = run_python(code, timeout_s=0.5)
    assert time.monotonic() - start < 3.0
    assert result.timed_out and not result.ok
    assert result.error == "timed out after 0.5s"


def test_memory_limit() -> None:
    """Allocating more than memory_mb fails with MemoryError instead of succeeding."""
    code = "data = bytearray(300 * 1024 * 1024)\nprint(len(data))\n"
    assert run_python(code, memory_mb=1024).ok
    result = run_python(code, memory_mb=128)
    assert not result.ok and result.error is not None and "MemoryError" in result.error


@pytest.mark.parametrize(
    "template",
    [
        "open({path!r}, 'w').write('x')",
        "open({path!r}, 'a')",
        "open({path!r}, 'x')",
        "import os\nos.open({path!r}, os.O_WRONLY | os.O_CREAT)",
        "import pathlib\npathlib.Path({path!r}).write_text('x')",
    ],
)
def test_file_writes_are_refused(template: str, tmp_path: Path) -> None:
    """Opening a file for writing fails and creates nothing."""
    target = tmp_path / "written.txt"
    result = run_python(template.format(path=str(target)))
    assert not result.ok and result.error is not None
    assert "writing files is not allowed" in result.error
    assert not target.exists()


def test_file_changes_are_refused(tmp_path: Path) -> None:
    """Removing a file fails and the file survives."""
    victim = tmp_path / "keep.txt"
    victim.write_text("keep", encoding="utf-8")
    result = run_python(f"import os\nos.remove({str(victim)!r})")
    assert not result.ok and victim.exists()


def test_reading_files_and_stdout_fd_are_allowed() -> None:
    """Reading a file and writing through an already open fd (stdout) still work."""
    code = "import os\nopen(os.__file__).read(10)\nf = open(1, 'w')\nf.write('ok\\n')\nf.flush()\n"
    result = run_python(code)
    assert result.ok and result.stdout == "ok\n"


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.socket()",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        "import socket\nsocket.getaddrinfo('localhost', 80)",
    ],
)
def test_network_is_refused(code: str) -> None:
    """Creating sockets and resolving names fail with a sandbox PermissionError."""
    result = run_python(code)
    assert not result.ok and result.error is not None
    assert result.error.startswith("PermissionError: sandbox:")


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import os\nos.fork()",
        "import os\nos.execv('/bin/true', ['true'])",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})",
        "import os\nos.kill(os.getppid(), 0)",
        "import ctypes",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))",
    ],
)
def test_processes_signals_and_limits_are_refused(code: str) -> None:
    """Starting processes, signalling others, ctypes and raising limits all fail."""
    result = run_python(code)
    assert not result.ok and result.error is not None
    assert result.error.startswith("PermissionError: sandbox:")


def test_environment_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's environment does not reach the program."""
    monkeypatch.setenv("REFINE_SECRET", "s3cret")
    result = run_python("import os\nprint(sorted(os.environ))")
    assert result.ok
    assert "REFINE_SECRET" not in result.stdout and "PATH" not in result.stdout


def test_site_packages_are_not_importable() -> None:
    """Only the standard library is importable (no site-packages)."""
    result = run_python("import orjson")
    assert not result.ok and result.error is not None
    assert result.error.startswith("ModuleNotFoundError")


def test_output_is_truncated() -> None:
    """Output beyond the kept size is dropped; the run still succeeds."""
    result = run_python(f"print('x' * {MAX_OUTPUT_BYTES * 4})")
    assert result.ok and len(result.stdout) == MAX_OUTPUT_BYTES


def test_endless_output_is_stopped() -> None:
    """A program that prints without end is stopped long before the timeout."""
    start = time.monotonic()
    result = run_python("while True:\n    print('x' * 10000)\n", timeout_s=30)
    assert time.monotonic() - start < 10
    assert not result.ok and result.error is not None and "output limit" in result.error


def test_runs_in_threads_do_not_mix() -> None:
    """Concurrent runs from worker threads each get their own output and value."""

    def one(i: int) -> SandboxResult:
        return run_python(f"print({i})\ndef solution():\n    return {i} * 2\n", call="solution()")

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(16)))
    assert [(r.stdout, r.value) for r in results] == [(f"{i}\n", str(i * 2)) for i in range(16)]


@pytest.mark.parametrize(("kwargs"), [{"timeout_s": 0}, {"memory_mb": 0}])
def test_bad_limits_are_refused(kwargs: dict[str, float]) -> None:
    """Non-positive limits are a caller error."""
    with pytest.raises(ValueError):
        run_python("pass", **kwargs)  # type: ignore[arg-type]


# -- run_tests -------------------------------------------------------------------------------

BUGGY_FIB = (
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        b = a + b\n    return a\n"
)


@pytest.mark.parametrize(
    ("test", "result"),
    [
        ("assert fib(0) == 0", None),
        (
            "assert fib(10) == 55",
            "`assert fib(10) == 55`: AssertionError "
            "(fib(10) is 0; fib returned at line 5 of the code, where b = 1)",
        ),
        (
            "assert fib(1) == 1, 'one'",
            "`assert fib(1) == 1, 'one'`: AssertionError: one "
            "(fib(1) is 0; fib returned at line 5 of the code, where b = 1)",
        ),
        (
            "x = [fib(i) for i in range(3)]\nassert x == [0, 1, 1]",
            "`assert x == [0, 1, 1]`: AssertionError (x is [0, 0, 0])",
        ),
        ("def test_f():\n    assert fib(2) == 1\ntest_f()", "`assert fib(2) == 1`: AssertionError"),
        (
            "fib(None)",
            "`fib(None)`: TypeError: 'NoneType' object cannot be interpreted as an integer "
            "(raised in fib, line 3 of the code: `for _ in range(n):`, where a = 0, b = 1)",
        ),
        ("while True:\n    pass", "`pass`: did not finish within 0.5 s"),
        ("import sys\nsys.exit(0)", None),
        ("assert (", "`assert (`: SyntaxError: '(' was never closed (<test>, line 1)"),
    ],
)
def test_run_tests_reports_each_test(test: str, result: str | None) -> None:
    """Each test passes or fails on its own, saying where and, for ==, what the value was."""
    run = run_tests(BUGGY_FIB, ["assert fib(0) == 0", test, "assert fib(0) == 0"], per_test_s=0.5)
    assert run.error is None
    assert run.results == (None, result, None)
    assert run.passed == 3 - (result is not None)


WORDS = (
    "import re\n"
    "def words(text):\n"
    "    parts = text.lower().split()\n"
    "    _seen = len(parts)\n"
    "    counts = {}\n"
    "    for part in parts:\n"
    "        counts[part] = counts.get(part, 0) + 1\n"
    "    helper = lambda: None\n"
    "    return counts\n"
    "def depth(items):\n"
    "    inner = [depth(i) for i in items if isinstance(i, list)]\n"
    "    return 1 + max(inner, default=0)\n"
    "def parse(text):\n"
    "    pieces = text.split()\n"
    "    if len(pieces) != 3:\n"
    "        raise ValueError('need three parts')\n"
    "    return int(pieces[0]) + int(pieces[1]) + int(pieces[2])\n"
    "def total(first, *rest, scale=1, **options):\n"
    "    summed = first + sum(rest)\n"
    "    return summed * scale\n"
)


@pytest.mark.parametrize(
    ("test", "result"),
    [
        # Its own values where it returned: not the parameters (the test shows them), not
        # names starting with _, functions or modules, not the returned value again.
        (
            "assert words('a1b a') == {'a': 2, 'b': 1}",
            "`assert words('a1b a') == {'a': 2, 'b': 1}`: AssertionError (words('a1b a') is "
            "{'a1b': 1, 'a': 1}; words returned at line 9 of the code, where "
            "parts = ['a1b', 'a'], part = 'a')",
        ),
        # The call the test made, not the recursive calls inside it.
        (
            "assert depth([1, [2, [3]]]) == 2",
            "`assert depth([1, [2, [3]]]) == 2`: AssertionError (depth([1, [2, [3]]]) is 3; "
            "depth returned at line 12 of the code, where inner = [2])",
        ),
        # Where an error was raised and the values there; a raise line is not quoted.
        (
            "assert parse('1h30m') == 5400",
            "`assert parse('1h30m') == 5400`: ValueError: need three parts (raised in parse, "
            "line 16 of the code, where pieces = ['1h30m'])",
        ),
        (
            "assert parse('a b c') == 0",
            "`assert parse('a b c') == 0`: ValueError: invalid literal for int() with base 10: "
            "'a' (raised in parse, line 17 of the code: "
            "`return int(pieces[0]) + int(pieces[1]) + int(pieces[2])`, where "
            "pieces = ['a', 'b', 'c'])",
        ),
        # Parameters of every sort are left out: *args and **kwargs too.
        (
            "assert total(1, 2, scale=3) == 0",
            "`assert total(1, 2, scale=3) == 0`: AssertionError (total(1, 2, scale=3) is 9; "
            "total returned at line 20 of the code, where summed = 3)",
        ),
        # Nothing of its own to show: the value alone.
        (
            "assert parse('1 2 3') == 7",
            "`assert parse('1 2 3') == 7`: AssertionError "
            "(parse('1 2 3') is 6; parse returned at line 17 of the code, where "
            "pieces = ['1', '2', '3'])",
        ),
    ],
)
def test_failing_tests_show_the_codes_values(test: str, result: str) -> None:
    """A failing test says where the code under test returned or raised, and its values
    there: what a reader would look at first to see why."""
    assert run_tests(WORDS, [test]).results == (result,)


def test_values_are_shown_briefly() -> None:
    """A long value is cut short; the values shown are at most four."""
    code = (
        "def f():\n"
        "    a = list(range(1000))\n    b = 'x' * 500\n    c = d = e = g = 1\n"
        "    return 0\n"
    )
    (result,) = run_tests(code, ["assert f() == 1"]).results
    assert result is not None
    assert "a = [0, 1, 2, 3, 4, 5, 6, 7, ...]" in result
    assert f"b = '{'x' * 27}...{'x' * 28}'" in result
    assert result.endswith("c = 1, d = 1)")


def test_values_of_none_and_odd_values() -> None:
    """A local that is None is shown where the call raised; one shown only by its address
    (its repr fails, or it has none of its own) is not."""
    code = (
        "class Odd:\n    def __repr__(self):\n        raise RuntimeError\n"
        "class Plain:\n    pass\n"
        "def f(text):\n    found = None\n    odd, plain = Odd(), Plain()\n    return text[5]\n"
    )
    (result,) = run_tests(code, ["assert f('abc') == 'x'"]).results
    assert result == (
        "`assert f('abc') == 'x'`: IndexError: string index out of range (raised in f, "
        "line 9 of the code: `return text[5]`, where found = None)"
    )


def test_a_slow_call_is_not_traced_past_its_limit() -> None:
    """Evaluating a failing test's left side again to show its value runs under the same
    per-test limit: a slow call fails alone, and the tests after it still run."""
    code = (
        "import time\ncalls = []\n"
        "def f():\n    calls.append(1)\n    time.sleep(0.1 if len(calls) == 1 else 30)\n"
        "    return 0\n"
    )
    run = run_tests(code, ["assert f() == 1", "assert 1 == 1"], timeout_s=5, per_test_s=1)
    assert run.error is None
    assert run.results == ("`assert f() == 1`: AssertionError", None)


def test_run_tests_when_the_code_fails() -> None:
    """Code that raises before its tests run is the run's error; no test counts as run."""
    run = run_tests("raise ValueError('boom')", ["assert True"])
    assert run.results == () and run.error == "ValueError: boom (line 1)"
    assert run.passed == 0


def test_run_tests_after_code_that_exits_cleanly() -> None:
    """Code that ends with sys.exit(0), or shadows builtins, still has its tests run."""
    run = run_tests("import sys\nprint = None\nsys.exit(0)", ["assert 1 + 1 == 2"])
    assert run.results == (None,)


def test_run_tests_when_a_test_stops_the_whole_run() -> None:
    """A test past the whole run's deadline fails; the tests after it did not run."""
    run = run_tests(
        "", ["assert True", "x = 10 ** 10 ** 8", "assert True"], timeout_s=1.0, per_test_s=5.0
    )
    assert run.results[0] is None
    assert run.results[1] is not None and run.results[1].startswith("stopped the run: timed out")
    assert run.results[2] == "not run: an earlier test stopped the run"


def test_cpu_time_is_the_programs_own() -> None:
    """cpu_s counts the program's work, not the interpreter's start."""
    idle = run_python("x = 1")
    busy = run_python("total = 0\nfor i in range(3_000_000):\n    total += i")
    assert idle.cpu_s is not None and busy.cpu_s is not None
    assert idle.cpu_s < 0.01 < busy.cpu_s


def test_run_calls_gives_each_calls_result_as_text() -> None:
    """Each call's repr (a set's items sorted, whatever the hash seed), the error it raised,
    or a timeout; the calls after a failing one still run."""
    code = (
        "def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return {str(x), 'a', 'b'}\n"
        "def spin():\n    while True:\n        pass"
    )
    got = run_calls(code, ["f(1)", "f(-1)", "spin()", "missing()", "f(2)"], per_call_s=0.2)
    assert got == (
        "set[\"'1'\", \"'a'\", \"'b'\"]",
        "raises ValueError",
        "timeout",
        "raises NameError",
        "set[\"'2'\", \"'a'\", \"'b'\"]",
    )
    assert run_calls(code, []) == ()
    assert run_calls("class P:\n    pass", ["P()", "P"]) == (
        "<__main__.P object>",
        "<class '__main__.P'>",
    )


def test_run_calls_sorts_sets_inside_lists_tuples_and_dicts() -> None:
    """A set of strings inside a list, tuple or dict iterates in an order that changes with
    each process's hash seed: shown sorted at any depth, every run of the same code gives
    the same text; other containers and a one-item tuple keep their own repr."""
    code = (
        "from collections import namedtuple\nP = namedtuple('P', 'x')\n"
        "def f():\n    words = {w for w in 'the cat sat on a mat by the old red door'.split()}\n"
        "    return [words, (frozenset(words),), {'k': [words]}]\n"
        "def g():\n    return (1,), P(2), [], {}"
    )
    runs = {run_calls(code, ["f()"]) for _ in range(4)}
    assert len(runs) == 1
    ran = runs.pop()
    assert ran is not None
    (shown,) = ran
    assert shown.startswith("[set[\"'a'\", \"'by'\", \"'cat'\"")
    assert "(frozenset[\"'a'\"" in shown and "{'k': [set[" in shown
    assert run_calls(code, ["g()"]) == ("((1,), P(x=2), [], {})",)


def test_run_calls_shows_an_error_class_of_the_codes_own_with_its_builtin_base() -> None:
    """A request names built-in errors: a class of the code's own is shown with the
    built-in one it derives from."""
    code = (
        "class RomanError(ValueError):\n    pass\nclass Odd(Exception):\n    pass\n"
        "def f(x):\n    raise RomanError(x) if x else Odd()"
    )
    assert run_calls(code, ["f(1)", "f(0)", "{}[1]"]) == (
        "raises RomanError(ValueError)",
        "raises Odd(Exception)",
        "raises KeyError",
    )


def test_run_calls_says_which_arguments_a_call_changed() -> None:
    """A call that changes a positional argument's value says which; a call of another
    shape, or one that changes nothing, gives its result alone."""
    code = (
        "def median(v, w=None):\n    v.sort()\n    return v[len(v) // 2]\n"
        "def pure(v, w):\n    return sorted(v)[0]\n"
        "def both(v, w):\n    v.append(1)\n    w.clear()"
    )
    assert run_calls(code, ["median([3, 1, 2])", "pure([3, 1], [])", "both([], [2])"]) == (
        "2 [argument 1 changed]",
        "1",
        "None [argument 1, 2 changed]",
    )
    assert run_calls(code, ["median(*[[2, 1]])", "[median([2, 1])]"]) == ("2", "[2]")
    # a long result is cut short, the change still said
    (long,) = run_calls(
        "def s(v):\n    v.sort()\n    return v", ["s(list(range(200, 0, -1)))"]
    ) or ("",)
    assert long.startswith("[1, 2, 3,") and long.endswith(" [argument 1 changed]")
    assert len(long) == 300


def test_run_calls_is_none_when_the_program_fails_before_the_calls() -> None:
    """A program that raises at import, or never finishes, gives no results at all."""
    assert run_calls("raise SystemExit(3)", ["1 + 1"]) is None
    assert run_calls("while True:\n    pass", ["1 + 1"], timeout_s=1.0) is None


def test_run_calls_gives_every_result_of_as_many_calls_as_the_tests_bring() -> None:
    """Hundreds of calls, each giving a long result, all come back (a value cut short at its
    first ten thousand characters came back as none at all)."""
    calls = [f"words({n})" for n in range(400)]
    code = "def words(n):\n    return [f'word{i}' for i in range(n % 40 + 20)]"
    got = run_calls(code, calls)
    assert got is not None and len(got) == len(calls)
    assert got[-1] == repr([f"word{i}" for i in range(399 % 40 + 20)])[:300]


def test_run_tests_reads_every_result_past_much_written_to_standard_error() -> None:
    """Results come on standard error: a program writing much there, and many failing tests
    with long messages, push none of the later results out (they were counted not run)."""
    noisy = f"import sys\nsys.stderr.write('z' * {2 * MAX_OUTPUT_BYTES})\ndef f(x):\n    return x\n"
    assert run_tests(noisy, ["assert f(1) == 1", "assert f(1) == 2"]).passed == 1
    failing = [f'assert f({n}) == {n} + 1, "y" * 800' for n in range(120)]
    run = run_tests("def f(x):\n    return x\n", [*failing, "assert f(1) == 1"], timeout_s=30)
    assert run.results[-1] is None and run.passed == 1
    assert all(r is not None and r.startswith("`assert f(") for r in run.results[:-1])
