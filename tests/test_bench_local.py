"""scripts/bench_local.py's pieces that run without a model: the repeated request file, and
the old prompt layout --layouts compares with."""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import orjson

from pipeline import RunSummary, Settings, arun
from pipeline.backends.realtime import RealTimeBackend
from pipeline.client.chat import OpenAIClient
from pipeline.client.limits import Limiter
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl
from tests.helpers import sent as sent_of
from tests.scripts import load_script

MODEL = "gpt-4o-mini"


def shared(a: str, b: str) -> int:
    """Characters at the start of ``a`` and ``b`` that are the same."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_repeat_sends_each_request_that_many_times_under_ids_of_their_own(tmp_path: Path) -> None:
    bench = load_script("bench_local")
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"id": "a", "task": "one"}\n{"id": "b", "task": "two"}\n\n')
    out = bench.repeated(source, 3, tmp_path / "out.jsonl")
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [row["id"] for row in rows] == ["a", "b", "a~2", "b~2", "a~3", "b~3"]
    assert [row["task"] for row in rows] == ["one", "two"] * 3
    assert bench.repeated(source, 1, tmp_path / "unused.jsonl") == source
    assert not (tmp_path / "unused.jsonl").exists()


def test_old_layout_shows_each_call_its_instruction_first(tmp_path: Path) -> None:
    """--layouts' old layout: every call is the system message and one user turn; after the
    generate call that turn opens with the role's instruction and the record's task comes
    later, so consecutive calls of a record share no more than the system message."""
    bench = load_script("bench_local")
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    with Simulator(SimConfig(p_done=0.0)) as sim:
        client = OpenAIClient(
            model=MODEL, base_url=sim.url, api_key="k", timeout=30, max_retries=0, limiter=Limiter()
        )
        settings = Settings(model=MODEL, base_url=sim.url, max_iters=1, min_iters=1)
        old = bench.OldLayout(client)

        async def main() -> RunSummary:
            try:
                return await arun(
                    "code-improve",
                    inp,
                    tmp_path / "run",
                    settings,
                    backend=RealTimeBackend(old),
                    show_progress=False,
                )
            finally:
                await client.aclose()

        summary = anyio.run(main)
    assert summary.state == "finished"
    traces = read_jsonl(tmp_path / "run" / "traces.jsonl")
    task = {str(r["id"]): str(r["task"]) for r in tasks(2)}
    assert sorted(str(t["id"]) for t in traces) == sorted(task)
    for trace in traces:
        sent = sent_of(trace)
        assert [step["role"] for step in trace["steps"]] == [
            "generate",
            "feedback",
            "refine",
            "feedback",
        ]
        assert all([m["role"] for m in messages] == ["system", "user"] for messages in sent)
        turns = [messages[1]["content"] for messages in sent]
        assert turns[0].index(task[trace["id"]]) >= 0
        for before, turn in itertools.pairwise(turns):
            assert turn.index(task[trace["id"]]) > shared(before, turn)
