"""The paper's built-in jobs: loading, rendering original-format records, hooks, end to end."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from jobs import (
    acronym_hooks,
    code_improve_hooks,
    code_optimize_hooks,
    code_readability_hooks,
    commongen_hooks,
    dialogue_hooks,
    gsm_hooks,
)
from jobs.code import join
from pipeline import Settings, run
from pipeline.core.jobs import Job
from pipeline.core.loader import load_job
from pipeline.core.loop import Call, Policy, Stop, make_step, next_call
from pipeline.core.records import Record
from pipeline.core.steps import Completion, Step
from pipeline.core.trace import steps_of
from pipeline.errors import InputError
from pipeline.io.records import read_records
from pipeline.testing.simulator import Simulator
from tests.helpers import SHARED_DATA

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "paper"
PAPER_JOBS = (
    "gsm",
    "commongen",
    "acronym",
    "sentiment-reversal",
    "dialogue",
    "code-optimize",
    "code-readability",
)
SHARED_FILES = {
    "gsm": "gsm8k-test.jsonl",
    "commongen": "commongen-hard.jsonl",
    "acronym": "acronym-titles.jsonl",
}
PROMPT_TOKENS = 600  # per prompt, before the record's text (a 4096-token local model)
CONTEXT_TOKENS = 4096


def rows(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, parsed."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def records(job: Job, path: Path, limit: int | None = None) -> list[Record]:
    """The records of ``path`` as the runner reads them; any bad line fails the test."""
    out: list[Record] = []
    for item in read_records(path, job.inputs, "id"):
        assert not isinstance(item, InputError), f"{path.name}: {item}"
        out.append(item)
        if limit is not None and len(out) == limit:
            break
    return out


def _reply(job: Job, call: Call, n: int) -> str:
    """A recognisable answer (ANSWER-n) or feedback (ACTION-n) for ``call``."""
    if call.role != "feedback":
        return f"ANSWER-{n}"
    parsed: dict[str, Any] = {
        job.actions_field: [f"ACTION-{call.iteration}"],
        job.done_field: False,
    }
    if job.score_field:
        parsed[job.score_field] = 3
    for name in job.score_from:
        parsed[name] = 1
    return orjson.dumps(parsed).decode()


def all_prompts(job: Job, record: Record) -> Iterator[tuple[str, str]]:
    """(role:iteration:message-role, text) of every message of a loop of two refinements,
    each answer and feedback recognisable; the job's checks off (nothing to run)."""
    steps: list[Step] = []
    answers = 0
    while True:
        call = next_call(job, record, steps, Policy(2, checks=False))
        if isinstance(call, Stop):
            return
        for message in call.request.messages:
            yield f"{call.role}:{call.iteration}:{message['role']}", message["content"]
        text = _reply(job, call, answers)
        answers += call.role != "feedback"
        comp = Completion(text, 10, 10, 0.0, 1, "fake-model")
        steps.append(anyio.run(make_step, job, record, call, comp, steps, False))


def conversations(job: Job, record: Record) -> dict[tuple[str, int], str]:
    """(role, iteration) -> all the text one call sends."""
    out: dict[tuple[str, int], list[str]] = {}
    for key, text in all_prompts(job, record):
        role, t, _ = key.split(":")
        out.setdefault((role, int(t)), []).append(text)
    return {k: "\n".join(v) for k, v in out.items()}


