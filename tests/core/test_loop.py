"""The Self-Refine loop: stop rules, the default choice, and refine_record with fakes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

from pipeline.core.answer_kinds import Code
from pipeline.core.choice import choose
from pipeline.core.loader import load_job
from pipeline.core.loop import (
    CUT_OFF,
    RETRY_FREQUENCY_PENALTY,
    Call,
    Next,
    Policy,
    Stop,
    StopReason,
    next_call,
    plan,
    refine_record,
)
from pipeline.core.records import Record
from pipeline.core.steps import CallKind, Completion, Outcome, Step
from pipeline.core.trace import steps_of, stored_steps, trace_line
from pipeline.errors import AuthError, CallError, FatalCallError
from tests.fakes import RecordingSink, ScriptedClient

# code-improve without its hooks: plain code answers; scores its feedback; threshold 10
SCORED = dataclasses.replace(
    load_job("code-improve"), checker=None, evaluator=None, answer_kind=Code()
)
UNSCORED = dataclasses.replace(SCORED, score_field=None, score_threshold=None)
THRESHOLD_8 = dataclasses.replace(SCORED, score_threshold=8.0)
RECORD = Record("r1", 7, {"id": "r1", "task": "sum the even numbers of a list"})
USAGE = {"prompt_tokens": 10, "completion_tokens": 5}


# -- step builders ---------------------------------------------------------------------------


def gen(output: str = "v0", checks: list[str] | None = None) -> Step:
    """A completed generate step whose answer is ``output``."""
    return Step("generate", 0, [], output, None, USAGE, 0.1, 1, output=output, checks=checks)


def ref(iteration: int, output: str | None = None, checks: list[str] | None = None) -> Step:
    """A completed refine step at ``iteration``."""
    out = output if output is not None else f"v{iteration}"
    return Step("refine", iteration, [], out, None, USAGE, 0.1, 1, output=out, checks=checks)


def fb(
    iteration: int,
    *,
    score: float | None = None,
    done: bool = False,
    actions: Sequence[str] = ("fix it",),
    parsed: bool = True,
) -> Step:
    """A completed feedback step on the answer of ``iteration``."""
    obj = {"actions": list(actions), "done": done, "score": score}
    raw = orjson.dumps(obj).decode() if parsed else "just prose, no JSON"
    error = None if parsed else {"type": "feedback_parse", "message": "no JSON object"}
    return Step("feedback", iteration, [], raw, obj if parsed else None, USAGE, 0.1, 1, error=error)


def nxt(role: str, t: int, call_kind: CallKind | None = None) -> Next:
    default = CallKind.FEEDBACK if role == "feedback" else CallKind.ANSWER
    return Next(role, call_kind or default, t)  # type: ignore[arg-type]


# -- plan ------------------------------------------------------------------------------------

PLAN_CASES = [
    pytest.param([], SCORED, 3, nxt("generate", 0), id="start-generates"),
    pytest.param([gen()], SCORED, 3, nxt("feedback", 0), id="generate-then-feedback"),
    pytest.param([gen()], UNSCORED, 3, nxt("feedback", 0), id="unscored-generate-then-feedback"),
    pytest.param([gen(), fb(0, done=True)], SCORED, 3, Stop(StopReason.DONE), id="done"),
    pytest.param(
        [gen(), fb(0, done=True, score=2)],
        SCORED,
        3,
        Stop(StopReason.DONE),
        id="done-beats-low-score",
    ),
    pytest.param(
        [gen(), fb(0, score=10)], SCORED, 3, Stop(StopReason.SCORE), id="score-at-threshold"
    ),
    pytest.param(
        [gen(), fb(0, score=8)], THRESHOLD_8, 3, Stop(StopReason.SCORE), id="score-equal-8"
    ),
    pytest.param([gen(), fb(0, score=9.5)], SCORED, 3, nxt("refine", 1), id="score-below"),
    pytest.param([gen(), fb(0, score=10)], UNSCORED, 3, nxt("refine", 1), id="unscored-no-score"),
    pytest.param(
        [gen(), fb(0, parsed=False)], SCORED, 3, nxt("refine", 1), id="unparsed-feedback-refines"
    ),
    pytest.param(
        [gen(checks=["a test fails"]), fb(0, done=True)],
        SCORED,
        3,
        nxt("refine", 1),
        id="checks-veto-done",
    ),
    pytest.param([gen(), fb(0), ref(1)], SCORED, 3, nxt("feedback", 1), id="refine-then-feedback"),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1), ref(2), fb(2)], SCORED, 3, nxt("refine", 3), id="third"
    ),
    pytest.param(
        [gen("def f():\n    return 1"), fb(0), ref(1, "def f():\n  return   1\n")],
        SCORED,
        3,
        Stop(StopReason.NO_CHANGE),
        id="no-change-modulo-whitespace",
    ),
    pytest.param(
        [gen(), fb(0), ref(1, "v1"), fb(1), ref(2, "v1")],
        UNSCORED,
        5,
        Stop(StopReason.NO_CHANGE),
        id="no-change-later-unscored",
    ),
    # max_iters: the last answer gets a feedback only when the job scores
    pytest.param([gen(), fb(0), ref(1)], SCORED, 1, nxt("feedback", 1), id="scored-last-feedback"),
    pytest.param(
        [gen(), fb(0), ref(1)], UNSCORED, 1, Stop(StopReason.MAX_ITERS), id="unscored-last"
    ),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1, score=10)],
        SCORED,
        1,
        Stop(StopReason.SCORE),
        id="threshold-at-max",
    ),
    pytest.param(
        [gen(), fb(0), ref(1, "v0")], SCORED, 1, Stop(StopReason.MAX_ITERS), id="copy-at-max-is-max"
    ),
    # --max-iters 0: initial generation only, no feedback even for a scored job
    pytest.param([gen()], SCORED, 0, Stop(StopReason.MAX_ITERS), id="max-iters-0-scored"),
]


@pytest.mark.parametrize(("steps", "job", "max_iters", "expected"), PLAN_CASES)
def test_plan(steps: list[Step], job: Any, max_iters: int, expected: object) -> None:
    """plan names the next call, or the first stop rule that holds."""
    assert plan(steps, job, Policy(max_iters)) == expected


def test_min_iters_defers_the_critics_verdict() -> None:
    """With min_iters=1 the critic's done (or a top score) on the first draft does not stop,
    and a copy of an answer the critic called done stops as done."""
    steps = [gen("draft"), fb(0, done=True, score=10)]
    assert plan(steps, SCORED, Policy(2)) == Stop(StopReason.DONE)
    assert plan(steps, SCORED, Policy(2, min_iters=1)) == nxt("refine", 1)
    assert plan([*steps, ref(1, "draft")], SCORED, Policy(3, 1)) == Stop(StopReason.DONE)
    assert plan([gen("draft"), fb(0), ref(1, "draft")], SCORED, Policy(3, 1)) == Stop(
        StopReason.NO_CHANGE
    )


# -- the default choice ----------------------------------------------------------------------

CHOOSE_CASES = [
    pytest.param([], SCORED, (None, None, ()), id="nothing"),
    pytest.param([gen()], SCORED, (0, None, (None,)), id="generate-only"),
    pytest.param(
        [gen(), fb(0, score=5), ref(1), fb(1, score=8), ref(2), fb(2, score=7)],
        SCORED,
        (1, 8.0, (5.0, 8.0, 7.0)),
        id="best-score-wins",
    ),
    pytest.param(
        [gen(), fb(0, score=8), ref(1), fb(1, score=8)],
        SCORED,
        (1, 8.0, (8.0, 8.0)),
        id="tie-goes-to-later",
    ),
    pytest.param(
        [gen(), fb(0, score=9), ref(1), fb(1, score=3)],
        UNSCORED,
        (1, None, (None, None)),
        id="unscored-job-takes-last",
    ),
    pytest.param(
        [gen(checks=[]), fb(0, score=4), ref(1, checks=["x"]), fb(1, score=9)],
        SCORED,
        (0, 4.0, (4.0, 9.0)),
        id="only-passing-answers-compete",
    ),
    pytest.param(
        [gen(checks=["a"]), fb(0), ref(1, checks=[]), fb(1), ref(2, checks=["b"])],
        UNSCORED,
        (1, None, (None, None, None)),
        id="latest-passing-unscored",
    ),
    pytest.param(
        [gen(checks=["a"]), fb(0), ref(1, checks=["a", "b"]), fb(1), ref(2, checks=["a", "c"])],
        UNSCORED,
        (0, None, (None, None, None)),
        id="none-passing-never-below-the-first",
    ),
    pytest.param(
        [gen(checks=["a", "b"]), fb(0), ref(1, checks=["c"]), fb(1), ref(2, checks=["d"])],
        UNSCORED,
        (2, None, (None, None, None)),
        id="none-passing-latest-of-the-best-ranked",
    ),
]


@pytest.mark.parametrize(("steps", "job", "expected"), CHOOSE_CASES)
def test_default_choice(steps: list[Step], job: Any, expected: tuple[Any, ...]) -> None:
    """The best passing iteration by score (ties to the later), else the latest passing;
    where none passes, the latest of those the checks rank best (never below the first)."""
    choice = choose(job, steps)
    chosen = None if choice.step is None else choice.step.iteration
    assert (chosen, choice.score, choice.scores) == expected


# -- refine_record with fakes ----------------------------------------------------------------


def code(version: str) -> str:
    """An answer holding one python block."""
    return f"Here you go:\n```python\n{version}\n```\nShort note."


def feedback(score: int, *, done: bool = False, action: str = "do better") -> str:
    """A well-formed feedback answer for code-improve."""
    return orjson.dumps(
        {"speed": "ok", "readability": "ok", "actions": [action], "score": score, "done": done}
    ).decode()


SCRIPT = [
    code("v0"),
    feedback(4, action="ACTION-0"),
    code("v1"),
    feedback(7, action="ACTION-1"),
    code("v2"),
    feedback(6, action="ACTION-2"),
    code("v3"),
    feedback(5, action="ACTION-3"),
]


async def run(
    script: Sequence[str | Completion | Exception],
    *,
    job: Any = SCORED,
    max_iters: int = 3,
    prior: Sequence[Step] = (),
    policy: Policy | None = None,
) -> tuple[Outcome, ScriptedClient, RecordingSink]:
    """refine_record over a scripted client; the outcome and both fakes."""
    sink = RecordingSink()
    client = ScriptedClient(script, sink=sink)
    outcome = await refine_record(
        RECORD, job, client, sink, policy or Policy(max_iters), prior=prior
    )
    assert client.script == [], "the loop stopped before using every scripted answer"
    return outcome, client, sink


def text_of(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


@pytest.mark.anyio
async def test_refine_record_runs_generate_feedback_refine() -> None:
    """Roles alternate generate, feedback, refine…; the best-scored answer is the output."""
    outcome, client, _ = await run(SCRIPT)
    assert [(s.role, s.iteration) for s in outcome.steps] == [
        ("generate", 0),
        ("feedback", 0),
        ("refine", 1),
        ("feedback", 1),
        ("refine", 2),
        ("feedback", 2),
        ("refine", 3),
        ("feedback", 3),
    ]
    assert {s.call_kind for s in outcome.steps} == {CallKind.ANSWER, CallKind.FEEDBACK}
    assert (outcome.status, outcome.stop_reason, outcome.error) == ("done", "max_iters", None)
    assert (outcome.output, outcome.chosen_iteration, outcome.score) == ("v1", 1, 7.0)
    assert outcome.iterations == 3
    assert outcome.scores == (4.0, 7.0, 6.0, 5.0)
    assert outcome.usage() == {
        "prompt_tokens": 800,
        "cached_tokens": 0,
        "completion_tokens": 160,
        "calls": 8,
    }
    assert [s is not None for s in client.schemas] == [False, True] * 4
    assert [s.messages for s in outcome.steps] == client.messages
    assert client.cache_keys == [RECORD.id] * 8


@pytest.mark.anyio
async def test_every_refine_call_carries_input_answer_feedback_and_history() -> None:
    """Self-Refine's invariant: each refine call holds the record's input, the latest answer,
    the feedback on it and every earlier (answer, feedback) pair, oldest first."""
    outcome, client, _ = await run(SCRIPT)
    refines = [m for m, s in zip(client.messages, outcome.steps, strict=True) if s.role == "refine"]
    assert len(refines) == 3
    for t, messages in enumerate(refines, start=1):
        text = text_of(messages)
        assert RECORD.fields["task"] in text
        marks = [f"v{i}" for i in range(t)] + [f"ACTION-{i}" for i in range(t)]
        assert all(mark in text for mark in marks)
        order = [text.index(f"```python\nv{i}\n```") for i in range(t)]
        assert order == sorted(order)
        assert text.index(f"ACTION-{t - 1}") > text.index(f"```python\nv{t - 1}\n```")
        assert messages[-1]["role"] == "user" and messages[-1]["content"].strip().startswith(
            "Improve the latest code"
        )


@pytest.mark.anyio
async def test_each_call_extends_the_previous_calls_messages() -> None:
    """A record's calls form one conversation: every call's messages start with the previous
    call's, so a provider's prefix cache serves them; no two calls are identical."""
    _, client, _ = await run(SCRIPT)
    for before, after in zip(client.messages, client.messages[1:], strict=False):
        assert after[: len(before)] == before and len(after) > len(before)
    assert client.messages[0][0] == {"role": "system", "content": SCORED.system_prompt}
    distinct = {orjson.dumps(m) for m in client.messages}
    assert len(distinct) == len(client.messages)


@pytest.mark.anyio
async def test_the_checks_findings_reach_the_critic_and_the_refinement() -> None:
    """What the checks found in an answer is in the feedback request on it, which the
    refine call carries; the critic's verdict does not stop the loop while they find any."""
    finding = "The test `assert f(2) == 5` fails: f(2) returned 4."

    def check(fields: Mapping[str, Any], output: str) -> list[str]:
        return [finding] if output == "v0" else []

    job = dataclasses.replace(SCORED, checker=check)
    script = [code("v0"), feedback(10, done=True), code("v1"), feedback(10, done=True)]
    outcome, client, _ = await run(script, job=job)
    assert finding in client.messages[1][-1]["content"]
    assert finding in text_of(client.messages[2])
    assert [s.checks for s in outcome.steps if s.role != "feedback"] == [[finding], []]
    assert (outcome.stop_reason, outcome.output) == ("done", "v1")


