"""Input formats: detection by content, compressed JSONL, CSV, identity, and runs over them."""

from __future__ import annotations

import bz2
import gzip
import lzma
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import ConfigError
from pipeline.commands.status import collect
from pipeline.core.jobs import InputField
from pipeline.core.records import Record
from pipeline.errors import InputError
from pipeline.io.inputs import InputFormat, check_input, count_rows, fingerprint, same_input
from pipeline.io.inputs.csvfile import cell_value
from pipeline.io.inputs.formats import sniff
from pipeline.io.records import read_records
from pipeline.testing.simulator import Simulator
from tests.helpers import concept_rows, read_jsonl, run_commongen

INPUTS = (
    InputField("task", "string"),
    InputField("tags", "string-list", required=False),
    InputField("n", "integer", required=False),
    InputField("ok", "boolean", required=False),
    InputField("x", "number", required=False),
    InputField("extra", "any", required=False),
)


def zstd_compress(data: bytes) -> bytes:
    """``data`` as one zstd frame (skips the test when the zstd extra is missing)."""
    zstandard = pytest.importorskip("zstandard", reason="the zstd extra is not installed")
    return bytes(zstandard.ZstdCompressor().compress(data))


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "zstd": zstd_compress,
}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    """The JSONL bytes of ``rows``."""
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def task_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """``n`` code-improve rows with ids."""
    return [{"id": f"r{i}", "task": f"write function {i}"} for i in range(start, start + n)]


def read(path: Path) -> list[Record | InputError]:
    """Every item the reader yields for ``path``."""
    return list(read_records(path, INPUTS, "id"))


def summary(items: list[Record | InputError]) -> list[tuple[str, int, str]]:
    """(what, line, id-or-reason) of every item."""
    return [
        ("rec", i.line, i.id) if isinstance(i, Record) else ("err", i.line, i.reason) for i in items
    ]


# -- recognising a format --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "name", "expected"),
    [
        (b'{"a": 1}\n', "in.jsonl", InputFormat("jsonl")),
        (b'{"a": 1}\n', "in.txt", InputFormat("jsonl")),
        (b"", "empty.jsonl", InputFormat("jsonl")),
        (b"id,task\n", "in.csv", InputFormat("csv")),
        (b"id,task\n", "IN.CSV", InputFormat("csv")),
        (b"id,task\n", "in.csv.gz", InputFormat("csv")),
        (b"\x1f\x8b\x08\x00", "in.jsonl.gz", InputFormat("jsonl", "gzip")),
        (b"\x1f\x8b\x08\x00", "in.jsonl", InputFormat("jsonl", "gzip")),
        (b"\x1f\x8b\x08\x00", "in.csv.gz", InputFormat("csv", "gzip")),
        (b"\x1f\x8b\x08\x00", "in.csv", InputFormat("csv", "gzip")),
        (b"BZh91AY", "in.jsonl.bz2", InputFormat("jsonl", "bzip2")),
        (b"\xfd7zXZ\x00\x00", "data", InputFormat("jsonl", "xz")),
        (b"\x28\xb5\x2f\xfd\x00", "in.jsonl.zst", InputFormat("jsonl", "zstd")),
        (b"PAR1\x15\x04", "in.parquet", InputFormat("parquet")),
        (b"PAR1\x15\x04", "in.jsonl", InputFormat("parquet")),
    ],
)
def test_format_comes_from_the_content_then_the_name(
    head: bytes, name: str, expected: InputFormat
) -> None:
    """Magic bytes decide compression and Parquet whatever the name; only CSV needs its name."""
    assert sniff(head, b"PAR1" if head.startswith(b"PAR1") else b"}\n", name) == expected


