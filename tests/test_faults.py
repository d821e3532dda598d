"""Faults: a misbehaving server, an outage, an unreachable endpoint, a full disk."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import Settings, run
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

KNOWN_FAILURES = {
    "http_500",
    "http_503",
    "timeout",
    "connection",
    "refusal",
    "bad_response",
    "empty",
}


def settings(url: str, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(model="sim-model", base_url=url, max_iters=2, concurrency=8)
    base.update(kw)
    return Settings(**base)


def test_every_fault_kind_ends_done_or_failed_with_reason(tmp_path: Path) -> None:
    """Under 5xx, hangs, resets, truncated bodies, cut answers and refusals every record ends
    as exactly one output line, done or failed with a precise reason; retries stay bounded."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(60))
    config = SimConfig(
        p_done=0.3,
        p_500=0.05,
        p_503=0.05,
        p_hang=0.02,
        hang_s=30,
        p_reset=0.05,
        p_truncate=0.05,
        p_length=0.05,
        p_refusal=0.02,
        faults_seed=11,
    )
    with Simulator(config) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, timeout=1.0, max_retries=4),
            api_key="k",
            show_progress=False,
        )
        outcomes = [r.outcome for r in sim.requests]
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(60))
    assert summary.exit_code in (0, 1)
    assert {"error_500", "error_503", "hang", "reset", "truncated", "length"} <= set(outcomes)
    for o in outs:
        if o["status"] == "failed":
            assert o["error"]["type"] in KNOWN_FAILURES, o["error"]
            assert o["error"]["message"]
        else:
            assert o["error"] is None
    refused = [o for o in outs if o["status"] == "failed"]
    assert all(
        o["error"]["type"] == "refusal" for o in refused if "refused" in o["error"]["message"]
    )
    traces = read_jsonl(tmp_path / "run" / "traces.jsonl")
    steps = [s for t in traces for s in t["steps"]]
    # a cut-off answer is traced and asked once more (cut_off); one cut off again, or a
    # cut-off feedback whose repair was cut too, stays as length
    assert any((s["error"] or {}).get("type") in ("cut_off", "length") for s in steps)
    # max_retries=4: five attempts a call, besides the probes that wait out an outage (a few
    # server faults in a row across calls open the breaker, and its probes use up no
    # retries, by design), which a loaded machine's interleaving sometimes brings about.
    assert max(s["attempts"] for s in steps) <= 8


def test_outage_is_waited_out_without_failing_records(tmp_path: Path) -> None:
    """A server down for seconds: calls probe one at a time and every record still finishes."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    with Simulator(SimConfig(latency_s=0.05, outages=((0.2, 2.2),))) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, max_retries=2),
            api_key="k",
            show_progress=False,
        )
        during = [r for r in sim.requests if r.outcome == "outage"]
        assert max(r.t for r in sim.requests) > 2.2, "the run must outlast the outage"
    assert summary.exit_code == 0, summary.message
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 30 and all(o["status"] == "done" for o in outs)
    # Once the outage is recognised the pool probes gently instead of retrying everything.
    assert 3 <= len(during) <= 20


def test_unreachable_endpoint_stops_run_at_once(tmp_path: Path) -> None:
    """A closed port (nothing ever answered) stops the run at once with exit 2, the URL and
    the cause, records left pending: a wrong URL is no outage to wait out."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(20))
    with Simulator(SimConfig()) as sim:
        url = sim.url  # a port that is closed once the simulator stops
    started = time.monotonic()
    summary = run(
        "code-improve",
        inp,
        tmp_path / "run",
        settings(url, max_outage=1.0),
        api_key="k",
        show_progress=False,
    )
    assert summary.exit_code == 2
    assert f"cannot reach {url}: connection refused" in (summary.message or "")
    assert time.monotonic() - started < 30
    assert read_jsonl(tmp_path / "run" / "outputs.jsonl") == []


def test_an_endpoint_that_never_answers_a_call_stops_resumable(tmp_path: Path) -> None:
    """A server that takes connections but answers no call (every one hangs) is an outage:
    the run stops after --max-outage (exit 5) with records left pending, resumable."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    with Simulator(SimConfig(p_hang=1.0, hang_s=60)) as sim:
        started = time.monotonic()
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, max_outage=1.0, timeout=0.3, max_retries=1),
            api_key="k",
            show_progress=False,
        )
    assert summary.exit_code == 5
    assert "resumable" in (summary.message or "")
    assert time.monotonic() - started < 30
    assert read_jsonl(tmp_path / "run" / "outputs.jsonl") == []


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))


def test_disk_full_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    """Writes failing mid-run (file size limit) exit 4 with a clear message; the run resumes."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    run_dir = tmp_path / "run"
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        args = [
            sys.executable,
            "-m",
            "pipeline.cli",
            "run",
            "code-improve",
            str(inp),
            "--out",
            str(run_dir),
            "--base-url",
            sim.url,
            "--max-iters",
            "1",
            "--quiet",
        ]
        env = {**os.environ, "OPENAI_API_KEY": "k"}
        full = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size
        )
        assert full.returncode == 4, full.stderr
        assert "cannot write" in full.stderr and "resum" in full.stderr
        again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    outs = read_jsonl(run_dir / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(40))
    assert len(read_jsonl(run_dir / "traces.jsonl")) == 40
