#!/usr/bin/env python3
"""Scale-out benchmark: one process vs 1 and 2 Ray workers, against the simulator, in one run.

Every figure is a ratio or a share measured in this run, so it holds on a noisy machine:

1. zero latency (client CPU bound): calls per second of the single-process pool, of one
   Ray worker and of two, taken from the simulator's log between the first and the last
   request (Ray's start-up is not counted), and their ratios.
2. a shared rate limit: a simulator enforcing ``--rpm`` per second (bucket of rpm/60), the
   same run by one process, one worker and two workers, each told ``--rpm``; utilisation =
   ideal time (the calls beyond the first second's budget, at the limit) / time from the
   first to the last request, and the share of requests refused (429). For contrast, two
   processes pacing on their own (two shards, each told ``--rpm``): what the cluster-wide
   limiter prevents.
3. the acceptance check: 400 records, ``--workers 2``, 2,400 RPM enforced per second, one
   worker SIGKILLed mid-run: records done, 429 share, calls made twice vs calls in flight.

The simulator runs in its own process (bench_throughput.simulator).
Usage: scripts/bench_scale.py [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import orjson
import ray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_throughput import records, simulator  # noqa: E402  (this folder)

from pipeline import Settings, arun  # noqa: E402
from pipeline.testing import traced_answers  # noqa: E402


def requests(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines() if line]


def span(reqs: list[dict[str, Any]]) -> float:
    times = [float(r["t"]) for r in reqs]
    return max(times) - min(times)


def refused(reqs: list[dict[str, Any]]) -> float:
    return sum(1 for r in reqs if r["status"] == 429) / len(reqs)


async def refine(url: str, inp: Path, out: Path, **kw: Any) -> None:
    settings = Settings(model="sim-model", base_url=url, **kw)
    summary = await arun("code-improve", inp, out, settings, api_key="k", show_progress=False)
    if summary.exit_code != 0:
        raise RuntimeError(f"run failed: {summary.message}")


async def zero_latency(tmp: Path, n: int) -> str:
    inp = records(tmp / "in-zero.jsonl", n)
    rates = {}
    for name, workers in (("one process", None), ("1 worker", 1), ("2 workers", 2)):
        log = tmp / f"zero-{workers}.jsonl"
        with simulator("--latency", "0", log=log) as url:
            await refine(url, inp, tmp / f"zero-{workers}", max_iters=0, workers=workers)
        reqs = requests(log)
        rates[name] = len(reqs) / span(reqs)
    one, w1, w2 = rates["one process"], rates["1 worker"], rates["2 workers"]
    return (
        f"zero latency, {n} calls, concurrency 64 per process: one process {one:.0f} calls/s, "
        f"1 worker {w1:.0f} calls/s (ratio {w1 / one:.2f}), 2 workers {w2:.0f} calls/s "
        f"(ratio to 1 worker {w2 / w1:.2f}, to one process {w2 / one:.2f})"
    )


async def shared_limit(tmp: Path, n: int, rpm: float) -> list[str]:
    inp = records(tmp / "in-limit.jsonl", n)
    per_s = rpm / 60.0
    lines = []
    kw: dict[str, Any] = {"max_iters": 1, "concurrency": 32, "rpm": rpm}
    for name, workers in (("one process", None), ("1 worker", 1), ("2 workers", 2)):
        log = tmp / f"limit-{workers}.jsonl"
        with simulator("--rpm", str(rpm), "--latency", "0.2", log=log) as url:
            await refine(url, inp, tmp / f"limit-{workers}", workers=workers, **kw)
        reqs = requests(log)
        ok = sum(r["status"] == 200 for r in reqs)
        ideal = max(0.0, (ok - per_s) / per_s)
        lines.append(
            f"strict limit {rpm:g} RPM, {n} records, --max-iters 1, {name}: {ok} calls, "
            f"utilisation {ideal / span(reqs):.3f}, refused {refused(reqs):.2%}"
        )
    log = tmp / "limit-alone.jsonl"
    with simulator("--rpm", str(rpm), "--latency", "0.2", log=log) as url:
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(partial(refine, url, inp, tmp / f"alone-{i}", shard=(i, 2), **kw))
    reqs = requests(log)
    lines.append(
        f"strict limit {rpm:g} RPM, the same records as two processes each pacing on its own: "
        f"refused {refused(reqs):.2%}"
    )
    return lines


async def killed_worker(tmp: Path, n: int, rpm: float, concurrency: int) -> str:
    inp = records(tmp / "in-kill.jsonl", n)
    run_dir = tmp / "kill"
    log = tmp / "kill.jsonl"
    with simulator("--rpm", str(rpm), "--latency", "0.2", log=log) as url:
        async with anyio.create_task_group() as tg:

            async def kill() -> None:
                while True:  # a third of the way: kill worker 0's process
                    await anyio.sleep(0.1)
                    done = (
                        len((run_dir / "outputs.jsonl").read_bytes().splitlines())
                        if (run_dir / "outputs.jsonl").exists()
                        else 0
                    )
                    try:
                        progress = orjson.loads((run_dir / "progress.json").read_bytes())
                    except (OSError, orjson.JSONDecodeError):
                        continue
                    pid = next((w["pid"] for w in progress.get("workers", ()) if w["pid"]), None)
                    if pid and done >= n // 3:
                        os.kill(pid, signal.SIGKILL)
                        return

            tg.start_soon(kill)
            await refine(
                url, inp, run_dir, workers=2, concurrency=concurrency, rpm=rpm, max_iters=1
            )
    reqs = requests(log)
    outs = [orjson.loads(x) for x in (run_dir / "outputs.jsonl").read_bytes().splitlines()]
    # Calls made again: answers the server gave that no trace holds.
    twice = sum(r["status"] == 200 for r in reqs) - traced_answers(run_dir)
    done = sum(o["status"] == "done" for o in outs)
    return (
        f"{n} records, --workers 2, {rpm:g} RPM enforced per second, one worker SIGKILLed a "
        f"third of the way: {done}/{n} done, refused {refused(reqs):.2%} of {len(reqs)} "
        f"requests, {twice} calls made again (calls in flight on the dead worker: at most "
        f"{concurrency})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    args = parser.parse_args()
    # One local Ray instance for every run, started on this (main) thread, which outlives
    # them all: Ray's processes end with the thread that started them.
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 * 1024 * 1024,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            print(await zero_latency(tmp, 600 if args.quick else 3000), flush=True)
            for line in await shared_limit(tmp, 60 if args.quick else 240, 2400):
                print(line, flush=True)
            print(await killed_worker(tmp, 120 if args.quick else 400, 2400, 16), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    anyio.run(main)
