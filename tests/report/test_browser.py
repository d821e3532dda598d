"""The record browser's data: one row per record, iterations for the records chosen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from pipeline.report.browser import TEXT_LIMIT, Browser, Candidate, clip, record_detail
from pipeline.report.source import Pricing
from tests.report.runs import record, step

MODEL = Pricing.single("m")  # no price
MINI = Pricing.single("gpt-4o-mini")


def finished(browser: Browser) -> tuple[dict[str, Any], list[list[Any]], dict[str, Any]]:
    """The browser's meta, rows and iterations, parsed."""
    meta, rows, details = browser.finish()
    parsed = orjson.loads(b"".join(rows)), orjson.loads(b"".join(details))
    browser.close()
    return meta, *parsed


def feed(browser: Browser, outputs: Sequence[dict[str, Any]], traced: bool = True) -> Browser:
    """Give the browser these outputs lines, then a one-step trace for each."""
    for line in outputs:
        browser.output(line)
    for line in outputs if traced else ():
        browser.trace({"id": line["id"], "steps": [step("generate", 0, output="y0")]})
    return browser


# -- one record's iterations -------------------------------------------------------------------


def test_record_detail_groups_calls_by_iteration() -> None:
    """Answers, feedback, findings, copies, errors and calls land in their iteration, in order."""
    million = {"prompt_tokens": 10**6, "completion_tokens": 0}
    steps = [
        step("generate", 0, output="first", metrics={"ok": False}, checks=["no number"]),
        step(
            "feedback",
            0,
            usage=million,
            model="gpt-4o",
            parsed={"actions": ["add a number"], "done": False, "score": 3},
        ),
        step("refine", 1, output="first", error={"type": "copy", "message": "identical"}),
        step("refine", 1, output="second 2", metrics={"ok": True}, checks=[], attempts=3),
        step("feedback", 1, response="not json", error={"type": "feedback_parse", "message": "x"}),
    ]
    cand = Candidate(0, ["r"], [3, None], {"type": "server", "message": "later"}, why="failed")
    detail = record_detail(cand, steps, MINI)
    assert detail["why"] == "failed"
    assert detail["error"] == {"type": "server", "message": "later"}
    first, second = detail["iterations"]
    assert (first["t"], first["role"], first["output"]) == (0, "generate", "first")
    assert first["score"] == 3
    assert first["metrics"] == {"ok": False} and first["checks"] == ["no number"]
    fb = first["feedback"]
    assert fb["parsed"]["actions"] == ["add a number"] and fb["response"] is None
    assert [c["model"] for c in first["calls"]] == ["gpt-4o-mini", "gpt-4o"]
    assert first["calls"][1]["cost"] == pytest.approx(2.5)
    # The copy is kept aside; the retried refinement is the iteration's answer.
    assert (second["role"], second["output"], second["copies"]) == ("refine", "second 2", ["first"])
    assert second["checks"] == [] and second["score"] is None
    assert second["calls"][1]["attempts"] == 3
    # An unparsed feedback keeps its raw text, and its error.
    assert second["feedback"]["parsed"] is None
    assert second["feedback"]["response"] == "not json"
    assert second["feedback"]["error"]["type"] == "feedback_parse"


def test_record_detail_keeps_a_retried_cut_off_feedback() -> None:
    """A cut-off feedback that was retried stays shown, with its raw text, before the retry."""
    steps = [
        step("generate", 0, output="a"),
        step(
            "feedback", 0, response="doll, doll, doll", error={"type": "length", "message": "cut"}
        ),
        step("feedback", 0, parsed={"actions": ["shorter"], "done": False}),
    ]
    [it] = record_detail(Candidate(0, ["r"], [], None), steps, MODEL)["iterations"]
    assert it["feedback"]["parsed"] == {"actions": ["shorter"], "done": False}
    [earlier] = it["retried_feedback"]
    assert earlier["response"] == "doll, doll, doll" and earlier["error"]["type"] == "length"
    assert len(it["calls"]) == 3


def test_record_detail_keeps_a_cut_off_answer_asked_again_aside() -> None:
    """An answer cut off and asked again is kept aside; the retry is the iteration's answer."""
    steps = [
        step("generate", 0, output="half", error={"type": "cut_off", "message": "asked again"}),
        step("generate", 0, output="whole"),
    ]
    [it] = record_detail(Candidate(0, ["r"], [], None), steps, MODEL)["iterations"]
    assert (it["output"], it["cut_off"], it["error"]) == ("whole", ["half"], None)
    assert len(it["calls"]) == 2


