"""The paper's built-in jobs: loading, rendering original-format records, hooks, end to end."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from pipeline import Settings, answers, run
from pipeline.answers import join, split_tests
from pipeline.errors import InputError
from pipeline.jobs import Job, load_job
from pipeline.loop import Step, build_messages
from pipeline.records import Record, read_records
from pipeline.testing.simulator import Simulator
from tests.helpers import SHARED_DATA

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "paper"
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


def feedback_step(job: Job, iteration: int) -> Step:
    """A parsed feedback step carrying one recognisable action."""
    parsed: dict[str, Any] = {job.actions_field: [f"ACTION-{iteration}"], job.done_field: False}
    if job.score_field:
        parsed[job.score_field] = 3.0
    return Step("feedback", iteration, [], "{}", parsed, {}, 0.0, 1)


def answer_step(role: str, iteration: int) -> Step:
    """A generate/refine step whose answer is recognisable."""
    text = f"ANSWER-{iteration}"
    return Step(role, iteration, [], text, None, {}, 0.0, 1, output=text)  # type: ignore[arg-type]


def all_prompts(job: Job, record: Record) -> Iterator[tuple[str, str]]:
    """(role, text) of every message for generate, feedback, refine and a second refine."""
    steps = [answer_step("generate", 0), feedback_step(job, 0)]
    calls = [
        ("generate", 0, []),
        ("feedback", 0, steps[:1]),
        ("refine", 1, steps),
        ("refine", 2, [*steps, answer_step("refine", 1), feedback_step(job, 1)]),
    ]
    for role, iteration, prior in calls:
        for message in build_messages(job, record, role, iteration, prior):  # type: ignore[arg-type]
            yield f"{role}:{iteration}:{message['role']}", message["content"]


def field_texts(value: Any) -> list[str]:
    """The pieces of a field's value that a rendered prompt must contain."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


# -- loading and rendering ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fields", "stop", "extract", "hooks"),
    [
        ("gsm", {"input": True, "target": False}, (None, None, 3), "code", "evaluate check"),
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
    extract: str,
    hooks: str,
) -> None:
    """Each paper job loads with DESIGN.md's input fields, its stop rule and its hooks."""
    job = load_job(name)
    assert job.name == name
    assert {f.name: f.required for f in job.inputs} == fields
    assert (job.score_field, job.score_threshold, job.max_iters) == stop
    assert job.extract == extract
    assert (job.evaluator is not None, job.checker is not None) == (
        "evaluate" in hooks,
        "check" in hooks,
    )
    # Greedy jobs retry a verbatim copy, and so do commongen and code-improve, whose
    # small-model refinements often hand the sentence or the failing code back unchanged.
    assert job.retry_copy is (job.temperature == 0 or job.name in ("commongen", "code-improve"))
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
        assert "ANSWER-0" in prompts["feedback:0:user"]
        assert "ACTION-0" in prompts["refine:1:user"]
        # the second refinement sees the first attempt and its feedback in the history
        assert "ANSWER-0" in prompts["refine:2:user"] and "ACTION-0" in prompts["refine:2:user"]
        assert "ANSWER-1" in prompts["refine:2:user"] and "ACTION-1" in prompts["refine:2:user"]
        longest = max(math.ceil(len(t) / 4) for t in prompts.values())
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
    gsm_hooks._run.cache_clear()


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
        prompt = generate["messages"][-1]["content"]
        fields = inputs[o["line"] - 1]
        assert all(piece in prompt for f in shown for piece in field_texts(fields.get(f)))
        if job.evaluator is not None:
            # the evaluator ran on every answer without failing the run (the simulator's
            # answers are no real programs, so the metrics may well hold errors)
            by_iteration = o["metrics_by_iteration"]
            assert by_iteration and all(isinstance(m, dict) for m in by_iteration)
            assert not any("check_error" in m for m in by_iteration)
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


