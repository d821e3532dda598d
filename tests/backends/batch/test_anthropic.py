"""Claude through Message Batches (``--batch`` with ``--model anthropic:NAME``), against the
simulator's Anthropic side: every round batched, at half price with cache reads and writes
as the server bills them, failed and expired requests sent again, and a kill at any moment
of a batch's life repeating no paid request."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from pipeline import Settings, arun
from pipeline.backends.batch import BatchBackend, BatchConfig, BatchInfo, read_ledger
from pipeline.backends.batch.api import TOKEN_KEY, FileInfo, Undecided, find_by_token
from pipeline.commands.cancel import cancel
from pipeline.runs.session import RunSummary
from pipeline.testing.simulator import Simulator
from tests.backends.batch.test_simulated import (
    DYING,
    FAST,
    PACE,
    REFINE,
    answered,
    assert_paid_once,
)
from tests.batch_faults import POINTS
from tests.client.test_caching import long_tasks
from tests.helpers import read_jsonl, tasks, write_jsonl

MODEL = "anthropic:claude-sonnet-4-6"
KEY = "sk-ant-batch-test"
SIM = replace(FAST, api_key=KEY, p_done=0.0)


def claude_batch_run(sim: Simulator, inp: Path, out: Path, **kw: object) -> RunSummary:
    """A --batch run of code-improve on Claude through the library against ``sim``."""
    base: dict[str, object] = dict(
        model=MODEL, base_url=sim.anthropic_url, max_iters=2, min_iters=2, poll=0.02
    )
    settings = Settings(batch=True, **(base | kw))  # type: ignore[arg-type]
    backend = BatchBackend(config=BatchConfig(creates_per_s=100, polls_per_s=500))
    return anyio.run(
        lambda: arun(
            "code-improve", inp, out, settings, api_key=KEY, show_progress=False, backend=backend
        )
    )


def test_every_round_goes_through_message_batches_at_half_price(tmp_path: Path) -> None:
    """Every call of every round is a Message Batches request (none in real time), each
    paid once; the cost the outputs record equals the server's batch-rate bill, and the
    cache reads and writes (an hour's, under --batch) the traces count equal its
    accounting."""
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(6, tokens=1500))  # cached from 1,024
    out = tmp_path / "run"
    with Simulator(SIM) as sim:
        summary = claude_batch_run(sim, inp, out)
        bill = sim.bill.to_json()
        real_time = [r for r in sim.requests if not r.is_batch]
        batches = {b["id"] for b in sim.message_batches}
        counts = answered(sim, out)
    assert summary.exit_code == 0, summary.message
    outputs = read_jsonl(out / "outputs.jsonl")
    assert len(outputs) == 6 and all(o["status"] == "done" for o in outputs)
    assert not real_time and len(batches) == 6  # generate, then feedback and refine twice
    assert set(bill["tiers"]) == {"batch"}
    assert sum(o["cost_usd"] for o in outputs) == pytest.approx(bill["total_usd"], abs=1e-6)
    steps = [s for t in read_jsonl(out / "traces.jsonl") for s in t["steps"]]
    assert all(s["batch_id"] in batches for s in steps)
    assert sum(s["usage"].get("cached_tokens", 0) for s in steps) == bill["cached_tokens"]
    written = sum(s["usage"].get("cache_write_tokens", 0) for s in steps)
    long = sum(s["usage"].get("cache_write_1h_tokens", 0) for s in steps)
    # Under --batch the prefixes are cached for an hour: a record's next call is a round later.
    assert written == long == bill["cache_write_1h_tokens"] > 0
    assert bill["cache_write_5m_tokens"] == 0
    assert_paid_once(counts, out)


def test_failed_and_expired_requests_go_out_again_and_lose_nothing(tmp_path: Path) -> None:
    """Requests that errored (500, 529, 429) or expired with their batch are sent in a later
    batch: every record done, no request answered twice."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(20))
    faulty = replace(SIM, p_line_fail=0.15, line_fail_statuses=(500, 529, 429), p_batch_expire=0.5)
    with Simulator(replace(faulty, faults_seed=4)) as sim:
        summary = claude_batch_run(sim, inp, tmp_path / "run", max_retries=8)
        results = [r for r in sim.requests if r.is_batch]
        counts = answered(sim, tmp_path / "run")
    assert summary.exit_code == 0, summary.message
    assert {r.status for r in results} >= {200, 500}
    outputs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outputs) == 20 and all(o["status"] == "done" for o in outputs)
    assert_paid_once(counts, tmp_path / "run")


