#!/usr/bin/env python3
"""Measure simulator throughput: a simulator process driven by a bare AsyncOpenAI loop.

Usage: scripts/bench_simulator.py [--requests 4000] [--concurrency 200] [--latency 0] [--raw]

``--raw`` drives it with minimal hand-written HTTP/1.1 over asyncio streams instead of the
openai client (whose per-request CPU cost usually dominates), to see the server's own ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai
import orjson

ROOT = Path(__file__).resolve().parents[1]


async def run_workers(total: int, concurrency: int, make: Callable[[], Awaitable[object]]) -> float:
    """Run ``make()`` ``total`` times with ``concurrency`` workers; return requests per second."""
    counter = itertools.count()

    async def worker() -> None:
        while next(counter) < total:
            await make()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - started)


async def drive_openai(url: str, total: int, concurrency: int) -> float:
    async with openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0, timeout=60) as client:
        seq = itertools.count()

        async def one() -> object:
            content = f"question {next(seq)}"
            return await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": content}]
            )

        await run_workers(concurrency, concurrency, one)  # open the connections first
        return await run_workers(total, concurrency, one)


async def drive_raw(url: str, total: int, concurrency: int) -> float:
    host, port = url.split("//")[1].split("/")[0].split(":")
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = [
        await asyncio.open_connection(host, int(port)) for _ in range(concurrency)
    ]
    seq = itertools.count()

    async def one() -> object:
        reader, writer = pool.pop()
        body = orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": f"q{next(seq)}"}]}
        )
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        pool.append((reader, writer))
        return None

    rps = await run_workers(total, concurrency, one)
    for _, writer in pool:
        writer.close()
    return rps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--raw", action="store_true", help="hand-written HTTP instead of openai")
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "pipeline.testing.simulator", "--latency", str(args.latency)]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[1]
            drive = drive_raw if args.raw else drive_openai
            rps = asyncio.run(drive(url, args.requests, args.concurrency))
            mode = "raw HTTP" if args.raw else "AsyncOpenAI"
            shape = f"{args.requests} requests, {args.concurrency} concurrent"
            print(f"{rps:.0f} requests/s ({mode}, {shape}, latency {args.latency}s)")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
