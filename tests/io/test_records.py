"""Reading input: records, bad lines, ids, duplicates and the input fingerprint."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline.core.jobs import InputField
from pipeline.core.records import Record, record_id
from pipeline.errors import InputError
from pipeline.io.records import fingerprint, read_records, same_input
from tests.helpers import write_jsonl

INPUTS = (
    InputField("task", "string"),
    InputField("tags", "string-list", required=False),
    InputField("n", "integer", required=False),
)
BOM = b"\xef\xbb\xbf"


def read(path: Path, id_field: str = "id") -> list[Record | InputError]:
    """Every item the reader yields for ``path``."""
    return list(read_records(path, INPUTS, id_field))


def write(tmp_path: Path, data: bytes) -> Path:
    """An input file holding exactly ``data``."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    return path


def records(items: list[Record | InputError]) -> list[Record]:
    """Only the records, asserting there were no errors."""
    errors = [i for i in items if isinstance(i, InputError)]
    assert errors == []
    return [i for i in items if isinstance(i, Record)]


def only_error(items: list[Record | InputError]) -> InputError:
    """The single InputError among ``items``."""
    errors = [i for i in items if isinstance(i, InputError)]
    assert len(errors) == 1, items
    return errors[0]


# -- line handling ---------------------------------------------------------------------------


def test_bom_on_first_line_is_accepted(tmp_path: Path) -> None:
    """A UTF-8 byte order mark before the first record is not part of the JSON."""
    path = write(tmp_path, BOM + b'{"id": "a", "task": "t"}\n{"id": "b", "task": "u"}\n')
    recs = records(read(path))
    assert [(r.id, r.line, r.fields["task"]) for r in recs] == [("a", 1, "t"), ("b", 2, "u")]


def test_crlf_line_endings_are_accepted(tmp_path: Path) -> None:
    """Windows line endings end a line; the carriage return is not left in the data."""
    path = write(tmp_path, b'{"id": "a", "task": "t"}\r\n{"id": "b", "task": "u"}\r\n')
    recs = records(read(path))
    assert [(r.id, r.line, r.fields) for r in recs] == [
        ("a", 1, {"id": "a", "task": "t"}),
        ("b", 2, {"id": "b", "task": "u"}),
    ]


def test_last_line_without_newline_is_read(tmp_path: Path) -> None:
    """A final record without a trailing newline is still a record."""
    path = write(tmp_path, b'{"id": "a", "task": "t"}\n{"id": "b", "task": "u"}')
    assert [r.id for r in records(read(path))] == ["a", "b"]


def test_blank_lines_are_skipped_but_counted(tmp_path: Path) -> None:
    """Whitespace-only lines are not records nor errors, yet line numbers stay physical."""
    data = b'\n{"id": "a", "task": "t"}\n   \n\t\r\n\r\n{"id": "b", "task": "u"}\n\n'
    recs = records(read(write(tmp_path, data)))
    # physical lines: 1 blank, 2 a, 3 spaces, 4 tab+CR, 5 CR, 6 b, 7 blank
    assert [(r.id, r.line) for r in recs] == [("a", 2), ("b", 6)]


def test_bom_only_first_line_is_blank(tmp_path: Path) -> None:
    """A first line that is only a byte order mark is blank once the BOM is removed."""
    path = write(tmp_path, BOM + b"\n" + b'{"id": "a", "task": "t"}\n')
    assert [(r.id, r.line) for r in records(read(path))] == [("a", 2)]


def test_unicode_line_separators_inside_strings_do_not_split_records(tmp_path: Path) -> None:
    """Only \\n ends a line: U+2028 and U+0085 inside a JSON string stay in the record."""
    task = "first\u2028second\x85third"
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "task": task}, {"id": "b", "task": "u"}])
    recs = records(read(path))
    assert [(r.id, r.line, r.fields["task"]) for r in recs] == [("a", 1, task), ("b", 2, "u")]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"task": }', "invalid JSON"),
        (b'{"task": "a"', "invalid JSON"),
        (b"{'task': 'a'}", "invalid JSON"),
        (b'["a", "b"]', "got array"),
        (b'"just a string"', "got string"),
        (b"42", "got number"),
        (b"4.5", "got number"),
        (b"null", "got null"),
        (b"true", "got boolean"),
        (b'{"task": "caf\xe9"}', "invalid UTF-8"),
        (b'{"task": "\xff\xfe"}', "invalid UTF-8"),
    ],
)
def test_bad_line_is_an_error_with_its_line_and_reason(
    tmp_path: Path, raw: bytes, reason: str
) -> None:
    """A line that is not a JSON object is an InputError on its 1-based line; reading goes on."""
    data = b'{"id": "a", "task": "t"}\n\n' + raw + b'\n{"id": "b", "task": "u"}\n'
    items = read(write(tmp_path, data))
    err = only_error(items)
    assert err.line == 3
    assert reason in err.reason
    assert err.field is None
    assert err.raw is not None and err.raw != ""
    assert [(i.id, i.line) for i in items if isinstance(i, Record)] == [("a", 1), ("b", 4)]