@pytest.mark.anyio
async def test_labels_reach_neither_a_prompt_nor_a_check() -> None:
    """A label field measures: the evaluator reads it, no message and no check sees it."""
    from pipeline.core.jobs import InputField

    seen: list[Mapping[str, Any]] = []

    def check(fields: Mapping[str, Any], output: str) -> list[str]:
        seen.append(dict(fields))
        return []

    def evaluate(fields: Mapping[str, Any], output: str) -> dict[str, Any]:
        return {"correct": fields.get("answer") == output}

    job = dataclasses.replace(
        UNSCORED,
        inputs=(*SCORED.inputs, InputField("answer", "string", False, use="label")),
        checker=check,
        evaluator=evaluate,
    )
    record = Record("r2", 1, {"task": "say v1", "answer": "SECRET-LABEL"})
    sink = RecordingSink()
    client = ScriptedClient([code("v0"), feedback(3), code("SECRET-LABEL")])
    outcome = await refine_record(record, job, client, sink, Policy(1))
    assert all("SECRET-LABEL" not in text_of(m) for m in client.messages[:2])
    assert all("answer" not in fields for fields in seen) and len(seen) == 2
    assert outcome.answers()[-1].metrics == {"correct": True}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("script", "max_iters", "reason", "output"),
    [
        ([code("v0"), feedback(3, done=True)], 3, "done", "v0"),
        ([code("v0"), feedback(4), code("v1"), feedback(10)], 3, "score_threshold", "v1"),
        ([code("v0"), feedback(4), code("  v0 ")], 3, "no_change", "v0"),
        ([code("v0")], 0, "max_iters", "v0"),
    ],
)
async def test_refine_record_stops_by_rule(
    script: list[str], max_iters: int, reason: str, output: str
) -> None:
    """The loop stops at the first stop rule that holds, making no further call."""
    outcome, _, _ = await run(script, max_iters=max_iters)
    assert (outcome.status, outcome.stop_reason, outcome.output) == ("done", reason, output)


