#!/usr/bin/env python3
"""A finished code-improve run of the quality suite, its output chosen again by this checkout.

Choosing a record's output makes no model call, so ``choose`` over a run's traced steps is
exactly what this checkout would have written for the same answers (the pooled tests a run
made before they were recorded are run here, as the loop now runs them). For each RUN_DIR
(from ``scripts/quality.py --tasks code --work DIR``) prints the hidden tests passed at
iteration 0, by the run's own output, by the output chosen again, chosen again without the
request's stated examples (the same steps without their metric), chosen again without the
rule that keeps out an answer failing a test an earlier answer passed, by the previous rule
(the same steps without the pooled-tests metric) and by the best answer of each record (what a
reader knowing the hidden tests would pick), the requests gained and lost against
iteration 0, the calls (copy retries among them) and tokens it used, how many answers ran
into max_tokens (and how many attempts cut off there were asked again), the answers the
rule on tests passed before kept out (how many of them right, in how many records, and how
many of those records are chosen right anyway), the later drafts
of refinements drafted again (how many were right where every earlier draft of their
iteration was wrong, how many wrong where the one before was right), the distinct tests
contradicting the request's signature or its examples, and how many answers get all the
request's examples right (and how many of those, and of the others, pass the hidden
tests), and how often a refinement of code failing the hidden tests passes them, by the
prompt it answered (an edit showing that code, a fresh start from the findings without it,
the copy guard's retry), and what the critic wrote (feedbacks with a blank ``correctness``,
the answers it accepts, right or wrong, with findings or without, the loops it stopped);
given several runs, the totals over all of them.

With ``--recheck``, every answer is first checked again by this checkout's hooks (its
tests split and run as this checkout would, its findings and pooled tests with them):
what this checkout would have chosen had it checked the same answers.

With ``--suite FILE``, the runs are of another suite's requests (``scripts/quality.py
--suite FILE``), scored by the hidden tests beside it.

Usage: scripts/choose_again.py [--recheck] [--suite FILE] RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Self, cast
from unittest import mock

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from quality import SUITE, BySuiteId, hidden_pass, hidden_path, load_hidden  # noqa: E402

from pipeline import loop  # noqa: E402
from pipeline.answers import (  # noqa: E402
    EXAMPLES_PASSED,
    FAILED_TESTS,
    POOLED_TESTS,
    normalized,
    split,
    split_tests,
    terms,
)
from pipeline.calls import Step, is_answer, is_copy, is_cut_retry, is_draft, is_redraft  # noqa: E402
from pipeline.examples import contradicted  # noqa: E402
from pipeline.jobs import Job, load_job  # noqa: E402
from pipeline.loop import CUT_OFF, chosen, pooled  # noqa: E402
from pipeline.signatures import contradiction  # noqa: E402


def with_pool(
    steps: list[Step], job: Job | None = None, fields: Mapping[str, Any] | None = None
) -> list[Step]:
    """``steps`` with the pooled-tests metric the loop now records on every answer, where a
    run made before it did not (the answers' tests are in the trace: no call is needed).

    Given the ``job``, every answer is checked again by this checkout's evaluate and check
    hooks (its metrics, findings and pooled tests as this checkout would record them), for
    the record's ``fields`` (the request).
    """
    fields = fields or {}
    out: list[Step] = []
    programs: list[str] = []
    for step in steps:
        if is_draft(step) and step.metrics is not None and FAILED_TESTS in step.metrics:
            if job is not None:
                step = rechecked(step, job, fields)
            programs.append(step.output or "")
            metrics = step.metrics or {}
            if POOLED_TESTS not in metrics:
                pool = pooled(programs, terms(fields))
                step = replace(step, metrics={**metrics, POOLED_TESTS: pool})
        out.append(step)
    return out


def rechecked(step: Step, job: Job, fields: Mapping[str, Any]) -> Step:
    """The answer as this checkout's hooks evaluate and check it (the run's finding that the
    reply was cut off kept: it is the loop's, not a hook's)."""
    assert job.evaluator is not None and job.checker is not None
    output = step.output or ""
    cut = [CUT_OFF] if CUT_OFF in (step.checks or ()) else []
    return replace(
        step,
        metrics=dict(job.evaluator(fields, output)),
        checks=[str(f) for f in job.checker(fields, output)] + cut,
    )


def without(steps: list[Step], key: str = POOLED_TESTS) -> list[Step]:
    """``steps`` without the metric ``key``: as the previous choice rule saw them (no
    pooled tests), or as the rule sees them where no example is read (EXAMPLES_PASSED)."""
    return [
        replace(s, metrics={k: v for k, v in s.metrics.items() if k != key}) if s.metrics else s
        for s in steps
    ]


def chosen_unbroken(steps: Sequence[Step], job: Job) -> Step | None:
    """The answer ``chosen`` would pick were no answer kept out for failing a test an
    earlier answer passed (the rule read alone: where the earlier answer's test is wrong, it
    keeps a right refinement out)."""
    with mock.patch.object(loop, "_breaks_passed_tests", return_value=set()):
        return chosen(steps, job)[0]


def _passes(passes: Mapping[int, bool], steps: Sequence[Step], step: Step | None) -> bool:
    """Whether the chosen ``step`` (one of ``steps``) passes the hidden tests."""
    return step is not None and passes.get(next(i for i, s in enumerate(steps) if s is step), False)


def added(mine: Any, theirs: Any) -> Any:
    """``theirs`` added to ``mine``: a tally by its ``merge``, a Counter's counts by
    ``update`` (``+`` would drop counts of 0), a dict key by key and a tuple item by item,
    a number or a list by ``+``. A tally or a Counter is added to in place and returned."""
    if isinstance(mine, Summed):
        mine.merge(theirs)
    elif isinstance(mine, Counter):
        mine.update(theirs)
    elif isinstance(mine, dict):
        return {key: added(mine[key], theirs[key]) for key in mine}
    elif isinstance(mine, tuple):
        return tuple(added(a, b) for a, b in zip(mine, theirs, strict=True))
    else:
        return mine + theirs
    return mine


class Summed:
    """A tally whose fields all add up over runs: ``merge`` adds another's, field by field
    (by ``added``)."""

    def merge(self, other: Self) -> None:
        for f in fields(cast(Any, self)):
            setattr(self, f.name, added(getattr(self, f.name), getattr(other, f.name)))


@dataclass
class Tally(Summed):
    """Hidden-test passes of one way of choosing, with the requests gained and lost."""

    passed: int = 0
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def add(self, rid: str, now: bool, at_0: bool) -> None:
        self.passed += now
        if now and not at_0:
            self.gained.append(rid)
        if at_0 and not now:
            self.lost.append(rid)

    def text(self, n: int, named: bool = True) -> str:
        def ids(rids: list[str]) -> str:
            return f" ({', '.join(rids) or '-'})" if named else ""

        return (
            f"{self.passed}/{n}, gained {len(self.gained)}{ids(self.gained)}, "
            f"lost {len(self.lost)}{ids(self.lost)}"
        )


# iteration 0, the run's own output, chosen again, chosen again without the request's
# examples, without the rule on tests passed before, the previous rule, the best answer
RULES = ("first", "output", "again", "no_examples", "unbroken", "previous", "best")
SHOWN = {
    "output": "the run's output",
    "again": "chosen again",
    "no_examples": "without the request's examples",
    "unbroken": "without the rule on tests passed before",
    "previous": "the previous rule (no pooled tests)",
    "best": "the best answer of each record",
}


@dataclass
class Drafts(Summed):
    """The later drafts of refinements drafted again (``is_redraft``), by their place among
    their iteration's drafts (2: the second): how many were made, how many passed the hidden
    tests where every earlier draft of their iteration failed them, and how many failed
    them where the draft before passed."""

    made: Counter[int] = field(default_factory=Counter)
    righted: Counter[int] = field(default_factory=Counter)
    wronged: int = 0

    def add(self, steps: Sequence[Step], passes: Mapping[int, bool]) -> None:
        """One record's steps; ``passes``: whether each draft (by its index) passes."""
        for t in {steps[i].iteration for i in passes if is_redraft(steps[i])}:
            drafts = sorted(
                i
                for i in passes
                if steps[i].iteration == t
                and steps[i].role == "refine"
                and not is_cut_retry(steps[i])  # asked again as it was: no redraft
            )
            for k in range(1, len(drafts)):
                place, now = k + 1, passes[drafts[k]]
                self.made[place] += 1
                if now and not any(passes[d] for d in drafts[:k]):
                    self.righted[place] += 1
                self.wronged += passes[drafts[k - 1]] and not now

    def text(self) -> str:
        places = sorted(self.made)
        made = ", ".join(f"{_ORDINAL.get(p, f'{p}th')} {self.made[p]}" for p in places)
        righted = ", ".join(f"{_ORDINAL.get(p, f'{p}th')} {self.righted[p]}" for p in places)
        return (
            f"later drafts: {sum(self.made.values())}"
            + (f" ({made})" if made else "")
            + f"; right where every earlier draft of their iteration was wrong: {righted or 0}"
            + f"; wrong where the draft before was right: {self.wronged}"
        )


