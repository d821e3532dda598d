"""One front door for every input format: check it, read its rows, count them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ...core.jobs import InputField
from ...errors import ConfigError, InputError
from .csvfile import csv_header, csv_rows
from .formats import ACCEPTED, SNIFF_BYTES, InputFormat, detect
from .jsonl import jsonl_rows
from .parquet import open_parquet, parquet_count, parquet_rows
from .rows import Row
from .streams import DECOMPRESSION_ERRORS, open_bytes

__all__ = ["check_input", "count_rows", "read_rows"]

TICK_EVERY = 1 << 16  # rows counted between two calls of the caller's tick


def check_input(path: Path) -> InputFormat:
    """The input's format, once what would make the whole file unreadable is ruled out.

    Raises ConfigError, naming the file, for what is not an input (a directory, another
    binary format), a compressed file that does not decompress or holds binary data, a
    CSV without a usable header row, and a Parquet file whose metadata cannot be read.
    """
    fmt = detect(path)
    if fmt.name == "parquet":
        open_parquet(path)
        return fmt
    try:
        with open_bytes(path, fmt.compression) as fh:
            head = fh.read(SNIFF_BYTES)
    except DECOMPRESSION_ERRORS as err:
        raise ConfigError(f"{path}: cannot read it as {fmt.describe()}: {err}") from err
    if b"\x00" in head:
        raise ConfigError(f"{path} holds binary data inside its {fmt.compression}; {ACCEPTED}")
    if fmt.name == "csv":
        with open_bytes(path, fmt.compression) as fh:
            csv_header(fh, str(path))
    return fmt


def read_rows(path: Path, inputs: Sequence[InputField] = ()) -> Iterator[Row | InputError]:
    """Every non-blank row of the input, in order, as a Row or the InputError it is.

    ``inputs`` are the job's fields: they type a CSV cell (other formats carry types).
    """
    fmt = detect(path)
    if fmt.name == "parquet":
        yield from parquet_rows(path)
        return
    with open_bytes(path, fmt.compression) as fh:
        yield from csv_rows(fh, inputs) if fmt.name == "csv" else jsonl_rows(fh)


def count_rows(path: Path, tick: Callable[[], None] | None = None) -> int:
    """How many items ``read_rows`` yields: the records an input holds, bad lines included.

    Parquet's count is in its metadata; other formats are read through, calling ``tick``
    now and then (it may raise to stop the count, e.g. when the run is cancelled).
    """
    if detect(path).name == "parquet":
        return parquet_count(path)
    n = 0
    for n, _ in enumerate(read_rows(path), start=1):
        if tick is not None and n % TICK_EVERY == 0:
            tick()
    return n
