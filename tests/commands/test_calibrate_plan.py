"""Refusals before spending, the budget across arms, and `refine run --plan` applying a
calibration, against the simulator's answer key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.commands.calibration import CALIBRATION
from pipeline.core.loader import load_job
from pipeline.testing.simulator import AnswerKey, SimConfig, Simulator
from tests.gsm_server import records
from tests.helpers import read_jsonl, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]
ENV = {**os.environ, "OPENAI_API_KEY": "sk-test"}


def refine(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the `refine` command; its output as text."""
    return subprocess.run(
        [*REFINE, *args], env=ENV, capture_output=True, text=True, timeout=300, check=False
    )


def knowing(p_right: float, p_right_refined: float, n: int = 30) -> Simulator:
    """A simulator that knows the answers of ``records(n)``."""
    key = AnswerKey.from_records(records(n))
    return Simulator(SimConfig(answer_key=key, p_right=p_right, p_right_refined=p_right_refined))


def calibrate(
    inp: Path, out: Path, url: str, *extra: str, job: str = "gsm"
) -> subprocess.CompletedProcess[str]:
    """`refine calibrate JOB` on 20 records, two refinements at most."""
    return refine(
        "calibrate", job, str(inp), "--out", str(out), "--base-url", url, "--quiet",
        "--max-iters", "2", "--sample", "20", *extra,
    )  # fmt: skip


def manifest(run_dir: Path) -> dict[str, Any]:
    """A run directory's manifest.json."""
    data: dict[str, Any] = orjson.loads((run_dir / "manifest.json").read_bytes())
    return data


# -- refused before any call -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "fields", "extra", "message"),
    [
        ("dialogue", {"context": "Hi!"}, (), "job 'dialogue' has no evaluator"),
        ("gsm", {"input": "2+2?", "target": 4}, ("--metric", "bogus"),
         "--metric bogus: job 'gsm' declares no such metric (its right-or-wrong metrics: correct)"),
        ("code-optimize", {"input": "print(1)"}, ("--metric", "speedup"),
         "--metric speedup: job 'code-optimize' declares it a number, not right or wrong"),
        ("gsm", {"input": "2+2?"}, (), "none of the 4 sampled records carries target"),
    ],
)  # fmt: skip
def test_what_calibrate_cannot_measure_is_refused_before_any_call(
    tmp_path: Path, job: str, fields: dict[str, Any], extra: tuple[str, ...], message: str
) -> None:
    """No evaluator, an unknown --metric, a metric that is a number, a sample without its
    label: exit 2 naming the cause, no request sent, no run directory made."""
    rows = [{k: f"{v} {i}" if k != "target" else v for k, v in fields.items()} for i in range(4)]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    with Simulator(SimConfig()) as sim:
        done = calibrate(inp, tmp_path / "cal", sim.url, *extra, job=job)
        assert sim.requests == []
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "cal" / "refine").exists()


def test_a_calibration_directory_of_the_earlier_layout_is_refused(tmp_path: Path) -> None:
    """A directory whose run is at its top (calibrate before arms) is refused, saying so."""
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "manifest.json").write_text("{}")
    inp = write_jsonl(tmp_path / "in.jsonl", records(4))
    with knowing(0.5, 0.5) as sim:
        done = calibrate(inp, tmp_path / "cal", sim.url)
        assert sim.requests == []
    assert done.returncode == 2 and "calibrate into a new --out" in done.stderr


