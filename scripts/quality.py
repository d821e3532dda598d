#!/usr/bin/env python3
"""Does program-verified feedback make a small local critic useful? A per-iteration table.

For CommonGen-Hard (mean concept coverage) and GSM8K (accuracy of the program-aided
answer), on the first N records of ../shared/data, with a local model, three ways:

  (a) critic only            --no-checks              (the paper's loop)
  (b) critic, min-iters 1     --no-checks --min-iters 1 (refinement forced once)
  (c) critic plus check       checks on                (findings merged, done vetoed)

The table is the carried-forward mean by iteration (each record contributes its latest
answer at or before iteration t), as `refine report` computes it.

Usage: scripts/quality.py [--model qwen2.5-coder-1.5b] [--records 20] [--skip 0]
                          [--max-iters 1] [--tasks commongen,gsm] [--conditions abc]
                          [--out docs/quality.md]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, run  # noqa: E402
from pipeline.report import summarize  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
TASKS = {
    "commongen": ("commongen-hard.jsonl", "coverage", "mean concept coverage"),
    "gsm": ("gsm8k-test.jsonl", "correct", "accuracy"),
}
CONDITIONS = {
    "a": ("critic only", {"checks": False}),
    "b": ("critic, --min-iters 1", {"checks": False, "min_iters": 1}),
    "c": ("critic plus check", {"checks": True}),
}


def first_records(source: Path, n: int, dest: Path, skip: int = 0) -> Path:
    lines = [line for line in source.read_text().splitlines() if line.strip()][skip : skip + n]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def table(task: str, runs: dict[str, Path], metric: str, label: str, max_iters: int) -> str:
    rows = [
        "| iteration | " + " | ".join(CONDITIONS[c][0] for c in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    columns: dict[str, list[str]] = {}
    notes = []
    for cond, run_dir in runs.items():
        report = summarize(run_dir)
        measure = next(
            (m for m in report.measures if m.kind == "metric" and m.name == metric), None
        )
        cells = list(measure.carried) if measure else []
        columns[cond] = [f"{c.mean:.3f} ({c.n})" if c.mean is not None else "-" for c in cells]
        refined = sum(n for t, n in report.iterations.items() if t > 0)
        notes.append(
            f"{CONDITIONS[cond][0]}: {report.done} done, {report.failed} failed, "
            f"{refined} refined at least once, stop reasons "
            + ", ".join(f"{k} {v}" for k, v in report.stop_reasons.items())
        )
    for t in range(max_iters + 1):
        rows.append(
            f"| {t} | "
            + " | ".join(columns[c][t] if t < len(columns[c]) else "-" for c in runs)
            + " |"
        )
    return (
        f"### {task}: {label} by iteration (carried forward; records with a value)\n\n"
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(f"- {n}" for n in notes)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument(
        "--skip", type=int, default=0, help="start after this many records (a held-out slice)"
    )
    parser.add_argument("--max-iters", type=int, default=1)
    parser.add_argument("--tasks", default="commongen,gsm")
    parser.add_argument("--conditions", default="abc")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "quality")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "quality.md")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    sections = []
    for task in args.tasks.split(","):
        source, metric, label = TASKS[task]
        tag = f"-from{args.skip}" if args.skip else ""
        inp = first_records(
            DATA / source, args.records, args.work / f"{task}{tag}-input.jsonl", args.skip
        )
        runs: dict[str, Path] = {}
        for cond in args.conditions:
            _, extra = CONDITIONS[cond]
            out = args.work / f"{task}{tag}-{cond}-{args.model}-{args.max_iters}"
            settings = Settings(
                local=True, local_model=args.model, max_iters=args.max_iters, concurrency=4, **extra
            )  # type: ignore[arg-type]
            started = time.monotonic()
            summary = run(task, inp, out, settings, show_progress=False)
            print(
                f"{task} ({cond}) {CONDITIONS[cond][0]}: {summary.state}, "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
            runs[cond] = out
        sections.append(table(task, runs, metric, label, args.max_iters))
    command = "scripts/quality.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = (
        "# Verified feedback: critic only vs critic plus check\n\n"
        f"Produced by `{command.strip()}` on {time.strftime('%Y-%m-%d')} "
        f"with the local model `{args.model}` on the "
        + (
            f"{args.records} records after the first {args.skip}"
            if args.skip
            else f"first {args.records} records"
        )
        + " of each data set, at most "
        f"{args.max_iters} refinement(s). Each cell: mean (records with a value).\n\n"
        + "\n".join(sections)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
