"""The Self-Refine loop for one record: generate, then feedback and refine until a stop rule holds.

The loop is a fold over completed steps: ``plan`` looks at the steps so far and names the
next call or the reason to stop; ``next_call`` turns that into the request; ``make_step``
turns the answer into the step that is checkpointed. ``refine_record`` drives the fold
with a model client; the Batch API and Ray drivers drive the same functions their own
way. Resume is the same fold started from the steps the checkpoint store replays, so a
resumed record never repeats a call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
import orjson

from . import answers as artifacts
from .calls import (
    COPY,
    CUT_RETRY,
    REDRAFT,
    Completion,
    ModelClient,
    Outcome,
    Role,
    Step,
    StepSink,
    is_answer,
    is_copy,
    is_cut_retry,
    is_draft,
    is_redraft,
    is_retried,
)
from .errors import CallError, FatalCallError, FeedbackParseError
from .feedback import parse_feedback, render_feedback
from .jobs import Job, render
from .records import Record
from .sandbox import run_calls, run_tests, syntax_problem

__all__ = [
    "Call",
    "Policy",
    "Stop",
    "build_messages",
    "call_failed",
    "choose",
    "failed_step",
    "feedback_text",
    "finish",
    "make_step",
    "next_call",
    "plan",
    "refine_record",
]


@dataclass(frozen=True, slots=True)
class Policy:
    """How far a loop may go: the iteration budget, and what may stop it early."""

    max_iters: int
    min_iters: int = 0  # refinements before the critic's done (or a score) may stop a loop
    checks: bool = True  # run the job's check hook on every answer


@dataclass(frozen=True, slots=True)
class Stop:
    """The loop is over, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Call:
    """The next model call of a record, exactly as it will be asked for."""

    role: Role
    iteration: int
    messages: list[dict[str, str]]
    schema: Mapping[str, Any] | None
    temperature: float
    max_tokens: int
    frequency_penalty: float | None = None  # only on the retry of a cut-off call

    def sampling(self) -> dict[str, float]:
        """Sampling settings beyond the temperature, as request-body fields (often none)."""
        return (
            {} if self.frequency_penalty is None else {"frequency_penalty": self.frequency_penalty}
        )


# -- pure parts --------------------------------------------------------------------------------

LENGTH = "length"  # error type of an answer cut off at max_tokens
CUT_OFF = "The answer was cut off at the length limit: give a shorter, complete answer."
# Sent with the one retry of a call cut off at max_tokens: a small model that runs away
# repeats one phrase until the budget is spent, a critic ("doll, doll, doll, ...") or an
# answer (`assert f([1, [2]]) == ...`, `assert f([1, [2], [3]]) == ...`, ...).
RETRY_FREQUENCY_PENALTY = 0.5
# From this many pooled tests, where no answer passes them all, answers passing a few fewer
# than the most stay in the choice (``chosen``, ``_slack``): one of many tests the model
# wrote is as likely its mistake as the code's, and answers written apart that agree
# outweigh it.
MANY_POOLED_TESTS = 10


def _answers(steps: Sequence[Step]) -> list[Step]:
    """Answer steps (generate and refine), without attempts retried (copies, cut off)."""
    return [s for s in steps if is_answer(s)]


def _drafts(steps: Sequence[Step]) -> list[Step]:
    """The answers that may be chosen: every iteration's answer, the first drafts of
    refinements drafted once more (``redraft``) and answers cut off in their tests and
    asked again (``is_draft``), in the order they were made."""
    return [s for s in steps if is_draft(s)]


def _feedback_on(steps: Sequence[Step], iteration: int) -> Step | None:
    """The feedback on an iteration's answer: the latest, when a cut-off one was retried."""
    return next(
        (s for s in reversed(steps) if s.role == "feedback" and s.iteration == iteration), None
    )


def _copied(job: Job, output: str, found: list[str] | None, before: Step) -> str | None:
    """How a refinement hands its input back, or None: the same text or, for answers that
    carry their tests, the same code while checks still find problems (tests reworded
    around code that still fails them are no refinement of the code)."""
    if _normalized(output) == _normalized(before.output):
        return "identical to"
    if job.extract != "code-with-tests" or not found or not before.checks:
        return None
    code = artifacts.split(output)[0]
    same = _normalized(code) == _normalized(artifacts.split(before.output or "")[0])
    return "the same code as" if same else None


def _reaches_the_end(text: str, output: str) -> bool:
    """Whether the artifact runs to the end of the answer (so a cut-off answer cut it too).

    A program whose block was closed before the prose after it ran out is whole.
    """
    lines = output.rstrip().splitlines()
    return not lines or text.rstrip().endswith(lines[-1].rstrip())


def _retry_cut_off(steps: Sequence[Step]) -> bool:
    """Whether the last step is a feedback cut off at max_tokens for the first time."""
    last = steps[-1]
    return (
        last.role == "feedback"
        and last.error is not None
        and last.error.get("type") == LENGTH
        and not any(s.role == "feedback" and s.iteration == last.iteration for s in steps[:-1])
    )


