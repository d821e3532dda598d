"""Run directories written by hand for the report's tests, and checks on what it writes."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.report import Cell, Measure, RunReport
from tests.helpers import write_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MINI = 0.15  # gpt-4o-mini, dollars per million prompt tokens
FOUR_O = 2.50  # gpt-4o


def record(
    rid: str,
    scores: Sequence[float | None],
    *,
    status: str = "done",
    stop: str = "done",
    chosen: int | None = None,
    metrics: Sequence[dict[str, Any] | None] | None = None,
    usage: tuple[int, int, int] = (10, 5, 2),
) -> dict[str, Any]:
    """One outputs.jsonl line; ``scores`` has one entry per answer (iteration 0..n)."""
    n = max(len(scores) - 1, 0)
    if chosen is None and status == "done":
        chosen = n
    return {
        "id": rid,
        "line": 1,
        "status": status,
        "output": "x",
        "iterations": n,
        "chosen_iteration": chosen,
        "stop_reason": stop,
        "score": scores[chosen] if chosen is not None and scores else None,
        "scores": list(scores),
        "metrics": metrics[chosen] if metrics and chosen is not None else None,
        "metrics_by_iteration": None if metrics is None else list(metrics),
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "calls": usage[2]},
        "error": {"type": "server", "message": "boom"} if status == "failed" else None,
    }


def step(role: str, iteration: int, latency: float = 0.1, **kw: Any) -> dict[str, Any]:
    """One traces.jsonl step (messages and response kept short); ``kw`` sets other fields."""
    return {
        "role": role,
        "iteration": iteration,
        "messages": [{"role": "user", "content": "q"}],
        "response": "a",
        "parsed": None,
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        "latency_s": latency,
        "attempts": 1,
        "error": None,
        **kw,
    }


def make_run(
    path: Path,
    outputs: Sequence[dict[str, Any]],
    traces: Sequence[dict[str, Any]] = (),
    *,
    input_lines: int | None = None,
    bad_lines: int = 0,
    raw_tail: bytes = b"",
    model: str = "sim-model",
) -> Path:
    """A run directory holding exactly these lines (and an input file of ``input_lines``)."""
    path.mkdir(parents=True)
    inp = path.parent / f"{path.name}-input.jsonl"
    if input_lines is not None:
        write_jsonl(inp, [{"id": f"r{i}"} for i in range(input_lines)])
    manifest = {
        "job": {"name": "gsm", "hash": "abc", "source": "gsm"},
        "model": model,
        "base_url": "http://127.0.0.1:1/v1",
        "max_iters": 3,
        "min_iters": 0,
        "settings": {"limit": None},
        "input": {"path": str(inp), "fingerprint": {"head_bytes": 0, "head_sha256": ""}},
        "created_at": "2025-01-01T00:00:00+00:00",
        "updated_at": "2025-01-01T00:05:00+00:00",
        "state": "finished",
    }
    (path / "manifest.json").write_bytes(orjson.dumps(manifest))
    write_jsonl(path / "outputs.jsonl", list(outputs))
    if raw_tail:
        with (path / "outputs.jsonl").open("ab") as fh:
            fh.write(raw_tail)
    write_jsonl(path / "traces.jsonl", list(traces))
    write_jsonl(path / "errors.jsonl", [{"line": i, "error": "bad"} for i in range(bad_lines)])
    return path


def gsm_run(path: Path) -> Path:
    """Three done records with scores [2,5,7], [4,None], [6] and gsm-like metrics, two failed."""
    outputs = [
        record(
            "a",
            [2, 5, 7],
            stop="max_iters",
            metrics=[
                {"correct": False, "coverage": 0.5, "answer": "12"},
                {"correct": True, "coverage": 0.75, "answer": "13"},
                {"correct": True, "coverage": 1.0, "answer": "13"},
            ],
            usage=(100, 50, 6),
        ),
        record(
            "b",
            [4, None],
            stop="no_change",
            chosen=0,
            metrics=[
                {"correct": False, "coverage": 0.25},
                {"correct": False, "coverage": 0.5, "error": "ValueError: x"},
            ],
            usage=(80, 20, 3),
        ),
        record("c", [6], metrics=[{"correct": True, "coverage": 1.0}], usage=(30, 10, 2)),
        # Failed records count in the header and stop reasons, never in the quality table:
        # their score of 100 would show in every mean if they did.
        record(
            "d",
            [100],
            status="failed",
            stop="error",
            chosen=0,
            metrics=[{"correct": True, "coverage": 1.0}],
            usage=(10, 5, 1),
        ),
        record("e", [], status="failed", stop="error", usage=(0, 0, 0)),
    ]
    traces = [
        {
            "id": "a",
            "steps": [
                step("generate", 0, 0.5),
                step("feedback", 0, 0.25),
                step("refine", 1, 1.0, attempts=3),
                step("feedback", 1, 0.75, error={"type": "length", "message": "cut"}),
                step("refine", 2, 2.0),
                step("feedback", 2, 0.5),
            ],
        },
        {"id": "c", "steps": [step("generate", 0, 1.5), step("feedback", 0, 0.5)]},
    ]
    return make_run(path, outputs, traces, input_lines=7, bad_lines=1)


def by_name(report: RunReport) -> dict[str, Measure]:
    """The report's measures keyed by name (the critic's score under "score")."""
    return {m.name: m for m in report.measures}


def check(got: Sequence[Cell], expected: Sequence[tuple[float, int]]) -> None:
    """The cells hold these (mean, n) pairs, means compared approximately."""
    assert [c.n for c in got] == [n for _, n in expected]
    assert [c.mean for c in got] == pytest.approx([m for m, _ in expected])


def assert_png(path: Path) -> None:
    """``path`` is a real PNG of the report's size, not an empty or placeholder file."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (640, 360)
    assert len(data) > 5_000, path


