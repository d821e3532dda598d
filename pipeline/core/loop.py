"""The Self-Refine loop for one record: generate, then feedback and refine until a stop rule holds.

The loop is a fold over completed steps: ``plan`` looks at the steps so far and names the
next call or the reason to stop; ``next_call`` turns that into the request; ``make_step``
turns the answer into the step that is checkpointed. ``refine_record`` drives the fold with
a model client; the Batch API and Ray drivers drive the same functions their own way.
Resume is the same fold started from the steps the journal replays, so a resumed
record never repeats a call. The loop knows no particular job: what differs between kinds
of answer is behind ``AnswerKind``, and a job's checks and evaluator are functions it calls.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from ..errors import CallError, FatalCallError, FeedbackParseError
from .choice import choose, score_of, summed_score
from .drafts import answer_of, answers, drafts, feedback_on
from .feedback import parse_feedback
from .hooks import Judged, judge
from .jobs import Job
from .prompts import build_messages
from .records import Record
from .steps import (
    LENGTH,
    CallKind,
    Completion,
    ModelClient,
    Outcome,
    Request,
    Role,
    Step,
    StepSink,
    Superseded,
)
from .strategies import next_draft

__all__ = [
    "CUT_OFF",
    "RETRY_FREQUENCY_PENALTY",
    "Call",
    "Next",
    "Policy",
    "Stop",
    "StopReason",
    "call_failed",
    "failed_step",
    "finish",
    "make_step",
    "next_call",
    "plan",
    "refine_record",
]

# The finding added to an answer cut off at max_tokens inside its artifact.
CUT_OFF = "The answer was cut off at the length limit: give a shorter, complete answer."
# Sent with the repair of a call cut off at max_tokens: a small model that runs away
# repeats one phrase until the budget is spent.
RETRY_FREQUENCY_PENALTY = 0.5


class StopReason(enum.StrEnum):
    """Why a record's loop stopped (the output line's ``stop_reason``)."""

    DONE = "done"  # the critic said done
    SCORE = "score_threshold"  # the critic's score reached the job's threshold
    MAX_ITERS = "max_iters"  # the refinements allowed were made
    NO_CHANGE = "no_change"  # a refinement handed its input back unchanged
    ERROR = "error"  # a call failed for good


@dataclass(frozen=True, slots=True)
class Policy:
    """How far a loop may go: the iteration budget, and what may stop it early."""

    max_iters: int
    min_iters: int = 0  # refinements before the critic's done (or a score) may stop a loop
    checks: bool = True  # run the job's check hook on every answer


@dataclass(frozen=True, slots=True)
class Stop:
    """The loop is over, and why."""

    reason: StopReason


@dataclass(frozen=True, slots=True)
class Next:
    """The next call's place in the loop: its role, why it is made, its iteration."""

    role: Role
    call_kind: CallKind
    iteration: int


@dataclass(frozen=True, slots=True)
class Call:
    """The next model call of a record: its place in the loop, and the request it makes."""

    role: Role
    iteration: int
    call_kind: CallKind
    request: Request


# -- the fold ----------------------------------------------------------------------------------


def _same(a: str | None, b: str | None) -> bool:
    return " ".join((a or "").split()) == " ".join((b or "").split())


def _verdict(job: Job, feedback: Step, answer: Step | None, t: int, min_iters: int) -> Stop | None:
    """Whether the critic's feedback on iteration ``t``'s answer stops the loop: done, then
    score. It counts only after ``min_iters`` refinements, and never while a check the
    program ran still finds problems in the answer."""
    if t < min_iters or (answer is not None and answer.checks):
        return None
    parsed = feedback.parsed
    if parsed is not None and parsed.get(job.done_field) is True:
        return Stop(StopReason.DONE)
    score = score_of(job, feedback)
    if job.score_threshold is not None and score is not None and score >= job.score_threshold:
        return Stop(StopReason.SCORE)
    return None


def plan(steps: Sequence[Step], job: Job, policy: Policy) -> Next | Stop:
    """The next call to make, or why the loop stops.

    The stop rules, first that holds: the critic's ``done``; score >= the job's threshold;
    ``max_iters`` refinements made; the refinement is identical to its input. Feedback is
    asked on every answer before the last, and on the last only where the job scores, so
    the best-scored iteration can be chosen. An attempt the loop asks again (cut off at
    max_tokens, or copied under copy-retry) is asked before anything else; the drafts a
    strategy adds to an iteration come before its feedback.
    """
    if not steps:
        return Next("generate", CallKind.ANSWER, 0)
    last = steps[-1]
    t = last.iteration
    if last.superseded:
        cut = (last.error or {}).get("type") == Superseded.CUT_OFF
        return Next(last.role, CallKind.REPAIR if cut else CallKind.COPY_RETRY, t)
    if last.role == "feedback":
        verdict = _verdict(job, last, answer_of(job.answer_kind, steps, t), t, policy.min_iters)
        if verdict is not None:
            return verdict
        if t >= policy.max_iters:
            return Stop(StopReason.MAX_ITERS)
        return Next("refine", CallKind.ANSWER, t + 1)
    refined = answer_of(job.answer_kind, steps, t - 1) if t > 0 else None
    made = [s for s in steps if s.role != "feedback" and s.iteration == t]
    extra = next_draft(job.strategies, made, None if refined is None else refined.checks)
    if extra is not None:
        return Next(last.role, extra, t)
    now = answer_of(job.answer_kind, steps, t)
    if refined is not None and now is not None and _same(now.output, refined.output):
        earlier = feedback_on(steps, t - 1)
        verdict = None if earlier is None else _verdict(job, earlier, now, t, policy.min_iters)
        return verdict or Stop(
            StopReason.MAX_ITERS if t >= policy.max_iters else StopReason.NO_CHANGE
        )
    if policy.max_iters == 0 or (t >= policy.max_iters and not job.scored):
        return Stop(StopReason.MAX_ITERS)
    return Next("feedback", CallKind.FEEDBACK, t)


