"""Batch API mode end to end against the simulator's /v1/files and /v1/batches (real HTTP).

In-process runs through the library, and the `refine` command in subprocesses for kills:
a run over a Batch API that kills its process at one moment of a batch's life
(``tests.batch_faults``: after the upload, before and after the creation, before the
collection is recorded), then `refine` again; and kills at random moments of a waiting run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

from pipeline import RunSummary, Settings, arun
from pipeline.backends.batch import BatchBackend, BatchConfig, read_ledger
from pipeline.backends.batch.api import LIST_PAGE, OpenAIBatchAPI, find_upload
from pipeline.backends.batch.ledger import custom_ids
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

MODEL = "gpt-4o-mini"
KEY = "sk-batch-sim"
FAST = SimConfig(batch_validating_s=0.02, batch_delay_s=0.1, batch_finalizing_s=0.02)
REFINE = [sys.executable, "-m", "pipeline.cli"]
DYING = [sys.executable, "-m", "tests.batch_faults"]  # `refine` over a Batch API that dies
ROOT = Path(__file__).resolve().parents[3]
PACE = {"REFINE_BATCH_CREATES_PER_S": "100", "REFINE_BATCH_POLLS_PER_S": "500"}


def batch_run(sim: Simulator, inp: Path, out: Path, **kw: Any) -> RunSummary:
    """A --batch run of code-improve through the library against ``sim``."""
    config: BatchConfig = kw.pop("config", BatchConfig(creates_per_s=100, polls_per_s=500))
    base: dict[str, Any] = dict(model=MODEL, base_url=sim.url, max_iters=2, poll=0.02)
    settings = Settings(batch=True, **(base | kw))
    backend = BatchBackend(config=config)  # the Batch API opened at the simulator's URL
    return anyio.run(
        lambda: arun(
            "code-improve", inp, out, settings, api_key=KEY, show_progress=False, backend=backend
        )
    )


def answered(sim: Simulator, run_dir: Path) -> Counter[tuple[str, int]]:
    """How often the simulator answered each call (record, step): more than once is paid twice.

    A batch line the ledger does not know would be a batch the run lost: a KeyError.
    """
    calls = custom_ids(run_dir / "batches.jsonl")
    return Counter(calls[str(r.custom_id)] for r in sim.requests if r.is_batch and r.completed)


def journal_keys(run_dir: Path) -> Counter[tuple[str, int]]:
    """Checkpoint entries by (record id, step index)."""
    return Counter((e["id"], e["n"]) for e in read_jsonl(run_dir / "checkpoint.jsonl"))


def kept_keys(run_dir: Path) -> Counter[tuple[str, int]]:
    """The steps a run kept by (record id, step index): journaled, or traced once finished
    (a finished record's entries leave the journal)."""
    traced = Counter(
        (t["id"], n) for t in read_jsonl(run_dir / "traces.jsonl") for n in range(len(t["steps"]))
    )
    return journal_keys(run_dir) + traced


def assert_paid_once(answers: Counter[tuple[str, int]], run_dir: Path) -> None:
    """Each call answered once, and each step the run kept is exactly one answered call."""
    journal = kept_keys(run_dir)
    assert max(answers.values()) == 1 and max(journal.values()) == 1
    assert answers.keys() == journal.keys()


def test_batch_run_equals_real_time_without_a_chat_call(tmp_path: Path) -> None:
    """Against the simulator, --batch gives real time's outputs; no call goes to chat completions.

    Every trace step names the batch that carried it, and every file is deleted at the end.
    """
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(20))
    with Simulator(FAST) as sim:
        rt = anyio.run(
            lambda: arun(
                "code-improve",
                inp,
                tmp_path / "rt",
                Settings(model=MODEL, base_url=sim.url, max_iters=2),
                api_key=KEY,
                show_progress=False,
            )
        )
        before = len(sim.requests)
        summary = batch_run(sim, inp, tmp_path / "b")
        during = sim.requests[before:]
        batch_ids = {b["id"] for b in sim.batches}
        files = openai.OpenAI(base_url=sim.url, api_key=KEY, max_retries=0).files.list()
    assert rt.exit_code == 0 and summary.exit_code == 0, summary.message
    assert during and all(r.is_batch for r in during)
    real = {o["id"]: o for o in read_jsonl(tmp_path / "rt" / "outputs.jsonl")}
    batch = {o["id"]: o for o in read_jsonl(tmp_path / "b" / "outputs.jsonl")}
    keys = ("output", "iterations", "chosen_iteration", "stop_reason", "score", "usage")
    assert {k: [batch[i][k] for i in sorted(batch)] for k in keys} == {
        k: [real[i][k] for i in sorted(real)] for k in keys
    }
    steps = [s for t in read_jsonl(tmp_path / "b" / "traces.jsonl") for s in t["steps"]]
    assert steps and all(s["batch_id"] in batch_ids for s in steps)
    assert list(files) == []


