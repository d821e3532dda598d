"""`refine calibrate` against a GSM-like server whose answers flip both ways between rounds.

The flip counts and rates are recomputed here from the traces alone (each iteration's
answer is the step marked ``iteration_answer``, the output the step marked ``chosen``),
independently of the report's and the calibration's code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import Settings, run
from pipeline.commands.calibrate import CALIBRATION, calibrate, even_positions, read_calibration
from pipeline.core.loader import load_job
from pipeline.errors import ConfigError
from pipeline.report import summarize
from pipeline.runs.journal import read_steps
from tests import gsm_server
from tests.gsm_server import GsmServer, records
from tests.helpers import read_jsonl, wait_for_calls, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]
ENV = {**os.environ, "OPENAI_API_KEY": "sk-test"}


def refine(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the `refine` command; its output as text."""
    return subprocess.run(
        [*REFINE, *args], env=ENV, capture_output=True, text=True, timeout=300, check=False
    )


def calibrate_args(inp: Path, out: Path, url: str, *extra: str) -> tuple[str, ...]:
    """`refine calibrate gsm` arguments against the server at ``url``."""
    return ("calibrate", "gsm", str(inp), "--out", str(out), "--base-url", url, "--quiet", *extra)


# -- the flips, recomputed from the traces -----------------------------------------------------


@dataclass(frozen=True)
class Recount:
    """Round t's counts, recomputed: n, right at t-1, fixed, broken, and against the first."""

    n: int
    right_before: int
    fixed: int
    broken: int
    first_better: int
    first_worse: int


def correct_by_iteration(run_dir: Path) -> dict[str, tuple[list[bool], bool]]:
    """Each done record's `correct` by iteration and of its chosen answer, from traces.jsonl."""
    done = {o["id"] for o in read_jsonl(run_dir / "outputs.jsonl") if o["status"] == "done"}
    out = {}
    for trace in read_jsonl(run_dir / "traces.jsonl"):
        steps: list[dict[str, Any]] = trace["steps"]
        if trace["id"] not in done:
            continue
        answers = sorted(
            (s for s in steps if s.get("iteration_answer")), key=lambda s: s["iteration"]
        )
        (chosen,) = [s for s in steps if s.get("chosen")]
        out[str(trace["id"])] = (
            [s["metrics"]["correct"] for s in answers],
            chosen["metrics"]["correct"],
        )
    return out


def recount(run_dir: Path) -> tuple[list[Recount], Recount]:
    """Every round's counts and the chosen output's (against the first answer)."""
    values = correct_by_iteration(run_dir)
    rounds = max(len(v) for v, _ in values.values()) - 1

    def at(v: list[bool], t: int) -> bool:
        return v[min(t, len(v) - 1)]  # carried forward once the loop stopped

    out = []
    for t in range(1, rounds + 1):
        pairs = [(at(v, t - 1), at(v, t), v[0]) for v, _ in values.values()]
        out.append(
            Recount(
                n=len(pairs),
                right_before=sum(a for a, _, _ in pairs),
                fixed=sum(not a and b for a, b, _ in pairs),
                broken=sum(a and not b for a, b, _ in pairs),
                first_better=sum(b and not f for _, b, f in pairs),
                first_worse=sum(f and not b for _, b, f in pairs),
            )
        )
    chosen = [(v[0], c) for v, c in values.values()]
    return out, Recount(
        n=len(chosen),
        right_before=sum(f for f, _ in chosen),
        fixed=sum(not f and c for f, c in chosen),
        broken=sum(f and not c for f, c in chosen),
        first_better=sum(not f and c for f, c in chosen),
        first_worse=sum(f and not c for f, c in chosen),
    )


