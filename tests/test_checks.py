"""Check hooks steering the critic, and the copy guard (program-verified feedback)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

from pipeline.answers import extract, join
from pipeline.calls import Outcome, Step
from pipeline.client import Completion
from pipeline.jobs import Job, load_job
from pipeline.loop import CUT_OFF, RETRY_FREQUENCY_PENALTY, Policy, refine_record
from pipeline.records import Record
from tests.fakes import RecordingSink, ScriptedClient

RECORD = Record("r1", 1, {"id": "r1", "task": "sum a list"})


def must_mention_total(fields: Mapping[str, Any], output: str) -> list[str]:
    """A check: the answer must contain the word 'total'."""
    return [] if "total" in output else ["Name the accumulator `total` (line 2)."]


BASE = dataclasses.replace(  # without its own hooks, tests, copy guard and second drafts
    load_job("code-improve"),
    checker=None,
    evaluator=None,
    extract="code",
    retry_copy=False,
    redraft=0,
    failing_prompt=None,
)
CHECKED = dataclasses.replace(BASE, checker=must_mention_total, score_threshold=None)


def critic(done: bool, action: str = "add a docstring", score: int = 5) -> str:
    return orjson.dumps(
        {"speed": "ok", "readability": "ok", "actions": [action], "score": score, "done": done}
    ).decode()


async def loop(
    job: Job, script: Sequence[str], record: Record = RECORD, **kw: Any
) -> tuple[Outcome, ScriptedClient]:
    client = ScriptedClient(script)
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(3, **kw))
    assert client.script == []
    return outcome, client


@pytest.mark.anyio
async def test_check_vetoes_done_and_reaches_refine_prompt() -> None:
    """A failing check overrides the critic's done; its finding is in the refine prompt."""
    outcome, client = await loop(
        CHECKED,
        [
            "x = 0",  # fails the check
            critic(done=True),  # the critic would stop here
            "total = 0",  # passes
            critic(done=True),
        ],
    )
    roles = [s.role for s in outcome.steps]
    assert roles == ["generate", "feedback", "refine", "feedback"]
    assert outcome.stop_reason == "done"
    assert outcome.steps[0].checks == ["Name the accumulator `total` (line 2)."]
    assert outcome.steps[2].checks == []
    refine_prompt = client.calls[2][0][-1]["content"]
    assert "Name the accumulator `total` (line 2)." in refine_prompt
    assert "add a docstring" in refine_prompt
    # check findings come after the critic's notes, nearest the instruction
    assert refine_prompt.index("Name the accumulator") > refine_prompt.index("add a docstring")


@pytest.mark.anyio
async def test_findings_recorded_with_their_source() -> None:
    """The feedback step's trace lists check findings and critic actions by source."""
    outcome, _ = await loop(
        CHECKED, ["x = 0", critic(done=False, action="use sum()"), "total = 0", critic(done=True)]
    )
    fb = outcome.steps[1].to_dict()
    assert fb["findings"] == [
        {"source": "check", "text": "Name the accumulator `total` (line 2)."},
        {"source": "critic", "text": "use sum()"},
    ]


@pytest.mark.anyio
async def test_checks_can_be_turned_off() -> None:
    """With checks off (--no-checks) the critic's done stops the loop as in the paper."""
    outcome, _ = await loop(CHECKED, ["x = 0", critic(done=True)], checks=False)
    assert outcome.stop_reason == "done"
    assert outcome.steps[0].checks is None


@pytest.mark.anyio
async def test_failing_check_keeps_refining_until_max_iters() -> None:
    """While the check keeps failing, the loop runs to --max-iters despite done."""
    script = ["a"] + [s for i in range(1, 4) for s in (critic(done=True), f"b{i}")]
    outcome, _ = await loop(CHECKED, [*script, critic(done=True)])
    assert outcome.stop_reason == "max_iters"
    assert outcome.iterations == 3


@pytest.mark.anyio
async def test_copy_guard_retries_once_at_higher_temperature() -> None:
    """A refinement identical to its input is retried once at copy_temperature, and traced."""
    job = dataclasses.replace(BASE, retry_copy=True, copy_temperature=1.1, score_threshold=None)
    outcome, client = await loop(
        job,
        [
            "v0",
            critic(done=False),
            "v0",  # a copy: retried
            "v1",
            critic(done=True),
        ],
    )
    assert [c[1] for c in client.calls] == [0.7, 0.7, 0.7, 1.1, 0.7]
    copy = outcome.steps[2]
    assert copy.error is not None and copy.error["type"] == "copy"
    assert outcome.output == "v1" and outcome.stop_reason == "done"


@pytest.mark.anyio
async def test_copy_retry_cut_off_is_asked_again_as_it_was() -> None:
    """A copy's retry cut off at max_tokens is asked once more at the copy temperature, its
    own prompt and a frequency penalty: the retry of a cut is the call that was cut."""
    job = dataclasses.replace(BASE, retry_copy=True, copy_temperature=1.1, score_threshold=None)
    cut = Completion("```python\nv1", 100, 20, 0.5, 1, finish_reason="length", model="x")
    outcome, client = await loop(
        job, ["v0", critic(done=False), "v0", cut, "v1", critic(done=True)]
    )
    assert [c[1] for c in client.calls] == [0.7, 0.7, 0.7, 1.1, 1.1, 0.7]
    assert client.penalties == [None, None, None, None, RETRY_FREQUENCY_PENALTY, None]
    assert client.calls[4][0] == client.calls[3][0]
    assert [(s.error or {}).get("type") for s in outcome.steps[2:5]] == ["copy", "cut_off", None]
    assert outcome.output == "v1" and outcome.iterations == 1


@pytest.mark.anyio
async def test_copy_guard_stops_when_retry_copies_too() -> None:
    """If the retry copies again the loop stops with no_change; both attempts are traced."""
    job = dataclasses.replace(BASE, retry_copy=True, score_threshold=None)
    outcome, _ = await loop(job, ["v0", critic(done=False), "v0", " v0 "])
    assert outcome.stop_reason == "no_change"
    assert [s.role for s in outcome.steps] == ["generate", "feedback", "refine", "refine"]


@pytest.mark.anyio
async def test_without_copy_guard_a_copy_stops_at_once() -> None:
    """Without retry_copy an identical refinement ends the loop with no_change."""
    outcome, _ = await loop(
        dataclasses.replace(BASE, score_threshold=None), ["v0", critic(done=False), "v0"]
    )
    assert outcome.stop_reason == "no_change"
    assert len(outcome.steps) == 3


@pytest.mark.anyio
async def test_resumed_copy_retry_keeps_its_temperature() -> None:
    """Resuming right after a copy step retries it at copy_temperature, not the base one."""
    job = dataclasses.replace(BASE, retry_copy=True, copy_temperature=1.3, score_threshold=None)
    first, _ = await loop(job, ["v0", critic(done=False), "v0", "v1", critic(done=True)])
    client = ScriptedClient(["v1", critic(done=True)])
    resumed = await refine_record(
        RECORD, job, client, RecordingSink(), Policy(3), prior=first.steps[:3]
    )
    assert [c[1] for c in client.calls] == [1.3, 0.7]
    assert resumed.output_line() == first.output_line()


@pytest.mark.anyio
async def test_unscored_job_keeps_latest_answer_that_passes_checks() -> None:
    """Without scores the output is the latest answer whose checks pass, not a failing last."""
    job = dataclasses.replace(CHECKED, score_field=None)
    client = ScriptedClient(
        [
            "x = 0",
            critic(done=False),
            "total = 0",
            critic(done=False),
            "y = 1",  # the last answer breaks the check again
        ]
    )
    outcome = await refine_record(RECORD, job, client, RecordingSink(), Policy(2))
    assert outcome.stop_reason == "max_iters"
    assert outcome.output == "total = 0"
    assert outcome.chosen_iteration == 1


def test_list_field_rendered_with_its_join() -> None:
    """A list-of-strings field is joined with the field's `join` in prompts."""
    from pipeline.jobs import InputField
    from pipeline.loop import build_messages

    job = dataclasses.replace(BASE, inputs=(InputField("task", "any", join="\n"),))
    record = Record("r", 1, {"task": ["User: hi", "System: hello"]})
    prompt = build_messages(job, record, "generate", 0, [])[-1]["content"]
    assert "User: hi\nSystem: hello" in prompt


@pytest.mark.parametrize(
    ("parsed", "expected"),
    [
        ({"a": 2, "b": 3}, 5.0),
        ({"a": 2.5, "b": 1}, 3.5),
        ({"a": 2}, None),
        ({"a": 2, "b": "x"}, None),
        ({"a": True, "b": 1}, None),
    ],
)
def test_summed_score(parsed: dict[str, Any], expected: float | None) -> None:
    """The score is the sum of the rating fields, or None when one is missing or not a number."""
    from pipeline.loop import summed_score

    assert summed_score(parsed, ("a", "b")) == expected


@pytest.mark.anyio
async def test_score_from_overrides_critic_arithmetic() -> None:
    """With score_from, a critic claiming 30 for ratings summing to 20 gets 20."""
    job = load_job("dialogue")
    ratings = {f: 2 for f in job.score_from}
    answer = orjson.dumps({**ratings, "score": 30, "actions": ["be specific"], "done": False})
    client = ScriptedClient(["Hello there!", answer.decode(), "Hi!", answer.decode()])
    outcome = await refine_record(
        Record("d", 1, {"context": "User: hi"}), job, client, RecordingSink(), Policy(1)
    )
    assert outcome.steps[1].parsed is not None
    assert outcome.steps[1].parsed["score"] == 20.0
    assert outcome.score == 20.0


@pytest.mark.anyio
async def test_copy_step_is_not_an_iteration_in_outputs() -> None:
    """Per-iteration scores and metrics skip the retried copy, so index t is iteration t."""
    job = dataclasses.replace(
        BASE,
        retry_copy=True,
        score_threshold=None,
        evaluator=lambda fields, output: {"length": len(output)},
    )
    outcome, _ = await loop(
        job, ["v0", critic(done=False, score=3), "v0", "v111", critic(done=True, score=8)]
    )
    line = outcome.output_line()
    assert line["scores"] == [3.0, 8.0]
    assert line["metrics_by_iteration"] == [{"length": 2}, {"length": 4}]


