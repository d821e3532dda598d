"""What tests and benchmarks use: the simulator, and measures of a finished run."""

from __future__ import annotations

from pathlib import Path

import orjson

__all__ = ["traced_answers"]


def traced_answers(run_dir: Path) -> int:
    """Steps in a run's traces that hold a model's answer (one per answered call it kept).

    A server's count of answered calls minus this is the calls made again after a crash;
    identical requests are no such measure (a loop asks again on purpose when an answer
    copied the previous one or was cut off at max_tokens, and that answer is a step too).
    """
    with (run_dir / "traces.jsonl").open("rb") as fh:
        return sum(
            1
            for line in fh
            if line.strip()
            for step in orjson.loads(line)["steps"]
            if step.get("response") is not None
        )