_ORDINAL = {2: "second", 3: "third"}


@dataclass
class KeptOut(Summed):
    """The answers the rule on tests passed before keeps out (each fails a test an earlier
    answer of its record passed), how many of them pass the hidden tests, the records with
    such a right answer and how many of those are chosen right anyway."""

    answers: int = 0
    right: int = 0
    records: int = 0
    chosen_right: int = 0

    def add(self, steps: Sequence[Step], passes: Mapping[int, bool], again: bool) -> None:
        """One record's steps; ``passes``: whether each draft (by its index) passes;
        ``again``: whether the answer chosen again does."""
        drafts = sorted(passes)  # the drafts in the order the loop reads them
        out = [drafts[k] for k in loop._breaks_passed_tests([steps[i] for i in drafts])]
        right = sum(passes[i] for i in out)
        self.answers += len(out)
        self.right += right
        self.records += right > 0
        self.chosen_right += right > 0 and again

    def text(self) -> str:
        return (
            f"kept out by the rule on tests passed before: {self.answers} answers "
            f"({self.right} right; {self.records} records with a right one, "
            f"{self.chosen_right} of them chosen right anyway)"
        )


# A critic's `correctness` this short says nothing (")", ",,": a field its grammar made it
# write without knowing what belongs there; docs/quality.md, "The critic is shown the schema")
BLANK_FIELD, BLANK_CHARS = "correctness", 8
CRITIC_STOPS = frozenset({"done", "score_threshold"})  # stop reasons that are the critic's