def rule(r: Recount) -> bool:
    """The rule as the issue states it: c/i > Acc/(1-Acc), zero introduction handled."""
    wrong = r.n - r.right_before
    if not r.n or not wrong:
        return False  # nothing measured, or nothing left to correct
    c = r.fixed / wrong
    if not r.right_before:
        return c > 0
    i = r.broken / r.right_before
    if i == 0:
        return c > 0
    acc = r.right_before / r.n
    return c / i > acc / (1 - acc)


ROW = re.compile(
    r"^\s*(\d+)\s+[\d.]+% \((\d+)/(\d+)\)\s+(\d+)\s+(\d+)\s+(\d+)\s+"
    r"[\d.]+% \((\d+)/(\d+)\)\s+[\d.]+% \((\d+)/(\d+)\)\s+(yes|no)"
)


@dataclass(frozen=True)
class Calibrated:
    """A finished `refine calibrate`: its directory, what it printed, the input it sampled."""

    out: Path
    stdout: str
    input: Path


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calibrated]:
    """`refine calibrate gsm` on 50 of 120 labelled records, three rounds."""
    root = tmp_path_factory.mktemp("calibrate")
    inp = write_jsonl(root / "in.jsonl", records(120))
    with GsmServer(seed=3).serve() as url:
        done = refine(*calibrate_args(inp, root / "cal", url, "--max-iters", "3"))
    assert done.returncode == 0, done.stderr
    yield Calibrated(root / "cal", done.stdout, inp)


def test_printed_rates_equal_those_recomputed_from_the_traces(calibrated: Calibrated) -> None:
    """Each round's printed accuracy, flips, correction and introduction equal the traces'."""
    rounds, _ = recount(calibrated.out / "refine")
    printed = [m.groups() for line in calibrated.stdout.splitlines() if (m := ROW.match(line))]
    assert len(printed) == len(rounds) == 3
    for (t, right, n, better, worse, same, fixed, wrong, broken, right_b, pays), r in zip(
        printed, rounds, strict=True
    ):
        assert int(n) == r.n == 50, t
        assert int(right) == r.right_before - r.broken + r.fixed, t
        assert (int(better), int(worse), int(same)) == (r.fixed, r.broken, r.n - r.fixed - r.broken)
        assert (int(fixed), int(wrong)) == (r.fixed, r.n - r.right_before), t
        assert (int(broken), int(right_b)) == (r.broken, r.right_before), t
        assert (pays == "yes") is rule(r), t
    # The server's answers flip both ways: some round fixes and breaks answers.
    assert any(r.fixed and r.broken for r in rounds)


def test_the_recommendation_follows_the_rule(calibrated: Calibrated) -> None:
    """The recommendation is the number of leading rounds for which the rule holds."""
    rounds, _ = recount(calibrated.out / "refine")
    expected = next((t for t, r in enumerate(rounds) if not rule(r)), len(rounds))
    cal = read_calibration(calibrated.out)
    assert cal.recommendation == expected
    assert f"rounds that pay: {expected} refinement(s)" in calibrated.stdout
    reasons = calibrated.stdout.split("refinement(s)\n", 1)[1].splitlines()[:2]
    assert reasons[0].startswith(f"  round {max(expected, 1)} corrects"), reasons
    assert reasons[1].startswith("  ") and reasons[1].endswith(")" if expected == 0 else ""), (
        reasons
    )


def test_calibration_json_holds_the_recounted_figures(calibrated: Calibrated) -> None:
    """calibration.json's rounds and chosen row hold the counts recomputed from the traces."""
    rounds, chosen = recount(calibrated.out / "refine")
    data = orjson.loads((calibrated.out / CALIBRATION).read_bytes())
    assert data["metric"] == {"name": "correct", "source": "label"}
    assert data["sample"] == {"records": 50, "requested": 50}
    for row, r in zip(data["rounds"], rounds, strict=True):
        assert (row["n"], row["right_before"], row["fixed"], row["broken"]) == (
            r.n,
            r.right_before,
            r.fixed,
            r.broken,
        )
        assert row["correction"] == pytest.approx(r.fixed / (r.n - r.right_before))
        assert row["introduction"] == pytest.approx(r.broken / r.right_before)
        assert (row["vs_first"]["better"], row["vs_first"]["worse"]) == (
            r.first_better,
            r.first_worse,
        )
        assert row["calls_per_record"] > 0 and row["cost_per_record"] > 0
    c = data["chosen"]
    assert (c["fixed"], c["broken"], c["right_before"]) == (
        chosen.fixed,
        chosen.broken,
        chosen.right_before,
    )
    assert data["calls_per_record"] > 1 and data["cost_per_record"] > 0


