"""The code-improve quality suite: fair hidden tests that never reach the model, and its scoring."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from pipeline.jobs import load_job
from pipeline.loop import Policy, Step, build_messages, refine_record
from pipeline.records import Record
from pipeline.sandbox import run_tests
from tests.fakes import RecordingSink, ScriptedClient
from tests.fixtures import (
    code_fourth_solutions,
    code_fresh_solutions,
    code_suite_solutions,
    code_third_solutions,
)
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def suite_rows(name: str) -> list[dict[str, Any]]:
    """The requests of scripts/data/NAME.jsonl."""
    return [
        orjson.loads(line)
        for line in (ROOT / f"scripts/data/{name}.jsonl").read_bytes().splitlines()
    ]


def suite_hidden(name: str) -> dict[str, list[str]]:
    """The hidden tests of scripts/data/NAME.jsonl, by request id."""
    return orjson.loads((ROOT / f"scripts/data/{name}-hidden-tests.json").read_bytes())


SUITE = suite_rows("code-suite")
HIDDEN = suite_hidden("code-suite")
SOLUTIONS = code_suite_solutions.SOLUTIONS
# the suite the prompts and choice rules were written on, and the three dozens written after them
SUITES = {
    "code-suite": (SUITE, HIDDEN, SOLUTIONS),
    "code-fresh": (
        suite_rows("code-fresh"),
        suite_hidden("code-fresh"),
        code_fresh_solutions.SOLUTIONS,
    ),
    "code-third": (
        suite_rows("code-third"),
        suite_hidden("code-third"),
        code_third_solutions.SOLUTIONS,
    ),
    "code-fourth": (
        suite_rows("code-fourth"),
        suite_hidden("code-fourth"),
        code_fourth_solutions.SOLUTIONS,
    ),
}


def quality_script() -> ModuleType:
    """scripts/quality.py, imported as a module."""
    return load_script("quality")


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_request_has_hidden_tests_and_a_reference_solution(suite: str) -> None:
    """Each suite's requests, hidden tests and reference solutions match one to one."""
    rows, hidden, solutions = SUITES[suite]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) >= 12
    assert set(ids) == set(hidden) == set(solutions)
    assert all(len(tests) >= 5 for tests in hidden.values())


@pytest.mark.parametrize(
    ("suite", "rid"), [(suite, rid) for suite in sorted(SUITES) for rid in sorted(SUITES[suite][1])]
)
def test_hidden_tests_are_fair(suite: str, rid: str) -> None:
    """A correct solution passes every hidden test; an empty one passes none."""
    _, hidden, solutions = SUITES[suite]
    assert run_tests(solutions[rid], hidden[rid]).passed == len(hidden[rid])
    assert run_tests("pass", hidden[rid]).passed == 0


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_hidden_tests_never_reach_a_prompt(suite: str) -> None:
    """No hidden test appears in any prompt code-improve sends for a suite's request."""
    rows, hidden, _ = SUITES[suite]
    job = load_job("code-improve")
    answer = Step("generate", 0, [], "x", None, {}, 0.0, 1, output="def f():\n    pass")
    critic = Step(
        "feedback", 0, [], "{}", {"actions": ["a"], "done": False, "score": 3}, {}, 0.0, 1
    )
    for i, row in enumerate(rows):
        record = Record(row["id"], i + 1, row)
        texts = [
            m["content"]
            for role, t, prior in (
                ("generate", 0, []),
                ("feedback", 0, [answer]),
                ("refine", 1, [answer, critic]),
            )
            for m in build_messages(job, record, role, t, prior)  # type: ignore[arg-type]
        ]
        for test in hidden[row["id"]]:
            for line in test.splitlines():
                if line.strip().startswith("assert"):
                    assert all(line.strip() not in text for text in texts)


def test_another_suite_is_scored_by_the_hidden_tests_beside_it(tmp_path: Path) -> None:
    """--suite FILE: its hidden tests are FILE's name with -hidden-tests.json."""
    quality = quality_script()
    path = quality.hidden_path(ROOT / "scripts/data/code-fresh.jsonl")
    assert path == ROOT / "scripts/data/code-fresh-hidden-tests.json"
    assert quality.load_hidden(path)["spiral~2"] == SUITES["code-fresh"][1]["spiral"]
    assert quality.hidden_path(quality.SUITE) == quality.HIDDEN


