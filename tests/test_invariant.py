"""Self-Refine's invariant over every built-in job, against the simulator: each refine call
carries the record's input, the latest answer, its feedback and every earlier pair, and
no request repeats another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import Settings, run
from pipeline.core.jobs import builtin_jobs
from pipeline.core.loader import load_job
from pipeline.core.prompts import field_text
from pipeline.core.trace import steps_of
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

PAPER = Path(__file__).resolve().parent / "fixtures" / "paper"


def records_for(name: str) -> list[dict[str, Any]]:
    if name == "code-improve":
        return tasks(4)
    rows = [orjson.loads(line) for line in (PAPER / f"{name}.jsonl").read_bytes().splitlines()]
    return [{**row, "id": f"r{i}"} for i, row in enumerate(rows[:4])]


@pytest.mark.parametrize("name", sorted(builtin_jobs()))
def test_every_refine_call_carries_the_whole_history(name: str, tmp_path: Path) -> None:
    """--max-iters 2 --min-iters 1: every refine call holds each shown input field, every
    earlier iteration's answer, every earlier feedback's actions and what the checks found;
    no two requests carry the same messages."""
    job = load_job(name)
    rows = records_for(name)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    with Simulator(SimConfig(p_done=0.0)) as sim:
        settings = Settings(model="sim", base_url=sim.url, max_iters=2, min_iters=1)
        summary = run(name, inp, tmp_path / "run", settings, api_key="k", show_progress=False)
        sent = [orjson.dumps(b["messages"]) for b in sim.completed_bodies()]
    assert summary.exit_code == 0
    assert len(set(sent)) == len(sent)
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