def test_the_report_counts_the_same_flips(calibrated: Calibrated) -> None:
    """The report's flips of `correct` per round and of the chosen output equal the traces'."""
    rounds, chosen = recount(calibrated.out / "refine")
    flips = summarize(calibrated.out / "refine").flips
    assert flips is not None
    (m,) = [m for m in flips.metrics if m.name == "correct"]
    for got, r in zip(m.rounds, rounds, strict=True):
        assert (got.vs_previous.better, got.vs_previous.worse, got.vs_previous.n) == (
            r.fixed,
            r.broken,
            r.n,
        )
        assert (got.vs_first.better, got.vs_first.worse) == (r.first_better, r.first_worse)
        assert got.rates is not None and got.rates.right_before == r.right_before
    assert (m.chosen.vs_first.better, m.chosen.vs_first.worse) == (
        chosen.first_better,
        chosen.first_worse,
    )
    # The default rule never outputs what the checks rank below the first answer.
    assert flips.ranks is not None and (flips.ranks.compared, flips.ranks.below) == (50, 0)


def test_the_sample_is_taken_evenly(calibrated: Calibrated) -> None:
    """The sample is the record at every k-th position of the input, in order."""
    ids = [r["id"] for r in read_jsonl(calibrated.out / "sample.jsonl")]
    everything = [r["id"] for r in read_jsonl(calibrated.input)]
    assert ids == [everything[i] for i in even_positions(120, 50)]
    assert even_positions(120, 50)[:4] == [0, 2, 4, 7] and even_positions(3, 50) == [0, 1, 2]


# -- --max-iters auto --------------------------------------------------------------------------