def step(role: str, t: int, output: str | None, error: str | None = None) -> dict[str, Any]:
    """A trace step as traces.jsonl holds it."""
    d: dict[str, Any] = {"role": role, "iteration": t, "error": {"type": error} if error else None}
    if output is not None:
        d["output"] = output
    return d


def test_answers_by_iteration_takes_the_answer_that_counted() -> None:
    """A copy retried, or an answer cut off and retried, gives way to its retry."""
    answers = quality_script().answers_by_iteration(
        [
            step("generate", 0, "cut", "length"),
            step("generate", 0, "v0"),
            step("feedback", 0, None),
            step("refine", 1, "v0", "copy"),
            step("refine", 1, "v1"),
            step("feedback", 1, None),
        ]
    )
    assert answers == {0: "v0", 1: "v1"}


def test_repeated_records_are_copies_scored_by_the_hidden_tests_of_their_request(
    tmp_path: Path,
) -> None:
    """--repeat: each record N times over as ID~1 .. ID~N, each copy scored by its
    request's hidden tests (a right copy passes, a wrong one fails)."""
    quality = quality_script()
    source = tmp_path / "suite.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in SUITE))
    dest = quality.slice_records(source, 2, 6, tmp_path / "slice.jsonl", repeat=3)
    rows = [orjson.loads(line) for line in dest.read_bytes().splitlines()]
    names = [SUITE[6]["id"], SUITE[7]["id"]]
    assert [r["id"] for r in rows] == [f"{n}~{k}" for n in names for k in (1, 2, 3)]
    assert [r["task"] for r in rows] == [SUITE[6]["task"]] * 3 + [SUITE[7]["task"]] * 3
    once = quality.slice_records(source, 2, 6, tmp_path / "once.jsonl")
    assert [orjson.loads(line)["id"] for line in once.read_bytes().splitlines()] == names

    hidden = quality.load_hidden()
    assert hidden[f"{names[0]}~12"] == HIDDEN[names[0]]
    for unknown in ("nothing~1", f"{names[0]}~", f"{names[0]}~a", f"{names[0]}-1"):
        with pytest.raises(KeyError):
            hidden[unknown]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rid = names[0]
    answers = {f"{rid}~1": SOLUTIONS[rid], f"{rid}~2": "def is_valid_ipv4(s):\n    return True"}
    with (run_dir / "outputs.jsonl").open("wb") as out, (run_dir / "traces.jsonl").open("wb") as tr:
        for copy, code in answers.items():
            line = {"id": copy, "output": code, "stop_reason": "done", "chosen_step": 0}
            out.write(orjson.dumps(line) + b"\n")
            tr.write(orjson.dumps({"id": copy, "steps": [step("generate", 0, code)]}) + b"\n")
    scored = quality.score_code_run(run_dir, hidden)
    assert scored.chosen == {f"{rid}~1": True, f"{rid}~2": False}
    assert scored.by_iteration == {f"{rid}~1": {0: True}, f"{rid}~2": {0: False}}


def test_pass_rate_by_iteration_is_carried_forward() -> None:
    """A record that stopped early counts with its last answer in later rows."""
    carried = quality_script().carried
    assert [carried({0: False, 1: True}, t) for t in range(3)] == [False, True, True]


def choose_again_script() -> ModuleType:
    """scripts/choose_again.py, imported as a module."""
    return load_script("choose_again")


def fenced(code: str, tests: str) -> str:
    """A model answer as code-improve asks for it: the code block, then the tests block."""
    return f"```python\n{code}\n```\n```python\n{tests}\n```"


