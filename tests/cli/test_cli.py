"""The `refine` command as users run it: subprocesses, signals, kills, locks, exit statuses."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, sent, tasks, wait_for_calls, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]


def refine(*args: str, key: str = "sk-test", **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": key}
    return subprocess.run(
        [*REFINE, *args], env=env, capture_output=True, text=True, timeout=120, **kw
    )


def start(*args: str, key: str = "sk-test") -> subprocess.Popen[str]:
    env = {**os.environ, "OPENAI_API_KEY": key}
    return subprocess.Popen(
        [*REFINE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_args(inp: Path, run_dir: Path, url: str, *extra: str) -> tuple[str, ...]:
    """`refine run code-improve` arguments against the simulator at ``url``."""
    return ("run", "code-improve", str(inp), "--out", str(run_dir), "--base-url", url, *extra)


def assert_clean_jsonl(path: Path) -> None:
    """Every line of ``path`` is complete JSON."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path} ends with a torn line"
    for line in data.splitlines():
        orjson.loads(line)


def test_jobs_lists_builtin_job_and_fields() -> None:
    """`refine jobs` names each built-in job with its input fields."""
    out = refine("jobs")
    assert out.returncode == 0
    assert "code-improve" in out.stdout and "task (string)" in out.stdout


def test_usage_error_exit_status(tmp_path: Path) -> None:
    """Bad usage (missing --out, unknown job) exits 2 with a message."""
    assert refine("run", "code-improve", "x.jsonl").returncode == 2
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    out = refine("run", "no-such-job", str(inp), "--out", str(tmp_path / "r"))
    assert out.returncode == 2 and "no such built-in job" in out.stderr


def test_sigkill_several_times_then_resume(tmp_path: Path) -> None:
    """Killed with SIGKILL at random moments, the same command finishes every record exactly once.

    No completed call is repeated beyond those in flight at each kill, and no file is torn.
    """
    n, concurrency, kills = 60, 8, 4
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(n))
    run_dir = tmp_path / "run"
    args = (
        "run",
        "code-improve",
        str(inp),
        "--out",
        str(run_dir),
        "--max-iters",
        "2",
        "--concurrency",
        str(concurrency),
        "--quiet",
    )
    rng = random.Random(7)
    with Simulator(SimConfig(latency_s=0.03, p_done=0.2)) as sim:
        at_sim = (*args, "--base-url", sim.url, "--model", "sim-model")
        killed = 0
        for _ in range(kills):
            proc = start(*at_sim)
            wait_for_calls(run_dir, killed * 10 + rng.randint(5, 25), proc)
            time.sleep(rng.uniform(0.0, 0.2))
            if proc.poll() is not None:
                proc.communicate()
                break
            proc.kill()
            proc.communicate()
            killed += 1
            for f in ("outputs.jsonl", "traces.jsonl"):
                if (run_dir / f).exists():
                    # A kill can tear at most the last line; what is there must be readable.
                    lines = (run_dir / f).read_bytes().split(b"\n")
                    for line in lines[:-1]:
                        orjson.loads(line)
        final = refine(*at_sim)
        bodies = Counter(
            orjson.dumps(b["messages"], option=orjson.OPT_SORT_KEYS) for b in sim.completed_bodies()
        )
    assert killed >= 2, "the run must have been killed mid-way at least twice"
    assert final.returncode == 0, final.stderr
    outs = read_jsonl(run_dir / "outputs.jsonl")
    assert len(outs) == n and {o["id"] for o in outs} == {f"r{i}" for i in range(n)}
    assert all(o["status"] == "done" for o in outs)
    traces = read_jsonl(run_dir / "traces.jsonl")
    assert len(traces) == n
    for f in ("outputs.jsonl", "traces.jsonl", "checkpoint.jsonl", "errors.jsonl"):
        if (run_dir / f).exists():
            assert_clean_jsonl(run_dir / f)
    used = Counter(orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for t in traces for m in sent(t))
    assert not used - bodies
    assert sum((bodies - used).values()) <= killed * concurrency


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_graceful_signal_exits_130_and_resumes(tmp_path: Path, signum: int) -> None:
    """SIGINT/SIGTERM stop the run cleanly with status 130; the same command then finishes it."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.05, p_done=0.2)) as sim:
        args = run_args(inp, run_dir, sim.url, "--concurrency", "4", "--quiet")
        proc = start(*args)
        wait_for_calls(run_dir, 8, proc)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "interrupted" in err
        manifest = orjson.loads((run_dir / "manifest.json").read_bytes())
        assert manifest["state"] == "interrupted"
        for f in ("outputs.jsonl", "traces.jsonl", "checkpoint.jsonl"):
            assert_clean_jsonl(run_dir / f)
        again = refine(*args)
    assert again.returncode == 0, again.stderr
    assert len(read_jsonl(run_dir / "outputs.jsonl")) == 40


def test_torn_files_repaired_on_resume(tmp_path: Path) -> None:
    """A checkpoint and an output file cut mid-line are repaired, with a warning naming each."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(12))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.0, p_done=0.0)) as sim:
        args = run_args(inp, run_dir, sim.url, "--max-iters", "1", "--concurrency", "2")
        first = refine(*args, "--limit", "6")
        assert first.returncode == 0, first.stderr
        # The run compacted its journal to nothing; a kill mid-write leaves half an entry.
        assert (run_dir / "checkpoint.jsonl").read_bytes() == b""
        (run_dir / "checkpoint.jsonl").write_bytes(b'{"id":"r7","n":0,"step":{"role":"gen')
        outputs = run_dir / "outputs.jsonl"
        data = outputs.read_bytes()
        outputs.write_bytes(data[: len(data) - 40])  # cut the last line mid-way
        again = refine(*args)
    assert again.returncode == 0, again.stderr
    assert "checkpoint.jsonl: repaired a torn final line" in again.stderr
    assert "outputs.jsonl: repaired a torn final line" in again.stderr
    outs = read_jsonl(run_dir / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(12))


