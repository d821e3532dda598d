"""Arms compared on the same records: which is best, which is detectably worse, which to run.

Each arm is a way to spend on a record (Self-Refine, best-of-n, the first answer alone),
measured by a right-or-wrong metric on the same records, with what it cost per record.

The rule: the **best** arm is the one with the most records right (the cheaper on a tie).
Every other arm is tested against it, paired over the same records (McNemar's exact test,
:mod:`pipeline.report.significance`); it is **detectably worse** when it got fewer right
and the two-sided p-value is below ``alpha``. The **recommendation** is the cheapest arm
that is not detectably worse than the best: a more expensive arm must earn its cost with a
difference the sample can tell from noise. Cheapest means dollars per record where every
arm has a price and some cost anything, else tokens per record (prompt and completion),
then calls. Where a difference is not detectable, the records that would tell one of the
size seen (80% power) are named.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .significance import ALPHA, POWER, mcnemar_exact, mcnemar_sample_size, wilson

__all__ = ["ArmFigures", "Basis", "Paired", "Verdict", "compare", "pair", "reasoning"]


class Basis(enum.StrEnum):
    """What "cheapest" is measured in."""

    DOLLARS = "dollars"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class ArmFigures:
    """One arm on the measured records: right or wrong on each (in one order for every arm),
    and what it spent per record."""

    name: str
    right: tuple[bool, ...]
    calls: float
    tokens: float  # prompt and completion
    dollars: float | None  # None: some call had no price

    @property
    def n(self) -> int:
        """Records measured."""
        return len(self.right)

    @property
    def right_count(self) -> int:
        """Records right."""
        return sum(self.right)

    @property
    def accuracy(self) -> float | None:
        """Share right (None: no record measured)."""
        return self.right_count / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval of the share right."""
        return wilson(self.right_count, self.n)

    def cost(self, basis: Basis) -> tuple[float, float]:
        """What ordering by cost compares: dollars or tokens, then calls."""
        main = self.dollars if basis is Basis.DOLLARS and self.dollars is not None else self.tokens
        return main, self.calls


@dataclass(frozen=True, slots=True)
class Paired:
    """``arm`` against ``against`` on the same records."""

    arm: str
    against: str
    n: int
    wins: int  # records ``arm`` got right and ``against`` wrong
    losses: int  # records ``arm`` got wrong and ``against`` right
    p_value: float  # McNemar's exact two-sided test
    needed: int | None  # records that would tell a difference of this size (None: none seen)
    alpha: float = ALPHA

    @property
    def detectable(self) -> bool:
        """Whether the difference is detectable on this sample."""
        return self.wins != self.losses and self.p_value < self.alpha

    @property
    def worse(self) -> bool:
        """Whether ``arm`` is detectably worse than ``against``."""
        return self.losses > self.wins and self.detectable


@dataclass(frozen=True, slots=True)
class Verdict:
    """The comparison: the best arm, each other arm against it, and the one to run."""

    best: str
    recommended: str
    basis: Basis
    against_best: tuple[Paired, ...]  # every other arm against the best, in the arms' order

    @property
    def detected(self) -> tuple[str, ...]:
        """Arms detectably worse than the best."""
        return tuple(p.arm for p in self.against_best if p.worse)


def pair(
    arm: ArmFigures, against: ArmFigures, *, alpha: float = ALPHA, power: float = POWER
) -> Paired:
    """McNemar's exact test of ``arm`` against ``against``, and the records that would tell."""
    if arm.n != against.n:
        raise ValueError(f"{arm.name} measured {arm.n} records, {against.name} {against.n}")
    wins = sum(a and not b for a, b in zip(arm.right, against.right, strict=True))
    losses = sum(b and not a for a, b in zip(arm.right, against.right, strict=True))
    needed = mcnemar_sample_size(wins, losses, arm.n, alpha=alpha, power=power) if arm.n else None
    return Paired(
        arm.name, against.name, arm.n, wins, losses, mcnemar_exact(wins, losses), needed, alpha
    )


def _basis(arms: Sequence[ArmFigures]) -> Basis:
    priced = all(a.dollars is not None for a in arms)
    return Basis.DOLLARS if priced and any(a.dollars for a in arms) else Basis.TOKENS


def compare(arms: Sequence[ArmFigures], *, alpha: float = ALPHA, power: float = POWER) -> Verdict:
    """The best arm, the others tested against it, and the cheapest not detectably worse.

    Ties keep the earlier arm in ``arms``.
    """
    if not arms:
        raise ValueError("no arm to compare")
    basis = _basis(arms)
    top = max(a.right_count for a in arms)
    best = min((a for a in arms if a.right_count == top), key=lambda a: a.cost(basis))
    pairs = tuple(pair(a, best, alpha=alpha, power=power) for a in arms if a is not best)
    worse = {p.arm for p in pairs if p.worse}
    candidates = [a for a in arms if a.name not in worse]
    recommended = min(candidates, key=lambda a: a.cost(basis))
    return Verdict(best.name, recommended.name, basis, pairs)


def _share(arm: ArmFigures) -> str:
    return f"{arm.right_count}/{arm.n}"


def _test(p: Paired) -> str:
    return (
        f"{p.arm} was right on {p.wins} record(s) {p.against} got wrong and wrong on "
        f"{p.losses} it got right: McNemar exact p = {p.p_value:.3g}"
    )


def _would_tell(p: Paired) -> str:
    if p.needed is None:
        return f"no difference between {p.arm} and {p.against} was seen on {p.n} records"
    return (
        f"a difference of this size ({abs(p.wins - p.losses)} of {p.n} records) needs about "
        f"{p.needed:,} records to be detected 4 times in 5: --sample {p.needed}"
    )


def reasoning(verdict: Verdict, arms: Sequence[ArmFigures]) -> tuple[str, ...]:
    """The lines saying why the recommendation is what it is."""
    by_name = {a.name: a for a in arms}
    best, chosen = by_name[verdict.best], by_name[verdict.recommended]
    lines = [f"best: {best.name}, {_share(best)} right"]
    for p in verdict.against_best:
        lines.append(f"{_test(p)}: {'detectably' if p.worse else 'not detectably'} worse")
    undetected = [p for p in verdict.against_best if not p.detectable]
    cost = "dollars" if verdict.basis is Basis.DOLLARS else "tokens"
    tell: Paired | None = None
    if not verdict.against_best:
        lines.append(f"so recommend {best.name}: the only arm measured, compared with none")
    elif chosen is not best:
        tell = next(p for p in verdict.against_best if p.arm == chosen.name)
        lines.append(
            f"so recommend {chosen.name}: the cheapest arm ({cost} per record) not detectably "
            f"worse than {best.name}"
        )
    elif undetected:
        tell = min(undetected, key=lambda p: p.needed or float("inf"))
        lines.append(
            f"so recommend {best.name}: the best seen and the cheapest of the arms not "
            f"detectably worse ({cost} per record)"
        )
    else:
        lines.append(f"so recommend {best.name}: every other arm is detectably worse")
    if undetected and len(undetected) == len(verdict.against_best):
        lines.append(
            f"nothing is detectable on {best.n} records: the choice is by cost, not by accuracy"
        )
    if tell is not None:
        lines.append(_would_tell(tell))
    return tuple(lines)