def test_error_keeps_the_start_of_a_long_bad_line(tmp_path: Path) -> None:
    """The raw text kept for errors.jsonl is the start of the line, truncated."""
    raw = b'{"task": "' + b"x" * 5000  # unterminated: invalid JSON
    err = only_error(read(write(tmp_path, raw + b"\n")))
    assert err.raw is not None
    assert raw.decode().startswith(err.raw)
    assert 0 < len(err.raw) < 5000


# -- fields ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "field", "reason"),
    [
        ({"id": "a"}, "task", "missing"),
        ({"id": "a", "task": None}, "task", "missing"),
        ({"id": "a", "task": 3}, "task", "expected string"),
        ({"id": "a", "task": ["t"]}, "task", "expected string"),
        ({"id": "a", "task": "t", "tags": ["x", 1]}, "tags", "expected string-list"),
        ({"id": "a", "task": "t", "tags": "x"}, "tags", "expected string-list"),
        ({"id": "a", "task": "t", "n": "3"}, "n", "expected integer"),
        ({"id": "a", "task": "t", "n": 3.5}, "n", "expected integer"),
        ({"id": "a", "task": "t", "n": True}, "n", "expected integer"),
    ],
)
def test_field_errors_name_the_field(
    tmp_path: Path, row: dict[str, object], field: str, reason: str
) -> None:
    """A missing required field or a wrong-typed field is an error naming that field."""
    err = only_error(read(write_jsonl(tmp_path / "in.jsonl", [row])))
    assert (err.line, err.field) == (1, field)
    assert reason in err.reason
    assert repr(field) in str(err)


@pytest.mark.parametrize(
    "row",
    [
        {"id": "a", "task": "t"},
        {"id": "a", "task": "t", "tags": None, "n": None},
        {"id": "a", "task": "t", "tags": [], "n": 0},
        {"id": "a", "task": "t", "tags": ["x", "y"], "n": -4, "extra": {"k": [1, 2]}},
    ],
)
def test_optional_fields_may_be_absent_null_or_valid(
    tmp_path: Path, row: dict[str, object]
) -> None:
    """Optional fields are not required; every field of the line is kept as is."""
    [rec] = records(read(write_jsonl(tmp_path / "in.jsonl", [row])))
    assert rec.fields == row


# -- ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "id_field", "expected"),
    [
        ({"id": "r-1", "task": "t"}, "id", "r-1"),
        ({"id": 7, "task": "t"}, "id", "7"),
        ({"id": 0, "task": "t"}, "id", "0"),
        ({"key": "k9", "id": "ignored", "task": "t"}, "key", "k9"),
        ({"key": 12, "task": "t"}, "key", "12"),
    ],
)
def test_id_comes_from_the_id_field(
    tmp_path: Path, row: dict[str, object], id_field: str, expected: str
) -> None:
    """The --id-field value (string or integer) is the record id, as a string."""
    [rec] = records(read(write_jsonl(tmp_path / "in.jsonl", [row]), id_field))
    assert rec.id == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"task": "t", "n": 1}, {"n": 1, "task": "t"}),
        (
            {"task": "t", "meta": {"x": 1, "y": [1, 2]}},
            {"meta": {"y": [1, 2], "x": 1}, "task": "t"},
        ),
    ],
)
def test_hash_id_ignores_key_order(a: dict[str, object], b: dict[str, object]) -> None:
    """Without an id field, the same content gives the same id whatever the key order."""
    assert record_id(a, "id") == record_id(b, "id")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"task": "t"}, {"task": "u"}),
        ({"task": "t"}, {"task": "t", "n": 1}),
        ({"task": "t", "n": 1}, {"task": "t", "n": "1"}),
        ({"task": "t", "meta": {"x": 1}}, {"task": "t", "meta": {"x": 2}}),
    ],
)
def test_hash_id_differs_for_different_content(a: dict[str, object], b: dict[str, object]) -> None:
    """Without an id field, records that differ in any value get different ids."""
    assert record_id(a, "id") != record_id(b, "id")


