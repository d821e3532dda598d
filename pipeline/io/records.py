"""Reading input: an input file streamed into records, bad lines into errors.

The formats (JSONL plain or compressed, CSV, Parquet) are ``pipeline.io.inputs``; here
their rows become records: fields checked against the job, ids given, duplicates
reported. Memory stays bounded whatever the file size: rows are read a batch at a
time, and the only state kept per record is an 8-byte digest of its id (to report
duplicates with the line where the id first appeared).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..core.jobs import InputField
from ..core.records import Record, record_id
from ..errors import InputError
from .inputs import (
    BOM,
    Row,
    count_rows,
    fingerprint,
    fixed_in_place,
    kept_lines,
    read_rows,
    same_input,
)

__all__ = [
    "count_lines",
    "count_records",
    "fingerprint",
    "fixed_in_place",
    "kept_lines",
    "read_records",
    "same_input",
    "to_record",
]

RAW_BYTES = 800  # of a broken line, kept for the error report


def parse_line(raw: bytes, line: int, inputs: Sequence[InputField], id_field: str) -> Record:
    """Turn one raw input line into a record, or raise InputError saying why."""
    if line == 1 and raw.startswith(BOM):
        raw = raw[len(BOM) :]
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
    return to_record(obj, line, inputs, id_field)


def to_record(
    obj: dict[str, Any], line: int, inputs: Sequence[InputField], id_field: str
) -> Record:
    """Check a row's values against the job's fields and give it its id; InputError if not."""
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
    """Yield a Record or an InputError for every non-blank line or row, in order.

    Blank lines (whitespace only) are skipped: they are not records. Duplicate ids
    after the first are yielded as InputErrors naming the first line.
    """
    seen: dict[bytes, int] = {}
    for row in read_rows(path, inputs):
        if isinstance(row, InputError):
            yield row
            continue
        try:
            if isinstance(row.data, bytes):
                rec = parse_line(row.data, row.line, inputs, id_field)
            else:
                rec = to_record(row.data, row.line, inputs, id_field)
        except InputError as err:
            err.raw = _raw(row)
            yield err
            continue
        key = hashlib.blake2b(rec.id.encode(), digest_size=8).digest()
        first = seen.setdefault(key, rec.line)
        if first != rec.line:
            dup = InputError(rec.line, f"duplicate id {rec.id!r} (first on line {first})", id_field)
            dup.raw = _raw(row)
            yield dup
            continue
        yield rec


def count_records(path: Path, tick: Callable[[], None] | None = None) -> int:
    """Records an input holds, bad lines included (what ``read_records`` yields)."""
    return count_rows(path, tick)


def count_lines(path: Path) -> int:
    """Non-blank lines of a plain JSONL file (such as errors.jsonl)."""
    with path.open("rb") as fh:
        return sum(1 for raw in fh if raw.strip())


def _raw(row: Row) -> str:
    """The start of a row, for the error report."""
    data = row.data if isinstance(row.data, bytes) else orjson.dumps(row.data, default=str)
    return data[:RAW_BYTES].decode("utf-8", "replace")


def _json_type(obj: Any) -> str:
    if obj is None:
        return "null"
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(obj), type(obj).__name__
    )
