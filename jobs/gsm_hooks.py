"""Hooks for the gsm job: run the program-aided answer, compare it with the target.

The answer is a Python program defining ``solution()``; it runs in the sandbox and
its return value is the answer. ``check`` never looks at the target: it reports only
what a program can verify without the reference (it raises, loops, returns no number),
so the loop stays free of oracle feedback.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from pipeline.core.extraction import comment_commentary
from pipeline.core.metrics import MetricSpec
from pipeline.sandbox import SandboxMode, SandboxPolicy, SandboxResult, current_mode, run_python

CALL = "solution()"
TIMEOUT_S = 5.0
MEMORY_MB = 256
REL_TOL = 1e-6
ABS_TOL = 1e-6
_SHOWN_CHARS = 60
_FRACTION_REPR = re.compile(r"^Fraction\((-?\d+),\s*(\d+)\)$")
_DECIMAL_REPR = re.compile(r"^Decimal\('([^']+)'\)$")
_NUMBER_JUNK = re.compile(r"[,\s$€£]")
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?::| \(line|$)")  # "ValueError: ..." vs "killed by ..."
# Every answer is a program, run in the sandbox (a run checks its isolation first).
RUNS_PROGRAMS = True
# ``correct`` reads the target (a label): it measures, and never chooses.
METRICS = {"correct": MetricSpec("label", value_type="boolean")}


@functools.lru_cache(maxsize=512)
def _run_in(program: str, mode: SandboxMode) -> SandboxResult:
    return run_python(
        program, call=CALL, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB, policy=SandboxPolicy(mode)
    )


def _run(program: str) -> SandboxResult:
    # evaluate and check both ask for the same run: do it once (in this run's mode).
    return _run_in(program, current_mode())


def parse_value(value: str | None) -> float | None:
    """The number a sandboxed ``solution()`` returned (JSON or a Fraction/Decimal repr)."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except ValueError:
        m = _FRACTION_REPR.match(value)
        if m:
            return float(Fraction(int(m.group(1)), int(m.group(2))))
        m = _DECIMAL_REPR.match(value)
        return _finite(m.group(1)) if m else None
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        return None
    return _finite(obj)


def parse_target(target: Any) -> float | None:
    """A reference answer as a number: 18, 18.0, "18", "1,200", "$5", "3/4", "... #### 18"."""
    if isinstance(target, bool):
        return None
    if isinstance(target, int | float):
        return _finite(target)
    if not isinstance(target, str):
        return None
    text = target.rsplit("####", 1)[-1]  # GSM8K's own answers end in "#### 18"
    text = _NUMBER_JUNK.sub("", text).removesuffix("%")
    if "/" in text:
        try:
            return float(Fraction(text))
        except (ValueError, ZeroDivisionError):
            return None
    return _finite(text)


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _answer(result: SandboxResult) -> tuple[float | None, str | None]:
    """The answer, or why there is none."""
    if not result.ok:
        return None, result.error or "the program failed"
    number = parse_value(result.value)
    if number is None:
        return None, f"{CALL} returned {_shown(result.value)}, not a number"
    return number, None


def _shown(value: str | None) -> str:
    if value is None:
        return "nothing"
    return value if len(value) <= _SHOWN_CHARS else value[: _SHOWN_CHARS - 3] + "..."


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """``{"answer": "18.0", "correct": True}``, or ``{"error": "..."}`` (with ``correct``
    False when the record has a target)."""
    answer, problem = _answer(_run(output))
    # The answer is kept as text: it is not a metric to average over records.
    metrics: dict[str, Any] = {"error": problem} if problem else {"answer": repr(answer)}
    target = fields.get("target")
    if target is not None:
        expected = parse_target(target)
        if expected is None:
            metrics["target_error"] = f"cannot read target {target!r} as a number"
        else:
            metrics["correct"] = answer is not None and math.isclose(
                answer, expected, rel_tol=REL_TOL, abs_tol=ABS_TOL
            )
    return metrics


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """What is verifiably wrong with the program, as actions; empty when it runs and
    returns a number."""
    result = _run(output)
    if result.timed_out:
        return [
            f"{CALL} did not finish within {TIMEOUT_S:g} seconds: remove the loop that "
            "never ends and compute each step directly."
        ]
    error = result.error or ""
    if "'return' outside function" in error:
        return [f"Put every step inside def solution(): and return the answer from it ({error})."]
    if error.startswith(("SyntaxError", "IndentationError", "TabError")):
        return [f"Fix the syntax error: {error}. Reply with only the code."]
    if "name 'solution' is not defined" in error:
        return ["Define a function solution() that takes no arguments and returns the answer."]
    if _RAISED.match(error):
        return [f"The program raises {error}: fix the step that causes it."]
    if not result.ok:
        return [f"The program failed ({error}): make {CALL} return the answer simply."]
    if parse_value(result.value) is None:
        return [
            f"{CALL} returns {_shown(result.value)}: return the final answer as a number "
            "(an int or a float)."
        ]
    return comment_commentary(output)
