#!/usr/bin/env python3
"""Batch API mode against real time: the same records on the simulator, figures from one run.

For each scenario the same records run twice against the project's simulator: in real
time, and with ``--batch``. Printed per scenario:

- rounds: submission rounds the batch run used (a round sends the next call of every
  waiting record; a record needs one per call, plus one per retried or unrun line);
- overhead requests per record: uploads, creates, retrieves, listings, downloads and
  deletions the batch run sent, against the chat calls the real-time run made;
- cost ratio: the batch run's dollars over the real-time run's, from each step's usage and
  the price table (the Batch API bills half); the target is <= 0.51;
- same outputs: whether every record ended with the same answer in both runs;
- chat calls: requests the batch run sent to /v1/chat/completions (must be 0), and calls
  (record, step) the simulator answered more than once (must be 0: none paid twice).

Scenarios: a clean provider; and one where 5% of lines fail (500, 429 or 400) and a
quarter of the batches expire half done.

Usage: scripts/bench_batch.py [--records 200] [--max-iters 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, arun  # noqa: E402
from pipeline.backends.batch import (  # noqa: E402
    BatchBackend,
    BatchConfig,
    OpenAIBatchAPI,
    read_ledger,
)
from pipeline.backends.batch.ledger import custom_ids  # noqa: E402
from pipeline.testing.simulator import SimConfig, Simulator  # noqa: E402

MODEL = "gpt-4o-mini"  # a model with a price, so dollars can be compared
KEY = "sk-bench"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One provider behaviour to measure."""

    name: str
    config: SimConfig


def records(n: int, path: Path) -> Path:
    """``n`` code-improve records (distinct tasks), written to ``path``."""
    rows = [{"id": f"r{i}", "task": f"Write a Python function number {i} that sums a list"}
            for i in range(n)]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def outputs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The output lines of a run, by record id."""
    lines = (run_dir / "outputs.jsonl").read_bytes().splitlines()
    return {o["id"]: o for o in map(orjson.loads, lines)}


def cost(outs: dict[str, dict[str, Any]]) -> float:
    """Dollars of every record."""
    return sum(o["cost_usd"] or 0.0 for o in outs.values())


async def measure(scenario: Scenario, n: int, max_iters: int, work: Path) -> str:
    """Run the scenario's records in real time and in batch mode; one line of figures."""
    inp = records(n, work / f"{scenario.name}.jsonl")
    with Simulator(scenario.config) as sim:
        real = await arun(
            "code-improve",
            inp,
            work / f"{scenario.name}-rt",
            Settings(model=MODEL, base_url=sim.url, max_iters=max_iters, concurrency=64),
            api_key=KEY,
            show_progress=False,
        )
        chat_calls = sum(1 for r in sim.requests if not r.is_batch)
        before = len(sim.requests)
        settings = Settings(
            model=MODEL, base_url=sim.url, max_iters=max_iters, batch=True, poll=0.05
        )
        api = OpenAIBatchAPI(sim.url, KEY, timeout=60.0)
        config = BatchConfig(creates_per_s=50, polls_per_s=200)
        try:
            batch = await arun(
                "code-improve",
                inp,
                work / f"{scenario.name}-batch",
                settings,
                api_key=KEY,
                show_progress=False,
                backend=BatchBackend(api, config=config),
            )
        finally:
            await api.aclose()
        during = sim.requests[before:]
    overhead: Counter[str] = api.requests
    rt_out, b_out = outputs(work / f"{scenario.name}-rt"), outputs(work / f"{scenario.name}-batch")
    same = rt_out.keys() == b_out.keys() and all(
        rt_out[k]["output"] == b_out[k]["output"] for k in rt_out
    )
    rounds = read_ledger(work / f"{scenario.name}-batch" / "batches.jsonl").rounds
    calls = custom_ids(work / f"{scenario.name}-batch" / "batches.jsonl")
    answered = Counter(calls[str(r.custom_id)] for r in during if r.is_batch and r.completed)
    twice = sum(1 for c in answered.values() if c > 1)
    per_record = ", ".join(f"{k} {v / n:.3f}" for k, v in sorted(overhead.items()))
    return (
        f"{scenario.name}: {n} records, --max-iters {max_iters}: "
        f"exit {real.exit_code} / {batch.exit_code}; rounds {rounds}; "
        f"real-time chat calls per record {chat_calls / n:.2f}; "
        f"batch overhead requests per record {sum(overhead.values()) / n:.3f} ({per_record}); "
        f"cost ratio {cost(b_out) / cost(rt_out):.4f}; same outputs {'yes' if same else 'NO'}; "
        f"batch-run chat calls {sum(1 for r in during if not r.is_batch)}, "
        f"calls answered twice {twice}"
    )


def main() -> None:
    """Run the scenarios and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--max-iters", type=int, default=2)
    args = parser.parse_args()
    clean = SimConfig(
        p_done=0.3, batch_validating_s=0.02, batch_delay_s=0.1, batch_finalizing_s=0.02
    )
    # Failed lines are 500 or 429 (retried), so every record ends as in real time and the
    # outputs can be compared; a 400 line would fail its record in batch mode only.
    faulty = replace(
        clean,
        p_line_fail=0.05,
        line_fail_statuses=(500, 429),
        p_batch_expire=0.25,
        expire_fraction=0.5,
    )
    scenarios = [Scenario("clean", clean), Scenario("faulty", faulty)]
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in scenarios:
            print(anyio.run(measure, scenario, args.records, args.max_iters, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