# -- answers that carry their own tests (code-improve) ------------------------------------------

REDRAFTING = load_job("code-improve")  # with its hooks: the answer's tests run in the sandbox
CODE_IMPROVE = dataclasses.replace(REDRAFTING, redraft=0)  # one draft per refinement
# redrafting from the same messages, at the job's temperature
SAME_MESSAGES = dataclasses.replace(REDRAFTING, failing_prompt=None, redraft_temperature=None)


def answer(code: str, tests: str) -> str:
    """A model answer laid out as code-improve asks: code block, then tests block."""
    return f"Here it is.\n```python\n{code}\n```\nTests:\n```python\n{tests}\n```\nDone."


ADD = "def add(a, b):\n    return a + b"
SUB = "def add(a, b):\n    return a - b"


@pytest.mark.anyio
async def test_refinement_that_breaks_passing_tests_is_never_chosen() -> None:
    """A refinement failing a test the draft passed gets it back, is told so, and is not chosen,
    however well the critic scores it."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    outcome, client = await loop(
        job,
        [
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=False, score=4),
            answer(SUB, "assert add(2, 2) == 0"),  # breaks the draft's test, drops it
            critic(done=True, score=9),
            answer(SUB, "assert add(3, 3) == 0"),
            critic(done=True, score=9),
            answer(SUB, "assert add(5, 5) == 0"),
            critic(done=True, score=10),
        ],
    )
    refined = outcome.steps[2]
    assert refined.output is not None and "assert add(1, 2) == 3" in refined.output  # carried
    assert refined.metrics is not None and refined.metrics["tests_failed"] == [
        "assert add(1, 2) == 3"
    ]
    assert (
        refined.checks
        and "`assert add(1, 2) == 3`: AssertionError (add(1, 2) is -1)" in refined.checks[0]
    )
    assert "assert add(1, 2) == 3" in client.calls[4][0][-1]["content"]  # the next refine sees it
    assert outcome.stop_reason == "max_iters"
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"], line["tests"]) == (
        0,
        ADD,
        "assert add(1, 2) == 3",
    )
    assert [m["tests_passed"] for m in line["metrics_by_iteration"]] == [1, 1, 2, 3]
    assert [m["tests_total"] for m in line["metrics_by_iteration"]] == [1, 2, 3, 4]


@pytest.mark.anyio
async def test_refinement_cut_off_in_its_tests_keeps_the_carried_ones_and_is_told() -> None:
    """A refinement cut off at max_tokens while writing a test, twice (asked once more): the
    half-written test is dropped, the tests an earlier answer passed still run, and the cut
    is a finding."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    text = f"```python\n{ADD}\n```\nTests:\n```python\nassert add(2, 2) == 4\nassert add(3, "
    cut = Completion(text, 100, 1024, 0.5, 1, finish_reason="length", model="fake-model")
    outcome, _ = await loop(
        job,
        [
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=False),
            cut,
            cut,  # asked once more, cut off again
            critic(done=True),  # vetoed: the cut is a finding
            answer(ADD, "assert add(0, 0) == 0"),
            critic(done=True),
        ],
    )
    assert [(s.error or {}).get("type") for s in outcome.steps[2:4]] == ["cut_off", "length"]
    refined = outcome.steps[3]
    assert refined.output is not None and "assert add(3," not in refined.output
    assert refined.metrics is not None
    assert (refined.metrics["tests_passed"], refined.metrics["tests_total"]) == (2, 2)
    assert refined.checks == [CUT_OFF]
    assert outcome.stop_reason == "done" and len(outcome.steps) == 7


@pytest.mark.anyio
async def test_a_right_answer_cut_off_in_its_tests_stays_a_candidate() -> None:
    """A first answer cut off at max_tokens while writing its third test is asked again;
    the answer asked again is wrong, passes its own test and is called done. The cut-off
    answer's code is whole and passes the two tests it finished: judged on the pooled
    tests with the rest, it is the output (``chosen_step`` says which step it is)."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    text = (
        f"```python\n{ADD}\n```\nTests:\n```python\nassert add(2, 2) == 4\n"
        "assert add(1, 1) == 2\nassert add(3, "
    )
    cut = Completion(text, 100, 1024, 0.5, 1, finish_reason="length", model="fake-model")
    outcome, _ = await loop(job, [cut, answer(SUB, "assert add(2, 2) == 0"), critic(done=True)])
    assert [(s.error or {}).get("type") for s in outcome.steps] == ["cut_off", None, None]
    pool = (outcome.steps[1].metrics or {})["tests_pooled"]
    assert (pool["total"], pool["passed"]) == (3, [2, 1])
    line = outcome.output_line()
    assert (line["output"], line["chosen_step"], line["chosen_iteration"]) == (ADD, 0, 0)
    assert line["tests"] == "assert add(2, 2) == 4\nassert add(1, 1) == 2"
    assert line["scores"] == [5.0] and line["score"] is None  # the critic saw the other


@pytest.mark.anyio
async def test_a_cut_off_answer_tied_on_the_pooled_tests_gives_way_to_its_retry() -> None:
    """A cut-off answer and the answer asked in its place pass as many of the pooled tests
    (both fail the cut-off one's wrong test): the tie goes to the answer asked again,
    though the cut-off one is earlier."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    text = (
        f"```python\n{ADD}\n```\nTests:\n```python\nassert add(2, 2) == 4\n"
        "assert add(1, 1) == 3\nassert add(3, "
    )
    cut = Completion(text, 100, 1024, 0.5, 1, finish_reason="length", model="fake-model")
    retry = answer(ADD, "assert add(0, 0) == 0")
    outcome, _ = await loop(job, [cut, retry, critic(done=True)])
    pool = (outcome.steps[1].metrics or {})["tests_pooled"]
    assert (pool["total"], pool["passed"]) == (3, [2, 2])
    line = outcome.output_line()
    assert "chosen_step" not in line and line["chosen_iteration"] == 0
    assert line["tests"] == "assert add(0, 0) == 0"


@pytest.mark.anyio
async def test_a_cut_off_answer_the_others_agree_with_most_wins_the_tie() -> None:
    """No answer passes every pooled test and all pass as many: the cut-off attempt's code
    (right) agrees in part with the answer asked in its place (wrong when ``a`` is 7) and
    with the refinement (wrong when ``a`` is 9), each of which agrees with it more than
    with the other. It once gave way to its retry before any tie-break; now its agreement
    counts as any answer's, and it is the output (``chosen_step`` says so)."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    tests = "assert add(8, 1) == 9\nassert add(10, 2) == 12\nassert add(1, 1) == 3"
    cut = Completion(
        f"```python\n{ADD}\n```\nTests:\n```python\n{tests}\nassert add(3, ",
        100,
        1024,
        0.5,
        1,
        finish_reason="length",
        model="fake-model",
    )
    at_seven = "def add(a, b):\n    return 0 if a == 7 else a + b"
    at_nine = "def add(a, b):\n    return -1 if a == 9 else a + b"
    script = [cut, answer(at_seven, tests), critic(done=False), answer(at_nine, tests)]
    client = ScriptedClient([*script, critic(done=False)])
    outcome = await refine_record(RECORD, job, client, RecordingSink(), Policy(1))
    pool = (outcome.steps[3].metrics or {})["tests_pooled"]
    assert (pool["total"], pool["passed"]) == (3, [2, 2, 2])
    assert pool["agreement"][0] > max(pool["agreement"][1:])
    line = outcome.output_line()
    assert (line["output"], line["chosen_step"], line["chosen_iteration"]) == (ADD, 0, 0)


def test_a_cut_off_answer_of_a_text_job_is_never_a_candidate() -> None:
    """Only an answer whose tests ran is a candidate when cut off; prose stopped
    mid-sentence is not, nor is a cut-off feedback."""
    from pipeline.answers import FAILED_TESTS
    from pipeline.calls import Step, is_draft

    cut = {"type": "cut_off", "message": "asked once more"}
    ran = {FAILED_TESTS: [], "tests_total": 1}

    def step(role: Any, **kw: Any) -> Step:
        return Step(role, 0, [], "x", None, {}, 0.1, 1, error=cut, **kw)

    assert is_draft(step("generate", output="x", metrics=ran))
    assert not is_draft(step("generate", output="x"))  # a text job's answer
    assert not is_draft(step("feedback", metrics=ran))


@pytest.mark.anyio
async def test_failing_own_tests_veto_done_and_a_fix_is_chosen() -> None:
    """A draft failing its own test is refined despite the critic's done; the fix is the output."""
    outcome, client = await loop(
        CODE_IMPROVE,
        [
            answer(SUB, "assert add(1, 2) == 3"),
            critic(done=True, score=10),
            answer(ADD, "assert add(1, 2) == 3\nassert add(0, 0) == 0"),
            critic(done=True, score=8),
        ],
    )
    assert outcome.steps[0].checks and "add(1, 2) is -1" in outcome.steps[0].checks[0]
    assert "add(1, 2) is -1" in client.calls[2][0][-1]["content"]
    line = outcome.output_line()
    assert (outcome.stop_reason, line["chosen_iteration"], line["output"]) == ("done", 1, ADD)
    assert line["tests"] == "assert add(1, 2) == 3\nassert add(0, 0) == 0"
    assert line["metrics"]["tests_passed"] == line["metrics"]["tests_total"] == 2


@pytest.mark.anyio
async def test_answer_without_tests_is_asked_for_them() -> None:
    """An answer carrying no tests cannot be done: the refine step is asked for tests."""
    outcome, client = await loop(
        CODE_IMPROVE,
        [
            f"```python\n{ADD}\n```",
            critic(done=True, score=10),
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=True, score=10),
        ],
    )
    assert outcome.steps[0].checks is not None and outcome.steps[0].checks[0].startswith(
        "Add tests"
    )
    assert "Add tests" in client.calls[2][0][-1]["content"]
    assert outcome.output_line()["tests"] == "assert add(1, 2) == 3"


