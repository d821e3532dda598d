"""Parquet input: record batches, nested values as JSON, unreadable row groups, identity, runs."""

from __future__ import annotations

import base64
import datetime as dt
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pipeline import ConfigError
from pipeline.commands.status import collect
from pipeline.core.jobs import InputField
from pipeline.core.records import Record
from pipeline.errors import InputError
from pipeline.io.inputs import check_input, count_rows, fingerprint, same_input
from pipeline.io.inputs.parquet import json_value, parquet_identity
from pipeline.io.records import read_records
from pipeline.testing.simulator import Simulator
from tests.helpers import concept_rows, read_jsonl, run_commongen

pa = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra (pyarrow) is not installed")

CONCEPTS = (InputField("concepts", "string-list"),)


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 64) -> Path:
    """``rows`` as a Parquet file with row groups of ``row_group_size`` rows."""
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def read(path: Path, inputs: tuple[InputField, ...] = CONCEPTS) -> list[Record | InputError]:
    """Every item the reader yields for ``path``."""
    return list(read_records(path, inputs, "id"))


def corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite the first column chunk of row group ``group`` with bytes no reader accepts."""
    column = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    with path.open("r+b") as fh:
        fh.seek(start)
        fh.write(b"\xff" * column.total_compressed_size)


# -- reading ---------------------------------------------------------------------------------


def test_rows_become_records_with_row_numbers_and_list_values(tmp_path: Path) -> None:
    """Each row is a record; its 1-based row number is its line; a list column is a list."""
    rows = concept_rows(150)
    path = write_parquet(tmp_path / "in.parquet", rows, row_group_size=64)
    items = read(path)
    assert all(isinstance(i, Record) for i in items)
    recs = [i for i in items if isinstance(i, Record)]
    assert [(r.id, r.line) for r in recs] == [(str(i), i + 1) for i in range(150)]
    assert [r.fields for r in recs] == rows
    assert count_rows(path) == 150


def test_misnamed_parquet_is_read_as_parquet(tmp_path: Path) -> None:
    """A Parquet file named .jsonl is recognised by its PAR1 signature."""
    path = write_parquet(tmp_path / "data.jsonl", concept_rows(3))
    assert check_input(path).name == "parquet"
    assert [i.line for i in read(path)] == [1, 2, 3]


def test_nested_and_typed_columns_become_json_values(tmp_path: Path) -> None:
    """Structs, maps, timestamps, decimals and binary columns arrive as JSON values."""
    table = pa.table(
        {
            "id": pa.array(["a"]),
            "meta": pa.array([{"lang": "en", "tags": ["x"]}]),
            "counts": pa.array([[("k", 1)]], type=pa.map_(pa.string(), pa.int64())),
            "at": pa.array([dt.datetime(2024, 5, 1, 12, 30)], type=pa.timestamp("ms")),
            "day": pa.array([dt.date(2024, 5, 1)]),
            "price": pa.array([Decimal("12.50")], type=pa.decimal128(6, 2)),
            "blob": pa.array([b"\x00\xff"], type=pa.binary()),
            "text": pa.array([b"plain"], type=pa.binary()),
        }
    )
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    [rec] = read(path, ())
    assert isinstance(rec, Record)
    assert rec.fields == {
        "id": "a",
        "meta": {"lang": "en", "tags": ["x"]},
        "counts": {"k": 1},
        "at": "2024-05-01T12:30:00",
        "day": "2024-05-01",
        "price": "12.50",
        "blob": base64.b64encode(b"\x00\xff").decode(),
        "text": "plain",
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("s", "s"),
        (3, 3),
        (2.5, 2.5),
        (True, True),
        ([1, [2, None]], [1, [2, None]]),
        ({"a": dt.date(2020, 1, 2)}, {"a": "2020-01-02"}),
        ([("k", 1), ("j", 2)], {"k": 1, "j": 2}),
        ([(1, "one")], {"1": "one"}),
        (dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "2020-01-02T03:04:05+00:00"),
        (dt.time(3, 4), "03:04:00"),
        (dt.timedelta(minutes=1, milliseconds=500), 60.5),
        (Decimal("-0.010"), "-0.010"),
        (b"caf\xc3\xa9", "café"),
        (b"\xff\xfe", "//4="),
    ],
)
def test_json_value_table(value: object, expected: object) -> None:
    """Values JSON has no type for become strings (or seconds); maps become objects."""
    assert json_value(value) == expected


def test_unreadable_row_group_is_reported_row_by_row_and_the_rest_read(tmp_path: Path) -> None:
    """A corrupt row group gives one error per row of it; rows of the other groups are records."""
    path = write_parquet(tmp_path / "in.parquet", concept_rows(150), row_group_size=64)
    corrupt_row_group(path, 1)  # rows 65-128
    items = read(path)
    errors = [i for i in items if isinstance(i, InputError)]
    recs = [i for i in items if isinstance(i, Record)]
    assert [e.line for e in errors] == list(range(65, 129))
    assert "row group 1 (rows 65-128) cannot be read" in errors[0].reason
    assert [r.line for r in recs] == [*range(1, 65), *range(129, 151)]
    assert count_rows(path) == len(items)


def test_missing_or_null_required_column_names_the_field(tmp_path: Path) -> None:
    """A row whose required field is null is an error on its row naming the field."""
    path = write_parquet(tmp_path / "in.parquet", [{"id": 1, "concepts": None}, *concept_rows(1)])
    first, second = read(path)
    assert isinstance(first, InputError) and (first.line, first.field) == (1, "concepts")
    assert first.raw is not None and '"id":1' in first.raw
    assert isinstance(second, Record)


def test_damaged_footer_is_refused_before_reading(tmp_path: Path) -> None:
    """A Parquet file whose metadata cannot be read is a ConfigError naming the file."""
    path = write_parquet(tmp_path / "in.parquet", concept_rows(10))
    data = bytearray(path.read_bytes())
    data[-40:-8] = b"\x07" * 32  # inside the footer, before its length and PAR1
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="cannot read its Parquet metadata") as caught:
        check_input(path)
    assert str(path) in str(caught.value)


# -- identity --------------------------------------------------------------------------------


def test_parquet_edited_in_place_is_another_input(tmp_path: Path) -> None:
    """A same-size edit that leaves the footer as it was is still caught: the file is hashed."""
    path = tmp_path / "in.parquet"
    table = pa.Table.from_pylist(concept_rows(50))
    pq.write_table(table, path, compression="none", use_dictionary=False)
    recorded = fingerprint(path)
    data = path.read_bytes()
    at = data.index(b"word12")
    path.write_bytes(data[:at] + b"word13" + data[at + 6 :])
    os.utime(path, ns=(recorded["mtime_ns"] + 10**9, recorded["mtime_ns"] + 10**9))
    edited = parquet_identity(path, digest=False)
    assert (edited["size"], edited["footer_sha256"]) == (
        recorded["size"],
        recorded["footer_sha256"],
    )
    assert not same_input(path, recorded)


def test_touched_but_unchanged_parquet_is_the_same_input(tmp_path: Path) -> None:
    """A Parquet file copied or touched (new time, same bytes) is still the run's input."""
    path = write_parquet(tmp_path / "in.parquet", concept_rows(50))
    recorded = fingerprint(path)
    os.utime(path, ns=(1, 1))
    assert same_input(path, recorded)


