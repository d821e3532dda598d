"""What jobs declare about their metrics: better direction and source (label or check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.core.jobs import builtin_jobs
from pipeline.core.loader import load_job
from pipeline.core.metrics import MetricSpec, compare
from pipeline.errors import JobError
from tests.core.test_jobs import BASE, write_job

HOOKS = """\
from pipeline.core.metrics import MetricSpec

METRICS = {"length": MetricSpec("check", better="lower"), "right": MetricSpec("label")}


def evaluate(fields, output):
    return {"length": len(output), "right": output == fields.get("answer")}
"""


@pytest.mark.parametrize(
    ("before", "after", "better", "expected"),
    [
        (0.0, 1.0, "higher", 1),
        (1.0, 0.0, "higher", -1),
        (0.5, 0.5, "higher", 0),
        (3.0, 2.0, "lower", 1),
        (2.0, 3.0, "lower", -1),
        (2.0, 2.0, "lower", 0),
    ],
)
def test_compare_follows_the_better_direction(
    before: float, after: float, better: Any, expected: int
) -> None:
    """An answer is better when its value moved the declared way, worse the other way."""
    assert compare(before, after, better) == expected


def test_a_spec_refuses_an_unknown_source_or_direction() -> None:
    """A MetricSpec names its source as label or check, and its direction higher, lower or None."""
    with pytest.raises(ValueError, match="source"):
        MetricSpec("oracle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="better"):
        MetricSpec("check", better="up")  # type: ignore[arg-type]


def test_hooks_declare_the_metrics(tmp_path: Path) -> None:
    """A hooks file's METRICS reaches the job: each metric's source and better direction."""
    (tmp_path / "hooks.py").write_text(HOOKS, encoding="utf-8")
    job = load_job(str(write_job(tmp_path, BASE + '\n[hooks]\nfile = "hooks.py"\n')))
    assert job.metrics == {
        "length": MetricSpec("check", "lower"),
        "right": MetricSpec("label", "higher"),
    }


@pytest.mark.parametrize("metrics", ['METRICS = ["right"]\n', 'METRICS = {"right": "higher"}\n'])
def test_malformed_metrics_is_a_job_error(tmp_path: Path, metrics: str) -> None:
    """METRICS that is not a mapping of names to MetricSpec is refused, naming the hooks file."""
    (tmp_path / "hooks.py").write_text(metrics, encoding="utf-8")
    with pytest.raises(JobError) as info:
        load_job(str(write_job(tmp_path, BASE + '\n[hooks]\nfile = "hooks.py"\n')))
    assert info.value.key == "hooks.file"


@pytest.mark.parametrize(
    ("name", "fields", "output"),
    [
        ("gsm", {"input": "q", "target": 5}, "def solution():\n    return 5\n"),
        ("acronym", {"title": "Grid Search Method", "acronym": "GSM"}, "GSM"),
    ],
)
def test_builtin_declarations_say_which_metrics_read_a_label(
    name: str, fields: dict[str, Any], output: str
) -> None:
    """A metric declared `check` is the same without the labels; one declared `label` is gone."""
    job = load_job(name)
    assert job.evaluator is not None
    with_labels = job.evaluator(fields, output)
    without = job.evaluator(job.shown_fields(fields), output)
    assert set(job.metrics) <= set(with_labels)
    for metric, spec in job.metrics.items():
        if spec.source == "label":
            assert metric not in without, metric
        else:
            assert without[metric] == with_labels[metric], metric


def test_the_docs_table_matches_the_declarations() -> None:
    """docs/calibrate.md's table lists every built-in job's declared metrics as declared:
    source, better direction and type (a row may name several metrics)."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "calibrate.md"
    rows = set()
    for line in docs.read_text(encoding="utf-8").splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[2] in ("label", "check"):
            for metric in cells[1].split(","):
                rows.add((cells[0], metric.strip().strip("`"), *cells[2:]))
    declared = {
        (name, metric, spec.source, spec.better or "none", spec.value_type)
        for name in builtin_jobs()
        for metric, spec in load_job(name).metrics.items()
    }
    assert rows == declared


@pytest.mark.parametrize(
    ("name", "fields", "output"),
    [
        ("gsm", {"input": "q", "target": 5}, "def solution():\n    return 5\n"),
        ("acronym", {"title": "Grid Search Method", "acronym": "GSM"}, "GSM"),
        ("commongen", {"concepts": ["dog", "ball"]}, "The dog chases the ball."),
        ("code-readability", {"input": "x = 1"}, "def f():\n    return 1\n"),
    ],
)
def test_builtin_metric_types_are_the_types_evaluators_return(
    name: str, fields: dict[str, Any], output: str
) -> None:
    """A metric declared boolean is a bool where measured, one declared a number is not."""
    job = load_job(name)
    assert job.evaluator is not None
    measured = job.evaluator(fields, output)
    for metric, spec in job.metrics.items():
        if metric in measured:
            assert isinstance(measured[metric], bool) is (spec.value_type == "boolean"), metric
            assert isinstance(measured[metric], int | float), metric


def test_a_metric_type_is_boolean_or_number() -> None:
    """MetricSpec refuses another type; only a boolean with a higher direction is right or
    wrong, and an undeclared type leaves it open."""
    with pytest.raises(ValueError, match="value_type must be one of"):
        MetricSpec("check", value_type="text")  # type: ignore[arg-type]
    assert MetricSpec("label", value_type="boolean").right_or_wrong is True
    assert MetricSpec("check", value_type="number").right_or_wrong is False
    assert MetricSpec("check", better="lower", value_type="boolean").right_or_wrong is False
    assert MetricSpec("check").right_or_wrong is None