def test_a_test_that_failed_before_does_not_bar_a_later_answer() -> None:
    """Only tests an earlier answer passed protect it: failing one already is no regression."""
    from pipeline.answers import join
    from pipeline.loop import choose

    def step(role: str, t: int, tests: str, failed: list[str]) -> Step:
        output = join(ADD, tests)
        metrics = {"tests_failed": failed}
        return Step(
            role, t, [], output, None, {}, 0.0, 1, output=output, metrics=metrics, checks=[]
        )  # type: ignore[arg-type]

    job = dataclasses.replace(CODE_IMPROVE, score_field=None, score_threshold=None)
    both = "assert add(1, 2) == 3\nassert add(0, 1) == 5"
    steps = [
        step("generate", 0, both, ["assert add(0, 1) == 5"]),
        step("refine", 1, both, ["assert add(0, 1) == 5"]),  # still fails the wrong test
        step("refine", 2, both, ["assert add(1, 2) == 3", "assert add(0, 1) == 5"]),
    ]
    assert choose(steps[:2], job)[0] == 1
    assert choose(steps, job)[0] == 1  # iteration 2 broke a passing test


@pytest.mark.anyio
async def test_text_answers_lose_their_preamble_and_notes_are_findings() -> None:
    """A text job's output is the artifact alone; a note left in it is a finding to remove."""
    job = load_job("commongen")
    record = Record("c", 1, {"concepts": ["dog", "run"]})
    client = ScriptedClient(
        [
            "Here is the sentence:\nA dog runs. To address the feedback, I added the missing "
            "words.",
            orjson.dumps(
                {"missing_concepts": [], "commonsense_errors": [], "actions": [], "done": True}
            ).decode(),
            '"A dog runs in the park."',
            orjson.dumps(
                {"missing_concepts": [], "commonsense_errors": [], "actions": [], "done": True}
            ).decode(),
        ]
    )
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(2))
    first = outcome.steps[0]
    assert first.output == "A dog runs. To address the feedback, I added the missing words."
    assert first.checks is not None and first.checks[0].startswith("Remove the note")
    assert (outcome.output, outcome.stop_reason) == ("A dog runs in the park.", "done")
    assert outcome.output_line()["metrics"]["one_sentence"] is True


@pytest.mark.anyio
async def test_same_code_around_failing_tests_is_a_copy() -> None:
    """code-improve: a refinement that keeps the failing code and rewords its tests is
    retried at copy_temperature; one that corrects a wrong test (now passing) is not."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, failing_prompt=None)
    outcome, client = await loop(
        job,
        [
            answer(SUB, "assert add(1, 2) == 3"),
            critic(done=False),
            answer(SUB, "assert add(1, 2) == 3, 'sum'\nassert add(2, 2) == 4"),  # a copy
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=True),
        ],
    )
    assert [c[1] for c in client.calls] == [0.7, 0.7, 0.7, 1.0, 0.7]
    # the retry asks [prompts] refine_copy: the findings, without the code it copied
    retry = client.calls[3][0][-1]["content"]
    assert "- Failing test `assert add(1, 2) == 3`: AssertionError (add(1, 2) is -1)." in retry
    assert "return a - b" not in retry and "return a - b" in client.calls[2][0][-1]["content"]
    copy = outcome.steps[2]
    assert copy.error == {
        "type": "copy",
        "message": "the same code as its input; retried once at temperature 1",
    }
    assert outcome.stop_reason == "done" and outcome.output == ADD

    corrected, client = await loop(
        job,
        [
            answer(ADD, "assert add(1, 2) == 4"),  # the test is wrong, not the code
            critic(done=False),
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=True),
        ],
    )
    assert [c[1] for c in client.calls] == [0.7, 0.7, 0.7, 0.7]
    assert not any(s.error for s in corrected.steps)
    assert corrected.stop_reason == "done" and corrected.steps[2].checks == []


@pytest.mark.anyio
async def test_when_no_answer_passes_its_checks_the_one_passing_most_tests_is_chosen() -> None:
    """No answer passes every check: the one passing the most of its own tests wins over a
    better-scored answer without tests (its critic's 9 is no evidence against tests)."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    outcome, _ = await loop(
        job,
        [
            f"```python\n{SUB}\n```",  # no tests
            critic(done=False, score=9),
            answer(ADD, "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(1, 1) == 3"),
            critic(done=False, score=4),
            answer(SUB, "assert add(0, 0) == 0"),  # breaks the tests that passed: never chosen
            critic(done=False, score=10),
            answer(SUB, "assert add(0, 0) == 0"),  # the same: the loop stops
        ],
    )
    assert all(s.checks for s in outcome.steps if s.role != "feedback")
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"]) == (1, ADD)
    assert (line["metrics"]["tests_passed"], line["metrics"]["tests_total"]) == (2, 3)


@pytest.mark.anyio
async def test_copy_retry_without_check_findings_shows_the_critics_actions() -> None:
    """{{findings}} falls back to the critic's actions when the checks found nothing: a
    verbatim copy of passing code is retried with what the critic asked for."""
    outcome, client = await loop(
        dataclasses.replace(CODE_IMPROVE, score_threshold=None),
        [
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=False, action="name the parameters x and y"),
            answer(ADD, "assert add(1, 2) == 3"),  # identical: a copy
            answer(ADD.replace("a, b", "x, y").replace("a + b", "x + y"), "assert add(1, 2) == 3"),
            critic(done=True),
        ],
    )
    assert outcome.steps[2].error is not None
    assert outcome.steps[2].error["message"].startswith("identical to its input")
    retry = client.calls[3][0][-1]["content"]
    assert "- name the parameters x and y" in retry and "return a + b" not in retry


LESS_THAN = "def add(a, b):\n    return a + b if a < b else 0"


def counts_of(value: Mapping[str, Any]) -> dict[str, Any]:
    """The pooled tests' total and passes (without the behaviour digests)."""
    return {"total": value["total"], "passed": value["passed"]}


def counts(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """An answer's tests_pooled metric: total and passes."""
    assert metrics is not None
    return counts_of(metrics["tests_pooled"])


@pytest.mark.anyio
async def test_answers_passing_fewer_of_the_pooled_tests_are_not_chosen() -> None:
    """Judged on every test any answer wrote, a draft that passed its one weak test loses to
    a refinement passing more of them, though the refinement fails a wrong test of its own
    and the critic scores the draft higher."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    tests = "assert add(2, 1) == 3\nassert add(3, 1) == 4\nassert add(1, 1) == 3"
    outcome, _ = await loop(
        job,
        [
            answer(LESS_THAN, "assert add(1, 2) == 3"),
            critic(done=False, score=9),
            answer(ADD, tests),  # the third test is wrong
            critic(done=False, score=4),
            answer(ADD, tests),  # identical: the loop stops
        ],
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.checks == [] and refined.checks
    # the pool: add(1,2)==3, add(2,1)==3, add(3,1)==4, add(1,1)==3
    assert draft.metrics is not None and refined.metrics is not None
    assert counts(draft.metrics) == {"total": 1, "passed": [1]}
    assert counts(refined.metrics) == {"total": 4, "passed": [1, 3]}
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"]) == (1, ADD)
    last = outcome.steps[-1]  # the identical answer, judged with the others
    assert last.metrics is not None and last.metrics["tests_pooled"]["passed"] == [1, 3, 3]


@pytest.mark.anyio
async def test_when_no_answer_passes_every_pooled_test_a_tie_keeps_the_earlier_answer() -> None:
    """The draft (right code, one wrong test) and a refinement bent around its own tests
    pass as many of the pooled tests: the draft stays the output, however much better the
    critic scores the refinement and the more of its own tests it passes."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    outcome, _ = await loop(
        job,
        [
            answer(ADD, "assert add(1, 2) == 3\nassert add(2, 2) == 5"),
            critic(done=False, score=3),
            answer(LESS_THAN, "assert add(2, 2) == 0\nassert add(5, 1) == 6"),
            critic(done=False, score=9),
            answer(LESS_THAN, "assert add(2, 2) == 0\nassert add(5, 1) == 6"),  # stops the loop
        ],
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.metrics is not None and refined.metrics is not None
    assert (draft.metrics["tests_passed"], refined.metrics["tests_passed"]) == (1, 2)
    # the pool: add(1,2)==3, add(2,2)==5, add(2,2)==0, add(5,1)==6
    assert counts(refined.metrics) == {"total": 4, "passed": [2, 2]}
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"]) == (0, ADD)


@pytest.mark.anyio
async def test_a_tie_on_the_pooled_tests_goes_to_the_behaviour_most_drafts_share() -> None:
    """Wrong code ties on the pooled tests with two refinements written apart that compute
    the same sums (none passes every test: each answer wrote one the others fail): the
    earlier of those two is the output, however the critic scores them, the draft being
    alone in what it returns. A copy is one program, not a second vote: the last answer
    hands the third back, and in the tie test above a copy does not outvote the draft."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    swapped = "def add(a, b):\n    return b + a"
    swapped_tests = "assert add(1, 2) == 3\nassert add(3, 3) == 0"  # the second is wrong
    outcome, _ = await loop(
        job,
        [
            answer(LESS_THAN, "assert add(1, 2) == 3\nassert add(2, 2) == 5"),
            critic(done=False, score=9),
            answer(ADD, "assert add(1, 2) == 3\nassert add(5, 1) == 6"),
            critic(done=False, score=3),
            answer(swapped, swapped_tests),
            critic(done=False, score=3),
            answer(swapped, swapped_tests),  # identical: the loop stops
        ],
    )
    answers = [outcome.steps[i] for i in (0, 2, 4, 6)]
    assert [a.output for a in answers].count(answers[2].output) == 2
    # the pool: add(1,2)==3, add(2,2)==5, add(5,1)==6, add(3,3)==0; none passes it all
    assert counts(answers[-1].metrics) == {"total": 4, "passed": [2, 2, 2, 2]}
    behaviour = (answers[-1].metrics or {})["tests_pooled"]["behaviour"]
    assert behaviour[1] == behaviour[2] == behaviour[3] != behaviour[0]
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"]) == (1, ADD)


@pytest.mark.anyio
async def test_a_refinement_that_drops_the_test_it_fails_does_not_win_a_tie() -> None:
    """A refinement that passes its own checks only because it left out the test it fails
    ties with the draft on the pooled tests: the draft stays the output."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    outcome, _ = await loop(
        job,
        [
            answer(ADD, "assert add(1, 2) == 3\nassert add(2, 2) == 5"),
            critic(done=False, score=3),
            answer(LESS_THAN, "assert add(1, 2) == 3"),  # add(2, 2) == 5 left out
            critic(done=False, score=9),
            answer(LESS_THAN, "assert add(1, 2) == 3"),  # stops the loop
        ],
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.checks and refined.checks == []
    assert refined.metrics is not None
    assert counts(refined.metrics) == {"total": 2, "passed": [1, 1]}
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"]) == (0, ADD)


CHUNK = (
    "def chunk(items, size):\n"
    "    if size < 1:\n"
    "        raise ValueError('size must be at least 1')\n"
    "    return [items[i:i + size] for i in range(0, len(items), size)]"
)


@pytest.mark.anyio
async def test_a_raise_check_written_in_the_code_block_protects_the_draft() -> None:
    """`try: chunk([1], 0)` / `except ValueError: pass` after the code is a test: a
    refinement raising another error breaks it, and the critic's better score for that
    refinement does not make it the output."""
    raise_check = "try:\n    chunk([1], 0)\nexcept ValueError:\n    pass"
    asserted = CHUNK.replace("if size < 1:\n        raise ValueError(", "assert size >= 1, (")
    tests = "assert chunk([1, 2, 3], 2) == [[1, 2], [3]]"
    outcome, _ = await loop(
        dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False),
        [
            answer(f"{CHUNK}\n\n{raise_check}", tests),
            critic(done=False, score=6, action="use an assert"),
            answer(asserted, tests),
            critic(done=True, score=10),  # vetoed: the raise check fails
            answer(asserted, tests),  # identical: the loop stops
        ],
        Record("chunk", 1, {"id": "chunk", "task": "Chunk a list; raise ValueError for size < 1."}),
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.metrics is not None and draft.metrics["tests_total"] == 2
    assert refined.checks and "chunk([1], 0)" in refined.checks[0]
    assert "AssertionError" in refined.checks[0]
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"]) == (0, CHUNK)
    assert raise_check in line["tests"]


@pytest.mark.anyio
async def test_answers_passing_every_pooled_test_are_chosen_by_the_critic() -> None:
    """When more than one answer passes every test written and they behave alike, the
    choice is the usual one: the best-scored (a refinement for readability is kept)."""
    renamed = ADD.replace("a, b", "x, y").replace("a + b", "x + y")
    outcome, _ = await loop(
        dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False),
        [
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=False, score=5, action="name the parameters x and y"),
            answer(renamed, "assert add(2, 2) == 4"),
            critic(done=True, score=9),
        ],
    )
    assert outcome.steps[2].metrics is not None
    assert counts(outcome.steps[2].metrics) == {"total": 2, "passed": [2, 2]}
    first, second = outcome.steps[2].metrics["tests_pooled"]["behaviour"]
    assert first is not None and first == second  # the same results on every probe
    assert (outcome.output_line()["chosen_iteration"], outcome.output) == (1, renamed)


