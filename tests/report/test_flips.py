"""Flips by round: answers each round made better or worse, the rates, the rule, the ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.report import summarize, write_report
from pipeline.report.flips import FlipReport, MetricFlips
from pipeline.report.payoff import Rates, reasoning, recommend
from tests.report.runs import make_run, record, step

T, F = True, False
# Five records' `correct` by iteration, and the chosen iteration. Round 1 fixes a and d and
# breaks b (2 > 1: it pays); round 2 breaks e and fixes nothing (it does not).
CORRECT: dict[str, tuple[list[bool], int]] = {
    "a": ([F, T, T], 2),
    "b": ([T, F], 0),
    "c": ([T], 0),
    "d": ([F, T, T], 1),
    "e": ([T, T, F], 1),
}


def flips_run(path: Path, *, job: str = "gsm") -> Path:
    """The records of CORRECT (plus a failed one, never counted), with a numeric metric."""
    outputs = []
    for rid, (values, chosen) in CORRECT.items():
        metrics = [{"correct": v, "answer": "12", "steps": 3 + t} for t, v in enumerate(values)]
        outputs.append(record(rid, [None] * len(values), chosen=chosen, metrics=metrics))
    failed = [{"correct": F}, {"correct": T}]
    outputs.append(record("x", [None, None], status="failed", stop="error", metrics=failed))
    run_dir = make_run(path, outputs)
    manifest = orjson.loads((run_dir / "manifest.json").read_bytes())
    manifest["job"] = {"name": job, "hash": "", "source": job}
    (run_dir / "manifest.json").write_bytes(orjson.dumps(manifest))
    return run_dir


def correct(report: FlipReport) -> MetricFlips:
    """The flips of `correct`."""
    return next(m for m in report.metrics if m.name == "correct")


def test_flip_counts_by_round_against_previous_and_first(tmp_path: Path) -> None:
    """Each round counts better/worse/same against t-1 and against the first answer, carrying
    a stopped record's last answer forward; failed records do not count."""
    flips = summarize(flips_run(tmp_path / "run")).flips
    assert flips is not None
    m = correct(flips)
    assert m.boolean and m.source == "label" and m.label == "correct (from a label)"
    assert [(r.vs_previous.better, r.vs_previous.worse, r.vs_previous.same) for r in m.rounds] == [
        (2, 1, 2),
        (0, 1, 4),
    ]
    assert [(r.vs_first.better, r.vs_first.worse, r.vs_first.same) for r in m.rounds] == [
        (2, 1, 2),
        (2, 2, 1),
    ]
    assert (m.chosen.vs_first.better, m.chosen.vs_first.worse, m.chosen.vs_first.same) == (2, 0, 3)
    assert [m.accuracy(t) for t in range(3)] == [0.6, 0.8, 0.6]


def test_correction_and_introduction_rates(tmp_path: Path) -> None:
    """Correction = wrong->right over wrong before; introduction = right->wrong over right."""
    flips = summarize(flips_run(tmp_path / "run")).flips
    assert flips is not None
    m = correct(flips)
    first, second = (r.rates for r in m.rounds)
    assert first == Rates(n=5, right_before=3, fixed=2, broken=1)
    assert first.correction == 1.0 and first.introduction == pytest.approx(1 / 3)
    assert second == Rates(n=5, right_before=4, fixed=0, broken=1)
    assert (second.correction, second.introduction) == (0.0, 0.25)
    assert m.chosen.rates == Rates(n=5, right_before=3, fixed=2, broken=0)
    assert recommend([first, second]) == 1


def test_numbers_need_a_declared_direction(tmp_path: Path) -> None:
    """A numeric metric the job does not declare gets no flips, and is named as such."""
    flips = summarize(flips_run(tmp_path / "run")).flips
    assert flips is not None
    assert [m.name for m in flips.metrics] == ["correct"]
    assert flips.undirected == ("steps",)


def test_a_declared_lower_is_better_number_flips_the_other_way(tmp_path: Path) -> None:
    """With `sentences` declared without direction and `coverage` higher-is-better (commongen),
    coverage going down is worse."""
    outputs = [
        record("a", [None, None], metrics=[{"coverage": 0.5}, {"coverage": 0.25}]),
        record("b", [None, None], metrics=[{"coverage": 0.5}, {"coverage": 1.0}]),
        record("c", [None, None], metrics=[{"coverage": 0.5}, {"coverage": 1.0}]),
    ]
    run_dir = make_run(tmp_path / "run", outputs)
    manifest = orjson.loads((run_dir / "manifest.json").read_bytes())
    manifest["job"] = {"name": "commongen", "hash": "", "source": "commongen"}
    (run_dir / "manifest.json").write_bytes(orjson.dumps(manifest))
    flips = summarize(run_dir).flips
    assert flips is not None
    (coverage,) = flips.metrics
    assert not coverage.boolean and coverage.rounds[0].rates is None
    assert (coverage.rounds[0].vs_previous.better, coverage.rounds[0].vs_previous.worse) == (2, 1)
    assert "sentences" in flips.undirected