def field_texts(value: Any) -> list[str]:
    """The pieces of a field's value that a rendered prompt must contain."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


# -- loading and rendering ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fields", "stop", "answer_kind", "hooks"),
    [
        ("gsm", {"input": True, "target": False}, (None, None, 3), "code", "evaluate check"),
        ("code-improve", {"task": True}, ("score", 10.0, 3), "code-with-tests", "evaluate check"),
        ("commongen", {"concepts": True}, (None, None, 4), "text", "evaluate check"),
        (
            "acronym",
            {"title": True, "acronym": False},
            ("score", 23.0, 4),
            "text",
            "evaluate check",
        ),
        (
            "sentiment-reversal",
            {"review": True, "target_sentiment": True},
            (None, None, 4),
            "text",
            "check",
        ),
        ("dialogue", {"context": True}, ("score", 28.0, 3), "text", "check"),
        (
            "code-optimize",
            {"input": True, "test_input": False},
            (None, None, 3),
            "code",
            "evaluate check",
        ),
        ("code-readability", {"input": True}, (None, None, 3), "code", "evaluate check"),
    ],
)
def test_job_loads_with_its_contract(
    name: str,
    fields: dict[str, bool],
    stop: tuple[str | None, float | None, int],
    answer_kind: str,
    hooks: str,
) -> None:
    """Each paper job loads with DESIGN.md's input fields, its stop rule and its hooks, and
    runs plain Self-Refine (no strategy on)."""
    job = load_job(name)
    assert job.name == name
    assert {f.name: f.required for f in job.inputs} == fields
    assert (job.score_field, job.score_threshold, job.max_iters) == stop
    assert job.answer_kind.name == answer_kind
    assert (job.evaluator is not None, job.checker is not None) == (
        "evaluate" in hooks,
        "check" in hooks,
    )
    assert job.strategies.names == () and job.strategies.repair
    schema = job.feedback_schema
    assert schema["properties"][job.actions_field]["type"] == "array"
    assert schema["properties"][job.done_field]["type"] == "boolean"
    assert {job.actions_field, job.done_field} <= set(schema["required"])
    if job.score_field:
        assert job.score_field in schema["required"]


@pytest.mark.parametrize("name", PAPER_JOBS)
def test_prompts_fit_a_small_local_model(name: str) -> None:
    """Every prompt stays well under budget before the record's text, with room to answer."""
    job = load_job(name)
    system = job.system_prompt or ""
    for template in (job.generate_prompt, job.feedback_prompt, job.refine_prompt):
        tokens = math.ceil(len(system + template) / 4)
        assert tokens < PROMPT_TOKENS
    assert job.max_tokens <= 1024


@pytest.mark.parametrize("name", PAPER_JOBS)
def test_original_format_records_render_every_prompt(name: str) -> None:
    """Fixture records in the paper's formats are accepted and render complete prompts."""
    job = load_job(name)
    recs = records(job, FIXTURES / f"{name}.jsonl")
    assert len(recs) >= 3
    for record in recs:
        prompts = dict(all_prompts(job, record))
        assert not any("{{" in text for text in prompts.values())
        generate = "\n".join(t for k, t in prompts.items() if k.startswith("generate"))
        shown = [f.name for f in job.inputs if "{{" + f.name + "}}" in job.generate_prompt]
        assert shown
        for fname in shown:
            for piece in field_texts(record.fields.get(fname)):
                assert piece in generate
        calls = conversations(job, record)
        # every refine call carries the input, each earlier answer and each earlier feedback
        for (role, t), text in calls.items():
            if role != "refine":
                continue
            for piece in field_texts(record.fields.get(shown[0])):
                assert piece in text
            assert all(f"ANSWER-{i}" in text and f"ACTION-{i}" in text for i in range(t))
        longest = max(math.ceil(len(t) / 4) for t in calls.values())
        assert longest + job.max_tokens < CONTEXT_TOKENS


@pytest.mark.parametrize(
    ("name", "field", "secret"), [("gsm", "target", 987654321), ("acronym", "acronym", "ZQXWV")]
)
def test_reference_answers_never_reach_the_model(name: str, field: str, secret: object) -> None:
    """The reference (gsm target, acronym reference) is for evaluators only."""
    job = load_job(name)
    record = records(job, FIXTURES / f"{name}.jsonl", limit=1)[0]
    record = Record(record.id, record.line, {**record.fields, field: secret})
    assert all(str(secret) not in text for _, text in all_prompts(job, record))


def test_dialogue_context_as_list_of_turns_renders_every_turn() -> None:
    """A dialogue context given as a list of turns shows each turn in the prompt."""
    job = load_job("dialogue")
    turns = ["User: I like jazz", "System: Who do you listen to?", "User: Mostly Miles Davis"]
    record = Record("d", 1, {"context": turns})
    generate = dict(all_prompts(job, record))["generate:0:user"]
    assert all(turn in generate for turn in turns)


@pytest.mark.parametrize(("name", "filename"), sorted(SHARED_FILES.items()))
def test_shared_data_files_are_accepted(name: str, filename: str) -> None:
    """Every line of the shared task data becomes a record and renders."""
    path = SHARED_DATA / filename
    job = load_job(name)
    recs = records(job, path)
    assert len(recs) == len(rows(path))
    for record in recs[:5]:
        assert all("{{" not in text for _, text in all_prompts(job, record))


# -- gsm -------------------------------------------------------------------------------------