async def refined_once(
    draft: str, refinement: str, tests: str, action: str, record: Record = RECORD
) -> Outcome:
    """One refinement of ``draft`` into ``refinement``, both carrying ``tests``, the critic
    asking for ``action`` (score 5) and then calling the refinement done (score 9)."""
    outcome, _ = await loop(
        dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False),
        [
            answer(draft, tests),
            critic(done=False, score=5, action=action),
            answer(refinement, tests),
            critic(done=True, score=9),
        ],
        record,
    )
    return outcome


STRICT = (  # no leading zeros, as the request asks
    "def valid(s):\n    parts = s.split('.')\n"
    "    return len(parts) == 4 and all(\n"
    "        p.isdigit() and (p == '0' or not p.startswith('0')) for p in parts\n    )"
)
LOOSE = (  # any digits
    "def valid(s):\n    parts = s.split('.')\n"
    "    return len(parts) == 4 and all(p.isdigit() for p in parts)"
)


@pytest.mark.anyio
async def test_a_refinement_that_changes_what_no_test_asserts_is_not_chosen() -> None:
    """Both answers pass every test written, and the critic scores the refinement higher,
    but on a call near one the tests make (`valid('00.0.0.0')`) the refinement gives
    another result: the draft stays the output."""
    tests = "assert valid('0.0.0.0')\nassert not valid('1.2.3')"
    outcome = await refined_once(STRICT, LOOSE, tests, "drop the leading-zero rule: simpler")
    refined = outcome.steps[2]
    assert counts(refined.metrics) == {"total": 2, "passed": [2, 2]}
    assert refined.metrics is not None
    first, second = refined.metrics["tests_pooled"]["behaviour"]
    assert first is not None and second is not None and first != second
    assert (outcome.output_line()["chosen_iteration"], outcome.output) == (0, STRICT)


def test_pooled_counts_code_that_cannot_run_as_passing_nothing() -> None:
    """pooled: each program's code on every program's tests; code that does not parse or
    fails before any test runs passes none."""
    from pipeline.answers import join
    from pipeline.loop import pooled

    programs = [
        join(ADD, "assert add(1, 2) == 3"),
        join("def add(a, b):\n    return (a + b", "assert add(0, 0) == 0"),  # does not parse
        join("raise SystemExit(3)", "assert add(1, 2) == 3"),  # a repeated test counts once
        join(SUB, ""),  # no tests of its own: judged on the others'
    ]
    assert counts_of(pooled(programs)) == {"total": 2, "passed": [2, 0, 0, 1]}
    assert counts_of(pooled([join(ADD, "")])) == {"total": 0, "passed": [0]}


@pytest.mark.anyio
@pytest.mark.parametrize(("names_the_error", "chosen"), [(True, 1), (False, 0)])
async def test_among_tied_answers_one_raising_the_error_the_request_names_wins(
    names_the_error: bool, chosen: int
) -> None:
    """Draft and refinement fail the same wrong test, so the tests cannot tell them apart;
    the draft raises KeyError on letters that are no numerals where the request names
    ValueError, and the refinement checks them: it is chosen, though the critic scores the
    draft higher. A request that names no error leaves the tie to the earliest."""
    from tests.test_jobs_builtin import ROMAN, ROMAN_CHECKED, ROMAN_TASK

    task = ROMAN_TASK if names_the_error else "Write roman_to_int(s)."
    tests = "assert roman_to_int('IX') == 9\nassert roman_to_int('XI') == 12"  # the 2nd is wrong
    client = ScriptedClient(
        [
            answer(ROMAN, tests),
            critic(done=False, score=8),
            answer(ROMAN_CHECKED, tests),
            critic(done=True, score=3),
        ]
    )
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    record = Record("roman", 1, {"id": "roman", "task": task})
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(1))
    pool = (outcome.steps[2].metrics or {})["tests_pooled"]
    assert (pool["total"], pool["passed"]) == (2, [1, 1])
    assert (pool["stray"][0] > 0, pool["stray"][1]) == (names_the_error, 0)
    draft_found = outcome.steps[0].checks or []
    assert any("raises KeyError" in f for f in draft_found) is names_the_error
    assert outcome.output_line()["chosen_iteration"] == chosen


def test_pooled_counts_foreign_characters_as_stray_but_not_as_behaviour() -> None:
    """A character no test's string holds (`IX#`) counts a KeyError as a stray effect where
    the request names ValueError; what code gives on such input does not enter its
    behaviour digest: code that drops such characters and code that refuses them with the
    error the request names behave alike on the calls near the tests."""
    from pipeline.answers import join, terms
    from pipeline.loop import pooled
    from tests.test_jobs_builtin import ROMAN_TASK, UPPER_ROMAN, UPPER_ROMAN_CHECKED

    dropping = UPPER_ROMAN.replace(
        "s = s.upper()", "s = ''.join(c for c in s.upper() if c in 'IVXLCDM')"
    )
    tests = "assert roman_to_int('IX') == 9\nassert roman_to_int('MCMXCIV') == 1994"
    programs = [join(UPPER_ROMAN, tests), join(UPPER_ROMAN_CHECKED, ""), join(dropping, "")]
    pool = pooled(programs, terms({"task": ROMAN_TASK}))
    assert (pool["passed"], pool["stray"]) == ([2, 2, 2], [4, 0, 0])
    assert pool["behaviour"][0] == pool["behaviour"][1] == pool["behaviour"][2]


def test_pooled_agreement_counts_a_copy_once_and_leaves_out_calls_that_raise() -> None:
    """Agreement sums, over the other distinct programs, the share of the calls near the
    tests both returned a value on where the values are equal: a copy of the draft (other
    tests, the same code) is no second program agreeing with it, nor with anyone else;
    code refusing negative numbers (the probes negate the tests' arguments) agrees fully
    with the draft, both returning the same wherever both return; code wrong on 0 agrees
    on the other calls only."""
    from pipeline.answers import join
    from pipeline.loop import pooled

    refusing = "def add(a, b):\n    if min(a, b) < 0:\n        raise ValueError\n    return a + b"
    at_zero = "def add(a, b):\n    return -1 if a == 0 else a + b"
    programs = [
        join(ADD, "assert add(2, 3) == 5"),
        join(ADD, "assert add(4, 1) == 5"),  # a copy of the draft's code
        join(refusing, ""),
    ]
    assert pooled(programs)["agreement"] == [1.0, 1.0, 1.0]
    agreement = pooled([*programs, join(at_zero, "")])["agreement"]
    assert 1 < agreement[0] == agreement[1] < 2 and agreement[3] < agreement[0]


def test_pooled_agreement_counts_an_error_the_request_names_as_an_answer() -> None:
    """Where the request names ValueError, raising it on negative numbers is an answer to
    those calls, and returning a sum there is not the same answer: code refusing them and
    code adding them agree on the other calls only. Which of the named errors does not
    matter (a subclass of the code's own agrees with ValueError itself)."""
    from pipeline.answers import join, terms
    from pipeline.loop import pooled

    refusing = "def add(a, b):\n    if min(a, b) < 0:\n        raise ValueError\n    return a + b"
    own = "class SignError(ValueError):\n    pass\n\n" + refusing.replace(
        "raise ValueError", "raise SignError"
    )
    programs = [join(ADD, "assert add(2, 3) == 5"), join(refusing, ""), join(own, "")]
    asked = terms({"task": "Add two numbers; raise ValueError for a negative one."})
    agreement = pooled(programs, asked)["agreement"]
    assert agreement[1] == agreement[2] and agreement[1] - 1 == pytest.approx(agreement[0] / 2)
    assert agreement[0] < 2 * 0.9  # ADD agrees with neither on the negative calls
    assert pooled(programs)["agreement"] == [2.0, 2.0, 2.0]  # no error named: left out


