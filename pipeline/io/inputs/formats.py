"""Recognising an input file's format: by its magic bytes first, by its name only for CSV.

Compressed streams and Parquet carry a signature in their first bytes, so a misnamed
file is still read right; CSV has none, so it is recognised by a ``.csv`` name (also
inside a compressed file: ``data.csv.gz``). Any other text is JSONL. What is neither
(a directory, a zip, an image) is refused before a run starts, naming what is accepted.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...errors import ConfigError

__all__ = ["ACCEPTED", "Compression", "FormatName", "InputFormat", "detect", "sniff"]

FormatName = Literal["jsonl", "csv", "parquet"]
Compression = Literal["gzip", "bzip2", "xz", "zstd"]

ACCEPTED = (
    "accepted: JSONL (plain, or compressed with gzip, bzip2, xz or zstd), "
    "Parquet, or CSV with a header row (named .csv, may be compressed)"
)
PARQUET_MAGIC = b"PAR1"
SNIFF_BYTES = 4096  # enough for every signature below and to tell text from binary

COMPRESSIONS: tuple[tuple[bytes, Compression], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
COMPRESSED_SUFFIXES = frozenset({".gz", ".gzip", ".bz2", ".xz", ".zst", ".zstd"})
# Formats people try that we do not read, named so the error says what the file is.
OTHER_BINARY: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (also .xlsx, .docx)"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"%PDF", "a PDF document"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"ARROW1", "an Arrow IPC file"),
    (b"Obj\x01", "an Avro file"),
    (b"ORC", "an ORC file"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"\x7fELF", "an executable"),
    (b"\xff\xfe", "UTF-16 text (save it as UTF-8)"),
    (b"\xfe\xff", "UTF-16 text (save it as UTF-8)"),
)
EXTRAS = {"zstd": ("zstandard", "zstd"), "parquet": ("pyarrow", "parquet")}


@dataclass(frozen=True, slots=True)
class InputFormat:
    """How an input file is read: its format's name and the compression around it."""

    name: FormatName
    compression: Compression | None = None

    def describe(self) -> str:
        """A short human name, e.g. ``JSONL (gzip)``."""
        shown = {"jsonl": "JSONL", "csv": "CSV", "parquet": "Parquet"}[self.name]
        return f"{shown} ({self.compression})" if self.compression else shown


def sniff(head: bytes, tail: bytes, filename: str) -> InputFormat | str:
    """The format of a file from its first bytes, last 4 bytes and file name, or why not."""
    if head.startswith(PARQUET_MAGIC):
        if tail != PARQUET_MAGIC:
            return "a damaged or incomplete Parquet file (no footer)"
        return InputFormat("parquet")
    suffixes = [s.lower() for s in Path(filename).suffixes]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes.pop()  # the content says whether it is compressed, not the name
    last = suffixes[-1] if suffixes else ""
    for magic, compression in COMPRESSIONS:
        if head.startswith(magic):
            if last in (".parquet", ".pq"):
                return "compressed Parquet (Parquet compresses internally: give the .parquet file)"
            return InputFormat("csv" if last == ".csv" else "jsonl", compression)
    for magic, what in OTHER_BINARY:
        if head.startswith(magic):
            return what
    if b"\x00" in head:
        return "an unknown binary format"
    if last in (".parquet", ".pq"):
        return "named as Parquet but not a Parquet file (no PAR1 signature)"
    return InputFormat("csv" if last == ".csv" else "jsonl")


def detect(path: Path) -> InputFormat:
    """The format of the input at ``path``; ConfigError when it cannot be read as input."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not an input file; {ACCEPTED}")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path} is not a regular file (it is read more than once); {ACCEPTED}")
    try:
        with path.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
            size = fh.seek(0, 2)
            fh.seek(max(0, size - len(PARQUET_MAGIC)))
            tail = fh.read()
    except FileNotFoundError as err:
        raise ConfigError(f"input file not found: {path}") from err
    except OSError as err:
        raise ConfigError(f"cannot read input {path}: {err.strerror}") from err
    found = sniff(head, tail, path.name)
    if isinstance(found, str):
        raise ConfigError(f"{path} is {found}; {ACCEPTED}")
    need = found.name if found.name == "parquet" else found.compression
    if need in EXTRAS:
        module, extra = EXTRAS[need]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"{path} is {found.describe()}, which needs {module}: pip install 'refine[{extra}]'"
            )
    return found
