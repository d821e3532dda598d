"""A record: one input line made into the fields a job reads, with its id and line number."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Record", "record_id"]


@dataclass(frozen=True, slots=True)
class Record:
    """One input record: its id, 1-based input line and fields."""

    id: str
    line: int
    fields: dict[str, Any]


def record_id(obj: dict[str, Any], id_field: str) -> str:
    """The id field's value when present, else a stable hash of the canonical JSON."""
    value = obj.get(id_field)
    if value is None:
        canonical = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
        return "h" + hashlib.sha256(canonical).hexdigest()[:16]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"expected string or integer, got {type(value).__name__}")
    return str(value)