@dataclass
class Critic(Summed):
    """The critic's feedbacks in runs: how many, unparsed, with a blank ``correctness``,
    their prompt tokens; how many of the answers they judge (right or wrong on the hidden
    tests, with or without findings of their own) they accept (``done`` or a score at the
    job's threshold); and the loops it stopped, of all."""

    feedbacks: int = 0
    unparsed: int = 0
    blank: int = 0
    prompt_tokens: int = 0
    judged: Counter[str] = field(default_factory=Counter)  # "right, clean" -> answers
    accepted: Counter[str] = field(default_factory=Counter)
    loops: int = 0
    stopped: int = 0

    def add(
        self, steps: Sequence[Step], passes: Mapping[int, bool], stop: str | None, job: Job
    ) -> None:
        answer_at = {s.iteration: i for i, s in enumerate(steps) if is_answer(s)}
        for step in steps:
            if step.role != "feedback":
                continue
            self.feedbacks += 1
            self.prompt_tokens += step.usage.get("prompt_tokens", 0)
            if step.parsed is None:
                self.unparsed += 1
                continue
            self.blank += len(str(step.parsed.get(BLANK_FIELD, "")).strip()) < BLANK_CHARS
            i = answer_at.get(step.iteration)
            if i is None or i not in passes:
                continue
            kind = (
                f"{'right' if passes[i] else 'wrong'}, {'flagged' if steps[i].checks else 'clean'}"
            )
            self.judged[kind] += 1
            score = step.parsed.get(job.score_field) if job.score_field else None
            self.accepted[kind] += step.parsed.get(job.done_field) is True or (
                job.score_threshold is not None
                and isinstance(score, int | float)
                and score >= job.score_threshold
            )
        self.loops += 1
        self.stopped += stop in CRITIC_STOPS

    def text(self) -> str:
        parsed = self.feedbacks - self.unparsed
        mean = round(self.prompt_tokens / self.feedbacks) if self.feedbacks else 0
        kinds = ("right, clean", "wrong, clean", "right, flagged", "wrong, flagged")
        accepted = ", ".join(f"{k} {self.accepted[k]}/{self.judged[k]}" for k in kinds)
        return (
            f"critic: {self.feedbacks} feedbacks ({self.unparsed} unparsed), `{BLANK_FIELD}` "
            f"under {BLANK_CHARS} characters in {self.blank} of {parsed} parsed, prompts of "
            f"{mean} tokens on average; answers it accepts (right or wrong on the hidden "
            f"tests, clean or flagged by their checks): {accepted}; loops it stopped: "
            f"{self.stopped} of {self.loops}"
        )


