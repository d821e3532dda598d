"""Choosing a record's output among its answers.

The default rule (DESIGN.md): the best iteration among those whose checks pass, by the
critic's score where the job scores (the later on a tie), else the latest of them; where
none passes, the latest of the answers the checks rank best (so the output is never one the
checks rank below the first answer). A job's answer kind may offer other rules (``Selection``),
chosen by name with ``[output] select`` or ``--select``; they see every draft. No rule
reads a label: checks and selection rules are given the record's fields less its labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .drafts import answers, drafts, feedback_on
from .jobs import Job
from .steps import Step

__all__ = ["DEFAULT", "Choice", "choose", "default_rule", "score_of", "summed_score"]

DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class Choice:
    """The chosen answer (None: no answer stands), its score, every iteration's score."""

    step: Step | None
    score: float | None
    scores: tuple[float | None, ...]
    by: str = DEFAULT


def score_of(job: Job, feedback: Step | None) -> float | None:
    """The critic's score in a feedback step, or None."""
    if feedback is None or feedback.parsed is None or job.score_field is None:
        return None
    value = feedback.parsed.get(job.score_field)
    return float(value) if isinstance(value, int | float) else None


def summed_score(parsed: Mapping[str, Any], fields: Sequence[str]) -> float | None:
    """The sum of the rating fields, or None when one is missing or not a number."""
    total = 0.0
    for name in fields:
        value = parsed.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        total += value
    return total


def default_rule(job: Job, found: Sequence[Step], scores: Sequence[float | None]) -> int:
    """The index of the chosen answer among ``found`` (one per iteration, in order)."""
    passing = [i for i, a in enumerate(found) if not a.checks]
    if passing:
        scored = [i for i in passing if scores[i] is not None]
        if job.scored and scored:
            return max(reversed(scored), key=lambda i: scores[i] or 0.0)  # the later on a tie
        return passing[-1]
    ranks = [job.answer_kind.rank(a) for a in found]
    best = max(ranks)
    return max(i for i, rank in enumerate(ranks) if rank == best)


def choose(job: Job, steps: Sequence[Step], select: str = DEFAULT) -> Choice:
    """The record's output under the rule ``select``."""
    found = answers(job.answer_kind, steps)
    scores = tuple(score_of(job, feedback_on(steps, a.iteration)) for a in found)
    if not found:
        return Choice(None, None, scores, select)
    if select == DEFAULT:
        pick = default_rule(job, found, scores)
        return Choice(found[pick], scores[pick], scores, select)
    every = drafts(steps)
    by_step = {id(a): s for a, s in zip(found, scores, strict=True)}
    rule = job.answer_kind.selections[select]
    step = every[rule.choose(every, [by_step.get(id(d)) for d in every])]
    return Choice(step, by_step.get(id(step)), scores, select)