@pytest.mark.anyio
@pytest.mark.parametrize("recheck", [False, True])
async def test_choose_again_scores_the_draft_the_loop_chose(tmp_path: Path, recheck: bool) -> None:
    """On a run whose output is a first draft (the right code, drafted twice more), the
    script's choice, like the run's, is that draft: iteration 0 fails the hidden tests,
    the output and the choice pass them, gained against iteration 0."""
    wrong = "def run_length_encode(s):\n    return [(c, 1) for c in s]"
    right = "assert run_length_encode('aab') == [('a', 2), ('b', 1)]"
    critic = '{{"actions": ["fix"], "score": {}, "done": false}}'
    client = ScriptedClient(
        [
            fenced(wrong, right),
            critic.format(3),
            fenced(SOLUTIONS["rle"], right + "\nassert run_length_encode('') == [('x', 1)]"),
            # the second draft: wrong again, with a test expecting lists, not tuples
            fenced(wrong, right + "\nassert run_length_encode('ab') == [['a', 1], ['b', 1]]"),
            fenced(wrong + "  # the third draft: wrong too", right),
            critic.format(9),
        ]
    )
    row = next(r for r in SUITE if r["id"] == "rle")
    job = dataclasses.replace(
        load_job("code-improve"), score_threshold=None, retry_copy=False, redraft=2
    )
    outcome = await refine_record(Record("rle", 1, row), job, client, RecordingSink(), Policy(1))
    assert outcome.output == SOLUTIONS["rle"].strip() and outcome.chosen_iteration == 1
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "outputs.jsonl").write_bytes(orjson.dumps(outcome.output_line()) + b"\n")
    (run_dir / "traces.jsonl").write_bytes(orjson.dumps(outcome.trace_line()) + b"\n")
    text, figures = choose_again_script().report(run_dir, HIDDEN, recheck)
    tallies, n, fixed = figures.tallies, figures.records, figures.fixed
    # the first draft right, the second and third wrong; one test against the request's
    # signature, one against its example ("the empty string gives []"); the right draft
    # alone gets both of the request's examples right; the critic judged iteration 0's
    # answer and iteration 1's (its last draft, wrong), each with failing tests
    assert text.endswith(
        "later drafts: 2 (second 1, third 1); right where every earlier draft of their "
        "iteration was wrong: second 0, third 0; wrong where the draft before was right: 1; "
        "1 distinct tests against the request's signature, 1 against its examples; 1 answers "
        "right on all the request's examples (1 of them pass the hidden tests; 0 answers "
        "wrong on one pass them); refinements of failing code right, by prompt: edit 0/0, "
        "fresh start 1/3, copy retry 0/0; critic: 2 feedbacks (0 unparsed), `correctness` "
        "under 8 characters in 2 of 2 parsed, prompts of 100 tokens on average; answers it "
        "accepts (right or wrong on the hidden tests, clean or flagged by their checks): "
        "right, clean 0/0, wrong, clean 0/0, right, flagged 0/0, wrong, flagged 0/2; loops it "
        "stopped: 0 of 1"
    )
    # the three drafts start afresh from the failing draft's findings: the first right
    assert fixed == {"edit": (0, 0), "fresh start": (1, 3), "copy retry": (0, 0)}
    assert n == 1
    assert [
        tallies[rule].passed for rule in ("first", "output", "again", "no_examples", "best")
    ] == [0, 1, 1, 1, 1]
    assert tallies["again"].gained == ["rle"] and tallies["again"].lost == []


