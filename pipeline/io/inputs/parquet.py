"""Parquet input (the ``parquet`` extra): read in record batches, a row group at a time.

Each row is a record and its 1-based row number is its line. Nested columns (lists,
structs, maps) become JSON values, so a ``concepts`` list column works as it is; values
JSON has no type for become strings (timestamps, dates and times in ISO 8601, decimals
as their digits, binary as UTF-8 text, or base64 when it is not text) and durations
seconds. A row group that cannot be read is reported one errors.jsonl line per row, so
every input row still ends as exactly one line of outputs or errors, and the rest of
the file is read.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InputError
from .rows import Row

__all__ = ["json_value", "open_parquet", "parquet_count", "parquet_identity", "parquet_rows"]

BATCH_ROWS = 1024  # rows converted to Python at a time
READ_BUFFER = 1 << 20  # column data is streamed through this buffer, not loaded whole
_TRAILER = 8  # footer length (4 bytes, little-endian) and the PAR1 signature


def open_parquet(path: Path) -> Any:
    """A ``pyarrow.parquet.ParquetFile``; ConfigError when its footer cannot be read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"{path}: cannot read its Parquet metadata: {_one_line(err)}") from err


def parquet_rows(path: Path) -> Iterator[Row | InputError]:
    """A Row per Parquet row, in order; the rows of an unreadable row group as errors."""
    import pyarrow as pa

    pf = open_parquet(path)
    meta = pf.metadata
    fix = {f.name for f in pf.schema_arrow if not _plain(f.type)}
    first = 1
    for group in range(meta.num_row_groups):
        size = meta.row_group(group).num_rows
        read = 0
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group]):
                for values in batch.to_pylist():
                    for name in fix:
                        values[name] = json_value(values[name])
                    yield Row(first + read, values)
                    read += 1
        except (pa.ArrowException, OSError) as err:
            last = first + size - 1
            reason = f"row group {group} (rows {first}-{last}) cannot be read: {_one_line(err)}"
            for k in range(read, size):
                yield InputError(first + k, reason)
        first += size


def parquet_count(path: Path) -> int:
    """Rows of a Parquet file, from its metadata."""
    return int(open_parquet(path).metadata.num_rows)


def parquet_identity(path: Path, digest: bool = True) -> dict[str, Any]:
    """Size, modification time, footer hash and (with ``digest``) the whole file's SHA-256."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - _TRAILER))
        length = int.from_bytes(fh.read(4), "little")
        fh.seek(max(0, size - _TRAILER - length))
        footer = fh.read(length)
        identity: dict[str, Any] = {
            "format": "parquet",
            "size": size,
            "mtime_ns": path.stat().st_mtime_ns,
            "footer_sha256": hashlib.sha256(footer).hexdigest(),
        }
        if digest:
            fh.seek(0)
            identity["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
    return identity


def _plain(t: Any) -> bool:
    """Whether pyarrow's Python values of type ``t`` are JSON values already."""
    import pyarrow as pa

    types = pa.types
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        return _plain(t.value_type)
    if types.is_struct(t):
        return all(_plain(t.field(i).type) for i in range(t.num_fields))
    if types.is_dictionary(t):
        return _plain(t.value_type)
    return bool(
        types.is_null(t)
        or types.is_boolean(t)
        or types.is_integer(t)
        or types.is_floating(t)
        or types.is_string(t)
        or types.is_large_string(t)
    )


def json_value(value: Any) -> Any:
    """A pyarrow Python value as a JSON value (maps arrive as lists of key-value pairs)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {str(json_value(k)): json_value(v) for k, v in value}
        return [json_value(v) for v in value]
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, tuple):
        return [json_value(v) for v in value]
    return str(value)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())
