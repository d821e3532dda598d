"""``report.md`` and its PNG plots: the files, the tables and the words, from known runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import ConfigError, Settings, run
from pipeline.report import render_markdown, summarize, write_report
from pipeline.testing.simulator import Simulator
from tests.helpers import tasks, write_jsonl
from tests.report.runs import assert_png, by_name, gsm_run, make_run, priced_run, record, step

# -- files and Markdown ------------------------------------------------------------------------


@pytest.mark.usefixtures("matplotlib")
def test_write_report_writes_markdown_and_valid_pngs(tmp_path: Path) -> None:
    """report.md lands in RUN_DIR/report with both tables and relative links to real PNGs."""
    run_dir = gsm_run(tmp_path / "run")
    path = write_report(run_dir).markdown
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
    assert "220 prompt (0 from the provider's cache) + 85 completion in 12 calls" in md
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
    path = write_report(gsm_run(tmp_path / "run"), tmp_path / "elsewhere" / "rep").markdown
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
    path = write_report(make_run(tmp_path / "run", outputs)).markdown
    md = path.read_text()
    assert "recorded no scores and no evaluator metrics" in md
    assert "No critic scores were recorded" in md
    assert "pending unknown (the input file cannot be read)" in md
    assert not list(path.parent.glob("by-iteration-*.png"))
    assert "No traces yet." in md
    for name in ("stop-reasons.png", "iterations.png", "tokens-per-record.png"):
        assert_png(path.parent / name)

    only_failed = write_report(make_run(tmp_path / "failed", [outputs[1]])).markdown
    assert "No done records yet." in only_failed.read_text()
    empty = write_report(make_run(tmp_path / "empty", [])).markdown
    text = empty.read_text()
    assert "0 done, 0 failed" in text and "No finished records yet." in text
    assert not list(empty.parent.glob("*.png"))


@pytest.mark.usefixtures("matplotlib")
def test_odd_metric_names_get_distinct_files_and_escaped_cells(tmp_path: Path) -> None:
    """Metric names that slug alike get distinct plots; pipes are escaped, dollars drawn."""
    metrics: list[dict[str, Any] | None] = [{"a b": 1.5, "a-b": 2.5, "x|$y": 0.5}]
    path = write_report(make_run(tmp_path / "run", [record("a", [None], metrics=metrics)])).markdown
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
    path = write_report(tmp_path / "run").markdown
    md = path.read_text()
    assert f"{report.done} done, {report.failed} failed, 0 pending (of 24)" in md
    for name in ("by-iteration-score.png", "stop-reasons.png", "latency-by-role.png"):
        assert f"]({name})" in md
        assert_png(path.parent / name)


@pytest.mark.usefixtures("matplotlib")
def test_cost_by_iteration_section(tmp_path: Path) -> None:
    """A priced run gets a cost-by-iteration table with the score's gain per dollar."""
    md = write_report(priced_run(tmp_path / "run")).markdown.read_text()
    assert "## Cost by iteration" in md
    assert "| t | calls | iteration t | refinement t | score (critic) gain per $ |" in md
    assert "| 0 | 4 | $5.3000 | - | - |" in md
    # refinement 1: $5.00 of feedback on answer 0 + $0.30 of refine calls; +3 score points
    assert "| 1 | 3 | $2.8000 | $5.3000 | +0.57 |" in md


@pytest.mark.usefixtures("matplotlib")
def test_unpriced_run_has_no_cost_table_and_says_what_is_unknown(tmp_path: Path) -> None:
    """Without prices there is no cost table; partly priced records say how many are unknown."""
    assert "Cost by iteration" not in write_report(gsm_run(tmp_path / "a")).markdown.read_text()
    outputs = [record("a", [1]), record("b", [1])]
    outputs[0]["cost_usd"], outputs[1]["cost_usd"] = 0.125, None
    md = write_report(make_run(tmp_path / "b", outputs)).markdown.read_text()
    assert "| cost | $0.1250 for the priced records; 1 unknown |" in md


def test_calls_are_counted_by_kind(tmp_path: Path) -> None:
    """The report counts calls by call kind, telling the method's from repairs and strategies;
    a call that failed for good is no call made."""
    steps = [
        step("generate", 0, kind="answer"),
        step("generate", 0, kind="sample"),
        step("feedback", 0, kind="feedback"),
        step("refine", 1, kind="answer", response=None),
    ]
    run_dir = make_run(tmp_path / "run", [record("r1", [3.0])], [{"id": "r1", "steps": steps}])
    report = summarize(run_dir)
    assert report.call_kinds == {"answer": 1, "sample": 1, "feedback": 1}
    md = render_markdown(report)
    assert "Calls by kind: answer 1, sample 1, feedback 1 (1 from opt-in strategies" in md