@pytest.mark.parametrize(
    ("head", "tail", "name", "says"),
    [
        (b"PK\x03\x04rest", b"xxxx", "in.jsonl", "zip archive"),
        (b"\x89PNG\r\n", b"xxxx", "in.jsonl", "PNG image"),
        (b"\xff\xfe{\x00", b"xxxx", "in.jsonl", "UTF-16"),
        (b"ab\x00\x00cd", b"xxxx", "in.jsonl", "unknown binary format"),
        (b"PAR1\x15", b"xxxx", "in.parquet", "incomplete Parquet"),
        (b'{"a": 1}\n', b"1}\n", "in.parquet", "not a Parquet file"),
        (b"\x1f\x8b\x08", b"xxxx", "in.parquet.gz", "compressed Parquet"),
    ],
)
def test_what_is_not_an_input_is_named(head: bytes, tail: bytes, name: str, says: str) -> None:
    """Other binary formats, and Parquet that is not, are refused with what they look like."""
    found = sniff(head, tail, name)
    assert isinstance(found, str) and says in found


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"PK\x03\x04" + b"\x00" * 40), "zip archive"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40), "PNG image"),
        (lambda p: p.write_bytes(gzip.compress(b"ustar\x00\x00\x00" * 100)), "binary data"),
        (lambda p: p.write_bytes(b"\x1f\x8b\x08\x00garbage"), "cannot read it as JSONL (gzip)"),
    ],
)
def test_unsupported_inputs_are_refused_naming_the_file_and_the_formats(
    tmp_path: Path, make: Callable[[Path], object], says: str
) -> None:
    """A directory or unknown binary file is a ConfigError naming it and what is accepted."""
    path = tmp_path / "data.jsonl"
    make(path)
    with pytest.raises(ConfigError) as caught:
        check_input(path)
    message = str(caught.value)
    assert str(path) in message and says in message
    if "cannot read" not in says:
        assert "accepted: JSONL" in message and "Parquet" in message and "CSV" in message


def test_missing_input_is_refused(tmp_path: Path) -> None:
    """A path that does not exist is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="input file not found"):
        check_input(tmp_path / "nope.jsonl")


def test_zstd_without_its_extra_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .zst input when zstandard is not installed says which extra to install."""
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 10)
    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr(
        "pipeline.io.inputs.formats.importlib.util.find_spec",
        lambda name, *a: None if name == "zstandard" else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"refine\[zstd\]"):
        check_input(path)


# -- compressed JSONL ------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(COMPRESSORS))
@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz", "in.txt"])
def test_compressed_jsonl_is_read_by_its_content_whatever_its_name(
    tmp_path: Path, compression: str, name: str
) -> None:
    """gzip, bzip2, xz and zstd content is decompressed even when the name says otherwise."""
    path = tmp_path / name
    path.write_bytes(COMPRESSORS[compression](jsonl(task_rows(3))))
    assert check_input(path).compression == compression
    assert summary(read(path)) == [("rec", 1, "r0"), ("rec", 2, "r1"), ("rec", 3, "r2")]


@pytest.mark.parametrize("compression", list(COMPRESSORS))
def test_bad_line_inside_a_compressed_file_has_its_line_number(
    tmp_path: Path, compression: str
) -> None:
    """Errors inside a compressed file name the 1-based line of the decompressed text."""
    data = jsonl(task_rows(1)) + b"\n" + b'{"id": "x", "task": }\n' + jsonl(task_rows(1, 5))
    path = tmp_path / "in.jsonl"
    path.write_bytes(COMPRESSORS[compression](data))
    items = read(path)
    assert [(k, line) for k, line, _ in summary(items)] == [("rec", 1), ("err", 3), ("rec", 4)]
    err = items[1]
    assert isinstance(err, InputError) and "invalid JSON" in err.reason
    assert err.raw is not None and err.raw.startswith('{"id": "x"')


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_truncated_compressed_file_reports_where_reading_stopped(
    tmp_path: Path, compression: str
) -> None:
    """A file cut mid-stream yields its whole lines, then one error for the unreadable rest."""
    data = COMPRESSORS[compression](jsonl(task_rows(20_000)))  # several compressed blocks
    path = tmp_path / "in.jsonl"
    path.write_bytes(data[: len(data) // 2])
    items = read(path)
    *recs, last = items
    assert isinstance(last, InputError) and "the rest of the file cannot be read" in last.reason
    whole = [i for i in recs if isinstance(i, Record)]
    assert 0 < len(whole) < 20_000
    assert last.line == len(recs) + 1
    assert count_rows(path) == len(items)  # the count agrees with what the run will see


def test_appended_gzip_members_are_one_input(tmp_path: Path) -> None:
    """Records appended as a new gzip member (cat a.gz b.gz) are read after the first ones."""
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl(task_rows(2))) + gzip.compress(jsonl(task_rows(2, 2))))
    assert [i[2] for i in summary(read(path))] == ["r0", "r1", "r2", "r3"]


