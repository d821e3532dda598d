#!/usr/bin/env python3
"""Does refinement pay on code-improve? Self-Refine against best-of-n, at equal budget.

On the coding suites (scripts/data/code-*.jsonl, each with hidden tests written apart from
the prompts and never shown to the model), in one run:

  (a) Self-Refine                 the method: generate, then feedback and refine, --max-iters
  (b) Self-Refine, pooled choice  the same calls, the output chosen by the code kit's opt-in
                                  `pooled` rule (the choice makes no call: (a)'s traces are
                                  chosen again)
  (c) best-of-n, pooled choice    --max-iters 0 --strategy samples=N, N the calls per record
                                  (a) made (rounded up), the output chosen by `pooled`

A record counts as right when its code passes every hidden test. Printed per condition:
records right at each iteration (carried forward: a loop that stopped keeps its answer),
right as chosen, right in any answer (what a reader knowing the tests would pick), calls
and tokens per record; then the same per suite. Markdown; --out writes it to a file.

Usage: scripts/quality.py [--suites code-suite,code-fresh,code-third,code-fourth]
                          [--model qwen2.5-coder-1.5b | --simulator] [--max-iters 2]
                          [--samples N] [--limit N] [--concurrency 4] [--work DIR] [--out FILE]
Run it under ``flock /tmp/refine-heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.code import split  # noqa: E402
from pipeline import Settings, run  # noqa: E402
from pipeline.core.choice import choose  # noqa: E402
from pipeline.core.drafts import answers  # noqa: E402
from pipeline.core.jobs import Job  # noqa: E402
from pipeline.core.loader import load_job  # noqa: E402
from pipeline.core.trace import steps_of  # noqa: E402
from pipeline.runs.settings import effective_job  # noqa: E402
from pipeline.sandbox import run_tests  # noqa: E402

DATA = ROOT / "scripts" / "data"
SUITES = ("code-suite", "code-fresh", "code-third", "code-fourth")
JOB = "code-improve"


def rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def build_input(suites: Sequence[str], limit: int | None, dest: Path) -> dict[str, list[str]]:
    """Write the suites' requests to ``dest`` (ids SUITE/ID); their hidden tests by that id."""
    hidden: dict[str, list[str]] = {}
    lines = []
    for suite in suites:
        tests = orjson.loads((DATA / f"{suite}-hidden-tests.json").read_bytes())
        for row in rows(DATA / f"{suite}.jsonl")[:limit]:
            rid = f"{suite}/{row['id']}"
            hidden[rid] = tests[row["id"]]
            lines.append(orjson.dumps({"id": rid, "task": row["task"]}))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(b"\n".join(lines) + b"\n")
    return hidden


def right(output: str | None, tests: Sequence[str]) -> bool:
    """Whether an answer's code passes every hidden test."""
    if not output:
        return False
    ran = run_tests(split(output)[0], list(tests))
    return ran.error is None and ran.passed == len(tests)


@dataclass(slots=True)
class Scored:
    """One condition's results over the records."""

    by_iteration: dict[int, int] = field(default_factory=dict)  # records right at t
    chosen: int = 0
    any_right: int = 0
    records: int = 0
    calls: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def score(
    job: Job,
    traces: Path,
    hidden: Mapping[str, list[str]],
    select: str,
    iterations: int,
    suite: str | None = None,
) -> Scored:
    """Hidden-test results of a run's traces, its output chosen by ``select``."""
    out = Scored(by_iteration=dict.fromkeys(range(iterations + 1), 0))
    cache: dict[str, bool] = {}

    def ok(rid: str, output: str | None) -> bool:
        key = f"{rid}\x00{output}"
        if key not in cache:
            cache[key] = right(output, hidden[rid])
        return cache[key]

    for trace in rows(traces):
        rid = trace["id"]
        if suite is not None and not rid.startswith(suite + "/"):
            continue
        steps = steps_of(trace["steps"])
        found = answers(job.answer_kind, steps)
        out.records += 1
        for t in range(iterations + 1):
            latest = [a for a in found if a.iteration <= t]
            out.by_iteration[t] += bool(latest) and ok(rid, latest[-1].output)
        chosen = choose(job, steps, select).step if found else None
        out.chosen += ok(rid, None if chosen is None else chosen.output)
        out.any_right += any(ok(rid, s.output) for s in steps if s.is_draft)
        made = [s for s in steps if not s.failed]
        out.calls.append(len(made))
        out.tokens.append(
            sum(s.usage.get("prompt_tokens", 0) + s.usage.get("completion_tokens", 0) for s in made)
        )
    return out