PROGRAM_30 = "def solution():\n    boxes_per_morning = 24 // 4\n    return boxes_per_morning * 5\n"
RAISING = "def solution():\n    return 1 / 0\n"
LOOPING = "def solution():\n    while True:\n        pass\n"


@pytest.fixture
def fast_gsm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short sandbox timeout for looping programs."""
    monkeypatch.setattr(gsm_hooks, "TIMEOUT_S", 0.5)
    gsm_hooks._run_in.cache_clear()


@pytest.mark.usefixtures("fast_gsm")
@pytest.mark.parametrize(
    ("program", "target", "metrics"),
    [
        (PROGRAM_30, 30, {"answer": repr(30.0), "correct": True}),
        (PROGRAM_30, 29, {"answer": repr(30.0), "correct": False}),
        (PROGRAM_30, None, {"answer": repr(30.0)}),
        (PROGRAM_30, "30", {"answer": repr(30.0), "correct": True}),
        (
            "def solution():\n    return 1200.0000000001\n",
            "1,200",
            {"answer": repr(1200.0000000001), "correct": True},
        ),
        (
            "def solution():\n    return 0.1 + 0.2\n",
            0.3,
            {"answer": repr(0.1 + 0.2), "correct": True},
        ),
        (PROGRAM_30, "She fills 6 boxes a day.\n#### 30", {"answer": repr(30.0), "correct": True}),
        (
            "from fractions import Fraction\ndef solution():\n    return Fraction(7, 2)\n",
            3.5,
            {"answer": repr(3.5), "correct": True},
        ),
        (RAISING, 1, {"error": "ZeroDivisionError: division by zero (line 2)", "correct": False}),
        (LOOPING, 1, {"error": "timed out after 0.5s", "correct": False}),
        (
            "def solution():\n    return '30'\n",
            30,
            {"error": 'solution() returned "30", not a number', "correct": False},
        ),
        (
            "def solution():\n    return None\n",
            None,
            {"error": "solution() returned null, not a number"},
        ),
        (
            "def answer():\n    return 30\n",
            None,
            {"error": "NameError: name 'solution' is not defined"},
        ),
        (
            PROGRAM_30,
            "N/A",
            {"answer": repr(30.0), "target_error": "cannot read target 'N/A' as a number"},
        ),
    ],
)
def test_gsm_evaluate(program: str, target: object, metrics: dict[str, Any]) -> None:
    """gsm runs solution() in the sandbox and compares it with the target, with tolerance."""
    fields = {"input": "q"} if target is None else {"input": "q", "target": target}
    assert gsm_hooks.evaluate(fields, program) == metrics


@pytest.mark.usefixtures("fast_gsm")
@pytest.mark.parametrize(
    ("program", "finding"),
    [
        (PROGRAM_30, None),
        ("def solution():\n    return 31\n", None),  # wrong, but only the target says so
        (RAISING, "The program raises ZeroDivisionError: division by zero (line 2)"),
        (LOOPING, "solution() did not finish within 0.5 seconds"),
        ("def solution():\n    return '30'\n", 'solution() returns "30": return the final answer'),
        ("def answer():\n    return 30\n", "Define a function solution()"),
        ("Sure! The answer is 30.", "Fix the syntax error: SyntaxError"),
        ("x = 30\nreturn x\n", "Put every step inside def solution(): and return the answer"),
    ],
)
def test_gsm_check(program: str, finding: str | None) -> None:
    """gsm's check reports raising, looping, non-number and missing programs, never the target."""
    found = gsm_hooks.check({"input": "q", "target": 30}, program)
    if finding is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(finding)


# -- commongen -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("concept", "sentence", "used"),
    [
        ("dog", "Two dogs play in the yard.", True),
        ("dog", "The dog's bowl is empty.", True),
        ("box", "She stacks the boxes.", True),
        ("berry", "He picks berries.", True),
        ("knife", "The knives are sharp.", True),
        ("carry", "She carried the bag.", True),
        ("bake", "He baked bread.", True),
        ("jump", "The kids jumped.", True),
        ("stop", "The bus stopped.", True),
        ("make", "They are making soup.", True),
        ("run", "He was running late.", True),
        ("swim", "Kids are swimming in the lake.", True),
        ("tie", "She is tying her shoes.", True),
        ("see", "We are seeing a film.", True),
        ("ski", "They went skiing.", True),
        ("throw", "He threw the ball.", True),
        ("catch", "She caught it.", True),
        ("run", "He ran home.", True),
        ("child", "The children laugh.", True),
        ("tooth", "He brushes his teeth.", True),
        ("ice-skate", "They ice-skate on the pond.", True),
        ("frisbee", "The dog runs.", False),
        ("cat", "The category is wrong.", False),
        ("pan", "A panda sleeps.", False),
        ("run", "The runner waves.", False),
    ],
)
def test_commongen_inflections(concept: str, sentence: str, used: bool) -> None:
    """A concept counts in any inflected form, and only as a whole word."""
    assert commongen_hooks.uses(concept, sentence) is used


