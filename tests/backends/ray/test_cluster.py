"""`--workers N` on a local 2-CPU Ray instance: same results, one rate limit, one budget, faults."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from pipeline import Settings, arun, run, run_status
from pipeline.runner import EXIT
from pipeline.testing import traced_answers
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, wait_for_calls, write_jsonl

ray = pytest.importorskip("ray")

REFINE = [sys.executable, "-m", "pipeline.cli"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """One local Ray instance (2 CPUs, a small object store) for this module; its address."""
    # On this (main) thread, which outlives the module: Ray's processes die with the thread
    # that started them. Ray's SIGTERM handler is taken back off.
    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    signal.signal(signal.SIGTERM, sigterm)
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


def settings(url: str | tuple[str, ...], **kw: Any) -> Settings:
    """A code-improve run against the simulator at ``url``."""
    base: dict[str, Any] = {"model": "sim-model", "base_url": url, "max_iters": 2}
    return Settings(**{**base, **kw})


def lost_calls(sim: Simulator, run_dir: Path) -> int:
    """Answers the server gave that no trace holds: calls made again after a crash."""
    return sum(r.status == 200 for r in sim.requests) - traced_answers(run_dir)


def refused_share(sim: Simulator) -> float:
    """The share of requests the simulator answered 429."""
    statuses = [r.status for r in sim.requests]
    return statuses.count(429) / len(statuses)


def comparable(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Outputs and traces by record id, without what differs between two runs (timings)."""
    outputs = {
        o["id"]: {k: v for k, v in o.items() if k != "cost_usd"}
        for o in read_jsonl(run_dir / "outputs.jsonl")
    }
    timing = {"latency_s", "tries"}
    traces = {
        t["id"]: [{k: v for k, v in s.items() if k not in timing} for s in t["steps"]]
        for t in read_jsonl(run_dir / "traces.jsonl")
    }
    return outputs, traces


def test_workers_produce_what_a_single_process_does(cluster: str, tmp_path: Path) -> None:
    """Two Ray workers (critic on another model) write what one process writes, call for call."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    # No prefix cache: the second run's prompts would be served from what the first one
    # left in it, and its usage would differ for that reason alone.
    with Simulator(SimConfig(latency_s=0.01, p_done=0.3, prefix_cache=False)) as sim:
        one = settings(sim.url, feedback_model="sim-critic", rpm=60_000)
        single = run("code-improve", inp, tmp_path / "one", one, show_progress=False)
        calls_single = len(sim.requests)
        spread = run(
            "code-improve",
            inp,
            tmp_path / "two",
            replace(one, workers=2, concurrency=4),
            show_progress=False,
        )
        calls_spread = len(sim.requests) - calls_single
    assert single.exit_code == spread.exit_code == 0, spread.message
    assert comparable(tmp_path / "two") == comparable(tmp_path / "one")
    assert len(comparable(tmp_path / "two")[0]) == 30
    assert spread.counters.calls == calls_spread == calls_single
    critic = {s["model"] for t in read_jsonl(tmp_path / "two" / "traces.jsonl") for s in t["steps"]}
    assert critic == {"sim-model", "sim-critic"}
    progress = orjson.loads((tmp_path / "two" / "progress.json").read_bytes())
    pids = {w["pid"] for w in progress["workers"]}
    assert len(pids) == 2 and os.getpid() not in pids


async def kill_a_worker_when(run_dir: Path, sim: Simulator, calls: int) -> tuple[int, int]:
    """SIGKILL worker 0's process once the simulator has answered ``calls``; its pid and the
    records finished by then."""
    with anyio.fail_after(60):
        while len(sim.completed_bodies()) < calls:
            await anyio.sleep(0.02)
        while True:
            try:
                progress = orjson.loads((run_dir / "progress.json").read_bytes())
            except (OSError, orjson.JSONDecodeError):
                progress = {}
            pid = next((w["pid"] for w in progress.get("workers", ()) if w["worker"] == 0), None)
            if pid:
                break
            await anyio.sleep(0.05)
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    return pid, len(read_jsonl(run_dir / "outputs.jsonl"))


@pytest.mark.slow
@pytest.mark.anyio
async def test_killed_worker_under_a_shared_rate_limit(
    cluster: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2,400 RPM enforced, one of two workers SIGKILLed: all done, <= 1% 429s, few calls twice."""
    n, concurrency = 80, 6
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(n))
    run_dir = tmp_path / "run"
    config = SimConfig(latency_s=0.05, p_done=0.3, rpm=2400)
    with Simulator(config) as sim:
        async with anyio.create_task_group() as tg:
            killed: list[tuple[int, int]] = []

            async def killer() -> None:
                killed.append(await kill_a_worker_when(run_dir, sim, calls=60))

            tg.start_soon(killer)
            summary = await arun(
                "code-improve",
                inp,
                run_dir,
                settings(sim.url, workers=2, concurrency=concurrency, rpm=2400, max_iters=1),
                api_key="k",
                show_progress=False,
            )
        share, repeats = refused_share(sim), lost_calls(sim, run_dir)
    ((pid, finished_at_kill),) = killed
    assert finished_at_kill < n, "the worker must die mid-run"
    assert summary.exit_code == 0, summary.message
    outs = read_jsonl(run_dir / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(n))
    assert all(o["status"] == "done" for o in outs)
    assert len(read_jsonl(run_dir / "traces.jsonl")) == n
    assert share <= 0.01, f"{share:.2%} of requests refused"
    assert repeats <= concurrency  # the dead worker's calls in flight, at most one per record
    assert any(f"(pid {pid}) is gone" in r.getMessage() for r in caplog.records)
    workers = orjson.loads((run_dir / "progress.json").read_bytes())["workers"]
    assert [w["restarts"] for w in workers] == [1, 0]


