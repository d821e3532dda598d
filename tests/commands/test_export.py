"""``refine export``: column types, and a run's outputs as Parquet, CSV and JSONL files."""

from __future__ import annotations

import csv
import gzip
import io
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pipeline import ConfigError
from pipeline.commands.columns import JSON, NULL, OUTPUT_TYPES, Columns, merge, to_cell, type_of
from pipeline.commands.export import export, export_format, input_column
from pipeline.runs.rundir import RunDir
from pipeline.testing.simulator import Simulator
from tests.helpers import concept_rows, read_jsonl, run_commongen, write_jsonl

# -- column types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "type_"),
    [
        (None, NULL),
        ("a", "string"),
        (1, "integer"),
        (1.5, "number"),
        (False, "boolean"),
        (["a", None, "b"], "list<string>"),
        ([1, 2.5], "list<number>"),
        ([], "list<null>"),
        (["a", 1], JSON),
        ([["a"]], JSON),
        ({"k": 1}, JSON),
    ],
)
def test_type_of_a_value(value: object, type_: str) -> None:
    """Scalars, lists of one scalar type, and everything else (JSON text) are told apart."""
    assert type_of(value) == type_


@pytest.mark.parametrize(
    ("a", "b", "merged"),
    [
        ("string", "string", "string"),
        ("string", NULL, "string"),
        (NULL, "integer", "integer"),
        ("integer", "number", "number"),
        ("number", "integer", "number"),
        ("list<null>", "list<string>", "list<string>"),
        ("list<integer>", "list<number>", "list<number>"),
        ("list<string>", "list<integer>", JSON),
        ("string", "integer", JSON),
        ("boolean", "integer", JSON),
        (JSON, "string", JSON),
    ],
)
def test_merging_kinds(a: str, b: str, merged: str) -> None:
    """A column's type holds all its values: numbers widen, null fits all, conflicts are JSON."""
    assert merge(a, b) == merged
    assert merge(b, a) == merged


def test_fixed_output_kinds_survive_all_null_values() -> None:
    """A run whose scores are all null still gets a number score column."""
    columns = Columns(OUTPUT_TYPES)
    columns.add({"id": "a", "score": None, "extra": None})
    columns.add({"id": "b", "score": 3, "extra": "x"})
    assert columns.types["score"] == "number"
    assert columns.types["extra"] == "string"
    assert columns.names()[: len(OUTPUT_TYPES)] == list(OUTPUT_TYPES)


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        (None, ""),
        ("text", "text"),
        (True, "true"),
        (3, "3"),
        (0.5, "0.5"),
        (["a", "b"], '["a","b"]'),
        ({"k": None}, '{"k":null}'),
    ],
)
def test_csv_cells(value: object, cell: str) -> None:
    """CSV cells: lists and objects as JSON, null as an empty cell, booleans lower-case."""
    assert to_cell(value) == cell


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("out.parquet", ("parquet", False)),
        ("OUT.PQ", ("parquet", False)),
        ("out.csv", ("csv", False)),
        ("out.csv.gz", ("csv", True)),
        ("out.jsonl", ("jsonl", False)),
        ("out.jsonl.gz", ("jsonl", True)),
    ],
)
def test_export_format_comes_from_the_extension(name: str, expected: tuple[str, bool]) -> None:
    """The export file's extension picks the format."""
    assert export_format(Path(name)) == expected


@pytest.mark.parametrize("name", ["out.xlsx", "out.json", "out", "out.parquet.gz"])
def test_unknown_export_extension_is_refused(name: str) -> None:
    """An extension that names no export format is a ConfigError listing the accepted ones."""
    with pytest.raises(ConfigError, match=r"\.parquet, \.csv"):
        export_format(Path(name))


@pytest.mark.parametrize(
    ("name", "id_field", "exported"),
    [
        ("concepts", "id", "concepts"),
        ("id", "id", None),
        ("id", "key", "input_id"),
        ("key", "key", "key"),
        ("output", "id", "input_output"),
        ("line", "id", "input_line"),
    ],
)
def test_input_column_names(name: str, id_field: str, exported: str | None) -> None:
    """Input columns keep their names unless an output column has it; the id is not repeated."""
    clash = frozenset(OUTPUT_TYPES)
    assert input_column(name, clash, id_field) == exported


# -- exporting runs --------------------------------------------------------------------------


@pytest.fixture
def finished_run(sim: Simulator, tmp_path: Path) -> Path:
    """A finished commongen run over 40 JSONL records (integer ids, concept lists)."""
    rows = concept_rows(40)
    rows[3]["line"] = "input's own line column"
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert run_commongen(sim, inp, tmp_path / "run").exit_code == 0
    return tmp_path / "run"