def test_rewritten_with_more_rows_is_another_input(tmp_path: Path) -> None:
    """Parquet is not appended in place: a file rewritten with rows added is a different input."""
    path = write_parquet(tmp_path / "in.parquet", concept_rows(50))
    recorded = fingerprint(path)
    write_parquet(path, concept_rows(60))
    assert not same_input(path, recorded)


# -- runs --------------------------------------------------------------------------------------


def test_300_parquet_records_with_id_and_list_columns_run_to_completion(
    sim: Simulator, tmp_path: Path
) -> None:
    """A Parquet input with an id column and a list column runs every row to one output."""
    rows = concept_rows(300)
    inp = write_parquet(tmp_path / "cg.parquet", rows)
    result = run_commongen(sim, inp, tmp_path / "run")
    assert result.exit_code == 0 and result.counters.total == 300
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted((o["id"], o["line"]) for o in outs) == sorted((str(i), i + 1) for i in range(300))
    generate = [b for b in sim.completed_bodies() if "word30" in str(b["messages"])]
    assert generate  # the list column reached the prompts as concepts


def test_run_over_a_corrupt_row_group_finishes_the_rest(sim: Simulator, tmp_path: Path) -> None:
    """Rows of an unreadable row group go to errors.jsonl; the run does the rest and exits 1."""
    inp = write_parquet(tmp_path / "cg.parquet", concept_rows(150), row_group_size=64)
    corrupt_row_group(inp, 0)
    result = run_commongen(sim, inp, tmp_path / "run")
    assert result.exit_code == 1
    errors = read_jsonl(tmp_path / "run" / "errors.jsonl")
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted(e["line"] for e in errors) == list(range(1, 65))
    assert len(outs) == 150 - 64
    info = collect(tmp_path / "run")
    assert (info["records"], info["bad_lines"], info["pending"]) == (86, 64, 0)


def test_changed_parquet_refuses_to_continue_the_run(sim: Simulator, tmp_path: Path) -> None:
    """Re-running on a RUN_DIR after its Parquet input changed is refused as another input."""
    inp = write_parquet(tmp_path / "cg.parquet", concept_rows(20))
    assert run_commongen(sim, inp, tmp_path / "run").exit_code == 0
    write_parquet(inp, concept_rows(25))
    with pytest.raises(ConfigError, match="is not the input of the run"):
        run_commongen(sim, inp, tmp_path / "run")