TRY_FIVE = "try:\n    roman_to_int(5)\nexcept ValueError:\n    pass"


def test_pooled_counts_no_stray_raise_on_a_call_against_the_declared_signature() -> None:
    """A test of a raise may pass a value of another kind than the request's signature
    declares (`roman_to_int(5)` where it declares `s: str`): whatever error code raises
    there, and on the calls near it, is no error the request left unnamed, so code that
    fails on it with AttributeError is not counted as raising one."""
    from pipeline.answers import join, terms
    from pipeline.loop import pooled
    from tests.test_jobs_builtin import UPPER_ROMAN_CHECKED

    task = "Write roman_to_int(s: str) -> int. It must raise ValueError for a bad numeral."
    typed = UPPER_ROMAN_CHECKED.replace(
        "    s = s.upper()", "    if not isinstance(s, str):\n        raise ValueError(s)\n"
        "    s = s.upper()"
    )  # fmt: skip
    tests = "assert roman_to_int('IX') == 9\n" + TRY_FIVE
    pool = pooled([join(UPPER_ROMAN_CHECKED, tests), join(typed, "")], terms({"task": task}))
    assert pool["raised"] == [0, 0]
    assert pool["stray"] == [0, 0]
    untyped = pooled([join(UPPER_ROMAN_CHECKED, tests)], terms({"task": task.replace(": str", "")}))
    assert untyped["raised"][0] > 0  # without the signature, AttributeError is a stray raise


UPPER_MIDDLE = (  # leaves the list alone; the upper middle value for an even count
    "def median(values):\n    if not values:\n        raise ValueError\n"
    "    s = sorted(values)\n    return s[len(s) // 2]"
)
SORTS_IN_PLACE = (  # the mean of the two middle values, sorting the caller's list
    "def median(values):\n    if not values:\n        raise ValueError\n    values.sort()\n"
    "    n = len(values)\n    if n % 2:\n        return values[n // 2]\n"
    "    return (values[n // 2 - 1] + values[n // 2]) / 2"
)


@pytest.mark.anyio
@pytest.mark.parametrize(("names_the_error", "chosen"), [(True, 0), (False, 1)])
async def test_an_answer_raising_no_error_but_those_named_wins_before_the_tests(
    names_the_error: bool, chosen: int
) -> None:
    """The refinement passes a wrong test the draft fails (`'XM'` is no numeral; the draft
    refuses it with ValueError), and raises KeyError on lower-case numerals, where the
    request names ValueError: the draft is chosen, though it passes fewer of the pooled
    tests and the critic scores the refinement higher. A request naming no error leaves
    it to the tests."""
    from tests.test_jobs_builtin import ROMAN, ROMAN_CHECKED, ROMAN_TASK

    task = ROMAN_TASK if names_the_error else "Write roman_to_int(s)."
    tests = "assert roman_to_int('IX') == 9"
    client = ScriptedClient(
        [
            answer(ROMAN_CHECKED, tests),
            critic(done=False, score=4),
            answer(
                ROMAN.replace("'X': 10}", "'X': 10, 'M': 1000}"),
                tests + "\nassert roman_to_int('XM') == 990",
            ),
            critic(done=True, score=9),
        ]
    )
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False, redraft=0)
    record = Record("roman", 1, {"id": "roman", "task": task})
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(1))
    pool = (outcome.steps[2].metrics or {})["tests_pooled"]
    assert (pool["total"], pool["passed"]) == (2, [1, 2])
    assert (pool["raised"][0], pool["raised"][1] > 0) == (0, names_the_error)
    assert outcome.output_line()["chosen_iteration"] == chosen


@pytest.mark.anyio
async def test_a_changed_argument_the_request_says_nothing_of_is_left_to_the_tests() -> None:
    """The refinement passes a test the draft fails, and sorts the caller's list, of which
    the request says nothing: it is chosen (a count of islands that marks the caller's
    grid is no worse for it in any test), the stray count deciding only among answers
    passing as many tests."""
    tests = "assert median([3, 1, 2]) == 2\nassert median([5]) == 5"
    client = ScriptedClient(
        [
            answer(UPPER_MIDDLE, tests),
            critic(done=False, score=4),
            answer(SORTS_IN_PLACE, tests + "\nassert median([4, 1, 3, 2]) == 2.5"),
            critic(done=True, score=9),
        ]
    )
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False, redraft=0)
    record = Record("median", 1, {"id": "median", "task": "Return the median."})
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(1))
    pool = (outcome.steps[2].metrics or {})["tests_pooled"]
    assert (pool["passed"], pool["raised"], pool["stray"][0]) == ([2, 3], [0, 0], 0)
    assert pool["stray"][1] > 0
    assert outcome.output_line()["chosen_iteration"] == 1


def test_pooled_runs_a_try_of_an_error_the_request_names_as_a_test_of_the_raise() -> None:
    """In the pool as in the check, a try catching the error the request names, asserting
    nothing, fails the code that returns; with no error named it is no test of what the
    request asks, and is left out of the pool."""
    from pipeline.answers import Terms, join
    from pipeline.loop import pooled

    tests = "assert add(1, 2) == 3\ntry:\n    add(1, None)\nexcept TypeError:\n    pass"
    checked = "def add(a, b):\n    if b is None:\n        raise TypeError(b)\n    return a + b"
    lenient = "def add(a, b):\n    return a + (b or 0)"
    programs = [join(checked, tests), join(lenient, "")]
    assert counts_of(pooled(programs, Terms(frozenset({"TypeError"})))) == {
        "total": 2,
        "passed": [2, 1],
    }
    assert counts_of(pooled(programs)) == {"total": 1, "passed": [1, 1]}


SECOND = (
    "def second_largest(nums):\n"
    "    distinct = sorted(set(nums))\n"
    "    return distinct[-2] if len(distinct) > 1 else None"
)
SEEDED = (  # refuses what is not an int, as no request asked, and seeds its maximum with -1
    "def second_largest(nums):\n"
    "    if not all(isinstance(n, int) for n in nums):\n"
    "        raise ValueError(nums)\n"
    "    distinct = set(nums)\n"
    "    if len(distinct) < 2:\n"
    "        return None\n"
    "    distinct.remove(max(distinct))\n"
    "    best = -1\n"
    "    for n in distinct:\n"
    "        best = max(best, n)\n"
    "    return best"
)


