"""The report's figures: per-iteration tables, counts, distributions and cost, from known runs.

The run directories are written by hand, so every expected figure below is worked out
from the lines themselves (see the comments next to each table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import ConfigError
from pipeline.client.prices import PriceBook
from pipeline.report import Distribution, Spend, summarize
from pipeline.report.aggregate import Summary
from pipeline.report.source import SCORE, Pricing, RunInfo, Scan, record_values
from tests.report.runs import (
    FOUR_O,
    MINI,
    by_name,
    check,
    gsm_run,
    make_run,
    priced_run,
    record,
    step,
)

# -- the per-iteration table -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "reached", "carried", "reached_records"),
    [
        # reached: t0 (2+4+6)/3; t1 only a has a score (b's last answer got no feedback);
        # carried: t1 = (5 + 4 carried + 6 carried)/3, t2 = (7 + 4 + 6)/3.
        (
            [[2, 5, 7], [4, None], [6]],
            [(4.0, 3), (5.0, 1), (7.0, 1)],
            [(4.0, 3), (5.0, 3), (17 / 3, 3)],
            (3, 2, 1),
        ),
        # A record whose first answer has no score joins the carried rows once it has one.
        ([[None, 3], [1]], [(1.0, 1), (3.0, 1)], [(1.0, 1), (2.0, 2)], (2, 1)),
        # Equal lengths: both readings agree.
        ([[1, 2], [3, 4]], [(2.0, 2), (3.0, 2)], [(2.0, 2), (3.0, 2)], (2, 2)),
    ],
)
def test_score_by_iteration_reached_and_carried_forward(
    tmp_path: Path,
    scores: list[list[float | None]],
    reached: list[tuple[float, int]],
    carried: list[tuple[float, int]],
    reached_records: tuple[int, ...],
) -> None:
    """Mean score per iteration over records that reached t, and carried forward to every t."""
    outputs = [record(f"r{i}", s, chosen=0) for i, s in enumerate(scores)]
    report = summarize(make_run(tmp_path / "run", outputs))
    score = by_name(report)["score"]
    assert score.measured == "score" and not score.rate
    check(score.reached, reached)
    check(score.carried, carried)
    assert report.reached_records == reached_records
    assert report.rows == len(reached_records)


def test_metrics_by_iteration_booleans_as_rates(tmp_path: Path) -> None:
    """Boolean metrics become rates, numbers means, text is ignored, failed records left out."""
    report = summarize(gsm_run(tmp_path / "run"))
    assert [m.name for m in report.measures] == ["score", "correct", "coverage"]
    correct, coverage = by_name(report)["correct"], by_name(report)["coverage"]
    assert correct.rate and correct.label == "correct (rate)"
    assert not coverage.rate and coverage.label == "coverage"
    # correct: t0 F,F,T; t1 T,F; t2 T.  Carried: t1 = T,F,T(c's t0); t2 = T,F,T.
    check(correct.reached, [(1 / 3, 3), (1 / 2, 2), (1.0, 1)])
    check(correct.carried, [(1 / 3, 3), (2 / 3, 3), (2 / 3, 3)])
    # coverage: t0 .5,.25,1; t1 .75,.5; t2 1.  Carried: t1 .75+.5+1; t2 1+.5+1.
    check(coverage.reached, [(1.75 / 3, 3), (0.625, 2), (1.0, 1)])
    check(coverage.carried, [(1.75 / 3, 3), (0.75, 3), (2.5 / 3, 3)])
    check(by_name(report)["score"].carried, [(4.0, 3), (5.0, 3), (17 / 3, 3)])


def test_what_changed_compares_chosen_with_initial(tmp_path: Path) -> None:
    """Share of records keeping a refinement, and chosen-vs-initial means over the same records."""
    report = summarize(gsm_run(tmp_path / "run"))
    assert report.refined_chosen == 1  # only a chose iteration 2; b and c chose 0
    score, correct = by_name(report)["score"], by_name(report)["correct"]
    # initial 2,4,6; chosen 7 (a@2), 4 (b@0), 6 (c@0)
    check([score.initial, score.chosen], [(4.0, 3), (17 / 3, 3)])
    assert score.gain == pytest.approx(5 / 3)
    assert correct.gain == pytest.approx(1 / 3)  # F,F,T -> T,F,T


def test_counts_stop_reasons_tokens_and_pending(tmp_path: Path) -> None:
    """Statuses, stop reasons, iterations, token sums and pending records are counted exactly."""
    report = summarize(gsm_run(tmp_path / "run"))
    assert (report.done, report.failed) == (3, 2)
    assert report.stop_reasons == {"error": 2, "max_iters": 1, "no_change": 1, "done": 1}
    assert next(iter(report.stop_reasons)) == "error"  # most frequent first
    assert report.iterations == {0: 1, 1: 1, 2: 1}
    assert report.chosen_iterations == {0: 2, 2: 1}
    assert (report.prompt_tokens, report.completion_tokens, report.calls) == (220, 85, 12)
    assert report.tokens.count == 5 and report.tokens.max == 150
    assert report.tokens.mean == pytest.approx((150 + 100 + 40 + 15 + 0) / 5)
    # 7 input lines, 1 unreadable: 6 records, 5 finished.
    assert (report.run.records, report.run.bad_lines, report.pending) == (6, 1, 1)
    assert report.cost_usd is None  # no price for "sim-model"


def test_latency_by_role_from_traces(tmp_path: Path) -> None:
    """Latency per role comes from every traced call, with retried and erroring calls counted."""
    report = summarize(gsm_run(tmp_path / "run"))
    assert list(report.latency) == ["generate", "feedback", "refine"]
    generate, feedback, refine = (report.latency[r] for r in ("generate", "feedback", "refine"))
    assert (generate.count, generate.mean, generate.max) == (2, 1.0, 1.5)
    assert (feedback.count, feedback.mean) == (4, 0.5)
    assert (refine.count, refine.mean, refine.min) == (2, 1.5, 1.0)
    assert report.retried == {"refine": 1}
    assert report.step_errors == {"feedback": 1}


def test_distributions_keep_a_bounded_sample(tmp_path: Path) -> None:
    """Past the sample size, counts, means and maxima stay exact while the sample stays bounded."""
    outputs = [record(f"r{i}", [1], usage=(i, 0, 1)) for i in range(1, 101)]
    trace = {"id": "r1", "steps": [step("generate", 0, i / 100) for i in range(1, 51)]}
    report = summarize(make_run(tmp_path / "run", outputs, [trace]), sample_size=8)
    assert (report.tokens.count, len(report.tokens.sample)) == (100, 8)
    assert report.tokens.mean == pytest.approx(50.5) and report.tokens.max == 100
    assert set(report.tokens.sample) <= set(range(1, 101))
    lat = report.latency["generate"]
    assert (lat.count, len(lat.sample), lat.max) == (50, 8, 0.5)


@pytest.mark.parametrize(
    ("sample", "q", "expected"),
    [
        ((), 0.5, None),
        ((3.0,), 0.9, 3.0),
        ((1.0, 2.0, 3.0, 4.0, 5.0), 0.5, 3.0),
        ((5.0, 1.0, 3.0), 0.0, 1.0),
        ((1.0, 2.0), 0.5, 1.5),
        ((1.0, 2.0, 3.0, 4.0, 5.0), 1.0, 5.0),
    ],
)
def test_quantile_interpolates_the_sample(
    sample: tuple[float, ...], q: float, expected: float | None
) -> None:
    """Quantiles of the sample interpolate linearly between ordered values."""
    dist = Distribution(len(sample), None, None, None, sample)
    assert dist.quantile(q) == expected


def test_torn_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    """A half-written last line is skipped (and reported), not a crash."""
    report = summarize(make_run(tmp_path / "run", [record("a", [1])], raw_tail=b'{"id": "b", "st'))
    assert (report.done, report.skipped_lines) == (1, 1)


def test_run_dir_without_manifest_is_refused(tmp_path: Path) -> None:
    """A directory that holds no run is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="no manifest"):
        summarize(tmp_path)


