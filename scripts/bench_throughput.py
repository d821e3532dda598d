#!/usr/bin/env python3
"""Throughput benchmark: rate-limit utilisation, latency hiding and client overhead, in one run.

Every figure is a ratio measured in this run, so it holds on a noisy shared machine:

1. strict limit, generation only: N records, ``--max-iters 0``, against a simulator that
   enforces ``--rpm`` per second (bucket of rpm/60, as OpenAI may). Utilisation = ideal time
   (calls / (rpm/60)) / wall time; refused = share of requests answered 429.
2. strict limit, a 2-iteration job: the same with ``--max-iters 2`` (ideal from the calls made).
3. latency hiding: 2 s latency, no limit: calls per second / (concurrency / latency).
4. client overhead: pipeline calls per second vs a bare AsyncOpenAI loop, both on an
   unlimited zero-latency simulator (its own process), as a ratio.

Usage: scripts/bench_throughput.py [--records 600] [--rpm 1200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import openai
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, arun, load_job  # noqa: E402
from pipeline.core.prompts import opening  # noqa: E402
from pipeline.core.records import Record  # noqa: E402
from pipeline.io.records import read_records  # noqa: E402


@contextmanager
def simulator(*flags: str, log: Path | None = None) -> Iterator[str]:
    """A simulator in its own process (so it does not share our CPU core); yields its URL."""
    cmd = [sys.executable, "-m", "pipeline.testing.simulator", "--port", "0", *flags]
    if log is not None:
        cmd += ["--log", str(log)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening "):
            raise RuntimeError(f"simulator did not start: {line!r}")
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def records(path: Path, n: int) -> Path:
    path.write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "id": f"b{i}",
                    "task": f"Write a Python function #{i} that merges two "
                    "sorted lists into one sorted list without duplicates.",
                }
            )
            + b"\n"
            for i in range(n)
        )
    )
    return path


def statuses(log: Path) -> list[int]:
    return [orjson.loads(line)["status"] for line in log.read_bytes().splitlines() if line]


async def pipeline_run(url: str, inp: Path, out: Path, **kw: object) -> tuple[float, int]:
    """Run the pipeline; return (wall seconds, model calls made)."""
    settings = Settings(model="sim-model", base_url=url, **kw)  # type: ignore[arg-type]
    started = time.perf_counter()
    summary = await arun("code-improve", inp, out, settings, api_key="k", show_progress=False)
    wall = time.perf_counter() - started
    if summary.exit_code != 0:
        raise RuntimeError(f"run failed: {summary.message}")
    calls = sum(
        orjson.loads(line)["usage"]["calls"]
        for line in (out / "outputs.jsonl").read_bytes().splitlines()
    )
    return wall, calls


async def strict_limit(tmp: Path, n: int, rpm: float, max_iters: int, latency: float) -> str:
    log = tmp / f"sim-{max_iters}.jsonl"
    with simulator("--rpm", str(rpm), "--latency", str(latency), "--p-done", "0.3", log=log) as url:
        wall, calls = await pipeline_run(
            url,
            records(tmp / f"in-{max_iters}.jsonl", n),
            tmp / f"run-{max_iters}",
            max_iters=max_iters,
            concurrency=256,
            rpm=rpm,
        )
    st = statuses(log)
    # The first request can go at t=0 and the bucket starts with one second of budget,
    # so ideal = the time to pace out the calls beyond that, plus one answer's latency.
    per_s = rpm / 60.0
    ideal = max(0.0, (calls - per_s) / per_s) + latency
    refused = st.count(429) / len(st)
    return (
        f"strict limit {rpm:g} RPM, {n} records, --max-iters {max_iters}: {calls} calls, "
        f"wall {wall:.1f} s, ideal {ideal:.1f} s, utilisation {ideal / wall:.3f}, "
        f"refused {st.count(429)}/{len(st)} = {refused:.2%}"
    )


async def latency_hiding(tmp: Path, n: int, concurrency: int, latency: float) -> str:
    with simulator("--latency", str(latency)) as url:
        wall, calls = await pipeline_run(
            url,
            records(tmp / "in-lat.jsonl", n),
            tmp / "run-lat",
            max_iters=0,
            concurrency=concurrency,
        )
    ideal_rate = concurrency / latency
    rate = calls / wall
    return (
        f"latency hiding, {latency:g} s latency, concurrency {concurrency}: "
        f"{rate:.1f} calls/s of an ideal {ideal_rate:.1f}, ratio {rate / ideal_rate:.3f}"
    )


async def bare_loop(url: str, inp: Path, total: int, concurrency: int, *, fast: bool) -> float:
    """Calls per second of a plain loop sending the same generate prompts.

    No checkpoint, no outputs, no pacing. ``fast=False`` is the loop a user writes:
    ``AsyncOpenAI().chat.completions.create`` on the SDK's default transport.
    ``fast=True`` is the floor of the transport the pipeline uses: raw POSTs of
    orjson bytes over the SDK's aiohttp transport.
    """
    job = load_job("code-improve")
    prompts = [
        opening(job, r) for r in read_records(inp, job.inputs, "id") if isinstance(r, Record)
    ]
    http = openai.DefaultAioHttpClient() if fast else None
    async with openai.AsyncOpenAI(
        base_url=url, api_key="k", max_retries=0, http_client=http
    ) as client:
        seq = itertools.count()

        async def call(messages: list[dict[str, str]]) -> None:
            if not fast:
                await client.chat.completions.create(
                    model="sim-model",
                    max_tokens=job.max_tokens,
                    temperature=job.temperature,
                    messages=messages,  # type: ignore[arg-type]
                )
                return
            body = {
                "model": "sim-model",
                "messages": messages,
                "max_tokens": job.max_tokens,
                "temperature": job.temperature,
            }
            raw = await client.post(
                "/chat/completions",
                cast_to=httpx2.Response,
                content=orjson.dumps(body),
                options={"headers": {"Content-Type": "application/json"}},
            )
            orjson.loads(raw.content)

        async def worker(limit: int) -> None:
            while (i := next(seq)) < limit:
                await call(prompts[i % len(prompts)])

        await asyncio.gather(*(worker(concurrency) for _ in range(concurrency)))  # warm up
        seq = itertools.count()
        started = time.perf_counter()
        await asyncio.gather(*(worker(total) for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


async def overhead(tmp: Path, n: int, concurrency: int, rounds: int = 3) -> str:
    """Medians over ``rounds`` alternating runs: this machine's load drifts within seconds."""
    inp = records(tmp / "in-oh.jsonl", n)
    rates: dict[str, list[float]] = {"sdk": [], "floor": [], "ours": []}
    with simulator("--latency", "0") as url:
        for r in range(rounds):
            rates["sdk"].append(await bare_loop(url, inp, n, concurrency, fast=False))
            rates["floor"].append(await bare_loop(url, inp, n, concurrency, fast=True))
            wall, calls = await pipeline_run(
                url, inp, tmp / f"run-oh{r}", max_iters=0, concurrency=concurrency
            )
            rates["ours"].append(calls / wall)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return (
        f"client overhead, zero latency, concurrency {concurrency}, {n} calls, median of "
        f"{rounds} rounds: pipeline {med['ours']:.0f} calls/s; bare AsyncOpenAI loop "
        f"{med['sdk']:.0f} calls/s (ratio {med['ours'] / med['sdk']:.2f}); bare raw-POST loop "
        f"on the same aiohttp transport {med['floor']:.0f} calls/s "
        f"(ratio {med['ours'] / med['floor']:.2f})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--rpm", type=float, default=1200)
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    args = parser.parse_args()
    n = 120 if args.quick else args.records
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print(await strict_limit(tmp, n, args.rpm, 0, latency=0.2), flush=True)
        print(await strict_limit(tmp, n // 3, args.rpm, 2, latency=0.2), flush=True)
        print(await latency_hiding(tmp, 200 if args.quick else 1000, 100, 2.0), flush=True)
        print(await overhead(tmp, 500 if args.quick else 2000, 64), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