@pytest.mark.anyio
async def test_a_test_for_an_error_the_request_does_not_name_does_not_choose() -> None:
    """The draft fails its own test for a ValueError the request does not ask for; the
    refinement passes it and brings a bug no test shows (negative numbers). The test is
    left out, the two then pass every test, and on the calls near them (signs turned) they
    differ: the draft stays the output, however the critic scores them."""
    tests = (
        "assert second_largest([3, 1, 2]) == 2\nassert second_largest([4]) is None\n"
        "try:\n    second_largest([1, 'a'])\n    assert False\nexcept ValueError:\n    pass"
    )
    outcome = await refined_once(
        SECOND,
        SEEDED,
        tests,
        "raise ValueError for items that are no ints",
        Record("s", 1, {"id": "s", "task": "Return the second largest distinct value, or None."}),
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.checks == [] and draft.metrics is not None
    assert draft.metrics["tests_total"] == 2  # the ValueError test is no test of the request
    assert counts(refined.metrics) == {"total": 2, "passed": [2, 2]}
    assert (outcome.output_line()["chosen_iteration"], outcome.output) == (0, SECOND)


@pytest.mark.anyio
async def test_a_refinement_failing_its_checks_is_drafted_once_more_and_either_may_win() -> None:
    """A refinement whose own test fails is drafted again from the same messages at the
    job's temperature; the second draft is the iteration's answer the critic reviews, the
    first stays a candidate and, passing more of the pooled tests, is the output."""
    job = dataclasses.replace(SAME_MESSAGES, score_threshold=None, retry_copy=False, redraft=1)
    client = ScriptedClient(
        [
            answer(SUB, "assert add(1, 2) == 3"),
            critic(done=False, score=3),
            answer(ADD, "assert add(1, 2) == 3\nassert add(2, 2) == 5"),  # one wrong test
            answer(SUB, "assert add(1, 2) == 3\nassert add(0, 0) == 0"),  # fails: no third
            critic(done=False, score=9),
        ]
    )
    sink = RecordingSink()
    outcome = await refine_record(RECORD, job, client, sink, Policy(1))
    assert client.script == []
    first, second = outcome.steps[2], outcome.steps[3]
    assert first.error is not None and first.error["type"] == "redraft" and first.checks
    assert second.error is None and second.checks
    assert client.messages[3] == client.messages[2]  # the same prompt, sampled once more
    assert client.temperatures[2] == client.temperatures[3] == job.temperature
    assert SUB in client.messages[4][-1]["content"]  # the critic reviews the second draft
    assert ADD not in client.messages[4][-1]["content"]
    # every draft is judged on the pooled tests: add(1,2)==3, add(2,2)==5, add(0,0)==0
    assert counts(second.metrics) == {"total": 3, "passed": [1, 2, 1]}
    line = outcome.output_line()
    assert (line["chosen_iteration"], line["output"], line["chosen_step"]) == (1, ADD, 2)
    assert line["metrics"]["tests_passed"] == 1  # the chosen draft's own metrics
    assert [m["tests_passed"] for m in line["metrics_by_iteration"]] == [0, 1]
    assert line["iterations"] == 1 and len(line["scores"]) == 2


@pytest.mark.anyio
async def test_a_redraft_count_bounds_the_drafts_of_a_failing_refinement() -> None:
    """redraft = 2: a refinement drafted again while its checks find problems, at most
    twice more (three drafts, the later two at redraft_temperature); the last is the
    iteration's answer whatever its checks say, the earlier ones stay candidates, and a
    run resumed after the second draft makes the third call, not a fourth."""
    job = dataclasses.replace(REDRAFTING, score_threshold=None, retry_copy=False, redraft=2)
    assert job.redraft_temperature is not None and job.redraft_temperature != job.temperature
    failing = [answer(SUB + f"  # draft {n}", "assert add(1, 2) == 3") for n in range(4)]
    script = [
        answer(SUB, "assert add(1, 2) == 3"),
        critic(done=False, score=3),
        *failing[:3],  # every draft of the refinement fails its test
        critic(done=False, score=4),
    ]
    sink = RecordingSink()
    client = ScriptedClient(script)
    outcome = await refine_record(RECORD, job, client, sink, Policy(1))
    assert client.script == []  # three drafts, then the critic: no fourth draft
    drafts = outcome.steps[2:5]
    assert [d.role for d in drafts] == ["refine"] * 3 and all(d.checks for d in drafts)
    assert [(d.error or {}).get("type") for d in drafts] == ["redraft", "redraft", None]
    assert client.messages[2] == client.messages[3] == client.messages[4]
    assert client.temperatures[2:5] == [job.temperature, *[job.redraft_temperature] * 2]
    assert "draft 2" in client.messages[5][-1]["content"]  # the critic reviews the last
    # A draft that passes its checks ends the drafting: the second one here.
    passing = ScriptedClient(
        [*script[:3], answer(ADD, "assert add(1, 2) == 3"), critic(done=True, score=9)]
    )
    won = await refine_record(RECORD, job, passing, RecordingSink(), Policy(1))
    assert passing.script == [] and won.output == ADD and len(won.steps) == 5
    resumed = ScriptedClient([failing[3], critic(done=False, score=4)])
    again = await refine_record(
        RECORD, job, resumed, RecordingSink(), Policy(1), prior=sink.steps[:4]
    )
    assert resumed.script == [] and resumed.messages[0] == client.messages[4]
    assert [(s.error or {}).get("type") for s in again.steps[2:5]] == ["redraft", "redraft", None]


@pytest.mark.anyio
async def test_failing_code_is_written_afresh_from_the_findings() -> None:
    """code-improve refines code its checks found problems in from refine_failing: the
    request and the findings, without the failing code or the critic's actions; its
    second draft asks the same messages at redraft_temperature, and a run resumed after
    the first draft makes that same call."""
    job = dataclasses.replace(REDRAFTING, score_threshold=None, retry_copy=False)
    assert job.redraft_temperature is not None and job.redraft_temperature != job.temperature
    script = [
        answer(SUB, "assert add(1, 2) == 3"),
        critic(done=False, action="Rename the function.", score=3),
        answer(SUB + "  # still", "assert add(2, 2) == 4"),  # fails its tests: redrafted
        answer(ADD, "assert add(1, 2) == 3"),
        critic(done=True, score=9),
    ]
    sink = RecordingSink()
    client = ScriptedClient(script)
    outcome = await refine_record(RECORD, job, client, sink, Policy(1))
    assert client.script == [] and outcome.output == ADD
    assert outcome.steps[2].error is not None and outcome.steps[2].error["type"] == "redraft"
    prompt = client.messages[2][-1]["content"]
    assert client.messages[3] == client.messages[2]
    assert SUB not in prompt and "Rename the function." not in prompt
    assert RECORD.fields["task"] in prompt
    assert "Failing test `assert add(1, 2) == 3`" in prompt  # the findings on the input
    assert "do not reuse the earlier code" in prompt
    assert client.temperatures[2] == job.temperature
    assert client.temperatures[3] == job.redraft_temperature
    resumed = ScriptedClient([answer(ADD, "assert add(1, 2) == 3"), critic(done=True, score=9)])
    again = await refine_record(
        RECORD, job, resumed, RecordingSink(), Policy(1), prior=sink.steps[:3]
    )
    assert resumed.messages[0] == client.messages[3]
    assert resumed.temperatures[0] == job.redraft_temperature
    assert again.output == ADD


@pytest.mark.anyio
async def test_code_that_passed_its_checks_is_edited() -> None:
    """Where the checks found nothing in the answer being refined, the refine prompt edits
    it with the critic's actions; an edit that breaks it is redrafted from the same
    messages, hotter."""
    job = dataclasses.replace(REDRAFTING, score_threshold=None, retry_copy=False)
    client = ScriptedClient(
        [
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=False, action="Add a docstring.", score=6),
            answer(SUB, "assert add(1, 2) == 3"),  # the edit broke it: redrafted
            answer(ADD + "  # adds", "assert add(1, 2) == 3"),
            critic(done=True, score=9),
        ]
    )
    outcome = await refine_record(RECORD, job, client, RecordingSink(), Policy(1))
    assert client.script == [] and outcome.steps[2].error is not None
    assert outcome.steps[2].error["type"] == "redraft"
    prompt = client.messages[2][-1]["content"]
    assert ADD in prompt and "Add a docstring." in prompt
    assert client.messages[3] == client.messages[2]
    assert client.temperatures[2] == job.temperature
    assert client.temperatures[3] == job.redraft_temperature


@pytest.mark.anyio
async def test_without_a_test_that_runs_a_later_answer_does_not_replace_the_draft() -> None:
    """Where no answer carries a test that runs (here every test passes strings as the
    declared ints), nothing shows a refinement does what the draft did: the critic's
    better score alone does not make it the output."""
    record = Record("i", 1, {"id": "i", "task": "Write add(a: int, b: int) -> int."})
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None)
    script = [
        answer(ADD, "assert add('1', '2') == '12'"),
        critic(done=False, score=3),
        answer(SUB, "assert add('3', '2') == '32'"),
        critic(done=False, score=9),
    ]
    outcome = await refine_record(record, job, ScriptedClient(script), RecordingSink(), Policy(1))
    assert [(s.metrics or {}).get("tests_total") for s in outcome.steps[::2]] == [0, 0]
    assert outcome.output == ADD and outcome.chosen_iteration == 0


@pytest.mark.anyio
async def test_a_refinement_passing_its_checks_is_not_drafted_again() -> None:
    """Only a refinement its checks find problems in gets a second draft."""
    job = dataclasses.replace(REDRAFTING, score_threshold=None, retry_copy=False)
    outcome, _ = await loop(
        job,
        [
            answer(SUB, "assert add(1, 2) == 3"),
            critic(done=False, score=3),
            answer(ADD, "assert add(1, 2) == 3"),
            critic(done=True, score=9),
        ],
    )
    assert [s.error for s in outcome.steps] == [None] * 4
    assert outcome.stop_reason == "done" and outcome.output == ADD
    assert "chosen_step" not in outcome.output_line()


@pytest.mark.anyio
async def test_a_run_stopped_after_a_first_draft_resumes_with_the_second() -> None:
    """Resumed from the steps saved up to a first draft, the loop asks the second draft
    (the same messages), not the critic."""
    job = dataclasses.replace(SAME_MESSAGES, score_threshold=None, retry_copy=False)
    script = [
        answer(SUB, "assert add(1, 2) == 3"),
        critic(done=False, score=3),
        answer(SUB, "assert add(2, 2) == 4"),  # fails its test: a second draft is due
    ]
    sink = RecordingSink()
    client = ScriptedClient(script)
    with pytest.raises(AssertionError, match="more calls than scripted"):
        await refine_record(RECORD, job, client, sink, Policy(1))
    saved = sink.steps
    assert saved[-1].error is not None and saved[-1].error["type"] == "redraft"
    resumed = ScriptedClient([answer(ADD, "assert add(1, 2) == 3"), critic(done=True, score=9)])
    outcome = await refine_record(RECORD, job, resumed, RecordingSink(), Policy(1), prior=saved)
    assert resumed.messages[0] == client.messages[2]
    assert resumed.script == [] and outcome.output == ADD and outcome.chosen_iteration == 1


TOTAL = Record(
    "t", 1, {"id": "t", "task": "Write total(values: list[int]) -> int that sums the values."}
)
SUM = "def total(values):\n    return sum(values)"
SUM_DIGITS = "def total(values):\n    return sum(int(v) for v in values)"