# -- dollars -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "model", "expected"),
    [
        ({"cost_usd": 0.25}, "sim-model", 0.25),  # the line's own figure wins
        ({"cost_usd": 0.25, "usage": {"prompt_tokens": 10**6}}, "gpt-4o-mini", 0.25),
        ({"cost_usd": None, "usage": {"prompt_tokens": 10**6}}, "gpt-4o-mini", None),
        ({"cost_usd": True}, "sim-model", None),  # not a number
        # lines written before cost_usd existed: their tokens at the run's price
        ({"usage": {"prompt_tokens": 10**6, "completion_tokens": 0}}, "gpt-4o-mini", MINI),
        ({"usage": {"prompt_tokens": 10**6}}, "local:qwen2.5-coder-0.5b", 0.0),
        ({"usage": {"prompt_tokens": 10**6}}, "sim-model", None),  # no price for it
        ({"usage": "junk"}, "gpt-4o-mini", 0.0),
    ],
)
def test_record_cost(line: dict[str, Any], model: str, expected: float | None) -> None:
    """A record costs its cost_usd when the line has that field, else its tokens at the price."""
    assert Pricing.single(model).record(line) == expected


CRITIC_ON_4O = Pricing(
    PriceBook(), {"generate": "gpt-4o-mini", "refine": "gpt-4o-mini", "feedback": "gpt-4o"}
)


