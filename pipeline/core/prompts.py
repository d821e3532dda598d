"""Building each call's messages: a record's calls form one conversation.

::

    system      the job's system message (the same for every record: cached across them)
    user        the generate prompt, with the record's input              -> answer 0
    assistant   answer 0
    user        the feedback prompt (with what the checks found)          -> feedback 0
    assistant   feedback 0
    user        the refine prompt                                         -> answer 1
    assistant   answer 1
    user        (what the checks found) and "review it the same way": the feedback
                prompt's rules are said once per conversation

Each call sends the conversation up to its own request, the role's instruction last, so
every call's messages extend the previous call's as they were sent: a provider's prefix
cache serves the history once, and every refine call carries the record's input, the
latest answer, its feedback (the critic's, and the checks' findings) and every earlier
(answer, feedback) pair, which is Self-Refine's invariant. The only call outside the
conversation is strategy ``restart``'s, which by design leaves the failing answer out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from .feedback import render_feedback
from .jobs import Job, placeholders, render
from .records import Record
from .steps import CallKind, Role, Step

__all__ = [
    "CHECKS_HEADING",
    "DEFAULT_RESTART",
    "FEEDBACK_AGAIN",
    "build_messages",
    "feedback_request",
    "feedback_text",
    "findings_text",
    "opening",
]

# Before the checks' findings, where a feedback prompt does not place them itself.
CHECKS_HEADING = "Automatic checks were run on this answer. They found:"
# A later feedback request, once the conversation holds the feedback prompt's rules.
FEEDBACK_AGAIN = (
    "Review the latest answer above in the same way as the earlier one: the same "
    "instructions and the same reply format."
)
DEFAULT_RESTART = (
    "An earlier answer to this was checked automatically, which found:\n\n{{findings}}\n\n"
    "Write a new answer from the start that avoids these problems, in the form asked above."
)


def field_text(value: Any, join: str = ", ") -> str:
    """A field's value as a prompt shows it."""
    if value is None:  # an absent optional field, or null
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return join.join(value)
    return orjson.dumps(value).decode()


def _values(job: Job, record: Record) -> dict[str, str]:
    """The placeholder values of the record's fields shown to the model."""
    return {
        f.name: field_text(record.fields.get(f.name), f.join)
        for f in job.inputs
        if f.use == "prompt"
    }


def opening(job: Job, record: Record, extra: str | None = None) -> list[dict[str, str]]:
    """The conversation's start: the system message and the generate prompt (``extra``
    after it, for a restart)."""
    prompt = render(job.generate_prompt, _values(job, record))
    if extra:
        prompt = f"{prompt.rstrip()}\n\n{extra}"
    messages = [{"role": "system", "content": job.system_prompt}] if job.system_prompt else []
    return [*messages, {"role": "user", "content": prompt}]


def findings_text(found: Sequence[str] | None) -> str:
    """Check findings as a prompt shows them: a "- " line each, "(none)", or "(not checked)"."""
    if found is None:
        return "(not checked)"
    return "\n".join(f"- {text}" for text in found) if found else "(none)"


def _rules(job: Job, record: Record) -> str:
    """The longest part of the record's feedback prompt that no answer changes: its rules
    (and reply format), which the conversation needs to hold once."""
    cut = "\x00"
    parts = render(job.feedback_prompt, {**_values(job, record), "findings": cut}).split(cut)
    return max((p.strip() for p in parts), key=len)


def feedback_request(
    job: Job, record: Record, answer: Step, before: Sequence[dict[str, str]] = ()
) -> str:
    """The user turn asking for feedback on ``answer``, with what its checks found: where
    the prompt has ``{{findings}}``, there; else after it, when they found something.

    The prompt's rules are said once per conversation: when the messages ``before`` it
    (the conversation it extends) hold them already, a short request points back to them,
    with the findings of this answer.
    """
    found = findings_text(answer.checks)
    rules = _rules(job, record)
    if rules and any(m["role"] == "user" and rules in m["content"] for m in before):
        said = "findings" in placeholders(job.feedback_prompt) or answer.checks
        checks = f"{CHECKS_HEADING}\n{found}\n\n" if said else ""
        return checks + FEEDBACK_AGAIN
    prompt = render(job.feedback_prompt, {**_values(job, record), "findings": found})
    if "findings" in placeholders(job.feedback_prompt) or not answer.checks:
        return prompt
    return f"{CHECKS_HEADING}\n{found}\n\n{prompt}"


def feedback_text(job: Job, step: Step) -> str:
    """The critic's feedback as the conversation shows it (its raw reply when unparsed)."""
    return render_feedback(
        step.parsed,
        step.response or "",
        actions_field=job.actions_field,
        done_field=job.done_field,
        score_field=job.score_field,
    )


def _main_call(steps: Sequence[Step], iteration: int) -> Step:
    """The method's own answer call of ``iteration`` (its messages are the conversation)."""
    return next(
        s
        for s in steps
        if s.role != "feedback" and s.iteration == iteration and s.call_kind is CallKind.ANSWER
    )


def _latest_feedback(steps: Sequence[Step], iteration: int) -> Step:
    return next(s for s in reversed(steps) if s.role == "feedback" and s.iteration == iteration)


def build_messages(
    job: Job,
    record: Record,
    role: Role,
    call_kind: CallKind,
    iteration: int,
    steps: Sequence[Step],
    answer: Step | None = None,
) -> list[dict[str, str]]:
    """The chat messages of one call, exactly as they will be sent.

    ``answer``: for a feedback call, the answer it reviews; for a refine or restart call,
    the answer it refines (each iteration's answer is the draft its loop went on with).
    """
    if call_kind in (CallKind.REPAIR, CallKind.COPY_RETRY):
        return [dict(m) for m in steps[-1].messages]  # asked again exactly as it was
    if role == "generate":
        return opening(job, record)
    assert answer is not None and answer.output is not None
    if call_kind is CallKind.RESTART:
        values = {**_values(job, record), "findings": findings_text(answer.checks)}
        return opening(job, record, render(job.restart_prompt or DEFAULT_RESTART, values))
    if role == "feedback":
        before = _main_call(steps, iteration).messages
        return [
            *[dict(m) for m in before],
            {"role": "assistant", "content": job.answer_kind.shown(answer.output)},
            {"role": "user", "content": feedback_request(job, record, answer, before)},
        ]
    feedback = _latest_feedback(steps, iteration - 1)
    return [
        *[dict(m) for m in feedback.messages],
        {"role": "assistant", "content": feedback_text(job, feedback)},
        {"role": "user", "content": render(job.refine_prompt, _values(job, record))},
    ]
