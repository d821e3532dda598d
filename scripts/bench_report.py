#!/usr/bin/env python3
"""Measure ``refine report`` on a large synthetic run: time, peak memory, page size and load.

Usage: .venv/bin/python scripts/bench_report.py [--records 100000] [--keep DIR]

Writes a run directory of ``--records`` records (three refinements each: seven calls,
feedback with findings, evaluator metrics), then, each in its own process:

- ``refine report`` (Markdown, plots and index.html): seconds and peak RSS;
- a bare baseline that only reads every line of outputs.jsonl and traces.jsonl with
  orjson (the least any report of these files must do): seconds and peak RSS.

Ratios are ours / baseline, measured in the same run; the same report of a run a
hundredth the size shows how peak memory grows with the run. Then, where Chromium and Playwright
are installed, the page is loaded from disk and timed against a bare page of the same
size that only parses its JSON: until the record list shows, a search, and opening a
record.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "a",
    "sentence",
    "scene",
    "dog",
    "child",
    "river",
    "bread",
    "window",
    "quickly",
    "carries",
    "under",
    "bright",
    "old",
    "market",
    "morning",
    "station",
    "paints",
    "laughs",
    "table",
    "garden",
    "behind",
    "across",
]
KIB_PER_MIB = 1024  # ru_maxrss is in KiB on Linux


def words(rng: random.Random, n: int) -> str:
    """``n`` random words."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def synthetic_run(run_dir: Path, records: int) -> None:
    """A finished commongen-like run: outputs, traces, manifest and input."""
    rng = random.Random(0)
    run_dir.mkdir(parents=True)
    inp = run_dir / "input.jsonl"
    with (
        inp.open("wb") as fin,
        (run_dir / "outputs.jsonl").open("wb") as fout,
        (run_dir / "traces.jsonl").open("wb") as ftr,
    ):
        for i in range(records):
            rid = f"rec-{i:07d}"
            fin.write(orjson.dumps({"id": rid, "concepts": ["dog", "river"]}) + b"\n")
            answers = [words(rng, 40) for _ in range(4)]
            coverage = [round(rng.random(), 3) for _ in range(4)]
            steps: list[dict[str, Any]] = []
            for t in range(4):
                role = "generate" if t == 0 else "refine"
                prompt = words(rng, 60 + 20 * t)
                steps.append(
                    {
                        "role": role,
                        "iteration": t,
                        "messages": [{"role": "user", "content": prompt}],
                        "response": answers[t],
                        "parsed": None,
                        "usage": {"prompt_tokens": 80 + 30 * t, "completion_tokens": 60},
                        "latency_s": round(rng.uniform(0.2, 3.0), 3),
                        "attempts": 1,
                        "error": None,
                        "output": answers[t],
                        "metrics": {"coverage": coverage[t], "missing": ["river"]},
                        "checks": ["These words are missing: river."],
                    }
                )
                if t < 3:
                    actions = [words(rng, 10) for _ in range(2)]
                    steps.append(
                        {
                            "role": "feedback",
                            "iteration": t,
                            "messages": [{"role": "user", "content": words(rng, 70)}],
                            "response": orjson.dumps({"actions": actions, "done": False}).decode(),
                            "parsed": {"actions": actions, "done": False},
                            "usage": {"prompt_tokens": 90, "completion_tokens": 40},
                            "latency_s": round(rng.uniform(0.2, 2.0), 3),
                            "attempts": 1,
                            "error": None,
                            "findings": [
                                {"source": "check", "text": "These words are missing: river."},
                                *({"source": "critic", "text": a} for a in actions),
                            ],
                        }
                    )
            ftr.write(orjson.dumps({"id": rid, "steps": steps}) + b"\n")
            failed = i % 97 == 0
            fout.write(
                orjson.dumps(
                    {
                        "id": rid,
                        "line": i + 1,
                        "status": "failed" if failed else "done",
                        "output": answers[3],
                        "iterations": 3,
                        "chosen_iteration": 3,
                        "stop_reason": "error" if failed else "max_iters",
                        "score": None,
                        "scores": [None] * 4,
                        "metrics": {"coverage": coverage[3]},
                        "metrics_by_iteration": [{"coverage": c} for c in coverage],
                        "usage": {"prompt_tokens": 600, "completion_tokens": 340, "calls": 7},
                        "cost_usd": 0.0003,
                        "error": {"type": "http_500", "message": "x"} if failed else None,
                    }
                )
                + b"\n"
            )
    manifest = {
        "job": {"name": "commongen", "hash": "synthetic", "source": "commongen"},
        "model": "gpt-4o-mini",
        "settings": {"max_iters": 3},
        "input": {"path": str(inp), "fingerprint": {}},
        "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T01:00:00+00:00",
        "state": "finished",
    }
    (run_dir / "manifest.json").write_bytes(orjson.dumps(manifest))