@pytest.mark.anyio
async def test_unscored_job_takes_the_last_answer_without_final_feedback() -> None:
    """Without scores, the last refinement is the output and it gets no feedback call."""
    script = [code("v0"), feedback(9), code("v1"), feedback(2), code("v2")]
    outcome, _, _ = await run(script, job=UNSCORED, max_iters=2)
    assert [s.role for s in outcome.steps][-1] == "refine"
    assert (outcome.output, outcome.chosen_iteration, outcome.score) == ("v2", 2, None)


@pytest.mark.anyio
async def test_unparsable_feedback_is_a_step_error_and_its_text_drives_the_refinement() -> None:
    """Feedback without JSON is a feedback_parse step error; its raw text reaches the refine."""
    prose = "Rename acc to total and use sum() with a generator."
    outcome, client, _ = await run([code("v0"), prose, code("v1"), feedback(10)])
    step = outcome.steps[1]
    assert (step.role, step.parsed, step.response) == ("feedback", None, prose)
    assert step.error is not None and step.error["type"] == "feedback_parse"
    assert prose in text_of(client.messages[2])
    assert (outcome.stop_reason, outcome.output, outcome.error) == ("score_threshold", "v1", None)


@pytest.mark.anyio
async def test_call_error_fails_the_record() -> None:
    """A CallError from the client ends the record as failed, the call last in its trace."""
    script: list[str | Exception] = [
        code("v0"),
        feedback(4),
        CallError("timeout", "read timed out after 60 s"),
    ]
    outcome, _, sink = await run(script)
    assert (outcome.status, outcome.stop_reason) == ("failed", "error")
    assert outcome.error is not None and outcome.error["type"] == "timeout"
    assert "read timed out after 60 s" in outcome.error["message"]
    failed = outcome.steps[-1]
    assert failed.failed and (failed.role, failed.iteration, failed.call_kind) == (
        "refine",
        1,
        CallKind.ANSWER,
    )
    assert outcome.usage()["calls"] == 2 and len(sink.saved) == 2


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error",
    [FatalCallError("not_found", "no such model"), AuthError("auth", "HTTP 401: bad key")],
)
async def test_fatal_call_error_propagates(error: FatalCallError) -> None:
    """A FatalCallError is not turned into a failed record: it stops the run."""
    sink = RecordingSink()
    client = ScriptedClient([code("v0"), error], sink=sink)
    with pytest.raises(FatalCallError) as info:
        await refine_record(RECORD, SCORED, client, sink, Policy(3))
    assert info.value is error
    assert len(sink.saved) == 1


