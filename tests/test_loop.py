"""The Self-Refine loop: stop rules, choice, prompts with history, and refine_record with fakes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

from pipeline.calls import Completion, Outcome, Step
from pipeline.errors import AuthError, CallError, FatalCallError
from pipeline.jobs import InputField, Job, load_job
from pipeline.loop import (
    CUT_OFF,
    RETRY_FREQUENCY_PENALTY,
    Call,
    Policy,
    Stop,
    build_messages,
    choose,
    next_call,
    plan,
    refine_record,
    render_history,
)
from pipeline.records import Record
from tests.fakes import RecordingSink, ScriptedClient

# code-improve without its hooks and tests: scores its feedback; score_threshold 10
SCORED = dataclasses.replace(
    load_job("code-improve"), checker=None, evaluator=None, extract="code", retry_copy=False
)
UNSCORED = dataclasses.replace(SCORED, score_field=None, score_threshold=None)
THRESHOLD_8 = dataclasses.replace(SCORED, score_threshold=8.0)
RECORD = Record("r1", 7, {"id": "r1", "task": "sum the even numbers of a list"})
USAGE = {"prompt_tokens": 10, "completion_tokens": 5}


# -- step builders ---------------------------------------------------------------------------


def gen(output: str = "v0") -> Step:
    """A completed generate step whose answer is ``output``."""
    return Step("generate", 0, [], output, None, USAGE, 0.1, 1, output=output)


def ref(iteration: int, output: str | None = None) -> Step:
    """A completed refine step at ``iteration``."""
    out = output if output is not None else f"v{iteration}"
    return Step("refine", iteration, [], out, None, USAGE, 0.1, 1, output=out)


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


# -- plan ------------------------------------------------------------------------------------

PLAN_CASES = [
    pytest.param([], SCORED, 3, ("generate", 0), id="start-generates"),
    pytest.param([gen()], SCORED, 3, ("feedback", 0), id="generate-then-feedback"),
    pytest.param([gen()], UNSCORED, 3, ("feedback", 0), id="unscored-generate-then-feedback"),
    pytest.param([gen(), fb(0, done=True)], SCORED, 3, Stop("done"), id="done"),
    pytest.param(
        [gen(), fb(0, done=True, score=2)], SCORED, 3, Stop("done"), id="done-beats-low-score"
    ),
    pytest.param(
        [gen(), fb(0, done=True, score=10)], SCORED, 3, Stop("done"), id="done-before-threshold"
    ),
    pytest.param(
        [gen(), fb(0, score=10)], SCORED, 3, Stop("score_threshold"), id="score-at-threshold"
    ),
    pytest.param(
        [gen(), fb(0, score=8)], THRESHOLD_8, 3, Stop("score_threshold"), id="score-equal-8"
    ),
    pytest.param([gen(), fb(0, score=9.5)], SCORED, 3, ("refine", 1), id="score-below-threshold"),
    pytest.param([gen(), fb(0, score=10)], UNSCORED, 3, ("refine", 1), id="unscored-ignores-score"),
    pytest.param(
        [gen(), fb(0, parsed=False)], SCORED, 3, ("refine", 1), id="unparsed-feedback-refines"
    ),
    pytest.param([gen(), fb(0), ref(1)], SCORED, 3, ("feedback", 1), id="refine-then-feedback"),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1), ref(2), fb(2)], SCORED, 3, ("refine", 3), id="third-refine"
    ),
    pytest.param(
        [gen("def f():\n    return 1"), fb(0), ref(1, "def f():\n  return   1\n")],
        SCORED,
        3,
        Stop("no_change"),
        id="no-change-modulo-whitespace",
    ),
    pytest.param(
        [gen("return 1"), fb(0), ref(1, "return 2")],
        SCORED,
        3,
        ("feedback", 1),
        id="small-change-is-a-change",
    ),
    pytest.param(
        [gen(), fb(0), ref(1, "v1"), fb(1), ref(2, "v1")],
        UNSCORED,
        5,
        Stop("no_change"),
        id="no-change-later-unscored",
    ),
    # max_iters: the last answer gets a feedback only when the job scores
    pytest.param([gen(), fb(0), ref(1)], SCORED, 1, ("feedback", 1), id="scored-last-feedback"),
    pytest.param([gen(), fb(0), ref(1)], UNSCORED, 1, Stop("max_iters"), id="unscored-last"),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1, score=3)], SCORED, 1, Stop("max_iters"), id="scored-max"
    ),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1, score=10)],
        SCORED,
        1,
        Stop("score_threshold"),
        id="threshold-before-max-iters",
    ),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1, done=True)], SCORED, 1, Stop("done"), id="done-at-max"
    ),
    # DESIGN's order: max_iters before no_change, for the last refinement made
    pytest.param(
        [gen(), fb(0), ref(1, "v0")], SCORED, 1, Stop("max_iters"), id="copy-at-max-is-max-iters"
    ),
    pytest.param(
        [gen(), fb(0), ref(1, "v1"), fb(1), ref(2, "v1")],
        UNSCORED,
        2,
        Stop("max_iters"),
        id="unscored-copy-at-max-is-max-iters",
    ),
    # --max-iters 0: initial generation only, no feedback even for a scored job
    pytest.param([gen()], SCORED, 0, Stop("max_iters"), id="max-iters-0-scored"),
    pytest.param([gen()], UNSCORED, 0, Stop("max_iters"), id="max-iters-0-unscored"),
]


@pytest.mark.parametrize(("steps", "job", "max_iters", "expected"), PLAN_CASES)
def test_plan(steps: list[Step], job: Job, max_iters: int, expected: object) -> None:
    """plan names the next call, or the first stop rule that holds."""
    assert plan(steps, job, max_iters) == expected


# -- choose ----------------------------------------------------------------------------------

CHOOSE_CASES = [
    pytest.param([], SCORED, (None, None, []), id="nothing"),
    pytest.param([gen()], SCORED, (0, None, [None]), id="generate-only"),
    pytest.param(
        [gen(), fb(0, score=5), ref(1), fb(1, score=8), ref(2), fb(2, score=7)],
        SCORED,
        (1, 8.0, [5.0, 8.0, 7.0]),
        id="best-score-wins",
    ),
    pytest.param(
        [gen(), fb(0, score=8), ref(1), fb(1, score=8)],
        SCORED,
        (1, 8.0, [8.0, 8.0]),
        id="tie-goes-to-later",
    ),
    pytest.param(
        [gen(), fb(0, score=0), ref(1), fb(1, score=0)],
        SCORED,
        (1, 0.0, [0.0, 0.0]),
        id="zero-scores-tie-later",
    ),
    pytest.param(
        [gen(), fb(0, score=0), ref(1), fb(1, score=-1)],
        SCORED,
        (0, 0.0, [0.0, -1.0]),
        id="zero-beats-negative",
    ),
    pytest.param(
        [gen(), fb(0, score=6), ref(1, "v0")],
        SCORED,
        (0, 6.0, [6.0, None]),
        id="unscored-last-answer-loses",
    ),
    pytest.param(
        [gen(), fb(0, parsed=False), ref(1), fb(1, score=2)],
        SCORED,
        (1, 2.0, [None, 2.0]),
        id="unparsed-feedback-has-no-score",
    ),
    pytest.param(
        [gen(), fb(0, score=9), ref(1), fb(1, score=3)],
        UNSCORED,
        (1, None, [None, None]),
        id="unscored-job-takes-last",
    ),
    pytest.param(
        [gen(), fb(0), ref(1), fb(1), ref(2)],
        SCORED,
        (2, None, [None, None, None]),
        id="no-scores-takes-last",
    ),
]


@pytest.mark.parametrize(("steps", "job", "expected"), CHOOSE_CASES)
def test_choose(steps: list[Step], job: Job, expected: tuple[Any, ...]) -> None:
    """The best-scored iteration is chosen (ties to the later); without scores, the last."""
    chosen, score, scores = choose(steps, job)
    assert (chosen, score, scores) == expected


# -- prompts ---------------------------------------------------------------------------------


def history_steps() -> list[Step]:
    """Three answers and their feedback, each with distinct, findable text."""
    steps: list[Step] = [gen("OUTPUT-0")]
    for t in range(3):
        steps.append(fb(t, score=t + 1, actions=[f"ACTION-{t}a", f"ACTION-{t}b"]))
        if t < 2:
            steps.append(ref(t + 1, f"OUTPUT-{t + 1}"))
    return steps


def user_prompt(messages: list[dict[str, str]]) -> str:
    """The content of the last (user) message."""
    assert messages[-1]["role"] == "user"
    return messages[-1]["content"]


def test_refine_prompt_carries_the_whole_history() -> None:
    """A refine at iteration 3 shows every earlier answer and every earlier feedback's actions."""
    messages = build_messages(SCORED, RECORD, "refine", 3, history_steps())
    assert [m["role"] for m in messages] == ["system", "user"]
    prompt = user_prompt(messages)
    assert RECORD.fields["task"] in prompt
    for t in range(3):
        assert f"OUTPUT-{t}" in prompt
        assert f"ACTION-{t}a" in prompt and f"ACTION-{t}b" in prompt
    # oldest first, and the latest answer and feedback come after the history
    positions = [prompt.index(f"OUTPUT-{t}") for t in range(3)]
    assert positions == sorted(positions)
    assert prompt.index("ACTION-1b") < prompt.index("ACTION-2a")
    # the latest (answer, feedback) pair is shown once, as the latest, not also in the history
    assert prompt.count("OUTPUT-2") == 1 and prompt.count("ACTION-2a") == 1
    assert "{{" not in prompt


