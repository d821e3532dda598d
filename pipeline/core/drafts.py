"""Which answer each iteration goes on with, read off a record's steps.

An iteration's drafts are its answer calls that stand (not failed, not asked again): one,
the method's own, unless a strategy drafts more. The loop goes on with the draft the
job's checks rank best, the method's own on a tie, so with one draft it is always that.
"""

from __future__ import annotations

from collections.abc import Sequence

from .answer_kinds import AnswerKind
from .steps import Step

__all__ = ["answer_of", "answers", "drafts", "drafts_of", "feedback_on"]


def drafts(steps: Sequence[Step]) -> list[Step]:
    """Every answer that stands, in the order made."""
    return [s for s in steps if s.is_draft]


def drafts_of(steps: Sequence[Step], iteration: int) -> list[Step]:
    """The answers of ``iteration`` that stand, in the order made."""
    return [s for s in steps if s.is_draft and s.iteration == iteration]


def answer_of(answer_kind: AnswerKind, steps: Sequence[Step], iteration: int) -> Step | None:
    """The draft ``iteration`` goes on with: the best ranked, the earliest on a tie."""
    found = drafts_of(steps, iteration)
    return max(found, key=answer_kind.rank) if found else None  # max keeps the first of equals


def answers(answer_kind: AnswerKind, steps: Sequence[Step]) -> list[Step]:
    """Each iteration's answer, in order."""
    out = []
    for iteration in sorted({s.iteration for s in steps if s.is_draft}):
        answer = answer_of(answer_kind, steps, iteration)
        if answer is not None:
            out.append(answer)
    return out


def feedback_on(steps: Sequence[Step], iteration: int) -> Step | None:
    """The feedback on an iteration's answer: the latest, after a repair."""
    return next(
        (s for s in reversed(steps) if s.role == "feedback" and s.iteration == iteration), None
    )