def test_record_detail_keeps_a_strategys_other_drafts_aside() -> None:
    """Of an iteration's drafts (strategy samples), the one marked as the iteration's answer
    is shown as such; the others are kept aside, with their call kind."""
    steps = [
        step("generate", 0, output="draft", iteration_answer=True),
        step("refine", 1, output="first", kind="answer"),
        step("refine", 1, output="second", kind="sample", iteration_answer=True),
    ]
    _, it = record_detail(Candidate(0, ["r"], [], None), steps, MODEL)["iterations"]
    assert (it["output"], it["drafts"], it["error"]) == ("second", ["[answer] first"], None)
    assert [c["kind"] for c in it["calls"]] == ["answer", "sample"]


def test_record_detail_cost_is_unknown_when_a_call_has_no_price() -> None:
    """An iteration's dollars are the sum of its calls', or unknown when one has no price."""
    million = {"prompt_tokens": 10**6, "completion_tokens": 0}
    steps = [
        step("generate", 0, output="a", usage=million),
        step("feedback", 0, model="gpt-4o", parsed={}, usage=million),
        step("generate", 1, output="b", usage=million),
        step("feedback", 1, model="mystery", parsed={}, usage=million),
    ]
    priced, unknown = record_detail(Candidate(0, ["r"], [], None), steps, MINI)["iterations"]
    assert priced["cost"] == pytest.approx(0.15 + 2.50)
    assert unknown["cost"] is None


def test_record_detail_skips_garbage_steps() -> None:
    """Steps that are not objects or have no iteration are left out, not a crash."""
    steps: list[Any] = ["junk", {"role": "generate"}, step("generate", 0, output=None)]
    [only] = record_detail(Candidate(0, ["r"], [], None), steps, MODEL)["iterations"]
    assert only["output"] == "a"  # no extracted answer: the raw response stands in


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        (None, 5, None),
        ("short", 5, "short"),
        ("abcdefgh", 5, "abcde\n… [3 more characters in traces.jsonl]"),
        (["a", 1], 50, '["a",1]'),
    ],
)
def test_clip(text: Any, limit: int, expected: str | None) -> None:
    """Long texts are cut, saying how much is left out; other values become JSON text."""
    assert clip(text, limit) == expected


def test_huge_metrics_are_clipped() -> None:
    """A metric value larger than the text limit is shown clipped, not embedded whole."""
    steps = [step("generate", 0, output="a", metrics={"blob": "x" * (2 * TEXT_LIMIT)})]
    [only] = record_detail(Candidate(0, ["r"], [], None), steps, MODEL)["iterations"]
    assert isinstance(only["metrics"], str) and "more characters" in only["metrics"]


# -- rows --------------------------------------------------------------------------------------


def test_rows_hold_codes_and_each_measures_initial_and_chosen_value() -> None:
    """A row is id, line, status, stop, refinements, chosen, cost, error type, each measure's
    initial and chosen value, and its value at every iteration."""
    lines = [
        record("a", [2, 5, 7], chosen=1, metrics=[{"ok": False}, {"ok": True}, {"ok": True}]),
        record("b", [], status="failed", stop="error"),
    ]
    lines[0]["cost_usd"] = 0.5
    meta, rows, _ = finished(feed(Browser(Pricing.single("sim-model")), lines))
    assert meta["statuses"] == ["done", "failed"] and meta["stops"] == ["done", "error"]
    assert meta["error_types"] == ["server"]
    assert meta["measures"] == [
        {"label": "score (critic)", "rate": False, "better": "higher"},
        {"label": "ok (rate)", "rate": True, "better": "higher"},
    ]
    assert meta["main"] == 0 and meta["rounds"] == 2
    assert rows[0] == [
        "a", 1, 0, 0, 2, 1, 0.5, None,
        [0, 2.0, 5.0, 1, 0.0, 1.0],
        [0, [2.0, 5.0, 7.0], 1, [0.0, 1.0, 1.0]],
    ]  # fmt: skip
    assert rows[1] == ["b", 1, 1, 1, 0, None, None, 0, [], []]


def test_a_declared_direction_reaches_the_page() -> None:
    """A metric the job declares lower-is-better is marked so; an undeclared number has none."""
    lines = [record("a", [None, None], metrics=[{"len": 3, "n": 2}, {"len": 2, "n": 1}])]
    meta, _, _ = finished(feed(Browser(MODEL, better={"len": "lower"}), lines))
    assert {m["label"]: m["better"] for m in meta["measures"]} == {"len": "lower", "n": None}