def test_first_refine_has_no_earlier_attempts() -> None:
    """A refine at iteration 1 gets the answer and its feedback; the history says there is none."""
    steps = [gen("OUTPUT-0"), fb(0, actions=["ACTION-0"])]
    prompt = user_prompt(build_messages(SCORED, RECORD, "refine", 1, steps))
    assert "OUTPUT-0" in prompt and "ACTION-0" in prompt
    assert "(no earlier attempts)" in prompt


def test_render_history_covers_only_iterations_before_upto() -> None:
    """render_history(upto) lists the (answer, feedback) pairs with iteration < upto, in order."""
    text = render_history(SCORED, history_steps(), 2)
    assert "OUTPUT-0" in text and "OUTPUT-1" in text and "OUTPUT-2" not in text
    assert "ACTION-0a" in text and "ACTION-1b" in text and "ACTION-2a" not in text
    assert text.index("OUTPUT-0") < text.index("ACTION-0a") < text.index("OUTPUT-1")


def test_refine_prompt_uses_raw_text_of_unparsed_feedback() -> None:
    """Feedback that could not be parsed reaches the refine prompt as the model wrote it."""
    steps = [gen("OUTPUT-0"), fb(0, parsed=False)]
    prompt = user_prompt(build_messages(SCORED, RECORD, "refine", 1, steps))
    assert "just prose, no JSON" in prompt


