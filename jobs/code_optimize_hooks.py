"""Hooks for the code-optimize job: does the faster program parse and behave the same.

PIE records keep their test cases outside the record, so ``same_output`` and
``speedup`` are measured only for records that carry a ``test_input`` (standard input
text, or a list of them): the original program and the answer both run in the sandbox
on it, and their outputs (trailing whitespace ignored) must agree. As PIE does, the
answer is then timed against the original on the same input: ``TIMING_RUNS`` runs of
each, interleaved so that load on the machine falls on both alike, the median of each
(of the programs' own CPU time, interpreter start excluded: unlike wall time it
does not count the time other work on the machine takes). ``speedup`` is the original's
median over the answer's, summed over the test inputs; an answer not faster by at
least ``MIN_SPEEDUP`` is a finding. Without a test input only ``parses`` is reported.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping
from typing import Any

from pipeline.core.extraction import comment_commentary
from pipeline.core.metrics import MetricSpec
from pipeline.sandbox import (
    SandboxMode,
    SandboxPolicy,
    SandboxResult,
    current_mode,
    run_python,
    syntax_problem,
)

TIMEOUT_S = 5.0
MEMORY_MB = 512
MAX_TEST_INPUTS = 3
TIMING_RUNS = 5
MIN_SPEEDUP = 1.10  # as PIE counts a program optimised; less is within timing noise here
MIN_TIMED_S = 0.001  # programs faster than this on the test input are not judged on speed
_SHOWN_CHARS = 60
# Every answer is a program, run in the sandbox (a run checks its isolation first).
RUNS_PROGRAMS = True
# test_input is read by the checks too (use = "check"), not a label.
METRICS = {
    "parses": MetricSpec("check", value_type="boolean"),
    "same_output": MetricSpec("check", value_type="boolean"),
    "speedup": MetricSpec("check", value_type="number"),
}


def _run(program: str, stdin: str) -> SandboxResult:
    # evaluate and check ask for the same runs, and the original runs once per record.
    return _run_in(program, stdin, current_mode())


@functools.lru_cache(maxsize=512)
def _run_in(program: str, stdin: str, mode: SandboxMode) -> SandboxResult:
    return run_python(
        program, stdin=stdin, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, policy=SandboxPolicy(mode)
    )


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


@functools.lru_cache(maxsize=256)
def _timing(
    original: str, answer: str, stdin: str, mode: SandboxMode
) -> tuple[float, float] | None:
    """Median run times (original, answer) on ``stdin``, or None when a run fails."""
    before: list[float] = []
    after: list[float] = []
    for _ in range(TIMING_RUNS):
        for program, times in ((original, before), (answer, after)):
            result = run_python(
                program,
                stdin=stdin,
                timeout_s=TIMEOUT_S,
                memory_mb=MEMORY_MB,
                policy=SandboxPolicy(mode),
            )
            if not result.ok or result.cpu_s is None:
                return None
            times.append(result.cpu_s)
    return statistics.median(before), statistics.median(after)


def _speedup(original: str, answer: str, inputs: list[str]) -> tuple[float, float] | None:
    """Summed median times (original, answer) over the test inputs, or None."""
    total_before = total_after = 0.0
    for stdin in inputs:
        timing = _timing(original, answer, stdin, current_mode())
        if timing is None:
            return None
        total_before += timing[0]
        total_after += timing[1]
    return total_before, total_after


def _ratio(before: float, after: float) -> float:
    return round(before / max(after, 1e-9), 3)


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
    timing = _speedup(original, output, inputs)
    if timing is not None:
        metrics["speedup"] = _ratio(*timing)
    return metrics


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """Actions for an empty or unparsable answer, one that behaves differently, one that
    is not faster than the original, and comments about the review."""
    if not output.strip():
        return ["Give the complete program in one ```python block."]
    problem = syntax_problem(output)
    if problem is not None:
        return [f"Fix the syntax error at {problem}."]
    found = comment_commentary(output)
    original = fields.get("input")
    inputs = stdin_cases(fields)
    if not isinstance(original, str) or not inputs:
        return found
    for stdin in inputs:
        same, why = _compare(original, output, stdin)
        if same is False and why is not None:
            return [*found, why]
        if same is None:  # the original does not run: nothing to compare with
            return found
    timing = _speedup(original, output, inputs)
    if timing is not None and timing[0] >= MIN_TIMED_S and _ratio(*timing) < MIN_SPEEDUP:
        found.append(
            f"The program is not faster than the original on the test input (median of "
            f"{TIMING_RUNS} runs: original {timing[0]:.4f} s, this version {timing[1]:.4f} s, "
            f"speedup {_ratio(*timing):.2f}): find a better algorithm or data structure, or "
            "cheaper input reading."
        )
    return found
