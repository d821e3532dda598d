"""The simulator's answer key: a model right at one rate on first drafts and another on
refinements, sampling afresh above temperature 0, driven by the real ``openai`` client."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from pipeline.testing.simulator import AnswerKey, SimConfig, Simulator, main
from tests.helpers import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = [
    {"input": f"Ana has {10 + i} apples and buys {i % 7 + 1} more. How many now?",
     "target": f"She has {10 + i} + {i % 7 + 1}.\n#### {11 + i + i % 7:,}"}
    for i in range(200)
]  # fmt: skip
RETURNED = re.compile(r"```python\ndef solution\(\):\n    return (-?[\d.]+)\n```")


def first_draft(question: str) -> list[ChatCompletionMessageParam]:
    """A generate request about ``question``."""
    return [
        {"role": "system", "content": "Solve it."},
        {"role": "user", "content": f"Write solution().\n\nThe problem:\n\n{question}"},
    ]


def refinement(question: str) -> list[ChatCompletionMessageParam]:
    """A refine request about ``question``: it carries an earlier answer and its feedback."""
    return [
        *first_draft(question),
        {"role": "assistant", "content": "def solution():\n    return 1"},
        {"role": "user", "content": "Review it."},
        {"role": "assistant", "content": '{"actions": ["fix"], "done": false}'},
        {"role": "user", "content": "Fix it."},
    ]


def returned(client: openai.OpenAI, messages: list[ChatCompletionMessageParam], **kw: Any) -> float:
    """The number the simulator's program returns."""
    reply = client.chat.completions.create(model="m", messages=messages, **kw)
    found = RETURNED.fullmatch(reply.choices[0].message.content or "")
    assert found is not None, reply.choices[0].message.content
    return float(found.group(1))


def answer(i: int) -> float:
    """The right answer to question ``i``."""
    return float(11 + i + i % 7)


@pytest.fixture
def key() -> AnswerKey:
    """The answer key of QUESTIONS."""
    return AnswerKey.from_records(QUESTIONS)


@pytest.fixture
def sim(key: AnswerKey) -> Iterator[Simulator]:
    """A simulator right on 20% of first drafts and 90% of refinements."""
    with Simulator(SimConfig(answer_key=key, p_right=0.2, p_right_refined=0.9)) as server:
        yield server


def client(server: Simulator) -> openai.OpenAI:
    """The real openai client on ``server``."""
    return openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=5.0)


def test_first_drafts_and_refinements_are_right_at_their_own_rates(sim: Simulator) -> None:
    """Over 200 questions about 20% of first drafts and 90% of refinements are right."""
    with client(sim) as c:
        drafts = [returned(c, first_draft(q["input"]), temperature=0) for q in QUESTIONS]
        refined = [returned(c, refinement(q["input"]), temperature=0) for q in QUESTIONS]
    right_first = sum(v == answer(i) for i, v in enumerate(drafts))
    right_refined = sum(v == answer(i) for i, v in enumerate(refined))
    assert 25 <= right_first <= 55 and 170 <= right_refined <= 195, (right_first, right_refined)


def test_temperature_zero_repeats_and_sampling_draws_afresh(sim: Simulator) -> None:
    """The same request at temperature 0 gets the same program every time; at temperature 1
    each asking is a new draw, so some question's samples differ."""
    with client(sim) as c:
        messages = first_draft(QUESTIONS[3]["input"])
        assert len({returned(c, messages, temperature=0) for _ in range(4)}) == 1
        varied = [
            {returned(c, first_draft(q["input"]), temperature=1.0) for _ in range(4)}
            for q in QUESTIONS[:20]
        ]
    assert any(len(values) > 1 for values in varied)


def test_requests_outside_the_key_and_feedback_are_answered_as_before(key: AnswerKey) -> None:
    """An unknown question and a request for structured output get the simulator's usual
    answers, identical with and without an answer key."""
    feedback: Any = {
        "type": "json_schema",
        "json_schema": {"name": "f", "schema": {"type": "object", "properties": {}}},
    }
    outputs = []
    for config in (SimConfig(), SimConfig(answer_key=key)):
        with Simulator(config) as server, client(server) as c:
            plain = c.chat.completions.create(model="m", messages=first_draft("Unknown task."))
            schema = c.chat.completions.create(
                model="m", messages=first_draft(QUESTIONS[0]["input"]), response_format=feedback
            )
            outputs.append((plain.choices[0].message.content, schema.choices[0].message.content))
    assert outputs[0] == outputs[1]
    assert "def solution" not in (outputs[1][0] or "")


def test_the_key_reads_gsm_targets_and_names_a_bad_line(tmp_path: Path) -> None:
    """Targets like "#### 1,200" are read as numbers; a line without one is named."""
    found = AnswerKey.from_records([{"input": "Q?", "target": "so #### 1,200"}])
    assert found.find("The problem:\n\nQ?\n") == 1200.0 and found.find("other") is None
    bad = write_jsonl(tmp_path / "key.jsonl", [QUESTIONS[0], {"input": "Q?", "target": "x"}])
    with pytest.raises(ValueError, match=r"key\.jsonl:2: needs a 'input' text"):
        AnswerKey.read(bad)


def test_cli_answer_key_reaches_the_server(tmp_path: Path, capsys: Any) -> None:
    """`--answer-key FILE --p-right 1` serves right programs; a bad file exits 2 naming it."""
    path = write_jsonl(tmp_path / "key.jsonl", QUESTIONS[:5])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pipeline.testing.simulator", "--port", "0"]
    cmd += ["--answer-key", str(path), "--p-right", "1", "--p-right-refined", "0"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[1]
            with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as c:
                assert returned(c, first_draft(QUESTIONS[2]["input"]), temperature=0) == 15.0
                assert returned(c, refinement(QUESTIONS[2]["input"]), temperature=0) != 15.0
        finally:
            proc.terminate()
            proc.wait(timeout=5)
    assert main(["--answer-key", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["--answer-key", str(path), "--p-right-refined", "1.5"]) == 2