def test_feedback_prompt_shows_only_the_answer_under_review() -> None:
    """The feedback prompt for iteration t holds answer t and the task, not earlier answers."""
    steps = history_steps()[:-1]  # up to refine 2, without its feedback
    prompt = user_prompt(build_messages(SCORED, RECORD, "feedback", 2, steps))
    assert "OUTPUT-2" in prompt and RECORD.fields["task"] in prompt
    assert "OUTPUT-1" not in prompt and "ACTION-1a" not in prompt


def test_feedback_prompt_shows_what_the_checks_found_in_that_answer() -> None:
    """The critic reviews a run, not only a reading: the feedback prompt holds the check
    findings of the answer under review (a failing test with the value the code gave),
    not those of an earlier answer; an answer the checks passed shows none."""
    failing = "Failing test `assert f(2) == 5`: AssertionError (f(2) is 4)."
    earlier = "Failing test `assert f(0) == 1`: AssertionError (f(0) is 0)."
    first = dataclasses.replace(gen("OUTPUT-0"), checks=[earlier])
    second = dataclasses.replace(ref(1, "OUTPUT-1"), checks=[failing])
    steps = [first, fb(0), second]
    prompt = user_prompt(build_messages(SCORED, RECORD, "feedback", 1, steps))
    assert f"- {failing}" in prompt and earlier not in prompt
    assert prompt.index("OUTPUT-1") < prompt.index(failing)
    clean = [first, fb(0), dataclasses.replace(second, checks=[])]
    assert "found:\n\n(none)" in user_prompt(build_messages(SCORED, RECORD, "feedback", 1, clean))
    unchecked = [first, fb(0), ref(1, "OUTPUT-1")]  # checks off: nothing ran
    assert "(not checked)" in user_prompt(build_messages(SCORED, RECORD, "feedback", 1, unchecked))