def test_zstd_frames_are_one_input(tmp_path: Path) -> None:
    """A zstd file of several frames (appended, or written in parallel) reads as one stream."""
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(zstd_compress(jsonl(task_rows(2))) + zstd_compress(jsonl(task_rows(2, 2))))
    assert [i[2] for i in summary(read(path))] == ["r0", "r1", "r2", "r3"]


# -- CSV -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "type_", "value"),
    [
        ("hello", "string", "hello"),
        (" spaced ", "string", " spaced "),
        ("", "string", None),
        ("", "integer", None),
        ('["dog", "frisbee"]', "string-list", ["dog", "frisbee"]),
        (" [] ", "string-list", []),
        ("42", "integer", 42),
        (" -7 ", "integer", -7),
        ("3", "number", 3),
        ("2.5", "number", 2.5),
        ("1e3", "number", 1000.0),
        ("true", "boolean", True),
        ("FALSE", "boolean", False),
        ("1", "boolean", True),
        ("no", "boolean", False),
        ("plain text", "any", "plain text"),
        ('["a", 1]', "any", ["a", 1]),
        ('{"k": [1]}', "any", {"k": [1]}),
        ("[not json", "any", "[not json"),
    ],
)
def test_csv_cell_is_read_as_its_job_field_type(text: str, type_: str, value: object) -> None:
    """A cell becomes the job field's type; an empty cell is a missing value."""
    assert cell_value(text, type_) == value


@pytest.mark.parametrize(
    ("text", "type_", "says"),
    [
        ("dog, frisbee", "string-list", "JSON list"),
        ('{"a": 1}', "string-list", "JSON list"),
        ("4.5", "integer", "expected an integer"),
        ("ten", "number", "expected a number"),
        ("maybe", "boolean", "expected true or false"),
    ],
)
def test_csv_cell_that_does_not_fit_says_why(text: str, type_: str, says: str) -> None:
    """A cell that is not of its field's type is refused with the reason."""
    with pytest.raises(ValueError, match=says):
        cell_value(text, type_)