@pytest.mark.parametrize(
    ("concepts", "sentence", "metrics", "findings"),
    [
        (
            ["dog", "frisbee", "catch", "throw"],
            "A man throws a frisbee and his dog catches it.",
            (1.0, [], 1, 1.0),
            [],
        ),
        (
            ["dog", "frisbee", "catch", "throw"],
            "A dog sleeps.",
            (0.25, ["frisbee", "catch", "throw"], 1, 0.25),
            ["These words are missing and must be added: frisbee, catch, throw."],
        ),
        ([], "Anything.", (1.0, [], 1, 1.0), []),
        (
            ["dog", "frisbee", "catch", "throw"],
            "A dog sleeps. A man throws a frisbee and catches it.",
            (0.25, ["frisbee", "catch", "throw"], 2, 1.0),
            [
                "The answer has 2 sentences; the task asks for exactly one. Join them into one "
                "sentence (with commas, 'and', 'while', 'as'), keeping every word."
            ],
        ),
        (
            ["dog", "sleep"],
            "A dog sleeps.\nTo address the feedback, I added the missing words.",
            (1.0, [], 2, 1.0),
            [
                'Remove the note that is not part of the sentence: "To address the feedback, '
                'I added the missing words.". Reply with the sentence only.',
                "The answer has 2 sentences; the task asks for exactly one. Join them into one "
                "sentence (with commas, 'and', 'while', 'as'), keeping every word.",
            ],
        ),
    ],
)
def test_commongen_evaluate_and_check(
    concepts: list[str],
    sentence: str,
    metrics: tuple[float, list[str], int, float],
    findings: list[str],
) -> None:
    """commongen scores the first sentence, as the task defines it; check asks for one
    sentence, for the missing words and for no notes."""
    fields = {"concepts": concepts}
    coverage, missing, count, anywhere = metrics
    assert commongen_hooks.evaluate(fields, sentence) == {
        "coverage": coverage,
        "missing": missing,
        "sentences": count,
        "one_sentence": count == 1,
        "coverage_any_sentence": anywhere,
    }
    assert commongen_hooks.check(fields, sentence) == findings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A dog runs. The cat sleeps.", ["A dog runs.", "The cat sleeps."]),
        ("Mr. Smith walks his dog past St. Mary's church.", None),
        ("At 5 p.m. a man waits.", None),
        ("A dog runs!  Then it stops?", ["A dog runs!", "Then it stops?"]),
        ("A dog runs\nA cat sleeps", ["A dog runs", "A cat sleeps"]),
        ('He shouts "stop." Then he leaves.', ['He shouts "stop."', "Then he leaves."]),
        ("Version 2.5 of the app loads.", None),
        ("no final stop", None),
        ("", []),
    ],
)
def test_commongen_sentences(text: str, expected: list[str] | None) -> None:
    """Sentences end at . ! ? before a capital (abbreviations aside) and at line breaks."""
    assert commongen_hooks.sentences(text) == (expected if expected is not None else [text])


# -- acronym ---------------------------------------------------------------------------------

NASA_TITLE = "National Aeronautics and Space Administration"


@pytest.mark.parametrize(
    ("output", "acronym"),
    [
        ("NASA\nN-ational A-eronautics S-pace A-dministration", "NASA"),
        ("Acronym: LASER", "LASER"),
        ("**SCUBA** - Self-Contained Underwater Breathing Apparatus", "SCUBA"),
        ("The acronym is GLOW.", "GLOW"),
        ("\n\n  STAR (Space...)", "STAR"),
        ("", ""),
    ],
)
def test_acronym_extraction(output: str, acronym: str) -> None:
    """The acronym is the first word of the answer's first line, labels and markup removed."""
    assert acronym_hooks.extract_acronym(output) == acronym


