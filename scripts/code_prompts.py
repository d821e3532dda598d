#!/usr/bin/env python3
"""Which refine prompt lets failing tests steer a small model? One refinement per first draft.

Takes the first drafts of a finished code-improve run (scripts/quality.py --tasks code)
whose checks found problems, and sends only the refine call for each, once per prompt
variant and seed, to a local model:

  shipped        jobs/code-improve.toml's refine prompt: the critic's notes, then the
                 check findings
  findings-only  the same prompt with only the check findings as its feedback
  focused        a short prompt: the request, the code and its tests, the findings
  fresh          the request and the findings, without the code: write it again

Every variant refines the same drafts, so the counts are paired. Prints how many
refinements pass every hidden test of the suite (scripts/data/code-suite-hidden-tests.json,
never shown to the model), how many drafts did, and how many answers came back unchanged.

Usage: scripts/code_prompts.py RUN_DIR [--model qwen2.5-coder-0.5b] [--seeds 3]
                               [--variants shipped,findings-only,focused,fresh]
                               [--concurrency 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import anyio
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.answers import code_with_tests, split  # noqa: E402
from pipeline.calls import Step  # noqa: E402
from pipeline.jobs import Job, load_job, render  # noqa: E402
from pipeline.loop import build_messages, feedback_text, findings  # noqa: E402
from pipeline.records import Record  # noqa: E402
from pipeline.sandbox import run_tests  # noqa: E402

HIDDEN = ROOT / "scripts" / "data" / "code-suite-hidden-tests.json"
FOCUSED = """Fix this Python code for the request below.

Request: {{task}}

```python
{{output}}
```

Running the code and its tests found:

{{feedback}}

Reply with two ```python blocks and nothing else: the complete fixed code, then all \
the tests (correct a test only if its expected value is wrong).
"""

FRESH = """Write Python code for this request:

{{task}}

An earlier attempt was checked by running its tests, which found:

{{feedback}}

Write a new, correct version; a test that expects a wrong value is corrected, not obeyed. \
Reply with two ```python blocks and nothing else: the complete code, then its tests \
(assert statements, one per behaviour).
"""

Case = tuple[Record, list[Step]]  # a record and its [generate, feedback] steps
Variant = Callable[[Job, Record, list[Step]], list[dict[str, str]]]


def _findings(steps: list[Step]) -> str:
    checked = [f["text"] for f in steps[1].findings or () if f["source"] == "check"]
    return "\n".join(f"- {text}" for text in checked)


def shipped(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    return build_messages(job, record, "refine", 1, steps)


def findings_only(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    messages = build_messages(job, record, "refine", 1, steps)
    text = "Problems found by running the code and its tests:\n" + _findings(steps)
    content = messages[-1]["content"].replace(feedback_text(job, steps[1]), text)
    return [*messages[:-1], {**messages[-1], "content": content}]


def focused(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    values = {"task": str(record.fields["task"]), "output": steps[0].output or ""}
    values["feedback"] = _findings(steps)
    messages = build_messages(job, record, "refine", 1, steps)
    return [*messages[:-1], {"role": "user", "content": render(FOCUSED, values)}]


def fresh(job: Job, record: Record, steps: list[Step]) -> list[dict[str, str]]:
    values = {"task": str(record.fields["task"]), "feedback": _findings(steps)}
    messages = build_messages(job, record, "refine", 1, steps)
    return [*messages[:-1], {"role": "user", "content": render(FRESH, values)}]


VARIANTS: dict[str, Variant] = {
    "shipped": shipped,
    "findings-only": findings_only,
    "focused": focused,
    "fresh": fresh,
}


def load_cases(run_dir: Path, job: Job) -> list[Case]:
    """The (record, [draft, feedback]) pairs of a run whose draft failed its checks."""
    source = Path(orjson.loads((run_dir / "manifest.json").read_bytes())["input"]["path"])
    inputs = {
        row["id"]: row
        for row in (orjson.loads(line) for line in source.read_bytes().splitlines() if line.strip())
    }
    cases: list[Case] = []
    for raw in (run_dir / "traces.jsonl").read_bytes().splitlines():
        line = orjson.loads(raw)
        draft, critic = (Step.from_dict(s) for s in line["steps"][:2])
        record = Record(line["id"], 0, inputs[line["id"]])
        # The draft as this checkout extracts and checks it, whatever the run's version was.
        output = code_with_tests(draft.response or "")
        assert job.checker is not None
        checks = list(job.checker(record.fields, output))
        if draft.role != "generate" or critic.role != "feedback" or not checks:
            continue
        draft = replace(draft, output=output, checks=checks)
        critic = replace(critic, findings=findings(job, draft, critic.parsed))
        cases.append((record, [draft, critic]))
    return cases


def passes(code: str, tests: list[str]) -> bool:
    """Whether ``code`` passes every hidden test."""
    result = run_tests(code, tests, timeout_s=20.0, per_test_s=5.0)
    return result.error is None and result.passed == len(tests)


async def compare(
    cases: Sequence[Case],
    job: Job,
    model_name: str,
    names: Sequence[str],
    seeds: int,
    concurrency: int,
) -> None:
    from openai import AsyncOpenAI

    from pipeline.local import LocalServer, resolve_model

    hidden = orjson.loads(HIDDEN.read_bytes())
    model = await anyio.to_thread.run_sync(resolve_model, model_name)
    async with LocalServer(model, parallel=concurrency) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="local", timeout=900)
        drafts = sum(passes(split(s[0].output or "")[0], hidden[r.id]) for r, s in cases)
        print(f"{len(cases)} drafts failing their checks, {drafts} pass the hidden tests")
        print("| variant | refinements passing the hidden tests | unchanged |\n|---|---|---|")
        limit = anyio.Semaphore(concurrency)
        for name in names:
            started = time.monotonic()
            passing = unchanged = 0

            async def one(record: Record, steps: list[Step], seed: int, name: str = name) -> None:
                nonlocal passing, unchanged
                async with limit:
                    reply = await client.chat.completions.create(
                        model=server.model,
                        messages=VARIANTS[name](job, record, steps),  # type: ignore[arg-type]
                        temperature=job.temperature,
                        max_tokens=job.max_tokens,
                        seed=seed,
                    )
                program = code_with_tests(reply.choices[0].message.content or "")
                ok = await anyio.to_thread.run_sync(passes, split(program)[0], hidden[record.id])
                passing += ok
                unchanged += split(program)[0].split() == split(steps[0].output or "")[0].split()

            async with anyio.create_task_group() as tg:
                for seed in range(seeds):
                    for record, steps in cases:
                        tg.start_soon(one, record, steps, seed)
            total = len(cases) * seeds
            print(
                f"| {name} | {passing}/{total} | {unchanged}/{total} |"
                f"  ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once (slots)")
    args = parser.parse_args()
    job = load_job("code-improve")
    cases = load_cases(args.run_dir, job)
    if not cases:
        sys.exit(f"{args.run_dir}: no code-improve drafts with check findings")
    anyio.run(
        compare, cases, job, args.model, args.variants.split(","), args.seeds, args.concurrency
    )


if __name__ == "__main__":
    main()
