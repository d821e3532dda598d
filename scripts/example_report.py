#!/usr/bin/env python3
"""Regenerate docs/example-report: a 25-record CommonGen run against the simulator, reported.

Usage: .venv/bin/python scripts/example_report.py [--out docs/example-report]

The run uses the project's simulator (placeholder text, so its quality figures mean
nothing), priced as gpt-4o-mini, with a few injected faults so that the report shows a
failed record, cut-off answers and unparseable feedback. The record browser's screenshot
(``index.png``) needs Playwright and Debian's ``chromium``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, run  # noqa: E402
from pipeline.report import write_report  # noqa: E402
from pipeline.testing.simulator import SimConfig, Simulator  # noqa: E402

# Words the simulator's placeholder answers sometimes use, so coverage moves between
# iterations, each set with one word they never use.
SCENES = (
    ("input", "total", "result", "step"),
    ("value", "order", "example", "reviewer"),
    ("edge", "task", "line", "answer"),
    ("table", "count", "wording", "figure"),
    ("justification", "constraint", "item", "pass"),
)
ODD = ("umbrella", "violin", "ladder", "kite", "anchor", "lantern", "compass")


def concept_records(n: int) -> list[dict[str, object]]:
    """``n`` CommonGen-style records, ids cg01 .. cgNN: four common words and one odd one."""
    return [
        {"id": f"cg{i:02d}", "concepts": [*SCENES[i % len(SCENES)], ODD[i % len(ODD)]]}
        for i in range(1, n + 1)
    ]


def screenshot(page: Path, out: Path, record_id: str) -> None:
    """The record browser with one record open, as a full-page PNG."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("REFINE_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        sys.exit("no Chromium for the screenshot: apt-get install chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 900})
        tab.goto(f"{page.as_uri()}#record={record_id}")
        tab.wait_for_selector("#record .iteration")
        tab.screenshot(path=str(out), full_page=True)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "example-report")
    args = parser.parse_args()
    os.chdir(ROOT)  # the report names the run by the relative path given here
    run_dir, inp = Path("runs/example"), Path("runs/example-input.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)
    inp.parent.mkdir(exist_ok=True)
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in concept_records(25)))
    config = SimConfig(latency_s=0.01, p_done=0.2, p_500=0.03, p_length=0.08, faults_seed=3)
    with Simulator(config) as sim:
        settings = Settings(
            model="gpt-4o-mini", base_url=sim.url, max_iters=2, concurrency=8, max_retries=0
        )
        run("commongen", inp, run_dir, settings, api_key="simulated", show_progress=False)
    for old in args.out.glob("*.png"):
        old.unlink()
    files = write_report(run_dir, args.out)
    outputs = [orjson.loads(line) for line in (run_dir / "outputs.jsonl").read_bytes().splitlines()]
    # The screenshot shows a record whose coverage rose, when one did.
    done = [o for o in outputs if o["status"] == "done" and o["metrics_by_iteration"]]
    shown = max(
        done,
        key=lambda o: (
            o["metrics_by_iteration"][-1]["coverage"] - o["metrics_by_iteration"][0]["coverage"]
        ),
    )
    screenshot(files.html, args.out / "index.png", shown["id"])
    print(f"{files.markdown}\n{files.html}\n{args.out / 'index.png'}")


if __name__ == "__main__":
    main()