@pytest.mark.parametrize(
    ("rates", "pays"),
    [
        (Rates(n=10, right_before=6, fixed=2, broken=1), True),  # c/i = 3 > 1.5
        (Rates(n=10, right_before=6, fixed=2, broken=2), False),  # c/i = 1.5 = A/(1-A)
        (Rates(n=10, right_before=9, fixed=1, broken=0), True),  # no introduction, corrects
        (Rates(n=10, right_before=9, fixed=0, broken=0), False),  # changes nothing
        (Rates(n=10, right_before=10, fixed=0, broken=0), False),  # A = 1: nothing to correct
        (Rates(n=10, right_before=0, fixed=3, broken=0), True),  # A = 0: pays if it corrects
        (Rates(n=10, right_before=0, fixed=0, broken=0), False),
        (Rates(n=0, right_before=0, fixed=0, broken=0), False),  # nothing measured
    ],
)
def test_the_rule(rates: Rates, pays: bool) -> None:
    """A round pays while correction/introduction > Acc/(1-Acc), zero rates handled."""
    assert rates.pays is pays
    ratio, threshold = rates.ratio, rates.threshold
    if ratio is not None and threshold is not None and ratio != float("inf"):
        assert pays is (ratio > threshold + 1e-12)


def test_recommendation_counts_the_leading_rounds_that_pay() -> None:
    """The recommendation is the number of rounds before the first one that does not pay."""
    good, bad = Rates(10, 5, 3, 1), Rates(10, 5, 1, 3)
    assert recommend([]) == 0
    assert recommend([bad, good]) == 0
    assert recommend([good, good, bad, good]) == 2
    assert recommend([good, good]) == 2
    lines = reasoning([good, good, bad, good])
    assert lines[0].startswith("round 2 corrects 60.0% of wrong answers (3/5)")
    assert lines[1].startswith("round 3 corrects 20.0%") and lines[1].endswith("recommend 2")
    assert "does not pay" in reasoning([bad])[1]
    assert "the most measured" in reasoning([good])[1]


def ranked_trace(rid: str, first: list[str] | None, chosen: list[str] | None) -> dict[str, Any]:
    """A trace whose first answer and chosen refinement carry these check findings."""
    return {
        "id": rid,
        "steps": [
            step("generate", 0, output="x", checks=first, iteration_answer=True),
            step("feedback", 0),
            step("refine", 1, output="y", checks=chosen, iteration_answer=True, chosen=True),
        ],
    }


def test_chosen_ranked_below_the_first_answer_is_counted(tmp_path: Path) -> None:
    """A chosen output the job's checks rank below the first answer is counted; others not."""
    outputs = [record(rid, [None, None]) for rid in ("p", "q", "r", "s")]
    traces = [
        ranked_trace("p", [], ["The program raises"]),  # passing -> failing: below
        ranked_trace("q", ["The program raises"], []),
        ranked_trace("r", [], []),
        {"id": "s", "steps": [step("generate", 0, output="x")]},  # no marks
    ]
    report = summarize(make_run(tmp_path / "run", outputs, traces))
    assert report.flips is not None and report.flips.ranks is not None
    ranks = report.flips.ranks
    assert (ranks.compared, ranks.below, ranks.unmarked) == (3, 1, 1)


@pytest.mark.usefixtures("matplotlib")
def test_markdown_and_html_show_the_flips(tmp_path: Path) -> None:
    """report.md and index.html carry the flip table, the rates and the rule's verdict."""
    files = write_report(flips_run(tmp_path / "run"))
    md = files.markdown.read_text(encoding="utf-8")
    assert "## Flips by round" in md and "### correct (from a label)" in md
    section = md.split("### correct (from a label)")[1]
    row = next(line for line in section.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        "1", "5", "2", "1", "2", "2", "1", "2",
        "80.0% (4/5)", "100.0% (2/2)", "33.3% (1/3)", "yes",
    ]  # fmt: skip
    assert "Refinements that pay by the rule: 1." in md
    assert "No better direction, so no flips: steps." in md
    page = files.html.read_text(encoding="utf-8")
    assert 'id="flips"' in page and "33.3% (1/3)" in page and "correct (from a label)" in page