@pytest.mark.parametrize(
    ("acronym", "title", "drawn"),
    [
        ("NASA", NASA_TITLE, True),
        ("nasa", NASA_TITLE, True),
        ("COGENT", "Cognitive Objects within a Graphical EnviroNmenT", True),
        ("SPACE", NASA_TITLE, True),
        ("QUIZ", NASA_TITLE, False),
        ("BDL", "Big Data Lab", True),
        ("BIGDATA", "Big Data Lab", True),
        ("LDB", "Big Data Lab", False),  # letters out of order
        ("IDL", "Big Data Lab", False),  # does not start at a word
        ("", NASA_TITLE, False),
    ],
)
def test_acronym_letters_from_title(acronym: str, title: str, drawn: bool) -> None:
    """An acronym is drawn from the title when its letters appear in order from a word start."""
    assert acronym_hooks.drawn_from(acronym, title) is drawn


@pytest.mark.parametrize(
    ("fields", "output", "metrics", "findings"),
    [
        (
            {"title": NASA_TITLE, "acronym": "NASA"},
            "NASA",
            {"acronym": "NASA", "letters_from_title": True, "matches_reference": True},
            0,
        ),
        (
            {"title": NASA_TITLE, "acronym": "N.A.S.A."},
            "nasa",
            {"acronym": "nasa", "letters_from_title": True, "matches_reference": True},
            0,
        ),
        (
            {"title": NASA_TITLE, "acronym": "NASA"},
            "SPACE",
            {"acronym": "SPACE", "letters_from_title": True, "matches_reference": False},
            0,
        ),
        ({"title": NASA_TITLE}, "QUIZ", {"acronym": "QUIZ", "letters_from_title": False}, 1),
        ({"title": NASA_TITLE}, "", {"acronym": "", "letters_from_title": False}, 1),
    ],
)
def test_acronym_evaluate_and_check(
    fields: dict[str, str], output: str, metrics: dict[str, Any], findings: int
) -> None:
    """acronym compares with the reference when given and checks the letters come from the title."""
    assert acronym_hooks.evaluate(fields, output) == metrics
    assert len(acronym_hooks.check(fields, output)) == findings


def test_reference_acronyms_are_mostly_drawn_from_their_titles() -> None:
    """The letters rule accepts the shared data's own reference acronyms (nearly all)."""
    path = SHARED_DATA / SHARED_FILES["acronym"]
    drawn = [acronym_hooks.drawn_from(r["acronym"], r["title"]) for r in rows(path)]
    assert sum(drawn) / len(drawn) > 0.9


# -- dialogue --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "findings"),
    [
        ("Nice! How long was the hike?", 0),
        ("System: Nice! How long was the hike?", 0),
        ("User: Hi!\nSystem: Hello!\nUser: I hiked\nSystem: Nice, how long was it?", 1),
        ("Nice!\nUser: thanks", 1),
        ("  ", 1),
    ],
)
def test_dialogue_check(output: str, findings: int) -> None:
    """dialogue's check flags an empty answer or one that repeats the conversation."""
    assert len(dialogue_hooks.check({"context": "User: Hi!"}, output)) == findings


# -- code ------------------------------------------------------------------------------------

# PIE's style: a blank line between every two lines of code
SLOW_SUM = (
    "N = int(eval(input()))\n\ntotal = 0\n\nfor i in range(1, N + 1):\n\n    total += i\n\n"
    "print(total)"
)
FAST_SUM = "N = int(input())\nprint(N * (N + 1) // 2)\n"


@pytest.mark.parametrize(
    ("output", "metrics", "finding"),
    [
        (
            "# read two numbers\ndef add(a, b):\n    return a + b\n\n\nprint(add(1, 2))  # show\n",
            {"parses": True, "functions": 1, "comment_lines": 2},
            None,
        ),
        (
            "def f(:\n    pass\n",
            {"parses": False, "syntax_error": "line 1: invalid syntax"},
            "Fix the syntax error at line 1",
        ),
        ("", {"parses": True, "functions": 0, "comment_lines": 0}, "Give the complete program"),
    ],
)
def test_code_readability_evaluate_and_check(
    output: str, metrics: dict[str, Any], finding: str | None
) -> None:
    """code-readability reports whether the code parses (and its shape); check names the line."""
    assert code_readability_hooks.evaluate({"input": SLOW_SUM}, output) == metrics
    found = code_readability_hooks.check({"input": SLOW_SUM}, output)
    assert found == [] if finding is None else found[0].startswith(finding)