# The prompt a refinement answered: one showing the code it refines (the refine prompt's
# edit), the copy guard's retry, or a fresh start from the findings without that code
# (a job's refine_failing); a later draft answered the prompt of the draft before it
CALL_KINDS = ("edit", "fresh start", "copy retry")


def call_kind(steps: Sequence[Step], i: int, refined: Step) -> str:
    """Which of CALL_KINDS the refinement ``steps[i]`` of the answer ``refined`` answered
    (a cut-off answer asked once more answers the prompt of the attempt it repeats)."""
    j = i - 1
    while j >= 0 and is_cut_retry(steps[j]):
        j -= 1
    if j >= 0 and is_copy(steps[j]):
        return "copy retry"
    code = split(refined.output or "")[0].strip()
    prompt = steps[i].messages[-1]["content"] if steps[i].messages else ""
    return "edit" if code and code in prompt else "fresh start"


def fixes(steps: Sequence[Step], passes: Callable[[int], bool]) -> dict[str, tuple[int, int]]:
    """By CALL_KINDS: of the refinements whose input (the iteration before's answer) fails
    the hidden tests (``passes`` by place in ``steps``), how many pass them, and how many
    there are. A cut-off attempt asked again is left out; a copy counts as a try of the
    prompt it answered."""
    answer_at = {s.iteration: i for i, s in enumerate(steps) if is_answer(s)}
    tally = dict.fromkeys(CALL_KINDS, (0, 0))
    for i, step in enumerate(steps):
        if step.role != "refine" or step.failed or is_cut_retry(step):
            continue
        before = answer_at.get(step.iteration - 1)
        if before is None or passes(before):
            continue
        kind = call_kind(steps, i, steps[before])
        right, tried = tally[kind]
        tally[kind] = (right + passes(i), tried + 1)
    return tally


def _passing(known: dict[int, bool], steps: Sequence[Step], tests: list[str], i: int) -> bool:
    """Whether ``steps[i]``'s code passes the hidden ``tests`` (``known`` keeps each answer)."""
    if i not in known:
        known[i] = hidden_pass(split(steps[i].output or "")[0], tests)
    return known[i]


def _fixes_text(tally: Mapping[str, tuple[int, int]]) -> str:
    return ", ".join(f"{kind} {right}/{tried}" for kind, (right, tried) in tally.items())