def test_generate_prompt_holds_the_record_fields() -> None:
    """The generate prompt is the job's template filled with the record's fields."""
    messages = build_messages(SCORED, RECORD, "generate", 0, [])
    assert messages[0] == {"role": "system", "content": SCORED.system_prompt}
    assert user_prompt(messages) == SCORED.generate_prompt.replace(
        "{{task}}", RECORD.fields["task"]
    )


def test_null_optional_field_renders_like_an_absent_one() -> None:
    """The reader treats a null optional field as absent; prompts must do the same."""
    job = dataclasses.replace(
        UNSCORED,
        inputs=(InputField("task", "string"), InputField("hint", "string", required=False)),
        generate_prompt="Do {{task}}. Hint: [{{hint}}]",
        system_prompt=None,
    )
    absent = Record("a", 1, {"task": "t"})
    null = Record("b", 2, {"task": "t", "hint": None})
    assert user_prompt(build_messages(job, absent, "generate", 0, [])) == "Do t. Hint: []"
    assert user_prompt(build_messages(job, null, "generate", 0, [])) == "Do t. Hint: []"


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
    feedback(4),
    code("v1"),
    feedback(7),
    code("v2"),
    feedback(6),
    code("v3"),
    feedback(5),
]


async def run(
    script: Sequence[str | Completion | Exception],
    *,
    job: Job = SCORED,
    max_iters: int = 3,
    prior: Sequence[Step] = (),
) -> tuple[Outcome, ScriptedClient, RecordingSink]:
    """refine_record over a scripted client; the outcome and both fakes."""
    sink = RecordingSink()
    client = ScriptedClient(script, sink=sink)
    outcome = await refine_record(RECORD, job, client, sink, Policy(max_iters), prior=prior)
    assert client.script == [], "the loop stopped before using every scripted answer"
    return outcome, client, sink


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
    assert (outcome.status, outcome.stop_reason, outcome.error) == ("done", "max_iters", None)
    assert (outcome.output, outcome.chosen_iteration, outcome.score) == ("v1", 1, 7.0)
    assert outcome.iterations == 3
    assert outcome.scores == (4.0, 7.0, 6.0, 5.0)
    assert outcome.usage() == {"prompt_tokens": 800, "completion_tokens": 160, "calls": 8}
    # only feedback calls ask for structured output
    assert [s is not None for s in client.schemas] == [False, True] * 4
    assert all(s is SCORED.feedback_schema for s in client.schemas[1::2])
    # each step records the messages exactly as sent
    assert [s.messages for s in outcome.steps] == client.messages


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
async def test_unparsable_feedback_is_a_step_error_and_the_loop_goes_on() -> None:
    """Feedback without JSON is a feedback_parse step error; its raw text drives the refine."""
    prose = "Rename acc to total and use sum() with a generator."
    script = [code("v0"), prose, code("v1"), feedback(10)]
    outcome, client, _ = await run(script)
    step = outcome.steps[1]
    assert (step.role, step.parsed, step.response) == ("feedback", None, prose)
    assert step.error is not None and step.error["type"] == "feedback_parse"
    assert prose in user_prompt(client.messages[2])
    assert (outcome.status, outcome.stop_reason, outcome.output) == (
        "done",
        "score_threshold",
        "v1",
    )
    assert outcome.error is None