def test_second_launch_is_refused_while_first_runs(tmp_path: Path) -> None:
    """Two overlapping launches on one RUN_DIR: the second exits 2 naming the holder."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(20))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.2)) as sim:
        args = run_args(inp, run_dir, sim.url, "--concurrency", "2", "--quiet")
        proc = start(*args)
        wait_for_calls(run_dir, 1, proc)
        second = refine(*args)
        status = refine("status", str(run_dir))
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert second.returncode == 2
    assert "in use by pid" in second.stderr
    assert status.returncode == 0 and "(running)" in status.stdout


@pytest.mark.slow
def test_lock_of_killed_process_is_taken_over(tmp_path: Path) -> None:
    """A RUN_DIR whose holder was SIGKILLed is usable at once by the next launch."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.2)) as sim:
        # One record at a time: the run lasts seconds, so the kill lands mid-run.
        args = run_args(inp, run_dir, sim.url, "--max-iters", "0", "--concurrency", "1", "--quiet")
        proc = start(*args)
        wait_for_calls(run_dir, 1, proc)
        assert proc.poll() is None, "the run must still be going when it is killed"
        proc.kill()
        proc.communicate()
        assert (run_dir / "lock").exists()
        status = refine("status", str(run_dir))
        assert "killed; resumable" in status.stdout
        again = refine(*args)
    assert again.returncode == 0, again.stderr


def test_resume_uses_manifest_settings(tmp_path: Path) -> None:
    """`refine resume RUN_DIR` continues with the job, input, model and endpoint it started with."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        first = refine(
            *run_args(
                inp,
                run_dir,
                sim.url,
                "--model",
                "sim-model",
                "--max-iters",
                "1",
                "--limit",
                "4",
            )
        )
        assert first.returncode == 0, first.stderr
        # The manifest's limit was 4: resume keeps it, so raise it by running again first.
        resumed = refine("resume", str(run_dir))
        models = {r.body["model"] for r in sim.requests}
    assert resumed.returncode == 0, resumed.stderr
    assert models == {"sim-model"}
    assert len(read_jsonl(run_dir / "outputs.jsonl")) == 4


def test_exit_status_for_auth_failure(tmp_path: Path) -> None:
    """A wrong API key ends the run with status 3 and one clear message, without the key."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(50))
    canary = "sk-canary-cli-4242"
    with Simulator(SimConfig(api_key="sk-right")) as sim:
        out = refine(*run_args(inp, tmp_path / "run", sim.url), key=canary)
    assert out.returncode == 3
    assert "401" in out.stderr
    assert canary not in out.stderr + out.stdout
    for path in (tmp_path / "run").iterdir():
        assert canary.encode() not in path.read_bytes()