@pytest.mark.anyio
async def test_a_test_contradicting_the_requests_signature_is_left_out_and_named() -> None:
    """A test passing a string where the request declares a list of ints is not run,
    counted, pooled or carried to the refinement, and a finding names it."""
    outcome, client = await loop(
        CODE_IMPROVE,
        [
            answer(SUM, "assert total([1, 2]) == 3\nassert total('12') == 3"),
            critic(done=True, score=9),  # vetoed: the finding stands
            answer(SUM_DIGITS, "assert total([3]) == 3"),
            critic(done=True, score=9),
        ],
        TOTAL,
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert "`total('12')` passes `'12'`" in client.messages[2][-1]["content"]
    assert draft.metrics is not None and draft.metrics["tests_total"] == 1
    assert draft.checks == [
        "Tests that contradict the request's signature are left out: `total('12')` passes "
        "`'12'` as `values: list[int]`. Call the function with arguments of the types it "
        "declares, and expect results of the type it returns."
    ]
    # the pool: total([1, 2]) == 3 (carried to the refinement too), total([3]) == 3
    assert counts(refined.metrics) == {"total": 2, "passed": [2, 2]}


@pytest.mark.anyio
async def test_a_left_out_test_is_not_carried_to_a_refinement() -> None:
    """The draft's tests passed are carried to a refinement that drops them; the one left
    out for contradicting the signature (it never ran) is not."""
    outcome, _ = await loop(
        CODE_IMPROVE,
        [
            answer(SUM, "assert total([1, 2]) == 3\nassert total('12') == 3"),
            critic(done=False, score=5),
            answer(SUM, "assert total([]) == 0"),
            critic(done=True, score=9),
        ],
        TOTAL,
    )
    refined = outcome.steps[2].output or ""
    assert "assert total([1, 2]) == 3" in refined
    assert "total('12')" not in refined


FLATTEN = Record(
    "f",
    1,
    {
        "id": "f",
        "task": "Write flatten(nested: list) -> list that returns every non-list item of a "
        "nested list, in order. Only lists are flattened: tuples are items.",
    },
)
LISTS_ONLY = (
    "def flatten(nested):\n    out = []\n    for x in nested:\n"
    "        if isinstance(x, list):\n            out.extend(flatten(x))\n"
    "        else:\n            out.append(x)\n    return out"
)
TUPLES_TOO = LISTS_ONLY.replace("isinstance(x, list)", "isinstance(x, (list, tuple))")


@pytest.mark.anyio
async def test_a_refinement_that_flattens_tuples_no_test_holds_is_not_chosen() -> None:
    """Draft and refinement pass the same tests, none with a tuple in it, and the critic
    scores the refinement higher; given the tests' lists as tuples, the two differ, so the
    draft stays the output."""
    outcome = await refined_once(
        LISTS_ONLY,
        TUPLES_TOO,
        "assert flatten([1, [2, [3]], 4]) == [1, 2, 3, 4]\nassert flatten([]) == []",
        "flatten tuples as well",
        FLATTEN,
    )
    refined = outcome.steps[2]
    assert counts(refined.metrics) == {"total": 2, "passed": [2, 2]}
    digests = refined.metrics["tests_pooled"]["behaviour"]  # type: ignore[index]
    assert digests[0] != digests[1]
    assert (outcome.output_line()["chosen_iteration"], outcome.output) == (0, LISTS_ONLY)


SNAKE = Record(
    "s",
    1,
    {
        "id": "s",
        "task": "Write camel_to_snake(name: str) -> str that converts camelCase to snake_case, "
        'a run of capitals being one word: "parseHTTPResponse" -> "parse_http_response".',
    },
)
EACH_CAPITAL = (  # a word per capital: parse_h_t_t_p_response
    "def camel_to_snake(name):\n"
    "    return ''.join('_' + c.lower() if c.isupper() else c for c in name).lstrip('_')"
)
RUNS_OF_CAPITALS = (
    "import re\n\n"
    "def camel_to_snake(name):\n"
    "    return re.sub(r'(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])', '_', name).lower()"
)


@pytest.mark.anyio
async def test_the_requests_own_example_vetoes_done_and_a_test_against_it_is_left_out() -> None:
    """Code that passes its own tests but gets the request's example wrong is told so
    first, the critic's done is vetoed, and the answer's test expecting the wrong result
    for the example's call is left out and named; the refinement that gets it right is
    chosen."""
    outcome, client = await loop(
        CODE_IMPROVE,
        [
            answer(
                EACH_CAPITAL,
                "assert camel_to_snake('userId') == 'user_id'\n"
                "assert camel_to_snake('parseHTTPResponse') == 'parse_h_t_t_p_response'",
            ),
            critic(done=True, score=9),  # vetoed: the example fails
            answer(RUNS_OF_CAPITALS, "assert camel_to_snake('userId') == 'user_id'"),
            critic(done=True, score=9),
        ],
        SNAKE,
    )
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.checks is not None and draft.checks[0] == (
        'The request\'s own example ("parseHTTPResponse" -> "parse_http_response") fails: '
        "`assert camel_to_snake('parseHTTPResponse') == 'parse_http_response'`: AssertionError "
        "(camel_to_snake('parseHTTPResponse') is 'parse_h_t_t_p_response'). The request's "
        "examples are right: fix the code so that it gives what they say."
    )
    assert draft.checks[1].startswith(
        "Tests that expect another result than the request's own example are left out: "
        "`assert camel_to_snake('parseHTTPResponse') == 'parse_h_t_t_p_response'` (the "
        'request: "parseHTTPResponse" -> "parse_http_response").'
    )
    assert draft.metrics is not None
    assert (draft.metrics["tests_total"], draft.metrics["tests_passed"]) == (1, 1)
    assert (draft.metrics["examples_passed"], draft.metrics["examples_total"]) == (0, 1)
    assert "parse_h_t_t_p_response" in client.messages[2][-1]["content"]  # the refine prompt
    assert refined.checks == [] and refined.metrics is not None
    assert refined.metrics["examples_passed"] == 1
    line = outcome.output_line()
    assert (outcome.stop_reason, line["chosen_iteration"]) == ("done", 1)


@pytest.mark.anyio
async def test_an_answer_right_on_the_requests_examples_wins_over_one_passing_more_tests() -> None:
    """A refinement that gets the request's example right is chosen although it fails a
    (wrong) test the draft passed, which without the example would bar it."""
    outcome, _ = await loop(
        dataclasses.replace(CODE_IMPROVE, retry_copy=False),
        [
            answer(EACH_CAPITAL, "assert camel_to_snake('ABC') == 'a_b_c'"),
            critic(done=False, score=6),
            answer(RUNS_OF_CAPITALS, "assert camel_to_snake('aB') == 'a_b'"),
            critic(done=False, score=6),
            answer(RUNS_OF_CAPITALS, "assert camel_to_snake('xY') == 'x_y'"),
            critic(done=False, score=6),
            answer(RUNS_OF_CAPITALS, "assert camel_to_snake('pQ') == 'p_q'"),
            critic(done=False, score=6),
        ],
        SNAKE,
    )
    examples = [(s.metrics or {}).get("examples_passed") for s in outcome.steps[::2]]
    assert examples == [0, 1, 1, 1]
    refined = outcome.steps[2]
    assert refined.metrics is not None and refined.metrics["tests_failed"] == [
        "assert camel_to_snake('ABC') == 'a_b_c'"  # carried from the draft, failed
    ]
    line = outcome.output_line()
    assert line["chosen_iteration"] != 0 and line["output"] == RUNS_OF_CAPITALS


def test_a_test_restating_a_failing_example_is_not_named_twice() -> None:
    """The answer's own test of the request's example fails as the example does: the
    finding for the example stands alone; the answer's other failing tests are named."""
    assert CODE_IMPROVE.checker is not None
    output = extract(
        answer(
            EACH_CAPITAL,
            'assert camel_to_snake("parseHTTPResponse") == "parse_http_response"\n'
            "assert camel_to_snake('a') == 'b'",
        ),
        "code-with-tests",
    )
    found = [str(f) for f in CODE_IMPROVE.checker(SNAKE.fields, output)]
    assert [f.split(" ")[:4] for f in found[:2]] == [
        ["The", "request's", "own", "example"],
        ["Failing", "test", "`assert", "camel_to_snake('a')"],
    ]
    assert not any("parse_http_response" in f for f in found[1:])


def test_an_answer_whose_tests_are_all_of_unasked_errors_is_told_why_they_do_not_count() -> None:
    """Asked to add tests, an answer whose only tests check an error the request does not
    name is told that they are left out, and why."""
    assert CODE_IMPROVE.checker is not None
    raises = "try:\n    add('a', 1)\nexcept TypeError:\n    pass\nelse:\n    assert False"
    found = [
        str(f)
        for f in CODE_IMPROVE.checker(
            RECORD.fields, extract(answer(ADD, raises), "code-with-tests")
        )
    ]
    assert found[0] == (
        "Tests of an error the request does not ask for are left out: `try: add('a', 1) "
        "except TypeError: pass else: assert False`; the request names no error to raise. "
        "Test the results it describes."
    )
    assert found[1].startswith("Add tests")


IPV4 = Record(
    "ip",
    1,
    {
        "id": "ip",
        "task": "Write is_valid_ipv4(s: str) -> bool: four dot-separated parts of digits, "
        'each 0 to 255, without leading zeros ("0" itself is fine, "01" is not).',
    },
)
IPV4_CODE = (
    "def is_valid_ipv4(s):\n"
    "    parts = s.split('.')\n"
    "    return len(parts) == 4 and all(\n"
    "        p.isdigit() and int(p) <= 255 and str(int(p)) == p for p in parts\n"
    "    )"
)
IPV4_TESTS = "assert is_valid_ipv4('10.0.0.1') is True\nassert is_valid_ipv4('1.2.3') is False"


def _broken(findings: Sequence[str]) -> bool:
    raise RuntimeError("a broken hook")


@pytest.mark.parametrize(
    ("rewriter", "edited"),
    [("job's", True), (None, False), (_broken, False)],
)
@pytest.mark.anyio
async def test_code_whose_only_finding_is_an_untested_quoted_value_is_edited(
    rewriter: Any, edited: bool
) -> None:
    """code-improve's rewrite hook: code that passes its tests, none of which uses the
    "01" the request quotes, is edited (the code, the critic's action and the finding in
    the refine prompt), not written afresh; without the hook, or with one that raises,
    any finding calls for refine_failing."""
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False)
    if rewriter != "job's":
        job = dataclasses.replace(job, rewriter=rewriter)
    assert job.checker is not None
    found = list(job.checker(IPV4.fields, join(IPV4_CODE, IPV4_TESTS)))
    assert len(found) == 1 and found[0].startswith('No test uses "01"')
    covered = IPV4_TESTS + "\nassert is_valid_ipv4('01.2.3.4') is False"
    client = ScriptedClient(
        [
            answer(IPV4_CODE, IPV4_TESTS),
            critic(done=False, action="Name the parts `octets`.", score=6),
            answer(IPV4_CODE, covered),
            critic(done=True, score=9),
        ]
    )
    outcome = await refine_record(IPV4, job, client, RecordingSink(), Policy(1))
    assert client.script == [] and outcome.output is not None
    prompt = client.messages[2][-1]["content"]
    assert found[0] in prompt  # the finding reaches either prompt
    assert (IPV4_CODE in prompt) == edited
    assert ("Name the parts `octets`." in prompt) == edited
    assert ("do not reuse the earlier code" in prompt) == (not edited)


ISLANDS_TASK = (
    "Write a Python function count_islands(grid: list[list[str]]) -> int that counts the "
    'islands in a grid of "1" (land) and "0" (water), where an island is a group of land '
    "cells connected horizontally or vertically. An empty grid has 0 islands."
)
SINKS_THE_GRID = (  # right, and marks the caller's grid as it goes
    "def count_islands(grid):\n    def sink(i, j):\n"
    "        if 0 <= i < len(grid) and 0 <= j < len(grid[i]) and grid[i][j] == '1':\n"
    "            grid[i][j] = '0'\n"
    "            for a, b in ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1)):\n"
    "                sink(a, b)\n"
    "    count = 0\n    for i in range(len(grid)):\n        for j in range(len(grid[i])):\n"
    "            if grid[i][j] == '1':\n                count += 1\n                sink(i, j)\n"
    "    return count"
)


async def _islands_after_one_refinement(
    refinement: str, tests: str
) -> tuple[dict[str, Any], int | None]:
    """The pooled metric of the refinement (``refinement`` with ``tests``) of a right draft
    that marks the caller's grid (``SINKS_THE_GRID``, tested on the empty grid), and the
    iteration chosen."""
    client = ScriptedClient(
        [
            answer(SINKS_THE_GRID, "assert count_islands([]) == 0"),
            critic(done=False, score=4),
            answer(refinement, tests),
            critic(done=True, score=9),
        ]
    )
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False, redraft=0)
    record = Record("islands", 1, {"id": "islands", "task": ISLANDS_TASK})
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(1))
    pool = (outcome.steps[2].metrics or {})["tests_pooled"]
    return pool, outcome.output_line()["chosen_iteration"]


