"""Checking a code-with-tests answer: its own tests, and the request's examples, run.

An answer carries its tests (``program``). Both run in the sandbox: the request's examples
first (those it states as code: ``assert`` lines and doctest ``>>>`` lines with their
expected output; a request in prose states none this reads), then the answer's own tests,
each on its own. ``metrics`` counts what passed; ``findings`` turns every failure into a
problem the refinement can act on. Nothing here reads the request's prose.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from jobs.code.program import normalized, split, split_tests
from pipeline.core.extraction import comment_commentary
from pipeline.core.pyast import parsed, parsed_expression
from pipeline.sandbox import (
    SandboxMode,
    SandboxPolicy,
    TestsRun,
    current_mode,
    run_tests,
    syntax_problem,
)

__all__ = [
    "SHOWN_FAILURES",
    "TESTS_FAILED",
    "TESTS_PASSED",
    "TESTS_TOTAL",
    "Checked",
    "check_answer",
    "findings",
    "metrics",
    "stated_examples",
]

SHOWN_FAILURES = 3  # more failing tests than this are counted, not listed
# The metrics an answer's run gives (its evaluator's), named once for the kit's readers.
TESTS_TOTAL = "tests_total"
TESTS_PASSED = "tests_passed"
TESTS_FAILED = "tests_failed"
_CLIP = 120
_SAID = 600  # of what the sandbox says of a failing test (values at the failure)


def stated_examples(request: str) -> list[str]:
    """The examples a request states as code, as tests: each ``assert`` line that parses,
    and each doctest ``>>> call`` followed by its expected output (earlier ``>>>``
    statements without output run before it)."""
    tests: list[str] = []
    setup: list[str] = []
    lines = [line.strip() for line in request.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("assert ") and parsed(line) is not None:
            tests.append(line)
        elif line.startswith(">>>"):
            source = line[3:].strip()
            after = lines[i + 1] if i + 1 < len(lines) else ""
            if after and not after.startswith((">>>", "...", "Traceback")):
                if parsed_expression(source) is not None:
                    tests.append("\n".join([*setup, _expectation(source, after)]))
            elif parsed(source) is not None:
                setup.append(source)
    return tests


def _expectation(call: str, expected: str) -> str:
    """An assert that ``call`` gives ``expected``: equal to it as a literal, else as its repr."""
    try:
        ast.literal_eval(expected)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return f"assert repr({call}) == {expected!r}"
    return f"assert ({call}) == ({expected})"


@functools.lru_cache(maxsize=256)
def _run_in(code: str, tests: tuple[str, ...], mode: SandboxMode) -> TestsRun:
    return run_tests(code, tests, policy=SandboxPolicy(mode))


def _run(code: str, tests: tuple[str, ...]) -> TestsRun:
    # metrics and findings ask for the same run (in this run's sandbox mode).
    return _run_in(code, tests, current_mode())


@dataclass(frozen=True, slots=True)
class Checked:
    """What running an answer found."""

    code: str
    units: tuple[str, ...]  # the answer's tests, one runnable piece each
    examples: tuple[str, ...]  # the request's examples, as tests
    own: TestsRun | None  # None: the code does not parse, or it has no tests
    shown: TestsRun | None  # None: the code does not parse, or the request states none
    syntax: str | None  # the code's syntax error, if any


def check_answer(request: str, output: str) -> Checked:
    """Run the answer's code with the request's examples and the answer's own tests."""
    code, tests = split(output)
    units = tuple(split_tests(tests))
    examples = tuple(stated_examples(request))
    syntax = syntax_problem(code) if code.strip() else "no code"
    if syntax is not None or not (units or examples):
        return Checked(code, units, examples, None, None, syntax)
    ran = _run(code, examples + units)
    own = TestsRun(ran.results[len(examples) :], ran.error) if units else None
    shown = TestsRun(ran.results[: len(examples)], ran.error) if examples else None
    return Checked(code, units, examples, own, shown, None)


def _failed(run: TestsRun | None, units: Sequence[str]) -> list[tuple[str, str]]:
    """(unit, why) of each failing unit; every unit when the program failed before them."""
    if run is None or run.error is not None:
        return [(u, run.error if run is not None and run.error else "not run") for u in units]
    return [(u, why) for u, why in zip(units, run.results, strict=True) if why is not None]


def metrics(checked: Checked) -> dict[str, object]:
    """``parses``, ``tests_total``, ``tests_passed``, ``tests_failed`` (each failing test,
    normalized) and, where the request states examples, ``examples_passed`` of
    ``examples_total``."""
    failed = [u for u, _ in _failed(checked.own, checked.units)]
    out: dict[str, object] = {
        "parses": checked.syntax is None,
        TESTS_TOTAL: len(checked.units),
        TESTS_PASSED: len(checked.units) - len(failed),
        TESTS_FAILED: [normalized(u) for u in failed],
    }
    if checked.examples:
        wrong = _failed(checked.shown, checked.examples)
        out["examples_total"] = len(checked.examples)
        out["examples_passed"] = len(checked.examples) - len(wrong)
    return out


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _CLIP else text[: _CLIP - 3] + "..."


def _said(why: str) -> str:
    """What the sandbox said of a failing test (the test, then why), within _SAID chars."""
    why = why.rstrip(".")
    return why if len(why) <= _SAID else why[: _SAID - 3] + "..."


def findings(checked: Checked, tests_text: str) -> list[str]:
    """Problems the run verified, each saying what to fix."""
    if checked.syntax == "no code":
        return ["Give the complete code in the first ```python block."]
    if checked.syntax is not None:
        return [f"Fix the syntax error at {checked.syntax}."]
    found = [
        f"The request's own example fails: {_said(why)}."
        for _, why in _failed(checked.shown, checked.examples)[:SHOWN_FAILURES]
    ]
    found += comment_commentary(checked.code, tests=True)
    problem = syntax_problem(tests_text) if tests_text.strip() else None
    if problem is not None:
        found.append(f"Fix the syntax error in the tests at {problem}.")
    if not checked.units:
        found.append(
            "Add tests: a second ```python block of assert statements that call the code "
            "and check the results the request asks for, edge cases included."
        )
        return found
    assert checked.own is not None
    if checked.own.error is not None:
        return [*found, f"The code fails before any test runs: {_clip(checked.own.error)}."]
    failures = _failed(checked.own, checked.units)
    found += [f"Failing test {_said(why)}." for _, why in failures[:SHOWN_FAILURES]]
    if failures:
        more = len(failures) - SHOWN_FAILURES
        found.append(
            (f"{more} more {'tests fail' if more > 1 else 'test fails'}. " if more > 0 else "")
            + "Fix the code so that it does what the request asks; where a test expects a "
            "wrong value, correct the test instead."
        )
    return found