@pytest.mark.anyio
async def test_every_step_is_saved_in_order_before_the_next_call() -> None:
    """Each completed step reaches the sink, with consecutive indices, before the next call."""
    outcome, client, sink = await run(SCRIPT)
    assert [(rid, i) for rid, i, _ in sink.saved] == [(RECORD.id, i) for i in range(8)]
    assert tuple(step for _, _, step in sink.saved) == outcome.steps
    assert client.saved_at_call == list(range(8))


@pytest.mark.anyio
@pytest.mark.parametrize("done", range(1, 9))
async def test_resume_from_prior_steps_repeats_no_call(done: int) -> None:
    """Resuming after k saved steps makes only the remaining calls and gives the same outcome."""
    full, _, _ = await run(SCRIPT)
    stored = orjson.loads(orjson.dumps(stored_steps(full.steps[:done])))
    resumed, client, sink = await run(SCRIPT[done:], prior=steps_of(stored))
    assert client.messages == [s.messages for s in full.steps[done:]]
    assert [i for _, i, _ in sink.saved] == list(range(done, len(SCRIPT)))
    assert resumed == full
    assert resumed.output_line() == full.output_line()
    assert trace_line(resumed) == trace_line(full)


def cut_off(text: str) -> Completion:
    """A reply that ran into max_tokens."""
    return Completion(text, 100, 1024, 0.5, 1, finish_reason="length", model="fake-model")


