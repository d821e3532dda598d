#!/usr/bin/env python3
"""Does program-verified feedback make a small local model's answers better? Tables by iteration.

Tasks, each on the first N records (after --skip) of its data set, with local models:

  code       code-improve on scripts/data/code-suite.jsonl: the pass rate of hidden tests
             (scripts/data/code-suite-hidden-tests.json, written for this suite and never
             put into a prompt) run on each iteration's code and on the chosen output;
             --suite scripts/data/code-fresh.jsonl, code-third.jsonl or
             code-fourth.jsonl for the three dozens written after the prompts and
             choice rules, to check them on requests they were not fit to
  commongen  CommonGen-Hard: concept coverage of the first sentence (the task asks for
             one sentence) and the share of one-sentence answers
  gsm        GSM8K: accuracy of the program-aided answer

and up to three conditions:

  (a) critic only            --no-checks               (the paper's loop)
  (b) critic, min-iters 1    --no-checks --min-iters 1 (refinement forced once)
  (c) critic plus check      checks on                 (findings merged, done vetoed)

Iteration rows are carried forward: each record contributes its latest answer at or
before iteration t, as `refine report` computes them. Prints Markdown; --out writes it.

--repeat N runs each record N times over, as records ID~1 .. ID~N (the same request,
scored by the same hidden tests): how one request fares from run to run, at the cost of
one run, for example `--skip 6 --records 1 --repeat 12` for the suite's ipv4 request.

Usage: scripts/quality.py [--tasks code,commongen,gsm] [--models qwen2.5-coder-0.5b,...]
                          [--suite FILE] [--records 20] [--skip 0] [--repeat 1] [--max-iters 1]
                          [--conditions c] [--concurrency 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, run  # noqa: E402
from pipeline.answers import split  # noqa: E402
from pipeline.report import summarize  # noqa: E402
from pipeline.sandbox import run_tests  # noqa: E402

SUITE = ROOT / "scripts" / "data" / "code-suite.jsonl"
HIDDEN = ROOT / "scripts" / "data" / "code-suite-hidden-tests.json"
CONDITIONS = {
    "a": ("critic only", {"checks": False}),
    "b": ("critic, --min-iters 1", {"checks": False, "min_iters": 1}),
    "c": ("critic plus check", {"checks": True}),
}


@dataclass(frozen=True, slots=True)
class Task:
    """A data set, the job run on it and the metrics its table shows."""

    source: Path  # relative: in --data
    job: str
    metrics: tuple[tuple[str, str], ...]  # (evaluator metric, label); none for hidden tests


TASKS = {
    "code": Task(SUITE, "code-improve", ()),
    "commongen": Task(
        Path("commongen-hard.jsonl"),
        "commongen",
        (
            ("coverage", "coverage (first sentence)"),
            ("one_sentence", "one sentence"),
            ("coverage_any_sentence", "coverage (any sentence)"),
        ),
    ),
    "gsm": Task(Path("gsm8k-test.jsonl"), "gsm", (("correct", "accuracy"),)),
}


def rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


REPEAT = "~"  # ID~K: the K-th copy of record ID (--repeat)


def slice_records(source: Path, n: int, skip: int, dest: Path, repeat: int = 1) -> Path:
    """Records skip+1 .. skip+n of ``source``, written to ``dest``; with ``repeat`` > 1,
    each ``repeat`` times over, one after another, as ID~1 .. ID~repeat (a record without
    an ``id`` is named by its line number in ``source``)."""
    lines = [line for line in source.read_text().splitlines() if line.strip()][skip : skip + n]
    if repeat > 1:
        records = [orjson.loads(line) for line in lines]
        names = [str(row.get("id", skip + i + 1)) for i, row in enumerate(records)]
        lines = [
            orjson.dumps({**row, "id": f"{name}{REPEAT}{k}"}).decode()
            for row, name in zip(records, names, strict=True)
            for k in range(1, repeat + 1)
        ]
    dest.write_text("\n".join(lines) + "\n")
    return dest


class BySuiteId(dict[str, Any]):
    """Values by the suite's record ids; a copy ID~K (--repeat) has those of ID."""

    def __missing__(self, rid: str) -> Any:
        name, mark, k = rid.rpartition(REPEAT)
        if mark and k.isdigit() and name in self:
            return self[name]
        raise KeyError(rid)


def hidden_path(suite: Path) -> Path:
    """Where a suite's hidden tests are: NAME-hidden-tests.json beside NAME.jsonl."""
    return suite.with_name(f"{suite.stem}-hidden-tests.json")


def load_hidden(path: Path = HIDDEN) -> BySuiteId:
    """A suite's hidden tests by record id (scripts/data/code-suite-hidden-tests.json)."""
    return BySuiteId(orjson.loads(path.read_bytes()))