def measured(code: str, *args: str) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of ``python -c code args`` in its own process."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"measured command failed: {code[:60]}")
    return seconds, usage.ru_maxrss / KIB_PER_MIB


REPORT = (
    "import sys; from pathlib import Path; from pipeline.report import write_report; "
    "write_report(Path(sys.argv[1]))"
)
BARE = textwrap.dedent(
    """
    import sys, orjson
    for name in ("outputs.jsonl", "traces.jsonl"):
        with open(sys.argv[1] + "/" + name, "rb") as fh:
            for line in fh:
                orjson.loads(line)
    """
)


def browser_figures(page: Path, work: Path, search: str) -> None:
    """Time the page in headless Chromium against a bare page that only parses its JSON."""
    chromium = os.environ.get("REFINE_CHROMIUM") or shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("page in Chromium: skipped (playwright is not installed)")
        return
    if chromium is None:
        print("page in Chromium: skipped (no Chromium: apt-get install chromium)")
        return
    # The bare page: the same bytes of data, parsed, and nothing drawn.
    text = page.read_text(encoding="utf-8")
    data = text[text.index('<script type="application/json"') : text.rindex("<script>")]
    bare = work / "bare.html"
    bare.write_text(
        "<!doctype html><html><body>" + data + "<script>for (const s of document.querySelectorAll"
        "('script[type=\"application/json\"]')) JSON.parse(s.textContent);"
        "document.body.dataset.ready = '1';</script></body></html>",
        encoding="utf-8",
    )
    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=flags)

        def timed(path: Path, fragment: str, selector: str) -> tuple[Any, float]:
            tab = browser.new_page(viewport={"width": 1400, "height": 900})
            started = time.perf_counter()
            tab.goto(path.as_uri() + fragment, timeout=120_000)
            tab.wait_for_selector(selector, state="attached", timeout=120_000)
            return tab, time.perf_counter() - started

        bare_tab, bare_s = timed(bare, "", "body[data-ready]")
        bare_tab.close()
        tab, load_s = timed(page, "#records", "#record-list tr[data-id]")
        started = time.perf_counter()
        tab.fill("#f-search", search)
        tab.wait_for_function("document.querySelectorAll('#record-list tr[data-id]').length === 1")
        search_s = time.perf_counter() - started
        first = tab.eval_on_selector("#record-list tr[data-id]", "r => r.dataset.id")
        started = time.perf_counter()
        tab.click(f'#record-list tr[data-id="{first}"]')
        tab.wait_for_selector("#record .record-head")
        open_s = time.perf_counter() - started
        browser.close()
    print(
        f"page in Chromium: list shown {load_s:.2f} s after opening (a bare page that only "
        f"parses the same JSON: {bare_s:.2f} s, ratio {load_s / bare_s:.2f}); search over "
        f"every row {1000 * search_s:.0f} ms; a record opened in {1000 * open_s:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="write the run here and keep it")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-report-")) if args.keep is None else args.keep
    try:
        small_dir, run_dir = work / "small", work / "run"
        small = max(1_000, args.records // 100)
        synthetic_run(small_dir, small)
        synthetic_run(run_dir, args.records)
        sizes = {n: (run_dir / n).stat().st_size / 2**20 for n in ("outputs.jsonl", "traces.jsonl")}
        print(
            f"{args.records:,} records: outputs.jsonl {sizes['outputs.jsonl']:,.0f} MiB, "
            f"traces.jsonl {sizes['traces.jsonl']:,.0f} MiB"
        )
        bare_s, bare_mib = measured(BARE, str(run_dir))
        ours_s, ours_mib = measured(REPORT, str(run_dir))
        _, small_mib = measured(REPORT, str(small_dir))
        page = run_dir / "report" / "index.html"
        print(
            f"refine report: {ours_s:.1f} s, peak {ours_mib:.0f} MiB; bare orjson read of both "
            f"files: {bare_s:.1f} s, peak {bare_mib:.0f} MiB; ratios {ours_s / bare_s:.2f} "
            f"(time), {ours_mib / bare_mib:.2f} (memory); index.html "
            f"{page.stat().st_size / 2**20:.1f} MiB"
        )
        print(
            f"memory growth: {small:,} records peak {small_mib:.0f} MiB, {args.records:,} records "
            f"peak {ours_mib:.0f} MiB (ratio {ours_mib / small_mib:.2f} for "
            f"{args.records / small:.0f}x the records)"
        )
        browser_figures(page, work, f"rec-{args.records - 1:07d}")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
