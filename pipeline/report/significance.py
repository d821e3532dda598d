"""How sure a comparison on a sample is: intervals, an exact paired test, the records that tell.

For right-or-wrong answers on the same records under two arms, only the records where the
arms disagree carry information about which is better (McNemar): ``b`` where the first is
right and the second wrong, ``c`` the other way round. Under "no difference" each of the
``b + c`` discordant records is equally likely to fall either way, so ``b`` is
Binomial(b + c, 1/2), and the exact two-sided p-value is twice the smaller tail, capped at 1.
Every probability is computed from exact integer binomial coefficients (no approximation, no
library), so the tables in the tests hold to the last digit.

The sample that would tell (Connor, 1987, the usual power formula for McNemar's test): with
the discordant shares ``p10 = b/n`` and ``p01 = c/n`` observed on ``n`` records, a
difference ``d = p10 - p01`` and a discordant share ``psi = p10 + p01``,

    n* = (z_{1-alpha/2} sqrt(psi) + z_{power} sqrt(psi - d^2))^2 / d^2

records detect a difference of that size at two-sided level ``alpha`` with the given power.
It rests on the observed shares, which are themselves noisy on a small sample: it says
roughly how many records would tell, not exactly.
"""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist
from typing import Final

__all__ = [
    "ALPHA",
    "POWER",
    "Z95",
    "binomial_tail",
    "mcnemar_exact",
    "mcnemar_sample_size",
    "wilson",
]

ALPHA: Final = 0.05  # two-sided level of every test here
POWER: Final = 0.8  # the power a sample size is computed for
Z95: Final = NormalDist().inv_cdf(0.975)  # 1.959963984540054


def wilson(right: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of the share ``right / n`` (95% by default).

    Unlike the textbook share +/- z standard errors it stays inside [0, 1] and does not
    collapse to a point at 0 or n right, which matters on samples of tens of records.
    """
    if not 0 <= right <= n:
        raise ValueError(f"right must be within [0, n], not {right} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = right / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if right == 0 else max(0.0, centre - half)  # exact at the edges, no rounding
    high = 1.0 if right == n else min(1.0, centre + half)
    return low, high


def binomial_tail(k: int, m: int) -> Fraction:
    """P(X <= k) for X ~ Binomial(m, 1/2), exactly."""
    if m < 0:
        raise ValueError(f"m must not be negative, not {m}")
    if k < 0:
        return Fraction(0)
    if k >= m:
        return Fraction(1)
    return Fraction(sum(math.comb(m, i) for i in range(k + 1)), 2**m)


def mcnemar_exact(b: int, c: int) -> float:
    """The exact two-sided p-value of McNemar's test on ``b`` and ``c`` discordant records."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must not be negative, not {b} and {c}")
    m = b + c
    if m == 0:
        return 1.0
    return float(min(Fraction(1), 2 * binomial_tail(min(b, c), m)))


def mcnemar_sample_size(
    b: int, c: int, n: int, *, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """Records needed to detect the difference ``b`` vs ``c`` seen on ``n`` records.

    None when there is no difference to detect (``b == c``, including no discordant record).
    """
    if n < 1 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"need 0 <= b + c <= n and n >= 1, not b={b}, c={c}, n={n}")
    if b == c:
        return None
    p10, p01 = b / n, c / n
    psi, d = p10 + p01, p10 - p01
    normal = NormalDist()
    z_alpha, z_power = normal.inv_cdf(1 - alpha / 2), normal.inv_cdf(power)
    root = z_alpha * math.sqrt(psi) + z_power * math.sqrt(max(0.0, psi - d * d))
    return math.ceil(root * root / (d * d))
