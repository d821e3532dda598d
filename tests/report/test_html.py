"""``index.html`` as a file: self-contained, escaped, and holding what the browser needs."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest

from pipeline.report import write_report
from pipeline.report.html import CSP
from tests.report.runs import Reported, gsm_run, make_run, record, step

pytestmark = pytest.mark.usefixtures("matplotlib")


class Page(HTMLParser):
    """The page's elements: every attribute, each script's text, and the JSON blobs."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.attrs: list[tuple[str, str, str]] = []  # (tag, name, value)
        self.scripts: list[tuple[str | None, str]] = []  # (id, text)
        self._script: str | Literal[False] | None = False  # False: outside a script
        self._buffer: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag == "script":
            self._script = dict(attrs).get("id")
            self._buffer = []

    def handle_data(self, data: str) -> None:
        if self._script is not False:
            self._buffer.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            assert self._script is not False
            self.scripts.append((self._script or None, "".join(self._buffer)))
            self._script = False

    def blob(self, ident: str) -> Any:
        """The parsed JSON of one ``<script type="application/json">``."""
        return orjson.loads(next(text for i, text in self.scripts if i == ident))


def outside_data(text: str) -> str:
    """The page without its JSON blobs (record text may quote any URL)."""
    return re.sub(r'<script type="application/json".*?</script>', "", text, flags=re.S)


def test_page_references_nothing_outside_itself(reported: Reported) -> None:
    """No attribute, style or script points anywhere but into the page or a data: URI."""
    text = reported.page.read_text(encoding="utf-8")
    page = Page(text)
    for tag, name, value in page.attrs:
        if name in ("src", "href", "action", "poster", "srcset", "data"):
            assert value.startswith(("data:", "#")), (tag, name, value[:80])
    code = outside_data(text)
    assert not re.search(r"(https?:)?//[\w.-]+\.\w", code.replace(" //", " ")), "a URL"
    assert "url(" not in code and "@import" not in code
    assert f'content="{CSP}"' in text and "default-src 'none'" in CSP


def test_plots_are_inlined_as_the_written_pngs(reported: Reported) -> None:
    """Every PNG next to report.md is in the page, byte for byte, as a data: URI."""
    page = Page(reported.page.read_text(encoding="utf-8"))
    inlined = {
        base64.b64decode(v.removeprefix("data:image/png;base64,"))
        for tag, name, v in page.attrs
        if tag == "img" and name == "src"
    }
    pngs = {p.read_bytes() for p in reported.page.parent.glob("*.png")}
    assert len(pngs) >= 5 and inlined == pngs


def test_page_embeds_every_record(reported: Reported) -> None:
    """The rows list every record and every record's iterations are embedded."""
    page = Page(reported.page.read_text(encoding="utf-8"))
    ids = [o["id"] for o in reported.outputs]
    assert [row[0] for row in page.blob("report-rows")] == ids
    assert sorted(page.blob("report-details")) == sorted(ids)
    meta = page.blob("report-meta")
    assert (meta["total"], meta["listed"], meta["detailed"], meta["selection"]) == (
        25,
        25,
        25,
        "all",
    )
    assert "coverage" in [m["label"] for m in meta["measures"]]


HOSTILE = '</script><script>alert(1)</script><!-- <img src=x onerror=alert(2)> "\u2028'


def test_record_text_cannot_break_out_of_its_script_element(tmp_path: Path) -> None:
    """Text holding </script> and comments stays data: four scripts, JSON that reads back."""
    line = record(HOSTILE, [1])
    trace = {"id": HOSTILE, "steps": [step("generate", 0, output=HOSTILE)]}
    page_path = write_report(make_run(tmp_path / "run", [line], [trace])).html
    text = page_path.read_text(encoding="utf-8")
    page = Page(text)
    assert [i for i, _ in page.scripts] == ["report-meta", "report-rows", "report-details", None]
    details = page.blob("report-details")
    assert details[HOSTILE]["iterations"][0]["output"] == HOSTILE
    assert page.blob("report-rows")[0][0] == HOSTILE
    assert "alert" not in outside_data(text)


def test_limits_are_stated_with_the_way_to_narrow(tmp_path: Path) -> None:
    """A run past the limits says how many records are listed and embedded, and how to pick."""
    lines = [record(f"r{i}", [i % 3, i % 5]) for i in range(12)]
    traces = [{"id": f"r{i}", "steps": [step("generate", 0, output="x")]} for i in range(12)]
    run_dir = make_run(tmp_path / "run", lines, traces)
    text = write_report(run_dir, details=4, listed=6).html.read_text(encoding="utf-8")
    # Embedded (one of each reason in turn): r9 most improved, r5 most worsened, r0 lowest final,
    # r3 next most improved. r9 is past the 6 listed rows, so it is listed too.
    assert "12 finished records; 7 listed below" in text
    assert "at most 6 records" in text and "at most 4 records" in text
    assert f"refine report {run_dir} --records FILE" in text
    meta = Page(text).blob("report-meta")
    assert (meta["total"], meta["detailed"], meta["selection"]) == (12, 4, "chosen")
    assert sorted(Page(text).blob("report-details")) == ["r0", "r3", "r5", "r9"]


class Rows(HTMLParser):
    """The text of every table row of a page, cell by cell."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None


def test_overview_holds_the_markdown_tables(tmp_path: Path) -> None:
    """Every row of every table in report.md is a row of the page's overview, cell for cell."""
    files = write_report(gsm_run(tmp_path / "run"))
    html_rows = Rows(files.html.read_text(encoding="utf-8")).rows
    md_rows = [
        [c.strip().strip("`").replace("\\|", "|") for c in line.strip()[1:-1].split(" | ")]
        for line in files.markdown.read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    md_rows = [r for r in md_rows if any(r)]  # the header row of the facts table is empty
    assert len(md_rows) > 20
    for row in md_rows:
        assert row in html_rows, row
    assert ["", ""] not in html_rows  # no empty header row above the facts table
