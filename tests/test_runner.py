"""End-to-end runs through the library API against the simulator (real HTTP, real openai client)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from pipeline import ConfigError, RunDirError, RunLocked, RunSummary, Settings, arun, load_job, run
from pipeline.backends.realtime import RealTimeBackend
from pipeline.commands.status import collect
from pipeline.core.trace import steps_of
from pipeline.runs.rundir import RunDir
from pipeline.testing.simulator import SimConfig, Simulator
from tests.fakes import ScriptedClient
from tests.helpers import read_jsonl, sent, tasks, write_jsonl

ROOT = Path(__file__).resolve().parents[1]

OUTPUT_FIELDS = {
    "id",
    "line",
    "status",
    "output",
    "iterations",
    "chosen_iteration",
    "stop_reason",
    "score",
    "usage",
    "cost_usd",
    "error",
}
STEP_FIELDS = {
    "role",
    "model",
    "iteration",
    "added",
    "response",
    "parsed",
    "usage",
    "latency_s",
    "attempts",
    "error",
}


def settings(sim: Simulator, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(model="sim-model", base_url=sim.url, max_iters=2, concurrency=16)
    base.update(kw)
    return Settings(**base)


def go(sim: Simulator, inp: Path, out: Path, **kw: Any) -> RunSummary:
    """Run code-improve over ``inp`` into ``out`` against ``sim``; ``kw`` adjusts settings."""
    return run("code-improve", inp, out, settings(sim, **kw), api_key="k", show_progress=False)


def test_run_writes_one_output_and_trace_per_record(sim: Simulator, tmp_path: Path) -> None:
    """Every record ends as one output line with the contract's fields and one full trace."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    summary = run(
        "code-improve", inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False
    )
    assert summary.exit_code == 0
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(40))
    assert all(set(o) >= OUTPUT_FIELDS and o["status"] == "done" for o in outs)
    traces = {t["id"]: t for t in read_jsonl(tmp_path / "run" / "traces.jsonl")}
    assert set(traces) == {o["id"] for o in outs}
    for o in outs:
        steps = traces[o["id"]]["steps"]
        assert all(set(s) >= STEP_FIELDS for s in steps)
        assert steps[0]["role"] == "generate"
        assert o["usage"]["calls"] == len(steps)
        assert o["iterations"] == max(s["iteration"] for s in steps)
        assert o["stop_reason"] in {"done", "score_threshold", "max_iters", "no_change"}
    # The run used every call the server completed, once.
    assert sum(o["usage"]["calls"] for o in outs) == len(sim.completed_bodies())


def test_refine_calls_carry_all_earlier_feedback_and_no_request_repeats(tmp_path: Path) -> None:
    """Against the simulator, with defaults: each refine call holds the record's input, every
    earlier answer and every earlier feedback's actions; no request repeats an earlier one."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    with Simulator(SimConfig(p_done=0.0)) as sim:
        run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim, max_iters=3),
            api_key="k",
            show_progress=False,
        )
        bodies = [orjson.dumps(b["messages"]) for b in sim.completed_bodies()]
    assert len(set(bodies)) == len(bodies)
    checked = 0
    tasks_by_id = {t["id"]: t["task"] for t in tasks(10)}
    for trace in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        steps = trace["steps"]
        for r, asked in zip(steps, sent(trace), strict=True):
            if r["role"] != "refine":
                continue
            checked += r["iteration"] - 1
            text = "\n".join(m["content"] for m in asked)
            assert tasks_by_id[trace["id"]] in text
            for fb in (
                s for s in steps if s["role"] == "feedback" and s["iteration"] < r["iteration"]
            ):
                assert all(action in text for action in fb["parsed"]["actions"])
            for ans in (
                s for s in steps if s.get("iteration_answer") and s["iteration"] < r["iteration"]
            ):
                assert ans["output"] in text
    assert checked > 0, "some refine must have had history beyond the latest attempt"


def test_max_iters_zero_is_generation_only(sim: Simulator, tmp_path: Path) -> None:
    """--max-iters 0 makes exactly one generate call per record and no feedback."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(12))
    go(sim, inp, tmp_path / "run", max_iters=0)
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert {o["stop_reason"] for o in outs} == {"max_iters"}
    assert len(sim.completed_bodies()) == 12
    assert all("response_format" not in b for b in sim.completed_bodies())