def test_non_tty_progress_is_plain_log_lines(tmp_path: Path) -> None:
    """Without a terminal, progress is plain log lines (no bar control characters)."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        out = refine(*run_args(inp, tmp_path / "run", sim.url, "--max-iters", "0"))
    assert out.returncode == 0
    assert "\r" not in out.stderr
    assert "5/5 records finished; this invocation: 5 done, 0 failed" in out.stdout


def test_console_shows_no_http_library_chatter(tmp_path: Path) -> None:
    """The console carries refine's own lines only, not one line per HTTP request."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        out = refine(*run_args(inp, tmp_path / "run", sim.url, "--max-iters", "1"))
    assert out.returncode == 0
    assert "HTTP Request" not in out.stderr


def test_report_writes_markdown_and_plots(tmp_path: Path) -> None:
    """`refine report RUN_DIR` writes report.md with its table and PNG plots, and index.html."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(12))
    with Simulator(SimConfig(latency_s=0.0, p_done=0.2)) as sim:
        assert (
            refine(
                *run_args(inp, tmp_path / "run", sim.url, "--max-iters", "2", "--quiet")
            ).returncode
            == 0
        )
    out = refine("report", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    report, page = map(Path, out.stdout.split())
    assert page == report.parent / "index.html" and page.read_text().startswith("<!doctype html>")
    text = report.read_text()
    assert "Quality by iteration" in text and "| t |" in text
    pngs = list(report.parent.glob("*.png"))
    assert pngs and all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)


def test_strategies_and_a_selection_rule_from_the_command_line(tmp_path: Path) -> None:
    """--strategy and --select turn opt-in calls and rules on: the trace shows each extra
    call as its own call kind, the output says which rule chose; a resumed run keeps them, and
    an unknown strategy or rule is a usage error naming it."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    with Simulator(SimConfig(p_done=0.0)) as sim:
        extra = ("--max-iters", "1", "--strategy", "samples=2", "--select", "pooled")
        done = refine(*run_args(inp, tmp_path / "run", sim.url, *extra))
        assert done.returncode == 0, done.stderr
        for bad, says in (("--strategy=vote", "unknown strategy"), ("--select=best", "offers")):
            out = refine(*run_args(inp, tmp_path / "bad", sim.url, bad))
            assert out.returncode == 2 and says in out.stderr
        again = refine(*run_args(inp, tmp_path / "run", sim.url, "--max-iters", "1"))
        assert again.returncode == 2 and "strategy" in again.stderr
    call_kinds = Counter(
        s["kind"] for t in read_jsonl(tmp_path / "run/traces.jsonl") for s in t["steps"]
    )
    assert call_kinds["sample"] == 3 * 2 and call_kinds["answer"] == 3 * 2
    assert {o["chosen_by"] for o in read_jsonl(tmp_path / "run/outputs.jsonl")} == {"pooled"}


def test_a_bad_number_names_its_option(tmp_path: Path) -> None:
    """`--max-iters abc` is refused naming --max-iters and what it takes (exit 2)."""
    out = refine("run", "code-improve", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "r"),
                 "--max-iters", "abc")  # fmt: skip
    assert out.returncode == 2
    assert "argument --max-iters: 'abc' is not a whole number >= 0, nor auto" in out.stderr
    assert "_max_iters" not in out.stderr


def test_run_help_describes_every_price_field() -> None:
    """`refine run --help` names every key a price file takes."""
    out = refine("run", "--help")
    text = " ".join(out.stdout.split())
    fields = "input, output, cached_input, cache_write, cache_write_1h, batch"
    assert all(key in text for key in (fields, "per million"))


def test_jobs_marks_labels_and_checks_a_job_file(tmp_path: Path) -> None:
    """`refine jobs` marks label and check-only fields; `refine jobs FILE` loads a job file
    and describes it, or refuses it naming the file and the line."""
    listing = refine("jobs")
    assert listing.returncode == 0
    assert "target? (any, label)" in listing.stdout
    assert "test_input? (any, check)" in listing.stdout
    one = refine("jobs", "gsm")
    assert one.returncode == 0
    assert "target  any, optional, label: read by the evaluator only" in one.stdout
    assert "hooks: evaluate, check" in one.stdout and "correct (label" in one.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[input.a\n')
    refused = refine("jobs", str(bad))
    assert refused.returncode == 2
    assert f"{bad}: toml:" in refused.stderr and "line 2" in refused.stderr
