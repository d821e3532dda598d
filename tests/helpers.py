"""Small helpers shared by the tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from pipeline import RunSummary, Settings, run
from pipeline.client.delays import DELAYS, Backoff
from pipeline.core.trace import steps_of
from pipeline.testing.simulator import Simulator

# The team's real task data, beside the checkout; a checkout without it (a fresh clone in
# CI) uses the copy in tests/fixtures/shared-data: the first 60 lines of GSM8K and
# CommonGen-Hard, every acronym title.
_BESIDE = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
SHARED_DATA = _BESIDE if _BESIDE.is_dir() else Path(__file__).parent / "fixtures" / "shared-data"
# A client's delays with no backoff between a call's attempts: a server's Retry-After, the
# outage probes' spacing and the flex tier's waits stay as in a run.
NO_BACKOFF = replace(DELAYS, retry=Backoff(0.0, 0.0))


def wait_for_calls(run_dir: Path, n: int, proc: subprocess.Popen[str], limit_s: float = 30) -> None:
    """Wait until the run's checkpoint holds at least ``n`` completed calls."""
    deadline = time.monotonic() + limit_s
    journal = run_dir / "checkpoint.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)


def sent(trace: Mapping[str, Any]) -> list[list[dict[str, str]]]:
    """Each call's messages as sent, rebuilt from a traces.jsonl line (or journaled steps)."""
    return [s.messages for s in steps_of(trace["steps"])]


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``rows`` as a JSONL file."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, parsed (JSON: any value under a key)."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def tasks(n: int, start: int = 0) -> list[dict[str, str]]:
    """``n`` distinct code-improve records."""
    return [
        {"id": f"r{i}", "task": f"Write a Python function number {i} that sums a list"}
        for i in range(start, start + n)
    ]


def concept_rows(n: int) -> list[dict[str, Any]]:
    """``n`` distinct commongen records: an integer id and a list of 3 to 6 concepts."""
    return [
        {"id": i, "concepts": [f"word{(i + 7 * j) % 31}" for j in range(3 + i % 4)]}
        for i in range(n)
    ]


def run_commongen(sim: Simulator, inp: Path, out: Path) -> RunSummary:
    """Run commongen over ``inp`` into ``out`` against ``sim``, one refinement at most."""
    settings = Settings(model="sim-model", base_url=sim.url, max_iters=1, concurrency=32)
    return run("commongen", inp, out, settings, api_key="k", show_progress=False)