# -- code-improve: the answer's own tests ------------------------------------------------------

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
            join(ADD + "\nprint(add(1, 1))  # 3", "assert add(1, 1) == 2"),
            (1, 1, []),
            ["The comment on line 3 claims an output nobody checked (`# 3`): turn it into an"],
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
        (
            join(ADD, "assert add('(]) == 0\nassert add(1, 2) == 3"),
            (0, 1, ["assert add('(]) == 0 assert add(1, 2) == 3"]),  # whitespace-normalized
            ["Fix the syntax error in the tests at line 1: unterminated string literal"],
        ),
        (  # a raise tested as a value: how to test it instead, whatever the code does
            join(
                ADD + "\n\ndef half(n):\n    if n % 2:\n        raise ValueError('odd')\n"
                "    return n // 2",
                "assert half(3) == ValueError('odd')\nassert half(4) == OverflowError()",
            ),
            (0, 2, ["assert half(3) == ValueError('odd')", "assert half(4) == OverflowError()"]),
            [
                "The test `assert half(3) == ValueError('odd')` cannot pass: a new ValueError "
                "object equals only itself. To test that `half(3)` raises ValueError: under "
                "`try:` call it, then `assert False`; under `except ValueError:` `pass`.",
                "The test `assert half(4) == OverflowError()` cannot pass",
                "Fix the code",
            ],
        ),
        (  # a raise tested against the class: code that raises fails it
            join(
                "def half(n):\n    if n % 2:\n        raise ValueError('odd')\n    return n // 2",
                "assert half(2) == 1\nassert half(3) == ValueError",
            ),
            (1, 2, ["assert half(3) == ValueError"]),
            [
                "The test `assert half(3) == ValueError` compares the result with the class "
                "ValueError: code that raises ValueError fails it. To test that `half(3)` "
                "raises ValueError: under `try:` call it, then `assert False`; under "
                "`except ValueError:` `pass`.",
                "Fix the code",
            ],
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
    found = code_improve_hooks.check({"task": "add"}, output)
    assert len(found) == len(findings)
    for text, start in zip(found, findings, strict=True):
        assert text.startswith(start)


ROMAN = (  # a dict lookup: a letter that is no numeral raises KeyError
    "def roman_to_int(s):\n"
    "    if not s:\n        raise ValueError('empty')\n"
    "    m = {'I': 1, 'V': 5, 'X': 10}\n"
    "    total = 0\n"
    "    for a, b in zip(s, s[1:] + ' '):\n"
    "        total += -m[a] if b != ' ' and m[a] < m[b] else m[a]\n"
    "    return total"
)
ROMAN_CHECKED = ROMAN.replace(
    "    m = {", "    if set(s) - set('IVX'):\n        raise ValueError(s)\n    m = {"
)
ROMAN_TASK = (
    "Write roman_to_int(s). It must raise ValueError for an empty string or a letter that "
    "is not a Roman numeral."
)


def test_code_improve_flags_an_error_the_request_does_not_name() -> None:
    """Code raising KeyError on a call near its tests (`roman_to_int('ix')`), where the
    request names ValueError, gets a finding that says which call and what to raise; code
    that checks its input, or a request naming no error, gets none."""
    tests = "\n".join(
        [
            "assert roman_to_int('IX') == 9",
            "assert roman_to_int('XI') == 11",
            "assert roman_to_int('V') == 5",
        ]
    )
    found = code_improve_hooks.check({"task": ROMAN_TASK}, join(ROMAN, tests))
    assert len(found) == 1
    # The first call says where the lookup failed, with the code's values there.
    assert found[0].startswith(
        "`roman_to_int('ix')` raises KeyError: 'i' (raised in roman_to_int, line 7 of the "
        "code: `total += -m[a] if b != ' ' and m[a] < m[b] else m[a]`, where m = {"
    )
    # ix, xi and v; then each numeral with a # and with a letter it lacks added (IX# and IXZ)
    assert "; `roman_to_int('xi')` raises KeyError (and 7 more such calls)" in found[0]
    assert "raise ValueError" in found[0]
    assert "check `if key not in table:` and raise ValueError before looking it up" in found[0]
    assert code_improve_hooks.check({"task": ROMAN_TASK}, join(ROMAN_CHECKED, tests)) == []
    assert code_improve_hooks.check({"task": "Convert a numeral."}, join(ROMAN, tests)) == []


def test_code_improve_says_where_an_unnamed_error_is_raised_without_a_lookup_hint() -> None:
    """An IndexError where the request names ValueError: the finding shows the line that
    raised it and the values there; the advice on table lookups is for KeyError only."""
    task = "Write first_char(s: str) -> str. It must raise ValueError for an empty string."
    code = "def first_char(s):\n    head = s[:1]\n    return s[0]"
    found = code_improve_hooks.check({"task": task}, join(code, "assert first_char('ab') == 'a'"))
    assert found == [
        "`first_char('')` raises IndexError: string index out of range (raised in first_char, "
        "line 3 of the code: `return s[0]`, where head = ''): the request names ValueError as "
        "the error to raise. Where such an input is not valid, check it and raise ValueError; "
        "where it is valid, return the result."
    ]


MAT_MUL_TASK = (
    "Write mat_mul(a: list[list[float]], b: list[list[float]]) -> list[list[float]] that "
    "multiplies two matrices. It must raise ValueError when the columns of a are not the "
    "rows of b, or when a matrix has rows of different lengths."
)
MAT_MUL = (  # reads the width of a off its first row
    "def mat_mul(a, b):\n"
    "    if not a or not b or len(a[0]) != len(b):\n"
    "        raise ValueError('shapes')\n"
    "    return [[sum(row[k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]\n"
    "            for row in a]"
)
MAT_MUL_CHECKED = MAT_MUL.replace(
    "    return",
    "    if len({len(r) for r in a}) > 1 or len({len(r) for r in b}) > 1:\n"
    "        raise ValueError('ragged')\n    return",
)


def test_code_improve_flags_rows_of_different_lengths_met_with_another_error() -> None:
    """No test of the answer's gives a matrix rows of different lengths; the same call
    with the last row of a matrix one item shorter does, and the IndexError it meets where
    the request names ValueError is a finding. Code checking its rows gets none, and a
    request naming no error asks nothing of such rows."""
    tests = "assert mat_mul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]"
    found = code_improve_hooks.check({"task": MAT_MUL_TASK}, join(MAT_MUL, tests))
    assert len(found) == 1
    assert found[0].startswith(
        "`mat_mul([[1, 2], [3]], [[5, 6], [7, 8]])` raises IndexError: list index out of range"
    )
    assert "the request names ValueError as the error to raise" in found[0]
    assert code_improve_hooks.check({"task": MAT_MUL_TASK}, join(MAT_MUL_CHECKED, tests)) == []
    plain = MAT_MUL_TASK.split(" It must")[0]
    assert code_improve_hooks.check({"task": plain}, join(MAT_MUL, tests)) == []


def test_code_improve_writes_out_the_check_on_rows_of_different_lengths() -> None:
    """Where a matrix with rows of different lengths meets another error than the one the
    request names, and the request speaks of lengths, the finding gives the check in the
    code's own parameter names, for each parameter such a call gave rows of different
    lengths; put at the start of the function, it clears the finding. A request saying
    nothing of lengths gets the general sentence only."""
    tests = "assert mat_mul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]"
    code = (  # MAT_MUL with other parameter names
        "def mat_mul(left, right):\n"
        "    if not left or not right or len(left[0]) != len(right):\n"
        "        raise ValueError('shapes')\n"
        "    return [[sum(row[k] * right[k][j] for k in range(len(right)))\n"
        "             for j in range(len(right[0]))] for row in left]"
    )
    (found,) = code_improve_hooks.check({"task": MAT_MUL_TASK}, join(code, tests))
    check = "if len({len(row) for row in left}) > 1 or len({len(row) for row in right}) > 1:"
    assert f"check `{check}` and raise ValueError before using the rows" in found
    lines = code.splitlines()
    checked = "\n".join([lines[0], "    " + check, "        raise ValueError('rows')", *lines[1:]])
    assert code_improve_hooks.check({"task": MAT_MUL_TASK}, join(checked, tests)) == []
    silent = MAT_MUL_TASK.replace(", or when a matrix has rows of different lengths", "")
    (general,) = code_improve_hooks.check({"task": silent}, join(code, tests))
    assert "the request names ValueError as the error to raise" in general
    assert "Rows of different lengths" not in general


def test_code_improve_runs_the_inputs_a_request_lists_as_raising_its_error() -> None:
    """Inputs the request lists as raising ValueError ("such as "1,00" or ",100"") run as
    its examples: code returning a value for one gets a finding naming the call, and a
    test expecting a value for one is left out as contradicting the request."""
    task = (
        "Write parse_grouped(text: str) -> int that reads numbers with commas as thousands "
        'separators. It must raise ValueError for any other text, such as "1,00" or ",100".'
    )
    lenient = "def parse_grouped(text):\n    return int(text.replace(',', ''))"
    tests = "assert parse_grouped('1,000') == 1000\nassert parse_grouped(',100') == 100"
    found = code_improve_hooks.check({"task": task}, join(lenient, tests))
    assert found[:2] == [
        f"The request's own example (ValueError for {value}) fails: parse_grouped('{value[1:-1]}') "
        "did not raise ValueError. The request's examples are right: fix the code so that it "
        "raises that error for such input."
        for value in ('"1,00"', '",100"')
    ]
    assert found[2].startswith("Tests that expect another result than the request's own")
    assert (
        "`assert parse_grouped(',100') == 100` (the request: ValueError for \",100\")" in found[2]
    )
    got = code_improve_hooks.evaluate({"task": task}, join(lenient, tests))
    assert (got["examples_passed"], got["examples_total"]) == (0, 2)
    assert (got["tests_passed"], got["tests_total"]) == (1, 1)
    strict = lenient.replace(
        "    return",
        "    if text.startswith(',') or text.endswith(',00'):"
        "\n        raise ValueError(text)\n    return",
    )
    got = code_improve_hooks.evaluate({"task": task}, join(strict, tests))
    assert (got["examples_passed"], got["examples_total"]) == (2, 2)
    assert (got["tests_passed"], got["tests_total"]) == (1, 1)  # the test of ",100" left out


NUMERALS = "'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}"
UPPER_ROMAN = (  # upper-cases its input: only a character no numeral holds raises KeyError
    ROMAN.replace("    if not s:", "    s = s.upper()\n    if not s:").replace("'X': 10}", NUMERALS)
)
UPPER_ROMAN_CHECKED = UPPER_ROMAN.replace(
    "    m = {", "    if set(s) - set('IVXLCDM'):\n        raise ValueError(s)\n    m = {"
)


def test_code_improve_flags_a_lookup_of_a_character_foreign_to_every_test() -> None:
    """Code that upper-cases its input before a dict lookup gets every small change of its
    tests' numerals right (`ix`, `IXX`, `XI`); only a character none of them holds (`IX#`,
    `IXZ`) shows that it raises KeyError where the request names ValueError."""
    tests = "assert roman_to_int('IX') == 9\nassert roman_to_int('MCMXCIV') == 1994"
    asked = answers.terms({"task": ROMAN_TASK})
    near = calls_near(UPPER_ROMAN, tests)
    assert not any(answers.stray_effect(call, result, asked) for call, result in near)
    found = code_improve_hooks.check({"task": ROMAN_TASK}, join(UPPER_ROMAN, tests))
    assert len(found) == 1
    assert found[0].startswith("`roman_to_int('IX#')` raises KeyError: '#' (raised in ")
    assert "; `roman_to_int('IXZ')` raises KeyError (and" in found[0]
    assert "(and 2 more such calls)" in found[0]  # MCMXCIV# and MCMXCIVZ
    assert code_improve_hooks.check({"task": ROMAN_TASK}, join(UPPER_ROMAN_CHECKED, tests)) == []


def calls_near(code: str, tests: str) -> list[tuple[str, str]]:
    """The small changes of its tests' calls (no foreign character), each with what
    ``code`` gives on it."""
    from pipeline.sandbox import run_calls

    calls = answers.probe_calls([code], split_tests(tests))
    results = run_calls(code, calls)
    assert results is not None
    return list(zip(calls, results, strict=True))


def test_code_improve_runs_a_try_of_an_error_the_request_names_as_a_test_of_the_raise() -> None:
    """`try: roman_to_int('Z')` / `except ValueError: pass` passes whatever the call does;
    where the request names ValueError it fails code that returns instead of raising; where
    the request names no error it is no test of what it asks and is left out."""
    lenient = (
        "def roman_to_int(s):\n    m = {'I': 1, 'V': 5}\n    return sum(m.get(c, 0) for c in s)"
    )
    tests = (
        "assert roman_to_int('VI') == 6\ntry:\n    roman_to_int('Z')\nexcept ValueError:\n    pass"
    )
    got = code_improve_hooks.evaluate({"task": ROMAN_TASK}, join(lenient, tests))
    assert (got["tests_passed"], got["tests_total"]) == (1, 2)
    found = code_improve_hooks.check({"task": ROMAN_TASK}, join(lenient, tests))
    assert "roman_to_int('Z') did not raise ValueError" in found[0]
    got = code_improve_hooks.evaluate({"task": "Convert a numeral."}, join(lenient, tests))
    assert (got["tests_passed"], got["tests_total"]) == (1, 1)


def test_code_improve_runs_an_assert_equal_to_a_named_error_as_a_raise_check() -> None:
    """`assert roman_to_int('Z') == ValueError` fails whatever the code does; where the
    request names ValueError it runs as the check of the raise it meant: code that raises
    passes it, code that returns is told it did not raise, and how to write the test."""
    tests = "assert roman_to_int('VI') == 6\nassert roman_to_int('Z') == ValueError"
    got = code_improve_hooks.evaluate({"task": ROMAN_TASK}, join(ROMAN_CHECKED, tests))
    assert (got["tests_passed"], got["tests_total"]) == (2, 2)
    found = code_improve_hooks.check({"task": ROMAN_TASK}, join(ROMAN, tests))
    assert found[0].startswith("Failing test `assert roman_to_int('Z') == ValueError`, run as")
    assert "it did not" in found[0] and "`except ValueError:`" in found[0]
    got = code_improve_hooks.evaluate({"task": "Convert a numeral."}, join(ROMAN_CHECKED, tests))
    assert (got["tests_passed"], got["tests_total"]) == (1, 2)  # as written: it cannot pass


def test_code_improve_flags_a_result_that_changes_the_callers_value() -> None:
    """Code that sorts the list it was given while returning its median gets a finding
    (the call, and to work on a copy); a request asking for work in place gets none."""
    sorts = "def median(v):\n    v.sort()\n    return v[len(v) // 2]"
    tests = "assert median([3, 1, 2]) == 2"
    found = code_improve_hooks.check({"task": "Return the median."}, join(sorts, tests))
    assert len(found) == 1 and found[0].startswith("`median([3, 1, 2])` changes argument 1")
    assert "work on a copy" in found[0]
    assert (
        "It is changed in place at line 2, `v.sort()`. Write line 2 as `v = sorted(v)`: a "
        "sorted copy, which leaves the caller's `v` as it is." in found[0]
    )
    assert (
        code_improve_hooks.check({"task": "Sort in place; return the median."}, join(sorts, tests))
        == []
    )
    copies = "def median(v):\n    return sorted(v)[len(v) // 2]"
    assert code_improve_hooks.check({"task": "Return the median."}, join(copies, tests)) == []


def _written_as(code: str, number: int, statement: str) -> str:
    """``code`` with line ``number`` replaced by ``statement``, at that line's indentation."""
    lines = code.splitlines()
    indent = lines[number - 1][: len(lines[number - 1]) - len(lines[number - 1].lstrip())]
    lines[number - 1] = indent + statement
    return "\n".join(lines)


def test_code_improve_says_how_to_sort_a_copy_by_the_line_that_sorts() -> None:
    """The finding on a parameter sorted in place gives that line written with `sorted`,
    its arguments kept; written so, the code no longer changes the caller's list. A sort
    of an item (`v[0].sort()`) keeps the general sentence."""
    code = (
        "def merge(spans):\n    spans.sort(key=lambda s: s[0], reverse=True)\n"
        "    return [s[0] for s in spans]"
    )
    tests = "assert merge([(1, 2), (3, 4)]) == [3, 1]"
    task = {"task": "Return the starts, latest first."}
    (found,) = code_improve_hooks.check(task, join(code, tests))
    assert "Write line 2 as `spans = sorted(spans, key=lambda s: s[0], reverse=True)`" in found
    assert (
        code_improve_hooks.check(
            task,
            join(
                _written_as(code, 2, "spans = sorted(spans, key=lambda s: s[0], reverse=True)"),
                tests,
            ),
        )
        == []
    )
    item = "def first(v):\n    v[0].sort()\n    return v[0][0]"
    (found,) = code_improve_hooks.check(
        {"task": "Return the least of the first row."}, join(item, "assert first([[2, 1]]) == 1")
    )
    assert "`sorted(v)` gives a sorted copy" in found and "Write line" not in found


@pytest.mark.parametrize(
    ("line", "given", "result"),
    [
        (
            "merged[-1][1] = max(merged[-1][1], end)",
            "merged[-1] = (*merged[-1][:1], max(merged[-1][1], end), *merged[-1][2:])",
            "(1, 6)",
        ),
        (
            "merged[-1][0] = min(merged[-1][0], start)",
            "merged[-1] = (min(merged[-1][0], start), *merged[-1][1:])",
            "(0, 3)",
        ),
        (
            "merged[-1][-1] += end - merged[-1][-1]",
            "merged[-1] = (*merged[-1][:-1], merged[-1][-1] + (end - merged[-1][-1]))",
            "(1, 6)",
        ),
    ],
)
def test_code_improve_says_how_to_replace_an_item_of_a_tuple(
    line: str, given: str, result: str
) -> None:
    """A test failing because the code assigns an item of a tuple gets one finding, after
    the failing tests, with the statement that puts a new tuple in its place (a literal
    index from the start or the end, an augmented assignment); the code with that line
    written so passes the tests it failed."""
    code = (
        "def widen(spans):\n    merged = [spans[0]]\n    for start, end in spans[1:]:\n"
        f"        {line}\n    return merged"
    )
    tests = f"assert widen([(1, 3), (0, 6)]) == [{result}]"
    found = code_improve_hooks.check({"task": "Widen the first span."}, join(code, tests))
    assert found[0].startswith("Failing test") and "does not support item assignment" in found[0]
    (hint,) = [f for f in found if f.startswith("`merged[-1]` is a tuple")]
    assert hint.endswith(f"Put a new tuple in its place: `{given}`.")
    assert f"line 4, `{line}`, fails so" in hint
    fixed = join(_written_as(code, 4, given), tests)
    assert code_improve_hooks.evaluate({"task": "Widen."}, fixed)["tests_failed"] == []


def test_code_improve_says_how_to_replace_a_character_of_a_string() -> None:
    """A string's character assigned at an index named by a variable: the finding gives
    the string rebuilt from slices, and the code written so passes its test; a failing
    test of another kind gets no such finding."""
    code = "def cap(s, i):\n    s[i] = s[i].upper()\n    return s"
    tests = "assert cap('abc', 1) == 'aBc'"
    found = code_improve_hooks.check({"task": "Capitalize one letter."}, join(code, tests))
    (hint,) = [f for f in found if f.startswith("`s` is a string")]
    assert hint.endswith("Put a new string in its place: `s = s[:i] + s[i].upper() + s[i + 1:]`.")
    assert (
        code_improve_hooks.check(
            {"task": "Capitalize one letter."},
            join(_written_as(code, 2, "s = s[:i] + s[i].upper() + s[i + 1:]"), tests),
        )
        == []
    )
    wrong = "def cap(s, i):\n    return s"
    found = code_improve_hooks.check({"task": "Capitalize one letter."}, join(wrong, tests))
    assert not any("cannot be changed in place" in f for f in found)


def test_code_improve_names_the_lines_that_change_an_argument() -> None:
    """The finding names each statement that changes the argument the call changed, two at
    most, and offers `sorted` only where one sorts; a change made through another name
    (`row.reverse()` on each row, `w.sort()` with `w = v`) is not found, and where none
    is, the finding names the call alone."""
    rotates = (
        "def rotate(m):\n    n = len(m)\n    for i in range(n):\n        for j in range(i, n):\n"
        "            m[i][j], m[j][i] = m[j][i], m[i][j]\n    for row in m:\n"
        "        row.reverse()\n    m.reverse()\n    m.reverse()\n    return m"
    )
    found = code_improve_hooks.check(
        {"task": "Return the matrix rotated."}, join(rotates, "assert rotate([[1, 2], [3, 4]])")
    )
    assert len(found) == 1
    assert "changed in place at line 5, `m[i][j], m[j][i] = m[j][i], m[i][j]`; line 8, " in found[0]
    assert "(and 1 more)" in found[0] and "sorted" not in found[0]
    # not a sort: how to copy the argument first, by the parameter's and function's names
    assert found[0].endswith(
        "Copy it before changing it: make `m = copy.deepcopy(m)` the first line of `rotate` "
        "(with `import copy` above it). Leave the arguments as they are (work on a copy)."
    )
    aliased = "def median(v):\n    w = v\n    w.sort()\n    return w[len(w) // 2]"
    found = code_improve_hooks.check(
        {"task": "Return the median."}, join(aliased, "assert median([3, 1, 2]) == 2")
    )
    assert len(found) == 1 and "changes argument 1" in found[0]
    assert "in place at" not in found[0]


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


IPV4_TASK = (
    "Write a Python function is_valid_ipv4(s: str) -> bool that checks whether a string is "
    "a dotted-decimal IPv4 address: four parts separated by dots, each of digits only, "
    'between 0 and 255, without leading zeros ("0" itself is fine, "01" is not).'
)
IPV4_LOOSE = (  # accepts leading zeros; every test it wrote passes
    "def is_valid_ipv4(s):\n"
    "    parts = s.split('.')\n"
    "    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts)"
)
IPV4_TESTS = "assert is_valid_ipv4('0.0.0.0') is True\nassert is_valid_ipv4('1.2.3') is False"


def test_code_improve_asks_for_a_test_of_a_value_the_request_quotes() -> None:
    """Code that passes all its tests, none of which uses the "01" the request quotes,
    gets a finding quoting the request's words; a test using it ends the finding."""
    found = code_improve_hooks.check({"task": IPV4_TASK}, join(IPV4_LOOSE, IPV4_TESTS))
    assert found == [
        'No test uses "01", which the request quotes: `...only, between 0 and 255, without '
        'leading zeros ("0" itself is fine, "01" is not)`. Add a test of what the request '
        "says for it, worked out by hand, and make the code do that."
    ]
    covered = IPV4_TESTS + "\nassert is_valid_ipv4('01.2.3.4') is False"
    strict = IPV4_LOOSE.replace("p.isdigit()", "p.isdigit() and str(int(p)) == p")
    assert code_improve_hooks.check({"task": IPV4_TASK}, join(strict, covered)) == []
    # The failing test is the finding then: the quoted value is used.
    failing = code_improve_hooks.check({"task": IPV4_TASK}, join(IPV4_LOOSE, covered))
    assert failing and not any("quotes" in f for f in failing)


def test_code_improve_rewrites_code_with_any_finding_but_an_untested_quoted_value() -> None:
    """Only findings that a quoted value no test uses call for an edit, not a fresh start."""
    quoted = code_improve_hooks.check({"task": IPV4_TASK}, join(IPV4_LOOSE, IPV4_TESTS))
    assert len(quoted) == 1 and not code_improve_hooks.rewrite(quoted)
    failing = code_improve_hooks.check(
        {"task": IPV4_TASK},
        join(IPV4_LOOSE, IPV4_TESTS + "\nassert is_valid_ipv4('01.2.3.4') is False"),
    )
    assert failing and code_improve_hooks.rewrite(failing)
    assert code_improve_hooks.rewrite([*quoted, *failing])
    rewriter = load_job("code-improve").rewriter  # the job file names the hooks
    assert rewriter is not None and not rewriter(quoted) and rewriter(failing)


NO_IMPORT_MEDIAN = (  # right for an odd count; an even one reaches a module never imported
    "def median(values: list[float]) -> float:\n    s = sorted(values)\n    n = len(s)\n"
    "    if n % 2:\n        return s[n // 2]\n"
    "    return statistics.mean(s[n // 2 - 1 : n // 2 + 1])"
)


@pytest.mark.parametrize("errors", ["", " It must raise ValueError for an empty list."])
def test_code_improve_flags_a_name_the_code_never_bound_on_a_call_near_its_tests(
    errors: str,
) -> None:
    """The code's one test (an odd count) passes; a call near it with an even count raises
    NameError, a module never imported. That is a finding whether or not the request names
    an error to raise, and it says what a NameError means, not which error to raise."""
    task = "Write a Python function median(values: list[float]) -> float." + errors
    found = code_improve_hooks.check(
        {"task": task}, join(NO_IMPORT_MEDIAN, "assert median([3, 1, 2]) == 2")
    )
    (finding,) = found
    assert "raises NameError: name 'statistics' is not defined" in finding
    assert finding.endswith(
        ": the code uses a name it never defines (a helper called under another name than "
        "its own, a module not imported). Define it, or call the one meant."
    )
    fixed = NO_IMPORT_MEDIAN.replace("def median", "import statistics\n\n\ndef median")
    again = code_improve_hooks.check({"task": task}, join(fixed, "assert median([3, 1, 2]) == 2"))
    assert not any("NameError" in f for f in again)


ROTATE = (
    "def rotate_clockwise(matrix: list[list[int]]) -> list[list[int]]:\n"
    "    return [list(row) for row in zip(*matrix[::-1])]"
)
ROTATE_TESTS = (  # a test function's own variable, as a parametrized test's would be
    "assert rotate_clockwise([[1, 2, 3]]) == [[1], [2], [3]]\n\n\n"
    "def test_square():\n    matrix = [[1, 2], [3, 4]]\n"
    "    assert rotate_clockwise(matrix) == [[3, 1], [4, 2]]\n\n\ntest_square()"
)


def test_code_improve_finds_nothing_in_right_code_whose_test_calls_it_on_its_own_variable() -> None:
    """`rotate_clockwise(matrix)` inside a test reads the test's variable: run alone, as a
    call near the tests, it would raise NameError whatever the code does, which is no
    name the code failed to define."""
    task = (
        "Write a Python function rotate_clockwise(matrix: list[list[int]]) -> "
        "list[list[int]] that rotates a matrix 90 degrees clockwise."
    )
    assert code_improve_hooks.check({"task": task}, join(ROTATE, ROTATE_TESTS)) == []


ROTATE_TASK = (
    "Write a Python function rotate_clockwise(matrix: list[list[int]]) -> "
    "list[list[int]] that rotates a matrix 90 degrees clockwise."
)
WITHOUT_PYTEST = (
    " The tests run without pytest: write each as a plain `assert` statement at the top "
    "level (no `import pytest`, no `@pytest` decorators)."
)
ROTATE_TEST = "assert rotate_clockwise([[1, 2, 3]]) == [[1], [2], [3]]"
PARAMETRIZED = (
    "@pytest.mark.parametrize('m, e', [([[1]], [[1]])])\n"
    "def test_rotate(m, e):\n    assert rotate_clockwise(m) == e"
)


@pytest.mark.parametrize(
    ("code", "tests", "finding"),
    [
        (
            ROTATE,
            ROTATE_TEST + "\n" + PARAMETRIZED,
            "Failing test `@pytest.mark.parametrize('m, e', [([[1]], [[1]])])`: NameError: "
            "name 'pytest' is not defined." + WITHOUT_PYTEST,
        ),
        (
            "import pytest\n\n" + ROTATE,
            ROTATE_TEST,
            "The code fails before any test runs: ModuleNotFoundError: No module named "
            "'pytest' (line 1)." + WITHOUT_PYTEST,
        ),
        (
            "import numpy as np\n\n" + ROTATE,
            ROTATE_TEST,
            "The code fails before any test runs: ModuleNotFoundError: No module named "
            "'numpy' (line 1). Only Python's standard library is there: write the code "
            "without `numpy`.",
        ),
    ],
)
def test_code_improve_says_what_to_write_where_a_module_is_not_there(
    code: str, tests: str, finding: str
) -> None:
    """The tests run with the standard library only: pytest used in the tests or imported,
    or a third-party module imported by the code, is a finding that says what to write
    instead, and right code failing only such tests is not told to fix the code."""
    assert code_improve_hooks.check({"task": ROTATE_TASK}, join(code, tests)) == [finding]
