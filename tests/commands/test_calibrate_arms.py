"""`refine calibrate`'s arms at equal budget, against the simulator's answer key: a model whose
refinements are right more often than its first drafts, and one whose are right less often.

Every figure checked here is recounted from the arms' run directories (outputs.jsonl and
the records' labels), independently of the calibration's own code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.commands.arms import Part, size_best_of_n
from pipeline.commands.calibration import CALIBRATION
from pipeline.testing.simulator import AnswerKey, SimConfig, Simulator
from tests.helpers import SHARED_DATA, read_jsonl, sent, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]
ENV = {**os.environ, "OPENAI_API_KEY": "sk-test"}


def refine(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the `refine` command; its output as text."""
    return subprocess.run(
        [*REFINE, *args], env=ENV, capture_output=True, text=True, timeout=300, check=False
    )


def gsm_records(n: int) -> list[dict[str, Any]]:
    """The first ``n`` GSM8K test problems, with their reference answers."""
    with (SHARED_DATA / "gsm8k-test.jsonl").open("rb") as fh:
        return [orjson.loads(line) for line in islice(fh, n)]


@dataclass(frozen=True)
class Calibration:
    """A finished calibration: its directory, its input, what it printed, calibration.json."""

    out: Path
    input: Path
    stdout: str
    data: dict[str, Any]


def calibrate(tmp: Path, sim: Simulator, *extra: str) -> Calibration:
    """`refine calibrate gsm` on 40 of 60 GSM8K problems, two refinements at most."""
    inp = write_jsonl(tmp / "in.jsonl", gsm_records(60))
    out = tmp / "cal"
    done = refine(
        "calibrate", "gsm", str(inp), "--out", str(out), "--base-url", sim.url, "--quiet",
        "--max-iters", "2", "--sample", "40", *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = orjson.loads((out / CALIBRATION).read_bytes())
    return Calibration(out, inp, done.stdout, data)


def simulated(p_right: float, p_right_refined: float) -> Simulator:
    """A model that knows GSM8K's answers: right at one rate first and another refined."""
    key = AnswerKey.from_records(gsm_records(60))
    return Simulator(SimConfig(answer_key=key, p_right=p_right, p_right_refined=p_right_refined))


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calibration]:
    """Refinement helps: first drafts right 30% of the time, refinements 90%."""
    with simulated(0.3, 0.9) as sim:
        yield calibrate(tmp_path_factory.mktemp("helps"), sim)


@pytest.fixture(scope="module")
def hurts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calibration]:
    """Refinement hurts: first drafts right 80% of the time, refinements 20%."""
    with simulated(0.8, 0.2) as sim:
        yield calibrate(tmp_path_factory.mktemp("hurts"), sim)


# -- recounted from the run directories ----------------------------------------------------------


def outputs(cal: Calibration, arm: str) -> list[dict[str, Any]]:
    """The output lines of an arm's run directories."""
    lines: list[dict[str, Any]] = []
    for run_dir in arm_entry(cal, arm)["run_dirs"]:
        lines += read_jsonl(cal.out / run_dir / "outputs.jsonl")
    return lines


def arm_entry(cal: Calibration, arm: str) -> dict[str, Any]:
    """The arm's row in calibration.json."""
    (entry,) = [a for a in cal.data["arms"] if a["name"] == arm]
    return dict(entry)


def right_by_label(cal: Calibration, arm: str) -> int:
    """Records whose answer (the chosen output; the first answer for `first`) returns the
    label the sample gives its problem."""
    labels = {
        str(r["input"]): float(str(r["target"]).rsplit("####", 1)[-1].replace(",", ""))
        for r in read_jsonl(cal.out / "sample.jsonl")
    }
    right = 0
    for run_dir in arm_entry(cal, arm)["run_dirs"]:
        for trace in read_jsonl(cal.out / run_dir / "traces.jsonl"):
            steps: list[dict[str, Any]] = trace["steps"]
            asked = sent(trace)[0][-1]["content"]
            (problem,) = [q for q in labels if q in asked]
            if arm == "first":
                answer = next(s for s in steps if s.get("iteration_answer") and not s["iteration"])
            else:
                answer = next(s for s in steps if s.get("chosen"))
            returned = float(str(answer["output"]).rsplit("return ", 1)[1])
            right += returned == labels[problem]
    return right


def calls_per_record(cal: Calibration, arm: str) -> float:
    """Calls the provider answered per record, from the arm's output lines."""
    lines = outputs(cal, arm)
    return float(sum(o["usage"]["calls"] for o in lines)) / len(lines)


