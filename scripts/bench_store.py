#!/usr/bin/env python3
"""Run-directory bytes and start-up times of `refine run` on long inputs, against the simulator.

N records whose input is a ~10 KB specification (generated here, seeded), run as
``code-improve --max-iters 2 --min-iters 2 --no-checks`` by the `refine` of a checkout
(this one by default; ``--checkout DIR`` measures another, e.g. a worktree of an older
commit, with the same script and the same simulator, so two tables compare). It prints:

- run dir / input: the run directory's bytes over the input's right after the run, and the
  largest sampled during it (every 50 ms);
- prompt tokens per record (from outputs.jsonl);
- re-run of a finished run: the same command again (nothing to call), the median of 3;
- first new call after a kill at 50%: a second run SIGKILLed once half its records are
  out, then the same command: time from its start to the simulator's next request;
- `refine status` on the finished run, the median of 5.

Each time is the command's wall time and, in brackets, its CPU time (user + system),
which a machine shared with other work disturbs less.

The simulator runs in its own process (bench_throughput.simulator).
Usage: scripts/bench_store.py [--records N] [--checkout DIR] [--concurrency C]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_throughput import simulator  # noqa: E402  (this folder)

WORDS = [
    *("value", "list", "entry", "field", "record", "parser", "buffer", "limit", "window"),
    *("index", "range", "stream", "token", "input", "output", "error", "retry", "number"),
    *("string", "sorted", "unique", "total", "count", "prefix", "suffix", "key", "order"),
]


def specification(rng: random.Random, i: int, size: int = 10_000) -> str:
    """A long task: a title, then numbered requirements of random words, about ``size`` bytes."""
    parts = [f"Implement module m{i}: a Python function `solve_{i}` meeting this specification."]
    n = 1
    while sum(len(p) + 1 for p in parts) < size:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 30)))
        parts.append(f"{n}. The function must handle the {words}.")
        n += 1
    return "\n".join(parts)


def make_input(path: Path, n: int) -> int:
    rng = random.Random(66)
    with path.open("wb") as fh:
        for i in range(n):
            fh.write(orjson.dumps({"id": f"s{i}", "task": specification(rng, i)}) + b"\n")
    return path.stat().st_size


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # a rewrite's copy, renamed away
                total += (Path(root) / f).stat().st_size
    return total


class Refine:
    """`refine` of one checkout, in a subprocess."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        self.env = {**os.environ, "OPENAI_API_KEY": "sk-bench", "PYTHONPATH": str(checkout)}

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "pipeline.cli", *args]
        return subprocess.Popen(
            cmd, cwd=self.checkout, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def run(self, *args: str) -> tuple[float, float]:
        """The wall time and the CPU time (user + system) of `refine ARGS`."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = self.start(*args)
        _, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"refine {' '.join(args)} exited {proc.returncode}: {err.decode()}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def cpu_s(pid: int) -> float:
    """The CPU time (user + system) a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2000, help="N (default 2000)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the refine measured")
    parser.add_argument(
        "--structured",
        choices=("json_schema", "none"),
        default="json_schema",
        help="what the simulator takes: none makes the schema spelled out in the prompt",
    )
    args = parser.parse_args()
    refine = Refine(args.checkout.resolve())
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp_name:
        tmp = Path(tmp_name)
        inp = tmp / "in.jsonl"
        size = make_input(inp, args.records)
        log = tmp / "sim.jsonl"
        flags = ("--latency", "0", "--p-done", "0", "--structured", args.structured)
        with simulator(*flags, log=log) as url:

            def run_args(out: Path) -> tuple[str, ...]:
                fixed = ("--max-iters", "2", "--min-iters", "2", "--no-checks", "--quiet")
                at = ("--base-url", url, "--model", "sim-model")
                c = ("--concurrency", str(args.concurrency))
                return ("run", "code-improve", str(inp), "--out", str(out), *at, *c, *fixed)

            # 1. the run, its directory sampled
            out = tmp / "run"
            peak = [0]
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], dir_bytes(out))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            wall, _ = refine.run(*run_args(out))
            done.set()
            sampler.join()
            after = dir_bytes(out)
            peak[0] = max(peak[0], after)
            outs = [orjson.loads(x) for x in (out / "outputs.jsonl").read_bytes().splitlines()]
            prompt = statistics.mean(o["usage"]["prompt_tokens"] for o in outs)
            files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
            feedback = [
                s
                for t in (out / "traces.jsonl").read_bytes().splitlines()
                for s in orjson.loads(t)["steps"]
                if s["role"] == "feedback"
            ]
            parsed = sum(s.get("parsed") is not None for s in feedback) / len(feedback)
            # 2. a finished run again, and its status
            rerun = median([refine.run(*run_args(out)) for _ in range(3)])
            status = median([refine.run("status", str(out)) for _ in range(5)])
            # 3. killed at 50%, then the same command: its first new call
            out2 = tmp / "killed"
            proc = refine.start(*run_args(out2))
            while lines(out2 / "outputs.jsonl") < args.records // 2 and proc.poll() is None:
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            before = lines(log)
            t0 = time.perf_counter()
            proc = refine.start(*run_args(out2))
            while lines(log) == before and proc.poll() is None:
                time.sleep(0.005)
            first_call = time.perf_counter() - t0, cpu_s(proc.pid)
            proc.communicate()
            finished = lines(out2 / "outputs.jsonl")
    print(
        f"refine of {args.checkout}: {args.records:,} records, input {size / 2**20:.1f} MiB, "
        f"simulator taking {args.structured}"
    )
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| run dir / input, right after the run | {after / size:.2f} |")
    print(f"| run dir / input, peak during the run | {peak[0] / size:.2f} |")
    print(f"| prompt tokens per record | {prompt:,.0f} |")
    print(f"| feedback parsed | {parsed:.1%} of {len(feedback):,} |")
    print(f"| the run (wall) | {wall:.1f} s |")
    for what, (w, c) in (
        ("re-run of the finished run", rerun),
        ("first new call after a kill at 50%", first_call),
        ("refine status (finished run)", status),
    ):
        print(f"| {what}: wall (CPU) | {w:.2f} s ({c:.2f} s) |")
    print("files after the run: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in files.items()))
    print(f"killed run resumed to {finished:,} outputs of {args.records:,}")


if __name__ == "__main__":
    main()