@pytest.mark.parametrize(
    ("role", "fields", "expected"),
    [
        ("refine", {}, MINI),  # the role's model
        ("feedback", {}, FOUR_O),  # the critic's, for steps that do not name their model
        ("refine", {"model": "gpt-4o"}, FOUR_O),  # the step's own model wins
        ("refine", {"model": "mystery"}, None),
        ("refine", {"model": ""}, MINI),
        ("refine", {"batch_id": "batch_1"}, MINI / 2),  # the Batch API's discount
        ("refine", {"usage": {"prompt_tokens": 10**6, "cached_tokens": 10**6}}, 0.075),
    ],
)
def test_step_cost(role: str, fields: dict[str, Any], expected: float | None) -> None:
    """A call is priced by its own model, else by its role's, with batch and cache rates."""
    one = step(role, 0, **{"usage": {"prompt_tokens": 10**6, "completion_tokens": 0}, **fields})
    cost = CRITIC_ON_4O.step(one)
    assert cost == (None if expected is None else pytest.approx(expected))


def test_cost_sums_known_records_and_counts_unknown(tmp_path: Path) -> None:
    """The run's cost is the sum of the records' cost_usd; records without a price are counted."""
    outputs = [record("a", [1]), record("b", [1]), record("c", [1])]
    for line, dollars in zip(outputs, (0.5, None, 0.25), strict=True):
        line["cost_usd"] = dollars
    report = summarize(make_run(tmp_path / "run", outputs))
    assert report.cost_usd == pytest.approx(0.75)
    assert report.cost_unknown == 1


def test_cost_of_an_empty_run() -> None:
    """Nothing finished: a priced model has cost nothing, an unpriced one is unknown."""
    for model, expected in (("gpt-4o-mini", 0.0), ("sim-model", None)):
        pricing = Pricing.single(model)
        info = RunInfo(Path("run"), "gsm", model, "finished", "", 1, None, None, 0, 0, pricing)
        assert Summary(pricing).report(Scan(info, skipped_lines=0)).cost_usd == expected


def test_spend_by_iteration_and_gain_per_dollar(tmp_path: Path) -> None:
    """Calls are priced per iteration; refinement 1's gain is divided by what it cost."""
    report = summarize(priced_run(tmp_path / "run"))
    assert report.priced
    assert report.spend(0) == Spend(4, pytest.approx(2 * MINI + 2 * FOUR_O), 0)  # type: ignore[arg-type]
    assert report.spend(1) == Spend(3, pytest.approx(2 * MINI + FOUR_O), 0)  # type: ignore[arg-type]
    # refinement 1: the feedback on answer 0 (2 x 2.50) and the refine calls (2 x 0.15)
    assert report.step_spend(1).known == pytest.approx(2 * FOUR_O + 2 * MINI)
    score = by_name(report)["score"]
    assert report.gain_per_dollar(score, 1) == pytest.approx(3 / (2 * FOUR_O + 2 * MINI))
    assert report.gain_per_dollar(score, 0) is None


def test_unpriced_call_makes_the_iteration_unknown(tmp_path: Path) -> None:
    """One call without a price leaves its iteration's dollars unknown, never counted as free."""
    outputs = [record("a", [2, 5])]
    traces = [
        {
            "id": "a",
            "steps": [
                step("generate", 0),
                step("feedback", 0, model="mystery"),
                step("refine", 1),
            ],
        }
    ]
    report = summarize(make_run(tmp_path / "run", outputs, traces, model="gpt-4o-mini"))
    assert report.spend(0).unknown == 1 and report.spend(0).known is None
    assert report.step_spend(1).known is None
    assert report.gain_per_dollar(by_name(report)["score"], 1) is None
    assert report.spend(1).known is not None


# -- one line's measures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "size", "series", "numeric"),
    [
        ({"scores": [1, None, 3]}, 3, {SCORE: [1.0, None, 3.0]}, {SCORE: True}),
        # metrics: booleans are 0/1 and leave the measure a rate; text is no measure.
        (
            {"iterations": 1, "metrics_by_iteration": [{"ok": True, "n": 2, "why": "x"}, None]},
            2,
            {SCORE: [None, None], ("metric", "ok"): [1.0, None], ("metric", "n"): [2.0, None]},
            {SCORE: True, ("metric", "ok"): False, ("metric", "n"): True},
        ),
        # the chosen iteration stretches the series even when nothing else reaches it
        ({"chosen_iteration": 2, "scores": "bad"}, 3, {SCORE: [None, None, None]}, {SCORE: True}),
    ],
)
def test_record_values(
    line: dict[str, Any], size: int, series: dict[Any, Any], numeric: dict[Any, bool]
) -> None:
    """One outputs line's score and metrics, by iteration, with garbage fields ignored."""
    values = record_values(line)
    assert (values.size, values.series, values.numeric) == (size, series, numeric)