def row(name: str, s: Scored, iterations: int) -> str:
    cells = [f"{s.by_iteration[t]}" for t in range(iterations + 1)]
    calls = statistics.fmean(s.calls) if s.calls else 0.0
    tokens = statistics.fmean(s.tokens) if s.tokens else 0.0
    return (
        f"| {name} | " + " | ".join(cells) + f" | **{s.chosen}** | {s.any_right} | "
        f"{calls:.2f} | {tokens:,.0f} |"
    )


def table(title: str, scored: Mapping[str, Scored], iterations: int) -> list[str]:
    n = next(iter(scored.values())).records
    heads = " | ".join(f"t={t}" for t in range(iterations + 1))
    lines = [
        f"**{title}** ({n} requests; records whose code passes every hidden test)",
        "",
        f"| condition | {heads} | chosen | any answer | calls/record | tokens/record |",
        "|---" * (iterations + 6) + "|",
    ]
    lines += [row(name, s, iterations) for name, s in scored.items()]
    return lines


def settings_for(args: argparse.Namespace, url: str | None, **changes: Any) -> Settings:
    base: dict[str, Any] = {"concurrency": args.concurrency, "select": "pooled"}
    if url is None:
        base.update(local=True, local_model=args.model)
    else:
        base.update(base_url=url, model="sim-model", max_retries=2)
    return Settings(**{**base, **changes})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--suites", default=",".join(SUITES))
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--simulator", action="store_true", help="the project's simulator (plumbing)")
    p.add_argument("--max-iters", type=int, default=2)
    p.add_argument("--samples", type=int, help="n of best-of-n (default: (a)'s calls per record)")
    p.add_argument("--limit", type=int, help="only the first N requests of each suite")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "quality")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    suites = [s for s in args.suites.split(",") if s]
    hidden = build_input(suites, args.limit, args.work / "input.jsonl")
    started = time.monotonic()
    sim = None
    if args.simulator:
        from pipeline.testing.simulator import Simulator

        sim = Simulator()
        sim.start()
    try:
        url = None if sim is None else sim.url
        sr = settings_for(args, url, max_iters=args.max_iters)
        run(JOB, args.work / "input.jsonl", args.work / "sr", sr, api_key="k")
        sr_job = effective_job(load_job(JOB), sr)
        calls = [len([s for s in t["steps"] if s["response"] is not None])
                 for t in rows(args.work / "sr" / "traces.jsonl")]  # fmt: skip
        n = args.samples or math.ceil(statistics.fmean(calls))
        bon = settings_for(args, url, max_iters=0, strategy=(f"samples={n}",))
        run(JOB, args.work / "input.jsonl", args.work / "bon", bon, api_key="k")
        bon_job = effective_job(load_job(JOB), bon)
    finally:
        if sim is not None:
            sim.stop()
    t = args.max_iters

    def conditions(suite: str | None) -> dict[str, Scored]:
        traces_sr, traces_bon = (
            args.work / "sr" / "traces.jsonl",
            args.work / "bon" / "traces.jsonl",
        )
        return {
            "(a) Self-Refine": score(sr_job, traces_sr, hidden, "default", t, suite),
            "(b) Self-Refine, pooled choice": score(sr_job, traces_sr, hidden, "pooled", t, suite),
            f"(c) best-of-{n}, pooled choice": score(
                bon_job, traces_bon, hidden, "pooled", t, suite
            ),
        }

    model = "simulator" if args.simulator else args.model
    lines = [
        f"# code-improve: Self-Refine against best-of-{n} ({model}, --max-iters {t})",
        "",
        *table("all suites", conditions(None), t),
    ]
    for suite in suites:
        lines += ["", *table(suite, conditions(suite), t)]
    lines += ["", f"{time.monotonic() - started:,.0f} s; runs in {args.work}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
