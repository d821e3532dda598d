"""A record's steps as stored: each message once, every request rebuilt exactly as sent."""

from __future__ import annotations

import orjson
import pytest

from pipeline.core.steps import CallKind, Role, Step
from pipeline.core.trace import steps_of, stored_step, stored_steps

SYSTEM = {"role": "system", "content": "You improve code."}
TASK = {"role": "user", "content": "Write f. " + "spec " * 200}


def step(role: Role, messages: list[dict[str, str]], kind: CallKind | None = None) -> Step:
    return Step(role, 0, messages, f"answer to {len(messages)}", None, {}, 0.1, 1, call_kind=kind)


def conversation() -> list[Step]:
    """generate, feedback, refine, a repair of the refine, a restart, and a sample."""
    gen = step("generate", [SYSTEM, TASK])
    fb = step("feedback", [*gen.messages, {"role": "assistant", "content": "a0"},
                           {"role": "user", "content": "review it"}])  # fmt: skip
    ref = step("refine", [*fb.messages, {"role": "assistant", "content": "f0"},
                          {"role": "user", "content": "improve it"}])  # fmt: skip
    repair = step("refine", [dict(m) for m in ref.messages], CallKind.REPAIR)  # equal, not shared
    restart = step("refine", [SYSTEM, {"role": "user", "content": "start over"}], CallKind.RESTART)
    sample = step("generate", [dict(m) for m in gen.messages], CallKind.SAMPLE)
    return [gen, fb, ref, repair, restart, sample]


def test_each_step_stores_only_the_messages_it_added() -> None:
    """A step names the earlier request it extends and adds only its new turns: no message
    is stored twice, so a record's bytes grow with its calls, not their square."""
    stored = stored_steps(conversation())
    assert [(s.get("extends"), len(s["added"])) for s in stored] == [
        (None, 2),
        ([0, 2], 2),
        ([1, 4], 2),
        ([2, 6], 0),  # a repair: the refine's request again, whole
        ([3, 1], 1),  # a restart: the system message (the latest holding it), its own prompt
        ([3, 2], 0),  # a sample: the generate prompt again
    ]
    assert all("messages" not in s for s in stored)
    text = orjson.dumps(stored)
    assert text.count(b"spec spec") == TASK["content"].count("spec spec") * 1  # the task once


def test_requests_are_rebuilt_exactly_as_sent() -> None:
    """Through JSON and back, every step's messages equal the ones it sent, in order."""
    steps = conversation()
    rebuilt = steps_of(orjson.loads(orjson.dumps(stored_steps(steps))))
    assert [s.messages for s in rebuilt] == [s.messages for s in steps]
    assert rebuilt == steps


def test_steps_stored_whole_by_older_runs_are_read_even_mixed() -> None:
    """A step with ``messages`` (the form before ``extends``/``added``) is read as it is, and
    a later step may extend it."""
    steps = conversation()
    old = [s.to_dict({"messages": s.messages}) for s in steps[:2]]
    new = [stored_step(s, steps[:i + 2]) for i, s in enumerate(steps[2:])]  # fmt: skip
    assert steps_of(orjson.loads(orjson.dumps(old + new))) == steps


@pytest.mark.parametrize(
    ("extends", "error"),
    [
        ([5, 1], "step 1: extends: [5, 1] names no earlier step"),
        ([0, 3], "step 1: extends: step 0 has 2 messages, not 3"),
        ([0, 0], "step 1: extends: step 0 has 2 messages, not 0"),
        ("0", "step 1: extends: '0' names no earlier step"),
    ],
)
def test_a_reference_to_no_earlier_request_is_an_error_naming_the_step(
    extends: object, error: str
) -> None:
    """A stored step whose ``extends`` points nowhere is refused, naming the step."""
    stored = stored_steps(conversation()[:2])
    stored[1]["extends"] = extends
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
        steps_of(stored)


def test_a_step_without_its_messages_is_an_error_naming_the_field() -> None:
    """A stored step with neither ``messages`` nor ``added`` is refused, naming both."""
    stored = stored_steps(conversation()[:1])
    del stored[0]["added"]
    with pytest.raises(ValueError, match="step 0: no 'added' field"):
        steps_of(stored)