def test_split_by_max_lines(tmp_path: Path) -> None:
    """With a line limit of 4, 10 records go out in batches of 4, 4 and 2."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    with Simulator(FAST) as sim:
        config = BatchConfig(max_lines=4, creates_per_s=100, polls_per_s=500)
        summary = batch_run(sim, inp, tmp_path / "run", max_iters=0, config=config)
        totals = [b["request_counts"]["total"] for b in sim.batches]
    assert summary.exit_code == 0
    assert totals == [4, 4, 2]


def test_expiry_and_failed_lines_lose_nothing(tmp_path: Path) -> None:
    """Expiring batches and 500/429 lines: every record done, no call answered twice."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    faulty = replace(
        FAST, p_line_fail=0.1, line_fail_statuses=(500, 429), p_batch_expire=0.5, faults_seed=3
    )
    with Simulator(faulty) as sim:
        summary = batch_run(sim, inp, tmp_path / "run", max_retries=8)
        statuses = Counter(b["status"] for b in sim.batches)
        counts = answered(sim, tmp_path / "run")
    assert summary.exit_code == 0, summary.message
    assert statuses["expired"] >= 1
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 40
    assert_paid_once(counts, tmp_path / "run")


def refine(*args: str, key: str = KEY) -> subprocess.CompletedProcess[str]:
    """Run `refine` to its end."""
    full = {**os.environ, "OPENAI_API_KEY": key, **PACE}
    return subprocess.run(
        [*REFINE, *args], env=full, capture_output=True, text=True, timeout=120, check=False
    )


def killed_at(point: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `refine` over a Batch API that kills the process at ``point``, to its death."""
    full = {**os.environ, "OPENAI_API_KEY": KEY, **PACE}
    return subprocess.run(
        [*DYING, point, *args],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def start(*args: str) -> subprocess.Popen[str]:
    """Start `refine` in the background."""
    env = {**os.environ, "OPENAI_API_KEY": KEY, **PACE}
    return subprocess.Popen(
        [*REFINE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def batch_args(inp: Path, run_dir: Path, url: str, *extra: str) -> tuple[str, ...]:
    """`refine run code-improve --batch` arguments against the simulator at ``url``."""
    return (
        "run", "code-improve", str(inp), "--out", str(run_dir), "--base-url", url,
        "--model", MODEL, "--batch", "--poll", "0.05", "--quiet", *extra,
    )  # fmt: skip


@pytest.mark.parametrize("point", ["after_create", "before_collected"])
def test_kill_at_a_crash_point_then_rerun_pays_no_call_twice(tmp_path: Path, point: str) -> None:
    """SIGKILLed right after creating a batch, or after checkpointing its lines: no call repeats.

    after_create: the batch id was never recorded; the re-run finds the batch by its
    metadata token and adopts it. before_collected: its lines are in the journal but the
    batch is not marked collected; the re-run collects it again and applies none twice.
    """
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(6))
    run_dir = tmp_path / "run"
    with Simulator(FAST) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "1")
        killed = killed_at(point, *args)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (entry,) = read_ledger(run_dir / "batches.jsonl").entries.values()
        journaled = sum(journal_keys(run_dir).values())
        again = refine(*args)
        batches = sim.batches
        counts = answered(sim, run_dir)
        chat = [r for r in sim.requests if not r.is_batch]
    assert again.returncode == 0, again.stderr
    tokens = [b["metadata"]["refine_token"] for b in batches]
    assert tokens[0] == entry.token and len(tokens) == len(set(tokens))
    assert_paid_once(counts, run_dir)
    assert not chat
    traces = read_jsonl(run_dir / "traces.jsonl")
    assert len(traces) == 6
    assert all(t["steps"][0]["batch_id"] == batches[0]["id"] for t in traces)
    if point == "after_create":
        assert entry.file_id is not None and entry.batch_id is None and journaled == 0
        assert "adopted" in again.stderr
    else:
        assert entry.batch_id == batches[0]["id"] and not entry.collected and journaled == 6


def test_kill_after_upload_then_rerun_deletes_the_file_and_sends_again(tmp_path: Path) -> None:
    """SIGKILLed after uploading a batch's input file, before journaling its id: the re-run
    finds the file by its name and deletes it, and sends the calls in a new batch."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    run_dir = tmp_path / "run"
    with Simulator(FAST) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "1")
        killed = killed_at("after_upload", *args)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (entry,) = read_ledger(run_dir / "batches.jsonl").entries.values()
        (stray,) = [f for f in sim.files if f["filename"] == f"refine-{entry.token}.jsonl"]
        again = refine(*args)
        files = sim.files
        batches = sim.batches
        counts = answered(sim, run_dir)
    assert again.returncode == 0, again.stderr
    assert entry.file_id is None
    assert stray["id"] not in {f["id"] for f in files}
    assert f"{stray['id']} (refine-{entry.token}.jsonl) was uploaded but never used" in again.stderr
    assert entry.token not in {b["metadata"]["refine_token"] for b in batches}
    assert not [f for f in files if f["purpose"] == "batch"]  # every input file deleted
    assert_paid_once(counts, run_dir)
    assert len(read_jsonl(run_dir / "outputs.jsonl")) == 4


