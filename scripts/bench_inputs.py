#!/usr/bin/env python3
"""Input benchmark: large Parquet and compressed JSONL stream in bounded memory and start at once.

Every figure is measured in this run, against a baseline measured in the same run:

1. reading: every record of a 200,000-row Parquet file (an id column and a list column)
   and of the same records as .jsonl.gz, through ``read_records``, each in a fresh
   process. Peak resident memory is compared with the floor (a process that only imports
   the same modules) and with the unbounded way (pyarrow's ``read_table`` of the whole
   file, or the whole .gz decompressed, turned into Python rows).
2. starting: ``refine run commongen INPUT --max-iters 0 --limit N`` against the simulator,
   for each format: time from process start to the first model call, and peak memory,
   with how long counting the input first would have held that call back.

Usage: scripts/bench_inputs.py [--rows 200000] [--gz-rows 2000000] [--limit 500]
(wrap it in ``flock /tmp/refine-heavy.lock`` on a shared machine).
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.io.records import count_records  # noqa: E402
from pipeline.testing.simulator import SimConfig, Simulator  # noqa: E402

PREAMBLE = (
    "import sys, time; sys.path.insert(0, {root!r})\n"
    "from pathlib import Path; path = Path({path!r})\n"
)
PEAK = (
    "import atexit, sys\n"
    "def _peak():\n"
    "    hwm = next(x for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
    "    sys.stderr.write(f'peak-kib {hwm.split()[1]}\\n')\n"
    "atexit.register(_peak)\n"
)
REFINE = (
    "import runpy; sys.argv[0] = 'refine'\nrunpy.run_module('pipeline.cli', run_name='__main__')\n"
)
# Every reading program imports the same modules, so their peaks differ by the reading alone.
FLOOR = (
    "import gzip, orjson, pyarrow.parquet as pq\n"
    "from pipeline.core.loader import load_job; from pipeline.io.records import read_records\n"
)
OURS = (
    "inputs = load_job('commongen').inputs; t = time.perf_counter()\n"
    "n = sum(1 for _ in read_records(path, inputs, 'id')); print(time.perf_counter() - t)\n"
)
UNBOUNDED = {
    "parquet": "rows = pq.read_table(path).to_pylist(); n = len(rows)\n",
    "jsonl.gz": (
        "rows = [orjson.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]\n"
        "n = len(rows)\n"
    ),
}


def concept_rows(n: int) -> list[dict[str, object]]:
    """``n`` commongen records: an integer id and a list of 3 to 6 concepts."""
    return [
        {"id": i, "concepts": [f"word{(i * 31 + 7 * j) % 4999}" for j in range(3 + i % 4)]}
        for i in range(n)
    ]


def write_inputs(folder: Path, rows: int, gz_rows: int) -> dict[str, Path]:
    """The inputs: plain JSONL, the same rows as Parquet and .jsonl.gz, and a larger .jsonl.gz."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = concept_rows(rows)
    paths = {
        "jsonl": folder / "cg.jsonl",
        "parquet": folder / "cg.parquet",
        "jsonl.gz": folder / "cg.jsonl.gz",
        "large jsonl.gz": folder / "cg-large.jsonl.gz",
    }
    paths["jsonl"].write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), paths["parquet"])
    with gzip.open(paths["jsonl.gz"], "wb", compresslevel=6) as fh:
        fh.writelines(orjson.dumps(r) + b"\n" for r in records)
    with gzip.open(paths["large jsonl.gz"], "wb", compresslevel=6) as fh:
        for start in range(0, gz_rows, rows):
            chunk = concept_rows(min(rows, gz_rows - start))
            fh.writelines(orjson.dumps({**r, "id": start + int(r["id"])}) + b"\n" for r in chunk)  # type: ignore[call-overload]
    return paths


def peak_mib(code: str, *args: str) -> tuple[float, float, str]:
    """(peak resident MiB, wall seconds, stdout) of ``code`` run in a fresh interpreter.

    The peak is the child's own VmHWM, read as it exits: its rusage would also count
    the pages of this (larger) process that it was forked from before exec.
    """
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PEAK + code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1) or "Traceback" in done.stderr:  # 1: failed records
        raise RuntimeError(f"exited {done.returncode}: {done.stderr[-2000:]}")
    peak = next(x for x in done.stderr.splitlines() if x.startswith("peak-kib "))
    return int(peak.split()[1]) / 1024, time.monotonic() - started, done.stdout


def python(code: str, path: Path) -> tuple[float, float, str]:
    """Run ``code`` in a fresh interpreter with ``path`` bound; its peak MiB, seconds, output."""
    program = PREAMBLE.format(root=str(ROOT), path=str(path)) + FLOOR + code + "print(n)\n"
    return peak_mib(program)


def reading(paths: dict[str, Path]) -> None:
    floor, _, _ = python("n = 0\n", paths["parquet"])
    for fmt in ("parquet", "jsonl.gz"):
        ours, _, out = python(OURS, paths[fmt])
        whole, _, _ = python(UNBOUNDED[fmt], paths[fmt])
        seconds, rows = float(out.split()[-2]), int(out.split()[-1])
        ratio = (ours - floor) / max(whole - floor, 1)
        print(
            f"reading {rows:,} records of {fmt}: peak {ours:.0f} MiB streamed "
            f"({ours - floor:.0f} MiB above the {floor:.0f} MiB import floor), "
            f"{rows / seconds:,.0f} records/s; whole file into Python: {whole:.0f} MiB "
            f"({whole - floor:.0f} above the floor); ratio {ratio:.2f}"
        )


def starting(paths: dict[str, Path], limit: int, folder: Path) -> None:
    baseline = None  # plain JSONL's time to the first call: what the others compare with
    peak_mib("import pipeline.cli, pyarrow.parquet")  # warm the page cache: first is not slower
    with Simulator(SimConfig(latency_s=0.01), keep_requests=True) as sim:
        for fmt, path in paths.items():
            t0 = time.monotonic() - sim.uptime_s  # the simulator's clock zero, on ours
            seen = len(sim.requests)
            started = time.monotonic()
            argv = [
                "run", "commongen", str(path),
                "--out", str(folder / f"run-{fmt.replace(' ', '-')}"), "--base-url", sim.url,
                "--model", "m", "--max-iters", "0", "--limit", str(limit), "--quiet",
            ]  # fmt: skip
            peak, wall, _ = peak_mib(REFINE, *argv)
            first = t0 + min(r.t for r in sim.requests[seen:]) - started
            counted = time.monotonic()
            rows = count_records(path)
            count_s = time.monotonic() - counted
            baseline = baseline or first
            print(
                f"refine run on {rows:,}-row {fmt}, --limit {limit}: first call "
                f"{first:.2f} s after process start ({first / baseline:.2f} x plain JSONL's), "
                f"wall {wall:.2f} s, peak {peak:.0f} MiB; counting the input before the "
                f"first call would have added {count_s:.2f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--gz-rows", type=int, default=2_000_000)
    parser.add_argument("--limit", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-inputs-") as tmp:
        folder = Path(tmp)
        paths = write_inputs(folder, args.rows, args.gz_rows)
        sizes = ", ".join(f"{k} {p.stat().st_size / 2**20:.1f} MiB" for k, p in paths.items())
        print(f"inputs: {sizes}")
        reading(paths)
        starting(paths, args.limit, folder)


if __name__ == "__main__":
    main()