RUNAWAY = '{"speed": "doll, doll, doll, doll, doll'


@pytest.mark.anyio
async def test_answer_cut_off_is_repaired_once_with_a_penalty() -> None:
    """An answer cut off inside its code is asked again (a repair: the same messages, a
    frequency penalty); the repair is the iteration's answer, the cut-off attempt stays."""
    outcome, client, _ = await run(
        [cut_off("Here you go:\n```python\nv0"), code("v0b"), feedback(3, done=True)]
    )
    assert [(s.role, s.call_kind) for s in outcome.steps] == [
        ("generate", CallKind.ANSWER),
        ("generate", CallKind.REPAIR),
        ("feedback", CallKind.FEEDBACK),
    ]
    assert (outcome.steps[0].error or {}).get("type") == "cut_off"
    assert client.penalties == [None, RETRY_FREQUENCY_PENALTY, None]
    assert client.messages[1] == client.messages[0]
    assert "v0b" in text_of(client.messages[2])
    assert (outcome.output, outcome.iterations, outcome.scores) == ("v0b", 0, (3.0,))


@pytest.mark.anyio
async def test_answer_cut_off_twice_is_a_finding() -> None:
    """A repair cut off again stands: marked, it vetoes done, and the refinement is told."""
    cut = cut_off("Here you go:\n```python\nv0")
    outcome, client, _ = await run(
        [cut, cut, feedback(3, done=True), code("v1"), feedback(4, done=True)]
    )
    assert [(s.error or {}).get("type") for s in outcome.steps[:2]] == ["cut_off", "length"]
    assert outcome.steps[1].checks == [CUT_OFF]
    assert CUT_OFF in text_of(client.messages[3])
    assert (outcome.stop_reason, outcome.output) == ("done", "v1")


