"""``index.html`` in a real browser: headless Chromium loads it from disk and is clicked through.

Chromium is Debian's ``chromium`` package (or ``$REFINE_CHROMIUM``), driven through
Playwright; Playwright's own browser download is never used. Without a browser these
tests skip, saying so.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.report import write_report
from tests.report.runs import Reported, make_run, record, step

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page

pytestmark = pytest.mark.usefixtures("matplotlib")

FLAGS = [
    "--no-sandbox",  # tests run as root in CI containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """$REFINE_CHROMIUM, else the first Chromium on PATH."""
    named = os.environ.get("REFINE_CHROMIUM")
    if named:
        return named
    return next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium, or a skip naming what is missing."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
    )
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium found: apt-get install chromium, or set REFINE_CHROMIUM")
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=path, args=FLAGS)
        yield launched
        launched.close()


@dataclass
class Visit:
    """A page opened from disk, with what it logged and fetched."""

    page: Page
    problems: list[str] = field(default_factory=list)  # console errors/warnings, page errors
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


def visit(browser: Browser, path: Path, fragment: str = "") -> Visit:
    """Open ``path`` (plus ``#fragment``) in a fresh page, recording what happens."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    seen = Visit(page)
    page.on(
        "console",
        lambda m: (
            seen.problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
        ),
    )
    page.on("pageerror", lambda e: seen.problems.append(f"page error: {e}"))
    page.on("request", lambda r: seen.requests.append(r.url))

    def dismiss(dialog: Dialog) -> None:
        seen.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    page.goto(path.as_uri() + (f"#{fragment}" if fragment else ""))
    page.wait_for_load_state("load")
    return seen


def listed_ids(page: Page) -> list[str]:
    """Ids of the rows the record list shows now."""
    return [
        str(v)
        for v in page.eval_on_selector_all(
            "#record-list tr[data-id]", "rs => rs.map(r => r.dataset.id)"
        )
    ]


def answers(steps: list[dict[str, Any]]) -> dict[int, str]:
    """Each iteration's answer in a trace (attempts the loop asked again left out)."""
    return {
        s["iteration"]: s["output"]
        for s in steps
        if s["role"] != "feedback" and (s.get("error") or {}).get("type") not in RETRIED
    }


RETRIED = ("copy", "cut_off")  # error types of attempts the loop asked again


# -- the 25-record run -------------------------------------------------------------------------


def test_page_loads_from_disk_without_errors_or_requests(
    browser: Browser, reported: Reported
) -> None:
    """Loading the page logs no error and requests nothing but the file itself."""
    seen = visit(browser, reported.page, "records")
    seen.page.wait_for_selector("#record-list tr[data-id]")
    assert seen.problems == []
    assert seen.requests == [reported.page.as_uri()]  # the fragment is not part of a request
    seen.page.close()


def test_lists_all_records_in_file_order(browser: Browser, reported: Reported) -> None:
    """The record list shows every id of the run, in outputs.jsonl's line order."""
    seen = visit(browser, reported.page, "records")
    by_line = sorted(reported.outputs, key=lambda o: o["line"])
    assert listed_ids(seen.page) == [o["id"] for o in by_line]
    assert len(by_line) == 25
    assert seen.page.inner_text("#record-count") == "25 of 25 listed records match"
    # The main measure's columns: coverage, one precision for the whole column.
    headers = seen.page.eval_on_selector_all("#record-list th", "hs => hs.map(h => h.textContent)")
    assert "coverage initial" in headers
    column = headers.index("coverage initial") + 1
    cells = seen.page.eval_on_selector_all(
        f"#record-list tbody td:nth-child({column})", "cs => cs.map(c => c.textContent)"
    )
    assert len(cells) == 25 and all(re.fullmatch(r"\d\.\d{3}|-", c) for c in cells), cells
    seen.page.close()


def test_opening_a_record_shows_its_iterations(browser: Browser, reported: Reported) -> None:
    """Clicking a row shows each answer in order, the diffs, the feedback, and the chosen one."""
    done = [o for o in reported.outputs if o["status"] == "done"]
    rec = next(o for o in done if len(set(answers(reported.traces[o["id"]]).values())) >= 2)
    steps = reported.traces[rec["id"]]
    seen = visit(browser, reported.page, "records")
    seen.page.click(f'#record-list tr[data-id="{rec["id"]}"]')
    seen.page.wait_for_selector("#record .iteration")
    cards = seen.page.query_selector_all("#record .iteration")
    outputs = answers(steps)
    assert [c.get_attribute("data-t") for c in cards] == [str(t) for t in sorted(outputs)]
    chosen = seen.page.query_selector_all("#record .iteration.chosen")
    assert [c.get_attribute("data-t") for c in chosen] == [str(rec["chosen_iteration"])]
    assert "chosen" in chosen[0].inner_text()
    # Iteration 0 shows its answer as written; later ones as changes from the one before,
    # which read back to the answer when the deletions are left out.
    assert cards[0].eval_on_selector("pre.answer", "p => p.textContent") == outputs[0]
    for card in cards[1:]:
        t = int(card.get_attribute("data-t") or -1)
        kept = card.eval_on_selector(
            "pre.diff",
            "p => [...p.childNodes].filter(n => n.nodeName !== 'DEL')"
            ".map(n => n.textContent).join('')",
        )
        assert kept == outputs[t]
    # The feedback on iteration 0: every action the critic listed.
    fb = next(s for s in steps if s["role"] == "feedback" and s["iteration"] == 0)
    if fb["parsed"] is not None:
        shown = cards[0].inner_text()
        assert all(action in shown for action in fb["parsed"]["actions"])
    assert "gpt-4o-mini" in cards[0].inner_text()
    # Switching to plain answers shows the later answer as written.
    seen.page.click("text=as written")
    assert (
        seen.page.eval_on_selector(
            '#record .iteration[data-t="1"] pre.answer', "p => p.textContent"
        )
        == outputs[1]
    )
    assert seen.problems == []
    seen.page.close()


def test_cut_off_answer_asked_again_is_shown_aside(browser: Browser, reported: Reported) -> None:
    """An answer cut off at max_tokens and asked again is under its iteration, folded away."""
    rid, cut = next(
        (rid, s)
        for rid, steps in reported.traces.items()
        for s in steps
        if (s.get("error") or {}).get("type") == "cut_off" and s["role"] != "feedback"
    )
    seen = visit(browser, reported.page, f"record={rid}")
    card = seen.page.wait_for_selector(f'#record .iteration[data-t="{cut["iteration"]}"]')
    assert card is not None
    summary = card.query_selector("details summary:has-text('ran into max_tokens')")
    assert summary is not None and summary.inner_text().startswith("1 earlier attempt")
    summary.click()
    shown = card.eval_on_selector_all("details pre", "ps => ps.map(p => p.textContent)")
    assert cut["output"] in shown
    assert seen.problems == []
    seen.page.close()


def test_failed_record_shows_its_error(browser: Browser, reported: Reported) -> None:
    """A failed record's page shows the error that failed it."""
    rec = next(o for o in reported.outputs if o["status"] == "failed")
    seen = visit(browser, reported.page, f"record={rec['id']}")
    seen.page.wait_for_selector("#record .record-head")
    boxes = seen.page.inner_text("#record")
    assert rec["error"]["type"] in boxes and rec["error"]["message"] in boxes
    seen.page.close()


def test_unparseable_feedback_shows_its_raw_text(browser: Browser, reported: Reported) -> None:
    """Feedback that could not be parsed shows its error and the raw answer."""
    rid, fb = next(
        (rid, s)
        for rid, steps in reported.traces.items()
        for s in steps
        if s["role"] == "feedback" and s["parsed"] is None
    )
    seen = visit(browser, reported.page, f"record={rid}")
    card = seen.page.wait_for_selector(f'#record .iteration[data-t="{fb["iteration"]}"]')
    assert card is not None
    text = card.inner_text()
    assert fb["error"]["type"] in text and "raw feedback" in text.lower()
    assert fb["response"].strip()[:40] in card.eval_on_selector_all(
        "pre", "ps => ps.map(p => p.textContent).join('\\n')"
    )
    seen.page.close()


def test_filters_and_search(browser: Browser, reported: Reported) -> None:
    """Status, id search and the measure's change each narrow the list to the right ids."""
    seen = visit(browser, reported.page, "records")
    page = seen.page
    failed = {o["id"] for o in reported.outputs if o["status"] == "failed"}
    page.select_option("#f-status", label="failed")
    assert set(listed_ids(page)) == failed
    page.select_option("#f-status", label="any")
    page.fill("#f-search", "CG1")
    assert set(listed_ids(page)) == {o["id"] for o in reported.outputs if "cg1" in o["id"]}
    page.fill("#f-search", "")
    # Coverage of any sentence: the simulator's placeholder answers seldom cover a concept
    # in their first sentence, so that measure hardly moves.
    page.select_option("#f-measure", label="coverage_any_sentence")

    def coverage(o: dict[str, Any], t: int) -> float:
        return float(o["metrics_by_iteration"][t]["coverage_any_sentence"])

    scored = [
        o
        for o in reported.outputs
        if o["metrics_by_iteration"] and o["chosen_iteration"] is not None
    ]
    expected = {
        "improved": {
            o["id"] for o in scored if coverage(o, o["chosen_iteration"]) > coverage(o, 0)
        },
        "worsened": {
            o["id"] for o in scored if coverage(o, o["chosen_iteration"]) < coverage(o, 0)
        },
    }
    assert any(0 < len(ids) < 25 for ids in expected.values())  # the filter has work to do
    for change, ids in expected.items():
        page.select_option("#f-change", change)
        assert set(listed_ids(page)) == ids, change
    page.close()


# -- the word diff -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def diff_page(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A report page whose script's diff can be called."""
    run_dir = make_run(tmp_path_factory.mktemp("diff") / "run", [record("a", [1])])
    seen = visit(browser, write_report(run_dir).html)
    yield seen.page
    seen.page.close()


@pytest.mark.parametrize(
    ("before", "after", "runs"),
    [
        ("a b c", "a b c", [["=", "a b c"]]),
        ("", "new", [["+", "new"]]),
        ("old", "", [["-", "old"]]),
        ("the cat sat", "the dog sat", [["=", "the "], ["-", "cat"], ["+", "dog"], ["=", " sat"]]),
        ("one two", "one two three", [["=", "one two"], ["+", " three"]]),
        ("x, y", "x; y", [["=", "x"], ["-", ","], ["+", ";"], ["=", " y"]]),
        ("a b", "b a", [["-", "a "], ["=", "b"], ["+", " a"]]),  # deletions first, as Myers
        ("café au lait", "café noir", [["=", "café "], ["-", "au lait"], ["+", "noir"]]),
    ],
)
def test_word_diff(diff_page: Page, before: str, after: str, runs: list[list[str]]) -> None:
    """The diff marks whole words, spaces and punctuation as kept, deleted or inserted."""
    assert diff_page.evaluate("([a, b]) => refineReport.diff(a, b)", [before, after]) == runs


def test_word_diff_reads_back_both_texts(diff_page: Page) -> None:
    """Kept plus deleted runs give the old text, kept plus inserted the new, for random edits."""
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", ",", ".", " ", "\n", "x1"]
    pairs = []
    for _ in range(40):
        a = "".join(rng.choice(words) for _ in range(rng.randrange(0, 60)))
        edited = list(a)
        for _ in range(rng.randrange(0, 8)):
            edited.insert(rng.randrange(0, len(edited) + 1), rng.choice(words))
        pairs.append([a, "".join(edited)])
    # Past the edit budget the diff gives up on detail: old text out, new text in.
    far = [" ".join(f"w{i}" for i in range(3000)), " ".join(f"v{i}" for i in range(3000))]
    pairs.append(far)
    for (a, b), runs in zip(
        pairs,
        diff_page.evaluate("ps => ps.map(([a, b]) => refineReport.diff(a, b))", pairs),
        strict=True,
    ):
        assert "".join(t for op, t in runs if op != "+") == a
        assert "".join(t for op, t in runs if op != "-") == b


# -- hand-made runs ----------------------------------------------------------------------------


def test_hostile_text_is_shown_as_text(browser: Browser, tmp_path: Path) -> None:
    """Markup inside an answer is shown literally: no element, no script, no request."""
    evil = '<img src="x" onerror="alert(1)"></script><script>alert(2)</script>'
    trace = {"id": "r1", "steps": [step("generate", 0, output=evil)]}
    page_path = write_report(make_run(tmp_path / "run", [record("r1", [1])], [trace])).html
    seen = visit(browser, page_path, "record=r1")
    seen.page.wait_for_selector("#record .iteration")
    assert seen.page.eval_on_selector("#record pre.answer", "p => p.textContent") == evil
    assert seen.page.query_selector('img[src="x"]') is None
    assert seen.dialogs == [] and seen.problems == []
    assert seen.requests == [page_path.as_uri()]
    seen.page.close()


def test_record_without_iterations_says_how_to_get_them(browser: Browser, tmp_path: Path) -> None:
    """A listed record whose iterations were not embedded says how to embed them."""
    lines = [record(f"r{i}", []) for i in range(3)]
    traces = [{"id": f"r{i}", "steps": [step("generate", 0, output="x")]} for i in range(3)]
    page_path = write_report(make_run(tmp_path / "run", lines, traces), details=1).html
    seen = visit(browser, page_path, "record=r2")
    seen.page.wait_for_selector("#record .record-head")
    assert "--records FILE" in seen.page.inner_text("#record")
    assert seen.page.query_selector("#record .iteration") is None
    seen.page.close()


def test_empty_run_page_works(browser: Browser, tmp_path: Path) -> None:
    """A run with no finished record yet gives a page that loads cleanly and lists nothing."""
    page_path = write_report(make_run(tmp_path / "run", [])).html
    seen = visit(browser, page_path, "records")
    seen.page.wait_for_selector("#record-count")
    assert seen.page.inner_text("#record-count") == "0 of 0 listed records match"
    assert listed_ids(seen.page) == [] and seen.problems == []
    seen.page.close()


def test_round_filter_lists_the_records_a_round_made_worse_side_by_side(
    browser: Browser, tmp_path: Path
) -> None:
    """The round filter keeps the records a round made worse (or better), and an opened one
    shows that round's two answers side by side."""
    correct = {
        "a": [False, True, True],
        "b": [True, False],
        "d": [False, True],
        "e": [True, True, False],
    }
    outputs, traces = [], []
    for rid, values in correct.items():
        metrics = [{"correct": v} for v in values]
        outputs.append(record(rid, [None] * len(values), metrics=metrics))
        steps = []
        for t in range(len(values)):
            role = "refine" if t else "generate"
            steps += [step(role, t, output=f"{rid} answer {t}", iteration_answer=True)]
            steps += [step("feedback", t)]
        traces.append({"id": rid, "steps": steps})
    page_path = write_report(make_run(tmp_path / "run", outputs, traces)).html
    seen = visit(browser, page_path, "records")
    page = seen.page
    page.select_option("#f-measure", label="correct (rate)")
    expected = {"worse:1": {"b"}, "better:1": {"a", "d"}, "better:2": set(), "worse:2": {"e"}}
    for option, ids in expected.items():
        page.select_option("#f-round", option)
        assert set(listed_ids(page)) == ids, option
    page.click('#record-list tr[data-id="e"]')
    sides = page.wait_for_selector("#record .compare")
    assert sides is not None and "what round 2 did" in sides.inner_text()
    shown = sides.eval_on_selector_all(
        ".side", "ss => ss.map(s => [s.dataset.t, s.querySelector('pre').textContent])"
    )
    assert shown == [["1", "e answer 1"], ["2", "e answer 2"]]
    text = sides.inner_text()
    assert "correct (rate) true" in text and "correct (rate) false" in text
    page.select_option("#f-round", "")
    assert page.query_selector("#record .compare") is None
    # Initial -> chosen: worsened shows the first answer beside the chosen output.
    page.select_option("#f-change", "worsened")
    assert set(listed_ids(page)) == {"b", "e"}
    shown = page.eval_on_selector_all("#record .compare .side", "ss => ss.map(s => s.dataset.t)")
    assert shown == ["0", "2"]
    assert seen.problems == []
    page.close()
