"""Hooks for the code-improve job: the answer's code runs its own tests in the sandbox.

An answer is the code plus the tests it carries, kept as one program by the code kit
(``jobs/code``). ``evaluate`` counts the tests that pass; ``check`` turns a syntax error,
missing tests, a failing program or test, and a failing example the request states as
code into a finding for the refinement. The request's prose is read by the model only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.code import CodeWithTests, check_answer, findings, metrics, split
from jobs.code.checks import TESTS_PASSED, TESTS_TOTAL
from pipeline.core.metrics import MetricSpec

KIND = CodeWithTests()
# Every answer is a program, run in the sandbox (a run checks its isolation first).
RUNS_PROGRAMS = True
# The tests are the answer's own, and the examples the request's: no metric reads a label.
METRICS = {
    "parses": MetricSpec("check", value_type="boolean"),
    TESTS_TOTAL: MetricSpec("check", better=None, value_type="number"),
    TESTS_PASSED: MetricSpec("check", value_type="number"),
    "examples_total": MetricSpec("check", better=None, value_type="number"),
    "examples_passed": MetricSpec("check", value_type="number"),
}


def _request(fields: Mapping[str, Any]) -> str:
    return str(fields.get("task") or "")


def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    """``parses``, ``tests_total``, ``tests_passed``, ``tests_failed`` and, where the request
    states examples as code, ``examples_passed`` of ``examples_total``."""
    return metrics(check_answer(_request(fields), output))


def check(fields: Mapping[str, Any], output: str) -> list[str]:
    """Findings: what running the answer's tests and the request's examples showed."""
    return findings(check_answer(_request(fields), output), split(output)[1])
