"""`refine show RUN_DIR ID`: a record's calls in order, each request as the server got it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from pipeline import Settings, run
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]


def refine(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    return subprocess.run(
        [*REFINE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def shown(run_dir: Path, rid: str) -> list[dict[str, object]]:
    """`refine show RUN_DIR ID --json`, parsed: one object per call."""
    done = refine("show", str(run_dir), rid, "--json")
    assert done.returncode == 0, done.stderr
    return [orjson.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("structured", ["json_schema", "none"])
def test_show_json_gives_each_request_as_the_server_received_it(
    tmp_path: Path, structured: str
) -> None:
    """Every call `refine show --json` prints carries the very messages the server got, in
    the record's order (with a plain-text fallback's schema spelled into the request)."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    rd = tmp_path / "run"
    config = SimConfig(latency_s=0.0, p_done=0.0, structured=structured, fence_json=True)
    with Simulator(config) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=2, concurrency=1)
        summary = run("code-improve", inp, rd, settings, api_key="k", show_progress=False)
        received = [orjson.dumps(b["messages"]) for b in sim.completed_bodies()]
    assert summary.exit_code == 0
    calls = [c for r in tasks(3) for c in shown(rd, r["id"])]
    assert Counter(orjson.dumps(c["messages"]) for c in calls) == Counter(received)
    r0 = [c for c in calls if c["id"] == "r0"]
    assert [c["call"] for c in r0] == list(range(len(r0)))
    assert [c["role"] for c in r0[:3]] == ["generate", "feedback", "refine"]
    assert all(c["finished"] for c in calls)
    assert sum(bool(c.get("chosen")) for c in r0) == 1
    traced = {t["id"]: t["steps"] for t in read_jsonl(rd / "traces.jsonl")}
    assert [c["response"] for c in r0] == [s["response"] for s in traced["r0"]]
    if structured == "none":
        assert any("JSON Schema" in c["messages"][-1]["content"] for c in r0)  # type: ignore[index]


def test_show_prints_a_record_in_flight_from_the_journal(tmp_path: Path) -> None:
    """A record with journaled calls and no trace line yet is shown from the journal, marked
    not finished; an id the run never called is an error naming it."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    rd = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.0, p_done=0.0)) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=1)
        assert (
            run("code-improve", inp, rd, settings, api_key="k", show_progress=False).exit_code == 0
        )
        first = [orjson.dumps(b["messages"]) for b in sim.completed_bodies()]
    # r1 as a kill after its second call leaves it: two journal entries, no lines.
    steps = next(t for t in read_jsonl(rd / "traces.jsonl") if t["id"] == "r1")["steps"]
    write_jsonl(rd / "checkpoint.jsonl", [{"id": "r1", "n": n, "step": steps[n]} for n in (0, 1)])
    write_jsonl(
        rd / "traces.jsonl", [t for t in read_jsonl(rd / "traces.jsonl") if t["id"] != "r1"]
    )
    write_jsonl(
        rd / "outputs.jsonl", [o for o in read_jsonl(rd / "outputs.jsonl") if o["id"] != "r1"]
    )
    calls = shown(rd, "r1")
    assert [c["call"] for c in calls] == [0, 1] and not any(c["finished"] for c in calls)
    assert all(orjson.dumps(c["messages"]) in first for c in calls)
    text = refine("show", str(rd), "r1")
    assert text.returncode == 0 and "not finished (from the journal)" in text.stdout
    assert "call 1: feedback (feedback)" in text.stdout
    missing = refine("show", str(rd), "nope")
    assert missing.returncode == 2 and "no call of record 'nope'" in missing.stderr