@dataclass
class Figures(Summed):
    """What one run adds up to (several runs, by ``merge``)."""

    records: int = 0
    tallies: dict[str, Tally] = field(default_factory=lambda: {rule: Tally() for rule in RULES})
    fixed: dict[str, tuple[int, int]] = field(  # refinements of failing code: right, tried
        default_factory=lambda: dict.fromkeys(CALL_KINDS, (0, 0))
    )
    drafted: Drafts = field(default_factory=Drafts)
    cut_chosen: tuple[int, int] = (0, 0)  # chosen again: cut off; of iteration 0, gaining
    critic: Critic = field(default_factory=Critic)
    kept_out: KeptOut = field(default_factory=KeptOut)


def report(
    run_dir: Path, hidden: dict[str, list[str]], recheck: bool = False, suite: Path = SUITE
) -> tuple[str, Figures]:
    """The run's line and its figures: its tallies by way of choosing (see RULES), its
    number of records, its refinements of failing code by prompt (right, tried), its later
    drafts, how many outputs chosen again are a cut-off attempt (and of iteration 0,
    gaining), its critic's feedbacks and the answers the rule on tests passed before kept
    out."""
    job = load_job("code-improve")
    outputs = {
        row["id"]: row
        for row in map(orjson.loads, (run_dir / "outputs.jsonl").read_bytes().splitlines())
    }
    requests = BySuiteId(
        {row["id"]: row for row in map(orjson.loads, suite.read_bytes().splitlines())}
    )
    figures = Figures()
    tallies, drafted, critic, kept_out = (
        figures.tallies,
        figures.drafted,
        figures.critic,
        figures.kept_out,
    )
    calls = copies = tokens = answers = cut_off = asked_again = 0
    against: set[tuple[str, str]] = set()  # tests contradicting the request's signature
    against_examples: set[tuple[str, str]] = set()  # ... or an example it states
    right_on_examples = [0, 0, 0]  # answers right on every example; those passing; others passing
    cut_chosen = [0, 0]
    for raw in (run_dir / "traces.jsonl").read_bytes().splitlines():
        line = orjson.loads(raw)
        rid = line["id"]
        steps = with_pool(
            [Step.from_dict(s) for s in line["steps"]], job if recheck else None, requests[rid]
        )
        calls += len(steps)
        copies += sum(is_copy(s) for s in steps)
        answers += sum(is_answer(s) for s in steps)
        cut_off += sum(is_answer(s) and (s.error or {}).get("type") == "length" for s in steps)
        asked_again += sum(is_cut_retry(s) for s in steps)
        tokens += sum(
            s.usage.get("prompt_tokens", 0) + s.usage.get("completion_tokens", 0) for s in steps
        )
        # every answer that may be chosen (a first draft too), by its place in the trace
        passes = {
            i: hidden_pass(split(s.output or "")[0], hidden[rid])
            for i, s in enumerate(steps)
            if is_draft(s)
        }
        # iteration 0 as scripts/quality.py counts it: its answer, not a cut-off attempt
        first = passes[next((i for i in sorted(passes) if is_answer(steps[i])), min(passes))]
        figures.fixed = added(
            figures.fixed, fixes(steps, partial(_passing, dict(passes), steps, hidden[rid]))
        )
        drafted.add(steps, passes)
        critic.add(steps, passes, outputs[rid].get("stop_reason"), job)
        asked = terms(requests[rid])
        units = [(i, unit) for i in passes for unit in split_tests(split(steps[i].output or "")[1])]
        against |= {
            (rid, normalized(unit))
            for _, unit in units
            if contradiction(unit, asked.signatures) is not None
        }
        against_examples |= {
            (rid, normalized(unit))
            for _, unit in units
            if contradicted(unit, asked.examples, asked.listed) is not None
        }
        if asked.examples:
            stated = [e.test for e in asked.examples]
            for i in passes:
                right = hidden_pass(split(steps[i].output or "")[0], stated)
                right_on_examples[0] += right
                right_on_examples[1 if right else 2] += passes[i]
        bare = without(steps)
        unexampled = without(steps, EXAMPLES_PASSED)
        out = outputs[rid]["output"]
        again = chosen(steps, job)[0]
        if again is not None and is_cut_retry(again):
            cut_chosen[0] += 1
            if again.iteration == 0 and _passes(passes, steps, again) and not first:
                cut_chosen[1] += 1
        now = {
            "first": first,
            "output": out is not None and hidden_pass(out, hidden[rid]),
            "again": _passes(passes, steps, again),
            "no_examples": _passes(passes, unexampled, chosen(unexampled, job)[0]),
            "unbroken": _passes(passes, steps, chosen_unbroken(steps, job)),
            "previous": _passes(passes, bare, chosen(bare, job)[0]),
            "best": any(passes.values()),
        }
        for rule in RULES:
            tallies[rule].add(rid, now[rule], first)
        kept_out.add(steps, passes, now["again"])
    n = figures.records = len(outputs)
    figures.cut_chosen = (cut_chosen[0], cut_chosen[1])
    shown = "; ".join(f"{SHOWN[rule]} {tallies[rule].text(n)}" for rule in RULES[1:])
    text = (
        f"{run_dir}: iteration 0 {tallies['first'].passed}/{n}; {shown}; "
        f"{calls} calls ({copies} copy retries), {tokens:,} tokens; "
        f"{cut_off} of {answers} answers cut off at max_tokens"
        + (f" ({asked_again} more cut off and asked again)" if asked_again else "")
        + f"; chosen again from a cut-off attempt: {cut_chosen[0]} ({cut_chosen[1]} of "
        "iteration 0, right where its answer is wrong: a gain no refinement made)"
        + f"; {kept_out.text()}"
        + f"; {drafted.text()}; {len(against)} distinct tests against the request's "
        f"signature, {len(against_examples)} against its examples; {right_on_examples[0]} "
        f"answers right on all the request's examples ({right_on_examples[1]} of them pass the "
        f"hidden tests; {right_on_examples[2]} answers wrong on one pass them); refinements "
        f"of failing code right, by prompt: {_fixes_text(figures.fixed)}; {critic.text()}"
    )
    return text, figures


