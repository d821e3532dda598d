"""``refine report``: per-iteration tables, counts, plots and the Markdown, from known runs.

The run directories are written by hand, so every expected figure below is worked out
from the lines themselves (see the comments next to each table).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import ConfigError, Settings, run
from pipeline.report import Cell, Distribution, Measure, RunReport, summarize, write_report
from pipeline.testing.simulator import Simulator
from tests.helpers import tasks, write_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def matplotlib() -> None:
    """Skip a test that draws plots when matplotlib is not installed."""
    pytest.importorskip("matplotlib")


def record(
    rid: str,
    scores: Sequence[float | None],
    *,
    status: str = "done",
    stop: str = "done",
    chosen: int | None = None,
    metrics: Sequence[dict[str, Any] | None] | None = None,
    usage: tuple[int, int, int] = (10, 5, 2),
) -> dict[str, Any]:
    """One outputs.jsonl line; ``scores`` has one entry per answer (iteration 0..n)."""
    n = max(len(scores) - 1, 0)
    if chosen is None and status == "done":
        chosen = n
    return {
        "id": rid,
        "line": 1,
        "status": status,
        "output": "x",
        "iterations": n,
        "chosen_iteration": chosen,
        "stop_reason": stop,
        "score": scores[chosen] if chosen is not None and scores else None,
        "scores": list(scores),
        "metrics": metrics[chosen] if metrics and chosen is not None else None,
        "metrics_by_iteration": None if metrics is None else list(metrics),
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "calls": usage[2]},
        "error": {"type": "server", "message": "boom"} if status == "failed" else None,
    }


def step(role: str, iteration: int, latency: float, **kw: Any) -> dict[str, Any]:
    """One traces.jsonl step (messages and response kept short)."""
    return {
        "role": role,
        "iteration": iteration,
        "messages": [{"role": "user", "content": "q"}],
        "response": "a",
        "parsed": None,
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        "latency_s": latency,
        "attempts": kw.get("attempts", 1),
        "error": kw.get("error"),
    }


def make_run(
    path: Path,
    outputs: Sequence[dict[str, Any]],
    traces: Sequence[dict[str, Any]] = (),
    *,
    input_lines: int | None = None,
    bad_lines: int = 0,
    raw_tail: bytes = b"",
) -> Path:
    """A run directory holding exactly these lines (and an input file of ``input_lines``)."""
    path.mkdir(parents=True)
    inp = path.parent / f"{path.name}-input.jsonl"
    if input_lines is not None:
        write_jsonl(inp, [{"id": f"r{i}"} for i in range(input_lines)])
    manifest = {
        "job": {"name": "gsm", "hash": "abc", "source": "gsm"},
        "model": "sim-model",
        "base_url": "http://127.0.0.1:1/v1",
        "max_iters": 3,
        "min_iters": 0,
        "settings": {"limit": None},
        "input": {"path": str(inp), "fingerprint": {"head_bytes": 0, "head_sha256": ""}},
        "created_at": "2025-01-01T00:00:00+00:00",
        "updated_at": "2025-01-01T00:05:00+00:00",
        "state": "finished",
    }
    (path / "manifest.json").write_bytes(orjson.dumps(manifest))
    write_jsonl(path / "outputs.jsonl", list(outputs))
    if raw_tail:
        with (path / "outputs.jsonl").open("ab") as fh:
            fh.write(raw_tail)
    write_jsonl(path / "traces.jsonl", list(traces))
    write_jsonl(path / "errors.jsonl", [{"line": i, "error": "bad"} for i in range(bad_lines)])
    return path


def gsm_run(path: Path) -> Path:
    """Three done records with scores [2,5,7], [4,None], [6] and gsm-like metrics, two failed."""
    outputs = [
        record(
            "a",
            [2, 5, 7],
            stop="max_iters",
            metrics=[
                {"correct": False, "coverage": 0.5, "answer": "12"},
                {"correct": True, "coverage": 0.75, "answer": "13"},
                {"correct": True, "coverage": 1.0, "answer": "13"},
            ],
            usage=(100, 50, 6),
        ),
        record(
            "b",
            [4, None],
            stop="no_change",
            chosen=0,
            metrics=[
                {"correct": False, "coverage": 0.25},
                {"correct": False, "coverage": 0.5, "error": "ValueError: x"},
            ],
            usage=(80, 20, 3),
        ),
        record("c", [6], metrics=[{"correct": True, "coverage": 1.0}], usage=(30, 10, 2)),
        # Failed records count in the header and stop reasons, never in the quality table:
        # their score of 100 would show in every mean if they did.
        record(
            "d",
            [100],
            status="failed",
            stop="error",
            chosen=0,
            metrics=[{"correct": True, "coverage": 1.0}],
            usage=(10, 5, 1),
        ),
        record("e", [], status="failed", stop="error", usage=(0, 0, 0)),
    ]
    traces = [
        {
            "id": "a",
            "steps": [
                step("generate", 0, 0.5),
                step("feedback", 0, 0.25),
                step("refine", 1, 1.0, attempts=3),
                step("feedback", 1, 0.75, error={"type": "length", "message": "cut"}),
                step("refine", 2, 2.0),
                step("feedback", 2, 0.5),
            ],
        },
        {"id": "c", "steps": [step("generate", 0, 1.5), step("feedback", 0, 0.5)]},
    ]
    return make_run(path, outputs, traces, input_lines=7, bad_lines=1)


def by_name(report: RunReport) -> dict[str, Measure]:
    """The report's measures keyed by name (the critic's score under "score")."""
    return {m.name: m for m in report.measures}


def check(got: Sequence[Cell], expected: Sequence[tuple[float, int]]) -> None:
    """The cells hold these (mean, n) pairs, means compared approximately."""
    assert [c.n for c in got] == [n for _, n in expected]
    assert [c.mean for c in got] == pytest.approx([m for m, _ in expected])


def assert_png(path: Path) -> None:
    """``path`` is a real PNG of the report's size, not an empty or placeholder file."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (640, 360)
    assert len(data) > 5_000, path


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
    assert score.kind == "score" and not score.rate
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
    assert (report.records, report.bad_lines, report.pending) == (6, 1, 1)
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