def test_limits_announced_in_headers_hold_for_the_cluster(cluster: str, tmp_path: Path) -> None:
    """With no --rpm, the limit the server announces paces both workers together, not each alone."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(150))
    with Simulator(SimConfig(latency_s=0.02, rpm=2400)) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, workers=2, concurrency=8, max_iters=0),
            show_progress=False,
        )
        share = refused_share(sim)
        span = max(r.t for r in sim.requests) - min(r.t for r in sim.requests)
    assert summary.exit_code == 0, summary.message
    assert share <= 0.01, f"{share:.2%} of requests refused"
    # 150 calls at 40/s, less the bucket's first second: at least 2.7 s, whoever sent them.
    assert span >= (150 - 40) / 40 * 0.98


def test_workers_drain_a_failing_replica(cluster: str, tmp_path: Path) -> None:
    """With two --base-url replicas, one down, every worker's calls end up on the live one."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    with (
        Simulator(SimConfig(latency_s=0.02, outages=((0.0, 1e6),))) as down,
        Simulator(SimConfig(latency_s=0.02)) as up,
    ):
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings((down.url, up.url), workers=2, concurrency=4, max_retries=2, max_iters=1),
            show_progress=False,
        )
        answered, refused = len(up.completed_bodies()), len(down.requests)
    assert summary.exit_code == 0, summary.message
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 30 and all(o["status"] == "done" for o in outs)
    assert answered == summary.counters.calls - refused
    # Each worker's breaker opens after max_retries + 1 faults, then a probe every 5 s.
    assert refused <= 2 * ((2 + 1) + 4 + 2)