@pytest.mark.parametrize(
    ("arms", "message"),
    [("best-of-n,first", "add refine"), ("refine,bogus", "unknown arm bogus")],
)
def test_arms_that_cannot_run_are_refused(tmp_path: Path, arms: str, message: str) -> None:
    """--arms naming an unknown arm, or best-of-n without the refine arm that sizes it."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(4))
    done = refine("calibrate", "gsm", str(inp), "--out", str(tmp_path / "cal"), "--arms", arms)
    assert done.returncode == 2 and message in done.stderr


# -- the budget across arms --------------------------------------------------------------------


def test_the_budget_holds_across_the_arms(tmp_path: Path) -> None:
    """With a budget a little above refine's spend, best-of-n stops at the cap (exit 6, the
    estimate printed first); a larger budget finishes without asking refine's calls again."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(30))
    with knowing(0.5, 0.5) as sim:
        alone = calibrate(inp, tmp_path / "alone", sim.url, "--arms", "refine")
        assert alone.returncode == 0, alone.stderr
        refine_cost = orjson.loads((tmp_path / "alone" / CALIBRATION).read_bytes())["spent_usd"]
        budget = f"{refine_cost * 1.3:.6f}"
        stopped = calibrate(inp, tmp_path / "cal", sim.url, "--budget", budget)
        assert not (tmp_path / "cal" / CALIBRATION).exists()
        before = len(sim.requests)
        done = calibrate(inp, tmp_path / "cal", sim.url, "--budget", "1")
        later = [r.body["messages"] for r in sim.requests[before:]]
    assert stopped.returncode == 6, stopped.stderr
    assert stopped.stdout.startswith("estimated cost before anything is spent")
    assert "caps every arm together" in stopped.stdout
    spent = sum(
        o["cost_usd"] for d in (tmp_path / "cal").rglob("outputs.jsonl") for o in read_jsonl(d)
    )
    assert done.returncode == 0, done.stderr
    data = orjson.loads((tmp_path / "cal" / CALIBRATION).read_bytes())
    assert data["spent_usd"] == pytest.approx(spent, abs=3e-6)
    # refine finished under the first budget: only best-of-n's drafts (no history) follow
    assert later and all(len(messages) == 2 for messages in later)


# -- applying it: refine run --plan ------------------------------------------------------------