def test_kill_between_upload_and_create_then_rerun_leaves_no_input_file(tmp_path: Path) -> None:
    """SIGKILLed after journaling a batch's input file, before creating the batch: the re-run
    deletes the file, sends its calls in a new batch, and loses or repeats no record."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    run_dir = tmp_path / "run"
    with Simulator(FAST) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "1")
        killed = killed_at("before_create", *args)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (entry,) = read_ledger(run_dir / "batches.jsonl").entries.values()
        held = [f["id"] for f in sim.files if f["purpose"] == "batch"]
        created = len(sim.batches)
        again = refine(*args)
        files = sim.files
        batches = sim.batches
        counts = answered(sim, run_dir)
    assert entry.file_id is not None and entry.batch_id is None
    assert held == [entry.file_id] and created == 0
    assert again.returncode == 0, again.stderr
    assert entry.token not in {b["metadata"]["refine_token"] for b in batches}
    assert not [f for f in files if f["purpose"] == "batch"]  # no input file left behind
    assert not read_ledger(run_dir / "batches.jsonl").entries
    assert_paid_once(counts, run_dir)
    outputs = read_jsonl(run_dir / "outputs.jsonl")
    assert sorted(o["id"] for o in outputs) == sorted(t["id"] for t in tasks(4))
    assert all(o["status"] == "done" for o in outputs)


def test_cancel_deletes_the_input_file_of_a_batch_never_created(tmp_path: Path) -> None:
    """Killed after uploading an input file whose id never reached the ledger, then `refine
    cancel`: the file is found by its name and deleted, and the next run completes."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    run_dir = tmp_path / "run"
    with Simulator(FAST) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "0")
        killed = killed_at("after_upload", *args)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (stray,) = [f for f in sim.files if f["purpose"] == "batch"]
        cancelled = refine("cancel", str(run_dir))
        left = [f for f in sim.files if f["purpose"] == "batch"]
        open_after_cancel = read_ledger(run_dir / "batches.jsonl").entries
        again = refine(*args)
        counts = answered(sim, run_dir)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"{stray['id']} was uploaded but never used" in cancelled.stderr
    assert left == [] and open_after_cancel == {}
    assert again.returncode == 0, again.stderr
    assert_paid_once(counts, run_dir)
    assert len(read_jsonl(run_dir / "outputs.jsonl")) == 3


@pytest.mark.slow
def test_sigkill_while_waiting_then_detach_until_done(tmp_path: Path) -> None:
    """Two SIGKILLs while waiting, then `--detach` re-runs until 0: all done, no call paid twice.

    Lines fail (500, 429) and a quarter of the batches expire half done; the re-runs exit
    75 while batches are in flight, and no call goes to /v1/chat/completions.
    """
    n = 30
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(n))
    run_dir = tmp_path / "run"
    config = replace(
        FAST,
        batch_delay_s=0.4,
        p_line_fail=0.05,
        line_fail_statuses=(500, 429),
        p_batch_expire=0.25,
    )
    rng = random.Random(5)
    with Simulator(config) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "2", "--max-retries", "8")
        ledger = run_dir / "batches.jsonl"
        for kill in range(2):
            proc = start(*args)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if ledger.exists() and ledger.read_bytes().count(b'"created"') > kill:
                    break
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.5))
            assert proc.poll() is None, "the run must still be waiting when it is killed"
            proc.kill()
            proc.communicate()
        codes = []
        for _ in range(200):
            out = refine(*args, "--detach")
            codes.append(out.returncode)
            if out.returncode != 75:
                break
            time.sleep(0.1)
        counts = answered(sim, run_dir)
        chat = [r for r in sim.requests if not r.is_batch]
    assert codes[-1] == 0, out.stderr
    assert set(codes[:-1]) <= {75}
    outs = read_jsonl(run_dir / "outputs.jsonl")
    assert len(outs) == n and all(o["status"] == "done" for o in outs)
    assert_paid_once(counts, run_dir)
    assert not chat


