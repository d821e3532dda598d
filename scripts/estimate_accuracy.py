#!/usr/bin/env python3
"""How close `refine estimate` comes to what a run really uses, measured in one go.

Estimates a run from its prompts and from a sample, then makes the run and prints the
real calls, tokens and dollars beside each estimate (ratio = real / estimate).

    scripts/estimate_accuracy.py                      # simulator, code-improve, 200 records
    scripts/estimate_accuracy.py --local --records 8 --data scripts/data/demo.jsonl
    scripts/estimate_accuracy.py --local --job gsm --data ../shared/data/gsm8k-test.jsonl

The simulator's answers are short and its critic calls a random share of answers done
(--p-done), so the local-model run is the realistic one; prices come from a price file
(the local model is free, so dollars are priced as if it were gpt-4o-mini).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, run  # noqa: E402
from pipeline.client.models import ModelId  # noqa: E402
from pipeline.client.prices import BUILTIN, PriceBook  # noqa: E402
from pipeline.commands.estimate import from_prompts, run_estimate  # noqa: E402
from pipeline.core.loader import load_job  # noqa: E402
from pipeline.serving.registry import DEFAULT_MODEL  # noqa: E402
from pipeline.testing.simulator import SimConfig, Simulator  # noqa: E402


def first_lines(source: Path, n: int, dest: Path) -> Path:
    lines = [line for line in source.read_text().splitlines() if line.strip()][:n]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def real_figures(run_dir: Path, book: PriceBook, model: str) -> tuple[int, int, int, float]:
    calls = prompt = completion = 0
    for raw in (run_dir / "outputs.jsonl").read_bytes().splitlines():
        usage = orjson.loads(raw)["usage"]
        calls += usage["calls"]
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
    price = book.price(model)
    assert price is not None
    dollars = price.cost({"prompt_tokens": prompt, "completion_tokens": completion})
    return calls, prompt, completion, dollars


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default="code-improve")
    ap.add_argument("--data", type=Path, help="input JSONL (default: generated coding tasks)")
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--max-iters", type=int, default=2)
    ap.add_argument("--local", action="store_true", help="the embedded local model")
    ap.add_argument("--p-done", type=float, default=0.3, help="simulator: share of done feedback")
    args = ap.parse_args()

    job = load_job(args.job)
    priced_as = "gpt-4o-mini"
    book = PriceBook({"sim-model": BUILTIN[priced_as]})
    with tempfile.TemporaryDirectory(prefix="refine-estimate-") as tmp:
        work = Path(tmp)
        if args.data is not None:
            inp = first_lines(args.data, args.records, work / "in.jsonl")
        else:
            rows = [
                {"id": f"t{i}", "task": f"Write a Python function number {i} that sums a list"}
                for i in range(args.records)
            ]
            inp = work / "in.jsonl"
            inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        price = BUILTIN[priced_as]
        prices = work / "prices.json"
        model = "sim-model"
        entry = {"input": price.input, "output": price.output}
        prices.write_bytes(orjson.dumps({model: entry, str(ModelId.local(DEFAULT_MODEL)): entry}))
        model_for = {"generate": model, "refine": model, "feedback": model}
        with Simulator(SimConfig(p_done=args.p_done, models=(model,))) as sim:
            if args.local:
                settings = Settings(
                    local=True, max_iters=args.max_iters, concurrency=4, prices=str(prices)
                )
            else:
                settings = Settings(
                    model=model, base_url=sim.url, max_iters=args.max_iters, prices=str(prices)
                )
            static = from_prompts(job, inp, settings, book, model_for)
            sample_dir = work / "run"
            _, sampled = run_estimate(job, inp, settings, sample=args.sample, out=sample_dir)
            summary = run(job, inp, sample_dir, settings, show_progress=False)
        real = real_figures(sample_dir, book, model)
    source = "local model" if args.local else f"simulator (p_done {args.p_done})"
    print(
        f"{args.job}, {args.records} records, --max-iters {args.max_iters}, {source}; "
        f"dollars at {priced_as} prices; run exit {summary.exit_code}"
    )
    print(
        f"real run: {real[0]} calls, {real[1]} prompt + {real[2]} completion tokens, ${real[3]:.4f}"
    )
    for label, est in (("from prompts", static), (f"--sample {args.sample}", sampled)):
        for name, f in est.scenarios.items():
            dollars = f.cost_usd or 0.0
            tokens = f.prompt_tokens + f.completion_tokens
            print(
                f"  {label:<13} {name:<9}"
                f" calls {f.calls:>6} (real/est {real[0] / max(f.calls, 1):.2f})"
                f"  tokens {tokens:>9} (real/est {(real[1] + real[2]) / max(tokens, 1):.2f})"
                f"  ${dollars:.4f} (real/est {real[3] / dollars if dollars else float('nan'):.2f})"
            )


if __name__ == "__main__":
    main()
