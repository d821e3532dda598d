"""What a job declares about its evaluator's metrics: which way is better, what they read, and
what values they take.

A job's hooks module may define ``METRICS``, a mapping of metric name to ``MetricSpec``.
The report counts, per refinement, how many answers a metric says got better or worse,
which needs the better direction (booleans are higher-is-better unless declared); the
docs and the report say, per metric, whether it reads a label (a reference answer: it
measures, and never chooses) or only the answer and the fields the checks see. The
declared ``value_type`` (``boolean``: right or wrong; ``number``) lets ``refine calibrate`` pick
and check its metric before it makes a call; undeclared, it is known once measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "BETTER",
    "SOURCES",
    "VALUE_TYPES",
    "Better",
    "MetricSpec",
    "Source",
    "ValueType",
    "compare",
]

Better = Literal["higher", "lower"]
Source = Literal["label", "check"]
ValueType = Literal["boolean", "number"]
BETTER: Final = ("higher", "lower")
SOURCES: Final = ("label", "check")
VALUE_TYPES: Final = ("boolean", "number")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One evaluator metric: what it reads, which way is better (None: neither), its values."""

    source: Source  # "label": reads a record's label; "check": the answer and shown fields only
    better: Better | None = "higher"
    value_type: ValueType | None = None  # "boolean": right or wrong; None: not declared

    @property
    def right_or_wrong(self) -> bool | None:
        """Whether the metric is right or wrong (a boolean); None when its value type is not
        declared."""
        if self.value_type is None:
            return None
        return self.value_type == "boolean" and self.better == "higher"

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {self.source!r}")
        if self.better is not None and self.better not in BETTER:
            raise ValueError(f"better must be one of {', '.join(BETTER)} or None")
        if self.value_type is not None and self.value_type not in VALUE_TYPES:
            raise ValueError(f"value_type must be one of {', '.join(VALUE_TYPES)} or None")


def compare(before: float, after: float, better: Better) -> int:
    """+1 when ``after`` is better than ``before``, -1 when worse, 0 when equal."""
    if after == before:
        return 0
    up = after > before
    return 1 if up == (better == "higher") else -1