@pytest.mark.parametrize(
    ("p_right", "p_right_refined", "arm", "max_iters"),
    [(0.3, 0.9, "refine", 2), (0.8, 0.2, "first", 0)],
)
def test_plan_auto_runs_the_recommended_arm_and_the_manifest_says_so(
    tmp_path: Path, p_right: float, p_right_refined: float, arm: str, max_iters: int
) -> None:
    """`refine run --plan auto --calibration DIR` runs the arm calibrate recommended, with its
    refinements, and its manifest names the arm and the calibration file."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(30))
    with knowing(p_right, p_right_refined) as sim:
        cal = calibrate(inp, tmp_path / "cal", sim.url, "--sample", "30")
        assert cal.returncode == 0, cal.stderr
        done = refine(
            "run", "gsm", str(inp), "--out", str(tmp_path / "run"), "--base-url", sim.url,
            "--plan", "auto", "--calibration", str(tmp_path / "cal"), "--quiet", "--limit", "6",
        )  # fmt: skip
    data = orjson.loads((tmp_path / "cal" / CALIBRATION).read_bytes())
    assert data["comparison"]["recommended"] == arm
    assert done.returncode == 0, done.stderr
    settings = manifest(tmp_path / "run")["settings"]
    assert (settings["plan"], settings["max_iters"]) == (arm, max_iters)
    assert settings["calibration"] == str((tmp_path / "cal" / CALIBRATION).resolve())


def test_plan_best_of_n_runs_the_samples_calibrated(tmp_path: Path) -> None:
    """`--plan best-of-n` runs --max-iters 0 with the drafts best-of-n was calibrated with."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(30))
    with knowing(0.5, 0.5) as sim:
        assert calibrate(inp, tmp_path / "cal", sim.url).returncode == 0
        done = refine(
            "run", "gsm", str(inp), "--out", str(tmp_path / "run"), "--base-url", sim.url,
            "--plan", "best-of-n", "--calibration", str(tmp_path / "cal"), "--quiet",
            "--limit", "3",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = orjson.loads((tmp_path / "cal" / CALIBRATION).read_bytes())
    (entry,) = [a for a in data["arms"] if a["name"] == "best-of-n"]
    settings = manifest(tmp_path / "run")["settings"]
    assert settings["strategy"] == entry["plan"]["strategy"] and settings["max_iters"] == 0
    n = int(entry["plan"]["strategy"][-1].split("=")[1])
    for trace in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        assert len(trace["steps"]) == n


def write_v1(directory: Path) -> Path:
    """A calibration.json as calibrate wrote it before the arms (version 1)."""
    job = load_job("gsm")
    data = {
        "version": 1,
        "job": {"name": job.name, "hash": job.content_hash},
        "model": "gpt-4o-mini",
        "recommendation": 1,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CALIBRATION).write_bytes(orjson.dumps(data))
    return directory


def write_v2(directory: Path) -> Path:
    """A calibration.json comparing one arm, refine, calibrated with the default options."""
    job = load_job("gsm")
    plan = {"max_iters": 2, "strategy": [], "min_iters": 0, "checks": True, "repair": None}
    data = {
        "version": 2,
        "job": {"name": job.name, "hash": job.content_hash},
        "model": "gpt-4o-mini",
        "recommendation": 1,
        "arms": [{"name": "refine", "plan": {**plan, "select": None}}],
        "comparison": {"recommended": "refine"},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CALIBRATION).write_bytes(orjson.dumps(data))
    return directory


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--plan", "auto", "--calibration", "V1"), "written before calibrate compared arms"),
        (
            ("--plan", "auto", "--calibration", "V2", "--min-iters", "1"),
            "the arm refine was calibrated with min_iters=0, not 1",
        ),
        (("--plan", "first", "--calibration", "V2"), "calibrated the arms refine, not first"),
        (("--plan", "auto"), "--plan auto needs --calibration DIR"),
        (("--plan", "auto", "--calibration", "V1", "--max-iters", "1"), "give neither"),
        (("--plan", "auto", "--calibration", "V1", "--strategy", "samples=2"), "give neither"),
    ],
)
def test_plan_without_a_calibration_of_arms_is_a_usage_error(
    tmp_path: Path, extra: tuple[str, ...], message: str
) -> None:
    """--plan needs a calibration that compared arms (and the arm named), sets --max-iters
    and strategies, and refuses a loop option the arm was not calibrated with."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(2))
    dirs = {"V1": write_v1(tmp_path / "v1"), "V2": write_v2(tmp_path / "v2")}
    args = [str(dirs.get(a, a)) for a in extra]
    done = refine("run", "gsm", str(inp), "--out", str(tmp_path / "run"), *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_a_version_1_calibration_still_serves_max_iters_auto(tmp_path: Path) -> None:
    """--max-iters auto reads an earlier calibration.json as before, and records which."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(2))
    v1 = write_v1(tmp_path / "v1")
    with knowing(0.5, 0.5) as sim:
        done = refine(
            "run", "gsm", str(inp), "--out", str(tmp_path / "run"), "--base-url", sim.url,
            "--max-iters", "auto", "--calibration", str(v1), "--quiet",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    settings = manifest(tmp_path / "run")["settings"]
    assert settings["max_iters"] == 1 and settings["plan"] is None
    assert settings["calibration"] == str((v1 / CALIBRATION).resolve())


def test_the_first_answer_alone_is_its_own_run(tmp_path: Path) -> None:
    """`--arms first` runs the first answers into DIR/first: no rounds, and --max-iters auto
    on it is refused while --plan auto runs the first answer."""
    inp = write_jsonl(tmp_path / "in.jsonl", records(10))
    with knowing(0.6, 0.6) as sim:
        cal = calibrate(inp, tmp_path / "cal", sim.url, "--arms", "first", "--sample", "10")
        auto = refine(
            "run", "gsm", str(inp), "--out", str(tmp_path / "run"), "--base-url", sim.url,
            "--max-iters", "auto", "--calibration", str(tmp_path / "cal"),
        )  # fmt: skip
    assert cal.returncode == 0, cal.stderr
    data = orjson.loads((tmp_path / "cal" / CALIBRATION).read_bytes())
    (first,) = data["arms"]
    lines = read_jsonl(tmp_path / "cal" / "first" / "outputs.jsonl")
    assert first["right"] == sum(o["metrics"]["correct"] for o in lines)
    assert all(o["iterations"] == 0 for o in lines) and data["recommendation"] is None
    assert "rounds of refine" not in cal.stdout and "recommendation: first" in cal.stdout
    assert auto.returncode == 2 and "measured no rounds" in auto.stderr
