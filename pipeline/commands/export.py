"""``refine export``: a run's outputs as one Parquet, CSV or JSONL file, in input order.

The format comes from the file name: ``.parquet`` (needs the ``parquet`` extra),
``.csv`` or ``.jsonl``, the last two also gzip-compressed (``.csv.gz``, ``.jsonl.gz``).
Rows are the records finished so far, sorted by input line; with ``with_input`` each
row also carries its input record's own columns, joined by id, so the refined dataset
is one file.

Memory stays bounded whatever the run's size: outputs.jsonl is indexed (id, line,
byte offset) in a temporary SQLite file next to the export, which sorts it by line
on disk; lines are then read back one at a time, and the input is read alongside in
the same order (a merge join on line, checked by id). What is held is SQLite's page
cache (``CACHE_MIB``), one batch of ``BATCH_ROWS`` rows and the column types. A
Parquet or CSV export first reads the input through once more to learn its columns.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import orjson

from ..core.loader import load_job
from ..core.records import Record
from ..errors import ConfigError, StoreError
from ..io.records import read_records, same_input
from ..runs.manifest import Manifest
from ..runs.rundir import RunDir
from .columns import JSON, NULL, OUTPUT_TYPES, Columns, to_cell, to_column

__all__ = ["ExportSummary", "export", "export_format", "input_column"]

ExportFormat = Literal["parquet", "csv", "jsonl"]
BATCH_ROWS = 4096  # rows per Parquet row group, and per batch held in memory
CACHE_MIB = 16
SUFFIXES: Mapping[str, tuple[ExportFormat, bool]] = {
    ".parquet": ("parquet", False),
    ".pq": ("parquet", False),
    ".csv": ("csv", False),
    ".csv.gz": ("csv", True),
    ".jsonl": ("jsonl", False),
    ".jsonl.gz": ("jsonl", True),
}


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote."""

    path: Path
    format: ExportFormat
    rows: int  # one per finished record
    without_input: int  # rows whose input record was not found (with_input only)
    running: bool = False  # a process held the run: its records finished so far
    records: int | None = None  # the records the run ends with (None: unknown)

    def partial(self) -> str | None:
        """What an export of an unfinished run leaves out, for people (None: nothing)."""
        of = "" if self.records is None else f" of {self.records}"
        if self.running:
            return (
                f"the run is still running: {self.rows}{of} records had finished and are "
                "written; export again once it has ended for the rest"
            )
        if self.records is not None and self.rows < self.records:
            return (
                f"{self.rows}{of} records are finished and written; the rest are pending "
                "(`refine resume RUN_DIR` runs them)"
            )
        return None


def export_format(path: Path) -> tuple[ExportFormat, bool]:
    """The format and gzip flag an export file's name asks for; ConfigError when unknown."""
    name = path.name.lower()
    for suffix, found in SUFFIXES.items():
        if name.endswith(suffix):
            return found
    raise ConfigError(
        f"{path}: cannot tell the export format from the name; "
        "use .parquet, .csv, .csv.gz, .jsonl or .jsonl.gz"
    )


def export(run_dir: str | Path, output: str | Path, *, with_input: bool = False) -> ExportSummary:
    """Write the finished records of ``run_dir`` to ``output`` (format by its extension)."""
    rd = RunDir(Path(run_dir))
    output = Path(output)
    fmt, compressed = export_format(output)
    manifest = rd.require_manifest()
    outputs_path = rd.outputs_path
    if output.resolve() == outputs_path.resolve():
        raise ConfigError(f"{output} is the run's own outputs.jsonl; choose another file")
    source = _InputSource.of(manifest) if with_input else None
    if fmt == "parquet":
        _require_pyarrow()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.TemporaryDirectory(prefix=".refine-export-", dir=output.parent)
    except OSError as err:
        raise StoreError(f"cannot write {output}: {err.strerror}") from err
    running = rd.is_locked()
    with scratch, _Index(Path(scratch.name) / "index.sqlite") as index:
        out_columns = index.load(outputs_path)
        if running and not index.rows:
            raise ConfigError(
                f"{rd.path} is a run in progress and none of its records has finished yet: "
                f"nothing to export (`refine status {rd.path}` shows its progress)"
            )
        in_columns = Columns()
        if source is not None and fmt != "jsonl":
            for record in source.records():
                in_columns.add(record.fields)
        clash = frozenset(out_columns.names())  # the output fields, fixed ones included
        id_field = source.id_field if source is not None else "id"
        columns = _table_columns(out_columns, in_columns, clash, id_field)
        rows = _JoinedRows(index, outputs_path, source, clash)
        tmp = Path(scratch.name) / output.name
        try:
            if fmt == "parquet":
                _write_parquet(tmp, rows, columns)
            elif fmt == "csv":
                _write_csv(tmp, rows, list(columns), compressed)
            else:
                _write_jsonl(tmp, rows, compressed)
            os.replace(tmp, output)
        except OSError as err:
            raise StoreError(f"cannot write {output}: {err.strerror or err}") from err
    records = rd.expected(manifest).records
    return ExportSummary(output, fmt, index.rows, rows.missing, running, records)


# -- the input ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _InputSource:
    """The run's input, read as the run read it (same job fields, same id field)."""

    path: Path
    job_source: str
    id_field: str

    @classmethod
    def of(cls, manifest: Manifest) -> _InputSource:
        path = Path(manifest.input.path)
        if not path.exists():
            raise ConfigError(f"the run's input {path} is gone; export without --with-input")
        if not same_input(path, manifest.input.fingerprint):
            raise ConfigError(f"the run's input {path} has changed since the run; cannot join it")
        return cls(path, manifest.job.source, manifest.settings.id_field)

    def records(self) -> Iterator[Record]:
        """The input's records in line order (bad lines and duplicates left out)."""
        inputs = load_job(self.job_source).inputs
        for item in read_records(self.path, inputs, self.id_field):
            if isinstance(item, Record):
                yield item