# -- files and Markdown ------------------------------------------------------------------------


@pytest.mark.usefixtures("matplotlib")
def test_write_report_writes_markdown_and_valid_pngs(tmp_path: Path) -> None:
    """report.md lands in RUN_DIR/report with both tables and relative links to real PNGs."""
    run_dir = gsm_run(tmp_path / "run")
    path = write_report(run_dir)
    assert path == run_dir / "report" / "report.md"
    md = path.read_text()
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    assert pngs == [
        "by-iteration-correct.png",
        "by-iteration-coverage.png",
        "by-iteration-score.png",
        "iterations.png",
        "latency-by-role.png",
        "stop-reasons.png",
        "tokens-per-record.png",
    ]
    for name in pngs:
        assert f"]({name})" in md
        assert_png(path.parent / name)
    assert "records | 3 done, 2 failed, 1 pending (of 6)" in md
    assert "220 prompt + 85 completion in 12 calls" in md
    assert "### (a) Carried forward" in md and "### (b) Reached t" in md
    header = "| t | records | score (critic) | correct (rate) | coverage |"
    assert md.count(header) == 2
    carried, reached = md.split("### (b)")
    assert "| 2 | 3 | 5.67 (3) | 66.7% (3) | 0.833 (3) |" in carried
    assert "| 1 | 2 | 5.00 (1) | 50.0% (2) | 0.625 (2) |" in reached
    assert "| 2 | 1 | 7.00 (1) | 100.0% (1) | 1.000 (1) |" in reached
    assert "1 of 3 done records (33.3%) kept a refined answer" in md
    assert "score (critic): initial 4.00, chosen 5.67, mean gain +1.67" in md
    assert "correct (rate): initial 33.3%, chosen 66.7%, mean gain +33.3 pp" in md
    assert "| `error` | 2 | 40.0% |" in md