def test_sigterm_while_waiting_exits_130_and_batches_keep_running(tmp_path: Path) -> None:
    """SIGTERM during a waiting run: exit 130, the batch in flight is kept and collected later."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    run_dir = tmp_path / "run"
    with Simulator(replace(FAST, batch_delay_s=2.0)) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "0")
        proc = start(*args)
        ledger = run_dir / "batches.jsonl"
        deadline = time.monotonic() + 60
        while not (ledger.exists() and b'"created"' in ledger.read_bytes()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        (entry,) = read_ledger(ledger).entries.values()
        again = refine(*args)
        batches = sim.batches
        counts = answered(sim, run_dir)
    assert proc.returncode == 130, err
    assert entry.live and entry.batch_id == batches[0]["id"]
    assert again.returncode == 0, again.stderr
    assert len(batches) == 1  # collected, not sent again
    assert_paid_once(counts, run_dir)


@pytest.mark.slow
def test_cancel_keeps_finished_lines_and_the_next_run_sends_the_rest(tmp_path: Path) -> None:
    """`refine cancel` cancels the batch in flight; the next run keeps its answered lines."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(20))
    run_dir = tmp_path / "run"
    with Simulator(replace(FAST, batch_delay_s=30.0)) as sim:
        args = batch_args(inp, run_dir, sim.url, "--max-iters", "0")
        first = refine(*args, "--detach")
        assert first.returncode == 75, first.stderr
        status = refine("status", str(run_dir))
        # The 20 lines finish one every 1.5 s of the 30 s window: wait for some, not all.
        time.sleep(4.0)
        cancelled = refine("cancel", str(run_dir))
        done = refine(*args)
        batches = sim.batches
        counts = answered(sim, run_dir)
    assert "batches:  1 in flight" in status.stdout
    assert cancelled.returncode == 0, cancelled.stderr
    assert batches[0]["id"] in cancelled.stdout
    assert done.returncode == 0, done.stderr
    assert batches[0]["status"] == "cancelled"
    kept = batches[0]["request_counts"]["completed"]
    assert 0 < kept < 20
    assert sum(b["request_counts"]["total"] for b in batches[1:]) == 20 - kept
    assert_paid_once(counts, run_dir)


def test_wrong_key_exits_3_and_never_shows_it(tmp_path: Path) -> None:
    """A key the Batch API refuses stops the run with status 3; the key is in no file."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    canary = "sk-canary-batch-777"
    with Simulator(replace(FAST, api_key="sk-right")) as sim:
        out = refine(*batch_args(inp, tmp_path / "run", sim.url), key=canary)
    assert out.returncode == 3 and "401" in out.stderr
    assert canary not in out.stderr + out.stdout
    for path in (tmp_path / "run").iterdir():
        if path.is_file():
            assert canary.encode() not in path.read_bytes()


def test_file_listing_pages_through_every_file_and_finds_one_by_name() -> None:
    """More files than one listing page holds: every one is listed, newest first, and
    ``find_upload`` finds the one asked for (and only it) on a later page."""
    n = LIST_PAGE + 30
    paced: list[int] = []

    async def pace() -> None:
        paced.append(1)

    async def scenario(url: str) -> tuple[list[str], list[str], list[str]]:
        api = OpenAIBatchAPI(url, "sk-test", timeout=30)
        try:
            ids = [await api.upload(f"refine-{i:04d}.jsonl", b"{}\n") for i in range(n)]
            listed = [f.id async for f in api.file_listing()]
            found = await find_upload(api, "refine-0003.jsonl", 0.0, pace)
        finally:
            await api.aclose()
        return ids, listed, found

    with Simulator(FAST) as sim:
        ids, listed, found = anyio.run(scenario, sim.url)
    assert listed == ids[::-1]
    assert found == [ids[3]]
    assert len(paced) == 2  # one pace per page read
