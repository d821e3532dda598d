"""The opt-in strategies: extra drafts, restarts, copy retries; each off by default."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

from pipeline.core.answer_kinds import Code
from pipeline.core.choice import choose
from pipeline.core.jobs import builtin_jobs
from pipeline.core.loader import load_job
from pipeline.core.loop import Policy, refine_record
from pipeline.core.records import Record
from pipeline.core.steps import CallKind, Outcome, Step
from pipeline.core.strategies import Strategies, parse_specs
from pipeline.errors import ConfigError
from tests.fakes import RecordingSink, ScriptedClient

BASE = dataclasses.replace(
    load_job("code-improve"),
    checker=None,
    evaluator=None,
    answer_kind=Code(),
    score_field=None,
    score_threshold=None,
)
RECORD = Record("r1", 1, {"task": "write f"})


def code(version: str) -> str:
    return f"```python\n{version}\n```"


def feedback(score: int = 5, action: str = "do better") -> str:
    return orjson.dumps({"actions": [action], "score": score, "done": False}).decode()


def check_v(fields: Mapping[str, Any], output: str) -> list[str]:
    """Passes answers whose code says "good"; anything else fails one check."""
    return [] if "good" in output else [f"{output} is wrong"]


def with_strategies(**changes: Any) -> Any:
    return dataclasses.replace(
        BASE, strategies=dataclasses.replace(Strategies(), **changes), checker=check_v
    )


async def run(job: Any, script: Sequence[str], max_iters: int) -> tuple[Outcome, ScriptedClient]:
    client = ScriptedClient(script)
    outcome = await refine_record(RECORD, job, client, RecordingSink(), Policy(max_iters))
    assert client.script == []
    return outcome, client


def test_every_builtin_job_runs_plain_self_refine_by_default() -> None:
    """No built-in job turns a strategy on: one draft per answer, repair only."""
    for name in builtin_jobs():
        job = load_job(name)
        assert job.strategies == Strategies(), name
        assert job.select == "default", name


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        ((), Strategies()),
        (("samples=3",), Strategies(samples=3)),
        (("samples",), Strategies(samples=2)),
        (("restart", "copy-retry"), Strategies(restart=True, copy_retry=True)),
        (("copy_retry=on", "restart=off"), Strategies(copy_retry=True)),
        (("samples=4", "samples=off"), Strategies(samples=1)),
    ],
)
def test_strategy_specs(specs: tuple[str, ...], expected: Strategies) -> None:
    """--strategy NAME[=VALUE] turns a strategy on (or off) over the job's own."""
    assert parse_specs(specs, Strategies()) == expected


@pytest.mark.parametrize(
    ("spec", "says"),
    [("samples=17", "1 to 16"), ("samples=x", "1 to 16"), ("vote", "unknown strategy"),
     ("restart=3", "takes no value")],
)  # fmt: skip
def test_bad_strategy_specs_say_why(spec: str, says: str) -> None:
    """A bad --strategy is a usage error naming the spec."""
    with pytest.raises(ConfigError, match=says):
        parse_specs([spec], Strategies())


@pytest.mark.anyio
async def test_samples_draft_each_answer_from_the_same_messages() -> None:
    """samples=3: each answer drafted three times from the same messages (the later two at
    the sample temperature); the loop goes on with the draft its checks pass, the method's
    own on a tie, and the critic sees only that one."""
    job = with_strategies(samples=3, sample_temperature=1.2)
    script = [code("bad0"), code("good0"), code("bad1"), feedback(), code("bad2"),
              code("bad3"), code("good1")]  # fmt: skip
    outcome, client = await run(job, script, max_iters=1)
    calls = [(s.role, s.call_kind, s.iteration) for s in outcome.steps]
    assert (
        calls
        == [
            ("generate", CallKind.ANSWER, 0),
            ("generate", CallKind.SAMPLE, 0),
            ("generate", CallKind.SAMPLE, 0),
            ("feedback", CallKind.FEEDBACK, 0),
            ("refine", CallKind.ANSWER, 1),
            ("refine", CallKind.SAMPLE, 1),
            ("refine", CallKind.SAMPLE, 1),
            ("feedback", CallKind.FEEDBACK, 1),
        ][: len(calls)]
    )
    assert client.messages[0] == client.messages[1] == client.messages[2]
    assert client.temperatures[:3] == [BASE.temperature, 1.2, 1.2]
    assert "good0" in client.messages[3][-2]["content"]  # the critic reviews the passing draft
    assert client.messages[4] == client.messages[5] == client.messages[6]
    assert [a.output for a in outcome.answers()] == ["good0", "good1"]


