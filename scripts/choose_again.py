#!/usr/bin/env python3
"""A finished code-improve run of the quality suite, its output chosen again by this checkout.

Choosing a record's output makes no model call, so ``choose`` over a run's traced steps is
exactly what this checkout would have written for the same answers (the pooled tests a run
made before they were recorded are run here, as the loop now runs them). For each RUN_DIR
(from ``scripts/quality.py --tasks code --work DIR``) prints the hidden tests passed at
iteration 0, by the run's own output and by the output chosen again, the requests gained
and lost against iteration 0, and the calls (copy retries among them) and tokens it used.

Usage: scripts/choose_again.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from quality import HIDDEN, hidden_pass  # noqa: E402  (this folder)

from pipeline.answers import FAILED_TESTS, POOLED_TESTS, split  # noqa: E402
from pipeline.calls import Step, is_answer, is_copy  # noqa: E402
from pipeline.jobs import load_job  # noqa: E402
from pipeline.loop import choose, pooled  # noqa: E402


def with_pool(steps: list[Step]) -> list[Step]:
    """``steps`` with the pooled-tests metric the loop now records on every answer, where a
    run made before it did not (the answers' tests are in the trace: no call is needed)."""
    out: list[Step] = []
    programs: list[str] = []
    for step in steps:
        if is_answer(step) and step.metrics is not None and FAILED_TESTS in step.metrics:
            programs.append(step.output or "")
            if POOLED_TESTS not in step.metrics:
                step = replace(step, metrics={**step.metrics, POOLED_TESTS: pooled(programs)})
        out.append(step)
    return out


def report(run_dir: Path, hidden: dict[str, list[str]]) -> str:
    job = load_job("code-improve")
    outputs = {
        row["id"]: row
        for row in map(orjson.loads, (run_dir / "outputs.jsonl").read_bytes().splitlines())
    }
    first = own = again = calls = copies = tokens = 0
    gained: list[str] = []
    lost: list[str] = []
    for raw in (run_dir / "traces.jsonl").read_bytes().splitlines():
        line = orjson.loads(raw)
        rid = line["id"]
        steps = with_pool([Step.from_dict(s) for s in line["steps"]])
        calls += len(steps)
        copies += sum(is_copy(s) for s in steps)
        tokens += sum(
            s.usage.get("prompt_tokens", 0) + s.usage.get("completion_tokens", 0) for s in steps
        )
        answers = {s.iteration: s for s in steps if is_answer(s)}
        chosen, _, _ = choose(steps, job)
        at_0 = hidden_pass(split(answers[0].output or "")[0], hidden[rid])
        now = chosen is not None and hidden_pass(
            split(answers[chosen].output or "")[0], hidden[rid]
        )
        out = outputs[rid]["output"]
        first += at_0
        own += out is not None and hidden_pass(out, hidden[rid])
        again += now
        if now and not at_0:
            gained.append(rid)
        if at_0 and not now:
            lost.append(rid)
    n = len(outputs)
    return (
        f"{run_dir}: iteration 0 {first}/{n}, the run's output {own}/{n}, chosen again "
        f"{again}/{n}; gained {len(gained)} ({', '.join(gained) or '-'}), lost {len(lost)} "
        f"({', '.join(lost) or '-'}); {calls} calls ({copies} copy retries), {tokens:,} tokens"
    )


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    hidden = orjson.loads(HIDDEN.read_bytes())
    for arg in sys.argv[1:]:
        print(report(Path(arg), hidden), flush=True)


if __name__ == "__main__":
    main()