def next_call(job: Job, record: Record, steps: Sequence[Step], policy: Policy) -> Call | Stop:
    """The record's next call as it will be sent, or why its loop stops."""
    nxt = plan(steps, job, policy)
    if isinstance(nxt, Stop):
        return nxt
    answer = None
    if nxt.role == "feedback":
        answer = answer_of(job.answer_kind, steps, nxt.iteration)
    elif nxt.iteration > 0:
        answer = answer_of(job.answer_kind, steps, nxt.iteration - 1)
    # A repair is asked as the call it repairs was, with a repetition penalty.
    repaired = steps[-1].call_kind if nxt.call_kind is CallKind.REPAIR else None
    origin = repaired or nxt.call_kind
    messages = build_messages(job, record, nxt.role, nxt.call_kind, nxt.iteration, steps, answer)
    request = Request(
        tuple(messages),
        temperature=job.strategies.temperature(origin, job.temperature),
        max_tokens=job.max_tokens,
        schema=job.feedback_schema if nxt.role == "feedback" else None,
        frequency_penalty=RETRY_FREQUENCY_PENALTY if nxt.call_kind is CallKind.REPAIR else None,
        cache_key=record.id,
    )
    return Call(nxt.role, nxt.iteration, nxt.call_kind, request)


# -- making a step -----------------------------------------------------------------------------


def _reaches_the_end(text: str, output: str) -> bool:
    """Whether the artifact runs to the end of the reply (so a reply cut off cut it too).

    A program whose block was closed before the prose after it ran out is whole.
    """
    lines = output.rstrip().splitlines()
    return not lines or text.rstrip().endswith(lines[-1].rstrip())


async def _evaluate(job: Job, record: Record, output: str, checks: bool) -> Judged:
    checker = job.checker if checks else None
    if job.evaluator is None and checker is None:
        return Judged()
    shown = job.shown_fields(record.fields)
    # Evaluators and checks may run a subprocess: keep the event loop free.
    return await anyio.to_thread.run_sync(
        judge, job.name, job.evaluator, checker, record.fields, shown, output
    )


def _as_sent(sent: list[dict[str, str]] | None, call: Call) -> list[dict[str, str]]:
    """The messages a step records: as the client sent them, else as the loop asked."""
    return sent if sent is not None else [dict(m) for m in call.request.messages]


def _usage(comp: Completion) -> dict[str, int]:
    usage = {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens}
    optional = {
        "cached_tokens": comp.cached_tokens,
        "cache_write_tokens": comp.cache_write_tokens,
        "cache_write_1h_tokens": comp.cache_write_1h_tokens,
    }
    usage.update((k, v) for k, v in optional.items() if v)
    return usage


def _cut_error(repair: bool, what: str) -> dict[str, str]:
    if repair:
        message = f"{what} cut off at max_tokens; asked once more (repair)"
        return {"type": Superseded.CUT_OFF, "message": message}
    return {"type": LENGTH, "message": f"{what} cut off at max_tokens (finish_reason=length)"}


def _feedback_step(job: Job, comp: Completion, repair: bool, common: dict[str, Any]) -> Step:
    parsed: dict[str, Any] | None
    error: dict[str, Any] | None = None
    try:
        parsed = parse_feedback(
            comp.text,
            actions_field=job.actions_field,
            done_field=job.done_field,
            score_field=job.score_field,
        )
    except FeedbackParseError as err:
        parsed = None
        error = {"type": "feedback_parse", "message": str(err)}
    if comp.finish_reason == "length":
        error = _cut_error(repair, "feedback")
    if parsed is not None and job.score_from and job.score_field is not None:
        parsed[job.score_field] = summed_score(parsed, job.score_from)
    return Step("feedback", parsed=parsed, error=error, **common)


