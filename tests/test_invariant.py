"""Self-Refine's invariant over every built-in job, against the simulator: each refine call
carries the record's input, the latest answer, its feedback and every earlier pair, and
no request repeats another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import Settings, run
from pipeline.backends.batch import BatchBackend, BatchConfig
from pipeline.core.jobs import builtin_jobs
from pipeline.core.loader import load_job
from pipeline.core.prompts import FEEDBACK_AGAIN, field_text, findings_text
from pipeline.core.trace import steps_of
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

PAPER = Path(__file__).resolve().parent / "fixtures" / "paper"


def records_for(name: str) -> list[dict[str, Any]]:
    if name == "code-improve":
        return tasks(4)
    rows = [orjson.loads(line) for line in (PAPER / f"{name}.jsonl").read_bytes().splitlines()]
    return [{**row, "id": f"r{i}"} for i, row in enumerate(rows[:4])]


def _sent(body: dict[str, Any]) -> bytes:
    """A request's conversation: its messages (and Anthropic's system blocks), breakpoints
    left out (they move as a conversation grows)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k != "cache_control"}
        return [plain(v) for v in value] if isinstance(value, list) else value

    return orjson.dumps([plain(body.get("system")), plain(body["messages"])])


@pytest.mark.parametrize("provider", ["openai", "anthropic", "anthropic-batch"])
@pytest.mark.parametrize("name", sorted(builtin_jobs()))
def test_every_refine_call_carries_the_whole_history(
    name: str, provider: str, tmp_path: Path
) -> None:
    """--max-iters 2 --min-iters 1, on an OpenAI-compatible endpoint, on Claude over
    Anthropic's Messages API and through its Message Batches (every round batched): every
    refine call holds each shown input field, every earlier iteration's answer, every
    earlier feedback's actions and what the checks found; no two requests carry the same
    messages."""
    job = load_job(name)
    rows = records_for(name)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    config = SimConfig(p_done=0.0, batch_validating_s=0.02, batch_delay_s=0.1)
    with Simulator(config) as sim:
        backend = None
        if provider == "openai":
            settings = Settings(model="sim", base_url=sim.url, max_iters=2, min_iters=1)
        else:
            url, model = sim.anthropic_url, "anthropic:claude-sonnet-4-6"
            batch = provider == "anthropic-batch"
            settings = Settings(
                model=model, base_url=url, max_iters=2, min_iters=1, batch=batch, poll=0.02
            )
            if batch:
                backend = BatchBackend(config=BatchConfig(creates_per_s=100, polls_per_s=500))
        summary = run(
            name,
            inp,
            tmp_path / "run",
            settings,
            api_key="k",
            show_progress=False,
            backend=backend,
        )
        bodies = sim.completed_bodies()
        batched = [r for r in sim.requests if r.is_batch]
        sent = [_sent(b) for b in bodies]
        claude = [b for b in bodies if isinstance(b.get("system"), list)]
    assert summary.exit_code == 0
    assert len(set(sent)) == len(sent)
    # every call went over the provider's own API (through batches: every one of them)
    assert len(claude) == (0 if provider == "openai" else len(bodies))
    assert len(batched) == (len(bodies) if provider == "anthropic-batch" else 0)
    shown = [f.name for f in job.inputs if f.use == "prompt"]
    by_id = {row["id"]: row for row in rows}
    refines = 0
    for trace in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        row = by_id[trace["id"]]
        steps = trace["steps"]
        for call, asked in zip(steps, steps_of(steps), strict=True):
            if call["role"] != "refine":
                continue
            refines += 1
            text = "\n".join(m["content"] for m in asked.messages)
            for f in job.inputs:
                if f.name in shown and row.get(f.name) is not None:
                    assert field_text(row[f.name], f.join) in text
            earlier = [s for s in steps if s["iteration"] < call["iteration"]]
            for answer in (s for s in earlier if s.get("iteration_answer")):
                assert answer["output"] in text
                assert all(finding in text for finding in answer.get("checks") or [])
            for fb in (s for s in earlier if s["role"] == "feedback" and s["parsed"]):
                assert all(action in text for action in fb["parsed"][job.actions_field])
    assert refines >= len(rows)


def test_the_feedback_rules_are_said_once_per_conversation(tmp_path: Path) -> None:
    """The first feedback request of a record's conversation carries the job's feedback
    prompt whole; each later one says what the checks found of its answer and points back
    to it, so every request holds the rules once, and every feedback still parses."""
    job = load_job("code-improve")
    rules = "Judge three things: correctness"  # a line of its feedback prompt
    assert rules in job.feedback_prompt
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    with Simulator(SimConfig(p_done=0.0)) as sim:
        settings = Settings(model="sim", base_url=sim.url, max_iters=2, min_iters=2)
        summary = run(
            "code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False
        )
    assert summary.exit_code == 0
    for trace in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        steps = steps_of(trace["steps"])
        feedback = [s for s in steps if s.role == "feedback"]
        assert len(feedback) == 3 and all(s.parsed is not None for s in feedback)
        assert all(sum(m["content"].count(rules) for m in s.messages) == 1 for s in steps[1:])
        assert rules in feedback[0].messages[-1]["content"]
        for s, answer in zip(feedback[1:], [x for x in steps if x.is_draft][1:], strict=True):
            request = s.messages[-1]["content"]
            assert request.endswith(FEEDBACK_AGAIN) and rules not in request
            assert findings_text(answer.checks) in request  # this answer's own findings
