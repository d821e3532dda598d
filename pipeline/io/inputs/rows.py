"""The unit every format reader yields: one numbered row of an input, before it is a record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Row"]


@dataclass(frozen=True, slots=True)
class Row:
    """One input row: its 1-based line (JSONL) or row number (CSV, Parquet) and its content.

    ``data`` is a JSONL line's bytes, still to be parsed, or a CSV or Parquet row's
    values by column, already JSON values.
    """

    line: int
    data: bytes | dict[str, Any]