def write_csv(tmp_path: Path, text: str, name: str = "in.csv") -> Path:
    """A CSV file holding ``text``."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_rows_become_records_typed_by_the_job(tmp_path: Path) -> None:
    """Job fields are typed from their cells; other columns stay strings; rows number from 1."""
    path = write_csv(
        tmp_path,
        'id,task,tags,n,ok,note\r\nr1,sum a list,"[""x"", ""y""]",3,true,007\r\nr2,sort,,,,\r\n',
    )
    recs = [i for i in read(path) if isinstance(i, Record)]
    assert [(r.id, r.line) for r in recs] == [("r1", 1), ("r2", 2)]
    assert recs[0].fields == {
        "id": "r1",
        "task": "sum a list",
        "tags": ["x", "y"],
        "n": 3,
        "ok": True,
        "note": "007",
    }
    assert recs[1].fields["tags"] is None and recs[1].fields["note"] == ""


def test_csv_bad_cell_names_the_row_and_field(tmp_path: Path) -> None:
    """A cell that does not fit its field is an error on its row naming the field; rows go on."""
    path = write_csv(tmp_path, "id,task,n\nr1,a,1\nr2,b,two\nr3,c,3\n")
    assert summary(read(path)) == [
        ("rec", 1, "r1"),
        ("err", 2, "expected an integer, got 'two'"),
        ("rec", 3, "r3"),
    ]
    err = read(path)[1]
    assert isinstance(err, InputError) and err.field == "n" and "r2,b,two" in (err.raw or "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # blank rows keep their number but are skipped
        ("id,task\nr1,a\n\nr2,b\n", [("rec", 1, "r1"), ("rec", 3, "r2")]),
        # a quoted cell across lines is one row
        ('id,task\nr1,"two\nlines"\nr2,b\n', [("rec", 1, "r1"), ("rec", 2, "r2")]),
        # a row with the wrong number of cells
        (
            "id,task\nr1,a,extra\nr2,b\n",
            [("err", 1, "3 cells, but the header has 2"), ("rec", 2, "r2")],
        ),
        # a missing required field
        ("id,task\nr1,\n", [("err", 1, "missing required field")]),
        # a byte order mark before the header
        ("\ufeffid,task\nr1,a\n", [("rec", 1, "r1")]),
        # a header only
        ("id,task\n", []),
    ],
)
def test_csv_rows_numbering_and_errors(
    tmp_path: Path, text: str, expected: list[tuple[str, int, str]]
) -> None:
    """CSV records and errors carry 1-based row numbers counted after the header."""
    path = write_csv(tmp_path, text)
    assert summary(read(path)) == expected
    assert count_rows(path) == len(expected)


def test_csv_row_with_invalid_utf8_is_an_error_of_its_own(tmp_path: Path) -> None:
    """Bad UTF-8 spoils only its row, not the rest of the file."""
    path = tmp_path / "in.csv"
    path.write_bytes(b"id,task\nr1,caf\xe9\nr2,b\n")
    assert summary(read(path)) == [("err", 1, "invalid UTF-8"), ("rec", 2, "r2")]


def test_compressed_csv_is_read(tmp_path: Path) -> None:
    """A gzip-compressed CSV named .csv.gz is read as CSV."""
    path = tmp_path / "in.csv.gz"
    path.write_bytes(gzip.compress(b"id,task\nr1,a\nr2,b\n"))
    assert summary(read(path)) == [("rec", 1, "r1"), ("rec", 2, "r2")]


@pytest.mark.parametrize(
    ("header", "says"),
    [("id,task,id\n", "the column name 'id' twice"), ("id,,task\n", "an empty column name")],
)
def test_csv_header_problems_refuse_the_file(tmp_path: Path, header: str, says: str) -> None:
    """A header with repeated or empty names makes the whole file unusable: a ConfigError."""
    path = write_csv(tmp_path, header + "r1,a,b\n")
    with pytest.raises(ConfigError, match=says) as caught:
        check_input(path)
    assert str(path) in str(caught.value)


# -- identity ----------------------------------------------------------------------------------


def test_appending_to_compressed_jsonl_keeps_its_identity(tmp_path: Path) -> None:
    """Rows appended to a .jsonl.gz (a new member), or the file recompressed, are the same input."""
    first = jsonl(task_rows(3))
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(first))
    recorded = fingerprint(path)
    path.write_bytes(gzip.compress(first) + gzip.compress(jsonl(task_rows(2, 3))))
    assert same_input(path, recorded)
    path.write_bytes(lzma.compress(first + jsonl(task_rows(2, 3))))
    assert same_input(path, recorded)
    path.write_bytes(gzip.compress(jsonl(task_rows(3, 1))))
    assert not same_input(path, recorded)


def test_appending_csv_rows_keeps_its_identity(tmp_path: Path) -> None:
    """A CSV with rows appended is the same input; one with an edited row is not."""
    path = write_csv(tmp_path, "id,task\nr1,a\n")
    recorded = fingerprint(path)
    write_csv(tmp_path, "id,task\nr1,a\nr2,b\n")
    assert same_input(path, recorded)
    write_csv(tmp_path, "id,task\nr1,A\nr2,b\n")
    assert not same_input(path, recorded)


def test_another_format_is_another_input(tmp_path: Path) -> None:
    """The same bytes read as CSV instead of JSONL are a different input."""
    text = "id,task\nr1,a\n"
    recorded = fingerprint(write_csv(tmp_path, text, "in.txt"))
    assert recorded["format"] == "jsonl"
    assert not same_input(write_csv(tmp_path, text, "in.csv"), recorded)


def test_fingerprint_of_an_older_manifest_still_matches(tmp_path: Path) -> None:
    """Manifests written before formats existed (no ``format`` key) identify plain JSONL."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(task_rows(2)))
    recorded = fingerprint(path)
    del recorded["format"]
    assert same_input(path, recorded)