def _passed_tests(answers: Sequence[Step]) -> dict[str, str]:
    """The tests (normalized -> source) that some answer passed, oldest first.

    Only answers whose evaluator lists their failing tests (code-with-tests jobs) count.
    """
    passed: dict[str, str] = {}
    for a in answers:
        failed = (a.metrics or {}).get(artifacts.FAILED_TESTS)
        if not isinstance(failed, list) or a.output is None:
            continue
        for unit in artifacts.split_tests(artifacts.split(a.output)[1]):
            key = artifacts.normalized(unit)
            if key not in failed:
                passed.setdefault(key, unit)
    return passed


def _breaks_passed_tests(answers: Sequence[Step]) -> set[int]:
    """Indices of answers that fail a test an earlier answer passed."""
    broken = set()
    for i, a in enumerate(answers):
        failed = (a.metrics or {}).get(artifacts.FAILED_TESTS)
        if isinstance(failed, list) and not _passed_tests(answers[:i]).keys().isdisjoint(failed):
            broken.add(i)
    return broken


def pooled(programs: Sequence[str], asked: artifacts.Terms | None = None) -> dict[str, Any]:
    """How many of the tests all ``programs`` carry each program's code passes, and how each
    behaves on calls near those the tests make.

    The value of the ``tests_pooled`` metric: ``{"total": tests, "passed": [per program],
    "behaviour": [per program], "agreement": [per program], "stray": [per program],
    "raised": [per program]}``. Code that does not parse, or fails before any test runs,
    passes none. A behaviour is a digest of what the code gave on every call of
    ``answers.probe_calls`` (equal digests: the same results on all of them), or None when
    the calls could not run; its agreement, how alike the other programs behave on those
    calls (``_agreement``); its stray count is how
    many of those calls, and of the same with a character foreign to a string argument
    (``answers.foreign_calls``), did what the request (its ``asked`` terms) does not ask
    for: raised an error it does not name (or a ``NameError``), changed an argument
    (``answers.stray_effect``; 0 when the calls did not run); its raised count, how many of
    them raised such an error.
    """
    asked = asked or artifacts.Terms()
    pool = artifacts.asked_tests(artifacts.pooled_tests(programs), asked)  # as the check does
    tests = [artifacts.must_raise(unit, asked.errors) for unit in pool]  # as the check runs them
    codes = [artifacts.split(program)[0] for program in programs]
    near = [*pool, *(e.test for e in asked.examples)]
    probes, foreign = artifacts.near_calls(codes, near)  # foreign: for the stray count only
    passed: list[int] = []
    behaviour: list[str | None] = []
    returned: list[Sequence[str] | None] = []  # what each code gave on the probe calls
    stray: list[int] = []
    raised: list[int] = []
    for code in codes:
        if not code.strip() or syntax_problem(code) is not None:
            passed.append(0)
            behaviour.append(None)
            returned.append(None)
            stray.append(0)
            raised.append(0)
            continue
        if pool:
            run = run_tests(code, tests)  # the limits the job's check ran its own tests under
            passed.append(0 if run.error is not None else run.passed)
        else:
            passed.append(0)
        results = run_calls(code, probes + foreign)
        returned.append(None if results is None else results[: len(probes)])
        behaviour.append(
            None
            if results is None
            else hashlib.sha256("\x00".join(results[: len(probes)]).encode()).hexdigest()[:16]
        )
        effects = [
            artifacts.stray_effect(call, result, asked)
            for call, result in zip(probes + foreign, results or (), strict=False)
        ]
        stray.append(sum(e is not None for e in effects))
        raised.append(sum(e is not None and artifacts.raised_error(e) is not None for e in effects))
    return {
        "total": len(pool),
        "passed": passed,
        "behaviour": behaviour,
        "agreement": _agreement(
            returned, [artifacts.normalized(code) for code in codes], asked.errors
        ),
        "stray": stray,
        "raised": raised,
    }


def _agreement(
    returned: Sequence[Sequence[str] | None],
    programs: Sequence[str],
    errors: frozenset[str] = frozenset(),
) -> list[float | None]:
    """For each program, how alike the other distinct programs behave on the probe calls:
    the sum, over every other program (a copy of its code, or of another's, counts once),
    of the share of the calls both answered where the answers are equal (``_answered``: a
    value returned, or one of the ``errors`` the request names raised); None where its
    calls did not run. Calls where either raised another error or ran out of time are left
    out: the probes vary the tests' arguments blindly, so many are inputs the request rules
    out, and which error a program raises there is no behaviour the request asks for.
    Programs written apart that agree are likelier right than one alone, and agreement in
    part counts: a program right where two others are wrong in the same way agrees with
    each of them, and with the rest, on most calls."""
    answered = [
        None if results is None else [_answered(r, errors) for r in results] for results in returned
    ]
    first: dict[str, list[str | None]] = {}  # what one program of each distinct code gave
    for program, given in zip(programs, answered, strict=True):
        if given is not None:
            first.setdefault(program, given)
    out: list[float | None] = []
    for program, mine in zip(programs, answered, strict=True):
        if mine is None:
            out.append(None)
            continue
        total = 0.0
        for other, theirs in first.items():
            if other == program:
                continue
            both = [
                (a, b)
                for a, b in zip(mine, theirs, strict=False)
                if a is not None and b is not None
            ]
            if both:
                total += sum(a == b for a, b in both) / len(both)
        out.append(round(total, 6))
    return out


