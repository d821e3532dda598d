"""Hooks for the code-optimize job: does the faster program parse and behave the same.

PIE records keep their test cases outside the record, so ``same_output`` is measured
only for records that carry a ``test_input`` (standard input text, or a list of them):
the original program and the answer both run in the sandbox on it, and their outputs
(trailing whitespace ignored) must agree. Without one, only ``parses`` is reported.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pipeline.sandbox import SandboxResult, run_python, syntax_problem

TIMEOUT_S = 5.0
MEMORY_MB = 512
MAX_TEST_INPUTS = 3
_SHOWN_CHARS = 60


@functools.lru_cache(maxsize=512)
def _run(program: str, stdin: str) -> SandboxResult:
    # evaluate and check ask for the same runs, and the original runs once per record.
    return run_python(program, stdin=stdin, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)


def stdin_cases(fields: Mapping[str, Any]) -> list[str]:
    """The record's test inputs (``test_input``: a string or a list of strings)."""
    value = fields.get("test_input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)][:MAX_TEST_INPUTS]
    return []


def _normalized(stdout: str) -> str:
    return "\n".join(line.rstrip() for line in stdout.rstrip().splitlines())


def _shown(text: str) -> str:
    text = _normalized(text)
    return repr(text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "...")


def _compare(original: str, answer: str, stdin: str) -> tuple[bool | None, str | None]:
    """(same output?, why not); (None, reason) when the original itself does not run."""
    before = _run(original, stdin)
    if not before.ok:
        return None, f"the original program fails on the test input ({before.error})"
    after = _run(answer, stdin)
    if not after.ok:
        return False, f"The program fails on the test input: {after.error}."
    if _normalized(after.stdout) != _normalized(before.stdout):
        return False, (
            f"The output differs from the original program's on the test input "
            f"(expected {_shown(before.stdout)}, got {_shown(after.stdout)}): "
            "keep the behaviour identical."
        )
    return True, None


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """``{"parses": bool}``, plus ``same_output`` when the record has a test input."""
    problem = syntax_problem(output)
    metrics: dict[str, Any] = {"parses": problem is None}
    if problem is not None:
        metrics["syntax_error"] = problem
    inputs = stdin_cases(fields)
    original = fields.get("input")
    if not inputs or not isinstance(original, str):
        return metrics
    if problem is not None:
        metrics["same_output"] = False
        return metrics
    for stdin in inputs:
        same, why = _compare(original, output, stdin)
        if same is None:
            metrics["original_error"] = why
            return metrics
        if not same:
            metrics["same_output"] = False
            return metrics
    metrics["same_output"] = True
    return metrics


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """Actions for an empty or unparsable answer, or one that behaves differently."""
    if not output.strip():
        return ["Give the complete program in one ```python block."]
    problem = syntax_problem(output)
    if problem is not None:
        return [f"Fix the syntax error at {problem}."]
    original = fields.get("input")
    if not isinstance(original, str):
        return []
    for stdin in stdin_cases(fields):
        same, why = _compare(original, output, stdin)
        if same is False and why is not None:
            return [why]
    return []