@pytest.mark.anyio
async def test_repair_can_be_turned_off() -> None:
    """With repair off a cut-off answer stands at once, with the cut-off finding."""
    job = dataclasses.replace(
        SCORED, strategies=dataclasses.replace(SCORED.strategies, repair=False)
    )
    outcome, client, _ = await run(
        [cut_off("```python\nv0"), feedback(3), code("v1"), feedback(10)], job=job
    )
    assert [s.call_kind for s in outcome.steps].count(CallKind.REPAIR) == 0
    assert (outcome.steps[0].error or {}).get("type") == "length"
    assert outcome.steps[0].checks == [CUT_OFF] and client.penalties == [None] * 4


@pytest.mark.anyio
async def test_answer_whose_prose_was_cut_off_is_whole() -> None:
    """Only the prose after a closed code block ran out: the code stands, with no finding."""
    text = code("v0") + "\nThis code adds the numbers one by one, and then it"
    outcome, _, _ = await run([cut_off(text), feedback(3, done=True)])
    assert outcome.steps[0].checks is None and outcome.stop_reason == "done"


@pytest.mark.anyio
async def test_feedback_cut_off_is_repaired_and_resume_keeps_the_penalty() -> None:
    """A cut-off feedback is asked again with a penalty, also right after a resume."""
    script: list[str | Completion | Exception] = [
        code("v0"),
        cut_off(RUNAWAY),
        feedback(3, done=True),
    ]
    outcome, client, _ = await run(script)
    assert [s.call_kind for s in outcome.steps] == [
        CallKind.ANSWER,
        CallKind.FEEDBACK,
        CallKind.REPAIR,
    ]
    assert client.penalties == [None, None, RETRY_FREQUENCY_PENALTY]
    assert client.messages[2] == client.messages[1]
    assert (outcome.stop_reason, outcome.score) == ("done", 3.0)
    resumed, client, _ = await run(script[2:], prior=outcome.steps[:2])
    assert client.penalties == [RETRY_FREQUENCY_PENALTY]
    assert resumed.output_line() == outcome.output_line()


@pytest.mark.anyio
async def test_evaluator_metrics_are_kept_and_its_errors_recorded() -> None:
    """The job's evaluator runs on each answer; one that raises is recorded on the step as a
    hook failure naming the hook and the job, its metrics left out, and counted per record."""

    def evaluate(fields: Mapping[str, Any], output: str) -> Mapping[str, Any]:
        if output == "v1":
            raise ValueError("cannot score v1")
        return {"chars": len(output)}

    job = dataclasses.replace(SCORED, evaluator=evaluate)
    outcome, _, _ = await run([code("v0"), feedback(4), code("v1"), feedback(10)], job=job)
    assert [a.metrics for a in outcome.answers()] == [{"chars": 2}, None]
    [failure] = outcome.answers()[1].hook_errors
    assert (
        failure.message == f"hook evaluate of job {job.name!r} raised ValueError: cannot score v1"
    )
    assert outcome.output_line()["hook_errors"] == {"evaluate": 1}
    assert outcome.status == "done"


def test_next_call_of_a_repair_carries_the_penalty() -> None:
    """A repair's request carries the frequency penalty; a first call's carries none."""
    draft = Step("generate", 0, [{"role": "user", "content": "q"}], code("v0"), None, USAGE, 0.1,
                 1, output="v0")  # fmt: skip
    cut = Step(
        "feedback", 0, [], RUNAWAY, None, USAGE, 0.1, 1, error={"type": "cut_off", "message": "m"}
    )
    repair = next_call(SCORED, RECORD, [draft, cut], Policy(3))
    assert isinstance(repair, Call) and (repair.role, repair.call_kind) == (
        "feedback",
        CallKind.REPAIR,
    )
    assert repair.request.frequency_penalty == RETRY_FREQUENCY_PENALTY
    first = next_call(SCORED, RECORD, [draft], Policy(3))
    assert isinstance(first, Call) and first.request.frequency_penalty is None