@pytest.mark.anyio
async def test_a_gain_from_a_cut_off_answer_of_iteration_0_is_marked(tmp_path: Path) -> None:
    """Iteration 0's first answer, right, is cut off in its tests and asked again; the
    answer asked again is wrong, and no refinement is asked. The output is the cut-off
    answer (it gets more of the request's examples right): the quality table counts a gain
    against iteration 0 (its answer is the one asked again) and marks it as no
    refinement's; choose_again counts it the same way."""
    from pipeline.client import Completion

    wrong = "def run_length_encode(s):\n    return [(c, 1) for c in s]"
    tests = "assert run_length_encode('aab') == [('a', 2), ('b', 1)]\nassert run_length_encode("
    cut = Completion(
        fenced(SOLUTIONS["rle"], tests).removesuffix("\n```"), 100, 1024, 0.5, 1,
        finish_reason="length", model="fake-model",
    )  # fmt: skip
    client = ScriptedClient(
        [cut, fenced(wrong, "assert run_length_encode('ab') == [('a', 1), ('b', 1)]")]
    )
    row = next(r for r in SUITE if r["id"] == "rle")
    job = dataclasses.replace(load_job("code-improve"), score_threshold=None, retry_copy=False)
    outcome = await refine_record(Record("rle", 1, row), job, client, RecordingSink(), Policy(0))
    assert client.script == []
    line = outcome.output_line()
    assert (line["output"], line["chosen_step"]) == (SOLUTIONS["rle"].strip(), 0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "outputs.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    (run_dir / "traces.jsonl").write_bytes(orjson.dumps(outcome.trace_line()) + b"\n")
    quality = quality_script()
    scored = quality.score_code_run(run_dir, HIDDEN)
    assert (scored.by_iteration, scored.chosen, scored.first_cut) == (
        {"rle": {0: False}}, {"rle": True}, frozenset({"rle"})
    )  # fmt: skip
    assert "gained 1 (rle*), lost 0 (-) (* its output is an answer of iteration 0 cut off" in (
        quality.code_table({"run": scored}, 0)
    )
    text = choose_again_script().report(run_dir, HIDDEN, False)[0]
    assert "chosen again from a cut-off attempt: 1 (1 of iteration 0, right where" in text


@pytest.mark.anyio
async def test_choosing_without_the_rule_on_tests_passed_before_is_counted_apart(
    tmp_path: Path,
) -> None:
    """Iteration 0's wrong code passes a wrong test of its own; the refinement, right, fails
    that test and passes more of the pooled tests. The loop keeps the refinement out (it
    fails a test an earlier answer passed): chosen again, iteration 0's wrong code; without
    that rule, the refinement, gained against iteration 0. The refinement is counted among
    the answers the rule kept out, right, in a record not chosen right."""
    wrong = (
        "def is_balanced(s):\n    return sum(c in '([{' for c in s) == sum(c in ')]}' for c in s)"
    )
    first_tests = "assert is_balanced('()') == True\nassert is_balanced('(]') == True"
    right_tests = (
        "assert is_balanced('()') == True\nassert is_balanced(')(') == False\n"
        "assert is_balanced('([)]') == False"
    )
    critic = '{{"actions": ["fix"], "score": {}, "done": false}}'
    client = ScriptedClient(
        [
            fenced(wrong, first_tests),
            critic.format(3),
            fenced(SOLUTIONS["balanced"], right_tests),
            critic.format(9),
        ]
    )
    row = next(r for r in SUITE if r["id"] == "balanced")
    job = dataclasses.replace(
        load_job("code-improve"), score_threshold=None, retry_copy=False, redraft=0
    )
    outcome = await refine_record(
        Record("balanced", 1, row), job, client, RecordingSink(), Policy(1)
    )
    assert client.script == [] and outcome.chosen_iteration == 0
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "outputs.jsonl").write_bytes(orjson.dumps(outcome.output_line()) + b"\n")
    (run_dir / "traces.jsonl").write_bytes(orjson.dumps(outcome.trace_line()) + b"\n")
    text, figures = choose_again_script().report(run_dir, HIDDEN, False)
    tallies = figures.tallies
    assert [tallies[rule].passed for rule in ("first", "again", "unbroken", "best")] == [
        0, 0, 1, 1,
    ]  # fmt: skip
    assert "without the rule on tests passed before 1/1, gained 1 (balanced), lost 0" in text
    assert (
        "kept out by the rule on tests passed before: 1 answers (1 right; 1 records with a "
        "right one, 0 of them chosen right anyway)" in text
    )


def test_later_drafts_are_counted_by_their_place_among_their_iterations_drafts() -> None:
    """A third draft right where the two before it were wrong is a third draft righted; a
    second draft wrong after a right first is one wronged; iterations not drafted again
    and the first answer are no later drafts."""

    def step(role: Any, iteration: int, redraft: bool = False) -> Step:
        error = {"type": "redraft", "message": "drafted once more"} if redraft else None
        return Step(role, iteration, [], "x", None, {}, 0.0, 1, error=error)

    steps = [
        step("generate", 0),
        step("feedback", 0),
        step("refine", 1, redraft=True),
        step("refine", 1, redraft=True),
        step("refine", 1),
        step("feedback", 1),
        step("refine", 2, redraft=True),
        step("refine", 2),
    ]
    passes = {0: False, 2: False, 3: False, 4: True, 6: True, 7: False}
    drafts = choose_again_script().Drafts()
    drafts.add(steps, passes)
    assert (drafts.made, drafts.righted, drafts.wronged) == ({2: 2, 3: 1}, {3: 1}, 1)
    assert drafts.text() == (
        "later drafts: 3 (second 2, third 1); right where every earlier draft of their "
        "iteration was wrong: second 0, third 1; wrong where the draft before was right: 1"
    )


