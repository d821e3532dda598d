"""Intervals, McNemar's exact test and its sample size, against values computed elsewhere.

The expected values were computed with statsmodels' ``proportion_confint(method="wilson")``,
scipy's ``binomtest`` / ``binom.cdf`` and statsmodels' ``mcnemar(exact=True)`` (in a
separate environment: neither is a dependency), and the sample sizes by hand from Connor's
formula; a simulation of McNemar's exact test at those sizes rejects about 78% of the time.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipeline.report.significance import (
    Z95,
    binomial_tail,
    mcnemar_exact,
    mcnemar_sample_size,
    wilson,
)


@pytest.mark.parametrize(
    ("right", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.27753279986288926),
        (10, 10, 0.7224672001371106, 1.0),
        (5, 10, 0.23659309051256394, 0.7634069094874361),
        (1, 20, 0.008881448800795402, 0.2361311934467421),
        (28, 40, 0.5456998118185505, 0.8192515477025348),
        (15, 40, 0.2422297916723327, 0.529675608626989),
        (31, 50, 0.48150446930992963, 0.741372106898064),
        (0, 1, 0.0, 0.7934506856227627),
        (1, 1, 0.2065493143772374, 1.0),
        (9, 16, 0.331785563988119, 0.7690134759450765),
    ],
)
def test_wilson_interval_matches_statsmodels(right: int, n: int, low: float, high: float) -> None:
    """The 95% Wilson interval equals statsmodels' to the last bits, exact at 0 and n right."""
    got = wilson(right, n)
    assert got == pytest.approx((low, high), abs=1e-12)
    assert (right == 0) <= (got[0] == 0.0) and (right == n) <= (got[1] == 1.0)


def test_wilson_interval_of_no_record_is_everything() -> None:
    """Nothing measured says nothing: the interval is [0, 1]; a count above n is an error."""
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="within"):
        wilson(3, 2)
    assert abs(Z95 - 1.959963984540054) < 1e-15


@pytest.mark.parametrize(
    ("k", "m", "tail"),
    [
        (0, 1, Fraction(1, 2)),
        (1, 15, Fraction(16, 2**15)),
        (3, 10, Fraction(176, 1024)),
        (7, 20, Fraction(137980, 2**20)),
        (12, 25, Fraction(1, 2)),
        (-1, 4, Fraction(0)),
        (4, 4, Fraction(1)),
    ],
)
def test_binomial_tail_is_exact(k: int, m: int, tail: Fraction) -> None:
    """P(X <= k) for Binomial(m, 1/2) is the exact fraction (scipy's binom.cdf agrees)."""
    assert binomial_tail(k, m) == tail


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 0, 1.0),
        (1, 0, 1.0),
        (0, 5, 0.0625),
        (6, 0, 0.03125),
        (1, 14, 0.0009765625),
        (4, 7, 0.548828125),
        (2, 9, 0.0654296875),
        (3, 3, 1.0),
        (10, 20, 0.09873714670538905),
        (25, 40, 0.08168153394154003),
    ],
)
def test_mcnemar_exact_matches_scipy(b: int, c: int, p: float) -> None:
    """The exact two-sided p-value equals scipy's binomtest on the discordant records."""
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(c, b) == mcnemar_exact(b, c)


@pytest.mark.parametrize(
    ("b", "c", "n", "needed"),
    [
        (4, 7, 40, 382),
        (2, 9, 16, 26),
        (1, 3, 50, 391),
        (10, 20, 100, 234),
        (5, 15, 60, 92),
        (7, 4, 40, 382),
        (3, 3, 40, None),
        (0, 0, 40, None),
    ],
)
def test_mcnemar_sample_size_follows_connors_formula(
    b: int, c: int, n: int, needed: int | None
) -> None:
    """Records that detect the observed difference at 5% with 80% power; None without one."""
    assert mcnemar_sample_size(b, c, n) == needed


def test_a_smaller_difference_needs_more_records() -> None:
    """Halving the difference in discordant records (same discordance) needs more records."""
    wide = mcnemar_sample_size(2, 10, 100)
    narrow = mcnemar_sample_size(4, 8, 100)
    assert wide is not None and narrow is not None and narrow > 2 * wide
    with pytest.raises(ValueError):
        mcnemar_sample_size(30, 30, 40)
