"""``refine report``'s options: which records the page embeds, and bad id files."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline.cli import main
from pipeline.report import DETAIL_LIMIT, read_ids
from tests.report.runs import make_run, record, step

pytestmark = pytest.mark.usefixtures("matplotlib")


def small_run(path: Path, n: int = 4) -> Path:
    """``n`` done records r0 .. r{n-1}, each with one traced answer."""
    lines = [record(f"r{i}", [1]) for i in range(n)]
    traces = [{"id": f"r{i}", "steps": [step("generate", 0, output=f"a{i}")]} for i in range(n)]
    return make_run(path, lines, traces)


def embedded(page: Path) -> list[str]:
    """Ids whose iterations the page embeds."""
    text = page.read_text(encoding="utf-8")
    start = text.index('<script type="application/json" id="report-details">')
    blob = text[text.index(">", start) + 1 : text.index("</script>", start)]
    return sorted(orjson.loads(blob))


def test_records_file_picks_the_embedded_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--records FILE` embeds exactly the ids listed (blank lines skipped); both paths print."""
    run_dir = small_run(tmp_path / "run")
    ids = tmp_path / "ids.txt"
    ids.write_text("r2\n\n  r0  \nmissing\n")
    assert main(["report", str(run_dir), "--records", str(ids)]) == 0
    md, page = capsys.readouterr().out.split()
    assert Path(md).name == "report.md" and Path(page) == run_dir / "report" / "index.html"
    assert embedded(Path(page)) == ["r0", "r2"]


def test_details_caps_the_embedded_records(tmp_path: Path) -> None:
    """`--details N` embeds at most N records of a larger run."""
    run_dir = small_run(tmp_path / "run", 5)
    assert main(["report", str(run_dir), "--details", "2"]) == 0
    assert len(embedded(run_dir / "report" / "index.html")) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the record ids in"),
        (b"\n \n", "names no record id"),
        (b"r1\n\xff\xfe\n", ":2: record id is not UTF-8 text"),
    ],
)
def test_bad_ids_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    """An unreadable, empty or non-UTF-8 ids file stops with exit 2, naming file and line."""
    ids = tmp_path / "ids.txt"
    if content is not None:
        ids.write_bytes(content)
    assert main(["report", str(small_run(tmp_path / "run")), "--records", str(ids)]) == 2
    err = capsys.readouterr().err
    assert str(ids) in err and message in err


def test_read_ids_keeps_file_order(tmp_path: Path) -> None:
    """Ids come back in the file's order, stripped."""
    path = tmp_path / "ids.txt"
    path.write_text("b\n a \n")
    assert read_ids(path) == ["b", "a"]


def test_help_states_the_default_detail_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """`refine report --help` names the limit the library uses."""
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert f"(default {DETAIL_LIMIT})" in capsys.readouterr().out