@pytest.mark.anyio
async def test_call_error_fails_the_record() -> None:
    """A CallError from the client ends the record as failed, with the error's type and message."""
    script: list[str | Exception] = [
        code("v0"),
        feedback(4),
        CallError("timeout", "read timed out after 60 s"),
    ]
    outcome, _, sink = await run(script)
    assert (outcome.status, outcome.stop_reason) == ("failed", "error")
    assert outcome.error is not None
    assert outcome.error["type"] == "timeout"
    assert "read timed out after 60 s" in outcome.error["message"]
    assert "refine" in outcome.error["message"]
    # the failed call is the last step of the trace, with its error; it is not checkpointed
    assert [s.role for s in outcome.steps] == ["generate", "feedback", "refine"]
    failed = outcome.steps[-1]
    assert failed.failed and failed.response is None and failed.output is None
    assert failed.error == {"type": "timeout", "message": "read timed out after 60 s"}
    assert (failed.iteration, failed.model) == (1, "fake-model")
    assert outcome.usage()["calls"] == 2
    assert len(sink.saved) == 2


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
    full, _, full_sink = await run(SCRIPT)
    # the store replays what it saved, through its serialised shape
    prior = [Step.from_dict(orjson.loads(orjson.dumps(s.to_dict()))) for s in full.steps[:done]]
    resumed, client, sink = await run(SCRIPT[done:], prior=prior)
    assert len(client.messages) == len(SCRIPT) - done
    assert client.messages == [s.messages for s in full.steps[done:]]
    assert [i for _, i, _ in sink.saved] == list(range(done, len(SCRIPT)))
    assert resumed == full
    assert resumed.output_line() == full.output_line()
    assert resumed.trace_line() == full.trace_line()
    assert len(full_sink.saved) == len(SCRIPT)


@pytest.mark.anyio
async def test_resume_of_a_finished_record_makes_no_call() -> None:
    """A record whose saved steps already meet a stop rule finishes without any call."""
    full, _, _ = await run([code("v0"), feedback(3, done=True)])
    resumed, client, sink = await run([], prior=full.steps)
    assert client.messages == [] and sink.saved == []
    assert resumed == full


@pytest.mark.anyio
async def test_answer_cut_off_is_asked_once_more_with_a_penalty() -> None:
    """An answer cut off inside its code is asked again, the same messages with a frequency
    penalty; the retry is the iteration's answer and the cut-off attempt stays in the trace."""
    text = "Here you go:\n```python\nv0"  # the block never closed
    cut = Completion(text, 100, 20, 0.5, 1, finish_reason="length", model="fake-model")
    outcome, client, _ = await run([cut, code("v0b"), feedback(3, done=True)])
    assert [(s.role, s.iteration) for s in outcome.steps] == [
        ("generate", 0),
        ("generate", 0),
        ("feedback", 0),
    ]
    assert outcome.steps[0].error is not None and outcome.steps[0].error["type"] == "cut_off"
    assert client.penalties == [None, RETRY_FREQUENCY_PENALTY, None]
    assert client.messages[1] == client.messages[0]
    assert "v0b" in client.messages[2][-1]["content"]  # the critic reads the retry
    line = outcome.output_line()
    assert (line["output"], line["iterations"], line["scores"]) == ("v0b", 0, [3.0])


