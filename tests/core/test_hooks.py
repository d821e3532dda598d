"""Hooks held to their contract: return types checked, failures counted and shown, a hook
that fails on every answer stops the run (exit 2), signatures checked when the job loads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pipeline import JobError, Settings, load_job, run
from pipeline.commands.status import collect, render
from pipeline.core.hooks import Hook, judge
from pipeline.core.steps import Step
from pipeline.report import write_report
from pipeline.runs.hooks import STRIKES, HookWatch
from pipeline.runs.progress import Counters
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, write_jsonl

JOB = """
name = "headline"
[input.article]
type = "string"
[prompts]
generate = "Write a headline for: {{article}}"
feedback = "Review the headline above. Checks found:\\n{{findings}}"
refine = "Rewrite the headline using the feedback above."
[feedback.schema]
type = "object"
required = ["actions", "done"]
properties.actions = { type = "array", items = { type = "string" } }
properties.done = { type = "boolean" }
[stop]
max_iters = 1
[model]
max_tokens = 64
[hooks]
file = "hooks.py"
"""


def job_with(tmp_path: Path, hooks: str) -> str:
    """A headline job whose hooks file is ``hooks``; the job file's path."""
    (tmp_path / "hooks.py").write_text(hooks)
    (tmp_path / "job.toml").write_text(JOB)
    return str(tmp_path / "job.toml")


def articles(tmp_path: Path, n: int) -> Path:
    return write_jsonl(
        tmp_path / "in.jsonl", [{"id": f"a{i}", "article": f"News {i}"} for i in range(n)]
    )


def ok_evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
    return {"words": len(output.split())}


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda f, o: "too long", "returned str, not a list of findings"),
        (lambda f, o: None, "returned None, not a list of findings"),
        (lambda f, o: [1, 2], "returned a finding of type int, not a string"),
        (lambda f, o: 1 / 0, "raised ZeroDivisionError: division by zero"),
    ],
)
def test_a_check_that_breaks_its_contract_gives_no_findings(check: Any, message: str) -> None:
    """A check returning a string (or None, or numbers) or raising is a failure naming the
    hook and the job; nothing it returned becomes a finding (no characters as findings)."""
    judged = judge("headline", ok_evaluate, check, {}, {}, "A short headline")
    assert judged.findings == [] and judged.metrics == {"words": 3}
    [failure] = judged.failures
    assert failure.hook is Hook.CHECK
    assert failure.message.startswith(f"hook check of job 'headline' {message}")


@pytest.mark.parametrize(
    ("evaluate", "message"),
    [
        (lambda f, o: ["words", 3], "returned list, not a dict of metrics"),
        (lambda f, o: {1: 2}, "returned a metric named 1, not a string"),
        (lambda f, o: {"when": object()}, "returned a value that is not JSON"),
        (lambda f, o: dict[str, int]()["x"], "raised KeyError: 'x'"),
    ],
)
def test_an_evaluator_that_breaks_its_contract_gives_no_metrics(
    evaluate: Any, message: str
) -> None:
    """An evaluator returning anything but a JSON mapping of names, or raising, is a
    failure naming the hook and the job; no metrics are kept."""
    judged = judge("headline", evaluate, None, {}, {}, "A headline")
    assert judged.metrics is None and judged.findings is None
    [failure] = judged.failures
    assert failure.hook is Hook.EVALUATE and message in failure.message
    assert "hook evaluate of job 'headline'" in failure.message


def test_hooks_that_keep_their_contract_pass_through() -> None:
    """Findings and metrics as returned, tuples of findings included; no failure."""
    judged = judge("h", ok_evaluate, lambda f, o: ("Cut it.",), {}, {}, "a b")
    assert (judged.metrics, judged.findings, judged.failures) == ({"words": 2}, ["Cut it."], ())


