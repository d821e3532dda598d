"""Column types of an exported table: what JSON values a column holds, as one stable type.

Rows are JSON objects whose keys and value types may vary; a Parquet file needs one
type per column, and the same run should always give the same one. Every value has a
type; a column's type is the merge of its values' types, starting from the fixed type
of the outputs.jsonl fields DESIGN.md names, so a run whose scores are all null still
gets a number column. What does not merge into one type is JSON text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

__all__ = ["JSON", "NULL", "OUTPUT_TYPES", "Columns", "merge", "to_cell", "to_column", "type_of"]

NULL = "null"
JSON = "json"  # written as JSON text
SCALARS = ("string", "integer", "number", "boolean")
# The outputs.jsonl fields, in DESIGN.md's order, and the type each always has.
OUTPUT_TYPES: Mapping[str, str] = {
    "id": "string",
    "line": "integer",
    "status": "string",
    "output": "string",
    "iterations": "integer",
    "chosen_iteration": "integer",
    "stop_reason": "string",
    "score": "number",
    "scores": "list<number>",
    "usage": JSON,
    "cost_usd": "number",
    "error": JSON,
}


def type_of(value: Any) -> str:
    """The type of one JSON value: a scalar type, ``list<scalar>``, null or json."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        inner = NULL
        for item in value:
            inner = merge(inner, type_of(item))
        return f"list<{inner}>" if inner == NULL or inner in SCALARS else JSON
    return JSON


def merge(a: str, b: str) -> str:
    """The one type that holds values of types ``a`` and ``b``."""
    if a == b or b == NULL:
        return a
    if a == NULL:
        return b
    if {a, b} == {"integer", "number"}:
        return "number"
    if a.startswith("list<") and b.startswith("list<"):
        inner = merge(a[5:-1], b[5:-1])
        return f"list<{inner}>" if inner != JSON else JSON
    return JSON


class Columns:
    """Column names in order of first appearance, each with the merged type of its values."""

    __slots__ = ("types",)

    def __init__(self, fixed: Mapping[str, str] | None = None) -> None:
        self.types: dict[str, str] = dict(fixed or {})

    def add(self, row: Mapping[str, Any]) -> None:
        """Take the keys and value types of one row into account."""
        types = self.types
        for name, value in row.items():
            type_ = type_of(value)
            old = types.get(name)
            types[name] = type_ if old is None else merge(old, type_)

    def names(self) -> list[str]:
        """The columns, in order."""
        return list(self.types)


def to_column(values: Iterable[Any], type_: str) -> list[Any]:
    """Values fit for a column of ``type_``: JSON text in a json column, floats in a number one."""
    if type_ == JSON:
        return [None if v is None else orjson.dumps(v).decode() for v in values]
    if type_ == "number":
        return [None if v is None else float(v) for v in values]
    if type_ == "list<number>":
        return [None if v is None else [None if x is None else float(x) for x in v] for v in values]
    return list(values)


def to_cell(value: Any) -> str:
    """A value as CSV text: lists and objects as JSON, null as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return orjson.dumps(value).decode()