def test_parquet_export_has_one_row_per_record_in_input_order(
    finished_run: Path, tmp_path: Path
) -> None:
    """pyarrow reads the export back with one row per record, sorted by input line."""
    pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra is not installed")
    done = export(finished_run, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert done.rows == table.num_rows == 40
    assert table.column("line").to_pylist() == list(range(1, 41))
    assert table.column("id").to_pylist() == [str(i) for i in range(40)]
    assert str(table.schema.field("score").type) == "double"
    assert str(table.schema.field("iterations").type) == "int64"
    in_file = read_jsonl(finished_run / "outputs.jsonl")
    assert [o["line"] for o in in_file] != list(range(1, 41))  # finished out of order
    outputs = {o["id"]: o for o in in_file}
    for row in table.to_pylist():
        assert row["output"] == outputs[row["id"]]["output"]
        assert orjson.loads(row["usage"]) == outputs[row["id"]]["usage"]
    assert "concepts" not in table.column_names


def test_parquet_export_with_input_joins_the_input_columns(
    finished_run: Path, tmp_path: Path
) -> None:
    """--with-input adds each record's own columns (lists stay lists); clashes are prefixed."""
    pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra is not installed")
    export(finished_run, tmp_path / "out.parquet", with_input=True)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names[:3] == ["id", "concepts", "input_line"]
    assert str(table.schema.field("concepts").type) == "list<element: string>"
    rows = table.to_pylist()
    expected = concept_rows(40)
    assert [r["concepts"] for r in rows] == [e["concepts"] for e in expected]
    assert rows[3]["input_line"] == "input's own line column"
    assert rows[3]["line"] == 4
    assert all(r["input_line"] is None for i, r in enumerate(rows) if i != 3)


def test_csv_export_with_input(finished_run: Path, tmp_path: Path) -> None:
    """CSV export: a header, one row per record, lists and objects as JSON text."""
    done = export(finished_run, tmp_path / "out.csv", with_input=True)
    with (tmp_path / "out.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert done.rows == len(rows) == 40
    assert [orjson.loads(r["concepts"]) for r in rows] == [r["concepts"] for r in concept_rows(40)]
    assert rows[0]["status"] == "done"
    assert orjson.loads(rows[0]["usage"])["calls"] >= 2
    assert rows[0]["error"] == ""


def test_jsonl_gz_export_is_the_outputs_in_input_order(finished_run: Path, tmp_path: Path) -> None:
    """A .jsonl.gz export holds every output line unchanged, sorted by input line."""
    export(finished_run, tmp_path / "out.jsonl.gz")
    data = gzip.decompress((tmp_path / "out.jsonl.gz").read_bytes())
    lines = [orjson.loads(x) for x in data.splitlines()]
    outputs = read_jsonl(finished_run / "outputs.jsonl")
    assert [line["line"] for line in lines] == list(range(1, 41))
    assert sorted(lines, key=lambda o: str(o["id"])) == sorted(outputs, key=lambda o: str(o["id"]))


def test_export_skips_a_torn_last_line_and_duplicates(finished_run: Path, tmp_path: Path) -> None:
    """A line cut by a kill is left out; a repeated id keeps its first line."""
    out = finished_run / "outputs.jsonl"
    first = out.read_bytes().splitlines()[0]
    dup = orjson.loads(first)
    dup["output"] = "a later copy"
    with out.open("ab") as fh:
        fh.write(orjson.dumps(dup) + b"\n" + first[:30])
    export(finished_run, tmp_path / "out.jsonl")
    lines = read_jsonl(tmp_path / "out.jsonl")
    assert len(lines) == 40
    assert "a later copy" not in {line["output"] for line in lines}


def test_export_of_an_unfinished_run_has_the_finished_records(
    sim: Simulator, tmp_path: Path
) -> None:
    """Records not finished yet are not in the export; the finished ones are."""
    inp = write_jsonl(tmp_path / "in.jsonl", concept_rows(12))
    assert run_commongen(sim, inp, tmp_path / "run").exit_code == 0
    out = tmp_path / "run" / "outputs.jsonl"
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:5]))
    done = export(tmp_path / "run", tmp_path / "out.csv", with_input=True)
    assert done.rows == 5 and done.without_input == 0
    assert done.partial() == (
        "5 of 12 records are finished and written; the rest are pending (`refine resume "
        "RUN_DIR` runs them)"
    )


def test_export_of_a_live_run_says_so_or_refuses(sim: Simulator, tmp_path: Path) -> None:
    """While a process holds the run, export writes the records finished so far and says
    the run is still going, or refuses (exit 2) when none has finished: never a bare
    '0 rows written'."""
    inp = write_jsonl(tmp_path / "in.jsonl", concept_rows(12))
    assert run_commongen(sim, inp, tmp_path / "run").exit_code == 0
    out = tmp_path / "run" / "outputs.jsonl"
    whole = out.read_bytes()
    out.write_bytes(b"".join(whole.splitlines(keepends=True)[:3]))
    with RunDir(tmp_path / "run").lock():
        done = export(tmp_path / "run", tmp_path / "out.jsonl")
        assert done.rows == 3 and done.running
        assert "the run is still running: 3 of 12 records had finished" in (done.partial() or "")
        out.write_bytes(b"")
        cli = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "export", str(tmp_path / "run"),
             str(tmp_path / "none.csv")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    assert cli.returncode == 2 and "none of its records has finished yet" in cli.stderr
    assert not (tmp_path / "none.csv").exists()


def test_export_refuses_a_directory_without_a_run(tmp_path: Path) -> None:
    """A RUN_DIR without a manifest is refused, and nothing is written."""
    with pytest.raises(ConfigError, match="holds no run"):
        export(tmp_path, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


def test_with_input_refuses_a_changed_input(finished_run: Path, tmp_path: Path) -> None:
    """Joining an input that changed since the run is refused: ids would not match."""
    write_jsonl(tmp_path / "in.jsonl", concept_rows(40)[5:])
    with pytest.raises(ConfigError, match="has changed since the run"):
        export(finished_run, tmp_path / "out.csv", with_input=True)


def test_export_command(finished_run: Path, tmp_path: Path) -> None:
    """`refine export RUN_DIR OUT --with-input` writes the file and says how many rows."""
    out = tmp_path / "refined.csv"
    args = ["export", str(finished_run), str(out), "--with-input"]
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"40 rows written to {out} (csv)" in done.stdout
    header = next(csv.reader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert header[:2] == ["id", "concepts"]
    bad = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "export", str(tmp_path), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "holds no run" in bad.stderr