@pytest.mark.parametrize(
    ("test_input", "output", "metrics", "finding"),
    [
        ("5\n", FAST_SUM, {"parses": True, "same_output": True}, None),
        (["5\n", "100\n"], FAST_SUM, {"parses": True, "same_output": True}, None),
        (None, FAST_SUM, {"parses": True}, None),
        (
            "5\n",
            "N = int(input())\nprint(N * N)\n",
            {"parses": True, "same_output": False},
            "The output differs",
        ),
        (
            "5\n",
            "print(1 / 0)\n",
            {"parses": True, "same_output": False},
            "The program fails on the test input: ZeroDivisionError",
        ),
        (
            "5\n",
            "print(\n",
            {"parses": False, "syntax_error": "line 1: '(' was never closed", "same_output": False},
            "Fix the syntax error at line 1",
        ),
        (
            None,
            "print(\n",
            {"parses": False, "syntax_error": "line 1: '(' was never closed"},
            "Fix the syntax error at line 1",
        ),
        (
            "",
            FAST_SUM,
            {
                "parses": True,
                "original_error": "the original program fails on the test input "
                "(EOFError: EOF when reading a line (line 1))",
            },
            None,
        ),
    ],
)
def test_code_optimize_evaluate_and_check(
    test_input: object, output: str, metrics: dict[str, Any], finding: str | None
) -> None:
    """code-optimize reports parses and, given a test input, whether the output is unchanged
    (and then its speedup)."""
    fields: dict[str, Any] = {"input": SLOW_SUM}
    if test_input is not None:
        fields["test_input"] = test_input
    got = code_optimize_hooks.evaluate(fields, output)
    speedup = got.pop("speedup", None)
    assert got == metrics
    assert isinstance(speedup, float) is (metrics.get("same_output") is True)
    found = code_optimize_hooks.check(fields, output)
    if finding is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(finding)


# -- end to end ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAPER_JOBS)
def test_job_runs_end_to_end_on_original_records(name: str, sim: Simulator, tmp_path: Path) -> None:
    """Each paper job finishes every original-format record against the simulator."""
    source = FIXTURES / f"{name}.jsonl"
    summary = run(
        name,
        source,
        tmp_path / "run",
        Settings(model="m", base_url=sim.url, max_iters=2, concurrency=8),
        api_key="k",
        show_progress=False,
    )
    assert summary.exit_code == 0
    job = load_job(name)
    inputs = rows(source)
    outs = rows(tmp_path / "run" / "outputs.jsonl")
    traces = {t["id"]: t["steps"] for t in rows(tmp_path / "run" / "traces.jsonl")}
    assert len(outs) == len(inputs)
    shown = [f.name for f in job.inputs if "{{" + f.name + "}}" in job.generate_prompt]
    assert shown
    for o in outs:
        assert o["status"] == "done"
        # each record's own text reached the model in its generate prompt
        generate = traces[o["id"]][0]
        assert generate["role"] == "generate"
        prompt = steps_of(traces[o["id"]])[0].messages[-1]["content"]
        fields = inputs[o["line"] - 1]
        assert all(piece in prompt for f in shown for piece in field_texts(fields.get(f)))
        if job.evaluator is not None:
            # the evaluator ran on every answer without failing the run (the simulator's
            # answers are no real programs, so the metrics may well hold errors)
            by_iteration = o["metrics_by_iteration"]
            assert by_iteration and all(isinstance(m, dict) for m in by_iteration)
            assert "check" not in (o.get("hook_errors") or {})
        if job.checker is not None:  # and so did the checks
            answers = [s for s in traces[o["id"]] if s["role"] != "feedback"]
            assert all(isinstance(s.get("checks"), list) for s in answers)


# -- code-optimize timing ----------------------------------------------------------------------

LOOP_SUM = "N = int(input())\ntotal = 0\nfor i in range(1, N + 1):\n    total += i\nprint(total)\n"


def test_code_optimize_times_the_answer_against_the_original() -> None:
    """A far faster answer on a measurable test input reports its speedup, and no finding."""
    fields = {"input": LOOP_SUM, "test_input": "2000000\n"}
    metrics = code_optimize_hooks.evaluate(fields, FAST_SUM)
    assert metrics["same_output"] is True and metrics["speedup"] > 10
    assert code_optimize_hooks.check(fields, FAST_SUM) == []