# -- runs --------------------------------------------------------------------------------------


def test_300_records_as_jsonl_gz_run_to_completion(sim: Simulator, tmp_path: Path) -> None:
    """A gzip-compressed JSONL input runs every record to one output line (exit 0)."""
    rows = concept_rows(300)
    inp = tmp_path / "cg.jsonl.gz"
    inp.write_bytes(gzip.compress(jsonl(rows)))
    result = run_commongen(sim, inp, tmp_path / "run")
    assert result.exit_code == 0
    assert result.counters.total == 300
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted((o["id"], o["line"]) for o in outs) == sorted(
        (str(r["id"]), i + 1) for i, r in enumerate(rows)
    )
    assert all(o["status"] == "done" for o in outs)
    info = collect(tmp_path / "run")
    assert (info["records"], info["pending"]) == (300, 0)


def test_csv_input_runs_with_list_cells(sim: Simulator, tmp_path: Path) -> None:
    """A CSV whose concepts cells hold JSON lists runs as commongen records."""
    rows = concept_rows(20)
    lines = ["id,concepts"] + [
        f'{r["id"]},"{orjson.dumps(r["concepts"]).decode().replace(chr(34), chr(34) * 2)}"'
        for r in rows
    ]
    inp = write_csv(tmp_path, "\n".join(lines) + "\n")
    result = run_commongen(sim, inp, tmp_path / "run")
    assert result.exit_code == 0
    prompts = " ".join(str(b["messages"]) for b in sim.completed_bodies())
    assert all(", ".join(r["concepts"]) in prompts for r in rows)


def test_rerun_with_appended_gzip_rows_processes_only_the_new(
    sim: Simulator, tmp_path: Path
) -> None:
    """Re-running after appending rows to a .jsonl.gz continues the run with only the new ones."""
    rows = concept_rows(30)
    inp = tmp_path / "cg.jsonl.gz"
    inp.write_bytes(gzip.compress(jsonl(rows[:20])))
    assert run_commongen(sim, inp, tmp_path / "run").exit_code == 0
    with inp.open("ab") as fh:
        fh.write(gzip.compress(jsonl(rows[20:])))
    again = run_commongen(sim, inp, tmp_path / "run")
    assert again.exit_code == 0
    assert (again.counters.already, again.counters.done, again.counters.total) == (20, 10, 30)
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 30


def test_unsupported_input_stops_before_the_run_starts(sim: Simulator, tmp_path: Path) -> None:
    """A zip given as input is refused before the run directory is used."""
    inp = tmp_path / "data.zip"
    inp.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with pytest.raises(ConfigError, match="zip archive"):
        run_commongen(sim, inp, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert sim.requests == []


def test_run_does_not_wait_for_the_input_count(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call goes out while the input is still being counted; the end stops the count."""
    first_call = threading.Event()
    seen: dict[str, bool] = {}

    def endless_count(path: Path, tick: Callable[[], None] | None = None) -> int:
        # Waits for the first model call, then counts on until the run cancels it via tick;
        # a runner that waited for the count, or never stopped it, runs out of time here.
        assert tick is not None
        seen["call_while_counting"] = first_call.wait(30)
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                tick()
                time.sleep(0.005)
        except BaseException:
            seen["cancelled"] = True
            raise
        return 0

    def watch() -> None:
        while not first_call.is_set() and "call_while_counting" not in seen:
            if sim.requests:
                first_call.set()
            time.sleep(0.002)

    monkeypatch.setattr("pipeline.runs.session.count_records", endless_count)
    inp = tmp_path / "in.jsonl.gz"
    inp.write_bytes(gzip.compress(jsonl(concept_rows(5))))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = run_commongen(sim, inp, tmp_path / "run")
    watcher.join(5)
    assert seen == {"call_while_counting": True, "cancelled": True}
    assert result.exit_code == 0 and result.counters.done == 5