def answers_by_iteration(steps: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Each iteration's answer in a trace (a retried copy, a cut-off answer or a first
    draft drafted once more gives way to the attempt after it)."""
    out: dict[int, str] = {}
    for step in steps:
        error = step.get("error") or {}
        if step["role"] != "feedback" and error.get("type") != "copy" and "output" in step:
            out[step["iteration"]] = step["output"]
    return out


def hidden_pass(code: str, tests: list[str]) -> bool:
    """Whether ``code`` passes every hidden test."""
    result = run_tests(code, tests, timeout_s=20.0, per_test_s=5.0)
    return result.error is None and result.passed == len(tests)


@dataclass(frozen=True, slots=True)
class CodeResult:
    """Hidden-test outcomes of one run: by record, per iteration and for the chosen output."""

    by_iteration: dict[str, dict[int, bool]]
    chosen: dict[str, bool]
    own_tests: tuple[int, int]  # the chosen outputs' own tests: passed, total
    stop_reasons: dict[str, int]
    # records whose output is an answer of iteration 0 cut off at max_tokens and asked
    # again (a candidate, but iteration 0 counts the answer asked in its place)
    first_cut: frozenset[str] = frozenset()


def score_code_run(run_dir: Path, hidden: dict[str, list[str]]) -> CodeResult:
    """Run the hidden tests on every answer of a code-improve run."""
    traces = {t["id"]: t["steps"] for t in rows(run_dir / "traces.jsonl")}
    by_iteration: dict[str, dict[int, bool]] = {}
    chosen: dict[str, bool] = {}
    passed = total = 0
    stops: dict[str, int] = {}
    first_cut: set[str] = set()
    for out in rows(run_dir / "outputs.jsonl"):
        rid = out["id"]
        stops[out["stop_reason"]] = stops.get(out["stop_reason"], 0) + 1
        by_iteration[rid] = {
            t: hidden_pass(split(answer)[0], hidden[rid])
            for t, answer in answers_by_iteration(traces[rid]).items()
        }
        chosen[rid] = out["output"] is not None and hidden_pass(out["output"], hidden[rid])
        step = out.get("chosen_step")
        if isinstance(step, int) and 0 <= step < len(traces[rid]):
            at = traces[rid][step]
            if at.get("iteration") == 0 and (at.get("error") or {}).get("type") == "cut_off":
                first_cut.add(rid)
        metrics = out.get("metrics") or {}
        passed += int(metrics.get("tests_passed") or 0)
        total += int(metrics.get("tests_total") or 0)
    return CodeResult(by_iteration, chosen, (passed, total), stops, frozenset(first_cut))


def restrict(result: CodeResult, ids: set[str]) -> CodeResult:
    """The result for some of the records (own-test counts are left out)."""
    return CodeResult(
        {k: v for k, v in result.by_iteration.items() if k in ids},
        {k: v for k, v in result.chosen.items() if k in ids},
        (0, 0),
        {},
        frozenset(k for k in result.first_cut if k in ids),
    )


def carried(by_iteration: dict[int, bool], t: int) -> bool:
    """The record's latest answer at or before iteration t passes."""
    return by_iteration[max(i for i in by_iteration if i <= t)]


