#!/usr/bin/env python3
"""Local-model batching benchmark: completion tokens per second by --concurrency, in one run.

1. Whole process: ``refine run code-improve`` on the 16 coding requests of
   ``scripts/data/bench_local.jsonl`` with ``--local --max-iters 0`` (generation only) at
   each concurrency, timed from start to exit (server start included). ``--concurrency N``
   gives the server ``min(N, DEFAULT_SLOTS)`` slots, so for this table the default is
   raised to the largest level. Tokens per second = completion tokens / wall time; the
   ratio is to concurrency 1 in the same run. Quality is the same job's answers judged
   the same way at every level: the share whose code block parses and defines a
   function or class, and the mean answer length. Each level runs ``--rounds`` times, in
   alternating order; the best run counts (the least disturbed on a shared machine).
   ``--repeat N`` sends each request N times (ids ``word-count~2``, ...): 16 requests
   keep a large server's higher levels waiting on the longest answer.
2. ``--tune``: the server alone (no refine around it) at 4 slots, varying threads, busy
   polling and the batch size, to see whether the defaults leave speed on the table.

The default slot count is the smallest level within 5% of the best tokens per second.

Usage: scripts/bench_local.py [--levels 1,2,4,8] [--rounds 2] [--repeat 1] [--model NAME]
                              [--tune]
Run it under ``flock /tmp/refine-heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import load_job  # noqa: E402
from pipeline.backends.local import DEFAULT_SLOTS, LocalServer, resolve_model  # noqa: E402
from pipeline.backends.local.server import SLOTS_ENV  # noqa: E402
from pipeline.core.answers import extract_code  # noqa: E402
from pipeline.core.prompts import opening  # noqa: E402
from pipeline.io.records import read_records  # noqa: E402
from pipeline.sandbox import syntax_problem  # noqa: E402

RECORDS = ROOT / "scripts" / "data" / "bench_local.jsonl"
NEAR_BEST = 0.95


@dataclass(frozen=True, slots=True)
class Level:
    """One whole-process run at one concurrency."""

    concurrency: int
    wall_s: float
    completion_tokens: int
    answers: int
    done: int
    parses: int

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens per second of wall time."""
        return self.completion_tokens / self.wall_s


def defines_code(answer: str) -> bool:
    """The answer's code block parses and defines at least one function or class."""
    code = extract_code(answer)
    if syntax_problem(code) is not None:
        return False
    tree = ast.parse(code)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(isinstance(node, kinds) for node in ast.walk(tree))


def repeated(records: Path, times: int, dest: Path) -> Path:
    """``records`` with each line ``times`` over in ``dest`` (the copies' ids end in ``~2``,
    ``~3``, ...: ids stay unique); ``records`` itself when ``times`` is 1."""
    if times == 1:
        return records
    rows = [orjson.loads(line) for line in records.read_bytes().splitlines() if line.strip()]
    with dest.open("wb") as handle:
        for copy in range(1, times + 1):
            for row in rows:
                named = row if copy == 1 else {**row, "id": f"{row['id']}~{copy}"}
                handle.write(orjson.dumps(named) + b"\n")
    return dest


def run_level(
    concurrency: int, model: str | None, work: Path, slots: int, records: Path = RECORDS
) -> Level:
    """``refine run`` at one concurrency, timed as a whole process."""
    out = work / f"c{concurrency}"
    command = [
        sys.executable, "-m", "pipeline.cli", "run", "code-improve", str(records),
        "--out", str(out), "--local", "--max-iters", "0",
        "--concurrency", str(concurrency), "--quiet",
    ]  # fmt: skip
    if model:
        command += ["--local-model", model]
    env = {**os.environ, SLOTS_ENV: str(slots)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"refine run exited with {done.returncode} at concurrency {concurrency}")
    rows = [orjson.loads(line) for line in (out / "outputs.jsonl").read_bytes().splitlines()]
    return Level(
        concurrency=concurrency,
        wall_s=wall,
        completion_tokens=sum(int(row["usage"]["completion_tokens"]) for row in rows),
        answers=len(rows),
        done=sum(row["status"] == "done" for row in rows),
        parses=sum(bool(row["output"]) and defines_code(str(row["output"])) for row in rows),
    )