@pytest.mark.anyio
async def test_answer_cut_off_twice_is_a_finding() -> None:
    """A retry cut off again is the answer: marked, vetoes done, and the refine step is told."""
    text = "Here you go:\n```python\nv0"
    cut = Completion(text, 100, 20, 0.5, 1, finish_reason="length", model="fake-model")
    outcome, client, _ = await run(
        [cut, cut, feedback(3, done=True), code("v1"), feedback(4, done=True)]
    )
    assert [s.role for s in outcome.steps] == [
        "generate",
        "generate",
        "feedback",
        "refine",
        "feedback",
    ]
    assert [(s.error or {}).get("type") for s in outcome.steps[:2]] == ["cut_off", "length"]
    assert outcome.steps[1].checks == [CUT_OFF]
    assert CUT_OFF in client.messages[3][-1]["content"]
    assert (outcome.status, outcome.stop_reason, outcome.output) == ("done", "done", "v1")
    assert client.penalties == [None, RETRY_FREQUENCY_PENALTY, None, None, None]


@pytest.mark.anyio
async def test_cut_off_refinement_is_asked_again_and_resume_keeps_the_penalty() -> None:
    """A refinement cut off is asked once more, also right after a resume."""
    cut = Completion("```python\nv1", 100, 20, 0.5, 1, finish_reason="length", model="x")
    script = [code("v0"), feedback(3), cut, code("v1b"), feedback(9, done=True)]
    first, client, _ = await run(script)
    assert [(s.role, (s.error or {}).get("type")) for s in first.steps[2:4]] == [
        ("refine", "cut_off"),
        ("refine", None),
    ]
    assert client.messages[3] == client.messages[2]
    assert client.penalties == [None, None, None, RETRY_FREQUENCY_PENALTY, None]
    assert (first.output, first.iterations) == ("v1b", 1)
    resumed, client, _ = await run(script[3:], prior=first.steps[:3])
    assert client.penalties == [RETRY_FREQUENCY_PENALTY, None]
    assert resumed.output_line() == first.output_line()


@pytest.mark.anyio
async def test_answer_whose_prose_was_cut_off_is_whole() -> None:
    """Only the prose after a closed code block ran out: the code stands, with no finding."""
    text = code("v0") + "\nThis code adds the numbers one by one, and then it"
    cut = Completion(text, 100, 20, 0.5, 1, finish_reason="length", model="fake-model")
    outcome, _, _ = await run([cut, feedback(3, done=True)])
    assert outcome.steps[0].checks is None and outcome.stop_reason == "done"


def cut_off(text: str) -> Completion:
    """An answer that ran into max_tokens."""
    return Completion(text, 100, 1024, 0.5, 1, finish_reason="length", model="fake-model")


RUNAWAY = '{"speed": "doll, doll, doll, doll, doll'


@pytest.mark.anyio
async def test_feedback_cut_off_is_retried_once_with_a_penalty() -> None:
    """A cut-off feedback is asked again with a frequency penalty; the retry is what counts."""
    outcome, client, _ = await run([code("v0"), cut_off(RUNAWAY), feedback(3, done=True)])
    assert [(s.role, s.iteration) for s in outcome.steps] == [
        ("generate", 0),
        ("feedback", 0),
        ("feedback", 0),
    ]
    assert outcome.steps[1].error == {
        "type": "length",
        "message": "answer cut off at max_tokens (finish_reason=length)",
    }
    assert client.penalties == [None, None, RETRY_FREQUENCY_PENALTY]
    assert client.messages[2] == client.messages[1]  # the same question, asked again
    assert (outcome.stop_reason, outcome.score) == ("done", 3.0)


@pytest.mark.anyio
async def test_feedback_cut_off_twice_stays_a_length_error_and_the_loop_goes_on() -> None:
    """A retry cut off again is kept (as cut off, not as a parse failure); the loop refines."""
    outcome, client, _ = await run(
        [code("v0"), cut_off(RUNAWAY), cut_off(RUNAWAY), code("v1"), feedback(4, done=True)]
    )
    assert [s.role for s in outcome.steps] == [
        "generate",
        "feedback",
        "feedback",
        "refine",
        "feedback",
    ]
    assert [(s.error or {}).get("type") for s in outcome.steps[1:3]] == ["length", "length"]
    assert client.penalties == [None, None, RETRY_FREQUENCY_PENALTY, None, None]
    assert (outcome.output, outcome.stop_reason) == ("v1", "done")