@pytest.mark.anyio
async def test_an_answer_calling_a_name_it_never_bound_loses_a_tie_to_one_that_runs() -> None:
    """The draft is right and marks the caller's grid as it goes; the refinement calls a
    helper under a misspelt name, so that every grid with land raises NameError. Both pass
    the empty grid's test and fail the refinement's wrong one: tied on the pooled tests,
    the draft is chosen, though the request names no error to raise (a name the code never
    bound is no answer to any request), and though it changes the caller's grid where the
    refinement, raising first, does not."""
    misspelt = SINKS_THE_GRID.replace("                sink(i, j)", "                sink_(i, j)")
    pool, chosen = await _islands_after_one_refinement(
        misspelt,
        "assert count_islands([]) == 0\n"
        "assert count_islands([['1', '1'], ['0', '1']]) == 3",  # wrong: one island
    )
    assert (pool["total"], pool["passed"], pool["raised"][0]) == (2, [1, 1], 0)
    assert pool["raised"][1] > 0 and pool["stray"][0] > 0
    assert chosen == 0


@pytest.mark.anyio
async def test_changing_the_callers_grid_on_fewer_calls_wins_no_tie() -> None:
    """Both answers change the caller's grid, which the request does not ask for: the
    draft (right) on every grid with land, the refinement (wrong: each land cell an
    island) only where the first cell is land. Tied on the pooled tests, the refinement
    was chosen for changing it on fewer calls; now how often counts for nothing where every
    answer does it, and the tie goes as any other does (the earliest of the behaviours
    most drafts share)."""
    cells = (  # wrong: counts land cells, and marks the first one
        "def count_islands(grid):\n"
        "    count = sum(cell == '1' for row in grid for cell in row)\n"
        "    if grid and grid[0] and grid[0][0] == '1':\n        grid[0][0] = '0'\n"
        "    return count"
    )
    pool, chosen = await _islands_after_one_refinement(
        cells,
        "assert count_islands([]) == 0\n"
        "assert count_islands([['0', '1'], ['1', '1']]) == 2",  # wrong: one island
    )
    assert (pool["total"], pool["passed"], pool["raised"]) == (2, [1, 1], [0, 0])
    assert pool["stray"][0] > pool["stray"][1] > 0
    assert chosen == 0


@pytest.mark.anyio
async def test_tests_left_out_as_against_the_signature_pass_nothing_in_the_choice() -> None:
    """The draft is right with one test; the refinement (wrong: counts land cells) adds
    tests writing cells as numbers, against the declared ``list[list[str]]``, which are
    left out and never run. Both pass the one test that runs and both carry findings: the
    tests left out once counted as the refinement's passed tests and chose it; now the
    tests that ran decide (a tie), and the critic's better score the draft."""
    right = SINKS_THE_GRID.replace(
        "    count = 0\n", "    grid = [list(row) for row in grid]\n    count = 0\n"
    )
    cells = "def count_islands(grid):\n    return sum(cell == '1' for row in grid for cell in row)"
    client = ScriptedClient(
        [
            answer(right, "assert count_islands([]) == 0"),
            critic(done=False, score=9),
            answer(
                cells,
                "assert count_islands([]) == 0\n"
                "assert count_islands([[1]]) == 1\n"
                "assert count_islands([[1, 0], [0, 1]]) == 2",
            ),
            critic(done=False, score=4),
        ]
    )
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False, redraft=0)
    record = Record("islands", 1, {"id": "islands", "task": ISLANDS_TASK})
    outcome = await refine_record(record, job, client, RecordingSink(), Policy(1))
    draft, refined = outcome.steps[0], outcome.steps[2]
    assert draft.checks and refined.checks  # neither is clean
    assert any("contradict the request's signature" in c for c in refined.checks)
    assert refined.metrics is not None
    assert (refined.metrics["tests_passed"], refined.metrics["tests_total"]) == (1, 1)
    assert outcome.output_line()["chosen_iteration"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize(("right", "wrong"), [(10, 1), (16, 2)], ids=["one-more", "two-more"])
async def test_a_few_pooled_tests_more_lose_to_answers_written_apart_that_agree(
    right: int, wrong: int
) -> None:
    """Right tests, wrong ones only the wrong refinement passes (``add(7, 1) == 0``, ...)
    and a wrong one nobody passes: the right draft and the right last refinement (written
    apart, alike in what they return) pass all but the wrong ones, the wrong refinement
    all but one. Where the pooled tests are many and none passes them all, one test more
    (from ten) or two (from sixteen) is within what the model's own mistaken tests give,
    and the behaviour most drafts share wins: the draft."""
    right_tests = "\n".join(f"assert add({a}, {a + 3}) == {2 * a + 3}" for a in range(right))
    wrong_tests = "\n".join(f"assert add(7, {b}) == 0" for b in range(1, wrong + 1))
    wrong_code = f"def add(a, b):\n    return 0 if a == 7 and 1 <= b <= {wrong} else a + b"
    client = ScriptedClient(
        [
            answer(ADD, right_tests),
            critic(done=False, score=5),
            answer(wrong_code, wrong_tests),
            critic(done=False, score=9),
            answer("def add(a, b):\n    return b + a", "assert add(1, 1) == 3"),
            critic(done=False, score=5),
        ]
    )
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False, redraft=0)
    outcome = await refine_record(RECORD, job, client, RecordingSink(), Policy(2))
    pool = (outcome.steps[4].metrics or {})["tests_pooled"]
    total = right + wrong + 1
    assert (pool["total"], pool["passed"]) == (total, [right, total - 1, right])
    assert pool["behaviour"][0] == pool["behaviour"][2] != pool["behaviour"][1]
    assert outcome.output_line()["chosen_iteration"] == 0


@pytest.mark.anyio
async def test_agreement_in_part_outvotes_two_answers_wrong_in_the_same_way() -> None:
    """Five answers tie on the pooled tests (each carries the same ten right ones and one
    wrong one nobody passes). The draft and the first refinement, written apart, both
    return 0 when ``a`` is 7; the third right; the last two each wrong on a value of their
    own. The pair alike on every call once won (two programs sharing one behaviour, the
    others alone); now the one the others agree with most on the calls near the tests
    wins: the right answer agrees in part with every other program."""
    tests = "\n".join(
        [f"assert add({a}, {b}) == {a + b}" for a in (5, 8, 10) for b in (1, 2, 3)]
        + ["assert add(20, 1) == 21", "assert add(1, 1) == 3"]  # the last is wrong
    )
    codes = [
        "def add(a, b):\n    return 0 if a == 7 else a + b",
        "def add(a, b):\n    if a != 7:\n        return b + a\n    return 0",
        "def add(a, b):\n    return a + b",
        "def add(a, b):\n    return -1 if a == 9 else a + b",
        "def add(a, b):\n    return -1 if a == 4 else a + b",
    ]
    script = [m for code in codes for m in (answer(code, tests), critic(done=False, score=5))]
    job = dataclasses.replace(CODE_IMPROVE, score_threshold=None, retry_copy=False, redraft=0)
    outcome = await refine_record(RECORD, job, ScriptedClient(script), RecordingSink(), Policy(4))
    pool = (outcome.steps[8].metrics or {})["tests_pooled"]
    assert (pool["total"], pool["passed"]) == (11, [10] * 5)
    assert pool["behaviour"][0] == pool["behaviour"][1]  # alike on every call
    assert len(set(pool["behaviour"])) == 4
    agreement = pool["agreement"]
    assert agreement[2] == max(agreement) and agreement.count(agreement[2]) == 1
    assert outcome.output_line()["chosen_iteration"] == 2


VERSIONS = Record(
    "v",
    1,
    {
        "id": "v",
        "task": "Write compare_versions(a: str, b: str) -> int that compares two dotted "
        "version strings numerically, returning -1, 0 or 1. Raise ValueError if either "
        "string has an empty component (for example '1..2' or '1.2.').",
    },
)
SKIPS_EMPTY = (  # '1..2' read as '1.2': no ValueError
    "def compare_versions(a, b):\n"
    "    x = [int(p) for p in a.split('.') if p]\n"
    "    y = [int(p) for p in b.split('.') if p]\n"
    "    return (x > y) - (x < y)"
)
RAISES_ON_EMPTY = (
    "def compare_versions(a, b):\n"
    "    x = [int(p) for p in a.split('.')]\n"
    "    y = [int(p) for p in b.split('.')]\n"
    "    return (x > y) - (x < y)"
)


@pytest.mark.anyio
async def test_a_test_expecting_a_value_for_an_input_the_request_lists_as_raising_is_left_out() -> (
    None
):
    """For a function of two parameters, a test expecting a value of a call passing an
    input the request lists as raising (either argument) is left out and named, so the
    draft passing it is no evidence against the refinement that raises there: that
    refinement is chosen."""
    outcome, _ = await loop(
        dataclasses.replace(CODE_IMPROVE, retry_copy=False),
        [
            answer(
                SKIPS_EMPTY,
                "assert compare_versions('1.10', '1.9') == 1\n"
                "assert compare_versions('1..2', '1.2') == 0",
            ),
            critic(done=False, score=6),
            answer(
                RAISES_ON_EMPTY,
                "assert compare_versions('1.10', '1.9') == 1\n"
                "try:\n    compare_versions('1.2.', '1')\nexcept ValueError:\n    pass\n"
                "else:\n    raise AssertionError('no ValueError')",
            ),
            critic(done=True, score=9),
        ],
        VERSIONS,
    )
    draft = outcome.steps[0]
    assert draft.checks is not None and any(
        c.startswith(
            "Tests that expect another result than the request's own example are left out: "
            "`assert compare_versions('1..2', '1.2') == 0` (the request: ValueError for '1..2')"
        )
        for c in draft.checks
    )
    assert draft.metrics is not None
    assert (draft.metrics["tests_passed"], draft.metrics["tests_total"]) == (1, 1)
    line = outcome.output_line()
    assert (line["chosen_iteration"], outcome.output) == (1, RAISES_ON_EMPTY)
