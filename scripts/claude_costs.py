#!/usr/bin/env python3
"""What a record costs on each provider, and what the prompt cache serves: measured on the
simulator, the run's own figures beside the server's bill.

Runs the same records (code-improve tasks with long inputs) through the simulator's OpenAI
side as gpt-4o (priced at its list prices, its automatic prefix cache) and its Anthropic
side as claude-sonnet-4-6 (explicit breakpoints), the Claude runs at each structured-output
level (structured outputs, a forced tool, plain text) and each --cache-ttl, and through
Message Batches (--batch), and prints per run: calls, prompt tokens, the share read from
the cache, the tokens written to it, the dollars the run recorded, the simulator's bill,
and dollars per record.

    scripts/claude_costs.py                         # 20 records of ~3,000 tokens, 2 rounds
    scripts/claude_costs.py --records 50 --tokens 6000 --max-iters 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, run  # noqa: E402
from pipeline.client.prices import BUILTIN  # noqa: E402
from pipeline.testing.simulator import SimConfig, Simulator  # noqa: E402

OPENAI_MODEL = "gpt-4o"
CLAUDE_MODEL = "anthropic:claude-sonnet-4-6"


def records(n: int, tokens: int) -> list[dict[str, str]]:
    """``n`` coding tasks whose input is about ``tokens`` tokens (four characters each)."""
    rows = []
    for i in range(n):
        head = f"Record {i}: write a Python function that sums a list, given this context.\n"
        body = "".join(f"context line {k} of record {i}: the list is long.\n" for k in range(2000))
        rows.append({"id": f"r{i}", "task": (head + body)[: tokens * 4]})
    return rows


def one_run(
    inp: Path,
    out: Path,
    model: str,
    max_iters: int,
    structured: str,
    ttl: str | None,
    batch: bool = False,
) -> dict[str, Any]:
    """Run the records; the run's own figures and the simulator's bill."""
    gpt = BUILTIN[OPENAI_MODEL]
    config = SimConfig(
        p_done=0.0,
        price_input=gpt.input,
        price_cached_input=gpt.cached_input or gpt.input,
        price_output=gpt.output,
        batch_validating_s=0.02,
        batch_delay_s=0.1,
        batch_finalizing_s=0.02,
    )
    with Simulator(config) as sim:
        claude = model.startswith("anthropic:")
        settings = Settings(
            model=model,
            base_url=sim.anthropic_url if claude else sim.url,
            max_iters=max_iters,
            min_iters=max_iters,
            structured=structured,
            cache_ttl=ttl,
            batch=batch,
            poll=0.05,
        )
        summary = run("code-improve", inp, out, settings, api_key="k", show_progress=False)
        bill = sim.bill.to_json()
    assert summary.exit_code == 0, summary.message
    lines = [orjson.loads(raw) for raw in (out / "outputs.jsonl").read_bytes().splitlines()]
    used: dict[str, float] = {}
    for line in lines:
        for key, value in line["usage"].items():
            used[key] = used.get(key, 0) + value
    return {
        "records": len(lines),
        "calls": int(used["calls"]),
        "prompt": int(used["prompt_tokens"]),
        "read": int(used.get("cached_tokens", 0)),
        "written": int(used.get("cache_write_tokens", 0)),
        "usd": sum(line["cost_usd"] for line in lines),
        "bill": bill["total_usd"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=3000, help="input tokens a record")
    ap.add_argument("--max-iters", type=int, default=2)
    args = ap.parse_args()
    runs = [
        ("openai", OPENAI_MODEL, "json_schema", None),
        ("claude", CLAUDE_MODEL, "json_schema", "5m"),
        ("claude", CLAUDE_MODEL, "json_object", "5m"),
        ("claude", CLAUDE_MODEL, "text", "5m"),
        ("claude", CLAUDE_MODEL, "text", "1h"),
        ("batch", CLAUDE_MODEL, "text", "1h"),
    ]
    print(
        f"{args.records} code-improve records of ~{args.tokens:,} input tokens, "
        f"{args.max_iters} refinements each (every round run: the critic never says done)"
    )
    print(
        f"{'model':<28}{'mode':<7}{'feedback as':<14}{'ttl':<5}{'calls':>6}{'prompt tok':>12}"
        f"{'read':>7}{'written':>9}{'run $':>10}{'bill $':>10}{'$/record':>10}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.jsonl"
        rows = records(args.records, args.tokens)
        inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        for i, (kind, model, structured, ttl) in enumerate(runs):
            batch = kind == "batch"
            out = Path(tmp) / f"run{i}"
            got = one_run(inp, out, model, args.max_iters, structured, ttl, batch)
            level = {"json_schema": "structured", "json_object": "tool", "text": "text"}
            print(
                f"{model:<28}{'batch' if batch else 'real':<7}{level[structured]:<14}"
                f"{ttl or '-':<5}{got['calls']:>6}"
                f"{got['prompt']:>12,}{got['read'] / got['prompt']:>7.0%}{got['written']:>9,}"
                f"{got['usd']:>10.4f}{got['bill']:>10.4f}{got['usd'] / got['records']:>10.5f}"
            )


if __name__ == "__main__":
    main()