def test_where_refining_pays_auto_runs_the_recommended_rounds(tmp_path: Path) -> None:
    """A model whose refinements are mostly right: calibrate recommends refining, and
    `--max-iters auto` runs with that many."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(40))
    with GsmServer(p_right=0.3, p_right_later=0.9, p_done=0.0).serve() as url:
        cal = refine(
            *calibrate_args(inp, tmp_path / "cal", url, "--sample", "20", "--max-iters", "2")
        )
        assert cal.returncode == 0, cal.stderr
        recommended = read_calibration(tmp_path / "cal").recommendation
        done = refine(
            "run", "gsm", str(inp), "--out", str(tmp_path / "run"), "--base-url", url,
            "--max-iters", "auto", "--calibration", str(tmp_path / "cal"), "--quiet",
            "--limit", "3",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert recommended is not None and recommended >= 1 and "recommendation: " in cal.stdout
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["settings"]["max_iters"] == recommended


def write_calibration(directory: Path, recommendation: int, **changes: Any) -> Path:
    """A calibration.json for gsm on gpt-4o-mini recommending ``recommendation``."""
    job = load_job("gsm")
    data: dict[str, Any] = {
        "job": {"name": job.name, "hash": job.content_hash},
        "model": "gpt-4o-mini",
    }
    data.update(changes, recommendation=recommendation)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CALIBRATION).write_bytes(orjson.dumps(data))
    return directory


def test_max_iters_auto_reads_the_recommendation(tmp_path: Path) -> None:
    """`refine run --max-iters auto --calibration DIR` runs with the recommended refinements."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(4))
    cal = write_calibration(tmp_path / "cal", 2)
    with GsmServer(p_done=0.0).serve() as url:
        done = refine(
            "run", "gsm", str(inp), "--out", str(tmp_path / "run"), "--base-url", url,
            "--max-iters", "auto", "--calibration", str(cal), "--quiet",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["settings"]["max_iters"] == 2
    assert max(o["iterations"] for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--max-iters", "auto"), "--max-iters auto needs --calibration DIR"),
        (("--calibration", "CAL"), "--calibration goes with --max-iters auto"),
        (("--max-iters", "auto", "--calibration", "NONE"), "no calibration.json in"),
        (("--max-iters", "auto", "--calibration", "OTHER"), "calibrated model 'gpt-4o'"),
        (("--max-iters", "auto", "--calibration", "JOB"), "calibrated job 'acronym'"),
    ],
)
def test_max_iters_auto_without_a_fitting_calibration_is_a_usage_error(
    tmp_path: Path, extra: tuple[str, ...], message: str
) -> None:
    """Without a calibration, or with one of another model or job, `auto` exits 2, saying why."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(1))
    dirs = {
        "CAL": write_calibration(tmp_path / "cal", 1),
        "NONE": tmp_path,
        "OTHER": write_calibration(tmp_path / "other", 1, model="gpt-4o"),
        "JOB": write_calibration(tmp_path / "job", 1, job={"name": "acronym", "hash": "x"}),
    }
    args = [str(dirs.get(a, a)) for a in extra]
    done = refine("run", "gsm", str(inp), "--out", str(tmp_path / "run"), *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


# -- a run's behaviour: resume, budget ---------------------------------------------------------


def test_killed_calibrate_resumes_without_repeating_a_call(tmp_path: Path) -> None:
    """SIGKILLed mid-way, the same command finishes: no call journaled before the kill is
    asked again, and the calibration is written."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(30))
    out = tmp_path / "cal"
    server = GsmServer(seed=5, delay_s=0.05)
    with server.serve() as url:
        # best-of-n asks refine's first requests again by design: its own arm, its own calls
        args = calibrate_args(
            inp, out, url, "--sample", "12", "--concurrency", "2", "--arms", "refine,first"
        )
        proc = subprocess.Popen([*REFINE, *args], env=ENV, text=True)
        wait_for_calls(out / "refine", 15, proc)
        assert proc.poll() is None, "the calibration finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (out / CALIBRATION).exists()
        journaled = {  # a kill may tear the last line; the resumed run drops it too
            orjson.dumps(s.messages, option=orjson.OPT_SORT_KEYS)
            for steps in read_steps(out / "refine" / "checkpoint.jsonl", set()).values()
            for s in steps
        }
        before = len(server.bodies)
        done = refine(*args)
        after = Counter(
            orjson.dumps(b["messages"], option=orjson.OPT_SORT_KEYS) for b in server.bodies[before:]
        )
    assert done.returncode == 0, done.stderr
    assert len(journaled) >= 15 and not journaled & set(after)
    assert read_calibration(out).data["records"] == {"done": 12, "failed": 0}


def test_calibrate_stops_at_the_budget_and_continues_with_a_larger_one(tmp_path: Path) -> None:
    """At --budget it exits 6 without a calibration; the same command with more finishes it."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(20))
    with GsmServer(seed=1).serve() as url:
        args = calibrate_args(inp, tmp_path / "cal", url, "--sample", "10")
        stopped = refine(*args, "--budget", "0.0002")
        assert stopped.returncode == 6, stopped.stderr
        assert not (tmp_path / "cal" / CALIBRATION).exists()
        done = refine(*args, "--budget", "1")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cal" / CALIBRATION).exists()


def test_another_sample_into_the_same_directory_is_refused(tmp_path: Path) -> None:
    """A calibration directory holds one sample: another --sample there exits 2."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(20))
    with GsmServer().serve() as url:
        assert refine(*calibrate_args(inp, tmp_path / "cal", url, "--sample", "4")).returncode == 0
        other = refine(*calibrate_args(inp, tmp_path / "cal", url, "--sample", "5"))
    assert other.returncode == 2 and "another sample" in other.stderr