@pytest.mark.parametrize(
    ("before", "after", "finding"),
    [
        (0.200, 0.198, True),  # the same speed
        (0.200, 0.300, True),  # slower
        (0.200, 0.190, True),  # faster by less than MIN_SPEEDUP: within the noise
        (0.200, 0.100, False),
        (0.0004, 0.0004, False),  # too fast to judge
    ],
)
def test_code_optimize_finds_an_answer_that_is_not_faster(
    monkeypatch: pytest.MonkeyPatch, before: float, after: float, finding: bool
) -> None:
    """Same output but not faster by MIN_SPEEDUP (on a measurable input) is a finding."""
    monkeypatch.setattr(code_optimize_hooks, "_timing", lambda *args: (before, after))
    fields = {"input": SLOW_SUM, "test_input": "5\n"}
    found = code_optimize_hooks.check(fields, FAST_SUM)
    assert bool(found) is finding
    if finding:
        assert found[0].startswith("The program is not faster than the original")
        assert f"speedup {before / after:.2f}" in found[0]


# -- code-improve: the answer's own tests, and the request's examples stated as code -----------

ADD = "def add(a, b):\n    return a + b"


@pytest.mark.parametrize(
    ("output", "metrics", "findings"),
    [
        (join(ADD, "assert add(1, 2) == 3"), (1, 1, []), []),
        (
            join(ADD, "assert add(1, 2) == 4\nassert add(0, 0) == 0"),
            (1, 2, ["assert add(1, 2) == 4"]),
            [
                "Failing test `assert add(1, 2) == 4`: AssertionError (add(1, 2) is 3).",
                "Fix the code so that it does what the request asks; where a test",
            ],
        ),
        (ADD, (0, 0, []), ["Add tests: a second ```python block"]),
        (
            join("raise RuntimeError('x')", "assert True"),
            (0, 1, ["assert True"]),
            ["The code fails before any test runs: RuntimeError: x (line 1)."],
        ),
        (
            join("def add(:", "assert add(1, 2) == 3"),
            (0, 1, ["assert add(1, 2) == 3"]),
            ["Fix the syntax error at line 1"],
        ),
        (
            join(ADD + "  # as the feedback suggested", "assert add(1, 2) == 3"),
            (1, 1, []),
            ["Remove the comment on line 2 about the changes or the feedback"],
        ),
        (
            join(ADD, "\n".join(f"assert add({i}, 0) == -1" for i in range(5))),
            (0, 5, [f"assert add({i}, 0) == -1" for i in range(5)]),
            [
                "Failing test `assert add(0, 0) == -1`",
                "Failing test",
                "Failing test",
                "2 more tests fail. Fix the code",
            ],
        ),
        ("", (0, 0, []), ["Give the complete code in the first ```python block."]),
        (
            join(ADD, "assert add(1, 2) == 3\nassert add('(]) == 0"),
            (1, 1, []),  # the tests before the broken line still run
            ["Fix the syntax error in the tests at line 2: unterminated string literal"],
        ),
        (  # cut off at max_tokens inside one test function: its finished asserts run
            join(
                ADD,
                "def test_add():\n    assert add(1, 2) == 4\n    assert add(2, 2) == 4\n"
                "    assert add(2, 2) == 4\n    assert add(3, [1",
            ),
            (1, 2, ["assert add(1, 2) == 4"]),
            [
                "Fix the syntax error in the tests at line 5: '[' was never closed",
                "Failing test `assert add(1, 2) == 4`: AssertionError (add(1, 2) is 3).",
                "Fix the code",
            ],
        ),
    ],
)
def test_code_improve_evaluate_and_check(
    output: str, metrics: tuple[int, int, list[str]], findings: list[str]
) -> None:
    """code-improve runs the answer's tests: counts, the failing ones, and a finding for each
    failure, a missing test, a failing program and a note in a comment."""
    passed, total, failed = metrics
    got = code_improve_hooks.evaluate({"task": "add"}, output)
    assert (got["tests_passed"], got["tests_total"], got["tests_failed"]) == (passed, total, failed)
    assert "examples_total" not in got  # a request in prose states no example as code
    found = code_improve_hooks.check({"task": "add"}, output)
    assert len(found) == len(findings), found
    for text, start in zip(found, findings, strict=True):
        assert text.startswith(start)


STATED = (
    "Write add(a, b) returning the sum.\n\n"
    ">>> add(2, 3)\n5\n>>> xs = [1, 2]\n>>> add(*xs)\n3\n"
    "assert add(-1, 1) == 0\n"
    "Also add('a', 'b') gives 'ab' (prose, not read)."
)