@pytest.mark.usefixtures("matplotlib")
def test_out_dir_holds_the_report_and_its_plots(tmp_path: Path) -> None:
    """With ``out`` the report and its plots go there, and the image links stay relative."""
    path = write_report(gsm_run(tmp_path / "run"), tmp_path / "elsewhere" / "rep")
    assert path == tmp_path / "elsewhere" / "rep" / "report.md"
    assert not (tmp_path / "run" / "report").exists()
    assert "](stop-reasons.png)" in path.read_text()
    assert_png(path.parent / "stop-reasons.png")


@pytest.mark.usefixtures("matplotlib")
def test_run_without_scores_metrics_or_done_records_still_reports(tmp_path: Path) -> None:
    """Failed records, missing scores and missing metrics give a report that says so."""
    outputs = [
        record("a", [None, None], stop="max_iters"),
        record("b", [], status="failed", stop="error"),
    ]
    path = write_report(make_run(tmp_path / "run", outputs))
    md = path.read_text()
    assert "recorded no scores and no evaluator metrics" in md
    assert "No critic scores were recorded" in md
    assert "pending unknown (the input file cannot be read)" in md
    assert not list(path.parent.glob("by-iteration-*.png"))
    assert "No traces yet." in md
    for name in ("stop-reasons.png", "iterations.png", "tokens-per-record.png"):
        assert_png(path.parent / name)

    only_failed = write_report(make_run(tmp_path / "failed", [outputs[1]]))
    assert "No done records yet." in only_failed.read_text()
    empty = write_report(make_run(tmp_path / "empty", []))
    text = empty.read_text()
    assert "0 done, 0 failed" in text and "No finished records yet." in text
    assert not list(empty.parent.glob("*.png"))


@pytest.mark.usefixtures("matplotlib")
def test_odd_metric_names_get_distinct_files_and_escaped_cells(tmp_path: Path) -> None:
    """Metric names that slug alike get distinct plots; pipes are escaped, dollars drawn."""
    metrics: list[dict[str, Any] | None] = [{"a b": 1.5, "a-b": 2.5, "x|$y": 0.5}]
    path = write_report(make_run(tmp_path / "run", [record("a", [None], metrics=metrics)]))
    md = path.read_text()
    assert "](by-iteration-a-b.png)" in md and "](by-iteration-a-b-2.png)" in md
    assert "| t | records | a b | a-b | x\\|$y |" in md
    assert_png(path.parent / "by-iteration-x-y.png")


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without matplotlib, write_report raises a ConfigError telling how to install it."""
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError, match=r"pip install 'refine\[report\]'"):
        write_report(gsm_run(tmp_path / "run"))


def test_importing_the_package_does_not_import_matplotlib() -> None:
    """``import pipeline`` (and pipeline.report) work without loading matplotlib."""
    code = "import sys, pipeline, pipeline.report; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


# -- end to end --------------------------------------------------------------------------------


@pytest.mark.usefixtures("matplotlib")
def test_report_of_a_simulated_run(sim: Simulator, tmp_path: Path) -> None:
    """A real run against the simulator reports every record, its stop reasons and its plots."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(24))
    settings = Settings(model="m", base_url=sim.url, max_iters=3, concurrency=8)
    summary = run("code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False)
    report = summarize(tmp_path / "run")
    assert report.done + report.failed == 24 and report.pending == 0
    assert sum(report.stop_reasons.values()) == 24
    assert report.calls == summary.counters.calls
    assert report.rows == 1 + max(report.iterations)
    score = by_name(report)["score"]
    assert all(c.n == report.done for c in score.carried)  # every record is scored at t=0
    assert score.reached[0] == score.carried[0]
    assert sum(d.count for d in report.latency.values()) == report.calls
    path = write_report(tmp_path / "run")
    md = path.read_text()
    assert f"{report.done} done, {report.failed} failed, 0 pending (of 24)" in md
    for name in ("by-iteration-score.png", "stop-reasons.png", "latency-by-role.png"):
        assert f"]({name})" in md
        assert_png(path.parent / name)