@pytest.mark.parametrize("case", ["helps", "hurts"])
def test_each_arms_accuracy_is_the_count_of_right_answers_in_its_run_dirs(
    case: str, request: pytest.FixtureRequest
) -> None:
    """Each arm's right count, printed and in calibration.json, equals the number of its
    outputs (refine's first answers, for `first`) returning the record's label."""
    cal: Calibration = request.getfixturevalue(case)
    for arm in ("refine", "best-of-n", "first"):
        entry = arm_entry(cal, arm)
        assert entry["measured"] == 40
        assert entry["right"] == right_by_label(cal, arm), arm
        printed = next(line for line in cal.stdout.splitlines() if line.startswith(f"{arm} "))
        assert f"({entry['right']}/40)" in printed


@pytest.mark.parametrize("case", ["helps", "hurts"])
def test_best_of_n_makes_refines_calls_per_record_within_ten_percent(
    case: str, request: pytest.FixtureRequest
) -> None:
    """Best-of-n's calls per record, counted from its outputs, are within 10% of refine's,
    and every draft of a record is a sample of the same request."""
    cal: Calibration = request.getfixturevalue(case)
    refined, sampled = calls_per_record(cal, "refine"), calls_per_record(cal, "best-of-n")
    assert abs(sampled / refined - 1) <= 0.10, (sampled, refined)
    for run_dir in arm_entry(cal, "best-of-n")["run_dirs"]:
        n = int(run_dir.rsplit("-", 1)[1])
        for trace in read_jsonl(cal.out / run_dir / "traces.jsonl"):
            kinds = [s["kind"] for s in trace["steps"]]
            assert kinds == ["answer"] + ["sample"] * (n - 1)


def test_where_refinement_helps_calibrate_recommends_it(helps: Calibration) -> None:
    """Refinements right 90% against first drafts 30%: refine is detectably better than both
    other arms and is recommended."""
    comparison = helps.data["comparison"]
    assert (comparison["best"], comparison["recommended"]) == ("refine", "refine")
    assert {p["arm"]: p["worse"] for p in comparison["pairs"]} == {
        "best-of-n": True,
        "first": True,
    }
    assert "recommendation: refine" in helps.stdout


def test_where_refinement_hurts_calibrate_does_not_recommend_it(hurts: Calibration) -> None:
    """Refinements right 20% against first drafts 80%: refine is detectably worse than the
    best, and the cheapest arm not detectably worse (the first answer) is recommended."""
    comparison = hurts.data["comparison"]
    assert comparison["recommended"] == "first" and comparison["best"] != "refine"
    (refine_pair,) = [p for p in comparison["pairs"] if p["arm"] == "refine"]
    assert refine_pair["worse"] and refine_pair["p_value"] < 0.05
    assert hurts.data["recommendation"] == 0  # and no round of refinement pays


def test_the_cost_is_estimated_before_and_reported_after(helps: Calibration) -> None:
    """The estimate opens the output; the spend closing it is the sum of the run
    directories' own costs (each to the millionth of a dollar), first answers not counted
    twice."""
    assert helps.stdout.startswith("estimated cost before anything is spent")
    spent = sum(o["cost_usd"] for arm in ("refine", "best-of-n") for o in outputs(helps, arm))
    assert helps.data["spent_usd"] == pytest.approx(spent, abs=3e-6)
    assert f"spent: ${helps.data['spent_usd']:.6f} in all" in helps.stdout


@pytest.mark.parametrize(
    ("calls", "per_draft", "records", "parts"),
    [
        (4.0, 1.0, 10, [Part(4, tuple(range(10)))]),
        (3.5, 1.0, 4, [Part(3, (1, 3)), Part(4, (0, 2))]),
        (2.5, 1.25, 6, [Part(2, tuple(range(6)))]),
        (3.3, 1.0, 10, [Part(3, (1, 2, 4, 5, 7, 8, 9)), Part(4, (0, 3, 6))]),
        (40.0, 1.0, 3, [Part(16, (0, 1, 2))]),
        (0.5, 1.0, 2, [Part(1, (0, 1))]),
    ],
)
def test_best_of_n_is_split_between_two_sizes_to_meet_the_calls(
    calls: float, per_draft: float, records: int, parts: list[Part]
) -> None:
    """N and N + 1 drafts share the records so their calls average refine's, within 1..16."""
    assert list(size_best_of_n(calls, per_draft, records)) == parts