def test_a_hook_that_cannot_take_fields_and_output_is_refused_on_load(tmp_path: Path) -> None:
    """A hook with the wrong signature is a job error when the job loads, before any call."""
    path = job_with(tmp_path, "def check(output):\n    return []\n")
    with pytest.raises(JobError, match=r"hooks.file: check must take two arguments"):
        load_job(path)


def answer(**kw: Any) -> Step:
    return Step("generate", 0, [], "x", None, {}, 0.0, 1, output="x", **kw)


def test_a_hook_that_worked_once_is_not_taken_for_broken(tmp_path: Path) -> None:
    """The watch stops a run only when a hook failed on each of its first answers: after
    one success, later failures are only counted."""
    job = load_job(job_with(tmp_path, "def check(fields, output):\n    return []\n"))
    failure = judge("headline", None, lambda f, o: "x", {}, {}, "x").failures
    broken = HookWatch(job, checks=True)
    for _ in range(STRIKES - 1):
        assert broken.saw(answer(checks=[], hook_errors=failure)) is None
    stop = broken.saw(answer(checks=[], hook_errors=failure))
    assert stop is not None and "check failed on each of the first 5 answers" in str(stop)
    flaky = HookWatch(job, checks=True)
    flaky.saw(answer(checks=[]))
    assert all(flaky.saw(answer(checks=[], hook_errors=failure)) is None for _ in range(20))


BROKEN = """
def check(fields, output):
    if fields["article"].endswith("3"):
        raise RuntimeError("cannot read article 3")
    return "Shorten it."  # a string, not a list: broken on every answer
"""


def test_hook_failures_are_counted_and_shown(tmp_path: Path) -> None:
    """Failures of a check reach the end-of-run figures, status and report.md; the string
    a check returned never reaches the model as findings."""
    hooks = (
        "def evaluate(fields, output):\n    if fields['article'] == 'News 2':\n"
        "        raise ValueError('no')\n    return {'n': 1}\n"
    )
    path = job_with(tmp_path, hooks)
    with Simulator(SimConfig(p_done=0.0)) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=1)
        summary = run(path, articles(tmp_path, 6), tmp_path / "run", settings, api_key="k",
                      show_progress=False)  # fmt: skip
    assert summary.exit_code == 0
    assert summary.counters.hook_errors == {"evaluate": 2}  # the two answers of one record
    assert "hook errors: evaluate on 2 answer(s)" in summary.counters.line()
    info = collect(tmp_path / "run")
    assert info["hook_errors"] == {"evaluate": 2}
    assert "evaluate failed on 2 answer(s)" in render(info)
    files = write_report(tmp_path / "run")
    assert "hook evaluate failed | on 2 answer(s)" in Path(files.markdown).read_text()


def test_a_hook_broken_on_every_answer_stops_the_run(tmp_path: Path) -> None:
    """A check that returns a string on every answer stops the run with exit 2 naming the
    hook and the job, records left pending; its characters never reach the model."""
    path = job_with(tmp_path, BROKEN)
    with Simulator(SimConfig(p_done=0.0)) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=1, concurrency=2)
        summary = run(path, articles(tmp_path, 40), tmp_path / "run", settings, api_key="k",
                      show_progress=False)  # fmt: skip
        sent = [m["content"] for r in sim.requests for m in r.body["messages"]]
    assert summary.exit_code == 2
    assert summary.message is not None and "hooks.file: check failed on each of the first" in (
        summary.message
    )
    assert "hook check of job 'headline' returned str" in summary.message
    assert not any("- S\n- h" in text for text in sent)
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) < 40


def test_counters_line_keeps_the_invocation_apart_from_the_run() -> None:
    """The end-of-run line labels this invocation's calls, tokens and dollars apart from
    the run's total cost."""
    c = Counters(lines=10, already=6, done=4, calls=9, prompt_tokens=100, completion_tokens=20)
    c.spent_before, c.spent_usd = 0.5, 0.75
    line = c.line()
    assert line.startswith("10/10 records finished; this invocation: 4 done, 0 failed")
    assert "9 calls, 120 tokens, $0.2500" in line and line.endswith("run total: $0.7500")
