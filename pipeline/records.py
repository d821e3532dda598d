"""Reading input: a JSONL file streamed into records, bad lines into errors.

Memory stays bounded whatever the file size: lines are read one at a time, and
the only state kept per record is an 8-byte digest of its id (to report
duplicates with the line where the id first appeared).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import InputError
from .jobs import InputField

__all__ = ["Record", "count_lines", "fingerprint", "read_records", "record_id"]

_BOM = b"\xef\xbb\xbf"
_FINGERPRINT_BYTES = 1 << 20
RAW_BYTES = 800  # of a broken line, kept for the error report


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


def parse_line(raw: bytes, line: int, inputs: Sequence[InputField], id_field: str) -> Record:
    """Turn one raw input line into a record, or raise InputError saying why."""
    if line == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM) :]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(line, f"invalid UTF-8 at byte {err.start}") from err
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise InputError(line, f"invalid JSON: {err}") from err
    if not isinstance(obj, dict):
        raise InputError(line, f"expected a JSON object, got {_json_type(obj)}")
    for f in inputs:
        if f.name not in obj or obj[f.name] is None:
            if f.required:
                raise InputError(line, "missing required field", f.name)
            continue
        problem = f.check(obj[f.name])
        if problem:
            raise InputError(line, problem, f.name)
    try:
        rid = record_id(obj, id_field)
    except TypeError as err:
        raise InputError(line, str(err), id_field) from err
    return Record(rid, line, obj)


def read_records(
    path: Path, inputs: Sequence[InputField], id_field: str
) -> Iterator[Record | InputError]:
    """Yield a Record or an InputError for every non-blank line, in order.

    Blank lines (whitespace only) are skipped: they are not records. Duplicate ids
    after the first are yielded as InputErrors naming the first line.
    """
    seen: dict[bytes, int] = {}
    with path.open("rb") as fh:
        for line, raw in enumerate(fh, start=1):
            raw = raw.rstrip(b"\r\n")
            if line == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            if not raw.strip():
                continue
            try:
                rec = parse_line(raw, line, inputs, id_field)
            except InputError as err:
                err.raw = raw[:RAW_BYTES].decode("utf-8", "replace")
                yield err
                continue
            key = hashlib.blake2b(rec.id.encode(), digest_size=8).digest()
            first = seen.setdefault(key, line)
            if first != line:
                dup = InputError(line, f"duplicate id {rec.id!r} (first on line {first})", id_field)
                dup.raw = raw[:RAW_BYTES].decode("utf-8", "replace")
                yield dup
                continue
            yield rec


def count_lines(path: Path) -> int:
    """Non-blank lines of an input file: the records it holds, bad lines included."""
    with path.open("rb") as fh:
        return sum(1 for raw in fh if raw.strip())


def fingerprint(path: Path) -> dict[str, Any]:
    """Identify an input by its first MiB, so appending records keeps its identity."""
    with path.open("rb") as fh:
        head = fh.read(_FINGERPRINT_BYTES)
    return {"head_bytes": len(head), "head_sha256": hashlib.sha256(head).hexdigest()}


def same_input(path: Path, recorded: dict[str, Any]) -> bool:
    """Whether ``path`` is the recorded input, possibly with records appended."""
    n = int(recorded["head_bytes"])
    with path.open("rb") as fh:
        head = fh.read(n)
    return len(head) == n and hashlib.sha256(head).hexdigest() == recorded["head_sha256"]


def _json_type(obj: Any) -> str:
    if obj is None:
        return "null"
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(obj), type(obj).__name__
    )