def pick_slots(levels: list[Level]) -> int:
    """The smallest concurrency within 5% of the best tokens per second."""
    best = max(level.tokens_per_s for level in levels)
    return min(level.concurrency for level in levels if level.tokens_per_s >= NEAR_BEST * best)


async def serve_once(model_name: str | None, slots: int, **server: object) -> float:
    """Tokens per second of the server alone: the 16 requests, ``slots`` at a time."""
    from openai import AsyncOpenAI

    job = load_job("code-improve")
    records = [r for r in read_records(RECORDS, job.inputs, "id") if not isinstance(r, Exception)]
    model = await anyio.to_thread.run_sync(resolve_model, model_name)
    tokens = 0
    async with LocalServer(model, parallel=slots, **server) as running:  # type: ignore[arg-type]
        client = AsyncOpenAI(base_url=running.base_url, api_key="local", timeout=900)
        limit = anyio.Semaphore(slots)

        async def one(messages: list[dict[str, str]]) -> None:
            nonlocal tokens
            async with limit:
                reply = await client.chat.completions.create(
                    model=running.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=job.temperature,
                    max_tokens=job.max_tokens,
                )
            tokens += reply.usage.completion_tokens if reply.usage else 0

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for record in records:
                tg.start_soon(one, opening(job, record))
        wall = time.perf_counter() - started
        await client.close()
    return tokens / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,2,4,8", help="concurrency levels, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="runs per level (best one counts)")
    parser.add_argument("--repeat", type=int, default=1, help="send each request N times")
    parser.add_argument("--model", default=None, help="--local-model (default: the default)")
    parser.add_argument("--tune", action="store_true", help="also vary threads, polling, batch")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    cores = len(os.sched_getaffinity(0))
    requests = len(RECORDS.read_text().splitlines()) * args.repeat
    print(
        f"{requests} coding requests, generation only, model {args.model or 'default'}, "
        f"{cores} cores, {args.rounds} rounds",
        flush=True,
    )
    runs: dict[int, list[Level]] = {level: [] for level in levels}
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        records = repeated(RECORDS, args.repeat, Path(tmp) / "records.jsonl")
        for round_ in range(args.rounds):
            # Alternate the order so a slow spell on a shared machine hits every level.
            for concurrency in levels if round_ % 2 == 0 else levels[::-1]:
                work = Path(tmp) / f"r{round_}"
                level = run_level(concurrency, args.model, work, max(levels), records)
                runs[concurrency].append(level)
                print(
                    f"round {round_ + 1}, concurrency {concurrency}: {level.completion_tokens} "
                    f"completion tokens in {level.wall_s:.1f} s = {level.tokens_per_s:.1f} tok/s; "
                    f"code that parses {level.parses}/{level.answers}",
                    flush=True,
                )
    best = [max(runs[level], key=lambda run: run.tokens_per_s) for level in levels]
    base = best[0]
    print()
    print("| concurrency | tok/s (best run) | vs 1 | code parses (all runs) | mean tokens |")
    print("| --- | --- | --- | --- | --- |")
    for level in best:
        every = runs[level.concurrency]
        answers = sum(run.answers for run in every)
        print(
            f"| {level.concurrency} | {level.tokens_per_s:.1f} | "
            f"{level.tokens_per_s / base.tokens_per_s:.2f}x | "
            f"{sum(run.parses for run in every)}/{answers} | "
            f"{sum(run.completion_tokens for run in every) / max(answers, 1):.0f} |"
        )
    print(
        f"\ndefault slots: {pick_slots(best)} (smallest level within 5% of the best; "
        f"pipeline.backends.local.DEFAULT_SLOTS is {DEFAULT_SLOTS})"
    )
    if args.tune:
        variants: list[tuple[str, dict[str, object]]] = [
            (f"{cores} threads (default)", {}),
            (f"{max(cores - 1, 1)} thread(s)", {"n_threads": max(cores - 1, 1)}),
            ("no busy polling (--poll 0)", {"extra_args": ("--poll", "0")}),
            ("batch 64 (--batch-size, --ubatch-size)", {"batch_size": 64}),
        ]
        print(f"\nserver alone, 4 slots, 16 requests, best of {args.rounds}:")
        for label, server in variants:
            rate = max(
                anyio.run(functools.partial(serve_once, args.model, 4, **server))
                for _ in range(args.rounds)
            )
            print(f"  {label}: {rate:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