def _not_in_suite(run_dir: Path, hidden: dict[str, list[str]]) -> str | None:
    """The first request of the run that the suite (its ``hidden`` tests) lacks, or None."""
    for raw in (run_dir / "outputs.jsonl").read_bytes().splitlines():
        rid = orjson.loads(raw)["id"]
        try:
            hidden[rid]
        except KeyError:
            return str(rid)
    return None


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    args = sys.argv[1:]
    recheck = "--recheck" in args
    suite = SUITE
    if "--suite" in args:
        at = args.index("--suite")
        if at + 1 == len(args):
            sys.exit("choose_again.py: --suite needs a FILE")
        suite = Path(args.pop(at + 1))
        del args[at]
    hidden = load_hidden(hidden_path(suite))
    totals = Figures()
    runs = [arg for arg in args if arg != "--recheck"]
    for arg in runs:
        missing = _not_in_suite(Path(arg), hidden)
        if missing is not None:
            sys.exit(
                f"choose_again.py: {arg} holds the request {missing!r}, which {suite} lacks: "
                "name the suite it ran (--suite FILE)"
            )
        text, figures = report(Path(arg), hidden, recheck, suite)
        print(text, flush=True)
        totals.merge(figures)
    if len(runs) > 1:
        records, cut_chosen = totals.records, totals.cut_chosen
        print(f"all {len(runs)} runs, {records} request-runs:")
        for rule in RULES[1:]:
            print(f"  {SHOWN[rule]}: {totals.tallies[rule].text(records, named=False)}")
        print(f"  (iteration 0: {totals.tallies['first'].passed}/{records})")
        print(
            f"  chosen again from a cut-off attempt: {cut_chosen[0]} ({cut_chosen[1]} of "
            "iteration 0, right where its answer is wrong)"
        )
        print(f"  refinements of failing code right, by prompt: {_fixes_text(totals.fixed)}")
        print(f"  {totals.kept_out.text()}")
        print(f"  {totals.drafted.text()}")
        print(f"  {totals.critic.text()}")


if __name__ == "__main__":
    main()