def test_a_sample_without_labels_says_what_is_missing(tmp_path: Path) -> None:
    """Without labels there is nothing to calibrate by: exit 2 before any call, naming the
    file, the label field and the way out."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(6, labels=False))
    server = GsmServer()
    with server.serve() as url:
        done = refine(*calibrate_args(inp, tmp_path / "cal", url, "--sample", "3"))
    assert done.returncode == 2, done.stderr
    assert f"{inp}: none of the 3 sampled records carries target" in done.stderr
    assert "add it to the records" in done.stderr
    assert server.bodies == []


# -- labels measure, they never choose ---------------------------------------------------------


@pytest.mark.parametrize("ids", [True, False], ids=["with-ids", "content-hash-ids"])
def test_chosen_outputs_are_the_same_with_or_without_labels(tmp_path: Path, ids: bool) -> None:
    """The same records with and without `target` end with the same chosen outputs."""
    outputs = {}
    with GsmServer(seed=11).serve() as url:
        for labels in (True, False):
            inp = write_jsonl(tmp_path / f"in-{labels}.jsonl", records(24, labels=labels, ids=ids))
            settings = Settings(model="gpt-4o-mini", base_url=url, max_iters=3, concurrency=4)
            out = tmp_path / f"run-{labels}"
            summary = run("gsm", inp, out, settings, api_key="k", show_progress=False)
            assert summary.exit_code == 0, summary.message
            outputs[labels] = {o["line"]: o for o in read_jsonl(out / "outputs.jsonl")}
    labelled, bare = outputs[True], outputs[False]
    assert labelled.keys() == bare.keys() and len(labelled) == 24
    for line, o in labelled.items():
        assert (o["output"], o["chosen_iteration"]) == (
            bare[line]["output"],
            bare[line]["chosen_iteration"],
        )
        assert "correct" in o["metrics"] and "correct" not in bare[line]["metrics"]
    # The chosen answers differ in rightness from the first: labels had something to change.
    assert any(
        o["metrics"]["correct"] != o["metrics_by_iteration"][0]["correct"]
        for o in labelled.values()
    )


def test_the_server_answers_from_the_question_not_a_label() -> None:
    """The fake works its answers out from the question alone (so labels cannot leak in)."""
    text, answer = gsm_server.question(5)
    assert str(answer) not in text.split("How many")[1]
    body = {"messages": [{"role": "user", "content": f"The problem:\n\n{text}"}]}
    program = GsmServer(p_right=1.0).answer(body)
    assert "return marbles + bought - given" in program


def test_calibrate_from_python_by_a_named_metric(tmp_path: Path) -> None:
    """`pipeline.commands.calibrate.calibrate` does what the command does; an unknown metric
    is refused before any call, and asking again calibrates without repeating a call."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(10))
    server = GsmServer()
    with server.serve() as url:
        settings = Settings(model="gpt-4o-mini", base_url=url, max_iters=1)
        kwargs: dict[str, Any] = {"sample": 4, "api_key": "k", "show_progress": False}
        with pytest.raises(ConfigError, match="--metric missing: job 'gsm' declares no such"):
            calibrate("gsm", inp, tmp_path / "cal", settings, metric="missing", **kwargs)
        assert server.bodies == []
        done = calibrate("gsm", inp, tmp_path / "cal", settings, metric="correct", **kwargs)
        calls = len(server.bodies)
        again = calibrate("gsm", inp, tmp_path / "cal", settings, metric="correct", **kwargs)
    assert done.calibration is not None and done.exit_code == 0
    assert done.calibration.data["metric"] == {"name": "correct", "source": "label"}
    assert again.calibration is not None and again.calibration.data == done.calibration.data
    assert len(server.bodies) == calls  # nothing asked twice
