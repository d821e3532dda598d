"""Exact counts, means and extremes of a stream of values, and a bounded sample of it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["Distribution", "Reservoir"]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Exact count, mean and extremes of a stream of values, plus a bounded sample of it."""

    count: int
    mean: float | None
    min: float | None
    max: float | None
    sample: tuple[float, ...]

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the sample (exact while the stream fit in the sample)."""
        if not self.sample:
            return None
        ordered = sorted(self.sample)
        pos = (len(ordered) - 1) * q
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Reservoir:
    """A uniform sample of at most ``size`` values of a stream (Vitter's algorithm R)."""

    __slots__ = ("count", "items", "max", "min", "rng", "size", "total")

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list[float] = []
        self.count = 0
        self.total = 0.0
        self.min: float | None = None
        self.max: float | None = None
        self.rng = random.Random(0)  # seeded: the same run gives the same report

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        if len(self.items) < self.size:
            self.items.append(value)
            return
        j = self.rng.randrange(self.count)
        if j < self.size:
            self.items[j] = value

    def freeze(self) -> Distribution:
        mean = self.total / self.count if self.count else None
        return Distribution(self.count, mean, self.min, self.max, tuple(self.items))