def _refine(*args: str, dying: str | None = None) -> subprocess.CompletedProcess[str]:
    """`refine ARGS` to its end (or over a batch API that kills it at ``dying``)."""
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, **PACE}
    command = [*DYING, dying] if dying else REFINE
    return subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_any_moment_of_a_batch_repeats_no_paid_request(
    tmp_path: Path, point: str
) -> None:
    """SIGKILLed after keeping a round's requests, before or after creating its batch, or
    before its lines are marked collected: the same command finishes every record, and no
    request is answered twice (after_create: the batch is found by the token in its
    custom_ids once it has ended, and adopted)."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    out = tmp_path / "run"
    with Simulator(SIM) as sim:
        args = (
            "run", "code-improve", str(inp), "--out", str(out), "--base-url",
            sim.anthropic_url, "--model", MODEL, "--batch", "--poll", "0.05", "--quiet",
            "--max-iters", "1",
        )  # fmt: skip
        killed = _refine(*args, dying=point)
        (entry,) = read_ledger(out / "batches.jsonl").entries.values()
        again = _refine(*args)
        counts = answered(sim, out)
        created = len(sim.message_batches)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert again.returncode == 0, again.stderr
    assert len(read_jsonl(out / "outputs.jsonl")) == 5
    assert_paid_once(counts, out)
    # One batch a round (generate, feedback, refine, the last feedback): none sent twice.
    assert created == 4
    if point == "after_create":
        assert entry.batch_id is None and "adopted" in again.stderr


class _Listing:
    """A batch API whose listing holds the batches given (only ``listing`` is used)."""

    def __init__(self, *infos: BatchInfo) -> None:
        self.infos = infos

    async def listing(self) -> AsyncIterator[BatchInfo]:
        for info in self.infos:
            yield info

    async def file_listing(self) -> AsyncIterator[FileInfo]:
        for _ in ():
            yield FileInfo("", "", None)


@pytest.mark.anyio
async def test_a_batch_that_cannot_show_whose_it_is_is_waited_for() -> None:
    """A batch created since an intent that is still in progress (Message Batches show no
    requests until they end) keeps the intent undecided instead of "not found", unless it
    is one of the run's own; an ended one with the token is found."""
    opaque = BatchInfo("msgbatch_1", "in_progress", created_at=2_000, opaque=True)
    ours = BatchInfo("msgbatch_0", "completed", created_at=1_900, metadata={TOKEN_KEY: "t0"})
    api = _Listing(opaque, ours)
    with pytest.raises(Undecided):
        await find_by_token(api, {"t1"}, since=1_800)  # type: ignore[arg-type]
    found = await find_by_token(api, {"t1"}, 1_800, known=frozenset({"msgbatch_1"}))  # type: ignore[arg-type]
    assert found == {}
    assert await find_by_token(api, {"t0"}, since=1_800) == {"t0": ours}  # type: ignore[arg-type]


def test_refine_cancel_stops_a_claude_runs_message_batches(tmp_path: Path) -> None:
    """--detach submits the first round and exits 75; `refine cancel` cancels its Message
    Batch; the next run sends the canceled requests again and finishes, paying none twice."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    out = tmp_path / "run"
    with Simulator(replace(SIM, batch_delay_s=30.0)) as sim:
        detached = claude_batch_run(sim, inp, out, detach=True, max_iters=0, min_iters=0)
        cancelled = cancel(out, api_key=KEY)
        sim.set_config(replace(SIM, batch_delay_s=0.1))
        summary = claude_batch_run(sim, inp, out, max_iters=0, min_iters=0)
        statuses = [b["processing_status"] for b in sim.message_batches]
        counts = answered(sim, out)
    assert detached.exit_code == 75
    assert [c.status for c in cancelled] == ["cancelling"]
    assert summary.exit_code == 0, summary.message
    assert statuses == ["ended", "ended"]  # the canceled one, and the one sent again
    assert len(read_jsonl(out / "outputs.jsonl")) == 4
    assert_paid_once(counts, out)