def input_column(name: str, clash: frozenset[str], id_field: str) -> str | None:
    """An input column's name in the export: none for an ``id`` id field (the output's id
    holds it), prefixed with ``input_`` when an output column has that name."""
    if name == id_field == "id":
        return None
    return f"input_{name}" if name in clash else name


def _table_columns(
    out: Columns, inp: Columns, clash: frozenset[str], id_field: str
) -> dict[str, str]:
    """Every export column and its type: the id, then the input's columns, then the outputs'."""
    types = dict(out.types)
    columns = {"id": types.pop("id")}
    for name, type_ in inp.types.items():
        new = input_column(name, clash, id_field)
        if new is not None:
            columns[new] = type_
    columns.update(types)
    return columns


# -- reading outputs in line order -------------------------------------------------------------


class _Index:
    """outputs.jsonl indexed by id (first line wins) and sorted by input line, on disk."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path)
        self.db.executescript(
            f"""
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            PRAGMA cache_size = -{CACHE_MIB * 1024};
            CREATE TABLE outputs (id TEXT PRIMARY KEY, line INTEGER, offset INTEGER)
                WITHOUT ROWID;
            """
        )
        self.rows = 0

    def __enter__(self) -> _Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    def load(self, outputs_path: Path) -> Columns:
        """Index every readable line of outputs.jsonl; return the output columns' types."""
        columns = Columns(OUTPUT_TYPES)
        batch: list[tuple[str, int, int]] = []
        with contextlib.suppress(FileNotFoundError), outputs_path.open("rb") as fh:
            offset = 0
            for raw in fh:
                start, offset = offset, offset + len(raw)
                try:
                    obj = orjson.loads(raw)
                    batch.append((str(obj["id"]), int(obj["line"]), start))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a line cut by a kill, or being written right now
                columns.add(obj)
                if len(batch) >= BATCH_ROWS:
                    self._insert(batch)
        self._insert(batch)
        self.db.execute("CREATE INDEX by_line ON outputs (line, id)")
        (self.rows,) = self.db.execute("SELECT count(*) FROM outputs").fetchone()
        return columns

    def _insert(self, batch: list[tuple[str, int, int]]) -> None:
        self.db.executemany("INSERT OR IGNORE INTO outputs VALUES (?, ?, ?)", batch)
        batch.clear()

    def in_line_order(self) -> Iterator[tuple[str, int, int]]:
        """(id, line, byte offset) of every indexed output, by input line."""
        yield from self.db.execute("SELECT id, line, offset FROM outputs ORDER BY line, id")


class _JoinedRows:
    """Output rows by input line, each with its input record's columns when asked."""

    def __init__(
        self,
        index: _Index,
        outputs_path: Path,
        source: _InputSource | None,
        clash: frozenset[str],
    ) -> None:
        self.index = index
        self.outputs_path = outputs_path
        self.source = source
        self.clash = clash
        self.missing = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        records = self.source.records() if self.source is not None else iter(())
        record = next(records, None)
        with self.outputs_path.open("rb") as fh:
            for rid, line, offset in self.index.in_line_order():
                fh.seek(offset)
                out: dict[str, Any] = orjson.loads(fh.readline())
                if self.source is None:
                    yield out
                    continue
                while record is not None and record.line < line:
                    record = next(records, None)
                row = {"id": out["id"]}
                if record is not None and record.line == line and record.id == rid:
                    for name, value in record.fields.items():
                        new = input_column(name, self.clash, self.source.id_field)
                        if new is not None:
                            row[new] = value
                else:
                    self.missing += 1
                row.update(out)
                yield row


# -- writers -----------------------------------------------------------------------------------


def _batches(rows: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= BATCH_ROWS:
            yield batch
            batch = []
    if batch:
        yield batch


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as err:
        raise ConfigError("a Parquet export needs pyarrow: pip install 'refine[parquet]'") from err


def _arrow_type(type_: str) -> Any:
    import pyarrow as pa

    if type_.startswith("list<"):
        return pa.list_(_arrow_type(type_[5:-1]))
    scalar = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
    return scalar.get(type_, pa.string())  # string, json text, and all-null columns


def _write_parquet(path: Path, rows: _JoinedRows, columns: Mapping[str, str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {name: (JSON if type_ == NULL else type_) for name, type_ in columns.items()}
    schema = pa.schema([(name, _arrow_type(type_)) for name, type_ in types.items()])
    with pq.ParquetWriter(path, schema) as writer:
        for batch in _batches(rows):
            arrays = [
                pa.array(to_column((r.get(name) for r in batch), type_), type=field.type)
                for (name, type_), field in zip(types.items(), schema, strict=True)
            ]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))


def _open_text(path: Path, compressed: bool) -> IO[str]:
    if compressed:
        return gzip.open(path, "wt", encoding="utf-8", newline="")
    return path.open("w", encoding="utf-8", newline="")


def _write_csv(path: Path, rows: _JoinedRows, names: list[str], compressed: bool) -> None:
    with _open_text(path, compressed) as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for row in rows:
            writer.writerow([to_cell(row.get(name)) for name in names])


def _write_jsonl(path: Path, rows: _JoinedRows, compressed: bool) -> None:
    with gzip.open(path, "wb") if compressed else path.open("wb") as fh:
        for row in rows:
            fh.write(orjson.dumps(row) + b"\n")
