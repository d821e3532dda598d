"""Run directories hold each message once: a finished run leaves one copy of every call, and
a run directory written before (every step's conversation whole) still reads and resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import Settings, run
from pipeline.core.trace import steps_of
from pipeline.runs.journal import read_steps
from pipeline.runs.traces import read_traces
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, sent, tasks, write_jsonl
from tests.journal_faults import POINTS

ROOT = Path(__file__).resolve().parents[2]


def go(sim: Simulator, inp: Path, out: Path, **kw: Any) -> int:
    settings = Settings(model="sim-model", base_url=sim.url, max_iters=2, min_iters=2, **kw)
    return run("code-improve", inp, out, settings, api_key="k", show_progress=False).exit_code


def whole(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A record's stored steps in the older form: each with its conversation whole."""
    out = []
    for d, step in zip(stored, steps_of(stored), strict=True):
        old = {k: v for k, v in d.items() if k not in ("extends", "added")}
        out.append({**old, "messages": step.messages})
    return out


def test_a_finished_run_leaves_one_copy_of_each_call(tmp_path: Path) -> None:
    """After the run the journal is empty, and each call's request is in traces.jsonl with
    each message once: rebuilt, it is exactly the body the server received."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(8))
    with Simulator(SimConfig(latency_s=0.0, p_done=0.0)) as sim:
        assert go(sim, inp, tmp_path / "run") == 0
        bodies = [b["messages"] for b in sim.completed_bodies()]
    assert (tmp_path / "run" / "checkpoint.jsonl").read_bytes() == b""
    traces = read_jsonl(tmp_path / "run" / "traces.jsonl")
    rebuilt = [m for t in traces for m in sent(t)]
    assert sorted(map(orjson.dumps, rebuilt)) == sorted(map(orjson.dumps, bodies))
    for t in traces:  # each step adds its own turns only: the task's text is stored once
        task = next(r["task"] for r in tasks(8) if r["id"] == t["id"])
        assert orjson.dumps(t).count(task.encode()) == 1


def test_a_run_directory_in_the_older_form_reads_and_resumes(tmp_path: Path) -> None:
    """Traces and journal entries whose steps hold their whole conversation (as written
    before) are read as they are; a record journaled part-way resumes from its steps
    without asking any of them again, and the new steps may extend the old ones."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(6))
    rd = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.0, p_done=0.0)) as sim:
        assert go(sim, inp, rd) == 0
        traces = {t["id"]: t for t in read_jsonl(rd / "traces.jsonl")}
        first = {rid: steps_of(t["steps"]) for rid, t in traces.items()}
        # Put the run back as the older form would have left it, r4 and r5 two calls in.
        in_flight = ("r4", "r5")
        write_jsonl(
            rd / "traces.jsonl",
            [{"id": rid, "steps": whole(t["steps"])} for rid, t in traces.items()
             if rid not in in_flight],
        )  # fmt: skip
        outs = [o for o in read_jsonl(rd / "outputs.jsonl") if o["id"] not in in_flight]
        write_jsonl(rd / "outputs.jsonl", outs)
        write_jsonl(
            rd / "checkpoint.jsonl",
            [{"id": rid, "n": n, "step": step}
             for rid in in_flight for n, step in enumerate(whole(traces[rid]["steps"])[:2])],
        )  # fmt: skip
        journaled = read_steps(rd / "checkpoint.jsonl", set())
        assert {rid: [s.messages for s in ss] for rid, ss in journaled.items()} == {
            rid: [s.messages for s in first[rid][:2]] for rid in in_flight
        }
        old = read_traces(rd / "traces.jsonl", {"r0"}, lambda w: None)
        assert old["r0"] == first["r0"]
        before = len(sim.completed_bodies())
        assert go(sim, inp, rd) == 0
        asked = [orjson.dumps(b["messages"]) for b in sim.completed_bodies()[before:]]
    again = {t["id"]: t for t in read_jsonl(rd / "traces.jsonl")}
    assert sorted(again) == [f"r{i}" for i in range(6)]
    for rid in in_flight:
        resumed = steps_of(again[rid]["steps"])
        assert resumed[:2] == first[rid][:2]  # the journaled calls, kept as they were
        kept = {orjson.dumps(s.messages) for s in resumed[:2]}
        assert not kept & set(asked)  # and none asked again
        assert "extends" in again[rid]["steps"][2]  # the new steps in the new form
    later = [
        orjson.dumps(s.messages) for rid in in_flight for s in steps_of(again[rid]["steps"])[2:]
    ]
    assert sorted(later) == sorted(asked)  # the calls after them, each asked once


def refine(*args: str, faults: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`refine ARGS` in a subprocess; with ``faults``, through tests.journal_faults."""
    cmd = ["-m", "tests.journal_faults", *faults] if faults else ["-m", "pipeline.cli"]
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    return subprocess.run(
        [sys.executable, *cmd, *args], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("nth", ["1", "3eager"])
def test_a_kill_during_compaction_loses_no_call(tmp_path: Path, point: str, nth: str) -> None:
    """SIGKILLed while compacting the journal (at the run's end, or mid-run; before or after
    the rename): the re-run finishes every record once, asks again no call it kept (at the
    end, none at all), and leaves an empty journal and no half-written copy."""
    n, concurrency = 16, 4
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(n))
    rd = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.0, p_done=0.0)) as sim:
        args = ("run", "code-improve", str(inp), "--out", str(rd), "--base-url", sim.url,
                "--max-iters", "2", "--concurrency", str(concurrency), "--quiet")  # fmt: skip
        killed = refine(*args, faults=(point, nth))
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert (rd / ".checkpoint.jsonl.compact").exists() == (point == "before_replace")
        finished = len(read_jsonl(rd / "outputs.jsonl"))
        again = refine(*args)
        bodies = Counter(orjson.dumps(b["messages"]) for b in sim.completed_bodies())
    assert again.returncode == 0, again.stderr
    assert (finished == n) == (nth == "1")  # mid-run, some records were still to do
    outs = read_jsonl(rd / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(n))
    traces = read_jsonl(rd / "traces.jsonl")
    assert len(traces) == n
    used = Counter(orjson.dumps(m) for t in traces for m in sent(t))
    assert not used - bodies  # every traced call is one the server answered...
    lost = sum((bodies - used).values())  # ...and each answered call is traced, but those
    assert lost <= (concurrency if nth != "1" else 0)  # in flight at the kill
    assert (rd / "checkpoint.jsonl").read_bytes() == b""
    assert not (rd / ".checkpoint.jsonl.compact").exists()