def test_tallies_of_several_runs_add_up_field_by_field() -> None:
    """Over several runs every count adds: numbers and lists of requests by ``+``, a
    Counter's counts by place (a count of 0 kept, as the text lists every place made)."""
    script = choose_again_script()
    tally, other = script.Tally(1, ["a"], []), script.Tally(2, ["b"], ["c"])
    tally.merge(other)
    assert (tally.passed, tally.gained, tally.lost) == (3, ["a", "b"], ["c"])
    drafts = script.Drafts()
    drafts.made.update({2: 1})
    drafts.righted[2] = 0
    more = script.Drafts(wronged=1)
    more.made.update({2: 2, 3: 1})
    drafts.merge(more)
    assert (drafts.made, drafts.wronged) == ({2: 3, 3: 1}, 1)
    assert 2 in drafts.righted  # still listed, at 0
    kept = script.KeptOut(1, 1, 1, 0)
    kept.merge(script.KeptOut(2, 0, 0, 0))
    assert dataclasses.astuple(kept) == (3, 1, 1, 0)
    critic = script.Critic(feedbacks=2, loops=1)
    critic.judged["right, clean"] = 1
    other_critic = script.Critic(feedbacks=1, stopped=1)
    other_critic.judged["right, clean"] = 2
    other_critic.accepted["wrong, clean"] = 1
    critic.merge(other_critic)
    assert (critic.feedbacks, critic.loops, critic.stopped) == (3, 1, 1)
    assert (critic.judged, critic.accepted) == ({"right, clean": 3}, {"wrong, clean": 1})
    # a run's figures: the tallies inside them added the same way, key by key and item by item
    figures = script.Figures(records=2, cut_chosen=(1, 0), critic=critic)
    figures.tallies["again"] = tally
    figures.fixed["edit"] = (1, 2)
    run = script.Figures(records=3, cut_chosen=(2, 1), kept_out=kept)
    run.tallies["again"].merge(script.Tally(1, [], ["d"]))
    run.fixed.update({"edit": (0, 1), "fresh start": (2, 5)})
    figures.merge(run)
    assert (figures.records, figures.cut_chosen) == (5, (3, 1))
    assert figures.tallies["again"] == script.Tally(4, ["a", "b"], ["c", "d"])
    assert figures.tallies["first"] == script.Tally()
    assert figures.fixed == {"edit": (1, 3), "fresh start": (2, 5), "copy retry": (0, 0)}
    assert dataclasses.astuple(figures.kept_out) == (3, 1, 1, 0)
    assert figures.critic is critic and critic.feedbacks == 3  # a tally added in place


def test_the_critic_is_tallied_by_what_it_wrote_and_what_it_accepted() -> None:
    """A feedback whose ``correctness`` says nothing is blank; an answer is accepted by
    ``done`` or a score at the job's threshold, and counted as right or wrong on the
    hidden tests and clean or flagged by its own checks; an unparsed feedback judges
    nothing; a loop the critic stopped is counted by its stop reason."""
    script = choose_again_script()
    job = load_job("code-improve")
    assert job.score_threshold == 10

    def answer(t: int, checks: list[str]) -> Step:
        role: Any = "generate" if t == 0 else "refine"
        return Step(role, t, [], "", None, {}, 0.0, 1, output=f"v{t}", checks=checks)

    def feedback(t: int, parsed: dict[str, Any] | None, prompt: int) -> Step:
        usage = {"prompt_tokens": prompt}
        return Step("feedback", t, [], "", parsed, usage, 0.0, 1)

    steps = [
        answer(0, []),  # wrong, clean: accepted by done under a blank correctness
        feedback(0, {"correctness": ",,", "score": 3, "done": True}, 100),
        answer(1, ["Failing test ..."]),  # right, flagged: accepted by its score
        feedback(1, {"correctness": "The empty string is not handled.", "score": 10}, 200),
        answer(2, []),  # right, clean: not accepted
        feedback(2, {"correctness": "fine, but slow", "score": 9, "done": False}, 300),
        answer(3, []),
        feedback(3, None, 400),  # unparsed: judges nothing
    ]
    critic = script.Critic()
    critic.add(steps, {0: False, 2: True, 4: True, 6: True}, "done", job)
    critic.add(steps[:2], {0: True}, "max_iters", job)
    assert (critic.feedbacks, critic.unparsed, critic.blank) == (5, 1, 2)
    assert critic.judged == {"wrong, clean": 1, "right, flagged": 1, "right, clean": 2}
    assert critic.accepted == {"wrong, clean": 1, "right, flagged": 1, "right, clean": 1}
    assert (critic.loops, critic.stopped) == (2, 1)
    assert critic.text().endswith(
        "right, clean 1/2, wrong, clean 1/1, right, flagged 1/1, wrong, flagged 0/0; "
        "loops it stopped: 1 of 2"
    )
    assert "prompts of 220 tokens on average" in critic.text()  # 1,100 over 5


