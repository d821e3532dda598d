"""CSV input: a header row, then one record per row; cells are strings unless a job says.

A job field's type decides how its cell is read: ``string-list`` from a JSON list in
the cell (``["dog", "frisbee"]``), ``number``/``integer``/``boolean`` parsed, ``any``
parsed when the cell holds a JSON array or object. Other columns stay strings. An
empty cell is a missing value. Rows are numbered from 1 after the header; blank rows
keep their number but are skipped.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, cast

import orjson

from ...core.jobs import InputField
from ...errors import ConfigError, InputError
from .rows import Row
from .streams import DECOMPRESSION_ERRORS

__all__ = ["cell_value", "csv_header", "csv_rows"]

TRUE = frozenset({"true", "1", "yes"})
FALSE = frozenset({"false", "0", "no"})
CELL_LIMIT = 1 << 30  # characters in one cell (the csv default, 128 KiB, is too few for programs)


def cell_value(text: str, type_: str) -> Any:
    """The value of a CSV cell for a job field of type ``type_``; ValueError says why not."""
    if text == "":
        return None
    if type_ == "string":
        return text
    stripped = text.strip()
    if type_ == "string-list":
        value = _json(stripped)
        if not isinstance(value, list):
            raise ValueError('expected a JSON list in the cell, such as ["a", "b"]')
        return value
    if type_ == "integer":
        try:
            return int(stripped)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if type_ == "number":
        try:
            return int(stripped)
        except ValueError:
            pass
        try:
            return float(stripped)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    if type_ == "boolean":
        lowered = stripped.lower()
        if lowered in TRUE or lowered in FALSE:
            return lowered in TRUE
        raise ValueError(f"expected true or false, got {text!r}")
    if stripped[:1] in ("[", "{"):  # "any": a JSON array or object, else the text
        try:
            return orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return text
    return text


def _json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError('expected a JSON list in the cell, such as ["a", "b"]') from None


def _text(stream: io.BufferedIOBase) -> io.TextIOWrapper:
    csv.field_size_limit(max(csv.field_size_limit(), CELL_LIMIT))
    # surrogateescape: a row with bad UTF-8 is reported on its own, not the rest of the file.
    binary = cast(BinaryIO, stream)  # every stream open_bytes returns is a buffered binary file
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors="surrogateescape", newline="")


def csv_header(stream: io.BufferedIOBase, where: str) -> list[str]:
    """The header row's column names; ConfigError when the file has no usable header."""
    with _text(stream) as text:
        return _header(csv.reader(text), where)


def _header(rows: Iterator[list[str]], where: str) -> list[str]:
    while True:
        try:
            cells = next(rows)
        except StopIteration:
            return []
        except csv.Error as err:
            raise ConfigError(f"{where}: the CSV header row is malformed: {err}") from err
        if not cells:
            continue
        names = [c.strip() for c in cells]
        problem = None
        if any(not n for n in names):
            problem = f"an empty column name (column {names.index('') + 1})"
        elif len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            problem = f"the column name {dup!r} twice"
        if problem:
            raise ConfigError(f"{where}: the CSV header row has {problem}")
        return names


def csv_rows(stream: io.BufferedIOBase, inputs: Sequence[InputField]) -> Iterator[Row | InputError]:
    """A Row per non-blank data row, job fields typed; a cut stream ends with an error."""
    with _text(stream) as text:
        yield from _rows(csv.reader(text), {f.name: f.type for f in inputs})


def _rows(rows: Iterator[list[str]], types: dict[str, str]) -> Iterator[Row | InputError]:
    header: list[str] | None = None
    number = 0
    while True:
        try:
            cells = next(rows)
        except StopIteration:
            return
        except csv.Error as err:
            if header is not None:
                number += 1
                yield InputError(number, f"malformed CSV: {err}")
            continue
        except DECOMPRESSION_ERRORS as err:
            yield InputError(number + 1, f"the rest of the file cannot be read: {err}")
            return
        if header is None:
            header = [c.strip() for c in cells] if cells else None
            continue
        number += 1
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        yield _row(number, header, cells, types)


def _row(
    number: int, header: list[str], cells: list[str], types: dict[str, str]
) -> Row | InputError:
    if len(cells) != len(header):
        err = InputError(number, f"{len(cells)} cells, but the header has {len(header)}")
        err.raw = ",".join(cells)
        return err
    try:
        "".join(cells).encode("utf-8")
    except UnicodeEncodeError:
        err = InputError(number, "invalid UTF-8")
        err.raw = ",".join(cells).encode("utf-8", "replace").decode()
        return err
    values: dict[str, Any] = {}
    for name, text in zip(header, cells, strict=True):
        type_ = types.get(name)
        if type_ is None:
            values[name] = text
            continue
        try:
            values[name] = cell_value(text, type_)
        except ValueError as reason:
            err = InputError(number, str(reason), name)
            err.raw = ",".join(cells)
            return err
    return Row(number, values)
