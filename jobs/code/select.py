"""The opt-in selection rule ``pooled``: the draft passing most of the tests all drafts wrote.

Off by default (``[output] select = "pooled"`` or ``--select pooled`` turns it on). After
each draft, ``measure`` pools every test any draft so far carries (once each, oldest first)
and runs each draft's code on them: how many it passes, and how its results on the calls
those tests make agree with the other drafts' (programs written apart that agree are
likelier right than one alone; a copy counts once). ``choose`` then applies a chain of
named filters, each keeping the drafts that do best on one thing; the first draft left
wins. A filter chain is a plain list: pass a shorter one to see what each filter adds.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs.code.program import normalized, pooled_tests, split
from pipeline.core.pyast import parsed
from pipeline.core.steps import Step
from pipeline.sandbox import run_calls, run_tests, syntax_problem

__all__ = ["FILTERS", "NAME", "Pooled", "calls_tested", "measure_pool"]

NAME = "pooled"
Filter = Callable[[Sequence[int], "Evidence"], list[int]]


@dataclass(frozen=True, slots=True)
class Evidence:
    """What ``measure`` recorded, one entry per draft, and the critic's scores."""

    passed: Sequence[int]
    agreement: Sequence[float]
    scores: Sequence[float | None]


def calls_tested(tests: Sequence[str]) -> list[str]:
    """The calls the tests check: the left side of each ``assert CALL == ...``, once each."""
    calls: dict[str, None] = {}
    for unit in tests:
        tree = parsed(unit)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                left = node.test.left
                if isinstance(left, ast.Call):
                    calls.setdefault(ast.unparse(left))
    return list(calls)


def measure_pool(outputs: Sequence[str]) -> dict[str, Any]:
    """``{"total": pooled tests, "passed": [per draft], "agreement": [per draft]}``."""
    pool = pooled_tests(outputs)
    calls = calls_tested(pool)
    codes = [split(output)[0] for output in outputs]
    passed: list[int] = []
    results: list[tuple[str, ...] | None] = []
    for code in codes:
        if not code.strip() or syntax_problem(code) is not None:
            passed.append(0)
            results.append(None)
            continue
        run = run_tests(code, pool) if pool else None
        passed.append(0 if run is None or run.error is not None else run.passed)
        results.append(run_calls(code, calls))
    return {
        "total": len(pool),
        "passed": passed,
        "agreement": _agreement(results, [normalized(c) for c in codes]),
    }


def _agreement(results: Sequence[Sequence[str] | None], programs: Sequence[str]) -> list[float]:
    """For each program, the sum over the other distinct programs of the share of the calls
    on which both gave the same result (0 where its calls did not run)."""
    first: dict[str, Sequence[str]] = {}
    for program, given in zip(programs, results, strict=True):
        if given is not None:
            first.setdefault(program, given)
    out = []
    for program, mine in zip(programs, results, strict=True):
        total = 0.0
        for other, theirs in first.items():
            if mine is not None and other != program and mine:
                total += sum(a == b for a, b in zip(mine, theirs, strict=False)) / len(mine)
        out.append(round(total, 6))
    return out


def most_passed(kept: Sequence[int], evidence: Evidence) -> list[int]:
    """The drafts passing the most pooled tests."""
    best = max(evidence.passed[i] for i in kept)
    return [i for i in kept if evidence.passed[i] == best]


def most_agreed(kept: Sequence[int], evidence: Evidence) -> list[int]:
    """The drafts the other drafts agree with most on the calls the tests make."""
    best = max(evidence.agreement[i] for i in kept)
    return [i for i in kept if evidence.agreement[i] == best]


def best_scored(kept: Sequence[int], evidence: Evidence) -> list[int]:
    """The drafts the critic scored best (all of them where none was scored)."""
    scored = [i for i in kept if evidence.scores[i] is not None]
    if not scored:
        return list(kept)
    best = max(evidence.scores[i] or 0.0 for i in scored)
    return [i for i in scored if evidence.scores[i] == best]


def latest(kept: Sequence[int], evidence: Evidence) -> list[int]:
    """The latest draft."""
    return [max(kept)]


FILTERS: tuple[Filter, ...] = (most_passed, most_agreed, best_scored, latest)


@dataclass(frozen=True, slots=True)
class Pooled:
    """The selection rule: measure the pool after each draft, choose by ``filters``."""

    filters: tuple[Filter, ...] = field(default=FILTERS)
    name: str = NAME

    def measure(self, fields: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
        """See ``pipeline.core.answer_kinds.Selection``."""
        return measure_pool(outputs)

    def choose(self, drafts: Sequence[Step], scores: Sequence[float | None]) -> int:
        """See ``pipeline.core.answer_kinds.Selection``."""
        pool = (drafts[-1].metrics or {}).get(self.name) if drafts else None
        n = len(drafts)
        passed = pool.get("passed") if isinstance(pool, dict) else None
        agreement = pool.get("agreement") if isinstance(pool, dict) else None
        if not (isinstance(passed, list) and isinstance(agreement, list)) or len(passed) != n:
            passed, agreement = [0] * n, [0.0] * n  # not measured: the later filters decide
        kept: list[int] = list(range(n))
        evidence = Evidence(passed, agreement, scores)
        for step in self.filters:
            kept = step(kept, evidence) or kept
        return kept[0]