@pytest.mark.anyio
async def test_resumed_cut_off_feedback_is_retried_with_the_penalty() -> None:
    """Resuming right after a cut-off feedback retries it once, with the penalty."""
    first, _, _ = await run([code("v0"), cut_off(RUNAWAY), feedback(3, done=True)])
    resumed, client, _ = await run([feedback(3, done=True)], prior=first.steps[:2])
    assert client.penalties == [RETRY_FREQUENCY_PENALTY]
    assert resumed.output_line() == first.output_line()


@pytest.mark.anyio
async def test_evaluator_metrics_are_kept_and_its_errors_recorded() -> None:
    """The job's evaluator runs on each answer; an evaluator that raises is recorded, not fatal."""

    def evaluate(fields: Mapping[str, Any], output: str) -> Mapping[str, Any]:
        if output == "v1":
            raise ValueError("cannot score v1")
        return {"chars": len(output), "task": fields["task"]}

    job = dataclasses.replace(SCORED, evaluator=evaluate)
    outcome, _, _ = await run([code("v0"), feedback(4), code("v1"), feedback(10)], job=job)
    answers = [s for s in outcome.steps if s.role != "feedback"]
    assert answers[0].metrics == {"chars": 2, "task": RECORD.fields["task"]}
    assert answers[1].metrics == {"error": "ValueError: cannot score v1"}
    assert all(s.metrics is None for s in outcome.steps if s.role == "feedback")
    assert outcome.status == "done"


def test_copy_after_a_deferred_done_stops_as_done() -> None:
    """A copy of an answer the critic called done (deferred by --min-iters) stops as done."""
    steps = [gen("draft"), fb(0, done=True), ref(1, "draft")]
    assert plan(steps, SCORED, max_iters=3, min_iters=1) == Stop("done")
    scored = [gen("draft"), fb(0, score=10), ref(1, "draft")]
    assert plan(scored, SCORED, max_iters=3, min_iters=1) == Stop("score_threshold")
    assert plan([gen("draft"), fb(0), ref(1, "draft")], SCORED, 3, 1) == Stop("no_change")


def test_min_iters_overrides_early_done() -> None:
    """With min_iters=1 the critic's done (or a top score) on the first draft does not stop."""
    steps = [gen("draft"), fb(0, done=True, score=10)]
    assert plan(steps, SCORED, max_iters=2) == Stop("done")
    assert plan(steps, SCORED, max_iters=2, min_iters=1) == ("refine", 1)
    assert plan([gen(), fb(0, score=10)], SCORED, 2, 1) == ("refine", 1)
    later = [*steps, ref(1, "better"), fb(1, done=True)]
    assert plan(later, SCORED, max_iters=2, min_iters=1) == Stop("done")


def test_next_call_after_a_cut_off_feedback_carries_the_penalty() -> None:
    """The Batch API and Ray drivers get the retry's penalty from next_call, as body fields."""
    draft = Step("generate", 0, [], code("v0"), None, USAGE, 0.1, 1, output="v0")
    cut = Step(
        "feedback", 0, [], RUNAWAY, None, USAGE, 0.1, 1, error={"type": "length", "message": "m"}
    )
    retry = next_call(SCORED, RECORD, [draft, cut], Policy(3))
    assert isinstance(retry, Call) and (retry.role, retry.iteration) == ("feedback", 0)
    assert retry.sampling() == {"frequency_penalty": RETRY_FREQUENCY_PENALTY}
    first = next_call(SCORED, RECORD, [draft], Policy(3))
    assert isinstance(first, Call) and first.sampling() == {}