def test_rerun_of_finished_run_makes_no_calls(sim: Simulator, tmp_path: Path) -> None:
    """Re-running the identical command on a finished RUN_DIR calls nothing and changes nothing."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(8))
    run("code-improve", inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False)
    calls = len(sim.requests)
    before = (tmp_path / "run" / "outputs.jsonl").read_bytes()
    summary = run(
        "code-improve", inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False
    )
    assert summary.exit_code == 0
    assert len(sim.requests) == calls
    assert (tmp_path / "run" / "outputs.jsonl").read_bytes() == before


def test_appended_records_are_the_only_new_work(sim: Simulator, tmp_path: Path) -> None:
    """Appending records to the input and re-running processes only the new ones."""
    rows = [{"task": f"Write function {i}"} for i in range(6)]  # no id: content hashes
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    go(sim, inp, tmp_path / "run", max_iters=0)
    write_jsonl(inp, rows + [{"task": f"Write function {i}"} for i in range(6, 9)])
    go(sim, inp, tmp_path / "run", max_iters=0)
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 9 and len({o["id"] for o in outs}) == 9
    assert len(sim.requests) == 9


def test_interrupted_run_resumes_without_repeating_calls(tmp_path: Path) -> None:
    """Cancelling mid-run and re-running finishes every record and repeats no completed call."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    with Simulator(SimConfig(latency_s=0.02, p_done=0.2)) as sim:

        async def interrupted() -> None:
            with anyio.move_on_after(0.4):
                await arun(
                    "code-improve",
                    inp,
                    tmp_path / "run",
                    # without checks the simulator's answers (no tests) may stop early
                    settings(sim, concurrency=8, checks=False),
                    api_key="k",
                    show_progress=False,
                )

        anyio.run(interrupted)
        first = len(sim.completed_bodies())
        assert 0 < len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) < 30
        summary = go(sim, inp, tmp_path / "run", concurrency=8, checks=False)
        bodies = Counter(
            orjson.dumps(b["messages"], option=orjson.OPT_SORT_KEYS) for b in sim.completed_bodies()
        )
    assert first > 0
    assert summary.exit_code == 0
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(30))
    used = Counter(
        orjson.dumps(m, option=orjson.OPT_SORT_KEYS)
        for t in read_jsonl(tmp_path / "run" / "traces.jsonl")
        for m in sent(t)
    )
    # Every traced step is a call the server completed...
    assert not used - bodies
    # ...and only calls in flight when the run was cancelled were made a second time.
    assert sum((bodies - used).values()) <= 8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "other-model"}, "model"),
        ({"max_iters": 1}, "max_iters"),
        ({"id_field": "task"}, "id_field"),
    ],
)
def test_different_settings_on_same_run_dir_are_refused(
    sim: Simulator, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """A different model, max-iters or id field on an existing RUN_DIR is refused clearly."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    run("code-improve", inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False)
    with pytest.raises(RunDirError, match=message):
        go(sim, inp, tmp_path / "run", **change)


def test_different_job_or_input_is_refused(sim: Simulator, tmp_path: Path) -> None:
    """Another job file or another input file on an existing RUN_DIR is refused."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    run("code-improve", inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False)
    other = write_jsonl(tmp_path / "other.jsonl", tasks(3, start=100))
    with pytest.raises(ConfigError, match="not the input"):
        run(
            "code-improve", other, tmp_path / "run", settings(sim), api_key="k", show_progress=False
        )
    job_file = tmp_path / "job.toml"
    source = Path(load_job("code-improve").source)
    shutil.copy(source.parent / "code_improve_hooks.py", tmp_path)
    job_file.write_text(
        Path(load_job("code-improve").source)
        .read_text()
        .replace("senior software engineer", "careful engineer")
    )
    with pytest.raises(RunDirError, match="job"):
        run(str(job_file), inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False)


def test_bad_lines_reported_and_valid_records_processed(sim: Simulator, tmp_path: Path) -> None:
    """Broken lines go to errors.jsonl with line and reason; the rest run; exit is partial."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(
        b'{"id": "a", "task": "t1"}\n{broken\n[1, 2]\n{"id": "b"}\n'
        b'{"id": "c", "task": 5}\n\n{"id": "a", "task": "t9"}\n'
        b'{"id": "d", "task": "\xff"}\n{"id": "e", "task": "t2"}\n'
    )
    summary = go(sim, inp, tmp_path / "run", max_iters=0)
    assert summary.exit_code == 1
    errors = {e["line"]: e for e in read_jsonl(tmp_path / "run" / "errors.jsonl")}
    assert sorted(errors) == [2, 3, 4, 5, 7, 8]
    assert errors[4]["field"] == "task" and "missing" in errors[4]["error"]
    assert "duplicate" in errors[7]["error"] and "line 1" in errors[7]["error"]
    assert "UTF-8" in errors[8]["error"]
    assert {o["id"] for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")} == {"a", "e"}
    # A rerun neither repeats the error lines nor the records.
    go(sim, inp, tmp_path / "run", max_iters=0)
    assert len(read_jsonl(tmp_path / "run" / "errors.jsonl")) == 6


def test_wrong_key_stops_run_fast_without_failing_records(tmp_path: Path) -> None:
    """A 401 stops the whole run (exit 3) after a handful of calls; no record is marked failed."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(300))
    with Simulator(SimConfig(api_key="sk-right")) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim, concurrency=4),
            api_key="sk-wrong",
            show_progress=False,
        )
        calls = len(sim.requests)
    assert summary.exit_code == 3
    assert summary.message is not None and "401" in summary.message
    assert calls <= 8
    assert read_jsonl(tmp_path / "run" / "outputs.jsonl") == []


