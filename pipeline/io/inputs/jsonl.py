"""JSONL input: one JSON object per line, plain or compressed."""

from __future__ import annotations

import io
from collections.abc import Iterator

from ...errors import InputError
from .rows import Row
from .streams import DECOMPRESSION_ERRORS

__all__ = ["BOM", "jsonl_rows"]

BOM = b"\xef\xbb\xbf"


def jsonl_rows(stream: io.BufferedIOBase) -> Iterator[Row | InputError]:
    """A Row per non-blank line, numbered by physical line; a cut stream ends with an error.

    A compressed stream that breaks off (truncated, damaged) cannot be read past that
    point: the line after the last whole one is reported with the reason, and the
    reading stops there.
    """
    line = 0
    lines = iter(stream)
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except DECOMPRESSION_ERRORS as err:
            yield InputError(line + 1, f"the rest of the file cannot be read: {err}")
            return
        line += 1
        raw = raw.rstrip(b"\r\n")
        if line == 1 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        if raw.strip():
            yield Row(line, raw)