def _answered(result: str, errors: frozenset[str]) -> str | None:
    """What a probe call's result (``run_calls``) answers the request: the value it
    returned, or that it raised one of the ``errors`` the request names (any of them: which
    one is no behaviour), None where it raised another error or ran out of time."""
    if result == "timeout":
        return None
    error = artifacts.raised_error(result)
    if error is None:
        return result
    return "raises a named error" if error.names & errors else None


def _pool(answers: Sequence[Step]) -> tuple[int, list[int]] | None:
    """The pooled tests as the last answer's evaluation ran them: how many there are and how
    many each answer passes; None when it did not (no tests ran, a trace written before)."""
    value = (answers[-1].metrics or {}).get(artifacts.POOLED_TESTS)
    if not isinstance(value, dict):
        return None
    total, passed = value.get("total"), value.get("passed")
    if not isinstance(total, int) or not isinstance(passed, list) or len(passed) != len(answers):
        return None
    return (total, passed) if all(isinstance(p, int) for p in passed) else None


def _behaviour(answers: Sequence[Step]) -> list[str | None] | None:
    """Each answer's behaviour digest as the last answer's evaluation recorded it (see
    ``pooled``); None when it did not (a trace written before)."""
    digests = _recorded(answers, "behaviour")
    return None if digests is None else [d if isinstance(d, str) else None for d in digests]


def _recorded(answers: Sequence[Step], key: str) -> list[Any] | None:
    """One value per answer of the pooled-tests metric ``key``, as the last answer's
    evaluation recorded it (see ``pooled``); None when it did not (a trace written before
    that key, or before the metric)."""
    value = (answers[-1].metrics or {}).get(artifacts.POOLED_TESTS)
    values = value.get(key) if isinstance(value, dict) else None
    if not isinstance(values, list) or len(values) != len(answers):
        return None
    return values


def _stray(answers: Sequence[Step], key: str = "stray") -> list[int] | None:
    """How many of the calls near the tests each answer made do what the request does not
    ask for (raise an error it does not name, change an argument; with ``key="raised"``,
    only the first), as the last answer's evaluation recorded it (see ``pooled``); None
    when it did not (a trace written before)."""
    counts = _recorded(answers, key)
    return None if counts is None else [c if isinstance(c, int) else 0 for c in counts]


def _normalized(text: str | None) -> str:
    return " ".join((text or "").split())


def _score(job: Job, step: Step | None) -> float | None:
    if step is None or step.parsed is None or job.score_field is None:
        return None
    value = step.parsed.get(job.score_field)
    return float(value) if isinstance(value, int | float) else None


def _verdict(job: Job, feedback: Step, answer: Step | None, t: int, min_iters: int) -> Stop | None:
    """Whether the critic's feedback on iteration ``t``'s answer stops the loop: done, then score.

    The critic's verdict counts only after ``min_iters`` refinements, and never while a
    check the program ran still finds problems in the answer.
    """
    if t < min_iters or (answer is not None and answer.checks):
        return None
    parsed = feedback.parsed
    if parsed is not None and parsed.get(job.done_field) is True:
        return Stop("done")
    score = _score(job, feedback)
    if job.score_threshold is not None and score is not None and score >= job.score_threshold:
        return Stop("score_threshold")
    return None


def plan(
    steps: Sequence[Step], job: Job, max_iters: int, min_iters: int = 0
) -> tuple[Role, int] | Stop:
    """The next call to make, or why the loop stops.

    The stop rules, first that holds: the critic's ``done``; score >= the job's threshold;
    ``max_iters`` refinements made; the refinement is identical to its input. Feedback is
    asked on every answer before the last; on the last answer only when the job scores,
    so the best-scored iteration can be chosen. A refinement identical to its input is
    not shown to the critic again: the feedback on its input stands for it. An answer
    or a feedback cut off at max_tokens is asked once more before anything else.
    """
    if not steps:
        return ("generate", 0)
    last = steps[-1]
    t = last.iteration
    if is_cut_retry(last):
        return (last.role, t)  # the same messages once more, with a repetition penalty
    if is_copy(last):
        return ("refine", t)  # the copy guard's one retry, at a higher temperature
    if is_redraft(last):
        return ("refine", t)  # the same messages once more: another draft
    if _retry_cut_off(steps):
        return ("feedback", t)  # one retry, with a repetition penalty
    if last.role == "feedback":
        answer = next((a for a in _answers(steps) if a.iteration == t), None)
        verdict = _verdict(job, last, answer, t, min_iters)
        if verdict is not None:
            return verdict
        if t >= max_iters:
            return Stop("max_iters")
        return ("refine", t + 1)
    answers = _answers(steps)
    if last.role == "refine" and len(answers) >= 2:
        before, now = answers[-2], answers[-1]
        if _normalized(now.output) == _normalized(before.output):
            earlier = _feedback_on(steps, before.iteration)
            verdict = None if earlier is None else _verdict(job, earlier, now, t, min_iters)
            if verdict is not None:
                return verdict
            return Stop("max_iters" if t >= max_iters else "no_change")
    if max_iters == 0 or (t >= max_iters and not job.scored):
        return Stop("max_iters")
    return ("feedback", t)