def test_unknown_model_stops_run(tmp_path: Path) -> None:
    """An unknown model stops the run with a configuration exit status."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(50))
    with Simulator(SimConfig(models=("gpt-x",))) as sim:
        summary = go(sim, inp, tmp_path / "run", model="nope")
    assert summary.exit_code == 2
    assert "nope" in (summary.message or "")


def test_secret_key_never_written(tmp_path: Path) -> None:
    """The API key appears in no file of the run directory, even after an auth failure."""
    canary = "sk-canary-7f3e9a1b2c"
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    with Simulator(SimConfig()) as sim:
        run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim),
            api_key=canary,
            show_progress=False,
        )
        assert sim.requests[0].headers["authorization"] == f"Bearer {canary}"
    with Simulator(SimConfig(api_key="sk-other")) as sim:
        run(
            "code-improve",
            inp,
            tmp_path / "run2",
            settings(sim),
            api_key=canary,
            show_progress=False,
        )
    for path in list((tmp_path / "run").iterdir()) + list((tmp_path / "run2").iterdir()):
        assert canary.encode() not in path.read_bytes(), path


def test_second_process_on_same_run_dir_is_refused(sim: Simulator, tmp_path: Path) -> None:
    """While one run holds RUN_DIR, another is refused with a clear message."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    with RunDir(tmp_path / "run").lock(), pytest.raises(RunLocked, match="in use"):
        run("code-improve", inp, tmp_path / "run", settings(sim), api_key="k", show_progress=False)


def test_status_counts_a_finished_run(sim: Simulator, tmp_path: Path) -> None:
    """`status` reports done, failed, pending and tokens from the run directory."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    go(sim, inp, tmp_path / "run", limit=6)
    info = collect(tmp_path / "run")
    assert (info["done"], info["failed"], info["pending"], info["records"]) == (6, 0, 0, 6)
    assert info["state"] == "finished"
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert info["prompt_tokens"] == sum(o["usage"]["prompt_tokens"] for o in outs) > 0


def test_thousand_loops_in_flight(tmp_path: Path) -> None:
    """--concurrency 1000 keeps 1,000 loops in flight at once."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1200))
    gate = ScriptedClient(default="def f():\n    return 1", gate=1000)
    summary = run(
        "code-improve",
        inp,
        tmp_path / "run",
        Settings(model="fake", max_iters=0, concurrency=1000),
        backend=RealTimeBackend(gate),
        show_progress=False,
    )
    assert summary.exit_code == 0
    assert gate.peak == 1000
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 1200


def test_thousand_concurrent_http_loops(tmp_path: Path) -> None:
    """A thousand loops share the HTTP client against the simulator and all finish."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1000))
    # A long latency, so a loaded machine still sends many requests within one answer's time.
    with Simulator(SimConfig(latency_s=1.5, p_done=1.0)) as sim:
        summary = go(sim, inp, tmp_path / "run", concurrency=1000, max_iters=1)
        arrivals = sorted(r.t for r in sim.requests)
    assert summary.exit_code == 0
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 1000
    # Far more requests arrived during the first answer's latency than a small pool could send.
    assert sum(1 for t in arrivals if t < arrivals[0] + 1.5) > 100


def test_min_iters_forces_a_refinement(tmp_path: Path) -> None:
    """With a critic that always says done, --min-iters 1 still refines every record once."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(6))
    with Simulator(SimConfig(p_done=1.0)) as sim:
        go(sim, inp, tmp_path / "run", min_iters=1)
        with pytest.raises(ConfigError, match="min-iters"):
            go(sim, inp, tmp_path / "bad", min_iters=3)
    for trace in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        # (an attempt asked again is not an iteration: its repair is)
        built = steps_of(trace["steps"])
        steps = [s for s, b in zip(trace["steps"], built, strict=True) if not b.superseded]
        roles = [s["role"] for s in steps]
        assert roles[:4] == ["generate", "feedback", "refine", "feedback"]


def test_pool_stops_producer_quietly_when_workers_fail(tmp_path: Path) -> None:
    """A fatal error with the producer blocked on a full stream surfaces alone, every time."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(200))
    for attempt in range(10):
        with Simulator(SimConfig(api_key="sk-right")) as sim:
            summary = run(
                "code-improve",
                inp,
                tmp_path / f"run{attempt}",
                settings(sim, concurrency=1),
                api_key="sk-wrong",
                show_progress=False,
            )
        assert summary.exit_code == 3