def test_refinements_of_failing_code_are_told_apart_by_the_prompt_they_answered() -> None:
    """An edit shows the code it refines, a fresh start does not, the copy guard's retry
    follows a copy (which counts as a try of its own prompt); a cut-off attempt asked
    again is counted once, as the kind it repeats; a second draft as its first; a
    refinement of code that passed is no refinement of failing code."""
    script = choose_again_script()

    def step(role: str, t: int, error: str | None = None, prompt: str = "") -> Step:
        kind = {"type": error} if error else None
        messages = [{"role": "user", "content": prompt}]
        return Step(role, t, messages, "", None, {}, 0.0, 1, error=kind, output=f"v{t}")

    steps = [
        step("generate", 0),  # 0: fails
        step("feedback", 0),
        step("refine", 1, "copy", "edit v0"),  # 2: an edit that copied its input
        step("refine", 1, "cut_off", "anew"),  # 3: the copy retry, cut off: asked again
        step("refine", 1, None, "anew"),  # 4: the copy retry, right
        step("feedback", 1),
        step("refine", 2, "redraft", "anew"),  # 6: a fresh start
        step("refine", 2, None, "anew"),  # 7: its second draft
    ]
    right = {4}  # the iteration-1 answer passes: iteration 2 refines no failing code
    assert script.fixes(steps, lambda i: i in right) == {
        "edit": (0, 1),
        "fresh start": (0, 0),
        "copy retry": (1, 1),
    }
    right = {7}
    assert script.fixes(steps, lambda i: i in right) == {
        "edit": (0, 1),
        "fresh start": (1, 2),
        "copy retry": (0, 1),
    }


@pytest.mark.anyio
async def test_choose_again_reads_another_suite_by_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`choose_again.py --suite FILE RUN_DIR`: the run's request is found in FILE and its
    answers scored by the hidden tests beside it (a request the default suite lacks)."""
    rows, _, solutions = SUITES["code-fresh"]
    row = next(r for r in rows if r["id"] == "pascal")
    tests = "assert pascal_row(0) == [1]\nassert pascal_row(4) == [1, 4, 6, 4, 1]"
    client = ScriptedClient(
        [
            fenced("def pascal_row(n):\n    return [1] * (n + 1)", tests),
            '{"actions": ["fix"], "score": 3, "done": false}',
            fenced(solutions["pascal"], tests),
            '{"actions": [], "score": 9, "done": true}',
        ]
    )
    job = dataclasses.replace(
        load_job("code-improve"), score_threshold=None, retry_copy=False, redraft=0
    )
    outcome = await refine_record(Record("pascal", 1, row), job, client, RecordingSink(), Policy(1))
    assert outcome.chosen_iteration == 1
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "outputs.jsonl").write_bytes(orjson.dumps(outcome.output_line()) + b"\n")
    (run_dir / "traces.jsonl").write_bytes(orjson.dumps(outcome.trace_line()) + b"\n")
    script = choose_again_script()
    suite = ROOT / "scripts/data/code-fresh.jsonl"
    monkeypatch.setattr("sys.argv", ["choose_again.py", "--suite", str(suite), str(run_dir)])
    script.main()
    assert capsys.readouterr().out.startswith(
        f"{run_dir}: iteration 0 0/1; the run's output 1/1, gained 1 (pascal), lost 0 (-)"
    )
    monkeypatch.setattr("sys.argv", ["choose_again.py", str(run_dir)])
    with pytest.raises(SystemExit) as stopped:  # the default suite has no such request
        script.main()
    assert "holds the request 'pascal'" in str(stopped.value)
    assert "name the suite it ran (--suite FILE)" in str(stopped.value)