async def make_step(
    job: Job,
    record: Record,
    call: Call,
    comp: Completion,
    steps: Sequence[Step],
    checks: bool,
) -> Step:
    """The step a completed call becomes: feedback parsed, or the answer extracted and checked."""
    repair = job.strategies.repair and call.call_kind is not CallKind.REPAIR
    common: dict[str, Any] = {
        "iteration": call.iteration,
        "messages": _as_sent(comp.messages, call),
        "response": comp.text,
        "usage": _usage(comp),
        "latency_s": comp.latency_s,
        "attempts": comp.attempts,
        "model": comp.model,
        "tries": comp.tries,
        "batch_id": comp.batch_id,
        "call_kind": call.call_kind,
        "service_tier": comp.service_tier,
    }
    if call.role == "feedback":
        return _feedback_step(job, comp, repair, common)
    output = job.answer_kind.extract(comp.text)
    cut = comp.finish_reason == "length"
    cut_inside = cut and _reaches_the_end(comp.text, output)
    refined = answer_of(job.answer_kind, steps, call.iteration - 1) if call.iteration else None
    if cut_inside and repair:  # asked again at once: nothing to check
        return Step(
            call.role, parsed=None, output=output, error=_cut_error(True, "answer"), **common
        )
    copied = (
        job.strategies.copy_retry
        and call.call_kind in (CallKind.ANSWER, CallKind.SAMPLE)
        and refined is not None
        and _same(output, refined.output)
    )
    if copied:  # the copy guard's one retry follows
        copy = {"type": Superseded.COPY, "message": "identical to its input; asked once more"}
        return Step(call.role, parsed=None, output=output, error=copy, **common)
    if cut_inside:
        output = job.answer_kind.cut(output)
    judged = await _evaluate(job, record, output, checks)
    metrics, found = judged.metrics, judged.findings
    if checks and cut_inside:
        found = [*(found or []), CUT_OFF]  # a verified problem: the refinement shortens it
    if job.select in job.answer_kind.selections:
        rule = job.answer_kind.selections[job.select]
        outputs = [d.output or "" for d in drafts(steps)] + [output]
        measured = await anyio.to_thread.run_sync(
            rule.measure, job.shown_fields(record.fields), outputs
        )
        if measured is not None:
            metrics = {**(metrics or {}), rule.name: measured}
    error = _cut_error(False, "answer") if cut else None
    return Step(
        call.role,
        parsed=None,
        output=output,
        metrics=metrics,
        checks=found,
        error=error,
        hook_errors=judged.failures,
        **common,
    )


def failed_step(call: Call, err: CallError) -> Step:
    """A call that failed for good, as its trace shows it: no response, the error, each try."""
    return Step(
        call.role,
        call.iteration,
        _as_sent(err.messages, call),
        None,
        None,
        {"prompt_tokens": 0, "completion_tokens": 0},
        round(sum(t.latency_s for t in err.tries), 4),
        err.attempts,
        error=err.as_dict(),
        model=err.model,
        tries=tuple(err.tries),
        call_kind=call.call_kind,
    )


def finish(
    job: Job,
    record: Record,
    steps: Sequence[Step],
    reason: str,
    error: dict[str, Any] | None = None,
) -> Outcome:
    """The record's outcome from its steps: the chosen answer, and why the loop stopped."""
    choice = choose(job, steps, job.select)
    index = {id(s): i for i, s in enumerate(steps)}
    output = tests = None
    if choice.step is not None and choice.step.output is not None:
        output, tests = job.answer_kind.parts(choice.step.output)
    found = answers(job.answer_kind, steps)
    return Outcome(
        record=record,
        status="failed" if error else "done",
        output=output,
        iterations=max((a.iteration for a in found), default=0),
        chosen_iteration=None if choice.step is None else choice.step.iteration,
        stop_reason=str(reason),
        score=choice.score,
        steps=tuple(steps),
        error=error,
        scores=choice.scores,
        tests=tests,
        chosen_step=None if choice.step is None else index[id(choice.step)],
        answer_steps=tuple(index[id(a)] for a in found),
        chosen_by=choice.by,
    )


def call_failed(
    job: Job, record: Record, steps: Sequence[Step], call: Call, err: CallError
) -> Outcome:
    """The outcome of a record whose call failed for good: failed, the call in its trace."""
    error = {"type": err.category, "message": f"{call.role} (iteration {call.iteration}): {err}"}
    return finish(job, record, [*steps, failed_step(call, err)], StopReason.ERROR, error)


async def refine_record(
    record: Record,
    job: Job,
    client: ModelClient,
    sink: StepSink,
    policy: Policy,
    *,
    critic: ModelClient | None = None,
    prior: Sequence[Step] = (),
) -> Outcome:
    """Run (or resume, from ``prior``) the loop for one record.

    Feedback calls go to ``critic`` when given. A call that fails for good fails the
    record (its trace keeps the failed call); a FatalCallError or BudgetReached
    propagates so the run can stop, leaving the record to be resumed.
    """
    steps = list(prior)
    while True:
        call = next_call(job, record, steps, policy)
        if isinstance(call, Stop):
            return finish(job, record, steps, call.reason)
        model = critic if critic is not None and call.role == "feedback" else client
        try:
            comp = await model.complete(call.request)
        except FatalCallError:
            raise
        except CallError as err:
            return call_failed(job, record, steps, call, err)
        step = await make_step(job, record, call, comp, steps, policy.checks)
        await sink.save(record.id, steps, step)
        steps.append(step)
