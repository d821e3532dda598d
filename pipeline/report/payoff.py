"""Does a round of refinement pay? Correction and introduction rates, and the rule over them.

For a metric that is right or wrong (a boolean), a refinement round t moves each answer
from its state at t-1: ``fixed`` counts wrong -> right, ``broken`` right -> wrong, over the
``n`` records with the metric at both. Then

    correction    c = P(right at t | wrong at t-1) = fixed / (n - right_before)
    introduction  i = P(wrong at t | right at t-1) = broken / right_before
    accuracy      A = right_before / n  (at t-1, over the same records)

and the round pays while ``c / i > A / (1 - A)`` (arXiv 2604.22273): what it corrects,
relative to what it breaks, must outweigh the odds that an answer was right already.
Multiplying out, that is ``fixed > broken``, which also settles the edges: with no
introduction (i = 0) a round pays when it corrects anything; with every answer right
(A = 1) there is nothing to correct and it never pays; with none right (A = 0) it pays
when it corrects anything; a round that measured no record does not pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Rates", "describe", "reasoning", "recommend"]


@dataclass(frozen=True, slots=True)
class Rates:
    """How a round (or the choice of output) moved a right-or-wrong metric."""

    n: int  # records with the metric both before and after
    right_before: int
    fixed: int  # wrong before, right after
    broken: int  # right before, wrong after

    @property
    def wrong_before(self) -> int:
        """Records wrong before."""
        return self.n - self.right_before

    @property
    def right_after(self) -> int:
        """Records right after."""
        return self.right_before - self.broken + self.fixed

    @property
    def correction(self) -> float | None:
        """P(right after | wrong before); None when none was wrong."""
        return self.fixed / self.wrong_before if self.wrong_before else None

    @property
    def introduction(self) -> float | None:
        """P(wrong after | right before); None when none was right."""
        return self.broken / self.right_before if self.right_before else None

    @property
    def accuracy_before(self) -> float | None:
        """Share right before (None: no record)."""
        return self.right_before / self.n if self.n else None

    @property
    def accuracy_after(self) -> float | None:
        """Share right after (None: no record)."""
        return self.right_after / self.n if self.n else None

    @property
    def ratio(self) -> float | None:
        """c / i: infinite when nothing was broken and something corrected; None undefined."""
        c, i = self.correction, self.introduction
        if c is None or i is None:
            return None
        if i == 0:
            return float("inf") if c > 0 else None
        return c / i

    @property
    def threshold(self) -> float | None:
        """A / (1 - A) at the accuracy before; None when every answer was right (infinite)."""
        a = self.accuracy_before
        if a is None or a >= 1:
            return None
        return a / (1 - a)

    @property
    def pays(self) -> bool:
        """Whether ``c / i > A / (1 - A)``: exactly, ``fixed > broken`` (see the module)."""
        return self.n > 0 and self.fixed > self.broken


def recommend(rounds: Sequence[Rates]) -> int:
    """The number of leading rounds that pay (0: do not refine)."""
    count = 0
    for rates in rounds:
        if not rates.pays:
            break
        count += 1
    return count


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None) -> str:
    if value is None:
        return "undefined"
    return "∞" if value == float("inf") else f"{value:.2f}"


def describe(t: int, r: Rates) -> str:
    """One round's case: its rates, against the rule's threshold."""
    if not r.n:
        return f"round {t} measured no record"
    head = (
        f"round {t} corrects {_percent(r.correction)} of wrong answers ({r.fixed}/"
        f"{r.wrong_before}) and breaks {_percent(r.introduction)} of right ones ({r.broken}/"
        f"{r.right_before})"
    )
    if r.threshold is None:
        return f"{head}; every answer was right before it, so there is nothing to correct"
    sign = ">" if r.pays else "≤"
    return (
        f"{head}: c/i = {_number(r.ratio)} {sign} Acc/(1-Acc) = {_number(r.threshold)} at "
        f"accuracy {_percent(r.accuracy_before)}"
    )


def reasoning(rounds: Sequence[Rates]) -> tuple[str, str]:
    """Two lines saying why ``recommend(rounds)`` is what it is."""
    k = recommend(rounds)
    if not rounds:
        return ("no refinement round was measured", "recommend 0: generation only")
    if k == 0:
        return (
            describe(1, rounds[0]),
            "so refining does not pay here: recommend 0 (--max-iters 0)",
        )
    last = describe(k, rounds[k - 1])
    if k == len(rounds):
        return (
            last,
            f"every measured round pays: recommend {k}, the most measured "
            "(calibrate with a larger --max-iters to see whether more pays)",
        )
    return (last, describe(k + 1, rounds[k]) + f": recommend {k}")