def test_large_runs_embed_the_record_one_round_made_worst() -> None:
    """Past the limit, the record a single round set back the most is embedded, saying why."""
    lines = [
        record("steady", [5, 5, 5]),
        record("dip", [5, 1, 5]),  # no worse in the end, but round 1 lost 4 points
        record("r2", [5, 5, 5]),
        record("r3", [5, 5, 5]),
    ]
    _, _, details = finished(feed(Browser(MODEL, detail_limit=2), lines))
    assert details["dip"]["why"] == "most worsened score (critic) by one round"


# -- which records get their iterations --------------------------------------------------------


def scored(rid: str, first: float, last: float, status: str = "done") -> dict[str, Any]:
    """A record whose score went from ``first`` to ``last`` (chosen: the last answer)."""
    return record(rid, [first, last], status=status, stop="error" if status == "failed" else "done")


def test_small_runs_embed_every_record() -> None:
    """A run within the limit gets every record's iterations."""
    meta, _, details = finished(feed(Browser(MODEL, detail_limit=5), [scored("a", 1, 2)]))
    assert meta["selection"] == "all" and meta["detailed"] == 1
    assert list(details) == ["a"] and details["a"]["iterations"][0]["output"] == "y0"


def test_large_runs_embed_failed_improved_worsened_lowest_then_first() -> None:
    """Past the limit: failed, most improved, most worsened, lowest final, in turns, then first."""
    lines = [
        scored("r0", 5, 5),
        scored("r1", 5, 5),
        scored("up-big", 1, 9),
        scored("down", 6, 2),
        scored("low", 0.5, 0.5),
        scored("up-small", 4, 5),
        scored("fail", 5, 5, status="failed"),
        scored("r7", 5, 5),
    ]
    meta, _, details = finished(feed(Browser(MODEL, detail_limit=5), lines))
    assert meta["selection"] == "chosen" and meta["total"] == 8 and meta["listed"] == 8
    # Round 1 takes the head of each reason: fail, up-big, down, low (the lowest final value,
    # 0.5); round 2 the next most improved: up-small.
    assert {rid: d["why"] for rid, d in details.items()} == {
        "fail": "failed",
        "up-big": "most improved score (critic)",
        "down": "most worsened score (critic)",
        "low": "lowest final score (critic)",
        "up-small": "most improved score (critic)",
    }


def test_leftover_room_goes_to_the_first_records() -> None:
    """Without failures or changes, the first records in file order fill the page."""
    lines = [record(f"r{i}", []) for i in range(6)]
    _, _, details = finished(feed(Browser(MODEL, detail_limit=3), lines))
    assert {rid: d["why"] for rid, d in details.items()} == dict.fromkeys(
        ("r0", "r1", "r2"), "first in file order"
    )


def test_asked_records_only() -> None:
    """With ids asked for, exactly those found get iterations, up to the limit."""
    lines = [record(f"r{i}", [1]) for i in range(5)]
    browser = Browser(MODEL, wanted=["r3", "r1", "nope"], detail_limit=5)
    meta, _, details = finished(feed(browser, lines))
    assert sorted(details) == ["r1", "r3"] and details["r1"]["why"] == "asked for"
    assert (meta["selection"], meta["asked"], meta["detailed"]) == ("asked", 3, 2)


def test_listing_limit_keeps_embedded_records_listed() -> None:
    """Past the listing limit only the first rows are listed, plus every embedded record."""
    lines = [record(f"r{i}", []) for i in range(5)]
    browser = Browser(MODEL, wanted=["r4"], index_limit=2)
    meta, rows, details = finished(feed(browser, lines))
    assert [r[0] for r in rows] == ["r0", "r1", "r4"]
    assert (meta["total"], meta["listed"], list(details)) == (5, 3, ["r4"])


def test_record_without_trace_gets_no_iterations() -> None:
    """A chosen record whose trace is missing is listed without iterations."""
    meta, rows, details = finished(feed(Browser(MODEL), [record("a", [1])], traced=False))
    assert (len(rows), details, meta["detailed"]) == (1, {}, 0)


def test_a_second_trace_of_the_same_record_is_ignored() -> None:
    """Each record's iterations are embedded once, so the page's JSON has unique keys."""
    browser = feed(Browser(MODEL), [record("a", [1])])
    browser.trace({"id": "a", "steps": [step("generate", 0, output="again")]})
    _, _, details_json = browser.finish()
    raw = b"".join(details_json)
    browser.close()
    assert raw.count(b'"a":') == 1 and b"again" not in raw