@pytest.mark.parametrize(
    ("config", "status", "words"),
    [
        (SimConfig(api_key="sk-right"), EXIT["auth"], "401"),
        (SimConfig(models=("another-model",)), EXIT["config"], "404"),
    ],
)
def test_an_error_every_record_would_hit_stops_the_run(
    cluster: str, tmp_path: Path, config: SimConfig, status: int, words: str
) -> None:
    """A 401 or an unknown model on a worker stops the run as in one process, failing none."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(20))
    with Simulator(config) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, workers=2, concurrency=4),
            api_key="sk-wrong-key",
            show_progress=False,
        )
    assert summary.exit_code == status, summary.message
    assert words in (summary.message or "") and "sk-wrong-key" not in (summary.message or "")
    assert read_jsonl(tmp_path / "run" / "outputs.jsonl") == []


def test_the_budget_caps_the_cluster(cluster: str, tmp_path: Path) -> None:
    """--budget holds for all workers together: the run stops at the cap (exit 6), under it."""
    prices = tmp_path / "prices.json"
    prices.write_bytes(orjson.dumps({"sim-model": {"input": 100.0, "output": 1000.0}}))
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    with Simulator(SimConfig(latency_s=0.02, p_done=0.2)) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(
                sim.url, workers=2, concurrency=6, budget=6.0, prices=str(prices), max_iters=3
            ),
            show_progress=False,
        )
    assert summary.exit_code == EXIT["budget"], summary.message
    status = run_status(tmp_path / "run")
    assert 3.0 < status["cost_usd"] <= 6.0
    assert status["done"] < 40 and status["calls"] > 10


def refine(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A `refine` process."""
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", **(env or {})}
    return subprocess.Popen(
        [*REFINE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_killed_driver_resumes_with_the_same_command(cluster: str, tmp_path: Path) -> None:
    """A SIGKILLed driver (--ray-address) resumes with the same command, repeating few calls."""
    n, workers, concurrency = 40, 2, 4
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(n))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.05, p_done=0.2)) as sim:
        args = (
            "run", "code-improve", str(inp), "--out", str(run_dir), "--base-url", sim.url,
            "--model", "sim-model", "--max-iters", "2", "--workers", str(workers),
            "--concurrency", str(concurrency), "--ray-address", cluster, "--quiet",
        )  # fmt: skip
        first = refine(*args)
        wait_for_calls(run_dir, 25, first, limit_s=60)
        assert first.poll() is None, first.communicate()
        first.kill()
        first.communicate()
        done_at_kill = len(read_jsonl(run_dir / "outputs.jsonl"))
        again = refine(*args)
        _, err = again.communicate(timeout=180)
        repeats = lost_calls(sim, run_dir)
    assert done_at_kill < n
    assert again.returncode == 0, err
    outs = read_jsonl(run_dir / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(n))
    assert len(read_jsonl(run_dir / "traces.jsonl")) == n
    assert repeats <= workers * concurrency


def ray_processes(under: int | None = None) -> set[int]:
    """Pids of Ray's processes (gcs_server, raylet, workers, agents) that are not this test
    process's own (the module's instance): those a `refine` child left behind. With
    ``under``, those of process ``under`` and its descendants instead."""
    parents: dict[int, int] = {}
    ray_pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            stat = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat[1])
        if stat[0] != "Z" and (b"ray::" in cmd or b"gcs_server" in cmd or b"raylet" in cmd):
            ray_pids.add(int(entry.name))

    def below(pid: int, root: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parents.get(pid, 0)
        return False

    if under is not None:
        return {pid for pid in ray_pids if below(pid, under)}
    return {pid for pid in ray_pids if not below(pid, os.getpid())}


@pytest.mark.slow
def test_a_local_ray_instance_is_started_and_stopped(cluster: str, tmp_path: Path) -> None:
    """Without --ray-address the command starts its own Ray and leaves no process behind."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    before = ray_processes()
    with Simulator(SimConfig()) as sim:
        proc = refine(
            "run", "code-improve", str(inp), "--out", str(tmp_path / "run"), "--base-url",
            sim.url, "--model", "sim-model", "--workers", "1", "--quiet",
            env={"RAY_ADDRESS": ""},
        )  # fmt: skip
        _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 4
    deadline = time.monotonic() + 60  # Ray's shutdown takes seconds; more on a loaded machine
    while ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ray_processes() - before


@pytest.mark.slow
def test_a_local_ray_instance_ends_when_the_command_is_killed(cluster: str, tmp_path: Path) -> None:
    """A SIGKILLed `refine` that started its own Ray takes Ray's server, raylet and workers
    with it (they die with the thread that started them). Ray's two agents find their raylet
    gone within seconds, then spend about a minute failing to report it to the dead server
    before they exit: they are not waited for here."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(200))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.2)) as sim:
        proc = refine(
            "run", "code-improve", str(inp), "--out", str(run_dir), "--base-url", sim.url,
            "--model", "sim-model", "--workers", "1", "--quiet", env={"RAY_ADDRESS": ""},
        )  # fmt: skip
        try:
            wait_for_calls(run_dir, 3, proc, limit_s=120)
            assert proc.poll() is None, "the run must still be going when it is killed"
            started = {
                pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                for pid in ray_processes(under=proc.pid)
            }
        finally:
            proc.kill()
            proc.communicate()

    def left() -> dict[int, str]:
        named = {}
        for pid, cmd in started.items():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
            except OSError:
                continue  # gone
            if state != "Z" and not cmd.endswith("Agent"):
                named[pid] = cmd
        return named

    assert any(cmd.endswith("raylet") for cmd in started.values()), started
    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left()
