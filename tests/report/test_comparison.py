"""The comparison of arms: the best, the detectably worse, the cheapest not detectably worse."""

from __future__ import annotations

import pytest

from pipeline.report.comparison import ArmFigures, Basis, compare, pair, reasoning


def arm(
    name: str,
    pattern: str,
    *,
    calls: float = 5.0,
    tokens: float = 1000.0,
    dollars: float | None = None,
) -> ArmFigures:
    """An arm right where ``pattern`` has a 1, wrong where it has a 0."""
    return ArmFigures(name, tuple(ch == "1" for ch in pattern), calls, tokens, dollars)


# 40 records: refine right on 30, first on 16 (14 refine alone, 0 first alone).
REFINE = "1" * 30 + "0" * 10
FIRST = "1" * 16 + "0" * 24


def test_a_detectably_better_arm_is_recommended_though_it_costs_more() -> None:
    """Refine, right on 14 records the others got wrong and wrong on none they got right,
    is recommended over cheaper arms that are detectably worse."""
    arms = [
        arm("refine", REFINE, tokens=3000),
        arm("best-of-n", FIRST, tokens=1500),
        arm("first", FIRST, calls=1, tokens=300),
    ]
    verdict = compare(arms)
    assert (verdict.best, verdict.recommended) == ("refine", "refine")
    assert verdict.detected == ("best-of-n", "first")
    (_, first) = verdict.against_best
    assert (first.wins, first.losses, first.n) == (0, 14, 40)
    assert first.p_value == pytest.approx(2 / 2**14) and first.worse
    lines = reasoning(verdict, arms)
    assert lines[-1] == "so recommend refine: every other arm is detectably worse"


def test_the_cheapest_arm_not_detectably_worse_wins_when_the_gap_is_noise() -> None:
    """Refine right on 3 more of 40 (4 against 7 discordant): not detectable, so the
    cheaper first answer is recommended, and the records that would tell are named."""
    refine = "1" * 24 + "0" * 16
    first = "1" * 17 + "0" * 7 + "1" * 4 + "0" * 12
    arms = [arm("refine", refine, tokens=3000), arm("first", first, calls=1, tokens=300)]
    verdict = compare(arms)
    assert (verdict.best, verdict.recommended, verdict.detected) == ("refine", "first", ())
    (p,) = verdict.against_best
    assert (p.wins, p.losses, p.needed) == (4, 7, 382)
    lines = reasoning(verdict, arms)
    assert "nothing is detectable on 40 records" in lines[-2]
    assert lines[-1].endswith("--sample 382")


def test_cost_is_in_dollars_where_every_arm_is_priced_else_tokens() -> None:
    """Dollars decide where every arm has a price; a free or unpriced arm makes it tokens."""
    same = "1" * 20 + "0" * 20
    priced = [
        arm("refine", same, tokens=3000, dollars=0.001),
        arm("best-of-n", same, tokens=1000, dollars=0.002),  # cached prompts make refine cheap
    ]
    assert compare(priced).basis is Basis.DOLLARS
    assert compare(priced).recommended == "refine"
    free = [arm(a.name, same, tokens=a.tokens, dollars=0.0) for a in priced]
    assert compare(free).basis is Basis.TOKENS and compare(free).recommended == "best-of-n"
    unpriced = [priced[0], arm("best-of-n", same, tokens=1000)]
    assert compare(unpriced).basis is Basis.TOKENS


def test_equal_accuracy_makes_the_cheaper_arm_the_best() -> None:
    """On a tie in records right the cheaper arm is the best; calls break a tie in tokens."""
    same = "1" * 10 + "0" * 10
    verdict = compare([arm("refine", same, tokens=900), arm("first", same, tokens=300)])
    assert (verdict.best, verdict.recommended) == ("first", "first")
    tied = compare([arm("a", same, calls=3), arm("b", same, calls=2)])
    assert tied.best == "b"
    lines = reasoning(verdict, [arm("refine", same, tokens=900), arm("first", same, tokens=300)])
    assert lines[-1] == "no difference between refine and first was seen on 20 records"


def test_arms_measured_on_different_records_are_not_paired() -> None:
    """A pair needs the same records: different counts are an error, not a silent result."""
    with pytest.raises(ValueError, match="measured"):
        pair(arm("a", "110"), arm("b", "11"))
    with pytest.raises(ValueError, match="no arm"):
        compare([])