def choose(steps: Sequence[Step], job: Job) -> tuple[int | None, float | None, list[float | None]]:
    """The chosen iteration, its score and every iteration's score (see ``chosen``)."""
    step, score, scores = chosen(steps, job)
    return (None if step is None else step.iteration), score, scores


def chosen(steps: Sequence[Step], job: Job) -> tuple[Step | None, float | None, list[float | None]]:
    """The chosen answer, its score and every iteration's score.

    The candidates are the drafts (``_drafts``): every iteration's answer, the first
    draft of a refinement drafted once more and an answer cut off in its tests and asked
    again (``is_draft``); the last two have no feedback and so no score.

    Where the request states examples (``"userId" -> "user_id"``: ``examples``), only the
    answers getting the most of them right stay. Of those, an answer that fails a test an
    earlier answer passed is never chosen (unless all of them do). Where the
    answers carry tests, those that on the calls near the tests never raise an error the
    request does not name, where it names the errors to raise (a ``KeyError`` where it
    names ``ValueError``), nor a ``NameError`` whatever it names (a name the code never
    bound), stay, if any: like its examples, that is the request's own word,
    checked by running the code, where the pooled tests are the model's, some of them
    wrong. The rest are judged on all the tests any of them wrote (the pooled tests):
    only those passing the most of them stay, or, where no answer passes them all and they
    are many, a few fewer (``_slack``: one of many tests the model wrote is as
    likely wrong as the code; where one passes them all, an answer cut off and asked
    again stays only where none other does: it wins on what running it showed, not on
    the tie-breaks that follow), of those the ones that on the calls near the tests never
    do what the request does not ask (raise such an error, sort the caller's list while
    returning a median, where it does not ask for work in place), if any: how often
    counts for nothing where all of them do (a wrong answer that marks the caller's grid
    on fewer calls is not the more faithful, only the one doing less), and
    when none passes them all, the one whose answers on those calls (values, errors the
    request names) the other distinct drafts agree with most, of those the one passing
    the most pooled tests, of those one not cut off, the earliest of those
    (``_most_agreed``: a cut-off answer's code is whole, and its agreement is evidence as
    any other's), is chosen: a refinement
    replaces an earlier answer only on what running them showed, never on a critic's
    score alone, nor on passing its own checks (which it may do by dropping the tests it
    failed). Among the rest, those that pass the job's checks are candidates; when none
    does, those that pass the most of their own tests that ran (a test left out as no
    test of what the request asks passes nothing; all of them for answers without tests,
    or when the job has no checks). Where the answers carry tests, a later
    candidate stays one only if it behaves as the earliest does on the calls near the
    tests (``pooled``'s behaviour digests; where none of them wrote a test that runs,
    nothing shows that, and the earliest candidate stays). The best-scored candidate
    wins, ties going to the later one; without scores, the last.
    """
    answers = _drafts(steps)
    if not answers:
        return None, None, []
    feedback = {s.iteration: s for s in steps if s.role == "feedback"}
    scores = [_score(job, feedback.get(a.iteration)) if is_answer(a) else None for a in answers]
    by_iteration = [sc for a, sc in zip(answers, scores, strict=True) if is_answer(a)]
    kept = list(range(len(answers)))
    examples = _examples_passed(answers)
    if examples is not None:  # the request's own examples first: right by definition
        most = max(examples)
        kept = [i for i in kept if examples[i] == most]
    broken = _breaks_passed_tests(answers)
    # Without examples never empty (0 breaks nothing); with them, all may break a test.
    kept = [i for i in kept if i not in broken] or kept
    pool = _pool(answers)
    if pool is not None:
        total, passed = pool
        raised = _stray(answers, "raised")
        if raised is not None:  # the request's word before the model's tests: see above
            kept = [i for i in kept if raised[i] == 0] or kept
        most = max(passed[i] for i in kept)
        # Many tests, none passing them all: a test or two more is within the model's own
        # mistaken tests, and agreement decides among those within it (see above).
        slack = _slack(total) if most < total else 0
        kept = [i for i in kept if passed[i] >= most - slack]
        if most == total:  # below, a cut-off answer is weighed with the rest (_most_agreed)
            kept = _uncut(answers, kept)
        stray = _stray(answers)
        if stray is not None:  # then those doing nothing the request does not ask, if any
            kept = [i for i in kept if stray[i] == 0] or kept
        if most < total:  # no answer passes every test written: the tests decide, not the critic
            pick = _most_agreed(answers, kept, passed)
            return answers[pick], scores[pick], by_iteration
    kept = _uncut(answers, kept)
    passing = [i for i in kept if answers[i].checks == []]
    candidates = passing or _most_tests_passed(answers, kept)
    behaviour = _behaviour(answers) if pool is not None else None
    if behaviour is not None:
        # Passing every test written, a later answer replaces the earliest candidate only
        # when it does the same on calls near those the tests make: a faster or clearer
        # refinement, not one that changed what no test asserts.
        first = behaviour[candidates[0]]  # None: its calls did not run, so none is like it
        if pool is not None and pool[0] == 0:
            first = None  # no test to run: nothing shows a later answer does the same
        candidates = [
            i
            for i in candidates
            if i == candidates[0] or (first is not None and behaviour[i] == first)
        ]
    best: int | None = None
    for i in candidates:
        sc = scores[i]
        if sc is not None and (best is None or sc >= (scores[best] or 0.0)):
            best = i
    if best is None:
        return answers[candidates[-1]], None, by_iteration
    return answers[best], scores[best], by_iteration