def test_examples_a_request_states_as_code_run_as_tests() -> None:
    """Doctest lines (with their expected output) and assert lines of the request run with
    the answer; a failing one is a finding; prose is never read as an example."""
    from jobs.code import stated_examples

    assert stated_examples(STATED) == [
        "assert (add(2, 3)) == (5)",
        "xs = [1, 2]\nassert (add(*xs)) == (3)",
        "assert add(-1, 1) == 0",
    ]
    right = join(ADD, "assert add(1, 1) == 2")
    got = code_improve_hooks.evaluate({"task": STATED}, right)
    assert (got["examples_passed"], got["examples_total"]) == (3, 3)
    assert code_improve_hooks.check({"task": STATED}, right) == []
    wrong = join("def add(a, b):\n    return abs(a) + b", "assert add(1, 1) == 2")
    got = code_improve_hooks.evaluate({"task": STATED}, wrong)
    assert (got["examples_passed"], got["tests_passed"]) == (2, 1)
    found = code_improve_hooks.check({"task": STATED}, wrong)
    assert [f.split(":")[0] for f in found] == ["The request's own example fails"]
    assert "add(-1, 1)" in found[0]


def test_code_improve_offers_the_pooled_rule_off_by_default() -> None:
    """The pooled-tests selection rule lives with the code kit and is opt-in."""
    job = load_job("code-improve")
    assert job.select == "default" and set(job.answer_kind.selections) == {"pooled"}


# -- every job: the artifact alone --------------------------------------------------------------

NOTE = "To address the feedback, I added the missing words."


@pytest.mark.parametrize(
    ("name", "fields", "output"),
    [
        ("commongen", {"concepts": ["dog", "run"]}, f"A dog runs. {NOTE}"),
        (
            "sentiment-reversal",
            {"review": "Bad.", "target_sentiment": "positive"},
            f"Great food! {NOTE}",
        ),
        ("dialogue", {"context": "User: hi"}, f"Hello there! {NOTE}"),
        ("acronym", {"title": "Deep Operator Graphs"}, f"DOG\nDeep Operator Graphs\n{NOTE}"),
        (
            "gsm",
            {"input": "1 + 1?"},
            "def solution():\n    # as suggested by the feedback\n    return 2",
        ),
        ("code-optimize", {"input": "print(1)"}, "print(1)  # improved: as the feedback asked"),
        (
            "code-readability",
            {"input": "print(1)"},
            "# Changed: as suggested by the reviewer\nprint(1)",
        ),
        (
            "code-improve",
            {"task": "t"},
            join(ADD + "  # fixed as the feedback said", "assert add(1, 1) == 2"),
        ),
    ],
)
def test_every_job_flags_notes_about_the_feedback(
    name: str, fields: dict[str, Any], output: str
) -> None:
    """Each built-in job's check finds a note about the feedback left in the answer."""
    job = load_job(name)
    assert job.checker is not None
    found = job.checker(fields, output)
    assert any("Remove the" in f and ("note" in f or "comment" in f) for f in found), found


@pytest.mark.parametrize("name", [*PAPER_JOBS, "code-improve"])
def test_feedback_schemas_are_bounded(name: str) -> None:
    """Every string and array of every built-in feedback schema has a maximum length: a
    grammar then cannot let a small model repeat one phrase until max_tokens."""

    def unbounded(schema: Any, path: str) -> list[str]:
        if not isinstance(schema, dict):
            return []
        found = []
        if schema.get("type") == "string" and "maxLength" not in schema and "enum" not in schema:
            found.append(path)
        if schema.get("type") == "array":
            if "maxItems" not in schema:
                found.append(path)
            found += unbounded(schema.get("items"), path + "[]")
        for key, sub in (schema.get("properties") or {}).items():
            found += unbounded(sub, f"{path}.{key}")
        return found

    assert unbounded(dict(load_job(name).feedback_schema), name) == []


@pytest.mark.parametrize("name", [*PAPER_JOBS, "code-improve"])
def test_refine_prompts_ask_for_the_artifact_only(name: str) -> None:
    """No refine prompt asks for prose about the changes; each says what alone to reply with."""
    prompt = load_job(name).refine_prompt.lower()
    assert "sentences on what changed" not in prompt
    assert "only" in prompt or "nothing else" in prompt
