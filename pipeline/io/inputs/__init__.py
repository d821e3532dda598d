"""Input files as they come: JSONL (plain or compressed), CSV and Parquet, streamed as rows."""

from .formats import ACCEPTED, InputFormat, detect
from .identity import fingerprint, fixed_in_place, kept_lines, same_input
from .jsonl import BOM
from .reader import check_input, count_rows, read_rows
from .rows import Row

__all__ = [
    "ACCEPTED",
    "BOM",
    "InputFormat",
    "Row",
    "check_input",
    "count_rows",
    "detect",
    "fingerprint",
    "fixed_in_place",
    "kept_lines",
    "read_rows",
    "same_input",
]