def _slack(total: int) -> int:
    """How many pooled tests fewer than the most an answer may pass and stay in the choice
    where none passes all ``total``: none below ``MANY_POOLED_TESTS``, else one in eight
    of them, at least one and at most two (a few wrong tests the model wrote, not a
    share that lets answers failing much of what was written outvote the rest)."""
    if total < MANY_POOLED_TESTS:
        return 0
    return min(2, max(1, total // 8))


def _most_agreed(answers: Sequence[Step], kept: Sequence[int], passed: Sequence[int]) -> int:
    """Of ``kept`` (within ``_slack`` tests of each other on what running them showed),
    the answer whose behaviour on the calls near the tests the other distinct programs
    among all the drafts agree with most (``pooled``'s agreement), of those the ones
    passing the most pooled tests (``passed``), of those one not cut off (the answer asked
    in its place stands for it), the earliest of those. Drafts written apart that agree on
    what they return are likelier right than one alone (a wrong answer is wrong in its own
    way); a copy of an answer is one program, not a second vote; an answer cut off in its
    tests has whole code, and its agreement counts as any other's. In a trace written
    before the agreement was recorded, the number of distinct programs sharing the
    answer's behaviour digest stands for it; where no behaviour was recorded, nothing
    does."""
    votes: list[float]
    agreement = _recorded(answers, "agreement")
    if agreement is not None:
        votes = [float(a) if isinstance(a, int | float) else -1.0 for a in agreement]
    elif (behaviour := _behaviour(answers)) is not None:
        programs: dict[str, set[str]] = {}
        for a, digest in zip(answers, behaviour, strict=True):
            if digest is not None and a.output is not None:
                programs.setdefault(digest, set()).add(
                    artifacts.normalized(artifacts.split(a.output)[0])
                )
        votes = [float(len(programs.get(d or "", ()))) for d in behaviour]
    else:
        votes = [0.0] * len(answers)
    return max(kept, key=lambda i: (votes[i], passed[i], not is_cut_retry(answers[i]), -i))


def _uncut(answers: Sequence[Step], kept: list[int]) -> list[int]:
    """``kept`` without answers cut off and asked again, unless only those are left: such
    an answer wins on what running it showed (the request's examples and errors, the pooled
    tests), never on a tie-break among answers passing every pooled test, where the answer
    asked in its place stands for it (where none passes them all, how far the others agree
    with it is what running it showed: ``_most_agreed``)."""
    return [i for i in kept if not is_cut_retry(answers[i])] or kept


def _examples_passed(answers: Sequence[Step]) -> list[int] | None:
    """How many of the request's stated examples each answer gets right, as its evaluation
    counted them; None when the request states none (or a trace written before)."""
    counts = [(a.metrics or {}).get(artifacts.EXAMPLES_PASSED) for a in answers]
    if not all(isinstance(c, int) for c in counts):
        return None
    return [c for c in counts if isinstance(c, int)]


def _most_tests_passed(answers: Sequence[Step], kept: Sequence[int]) -> list[int]:
    """Of ``kept``, the answers passing the most of their own tests that ran (a critic's
    score is no evidence against a test that ran; a test left out as no test of what the
    request asks, one contradicting its signature, say, ran and passed nothing)."""
    counts = {i: _tests_passed(answers[i]) for i in kept}
    most = max(counts.values())
    return [i for i in kept if counts[i] == most]


def _tests_passed(answer: Step) -> int:
    """How many of the answer's own tests ran and passed (its ``tests_passed``; in a trace
    written before that metric, those of its tests not listed as failing)."""
    passed = (answer.metrics or {}).get(artifacts.PASSED_TESTS)
    return passed if isinstance(passed, int) else len(_passed_tests([answer]))


def summed_score(parsed: Mapping[str, Any], fields: Sequence[str]) -> float | None:
    """The sum of the rating fields, or None when one is missing or not a number."""
    total = 0.0
    for f in fields:
        value = parsed.get(f)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        total += value
    return total


def _field_text(value: Any, join: str = ", ") -> str:
    if value is None:  # an absent optional field, or null
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return join.join(value)
    return orjson.dumps(value).decode()


def feedback_text(job: Job, step: Step) -> str:
    critic = render_feedback(
        step.parsed,
        step.response or "",
        actions_field=job.actions_field,
        done_field=job.done_field,
        score_field=job.score_field,
    )
    checked = [f["text"] for f in step.findings or () if f["source"] == "check"]
    if not checked:
        return critic
    # The check findings come last, nearest the instruction that follows {{feedback}}: a
    # small model heeds what it read last. scripts/refine_prompts.py, 1.5B local model,
    # 20 CommonGen-Hard drafts, one refinement: +15.4 coverage points with the findings
    # after the critic's notes, +12.5 with the same findings before them.
    lines = ["Problems found by running automatic checks on the answer (fix these first):"]
    lines += [f"- {text}" for text in checked]
    return critic + "\n\n" + "\n".join(lines)


def findings_text(job: Job, step: Step) -> str:
    """``{{findings}}``: what the checks found in the answer, one per line; without any,
    the critic's actions."""
    items = step.findings or findings(job, None, step.parsed)
    checked = [f["text"] for f in items if f["source"] == "check"]
    return _bullets(checked or [f["text"] for f in items if f["source"] == "critic"])


def _bullets(items: Sequence[str]) -> str:
    """Findings as a prompt shows them: one "- " line each, or "(none)"."""
    return "\n".join(f"- {text}" for text in items) if items else "(none)"


def checks_text(answer: Step) -> str:
    """A feedback prompt's ``{{findings}}``: what the checks found in the answer it reviews
    (a failing test with the value the code gave, an exception), so the critic judges a
    run, not only a reading; "(none)" when they found nothing."""
    if answer.checks is None:
        return "(not checked)"
    return _bullets(answer.checks)


def findings(
    job: Job, answer: Step | None, parsed: Mapping[str, Any] | None
) -> list[dict[str, str]]:
    """The feedback items a refine step sees, each with its source: ``check`` or ``critic``."""
    items = [{"source": "check", "text": t} for t in (answer.checks if answer else None) or ()]
    actions = (parsed or {}).get(job.actions_field) or []
    items += [{"source": "critic", "text": str(a)} for a in actions]
    return items


def render_history(job: Job, steps: Sequence[Step], upto: int) -> str:
    """Every (answer, feedback) pair with iteration < ``upto``, oldest first."""
    feedback = {s.iteration: s for s in steps if s.role == "feedback"}
    parts = []
    for a in _answers(steps):
        if a.iteration >= upto or a.iteration not in feedback:
            continue
        parts.append(
            f"### Attempt {a.iteration}\n{a.output}\n\n"
            f"### Feedback on attempt {a.iteration}\n{feedback_text(job, feedback[a.iteration])}"
        )
    return "\n\n".join(parts) if parts else "(no earlier attempts)"


def build_messages(
    job: Job, record: Record, role: Role, iteration: int, steps: Sequence[Step]
) -> list[dict[str, str]]:
    """The chat messages for one call, exactly as they will be sent."""
    if steps and is_cut_retry(steps[-1]) and steps[-1].role == role:
        return [dict(m) for m in steps[-1].messages]  # asked again exactly as it was
    values = {f.name: _field_text(record.fields.get(f.name), f.join) for f in job.inputs}
    if role == "generate":
        prompt = render(job.generate_prompt, values)
    else:
        answers = {s.iteration: s for s in _answers(steps)}
        base = iteration if role == "feedback" else iteration - 1
        values["output"] = answers[base].output or ""
        if role == "feedback":
            values["findings"] = checks_text(answers[base])
            prompt = render(job.feedback_prompt, values)
        else:
            fb = _feedback_on(steps, base)
            assert fb is not None  # plan asks for a refinement only after its feedback
            values["feedback"] = feedback_text(job, fb)
            values["history"] = render_history(job, steps, base)
            values["findings"] = findings_text(job, fb)
            template = job.refine_prompt
            if steps and is_copy(steps[-1]) and job.copy_prompt:
                template = job.copy_prompt
            elif job.failing_prompt and _rewrite(job, answers[base].checks):
                template = job.failing_prompt  # the checks found problems in the answer
            prompt = render(template, values)
    messages = []
    if job.system_prompt:
        messages.append({"role": "system", "content": render(job.system_prompt, values)})
    messages.append({"role": "user", "content": prompt})
    return messages


def _rewrite(job: Job, checks: Sequence[str] | None) -> bool:
    """Whether the checks' findings on an answer call for ``job.failing_prompt``: any
    finding does, unless the job's rewrite hook says these do not (a broken hook: they do)."""
    if not checks:
        return False
    if job.rewriter is None:
        return True
    try:
        return bool(job.rewriter(checks))
    except Exception:  # a broken hook changes which prompt is asked, never crashes a record
        return True


# -- the async loop ----------------------------------------------------------------------------


def _evaluate_sync(
    job: Job, record: Record, output: str, checks: bool
) -> tuple[dict[str, Any] | None, list[str] | None]:
    metrics: dict[str, Any] | None = None
    found: list[str] | None = None
    if job.evaluator is not None:
        try:
            metrics = dict(job.evaluator(record.fields, output))
        except Exception as err:  # a broken evaluator is recorded, never a crash
            metrics = {"error": f"{type(err).__name__}: {err}"}
    if checks and job.checker is not None:
        try:
            found = [str(f) for f in job.checker(record.fields, output)]
        except Exception as err:  # a broken check is recorded, and passes
            metrics = {**(metrics or {}), "check_error": f"{type(err).__name__}: {err}"}
            found = []
    return metrics, found


async def _evaluate(
    job: Job, record: Record, output: str, checks: bool
) -> tuple[dict[str, Any] | None, list[str] | None]:
    if job.evaluator is None and (job.checker is None or not checks):
        return None, None
    # Evaluators and checks may run a subprocess (program-aided answers): keep the
    # event loop free.
    return await anyio.to_thread.run_sync(_evaluate_sync, job, record, output, checks)


def next_call(job: Job, record: Record, steps: Sequence[Step], policy: Policy) -> Call | Stop:
    """The record's next call as it will be sent, or why its loop stops."""
    nxt = plan(steps, job, policy.max_iters, policy.min_iters)
    if isinstance(nxt, Stop):
        return nxt
    role, iteration = nxt
    again = bool(steps) and is_cut_retry(steps[-1])
    cut = again or (bool(steps) and _retry_cut_off(steps))
    # A copy's retry runs hotter, a later draft at its own temperature where the job sets
    # one; a cut-off answer is asked again as its call was made.
    before = steps[:-1] if again else steps
    temperature = job.temperature
    if before and is_copy(before[-1]):
        temperature = job.copy_temperature
    elif job.redraft_temperature is not None and before and is_redraft(before[-1]):
        temperature = job.redraft_temperature
    return Call(
        role=role,
        iteration=iteration,
        messages=build_messages(job, record, role, iteration, steps),
        schema=job.feedback_schema if role == "feedback" else None,
        temperature=temperature,
        max_tokens=job.max_tokens,
        frequency_penalty=RETRY_FREQUENCY_PENALTY if cut else None,
    )


def _usage(comp: Completion) -> dict[str, int]:
    usage = {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens}
    if comp.cached_tokens:
        usage["cached_tokens"] = comp.cached_tokens
    return usage


async def make_step(
    job: Job,
    record: Record,
    call: Call,
    comp: Completion,
    steps: Sequence[Step],
    checks: bool,
) -> Step:
    """The step a completed call becomes: feedback parsed, or the answer extracted and checked."""
    role, iteration = call.role, call.iteration
    messages = comp.messages if comp.messages is not None else call.messages
    error: dict[str, Any] | None = None
    if comp.finish_reason == "length":
        error = {"type": LENGTH, "message": "answer cut off at max_tokens (finish_reason=length)"}
    common: dict[str, Any] = {
        "usage": _usage(comp),
        "latency_s": comp.latency_s,
        "attempts": comp.attempts,
        "model": comp.model,
        "tries": comp.tries,
        "batch_id": comp.batch_id,
    }
    if role == "feedback":
        parsed: dict[str, Any] | None
        try:
            parsed = parse_feedback(
                comp.text,
                actions_field=job.actions_field,
                done_field=job.done_field,
                score_field=job.score_field,
            )
        except FeedbackParseError as err:
            parsed = None
            if error is None:  # a cut-off feedback is retried, not a parse failure
                error = {"type": "feedback_parse", "message": str(err)}
        if parsed is not None and job.score_from and job.score_field is not None:
            parsed[job.score_field] = summed_score(parsed, job.score_from)
        answer = next((a for a in _answers(steps) if a.iteration == iteration), None)
        return Step(
            role,
            iteration,
            messages,
            comp.text,
            parsed,
            error=error,
            findings=findings(job, answer, parsed)
            if answer and answer.checks is not None
            else None,
            **common,
        )
    output = artifacts.extract(comp.text, job.extract)
    answers = _answers(steps)
    cut_off = comp.finish_reason == "length" and _reaches_the_end(comp.text, output)
    if cut_off and job.extract == "code-with-tests" and not comp.text.endswith("\n"):
        output = artifacts.without_unfinished_test(output)
    # What the request asks (read once): for the tests carried and the pooled tests.
    asked = artifacts.terms(record.fields) if job.extract == "code-with-tests" else None
    if role == "refine" and asked is not None:
        # Tests an earlier answer passed stay with every later one, so a refinement that
        # breaks them is seen to (and, by choose, is never the chosen answer).
        # (Only tests of what the request asks: one left out by the check never ran.)
        kept = artifacts.asked_tests(_passed_tests(answers).values(), asked)
        output = artifacts.carry_tests(output, kept)
    metrics, found = await _evaluate(job, record, output, checks)
    if checks and cut_off:
        found = [*(found or []), CUT_OFF]  # a verified problem: the refine step shortens it
    copied = (
        _copied(job, output, found, answers[-1])
        if role == "refine" and job.retry_copy and answers
        else None
    )
    retry_copy = copied and not any(is_copy(s) and s.iteration == iteration for s in steps)
    if not retry_copy and metrics is not None and artifacts.FAILED_TESTS in metrics:
        # An answer (not a copy to retry) whose tests ran, a cut-off one too (a candidate:
        # ``is_draft``): how it and every earlier draft fare on the tests all of them
        # wrote, for choose.
        programs = [d.output or "" for d in _drafts(steps)] + [output]
        if asked is None:
            asked = artifacts.terms(record.fields)
        pool = await anyio.to_thread.run_sync(pooled, programs, asked)
        metrics[artifacts.POOLED_TESTS] = pool
    if retry_copy:
        error = {
            "type": COPY,
            "message": f"{copied} its input; retried once at temperature {job.copy_temperature:g}",
        }
    elif cut_off and not any(
        is_cut_retry(s) and s.role == role and s.iteration == iteration for s in steps
    ):
        error = {
            "type": CUT_RETRY,
            "message": "answer cut off at max_tokens (finish_reason=length); asked once more "
            f"with frequency penalty {RETRY_FREQUENCY_PENALTY:g}",
        }
    else:
        if (
            job.redraft
            and role == "refine"
            and found
            and error is None
            and sum(is_retried(s) and s.iteration == iteration for s in steps) < job.redraft
        ):
            error = {
                "type": REDRAFT,
                "message": f"checks found {len(found)} problem(s); drafted once more "
                "from the same messages (this draft stays a candidate)",
            }
    return Step(
        role,
        iteration,
        messages,
        comp.text,
        None,
        error=error,
        output=output,
        metrics=metrics,
        checks=found,
        **common,
    )


def failed_step(call: Call, err: CallError) -> Step:
    """A call that failed for good, as its trace shows it: no response, the error, each try."""
    return Step(
        call.role,
        call.iteration,
        err.messages if err.messages is not None else call.messages,
        None,
        None,
        {"prompt_tokens": 0, "completion_tokens": 0},
        round(sum(t.latency_s for t in err.tries), 4),
        err.attempts,
        error=err.as_dict(),
        model=err.model,
        tries=tuple(err.tries),
    )


def finish(
    job: Job,
    record: Record,
    steps: Sequence[Step],
    reason: str,
    error: dict[str, Any] | None = None,
) -> Outcome:
    """The record's outcome from its steps: the chosen answer, and why the loop stopped."""
    answer, score, scores = chosen(steps, job)
    output = answer.output if answer is not None else None
    tests = None
    if output is not None and job.extract == "code-with-tests":
        output, tests = artifacts.split(output)
    return Outcome(
        record=record,
        status="failed" if error else "done",
        output=output,
        iterations=max((s.iteration for s in _answers(steps) if s.role == "refine"), default=0),
        chosen_iteration=None if answer is None else answer.iteration,
        stop_reason=reason,
        score=score,
        steps=tuple(steps),
        error=error,
        scores=tuple(scores),
        tests=tests,
        chosen_step=None if answer is None else next(i for i, s in enumerate(steps) if s is answer),
    )


def call_failed(
    job: Job, record: Record, steps: Sequence[Step], call: Call, err: CallError
) -> Outcome:
    """The outcome of a record whose call failed for good: failed, the call in its trace."""
    error = {"type": err.kind, "message": f"{call.role} (iteration {call.iteration}): {err}"}
    return finish(job, record, [*steps, failed_step(call, err)], "error", error)


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
        # Passed only when set, so clients written without the keyword keep working.
        options: dict[str, Any] = call.sampling()
        try:
            comp = await model.complete(
                call.messages,
                schema=call.schema,
                temperature=call.temperature,
                max_tokens=call.max_tokens,
                **options,
            )
        except FatalCallError:
            raise
        except CallError as err:
            if err.model is None:
                err.model = model.model
            return call_failed(job, record, steps, call, err)
        if comp.model is None:
            comp = replace(comp, model=model.model)
        step = await make_step(job, record, call, comp, steps, policy.checks)
        await sink.save(record.id, len(steps), step)
        steps.append(step)
