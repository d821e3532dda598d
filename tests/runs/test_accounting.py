"""Every call accounted for: failed calls in traces, --retry-failed, status from the journal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import FatalCallError, Settings, run
from pipeline.backends.realtime import RealTimeBackend
from pipeline.commands.status import collect, render
from pipeline.testing.simulator import SimConfig, Simulator
from tests.fakes import ScriptedClient
from tests.helpers import read_jsonl, sent, tasks, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]


def _code(v: str) -> str:
    return f"```python\n{v}\n```"


def _feedback(done: bool, score: int = 5) -> str:
    return orjson.dumps(
        {"speed": "ok", "readability": "ok", "actions": ["x"], "score": score, "done": done}
    ).decode()


def test_failed_calls_are_traced_and_retry_failed_finishes_without_repeats(
    tmp_path: Path,
) -> None:
    """15% HTTP 500 with no retries: failed records trace the failed call; --retry-failed ends 0."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(60))
    out = tmp_path / "run"
    with Simulator(SimConfig(p_500=0.15, p_done=0.0, faults_seed=3)) as sim:
        base: dict[str, Any] = dict(
            model="sim-model",
            base_url=sim.url,
            max_iters=2,
            max_retries=0,
            concurrency=8,
            checks=False,  # code-improve's check wants tests the simulator's answers lack
        )
        first = run("code-improve", inp, out, Settings(**base), api_key="k", show_progress=False)
        assert first.exit_code == 1
        outputs = {o["id"]: o for o in read_jsonl(out / "outputs.jsonl")}
        traces = {t["id"]: t for t in read_jsonl(out / "traces.jsonl")}
        failed = [rid for rid, o in outputs.items() if o["status"] == "failed"]
        assert failed, "the faults must fail some records"
        for rid in failed:
            last = traces[rid]["steps"][-1]
            assert last["response"] is None and last["error"]["status"] == 500
            assert last["error"]["type"] == "http_500"
            assert last["role"] in ("generate", "feedback", "refine") and sent(traces[rid])[-1]
            # one attempt, or (a probe while the breaker was open, then a counted one) each
            # attempt's status and latency in compact form
            tries = last.get("tries", [])
            assert last["attempts"] == max(1, len(tries))
            assert all(status == 500 and seconds >= 0 for status, seconds in tries)

        # Without --retry-failed, a finished run stays as it is: no call, exit 1 again.
        before = len(sim.requests)
        again = run("code-improve", inp, out, Settings(**base), api_key="k", show_progress=False)
        assert (again.exit_code, len(sim.requests)) == (1, before)

        retry = Settings(**base, retry_failed=True)
        for _ in range(20):
            summary = run("code-improve", inp, out, retry, api_key="k", show_progress=False)
            if summary.exit_code == 0:
                break
        assert summary.exit_code == 0
        answered = len(sim.completed_bodies())
    outs = read_jsonl(out / "outputs.jsonl")
    # Each answer the server gave became exactly one step: no successful call was repeated.
    assert answered == sum(o["usage"]["calls"] for o in outs)
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(60))
    assert all(o["status"] == "done" for o in outs)
    assert len(read_jsonl(out / "traces.jsonl")) == 60


def test_status_counts_calls_of_unfinished_records_from_the_journal(tmp_path: Path) -> None:
    """A run stopped mid-record: status counts the journaled calls, not only finished records."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    script: list[str | Exception] = [
        _code("a0"),
        _feedback(done=True),  # r0: done after 2 calls
        _code("b0"),
        _feedback(done=False),  # r1: 2 calls journaled, then the run stops
        FatalCallError("not_found", "no such model"),
    ]
    client = ScriptedClient(script)
    summary = run(
        "code-improve",
        inp,
        tmp_path / "run",
        Settings(model="fake-model", max_iters=2, concurrency=1, checks=False),
        backend=RealTimeBackend(client),
        show_progress=False,
    )
    assert summary.exit_code == 2
    journal = (tmp_path / "run" / "checkpoint.jsonl").read_bytes().count(b"\n")
    info = collect(tmp_path / "run")
    assert (info["done"], info["in_progress"], info["calls"]) == (1, 1, 4)
    assert journal == 2  # r1's calls; r0's entries went once its lines were durable
    assert info["prompt_tokens"] == 4 * 100 and info["completion_tokens"] == 4 * 20
    assert "1 part-way" in render(info)


def test_limit_counts_lines_and_status_says_first_n_of_m(tmp_path: Path) -> None:
    """--limit 4 over 10 lines with one bad line: 3 records done, exit 1, status 'first 4 of 10'."""
    rows: list[Any] = tasks(10)
    rows[1] = {"id": "bad"}  # no `task`: an unreadable line inside the limit
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    with Simulator(SimConfig(p_done=1.0)) as sim:
        s = Settings(model="sim-model", base_url=sim.url, max_iters=1, limit=4)
        summary = run("code-improve", inp, tmp_path / "run", s, api_key="k", show_progress=False)
    assert summary.exit_code == 1
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 3
    info = collect(tmp_path / "run")
    assert info["input"] == "first 4 of 10 lines"
    assert (info["records"], info["pending"], info["bad_lines"]) == (3, 0, 1)
    assert "first 4 of 10 lines" in render(info)


def test_limit_past_good_lines_exits_zero(tmp_path: Path) -> None:
    """Lines past --limit are outside the run: its records all done means exit 0."""
    inp = write_jsonl(tmp_path / "in.jsonl", [*tasks(3), {"id": "bad"}])
    with Simulator(SimConfig(p_done=1.0)) as sim:
        s = Settings(model="sim-model", base_url=sim.url, max_iters=1, limit=3)
        summary = run("code-improve", inp, tmp_path / "run", s, api_key="k", show_progress=False)
    assert summary.exit_code == 0
    assert not (tmp_path / "run" / "errors.jsonl").read_bytes()


@pytest.mark.parametrize("command", ["run", "jobs"])
def test_closed_stdout_prints_no_traceback(tmp_path: Path, command: str) -> None:
    """`refine ... | head`: a reader that went away causes no BrokenPipeError traceback."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    with Simulator(SimConfig(p_done=1.0)) as sim:
        args = ["jobs"]
        if command == "run":
            args = ["run", "code-improve", str(inp), "--out", str(tmp_path / "run")]
            args += ["--base-url", sim.url, "--max-iters", "0", "--quiet"]
        env = {**os.environ, "OPENAI_API_KEY": "k"}
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte is written
        proc = subprocess.run(
            [*REFINE, *args], stdout=write, stderr=subprocess.PIPE, env=env, timeout=60
        )
        os.close(write)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
    assert proc.returncode == 0


def test_every_answered_call_is_a_traced_step(tmp_path: Path) -> None:
    """A run that was never killed keeps each answer the server gave: re-asks, cut-off ones."""
    from pipeline.testing import traced_answers

    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    with Simulator(SimConfig(p_done=0.2, p_length=0.1, faults_seed=5)) as sim:
        settings = Settings(model="gpt-4o-mini", base_url=sim.url, max_iters=2, concurrency=8)
        run("code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False)
        answered = sum(r.status == 200 for r in sim.requests)
        cut_off = sum(r.outcome == "length" for r in sim.requests)
    assert answered > 30 and cut_off > 0  # cut-off answers are answers too
    assert traced_answers(tmp_path / "run") == answered