def test_hash_id_is_used_when_the_id_field_is_absent(tmp_path: Path) -> None:
    """Records without the id field get content ids, the same on every read."""
    rows: list[dict[str, object]] = [{"task": "t"}, {"task": "u"}]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    first = [r.id for r in records(read(path))]
    second = [r.id for r in records(read(path))]
    assert first == second
    assert first == [record_id(rows[0], "id"), record_id(rows[1], "id")]
    assert len(set(first)) == 2
    assert "t" not in first and "u" not in first


@pytest.mark.parametrize("value", [1.5, True, False, ["a"], {"k": "v"}])
def test_id_of_wrong_type_is_an_error_naming_the_field(tmp_path: Path, value: object) -> None:
    """An id field that is not a string or an integer is an error naming the id field."""
    path = write_jsonl(tmp_path / "in.jsonl", [{"key": value, "task": "t"}])
    err = only_error(read(path, "key"))
    assert (err.line, err.field) == (1, "key")


def test_duplicate_ids_are_reported_with_the_first_line(tmp_path: Path) -> None:
    """A repeated id is an error naming the line where it first appeared; the first wins."""
    rows: list[dict[str, object]] = [
        {"id": "a", "task": "first"},
        {"id": "b", "task": "t"},
        {"id": "a", "task": "second"},
        {"id": "a", "task": "third"},
    ]
    items = read(write_jsonl(tmp_path / "in.jsonl", rows))
    recs = [i for i in items if isinstance(i, Record)]
    errs = [i for i in items if isinstance(i, InputError)]
    assert [(r.id, r.line, r.fields["task"]) for r in recs] == [("a", 1, "first"), ("b", 2, "t")]
    assert [(e.line, e.field) for e in errs] == [(3, "id"), (4, "id")]
    assert all("first on line 1" in e.reason for e in errs)


def test_identical_records_without_ids_are_duplicates(tmp_path: Path) -> None:
    """Two lines with the same content and no id are one record (content ids collide)."""
    rows: list[dict[str, object]] = [{"task": "t"}, {"task": "u"}, {"task": "t"}]
    items = read(write_jsonl(tmp_path / "in.jsonl", rows))
    assert [(i.line, type(i).__name__) for i in items] == [
        (1, "Record"),
        (2, "Record"),
        (3, "InputError"),
    ]


def test_ten_megabyte_line_parses(tmp_path: Path) -> None:
    """A single 10 MB line is read whole (no line-length limit)."""
    task = "x" * 10_000_000
    path = write_jsonl(
        tmp_path / "in.jsonl", [{"id": "big", "task": task}, {"id": "b", "task": "u"}]
    )
    recs = records(read(path))
    assert [(r.id, r.line) for r in recs] == [("big", 1), ("b", 2)]
    assert recs[0].fields["task"] == task


# -- fingerprint -----------------------------------------------------------------------------


def rows_bytes(rows: list[dict[str, object]]) -> bytes:
    """The JSONL bytes of ``rows``."""
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def test_appending_records_keeps_the_input_identity(tmp_path: Path) -> None:
    """An input with records appended is the same input (re-runs process only the new ones)."""
    path = write(tmp_path, rows_bytes([{"id": "a", "task": "t"}, {"id": "b", "task": "u"}]))
    recorded = fingerprint(path)
    with path.open("ab") as fh:
        fh.write(rows_bytes([{"id": "c", "task": "v"}]))
    assert same_input(path, recorded)


@pytest.mark.parametrize(
    "edited",
    [
        rows_bytes([{"id": "a", "task": "T"}, {"id": "b", "task": "u"}]),
        rows_bytes([{"id": "z", "task": "t"}, {"id": "b", "task": "u"}]),
        rows_bytes([{"id": "a", "task": "t"}]),
        b"",
    ],
)
def test_editing_or_truncating_the_input_breaks_its_identity(tmp_path: Path, edited: bytes) -> None:
    """A changed first record, or a shorter file, is another input."""
    path = write(tmp_path, rows_bytes([{"id": "a", "task": "t"}, {"id": "b", "task": "u"}]))
    recorded = fingerprint(path)
    path.write_bytes(edited)
    assert not same_input(path, recorded)


def test_fingerprint_covers_only_the_head_of_a_large_input(tmp_path: Path) -> None:
    """Past the first MiB, content does not change the identity (it stays O(1) to check)."""
    head = rows_bytes([{"id": f"r{i}", "task": "t" * 100} for i in range(12_000)])
    assert len(head) > 1 << 20
    path = write(tmp_path, head)
    recorded = fingerprint(path)
    assert recorded["head_bytes"] == 1 << 20
    path.write_bytes(head[: 1 << 20] + b"changed tail\n")
    assert same_input(path, recorded)
    path.write_bytes(b"X" + head[1:])
    assert not same_input(path, recorded)