@pytest.mark.anyio
async def test_best_of_n_is_samples_without_refinement() -> None:
    """--max-iters 0 with samples=4: four drafts of the first answer, no feedback."""
    job = with_strategies(samples=4)
    outcome, _ = await run(job, [code("a"), code("b"), code("good"), code("c")], 0)
    assert [s.call_kind for s in outcome.steps] == [CallKind.ANSWER] + [CallKind.SAMPLE] * 3
    assert outcome.output == "good" and outcome.usage()["calls"] == 4


@pytest.mark.anyio
async def test_restart_drafts_afresh_only_after_findings() -> None:
    """restart: where the checks found problems in the latest answer, one more draft of the
    next iteration is written from the request and the findings, without that answer."""
    job = with_strategies(restart=True)
    script = [code("bad0"), feedback(), code("bad1"), code("good1"), feedback(), code("good2")]
    outcome, client = await run(job, script, max_iters=2)
    assert (
        [s.call_kind for s in outcome.steps]
        == [
            CallKind.ANSWER,
            CallKind.FEEDBACK,
            CallKind.ANSWER,
            CallKind.RESTART,
            CallKind.FEEDBACK,
            CallKind.ANSWER,  # good1 passed its checks: no restart
            CallKind.FEEDBACK,
        ][: len(outcome.steps)]
    )
    restart = client.messages[3]
    assert len(restart) == 2 and "bad0 is wrong" in restart[-1]["content"]
    assert "```python\nbad0" not in restart[-1]["content"]
    assert RECORD.fields["task"] in restart[-1]["content"]
    assert outcome.answers()[1].call_kind is CallKind.RESTART  # the draft that passed went on


@pytest.mark.anyio
async def test_copy_retry_asks_a_copied_refinement_again_hotter() -> None:
    """copy-retry: a refinement identical to its input is asked once more at the copy
    temperature instead of ending the loop; without it, the loop stops with no_change."""
    script = [code("v0"), feedback(), code("v0"), code("v1")]
    job = with_strategies(copy_retry=True, copy_temperature=1.3)
    outcome, client = await run(job, script, max_iters=1)
    assert [s.call_kind for s in outcome.steps][2:4] == [CallKind.ANSWER, CallKind.COPY_RETRY]
    assert (outcome.steps[2].error or {}).get("type") == "copy"
    assert client.messages[3] == client.messages[2] and client.temperatures[3] == 1.3
    plain, _ = await run(with_strategies(), script[:3], max_iters=2)
    assert plain.stop_reason == "no_change"


class _Longest:
    """A selection rule for the test: the longest draft, measured as it goes."""

    name = "longest"

    def measure(self, fields: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
        assert "label" not in fields
        return {"lengths": [len(o) for o in outputs]}

    def choose(self, drafts: Sequence[Step], scores: Sequence[float | None]) -> int:
        lengths = (drafts[-1].metrics or {})["longest"]["lengths"]
        return max(range(len(drafts)), key=lambda i: lengths[i])


class _LongestKind(Code):
    selections = {"longest": _Longest()}  # noqa: RUF012


@pytest.mark.anyio
async def test_a_kinds_selection_rule_sees_every_draft_and_chooses() -> None:
    """An opt-in selection rule measures after each draft and chooses among all of them,
    samples included; the output line says which rule chose."""
    job = dataclasses.replace(
        with_strategies(samples=2), answer_kind=_LongestKind(), select="longest", checker=None
    )
    script = [code("a"), code("a-very-long-draft"), feedback(), code("bb"), code("ccc")]
    outcome, _ = await run(job, script, max_iters=1)
    assert outcome.output == "a-very-long-draft"
    line = outcome.output_line()
    assert line["chosen_by"] == "longest" and line["chosen_step"] == 1
    assert choose(job, outcome.steps, "default").step is not outcome.steps[1]