def priced_run(path: Path) -> Path:
    """Two records on gpt-4o-mini whose critic runs on gpt-4o; every call reads 1M tokens.

    Scores: a [2, 5], b [4, 4], so the carried-forward mean goes 3 -> 4.5 (+1.5 on each
    of 2 records = 3 points). Generate and refine cost $0.15 a call, feedback $2.50; b's
    last answer gets no feedback.
    """
    million = {"prompt_tokens": 10**6, "completion_tokens": 0}

    def calls(feedback_on_last: bool) -> list[dict[str, Any]]:
        out = [
            step("generate", 0, usage=million),
            step("feedback", 0, usage=million, model="gpt-4o"),
            step("refine", 1, usage=million),
        ]
        return [*out, step("feedback", 1, usage=million, model="gpt-4o")][
            : 4 if feedback_on_last else 3
        ]

    outputs = [record("a", [2, 5]), record("b", [4, 4])]
    traces = [{"id": "a", "steps": calls(True)}, {"id": "b", "steps": calls(False)}]
    return make_run(path, outputs, traces, model="gpt-4o-mini")


# Words the simulator's placeholder answers sometimes use (so coverage moves between
# iterations) and words they never use.
WORDS = (
    "input",
    "total",
    "result",
    "step",
    "value",
    "order",
    "example",
    "reviewer",
    "edge",
    "task",
    "line",
    "answer",
    "umbrella",
    "violin",
    "ladder",
    "kite",
)


@dataclass(frozen=True, slots=True)
class Reported:
    """A finished run and its report."""

    run_dir: Path
    page: Path
    outputs: list[dict[str, Any]]
    traces: dict[str, list[dict[str, Any]]]  # steps by record id


def concept_sets(n: int) -> list[dict[str, object]]:
    """``n`` CommonGen records with ids cg01, cg02, ... and 3 to 6 concepts each."""
    words = itertools.cycle(WORDS)
    return [
        {"id": f"cg{i:02d}", "concepts": [next(words) for _ in range(3 + i % 4)]}
        for i in range(1, n + 1)
    ]