def code_table(results: dict[str, CodeResult], max_iters: int) -> str:
    """Pass rates by iteration and of the chosen output, one column per run."""
    names = list(results)
    lines = [
        "| iteration | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for t in range(max_iters + 1):
        cells = []
        for r in results.values():
            n = sum(carried(b, t) for b in r.by_iteration.values() if b)
            cells.append(f"{n}/{len(r.by_iteration)}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    cells = [f"**{sum(r.chosen.values())}/{len(r.chosen)}**" for r in results.values()]
    lines.append("| chosen output | " + " | ".join(cells) + " |")
    notes = []
    for name, r in results.items():
        first = {rid: b.get(0, False) for rid, b in r.by_iteration.items()}
        gained = sorted(rid for rid, ok in r.chosen.items() if ok and not first[rid])
        lost = sorted(rid for rid, ok in r.chosen.items() if not ok and first[rid])
        shown = [f"{rid}*" if rid in r.first_cut else rid for rid in gained]
        note = f"{name}: gained {len(gained)} ({', '.join(shown) or '-'}), lost {len(lost)} "
        note += f"({', '.join(lost) or '-'})"
        if any(rid in r.first_cut for rid in gained):
            note += " (* its output is an answer of iteration 0 cut off at max_tokens and "
            note += "asked again: a gain of the choice, not of a refinement)"
        if r.own_tests[1]:
            note += f"; the chosen outputs' own tests pass {r.own_tests[0]}/{r.own_tests[1]}"
        if r.stop_reasons:
            note += "; stop reasons " + ", ".join(
                f"{k} {v}" for k, v in sorted(r.stop_reasons.items())
            )
        notes.append(note)
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def metric_table(runs: dict[str, Path], task: Task, max_iters: int) -> str:
    """Carried-forward means of the task's metrics by iteration, and of the chosen answers."""
    header = ["iteration"]
    columns: list[list[str]] = []
    notes = []
    for name, run_dir in runs.items():
        report = summarize(run_dir)
        for metric, label in task.metrics:
            measure = next(
                (m for m in report.measures if m.kind == "metric" and m.name == metric), None
            )
            header.append(f"{label}: {name}")
            cells = [
                f"{c.mean:.3f} ({c.n})" if c.mean is not None else "-"
                for c in (measure.carried if measure else ())
            ]
            cells += ["-"] * (max_iters + 1 - len(cells))
            chosen = measure.chosen if measure else None
            cells.append(f"**{chosen.mean:.3f}**" if chosen and chosen.mean is not None else "-")
            columns.append(cells)
        refined = sum(n for t, n in report.iterations.items() if t > 0)
        notes.append(
            f"{name}: {report.done} done, {report.failed} failed, {refined} refined at least "
            "once, stop reasons " + ", ".join(f"{k} {v}" for k, v in report.stop_reasons.items())
        )
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---|" * len(columns)]
    for t, label in enumerate([*map(str, range(max_iters + 1)), "chosen output"]):
        lines.append(f"| {label} | " + " | ".join(col[t] for col in columns) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tasks", default="code")
    parser.add_argument(
        "--models", default="qwen2.5-coder-0.5b", help="local models, comma separated"
    )
    parser.add_argument(
        "--suite",
        type=Path,
        default=SUITE,
        help="code: the requests (hidden tests in NAME-hidden-tests.json beside them)",
    )
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--skip", type=int, default=0, help="start after this many records")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each record this many times (ID~1 .. ID~N)"
    )
    parser.add_argument("--max-iters", type=int, default=2)
    parser.add_argument("--conditions", default="c")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--held-out",
        type=int,
        default=0,
        help="code: also report the last N records apart (held out while writing prompts)",
    )
    parser.add_argument(
        "--data", type=Path, default=ROOT.parent / "shared" / "data", help="the shared data sets"
    )
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "quality")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown here")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    args.work.mkdir(parents=True, exist_ok=True)
    sections = []
    for name in args.tasks.split(","):
        task = TASKS[name]
        tag = f"{name}-{args.skip}-{args.skip + args.records}"
        if name == "code" and args.suite.resolve() != SUITE:
            task = dataclasses.replace(task, source=args.suite.resolve())
            tag = f"{args.suite.stem}-{tag}"
        tag += f"x{args.repeat}" if args.repeat > 1 else ""
        source = args.data / task.source if not task.source.is_absolute() else task.source
        inp = slice_records(
            source, args.records, args.skip, args.work / f"{tag}.jsonl", args.repeat
        )
        runs: dict[str, Path] = {}
        for model in args.models.split(","):
            for cond in args.conditions:
                label, extra = CONDITIONS[cond]
                out = args.work / f"{tag}-{cond}-{model}-{args.max_iters}"
                settings = Settings(
                    local=True,
                    local_model=model,
                    max_iters=args.max_iters,
                    concurrency=args.concurrency,
                    **extra,
                )  # type: ignore[arg-type]
                started = time.monotonic()
                summary = run(task.job, inp, out, settings, show_progress=False)
                print(
                    f"{name} {model} ({label}): {summary.state}, "
                    f"{time.monotonic() - started:.0f} s",
                    flush=True,
                )
                runs[f"{model}, {label}"] = out
        if name == "code":
            hidden = load_hidden(hidden_path(task.source))
            scored = {k: score_code_run(v, hidden) for k, v in runs.items()}
            table = code_table(scored, args.max_iters)
            title = "hidden tests passed, by iteration (carried forward)"
            if args.held_out:
                ids = [row["id"] for row in rows(inp)]
                for label, part in (
                    ("used while writing the prompts", ids[: -args.held_out]),
                    ("held out", ids[-args.held_out :]),
                ):
                    parts = {k: restrict(v, set(part)) for k, v in scored.items()}
                    table += f"\nRecords {label} ({', '.join(part)}):\n\n"
                    table += code_table(parts, args.max_iters)
        else:
            table = metric_table(runs, task, args.max_iters)
            title = "mean by iteration (carried forward; records with a value)"
        sections.append(f"### {name}: {title}\n\n{table}")
    command = "scripts/quality.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = (
        f"Produced by `{command.strip()}` on {time.strftime('%Y-%m-%d')}: records "
        f"{args.skip + 1}-{args.skip + args.records}"
        + (f", each {args.repeat} times" if args.repeat > 1 else "")
        + f", at most {args.max_iters} refinement(s).\n\n"
        + "\n".join(sections)
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
